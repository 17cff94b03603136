#include "transform/graph_rewrite.h"

#include <algorithm>
#include <string>

#include "base/errors.h"
#include "transform/copy_graph.h"

namespace vaswap {

namespace {

// The clone being built; destroyed unless handed out.
class Clone {
 public:
  Clone(const Driver& driver, CUgraph graph) : driver_(driver) {
    call(driver_.cuGraphClone(&graph_, graph), "cuGraphClone", "the captured graph");
  }
  Clone(const Clone&) = delete;
  Clone& operator=(const Clone&) = delete;
  ~Clone() {
    if (graph_ != nullptr) driver_.cuGraphDestroy(graph_);
  }
  CUgraph get() const { return graph_; }
  CUgraph release() {
    CUgraph g = graph_;
    graph_ = nullptr;
    return g;
  }

  void call(CUresult rc, const char* what, const std::string& subject) const {
    if (rc != CUDA_SUCCESS) {
      fail_driver(rc,
                  cuda_failure(what, rc, subject + ", rewriting a graph for offload inside it"));
    }
  }

 private:
  const Driver& driver_;
  CUgraph graph_ = nullptr;
};

}  // namespace

CUgraph rewrite_graph(const Driver& driver, CUgraph graph, const std::vector<ScannedNode>& order,
                      const windows::Choice& choice, const std::vector<RewriteSlot>& slots,
                      const std::vector<WindowFlags>& flags, CUcontext context,
                      const std::function<void(size_t, const std::function<void()>&)>& with_pages,
                      WindowCopies* copies) {
  *copies = {};
  Clone clone(driver, graph);
  std::vector<CUgraphNode> at(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    clone.call(driver.cuGraphNodeFindInClone(&at[i], order[i].node, clone.get()),
               "cuGraphNodeFindInClone", "node " + std::to_string(i));
  }
  auto nodes_at = [&](const std::vector<size_t>& positions) {
    std::vector<CUgraphNode> out;
    out.reserve(positions.size());
    for (size_t p : positions) out.push_back(at[p]);
    return out;
  };
  auto memop = [&](const std::vector<CUgraphNode>& deps, std::vector<CUstreamBatchMemOpParams> ops,
                   const std::string& subject) {
    CUDA_BATCH_MEM_OP_NODE_PARAMS params{};
    params.ctx = context;
    params.count = static_cast<unsigned>(ops.size());
    params.paramArray = ops.data();
    CUgraphNode node = nullptr;
    clone.call(
        driver.cuGraphAddBatchMemOpNode(&node, clone.get(), deps.data(), deps.size(), &params),
        "cuGraphAddBatchMemOpNode", subject);
    return node;
  };
  auto write_one = [](CUdeviceptr address) {
    CUstreamBatchMemOpParams op{};
    op.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    op.writeValue.address = address;
    op.writeValue.value = 1;
    op.writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
    return op;
  };
  auto subject_of = [&](size_t k) {
    return "window " + std::to_string(k) + " of the slot at " +
           hex(slots.at(choice.windows[k].candidate).va);
  };
  // Releases first: a D2H after the uses before the gap, then `released`.
  std::vector<CUgraphNode> released(choice.windows.size());
  for (size_t k = 0; k < choice.windows.size(); ++k) {
    const windows::Window& w = choice.windows[k];
    const RewriteSlot& slot = slots.at(w.candidate);
    const std::vector<CUgraphNode> before = nodes_at(w.before);
    CUDA_MEMCPY3D out = copy_params(slot.va, slot.host, slot.bytes, true);
    CUgraphNode d2h = nullptr;
    with_pages(w.candidate, [&] {
      clone.call(driver.cuGraphAddMemcpyNode(&d2h, clone.get(), before.data(), before.size(), &out,
                                             context),
                 "cuGraphAddMemcpyNode", subject_of(k) + " (D2H)");
    });
    copies->d2h.push_back(d2h);
    released[k] = memop({d2h}, {write_one(flags.at(k).released)}, subject_of(k) + " (released)");
  }
  // Then restores: `trigger` after the trigger position and after every release the schedule
  // counts on for room there (those after a last use at least the schedule's lag before it: the
  // schedule takes their pages as given back by then), so that the executor never waits for
  // room with the graph parked on it; then the wait for `mapped`, the H2D, and edges to the uses
  // after the gap. Every added edge runs from a lower position to a higher one: no cycle.
  for (size_t k = 0; k < choice.windows.size(); ++k) {
    const windows::Window& w = choice.windows[k];
    const RewriteSlot& slot = slots.at(w.candidate);
    const WindowFlags& f = flags.at(k);
    const std::string subject = subject_of(k);
    std::vector<CUgraphNode> trigger_deps;
    if (!w.trigger_at_start) {
      trigger_deps.push_back(at[w.trigger]);
      for (size_t r = 0; r < choice.windows.size(); ++r) {
        if (windows::counts_on(w, choice.windows[r], choice.lag)) {
          trigger_deps.push_back(released[r]);
        }
      }
    }
    if (!w.wrap &&
        std::find(trigger_deps.begin(), trigger_deps.end(), released[k]) == trigger_deps.end()) {
      trigger_deps.push_back(released[k]);
    }
    const CUgraphNode trigger = memop(trigger_deps, {write_one(f.trigger)}, subject + " (trigger)");
    CUstreamBatchMemOpParams wait{};
    wait.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    wait.waitValue.address = f.mapped;
    wait.waitValue.value = 1;
    wait.waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
    CUstreamBatchMemOpParams clear{};
    clear.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    clear.writeValue.address = f.mapped;
    clear.writeValue.value = 0;
    const CUgraphNode mapped = memop({trigger}, {wait, clear}, subject + " (wait for the map)");
    CUDA_MEMCPY3D in = copy_params(slot.va, slot.host, slot.bytes, false);
    CUgraphNode h2d = nullptr;
    with_pages(w.candidate, [&] {
      clone.call(driver.cuGraphAddMemcpyNode(&h2d, clone.get(), &mapped, 1, &in, context),
                 "cuGraphAddMemcpyNode", subject + " (H2D)");
    });
    copies->h2d.push_back(h2d);
    const std::vector<CUgraphNode> after = nodes_at(w.after);
    const std::vector<CUgraphNode> from(after.size(), h2d);
    clone.call(driver.cuGraphAddDependencies(clone.get(), from.data(), after.data(), nullptr,
                                             after.size()),
               "cuGraphAddDependencies", subject + " (the uses after the gap)");
  }
  return clone.release();
}

}  // namespace vaswap
