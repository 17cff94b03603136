// Residency: which of the preload's slots hold device pages, within a budget, and the device-side
// handshakes that make a slot's pages and data arrive before any work that uses it runs
// (DESIGN.md section 5, invariants 2, 3, 10, 11 and 12).
//
// A slot the preload makes reserves its address at once and gets pages only before its first
// use. Before a graph launch or an eager kernel, copy or memset, acquire() makes the slots it uses
// resident: pages mapped, data copied back. Doing so may go over the budget; then slots that this
// launch does not need are evicted (D2H to pinned host memory after their last use, then unmap),
// farthest next use first once a schedule is known (set_schedule), least recently used before.
//
// The application's thread only decides and enqueues. Under the device handshake (the default)
// it enqueues the copies themselves when it decides them: an eviction's D2H behind waits on the
// device for the slot's last uses, a restore's H2D behind a wait for the slot's flag, both as
// graphs of one memcpy node (transform/copy_graph.h: the driver checks a graph's copy for pages
// when the node is added, not when it is launched); the launching stream waits for the restore's
// event. Each device's vaswap threads then act on the host only: the mover maps pages once the
// budget has room and writes the flag, the unmapper unmaps an evicted slot once its copy has
// ended. Where stream memory operations are unsupported, or with one hardware queue
// (CUDA_DEVICE_MAX_CONNECTIONS=1: the restore stream's wait would hold every stream's later work
// behind it), the host handshake stands in: the mover and the unmapper enqueue the copies, and
// the application's thread waits until a restore was submitted, its stream for the copy's event.
//
// Every wait is bounded (residency.wait_limit) and checks the device's health; a stuck
// handshake is a named error. A launch whose slots cannot fit the budget at all gets the API's
// out-of-memory error.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace vaswap {

struct Slot;

namespace residency {

// How long a restore waits for room that nothing under way will make before it maps beyond what
// it was allowed (a size budget here, a rewritten graph's reserve in plan/inside.cpp): the work
// that would make room may be waiting on the device behind it.
constexpr uint64_t kOvershootAfterNs = 100'000'000;

enum class Handshake { automatic, device, host };

struct Settings {
  uint64_t budget_bytes = 0;   // 0: auto (what the device has, less the reserve)
  uint64_t reserve_bytes = 0;  // auto budget only: headroom evictions leave; 0: auto (min(512
                               // MiB, 1/32 of the device, half of what slots could have now))
  Handshake handshake = Handshake::automatic;
  uint64_t wait_limit_ns = uint64_t{60} * 1000000000;
  uint64_t host_limit_bytes = 0;  // pinned host memory for evicted slots; 0: no limit
  bool d2h_gate = false;          // residency.d2h_gate (device handshake only)
  // selection.captured_only and selection.min_bytes: a refusal for want of room suggests letting
  // the program's other buffers be slots only where they are not already.
  bool captured_only = true;
  uint64_t min_bytes = 0;
};

// Called once, at start.
void configure(const Settings& settings);

// Why can_hold_slots refused: the device could not be started (its context, vaswap's copy
// streams or threads), or a slot there would have no handshake flag (pinned host memory ran out).
enum class NoSlots : uint8_t { device, flags };

// Whether slots can be made on `device`. Its first asks for vaswap's copy streams and threads
// there; where they cannot be had (a device the program has all but filled, a thread limit) it has
// no slots, and `why` (and `cause`) say so. Asked before each slot is made; what failed is tried
// again once a second has passed since the last failure (the program may have freed memory
// since). The same second after the device's handshake flags could not be pinned, where no
// freed flag is left: refused before the slot reserves an address.
bool can_hold_slots(int device, std::string* why, NoSlots* cause = nullptr);
// A slot the preload made. `backed`: it has its pages already (made outside a capture).
void adopt(Slot* slot, bool backed);
// The slot is about to be destroyed: its jobs finish (bounded), its host copy goes back.
void forget(Slot* slot);

// What acquire() holds until the launch is enqueued: the slots cannot be evicted meanwhile.
struct Acquired {
  std::vector<Slot*> slots;
  CUstream stream = nullptr;
  size_t waits = 0;              // slots whose restore the stream waits for
  std::vector<uint64_t> waited;  // their ids
  size_t demanded = 0;           // of them, restored for this launch rather than ahead (first maps
                                 // of never-used slots are not counted)
  uint64_t demanded_bytes = 0;
  bool host_waited = false;  // host handshake: this thread had to wait for a restore's
                             // submission (not when every one was started ahead)
  double host_wait_us = 0;
  double map_wait_us = 0;   // a copy or memset: host time until its pages were mapped
  bool map_waited = false;  // of it, this thread had to wait (they were not mapped yet)
  // A copy or memset (EagerShape): made instead as a launch of this graph on the stream, which
  // waits for the slots' restores; null: the program's call is made. Owned by residency.
  CUgraphExec substitute = nullptr;
  // Pinned for a copy or memset recorded into a capture (back_for_capture): nothing runs now, so
  // used() only lets their pins go.
  bool captured = false;
};

// An eager copy or memset between device addresses, as the program asked for it. The driver checks
// such work's addresses when it is enqueued, and its slots may have no pages yet: under the device
// handshake the first one that waits for them is also made as a graph of its one node
// (transform/copy_graph.h), and from then on the same copy or memset is launched as that graph
// instead, without waiting (its node's addresses were checked when it was added).
struct EagerShape {
  bool memset = false;
  CUdeviceptr dst = 0, src = 0;     // src: a copy's
  size_t count = 0;                 // a copy's bytes, a memset's elements
  unsigned value = 0, element = 1;  // a memset's value and element size (1, 2 or 4 bytes)
  bool operator<(const EagerShape& o) const {
    return std::tie(memset, dst, src, count, value, element) <
           std::tie(o.memset, o.dst, o.src, o.count, o.value, o.element);
  }
};

// When the driver checks the work's addresses (bench/results/launch_unmapped_h200.txt): kernels
// and graph launches only when they run, so their pages may be mapped while the stream waits;
// copies and memsets when they are enqueued, so their pages must be mapped before the call.
enum class Checked { when_run, when_enqueued };

// Before work on `stream` that uses `slots` (each listed once). `what` names the work in errors
// ("cudaGraphLaunch of graph 0x…"). On success the stream waits (on the device, or the host
// waited) for every slot's pages and data; with Checked::when_enqueued this thread has also
// waited until the pages are mapped (not for their data). CUDA_ERROR_OUT_OF_MEMORY: they cannot
// fit the budget at once, or a restore failed; `message` says why, nothing was enqueued, the data
// stays safe.
CUresult acquire(const std::vector<Slot*>& slots, CUstream stream, const std::string& what,
                 Acquired* acquired, std::string* message, Checked checked = Checked::when_run,
                 const EagerShape* shape = nullptr);
// After the work was enqueued: the slots were used on the stream (their next eviction waits for
// that use), and may be evicted again.
void used(const Acquired& acquired);

// Slots lent to the executor of a rewritten graph (core/plan/inside.h), all of one device: from
// now on residency neither counts, evicts nor restores them; the executor maps and unmaps them as
// the graph's windows say, within `reserve` bytes, which residency counts as held instead. Each
// must be resident (its restore submitted), offloaded, or never used; `lent` says, per slot,
// whether it has its pages, and where its data is when it is off the device (residency's host
// copy, which stays valid until the slot is taken back). False, with nothing lent, otherwise
// (an eviction or a restore in progress).
struct Lent {
  bool pages = false;    // resident: mapped, with its data
  void* data = nullptr;  // offloaded: its data (null: none, never used or no data)
};
bool lend(const std::vector<Slot*>& slots, uint64_t reserve, std::vector<Lent>* lent);
// The executor gives slots of `device` back: mapped, with their data (take_back; `reserve`: what
// of the lend's reserve goes back with them), or off the device with their data in `host` (pinned,
// from the engine's host pool), which residency takes: offloaded then, restored before their next
// use.
void take_back(int device, const std::vector<Slot*>& slots, uint64_t reserve);
void take_back_offloaded(Slot* slot, void* host);
// Runs `fn` while `slots` have pages: their own where resident, else a placeholder mapped for the
// call and unmapped after it (Engine::map_placeholder: no data and no memory of their own; for
// driver calls that check an address, such as adding a copy node to a graph or instantiating
// one). Lent slots are left as they are (their executor's:
// inside::present). Nothing is decided meanwhile; an eviction or a restore of one under way ends
// first (bounded by residency.wait_limit, else Error). Throws what `fn` or the engine throw, with
// the slots as they were.
void with_pages(const std::vector<Slot*>& slots, const std::function<void()>& fn);
// Waits until no eviction or restore of `slots` is under way: each resident with its restore
// landed, or offloaded with its pages unmapped and given back (bounded by residency.wait_limit,
// else Error). Decides nothing.
void wait_settled(const std::vector<Slot*>& slots);

// The plan's actions. evict: offload `slots` that are resident and not in use now (after their
// last use); returns those it left resident (in use by a launch being made, an eviction the
// device handshake cannot enqueue ahead yet, no host copy). prefetch: start restoring `slots`
// that are away, evicting others if the budget says so. Neither waits.
std::vector<Slot*> evict(const std::vector<Slot*>& slots, const char* cause);
void prefetch(const std::vector<Slot*>& slots);

// The learned period, for choosing what to evict: per position, the slots used there. Empty
// clears it (least recently used from then on). at_position() moves the current position.
void set_schedule(const std::vector<std::vector<Slot*>>& uses_by_position);
void at_position(int position);

// The budget of `device` now. `limit`: what slots may hold at once (auto: what the device has
// free, less 2 MiB, plus what slots hold, read from the device). `target`: what evictions bring
// them down to once the limit is reached (auto: the limit less residency.reserve, headroom left
// to the program's own allocations; a size: the limit). Slots grow into all the device has, so a
// job that fits evicts nothing; under pressure they leave the reserve free. A size budget is
// bounded by what the device could give slots when last read (`device_bound` then): beyond it,
// restores would wait for pages that never come.
struct Budget {
  uint64_t limit = 0, target = 0;
  bool device_bound = false;  // a size budget, lowered to the device's room
};
Budget budget(int device);
// budget() of each device vaswap has started (at its first slot), by ordinal, none started here:
// a graph's instantiation asks these (inside::enabled), whatever device is current. A device not
// started holds no slot to weigh; asking budget() for it started one that held none (vaswap's
// threads and copy streams on a GPU it did not use), and ended the process where it could not
// start.
std::map<int, Budget> started_budgets();
// What `device` could give slots at most now, whatever residency.budget says: what it has free
// (less what no allocation gets, Engine::allocatable), plus what slots hold there (spare
// handles included), less residency.reserve where the user set one. Read from the device; empty
// when it cannot be read.
std::optional<uint64_t> device_room(int device);

// What the rest of the program takes of `device`'s budget, for a graph about to be rewritten
// (core/plan/inside.h), whose executor's reserve must leave it: the reserves lent to executors
// already (parked ones included: each is taken again at its graph's next launch), and the most
// bytes of slots that one launch has needed so far (a rewritten graph's reserve stays counted
// while its launches are queued, and the program's other work needs at least that much room
// then).
struct Others {
  uint64_t lent = 0;
  uint64_t largest_launch = 0;
};
Others others(int device);

// A rewritten graph's executor keeps `bytes` more on `device` than the reserve it was lent (a
// slot that other work uses between launches stays on the device): counted as lent from now
// on, as its reserve is (take_back gives back the grown reserve).
void lend_more(int device, uint64_t bytes);

// A rewritten graph's executor between its launches (no launch queued): `bytes` of its reserve,
// the part it has no pages mapped for, are not counted as lent until unpark(), so that other
// launches may have them meanwhile (a forward graph launched between a backward graph's
// launches). unpark() counts them again and, where `make_room`, evicts slots no launch holds
// down to the budget's target, so that the executor's maps find the pages (it does not wait for
// the evictions: its maps retry until residency.wait_limit). Without `make_room`, only the count
// (a graph destroyed while parked, before take_back).
void park(int device, uint64_t bytes);
void unpark(int device, uint64_t bytes, bool make_room);
// What the executors of rewritten graphs have mapped on `device` now, of the reserves lent them:
// the device's room for slots (its free memory plus what slots hold) counts that, not the
// reserves, whose unmapped part is in the free memory already.
void executors_hold(int device, uint64_t bytes);

// The program's own allocation on `device` failed for want of memory: evict slots that no
// launch in flight needs until `bytes` and residency.reserve more are free (the reserve stays
// free after the allocation, for the driver's own needs), waiting (bounded) for their copies.
// Returns the bytes of pages given back.
uint64_t make_room(int device, uint64_t bytes);

// A capture is about to begin on `stream`: the slots' uses enqueued there so far are closed by a
// mark recorded now (during the capture a record would go into the graph).
void capture_beginning(CUstream stream);
// `stream` is about to be destroyed: the same (its work may still run; the mark follows it).
void stream_gone(CUstream stream);
// While any capture is open (core/base/capture_gate.h counts them), marks are not recorded on
// capturing streams, and only slots whose last uses are closed already are evicted.

// Copies and memsets recorded into a capture need their addresses mapped: backs `slots` now
// (waiting until they are mapped), without recording anything on the capturing stream (it evicts
// only slots whose last uses are closed by recorded marks). On success the slots stay pinned in
// `held` until used(*held), once the copy is recorded: a restore short of room would otherwise
// evict one of them before the driver checks it. CUDA_ERROR_OUT_OF_MEMORY, with `message` and
// nothing held, when the budget has no room within residency.wait_limit.
CUresult back_for_capture(const std::vector<Slot*>& slots, CUstream stream, Acquired* held,
                          std::string* message);

// Ends the process with exit status 70 after `message` (and that vaswap cannot keep its device
// work correct past it) goes to the log and, as an `error` event from `who`, to the trace: for a
// stuck handshake or a lost map that a graph waits for (invariant 12).
[[noreturn]] void end_process(const char* who, const std::string& message);

struct Stats {
  uint64_t budget_bytes = 0;    // the last budget computed (the first device with slots)
  uint64_t resident_bytes = 0;  // pages slots hold now
  uint64_t peak_resident = 0;   // most pages slots held at once
  uint64_t evictions = 0, restores = 0, first_maps = 0;
  uint64_t distinct_evicted = 0;  // slots evicted at least once
  uint64_t evictions_budget = 0, evictions_plan = 0, evictions_program = 0;
  uint64_t reclaims = 0;      // evictions called off by a restore of the same slot before the unmap
  uint64_t oom_launches = 0;  // launches refused with out-of-memory
  uint64_t host_waits = 0;    // host handshakes that had to wait for a worker
  double host_wait_us = 0;
  uint64_t map_waits = 0;  // copies and memsets that waited for their slots' pages to be mapped
  double map_wait_us = 0;
  uint64_t host_bytes = 0;        // pinned bytes held (or being allocated) for evicted slots
  bool device_handshake = false;  // stream memory operations in use
  uint64_t settle_waits = 0;      // first-time work that waited for parked streams (settle)
  double settle_wait_us = 0;
  uint64_t budget_overshoots = 0;   // device handshake: restores mapped beyond a size budget, with
                                    // what would make room queued on the device behind them
  uint64_t d2h_gate_raises = 0;     // residency.d2h_gate: restores that held D2Hs back to map
  uint64_t d2h_gate_timeouts = 0;   // of them, the gate came down at its limit, not at the map
  double d2h_gate_us = 0;           // time the gate was up
  uint64_t host_path_restores = 0;  // device handshake: restores that took the host path (an
                                    // eviction they may count on could not be enqueued ahead, or
                                    // first-time work waited for parks to drain)
};
Stats stats();

// Device handshake: true once a device's launches wait for restores on the device, so that
// streams may be parked on flags.
bool parks_streams();
// Held by first-time work that settle() let go ahead: while any is held, restores park no stream
// (they take the host path), so no stream is parked again before that work has run. Released
// when it is destroyed.
class Quiet {
 public:
  Quiet() = default;
  Quiet(Quiet&& other) noexcept : held_(std::exchange(other.held_, false)) {}
  Quiet& operator=(Quiet&& other) noexcept {
    release();
    held_ = std::exchange(other.held_, false);
    return *this;
  }
  Quiet(const Quiet&) = delete;
  Quiet& operator=(const Quiet&) = delete;
  ~Quiet() { release(); }
  void release();
  bool held() const { return held_; }

 private:
  friend CUresult settle(const std::string& what, std::string* why, Quiet* quiet);
  bool held_ = false;
};

// Waits on the host until no stream is parked on a restore that has not landed. Called before
// first-time work (a kernel's or a graph's first launch, an instantiation, a module load): module
// loading and graph upload wait for the whole context, and on the H200 hang while a stream is
// parked (docs/PLANNER.md, "Handshakes"). Bounded by residency.wait_limit: past it,
// CUDA_ERROR_LAUNCH_TIMEOUT, and `why` says what waited for what. With `quiet`, on success it
// holds `*quiet` until that work is done, so that no other thread parks a stream meanwhile.
CUresult settle(const std::string& what, std::string* why, Quiet* quiet = nullptr);

}  // namespace residency
}  // namespace vaswap
