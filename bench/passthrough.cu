// What the preload adds to calls it passes through: nanoseconds per call of cudaMalloc and cudaFree
// (2 MiB, outside any capture, so never selected), cudaGraphLaunch (a one-kernel graph) and
// cudaLaunchKernel (not hooked: the control), in batches, median over batches.
//
// Built with `nvcc -cudart shared`, as PyTorch links cudart, so the runtime hooks apply. Run it
// without and with LD_PRELOAD=libvaswap.so; bench/run_interpose_h200.sh alternates the runs and
// prints the table (bench/results/passthrough_h200.md).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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

}  // namespace

int main(int argc, char** argv) {
  const int batches = argc > 1 ? std::atoi(argv[1]) : 31;
  const int per_batch = argc > 2 ? std::atoi(argv[2]) : 256;
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

  std::vector<void*> blocks(per_batch);
  std::vector<double> malloc_ns, free_ns, graph_ns, kernel_ns;
  for (int b = -2; b < batches; ++b) {  // two warm-up batches
    auto t0 = Clock::now();
    for (void*& p : blocks) CHECK(cudaMalloc(&p, 2u << 20));
    auto t1 = Clock::now();
    for (void* p : blocks) CHECK(cudaFree(p));
    auto t2 = Clock::now();
    for (int i = 0; i < per_batch; ++i) CHECK(cudaGraphLaunch(exec, stream));
    auto t3 = Clock::now();
    CHECK(cudaStreamSynchronize(stream));
    auto t4 = Clock::now();
    for (int i = 0; i < per_batch; ++i) empty_kernel<<<1, 1, 0, stream>>>();
    auto t5 = Clock::now();
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(stream));
    if (b < 0) continue;
    auto ns = [&](Clock::time_point from, Clock::time_point to) {
      return std::chrono::duration<double, std::nano>(to - from).count() / per_batch;
    };
    malloc_ns.push_back(ns(t0, t1));
    free_ns.push_back(ns(t1, t2));
    graph_ns.push_back(ns(t2, t3));
    kernel_ns.push_back(ns(t4, t5));
  }
  std::printf("cudaMalloc %.1f\ncudaFree %.1f\ncudaGraphLaunch %.1f\ncudaLaunchKernel %.1f\n",
              median(malloc_ns), median(free_ns), median(graph_ns), median(kernel_ns));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return 0;
}
