// Several application threads at once: each allocates buffers, captures a graph over them (with
// its own thread-local capture mode, as PyTorch does), launches it between eager kernels,
// checks every element, and frees everything, round after round. Under vaswap on a small
// device, the slots of one thread are evicted and restored while the others capture, launch and
// free theirs (tests/integration/stress_test.sh).
//
// --legacy: graphs and eager kernels run on the legacy default stream (0), shared by every thread,
// as PyTorch replays its graphs on the current stream; captures stay on each thread's own stream.
// --copy2d: the result is read back with cudaMemcpy2DAsync (rows of 4 KiB), after a
// cudaMemset2DAsync clears it, instead of with cudaMemcpyAsync.
// --default-kind: the result is read back with cudaMemcpyAsync naming cudaMemcpyDefault (the
// driver tells the host memory from the pointer), as many programs do.
// --copy3dpeer: the result is first copied into the round's second buffer with
// cudaMemcpy3DPeerAsync (rows of 4 KiB, this device to itself), and read back from there.
//
// --nodes: the result is read back from b after a graph built node by node (the runtime's
// cudaGraphAddMemsetNode clears b, then cudaGraphAddMemcpyNode1D copies a into b, and
// cudaGraphMemcpyNodeSetParams1D makes it copy c instead) is instantiated and launched: adding
// the nodes and changing them name buffers another thread's round may have sent away.
//
// --jit: each round, each thread loads a new module through the driver, as a JIT compiler (Triton,
// NVRTC) does: dlopen("libcuda.so.1") and cuModuleLoadData at the round's start, then, in the
// middle of its launches, cuModuleGetFunction (under lazy loading the kernel is loaded then, as a
// static cudart's kernels are at their first launch) and its kernel (a = c) with cuLaunchKernel
// in place of that launch's add; the module stays loaded. Loads and lookups come while the
// thread's own stream, and others', may be parked on restores.
//
// --attributes (a GPU only): each round, each thread asks the runtime about a kernel it has never
// launched before launching it (cudaFuncGetAttributes, cudaFuncSetAttribute of the largest dynamic
// shared memory, cudaOccupancyMaxActiveBlocksPerMultiprocessor; which comes first rotates with the
// round), as libraries do before a kernel's first launch, then launches it (a = c) in place of
// the round's middle add. Under lazy loading, CUDA's default, the first question loads the kernel,
// and a load waits for every stream parked on a wait-value
// (bench/results/park_attributes_h100.txt).
//
// --free-while-capturing: instead of the rounds, one thread frees a buffer while another has a
// capture (thread-local mode) open, then the capture ends and its graph runs: prints
// "free while capturing: checksum 0x..." from the graph's result.
//
// Prints "stress: threads T rounds R checksum 0x..." and exits 0 when every element of every
// round holds its expected value; otherwise names the thread, round, element and values and
// exits 1. A CUDA call that fails names itself and exits 1.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "vaswap_sim/kernel.h"
#ifndef __CUDACC__
#include "vaswap_sim/abi.h"
#endif

VSK_GLOBAL void fill_u32(uint32_t* out, uint32_t seed, uint32_t n) {
  VSK_FOR(i, n) { out[i] = static_cast<uint32_t>(i) * 2654435761u ^ seed; }
}
VSK_REGISTER(fill_u32)

VSK_GLOBAL void add_u32(uint32_t* y, const uint32_t* x, uint32_t value, uint32_t n) {
  VSK_FOR(i, n) { y[i] = x[i] + value; }
}
VSK_REGISTER(add_u32)

namespace {

std::atomic<int> g_failed{0};
bool g_legacy = false;
bool g_copy2d = false;
bool g_default_kind = false;
bool g_copy3d_peer = false;
bool g_jit = false;
bool g_attributes = false;
bool g_nodes = false;
std::mutex g_print;

bool ok(cudaError_t rc, const char* call, int thread, int round) {
  if (rc == cudaSuccess) return true;
  std::lock_guard<std::mutex> lock(g_print);
  std::fprintf(stderr, "stress_probe: thread %d round %d: %s failed: %s (%s)\n", thread, round,
               call, cudaGetErrorName(rc), cudaGetErrorString(rc));
  g_failed.store(1);
  return false;
}
#define CHECK(call) \
  if (!ok((call), #call, thread, round)) return

constexpr uint32_t kElems = 1u << 18;  // 1 MiB of uint32
constexpr int kLaunches = 6;

void launch_add(uint32_t* y, const uint32_t* x, uint32_t value, cudaStream_t s, cudaError_t* rc) {
  uint32_t n = kElems;
  void* args[] = {&y, &x, &value, &n};
  *rc = cudaLaunchKernel(reinterpret_cast<const void*>(add_u32), dim3(256), dim3(256), args, 0, s);
}

// --jit: a module loaded through the driver at run time, as a JIT compiler's. Its one kernel is
// copy_u32(uint32_t* dst, const uint32_t* src, uint32_t n): PTX on a GPU (the driver compiles it
// at the load, as it does Triton's), a simulator image on the simulator (a host function and its
// parameter layout, vaswap_sim/abi.h).
#ifdef __CUDACC__
const char kJitImage[] = R"(
.version 8.0
.target sm_90
.address_size 64
.visible .entry copy_u32(.param .u64 dst, .param .u64 src, .param .u32 n)
{
  .reg .pred %p<2>;
  .reg .u32 %r<8>;
  .reg .u64 %rd<6>;
  ld.param.u64 %rd1, [dst];
  ld.param.u64 %rd2, [src];
  ld.param.u32 %r1, [n];
  cvta.to.global.u64 %rd1, %rd1;
  cvta.to.global.u64 %rd2, %rd2;
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mov.u32 %r4, %tid.x;
  mad.lo.u32 %r5, %r2, %r3, %r4;
  mov.u32 %r6, %nctaid.x;
  mul.lo.u32 %r6, %r6, %r3;
LOOP:
  setp.ge.u32 %p1, %r5, %r1;
  @%p1 bra DONE;
  mul.wide.u32 %rd3, %r5, 4;
  add.u64 %rd4, %rd2, %rd3;
  ld.global.u32 %r7, [%rd4];
  add.u64 %rd5, %rd1, %rd3;
  st.global.u32 [%rd5], %r7;
  add.u32 %r5, %r5, %r6;
  bra LOOP;
DONE:
  ret;
}
)";
#else
void copy_u32_entry(const void* args, const vaswap_sim_dims*) {
  uint32_t* dst = nullptr;
  const uint32_t* src = nullptr;
  uint32_t n = 0;
  std::memcpy(&dst, static_cast<const char*>(args), sizeof dst);
  std::memcpy(&src, static_cast<const char*>(args) + 8, sizeof src);
  std::memcpy(&n, static_cast<const char*>(args) + 16, sizeof n);
  for (uint32_t i = 0; i < n; ++i) dst[i] = src[i];
}
const uint32_t kCopyOffsets[] = {0, 8, 16};
const uint32_t kCopySizes[] = {8, 8, 4};
const vaswap_sim_kernel_desc kCopyKernel[] = {
    {"copy_u32", &copy_u32_entry, 3, kCopyOffsets, kCopySizes, 24}};
const vaswap_sim_image kJitImage = {VASWAP_SIM_IMAGE_MAGIC, VASWAP_SIM_IMAGE_VERSION, 1,
                                    kCopyKernel};
#endif

// The driver's functions, as a JIT compiler finds them (dlsym into libcuda; vaswap routes them).
struct JitDriver {
  CUresult (*load)(CUmodule*, const void*) = nullptr;
  CUresult (*get)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                     unsigned, CUstream, void**, void**) = nullptr;
};

const JitDriver* jit_driver() {
  static const JitDriver driver = [] {
    JitDriver d;
    void* cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (cuda == nullptr) return d;
    d.load = reinterpret_cast<decltype(d.load)>(dlsym(cuda, "cuModuleLoadData"));
    d.get = reinterpret_cast<decltype(d.get)>(dlsym(cuda, "cuModuleGetFunction"));
    d.launch = reinterpret_cast<decltype(d.launch)>(dlsym(cuda, "cuLaunchKernel"));
    return d;
  }();
  return driver.load != nullptr && driver.get != nullptr && driver.launch != nullptr ? &driver
                                                                                     : nullptr;
}

bool jit_failed(const char* call, CUresult rc, int thread, int round) {
  std::lock_guard<std::mutex> lock(g_print);
  std::fprintf(stderr, "stress_probe: thread %d round %d: %s failed: %d\n", thread, round, call,
               static_cast<int>(rc));
  g_failed.store(1);
  return false;
}

// A new module, loaded now; it stays loaded, as a JIT compiler's cached kernels do.
bool jit_load(CUmodule* module, int thread, int round) {
  const JitDriver* d = jit_driver();
  if (d == nullptr)
    return jit_failed("dlopen/dlsym libcuda.so.1", CUDA_ERROR_NOT_FOUND, thread, round);
  if (CUresult rc = d->load(module, &kJitImage))
    return jit_failed("cuModuleLoadData", rc, thread, round);
  return true;
}

// dst = src through `module`'s kernel, looked up now (its first lookup: lazy loading loads it
// then); the launch is enqueued on `s` before this returns.
bool jit_copy(CUmodule module, uint32_t* dst, const uint32_t* src, cudaStream_t s, int thread,
              int round) {
  const JitDriver* d = jit_driver();
  CUfunction function = nullptr;
  if (CUresult rc = d->get(&function, module, "copy_u32")) {
    return jit_failed("cuModuleGetFunction", rc, thread, round);
  }
  uint32_t n = kElems;
  void* args[] = {&dst, &src, &n};
  if (CUresult rc = d->launch(function, 256, 1, 1, 256, 1, 1, 0, reinterpret_cast<CUstream>(s),
                              args, nullptr)) {
    return jit_failed("cuLaunchKernel", rc, thread, round);
  }
  return true;
}

// --attributes: kernels no round has launched before it, one for each thread and round.
constexpr int kFreshKernels = 128;
#ifdef __CUDACC__
template <int N>
__global__ void fresh_copy(uint32_t* dst, const uint32_t* src, uint32_t n) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    dst[i] = src[i] + static_cast<uint32_t>(N - N);
  }
}
using FreshKernel = void (*)(uint32_t*, const uint32_t*, uint32_t);
template <int... N>
constexpr std::array<FreshKernel, sizeof...(N)> fresh_table(std::integer_sequence<int, N...>) {
  return {fresh_copy<N>...};
}
const std::array<FreshKernel, kFreshKernels> kFresh =
    fresh_table(std::make_integer_sequence<int, kFreshKernels>{});

// a = c through kernel `index`, asked about first.
cudaError_t fresh_copy_now(int index, int round, uint32_t* dst, const uint32_t* src,
                           cudaStream_t s) {
  const FreshKernel kernel = kFresh[static_cast<size_t>(index)];
  cudaFuncAttributes attributes{};
  int blocks = 0;
  for (int q = 0; q < 3; ++q) {
    cudaError_t rc = cudaSuccess;
    switch ((q + round) % 3) {
      case 0: rc = cudaFuncGetAttributes(&attributes, kernel); break;
      case 1:
        rc = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 1024);
        break;
      default: rc = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, 256, 0); break;
    }
    if (rc != cudaSuccess) return rc;
  }
  kernel<<<256, 256, 0, s>>>(dst, src, kElems);
  return cudaGetLastError();
}
#else
cudaError_t fresh_copy_now(int, int, uint32_t*, const uint32_t*, cudaStream_t) {
  return cudaErrorNotSupported;
}
#endif

// One thread's rounds. a -> (graph: b = a + 1; c = b + 2) -> (eager: a = c), kLaunches times:
// c ends as the seed's fill plus 3 * kLaunches.
void work(int thread, int rounds, uint64_t* checksum) {
  int round = 0;
  cudaStream_t capture = nullptr;
  CHECK(cudaStreamCreateWithFlags(&capture, cudaStreamNonBlocking));
  cudaStream_t s = g_legacy ? cudaStreamLegacy : capture;
  std::vector<uint32_t> host(kElems);
  for (round = 0; round < rounds && g_failed.load() == 0; ++round) {
    void* buffers[3] = {};
    for (void*& p : buffers) CHECK(cudaMalloc(&p, kElems * sizeof(uint32_t)));
    auto* a = static_cast<uint32_t*>(buffers[0]);
    auto* b = static_cast<uint32_t*>(buffers[1]);
    auto* c = static_cast<uint32_t*>(buffers[2]);
    const uint32_t seed = static_cast<uint32_t>(thread * 7919 + round * 104729);
    CUmodule module = nullptr;
    if (g_jit && !jit_load(&module, thread, round)) return;
    {
      uint32_t n = kElems;
      uint32_t seed_arg = seed;
      void* args[] = {&a, &seed_arg, &n};
      CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(fill_u32), dim3(256), dim3(256), args, 0,
                             s));
    }
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    if (g_legacy) CHECK(cudaStreamSynchronize(s));  // the fill, before the capture stream reads a
    CHECK(cudaStreamBeginCapture(capture, cudaStreamCaptureModeThreadLocal));
    cudaError_t rc1 = cudaSuccess, rc2 = cudaSuccess;
    launch_add(b, a, 1, capture, &rc1);
    launch_add(c, b, 2, capture, &rc2);
    CHECK(cudaStreamEndCapture(capture, &graph));
    CHECK(rc1);
    CHECK(rc2);
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int k = 0; k < kLaunches; ++k) {
      CHECK(cudaGraphLaunch(exec, s));
      cudaError_t rc = cudaSuccess;
      if (g_jit && k == kLaunches / 2) {
        if (!jit_copy(module, a, c, s, thread, round)) return;
      } else if (g_attributes && k == kLaunches / 2) {
        rc = fresh_copy_now(thread * rounds + round, round, a, c, s);
      } else {
        launch_add(a, c, 0, s, &rc);
      }
      CHECK(rc);
      if (k % 2 == 1) std::this_thread::yield();
    }
    constexpr size_t kRow = 4096, kRows = kElems * sizeof(uint32_t) / kRow;
    if (g_copy3d_peer) {
      int device = 0;
      CHECK(cudaGetDevice(&device));
      cudaMemcpy3DPeerParms p{};
      p.srcPtr = cudaPitchedPtr{c, kRow, kRow, kRows};
      p.srcDevice = device;
      p.dstPtr = cudaPitchedPtr{b, kRow, kRow, kRows};  // b is read no more this round
      p.dstDevice = device;
      p.extent = cudaExtent{kRow, kRows, 1};
      CHECK(cudaMemcpy3DPeerAsync(&p, s));
      CHECK(cudaMemcpyAsync(host.data(), b, kElems * sizeof(uint32_t), cudaMemcpyDeviceToHost, s));
    } else if (g_nodes) {
      constexpr size_t kBytes = kElems * sizeof(uint32_t);
      cudaGraph_t built = nullptr;
      CHECK(cudaGraphCreate(&built, 0));
      cudaMemsetParams clear{};
      clear.dst = b;  // b is read no more this round
      clear.elementSize = sizeof(uint32_t);
      clear.width = kElems;
      clear.height = 1;
      cudaGraphNode_t clear_node = nullptr, copy_node = nullptr;
      CHECK(cudaGraphAddMemsetNode(&clear_node, built, nullptr, 0, &clear));
      CHECK(cudaGraphAddMemcpyNode1D(&copy_node, built, &clear_node, 1, b, a, kBytes,
                                     cudaMemcpyDeviceToDevice));
      std::this_thread::yield();
      CHECK(cudaGraphMemcpyNodeSetParams1D(copy_node, b, c, kBytes, cudaMemcpyDeviceToDevice));
      cudaGraphExec_t built_exec = nullptr;
      CHECK(cudaGraphInstantiate(&built_exec, built, 0));
      CHECK(cudaGraphLaunch(built_exec, s));
      CHECK(cudaMemcpyAsync(host.data(), b, kBytes, cudaMemcpyDeviceToHost, s));
      CHECK(cudaStreamSynchronize(s));
      CHECK(cudaGraphExecDestroy(built_exec));
      CHECK(cudaGraphDestroy(built));
    } else if (g_copy2d) {
      CHECK(cudaMemcpy2DAsync(host.data(), kRow, c, kRow, kRow, kRows, cudaMemcpyDeviceToHost, s));
      CHECK(cudaMemset2DAsync(b, kRow, 0, kRow, kRows, s));  // b is read no more this round
    } else {
      CHECK(cudaMemcpyAsync(host.data(), c, kElems * sizeof(uint32_t),
                            g_default_kind ? cudaMemcpyDefault : cudaMemcpyDeviceToHost, s));
    }
    CHECK(cudaStreamSynchronize(s));
    for (uint32_t i = 0; i < kElems; ++i) {
      const uint32_t want = (i * 2654435761u ^ seed) + 3u * kLaunches;
      if (host[i] != want) {
        std::lock_guard<std::mutex> lock(g_print);
        std::fprintf(stderr,
                     "stress_probe: thread %d round %d: element %u is 0x%08x, expected 0x%08x\n",
                     thread, round, i, host[i], want);
        g_failed.store(1);
        return;
      }
      *checksum = *checksum * 1099511628211ull ^ host[i];
    }
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    for (void* p : buffers) CHECK(cudaFree(p));
  }
  CHECK(cudaStreamDestroy(capture));
}

// Thread A opens a capture and records b = a + 1; thread B frees another buffer meanwhile; A
// records c = b + 2, ends the capture and launches the graph. On a GPU a device-wide synchronize
// during the capture (cudaFree's, or vaswap's for a slot) would invalidate it.
int free_while_capturing() {
  const int thread = 0, round = 0;
  int rc = 1;
  std::mutex m;
  std::condition_variable cv;
  int stage = 0;  // 1: A's capture is open; 2: B freed
  auto step = [&](int to) {
    std::lock_guard<std::mutex> lock(m);
    stage = to;
    cv.notify_all();
  };
  auto await = [&](int at) {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return stage >= at; });
  };
  void* doomed = nullptr;
  std::thread b([&] {
    await(1);
    ok(cudaFree(doomed), "cudaFree(doomed)", 1, 0);
    step(2);
  });
  [&] {
    void* buffers[3] = {};
    for (void*& p : buffers) CHECK(cudaMalloc(&p, kElems * sizeof(uint32_t)));
    CHECK(cudaMalloc(&doomed, kElems * sizeof(uint32_t)));
    auto* a = static_cast<uint32_t*>(buffers[0]);
    auto* bb = static_cast<uint32_t*>(buffers[1]);
    auto* c = static_cast<uint32_t*>(buffers[2]);
    cudaStream_t s = nullptr;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    {
      uint32_t n = kElems, seed = 12345;
      void* args[] = {&a, &seed, &n};
      CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(fill_u32), dim3(256), dim3(256), args, 0,
                             s));
      // The doomed buffer was used too: its free must wait for this work.
      void* args2[] = {&doomed, &seed, &n};
      CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(fill_u32), dim3(256), dim3(256), args2,
                             0, s));
      CHECK(cudaStreamSynchronize(s));
    }
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cudaError_t rc1 = cudaSuccess, rc2 = cudaSuccess;
    launch_add(bb, a, 1, s, &rc1);
    step(1);
    await(2);
    launch_add(c, bb, 2, s, &rc2);
    CHECK(cudaStreamEndCapture(s, &graph));
    CHECK(rc1);
    CHECK(rc2);
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphLaunch(exec, s));
    std::vector<uint32_t> host(kElems);
    CHECK(cudaMemcpyAsync(host.data(), c, kElems * sizeof(uint32_t), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    uint64_t sum = 1469598103934665603ull;
    for (uint32_t i = 0; i < kElems; ++i) {
      const uint32_t want = (i * 2654435761u ^ 12345u) + 3u;
      if (host[i] != want) {
        std::fprintf(stderr, "stress_probe: element %u is 0x%08x, expected 0x%08x\n", i, host[i],
                     want);
        return;
      }
      sum = sum * 1099511628211ull ^ host[i];
    }
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    for (void* p : buffers) CHECK(cudaFree(p));
    CHECK(cudaStreamDestroy(s));
    std::printf("free while capturing: checksum 0x%016" PRIx64 "\n", sum);
    rc = 0;
  }();
  if (stage < 1) step(1);  // A failed before its capture: let B go
  b.join();
  return rc == 0 && g_failed.load() == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 4, rounds = 8;
  const char* usage =
      "usage: stress_probe [--threads N] [--rounds N] [--legacy] [--copy2d] [--copy3dpeer] [--jit] "
      "[--attributes] [--default-kind] [--nodes] [--free-while-capturing]\n";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--free-while-capturing") == 0) return free_while_capturing();
  }
  for (int i = 1; i < argc; i += 2) {
    bool* flag = std::strcmp(argv[i], "--legacy") == 0         ? &g_legacy
                 : std::strcmp(argv[i], "--copy2d") == 0       ? &g_copy2d
                 : std::strcmp(argv[i], "--copy3dpeer") == 0   ? &g_copy3d_peer
                 : std::strcmp(argv[i], "--jit") == 0          ? &g_jit
                 : std::strcmp(argv[i], "--attributes") == 0   ? &g_attributes
                 : std::strcmp(argv[i], "--nodes") == 0        ? &g_nodes
                 : std::strcmp(argv[i], "--default-kind") == 0 ? &g_default_kind
                                                               : nullptr;
    if (flag != nullptr) {
      *flag = true;
      --i;
    } else if (i + 1 >= argc) {
      std::fputs(usage, stderr);
      return 2;
    } else if (std::strcmp(argv[i], "--threads") == 0) {
      threads = std::atoi(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--rounds") == 0) {
      rounds = std::atoi(argv[i + 1]);
    } else {
      std::fputs(usage, stderr);
      return 2;
    }
  }
  if (g_attributes && threads * rounds > kFreshKernels) {
    std::fprintf(stderr, "stress_probe: --attributes has %d fresh kernels, for threads x rounds\n",
                 kFreshKernels);
    return 2;
  }
  std::vector<uint64_t> sums(static_cast<size_t>(threads), 1469598103934665603ull);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back(work, t, rounds, &sums[static_cast<size_t>(t)]);
  }
  for (auto& t : pool) t.join();
  if (g_failed.load() != 0) return 1;
  uint64_t total = 0;
  for (uint64_t s : sums) total = total * 31 + s;
  std::printf("stress: threads %d rounds %d checksum 0x%016" PRIx64 "\n", threads, rounds, total);
  return 0;
}
