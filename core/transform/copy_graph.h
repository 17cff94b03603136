// One slot's copy as an executable graph of one memcpy node: what the device handshake enqueues
// ahead of a slot's pages (DESIGN.md section 5, "Handshakes"; docs/PLANNER.md).
//
// The driver checks an eager copy's device addresses when it is enqueued, and a graph's copy
// nodes only when they are added (bench/results/inside_first_h200.md). A restore's H2D can so be
// enqueued before the slot's pages are mapped, behind a wait on the device for the flag the host
// writes once they are; an eviction's D2H can be enqueued behind a restore whose map is still to
// come. The graphs are made once per slot, while it has pages, and launched for every move.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <string>

#include "base/driver.h"

namespace vaswap {

// A whole-buffer copy between a device address and pinned host memory.
CUDA_MEMCPY3D copy_params(CUdeviceptr va, void* host, size_t bytes, bool to_host);

// An instantiated graph whose one node makes that copy, uploaded on `stream` (its first launch
// then does no first-time work). `va` must have pages now. Throws Error naming the driver call
// that failed and `subject`; nothing is left behind then.
CUgraphExec make_copy_exec(const Driver& driver, CUcontext context, CUstream stream, CUdeviceptr va,
                           void* host, size_t bytes, bool to_host, const std::string& subject);

// The same for a copy of `bytes` between two device addresses, or a memset of `count` elements of
// `element` bytes (1, 2 or 4) to `value` at `dst`. The addresses must have pages now.
CUgraphExec make_device_copy_exec(const Driver& driver, CUcontext context, CUstream stream,
                                  CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                                  const std::string& subject);
CUgraphExec make_memset_exec(const Driver& driver, CUcontext context, CUstream stream,
                             CUdeviceptr dst, unsigned value, unsigned element, size_t count,
                             const std::string& subject);

}  // namespace vaswap
