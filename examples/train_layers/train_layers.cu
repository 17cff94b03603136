// vaswap's demo: a small layered "training" job built on per-layer CUDA graphs.
//
// Each layer has a forward graph (input -> saved activation, output) and a backward graph
// (incoming gradient, saved activation -> input gradient, weight gradient). As in PyTorch, the
// buffers the graphs write are allocated with cudaMalloc while the graph is being captured, with
// the thread's capture mode relaxed. Between graphs, eager work moves data: the input copy into
// the next layer's static input, the gradient copy into the previous layer's static gradient, and
// gradient accumulation and the weight update as eager kernels.
//
// All arithmetic is on uint32 with wrap-around, so the result is exact: the same source built with
// nvcc for a GPU and with a host compiler for vaswap's simulated device prints the same checksum.
#include <cuda_runtime_api.h>
#include <getopt.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "vaswap_sim/kernel.h"

// ------------------------------------------------------------------------------------------------
// Kernels
// ------------------------------------------------------------------------------------------------

VSK_GLOBAL void fill_kernel(uint32_t* out, uint32_t seed, uint32_t n) {
  VSK_FOR(i, n) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    out[i] = h;
  }
}
VSK_REGISTER(fill_kernel)

// --work N: N rounds of integer mixing per element in each layer's forward and backward kernel,
// so that a layer computes for as long as a real one does beside its buffers' copies (without it
// the demo's kernels only stream their buffers, microseconds against the link's milliseconds).
VSK_DEVICE uint32_t mix(uint32_t a, uint32_t rounds) {
  for (uint32_t r = 0; r < rounds; ++r) a = (a ^ (a >> 11)) * 2654435761u + r;
  return a;
}

VSK_GLOBAL void forward_kernel(const uint32_t* x, const uint32_t* w, uint32_t* act, uint32_t* y,
                               uint32_t n, uint32_t work) {
  VSK_FOR(i, n) {
    const uint32_t a = mix(x[i] ^ (x[i] >> 7), work);
    act[i] = a;
    y[i] = a * (w[i] | 1u) + 0x9e3779b9u;
  }
}
VSK_REGISTER(forward_kernel)

VSK_GLOBAL void backward_kernel(const uint32_t* gy, const uint32_t* act, const uint32_t* w,
                                uint32_t* gx, uint32_t* gw, uint32_t n, uint32_t work) {
  VSK_FOR(i, n) {
    gx[i] = mix(gy[i] * (w[i] | 1u) + act[i], work);
    gw[i] = (gy[i] * act[i]) ^ (gy[i] >> 3);
  }
}
VSK_REGISTER(backward_kernel)

VSK_GLOBAL void loss_grad_kernel(const uint32_t* y, uint32_t* gy, uint32_t n) {
  VSK_FOR(i, n) { gy[i] = y[i] * 2654435761u + 1u; }
}
VSK_REGISTER(loss_grad_kernel)

VSK_GLOBAL void accumulate_kernel(uint32_t* acc, const uint32_t* g, uint32_t n) {
  VSK_FOR(i, n) { acc[i] += g[i]; }
}
VSK_REGISTER(accumulate_kernel)

// Reads a saved activation outside the graphs (the --peek option): eager work that the learned
// pattern did not contain.
VSK_GLOBAL void peek_kernel(const uint32_t* act, uint32_t* out, uint32_t n) {
  VSK_FOR(i, n) { out[i] = act[i] * 2246822519u ^ out[i]; }
}
VSK_REGISTER(peek_kernel)

// Writes far outside every allocation (the --fault-step option): a device fault (illegal address)
// in the middle of a step, as a buggy kernel would make one.
VSK_GLOBAL void fault_kernel(uint32_t* wild, uint32_t n) {
  VSK_FOR(i, n) { wild[i] = static_cast<uint32_t>(i); }
}
VSK_REGISTER(fault_kernel)

// Between layers on two devices with --peer-kernels: the receiving device reads the other's buffer.
VSK_GLOBAL void copy_kernel(uint32_t* dst, const uint32_t* src, uint32_t n) {
  VSK_FOR(i, n) { dst[i] = src[i]; }
}
VSK_REGISTER(copy_kernel)

VSK_GLOBAL void update_kernel(uint32_t* w, uint32_t* acc, uint32_t n) {
  VSK_FOR(i, n) {
    w[i] -= acc[i] >> 24;
    acc[i] = 0;
  }
}
VSK_REGISTER(update_kernel)

// ------------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------------

#define CHECK(call)                                                                        \
  do {                                                                                     \
    const cudaError_t check_rc_ = (call);                                                  \
    if (check_rc_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "train_layers: %s failed at %s:%d: %s (%s)\n", #call, __FILE__, \
                   __LINE__, cudaGetErrorName(check_rc_), cudaGetErrorString(check_rc_));  \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

namespace {

struct Options {
  int layers = 8;
  uint32_t elems = 1u << 18;
  int steps = 10;
  uint32_t seed = 1;
  int device = 0;
  int devices = 1;  // layers spread over devices device .. device + devices - 1
  bool peer_kernels = false;
  bool quiet = false;
  int eval_every = 0;   // 0: never
  int peek_step = -1;   // -1: never
  int fault_step = -1;  // -1: never
  bool api_graph = false;
  bool batch_copies = false;
  bool whole = false;        // --graph whole: one graph per step
  bool pair = false;         // --graph pair: a forward and a backward graph per step
  int set_params_step = -1;  // --graph whole: -1: never
  int retarget_step = -1;    // --graph whole: -1: never
  int update_step = -1;      // --graph whole: -1: never
  bool update_retarget = false;
  bool free_first = false;  // --graph whole: free the buffers before destroying the executable
  int extra_mib = 0;        // 0: none
  int eager_mib = 0;        // 0: none
  uint32_t work = 0;        // rounds of mixing per element in the layer kernels
  long limit_mib = 0;       // 0: the whole device
  const char* out = nullptr;
};

void usage(FILE* to) {
  std::fprintf(
      to,
      "usage: train_layers [--layers N] [--elems N] [--steps N] [--seed N] [--device N]\n"
      "                    [--devices N] [--eval-every N] [--peek-step N] [--api-graph]\n"
      "                    [--extra-mib N] [--limit-mib N] [--fault-step N] [--batch-copies]\n"
      "                    [--graph layers|whole|pair] [--set-params-step N]\n"
      "                    [--retarget-step N] [--update-step N [--update-retarget]]\n"
      "                    [--free-first]\n"
      "                    [--work N] [--eager-mib N] [--out FILE] [--quiet]\n"
      "  Trains a toy layered model with one forward and one backward CUDA graph per layer\n"
      "  and prints a per-step loss and a final checksum. Integer arithmetic: the checksum\n"
      "  is the same on a GPU and on vaswap's simulated device.\n"
      "  --layers N   layers (default 8)\n"
      "  --elems N    uint32 elements per buffer (default 262144, i.e. 1 MiB)\n"
      "  --steps N    training steps (default 10)\n"
      "  --seed N     data seed (default 1)\n"
      "  --device N   CUDA device (default 0)\n"
      "  --devices N  spread the layers over N devices, from --device on, in blocks of\n"
      "               consecutive layers (as a model split over GPUs in one process is):\n"
      "               one thread drives them all, the copies between blocks are peer\n"
      "               copies; the checksum is the one device's (default 1)\n"
      "  --peer-kernels  with --devices: enable peer access between the devices, and hand\n"
      "               data between them with a kernel on the receiving device that reads the\n"
      "               other device's buffer directly, instead of a copy\n"
      "  --eval-every N  after every N-th step, an evaluation pass: forward graphs only\n"
      "  --peek-step N   in step N, between forward and backward, an eager kernel reads\n"
      "                  the first layer's saved activation (0-based step number)\n"
      "  --api-graph     every step, between forward and backward, launch a graph built\n"
      "                  with the graph API (not captured) that reads the first layer's\n"
      "                  saved activation; from step 10 its node reads the second layer's\n"
      "                  (cudaGraphExecKernelNodeSetParams), from step 20 the third's\n"
      "                  (cudaGraphExecUpdate)\n"
      "  --extra-mib N   after step 5, allocate N MiB more (cudaMalloc, as an optimizer's\n"
      "                  state grows) and keep it to the end\n"
      "  --limit-mib N   leave the job N MiB of device memory: first hold the rest of what\n"
      "                  is free (cudaMallocAsync, which vaswap never makes a slot), as a\n"
      "                  smaller GPU would\n"
      "  --fault-step N  in step N, between forward and backward, an eager kernel writes\n"
      "                  1 TiB past the first layer's activation: a device fault (illegal\n"
      "                  address) mid-step; the run must end with an error, not hang.\n"
      "                  On the simulated device the process dies with SIGSEGV instead\n"
      "  --batch-copies  copy between layers with cudaMemcpyBatchAsync (one copy a batch), and\n"
      "                  at each step's end copy the last layer's output and the first\n"
      "                  layer's to the host in one batch of two\n"
      "  --graph KIND    layers (default): a forward and a backward graph per layer, with\n"
      "                  eager work between them; whole: one graph per step, captured once,\n"
      "                  holding every layer's forward and backward, the copies between\n"
      "                  layers, the gradient accumulation and the update (as a\n"
      "                  whole-iteration torch.cuda.graph); the checksum is the same;\n"
      "                  pair: two graphs per step, captured once, one holding every\n"
      "                  layer's forward and the copies between them, the other the\n"
      "                  loss's gradient and every layer's backward, accumulation and\n"
      "                  update (as torch.compile's CUDA graph trees in training): the\n"
      "                  saved activations are written by one graph and read by the\n"
      "                  other; the checksum is the same. --peek-step and --eval-every\n"
      "                  (the forward graph alone) go with it\n"
      "  --set-params-step N  with --graph whole: before step N, give a kernel node of the\n"
      "                  executable its own parameters again (cudaGraphExecKernelNodeSetParams\n"
      "                  with the captured graph's node), and read and set again whether it\n"
      "                  is enabled (cudaGraphNode{Get,Set}Enabled)\n"
      "  --retarget-step N  with --graph whole: before step N, point the last layer's\n"
      "                  forward kernel node at the first layer's activation buffer\n"
      "                  (cudaGraphExecKernelNodeSetParams): a node in the middle of the\n"
      "                  graph then writes a buffer that the graph otherwise leaves alone\n"
      "                  between the first layer's forward and backward; the checksum\n"
      "                  changes (the same with and without vaswap)\n"
      "  --update-step N  with --graph whole: before step N, update the executable from a\n"
      "                  copy of the captured graph (cudaGraphExecUpdate); the checksum is\n"
      "                  the same. With --update-retarget, the copy's last forward kernel\n"
      "                  node writes the first layer's activation, as --retarget-step makes\n"
      "                  the executable's (the checksum is --retarget-step's). A refused\n"
      "                  update leaves the executable as it was, as CUDA does: the demo\n"
      "                  says so on stderr and goes on with it\n"
      "  --free-first    with --graph whole: at the end, free the buffers before destroying\n"
      "                  the executable that uses them (CUDA allows it once no launch of it\n"
      "                  is to come; a program that frees its pool before its graphs does it)\n"
      "  --work N        N rounds of integer mixing per element in each layer's forward and\n"
      "                  backward kernel (default 0): device time for the copies to hide\n"
      "                  behind, as a real layer's compute gives (on the H200, --work 2000\n"
      "                  with 32 MiB buffers is about 2.4 ms per kernel); the checksum changes\n"
      "  --eager-mib N   eager work of its own beside the graphs, as an optimizer outside them:\n"
      "                  a kernel fills a buffer of N MiB (cudaMalloc) once before the\n"
      "                  graphs are captured and again every step after them; the\n"
      "                  checksum is the same\n"
      "  --out FILE      also write the checksum and the time per step there, as JSON\n"
      "  --quiet      print only the checksum line\n");
}

bool parse_number(const char* text, long min, long max, long* out) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < min || v > max) return false;
  *out = v;
  return true;
}

Options parse(int argc, char** argv) {
  Options o;
  static const option longs[] = {{"layers", required_argument, nullptr, 'l'},
                                 {"elems", required_argument, nullptr, 'n'},
                                 {"steps", required_argument, nullptr, 's'},
                                 {"seed", required_argument, nullptr, 'r'},
                                 {"device", required_argument, nullptr, 'd'},
                                 {"devices", required_argument, nullptr, 'D'},
                                 {"peer-kernels", no_argument, nullptr, 'P'},
                                 {"quiet", no_argument, nullptr, 'q'},
                                 {"help", no_argument, nullptr, 'h'},
                                 {"eval-every", required_argument, nullptr, 'e'},
                                 {"peek-step", required_argument, nullptr, 'p'},
                                 {"out", required_argument, nullptr, 'o'},
                                 {"api-graph", no_argument, nullptr, 'a'},
                                 {"extra-mib", required_argument, nullptr, 'x'},
                                 {"limit-mib", required_argument, nullptr, 'm'},
                                 {"fault-step", required_argument, nullptr, 'f'},
                                 {"batch-copies", no_argument, nullptr, 'b'},
                                 {"graph", required_argument, nullptr, 'g'},
                                 {"set-params-step", required_argument, nullptr, 'k'},
                                 {"retarget-step", required_argument, nullptr, 'R'},
                                 {"update-step", required_argument, nullptr, 'U'},
                                 {"update-retarget", no_argument, nullptr, 'T'},
                                 {"free-first", no_argument, nullptr, 'F'},
                                 {"work", required_argument, nullptr, 'W'},
                                 {"eager-mib", required_argument, nullptr, 'E'},
                                 {nullptr, 0, nullptr, 0}};
  int c = 0;
  int index = 0;
  while ((c = getopt_long(argc, argv, "", longs, &index)) != -1) {
    long v = 0;
    bool ok = true;
    switch (c) {
      case 'l':
        ok = parse_number(optarg, 1, 4096, &v);
        o.layers = static_cast<int>(v);
        break;
      case 'n':
        ok = parse_number(optarg, 1, 1L << 30, &v);
        o.elems = static_cast<uint32_t>(v);
        break;
      case 's':
        ok = parse_number(optarg, 1, 1000000, &v);
        o.steps = static_cast<int>(v);
        break;
      case 'r':
        ok = parse_number(optarg, 0, 0xffffffffL, &v);
        o.seed = static_cast<uint32_t>(v);
        break;
      case 'd':
        ok = parse_number(optarg, 0, 1024, &v);
        o.device = static_cast<int>(v);
        break;
      case 'D':
        ok = parse_number(optarg, 1, 64, &v);
        o.devices = static_cast<int>(v);
        break;
      case 'e':
        ok = parse_number(optarg, 0, 1000000, &v);
        o.eval_every = static_cast<int>(v);
        break;
      case 'p':
        ok = parse_number(optarg, 0, 1000000, &v);
        o.peek_step = static_cast<int>(v);
        break;
      case 'f':
        ok = parse_number(optarg, 0, 1000000, &v);
        o.fault_step = static_cast<int>(v);
        break;
      case 'o': o.out = optarg; break;
      case 'a': o.api_graph = true; break;
      case 'b': o.batch_copies = true; break;
      case 'k':
        ok = parse_number(optarg, 0, 1000000, &v);
        o.set_params_step = static_cast<int>(v);
        break;
      case 'R':
        ok = parse_number(optarg, 0, 1000000, &v);
        o.retarget_step = static_cast<int>(v);
        break;
      case 'U':
        ok = parse_number(optarg, 0, 1000000, &v);
        o.update_step = static_cast<int>(v);
        break;
      case 'T': o.update_retarget = true; break;
      case 'F': o.free_first = true; break;
      case 'g':
        o.whole = std::strcmp(optarg, "whole") == 0;
        o.pair = std::strcmp(optarg, "pair") == 0;
        if (!o.whole && !o.pair && std::strcmp(optarg, "layers") != 0) {
          std::fprintf(stderr, "train_layers: --graph needs layers, whole or pair, got \"%s\"\n",
                       optarg);
          usage(stderr);
          std::exit(2);
        }
        break;
      case 'P': o.peer_kernels = true; break;
      case 'W':
        ok = parse_number(optarg, 0, 1000000, &v);
        o.work = static_cast<uint32_t>(v);
        break;
      case 'x':
        ok = parse_number(optarg, 1, 1 << 20, &v);
        o.extra_mib = static_cast<int>(v);
        break;
      case 'E':
        ok = parse_number(optarg, 1, 1 << 12, &v);
        o.eager_mib = static_cast<int>(v);
        break;
      case 'm':
        ok = parse_number(optarg, 1, 1L << 30, &v);
        o.limit_mib = v;
        break;
      case 'q': o.quiet = true; break;
      case 'h': usage(stdout); std::exit(0);
      default: usage(stderr); std::exit(2);
    }
    if (!ok) {
      std::fprintf(stderr, "train_layers: --%s needs a whole number in range, got \"%s\"\n",
                   longs[index].name, optarg);
      usage(stderr);
      std::exit(2);
    }
  }
  if (optind != argc) {
    std::fprintf(stderr, "train_layers: unexpected argument \"%s\"\n", argv[optind]);
    usage(stderr);
    std::exit(2);
  }
  if (o.devices > 1 && (o.api_graph || o.batch_copies)) {
    std::fprintf(stderr,
                 "train_layers: --devices %d cannot go with --api-graph or --batch-copies "
                 "(they use one device)\n",
                 o.devices);
    std::exit(2);
  }
  if ((o.set_params_step >= 0 || o.retarget_step >= 0 || o.update_step >= 0 || o.free_first) &&
      !o.whole) {
    std::fprintf(stderr,
                 "train_layers: --set-params-step, --retarget-step, --update-step and "
                 "--free-first need --graph whole\n");
    std::exit(2);
  }
  if (o.update_retarget && o.update_step < 0) {
    std::fprintf(stderr, "train_layers: --update-retarget needs --update-step\n");
    std::exit(2);
  }
  if ((o.retarget_step >= 0 || o.update_retarget) && o.layers < 2) {
    std::fprintf(stderr, "train_layers: --retarget-step needs two layers or more\n");
    std::exit(2);
  }
  if (o.whole && (o.devices > 1 || o.api_graph || o.batch_copies || o.eval_every > 0 ||
                  o.peek_step >= 0 || o.fault_step >= 0)) {
    std::fprintf(stderr,
                 "train_layers: --graph whole cannot go with --devices, --api-graph, "
                 "--batch-copies, --eval-every, --peek-step or --fault-step (they act between "
                 "the layers' graphs)\n");
    std::exit(2);
  }
  if (o.pair && (o.devices > 1 || o.api_graph || o.batch_copies || o.fault_step >= 0)) {
    std::fprintf(stderr,
                 "train_layers: --graph pair cannot go with --devices, --api-graph, "
                 "--batch-copies or --fault-step\n");
    std::exit(2);
  }
  return o;
}

struct Layer {
  size_t dev = 0;           // index of its device in main's list
  uint32_t* x = nullptr;    // static input (written by the eager input copy)
  uint32_t* gy = nullptr;   // static incoming gradient
  uint32_t* w = nullptr;    // parameters
  uint32_t* acc = nullptr;  // gradient accumulator
  // allocated during capture, as PyTorch's graph pools are
  uint32_t* act = nullptr;  // saved activation: written by forward, read by backward
  uint32_t* y = nullptr;
  uint32_t* gx = nullptr;
  uint32_t* gw = nullptr;
  cudaGraphExec_t forward = nullptr;
  cudaGraphExec_t backward = nullptr;
};

uint64_t fnv1a(uint64_t h, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

struct Launcher {
  dim3 grid, block{256};
  cudaStream_t stream;
  Launcher(uint32_t n, cudaStream_t s)
      : grid((n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024), stream(s) {}
  void operator()(const void* kernel, std::initializer_list<void*> args) const {
    std::vector<void*> a(args);
    CHECK(cudaLaunchKernel(kernel, grid, block, a.data(), 0, stream));
  }
};

// cudaMalloc with the thread's capture mode relaxed, as PyTorch's caching allocator does.
uint32_t* malloc_during_capture(size_t bytes) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  void* p = nullptr;
  CHECK(cudaMalloc(&p, bytes));
  CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  return static_cast<uint32_t*>(p);
}

// --eager-mib: the optimizer's own state, allocated in a function of its own so that a policy can
// select it by call site (selection.include), as the graphs' buffers by malloc_during_capture.
__attribute__((noinline)) uint32_t* malloc_state(size_t bytes) {
  void* p = nullptr;
  CHECK(cudaMalloc(&p, bytes));
  return static_cast<uint32_t*>(p);
}

// A one-node graph built through the graph API: peek_kernel(act, out, n).
struct PeekGraph {
  const uint32_t* act;
  uint32_t* out;
  uint32_t n;
  void* args[3] = {&act, &out, &n};
  cudaKernelNodeParams params(const Launcher& launch) {
    cudaKernelNodeParams p{};
    p.func = (void*)peek_kernel;
    p.gridDim = launch.grid;
    p.blockDim = launch.block;
    p.kernelParams = args;
    return p;
  }
  cudaGraph_t build(const Launcher& launch, cudaGraphNode_t* node) {
    cudaGraph_t graph = nullptr;
    CHECK(cudaGraphCreate(&graph, 0));
    const cudaKernelNodeParams p = params(launch);
    CHECK(cudaGraphAddKernelNode(node, graph, nullptr, 0, &p));
    return graph;
  }
};

template <class Body>
cudaGraphExec_t capture(cudaStream_t s, Body body) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  body();
  CHECK(cudaStreamEndCapture(s, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphDestroy(graph));
  return exec;
}

// As capture(), keeping the captured graph in *graph.
template <class Body>
cudaGraphExec_t capture_keeping(cudaStream_t s, cudaGraph_t* graph, Body body) {
  cudaGraphExec_t exec = nullptr;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  body();
  CHECK(cudaStreamEndCapture(s, graph));
  CHECK(cudaGraphInstantiate(&exec, *graph, 0));
  return exec;
}

}  // namespace

// One device's part of the job: its stream (every launch on it), the event that orders its
// stream before the next device's, and the memory held back by --limit-mib.
struct Device {
  int id = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t handed = nullptr;  // recorded after a copy to the next or previous device
  void* hold = nullptr;
  size_t held = 0;
  size_t free_start = 0;  // after the hold: the job's own use is free_start - least_free
  size_t least_free = 0;
};

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const size_t bytes = size_t{o.elems} * sizeof(uint32_t);
  uint32_t n = o.elems;
  uint32_t work = o.work;
  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  if (o.device + o.devices > count) {
    std::fprintf(stderr, "train_layers: devices %d to %d asked for, but there are %d\n", o.device,
                 o.device + o.devices - 1, count);
    return 2;
  }
  std::vector<Device> devs(static_cast<size_t>(o.devices));
  std::vector<Launcher> launchers;
  size_t total = 0;
  for (size_t d = 0; d < devs.size(); ++d) {
    Device& D = devs[d];
    D.id = o.device + static_cast<int>(d);
    CHECK(cudaSetDevice(D.id));
    CHECK(cudaStreamCreateWithFlags(&D.stream, cudaStreamNonBlocking));
    CHECK(cudaEventCreateWithFlags(&D.handed, cudaEventDisableTiming));
    launchers.emplace_back(o.elems, D.stream);
    CHECK(cudaMemGetInfo(&D.free_start, &total));
    if (o.limit_mib > 0 && D.free_start > (size_t(o.limit_mib) << 20)) {
      D.held = D.free_start - (size_t(o.limit_mib) << 20);
      CHECK(cudaMallocAsync(&D.hold, D.held, D.stream));
      CHECK(cudaStreamSynchronize(D.stream));
      CHECK(cudaMemGetInfo(&D.free_start, &total));
    }
    D.least_free = D.free_start;
  }
  if (o.peer_kernels) {
    for (const Device& D : devs) {
      for (const Device& E : devs) {
        if (D.id == E.id) continue;
        int can = 0;
        CHECK(cudaDeviceCanAccessPeer(&can, D.id, E.id));
        if (can == 0) {
          std::fprintf(stderr, "train_layers: --peer-kernels: device %d cannot access device %d\n",
                       D.id, E.id);
          return 2;
        }
        CHECK(cudaSetDevice(D.id));
        CHECK(cudaDeviceEnablePeerAccess(E.id, 0));
      }
    }
  }
  // Makes layer l's device current and returns its launcher.
  std::vector<Layer> layers(static_cast<size_t>(o.layers));
  const auto on = [&](const Layer& L) -> const Launcher& {
    CHECK(cudaSetDevice(devs[L.dev].id));
    return launchers[L.dev];
  };

  for (size_t l = 0; l < layers.size(); ++l) {
    Layer& L = layers[l];
    L.dev = l * devs.size() / layers.size();  // blocks of consecutive layers
    const Launcher& launch = on(L);
    for (uint32_t** p : {&L.x, &L.gy, &L.w, &L.acc})
      CHECK(cudaMalloc(reinterpret_cast<void**>(p), bytes));
    uint32_t wseed = o.seed * 7919u + static_cast<uint32_t>(l);
    launch((const void*)fill_kernel, {&L.w, &wseed, &n});
    CHECK(cudaMemsetAsync(L.acc, 0, bytes, launch.stream));
    CHECK(cudaMemsetAsync(L.x, 0, bytes, launch.stream));
    CHECK(cudaMemsetAsync(L.gy, 0, bytes, launch.stream));
  }
  // --eager-mib: the optimizer's own buffer, on the first layer's device, filled before any
  // capture (warm-up) and after every step's graphs.
  uint32_t* eager = nullptr;
  const auto eager_step = [&](uint32_t seed) {
    uint32_t elements = static_cast<uint32_t>((size_t(o.eager_mib) << 20) / sizeof(uint32_t));
    if (eager != nullptr) on(layers.front())((const void*)fill_kernel, {&eager, &seed, &elements});
  };
  if (o.eager_mib > 0) {
    on(layers.front());
    eager = malloc_state(size_t(o.eager_mib) << 20);
    eager_step(0);
  }
  int captured_allocations = 0;
  const bool per_layer = !o.whole && !o.pair;  // --graph layers
  for (Layer& L : layers) {
    if (o.whole || o.pair) break;  // captured below, after the hand-off between layers is defined
    const Launcher& launch = on(L);
    L.forward = capture(launch.stream, [&] {
      L.act = malloc_during_capture(bytes);
      L.y = malloc_during_capture(bytes);
      captured_allocations += 2;
      launch((const void*)forward_kernel, {&L.x, &L.w, &L.act, &L.y, &n, &work});
    });
    L.backward = capture(launch.stream, [&] {
      L.gx = malloc_during_capture(bytes);
      L.gw = malloc_during_capture(bytes);
      captured_allocations += 2;
      launch((const void*)backward_kernel, {&L.gy, &L.act, &L.w, &L.gx, &L.gw, &n, &work});
    });
  }
  Layer& first = layers.front();
  Layer& last = layers.back();
  const Launcher& launch = on(first);  // the first layer's device: the eager extras run there
  const cudaStream_t s = launch.stream;

  uint32_t* host = nullptr;
  CHECK(cudaMallocHost(reinterpret_cast<void**>(&host), bytes));
  uint32_t* host_first = nullptr;  // --batch-copies: the first layer's output, copied beside
  CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_first), bytes));
  // A device-to-device copy between layers, on the stream of the layer that wrote the source: one
  // cudaMemcpyAsync, or with --batch-copies a batch of one copy (cudaMemcpyBatchAsync, CUDA 12.8
  // and later). Between layers on two devices it is a peer copy, and the receiving device's stream
  // waits for it.
  cudaMemcpyAttributes batch_attrs{};
  batch_attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t batch_attrs_index = 0;
  const auto hand_off = [&](const Layer& from, const Layer& to, void* dst, const void* src) {
    const cudaStream_t stream = on(from).stream;
    if (o.peer_kernels && to.dev != from.dev) {
      CHECK(cudaEventRecord(devs[from.dev].handed, stream));
      const Launcher& there = on(to);
      CHECK(cudaStreamWaitEvent(there.stream, devs[from.dev].handed, 0));
      auto* into = static_cast<uint32_t*>(dst);
      auto* from_buffer = static_cast<const uint32_t*>(src);
      there((const void*)copy_kernel, {&into, &from_buffer, &n});
      return;
    }
    if (!o.batch_copies) {
      CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
    } else {
      void* dsts[] = {dst};
      const void* srcs[] = {src};
      const size_t sizes[] = {bytes};
      CHECK(
          cudaMemcpyBatchAsync(dsts, srcs, sizes, 1, &batch_attrs, &batch_attrs_index, 1, stream));
    }
    if (to.dev != from.dev) {
      CHECK(cudaEventRecord(devs[from.dev].handed, stream));
      CHECK(cudaStreamWaitEvent(launchers[to.dev].stream, devs[from.dev].handed, 0));
    }
  };
  // The forward pass from the first layer's static input to the last layer's output.
  const auto forward = [&] {
    for (size_t l = 0; l < layers.size(); ++l) {
      CHECK(cudaGraphLaunch(layers[l].forward, on(layers[l]).stream));
      if (l + 1 < layers.size()) hand_off(layers[l], layers[l + 1], layers[l + 1].x, layers[l].y);
    }
  };
  // The last layer's output to the host, and every device's stream drained.
  const auto to_host = [&](uint32_t* into) {
    CHECK(cudaMemcpyAsync(into, last.y, bytes, cudaMemcpyDeviceToHost, on(last).stream));
    for (Device& D : devs) {
      CHECK(cudaSetDevice(D.id));
      CHECK(cudaStreamSynchronize(D.stream));
    }
  };
  // --graph whole: the step from the first layer's input to the updated weights, one graph. The
  // same kernels and copies in the same order as the per-layer step, so the same checksum.
  cudaGraphExec_t whole = nullptr;
  cudaGraph_t whole_graph = nullptr;       // kept: --set-params-step names one of its nodes
  cudaGraphNode_t whole_kernel = nullptr;  // its last kernel node (the last layer's update)
  cudaKernelNodeParams whole_params{};
  cudaGraphNode_t last_forward = nullptr;  // the last layer's forward kernel (--retarget-step)
  const auto forward_body = [&] {
    for (size_t l = 0; l < layers.size(); ++l) {
      Layer& L = layers[l];
      L.act = malloc_during_capture(bytes);
      L.y = malloc_during_capture(bytes);
      captured_allocations += 2;
      launch((const void*)forward_kernel, {&L.x, &L.w, &L.act, &L.y, &n, &work});
      if (l + 1 < layers.size()) hand_off(L, layers[l + 1], layers[l + 1].x, L.y);
    }
  };
  const auto backward_body = [&] {
    launch((const void*)loss_grad_kernel, {&last.y, &last.gy, &n});
    for (size_t l = layers.size(); l-- > 0;) {
      Layer& L = layers[l];
      L.gx = malloc_during_capture(bytes);
      L.gw = malloc_during_capture(bytes);
      captured_allocations += 2;
      launch((const void*)backward_kernel, {&L.gy, &L.act, &L.w, &L.gx, &L.gw, &n, &work});
      launch((const void*)accumulate_kernel, {&L.acc, &L.gw, &n});
      if (l > 0) hand_off(L, layers[l - 1], layers[l - 1].gy, L.gx);
    }
    for (Layer& L : layers) launch((const void*)update_kernel, {&L.w, &L.acc, &n});
  };
  // --graph pair: the same kernels and copies as --graph whole, in two graphs.
  cudaGraphExec_t pair_forward = nullptr;
  cudaGraphExec_t pair_backward = nullptr;
  if (o.pair) {
    pair_forward = capture(s, forward_body);
    pair_backward = capture(s, backward_body);
  }
  if (o.whole) {
    whole = capture_keeping(s, &whole_graph, [&] {
      forward_body();
      backward_body();
    });
    size_t node_count = 0;
    CHECK(cudaGraphGetNodes(whole_graph, nullptr, &node_count));
    std::vector<cudaGraphNode_t> nodes(node_count);
    CHECK(cudaGraphGetNodes(whole_graph, nodes.data(), &node_count));
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType type{};
      CHECK(cudaGraphNodeGetType(node, &type));
      if (type != cudaGraphNodeTypeKernel) continue;
      whole_kernel = node;
      cudaKernelNodeParams p{};
      CHECK(cudaGraphKernelNodeGetParams(node, &p));
      if (p.func == (void*)forward_kernel && *static_cast<void**>(p.kernelParams[2]) == last.act) {
        last_forward = node;
      }
    }
    CHECK(cudaGraphKernelNodeGetParams(whole_kernel, &whole_params));
  }
  on(first);
  uint32_t* peek = nullptr;
  CHECK(cudaMalloc(reinterpret_cast<void**>(&peek), bytes));
  CHECK(cudaMemsetAsync(peek, 0, bytes, s));
  if (!o.quiet) {
    std::printf("train_layers: %d layers x %u elements (%.2f MiB per buffer), %d steps, device %d",
                o.layers, o.elems, static_cast<double>(bytes) / (1 << 20), o.steps, o.device);
    if (o.devices > 1) std::printf(" to %d", o.device + o.devices - 1);
    std::printf("\n");
  }

  PeekGraph peeker{first.act, peek, n};
  cudaGraph_t peek_graph = nullptr;
  cudaGraphNode_t peek_node = nullptr;
  cudaGraphExec_t peek_exec = nullptr;
  if (o.api_graph) {
    peek_graph = peeker.build(launch, &peek_node);
    CHECK(cudaGraphInstantiate(&peek_exec, peek_graph, 0));
  }

  uint64_t checksum = 1469598103934665603ull;
  void* extra = nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<double> step_ms;
  for (int step = 0; step < o.steps; ++step) {
    const auto step_start = std::chrono::steady_clock::now();
    uint32_t data_seed = o.seed * 104729u + static_cast<uint32_t>(step);
    on(first)((const void*)fill_kernel, {&first.x, &data_seed, &n});
    if (step == o.set_params_step) {
      CHECK(cudaGraphExecKernelNodeSetParams(whole, whole_kernel, &whole_params));
      unsigned enabled = 0;
      CHECK(cudaGraphNodeGetEnabled(whole, whole_kernel, &enabled));
      CHECK(cudaGraphNodeSetEnabled(whole, whole_kernel, enabled));
    }
    if ((step == o.retarget_step || (step == o.update_step && o.update_retarget)) &&
        last_forward == nullptr) {
      std::fprintf(stderr, "train_layers: the last layer's forward kernel node was not found\n");
      std::exit(1);
    }
    void* retargeted[] = {&last.x, &last.w, &first.act, &last.y, &n, &work};
    if (step == o.retarget_step) {
      cudaKernelNodeParams p{};
      CHECK(cudaGraphKernelNodeGetParams(last_forward, &p));
      p.kernelParams = retargeted;
      CHECK(cudaGraphExecKernelNodeSetParams(whole, last_forward, &p));
    }
    if (step == o.update_step) {
      cudaGraph_t copy = nullptr;
      CHECK(cudaGraphClone(&copy, whole_graph));
      if (o.update_retarget) {
        cudaGraphNode_t node = nullptr;
        CHECK(cudaGraphNodeFindInClone(&node, last_forward, copy));
        cudaKernelNodeParams p{};
        CHECK(cudaGraphKernelNodeGetParams(node, &p));
        p.kernelParams = retargeted;
        CHECK(cudaGraphKernelNodeSetParams(node, &p));
      }
      cudaGraphExecUpdateResultInfo info{};
      const cudaError_t updated = cudaGraphExecUpdate(whole, copy, &info);
      if (updated != cudaSuccess) {
        (void)cudaGetLastError();  // "the graph update was not performed"
        std::fprintf(stderr,
                     "train_layers: step %d: cudaGraphExecUpdate refused (%s): the executable "
                     "runs as it was\n",
                     step, cudaGetErrorName(updated));
      }
      CHECK(cudaGraphDestroy(copy));
    }
    if (o.whole) CHECK(cudaGraphLaunch(whole, s));
    if (o.pair) CHECK(cudaGraphLaunch(pair_forward, s));
    if (per_layer) forward();
    on(first);
    if (step == o.peek_step) launch((const void*)peek_kernel, {&first.act, &peek, &n});
    if (step == o.fault_step) {
      auto* wild = reinterpret_cast<uint32_t*>(reinterpret_cast<uintptr_t>(first.act) +
                                               (uintptr_t{1} << 40));
      uint32_t one = 1;
      launch((const void*)fault_kernel, {&wild, &one});
    }
    if (o.api_graph) {
      if (step == 10 && layers.size() > 1) {
        peeker.act = layers[1].act;
        const cudaKernelNodeParams p = peeker.params(launch);
        CHECK(cudaGraphExecKernelNodeSetParams(peek_exec, peek_node, &p));
      } else if (step == 20 && layers.size() > 2) {
        peeker.act = layers[2].act;
        cudaGraphNode_t node = nullptr;
        cudaGraph_t graph = peeker.build(launch, &node);
        cudaGraphExecUpdateResultInfo info{};
        CHECK(cudaGraphExecUpdate(peek_exec, graph, &info));
        CHECK(cudaGraphDestroy(graph));
      }
      CHECK(cudaGraphLaunch(peek_exec, s));
    }
    if (o.pair) CHECK(cudaGraphLaunch(pair_backward, s));
    if (per_layer) on(last)((const void*)loss_grad_kernel, {&last.y, &last.gy, &n});
    for (size_t l = layers.size(); l-- > 0 && per_layer;) {
      Layer& L = layers[l];
      CHECK(cudaGraphLaunch(L.backward, on(L).stream));
      on(L)((const void*)accumulate_kernel, {&L.acc, &L.gw, &n});
      if (l > 0) hand_off(L, layers[l - 1], layers[l - 1].gy, L.gx);
    }
    for (size_t l = 0; l < layers.size() && per_layer; ++l) {
      on(layers[l])((const void*)update_kernel, {&layers[l].w, &layers[l].acc, &n});
    }
    eager_step(static_cast<uint32_t>(step) + 1);
    if (o.batch_copies) {
      // The loss's source and the first layer's output (not part of the checksum) in one batch.
      on(first);
      void* dsts[] = {host, host_first};
      const void* srcs[] = {last.y, first.y};
      const size_t sizes[] = {bytes, bytes};
      CHECK(cudaMemcpyBatchAsync(dsts, srcs, sizes, 2, &batch_attrs, &batch_attrs_index, 1, s));
      CHECK(cudaStreamSynchronize(s));
    } else {
      to_host(host);
    }
    const uint64_t loss = fnv1a(1469598103934665603ull, host, bytes);
    checksum = fnv1a(checksum, &loss, sizeof(loss));
    step_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - step_start)
            .count());
    if (!o.quiet) std::printf("step %4d  loss 0x%016" PRIx64 "\n", step, loss);
    for (Device& D : devs) {
      size_t free_now = 0;
      CHECK(cudaSetDevice(D.id));
      CHECK(cudaMemGetInfo(&free_now, &total));
      D.least_free = free_now < D.least_free ? free_now : D.least_free;
    }
    on(first);
    if (step == 5 && o.extra_mib > 0) {
      const size_t extra_bytes = size_t(o.extra_mib) << 20;
      CHECK(cudaMalloc(&extra, extra_bytes));
      CHECK(cudaMemsetAsync(extra, 0x5a, extra_bytes, s));
    }
    // As frameworks do after their launches (PyTorch after every kernel): no call of the step
    // left an error behind, including one that vaswap retried and that succeeded.
    CHECK(cudaGetLastError());
    if (o.eval_every > 0 && step % o.eval_every == o.eval_every - 1) {
      // Evaluation: the forward graphs alone, out of the training pattern.
      uint32_t eval_seed = o.seed * 15485863u + static_cast<uint32_t>(step);
      on(first)((const void*)fill_kernel, {&first.x, &eval_seed, &n});
      if (o.pair) CHECK(cudaGraphLaunch(pair_forward, s));
      if (per_layer) forward();
      to_host(host);
      const uint64_t eval = fnv1a(1469598103934665603ull, host, bytes);
      checksum = fnv1a(checksum, &eval, sizeof(eval));
      if (!o.quiet) std::printf("eval %4d  loss 0x%016" PRIx64 "\n", step, eval);
    }
  }
  on(first);
  if (o.peek_step >= 0 || o.api_graph) {
    CHECK(cudaMemcpy(host, peek, bytes, cudaMemcpyDeviceToHost));
    checksum = fnv1a(checksum, host, bytes);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (Layer& L : layers) {
    on(L);
    CHECK(cudaMemcpy(host, L.w, bytes, cudaMemcpyDeviceToHost));
    checksum = fnv1a(checksum, host, bytes);
  }

  size_t in_use = 0, least_free = 0, held = 0;
  for (Device& D : devs) {
    size_t free_end = 0;
    CHECK(cudaSetDevice(D.id));
    CHECK(cudaMemGetInfo(&free_end, &total));
    in_use += D.free_start - free_end;
    least_free += D.least_free;
    held += D.held;
  }
  if (!o.quiet) {
    const int graphs = o.whole ? 1 : o.pair ? 2 : 2 * o.layers;
    std::printf(
        "graphs: %d captured, %d replays; buffers allocated during capture: %d (%.1f MiB)\n",
        graphs, graphs * o.steps, captured_allocations,
        static_cast<double>(captured_allocations) * static_cast<double>(bytes) / (1 << 20));
    std::printf("device memory in use: %.1f MiB (cudaMemGetInfo); %.3f s, %.2f ms/step\n",
                static_cast<double>(in_use) / (1 << 20), seconds, 1e3 * seconds / o.steps);
  }
  std::printf("checksum 0x%016" PRIx64 "\n", checksum);
  if (o.out != nullptr) {
    FILE* f = std::fopen(o.out, "w");
    if (f == nullptr) {
      std::fprintf(stderr, "train_layers: cannot write %s\n", o.out);
      std::exit(1);
    }
    std::fprintf(f, "{\"checksum\": \"0x%016" PRIx64 "\", \"ms_per_step\": %.4f, \"step_ms\": [",
                 checksum, 1e3 * seconds / o.steps);
    for (size_t i = 0; i < step_ms.size(); ++i) {
      std::fprintf(f, "%s%.4f", i == 0 ? "" : ", ", step_ms[i]);
    }
    std::fprintf(f, "], \"least_free_bytes\": %zu, \"held_bytes\": %zu, \"devices\": %d}\n",
                 least_free, held, o.devices);
    std::fclose(f);
  }
  for (Layer& L : layers) {
    on(L);
    if (per_layer) CHECK(cudaGraphExecDestroy(L.forward));
    if (per_layer) CHECK(cudaGraphExecDestroy(L.backward));
    if (L.dev == 0 && pair_forward != nullptr) {  // before the buffers they use go
      CHECK(cudaGraphExecDestroy(pair_forward));
      CHECK(cudaGraphExecDestroy(pair_backward));
      pair_forward = pair_backward = nullptr;
    }
    if (L.dev == 0 && whole != nullptr && !o.free_first) {  // before the buffers it uses go
      CHECK(cudaGraphExecDestroy(whole));
      CHECK(cudaGraphDestroy(whole_graph));
      whole = nullptr;
    }
    for (uint32_t* p : {L.x, L.gy, L.w, L.acc, L.act, L.y, L.gx, L.gw}) CHECK(cudaFree(p));
  }
  if (whole != nullptr) {  // --free-first: after the buffers it used
    CHECK(cudaGraphExecDestroy(whole));
    CHECK(cudaGraphDestroy(whole_graph));
  }
  on(first);
  if (extra != nullptr) CHECK(cudaFree(extra));
  if (eager != nullptr) CHECK(cudaFree(eager));
  if (o.api_graph) {
    CHECK(cudaGraphExecDestroy(peek_exec));
    CHECK(cudaGraphDestroy(peek_graph));
  }
  CHECK(cudaFree(peek));
  CHECK(cudaFreeHost(host));
  CHECK(cudaFreeHost(host_first));
  for (Device& D : devs) {
    CHECK(cudaSetDevice(D.id));
    if (D.hold != nullptr) CHECK(cudaFreeAsync(D.hold, D.stream));
    CHECK(cudaStreamSynchronize(D.stream));
    CHECK(cudaEventDestroy(D.handed));
    CHECK(cudaStreamDestroy(D.stream));
  }
  return 0;
}
