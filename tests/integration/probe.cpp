// The interposition probe: one scenario, reached through one of three ways a program can get at
// CUDA, chosen at build time (PROBE_WAY):
//
//   1 runtime   linked against libcudart (dynamic): cudaMalloc, cudaStreamBeginCapture, ...
//   2 procaddr  linked against libcuda; every other driver function through cuGetProcAddress
//   3 dlopen    links no CUDA library: dlopen("libcuda.so.1") and dlsym of each ABI name
//
// The scenario: a buffer A allocated outside any capture, a buffer B allocated while the stream
// captures (as PyTorch's graph pool does), a graph that fills B and copies A into it, two
// launches, and the frees. stdout carries only what the program computed (checksums of B) and the
// calls it made, so it is identical with and without vaswap. When libvaswap.so is preloaded, the
// probe also asks vaswap for the slot behind B between the launches (at B's address, mapped),
// and writes what vaswap counted to stderr, for tests/integration/preload_ways_test.sh to compare
// with the calls.
#include <cuda.h>
#include <dlfcn.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#if PROBE_WAY == 1
#include <cuda_runtime_api.h>
#endif

#include "vaswap/vaswap.h"

namespace {

constexpr size_t kA = 1u << 20;  // not captured
constexpr size_t kB = 8u << 20;  // captured: a slot when selection.min_bytes <= 8 MiB

[[noreturn]] void die(const char* what, int rc) {
  std::fprintf(stderr, "probe: %s failed with %d\n", what, rc);
  std::exit(1);
}
#define CHECK(call)                \
  do {                             \
    const int rc_ = (int)(call);   \
    if (rc_ != 0) die(#call, rc_); \
  } while (0)

uint64_t fnv1a(const std::vector<uint8_t>& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : bytes) h = (h ^ b) * 1099511628211ull;
  return h;
}

// ------------------------------------------------------------------------------------------------
// The three ways in, behind one small interface
// ------------------------------------------------------------------------------------------------

struct Cuda {
  virtual ~Cuda() = default;
  virtual void init() = 0;
  virtual void* stream() = 0;
  virtual uintptr_t alloc(size_t bytes) = 0;
  virtual uintptr_t alloc_captured(size_t bytes) { return alloc(bytes); }
  virtual void reset() { die("reset is only probed through the runtime", 0); }
  virtual void free(uintptr_t p) = 0;
  virtual uintptr_t alloc_async(size_t bytes, void* stream) = 0;  // stream-ordered
  virtual void free_async(uintptr_t p, void* stream) = 0;
  virtual void begin_capture(void* stream) = 0;
  virtual void relaxed(bool on) = 0;  // the thread's capture mode, around a captured allocation
  virtual void* end_capture(void* stream) = 0;
  virtual void* instantiate(void* graph) = 0;
  virtual void launch(void* exec, void* stream) = 0;
  virtual void destroy(void* exec, void* graph) = 0;
  virtual void memset32(uintptr_t p, uint32_t value, size_t words, void* stream) = 0;
  virtual void copy(uintptr_t dst, uintptr_t src, size_t bytes, void* stream) = 0;
  virtual void sync(void* stream) = 0;
  virtual void read(void* host, uintptr_t src, size_t bytes) = 0;
  // Whether CUDA calls `p` device memory (as launchers check each pointer argument).
  virtual bool device_pointer(uintptr_t p) = 0;
};

#if PROBE_WAY == 1
const char* const kWay = "runtime";
struct Way : Cuda {
  void init() override { CHECK(cudaSetDevice(0)); }
  void* stream() override {
    cudaStream_t s = nullptr;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }
  uintptr_t alloc(size_t bytes) override {
    void* p = nullptr;
    CHECK(cudaMalloc(&p, bytes));
    return reinterpret_cast<uintptr_t>(p);
  }
  // PROBE_ALLOC_LIBRARY names a library whose probe_alloc(void**, size_t) makes the captured
  // allocation instead (the test's stand-in for NCCL).
  uintptr_t alloc_captured(size_t bytes) override {
    const char* library = std::getenv("PROBE_ALLOC_LIBRARY");
    if (library == nullptr) return alloc(bytes);
    void* lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    using AllocFn = cudaError_t (*)(void**, size_t);
    auto fn = lib != nullptr ? reinterpret_cast<AllocFn>(dlsym(lib, "probe_alloc")) : nullptr;
    if (fn == nullptr) die(dlerror(), 0);
    void* p = nullptr;
    CHECK(fn(&p, bytes));
    return reinterpret_cast<uintptr_t>(p);
  }
  void free(uintptr_t p) override { CHECK(cudaFree(reinterpret_cast<void*>(p))); }
  uintptr_t alloc_async(size_t bytes, void* s) override {
    void* p = nullptr;
    CHECK(cudaMallocAsync(&p, bytes, static_cast<cudaStream_t>(s)));
    return reinterpret_cast<uintptr_t>(p);
  }
  void free_async(uintptr_t p, void* s) override {
    CHECK(cudaFreeAsync(reinterpret_cast<void*>(p), static_cast<cudaStream_t>(s)));
  }
  void reset() override { CHECK(cudaDeviceReset()); }
  void begin_capture(void* s) override {
    CHECK(cudaStreamBeginCapture(static_cast<cudaStream_t>(s), cudaStreamCaptureModeGlobal));
  }
  void relaxed(bool on) override {
    cudaStreamCaptureMode mode = on ? cudaStreamCaptureModeRelaxed : cudaStreamCaptureModeGlobal;
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  }
  void* end_capture(void* s) override {
    cudaGraph_t g = nullptr;
    CHECK(cudaStreamEndCapture(static_cast<cudaStream_t>(s), &g));
    return g;
  }
  void* instantiate(void* g) override {
    cudaGraphExec_t e = nullptr;
    CHECK(cudaGraphInstantiate(&e, static_cast<cudaGraph_t>(g), 0));
    return e;
  }
  void launch(void* e, void* s) override {
    CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(e), static_cast<cudaStream_t>(s)));
  }
  void destroy(void* e, void* g) override {
    CHECK(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(e)));
    CHECK(cudaGraphDestroy(static_cast<cudaGraph_t>(g)));
  }
  void memset32(uintptr_t p, uint32_t v, size_t words, void* s) override {
    // cudaMemsetAsync sets bytes: use a byte pattern the words then carry
    CHECK(cudaMemsetAsync(reinterpret_cast<void*>(p), static_cast<int>(v & 0xff), words * 4,
                          static_cast<cudaStream_t>(s)));
  }
  void copy(uintptr_t d, uintptr_t src, size_t n, void* s) override {
    CHECK(cudaMemcpyAsync(reinterpret_cast<void*>(d), reinterpret_cast<void*>(src), n,
                          cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(s)));
  }
  void sync(void* s) override { CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(s))); }
  void read(void* h, uintptr_t src, size_t n) override {
    CHECK(cudaMemcpy(h, reinterpret_cast<void*>(src), n, cudaMemcpyDeviceToHost));
  }
  bool device_pointer(uintptr_t p) override {
    cudaPointerAttributes a{};
    return cudaPointerGetAttributes(&a, reinterpret_cast<void*>(p)) == cudaSuccess &&
           a.type == cudaMemoryTypeDevice && a.devicePointer == reinterpret_cast<void*>(p);
  }
};
#else
// The driver table: each function by its exported ABI name (dlopen way) or by its base name and
// CUDA version (cuGetProcAddress way).
#define PROBE_DRIVER(X)                                                            \
  X(cuInit, "cuInit", 2000)                                                        \
  X(cuDeviceGet, "cuDeviceGet", 2000)                                              \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000)                    \
  X(cuCtxSetCurrent, "cuCtxSetCurrent", 4000)                                      \
  X(cuStreamCreate, "cuStreamCreate", 2000)                                        \
  X(cuMemAlloc, "cuMemAlloc_v2", 3020)                                             \
  X(cuMemFree, "cuMemFree_v2", 3020)                                               \
  X(cuMemAllocAsync, "cuMemAllocAsync", 11020)                                     \
  X(cuMemFreeAsync, "cuMemFreeAsync", 11020)                                       \
  X(cuStreamBeginCapture, "cuStreamBeginCapture_v2", 10010)                        \
  X(cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode", 10010) \
  X(cuStreamEndCapture, "cuStreamEndCapture", 10000)                               \
  X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 11040)             \
  X(cuGraphLaunch, "cuGraphLaunch", 10000)                                         \
  X(cuGraphExecDestroy, "cuGraphExecDestroy", 10000)                               \
  X(cuGraphDestroy, "cuGraphDestroy", 10000)                                       \
  X(cuMemsetD32Async, "cuMemsetD32Async", 3020)                                    \
  X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", 3020)                               \
  X(cuMemcpyDtoH, "cuMemcpyDtoH_v2", 3020)                                         \
  X(cuStreamSynchronize, "cuStreamSynchronize", 2000)                              \
  X(cuPointerGetAttribute, "cuPointerGetAttribute", 4000)                          \
  X(cuPointerGetAttributes, "cuPointerGetAttributes", 7000)

struct Driver {
#define PROBE_MEMBER(name, abi, version) decltype(&::name) name = nullptr;
  PROBE_DRIVER(PROBE_MEMBER)
#undef PROBE_MEMBER
};

#if PROBE_WAY == 2
const char* const kWay = "procaddr";
void load(Driver* d) {
  // cuGetProcAddress itself comes from the link (libcuda.so.1); everything else through it.
#define PROBE_LOAD(name, abi, version)                                                     \
  {                                                                                        \
    void* fn = nullptr;                                                                    \
    CUdriverProcAddressQueryResult status{};                                               \
    CHECK(cuGetProcAddress(#name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &status));    \
    if (std::getenv("PROBE_DEBUG") != nullptr) std::fprintf(stderr, "probe: %s\n", #name); \
    d->name = reinterpret_cast<decltype(d->name)>(fn);                                     \
  }
  PROBE_DRIVER(PROBE_LOAD)
#undef PROBE_LOAD
}
#else
const char* const kWay = "dlopen";
void load(Driver* d) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) die(dlerror(), 0);
#define PROBE_LOAD(name, abi, version)                            \
  d->name = reinterpret_cast<decltype(d->name)>(dlsym(lib, abi)); \
  if (d->name == nullptr) die("dlsym " abi, 0);
  PROBE_DRIVER(PROBE_LOAD)
#undef PROBE_LOAD
}
#endif

struct Way : Cuda {
  Driver d;
  void init() override {
    load(&d);
    CHECK(d.cuInit(0));
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    CHECK(d.cuDeviceGet(&dev, 0));
    CHECK(d.cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(d.cuCtxSetCurrent(ctx));
  }
  void* stream() override {
    CUstream s = nullptr;
    CHECK(d.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    return s;
  }
  uintptr_t alloc(size_t bytes) override {
    CUdeviceptr p = 0;
    CHECK(d.cuMemAlloc(&p, bytes));
    return p;
  }
  void free(uintptr_t p) override { CHECK(d.cuMemFree(p)); }
  uintptr_t alloc_async(size_t bytes, void* s) override {
    CUdeviceptr p = 0;
    CHECK(d.cuMemAllocAsync(&p, bytes, static_cast<CUstream>(s)));
    return p;
  }
  void free_async(uintptr_t p, void* s) override {
    CHECK(d.cuMemFreeAsync(p, static_cast<CUstream>(s)));
  }
  void begin_capture(void* s) override {
    CHECK(d.cuStreamBeginCapture(static_cast<CUstream>(s), CU_STREAM_CAPTURE_MODE_GLOBAL));
  }
  void relaxed(bool on) override {
    CUstreamCaptureMode mode = on ? CU_STREAM_CAPTURE_MODE_RELAXED : CU_STREAM_CAPTURE_MODE_GLOBAL;
    CHECK(d.cuThreadExchangeStreamCaptureMode(&mode));
  }
  void* end_capture(void* s) override {
    CUgraph g = nullptr;
    CHECK(d.cuStreamEndCapture(static_cast<CUstream>(s), &g));
    return g;
  }
  void* instantiate(void* g) override {
    CUgraphExec e = nullptr;
    CHECK(d.cuGraphInstantiateWithFlags(&e, static_cast<CUgraph>(g), 0));
    return e;
  }
  void launch(void* e, void* s) override {
    CHECK(d.cuGraphLaunch(static_cast<CUgraphExec>(e), static_cast<CUstream>(s)));
  }
  void destroy(void* e, void* g) override {
    CHECK(d.cuGraphExecDestroy(static_cast<CUgraphExec>(e)));
    CHECK(d.cuGraphDestroy(static_cast<CUgraph>(g)));
  }
  void memset32(uintptr_t p, uint32_t v, size_t words, void* s) override {
    CHECK(d.cuMemsetD32Async(p, v, words, static_cast<CUstream>(s)));
  }
  void copy(uintptr_t dst, uintptr_t src, size_t n, void* s) override {
    CHECK(d.cuMemcpyDtoDAsync(dst, src, n, static_cast<CUstream>(s)));
  }
  void sync(void* s) override { CHECK(d.cuStreamSynchronize(static_cast<CUstream>(s))); }
  void read(void* h, uintptr_t src, size_t n) override { CHECK(d.cuMemcpyDtoH(h, src, n)); }
  bool device_pointer(uintptr_t p) override {
    CUdeviceptr at = 0;
    if (d.cuPointerGetAttribute(&at, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, p) != CUDA_SUCCESS ||
        at != p) {
      return false;
    }
    // And as a real cudaPointerGetAttributes asks: several at once.
    unsigned int type = 0;
    int ordinal = -1;
    CUpointer_attribute which[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                   CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    void* into[] = {&type, &ordinal};
    return d.cuPointerGetAttributes(2, which, into, p) == CUDA_SUCCESS &&
           type == CU_MEMORYTYPE_DEVICE && ordinal == 0;
  }
};
#endif

// ------------------------------------------------------------------------------------------------
// vaswap, when it is preloaded
// ------------------------------------------------------------------------------------------------

struct Vaswap {
// clang-format off
#define PROBE_VASWAP(X)                                                                    \
  X(vaswap_slot_find)                                                                      \
  X(vaswap_slot_get_info) X(vaswap_host_alloc) X(vaswap_host_free) X(vaswap_offload_after) \
      X(vaswap_remap_and_copy_after) X(vaswap_remap_wait_on_stream) X(vaswap_remap_adopt)  \
          X(vaswap_remap_destroy) X(vaswap_get_stats) X(vaswap_last_error)
// clang-format on
#define PROBE_MEMBER(name) decltype(&::name) name = nullptr;
  PROBE_VASWAP(PROBE_MEMBER)
#undef PROBE_MEMBER
  bool present = false;
  Vaswap() {
#define PROBE_FIND(name) name = reinterpret_cast<decltype(name)>(dlsym(RTLD_DEFAULT, #name));
    PROBE_VASWAP(PROBE_FIND)
#undef PROBE_FIND
    present = vaswap_get_stats != nullptr;
  }
};

#define VCHECK(v, call)                                                               \
  do {                                                                                \
    if ((call) != VASWAP_OK) {                                                        \
      std::fprintf(stderr, "probe: %s failed: %s\n", #call, (v).vaswap_last_error()); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

// Finds the slot behind `b` and checks it: at B's address, with its pages (the graph's first
// launch gave them: a slot made during a capture reserves its address alone until then), its
// bytes what the program computed. Its eviction and restore under a budget are the capacity
// tests' subject (tests/integration/capacity_test.sh); the C API does not move the preload's
// slots. Exits non-zero when the slot is wrong; says so when there is none.
void check_slot(const Vaswap& v, Cuda& cuda, uintptr_t b) {
  vaswap_slot slot = nullptr;
  if (v.vaswap_slot_find(reinterpret_cast<void*>(b + 4096), &slot) == VASWAP_ERROR_NOT_FOUND) {
    std::fprintf(stderr, "vaswap: no slot behind B (%s)\n", v.vaswap_last_error());
    return;
  }
  vaswap_slot_info info{};
  VCHECK(v, v.vaswap_slot_get_info(slot, &info));
  if (info.va != b || info.mapped != 1) {
    std::fprintf(stderr, "probe: the slot is at 0x%" PRIx64 " (B is 0x%" PRIxPTR "), mapped %d\n",
                 static_cast<uint64_t>(info.va), b, info.mapped);
    std::exit(1);
  }
  std::vector<uint8_t> bytes(kB);
  cuda.read(bytes.data(), b, kB);
  std::fprintf(stderr, "vaswap: slot %" PRIu64 " at 0x%" PRIxPTR " mapped after its first launch\n",
               static_cast<uint64_t>(info.id), b);
}

}  // namespace

void step(const char* what) {
  if (std::getenv("PROBE_DEBUG") != nullptr) std::fprintf(stderr, "probe: step %s\n", what);
}

int main() {
  Way cuda;
  Vaswap vaswap;
  step("init");
  cuda.init();
  void* stream = cuda.stream();
  int allocs = 0, frees = 0, captures = 0, instantiations = 0, launches = 0;

  step("alloc A");
  const uintptr_t a = cuda.alloc(kA);
  ++allocs;
  // A stream-ordered allocation: tracked, never a slot (its pool owns the memory).
  const uintptr_t pooled = cuda.alloc_async(kB, stream);
  ++allocs;
  cuda.memset32(pooled, 0x11111111u, kB / 4, stream);
  cuda.free_async(pooled, stream);
  ++frees;
  cuda.memset32(a, 0x01020304u, kA / 4, stream);

  step("capture");
  cuda.begin_capture(stream);
  ++captures;
  cuda.relaxed(true);
  const uintptr_t b = cuda.alloc_captured(kB);
  ++allocs;
  cuda.relaxed(false);
  // Before anything uses B (under vaswap: a slot with no pages yet), as a launcher checks it.
  const bool b_device = cuda.device_pointer(b);
  cuda.memset32(b, 0x5a5a5a5au, kB / 4, stream);
  cuda.copy(b + kB / 2, a, kA, stream);
  step("end capture");
  void* graph = cuda.end_capture(stream);
  void* exec = cuda.instantiate(graph);
  ++instantiations;

  std::vector<uint8_t> out(kB);
  step("launch");
  cuda.launch(exec, stream);
  ++launches;
  cuda.sync(stream);
  cuda.read(out.data(), b, kB);
  const uint64_t first = fnv1a(out);

  if (vaswap.present) check_slot(vaswap, cuda, b);

  cuda.memset32(a, 0x0a0b0c0du, kA / 4, stream);
  cuda.launch(exec, stream);
  ++launches;
  cuda.sync(stream);
  cuda.read(out.data(), b, kB);
  const uint64_t second = fnv1a(out);

  cuda.destroy(exec, graph);
  cuda.free(a);
  ++frees;
  if (std::getenv("PROBE_RESET") != nullptr) {
    // B is left to the reset, which must take its slot with it.
    cuda.reset();
    if (vaswap.present) {
      vaswap_slot slot = nullptr;
      vaswap_stats s{};
      const vaswap_status found = vaswap.vaswap_slot_find(reinterpret_cast<void*>(b), &slot);
      VCHECK(vaswap, vaswap.vaswap_get_stats(&s));
      std::fprintf(stderr, "after reset: slot_find %s, slots_live=%" PRIu64 "\n",
                   found == VASWAP_ERROR_NOT_FOUND ? "NOT_FOUND" : "found", s.slots_live);
    }
  } else {
    cuda.free(b);
    ++frees;
  }

  std::printf("way %s\nchecksums %016" PRIx64 " %016" PRIx64 "\n", kWay, first, second);
  std::printf("B, allocated in the capture, is device memory: %s\n", b_device ? "yes" : "no");
  std::printf("calls allocations=%d frees=%d captures=%d instantiations=%d launches=%d\n", allocs,
              frees, captures, instantiations, launches);
  if (vaswap.present) {
    vaswap_stats s{};
    VCHECK(vaswap, vaswap.vaswap_get_stats(&s));
    std::fprintf(stderr,
                 "seen allocations=%" PRIu64 " frees=%" PRIu64 " captures=%" PRIu64
                 " instantiations=%" PRIu64 " launches=%" PRIu64 " slots=%" PRIu64 "\n",
                 s.allocations_seen, s.frees_seen, s.captures_seen, s.instantiations_seen,
                 s.graph_launches_seen, s.slots_selected);
  }
  return 0;
}
