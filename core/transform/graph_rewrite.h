// The rewritten graph: a copy of a captured graph with the in-graph schedule's windows added as
// nodes (DESIGN.md section 5, "Inside one graph"; the transform that consumes the graph scan's
// facts and the schedule's choice, core/plan/graph_windows.h).
//
// For each window, after the uses before the gap: a D2H memcpy node (slot to its pinned host
// copy), then a write-value node setting the window's `released` flag, on which the host unmaps
// the slot's pages. After the trigger position: a write-value node setting `trigger`, on which
// the host maps pages again and sets `mapped`; then a node that waits for `mapped` and clears
// it, an H2D memcpy node, and edges from it to the uses after the gap. A wrap window's release
// nodes follow the slot's last uses and its restore nodes precede its first uses: they belong to
// consecutive launches. Flags live in pinned host memory the device can reach; every value is 1,
// so the graph needs no per-launch update: the host clears `released` and `trigger` as it takes
// them, the graph clears `mapped` as it passes it.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "base/driver.h"
#include "observe/graph_scan.h"
#include "plan/graph_windows.h"

namespace vaswap {

struct RewriteSlot {
  CUdeviceptr va = 0;
  size_t bytes = 0;
  void* host = nullptr;  // pinned, `bytes` long
};

// Device addresses of one window's flags (4-byte words of pinned mapped host memory).
struct WindowFlags {
  CUdeviceptr released = 0, trigger = 0, mapped = 0;
};

// Clones `graph` and adds the windows of `choice` (positions index `order`; candidates index
// `slots`; flags by window). Returns the clone, which the caller instantiates and destroys.
// Throws Error naming the driver call that failed; nothing is left behind then.
// `with_pages(candidate, add)` runs `add` (which adds the window's copy nodes) while the slot has
// pages: the driver refuses a copy node that names an address without them. `copies` gets the
// windows' D2H and H2D nodes (nodes of the clone), which an executable made from it can disable.
struct WindowCopies {
  std::vector<CUgraphNode> d2h, h2d;
};
CUgraph rewrite_graph(const Driver& driver, CUgraph graph, const std::vector<ScannedNode>& order,
                      const windows::Choice& choice, const std::vector<RewriteSlot>& slots,
                      const std::vector<WindowFlags>& flags, CUcontext context,
                      const std::function<void(size_t, const std::function<void()>&)>& with_pages,
                      WindowCopies* copies);

}  // namespace vaswap
