#include "observe/graph_scan.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <unordered_map>

#include "base/trace.h"

namespace vaswap {

namespace {

class Scanner {
 public:
  Scanner(const Driver& driver, const RegionRegistry& registry)
      : driver_(driver), registry_(registry) {}

  void graph(CUgraph graph, int depth) {
    for (CUgraphNode node : nodes_of(graph)) this->node(node, depth);
  }

  // The top level with each node's references, then a topological order of it.
  void top_level(CUgraph graph) {
    const std::vector<CUgraphNode> nodes = nodes_of(graph);
    std::vector<ScannedNode> listed(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) {
      listed[i].node = nodes[i];
      into_ = &listed[i].bases;
      node(nodes[i], 0);
      std::sort(listed[i].bases.begin(), listed[i].bases.end());
      listed[i].bases.erase(std::unique(listed[i].bases.begin(), listed[i].bases.end()),
                            listed[i].bases.end());
    }
    into_ = nullptr;
    order(std::move(listed));
  }

  GraphScan result;
  std::map<uintptr_t, Region> found;
  std::set<uintptr_t> copied;  // GraphScan::copied

 private:
  std::vector<CUgraphNode> nodes_of(CUgraph graph) {
    size_t count = 0;
    if (driver_.cuGraphGetNodes(graph, nullptr, &count) != CUDA_SUCCESS) return {};
    std::vector<CUgraphNode> nodes(count);
    if (count > 0 && driver_.cuGraphGetNodes(graph, nodes.data(), &count) != CUDA_SUCCESS)
      return {};
    nodes.resize(count);
    return nodes;
  }

  // Kahn's algorithm over the dependency edges, the earliest listed ready node first.
  void order(std::vector<ScannedNode> listed) {
    std::unordered_map<CUgraphNode, size_t> index;
    for (size_t i = 0; i < listed.size(); ++i) index[listed[i].node] = i;
    std::vector<size_t> missing(listed.size(), 0);
    std::vector<std::vector<size_t>> dependents(listed.size());
    for (size_t i = 0; i < listed.size(); ++i) {
      size_t count = 0;
      if (driver_.cuGraphNodeGetDependencies(listed[i].node, nullptr, nullptr, &count) !=
          CUDA_SUCCESS) {
        return;
      }
      std::vector<CUgraphNode> deps(count);
      if (count > 0 && driver_.cuGraphNodeGetDependencies(listed[i].node, deps.data(), nullptr,
                                                          &count) != CUDA_SUCCESS) {
        return;
      }
      for (size_t k = 0; k < count; ++k) {
        auto it = index.find(deps[k]);
        if (it == index.end()) return;
        ++missing[i];
        dependents[it->second].push_back(i);
      }
    }
    std::set<size_t> ready;
    for (size_t i = 0; i < listed.size(); ++i) {
      if (missing[i] == 0) ready.insert(i);
    }
    std::vector<ScannedNode> sorted;
    sorted.reserve(listed.size());
    while (!ready.empty()) {
      const size_t i = *ready.begin();
      ready.erase(ready.begin());
      sorted.push_back(std::move(listed[i]));
      for (size_t j : dependents[i]) {
        if (--missing[j] == 0) ready.insert(j);
      }
    }
    if (sorted.size() != listed.size()) return;  // not a DAG: no order to plan over
    result.order = std::move(sorted);
    result.ordered = true;
  }

  void node(CUgraphNode node, int depth) {
    ++result.nodes;
    CUgraphNodeType type{};
    if (driver_.cuGraphNodeGetType(node, &type) != CUDA_SUCCESS) {
      ++result.unscanned_nodes;
      return;
    }
    switch (type) {
      case CU_GRAPH_NODE_TYPE_KERNEL: kernel(node); break;
      case CU_GRAPH_NODE_TYPE_MEMCPY: memcpy_node(node); break;
      case CU_GRAPH_NODE_TYPE_MEMSET: memset_node(node); break;
      case CU_GRAPH_NODE_TYPE_GRAPH: {
        CUgraph child = nullptr;
        if (depth < 16 && driver_.cuGraphChildGraphNodeGetGraph(node, &child) == CUDA_SUCCESS) {
          ++result.child_graphs;
          graph(child, depth + 1);
        } else {
          ++result.unscanned_nodes;
        }
        break;
      }
      case CU_GRAPH_NODE_TYPE_BATCH_MEM_OP: memop_node(node); break;
      case CU_GRAPH_NODE_TYPE_EMPTY:
      case CU_GRAPH_NODE_TYPE_HOST:
      case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
      case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
      case CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL:
      case CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT:
      // The graph's own memory, from its memory pool: never a registered region.
      case CU_GRAPH_NODE_TYPE_MEM_ALLOC:
      case CU_GRAPH_NODE_TYPE_MEM_FREE: break;
      default: ++result.unscanned_nodes; break;  // conditional nodes, kinds newer than this scan
    }
  }

  void address(uint64_t value) {
    if (value == 0) return;
    if (auto region = registry_.find(static_cast<uintptr_t>(value))) {
      found.emplace(region->base, *region);
      if (into_ != nullptr) into_->push_back(region->base);
      if (copying_) copied.insert(region->base);
    }
  }

  // Every 8-byte-aligned word of `bytes` bytes at `data`.
  void words(const void* data, size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t at = 0; at + sizeof(uint64_t) <= bytes; at += sizeof(uint64_t)) {
      uint64_t word = 0;
      std::memcpy(&word, p + at, sizeof word);
      address(word);
    }
  }

  void kernel(CUgraphNode node) {
    CUDA_KERNEL_NODE_PARAMS params{};
    if (driver_.cuGraphKernelNodeGetParams(node, &params) != CUDA_SUCCESS) {
      ++result.unscanned_nodes;
      return;
    }
    ++result.kernel_nodes;
    if (params.extra != nullptr) {
      const void* buffer = nullptr;
      size_t size = 0;
      for (size_t i = 0; params.extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
        if (params.extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buffer = params.extra[i + 1];
        if (params.extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) {
          size = *static_cast<const size_t*>(params.extra[i + 1]);
        }
      }
      if (buffer != nullptr) {
        ++result.extra_buffers;
        words(buffer, size);
      }
      return;
    }
    if (params.kernelParams == nullptr) return;
    CUresult failure = CUDA_SUCCESS;
    size_t i = 0;
    for (;; ++i) {
      size_t offset = 0, size = 0;
      if (!kernel_param_info(driver_, params.func, params.kern, i, &offset, &size, &failure)) break;
      words(params.kernelParams[i], size);
    }
    if (i == 0 && failure != CUDA_ERROR_INVALID_VALUE) {
      // No layout at all (INVALID_VALUE at index 0 means a kernel without parameters): what this
      // node references is unknown.
      ++result.opaque_kernels;
      if (result.opaque_error == CUDA_SUCCESS) result.opaque_error = failure;
    }
  }

  void memcpy_node(CUgraphNode node) {
    CUDA_MEMCPY3D copy{};
    if (driver_.cuGraphMemcpyNodeGetParams(node, &copy) != CUDA_SUCCESS) {
      ++result.unscanned_nodes;
      return;
    }
    ++result.memcpy_nodes;
    auto device_side = [](CUmemorytype type) {
      return type == CU_MEMORYTYPE_DEVICE || type == CU_MEMORYTYPE_UNIFIED;
    };
    copying_ = true;
    if (device_side(copy.srcMemoryType)) address(copy.srcDevice);
    if (device_side(copy.dstMemoryType)) address(copy.dstDevice);
    copying_ = false;
  }

  void memop_node(CUgraphNode node) {
    CUDA_BATCH_MEM_OP_NODE_PARAMS params{};
    if (driver_.cuGraphBatchMemOpNodeGetParams(node, &params) != CUDA_SUCCESS) {
      ++result.unscanned_nodes;
      return;
    }
    ++result.memop_nodes;
    for (unsigned i = 0; i < params.count && params.paramArray != nullptr; ++i) {
      const CUstreamBatchMemOpParams& op = params.paramArray[i];
      switch (op.operation) {
        case CU_STREAM_MEM_OP_WAIT_VALUE_32:
        case CU_STREAM_MEM_OP_WAIT_VALUE_64: address(op.waitValue.address); break;
        case CU_STREAM_MEM_OP_WRITE_VALUE_32:
        case CU_STREAM_MEM_OP_WRITE_VALUE_64: address(op.writeValue.address); break;
        default: break;
      }
    }
  }

  void memset_node(CUgraphNode node) {
    CUDA_MEMSET_NODE_PARAMS set{};
    if (driver_.cuGraphMemsetNodeGetParams(node, &set) != CUDA_SUCCESS) {
      ++result.unscanned_nodes;
      return;
    }
    ++result.memset_nodes;
    copying_ = true;
    address(set.dst);
    copying_ = false;
  }

  const Driver& driver_;
  const RegionRegistry& registry_;
  std::vector<uintptr_t>* into_ = nullptr;  // the top-level node being scanned (top_level)
  bool copying_ = false;                    // a copy's or memset's address is being looked up
};

}  // namespace

GraphScan scan_graph(const Driver& driver, CUgraph graph, const RegionRegistry& registry,
                     bool with_nodes) {
  const uint64_t start = trace::now_ns();
  Scanner scanner(driver, registry);
  if (with_nodes) {
    scanner.top_level(graph);
  } else {
    scanner.graph(graph, 0);
  }
  for (auto& entry : scanner.found) scanner.result.regions.push_back(entry.second);
  scanner.result.copied.assign(scanner.copied.begin(), scanner.copied.end());
  scanner.result.dur_us = trace::us_since(start);
  return scanner.result;
}

}  // namespace vaswap
