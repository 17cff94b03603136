// A graph and a second stream that share a buffer only the graph's first and last kernels read
// (a frozen table, as frozen weights are): each step the graph runs on stream S, then a long
// kernel on stream X reads the table while the program enqueues the next launch on S at once.
// Both only read the table, so the program orders nothing between X and S's next launch; it is
// correct without vaswap. Under vaswap, when the graph is rewritten with a window that takes the
// table off the device between its two uses (inside.mode=on and a residency.budget), the next
// launch must not move the table before X has finished reading it (DESIGN.md invariant 3).
//
// The graph: t = table + 1 (first kernel), then kMiddle kernels that only touch `act`, then
// out = t + table (last kernel). X: side = table * kPasses, summed over kPasses passes.
// Prints "side stream: steps N checksum 0x..." and exits 0 when every element holds its value;
// otherwise names the buffer, step and element and exits 1. A CUDA call that fails names itself.
// With --alternate, the graph's launches alternate between S and a third stream S2, ordered after
// one another only as CUDA orders every launch of one executable graph.
// Usage: side_stream_probe [--alternate] [STEPS]
#include <cuda_runtime_api.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "vaswap_sim/kernel.h"

VSK_GLOBAL void fill_table(uint32_t* table, uint32_t n) {
  VSK_FOR(i, n) { table[i] = static_cast<uint32_t>(i) * 2654435761u; }
}
VSK_REGISTER(fill_table)

VSK_GLOBAL void add_one(uint32_t* y, const uint32_t* x, uint32_t n) {
  VSK_FOR(i, n) { y[i] = x[i] + 1; }
}
VSK_REGISTER(add_one)

VSK_GLOBAL void add_both(uint32_t* y, const uint32_t* a, const uint32_t* b, uint32_t n) {
  VSK_FOR(i, n) { y[i] = a[i] + b[i]; }
}
VSK_REGISTER(add_both)

// Reads the table `passes` times (slowly, on purpose: the next launch is enqueued meanwhile).
VSK_GLOBAL void read_passes(uint32_t* side, const uint32_t* table, uint32_t passes, uint32_t n) {
  VSK_FOR(i, n) {
    uint32_t sum = 0;
    for (uint32_t p = 0; p < passes; ++p) sum += table[(i + p * 4099u) % n];
    side[i] = sum;
  }
}
VSK_REGISTER(read_passes)

namespace {

constexpr uint32_t kElems = 1u << 20;  // 4 MiB of uint32 per buffer
constexpr int kMiddle = 8;
constexpr uint32_t kPasses = 24;

#define CHECK(call)                                                                             \
  do {                                                                                          \
    const cudaError_t rc_ = (call);                                                             \
    if (rc_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "side_stream_probe: %s failed: %s\n", #call, cudaGetErrorName(rc_)); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

template <class... Args>
void launch(const void* kernel, cudaStream_t s, Args... args) {
  void* params[] = {&args...};
  CHECK(cudaLaunchKernel(kernel, dim3(256), dim3(256), params, 0, s));
}

uint64_t fnv1a(const std::vector<uint32_t>& words, uint64_t h = 1469598103934665603ull) {
  for (uint32_t w : words) {
    for (int b = 0; b < 4; ++b) h = (h ^ ((w >> (8 * b)) & 0xff)) * 1099511628211ull;
  }
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  const bool alternate = argc > 1 && std::strcmp(argv[1], "--alternate") == 0;
  const int steps = argc > 1 + alternate ? std::atoi(argv[1 + alternate]) : 12;
  const uint32_t n = kElems;
  cudaStream_t s = nullptr, s2 = nullptr, x = nullptr;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
  uint32_t *table = nullptr, *t = nullptr, *act = nullptr, *out = nullptr, *side = nullptr;
  for (uint32_t** p : {&table, &t, &act, &out, &side}) {
    CHECK(cudaMalloc(reinterpret_cast<void**>(p), n * sizeof(uint32_t)));
  }
  launch(reinterpret_cast<const void*>(fill_table), s, table, n);
  CHECK(cudaMemsetAsync(act, 0, n * sizeof(uint32_t), s));
  CHECK(cudaStreamSynchronize(s));

  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  launch(reinterpret_cast<const void*>(add_one), s, t, static_cast<const uint32_t*>(table), n);
  for (int k = 0; k < kMiddle; ++k) {
    launch(reinterpret_cast<const void*>(add_one), s, act, static_cast<const uint32_t*>(act), n);
  }
  launch(reinterpret_cast<const void*>(add_both), s, out, static_cast<const uint32_t*>(t),
         static_cast<const uint32_t*>(table), n);
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec = nullptr;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));

  cudaEvent_t done = nullptr;
  CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  for (int step = 0; step < steps; ++step) {
    cudaStream_t on = alternate && step % 2 == 1 ? s2 : s;
    CHECK(cudaGraphLaunch(exec, on));
    CHECK(cudaEventRecord(done, on));
    CHECK(cudaStreamWaitEvent(x, done, 0));  // X reads after the graph, which it does not write
    launch(reinterpret_cast<const void*>(read_passes), x, side, static_cast<const uint32_t*>(table),
           kPasses, n);
  }
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaStreamSynchronize(s2));
  CHECK(cudaStreamSynchronize(x));

  std::vector<uint32_t> got_table(n), got_out(n), got_act(n), got_side(n);
  CHECK(cudaMemcpy(got_table.data(), table, n * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(got_out.data(), out, n * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(got_act.data(), act, n * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(got_side.data(), side, n * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t want_table = i * 2654435761u;
    uint32_t want_side = 0;
    for (uint32_t p = 0; p < kPasses; ++p) want_side += ((i + p * 4099u) % n) * 2654435761u;
    const char* bad = got_table[i] != want_table                             ? "table"
                      : got_out[i] != 2 * want_table + 1                     ? "out"
                      : got_act[i] != static_cast<uint32_t>(steps * kMiddle) ? "act"
                      : got_side[i] != want_side                             ? "side"
                                                                             : nullptr;
    if (bad != nullptr) {
      std::fprintf(stderr, "side_stream_probe: %s[%u] is wrong after %d steps\n", bad, i, steps);
      return 1;
    }
  }
  std::printf("side stream: steps %d checksum 0x%016" PRIx64 "\n", steps,
              fnv1a(got_side, fnv1a(got_act, fnv1a(got_out))));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaEventDestroy(done));
  for (uint32_t* p : {table, t, act, out, side}) CHECK(cudaFree(p));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaStreamDestroy(s2));
  CHECK(cudaStreamDestroy(x));
  return 0;
}
