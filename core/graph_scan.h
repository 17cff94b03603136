// Graph analysis: which registered regions a captured graph references (DESIGN.md section 5).
//
// Scanned once, at the end of the capture that made the graph. A kernel node's parameters are
// read at the offsets and sizes cuFuncGetParamInfo gives, or from the packed `extra` buffer
// (CU_LAUNCH_PARAM_BUFFER_POINTER, as cuBLAS launches); every 8-byte-aligned word that falls in a
// registered region is a reference. Memcpy and memset nodes give their addresses; child graphs
// are scanned recursively. What a scan cannot see: pointers held in device memory (arrays of
// pointers a kernel dereferences), conditional nodes' bodies (not yet), and kernels launched as
// CUkernel handles without a CUfunction. The guard (issue 6) is meant to catch what a scan misses.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <vector>

#include "driver.h"
#include "registry.h"

namespace vaswap {

struct GraphScan {
  std::vector<Region> regions;  // referenced regions, by base address, each once
  uint64_t nodes = 0, kernel_nodes = 0, extra_buffers = 0, memcpy_nodes = 0, memset_nodes = 0,
           child_graphs = 0, unscanned_nodes = 0;
  // Kernel nodes whose parameter layout the driver would not give: their references are unknown,
  // so the graph is opaque (the planner keeps every slot resident around it).
  uint64_t opaque_kernels = 0;
  CUresult opaque_error = CUDA_SUCCESS;
  double dur_us = 0;
};

// Scans `graph` against `registry`. Driver calls that fail leave the node counted as unscanned.
GraphScan scan_graph(const Driver& driver, CUgraph graph, const RegionRegistry& registry);

}  // namespace vaswap
