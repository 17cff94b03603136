#include "plan/inside.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "base/capture_gate.h"
#include "base/errors.h"
#include "base/log.h"
#include "base/own_thread.h"
#include "base/trace.h"
#include "plan/graph_windows.h"
#include "plan/residency.h"
#include "slots/engine.h"
#include "transform/graph_rewrite.h"

namespace vaswap::inside {

namespace {

// One step of a lent slot's launch, in launch order: a window's release or its restore.
struct Step {
  bool release = false;
  size_t window = 0;
  size_t position = 0;  // of the last use before it (a release) or the next use (a restore)
};

struct Lent {
  Slot* slot = nullptr;
  void* host = nullptr;  // its pinned copy, which the graph's copy nodes name
  bool wraps = false;    // has a wrap window: off the device between launches
  bool inner = false;    // has windows within a launch
  // Other work used it between launches: it stays on the device then (its wrap window copies
  // but does not unmap), so that such work never waits again.
  bool kept = false;
  bool mapped = true;  // pages mapped now (the executor's doing)
  // Launch start: its data was copied out on the launching stream (after this event), and the
  // executor unmaps it once that copy has completed, before its first restore.
  CUevent handed = nullptr;
  bool gone = false;  // destroyed: its windows do nothing
  std::vector<Step> steps;
  size_t next = 0;  // the launch being carried out: the next step
};

// Each of `picked`'s positions in `scan.order`: the nodes that use it, in order.
std::vector<std::vector<size_t>> uses_of(const GraphScan& scan, const std::vector<Slot*>& picked) {
  std::unordered_map<uintptr_t, size_t> index;
  for (size_t i = 0; i < picked.size(); ++i) index[static_cast<uintptr_t>(picked[i]->va)] = i;
  std::vector<std::vector<size_t>> uses(picked.size());
  for (size_t p = 0; p < scan.order.size(); ++p) {
    for (uintptr_t base : scan.order[p].bases) {
      auto it = index.find(base);
      if (it != index.end()) uses[it->second].push_back(p);
    }
  }
  return uses;
}

// What a rewritten copy was made of, to make the same windows in another graph (the program's
// cudaGraphExecUpdate): the choice, the slots (candidates) with their host copies, the flags, and
// where the graph used each candidate.
struct Recipe {
  windows::Choice choice;
  std::vector<RewriteSlot> slots;
  std::vector<WindowFlags> flags;
  std::vector<Slot*> picked;
  std::vector<std::vector<size_t>> uses;
  size_t nodes = 0;
};

// An executable made from a rewritten graph.
struct Rewritten {
  CUgraphExec exec = nullptr;
  // The rewritten copy it was instantiated from, kept: the program names nodes of the captured
  // graph when it changes one in the executable, and its node in the copy is found through it.
  CUgraph clone = nullptr;
  WindowCopies copies;  // the windows' D2H and H2D nodes, in `clone`
  Recipe recipe;
  // An update's source in the making (update_source). The executable's nodes keep the identity
  // of `clone`'s, which the program's calls (through node_in) and the copies go on naming, as CUDA
  // asks for an updated executable ("a node from the graph from which graphExec was
  // instantiated"). A source the driver refused is kept until the next update or the end: the
  // error node the driver gave the program names one of its nodes.
  CUgraph updating = nullptr;
  CUgraph updating_from = nullptr;  // the program's graph of the update in the making (its log)
  CUgraph refused_source = nullptr;
  // What the windows do (`phase`); it only ever moves to a later one, but for stuck to off.
  //   on: they release and restore.
  //   off: the program changed a node (or an update made the graph use its slots elsewhere):
  //     what it uses may have changed, so nothing is unmapped any more and the windows' copies
  //     are disabled in the executable (every slot stays on the device, its data there; the
  //     windows still signal, and the executor still follows them). A copy left on would put
  //     back a slot's data from before a gap that a changed node now writes in.
  //   stuck: off, but a restore's copy could not be disabled (`phase_error`,
  //     cuGraphNodeSetEnabled's): the program's node changes, and updates that move the slots'
  //     uses, are refused from then on. A later copies_off that succeeds makes it off again.
  //   unsafe: an update was made whose copies could not be turned off again (`phase_error`):
  //     a restore left on may put back data the updated nodes wrote. Launches are refused.
  enum class Phase { on, off, stuck, unsafe };
  Phase phase = Phase::on;
  CUresult phase_error = CUDA_SUCCESS;  // stuck, unsafe: why
  // The update in the making uses the slots elsewhere: made, it is as a changed node (off);
  // refused, nothing changed and the windows go on.
  bool update_disables = false;
  // A thread works on its slots with the lock released (driver calls that wait): the executor and
  // other threads leave the graph alone until it is done (`moving` false, done_ notified).
  bool moving = false;
  // Destroyed (its slots went back to residency). Threads that wait on it with the lock released
  // (present, forget: `waiters`) keep it until the last of them leaves.
  bool ended = false;
  CUevent finished = nullptr;      // recorded after each of its launches: its device work is over
  CUstream last_stream = nullptr;  // the stream of its last launch enqueued (finished's)
  // Other work that used its lent slots, by stream (used_elsewhere): an event recorded after it,
  // `pending` until a launch of this graph was ordered after it. A launch on another stream waits
  // for it on the device before anything moves the slots.
  struct Other {
    CUstream stream = nullptr;
    CUevent used = nullptr;
    bool pending = false;
  };
  std::vector<Other> others;
  int device = 0;
  int waiters = 0;
  CUcontext context = nullptr;
  std::vector<Lent> slots;
  size_t windows = 0;
  uint32_t* flags = nullptr;  // 3 per window: released, trigger, mapped (pinned, device-mapped)
  uint64_t moved_per_launch = 0;
  // What its slots may hold at once (the schedule's peak): residency counts this instead of
  // them, and the executor maps a slot only within it while a release of the launch is pending.
  uint64_t reserve = 0;
  // Rewritten under the auto budget because its slots do not fit the device, or under a size
  // budget that its windows fill past: no pages exist beyond the reserve, so a lent slot that
  // other work uses between launches is not kept on the device (below) but brought back for that
  // work each time.
  bool tight = false;
  bool said_not_kept = false;  // that a slot used between launches is not kept (keep_limit)
  // Under a size budget: what its reserve may grow to for slots kept on the device (the budget,
  // less what the rest of the program needs of it); 0: no bound.
  uint64_t keep_limit = 0;
  uint64_t held = 0;  // what its lent slots hold now
  // Of its reserve, what residency does not count while no launch is queued (the part it has no
  // pages for, given back when its last launch was carried out; residency::park): taken again,
  // evicting others, before anything maps for it (unpark_locked).
  uint64_t parked = 0;
  uint64_t kept_bytes = 0;  // of its lent slots, those kept on the device between launches
  // Residency lent it the slots (at a launch; until then, or when a slot was away there, the
  // windows copy and signal but nothing is unmapped).
  bool lent = false;
  uint64_t queued = 0;         // launches enqueued whose windows are not all carried out
  uint64_t progress = 0;       // steps and launches the executor has carried out
  bool running = false;        // the executor is carrying out the oldest of them
  uint64_t started_ns = 0;     // when the executor took it up
  uint64_t room_since_ns = 0;  // a restore of the launch has waited for room since (0: none)
  // By window: its restore waited residency::kOvershootAfterNs for room that never came, and
  // maps at once from then on (see advance_locked).
  std::vector<bool> room_overshoot;
  // A restore's map found no pages (the program's own allocations took them) since (0: none); the
  // executor tries again from map_retry_ns, backing off, without holding the lock meanwhile.
  uint64_t map_since_ns = 0;
  uint64_t map_retry_ns = 0;
  uint32_t* flag(size_t window, int which) const { return flags + 3 * window + which; }
};

enum FlagKind { kReleased = 0, kTrigger = 1, kMapped = 2 };

// What one graph's windows are chosen from, before its rewrite, so that the choice can be made
// again offline (bench/inside_replay): the positions, the settings and target, each candidate's
// slot, bytes and uses.
void trace_input(CUgraph graph, int device, const std::vector<Slot*>& picked,
                 const std::vector<windows::Candidate>& candidates, size_t positions,
                 const windows::Settings& ws) {
  const auto number = [](auto v) { return std::to_string(v); };
  trace::Record(trace::Event::inside_input)
      .hex("graph", reinterpret_cast<uintptr_t>(graph))
      .add("device", device)
      .add("positions", static_cast<uint64_t>(positions))
      .add("lead", static_cast<uint64_t>(ws.lead))
      .add("min_gap", static_cast<uint64_t>(ws.min_gap))
      .add("lag", static_cast<uint64_t>(ws.lag))
      .add("target", ws.target)
      .add("slots", trace::joined(picked, [](const Slot* s) { return std::to_string(s->id); }))
      .add("slot_bytes",
           trace::joined(candidates,
                         [](const windows::Candidate& c) { return std::to_string(c.bytes); }))
      .add("uses",
           trace::joined(
               candidates,
               [&](const windows::Candidate& c) { return trace::joined(c.uses, number); }, ";"))
      .emit();
}

uint32_t load(const uint32_t* flag) { return __atomic_load_n(flag, __ATOMIC_ACQUIRE); }
void store(uint32_t* flag, uint32_t value) { __atomic_store_n(flag, value, __ATOMIC_RELEASE); }

class Inside {
 public:
  void configure(const Settings& s) {
    std::lock_guard<std::mutex> lock(mutex_);
    settings_ = s;
    wait_limit_ns_.store(s.wait_limit_ns, std::memory_order_relaxed);
  }
  bool enabled() {
    Settings s;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      s = settings_;
    }
    if (s.mode == Mode::on) return true;
    if (s.mode != Mode::automatic) return false;
    if (s.budget_bytes > 0) return true;
    // The auto budget: an instantiation is scanned a second time only while some device's slots
    // exceed what it has for them; a job that fits pays nothing. prepare() then weighs the
    // graph's own slots on their device. Not asked of the current device: one that holds no slot
    // has nothing to weigh, and starting it to ask cost that GPU vaswap's threads and copy
    // streams, or ended the process where it could not start (a thread limit, no room for its
    // streams). Nor of every device's slots against one device's room: a second GPU's slots
    // made every graph of the first scanned twice.
    for (const auto& [ordinal, budget] : residency::started_budgets()) {
      if (engine().slot_bytes(ordinal) > budget.limit) return true;
    }
    return false;
  }

  CUgraph prepare(CUgraph graph, const GraphScan& scan, const std::vector<Slot*>& slots,
                  const std::function<bool(const Slot*)>& shared, std::string* why);
  void instantiated(CUgraph rewritten, CUgraphExec exec);
  std::vector<Slot*> lent_to(CUgraphExec exec);
  bool rewritten(CUgraphExec exec) {
    if (!any_.load(std::memory_order_acquire)) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    return graphs_.count(exec) != 0;
  }
  CUresult before_launch(CUgraphExec exec, CUstream stream, std::string* message);
  void launch_returned(CUgraphExec exec, CUstream stream, bool enqueued);
  void used_elsewhere(const std::vector<Slot*>& slots, CUstream stream);
  std::vector<Slot*> present(const std::vector<Slot*>& slots, CUresult* rc, std::string* message);
  void exec_destroyed(CUgraphExec exec);
  CUresult node_changing(CUgraphExec exec, std::string* message);
  CUgraph update_source(CUgraphExec exec, CUgraph graph, const GraphScan& scan, std::string* why);
  CUresult updated(CUgraphExec exec, CUgraph source, bool made, std::string* message);
  // Waits until g's launches have finished (finished_locked), then brings every lent slot of it
  // that is off the device back with its data; `when`: what is about to happen to it.
  void all_back_locked(std::unique_lock<std::mutex>& lock, Rewritten& g, const char* when);
  // Disables `copies` (nodes of g's clone, or of an update's source) in g's executable, restores
  // first; CUDA_SUCCESS, or the error that left a restore's copy on, with `message`.
  CUresult copies_off(Rewritten& g, const WindowCopies& copies, std::string* message);
  // Turns g's windows off for good, as for a changed node: every slot kept on the device, the
  // copies disabled (copies_off). g's launches have finished and its slots are back.
  CUresult disable_locked(Rewritten& g, std::string* message);
  // What a restore's copy that could not be disabled (`rc`) means for g: `outcome` follows
  // "cuGraphNodeSetEnabled failed ... for a restore's copy in rewritten graph 0x...".
  static std::string left_on(const Rewritten& g, CUresult rc, const char* outcome);
  CUgraphNode node_in(CUgraphExec exec, CUgraphNode node);
  void forget(Slot* slot);
  uint64_t unmapped_reserve(int device) {
    if (!any_.load(std::memory_order_acquire)) return 0;
    std::lock_guard<std::mutex> lock(mutex_);
    uint64_t bytes = 0;
    for (const auto& [exec, g] : graphs_) {
      if (g->device == device && g->tight && g->lent && g->phase == Rewritten::Phase::on &&
          g->reserve > g->held) {
        bytes += g->reserve - g->held;
      }
    }
    return bytes;
  }
  Stats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    Stats out = stats_;
    out.failures = failures_.load();
    return out;
  }

 private:
  void run();  // the executor
  bool advance_locked(Rewritten& g);
  // Waits until `g` has no launch in flight; false once residency.wait_limit passes without the
  // executor carrying out one of its steps, or a limit per launch queued when it began.
  bool drain_locked(std::unique_lock<std::mutex>& lock, Rewritten& g);
  // Maps `lent` again for other work that waits for it (bring_back, without the lock), retrying
  // within residency.wait_limit; dies past it. The executor retries at a later pass instead.
  void map_back(Lent& lent, const char* why);
  // One try of map_back: false with `error` when the engine found no pages.
  bool map_once(Lent& lent, const char* why, std::string* error);
  // Maps `lent` again and copies its data back on the executor's stream (this thread waits).
  // Without the lock (g moving): maps lent again and copies `data` (pinned) or its host copy in
  // on `stream`, this thread waiting; copies its pages out to its host copy the same way.
  void bring_back(Rewritten& g, Lent& lent, CUstream stream, const void* data = nullptr);
  void copy_in(Rewritten& g, Lent& lent, const void* data, CUstream stream);
  void copy_out(Rewritten& g, Lent& lent, CUstream stream);
  CUstream stream_locked(Rewritten& g);
  // Runs `work` with the lock released and g moving (see Rewritten::moving).
  template <class Work>
  void unlocked(std::unique_lock<std::mutex>& lock, Rewritten& g, Work work);
  // Waits until no thread is moving g's slots; false past residency.wait_limit.
  bool settle_locked(std::unique_lock<std::mutex>& lock, Rewritten& g);
  // Drains g (quiet_locked), then waits (lock released) until its last launch has finished on
  // the device; returns at once when g was destroyed meanwhile.
  void finished_locked(std::unique_lock<std::mutex>& lock, Rewritten& g, const char* why);
  void note_held_locked();
  // Gives residency the part of `g`'s reserve it has no pages for (no launch queued), or takes it
  // back before a launch or other work maps for it.
  void park_locked(Rewritten& g);
  void unpark_locked(std::unique_lock<std::mutex>& lock, Rewritten& g);
  // Unmaps lent's pages; a failure leaves it its pages and data (invariant 7), and says so.
  bool release_pages(Rewritten& g, Lent& lent);
  // Whether a slot of g's launch in progress has a release still to come before its next restore.
  // `before`: releases after the last use at an earlier position only (a later one may depend
  // on the restore that waits).
  static bool release_pending_locked(const Rewritten& g, size_t before);
  // The bytes that restores of g's launch in progress for uses before `position` will map: of
  // the lent slots off the device whose next step is such a restore.
  static uint64_t earlier_restores_locked(const Rewritten& g, size_t position);
  // Lends g's slots (residency.h): false while one is neither resident nor unused.
  bool lend_locked(std::unique_lock<std::mutex>& lock, Rewritten& g);
  // Frees what `g` holds but its flags, which it returns: the caller frees them without the lock.
  uint32_t* free_locked(Rewritten& g);
  // Waits until no other thread moves g's slots and (with `drain`) its launches are carried out,
  // and returns with the lock held, so that the caller may move them next; false past
  // residency.wait_limit. `g.ended` may be true on return.
  bool quiet_locked(std::unique_lock<std::mutex>& lock, Rewritten& g, bool drain);
  // A thread waiting on g, with the lock held at both ends (see Rewritten::waiters).
  struct Waiting {
    Inside& inside;
    Rewritten& g;
    Waiting(Inside& in, Rewritten& r) : inside(in), g(r) { ++g.waiters; }
    Waiting(const Waiting&) = delete;
    Waiting& operator=(const Waiting&) = delete;
    ~Waiting() {
      if (--g.waiters == 0 && g.ended) {
        auto& e = inside.ended_;
        e.erase(std::remove_if(e.begin(), e.end(), [this](const auto& p) { return p.get() == &g; }),
                e.end());
      }
    }
  };
  [[noreturn]] void die(const std::string& message);
  // die() for a graph whose slots another thread still moved past residency.wait_limit when
  // `when` happened; `whose`: "graph 0x...", or "the graph that holds slot ...".
  [[noreturn]] void still_moving(const std::string& whose, const char* when) {
    die("inside one graph: the slots of " + whose +
        " were still being moved by another thread past residency.wait_limit "
        "(CUDA_ERROR_LAUNCH_TIMEOUT) when " +
        when);
  }
  // Ends the process when one of the executor's driver calls has lasted past
  // residency.wait_limit: a graph may be parked on the map it is making (invariant 12).
  void watch();
  // Around the executor's driver calls: what watch() reads.
  void busy(const std::string& what);
  void idle();

  std::mutex mutex_;
  std::condition_variable work_, done_;
  Settings settings_;
  std::unordered_map<CUgraph, std::unique_ptr<Rewritten>> prepared_;
  std::unordered_map<CUgraphExec, std::unique_ptr<Rewritten>> graphs_;
  std::set<int> devices_lent_;  // devices whose executors' pages residency was told of
  std::vector<std::unique_ptr<Rewritten>> ended_;      // destroyed while a thread waited on them
  std::unordered_map<const Slot*, Rewritten*> owner_;  // lent (or to be lent) slots
  std::atomic<bool> any_{false};                       // owner_ was ever not empty
  std::unordered_map<int, CUstream> streams_;          // per device, for copies back
  std::unique_ptr<std::thread> thread_, watchdog_;
  std::mutex busy_mutex_;
  std::atomic<uint64_t> wait_limit_ns_{uint64_t{60} * 1000000000};  // read without the lock
  std::atomic<uint64_t> failures_{0};  // unmaps that failed (counted without the lock too)
  // Driver calls in flight that a graph may wait for, per thread: the executor's, and those of
  // application threads that copy a lent slot back (one thread's end must not hide another's).
  struct Busy {
    uint64_t since_ns = 0;
    std::string what;
  };
  std::unordered_map<std::thread::id, Busy> busy_;
  // The longest in flight, or nullptr (under busy_mutex_).
  const Busy* oldest_busy_locked() const;
  Stats stats_;
};

Inside& the() {
  static auto* inside = new Inside;  // leaked: hooks run from atexit handlers and other threads
  return *inside;
}

const Driver& drv() { return engine().driver(); }

// =============================================================================================
// Instantiation
// =============================================================================================

CUgraph Inside::prepare(CUgraph graph, const GraphScan& scan, const std::vector<Slot*>& slots,
                        const std::function<bool(const Slot*)>& shared, std::string* why) {
  Settings s;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s = settings_;
  }
  if (s.mode == Mode::off || slots.empty()) return nullptr;
  if (!scan.ordered) {
    *why = "its nodes' order could not be read";
    return nullptr;
  }
  // Candidates: slots of one device that no other executable uses.
  std::vector<Slot*> picked;
  uint64_t others = 0;
  const int device = slots[0]->device;
  std::vector<bool> elsewhere(slots.size());  // asked before taking the lock: shared() has its own
  for (size_t i = 0; i < slots.size(); ++i) elsewhere[i] = shared(slots[i]);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < slots.size(); ++i) {
      Slot* slot = slots[i];
      const bool ok =
          slot->managed && slot->device == device && owner_.count(slot) == 0 && !elsewhere[i];
      if (ok) {
        picked.push_back(slot);
      } else {
        others += slot->mapped_bytes;
      }
    }
  }
  if (picked.empty()) return nullptr;
  std::vector<std::vector<size_t>> uses = uses_of(scan, picked);
  std::vector<windows::Candidate> candidates(picked.size());
  for (size_t i = 0; i < picked.size(); ++i) {
    candidates[i].bytes = picked[i]->mapped_bytes;
    candidates[i].uses = uses[i];
  }
  windows::Settings ws;
  ws.lead = s.lead;
  ws.min_gap = s.min_gap;
  ws.lag = s.lag;
  // A release frees its pages only once its D2H has run and the executor has unmapped them,
  // later than the position it follows, so a restore may wait for room (the summary's room
  // waits). Under a budget the schedule fills what the slots may hold: aiming lower leaves
  // headroom but moves more bytes, and on the H200 cost more than the waits it saved
  // (bench/results/inside_budget_headroom_h200.md). With every window taken (inside.mode=on)
  // the executor gets one slot of headroom over the schedule's peak.
  uint64_t largest = 0;
  for (const windows::Candidate& c : candidates) largest = std::max(largest, c.bytes);
  uint64_t allowed = 0;  // what the lent slots may hold at once (0: what the schedule needs)
  uint64_t kept = 0;     // of the budget, what the rest of the program needs beside them
  residency::Others rest;
  uint64_t budget = s.budget_bytes;  // what the slots may hold at once
  uint64_t room_with_reserve = 0;    // auto: `allowed` with residency.reserve given up
  // A size budget beyond what the device has for slots is bounded by that room (residency's
  // device_bound): the device has no pages beyond it, as under the auto budget. Before, the
  // graph's windows aimed at the size, and on the simulator a whole-step graph under a 256 MiB
  // budget on a device left 100 MiB was instantiated as captured and its launch refused.
  residency::Budget bound;
  if (s.mode == Mode::automatic && s.budget_bytes != 0) {
    bound = residency::budget(device);
    if (bound.device_bound) budget = bound.target;
  }
  // Rewritten for the auto budget's pressure (or a size budget's the device bounds): the device
  // has no pages beyond it.
  const bool tight = s.mode == Mode::automatic && (s.budget_bytes == 0 || bound.device_bound);
  if (s.mode == Mode::automatic) {
    uint64_t total = others;
    for (const windows::Candidate& c : candidates) total += c.bytes;
    // Under the auto budget: what the device has for slots now. A graph whose slots do not fit
    // it could not be launched as captured (the launch would be refused for want of memory);
    // the windows aim at the budget's target, the reserve below it.
    uint64_t limit = bound.limit;  // what the device has for slots, the reserve included
    if (budget == 0) {
      const residency::Budget auto_budget = residency::budget(device);
      budget = auto_budget.target;
      limit = auto_budget.limit;
    }
    // Auto, 0: the device has nothing left for slots, and its launch is refused; said here, so
    // that the refusal's reader knows why no windows were tried.
    if (budget == 0) {
      *why =
          "the device has no memory left for slots beside the rest of the program (the auto "
          "budget's target is 0, after residency.reserve), so no windows can bring its " +
          byte_size(total - others) + " of slots within it";
      return nullptr;
    }
    if (total <= budget) return nullptr;  // it fits
    // Residency counts the reserve as held from the first launch on, between launches too: it
    // leaves the rest of the program the reserves of graphs rewritten before and room for the
    // largest launch seen so far (torch.compile's eager work between its graphs, which a reserve
    // of the whole budget left without any: bench/results/torch_compile_budget_h200.md).
    rest = residency::others(device);
    kept = others + rest.lent + rest.largest_launch;
    allowed = budget > kept ? budget - kept : 1;
    ws.target = allowed;
    room_with_reserve = limit > kept ? limit - kept : 0;
  }
  if (trace::enabled()) trace_input(graph, device, picked, candidates, scan.order.size(), ws);
  windows::Choice choice = windows::choose(candidates, scan.order.size(), ws);
  if (choice.windows.empty()) {
    // A short graph (one layer's, between whose launches the planner offloads) is the common
    // case, not a warning: said at the info level.
    log().info(
        "inside one graph: graph {} is instantiated as captured: no gap between its slots' uses "
        "is long enough (inside.lead, inside.min_gap)",
        hex(reinterpret_cast<uintptr_t>(graph)));
    return nullptr;
  }
  if (tight && choice.peak_bytes > allowed && choice.peak_bytes <= room_with_reserve) {
    // Beyond the auto budget's target but within the reserve below it: the reserve is headroom
    // for the program's later allocations, and as captured the launch would be refused. The
    // graph takes what it needs of it (on an H100 left 100 MiB, the auto budget refused the
    // whole-step demo that a 12 MiB budget ran: bench/results/capacity_edges_session51_h100.md).
    log().info(
        "inside one graph: graph {}'s windows hold {} at once, {} of it from residency.reserve "
        "(the headroom left to the program's own allocations)",
        hex(reinterpret_cast<uintptr_t>(graph)), byte_size(choice.peak_bytes),
        byte_size(choice.peak_bytes - allowed));
    allowed = choice.peak_bytes;
  }
  if (tight && choice.peak_bytes > allowed) {
    // Under the auto budget the room is the device's own: windows that cannot bring the graph
    // within it would leave a launch waiting for pages that never come, and the process would
    // end (invariant 12). As captured, the launch is refused with a named error instead.
    *why = "with its windows its slots still hold " + byte_size(choice.peak_bytes) +
           " at once, more than the device has for them beside the rest of the program (" +
           byte_size(room_with_reserve) + ", residency.reserve included)";
    return nullptr;
  }
  if (!tight) {
    // A size budget (or none, inside.mode=on) may allow more than the device has: windows whose
    // peak the device itself cannot hold beside the graph's other slots would leave a launch
    // waiting for pages that never come, and a 24 MiB device's 36 MiB of windows under a 28 MiB
    // budget ended in a wait past residency.wait_limit. As captured, the launch is refused with a
    // named error at once instead.
    const std::optional<uint64_t> room = residency::device_room(device);
    if (room && choice.peak_bytes + others > *room) {
      *why = "with its windows its slots still hold " + byte_size(choice.peak_bytes) + " at once" +
             (others > 0 ? " (and its other slots " + byte_size(others) + ")" : "") +
             ", more than the device could give slots at all (" + byte_size(*room) +
             ": its free memory less what no allocation gets, and what slots hold, less "
             "residency.reserve if set)";
      return nullptr;
    }
  }

  // The stream that copies lent slots, made now, while the instantiation holds the quiet (no
  // stream parked): vaswap's streams are not made while streams are parked (docs/PLANNER.md,
  // "Handshakes"). A stream takes device memory: where the device has none left, slots no launch
  // needs make room for it, and it is tried once more (100 MiB left, 2 MiB a stream: the windows
  // took part of the reserve and slots held the rest, and the graph was instantiated as captured
  // and its launch refused, in one CI run of several). Without it the graph is instantiated as
  // captured.
  bool make_stream = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    make_stream = streams_[device] == nullptr;
  }
  if (make_stream) {
    const Driver& driver = drv();
    ContextScope scope(driver, engine().context(device));
    CUstream made = nullptr;
    CUresult rc = driver.cuStreamCreate(&made, CU_STREAM_NON_BLOCKING);
    if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
      residency::make_room(device, kFreeNoAllocationGets);
      rc = driver.cuStreamCreate(&made, CU_STREAM_NON_BLOCKING);
    }
    if (rc != CUDA_SUCCESS) {
      *why = cuda_failure("cuStreamCreate", rc, "the stream that copies lent slots");
      return nullptr;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    CUstream& stream = streams_[device];
    if (stream == nullptr) {
      stream = made;
    } else {
      driver.cuStreamDestroy(made);  // another instantiation made one meanwhile
    }
  }

  // The executor's threads, also before the rewrite: without them nothing would answer the
  // rewritten graph's waits. Where the system starts no thread (a thread limit) the graph is
  // instantiated as captured; before, std::system_error left the program's first launch and
  // ended the process.
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Each holder is allocated before its thread starts: allocated after, its std::bad_alloc
    // would have dropped a started thread still joinable (std::terminate).
    const auto start = [](std::unique_ptr<std::thread>* held, std::function<void()> body) {
      if (*held) return;
      auto holder = std::make_unique<std::thread>();
      *holder = start_thread(std::move(body));
      *held = std::move(holder);
    };
    try {
      start(&thread_, [this] { run(); });
      start(&watchdog_, [this] { watch(); });
    } catch (const std::exception& error) {  // std::system_error, or no memory for a holder
      *why = std::string("vaswap's executor threads could not be started (") + error.what() + ")";
      return nullptr;
    }
  }

  auto g = std::make_unique<Rewritten>();
  g->device = device;
  g->context = engine().context(device);
  g->windows = choice.windows.size();
  g->room_overshoot.assign(g->windows, false);
  g->moved_per_launch = choice.moved_bytes;
  g->reserve = allowed > 0 ? std::max(allowed, choice.peak_bytes) : choice.peak_bytes + largest;
  // A size budget that its windows already fill past has no room beyond the reserve either:
  // kept beyond it, slots used between launches made the executor map past its reserve every
  // launch, and on a 40 MiB device under a 28 MiB budget it ran out of pages and ended the
  // process (exit 70) where the auto budget ran.
  g->tight = tight || (s.mode == Mode::automatic && choice.peak_bytes > allowed);
  // (inside.mode=on chooses no target: the budget itself.)
  if (s.budget_bytes != 0) g->keep_limit = allowed > 0 ? allowed : s.budget_bytes;
  const Driver& driver = drv();
  ContextScope scope(driver, g->context);
  void* flags = nullptr;
  const size_t flag_bytes = 3 * g->windows * sizeof(uint32_t);
  const RelaxedCapture relaxed(driver);  // another thread's global capture stays valid
  CUresult rc = driver.cuMemHostAlloc(&flags, flag_bytes,
                                      CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
  if (rc != CUDA_SUCCESS) {
    *why = cuda_failure("cuMemHostAlloc", rc, "the flags of a rewritten graph");
    return nullptr;
  }
  std::memset(flags, 0, flag_bytes);
  g->flags = static_cast<uint32_t*>(flags);
  CUdeviceptr flags_device = 0;
  if (driver.cuMemHostGetDevicePointer(&flags_device, flags, 0) != CUDA_SUCCESS) {
    flags_device = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(flags));
  }
  std::vector<WindowFlags> wflags(g->windows);
  for (size_t k = 0; k < g->windows; ++k) {
    const CUdeviceptr base = flags_device + 3 * k * sizeof(uint32_t);
    wflags[k] = WindowFlags{base, base + sizeof(uint32_t), base + 2 * sizeof(uint32_t)};
  }
  // The lent slots, each with its pinned copy and its steps in launch order.
  std::vector<RewriteSlot> rslots(picked.size());
  std::vector<int> lent_of(picked.size(), -1);
  // Every candidate is lent, windows or not: the schedule's peak, which residency counts
  // instead of them, is what all of them hold.
  try {
    for (size_t c = 0; c < picked.size(); ++c) {
      lent_of[c] = static_cast<int>(g->slots.size());
      Lent lent;
      lent.slot = picked[c];
      const bool windowed = std::any_of(choice.windows.begin(), choice.windows.end(),
                                        [c](const windows::Window& w) { return w.candidate == c; });
      if (windowed) lent.host = engine().host_alloc(picked[c]->mapped_bytes);
      g->slots.push_back(lent);
      rslots[c] = RewriteSlot{picked[c]->va, picked[c]->mapped_bytes, lent.host};
    }
  } catch (const Error& e) {
    for (Lent& lent : g->slots) {
      if (lent.host != nullptr) engine().host_free(lent.host);
    }
    driver.cuMemFreeHost(flags);
    *why = std::string("no pinned host memory for its slots' copies: ") + e.what();
    return nullptr;
  }
  for (Lent& lent : g->slots) {
    const size_t c =
        static_cast<size_t>(std::find(picked.begin(), picked.end(), lent.slot) - picked.begin());
    // Windows of one candidate are consecutive in the choice, the wrap first: the wrap's
    // restore opens the launch and its release closes it.
    const windows::Window* wrap = nullptr;
    size_t wrap_index = 0;
    for (size_t k = 0; k < choice.windows.size(); ++k) {
      const windows::Window& w = choice.windows[k];
      if (w.candidate != c) continue;
      if (w.wrap) {
        wrap = &w;
        wrap_index = k;
        lent.steps.push_back(Step{false, k, w.restore_before});
      }
    }
    for (size_t k = 0; k < choice.windows.size(); ++k) {
      const windows::Window& w = choice.windows[k];
      if (w.candidate != c || w.wrap) continue;
      lent.steps.push_back(Step{true, k, w.release_after});
      lent.steps.push_back(Step{false, k, w.restore_before});
    }
    if (wrap != nullptr) lent.steps.push_back(Step{true, wrap_index, wrap->release_after});
    lent.wraps = wrap != nullptr;
    lent.inner = lent.steps.size() > (lent.wraps ? 2u : 0u);
  }
  // The driver refuses a copy node naming an address without pages (as it refuses to capture
  // one, bench/results/launch_unmapped_h200.txt): a slot without them has a placeholder mapped
  // while its nodes are added (residency::with_pages; no memory of its own, so a full device
  // is no obstacle), one slot at a time.
  auto with_pages = [&picked](size_t candidate, const std::function<void()>& add) {
    residency::with_pages({picked[candidate]}, add);
  };
  CUgraph rewritten = nullptr;
  try {
    rewritten = rewrite_graph(driver, graph, scan.order, choice, rslots, wflags, g->context,
                              with_pages, &g->copies);
  } catch (const Error& e) {
    for (Lent& lent : g->slots) {
      if (lent.host != nullptr) engine().host_free(lent.host);
    }
    driver.cuMemFreeHost(flags);
    *why = e.what();
    return nullptr;
  }
  uint64_t lent_bytes = 0;
  for (const Lent& lent : g->slots) lent_bytes += lent.slot->mapped_bytes;
  if (trace::enabled()) {
    trace::Record(trace::Event::graph_rewrite)
        .hex("graph", reinterpret_cast<uintptr_t>(graph))
        .add("device", device)
        .add("nodes", static_cast<uint64_t>(scan.order.size()))
        .add("windows", static_cast<uint64_t>(g->windows))
        .add("slots", static_cast<uint64_t>(g->slots.size()))
        .add("bytes", lent_bytes)
        .add("held_without", choice.total_bytes)
        .add("held_peak", choice.peak_bytes)
        .add("moved_bytes", choice.moved_bytes)
        .emit();
  }
  log().info(
      "inside one graph: graph {} rewritten with {} windows over {} nodes for {} slots ({}): "
      "they hold at most {} at once in a launch instead of {}, moving {} each way per launch",
      hex(reinterpret_cast<uintptr_t>(graph)), g->windows, scan.order.size(), g->slots.size(),
      byte_size(lent_bytes), byte_size(choice.peak_bytes), byte_size(choice.total_bytes),
      byte_size(choice.moved_bytes));
  if (s.mode == Mode::automatic && choice.peak_bytes > allowed) {
    log().warn(
        "inside one graph: graph {} leaves the rest of the program too little of "
        "residency.budget ({}): its windows hold at least {} at once, and beside them the budget "
        "has to hold its other slots ({}), the reserves of graphs rewritten before ({}) and the "
        "largest launch so far ({}). Launches may be refused for want of memory; a budget of at "
        "least {} leaves that room",
        hex(reinterpret_cast<uintptr_t>(graph)), byte_size(budget), byte_size(choice.peak_bytes),
        byte_size(others), byte_size(rest.lent), byte_size(rest.largest_launch),
        byte_size(choice.peak_bytes + kept));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Another instantiation may have taken one of them meanwhile: then this one is not rewritten.
    const bool taken = std::any_of(g->slots.begin(), g->slots.end(), [this](const Lent& lent) {
      return owner_.count(lent.slot) != 0;
    });
    if (!taken) {
      g->recipe = Recipe{choice, rslots, wflags, picked, std::move(uses), scan.order.size()};
      for (const Lent& lent : g->slots) owner_[lent.slot] = g.get();
      any_.store(true, std::memory_order_release);
      prepared_[rewritten] = std::move(g);
      return rewritten;
    }
  }
  drv().cuGraphDestroy(rewritten);
  for (Lent& other : g->slots) {
    if (other.host != nullptr) engine().host_free(other.host);
  }
  drv().cuMemFreeHost(flags);  // without the lock, as in exec_destroyed
  *why = "another instantiation took its slots";
  return nullptr;
}

void Inside::instantiated(CUgraph rewritten, CUgraphExec exec) {
  std::unique_ptr<Rewritten> failed;  // the instantiation failed: its resources go
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = prepared_.find(rewritten);
    if (it == prepared_.end()) return;
    std::unique_ptr<Rewritten> g = std::move(it->second);
    prepared_.erase(it);
    if (exec != nullptr) {
      g->exec = exec;
      g->clone = rewritten;
      ++stats_.graphs;
      stats_.windows += g->windows;
      graphs_[exec] = std::move(g);
    } else {
      for (const Lent& lent : g->slots) owner_.erase(lent.slot);
      failed = std::move(g);
    }
  }
  if (failed) {
    drv().cuGraphDestroy(rewritten);
    for (Lent& lent : failed->slots) {
      if (lent.host != nullptr) engine().host_free(lent.host);
    }
    drv().cuMemFreeHost(failed->flags);
  }
}

template <class Work>
void Inside::unlocked(std::unique_lock<std::mutex>& lock, Rewritten& g, Work work) {
  g.moving = true;
  lock.unlock();
  struct Relock {
    std::unique_lock<std::mutex>& lock;
    Rewritten& g;
    Inside& inside;
    ~Relock() {
      lock.lock();
      g.moving = false;
      inside.done_.notify_all();
      inside.work_.notify_all();
    }
  } relock{lock, g, *this};
  work();
}

bool Inside::settle_locked(std::unique_lock<std::mutex>& lock, Rewritten& g) {
  return done_.wait_for(lock, std::chrono::nanoseconds(wait_limit_ns_.load()),
                        [&] { return !g.moving || g.ended; });
}

bool Inside::quiet_locked(std::unique_lock<std::mutex>& lock, Rewritten& g, bool drain) {
  // A drain releases the lock while it waits: another thread may have begun to move the slots
  // meanwhile, so both are asked again until neither waits.
  for (;;) {
    if (!settle_locked(lock, g)) return false;
    if (g.ended || !drain) return true;
    if (!drain_locked(lock, g)) return false;
    if (g.ended || !g.moving) return true;
  }
}

bool Inside::lend_locked(std::unique_lock<std::mutex>& lock, Rewritten& g) {
  std::vector<Slot*> slots;
  for (const Lent& lent : g.slots) {
    if (!lent.gone) slots.push_back(lent.slot);
  }
  const CUstream stream = stream_locked(g);
  bool lent_now = false;
  // The first launch starts as every later one does: slots whose launch begins with a restore
  // of the graph's leave the device now (their data to the host copy the restore reads), then
  // slots whose first use no restore precedes get their pages (and data). Waits of the first
  // launch only, made without the lock: another rewritten graph may be parked on the executor.
  unlocked(lock, g, [&] {
    std::vector<residency::Lent> states;
    if (!residency::lend(slots, g.reserve, &states)) return;
    lent_now = true;
    size_t i = 0;
    g.held = 0;
    bool synchronized = false;
    for (Lent& lent : g.slots) {
      if (lent.gone) continue;
      const residency::Lent& state = states[i++];
      lent.mapped = state.pages;
      if (lent.mapped) g.held += lent.slot->mapped_bytes;
      if (state.data != nullptr && lent.host != nullptr) {
        std::memcpy(lent.host, state.data, lent.slot->mapped_bytes);
      }
      const bool restored_first = !lent.steps.empty() && !lent.steps.front().release;
      if (lent.mapped && restored_first) {
        if (!synchronized) {
          // The work that wrote them may still run: the device's work ends first, once no
          // capture is open (a device-wide synchronize would invalidate it).
          ContextScope scope(drv(), g.context);
          busy("waiting for the device before a rewritten graph's first launch");
          const uint64_t limit = wait_limit_ns_.load(std::memory_order_relaxed);
          const capture_gate::Exclusive gate(limit);
          if (!gate) {
            die("a rewritten graph's first launch waited " + std::to_string(limit / 1000000) +
                " ms (residency.wait_limit; CUDA_ERROR_LAUNCH_TIMEOUT) for stream captures open on "
                "other threads to end: "
                "it synchronizes the device first, which would invalidate them");
          }
          const CUresult rc = drv().cuCtxSynchronize();
          idle();
          if (rc != CUDA_SUCCESS) {
            die(cuda_failure("cuCtxSynchronize", rc, "before a rewritten graph's first launch"));
          }
          synchronized = true;
        }
        copy_out(g, lent, stream);
        release_pages(g, lent);
      }
    }
    i = 0;
    for (Lent& lent : g.slots) {
      if (lent.gone) continue;
      const residency::Lent& state = states[i++];
      const bool restored_first = !lent.steps.empty() && !lent.steps.front().release;
      if (lent.mapped || restored_first) continue;
      // Its data: our host copy (filled above from residency's), or residency's own copy for a
      // slot without windows; none for a slot never used.
      bring_back(g, lent, stream, lent.host != nullptr ? nullptr : state.data);
    }
  });
  if (!lent_now) return false;
  g.lent = true;
  for (const Lent& lent : g.slots) {
    if (lent.gone) continue;
    stats_.lent_slots += 1;
    stats_.lent_bytes += lent.slot->mapped_bytes;
  }
  note_held_locked();
  return true;
}

std::vector<Slot*> Inside::lent_to(CUgraphExec exec) {
  if (!any_.load(std::memory_order_acquire)) return {};
  std::unique_lock<std::mutex> lock(mutex_);
  std::vector<Slot*> out;
  auto it = graphs_.find(exec);
  if (it == graphs_.end()) return out;
  Rewritten& g = *it->second;
  if (!settle_locked(lock, g)) return out;
  // The first launch lends them before residency would map the unused ones (not while a launch
  // of it is in flight: lending moves their pages).
  if (!g.lent && (g.queued > 0 || !lend_locked(lock, g))) return out;
  for (const Lent& lent : it->second->slots) {
    if (!lent.gone) out.push_back(lent.slot);
  }
  return out;
}

// =============================================================================================
// Launches
// =============================================================================================

CUresult Inside::before_launch(CUgraphExec exec, CUstream stream, std::string* message) {
  if (!any_.load(std::memory_order_acquire)) return CUDA_SUCCESS;
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = graphs_.find(exec);
  if (it == graphs_.end()) return CUDA_SUCCESS;
  Rewritten& g = *it->second;
  if (g.phase == Rewritten::Phase::unsafe) {
    *message =
        left_on(g, g.phase_error,
                " after its update: a launch could put back data from before a window over "
                "what its updated nodes wrote, and is refused (instantiate the graph again)");
    return g.phase_error;
  }
  if (!settle_locked(lock, g)) {
    *message = "the slots of a rewritten graph were still being moved past residency.wait_limit";
    return CUDA_ERROR_LAUNCH_TIMEOUT;
  }
  // Not lent before the launch (a slot was away in residency): residency made them resident, and
  // this launch holds them (its windows only copy and signal if they cannot be lent still).
  if (!g.lent && g.queued == 0) lend_locked(lock, g);
  // Its reserve, parked since its last launch was carried out, is counted again before the
  // executor maps for this one: slots other launches brought back meanwhile are evicted for it.
  unpark_locked(lock, g);
  // A wrap slot on the device when this launch begins hands it its data (a D2H on its stream,
  // before the graph, whose first restore copies the host copy back): one kept on the device
  // between launches, one not lent, or, with no launch in flight, one on the device now (the
  // first launch; brought back for other work since). The program may have written it since
  // the launch before. One not kept then leaves the device until the graph's restore: the
  // executor unmaps it once the copy has completed.
  const bool idle = g.queued == 0;
  const Driver& driver = drv();
  // Invariant 3 across streams: what this launch moves (its hand-off copies, then its windows'
  // releases and the executor's unmaps) waits on the device for work on other streams that used
  // its slots, and for its own last launch if that was on another stream.
  for (Rewritten::Other& other : g.others) {
    if (!other.pending) continue;
    if (other.stream != stream) {
      const CUresult rc = driver.cuStreamWaitEvent(stream, other.used, 0);
      if (rc != CUDA_SUCCESS) {
        *message = cuda_failure("cuStreamWaitEvent", rc,
                                "a rewritten graph's launch, for other work that used its slots");
        return rc;
      }
    }
    other.pending = false;  // what this stream runs from now on comes after it
  }
  if (g.finished != nullptr && g.last_stream != stream) {
    const CUresult rc = driver.cuStreamWaitEvent(stream, g.finished, 0);
    if (rc != CUDA_SUCCESS) {
      *message = cuda_failure("cuStreamWaitEvent", rc,
                              "a rewritten graph's launch, for its last launch on another stream");
      return rc;
    }
  }
  for (Lent& lent : g.slots) {
    // With the windows' copies off, nothing would copy the data back: it stays where it is.
    if (g.phase == Rewritten::Phase::off) break;
    if (lent.gone || !lent.wraps) continue;
    const bool on_device =
        lent.kept || g.phase != Rewritten::Phase::on || !g.lent || (idle && lent.mapped);
    if (!on_device) continue;
    const std::string what = lent.slot->describe() + ", its data for a rewritten graph's launch";
    CUresult rc =
        driver.cuMemcpyDtoHAsync(lent.host, lent.slot->va, lent.slot->mapped_bytes, stream);
    if (rc != CUDA_SUCCESS) {
      *message = cuda_failure("cuMemcpyDtoHAsync", rc, what);
      return rc;
    }
    if (idle && g.lent && g.phase == Rewritten::Phase::on && !lent.kept) {
      // Recorded after this copy, every time: one left from a launch that was never enqueued (a
      // later slot's copy failed, or the launch itself) marks an older copy, and the pages would
      // go while this one still reads them.
      const char* call = "cuEventRecord";
      rc = CUDA_SUCCESS;
      if (lent.handed == nullptr) {
        call = "cuEventCreate";
        rc = driver.cuEventCreate(&lent.handed, CU_EVENT_DISABLE_TIMING);
        if (rc != CUDA_SUCCESS) lent.handed = nullptr;
      }
      if (rc == CUDA_SUCCESS) rc = driver.cuEventRecord(lent.handed, stream);
      if (rc != CUDA_SUCCESS) {
        // Never recorded, an event reads as complete: the slot would be unmapped at once.
        if (lent.handed != nullptr) driver.cuEventDestroy(lent.handed);
        lent.handed = nullptr;
        *message = cuda_failure(call, rc, what);
        return rc;
      }
    }
  }
  return CUDA_SUCCESS;
}

void Inside::launch_returned(CUgraphExec exec, CUstream stream, bool enqueued) {
  if (!enqueued || !any_.load(std::memory_order_acquire)) return;
  std::string unmarked;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = graphs_.find(exec);
    if (it == graphs_.end()) return;
    Rewritten& g = *it->second;
    ++g.queued;
    // Its end on the device: what is freed or given back after its executor is done waits for it.
    const Driver& driver = drv();
    CUresult rc = CUDA_SUCCESS;
    const char* call = "cuEventRecord";
    if (g.finished == nullptr) {
      call = "cuEventCreate";
      rc = driver.cuEventCreate(&g.finished, CU_EVENT_DISABLE_TIMING);
      if (rc != CUDA_SUCCESS) g.finished = nullptr;
    }
    if (rc == CUDA_SUCCESS) {
      call = "cuEventRecord";
      rc = driver.cuEventRecord(g.finished, stream);
    }
    if (rc == CUDA_SUCCESS) {
      g.last_stream = stream;
    } else {
      unmarked = cuda_failure(
          call, rc,
          "the end of a launch of rewritten graph " + hex(reinterpret_cast<uintptr_t>(exec)));
    }
  }
  work_.notify_all();
  if (unmarked.empty()) return;
  // No event marks this launch's end (an older one may, which would let its slots go while this
  // launch still uses them): it ends here, with the executor free to serve it, before anything
  // the program enqueues next.
  log().warn("inside one graph: {}: this thread waits for its stream instead", unmarked);
  drv().cuStreamSynchronize(stream);
}

void Inside::used_elsewhere(const std::vector<Slot*>& slots, CUstream stream) {
  if (slots.empty()) return;
  std::string unordered;  // the failed call, when an event could not be recorded
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<Rewritten*> marked;
    for (Slot* slot : slots) {
      auto it = owner_.find(slot);
      if (it == owner_.end()) continue;
      Rewritten& g = *it->second;
      if (std::find(marked.begin(), marked.end(), &g) != marked.end()) continue;
      marked.push_back(&g);
      auto other = std::find_if(g.others.begin(), g.others.end(),
                                [stream](const Rewritten::Other& o) { return o.stream == stream; });
      if (other == g.others.end()) {
        CUevent used = nullptr;
        const CUresult rc = drv().cuEventCreate(&used, CU_EVENT_DISABLE_TIMING);
        if (rc != CUDA_SUCCESS) {
          unordered = cuda_failure("cuEventCreate", rc, "other work that uses a lent slot");
          continue;
        }
        other = g.others.insert(g.others.end(), Rewritten::Other{stream, used, false});
      }
      const CUresult rc = drv().cuEventRecord(other->used, stream);
      if (rc != CUDA_SUCCESS) {
        unordered = cuda_failure("cuEventRecord", rc, "other work that uses a lent slot");
        continue;
      }
      other->pending = true;
    }
  }
  if (unordered.empty()) return;
  // No event to order the graph's next launch by: the work ends here before anything else runs.
  log().warn("inside one graph: {}: this thread waits for its stream instead", unordered);
  drv().cuStreamSynchronize(stream);
}

// =============================================================================================
// The executor
// =============================================================================================

void Inside::run() {
  become_own_thread("vaswap-inside");
  CUstreamCaptureMode relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
  drv().cuThreadExchangeStreamCaptureMode(&relaxed);  // invariant 5
  std::unique_lock<std::mutex> lock(mutex_);
  auto pause = std::chrono::microseconds(1);
  for (;;) {
    bool busy = false, progressed = false;
    for (auto& [exec, g] : graphs_) {
      if (g->queued == 0 || g->moving) continue;
      busy = true;
      if (!g->running) {
        g->running = true;
        g->started_ns = trace::now_ns();
        for (Lent& lent : g->slots) lent.next = 0;
      }
      if (advance_locked(*g)) {
        ++g->progress;
        progressed = true;
      }
    }
    if (!busy) {
      work_.wait(lock);
      pause = std::chrono::microseconds(1);
      continue;
    }
    if (progressed) {
      done_.notify_all();  // a drain's limit counts from the last progress
      pause = std::chrono::microseconds(1);
      continue;
    }
    // Flags are written by the device: poll, backing off to 50 us.
    work_.wait_for(lock, pause);
    pause = std::min(pause * 2, std::chrono::microseconds(50));
  }
}

bool Inside::advance_locked(Rewritten& g) {
  bool progressed = false, finished = true;
  uint64_t releases = 0, restores = 0;
  // Releases first, then restores: a restore that counts on a release for room finds it done
  // when both flags came in together.
  for (int pass = 0; pass < 2; ++pass) {
    for (Lent& lent : g.slots) {
      if (lent.handed != nullptr) {
        // Its data left on the launching stream: once that copy completed, so have its uses
        // before the launch (they precede it there), and the pages may go until the restore.
        const CUresult rc = drv().cuEventQuery(lent.handed);
        if (rc == CUDA_ERROR_NOT_READY) {
          finished = false;
          continue;
        }
        drv().cuEventDestroy(lent.handed);
        lent.handed = nullptr;
        if (rc == CUDA_SUCCESS && lent.mapped && !lent.gone && g.lent &&
            g.phase == Rewritten::Phase::on && !lent.kept && release_pages(g, lent)) {
          ++releases;
        }
        progressed = true;
      }
      while (lent.next < lent.steps.size()) {
        const Step step = lent.steps[lent.next];
        if (pass == 0 && !step.release) break;
        uint32_t* flag = g.flag(step.window, step.release ? kReleased : kTrigger);
        if (load(flag) == 0) break;
        store(flag, 0);  // taken: the next launch writes it again
        if (step.release) {
          // Its D2H has completed (the flag follows it in the graph), and so have the uses
          // before it (the D2H follows them): the pages may go (invariant 3).
          const bool wrap_release = lent.wraps && lent.next + 1 == lent.steps.size();
          if (lent.mapped && !lent.gone && g.lent && g.phase == Rewritten::Phase::on &&
              !(wrap_release && lent.kept) && release_pages(g, lent)) {
            ++releases;
          }
        } else {
          // A slot freed meanwhile has no pages to get (nor a Slot): its flag alone is written.
          if (!lent.mapped && !lent.gone) {
            // Within the reserve while a release of this launch can still make room (the
            // schedule's peak says it will); past it only when none can. And not into the room
            // that restores for earlier uses still to be mapped count on: when the graph has
            // run ahead, the triggers of several restores wait at once, and one for a later use
            // mapped first took an earlier one's room, while the releases that would give room
            // back come only after that earlier use (on a device with no pages beyond the
            // budget the process was then ended). Neither is ordered before this restore's
            // trigger in the graph (what is, came first), so the graph may be parked on this
            // very restore with them behind it: in one hardware queue (the simulator's, or
            // CUDA_DEVICE_MAX_CONNECTIONS=1), or where this trigger opens the launch. Past
            // residency::kOvershootAfterNs (as residency's restores past a size budget; on a GPU
            // with its queues the room comes within a few kernels) the restore maps beyond the
            // reserve, and its window waits no more.
            const uint64_t now = trace::now_ns();
            const uint64_t need = g.held + lent.slot->mapped_bytes;
            if (!g.room_overshoot[step.window] &&
                ((need > g.reserve && release_pending_locked(g, step.position)) ||
                 need + earlier_restores_locked(g, step.position) > g.reserve)) {
              if (g.room_since_ns == 0) {
                g.room_since_ns = now;
                ++stats_.room_waits;
              }
              const uint64_t patience = std::min<uint64_t>(
                  residency::kOvershootAfterNs, wait_limit_ns_.load(std::memory_order_relaxed));
              if (now - g.room_since_ns < patience) {
                store(flag, 1);  // not taken yet
                break;
              }
              // Said as a warning for a graph's first such window, then at info level.
              const bool first = std::none_of(g.room_overshoot.begin(), g.room_overshoot.end(),
                                              [](bool b) { return b; });
              g.room_overshoot[step.window] = true;
              ++stats_.room_overshoots;
              log().log(first ? spdlog::level::warn : spdlog::level::info,
                        "inside one graph: {} is mapped beyond graph {}'s reserve of {} (it holds "
                        "{}), or into the room of restores for earlier uses: no release or restore "
                        "before it came within {} ms, so the graph may be waiting for this restore "
                        "(one hardware queue, or its trigger opens the launch); this window maps "
                        "at once from now on",
                        lent.slot->describe(), hex(reinterpret_cast<uintptr_t>(g.exec)),
                        byte_size(g.reserve), byte_size(g.held), patience / 1000000);
            }
            if (g.room_since_ns != 0) {
              stats_.room_wait_us += static_cast<double>(now - g.room_since_ns) / 1e3;
            }
            g.room_since_ns = 0;
            // No pages now: tried again at a later pass (the lock is not held while it waits:
            // launches and other threads go on), until residency.wait_limit.
            if (now < g.map_retry_ns) {
              store(flag, 1);
              break;
            }
            std::string error;
            if (!map_once(lent, "the graph's next use", &error)) {
              if (g.map_since_ns == 0) {
                g.map_since_ns = now;
                ++stats_.map_waits;
              }
              const uint64_t waited = now - g.map_since_ns;
              if (waited > wait_limit_ns_.load(std::memory_order_relaxed)) {
                die("inside one graph: cannot map " + lent.slot->describe() +
                    " again for the graph's next use within residency.wait_limit: " + error);
              }
              // 1 ms, doubling with the time waited, at most 50 ms between tries.
              g.map_retry_ns = now + std::clamp<uint64_t>(waited, 1000000, 50000000);
              store(flag, 1);
              break;
            }
            if (g.map_since_ns != 0) {
              stats_.map_wait_us += static_cast<double>(now - g.map_since_ns) / 1e3;
            }
            g.map_since_ns = g.map_retry_ns = 0;
            g.held += lent.slot->mapped_bytes;
            note_held_locked();
            ++restores;
          }
          store(g.flag(step.window, kMapped), 1);
        }
        ++lent.next;
        progressed = true;
      }
      if (pass == 1 && lent.next < lent.steps.size()) finished = false;
    }
  }
  stats_.releases += releases;
  stats_.restores += restores;
  if (releases > 0) note_held_locked();  // restores said so as they mapped
  if (finished) {
    g.running = false;
    --g.queued;
    if (g.queued == 0) park_locked(g);
    ++stats_.launches;
    stats_.moved_bytes += g.moved_per_launch;
    if (trace::enabled()) {
      trace::Record(trace::Event::inside_launch)
          .hex("exec", reinterpret_cast<uintptr_t>(g.exec))
          .add("windows", static_cast<uint64_t>(g.windows))
          .add("moved_bytes", g.moved_per_launch)
          .add("dur_us", trace::us_since(g.started_ns))
          .emit();
    }
    done_.notify_all();
    progressed = true;
  }
  return progressed;
}

bool Inside::map_once(Lent& lent, const char* why, std::string* error) {
  try {
    busy("mapping " + lent.slot->describe() + " again for " + why);
    engine().back(lent.slot, std::nullopt, /*report=*/false);
    idle();
    lent.mapped = true;
    return true;
  } catch (const Error& e) {
    idle();
    *error = e.what();
    return false;
  }
}

void Inside::map_back(Lent& lent, const char* why) {
  const uint64_t start = trace::now_ns();
  auto pause = std::chrono::milliseconds(1);
  std::string error;
  // No pages now (the program's own allocations took the room): try again until the limit, for
  // the thread that brings the slot back waits for this map.
  while (!map_once(lent, why, &error)) {
    if (trace::now_ns() - start > wait_limit_ns_.load(std::memory_order_relaxed)) {
      die(std::string("inside one graph: cannot map ") + lent.slot->describe() + " again for " +
          why + " within residency.wait_limit: " + error);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

bool Inside::release_pages(Rewritten& g, Lent& lent) {
  try {
    busy("unmapping " + lent.slot->describe());
    engine().unback(lent.slot, std::nullopt);
    idle();
  } catch (const Error& e) {
    idle();
    // The pages stay, and so does the data; the next restore finds the slot mapped.
    failures_.fetch_add(1);
    log().warn("inside one graph: {} keeps its pages: {}", lent.slot->describe(), e.what());
    return false;
  }
  lent.mapped = false;
  g.held -= lent.slot->mapped_bytes;
  return true;
}

bool Inside::release_pending_locked(const Rewritten& g, size_t before) {
  for (const Lent& lent : g.slots) {
    if (lent.gone || !lent.mapped) continue;
    if (lent.handed != nullptr) return true;
    if (lent.next < lent.steps.size() && lent.steps[lent.next].release &&
        lent.steps[lent.next].position < before &&
        !(lent.kept && lent.next + 1 == lent.steps.size())) {
      return true;
    }
  }
  return false;
}

uint64_t Inside::earlier_restores_locked(const Rewritten& g, size_t position) {
  uint64_t bytes = 0;
  for (const Lent& lent : g.slots) {
    if (lent.gone || lent.mapped || lent.next >= lent.steps.size()) continue;
    const Step& next = lent.steps[lent.next];
    if (!next.release && next.position < position) bytes += lent.slot->mapped_bytes;
  }
  return bytes;
}

void Inside::note_held_locked() {
  uint64_t held = 0;
  std::map<int, uint64_t> by_device;
  for (const auto& [exec, g] : graphs_) {
    held += g->held;
    if (g->lent && !g->ended) by_device[g->device] += g->held;
  }
  stats_.peak_lent_held = std::max(stats_.peak_lent_held, held);
  for (int device : devices_lent_) by_device.emplace(device, 0);  // one that holds none now
  for (const auto& [device, bytes] : by_device) {
    residency::executors_hold(device, bytes);
    devices_lent_.insert(device);
  }
}

void Inside::park_locked(Rewritten& g) {
  if (!g.lent || g.ended || g.parked > 0 || g.reserve <= g.held) return;
  g.parked = g.reserve - g.held;
  residency::park(g.device, g.parked);
}

void Inside::unpark_locked(std::unique_lock<std::mutex>& lock, Rewritten& g) {
  if (g.parked == 0) return;
  const uint64_t bytes = g.parked;
  g.parked = 0;
  unlocked(lock, g, [&] { residency::unpark(g.device, bytes, /*make_room=*/true); });
}

bool Inside::drain_locked(std::unique_lock<std::mutex>& lock, Rewritten& g) {
  // Bounded by progress, not by the queue's length: many launches of a long graph may be queued,
  // and only a wait_limit without one step carried out is a stuck graph. In all, at most a
  // wait_limit for each launch queued when the drain began (and one more): a program that keeps
  // launching the graph meanwhile cannot hold this thread forever.
  const auto limit = std::chrono::nanoseconds(wait_limit_ns_.load(std::memory_order_relaxed));
  const auto deadline =
      std::chrono::steady_clock::now() + limit * static_cast<int64_t>(g.queued + 1);
  for (;;) {
    const uint64_t seen = g.progress;
    const auto until = std::min(deadline, std::chrono::steady_clock::now() + limit);
    const bool woke =
        done_.wait_until(lock, until, [&] { return g.queued == 0 || g.progress != seen; });
    if (g.queued == 0) return true;
    if (!woke) return false;
  }
}

void Inside::finished_locked(std::unique_lock<std::mutex>& lock, Rewritten& g, const char* why) {
  if (!quiet_locked(lock, g, /*drain=*/true)) {
    die("inside one graph: the launches of graph " + hex(reinterpret_cast<uintptr_t>(g.exec)) +
        " were not carried out within residency.wait_limit (CUDA_ERROR_LAUNCH_TIMEOUT) " + why);
  }
  if (g.ended) return;
  // The executor has taken every flag; the graph may still be clearing one, copying a slot back
  // from its host copy, and using it; other work on other streams may still use its slots. Their
  // ends, waited for without the lock.
  std::vector<CUevent> ends;
  if (g.finished != nullptr) ends.push_back(g.finished);
  for (const Rewritten::Other& other : g.others) {
    if (other.pending) ends.push_back(other.used);
  }
  if (ends.empty()) return;
  CUresult rc = CUDA_SUCCESS;
  unlocked(lock, g, [&] {
    const uint64_t start = trace::now_ns();
    for (const CUevent end : ends) {
      while ((rc = drv().cuEventQuery(end)) == CUDA_ERROR_NOT_READY &&
             trace::now_ns() - start < wait_limit_ns_.load()) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      if (rc == CUDA_ERROR_NOT_READY) return;
    }
  });
  if (rc == CUDA_ERROR_NOT_READY) {
    die("inside one graph: the last launch of graph " + hex(reinterpret_cast<uintptr_t>(g.exec)) +
        ", or other work that used its slots, did not end on the device within "
        "residency.wait_limit (CUDA_ERROR_LAUNCH_TIMEOUT) " +
        why);
  }
}

void Inside::bring_back(Rewritten& g, Lent& lent, CUstream stream, const void* data) {
  map_back(lent, "other work that uses it");
  g.held += lent.slot->mapped_bytes;
  if (data == nullptr) data = lent.host;
  if (data != nullptr) copy_in(g, lent, data, stream);
}

// Made by prepare() before the graph was rewritten, and kept until the process ends.
CUstream Inside::stream_locked(Rewritten& g) { return streams_.at(g.device); }

void Inside::copy_in(Rewritten& g, Lent& lent, const void* data, CUstream stream) {
  const Driver& driver = drv();
  ContextScope scope(driver, g.context);
  busy("copying the data of " + lent.slot->describe() + " back");
  CUresult rc = driver.cuMemcpyHtoDAsync(lent.slot->va, data, lent.slot->mapped_bytes, stream);
  if (rc == CUDA_SUCCESS) rc = driver.cuStreamSynchronize(stream);
  idle();
  if (rc != CUDA_SUCCESS) {
    die(cuda_failure("cuMemcpyHtoDAsync", rc,
                     lent.slot->describe() + ", copying its data back from its host copy"));
  }
}

void Inside::copy_out(Rewritten& g, Lent& lent, CUstream stream) {
  const Driver& driver = drv();
  ContextScope scope(driver, g.context);
  busy("copying the data of " + lent.slot->describe() + " out");
  CUresult rc = driver.cuMemcpyDtoHAsync(lent.host, lent.slot->va, lent.slot->mapped_bytes, stream);
  if (rc == CUDA_SUCCESS) rc = driver.cuStreamSynchronize(stream);
  idle();
  if (rc != CUDA_SUCCESS) {
    die(cuda_failure("cuMemcpyDtoHAsync", rc,
                     lent.slot->describe() + ", copying its data to its host copy"));
  }
}

// =============================================================================================
// Other work, and the end of executables and slots
// =============================================================================================

std::vector<Slot*> Inside::present(const std::vector<Slot*>& slots, CUresult* rc,
                                   std::string* message) {
  *rc = CUDA_SUCCESS;
  if (!any_.load(std::memory_order_acquire)) return slots;  // no graph rewritten: no lock
  std::unique_lock<std::mutex> lock(mutex_);
  if (owner_.empty()) return slots;
  std::vector<Slot*> rest;
  for (Slot* slot : slots) {
    auto it = owner_.find(slot);
    if (it == owner_.end() || !it->second->lent) {
      rest.push_back(slot);
      continue;
    }
    Rewritten& g = *it->second;
    Waiting waiting(*this, g);
    Lent* lent = nullptr;
    for (Lent& l : g.slots) {
      if (l.slot == slot) lent = &l;
    }
    if (!settle_locked(lock, g)) {
      *rc = CUDA_ERROR_LAUNCH_TIMEOUT;
      *message = "the slots of the rewritten graph that holds " + slot->describe() +
                 " were still being moved past residency.wait_limit";
      return rest;
    }
    if (g.ended) {  // destroyed meanwhile: the slot is residency's again
      rest.push_back(slot);
      continue;
    }
    if (lent == nullptr || lent->gone) continue;
    // On the device whenever other work runs: no windows, or kept with no window within launches,
    // or the graph's windows disabled.
    if (g.phase != Rewritten::Phase::on || (!lent->inner && (lent->kept || !lent->wraps))) continue;
    const uint64_t start = trace::now_ns();
    const bool waited = g.queued > 0;
    if (!quiet_locked(lock, g, /*drain=*/true)) {
      for (const Lent& l : g.slots) {
        if (l.mapped) {
          log().debug("{}: mapped, step {} of {}, wraps {} inner {} handed {}", l.slot->describe(),
                      l.next, l.steps.size(), l.wraps, l.inner, l.handed != nullptr);
        }
        if (l.next >= l.steps.size()) continue;
        const Step& st = l.steps[l.next];
        log().debug(
            "{}: step {} of {} ({} of window {} at {}), mapped {}, held {} of {}, flags {} {} {}",
            l.slot->describe(), l.next, l.steps.size(), st.release ? "release" : "restore",
            st.window, st.position, l.mapped, g.held, g.reserve, load(g.flag(st.window, kReleased)),
            load(g.flag(st.window, kTrigger)), load(g.flag(st.window, kMapped)));
      }
      {
        // The executor stuck in a driver call is the likeliest cause: say so and end (the
        // watchdog would, a moment later).
        std::lock_guard<std::mutex> busy_lock(busy_mutex_);
        if (const Busy* busy = oldest_busy_locked()) {
          die("inside one graph: " + slot->describe() +
              " waited for the launches of its graph "
              "past residency.wait_limit (CUDA_ERROR_LAUNCH_TIMEOUT), and the executor has been " +
              busy->what + " for " + std::to_string((trace::now_ns() - busy->since_ns) / 1000000) +
              " ms");
        }
      }
      *rc = CUDA_ERROR_LAUNCH_TIMEOUT;
      *message = "the launches of the rewritten graph that holds " + slot->describe() +
                 " did not finish within residency.wait_limit";
      return rest;
    }
    if (g.ended) {
      rest.push_back(slot);
      continue;
    }
    const bool away = !lent->mapped;
    if (away) {
      // Its last step was a release, whose D2H has completed: nothing of the graph touches it
      // until the next launch, which waits for this thread. Its pages come from the reserve.
      unpark_locked(lock, g);
      const CUstream stream = stream_locked(g);
      unlocked(lock, g, [&] { bring_back(g, *lent, stream); });
      note_held_locked();
    }
    // Kept, it would hold its pages where the schedule has it away (its wrap window), beyond the
    // reserve: where the device has no pages beyond it (tight), a restore of the launch then
    // found none and the process was ended (the simulator, selection.captured_only=false).
    // A size budget that cannot hold it beside the schedule's peak: brought back for each use,
    // as under the tight budget. Kept, it took the slots 2 MiB past a 28 MiB budget
    // (inside_test.sh "capacity", a run under load).
    const bool room =
        g.keep_limit == 0 ||
        g.recipe.choice.peak_bytes + g.kept_bytes + lent->slot->mapped_bytes <= g.keep_limit;
    if (lent->wraps && !lent->kept && !g.tight && !room && !g.said_not_kept) {
      g.said_not_kept = true;
      log().info(
          "inside one graph: {} is used between launches, but residency.budget leaves graph {} "
          "no room to keep it on the device beside its windows' {}: it is brought back for each "
          "such use",
          slot->describe(), hex(reinterpret_cast<uintptr_t>(g.exec)),
          byte_size(g.recipe.choice.peak_bytes));
    }
    if (lent->wraps && !lent->kept && !g.tight && room) {
      lent->kept = true;
      // Kept, it holds its pages where the schedule has it away: the reserve covers the
      // schedule's peak and every kept slot, so that restores at the peak find the room the
      // schedule gave them (residency counts the growth, and evicts its own slots for it).
      // Without, they waited for a release their trigger does not follow, and with one hardware
      // queue the graph was parked on them (100 ms each, then mapped beyond the reserve).
      g.kept_bytes += lent->slot->mapped_bytes;
      const uint64_t need = g.recipe.choice.peak_bytes + g.kept_bytes;
      if (need > g.reserve) {
        const uint64_t more = need - g.reserve;
        g.reserve = need;
        if (g.lent) unlocked(lock, g, [&] { residency::lend_more(g.device, more); });
      }
      log().info(
          "inside one graph: {} is used between launches: it stays on the device then (graph "
          "{}'s reserve is {})",
          slot->describe(), hex(reinterpret_cast<uintptr_t>(g.exec)), byte_size(g.reserve));
    }
    if (!away && !waited) continue;
    ++stats_.on_demand;
    const double us = trace::us_since(start);
    stats_.on_demand_wait_us += us;
    if (trace::enabled()) {
      trace::Record(trace::Event::inside_demand)
          .add("slot", slot->id)
          .add("bytes", static_cast<uint64_t>(slot->mapped_bytes))
          .add("dur_us", us)
          .emit();
    }
  }
  return rest;
}

void Inside::exec_destroyed(CUgraphExec exec) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = graphs_.find(exec);
  if (it == graphs_.end()) return;
  Rewritten& g = *it->second;
  if (!quiet_locked(lock, g, /*drain=*/false)) {
    still_moving("graph " + hex(reinterpret_cast<uintptr_t>(exec)), "it was destroyed or updated");
  }
  finished_locked(lock, g, "before it was destroyed or updated");
  // Slots on the device go back as they are; slots off it go back offloaded, their data in the
  // host copy residency takes over (the program often frees them next: nothing is mapped then).
  std::vector<Slot*> back;
  for (Lent& lent : g.slots) {
    if (lent.gone) continue;
    if (!g.lent) continue;
    if (lent.mapped) {
      back.push_back(lent.slot);
    } else {
      residency::take_back_offloaded(lent.slot, lent.host);
      lent.host = nullptr;
    }
  }
  if (g.parked > 0) residency::unpark(g.device, g.parked, /*make_room=*/false);
  g.parked = 0;
  if (g.lent) residency::take_back(g.device, back, g.reserve);
  uint32_t* flags = free_locked(g);
  g.ended = true;
  done_.notify_all();  // its waiters see it ended
  // Found again: the waits above released the lock, and another graph's instantiation may have
  // rehashed the table meanwhile.
  it = graphs_.find(exec);
  if (g.waiters > 0) ended_.push_back(std::move(it->second));  // the last of them frees it
  graphs_.erase(it);
  note_held_locked();  // its pages are residency's again
  lock.unlock();
  // Not under the lock: freeing pinned memory may wait for the device, where another rewritten
  // graph may be parked on a map that only the executor, which needs the lock, makes.
  drv().cuMemFreeHost(flags);
}

void Inside::all_back_locked(std::unique_lock<std::mutex>& lock, Rewritten& g, const char* when) {
  if (!quiet_locked(lock, g, /*drain=*/false)) {
    still_moving("graph " + hex(reinterpret_cast<uintptr_t>(g.exec)), when);
  }
  if (g.ended) return;
  finished_locked(lock, g, (std::string("before ") + when).c_str());
  if (g.ended) return;  // destroyed meanwhile: residency has its slots back
  unpark_locked(lock, g);
  if (g.ended) return;
  const CUstream stream = stream_locked(g);
  unlocked(lock, g, [&] {
    for (Lent& lent : g.slots) {
      if (!lent.gone && g.lent && !lent.mapped) bring_back(g, lent, stream);
    }
  });
  note_held_locked();
}

CUresult Inside::copies_off(Rewritten& g, const WindowCopies& copies, std::string* message) {
  // No launch is in flight (finished_locked): the copies go off for every launch from now on.
  // Restores first: a D2H left on only copies data that stays on the device, an H2D left on
  // would put back what a changed node may have written since its D2H.
  const Driver& driver = drv();
  for (const CUgraphNode node : copies.h2d) {
    const CUresult rc = driver.cuGraphNodeSetEnabled(g.exec, node, 0);
    if (rc != CUDA_SUCCESS) {
      if (g.phase != Rewritten::Phase::unsafe) g.phase = Rewritten::Phase::stuck;
      g.phase_error = rc;
      *message = left_on(g, rc, ": the program's change would be undone by it, and is refused");
      log().error("inside one graph: {}", *message);
      return rc;
    }
  }
  for (const CUgraphNode node : copies.d2h) {
    const CUresult rc = driver.cuGraphNodeSetEnabled(g.exec, node, 0);
    if (rc != CUDA_SUCCESS) {
      log().warn("inside one graph: {} (it copies data that stays on the device)",
                 cuda_failure("cuGraphNodeSetEnabled", rc, "a release's copy"));
    }
  }
  if (g.phase == Rewritten::Phase::unsafe) return CUDA_SUCCESS;  // an update was made with one on
  g.phase = Rewritten::Phase::off;
  g.phase_error = CUDA_SUCCESS;
  return CUDA_SUCCESS;
}

std::string Inside::left_on(const Rewritten& g, CUresult rc, const char* outcome) {
  return cuda_failure(
             "cuGraphNodeSetEnabled", rc,
             "a restore's copy in rewritten graph " + hex(reinterpret_cast<uintptr_t>(g.exec))) +
         outcome;
}

CUresult Inside::disable_locked(Rewritten& g, std::string* message) {
  for (Lent& lent : g.slots) lent.kept = true;
  if (g.phase == Rewritten::Phase::on) g.phase = Rewritten::Phase::off;
  note_held_locked();
  return copies_off(g, g.copies, message);
}

CUresult Inside::node_changing(CUgraphExec exec, std::string* message) {
  if (!any_.load(std::memory_order_acquire)) return CUDA_SUCCESS;
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = graphs_.find(exec);
  if (it == graphs_.end()) return CUDA_SUCCESS;
  Rewritten& g = *it->second;
  Waiting waiting(*this, g);
  if (g.phase == Rewritten::Phase::on) all_back_locked(lock, g, "a node of it was changed");
  if (g.ended) return CUDA_SUCCESS;  // destroyed meanwhile: the program's call fails on its own
  if (g.phase != Rewritten::Phase::on) {  // at an earlier change (or by another thread)
    if (g.phase_error != CUDA_SUCCESS) {
      *message = left_on(g, g.phase_error,
                         " (at an earlier change): the program's change would be undone by it, "
                         "and is refused");
    }
    return g.phase_error;
  }
  const CUresult rc = disable_locked(g, message);
  if (rc == CUDA_SUCCESS) {
    log().info(
        "inside one graph: a node of graph {} is changed: its slots stay on the device from "
        "now on (its windows' copies are off, and nothing is unmapped)",
        hex(reinterpret_cast<uintptr_t>(exec)));
  }
  return rc;
}

CUgraph Inside::update_source(CUgraphExec exec, CUgraph graph, const GraphScan& scan,
                              std::string* why) {
  if (!any_.load(std::memory_order_acquire)) return nullptr;
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = graphs_.find(exec);
  if (it == graphs_.end()) return nullptr;
  Rewritten& g = *it->second;
  if (g.updating != nullptr) {
    *why = "another thread updates it";
    return nullptr;
  }
  if (!scan.ordered || scan.order.size() != g.recipe.nodes) {
    *why = "the new graph's nodes are not those of the graph it was made from";
    return nullptr;
  }
  const bool gone =
      std::any_of(g.slots.begin(), g.slots.end(), [](const Lent& l) { return l.gone; });
  if (gone) {
    *why = "a slot of its windows was freed";
    return nullptr;
  }
  // Launches in flight keep the nodes they started with, and their windows are followed to the
  // end. The copy's nodes name the slots, which the driver checks: those off the device come back
  // with their data first. Where the new graph uses the lent slots at the same positions, nothing
  // else changes (the next launch hands their data over and unmaps them again, as after other
  // work that used them). Where not (or where it cannot be read in full), a made update is as a
  // changed node: nothing unmapped any more, the windows' copies off (updated); a refused one
  // changes nothing.
  const bool same = scan.opaque_kernels == 0 && scan.unscanned_nodes == 0 &&
                    uses_of(scan, g.recipe.picked) == g.recipe.uses;
  if (!same && g.phase_error != CUDA_SUCCESS) {
    *why = left_on(g, g.phase_error,
                   " (at an earlier change): the update would be undone by it, and is refused");
    return nullptr;
  }
  Waiting waiting(*this, g);
  all_back_locked(lock, g, "it was updated");
  if (g.ended) return nullptr;  // destroyed meanwhile: the program's update fails on its own
  if (g.updating != nullptr) {  // the waits released the lock
    *why = "another thread updates it";
    return nullptr;
  }
  g.updating = graph;  // claimed: the copy is made without the lock
  g.update_disables = !same && g.phase == Rewritten::Phase::on;
  const Recipe recipe = g.recipe;
  const CUcontext context = g.context;
  const bool lent = g.lent;  // else residency still has the slots
  lock.unlock();
  auto with_pages = [&recipe, lent](size_t candidate, const std::function<void()>& add) {
    if (lent) return add();  // mapped by the executor, which maps nothing away while idle
    residency::with_pages({recipe.picked[candidate]}, add);
  };
  CUgraph source = nullptr;
  WindowCopies copies;
  try {
    source = rewrite_graph(drv(), graph, scan.order, recipe.choice, recipe.slots, recipe.flags,
                           context, with_pages, &copies);
  } catch (const Error& e) {
    *why = e.what();
  }
  lock.lock();
  if (g.ended) {  // destroyed meanwhile: the program's update fails on its own
    if (source != nullptr) drv().cuGraphDestroy(source);
    return nullptr;
  }
  g.updating = source;
  if (source == nullptr) {  // updated from the program's graph instead (exec_changed)
    g.update_disables = false;
    return nullptr;
  }
  g.updating_from = graph;  // logged with the driver's verdict (updated)
  return source;
}

CUresult Inside::updated(CUgraphExec exec, CUgraph source, bool made, std::string* message) {
  CUgraph drop = source;
  CUresult rc = CUDA_SUCCESS;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = graphs_.find(exec);
    if (it != graphs_.end() && it->second->updating == source) {
      Rewritten& g = *it->second;
      const std::string graph = hex(reinterpret_cast<uintptr_t>(exec));
      const std::string from = hex(reinterpret_cast<uintptr_t>(g.updating_from));
      g.updating = nullptr;
      g.updating_from = nullptr;
      std::swap(drop, g.refused_source);  // the last refused one goes now
      if (made) {
        drop = source;  // the executable keeps its own nodes' identity (clone's)
        // Whatever state an update gives the copies: off again where they were off.
        const bool was_disabled = g.phase != Rewritten::Phase::on;
        if (g.update_disables) {
          rc = disable_locked(g, message);
        } else if (was_disabled) {
          rc = copies_off(g, g.copies, message);
        }
        if (rc != CUDA_SUCCESS) {
          g.phase = Rewritten::Phase::unsafe;  // copies_off kept its error
        } else if (g.update_disables) {
          log().info(
              "inside one graph: graph {} is updated from graph {} with its windows added; it "
              "uses its slots elsewhere now: they stay on the device from now on (its windows' "
              "copies are off, and nothing is unmapped)",
              graph, from);
        } else {
          log().info(
              "inside one graph: graph {} is updated from graph {} with its windows added "
              "({})",
              graph, from,
              was_disabled ? "its windows' copies stay off"
                           : "the slots are used where they were: the windows go on");
        }
      } else {
        g.refused_source = source;
        log().info(
            "inside one graph: graph {}: the driver refused its update from graph {} with its "
            "windows added; the executable and its windows are as they were",
            graph, from);
      }
      g.update_disables = false;
    }
  }
  if (drop != nullptr) drv().cuGraphDestroy(drop);
  return rc;
}

CUgraphNode Inside::node_in(CUgraphExec exec, CUgraphNode node) {
  if (!any_.load(std::memory_order_acquire)) return node;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = graphs_.find(exec);
  if (it == graphs_.end() || it->second->clone == nullptr) return node;
  CUgraphNode in_clone = nullptr;
  if (drv().cuGraphNodeFindInClone(&in_clone, node, it->second->clone) != CUDA_SUCCESS) {
    return node;  // not a node of the captured graph: the driver says what it is
  }
  return in_clone;
}

void Inside::forget(Slot* slot) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = owner_.find(slot);
  if (it == owner_.end()) return;
  Rewritten& g = *it->second;
  Waiting waiting(*this, g);
  if (!quiet_locked(lock, g, /*drain=*/false)) {
    still_moving("the graph that holds " + slot->describe(), "it was freed");
  }
  if (g.ended) return;  // destroyed meanwhile: residency has the slot back
  if (g.lent) finished_locked(lock, g, "before a slot of it was freed");
  if (g.ended) return;
  for (Lent& lent : g.slots) {
    if (lent.slot != slot || lent.gone) continue;
    lent.gone = true;
    // Mapped, it goes back to residency, which frees its pages. Off the device it stays lent
    // until residency forgets it: nothing is mapped for a slot about to go (the device may have
    // no room for it, and its data is not needed).
    if (g.lent && lent.mapped) {
      g.held -= slot->mapped_bytes;
      residency::take_back(g.device, {slot}, 0);
      note_held_locked();
    }
  }
  owner_.erase(slot);  // by key: the lock was released meanwhile
}

uint32_t* Inside::free_locked(Rewritten& g) {
  if (g.finished != nullptr) drv().cuEventDestroy(g.finished);
  for (const Rewritten::Other& other : g.others) drv().cuEventDestroy(other.used);
  if (g.clone != nullptr) drv().cuGraphDestroy(g.clone);
  if (g.refused_source != nullptr) drv().cuGraphDestroy(g.refused_source);
  for (Lent& lent : g.slots) {
    if (lent.handed != nullptr) drv().cuEventDestroy(lent.handed);
    // A slot freed while lent left owner_ already, and its address may serve another graph now.
    auto owner = owner_.find(lent.slot);
    if (!lent.gone && owner != owner_.end() && owner->second == &g) owner_.erase(owner);
    if (lent.host != nullptr) engine().host_free(lent.host);
  }
  return g.flags;
}

void Inside::busy(const std::string& what) {
  std::lock_guard<std::mutex> lock(busy_mutex_);
  busy_[std::this_thread::get_id()] = Busy{trace::now_ns(), what};
}

void Inside::idle() {
  std::lock_guard<std::mutex> lock(busy_mutex_);
  busy_.erase(std::this_thread::get_id());
}

const Inside::Busy* Inside::oldest_busy_locked() const {
  const Busy* oldest = nullptr;
  for (const auto& [thread, busy] : busy_) {
    if (oldest == nullptr || busy.since_ns < oldest->since_ns) oldest = &busy;
  }
  return oldest;
}

void Inside::watch() {
  become_own_thread("vaswap-iwatch");
  for (;;) {
    const uint64_t limit = wait_limit_ns_.load(std::memory_order_relaxed);
    const uint64_t period = std::min<uint64_t>(limit / 10, 100000000);
    std::this_thread::sleep_for(std::chrono::nanoseconds(period));
    std::lock_guard<std::mutex> lock(busy_mutex_);
    const Busy* busy = oldest_busy_locked();
    if (busy != nullptr && trace::now_ns() - busy->since_ns > limit) {
      die("inside one graph: the executor has been " + busy->what + " for " +
          std::to_string((trace::now_ns() - busy->since_ns) / 1000000) +
          " ms (residency.wait_limit " + std::to_string(limit / 1000000) +
          " ms; CUDA_ERROR_LAUNCH_TIMEOUT), and the graph that waits for it cannot go on");
    }
  }
}

[[noreturn]] void Inside::die(const std::string& message) {
  residency::end_process("inside", message);
}

}  // namespace

void configure(const Settings& settings) { the().configure(settings); }
bool enabled() { return the().enabled(); }
void used_elsewhere(const std::vector<Slot*>& slots, CUstream stream) {
  the().used_elsewhere(slots, stream);
}
CUgraph prepare(CUgraph graph, const GraphScan& scan, const std::vector<Slot*>& slots,
                const std::function<bool(const Slot*)>& shared, std::string* why) {
  return the().prepare(graph, scan, slots, shared, why);
}
void instantiated(CUgraph rewritten, CUgraphExec exec) { the().instantiated(rewritten, exec); }
std::vector<Slot*> lent_to(CUgraphExec exec) { return the().lent_to(exec); }
bool rewritten(CUgraphExec exec) { return the().rewritten(exec); }
CUresult before_launch(CUgraphExec exec, CUstream stream, std::string* message) {
  return the().before_launch(exec, stream, message);
}
void launch_returned(CUgraphExec exec, CUstream stream, bool enqueued) {
  the().launch_returned(exec, stream, enqueued);
}
std::vector<Slot*> present(const std::vector<Slot*>& slots, CUresult* rc, std::string* message) {
  return the().present(slots, rc, message);
}
void exec_destroyed(CUgraphExec exec) { the().exec_destroyed(exec); }
CUresult node_changing(CUgraphExec exec, std::string* message) {
  return the().node_changing(exec, message);
}
CUgraph update_source(CUgraphExec exec, CUgraph graph, const GraphScan& scan, std::string* why) {
  return the().update_source(exec, graph, scan, why);
}
CUresult updated(CUgraphExec exec, CUgraph source, bool made, std::string* message) {
  return the().updated(exec, source, made, message);
}
CUgraphNode node_in(CUgraphExec exec, CUgraphNode node) { return the().node_in(exec, node); }
void forget(Slot* slot) { the().forget(slot); }
uint64_t unmapped_reserve(int device) { return the().unmapped_reserve(device); }
Stats stats() { return the().stats(); }

}  // namespace vaswap::inside
