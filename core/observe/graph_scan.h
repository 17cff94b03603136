// Graph analysis: which registered regions a captured graph references (DESIGN.md section 5).
//
// Scanned at every instantiation and update of an executable graph. A kernel node's parameters are
// read at the offsets and sizes cuFuncGetParamInfo gives, or from the packed `extra` buffer
// (CU_LAUNCH_PARAM_BUFFER_POINTER, as cuBLAS launches); every 8-byte-aligned word that falls in a
// registered region is a reference. Memcpy and memset nodes give their addresses; child graphs
// are scanned recursively; batch memory-op nodes give their addresses. What a scan cannot see:
// pointers held in device memory (arrays of pointers a kernel dereferences); conditional nodes'
// bodies and kernels without a parameter layout make the graph opaque (it uses every slot).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <vector>

#include "base/driver.h"
#include "observe/registry.h"

namespace vaswap {

// One of a graph's top-level nodes and the registered regions it references (a child graph's
// node: everything in it), by base address, each once.
struct ScannedNode {
  CUgraphNode node = nullptr;
  std::vector<uintptr_t> bases;
};

struct GraphScan {
  std::vector<Region> regions;  // referenced regions, by base address, each once
  // With `with_nodes`: the top-level nodes in a topological order (dependencies first; ties in
  // the order the driver lists them), what the in-graph schedule plans over. Empty when a
  // dependency query failed (`ordered` false).
  std::vector<ScannedNode> order;
  bool ordered = false;
  // The regions that copy and memset nodes name (a child graph's included), by base address, each
  // once: the driver refuses to instantiate the graph while one of them has no pages
  // (bench/results/launch_unmapped_h100.txt).
  std::vector<uintptr_t> copied;
  uint64_t nodes = 0, kernel_nodes = 0, extra_buffers = 0, memcpy_nodes = 0, memset_nodes = 0,
           memop_nodes = 0, child_graphs = 0;
  // Nodes whose references could not be read: conditional nodes (their bodies are not
  // queryable), node kinds this scan does not know, and nodes whose queries failed. A graph with
  // any is treated as using every slot (DESIGN.md invariant 10).
  uint64_t unscanned_nodes = 0;
  // Kernel nodes whose parameter layout the driver would not give: their references are unknown,
  // so the graph is opaque (the planner keeps every slot resident around it).
  uint64_t opaque_kernels = 0;
  CUresult opaque_error = CUDA_SUCCESS;
  double dur_us = 0;
};

// Scans `graph` against `registry`. Driver calls that fail leave the node counted as unscanned.
// `with_nodes`: also each top-level node's references, in a topological order.
GraphScan scan_graph(const Driver& driver, CUgraph graph, const RegionRegistry& registry,
                     bool with_nodes = false);

}  // namespace vaswap
