// What the preload adds to calls it passes through, measured inside one process: each call is
// made in batches both through its symbol (which resolves to vaswap's hook when libvaswap.so is
// preloaded) and through libcudart's own function (dlvsym, which vaswap does not route), in
// alternating order, and the per-call difference of each pair of batches is kept. The median
// difference is the added cost; without the preload it is the method's noise floor.
//
// Calls: cudaMalloc and cudaFree (2 MiB, outside any capture, so never selected),
// cudaGraphLaunch (a one-kernel graph), cudaThreadExchangeStreamCaptureMode (hooked and nearly
// free, so the hook's own cost shows), and cudaLaunchKernel (hooked for the planner's
// eager scan: with vaswap on, the cost of one scan).
//
// Built with `nvcc -cudart shared`, as PyTorch links cudart. bench/run_interpose_h200.sh runs it
// without the preload, with it off, and with it on, and writes bench/results/passthrough_h200.md.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#define CHECK(call)                                                           \
  do {                                                                        \
    cudaError_t e_ = (call);                                                  \
    if (e_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

__global__ void empty_kernel() {}

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class Fn>
Fn cudart_own(const char* name) {
  void* lib = dlopen("libcudart.so.13", RTLD_LAZY | RTLD_NOLOAD);
  void* fn = lib != nullptr ? dlvsym(lib, name, "libcudart.so.13") : nullptr;
  if (fn == nullptr) {
    std::fprintf(stderr, "cannot find libcudart.so.13's own %s\n", name);
    std::exit(1);
  }
  return reinterpret_cast<Fn>(fn);
}

// Runs `batch(hooked)` for hooked = true and false, alternating which goes first, and returns the
// per-call times of each and the per-call paired differences.
struct Result {
  double via_symbol_ns, direct_ns, added_ns;
};
Result measure(int batches, int per_batch, const std::function<void(bool)>& batch) {
  std::vector<double> a, b, d;
  for (int k = -2; k < batches; ++k) {
    double t[2];
    for (int j = 0; j < 2; ++j) {
      const bool hooked = (k + j) % 2 == 0;
      const auto t0 = Clock::now();
      batch(hooked);
      t[hooked ? 0 : 1] =
          std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / per_batch;
    }
    if (k < 0) continue;  // warm-up
    a.push_back(t[0]);
    b.push_back(t[1]);
    d.push_back(t[0] - t[1]);
  }
  return {median(a), median(b), median(d)};
}

}  // namespace

int main(int argc, char** argv) {
  const int batches = argc > 1 ? std::atoi(argv[1]) : 101;
  const int n = argc > 2 ? std::atoi(argv[2]) : 128;
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  empty_kernel<<<1, 1, 0, stream>>>();
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));

  using MallocFn = cudaError_t (*)(void**, size_t);
  using FreeFn = cudaError_t (*)(void*);
  using LaunchFn = cudaError_t (*)(cudaGraphExec_t, cudaStream_t);
  using ExchangeFn = cudaError_t (*)(cudaStreamCaptureMode*);
  using KernelFn = cudaError_t (*)(const void*, dim3, dim3, void**, size_t, cudaStream_t);
  const auto own_malloc = cudart_own<MallocFn>("cudaMalloc");
  const auto own_free = cudart_own<FreeFn>("cudaFree");
  const auto own_launch = cudart_own<LaunchFn>("cudaGraphLaunch");
  const auto own_exchange = cudart_own<ExchangeFn>("cudaThreadExchangeStreamCaptureMode");
  const auto own_kernel = cudart_own<KernelFn>("cudaLaunchKernel");
  const MallocFn via_malloc = &cudaMalloc;  // the symbol: vaswap's hook when preloaded
  const KernelFn via_kernel = &cudaLaunchKernel;

  std::vector<void*> blocks(n);
  const Result alloc = measure(batches, n, [&](bool hooked) {
    for (void*& p : blocks) CHECK(hooked ? via_malloc(&p, 2u << 20) : own_malloc(&p, 2u << 20));
    for (void* p : blocks) CHECK(own_free(p));
  });
  const Result release = measure(batches, n, [&](bool hooked) {
    for (void*& p : blocks) CHECK(own_malloc(&p, 2u << 20));
    for (void* p : blocks) CHECK(hooked ? cudaFree(p) : own_free(p));
  });
  const Result launch = measure(batches, n, [&](bool hooked) {
    for (int i = 0; i < n; ++i)
      CHECK(hooked ? cudaGraphLaunch(exec, stream) : own_launch(exec, stream));
    CHECK(cudaStreamSynchronize(stream));
  });
  const Result exchange = measure(batches, n, [&](bool hooked) {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    for (int i = 0; i < n; ++i) {
      CHECK(hooked ? cudaThreadExchangeStreamCaptureMode(&mode) : own_exchange(&mode));
    }
  });
  void* no_args[1] = {nullptr};
  const Result kernel = measure(batches, n, [&](bool hooked) {
    for (int i = 0; i < n; ++i) {
      CHECK((hooked ? via_kernel : own_kernel)(reinterpret_cast<const void*>(&empty_kernel),
                                               dim3(1), dim3(1), no_args, 0, stream));
    }
    CHECK(cudaStreamSynchronize(stream));
  });
  // malloc and free batches include the other half of the pair; graph and kernel batches include
  // one synchronize: both are the same for the two sides, so the difference is the call's.
  std::printf("call via_symbol_ns direct_ns added_ns\n");
  std::printf("cudaMalloc %.1f %.1f %.1f\n", alloc.via_symbol_ns, alloc.direct_ns, alloc.added_ns);
  std::printf("cudaFree %.1f %.1f %.1f\n", release.via_symbol_ns, release.direct_ns,
              release.added_ns);
  std::printf("cudaGraphLaunch %.1f %.1f %.1f\n", launch.via_symbol_ns, launch.direct_ns,
              launch.added_ns);
  std::printf("cudaThreadExchangeStreamCaptureMode %.1f %.1f %.1f\n", exchange.via_symbol_ns,
              exchange.direct_ns, exchange.added_ns);
  std::printf("cudaLaunchKernel %.1f %.1f %.1f\n", kernel.via_symbol_ns, kernel.direct_ns,
              kernel.added_ns);
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return 0;
}
