// Internal state of the simulated CUDA driver (libcuda.so.1 on host memory).
//
// Every handle the driver hands out is a pointer to one of the objects below, checked against a
// live-set before use. Global state is deliberately leaked: stream threads may still run while
// the process exits, and must never find a destroyed mutex.
#pragma once

#include <cuda.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "vaswap_sim/abi.h"

namespace vsim {

constexpr size_t kGranularity = size_t{2} << 20;  // VMM granularity, as on an H200
constexpr size_t kPage = 4096;

inline size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }
// Parses "16GiB", "512MiB", "1048576" (the VASWAP_SIM_* sizes); `fallback` when it cannot.
size_t parse_bytes(const std::string& text, size_t fallback);

// ---------------------------------------------------------------------------------------------
// Entry checks
// ---------------------------------------------------------------------------------------------

// True while a stream worker runs a host function: CUDA calls from there are not permitted.
extern thread_local bool tls_in_host_fn;
// CUDA calls attempted from host functions (each refused); vaswapSimHostFnViolations reads it.
extern std::atomic<unsigned long long> g_host_fn_violations;
// Set by the _ptsz/_ptds entry points: the null stream means the per-thread stream.
extern thread_local bool tls_null_is_per_thread;

bool initialized();
// The process is exiting and the driver has shut down: every call is CUDA_ERROR_DEINITIALIZED.
bool shut_down();
// At shutdown: waits (`limit` at most) for every stream's enqueued work to retire, as a GPU's
// driver tears its contexts down behind the device's pending work.
void drain_at_shutdown(std::chrono::milliseconds limit);
CUresult fault_check(const char* function);
// The error a device fault left on the calling thread's device (any device when no context is
// current), or CUDA_SUCCESS. Sticky, as on a GPU: every later call returns it.
CUresult sticky_error();
// The sticky error of `device` (what a synchronization returns once its wait ends).
CUresult device_error(int device);
// What a stream worker is running ("kernel NAME", "a copy", ...), for the device-fault report.
extern thread_local const char* tls_running;
// On a stream worker: the device it runs for (-1 elsewhere).
extern thread_local int tls_worker_device;
// Called as a kernel starts on the device: true when the armed "device" fault fires, which makes
// the error sticky on tls_worker_device; the kernel does not run.
bool kernel_faults();

// Every public entry point starts with this: host-function rule, cuInit, fault injection.
#define SIM_ENTER()                                                             \
  do {                                                                          \
    if (::vsim::tls_in_host_fn) {                                               \
      ::vsim::g_host_fn_violations.fetch_add(1);                                \
      return CUDA_ERROR_NOT_PERMITTED;                                          \
    }                                                                           \
    if (!::vsim::initialized()) return CUDA_ERROR_NOT_INITIALIZED;              \
    if (::vsim::shut_down()) return CUDA_ERROR_DEINITIALIZED;                   \
    if (CUresult sim_sticky_ = ::vsim::sticky_error()) return sim_sticky_;      \
    if (CUresult sim_fault_ = ::vsim::fault_check(__func__)) return sim_fault_; \
  } while (0)

#define SIM_TRY(expr)                              \
  do {                                             \
    if (CUresult sim_rc_ = (expr)) return sim_rc_; \
  } while (0)

struct PerThreadScope {
  bool saved = tls_null_is_per_thread;
  PerThreadScope() { tls_null_is_per_thread = true; }
  ~PerThreadScope() { tls_null_is_per_thread = saved; }
  PerThreadScope(const PerThreadScope&) = delete;
  PerThreadScope& operator=(const PerThreadScope&) = delete;
};

// ---------------------------------------------------------------------------------------------
// Devices and contexts
// ---------------------------------------------------------------------------------------------

struct Stream;

struct Context {
  static constexpr uint32_t kMagic = 0x43545853;  // "SXTC"
  uint32_t magic = kMagic;
  int device = 0;
  int retains = 0;
  uint64_t peers = 0;              // devices whose memory it enabled access to (capture_mutex)
  std::shared_ptr<Stream> legacy;  // the device's NULL stream
};

struct Device {
  int ordinal = 0;
  size_t capacity_bytes = 0;
  std::atomic<size_t> physical_bytes{0};
  // VASWAP_SIM_STREAM_BYTES: device memory each stream made by cuStreamCreate* holds until it is
  // destroyed (0 by default). A GPU's streams cost some; on an H100 left 24 MiB, vaswap's were
  // refused for want of it (bench/results/capacity_edges_session51_h100.md).
  std::atomic<size_t> stream_bytes{0};
  // VASWAP_SIM_HOLDBACK: device memory that cuMemGetInfo reports free but no allocation can
  // have (0 by default): a cuMemCreate, cuMemAlloc or array that would leave less than this free
  // fails out of memory. An H100 reported about 2.2 MiB free that neither cuMemCreate nor
  // cuMemAlloc could get, at every fill from 256 to 8 MiB left
  // (bench/results/create_room_session54_h100.txt).
  std::atomic<size_t> holdback{0};
  Context primary;
  // CUDA_DEVICE_MAX_CONNECTIONS=1: every stream of the device feeds one hardware queue. An
  // operation is dispatched only after every operation submitted before it (from any stream) was
  // dispatched, and a waiting operation (event wait, wait-value, host function) is dispatched only
  // once it is done: it blocks the queue behind it, as on a GPU.
  std::atomic<bool> single_queue{false};
  // A device fault (an illegal address in a kernel): every later call and operation fails with it.
  std::atomic<int> sticky{0};
  std::mutex queue_mutex;
  std::condition_variable queue_cv;
  uint64_t queue_submitted = 0;   // sequence numbers handed out
  uint64_t queue_dispatched = 0;  // every operation up to this one has been dispatched
  // A module load waits while a stream of the device is parked on a wait-value, and no other
  // thread enqueues work on the device meanwhile (see cuModuleLoadData): a load holds `loading`
  // exclusively, every enqueue shares it; `parked` counts the waits not yet satisfied.
  std::shared_mutex loading;
  std::atomic<int> parked{0};
};

std::vector<Device>& devices();

// Work the driver does for the whole device: a module load (cuModuleLoadData, a function's first
// lookup) and a graph's instantiation. As on the H200, it does not return while a stream of the
// device is parked on a wait-value (bench/results/park_probe_module_h200.txt; for instantiation,
// vaswap's copy graphs in bench/results/stall_dump_h200.md). And, as there, where vaswap's worker
// stayed blocked in the driver meanwhile, no other thread enqueues work on the device until it is
// done: such work that waits for a flag whose write is not enqueued yet never returns. Held for
// the length of the call.
class DeviceWideWork {
 public:
  explicit DeviceWideWork(int dev)
      : device_(devices()[static_cast<size_t>(dev)]), lock_(device_.loading) {
    while (device_.parked.load() > 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

 private:
  Device& device_;
  std::unique_lock<std::shared_mutex> lock_;
};
int device_count();
// The calling thread's current context, or nullptr.
Context* current_context();
CUresult current_device(int* device);
// Charges `bytes` of physical memory to `device`, or fails with CUDA_ERROR_OUT_OF_MEMORY.
// Charges bytes of the device's memory, out of memory where that would leave less than keep_free.
CUresult charge_physical(int device, size_t bytes, size_t keep_free = 0);
// An allocation's charge (cuMemCreate, cuMemAlloc*, arrays): keeps the device's holdback free.
CUresult charge_allocation(int device, size_t bytes);
void refund_physical(int device, size_t bytes);

// ---------------------------------------------------------------------------------------------
// Graphs
// ---------------------------------------------------------------------------------------------

struct Function;
struct Graph;

struct Node {
  static constexpr uint32_t kMagic = 0x45444f4e;  // "NODE"
  uint32_t magic = kMagic;
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  Graph* owner = nullptr;
  std::vector<Node*> deps;
  // cuGraphNodeSetEnabled (an executable's kernel, memcpy or memset node): a disabled node is an
  // empty node until enabled again.
  bool enabled = true;

  // CU_GRAPH_NODE_TYPE_KERNEL
  Function* function = nullptr;
  vaswap_sim_dims dims{};
  std::vector<uint8_t> args;    // packed parameter buffer
  std::vector<void*> arg_ptrs;  // kernelParams form: pointers into `args`
  bool via_extra = false;       // launched with a packed `extra` buffer
  size_t extra_size = 0;
  std::vector<void*> extra;  // extra form: {BUFFER_POINTER, args, BUFFER_SIZE, &extra_size, END}
  // CU_GRAPH_NODE_TYPE_MEMCPY
  CUDA_MEMCPY3D copy{};
  // CU_GRAPH_NODE_TYPE_MEMSET
  CUDA_MEMSET_NODE_PARAMS memset{};
  // CU_GRAPH_NODE_TYPE_HOST
  CUhostFn host_fn = nullptr;
  void* host_data = nullptr;
  // CU_GRAPH_NODE_TYPE_GRAPH
  std::shared_ptr<Graph> child;  // shared with the executable graph a launch came from
  // CU_GRAPH_NODE_TYPE_BATCH_MEM_OP (also what a captured stream memory operation becomes)
  std::vector<CUstreamBatchMemOpParams> memops;

  std::unique_ptr<Node> clone(Graph* new_owner,
                              const std::unordered_map<const Node*, Node*>& remap) const;
  void run() const;  // executes the node on the calling (stream worker) thread
  // True when the node waits for something outside its stream (a wait-value operation, a host
  // function): with one hardware queue per device it holds the queue until it is done.
  bool holds_queue() const;
};

struct Graph {
  static constexpr uint32_t kMagic = 0x48505247;  // "GRPH"
  uint32_t magic = kMagic;
  std::vector<std::unique_ptr<Node>> nodes;  // insertion order is a topological order

  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph();  // leaves the handle registry: a stale handle is then invalid, never dangling

  std::unique_ptr<Graph> clone() const;
  Node* add(std::unique_ptr<Node> node, const CUgraphNode* deps, size_t num_deps);
  // Restores `nodes` to a topological order after an edge was added (cuGraphAddDependencies),
  // keeping the present order where the edges allow. False, with nothing changed, on a cycle.
  bool reorder();
  // A clone made by cuGraphClone: its node for each node of the graph it was cloned from
  // (cuGraphNodeFindInClone).
  std::unordered_map<const Node*, Node*> clone_of;
  void run() const;
};

// Where a stream operation was enqueued: the stream and its ticket there.
struct Enqueued {
  std::weak_ptr<Stream> stream;
  uint64_t ticket = 0;
};

struct GraphExec {
  static constexpr uint32_t kMagic = 0x43584547;  // "GEXC"
  uint32_t magic = kMagic;
  std::mutex mutex;              // guards `graph` and `index_of`
  std::shared_ptr<Graph> graph;  // a snapshot taken at instantiation; replaced, never edited,
                                 // by updates, so launches in flight keep what they started with
  // The nodes of the graph it was instantiated from (or last updated from), by their position:
  // how cuGraphExec*SetParams finds the executable's copy of a node.
  std::unordered_map<const Node*, size_t> index_of;
  int device = 0;
  // Its last launch enqueued: the next one, on any stream, runs after it (as CUDA orders them).
  std::mutex launch_mutex;
  Enqueued last_launch;
};

Graph* lookup_graph(CUgraph h);
// Makes `g` a valid handle. `owned`: the application owns it and may cuGraphDestroy it;
// otherwise it is embedded in a child-graph node, which owns it.
void register_graph(Graph* g, bool owned = true);
Node* lookup_node(CUgraphNode h);

// ---------------------------------------------------------------------------------------------
// Streams, events, capture
// ---------------------------------------------------------------------------------------------

struct Capture {
  uint64_t id = 0;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::thread::id thread;
  Graph* graph = nullptr;
  bool owns_graph = true;  // false for cuStreamBeginCaptureToGraph
  bool invalidated = false;
  Stream* origin = nullptr;
  std::set<Stream*> streams;
};

struct Stream {
  static constexpr uint32_t kMagic = 0x4d525453;  // "STRM"
  uint32_t magic = kMagic;
  int device = 0;
  unsigned flags = 0;
  int priority = 0;
  bool legacy = false;
  bool per_thread = false;
  uint64_t id = 0;
  size_t charged = 0;  // device memory it holds (Device::stream_bytes)

  // Work queue; tickets count operations: the op pushed as ticket t is done once completed >= t.
  struct Op {
    std::function<void()> run;
    uint64_t queue_sequence = 0;  // on the device's single queue (CUDA_DEVICE_MAX_CONNECTIONS=1)
    bool holds_queue = false;     // dispatched only once done (see Device::single_queue)
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Op> ops;
  uint64_t enqueued = 0;
  uint64_t completed = 0;
  bool stopping = false;
  std::thread worker;

  // Capture state, guarded by capture_mutex().
  Capture* capture = nullptr;
  std::vector<Node*> capture_deps;

  uint64_t push(std::function<void()> op, bool holds_queue = false);
  uint64_t tail();
  bool done(uint64_t ticket);
  void wait(uint64_t ticket);
  void stop_and_join();
};

struct Event {
  static constexpr uint32_t kMagic = 0x544e5645;  // "EVNT"
  uint32_t magic = kMagic;
  unsigned flags = 0;
  int device = 0;  // of the context current at creation; recorded only on its streams
  std::mutex mu;
  std::shared_ptr<Stream> stream;  // where it was last recorded (outside capture)
  uint64_t ticket = 0;
  uint64_t generation = 0;
  bool stamped = false;
  std::chrono::steady_clock::time_point stamp;
  // Recorded inside a capture: the capture and the nodes a waiter will depend on.
  Capture* capture = nullptr;
  std::vector<Node*> capture_deps;
};

std::mutex& capture_mutex();
// Resolves a stream handle (0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD or a created stream).
CUresult resolve_stream(CUstream h, std::shared_ptr<Stream>* out);
std::shared_ptr<Event> lookup_event(CUevent h);
// The rule for potentially unsafe calls during stream capture (see docs/SIMULATOR.md).
// `own_only`: the rule for the thread's own capture alone, as for instantiating a graph while
// the calling thread captures in a mode other than relaxed (measured on the H200:
// cuGraphInstantiateWithFlags fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and the capture
// is invalidated).
CUresult check_capture_safety(bool own_only = false);
// A device-wide synchronize (cuCtxSynchronize): it may not run while any stream of the device
// captures, whatever the capture's mode and thread (as on the H200: the call fails and every such
// capture is invalidated).
CUresult check_device_sync(int device);
// Enqueues `node` on the stream, or records it into the stream's capture. `after` (enqueued only):
// it first waits for that operation on its stream, and then names this one (how the launches of
// one executable graph are ordered, whatever their streams).
CUresult submit(CUstream h, std::unique_ptr<Node> node, Enqueued* after = nullptr);
// cuStreamSynchronize (wait) or cuStreamQuery (!wait) without the entry checks.
CUresult sync_or_query(CUstream h, bool wait);
// The end of a copy to or from pageable host memory, just enqueued on `h`: as on the H200
// (bench/results/stall_dump_h200.md), the driver stages it, and the call waits, holding the
// device, for the stream's earlier work (CUDA's "API synchronization behavior": a copy from
// pageable memory starts once the stream's earlier work is done) and, `to_host`, for the copy
// itself (its data reaches the pageable buffer through the staging one). `loading` is held
// exclusively meanwhile: no other thread enqueues work or maps pages on the device until it
// returns. Nothing waits when `h` captures (the copy became a node).
CUresult finish_staged(CUstream h, bool to_host);
// Waits until every stream of `device` has finished the work enqueued so far.
void synchronize_device(int device);

// ---------------------------------------------------------------------------------------------
// Modules and functions
// ---------------------------------------------------------------------------------------------

struct Module {
  static constexpr uint32_t kMagic = 0x444f4d53;  // "SMOD"
  uint32_t magic = kMagic;
  const vaswap_sim_image* image = nullptr;
  std::map<std::string, std::unique_ptr<Function>> functions;
};

struct Function {
  static constexpr uint32_t kMagic = 0x434e5546;  // "FUNC"
  uint32_t magic = kMagic;
  const vaswap_sim_kernel_desc* desc = nullptr;
  Module* module = nullptr;
  bool loaded = false;  // looked up once (lazy loading loads it then; module_mutex)
};

Function* lookup_function(CUfunction h);
// Builds a kernel node from either form of arguments (kernelParams, or a packed extra buffer).
CUresult make_kernel_node(CUfunction f, const vaswap_sim_dims& dims, void** params, void** extra,
                          std::unique_ptr<Node>* out);

// ---------------------------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------------------------

// Copies `bytes` between any two addresses; device memory is host memory in the simulator.
CUDA_MEMCPY3D linear_copy(void* dst, CUmemorytype dst_type, const void* src, CUmemorytype src_type,
                          size_t bytes);
void run_copy(const CUDA_MEMCPY3D& c);
// A copy's or memset's device span must be mapped (with access for `hs`'s device) when it is
// enqueued, recorded or added to a graph: else CUDA_ERROR_INVALID_VALUE (memory.cpp).
CUresult check_span(uintptr_t p, size_t bytes, CUstream hs);
void run_memset(const CUDA_MEMSET_NODE_PARAMS& m);

// ---------------------------------------------------------------------------------------------
// Stream memory operations
// ---------------------------------------------------------------------------------------------

// False with VASWAP_SIM_MEMOPS=0 (a system without stream memory operations).
bool memops_supported();
// Checks one operation as the driver does (kind, flags, alignment); CUDA_SUCCESS when valid.
// The CUDA version this driver says it is (VASWAP_SIM_DRIVER_VERSION, else the headers').
int driver_version();
CUresult check_memop(const CUstreamBatchMemOpParams& op);
// Runs a batch on the calling (stream worker) thread: a wait polls its address until the
// condition holds; a write stores the value.
void run_memops(const std::vector<CUstreamBatchMemOpParams>& ops);

}  // namespace vsim

// CUDA 12.8's revision of cuMemcpyBatchAsync (failure index before the stream); cuda.h of CUDA 13
// no longer declares it, and only cuGetProcAddress reaches it.
CUresult CUDAAPI cuMemcpyBatchAsync_sim_v1(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                                           size_t count, CUmemcpyAttributes* attrs,
                                           size_t* attrsIdxs, size_t numAttrs, size_t* failIdx,
                                           CUstream hs);
// CUDA 12.8's revision of cuMemcpy3DBatchAsync (failure index before the flags), likewise.
CUresult CUDAAPI cuMemcpy3DBatchAsync_sim_v1(size_t count, CUDA_MEMCPY3D_BATCH_OP* ops,
                                             size_t* failIdx, unsigned long long flags,
                                             CUstream hs);
