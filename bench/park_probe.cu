// Probe: while one stream is parked on a wait-value whose flag the host writes, does copy work
// enqueued afterwards on another stream run? (vaswap's device handshake parks the launching
// stream on a restore's flag while a worker enqueues the D2H copies that make room for it.)
// Each case: stream S parks on a flag (and, in some cases, has work queued behind the wait);
// then stream O gets one piece of work and an event; the host waits up to 2 s for the event,
// then writes the flag either way. Prints whether O's work completed while S was parked.
//
// `park_probe --streams` asks the same of many streams: 40 non-blocking streams are created in
// order; stream 0 is parked; each other stream gets a kernel, then (separately) an H2D copy, and
// the host waits up to 50 ms for each. A stream whose work does not run shares a hardware queue
// with the parked one. Repeated with high-priority streams created after the parked one, and with
// the other streams created before it. The answer decides when a device-side handshake can park
// an application stream without stalling vaswap's copies (docs/PLANNER.md, "Handshakes"). The
// kernel is loaded before anything parks, unless PARK_PROBE_LAZY=1.
//
// The default run parks S both with cuStreamWaitValue32 and as vaswap does (a cuStreamBatchMemOp
// of one wait), and also times copies between timing events, as vaswap's eviction worker does.
// `park_probe --vmm` does vaswap's workers' VMM and pinned-memory calls while S is parked.
// `park_probe --module` loads a module while S is parked, as Triton and torch.compile do between
// launches: on a helper thread cuModuleLoadData (a PTX image), cuModuleGetFunction,
// cuFuncSetAttribute and a launch on O; the main thread says which call has not returned after
// 2 s, and whether a cuEventQuery on a third thread returns meanwhile (vaswap's workers query
// events while a stream is parked); then it writes the flag and says whether all completed.
// `park_probe --create [N]` does the same with what vaswap's workers and programs create as they
// go: cuEventCreate, cuStreamCreate, cuStreamCreateWithPriority, an event record on the new
// stream, cuStreamDestroy and 16 more cuStreamCreate; first N more streams that ran a kernel are
// parked on the same flag with a kernel behind the wait.
// `park_probe --attributes N` asks one question of a kernel never launched (lazy loading, CUDA's
// default) while S is parked: N = 0 cudaFuncGetAttributes, 1 cudaFuncSetAttribute (max dynamic
// shared memory), 2 cudaOccupancyMaxActiveBlocksPerMultiprocessor; 3-5 the same through the
// driver (cuFuncGetAttribute, cuFuncSetAttribute, cuOccupancyMaxActiveBlocksPerMultiprocessor) on
// a CUfunction that cudaGetFuncBySymbol gave before anything parked (its load state, from
// cuFuncIsLoaded, is printed before and after); 6 cuKernelGetFunction of a CUkernel that
// cudaGetKernel gave before anything parked; 7 cuFuncGetAttribute, 8 cuFuncSetAttribute and 9
// cuOccupancyMaxActiveBlocksPerMultiprocessor on a function of a PTX module that cuModuleLoadData
// and cuModuleGetFunction gave before anything parked (as Triton gets its kernels). Then a launch
// of that kernel on O, and whether it ran. Does a question about an unloaded kernel load it, and
// wait for the parked stream? `park_probe --graphs` asks what the device handshake's copy graphs
// (core/transform/copy_graph.h) need: while S is parked, a graph of one D2H memcpy node is made,
// instantiated, uploaded and launched on O (does it run?); then an H2D graph into a VMM buffer
// whose pages were unmapped after the node was added is launched behind a wait-value, the pages
// mapped again and the flag written (does the copy land, with the right bytes?).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

__global__ void spin(unsigned* p) {
  if (threadIdx.x == 0) atomicAdd(p, 1u);
}

// Never launched: `park_probe --attributes` asks for their attributes while a stream is parked,
// each case of a kernel of its own, so that none is loaded by an earlier case.
#define PARK_PROBE_UNLAUNCHED(name)         \
  __global__ void name(unsigned* p) {       \
    if (threadIdx.x == 0) atomicAdd(p, 2u); \
  }
PARK_PROBE_UNLAUNCHED(unlaunched_0)
PARK_PROBE_UNLAUNCHED(unlaunched_1)
PARK_PROBE_UNLAUNCHED(unlaunched_2)
PARK_PROBE_UNLAUNCHED(unlaunched_3)
PARK_PROBE_UNLAUNCHED(unlaunched_4)
PARK_PROBE_UNLAUNCHED(unlaunched_5)
PARK_PROBE_UNLAUNCHED(unlaunched_6)

namespace {

constexpr size_t kBytes = 32u << 20;

bool wait_stream(cudaStream_t s, double seconds) {
  const auto start = std::chrono::steady_clock::now();
  while (cudaStreamQuery(s) == cudaErrorNotReady) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds)
      return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

bool wait_event(cudaEvent_t e, double seconds) {
  const auto start = std::chrono::steady_clock::now();
  while (cudaEventQuery(e) == cudaErrorNotReady) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds)
      return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

}  // namespace

// Parks `parked` on a fresh flag value; returns, for each of `others`, whether a kernel and an
// H2D enqueued on it ran while `parked` waited.
void probe_streams(const char* title, cudaStream_t parked, const std::vector<cudaStream_t>& others,
                   unsigned* flag, unsigned* value, unsigned* counter, void* dev, void* host) {
  std::printf("%s\n", title);
  std::fflush(stdout);
  std::string kernel_blocked, copy_blocked;
  cudaEvent_t done;
  cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  for (int kind = 0; kind < 2; ++kind) {
    for (size_t k = 0; k < others.size(); ++k) {
      ++*value;
      cuStreamWaitValue32(reinterpret_cast<CUstream>(parked), reinterpret_cast<CUdeviceptr>(flag),
                          *value, CU_STREAM_WAIT_VALUE_GEQ);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (kind == 0) spin<<<1, 32, 0, others[k]>>>(counter);
      if (kind == 1) cudaMemcpyAsync(dev, host, 1u << 20, cudaMemcpyHostToDevice, others[k]);
      cudaEventRecord(done, others[k]);
      const bool ran = wait_event(done, 0.05);
      __atomic_store_n(flag, *value, __ATOMIC_RELEASE);
      for (cudaStream_t st : {parked, others[k]}) {
        if (!wait_stream(st, 3.0)) {
          std::printf("  %s on stream %zu: %s stream still busy 3 s after the flag was written\n",
                      kind == 0 ? "kernel" : "H2D", k + 1, st == parked ? "the parked" : "this");
          std::exit(3);
        }
      }
      if (!ran) (kind == 0 ? kernel_blocked : copy_blocked) += " " + std::to_string(k + 1);
    }
  }
  cudaEventDestroy(done);
  std::printf("  kernel held back on streams:%s\n  H2D held back on streams:%s\n",
              kernel_blocked.empty() ? " none" : kernel_blocked.c_str(),
              copy_blocked.empty() ? " none" : copy_blocked.c_str());
}

int many_streams() {
  cudaSetDevice(0);
  cudaFree(nullptr);
  const char* connections = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  std::printf(
      "CUDA_DEVICE_MAX_CONNECTIONS=%s; streams numbered in creation order after the "
      "parked one\n",
      connections ? connections : "(unset)");
  unsigned* flag = nullptr;
  cudaHostAlloc(reinterpret_cast<void**>(&flag), 64, cudaHostAllocMapped);
  void* host = nullptr;
  cudaHostAlloc(&host, 1u << 20, cudaHostAllocDefault);
  void* dev = nullptr;
  cudaMalloc(&dev, 1u << 20);
  unsigned* counter = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&counter), 4);
  unsigned value = 0;
  // Load the kernel before any stream parks: with lazy loading (CUDA_MODULE_LOADING=LAZY, the
  // default), a kernel's first launch loads its module, which may wait for the whole context,
  // parked stream included. PARK_PROBE_LAZY=1 skips this, to show that.
  if (std::getenv("PARK_PROBE_LAZY") == nullptr) {
    spin<<<1, 32>>>(counter);
    cudaDeviceSynchronize();
  }
  int least = 0, greatest = 0;
  cudaDeviceGetStreamPriorityRange(&least, &greatest);

  std::vector<cudaStream_t> before(39);
  for (cudaStream_t& st : before) cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  cudaStream_t parked;
  cudaStreamCreateWithFlags(&parked, cudaStreamNonBlocking);
  std::vector<cudaStream_t> after(39), high(16);
  for (cudaStream_t& st : after) cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  for (cudaStream_t& st : high) cudaStreamCreateWithPriority(&st, cudaStreamNonBlocking, greatest);
  probe_streams("39 streams created after the parked one", parked, after, flag, &value, counter,
                dev, host);
  probe_streams("16 high-priority streams created after the parked one", parked, high, flag, &value,
                counter, dev, host);
  probe_streams("39 streams created before the parked one (1: the earliest)", parked, before, flag,
                &value, counter, dev, host);
  std::printf("last error: %s\n", cudaGetErrorName(cudaGetLastError()));
  return 0;
}

// `park_probe --vmm`: what vaswap's workers do while the application's stream is parked on a
// restore's flag. S parks; the host then does VMM work on buffers S never touches and copies on
// O: (1) D2H out of a VMM-mapped buffer; (2) cuMemUnmap + cuMemRelease of another, then D2H;
// (3) cuMemCreate + cuMemMap + cuMemSetAccess of a new buffer, then H2D into it; (4) the same
// with a pinned buffer cuMemHostAlloc'ed while S is parked. Each: does O's copy complete within
// 2 s while S stays parked?
namespace {
struct Vmm {
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle handle = 0;
  size_t bytes = 0;
};
CUmemAllocationProp vmm_prop() {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  return prop;
}
bool vmm_map(Vmm* v, size_t bytes) {
  const CUmemAllocationProp prop = vmm_prop();
  v->bytes = bytes;
  if (v->va == 0 && cuMemAddressReserve(&v->va, bytes, 0, 0, 0) != CUDA_SUCCESS) return false;
  if (cuMemCreate(&v->handle, bytes, &prop, 0) != CUDA_SUCCESS) return false;
  if (cuMemMap(v->va, bytes, 0, v->handle, 0) != CUDA_SUCCESS) return false;
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return cuMemSetAccess(v->va, bytes, &access, 1) == CUDA_SUCCESS;
}
bool vmm_unmap(Vmm* v) {
  return cuMemUnmap(v->va, v->bytes) == CUDA_SUCCESS && cuMemRelease(v->handle) == CUDA_SUCCESS;
}
// What the VMM probes share: a mapped flag, a pinned host buffer, two VMM buffers (`a` filled with
// `fill`), streams S (to park) and O, and an event.
struct Parked {
  unsigned* flag = nullptr;
  unsigned char* host = nullptr;
  Vmm a, b;
  cudaStream_t s = nullptr, o = nullptr;
  cudaEvent_t done = nullptr;
};
bool parked_setup(Parked* p, int fill) {
  cudaSetDevice(0);
  cudaFree(nullptr);
  cudaHostAlloc(reinterpret_cast<void**>(&p->flag), 64, cudaHostAllocMapped);
  cudaHostAlloc(reinterpret_cast<void**>(&p->host), kBytes, cudaHostAllocDefault);
  if (!vmm_map(&p->a, kBytes) || !vmm_map(&p->b, kBytes)) {
    std::printf("VMM setup failed\n");
    return false;
  }
  cudaMemset(reinterpret_cast<void*>(p->a.va), fill, kBytes);
  cudaDeviceSynchronize();
  cudaStreamCreateWithFlags(&p->s, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&p->o, cudaStreamNonBlocking);
  cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming);
  return true;
}
}  // namespace

int vmm_while_parked() {
  Parked p;
  if (!parked_setup(&p, 1)) return 1;
  unsigned* flag = p.flag;
  void* host = p.host;
  Vmm a = p.a, b = p.b, c;
  cudaStream_t s = p.s, o = p.o;
  cudaEvent_t done = p.done;
  const char* cases[] = {"D2H out of a VMM buffer", "unmap+release another, then D2H",
                         "create+map+access a new buffer, then H2D into it",
                         "cuMemHostAlloc 32 MiB, then D2H into it"};
  unsigned value = 0;
  for (int k = 0; k < 4; ++k) {
    ++value;
    cuStreamWaitValue32(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(flag), value,
                        CU_STREAM_WAIT_VALUE_GEQ);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const auto start = std::chrono::steady_clock::now();
    bool host_ok = true;
    void* fresh = nullptr;
    if (k == 1) host_ok = vmm_unmap(&b);
    if (k == 2) host_ok = vmm_map(&c, kBytes);
    if (k == 3) host_ok = cuMemHostAlloc(&fresh, kBytes, 0) == CUDA_SUCCESS;
    const double host_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (k == 2) {
      cudaMemcpyAsync(reinterpret_cast<void*>(c.va), host, kBytes, cudaMemcpyHostToDevice, o);
    } else {
      cudaMemcpyAsync(k == 3 ? fresh : host, reinterpret_cast<void*>(a.va), kBytes,
                      cudaMemcpyDeviceToHost, o);
    }
    cudaEventRecord(done, o);
    const bool ran = wait_event(done, 2.0);
    __atomic_store_n(flag, value, __ATOMIC_RELEASE);
    cudaStreamSynchronize(s);
    cudaStreamSynchronize(o);
    if (fresh != nullptr) cuMemFreeHost(fresh);
    std::printf("S parked; %-50s host calls %s in %.2f ms; O's copy %s\n", cases[k],
                host_ok ? "ok" : "FAILED", host_ms,
                ran ? "ran" : "DID NOT RUN until the flag was written");
  }
  std::printf("last error: %s\n", cudaGetErrorName(cudaGetLastError()));
  return 0;
}

// A graph of one copy between `va` and pinned `host`, instantiated and uploaded on `stream`.
bool copy_graph(cudaGraphExec_t* exec, CUdeviceptr va, void* host, size_t bytes, bool to_host,
                cudaStream_t stream) {
  CUDA_MEMCPY3D p{};
  p.srcMemoryType = to_host ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
  p.dstMemoryType = to_host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
  if (to_host) {
    p.srcDevice = va;
    p.dstHost = host;
  } else {
    p.srcHost = host;
    p.dstDevice = va;
  }
  p.WidthInBytes = p.srcPitch = p.dstPitch = bytes;
  p.srcHeight = p.dstHeight = p.Height = p.Depth = 1;
  CUcontext ctx = nullptr;
  cuCtxGetCurrent(&ctx);
  CUgraph g = nullptr;
  CUgraphNode node = nullptr;
  if (cuGraphCreate(&g, 0) != CUDA_SUCCESS) return false;
  bool ok = cuGraphAddMemcpyNode(&node, g, nullptr, 0, &p, ctx) == CUDA_SUCCESS &&
            cuGraphInstantiateWithFlags(reinterpret_cast<CUgraphExec*>(exec), g, 0) == CUDA_SUCCESS;
  cuGraphDestroy(g);
  return ok && cuGraphUpload(reinterpret_cast<CUgraphExec>(*exec),
                             reinterpret_cast<CUstream>(stream)) == CUDA_SUCCESS;
}

int graphs_while_parked() {
  Parked p;
  if (!parked_setup(&p, 7)) return 1;
  unsigned* flag = p.flag;
  unsigned char* host = p.host;
  Vmm a = p.a, c = p.b;
  cudaStream_t s = p.s, o = p.o;
  cudaEvent_t done = p.done;
  // 1. S parked; a D2H graph made, instantiated, uploaded and launched on O.
  *flag = 0;
  cuStreamWaitValue32(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(flag), 1,
                      CU_STREAM_WAIT_VALUE_GEQ);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  auto start = std::chrono::steady_clock::now();
  cudaGraphExec_t d2h = nullptr;
  const bool made = copy_graph(&d2h, a.va, host, kBytes, true, o);
  const double make_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  bool ran = false;
  if (made) {
    cudaGraphLaunch(d2h, o);
    cudaEventRecord(done, o);
    ran = wait_event(done, 2.0);
  }
  __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
  cudaStreamSynchronize(s);
  cudaStreamSynchronize(o);
  std::printf(
      "S parked; D2H graph made, instantiated and uploaded on O: %s in %.2f ms; its launch "
      "%s; bytes %s\n",
      made ? "ok" : "FAILED", make_ms, ran ? "ran" : "DID NOT RUN until the flag was written",
      host[0] == 7 && host[kBytes - 1] == 7 ? "right" : "WRONG");
  // 2. The ahead restore: an H2D graph into c, made while c has pages; c unmapped; on S a wait for
  //    the flag, then the graph; the host maps c again and writes the flag.
  std::memset(host, 9, kBytes);
  cudaGraphExec_t h2d = nullptr;
  const bool made_h2d = copy_graph(&h2d, c.va, host, kBytes, false, s);
  cudaDeviceSynchronize();
  const bool unmapped = vmm_unmap(&c);
  *flag = 1;
  cuStreamWaitValue32(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(flag), 2,
                      CU_STREAM_WAIT_VALUE_GEQ);
  const cudaError_t launched = cudaGraphLaunch(h2d, s);
  cudaEventRecord(done, s);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const bool early = cudaEventQuery(done) == cudaSuccess;
  const bool mapped = vmm_map(&c, kBytes);
  __atomic_store_n(flag, 2, __ATOMIC_RELEASE);
  const bool landed = wait_event(done, 2.0);
  std::memset(host, 0, kBytes);
  cudaMemcpy(host, reinterpret_cast<void*>(c.va), kBytes, cudaMemcpyDeviceToHost);
  std::printf(
      "H2D graph made with pages (%s), pages unmapped (%s), launched behind a wait-value "
      "with none (%s), %s before the flag; pages mapped again (%s), flag written: the copy "
      "%s; bytes %s\n",
      made_h2d ? "ok" : "FAILED", unmapped ? "ok" : "FAILED", cudaGetErrorName(launched),
      early ? "RAN" : "held", mapped ? "ok" : "FAILED", landed ? "landed" : "DID NOT LAND",
      host[0] == 9 && host[kBytes - 1] == 9 ? "right" : "WRONG");
  std::printf("last error: %s\n", cudaGetErrorName(cudaGetLastError()));
  return 0;
}

namespace {
const char kPtx[] = R"(
.version 8.0
.target sm_90
.address_size 64
.visible .entry probe_kernel(.param .u64 p)
{
  .reg .u64 %rd<3>;
  .reg .u32 %r<2>;
  ld.param.u64 %rd1, [p];
  cvta.to.global.u64 %rd2, %rd1;
  mov.u32 %r1, 7;
  st.global.u32 [%rd2], %r1;
  ret;
}
)";
}  // namespace

// Runs `count` steps on a helper thread (in the context) while stream S is parked on a flag:
// says which step had not returned after 2 s per step, and whether an event query on a third
// thread returns meanwhile; then writes the flag and says how many steps completed.
int steps_while_parked(const char* const* steps, int count,
                       const std::function<CUresult(int, const Parked&)>& step) {
  Parked p;
  if (!parked_setup(&p, 1)) return 1;
  CUcontext context = nullptr;
  cuCtxGetCurrent(&context);
  cudaEvent_t other = nullptr;
  cudaEventCreateWithFlags(&other, cudaEventDisableTiming);
  cudaEventRecord(other, p.o);
  cudaStreamSynchronize(p.o);
  cuStreamWaitValue32(reinterpret_cast<CUstream>(p.s), reinterpret_cast<CUdeviceptr>(p.flag), 1,
                      CU_STREAM_WAIT_VALUE_GEQ);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  int done = 0;  // steps done (atomic)
  std::vector<double> ms(count);
  std::vector<CUresult> rcs(count, CUDA_SUCCESS);
  std::thread runner([&] {
    cuCtxSetCurrent(context);
    for (int k = 0; k < count; ++k) {
      const auto start = std::chrono::steady_clock::now();
      const CUresult rc = step(k, p);
      rcs[k] = rc;
      ms[k] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count();
      __atomic_store_n(&done, k + 1, __ATOMIC_RELEASE);
      if (rc != CUDA_SUCCESS) return;
    }
  });
  const auto start = std::chrono::steady_clock::now();
  int seen = 0;
  for (;;) {
    seen = __atomic_load_n(&done, __ATOMIC_ACQUIRE);
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (seen == count || waited > 2.0 * (seen + 1)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // A worker's event query meanwhile, on a thread of its own.
  double query_ms = -1;
  std::thread querier([&] {
    cuCtxSetCurrent(context);
    const auto q = std::chrono::steady_clock::now();
    cudaEventQuery(other);
    query_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - q).count();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const bool query_returned = query_ms >= 0;
  if (seen < count) {
    std::printf("S parked: %s had not returned after %.1f s (earlier steps:", steps[seen],
                2.0 * (seen + 1));
  } else {
    std::printf("S parked: every step returned (");
  }
  for (int k = 0; k < seen; ++k) std::printf(" %s %.1f ms rc %d;", steps[k], ms[k], rcs[k]);
  std::printf(") ; an event query on another thread meanwhile %s\n",
              query_returned ? "returned" : "DID NOT RETURN within 0.5 s");
  __atomic_store_n(p.flag, 1u, __ATOMIC_RELEASE);
  runner.join();
  querier.join();
  const int all = __atomic_load_n(&done, __ATOMIC_ACQUIRE);
  std::printf(
      "after the flag was written: %d of %d steps done (last rc %d, %.1f ms); the query took "
      "%.1f ms\n",
      all, count, all > 0 ? rcs[all - 1] : 0, all > 0 ? ms[all - 1] : 0.0, query_ms);
  return 0;
}

int module_while_parked() {
  const char* steps[] = {"cuModuleLoadData", "cuModuleGetFunction", "cuFuncSetAttribute",
                         "cuLaunchKernel", "the kernel ran"};
  CUmodule module = nullptr;
  CUfunction function = nullptr;
  return steps_while_parked(steps, 5, [&](int k, const Parked& p) {
    if (k == 0) return cuModuleLoadData(&module, kPtx);
    if (k == 1) return cuModuleGetFunction(&function, module, "probe_kernel");
    if (k == 2) {
      return cuFuncSetAttribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1024);
    }
    if (k == 3) {
      CUdeviceptr target = p.a.va;
      void* args[] = {&target};
      return cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, reinterpret_cast<CUstream>(p.o), args,
                            nullptr);
    }
    return cuStreamSynchronize(reinterpret_cast<CUstream>(p.o));
  });
}

// What vaswap's workers and the programs it lives in create as they go: events and streams.
// First `busy` more streams, each of which ran a kernel before, are parked on S's flag with a
// kernel behind the wait (as an application's streams wait for restores).
int creation_while_parked(int busy) {
  const char* steps[] = {"parking the busy streams behind a kernel",
                         "cuEventCreate",
                         "cuStreamCreate",
                         "cuStreamCreateWithPriority",
                         "cuEventRecord on the new stream",
                         "cuStreamDestroy",
                         "16 more cuStreamCreate"};
  unsigned* counter = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&counter), sizeof(unsigned));
  std::vector<cudaStream_t> others(busy);
  for (cudaStream_t& other : others) {
    cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking);
    spin<<<1, 32, 0, other>>>(counter);
  }
  cudaDeviceSynchronize();
  std::printf("%d busy streams\n", busy);
  CUevent event = nullptr;
  CUstream fresh = nullptr, urgent = nullptr;
  return steps_while_parked(steps, 7, [&](int k, const Parked& p) {
    if (k == 0) {
      for (cudaStream_t other : others) {
        const CUresult rc =
            cuStreamWaitValue32(reinterpret_cast<CUstream>(other),
                                reinterpret_cast<CUdeviceptr>(p.flag), 1, CU_STREAM_WAIT_VALUE_GEQ);
        if (rc != CUDA_SUCCESS) return rc;
        spin<<<1, 32, 0, other>>>(counter);
      }
      return cudaGetLastError() == cudaSuccess ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
    }
    if (k == 1) return cuEventCreate(&event, CU_EVENT_DEFAULT);
    if (k == 2) return cuStreamCreate(&fresh, CU_STREAM_NON_BLOCKING);
    if (k == 3) {
      int least = 0, greatest = 0;
      cuCtxGetStreamPriorityRange(&least, &greatest);
      return cuStreamCreateWithPriority(&urgent, CU_STREAM_NON_BLOCKING, greatest);
    }
    if (k == 4) return cuEventRecord(event, fresh);
    if (k == 5) return cuStreamDestroy(urgent);
    for (int i = 0; i < 16; ++i) {
      CUstream more = nullptr;
      if (const CUresult rc = cuStreamCreate(&more, CU_STREAM_NON_BLOCKING); rc != CUDA_SUCCESS) {
        return rc;
      }
    }
    return CUDA_SUCCESS;
  });
}

int attributes_while_parked(int which) {
  using Kernel = void (*)(unsigned*);
  const Kernel kernels[] = {unlaunched_0, unlaunched_1, unlaunched_2, unlaunched_3,
                            unlaunched_4, unlaunched_5, unlaunched_6};
  const char* questions[] = {"cudaFuncGetAttributes",
                             "cudaFuncSetAttribute",
                             "cudaOccupancyMaxActiveBlocksPerMultiprocessor",
                             "cuFuncGetAttribute",
                             "cuFuncSetAttribute",
                             "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                             "cuKernelGetFunction",
                             "cuFuncGetAttribute of a module's function",
                             "cuFuncSetAttribute of a module's function",
                             "cuOccupancyMaxActiveBlocksPerMultiprocessor of a module's function"};
  if (which < 0 || which > 9) {
    std::printf("--attributes takes 0-9\n");
    return 2;
  }
  const Kernel kernel = kernels[which % 7];
  cudaSetDevice(0);
  cudaFree(nullptr);
  CUfunction function = nullptr;
  CUkernel library_kernel = nullptr;
  const auto loaded = [&function]() -> const char* {
    CUfunctionLoadingState state = CU_FUNCTION_LOADING_STATE_MAX;
    if (function == nullptr || cuFuncIsLoaded(&state, function) != CUDA_SUCCESS) return "unknown";
    return state == CU_FUNCTION_LOADING_STATE_LOADED ? "loaded" : "not loaded";
  };
  if (which >= 3 && which <= 5) {
    const cudaError_t rc = cudaGetFuncBySymbol(&function, reinterpret_cast<const void*>(kernel));
    std::printf("cudaGetFuncBySymbol before parking: %s; the function is %s\n",
                cudaGetErrorName(rc), loaded());
  }
  if (which >= 7) {
    CUmodule module = nullptr;
    const CUresult loaded_rc = cuModuleLoadData(&module, kPtx);
    const CUresult got = loaded_rc == CUDA_SUCCESS
                             ? cuModuleGetFunction(&function, module, "probe_kernel")
                             : loaded_rc;
    std::printf("cuModuleLoadData and cuModuleGetFunction before parking: %d; the function is %s\n",
                got, loaded());
  }
  if (which == 6) {
    const cudaError_t rc = cudaGetKernel(reinterpret_cast<cudaKernel_t*>(&library_kernel),
                                         reinterpret_cast<const void*>(kernel));
    std::printf("cudaGetKernel before parking: %s\n", cudaGetErrorName(rc));
  }
  const char* steps[] = {questions[which], "a launch of it on O", "the kernel ran"};
  unsigned* counter = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&counter), sizeof(unsigned));
  const int status = steps_while_parked(steps, 3, [&](int k, const Parked& p) -> CUresult {
    if (k == 0) {
      int value = 0;
      cudaFuncAttributes attributes{};
      switch (which) {
        case 0:
          return cudaFuncGetAttributes(&attributes, kernel) == cudaSuccess ? CUDA_SUCCESS
                                                                           : CUDA_ERROR_UNKNOWN;
        case 1:
          return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 1024) ==
                         cudaSuccess
                     ? CUDA_SUCCESS
                     : CUDA_ERROR_UNKNOWN;
        case 2:
          return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&value, kernel, 128, 0) ==
                         cudaSuccess
                     ? CUDA_SUCCESS
                     : CUDA_ERROR_UNKNOWN;
        case 3: return cuFuncGetAttribute(&value, CU_FUNC_ATTRIBUTE_NUM_REGS, function);
        case 4:
          return cuFuncSetAttribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    1024);
        case 5:
        case 9: return cuOccupancyMaxActiveBlocksPerMultiprocessor(&value, function, 128, 0);
        case 7: return cuFuncGetAttribute(&value, CU_FUNC_ATTRIBUTE_NUM_REGS, function);
        case 8:
          return cuFuncSetAttribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    1024);
        default: return cuKernelGetFunction(&function, library_kernel);
      }
    }
    if (k == 1 && which >= 7) {
      CUdeviceptr target = p.a.va;
      void* args[] = {&target};
      return cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, reinterpret_cast<CUstream>(p.o), args,
                            nullptr);
    }
    if (k == 1) {
      kernel<<<1, 32, 0, p.o>>>(counter);
      return cudaGetLastError() == cudaSuccess ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
    }
    return cuStreamSynchronize(reinterpret_cast<CUstream>(p.o));
  });
  std::printf("after: the function is %s\n", loaded());
  return status;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--module") == 0) return module_while_parked();
  if (argc > 2 && std::strcmp(argv[1], "--attributes") == 0) {
    return attributes_while_parked(std::atoi(argv[2]));
  }
  if (argc > 1 && std::strcmp(argv[1], "--create") == 0) {
    return creation_while_parked(argc > 2 ? std::atoi(argv[2]) : 0);
  }
  if (argc > 1 && std::strcmp(argv[1], "--graphs") == 0) return graphs_while_parked();
  if (argc > 1 && std::strcmp(argv[1], "--streams") == 0) return many_streams();
  if (argc > 1 && std::strcmp(argv[1], "--vmm") == 0) return vmm_while_parked();
  cudaSetDevice(0);
  cudaFree(nullptr);
  const char* connections = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  std::printf("CUDA_DEVICE_MAX_CONNECTIONS=%s\n", connections ? connections : "(unset)");
  unsigned* flag = nullptr;
  cudaHostAlloc(reinterpret_cast<void**>(&flag), 64, cudaHostAllocMapped);
  void* host = nullptr;
  cudaHostAlloc(&host, kBytes, cudaHostAllocDefault);
  void *dev_a = nullptr, *dev_b = nullptr;
  cudaMalloc(&dev_a, kBytes);
  cudaMalloc(&dev_b, kBytes);
  unsigned* counter = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&counter), 4);
  cudaStream_t s, o;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&o, cudaStreamNonBlocking);
  // A graph of one kernel, as the launch behind the wait.
  cudaGraph_t g;
  cudaGraphExec_t x;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
  spin<<<1, 32, 0, s>>>(counter);
  cudaStreamEndCapture(s, &g);
  cudaGraphInstantiate(&x, g, 0);
  cudaEvent_t done;
  cudaEventCreateWithFlags(&done, cudaEventDisableTiming);

  // Timing events (created without cudaEventDisableTiming) around a copy, as vaswap's eviction
  // worker records them to time its D2H; and the park made as vaswap makes it, a batch of one
  // wait-value operation.
  cudaEvent_t timed_start, timed_end;
  cudaEventCreate(&timed_start);
  cudaEventCreate(&timed_end);
  const char* behinds[] = {"nothing", "an eager kernel", "a graph launch", "a D2D copy"};
  const char* works[] = {"D2H copy", "H2D copy", "D2D copy", "kernel", "timed D2H", "timed H2D"};
  unsigned value = 0;
  for (int park = 0; park < 2; ++park) {
    std::printf("parked with %s\n", park == 0 ? "cuStreamWaitValue32" : "cuStreamBatchMemOp");
    for (int behind = 0; behind < 4; ++behind) {
      for (int work = 0; work < 6; ++work) {
        ++value;
        if (park == 0) {
          cuStreamWaitValue32(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(flag),
                              value, CU_STREAM_WAIT_VALUE_GEQ);
        } else {
          CUstreamBatchMemOpParams op{};
          op.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
          op.waitValue.address = reinterpret_cast<CUdeviceptr>(flag);
          op.waitValue.value = value;
          op.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
          cuStreamBatchMemOp(reinterpret_cast<CUstream>(s), 1, &op, 0);
        }
        if (behind == 1) spin<<<1, 32, 0, s>>>(counter);
        if (behind == 2) cudaGraphLaunch(x, s);
        if (behind == 3) cudaMemcpyAsync(dev_b, dev_a, kBytes, cudaMemcpyDeviceToDevice, s);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        if (work == 0) cudaMemcpyAsync(host, dev_a, kBytes, cudaMemcpyDeviceToHost, o);
        if (work == 1) cudaMemcpyAsync(dev_a, host, kBytes, cudaMemcpyHostToDevice, o);
        if (work == 2) cudaMemcpyAsync(dev_a, dev_b, kBytes, cudaMemcpyDeviceToDevice, o);
        if (work == 3) spin<<<1, 32, 0, o>>>(counter);
        if (work >= 4) {
          cudaEventRecord(timed_start, o);
          if (work == 4) cudaMemcpyAsync(host, dev_a, kBytes, cudaMemcpyDeviceToHost, o);
          if (work == 5) cudaMemcpyAsync(dev_a, host, kBytes, cudaMemcpyHostToDevice, o);
          cudaEventRecord(timed_end, o);
        }
        cudaEventRecord(done, o);
        const bool ran = wait_event(done, 2.0);
        __atomic_store_n(flag, value, __ATOMIC_RELEASE);
        cudaStreamSynchronize(s);
        cudaStreamSynchronize(o);
        std::printf("S parked, %-15s behind the wait; O's %-9s %s\n", behinds[behind], works[work],
                    ran ? "ran" : "DID NOT RUN until the flag was written");
      }
    }
  }
  std::printf("last error: %s\n", cudaGetErrorName(cudaGetLastError()));
  return 0;
}
