// Probe: can the device time of the segments of one graph be measured while it runs, and at what
// cost? Issue 14 asks the planner to plan inside a whole-iteration graph over "node order, and
// device time per segment measured while learning"; today its positions are nodes
// (core/plan/graph_windows.h), which is why a graph with many short nodes and a few long ones
// gets windows the link cannot hide. This asks whether event-record nodes added to the graph
// give those times.
//
// A chain of K kernels, each spinning on the device's global timer for a set time (2, 10, 50,
// 200 and 1000 us in turn), is built as an explicit graph, in these variants:
//   plain:          the chain alone;
//   side, every s:  an event-record node after every s-th kernel, on a branch of its own (nothing
//                   depends on it), and one before the first kernel;
//   inline, every 1: the same after every kernel, with the next kernel depending on it.
// Each variant is launched 3 times to warm, then 21 times between timing events on the stream.
// Printed per variant: the median launch's device time, its cost against plain per event node,
// and how the events' elapsed times match the kernels' spin times: per segment (between two
// consecutive events), the measured time minus the sum of its kernels' spins, median and worst.
// With --check, exits 1 when an event-record node's elapsed time cannot be read (the answer the
// planner needs first).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

__global__ void spin_ns(unsigned long long ns) {
  unsigned long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

namespace {

#define CHECK(call)                                                                                \
  do {                                                                                             \
    const cudaError_t rc_ = (call);                                                                \
    if (rc_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(rc_)); \
      std::exit(2);                                                                                \
    }                                                                                              \
  } while (0)

constexpr int kKernels = 250;
constexpr unsigned long long kSpinUs[] = {2, 10, 50, 200, 1000};
constexpr int kWarm = 3, kTimed = 21;

unsigned long long spin_us(int i) { return kSpinUs[i % 5]; }

struct Variant {
  const char* name;
  int every;     // an event after every `every`-th kernel; 0: none
  bool inline_;  // the next kernel depends on the event node
};

struct Built {
  cudaGraphExec_t exec = nullptr;
  std::vector<cudaEvent_t> events;  // events[0] before kernel 0; events[j] after kernel ends[j]
  std::vector<int> ends;            // the kernel index each event follows (-1 for the first)
};

Built build(const Variant& v) {
  cudaGraph_t graph = nullptr;
  CHECK(cudaGraphCreate(&graph, 0));
  Built b;
  cudaGraphNode_t prev = nullptr;
  auto add_event = [&](int after_kernel, cudaGraphNode_t dep) {
    cudaEvent_t e = nullptr;
    CHECK(cudaEventCreate(&e));
    cudaGraphNode_t node = nullptr;
    CHECK(cudaGraphAddEventRecordNode(&node, graph, dep != nullptr ? &dep : nullptr,
                                      dep != nullptr ? 1 : 0, e));
    b.events.push_back(e);
    b.ends.push_back(after_kernel);
    return node;
  };
  if (v.every > 0) prev = add_event(-1, nullptr);
  for (int i = 0; i < kKernels; ++i) {
    unsigned long long ns = spin_us(i) * 1000ull;
    void* args[] = {&ns};
    cudaKernelNodeParams p{};
    p.func = reinterpret_cast<void*>(spin_ns);
    p.gridDim = dim3(1);
    p.blockDim = dim3(32);
    p.kernelParams = args;
    cudaGraphNode_t node = nullptr;
    CHECK(cudaGraphAddKernelNode(&node, graph, prev != nullptr ? &prev : nullptr,
                                 prev != nullptr ? 1 : 0, &p));
    prev = node;
    if (v.every > 0 && (i + 1) % v.every == 0) {
      cudaGraphNode_t e = add_event(i, node);
      if (v.inline_) prev = e;
    }
  }
  CHECK(cudaGraphInstantiate(&b.exec, graph, 0));
  CHECK(cudaGraphDestroy(graph));
  return b;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const bool check = argc > 1 && std::strcmp(argv[1], "--check") == 0;
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t before = nullptr, after = nullptr;
  CHECK(cudaEventCreate(&before));
  CHECK(cudaEventCreate(&after));
  const Variant variants[] = {{"plain", 0, false},
                              {"side, every 1", 1, false},
                              {"side, every 8", 8, false},
                              {"side, every 32", 32, false},
                              {"inline, every 1", 1, true}};
  double nominal_ms = 0;
  for (int i = 0; i < kKernels; ++i) nominal_ms += static_cast<double>(spin_us(i)) / 1e3;
  std::printf("# %d kernels in a chain, spins of 2/10/50/200/1000 us in turn: %.3f ms of spin\n",
              kKernels, nominal_ms);
  std::printf(
      "| variant | events | launch ms (median of %d) | cost per event us | segment error "
      "us, median | worst |\n|---|---:|---:|---:|---:|---:|\n",
      kTimed);
  double plain_ms = 0;
  bool readable = true;
  for (const Variant& v : variants) {
    Built b = build(v);
    for (int r = 0; r < kWarm; ++r) CHECK(cudaGraphLaunch(b.exec, stream));
    CHECK(cudaStreamSynchronize(stream));
    std::vector<double> launch_ms, errors_us;
    for (int r = 0; r < kTimed; ++r) {
      CHECK(cudaEventRecord(before, stream));
      CHECK(cudaGraphLaunch(b.exec, stream));
      CHECK(cudaEventRecord(after, stream));
      CHECK(cudaStreamSynchronize(stream));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, before, after));
      launch_ms.push_back(ms);
      for (size_t j = 1; j < b.events.size(); ++j) {
        float seg = 0;
        const cudaError_t rc = cudaEventElapsedTime(&seg, b.events[j - 1], b.events[j]);
        if (rc != cudaSuccess) {
          if (readable) {
            std::printf("(%s: cudaEventElapsedTime on the graph's events: %s)\n", v.name,
                        cudaGetErrorString(rc));
          }
          readable = false;
          break;
        }
        double spin = 0;
        for (int k = b.ends[j - 1] + 1; k <= b.ends[j]; ++k)
          spin += static_cast<double>(spin_us(k));
        errors_us.push_back(static_cast<double>(seg) * 1e3 - spin);
      }
    }
    const double ms = median(launch_ms);
    if (v.every == 0) plain_ms = ms;
    const size_t events = b.events.size();
    if (events == 0) {
      std::printf("| %s | 0 | %.3f | | | |\n", v.name, ms);
    } else if (errors_us.empty()) {
      std::printf("| %s | %zu | %.3f | %.2f | unreadable | |\n", v.name, events, ms,
                  (ms - plain_ms) * 1e3 / static_cast<double>(events));
    } else {
      double worst = 0;
      for (double e : errors_us) worst = std::max(worst, std::abs(e));
      std::printf("| %s | %zu | %.3f | %.2f | %.2f | %.2f |\n", v.name, events, ms,
                  (ms - plain_ms) * 1e3 / static_cast<double>(events), median(errors_us), worst);
    }
    for (cudaEvent_t e : b.events) CHECK(cudaEventDestroy(e));
    CHECK(cudaGraphExecDestroy(b.exec));
  }
  return check && !readable ? 1 : 0;
}
