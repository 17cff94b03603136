// Offload inside one graph: rewritten graphs and the executor that carries out their windows
// (DESIGN.md section 5, "Inside one graph"; invariants 2, 3, 7, 11 and 12).
//
// When a captured graph is instantiated and the policy asks for it (inside.mode), its slots that
// no other executable uses get windows over the graph's nodes (core/plan/graph_windows.h) and the
// executable is made from a rewritten copy (core/transform/graph_rewrite.h). At its first launch
// those slots are lent by residency (pinned there: residency neither evicts nor restores them)
// to this module's executor, a thread that follows the flags the graph writes: on a window's
// `released` flag (written after its D2H node) it unmaps the slot's pages, on its `trigger` flag
// it maps pages again and writes `mapped`, which the graph's wait node holds the H2D and the next
// uses behind. The application's thread only enqueues: it never waits for the executor in steady
// state, and the graph waits on the device only for a map, never for a copy enqueued after it
// (the hazard docs/PLANNER.md describes: every copy is a node of the graph itself).
//
// Other work that uses a lent slot (a read of the graph's output, another graph) makes it present
// first: the thread waits until the executor has finished the launches in flight, then the slot
// is mapped and its data copied back, and the next launch takes the data from the device.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "observe/graph_scan.h"

namespace vaswap {

struct Slot;

namespace inside {

enum class Mode { off, automatic, on };

struct Settings {
  Mode mode = Mode::automatic;
  size_t lead = 8, min_gap = 4, lag = 0;
  // residency.budget; 0: auto (the automatic mode then rewrites a graph whose slots do not fit
  // what the device has for slots when it is instantiated).
  uint64_t budget_bytes = 0;
  uint64_t wait_limit_ns = uint64_t{60} * 1000000000;
};

void configure(const Settings& settings);
// Whether an instantiation may be rewritten at all: inside.mode on; automatic under a
// residency.budget size; automatic under the auto budget while a started device's slots (one
// that holds or held slots: residency::started_budgets) exceed what it has for them; no device is
// started to ask. The graph is scanned for it only then.
bool enabled();

// At the instantiation of `graph`, which uses `slots` (its scan, with nodes: `scan.order`):
// the rewritten copy to instantiate instead, or nullptr to instantiate it as captured (`why`
// then says why, where there is something to say). `shared(slot)`: another executable uses it.
CUgraph prepare(CUgraph graph, const GraphScan& scan, const std::vector<Slot*>& slots,
                const std::function<bool(const Slot*)>& shared, std::string* why);
// The copy prepare() gave was instantiated as `exec` (nullptr: the instantiation failed). The
// copy is destroyed here.
void instantiated(CUgraph rewritten, CUgraphExec exec);
// The slots lent to `exec`'s windows: its launches do not make them resident (its own nodes
// do). Empty before its first launch.
std::vector<Slot*> lent_to(CUgraphExec exec);

// A launch of `exec` on `stream`, after residency made its other slots resident and before the
// real launch: the first one lends its slots; lent slots on the device hand their data to the
// launch (a D2H on `stream`, which the graph's first restore copies back). CUDA_SUCCESS, or an
// error with `message` (nothing is lent then).
CUresult before_launch(CUgraphExec exec, CUstream stream, std::string* message);
// After the real launch on `stream`: `enqueued` ones are followed by the executor.
void launch_returned(CUgraphExec exec, CUstream stream, bool enqueued);

// Other work is about to use `slots`: those lent and off the device are brought back first (this
// thread waits, bounded by residency.wait_limit). Returns the slots that are not lent; on
// failure `rc` and `message` say why.
std::vector<Slot*> present(const std::vector<Slot*>& slots, CUresult* rc, std::string* message);

// Other work that uses `slots` (present() gave them back as lent: not in its result) was enqueued
// on `stream`: the next launch of their graph on another stream waits for it on the device before
// it moves them (invariant 3), and the graph's end (destroyed, changed) waits for it too.
void used_elsewhere(const std::vector<Slot*>& slots, CUstream stream);

// `exec` is about to be destroyed, or the program updated it from another graph (which replaces
// its nodes, windows included): its launches finish, its slots get their pages and data back
// and return to residency, and it is followed no more.
void exec_destroyed(CUgraphExec exec);
// Before the program changes a node of `exec` (cudaGraphExec*NodeSetParams): what the node uses
// may change, so its launches finish, its slots come back, from then on nothing of it is
// unmapped, and its windows' copies are disabled in the executable (cuGraphNodeSetEnabled: a
// restore would put back data from before a gap that the changed node may now write in); the
// windows still signal and are still followed. An error, with `message`, when a restore's copy
// could not be disabled: the change must not be made then.
CUresult node_changing(CUgraphExec exec, std::string* message);
// Whether `exec` was made from a rewritten copy (and is not destroyed).
bool rewritten(CUgraphExec exec);
// The program updates `exec` from `graph` (cudaGraphExecUpdate; `scan`: its scan, with nodes),
// which the driver refuses for an executable made from a rewritten copy (the copy has nodes the
// program's graph does not). For such an executable: `graph` with the same windows added (the
// same flags and host copies), to update from instead; nullptr for any other (or, with `why`,
// where `graph` does not have the nodes `exec` was made from: the driver then says what it
// says). Launches in flight finish first. Where `graph` uses the lent slots at other positions
// than the graph `exec` was made from, it is as a changed node (node_changing): nothing is
// unmapped any more and the windows' copies are off.
CUgraph update_source(CUgraphExec exec, CUgraph graph, const GraphScan& scan, std::string* why);
// After the real update from what update_source gave (`made`: it succeeded): the executable's
// nodes are the source's from then on (the source is kept, the old copy destroyed), or the source
// is destroyed. An error, with `message`, where the windows' copies were off and cannot be
// turned off again in the updated executable.
CUresult updated(CUgraphExec exec, CUgraph source, bool made, std::string* message);
// The node of `exec` the program names (a node of the captured graph): its counterpart in the
// rewritten copy the executable was made from; `node` itself for any other executable.
CUgraphNode node_in(CUgraphExec exec, CUgraphNode node);
// `slot` is about to be destroyed: it gets its pages back (for residency to free) and its
// windows do nothing from now on.
void forget(Slot* slot);
// Pages that the executors of graphs rewritten under the auto budget on `device` may still map
// within their reserves (each reserve less what its lent slots hold now). No pages exist beyond
// the reserve there: an allocation that takes these leaves a restore that the graph waits for
// on the device without pages (docs/PLANNER.md, "Inside one graph", "Within a budget").
uint64_t unmapped_reserve(int device);

struct Stats {
  uint64_t graphs = 0;   // executables made from rewritten graphs
  uint64_t windows = 0;  // their windows
  uint64_t lent_slots = 0, lent_bytes = 0;
  uint64_t launches = 0;  // launches whose windows the executor finished
  uint64_t releases = 0, restores = 0;
  uint64_t moved_bytes = 0;     // D2H bytes of the finished launches' windows
  uint64_t peak_lent_held = 0;  // the most pages lent slots held at once
  uint64_t on_demand = 0;       // lent slots other work brought back
  double on_demand_wait_us = 0;
  uint64_t failures = 0;  // unmaps that failed (the slot kept its pages)
  // Restores that waited for a release of their launch to make room within the reserve (the
  // graph waits on the device meanwhile), and for how long in all.
  uint64_t room_waits = 0;
  double room_wait_us = 0;
  // Restores mapped beyond the reserve after waiting residency::kOvershootAfterNs for room that
  // did not come (the graph was parked on them: one hardware queue); each such window waits no
  // more.
  uint64_t room_overshoots = 0;
  // Restores whose map found no pages at first (the program's own allocations held them): the
  // executor tried again later, the graph waiting on the device meanwhile; for how long in all.
  uint64_t map_waits = 0;
  double map_wait_us = 0;
};
Stats stats();

}  // namespace inside
}  // namespace vaswap
