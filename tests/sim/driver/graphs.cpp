// Simulated driver: graphs, nodes, instantiation and launch.
//
// A graph executes its nodes one after another in a topological order: insertion order, which
// is one (a node's dependencies must exist before it), restored after cuGraphAddDependencies. An
// executable graph is a deep copy taken at instantiation, so later edits or destruction of the
// source graph do not affect it.
#include <algorithm>
#include <set>

#include "state.h"

namespace vsim {

namespace {

std::mutex& graph_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::map<Graph*, bool>& graph_registry() {  // graph -> owned by the application
  static auto* m = new std::map<Graph*, bool>;
  return *m;
}
std::unordered_map<GraphExec*, std::shared_ptr<GraphExec>>& exec_registry() {
  static auto* m = new std::unordered_map<GraphExec*, std::shared_ptr<GraphExec>>;
  return *m;
}

void point_extra_at_args(Node* n) {
  n->extra_size = n->args.size();
  n->extra = {CU_LAUNCH_PARAM_BUFFER_POINTER, n->args.data(), CU_LAUNCH_PARAM_BUFFER_SIZE,
              &n->extra_size, CU_LAUNCH_PARAM_END};
}

void rebind_kernel_args(Node* n) {
  if (n->type != CU_GRAPH_NODE_TYPE_KERNEL) return;
  const vaswap_sim_kernel_desc* d = n->function->desc;
  n->arg_ptrs.assign(d->num_params, nullptr);
  for (uint32_t i = 0; i < d->num_params; ++i)
    n->arg_ptrs[i] = n->args.data() + d->param_offsets[i];
  if (n->via_extra) point_extra_at_args(n);
}

}  // namespace

void register_graph(Graph* g, bool owned) {
  std::lock_guard<std::mutex> lock(graph_mutex());
  graph_registry()[g] = owned;
}

Graph::~Graph() {
  std::lock_guard<std::mutex> lock(graph_mutex());
  graph_registry().erase(this);
}

Graph* lookup_graph(CUgraph h) {
  std::lock_guard<std::mutex> lock(graph_mutex());
  auto* g = reinterpret_cast<Graph*>(h);
  return graph_registry().count(g) ? g : nullptr;
}

Node* lookup_node(CUgraphNode h) {
  auto* n = reinterpret_cast<Node*>(h);
  return n != nullptr && n->magic == Node::kMagic ? n : nullptr;
}

std::unique_ptr<Node> Node::clone(Graph* new_owner,
                                  const std::unordered_map<const Node*, Node*>& remap) const {
  auto n = std::make_unique<Node>();
  n->type = type;
  n->owner = new_owner;
  n->enabled = enabled;
  for (Node* d : deps) n->deps.push_back(remap.at(d));
  n->function = function;
  n->dims = dims;
  n->args = args;
  n->via_extra = via_extra;
  n->copy = copy;
  n->memset = memset;
  n->host_fn = host_fn;
  n->host_data = host_data;
  n->memops = memops;
  if (child) n->child = child->clone();
  rebind_kernel_args(n.get());
  return n;
}

void Node::run() const {
  if (!enabled) return;
  switch (type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
      if (kernel_faults()) break;
      tls_running = function->desc->name;
      function->desc->entry(args.data(), &dims);
      tls_running = nullptr;
      break;
    case CU_GRAPH_NODE_TYPE_MEMCPY:
      tls_running = "a copy";
      run_copy(copy);
      tls_running = nullptr;
      break;
    case CU_GRAPH_NODE_TYPE_MEMSET:
      tls_running = "a memset";
      run_memset(memset);
      tls_running = nullptr;
      break;
    case CU_GRAPH_NODE_TYPE_HOST:
      tls_in_host_fn = true;
      host_fn(host_data);
      tls_in_host_fn = false;
      break;
    case CU_GRAPH_NODE_TYPE_GRAPH: child->run(); break;
    case CU_GRAPH_NODE_TYPE_BATCH_MEM_OP: run_memops(memops); break;
    default: break;
  }
}

bool Node::holds_queue() const {
  switch (type) {
    case CU_GRAPH_NODE_TYPE_HOST: return true;
    case CU_GRAPH_NODE_TYPE_BATCH_MEM_OP:
      return std::any_of(memops.begin(), memops.end(), [](const CUstreamBatchMemOpParams& op) {
        return op.operation == CU_STREAM_MEM_OP_WAIT_VALUE_32 ||
               op.operation == CU_STREAM_MEM_OP_WAIT_VALUE_64;
      });
    case CU_GRAPH_NODE_TYPE_GRAPH:
      return std::any_of(child->nodes.begin(), child->nodes.end(),
                         [](const std::unique_ptr<Node>& n) { return n->holds_queue(); });
    default: return false;
  }
}

std::unique_ptr<Graph> Graph::clone() const {
  auto g = std::make_unique<Graph>();
  for (const auto& n : nodes) {
    g->nodes.push_back(n->clone(g.get(), g->clone_of));
    g->clone_of[n.get()] = g->nodes.back().get();
  }
  return g;
}

bool Graph::reorder() {
  // Kahn's algorithm, taking the earliest ready node each time, but a node that can hold the
  // queue (a wait on a value, a host function) only when nothing else is ready: a GPU runs the
  // other branches of a graph while one waits, and one worker thread running the nodes in this
  // order does the same (what the waiting node waits for may come from those branches).
  std::unordered_map<const Node*, size_t> index;
  for (size_t i = 0; i < nodes.size(); ++i) index[nodes[i].get()] = i;
  std::vector<size_t> missing(nodes.size(), 0);
  std::vector<std::vector<size_t>> dependents(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (const Node* d : nodes[i]->deps) {
      ++missing[i];
      dependents[index.at(d)].push_back(i);
    }
  }
  std::set<std::pair<bool, size_t>> ready;  // (holds the queue, index)
  auto make_ready = [&](size_t i) { ready.emplace(nodes[i]->holds_queue(), i); };
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (missing[i] == 0) make_ready(i);
  }
  std::vector<size_t> order;
  while (!ready.empty()) {
    const size_t i = ready.begin()->second;
    ready.erase(ready.begin());
    order.push_back(i);
    for (size_t j : dependents[i]) {
      if (--missing[j] == 0) make_ready(j);
    }
  }
  if (order.size() != nodes.size()) return false;
  std::vector<std::unique_ptr<Node>> sorted;
  sorted.reserve(nodes.size());
  for (size_t i : order) sorted.push_back(std::move(nodes[i]));
  nodes = std::move(sorted);
  return true;
}

Node* Graph::add(std::unique_ptr<Node> node, const CUgraphNode* deps, size_t num_deps) {
  node->owner = this;
  node->deps.clear();
  for (size_t i = 0; i < num_deps; ++i) node->deps.push_back(reinterpret_cast<Node*>(deps[i]));
  rebind_kernel_args(node.get());
  nodes.push_back(std::move(node));
  return nodes.back().get();
}

void Graph::run() const {
  for (const auto& n : nodes) n->run();
}

}  // namespace vsim

using namespace vsim;

// A kernel node from any revision of the kernel-node parameters (v1, v2, v3 share these fields).
template <class Params>
static CUresult kernel_node_of(const Params* p, std::unique_ptr<Node>* out) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const vaswap_sim_dims dims{{p->gridDimX, p->gridDimY, p->gridDimZ},
                             {p->blockDimX, p->blockDimY, p->blockDimZ},
                             p->sharedMemBytes};
  return make_kernel_node(p->func, dims, p->kernelParams, p->extra, out);
}

static bool deps_belong(Graph* g, const CUgraphNode* deps, size_t n) {
  if (n > 0 && deps == nullptr) return false;
  for (size_t i = 0; i < n; ++i) {
    Node* d = lookup_node(deps[i]);
    if (d == nullptr || d->owner != g) return false;
  }
  return true;
}

static CUresult add_node(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps, size_t n,
                         std::unique_ptr<Node> node) {
  Graph* g = lookup_graph(hg);
  if (out == nullptr || g == nullptr || !deps_belong(g, deps, n)) return CUDA_ERROR_INVALID_VALUE;
  *out = reinterpret_cast<CUgraphNode>(g->add(std::move(node), deps, n));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphCreate(CUgraph* ph, unsigned int flags) {
  SIM_ENTER();
  if (ph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  auto* g = new Graph;
  register_graph(g);
  *ph = reinterpret_cast<CUgraph>(g);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphDestroy(CUgraph hg) {
  SIM_ENTER();
  auto* g = reinterpret_cast<Graph*>(hg);
  {
    std::lock_guard<std::mutex> lock(graph_mutex());
    auto it = graph_registry().find(g);
    // A child-graph node's embedded graph belongs to that node.
    if (it == graph_registry().end() || !it->second) return CUDA_ERROR_INVALID_VALUE;
  }
  delete g;  // unregisters itself, and its embedded child graphs
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphAddEmptyNode(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps,
                                     size_t n) {
  SIM_ENTER();
  return add_node(out, hg, deps, n, std::make_unique<Node>());
}

CUresult CUDAAPI cuGraphAddKernelNode_v2(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps,
                                         size_t n, const CUDA_KERNEL_NODE_PARAMS* p) {
  SIM_ENTER();
  std::unique_ptr<Node> node;
  SIM_TRY(kernel_node_of(p, &node));
  return add_node(out, hg, deps, n, std::move(node));
}

// The device sides of a copy node, of a memset node, and of those in a child graph: mapped, or
// CUDA_ERROR_INVALID_VALUE. The driver checks them when a graph is instantiated, and when an
// executable's copy or memset node is given new parameters, not when an executable is updated or
// launched (bench/results/launch_unmapped_h100.txt). The simulator checks them too when a copy or
// memset node is added or a graph's node is given new parameters, as it does a captured copy or
// memset (the driver refuses those: DESIGN.md section 7); that the driver checks an added node is
// inferred from the capture, not measured (case 6 of bench/launch_unmapped.cu asks).
static CUresult check_node_spans(const Node& node) {
  if (node.type == CU_GRAPH_NODE_TYPE_MEMCPY) {
    const CUDA_MEMCPY3D& copy = node.copy;
    const size_t rows = std::max<size_t>(copy.Height, 1) * std::max<size_t>(copy.Depth, 1);
    if (copy.srcMemoryType == CU_MEMORYTYPE_DEVICE) {
      SIM_TRY(check_span(copy.srcDevice + copy.srcXInBytes, copy.WidthInBytes * rows, nullptr));
    }
    if (copy.dstMemoryType == CU_MEMORYTYPE_DEVICE) {
      SIM_TRY(check_span(copy.dstDevice + copy.dstXInBytes, copy.WidthInBytes * rows, nullptr));
    }
  } else if (node.type == CU_GRAPH_NODE_TYPE_MEMSET) {
    const CUDA_MEMSET_NODE_PARAMS& set = node.memset;
    const size_t rows = std::max<size_t>(set.height, 1);
    const size_t row = set.width * set.elementSize;
    SIM_TRY(check_span(set.dst, (rows - 1) * set.pitch + row, nullptr));
  } else if (node.type == CU_GRAPH_NODE_TYPE_GRAPH && node.child) {
    for (const auto& inner : node.child->nodes) SIM_TRY(check_node_spans(*inner));
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphAddMemcpyNode(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps,
                                      size_t n, const CUDA_MEMCPY3D* copy, CUcontext ctx) {
  SIM_ENTER();
  (void)ctx;
  if (copy == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto node = std::make_unique<Node>();
  node->type = CU_GRAPH_NODE_TYPE_MEMCPY;
  node->copy = *copy;
  SIM_TRY(check_node_spans(*node));
  return add_node(out, hg, deps, n, std::move(node));
}

CUresult CUDAAPI cuGraphAddMemsetNode(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps,
                                      size_t n, const CUDA_MEMSET_NODE_PARAMS* params,
                                      CUcontext ctx) {
  SIM_ENTER();
  (void)ctx;
  if (params == nullptr ||
      (params->elementSize != 1 && params->elementSize != 2 && params->elementSize != 4)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto node = std::make_unique<Node>();
  node->type = CU_GRAPH_NODE_TYPE_MEMSET;
  node->memset = *params;
  SIM_TRY(check_node_spans(*node));
  return add_node(out, hg, deps, n, std::move(node));
}

// A graph's (not an executable's) copy or memset node given new parameters: checked as an added
// node is.
static CUresult change_node(CUgraphNode hn, const Node& changed) {
  Node* n = lookup_node(hn);
  if (n == nullptr || n->type != changed.type) return CUDA_ERROR_INVALID_VALUE;
  SIM_TRY(check_node_spans(changed));
  if (changed.type == CU_GRAPH_NODE_TYPE_MEMCPY) {
    n->copy = changed.copy;
  } else {
    n->memset = changed.memset;
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphKernelNodeSetParams_v2(CUgraphNode hn, const CUDA_KERNEL_NODE_PARAMS* p) {
  SIM_ENTER();
  Node* n = lookup_node(hn);
  if (n == nullptr || n->type != CU_GRAPH_NODE_TYPE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
  std::unique_ptr<Node> changed;
  SIM_TRY(kernel_node_of(p, &changed));
  n->function = changed->function;
  n->dims = changed->dims;
  n->args = std::move(changed->args);
  n->via_extra = changed->via_extra;
  rebind_kernel_args(n);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphMemcpyNodeSetParams(CUgraphNode hn, const CUDA_MEMCPY3D* copy) {
  SIM_ENTER();
  if (copy == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Node changed;
  changed.type = CU_GRAPH_NODE_TYPE_MEMCPY;
  changed.copy = *copy;
  return change_node(hn, changed);
}

CUresult CUDAAPI cuGraphMemsetNodeSetParams(CUgraphNode hn, const CUDA_MEMSET_NODE_PARAMS* params) {
  SIM_ENTER();
  if (params == nullptr ||
      (params->elementSize != 1 && params->elementSize != 2 && params->elementSize != 4)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Node changed;
  changed.type = CU_GRAPH_NODE_TYPE_MEMSET;
  changed.memset = *params;
  return change_node(hn, changed);
}

CUresult CUDAAPI cuGraphAddHostNode(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps, size_t n,
                                    const CUDA_HOST_NODE_PARAMS* params) {
  SIM_ENTER();
  if (params == nullptr || params->fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto node = std::make_unique<Node>();
  node->type = CU_GRAPH_NODE_TYPE_HOST;
  node->host_fn = params->fn;
  node->host_data = params->userData;
  return add_node(out, hg, deps, n, std::move(node));
}

CUresult CUDAAPI cuGraphAddChildGraphNode(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps,
                                          size_t n, CUgraph child) {
  SIM_ENTER();
  Graph* c = lookup_graph(child);
  if (c == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto node = std::make_unique<Node>();
  node->type = CU_GRAPH_NODE_TYPE_GRAPH;
  node->child = c->clone();  // CUDA embeds a copy of the child graph
  return add_node(out, hg, deps, n, std::move(node));
}

CUresult CUDAAPI cuGraphGetNodes(CUgraph hg, CUgraphNode* nodes, size_t* count) {
  SIM_ENTER();
  Graph* g = lookup_graph(hg);
  if (g == nullptr || count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (nodes == nullptr) {
    *count = g->nodes.size();
    return CUDA_SUCCESS;
  }
  const size_t n = std::min(*count, g->nodes.size());
  for (size_t i = 0; i < n; ++i) nodes[i] = reinterpret_cast<CUgraphNode>(g->nodes[i].get());
  for (size_t i = n; i < *count; ++i) nodes[i] = nullptr;
  *count = n;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphNodeGetType(CUgraphNode hn, CUgraphNodeType* type) {
  SIM_ENTER();
  Node* n = lookup_node(hn);
  if (n == nullptr || type == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *type = n->type;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphNodeGetDependencies_v2(CUgraphNode hn, CUgraphNode* deps,
                                               CUgraphEdgeData* edge_data, size_t* count) {
  SIM_ENTER();
  Node* n = lookup_node(hn);
  if (n == nullptr || count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (deps == nullptr) {
    *count = n->deps.size();
    return CUDA_SUCCESS;
  }
  const size_t k = std::min(*count, n->deps.size());
  for (size_t i = 0; i < k; ++i) {
    deps[i] = reinterpret_cast<CUgraphNode>(n->deps[i]);
    if (edge_data != nullptr) edge_data[i] = CUgraphEdgeData{};
  }
  *count = k;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphClone(CUgraph* out, CUgraph original) {
  SIM_ENTER();
  Graph* g = lookup_graph(original);
  if (out == nullptr || g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Graph* copy = g->clone().release();
  register_graph(copy);
  *out = reinterpret_cast<CUgraph>(copy);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphNodeFindInClone(CUgraphNode* out, CUgraphNode original, CUgraph clone) {
  SIM_ENTER();
  Graph* g = lookup_graph(clone);
  Node* n = lookup_node(original);
  if (out == nullptr || g == nullptr || n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto it = g->clone_of.find(n);
  if (it == g->clone_of.end()) return CUDA_ERROR_INVALID_VALUE;
  *out = reinterpret_cast<CUgraphNode>(it->second);
  return CUDA_SUCCESS;
}

// Edges from[i] -> to[i]. As CUDA documents: both ends in `graph`, no edge twice, no cycle;
// edge data other than the default is refused (the simulator has no programmatic edges).
CUresult CUDAAPI cuGraphAddDependencies_v2(CUgraph hg, const CUgraphNode* from,
                                           const CUgraphNode* to, const CUgraphEdgeData* data,
                                           size_t count) {
  SIM_ENTER();
  Graph* g = lookup_graph(hg);
  if (g == nullptr || (count > 0 && (from == nullptr || to == nullptr))) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (size_t i = 0; i < count; ++i) {
    Node* a = lookup_node(from[i]);
    Node* b = lookup_node(to[i]);
    if (a == nullptr || b == nullptr || a->owner != g || b->owner != g || a == b) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (std::find(b->deps.begin(), b->deps.end(), a) != b->deps.end()) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (data != nullptr && (data[i].type != 0 || data[i].from_port != 0 || data[i].to_port != 0)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  std::vector<std::pair<Node*, size_t>> added;
  for (size_t i = 0; i < count; ++i) {
    Node* b = lookup_node(to[i]);
    b->deps.push_back(lookup_node(from[i]));
    added.emplace_back(b, b->deps.size() - 1);
  }
  if (!g->reorder()) {
    for (auto it = added.rbegin(); it != added.rend(); ++it) {
      it->first->deps.erase(it->first->deps.begin() + static_cast<long>(it->second));
    }
    return CUDA_ERROR_INVALID_VALUE;  // a cycle
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphKernelNodeGetParams_v2(CUgraphNode hn, CUDA_KERNEL_NODE_PARAMS* p) {
  SIM_ENTER();
  Node* n = lookup_node(hn);
  if (n == nullptr || p == nullptr || n->type != CU_GRAPH_NODE_TYPE_KERNEL) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *p = CUDA_KERNEL_NODE_PARAMS{};
  p->func = reinterpret_cast<CUfunction>(n->function);
  p->gridDimX = n->dims.grid[0];
  p->gridDimY = n->dims.grid[1];
  p->gridDimZ = n->dims.grid[2];
  p->blockDimX = n->dims.block[0];
  p->blockDimY = n->dims.block[1];
  p->blockDimZ = n->dims.block[2];
  p->sharedMemBytes = n->dims.shared_bytes;
  // The form the launch used: kernelParams, or the packed `extra` buffer (as cuBLAS launches).
  if (n->via_extra) {
    p->extra = n->extra.data();
  } else {
    p->kernelParams = n->arg_ptrs.data();
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphMemcpyNodeGetParams(CUgraphNode hn, CUDA_MEMCPY3D* p) {
  SIM_ENTER();
  Node* n = lookup_node(hn);
  if (n == nullptr || p == nullptr || n->type != CU_GRAPH_NODE_TYPE_MEMCPY) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *p = n->copy;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphMemsetNodeGetParams(CUgraphNode hn, CUDA_MEMSET_NODE_PARAMS* p) {
  SIM_ENTER();
  Node* n = lookup_node(hn);
  if (n == nullptr || p == nullptr || n->type != CU_GRAPH_NODE_TYPE_MEMSET) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *p = n->memset;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphHostNodeGetParams(CUgraphNode hn, CUDA_HOST_NODE_PARAMS* p) {
  SIM_ENTER();
  Node* n = lookup_node(hn);
  if (n == nullptr || p == nullptr || n->type != CU_GRAPH_NODE_TYPE_HOST) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  p->fn = n->host_fn;
  p->userData = n->host_data;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphChildGraphNodeGetGraph(CUgraphNode hn, CUgraph* out) {
  SIM_ENTER();
  Node* n = lookup_node(hn);
  if (n == nullptr || out == nullptr || n->type != CU_GRAPH_NODE_TYPE_GRAPH) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // The embedded graph is owned by the node; register it so queries on it work.
  register_graph(n->child.get(), /*owned=*/false);
  *out = reinterpret_cast<CUgraph>(n->child.get());
  return CUDA_SUCCESS;
}

// -----------------------------------------------------------------------------------------------
// Instantiation and launch
// -----------------------------------------------------------------------------------------------

static CUresult instantiate(CUgraphExec* out, CUgraph hg, unsigned long long flags) {
  Graph* g = lookup_graph(hg);
  if (out == nullptr || g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  constexpr unsigned long long kKnown =
      CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
      CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
  if ((flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  SIM_TRY(check_capture_safety(/*own_only=*/true));
  for (const auto& node : g->nodes) SIM_TRY(check_node_spans(*node));
  int dev = 0;
  SIM_TRY(current_device(&dev));
  const DeviceWideWork stall(dev);
  auto exec = std::make_shared<GraphExec>();
  std::unique_ptr<Graph> copy = g->clone();
  // The launch order: a wait on a value runs once nothing beside it is ready (reorder()).
  if (!copy->reorder()) return CUDA_ERROR_INVALID_VALUE;
  std::unordered_map<const Node*, size_t> position;
  for (size_t i = 0; i < copy->nodes.size(); ++i) position[copy->nodes[i].get()] = i;
  for (const auto& [original, cloned] : copy->clone_of) {
    exec->index_of[original] = position.at(cloned);
  }
  exec->graph = std::shared_ptr<Graph>(copy.release());
  exec->device = dev;
  std::lock_guard<std::mutex> lock(graph_mutex());
  exec_registry()[exec.get()] = exec;
  *out = reinterpret_cast<CUgraphExec>(exec.get());
  return CUDA_SUCCESS;
}

static std::shared_ptr<GraphExec> lookup_exec(CUgraphExec he) {
  std::lock_guard<std::mutex> lock(graph_mutex());
  auto it = exec_registry().find(reinterpret_cast<GraphExec*>(he));
  return it == exec_registry().end() ? nullptr : it->second;
}

// Replaces the executable's copy of `hn` (a node of the graph it was made from) with `node`,
// keeping its dependencies. Copy on write: launches already enqueued keep the old graph, as CUDA
// documents ("already enqueued or running launches are not affected").
// The position of the executable's copy of `hn` (a node of the graph it was made from): false when
// it has none. Under exec.mutex.
static bool exec_index_locked(const GraphExec& exec, CUgraphNode hn, size_t* index) {
  Node* source = lookup_node(hn);
  auto it = source == nullptr ? exec.index_of.end() : exec.index_of.find(source);
  if (it == exec.index_of.end()) return false;
  *index = it->second;
  return true;
}

static CUresult replace_exec_node(CUgraphExec he, CUgraphNode hn, std::unique_ptr<Node> node) {
  auto exec = lookup_exec(he);
  if (!exec) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(exec->mutex);
  size_t at = 0;
  if (!exec_index_locked(*exec, hn, &at)) return CUDA_ERROR_INVALID_VALUE;
  const Node& old = *exec->graph->nodes[at];
  if (old.type != node->type) return CUDA_ERROR_INVALID_VALUE;  // a node keeps its kind
  std::shared_ptr<Graph> updated(exec->graph->clone().release());
  node->owner = updated.get();
  node->deps = updated->nodes[at]->deps;
  node->enabled = old.enabled;  // new parameters leave a disabled node disabled
  rebind_kernel_args(node.get());
  // The nodes that depend on the old one depend on its replacement.
  const Node* replaced = updated->nodes[at].get();
  for (const auto& other : updated->nodes) {
    std::replace(other->deps.begin(), other->deps.end(), const_cast<Node*>(replaced), node.get());
  }
  updated->nodes[at] = std::move(node);
  exec->graph = std::move(updated);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* out, CUgraph hg,
                                             unsigned long long flags) {
  SIM_ENTER();
  return instantiate(out, hg, flags);
}

// The CUDA 10-11 ABI that cuGetProcAddress still answers for "cuGraphInstantiate" (versions 10000
// and 11000): an error node and a log buffer instead of flags. (cuda.h's cuGraphInstantiate is a
// macro for cuGraphInstantiateWithFlags; asking the driver for that name is another function.)
CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec* out, CUgraph hg, CUgraphNode* error_node,
                                       char* log, size_t log_bytes) {
  SIM_ENTER();
  if (error_node != nullptr) *error_node = nullptr;
  if (log != nullptr && log_bytes > 0) log[0] = '\0';
  return instantiate(out, hg, 0);
}

CUresult CUDAAPI cuGraphInstantiateWithParams(CUgraphExec* out, CUgraph hg,
                                              CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  SIM_ENTER();
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const CUresult rc = instantiate(out, hg, params->flags);
  params->hErrNode_out = nullptr;
  params->result_out =
      rc == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
  return rc;
}

CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec he) {
  SIM_ENTER();
  // A launch still in flight keeps its own reference; destruction completes after it.
  std::shared_ptr<GraphExec> last;  // released after the lock: ~Graph takes it
  {
    std::lock_guard<std::mutex> lock(graph_mutex());
    auto it = exec_registry().find(reinterpret_cast<GraphExec*>(he));
    if (it == exec_registry().end()) return CUDA_ERROR_INVALID_VALUE;
    last = std::move(it->second);
    exec_registry().erase(it);
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphLaunch(CUgraphExec he, CUstream hs) {
  SIM_ENTER();
  auto exec = lookup_exec(he);
  if (!exec) return CUDA_ERROR_INVALID_VALUE;
  // Launched into a capture, a graph becomes a child-graph node; otherwise it runs as one
  // stream operation. The node keeps the executable alive until it has run.
  auto node = std::make_unique<Node>();
  node->type = CU_GRAPH_NODE_TYPE_GRAPH;
  {
    std::lock_guard<std::mutex> lock(exec->mutex);
    node->child = exec->graph;
  }
  // "Each launch is ordered behind both any previous work in hStream and any previous launches of
  // hGraphExec" (cuGraphLaunch).
  std::lock_guard<std::mutex> order(exec->launch_mutex);
  return submit(hs, std::move(node), &exec->last_launch);
}

// -----------------------------------------------------------------------------------------------
// Updates of executable graphs
// -----------------------------------------------------------------------------------------------

// The whole graph, if its topology matches (same nodes, of the same kinds, in the same order).
// "Sets the specified node to be enabled or disabled. Disabled nodes are functionally equivalent to
// empty nodes until they are reenabled" (cuGraphNodeSetEnabled): a node of the graph the
// executable was made from; kernel, memcpy and memset nodes only. Copy on write, as a node's new
// parameters: launches already enqueued keep what they started with.
static bool can_disable(const Node& node) {
  return node.type == CU_GRAPH_NODE_TYPE_KERNEL || node.type == CU_GRAPH_NODE_TYPE_MEMCPY ||
         node.type == CU_GRAPH_NODE_TYPE_MEMSET;
}

CUresult CUDAAPI cuGraphNodeSetEnabled(CUgraphExec he, CUgraphNode hn, unsigned int enabled) {
  SIM_ENTER();
  auto exec = lookup_exec(he);
  if (!exec) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(exec->mutex);
  size_t at = 0;
  if (!exec_index_locked(*exec, hn, &at) || !can_disable(*exec->graph->nodes[at])) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::shared_ptr<Graph> updated(exec->graph->clone().release());
  updated->nodes[at]->enabled = enabled != 0;
  exec->graph = std::move(updated);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphNodeGetEnabled(CUgraphExec he, CUgraphNode hn, unsigned int* enabled) {
  SIM_ENTER();
  auto exec = lookup_exec(he);
  if (!exec || enabled == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(exec->mutex);
  size_t at = 0;
  if (!exec_index_locked(*exec, hn, &at) || !can_disable(*exec->graph->nodes[at])) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *enabled = exec->graph->nodes[at]->enabled ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphExecUpdate_v2(CUgraphExec he, CUgraph hg,
                                      CUgraphExecUpdateResultInfo* info) {
  SIM_ENTER();
  auto exec = lookup_exec(he);
  Graph* g = lookup_graph(hg);
  if (!exec || g == nullptr || info == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *info = CUgraphExecUpdateResultInfo{};
  std::lock_guard<std::mutex> lock(exec->mutex);
  const auto& now = exec->graph->nodes;
  bool same = now.size() == g->nodes.size();
  for (size_t i = 0; same && i < now.size(); ++i) {
    if (now[i]->type != g->nodes[i]->type) {
      same = false;
      info->errorNode = reinterpret_cast<CUgraphNode>(g->nodes[i].get());
      info->result = CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED;
    }
  }
  if (!same) {
    if (info->result == CU_GRAPH_EXEC_UPDATE_SUCCESS) {
      info->result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
    }
    return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
  }
  exec->graph = std::shared_ptr<Graph>(g->clone().release());
  for (size_t i = 0; i < g->nodes.size(); ++i) exec->index_of[g->nodes[i].get()] = i;
  info->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
  return CUDA_SUCCESS;
}

// The CUDA 10.2-11.x ABI.
CUresult CUDAAPI cuGraphExecUpdate(CUgraphExec he, CUgraph hg, CUgraphNode* error_node,
                                   CUgraphExecUpdateResult* result) {
  CUgraphExecUpdateResultInfo info{};
  const CUresult rc = cuGraphExecUpdate_v2(he, hg, &info);
  if (error_node != nullptr) *error_node = info.errorNode;
  if (result != nullptr) *result = info.result;
  return rc;
}

CUresult CUDAAPI cuGraphExecKernelNodeSetParams_v2(CUgraphExec he, CUgraphNode hn,
                                                   const CUDA_KERNEL_NODE_PARAMS* p) {
  SIM_ENTER();
  std::unique_ptr<Node> node;
  SIM_TRY(kernel_node_of(p, &node));
  return replace_exec_node(he, hn, std::move(node));
}

CUresult CUDAAPI cuGraphExecKernelNodeSetParams(CUgraphExec he, CUgraphNode hn,
                                                const CUDA_KERNEL_NODE_PARAMS_v1* p) {
  SIM_ENTER();
  std::unique_ptr<Node> node;
  SIM_TRY(kernel_node_of(p, &node));
  return replace_exec_node(he, hn, std::move(node));
}

CUresult CUDAAPI cuGraphExecMemcpyNodeSetParams(CUgraphExec he, CUgraphNode hn,
                                                const CUDA_MEMCPY3D* copy, CUcontext ctx) {
  SIM_ENTER();
  (void)ctx;
  if (copy == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto node = std::make_unique<Node>();
  node->type = CU_GRAPH_NODE_TYPE_MEMCPY;
  node->copy = *copy;
  SIM_TRY(check_node_spans(*node));
  return replace_exec_node(he, hn, std::move(node));
}

CUresult CUDAAPI cuGraphExecMemsetNodeSetParams(CUgraphExec he, CUgraphNode hn,
                                                const CUDA_MEMSET_NODE_PARAMS* params,
                                                CUcontext ctx) {
  SIM_ENTER();
  (void)ctx;
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto node = std::make_unique<Node>();
  node->type = CU_GRAPH_NODE_TYPE_MEMSET;
  node->memset = *params;
  SIM_TRY(check_node_spans(*node));
  return replace_exec_node(he, hn, std::move(node));
}

CUresult CUDAAPI cuGraphExecChildGraphNodeSetParams(CUgraphExec he, CUgraphNode hn, CUgraph child) {
  SIM_ENTER();
  Graph* c = lookup_graph(child);
  if (c == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto node = std::make_unique<Node>();
  node->type = CU_GRAPH_NODE_TYPE_GRAPH;
  node->child = c->clone();
  return replace_exec_node(he, hn, std::move(node));
}

// The generic form: the simulator knows kernel nodes only through the typed calls.
CUresult CUDAAPI cuGraphExecNodeSetParams(CUgraphExec he, CUgraphNode hn,
                                          CUgraphNodeParams* params) {
  SIM_ENTER();
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (params->type != CU_GRAPH_NODE_TYPE_KERNEL) return CUDA_ERROR_NOT_SUPPORTED;
  std::unique_ptr<Node> node;
  SIM_TRY(kernel_node_of(&params->kernel, &node));
  return replace_exec_node(he, hn, std::move(node));
}

// -----------------------------------------------------------------------------------------------
// Batch memory-operation nodes (stream memory operations in a graph)
// -----------------------------------------------------------------------------------------------

static CUresult memop_node(const CUDA_BATCH_MEM_OP_NODE_PARAMS* p, std::unique_ptr<Node>* out) {
  if (p == nullptr || p->count == 0 || p->paramArray == nullptr || p->flags != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto node = std::make_unique<Node>();
  node->type = CU_GRAPH_NODE_TYPE_BATCH_MEM_OP;
  for (unsigned i = 0; i < p->count; ++i) {
    SIM_TRY(check_memop(p->paramArray[i]));
    node->memops.push_back(p->paramArray[i]);
  }
  *out = std::move(node);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphAddBatchMemOpNode(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps,
                                          size_t n, const CUDA_BATCH_MEM_OP_NODE_PARAMS* p) {
  SIM_ENTER();
  std::unique_ptr<Node> node;
  SIM_TRY(memop_node(p, &node));
  return add_node(out, hg, deps, n, std::move(node));
}

CUresult CUDAAPI cuGraphBatchMemOpNodeGetParams(CUgraphNode hn, CUDA_BATCH_MEM_OP_NODE_PARAMS* p) {
  SIM_ENTER();
  Node* n = lookup_node(hn);
  if (n == nullptr || p == nullptr || n->type != CU_GRAPH_NODE_TYPE_BATCH_MEM_OP) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  p->ctx = nullptr;
  p->count = static_cast<unsigned>(n->memops.size());
  p->paramArray = n->memops.data();
  p->flags = 0;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphExecBatchMemOpNodeSetParams(CUgraphExec he, CUgraphNode hn,
                                                    const CUDA_BATCH_MEM_OP_NODE_PARAMS* p) {
  SIM_ENTER();
  std::unique_ptr<Node> node;
  SIM_TRY(memop_node(p, &node));
  return replace_exec_node(he, hn, std::move(node));
}

CUresult CUDAAPI cuGraphUpload(CUgraphExec he, CUstream hs) {
  SIM_ENTER();
  (void)hs;
  std::lock_guard<std::mutex> lock(graph_mutex());
  return exec_registry().count(reinterpret_cast<GraphExec*>(he)) ? CUDA_SUCCESS
                                                                 : CUDA_ERROR_INVALID_VALUE;
}
