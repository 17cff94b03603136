#include "plan/residency.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "base/capture_gate.h"
#include "base/driver.h"
#include "base/errors.h"
#include "base/log.h"
#include "base/own_thread.h"
#include "base/trace.h"
#include "observe/callsite.h"
#include "plan/d2h_gate.h"
#include "slots/engine.h"
#include "slots/worker.h"
#include "transform/copy_graph.h"

namespace vaswap::residency {

namespace {

constexpr size_t kFlagsPerChunk = 1024;
// Device handshake: at most this many streams for evictions' D2H copies per device.
constexpr size_t kAheadStreams = 16;
// How long an eager copy's thread waits for parked streams before it makes the copy's graph, and
// how many such waits a copy gets before it is never made as a graph.
constexpr uint64_t kEagerSettleNs = 100'000'000;
constexpr int kEagerTries = 3;
// Device handshake: at most this many eager copies and memsets kept as graphs (EagerShape).
constexpr size_t kEagerGraphs = 1024;
constexpr uint64_t kAutoReserveMax = uint64_t{512} << 20;
// Under a size budget the device's room (which only bounds it) is read again at most this often,
// unless a decision goes beyond the last figure.
constexpr uint64_t kRoomEveryNs = 50'000'000;
// A driver call on the slot path that fails is tried again this often, backing off from 1 ms: a
// transient failure (another process briefly holding memory) costs milliseconds, not the job.
constexpr int kRetries = 6;
// A device whose start failed (its copy streams, its threads) or whose handshake flags could not
// be pinned gets no slots; what failed is tried again at a selected allocation this long after
// the last failure (the program may have freed memory, or ended threads, since).
constexpr uint64_t kRetryStreamsNs = 1'000'000'000;

// A failure remembered for kRetryStreamsNs, so that each selected allocation meanwhile is refused
// at once rather than after the failed call's retries. Under Residency::mutex_.
struct RecentFailure {
  std::string why;
  CUresult rc = CUDA_SUCCESS;  // the driver's error, where one call failed
  uint64_t at_ns = 0;          // trace::now_ns(); 0: none
  bool recent() const { return at_ns != 0 && trace::now_ns() - at_ns < kRetryStreamsNs; }
  void note(std::string message, CUresult code = CUDA_SUCCESS) {
    why = std::move(message);
    rc = code;
    at_ns = trace::now_ns();
  }
};

enum class Where : uint8_t {
  unbacked,   // no pages, no data: never used
  resident,   // pages (or a restore of them queued), counted against the budget
  releasing,  // an eviction is queued or its D2H runs; pages until the unmapper is done
  offloaded,  // no pages; the data is in the host copy
  lent,       // a rewritten graph's executor has it (plan/inside.h): not counted, not touched
};

uint64_t thread_id() {
  static thread_local const uint64_t tid = static_cast<uint64_t>(syscall(SYS_gettid));
  return tid;
}

// ---------------------------------------------------------------------------------------------
// Streams and their marks
// ---------------------------------------------------------------------------------------------

// A stream as the application names it. CU_STREAM_PER_THREAD is a different stream on every
// thread, and the null and legacy handles a different one per context.
struct StreamKey {
  CUstream handle = nullptr;
  uint64_t owner = 0;  // thread id (per-thread) or context (null, legacy); 0 otherwise
  bool operator==(const StreamKey& o) const { return handle == o.handle && owner == o.owner; }
};

struct StreamKeyHash {
  size_t operator()(const StreamKey& k) const {
    return std::hash<uintptr_t>()(reinterpret_cast<uintptr_t>(k.handle)) ^ (k.owner * 0x9e3779b9u);
  }
};

bool special(CUstream stream) {
  return stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD;
}

// Uses are closed lazily: after a launch the program may enqueue eager work the hooks do not see
// (in steady state, with the guard off), so a use is closed by the next event recorded on its
// stream, at the next acquire there or when an eviction needs it, which comes after all of it.
// The special handles name a stream that only the calling thread (or context) can reach: their
// uses are closed at once.
//
// A mark's event is recorded once and never again while anything refers to it: recorded again
// later, it could follow a wait for a restore that needs this very eviction (a deadlock). Events
// go back to a pool when the last reference goes.
class EventPool {
 public:
  // An event from the pool, or a new one made in `context`: CUDA_SUCCESS, or cuEventCreate's error.
  CUresult take(CUcontext context, CUevent* event);
  void give(CUevent event) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(event);
  }

 private:
  std::mutex mutex_;
  std::vector<CUevent> free_;
};

struct MarkRecord {
  EventPool* pool = nullptr;
  // Recorded once the mark is closed (by an application thread, under submit_); the workers read
  // it. Not recorded while its stream captures: the record would go into the graph.
  std::atomic<CUevent> event{nullptr};
  MarkRecord() = default;
  MarkRecord(const MarkRecord&) = delete;
  MarkRecord& operator=(const MarkRecord&) = delete;
  ~MarkRecord() {
    if (CUevent e = event.load()) pool->give(e);
  }
  // Closed, and what it closes has completed. A device error (a fault in the work it follows)
  // is returned in `failure`.
  bool complete(const Driver& driver, CUresult* failure = nullptr) const {
    CUevent e = event.load(std::memory_order_acquire);
    if (e == nullptr) return false;
    const CUresult rc = driver.cuEventQuery(e);
    if (failure != nullptr && rc != CUDA_SUCCESS && rc != CUDA_ERROR_NOT_READY) *failure = rc;
    return rc == CUDA_SUCCESS;
  }
  bool closed() const { return event.load(std::memory_order_acquire) != nullptr; }
};
using MarkRef = std::shared_ptr<MarkRecord>;

struct Marks {
  CUcontext context = nullptr;
  EventPool pool;  // events of this stream's context
  MarkRef next;    // uses made now are closed by it
};

struct Mark {
  StreamKey stream;
  MarkRef record;
};

// ---------------------------------------------------------------------------------------------
// Flags: words in pinned host memory that the device reads and writes
// ---------------------------------------------------------------------------------------------

struct Flag {
  uint32_t* host = nullptr;
  CUdeviceptr device = 0;
  void store(uint32_t v) const { __atomic_store_n(host, v, __ATOMIC_RELEASE); }
  uint32_t load() const { return __atomic_load_n(host, __ATOMIC_ACQUIRE); }
};

// Device handshake: vaswap's restore stream waits on the device for a slot's pages, until the
// mover writes the slot's flag once it has mapped them.
struct FlagWait {
  Flag flag;
  uint32_t value = 0;  // the stream runs on once the flag reaches it
  uint64_t slot = 0;   // whose restore writes the flag
  int device = 0;
  uint64_t since = 0;  // enqueued (trace::now_ns); set by carry_out
  bool written() const { return static_cast<int32_t>(flag.load() - value) >= 0; }
};

// ---------------------------------------------------------------------------------------------
// Slots, jobs, devices
// ---------------------------------------------------------------------------------------------

struct Entry {
  // Wide fields first, then narrow ones (no padding between them).
  Slot* slot = nullptr;
  uint64_t id = 0;
  uint64_t pages = 0;    // mapped bytes: what the budget counts
  uint64_t bytes = 0;    // what copies move
  void* host = nullptr;  // its pinned copy, kept from its first eviction until it is freed
  // Follows the copy of the restore of `ready` (recorded when it was decided, if `ahead`; else
  // once the mover submitted it).
  CUevent ready_event = nullptr;
  // Device handshake: its D2H and H2D as graphs (transform/copy_graph.h), made at its first
  // eviction while it has pages; null until then.
  CUgraphExec d2h_exec = nullptr, h2d_exec = nullptr;
  uint64_t lru = 0;
  // Evictions decided, and done (unmapped, given up or skipped): a restore waits for those
  // decided before it, and only those (an eviction decided later follows it in the queue).
  uint64_t evictions_decided = 0, evictions_done = 0;
  Flag flag;
  std::vector<std::pair<StreamKey, uint32_t>> waited;  // streams that waited for `ready`
  std::vector<Mark> marks;  // its last use on each stream since it got pages
  // A restore for a capture's copy that the mover gave up (no pages, nothing to give any back):
  // why, for back_for_capture to say; empty otherwise.
  std::string no_pages;
  int device = 0;
  uint32_t ready = 0;         // the flag's value once its pages and data are in place
  uint32_t mapped_ready = 0;  // the restore whose pages are mapped now (its data may still move)
  uint32_t landed = 0;        // the last restore whose pages and data are in place (host's view)
  int pins = 0;
  int busy = 0;  // workers' driver calls on its pages (or its VA) in flight
  Where where = Where::unbacked;
  bool has_data = false;      // used since it got pages: an eviction copies it out
  bool host_pending = false;  // a thread is allocating its pinned copy (ensure_host_copies)
  bool submitted = true;
  bool mapped = false;     // pages mapped now (what the workers did, not what was decided)
  bool unmapping = false;  // the unmapper is unmapping it
  bool forgotten = false;
  bool evicted_once = false;
  bool restored_once = false;  // `ready` names a restore of this slot's (else the flag's past)
  bool ahead = false;  // device handshake: the restore of `ready` was enqueued when decided, and
                       // launches wait for its ready_event on the device, not for the mover
  bool used_since_restore = false;  // work using it was enqueued after its latest restore
  // Device handshake: the D2H of its latest eviction was enqueued when decided (evict_ahead). A
  // restore decided while an eviction that took the host path is pending takes the host path
  // too: that eviction may be called off before its copy (reclaim), and an H2D enqueued ahead
  // would then copy a stale host copy over the slot's live data.
  bool eviction_ahead = false;
  uint64_t eviction_sequence = 0;  // its latest eviction's place among the device's decisions
  // Device handshake: the flag value the restore stream waits for, for this slot's latest restore
  // that went ahead (a later one may have taken the host path).
  uint32_t ahead_ready = 0;
};

enum class JobKind { restore, evict };

struct Job {
  JobKind kind = JobKind::restore;
  uint64_t slot = 0;
  uint32_t ready = 0;  // restore: the flag value it publishes; evict: the restore to follow
  uint64_t after_evictions = 0;  // restore: the slot's evictions decided before it
  bool after_restore = false;    // evict: waits for the restore `ready` to have landed
  bool with_data = false;        // restore: copy the host copy back; evict: copy out first
  uint64_t hand_to = 0;          // evict: the slot (id) of its size whose map takes its handle
  std::vector<MarkRef> waits;    // evict: the marks of its last uses (recorded)
  std::vector<Mark> last_uses;   // evict: the same with their streams (a reclaim gives them back)
  const char* cause = "";
  uint64_t decided_ns = 0;
  // Device handshake: enqueued when decided. A restore: the wait for the flag, then its H2D (the
  // mover only maps and writes the flag). An eviction: its D2H between `start` and `done`.
  bool ahead = false;
  CUevent start = nullptr, done = nullptr;
  CUstream out = nullptr;  // evict: the stream its D2H went on
  uint64_t sequence = 0;   // restore: its place among the device's decisions (Device::decisions)
  Where before = Where::offloaded;  // restore: where the slot goes back if it is given up
  bool for_capture = false;         // restore: for a copy recorded into a capture (may be given up)
};

struct Unmap {
  uint64_t slot = 0;
  bool copied = false;   // has data: copied out before the unmap
  bool may_keep = true;  // false for the program's out-of-memory: its pages go back to the device
  bool reclaimable = true;  // false for the program's out-of-memory and a rule's explicit offload
  uint64_t hand_to = 0;     // a slot of its size whose map is to take the handle (0: none)
  uint64_t bytes = 0;
  uint64_t queued_ns = 0;
  // What the copy waits for, checked on the host: the slot's last uses, and the restore it
  // follows (`restore`, landed once the slot's `landed` reaches it).
  std::vector<MarkRef> waits;
  std::vector<Mark> last_uses;  // the same marks with their streams
  bool after_restore = false;
  uint32_t restore = 0;
  // Once the dependencies are done: the D2H between two timing events, on the offload stream.
  bool submitted = false;
  bool failed = false;  // the copy could not be enqueued: the slot stays resident
  CUevent start = nullptr, done = nullptr;
  CUstream out = nullptr;      // the stream of its copy: the offload stream unless enqueued ahead
  uint64_t waiting_since = 0;  // the unmapper began to wait for it (residency.wait_limit)
};

// Which of an eviction's dependencies had not completed when its wait ran out.
std::string stuck_part(const Driver& driver, const Unmap& unmap) {
  if (unmap.submitted) {
    // Whether the copy began tells a stream held back before it (the event before the copy has
    // not completed: something ahead of it on the offload stream, or the device's queues) from a
    // copy that began and does not end.
    const CUresult started =
        unmap.start != nullptr ? driver.cuEventQuery(unmap.start) : CUDA_SUCCESS;
    return std::string("; its D2H copy did not complete (") +
           (started == CUDA_SUCCESS ? "it began"
            : started == CUDA_ERROR_NOT_READY
                ? "it never began: the event before it on the offload "
                  "stream has not completed"
                : "the event before it: " + cuda_error_name(started)) +
           ")";
  }
  size_t pending = 0;
  for (const MarkRef& mark : unmap.waits) {
    pending += !mark->complete(driver);
  }
  std::string parts;
  if (pending > 0) {
    parts += "; " + std::to_string(pending) + " of its " + std::to_string(unmap.waits.size()) +
             " last uses (one per stream) did not complete";
  }
  return parts.empty() ? "; the restore it follows did not land" : parts;
}

// An H2D copy in flight, timed on the device; the completion thread reads it.
struct Copied {
  uint64_t slot = 0;
  CUdeviceptr va = 0;
  uint64_t bytes = 0;
  CUevent start = nullptr, end = nullptr;
  uint64_t queued_ns = 0;
  uint32_t ready = 0;  // the restore it carries (Entry::landed once it is done)
  // Device handshake: the copy waits on the device until `flag` reaches `ready` (the watchdog
  // bounds that wait); only then does residency.wait_limit run for the copy itself.
  Flag flag;
  bool ahead = false;
};

// Where the restore that a device's mover carries out stands, for the watchdog's message and the
// death dump: a stalled restore says why. Kept as facts, said only when asked (describe()).
struct MoverState {
  bool known = false;     // a restore under way has been looked at
  bool mapping = false;   // its pages are being mapped (else it waits for room)
  uint64_t physical = 0;  // what slots held then, of `budget`
  uint64_t budget = 0;
  uint64_t pages = 0;  // what it maps
  int unmaps_in_flight = 0;
  bool none_before = false;    // no eviction decided before it is on its way
  bool relief_failed = false;  // the last relieve() found nothing to set going
  int attempt = 0;
  std::string failure;  // the last map's failure
  std::string describe() const;
};

std::string MoverState::describe() const {
  if (!known) return std::string();
  return (mapping ? std::string("mapping its pages")
                  : "waiting for room: " + byte_size(physical) + " held of the budget's " +
                        byte_size(budget) + ", " + byte_size(pages) + " more; " +
                        std::to_string(unmaps_in_flight) + " evictions in flight, " +
                        (none_before ? "none" : "some") + " decided before it, the last relief " +
                        (relief_failed ? "found nothing" : "set one going")) +
         ", try " + std::to_string(attempt + 1) +
         (failure.empty() ? std::string() : "; the last map failed: " + failure);
}

struct Device {
  int ordinal = 0;
  CUcontext context = nullptr;
  CUstream offload = nullptr, restore = nullptr;
  // Device handshake: the copies enqueued when decided, on streams of their own. Only these wait
  // on the device (restores for their flags, evictions for their slots' last uses); the host
  // path's copies on the two above are never queued behind such a wait. Restores wait in the
  // mover's order, on one stream. An eviction's D2H goes on an idle stream of `ahead_out`: one
  // whose last uses have not completed would otherwise hold back the evictions decided after it,
  // which a restore waiting for room may need (the stress suite deadlocked so).
  std::vector<CUstream> ahead_out;
  // The latest eviction enqueued ahead: its stream and what its D2H waits for. One decided next
  // with the same waits goes behind it on that stream, so that their copies follow each other on
  // the link rather than share it and all end late (the first room comes a copy sooner). Under
  // submit_.
  CUstream last_out = nullptr;
  std::vector<MarkRef> last_out_waits;
  CUstream ahead_in = nullptr;
  bool device_handshake = false;
  std::vector<Flag> free_flags;
  // The last failure to pin a chunk of flags (under mutex_): while recent, take_flag fails at
  // once, not after its retries, and can_hold_slots refuses the device's slots before they are
  // made.
  RecentFailure flags_failed;
  uint64_t committed = 0;       // host order: pages of resident slots (restores queued included),
                                // and what lent slots may hold (`lent`)
  uint64_t lent = 0;            // reserved for the executors of rewritten graphs (plan/inside.h)
  uint64_t parked = 0;          // of their reserves, not counted while they have no launch queued
  uint64_t executors_hold = 0;  // what those executors have mapped now, of `lent` (slot_room)
  uint64_t largest_launch = 0;  // the most bytes of slots one acquire() has needed (others())
  uint64_t physical = 0;        // pages mapped now
  uint64_t limit = 0;         // what the device could give slots, last read (free + what they hold)
  bool room_read = false;     // limit was read from the device (a size budget is bounded by it)
  uint64_t room_read_ns = 0;  // when (a size budget reads it again only now and then)
  uint64_t reserve = 0;       // auto: the headroom evictions leave the program
  uint64_t total = 0;         // the device's memory
  std::deque<Job> jobs;
  std::deque<Unmap> unmaps;
  // Restore copies in flight, each stream's in its order: the host path's on `restore`, the
  // device handshake's on `ahead_in` (where one may wait for room while the other lands).
  std::deque<Copied> copies, ahead_copies;
  std::condition_variable jobs_cv, unmaps_cv, copies_cv;
  bool retired = false;      // its start failed after its threads began: they return (under mutex_)
  int h2d_in_flight = 0;     // restore copies submitted and not yet seen complete
  int unmaps_in_flight = 0;  // evictions submitted whose unmap is not done yet
  uint64_t moving = 0;       // the slot whose restore the mover carries out now (0: none)
  MoverState mover_state;    // where that restore stands
  uint64_t unmapping = 0;    // the slot whose eviction the unmapper waits for (0: none)
  std::vector<CUevent> spare_events;  // timing events for evictions, reused
  // Evictions whose D2H is enqueued, with their timing events, until the events go back to the
  // spares (d2h_running: the unmapper holds the copies it waits for in a list of its own).
  struct CopyOut {
    CUevent start = nullptr, done = nullptr;
    uint64_t bytes = 0;
  };
  std::vector<CopyOut> copies_out;
  uint64_t decisions = 0;  // evictions and restores decided (under the state lock)
  // residency.d2h_gate: a flag every eviction's D2H enqueued ahead waits on to be 0, raised and
  // lowered through Residency::gates_ (plan/d2h_gate.h; see do_restore).
  Flag gate;
};

// An eviction's timing events go back to the device's spares (under the state lock). One that
// copied nothing had none.
void give_back_events_locked(Device& d, const Unmap& unmap) {
  if (unmap.start != nullptr) d.spare_events.push_back(unmap.start);
  if (unmap.done != nullptr) d.spare_events.push_back(unmap.done);
  if (unmap.start == nullptr) return;
  d.copies_out.erase(
      std::remove_if(d.copies_out.begin(), d.copies_out.end(),
                     [&](const Device::CopyOut& c) { return c.start == unmap.start; }),
      d.copies_out.end());
}

// What one decision asks the application's thread to do once the state lock is dropped.
struct Actions {
  int device = -1;
  std::vector<Job> jobs;                 // in decision order
  std::vector<std::vector<Mark>> marks;  // per job: the marks an eviction waits for
  std::vector<Entry*> event_waits;       // device handshake: the stream waits for ready_event
  std::vector<Entry*> host_waits;        // host handshake: wait for their submission
};

// =============================================================================================
// The residency
// =============================================================================================

class Residency {
 public:
  void configure(const Settings& s) {
    std::lock_guard<std::mutex> lock(mutex_);
    settings_ = s;
  }
  bool can_hold_slots(int ordinal, std::string* why, NoSlots* cause);
  void adopt(Slot* slot, bool backed);
  void forget(Slot* slot);
  CUresult acquire(const std::vector<Slot*>& slots, CUstream stream, const std::string& what,
                   Acquired* acquired, std::string* message, Checked checked,
                   const EagerShape* shape);
  void used(const Acquired& acquired);
  bool lend(const std::vector<Slot*>& slots, uint64_t reserve, std::vector<Lent>* lent);
  void take_back(int device, const std::vector<Slot*>& slots, uint64_t reserve);
  void lend_more(int ordinal, uint64_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Device& d = device_locked(ordinal);
      d.committed += bytes;
      d.physical += bytes;
      d.lent += bytes;
    }
    changed_.notify_all();
  }
  void park(int ordinal, uint64_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = devices_.find(ordinal);
      if (it == devices_.end()) return;
      Device& d = *it->second;
      bytes = std::min({bytes, d.lent, d.committed, d.physical});
      d.committed -= bytes;
      d.physical -= bytes;
      d.lent -= bytes;
      d.parked += bytes;
    }
    changed_.notify_all();  // launches waiting for room look again
  }
  void unpark(int ordinal, uint64_t bytes, bool make_room);
  void executors_hold(int ordinal, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = devices_.find(ordinal); it != devices_.end()) it->second->executors_hold = bytes;
  }
  void take_back_offloaded(Slot* slot, void* host);
  void with_pages(const std::vector<Slot*>& slots, const std::function<void()>& fn);
  void wait_settled(const std::vector<Slot*>& slots);
  // With mutex_ held in `lock`: until no eviction or restore of `slots` is under way.
  void wait_settled_locked(const std::vector<Slot*>& slots, std::unique_lock<std::mutex>& lock);
  std::vector<Slot*> evict(const std::vector<Slot*>& slots, const char* cause);
  void prefetch(const std::vector<Slot*>& slots);
  void set_schedule(const std::vector<std::vector<Slot*>>& uses);
  void at_position(int position) {
    std::lock_guard<std::mutex> lock(mutex_);
    position_ = position;
  }
  uint64_t make_room(int ordinal, uint64_t bytes);
  bool evictable_during_capture_locked(const Entry& e) const;
  static bool marks_closed(const Entry& e) {
    return std::all_of(e.marks.begin(), e.marks.end(),
                       [](const Mark& m) { return m.record->closed(); });
  }
  uint64_t make_room_once(int ordinal, uint64_t bytes, bool* busy_slots);
  Budget budget(int ordinal) {
    std::lock_guard<std::mutex> submit(submit_);
    return budget_of(device(ordinal));
  }
  // budget() of each device started so far (those that hold slots or held them), none started
  // here.
  std::map<int, Budget> started_budgets() {
    std::lock_guard<std::mutex> submit(submit_);  // devices_ grows under it: none added meanwhile
    std::vector<Device*> started;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& [ordinal, d] : devices_) started.push_back(d.get());
    }
    std::map<int, Budget> budgets;
    for (Device* d : started) budgets[d->ordinal] = budget_of(*d);
    return budgets;
  }
  std::optional<uint64_t> device_room(int ordinal);
  std::optional<uint64_t> slot_room(Device& d);
  void learn_held_back(Device& d, uint64_t pages, uint64_t mark, uint64_t free_before);
  bool room_stale_locked(const Device& d, uint64_t pages) const;
  Others others(int ordinal) {
    std::lock_guard<std::mutex> submit(submit_);
    Device& d = device(ordinal);
    std::lock_guard<std::mutex> lock(mutex_);
    return {d.lent + d.parked, d.largest_launch};
  }
  CUresult back_for_capture(const std::vector<Slot*>& slots, std::vector<Slot*>* pinned,
                            std::string* message);
  void close_uses(CUstream stream) {
    std::lock_guard<std::mutex> submit(submit_);
    close_mark(key_of(stream));
  }
  Stats stats();
  bool parks_streams() const { return parks_.load(std::memory_order_acquire); }
  // `limit_ns` (0: residency.wait_limit) bounds the wait.
  CUresult settle(const std::string& what, std::string* why, bool hold, uint64_t limit_ns = 0);
  void unquiet() {
    std::lock_guard<std::mutex> lock(mutex_);
    --settling_;
  }

 private:
  // *_locked: under mutex_, no driver calls.
  Device& device_locked(int ordinal);
  // No eviction or restore of it under way: never used, resident with its restore submitted and
  // its data landed, or offloaded with its evictions done.
  static bool settled(const Entry& e) {
    return e.where == Where::unbacked ||
           (e.where == Where::resident && e.mapped && e.submitted &&
            (!e.restored_once || static_cast<int32_t>(e.landed - e.ready) >= 0)) ||
           (e.where == Where::offloaded && e.evictions_done == e.evictions_decided && !e.mapped);
  }
  Entry* find_locked(const Slot* slot) {
    auto it = entries_.find(slot);
    return it == entries_.end() ? nullptr : &it->second;
  }
  Entry* by_id_locked(uint64_t id) {
    auto it = ids_.find(id);
    return it == ids_.end() ? nullptr : find_locked(it->second);
  }
  // The user's, or auto: 1/32 of the device, at most 512 MiB, and at most half of what slots could
  // have now (d.limit). On a device the program has all but filled, a fixed share of the GPU left
  // slots nothing: on an H100 left 100 MiB, the auto budget's target was 0, the whole-step
  // graph's windows were refused and its launch with them (bench/results/
  // capacity_edges_session51_h100.md), where a 12 MiB budget ran it.
  uint64_t reserve_locked(const Device& d) const {
    if (settings_.reserve_bytes != 0) return settings_.reserve_bytes;
    return std::min({kAutoReserveMax, d.total / 32, d.limit / 2});
  }
  // "the residency budget of 4 MiB (residency.budget)", or the auto budget's kind; and the fix
  // that applies to it, for a refusal's message.
  std::string budget_named_locked(const Budget& budget) const {
    if (budget.device_bound) {
      return "what the device can give slots, " + byte_size(budget.limit) +
             " (its free memory less what no allocation gets, what slots hold and kept handles; "
             "residency.budget allows " +
             byte_size(settings_.budget_bytes) + ")";
    }
    return "the residency budget of " + byte_size(budget.limit) +
           (settings_.budget_bytes != 0 ? " (residency.budget)"
                                        : " (what the device has free with every slot evicted)");
  }
  // A size budget the device bounds gets the auto budget's fix: raising it changes nothing.
  // Where every buffer the selection's size allows is a slot already, smaller ones are what is
  // left to evict.
  std::string budget_fix_locked(const Budget& budget) const {
    if (settings_.budget_bytes != 0 && !budget.device_bound) {
      return "raise residency.budget, or free device memory";
    }
    if (settings_.captured_only) {
      return "free device memory, or let more of the program's buffers be slots "
             "(selection.captured_only: false) so that they can be evicted";
    }
    const std::string otherwise =
        "the launch itself must need less at once (selection.captured_only is false already)";
    if (settings_.min_bytes == 0) {
      return "free device memory; every buffer the selection takes is a slot already, so " +
             otherwise;
    }
    return "free device memory, or lower selection.min_bytes (now " +
           byte_size(settings_.min_bytes) +
           ") so that smaller buffers can be slots and be evicted; with every buffer the "
           "selection takes a slot, " +
           otherwise;
  }
  // With submit_ held: d's budget, its room read now.
  Budget budget_of(Device& d) {
    refresh_budget(d);
    std::lock_guard<std::mutex> lock(mutex_);
    return budget_locked(d);
  }
  // A size budget is bounded by what the device could give slots when last read (d.limit): a
  // residency.budget of 32 MiB on a device the program had left 24 MiB planned and decided
  // restores into pages the device would not give, and each launch that needed one waited
  // residency.wait_limit before it failed.
  Budget budget_locked(const Device& d) const {
    if (settings_.budget_bytes != 0) {
      // Bounded, it is the auto budget: the reserve below the room too. Aimed at the room
      // itself, a whole-step graph's windows left the driver's own allocations nothing, and on an
      // H100 left 100 MiB its launches waited past residency.wait_limit where the auto budget ran
      // (bench/results/gpu_checks_session55_fa43d4b_h100.md).
      if (d.room_read && d.limit < settings_.budget_bytes) {
        return {d.limit, d.limit > d.reserve ? d.limit - d.reserve : 0, true};
      }
      return {settings_.budget_bytes, settings_.budget_bytes, false};
    }
    return {d.limit, d.limit > d.reserve ? d.limit - d.reserve : 0, false};
  }
  int64_t distance_locked(const Entry& e) const;
  bool parked_locked(const StreamKey& key) const;
  bool any_parked_locked() const;  // whether any stream is parked (forgets those that landed)
  bool held_by_parked_stream_locked(const Entry& e) const;
  bool host_path_evictions_pending_locked(const Device& d) const;
  // Whether an eviction decided before the `sequence`-th decision is still pending.
  bool evictions_before_locked(const Device& d, uint64_t sequence) const;
  // Device handshake: an eviction of `e` decided now can enqueue its D2H at once (evict_ahead),
  // on the device behind its last uses and its latest restore: it has no data, or its copy
  // graphs, or the pages to make them with; and its latest restore has landed or work that uses
  // the slot was enqueued after it. Other slots are not chosen:
  // - a copy the host path enqueues later could queue behind a stream parked for room that this
  //   very eviction is to give;
  // - a restore that nothing used yet would be undone before it lands. Its room was counted when
  //   it was decided, and this eviction would give that room to later restores; it would then
  //   wait for room that only evictions decided after it make (the stress suite deadlocked so).
  static bool evicts_ahead_locked(const Entry& e) {
    const bool restore_done =
        !e.restored_once || e.used_since_restore || static_cast<int32_t>(e.landed - e.ready) >= 0;
    return restore_done && (!e.has_data || e.d2h_exec != nullptr ||
                            (e.mapped && !e.unmapping && e.evictions_done == e.evictions_decided));
  }
  // `recorded_only`: only slots whose last uses are closed by a recorded mark already, so that
  // evicting them records nothing on any stream (one may be capturing).
  // `held_back`, where given: the pages of resident slots (other than `keep`) passed over for a
  // while only (pinned by a launch being prepared, used while a capture is open, behind a parked
  // stream, or not yet able to evict ahead). Counted in the same pass as the choice, so that a
  // caller deciding whether waiting can help sees the state the choice saw: a capture that closed
  // between two passes once made a launch refuse with nothing held back (TSan's stress run).
  std::vector<Entry*> victims_locked(const Device& d, uint64_t pages,
                                     const std::vector<Entry*>& keep, bool recorded_only = false,
                                     uint64_t* held_back = nullptr) const;
  // Whether `e` cannot be evicted for a while only: pinned by a launch being prepared, used
  // behind a parked stream, or not yet able to evict ahead (a restore still landing). Victims
  // pass such slots over.
  bool settling_locked(const Device& d, const Entry& e) const;
  // The pages of resident slots (other than `keep`) whose last uses are closed by recorded marks
  // but that are settling.
  uint64_t settling_pages_locked(const Device& d, const std::vector<Entry*>& keep) const;
  void evict_locked(Entry& e, const char* cause, Actions* out);
  // Victims chosen before the lock was dropped (for their host copies) that were freed, left the
  // device, or were pinned by a launch meanwhile leave the list.
  void drop_unevictable_locked(std::vector<Entry*>* victims) const {
    victims->erase(std::remove_if(victims->begin(), victims->end(),
                                  [this](Entry* v) {
                                    return entries_.count(v->slot) == 0 ||
                                           v->where != Where::resident || v->pins != 0;
                                  }),
                   victims->end());
  }
  void restore_locked(Entry& e, const char* cause, Actions* out);
  // Evicts `victims` to make room for `wanted`: a victim the size of a wanted slot that needs
  // pages hands its handle to that slot's restore (one each).
  void evict_handing_off_locked(const std::vector<Entry*>& victims,
                                const std::vector<Entry*>& wanted, const char* cause, Actions* out);
  void wait_for_locked(Entry& e, const StreamKey& stream, Actions* out);

  // On an application thread, under submit_ and not mutex_. A device is started at its first
  // use; where its copy streams cannot be made, try_device() says why and gives none, and
  // device() ends the process (reached only for devices that have slots: can_hold_slots).
  Device& device(int ordinal);
  Device* try_device(int ordinal, std::string* why);
  CUresult make_copy_streams(Device& d);
  void destroy_copy_streams(Device& d);
  void start_device(Device& d);
  class GateHold;
  uint64_t d2h_running(Device& d);
  bool raise_gate(Device& d, uint64_t d2h_bytes);
  // A flag from the device's free ones, pinning a chunk of them when none is left. Throws when
  // the chunk cannot be pinned; the second form says why instead.
  Flag take_flag(Device& d);
  bool take_flag(Device& d, Flag* flag, std::string* why);
  StreamKey key_of(CUstream stream);
  Marks& marks_of(const StreamKey& key);
  void close_mark(const StreamKey& key);
  std::optional<uint64_t> refresh_budget(Device& d);
  // Also from the mover (evict_idle): no application thread lock is needed.
  bool ensure_host_copies(const std::vector<Entry*>& victims, std::string* why);
  bool ensure_host_copies(const std::vector<uint64_t>& ids, std::string* why);
  bool finish_host_copy(uint64_t id, uint64_t bytes, void* host);
  // `stream`: the launching stream to make wait, if `waits`.
  void carry_out(Actions& actions, bool waits, CUstream stream);
  bool evict_ahead(Device& d, Job& job);
  CUstream idle_out_stream(Device& d);
  CUresult make_handshake_streams(Device& d);
  // Uploads them on the two streams given.
  // Copy graphs are first-time work (see make_graphs_first): made only while no stream is parked.
  void make_graphs_first(Device& d, const std::vector<Job>& jobs);
  // Holds the quiet (restores park nothing) when no stream is parked now; false otherwise.
  bool try_quiet();
  bool make_copy_graphs(Device& d, uint64_t id, Slot* slot, void* host, CUstream d2h_upload,
                        CUstream h2d_upload);
  void restore_ahead(Device& d, Job& job);
  bool wait_submitted(const std::vector<Entry*>& entries, bool* blocked, std::string* why);
  // `blocked`: it had to wait.
  bool wait_mapped(const std::vector<Slot*>& slots, std::string* why, bool* blocked);
  bool mapped_now(const std::vector<Slot*>& slots);
  // The slot's pages of its latest restore are mapped (its data may still be on its way), or it
  // is not residency's (any more).
  bool in_place_locked(const Slot* slot) {
    const Entry* e = find_locked(slot);
    return e == nullptr || e->forgotten ||
           (e->mapped &&
            (!e->restored_once || static_cast<int32_t>(e->mapped_ready - e->ready) >= 0));
  }
  // Device handshake: the graph made for `shape` on `d`, if `stream` is of that device
  // (EagerShape); make_eager_graph makes it while its pages are mapped.
  CUgraphExec eager_graph(const Device& d, const EagerShape& shape, CUstream stream);
  void make_eager_graph(Device& d, const EagerShape& shape, CUstream stream);
  void used_submitted(const Acquired& acquired);

  // Workers.
  void run_mover(Device& d);
  void run_unmapper(Device& d);
  void run_completions(Device& d, std::deque<Copied>& copies, const char* name);
  CUevent spare_event(Device& d);
  void do_restore(Device& d, const Job& job);
  bool give_up_for_capture(Device& d, const Job& job, CUresult failed_with,
                           const std::string& failure);
  void do_evict(Device& d, const Job& job);
  bool dependencies_done(const Unmap& unmap);
  bool restore_landed(const Unmap& unmap);
  // The eviction is called off when a restore of the slot was decided after it (and no eviction
  // since), before its pages went: see run_unmapper. `copied`: its D2H ran. True when it was.
  // `va`, when not null, gets the slot's address.
  bool reclaim(Device& d, const Unmap& unmap, bool copied, CUdeviceptr* va = nullptr);
  bool submit_copy(Device& d, Unmap& unmap);
  bool relieve(Device& d, uint64_t restoring);
  bool evict_idle(Device& d, uint64_t restoring);
  // CUDA_SUCCESS, the driver's error, or (with *timed_out set) CUDA_ERROR_LAUNCH_TIMEOUT once
  // residency.wait_limit has passed.
  CUresult wait_event(CUevent event, bool* timed_out);
  // What a failed wait_event says about `subject`.
  std::string wait_failure(CUresult rc, bool timed_out, const std::string& subject);
  void record_or_die(const Driver& driver, CUevent event, CUstream stream,
                     const std::string& subject);
  [[noreturn]] void die(const std::string& message);
  // Device handshake: ends the process when a stream has waited on the device for a restore's flag
  // longer than residency.wait_limit, whatever holds the restore back (a copy queued behind the
  // parked stream, a worker stuck in a driver call) and whatever the application's thread does
  // meanwhile (it may be blocked in the driver, synchronizing that stream).
  // The watchdog, started with the first device that takes the device handshake: it ends the
  // process with a named error when a stream waits on the device past residency.wait_limit.
  bool start_watchdog(std::string* why);
  void run_watchdog();

  // Gives back, at the end of a scope, a busy count taken on slot `id` under mutex_ (0: none).
  class BusyHold {
   public:
    BusyHold(Residency& r, uint64_t id) : r_(r), id_(id) {}
    BusyHold(const BusyHold&) = delete;
    BusyHold& operator=(const BusyHold&) = delete;
    ~BusyHold() {
      if (id_ == 0) return;
      {
        std::lock_guard<std::mutex> lock(r_.mutex_);
        if (Entry* e = r_.by_id_locked(id_)) --e->busy;
      }
      r_.changed_.notify_all();
    }

   private:
    Residency& r_;
    uint64_t id_;
  };

  std::mutex submit_;  // one application thread decides and enqueues at a time
  std::mutex mutex_;   // the state below; never held across a driver call
  std::condition_variable changed_;
  Settings settings_;
  std::unordered_map<const Slot*, Entry> entries_;
  std::unordered_map<uint64_t, const Slot*> ids_;
  std::map<int, std::unique_ptr<Device>> devices_;  // created under submit_, read under mutex_
  // Devices whose start failed (context, copy streams, threads): tried again once the failure
  // is no longer recent.
  std::map<int, RecentFailure> unusable_;
  std::atomic<uint64_t> started_{0};  // bit N: device N (< 64) is in devices_
  // Bit N: device N (< 64) failed to pin flags (Device::flags_failed), so its started bit alone
  // does not answer can_hold_slots. Cleared there once the failure is no longer recent.
  std::atomic<uint64_t> flags_refused_{0};
  std::unordered_map<StreamKey, Marks, StreamKeyHash> marks_;  // under submit_
  // Device handshake: the flag waits enqueued on each stream whose restores have not landed yet
  // (under mutex_). Work enqueued there after such a wait cannot complete before that restore.
  mutable std::unordered_map<StreamKey, std::vector<FlagWait>, StreamKeyHash> parked_;
  // Threads in settle(), waiting for no stream to be parked: meanwhile restores park nothing new
  // (they take the host path), so that the parks drain even while other threads keep launching.
  int settling_ = 0;
  D2hGates gates_;         // residency.d2h_gate (raise_gate)
  bool watching_ = false;  // the watchdog runs (start_watchdog)
  std::unordered_map<const Slot*, std::vector<int>> schedule_;  // positions of each slot's uses
  int period_ = 0, position_ = 0;
  uint64_t tick_ = 0;
  Stats stats_;
  bool said_fallback_ = false;
  bool said_graphs_ = false;
  bool said_overshoot_ = false;
  // Device handshake: eager copies and memsets made as graphs (EagerShape), per device; at most
  // kEagerGraphs of them.
  std::map<std::pair<int, EagerShape>, CUgraphExec> eager_graphs_;
  // Settles that ran out of time before such a graph was made (kEagerTries), by the same key.
  std::map<std::pair<int, EagerShape>, int> eager_tries_;

 public:
  std::atomic<bool> parks_{false};  // some device uses the device handshake
};

Residency& the() {
  static auto* r = new Residency;  // leaked: workers and hooks run until the process exits
  return *r;
}

const Driver& drv() { return engine().driver(); }

// A driver call on the slot path, tried again with backoff when it fails.
template <class Call>
CUresult with_retries(Call call) {
  CUresult rc = CUDA_SUCCESS;
  auto pause = std::chrono::milliseconds(1);
  for (int attempt = 0; attempt < kRetries; ++attempt) {
    rc = call();
    if (rc == CUDA_SUCCESS) return rc;
    std::this_thread::sleep_for(pause);
    pause *= 4;
  }
  return rc;
}

// =============================================================================================
// Devices (created on an application thread, under submit_, at a device's first slot)
// =============================================================================================

Device& Residency::device(int ordinal) {
  std::string why;
  Device* d = try_device(ordinal, &why);
  if (d == nullptr) die(why);
  return *d;
}

Device* Residency::try_device(int ordinal, std::string* why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = devices_.find(ordinal);
    if (it != devices_.end()) return it->second.get();
    if (auto failed = unusable_.find(ordinal);
        failed != unusable_.end() && failed->second.recent()) {
      *why = failed->second.why;
      return nullptr;
    }
  }
  auto d = std::make_unique<Device>();
  d->ordinal = ordinal;
  const auto unusable = [&](const std::string& reason) {
    *why = reason;
    std::lock_guard<std::mutex> lock(mutex_);
    unusable_[ordinal].note(reason);
  };
  // The engine's first look at the device may fail too (cuDeviceGet or the primary context after a
  // sticky fault): the device gets no slots for now, as without streams. Thrown, it ended the
  // process from the program's cudaMalloc (SIGABRT; the fault matrix, a device fault before the
  // first slot).
  try {
    d->context = engine().context(ordinal);
  } catch (const Error& error) {
    unusable(error.what());
    return nullptr;
  }
  if (const CUresult rc = make_copy_streams(*d); rc != CUDA_SUCCESS) {
    unusable(cuda_failure("cuStreamCreate", rc,
                          "vaswap's copy streams on device " + std::to_string(ordinal)));
    return nullptr;
  }
  // Its threads, before it is published: each waits for work that only a published device gets.
  // One the system will not start (a thread limit) leaves the device without slots for now, as
  // streams that cannot be made do; those started before it return, and its streams go. Before,
  // std::system_error left the program's cudaMalloc and ended the process.
  Device* device = d.get();
  std::vector<std::thread> started;
  started.reserve(4);
  try {
    started.push_back(start_thread([this, device] { run_mover(*device); }));
    started.push_back(start_thread([this, device] { run_unmapper(*device); }));
    started.push_back(
        start_thread([this, device] { run_completions(*device, device->copies, "vaswap-cpl"); }));
    started.push_back(start_thread(
        [this, device] { run_completions(*device, device->ahead_copies, "vaswap-cpa"); }));
  } catch (const std::system_error& error) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      device->retired = true;
    }
    device->jobs_cv.notify_all();
    device->unmaps_cv.notify_all();
    device->copies_cv.notify_all();
    for (std::thread& thread : started) thread.join();
    destroy_copy_streams(*device);
    unusable("vaswap's threads for device " + std::to_string(ordinal) + " could not be started (" +
             error.what() + ")");
    return nullptr;
  }
  for (std::thread& thread : started) thread.detach();
  start_device(*d);
  std::lock_guard<std::mutex> lock(mutex_);
  unusable_.erase(ordinal);
  devices_[ordinal] = std::move(d);
  if (ordinal >= 0 && ordinal < 64) started_.fetch_or(uint64_t{1} << ordinal);
  return device;
}

// A device's first slot makes them. On a device the program has all but filled they may not fit:
// the device then gets no slots (can_hold_slots), and a stream made before the failure goes.
CUresult Residency::make_copy_streams(Device& d) {
  const Driver& driver = drv();
  ContextScope scope(driver, d.context);
  for (CUstream* stream : {&d.offload, &d.restore}) {
    const CUresult created =
        with_retries([&] { return driver.cuStreamCreate(stream, CU_STREAM_NON_BLOCKING); });
    if (created != CUDA_SUCCESS) {
      *stream = nullptr;  // not made
      destroy_copy_streams(d);
      return created;
    }
  }
  return CUDA_SUCCESS;
}

// Those of a device that does not start (make_copy_streams, try_device): nothing was enqueued
// on them.
void Residency::destroy_copy_streams(Device& d) {
  const Driver& driver = drv();
  ContextScope scope(driver, d.context);
  for (CUstream* stream : {&d.offload, &d.restore}) {
    if (*stream != nullptr) driver.cuStreamDestroy(*stream);
    *stream = nullptr;
  }
}

// Whether slots can be made on the device: its copy streams are made at the first one.
bool Residency::can_hold_slots(int ordinal, std::string* why, NoSlots* cause) {
  // Asked at every selected allocation: a started device answers without a lock, unless its
  // flags could not be pinned lately.
  const uint64_t bit = ordinal >= 0 && ordinal < 64 ? uint64_t{1} << ordinal : 0;
  if ((started_.load(std::memory_order_acquire) & bit) != 0 &&
      (flags_refused_.load(std::memory_order_acquire) & bit) == 0) {
    return true;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);  // not submit_: launches hold it to decide
    if (auto it = devices_.find(ordinal); it != devices_.end()) {
      // No flag for the slot's handshake without pinning more, and pinning failed a moment ago:
      // refused before the slot reserves its address (adopt would refuse it after).
      const Device& d = *it->second;
      if (!d.flags_failed.recent()) {
        flags_refused_.fetch_and(~bit);  // set again, under mutex_, by the next failure
        return true;
      }
      if (!d.free_flags.empty()) return true;  // one a freed slot gave back
      *why = d.flags_failed.why;
      if (cause != nullptr) *cause = NoSlots::flags;
      return false;
    }
  }
  std::lock_guard<std::mutex> submit(submit_);
  if (cause != nullptr) *cause = NoSlots::device;
  return try_device(ordinal, why) != nullptr;
}

Device& Residency::device_locked(int ordinal) { return *devices_.at(ordinal); }

void Residency::start_device(Device& d) {
  const Driver& driver = drv();
  ContextScope scope(driver, d.context);
  size_t free_bytes = 0, total_bytes = 0;
  const bool read = driver.cuMemGetInfo(&free_bytes, &total_bytes) == CUDA_SUCCESS;
  if (read) d.total = total_bytes;
  Settings s;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s = settings_;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // No slots yet: the device's room is what allocations can have of its free memory.
    d.limit = read ? engine().allocatable(d.ordinal, free_bytes) : 0;
    d.room_read = read;
    d.room_read_ns = trace::now_ns();
    d.reserve = reserve_locked(d);
  }
  // The device handshake unless the host one is asked for. It needs stream memory operations,
  // and is not used with one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1), where the restore
  // stream's wait for pages would hold every stream's later work behind it. The automatic choice
  // falls back to the host handshake there, and says so once.
  const char* connections = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  const bool one_queue = connections != nullptr && std::atoi(connections) == 1;
  std::string fallback;
  if (s.handshake == Handshake::host) {
    fallback = "residency.handshake is host";
  } else if (one_queue) {
    fallback =
        "CUDA_DEVICE_MAX_CONNECTIONS=1 (the restore stream's wait for pages would hold every "
        "stream's later work behind it)";
  } else if (Flag probe; !take_flag(d, &probe, &fallback)) {
    fallback = "its flags could not be pinned (" + fallback + ")";
  } else {
    CUresult rc = driver.cuStreamWriteValue32(d.restore, probe.device, 0, 0);
    // The probe's write must land before its flag serves a slot: a late write of 0 would undo a
    // restore's publication, and a stream would wait for it forever.
    if (rc == CUDA_SUCCESS) rc = driver.cuStreamSynchronize(d.restore);
    if (rc != CUDA_SUCCESS) {
      fallback = "stream memory operations are not available (cuStreamWriteValue32 gave " +
                 cuda_error_name(rc) + ")";
    } else if (std::string failed; !start_watchdog(&failed)) {
      // Nothing would bound a wait on the device that never ends.
      fallback = "vaswap's watchdog thread could not be started (" + failed + ")";
    } else if (const CUresult made = make_handshake_streams(d); made != CUDA_SUCCESS) {
      // A device the program has all but filled: the host handshake needs none of these streams.
      fallback = "vaswap's own streams for it could not be made (cuStreamCreate gave " +
                 cuda_error_name(made) + ")";
    } else {
      d.device_handshake = true;
      parks_.store(true, std::memory_order_release);
      // Without pinned memory for its flag the device has no gate: the program's copies to the
      // host then wait on the host for a parked stream, as with residency.d2h_gate off.
      if (s.d2h_gate) {
        if (std::string why; take_flag(d, &d.gate, &why)) {
          gates_.add(d.ordinal, d.gate.host);
        } else {
          log().warn("device {}: no gate for the program's copies to the host: {}", d.ordinal, why);
        }
      }
    }
    d.free_flags.push_back(probe);
  }
  if (!fallback.empty() && s.handshake == Handshake::device) {
    die("residency.handshake is device, but " + fallback);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (!fallback.empty() && s.handshake == Handshake::automatic && !said_fallback_) {
    said_fallback_ = true;
    log().warn(
        "device {}: the host handshake, because {}: a launch whose restores were not started "
        "early enough waits on the host for them to be submitted (docs/PLANNER.md, "
        "\"Handshakes\")",
        d.ordinal, fallback);
  }
  stats_.device_handshake = stats_.device_handshake || d.device_handshake;
  if (trace::enabled()) {
    trace::Record(trace::Event::residency)
        .add("device", d.ordinal)
        .add("budget", s.budget_bytes)
        .add("reserve", d.reserve)
        .add("total", d.total)
        .add("handshake", d.device_handshake ? "device" : "host")
        .add("d2h_gate", d.gate.host != nullptr)
        .add("why", fallback)
        .emit();
  }
}

// Every stream the device handshake uses, made before any stream is parked: on the H200 an
// application thread making an eviction stream while streams were parked stayed inside
// cuStreamCreate, holding the residency lock and a driver lock the mover's next call needed
// (bench/results/staged_h200.md run 25, first_launch_h200.md run 61; made up front, 48 of 48 runs
// passed, streams_first_h200.md). A stream made while one is parked returns at once in
// park_probe --create, so what held it is not established. On a failure none is kept.
CUresult Residency::make_handshake_streams(Device& d) {
  const Driver& driver = drv();
  CUresult rc =
      with_retries([&] { return driver.cuStreamCreate(&d.ahead_in, CU_STREAM_NON_BLOCKING); });
  while (rc == CUDA_SUCCESS && d.ahead_out.size() < kAheadStreams) {
    CUstream out = nullptr;
    rc = with_retries([&] { return driver.cuStreamCreate(&out, CU_STREAM_NON_BLOCKING); });
    if (rc == CUDA_SUCCESS) d.ahead_out.push_back(out);
  }
  if (rc != CUDA_SUCCESS) {
    if (d.ahead_in != nullptr) driver.cuStreamDestroy(d.ahead_in);
    for (CUstream out : d.ahead_out) driver.cuStreamDestroy(out);
    d.ahead_in = nullptr;
    d.ahead_out.clear();
  }
  return rc;
}

bool Residency::take_flag(Device& d, Flag* flag, std::string* why) {
  try {
    *flag = take_flag(d);
    return true;
  } catch (const Error& error) {
    *why = error.what();
    return false;
  }
}

Flag Residency::take_flag(Device& d) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!d.free_flags.empty()) {
      const Flag flag = d.free_flags.back();
      d.free_flags.pop_back();
      return flag;
    }
    if (d.flags_failed.recent()) {
      fail_driver(d.flags_failed.rc, d.flags_failed.why, "cuMemHostAlloc");
    }
  }
  const Driver& driver = drv();
  ContextScope scope(driver, d.context);
  void* host = nullptr;
  const size_t bytes = kFlagsPerChunk * sizeof(uint32_t);
  const RelaxedCapture relaxed(driver);  // a restore decided while the thread captures
  const CUresult rc = with_retries([&] {
    return driver.cuMemHostAlloc(&host, bytes,
                                 CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
  });
  if (rc != CUDA_SUCCESS) {
    // Thrown, not fatal: it comes from the program's cudaMalloc (a slot's first flag), which then
    // gets its memory without a slot, or from a device's start, which then takes the host
    // handshake. Pinned memory can run out on a host the program's own pinned buffers fill.
    const std::string message =
        cuda_failure("cuMemHostAlloc", rc,
                     "vaswap's handshake flags on device " + std::to_string(d.ordinal)) +
        "; free pinned host memory";
    {
      std::lock_guard<std::mutex> lock(mutex_);
      d.flags_failed.note(message, rc);
      if (d.ordinal >= 0 && d.ordinal < 64) flags_refused_.fetch_or(uint64_t{1} << d.ordinal);
    }
    fail_driver(rc, message, "cuMemHostAlloc");
  }
  std::memset(host, 0, bytes);
  CUdeviceptr base = 0;
  if (driver.cuMemHostGetDevicePointer(&base, host, 0) != CUDA_SUCCESS) {
    base = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(host));  // unified addressing
  }
  auto* words = static_cast<uint32_t*>(host);
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = kFlagsPerChunk; i-- > 1;) {
    d.free_flags.push_back(Flag{words + i, base + i * sizeof(uint32_t)});
  }
  return Flag{words, base};
}

// =============================================================================================
// Streams and marks (application threads, under submit_)
// =============================================================================================

StreamKey Residency::key_of(CUstream stream) {
  if (stream == CU_STREAM_PER_THREAD) return {stream, thread_id()};
  if (special(stream)) {
    CUcontext context = nullptr;
    drv().cuCtxGetCurrent(&context);
    return {stream, reinterpret_cast<uintptr_t>(context)};
  }
  return {stream, 0};
}

CUresult EventPool::take(CUcontext context, CUevent* event) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      *event = free_.back();
      free_.pop_back();
      return CUDA_SUCCESS;
    }
  }
  const Driver& driver = drv();
  ContextScope scope(driver, context);
  *event = nullptr;
  const CUresult rc = driver.cuEventCreate(event, CU_EVENT_DISABLE_TIMING);
  if (rc != CUDA_SUCCESS) *event = nullptr;
  return rc;
}

Marks& Residency::marks_of(const StreamKey& key) {
  Marks& m = marks_[key];
  if (m.context == nullptr) {
    // The legacy and per-thread streams belong to the current context; so does a stream whose
    // context cannot be read.
    if (special(key.handle) || drv().cuStreamGetCtx(key.handle, &m.context) != CUDA_SUCCESS) {
      drv().cuCtxGetCurrent(&m.context);
    }
  }
  if (!m.next) {
    m.next = std::make_shared<MarkRecord>();
    m.next->pool = &m.pool;
  }
  return m;
}

// Records the pending mark of `key` on its stream (if a use refers to it): everything enqueued
// there so far precedes it.
void Residency::close_mark(const StreamKey& key) {
  Marks& m = marks_of(key);
  if (m.next.use_count() == 1) return;  // nobody refers to it: nothing to record
  const Driver& driver = drv();
  if (capture_gate::open() > 0) {
    // A stream that captures (one that began it, or one forked into it) would record the mark
    // into the graph: it stays open, and its slots are not evicted until it is closed.
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    const CUresult rc = driver.cuStreamIsCapturing(key.handle, &status);
    if (rc == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT || status != CU_STREAM_CAPTURE_STATUS_NONE) return;
  }
  CUevent event = nullptr;
  const CUresult made = m.pool.take(m.context, &event);
  if (made != CUDA_SUCCESS) {
    die(cuda_failure("cuEventCreate", made,
                     "a use mark on stream " + hex(reinterpret_cast<uintptr_t>(key.handle))));
  }
  const CUresult rc = driver.cuEventRecord(event, key.handle);
  if (rc != CUDA_SUCCESS) {
    m.pool.give(event);
    die(cuda_failure("cuEventRecord", rc,
                     "a use mark on stream " + hex(reinterpret_cast<uintptr_t>(key.handle))));
  }
  m.next->event.store(event, std::memory_order_release);
  m.next = std::make_shared<MarkRecord>();
  m.next->pool = &m.pool;
}

// =============================================================================================
// What to evict
// =============================================================================================

// Positions from the current one to the slot's next use in the learned period; a slot the
// period does not use is the farthest of all. Without a schedule: the longer unused, the farther.
int64_t Residency::distance_locked(const Entry& e) const {
  if (period_ > 0) {
    auto it = schedule_.find(e.slot);
    if (it == schedule_.end() || it->second.empty()) return int64_t{period_} * 2;
    int best = period_;
    for (int use : it->second) {
      best = std::min(best, ((use - position_) % period_ + period_) % period_);
    }
    return best;
  }
  return static_cast<int64_t>(tick_ - e.lru);
}

// While a capture is open, a mark left open could only be closed on a capturing stream: a slot
// used since its streams' last marks waits until they are closed (or the captures end).
bool Residency::evictable_during_capture_locked(const Entry& e) const {
  return capture_gate::open() == 0 || marks_closed(e);
}

// Device handshake: true while `key` is parked (or will be) on the device for a restore that has
// not landed. A slot used there since cannot leave before that restore does; evicting it to make
// room for a restore queued ahead of that one would wait forever.
bool Residency::parked_locked(const StreamKey& key) const {
  auto it = parked_.find(key);
  if (it == parked_.end()) return false;
  auto& waits = it->second;
  waits.erase(
      std::remove_if(waits.begin(), waits.end(), [](const FlagWait& w) { return w.written(); }),
      waits.end());
  if (!waits.empty()) return true;
  parked_.erase(it);
  return false;
}

bool Residency::any_parked_locked() const {
  std::vector<StreamKey> keys;
  keys.reserve(parked_.size());
  for (const auto& entry : parked_) keys.push_back(entry.first);
  bool any = false;
  for (const StreamKey& key : keys) any = parked_locked(key) || any;  // each: forgets landed ones
  return any;
}

bool Residency::held_by_parked_stream_locked(const Entry& e) const {
  return std::any_of(e.marks.begin(), e.marks.end(),
                     [this](const Mark& m) { return parked_locked(m.stream); });
}

// Device handshake: an eviction with data that could not go ahead (its last uses were on a
// capturing stream, or its copy graphs could not be made) is enqueued on the device only once the
// host sees those uses done, which is after the streams a restore decided now would park. A
// restore that counts on its pages must not park anything: on the H200 work enqueued behind a
// parked stream did not run (docs/PLANNER.md, "Handshakes"). While such an eviction is pending,
// restores take the host path.
bool Residency::host_path_evictions_pending_locked(const Device& d) const {
  return std::any_of(entries_.begin(), entries_.end(), [&d](const auto& entry) {
    const Entry& e = entry.second;
    return e.device == d.ordinal && e.has_data && !e.eviction_ahead &&
           e.evictions_done != e.evictions_decided;
  });
}

bool Residency::evictions_before_locked(const Device& d, uint64_t sequence) const {
  return std::any_of(entries_.begin(), entries_.end(), [&d, sequence](const auto& entry) {
    const Entry& e = entry.second;
    return e.device == d.ordinal && e.evictions_done != e.evictions_decided &&
           e.eviction_sequence < sequence;
  });
}

std::vector<Entry*> Residency::victims_locked(const Device& d, uint64_t pages,
                                              const std::vector<Entry*>& keep, bool recorded_only,
                                              uint64_t* held_back) const {
  std::vector<Entry*> candidates;
  if (held_back != nullptr) *held_back = 0;
  for (const auto& [slot, e] : entries_) {
    if (e.device != d.ordinal || e.where != Where::resident) continue;
    if (std::find(keep.begin(), keep.end(), &e) != keep.end()) continue;
    const bool passed_over =
        settling_locked(d, e) ||
        (recorded_only ? !marks_closed(e) : !evictable_during_capture_locked(e));
    if (passed_over) {
      if (held_back != nullptr) *held_back += e.pages;
      continue;
    }
    candidates.push_back(const_cast<Entry*>(&e));
  }
  std::stable_sort(candidates.begin(), candidates.end(), [this](const Entry* a, const Entry* b) {
    return distance_locked(*a) > distance_locked(*b);
  });
  std::vector<Entry*> chosen;
  uint64_t freed = 0;
  for (Entry* e : candidates) {
    if (freed >= pages) break;
    chosen.push_back(e);
    freed += e->pages;
  }
  return chosen;
}

// =============================================================================================
// Decisions (under mutex_): state changes, and the jobs that carry them out
// =============================================================================================

bool Residency::settling_locked(const Device& d, const Entry& e) const {
  return e.pins > 0 || (!parked_.empty() && held_by_parked_stream_locked(e)) ||
         (d.device_handshake && !evicts_ahead_locked(e));
}

uint64_t Residency::settling_pages_locked(const Device& d, const std::vector<Entry*>& keep) const {
  uint64_t pages = 0;
  for (const auto& [slot, e] : entries_) {
    if (e.device != d.ordinal || e.where != Where::resident || !marks_closed(e)) continue;
    if (std::find(keep.begin(), keep.end(), &e) != keep.end()) continue;
    if (settling_locked(d, e)) pages += e.pages;
  }
  return pages;
}

void Residency::evict_locked(Entry& e, const char* cause, Actions* out) {
  Device& d = device_locked(e.device);
  e.where = Where::releasing;
  ++e.evictions_decided;
  e.eviction_sequence = ++d.decisions;
  e.eviction_ahead = false;  // until carry_out enqueues its D2H
  d.committed -= e.pages;
  Job job;
  job.kind = JobKind::evict;
  job.slot = e.id;
  job.ready = e.ready;
  job.after_restore = e.restored_once;
  job.with_data = e.has_data;
  job.cause = cause;
  job.decided_ns = trace::now_ns();
  out->jobs.push_back(std::move(job));
  out->marks.push_back(std::move(e.marks));
  e.marks.clear();
  e.waited.clear();
  ++stats_.evictions;
  if (!e.evicted_once) {
    e.evicted_once = true;
    ++stats_.distinct_evicted;
  }
  const std::string why(cause);
  if (why == "plan") {
    ++stats_.evictions_plan;
  } else if (why == "program") {
    ++stats_.evictions_program;
  } else {
    ++stats_.evictions_budget;
  }
  if (trace::enabled()) {
    trace::Record(trace::Event::evict)
        .add("slot", e.id)
        .hex("va", e.slot->va)
        .add("bytes", e.pages)
        .add("device", e.device)
        .add("cause", cause)
        .add("position", position_)
        .add("data", e.has_data)
        .emit();
  }
}

// A slot that is unbacked, offloaded or releasing becomes resident: its pages mapped again and
// its data copied back. A releasing slot is not called back from its eviction: restores queued
// after that eviction count on the pages it gives back, so it runs to the end and the restore
// follows it (the mover maps only once the unmapper is done with the slot).
void Residency::restore_locked(Entry& e, const char* cause, Actions* out) {
  Device& d = device_locked(e.device);
  d.committed += e.pages;
  const bool first = e.where == Where::unbacked;
  e.where = Where::resident;
  ++e.ready;
  e.restored_once = true;
  e.used_since_restore = false;
  e.waited.clear();
  e.submitted = false;
  e.no_pages.clear();
  // Device handshake: enqueued now, unless its data has no copy graph to come back with (its
  // evictions took the host path); then the host handshake stands in for this restore.
  // Nor while an eviction of it that took the host path is pending: its copy may never run (a
  // reclaim calls it off first), and the host copy an H2D enqueued now would read is then stale.
  // A restore for a copy recorded into a capture takes the host path too: its capturing thread
  // waits on the host for the map (back_for_capture), and with nothing enqueued on a device stream
  // for it, a restore whose pages the device never gives can be given up (give_up_for_capture).
  // Gone ahead, its wait on the restore stream held every later restore there until the flag came,
  // so it could not be given up, and the process was ended after residency.wait_limit.
  const bool for_capture = std::strcmp(cause, "capture") == 0;
  const bool host_copy_current = e.evictions_done == e.evictions_decided || e.eviction_ahead;
  e.ahead = d.device_handshake && !for_capture &&
            (!e.has_data || (e.h2d_exec != nullptr && host_copy_current));
  if (d.device_handshake && !e.ahead && !for_capture) ++stats_.host_path_restores;
  Job job;
  job.kind = JobKind::restore;
  job.slot = e.id;
  job.ready = e.ready;
  job.ahead = e.ahead;
  job.after_evictions = e.evictions_decided;
  job.with_data = e.has_data;
  job.sequence = ++d.decisions;
  job.cause = cause;
  job.for_capture = for_capture;
  job.decided_ns = trace::now_ns();
  job.before = first ? Where::unbacked : Where::offloaded;
  out->jobs.push_back(std::move(job));
  out->marks.emplace_back();
  ++(first ? stats_.first_maps : stats_.restores);
  if (trace::enabled()) {
    trace::Record(trace::Event::fetch)
        .add("slot", e.id)
        .hex("va", e.slot->va)
        .add("bytes", e.pages)
        .add("device", e.device)
        .add("cause", first && std::strcmp(cause, "demand") == 0 ? "first_use" : cause)
        .add("data", e.has_data)
        .add("ready", static_cast<uint64_t>(e.ready))
        .emit();
  }
}

void Residency::evict_handing_off_locked(const std::vector<Entry*>& victims,
                                         const std::vector<Entry*>& wanted, const char* cause,
                                         Actions* out) {
  std::vector<const Entry*> waiting;  // the wanted slots that get pages
  for (const Entry* e : wanted) {
    if (e->where != Where::resident) waiting.push_back(e);
  }
  for (Entry* v : victims) {
    evict_locked(*v, cause, out);
    auto it = std::find_if(waiting.begin(), waiting.end(),
                           [v](const Entry* e) { return e->pages == v->pages; });
    if (it != waiting.end() && v->mapped) {
      out->jobs.back().hand_to = (*it)->id;
      waiting.erase(it);
    }
  }
}

// The stream must not run ahead of the slot's latest restore.
void Residency::wait_for_locked(Entry& e, const StreamKey& stream, Actions* out) {
  if (!e.restored_once) return;
  auto seen = std::find_if(e.waited.begin(), e.waited.end(),
                           [&stream](const auto& w) { return w.first == stream; });
  if (seen != e.waited.end() && seen->second == e.ready) return;
  if (seen == e.waited.end()) {
    e.waited.emplace_back(stream, e.ready);
  } else {
    seen->second = e.ready;
  }
  if (e.ahead) {
    out->event_waits.push_back(&e);
  } else {
    out->host_waits.push_back(&e);
  }
}

// =============================================================================================
// Carrying decisions out (application thread, under submit_)
// =============================================================================================

// What the device could give slots now: what it has free (less what no allocation gets) plus
// what slots hold there (spare handles included: reusable by slots, not the program's). Empty
// when it cannot be read.
std::optional<uint64_t> Residency::slot_room(Device& d) {
  const std::optional<uint64_t> free_bytes = engine().allocatable_now(d.ordinal);
  if (!free_bytes) return std::nullopt;
  const uint64_t kept = engine().spare_bytes(d.ordinal);
  std::lock_guard<std::mutex> lock(mutex_);
  // The reserves lent to executors count as held (`physical`), but only what the executors have
  // mapped holds pages; the rest is in the free memory already. Counted twice, the room let a
  // forward graph's launch restore its slots into the pages a backward graph's executor maps
  // next, which then found none and the process was ended (the demo's --graph pair on a 100 MiB
  // simulated device).
  const uint64_t slots_hold = d.physical - std::min(d.lent, d.physical) + d.executors_hold;
  return *free_bytes + slots_hold + kept;
}

// A map of `pages` failed out of memory in cuMemCreate (`mark`: Engine::given_back_mark() before
// it, `free_before` the free memory read then). Where cuMemGetInfo reported room for them beyond
// the one granule before and after, and nothing went back to the driver since the mark, the
// device keeps more back than that: the engine leaves that much out of
// the device's room from then on, for every user of it (Engine::learn_held_back), so that later
// decisions evict for it instead of mapping into it. Under the device handshake a restore parked
// on the device for such pages waited residency.wait_limit and the process was ended (the
// simulator holding 8 MiB back, 24 MiB left): nothing decided evictions, the budget counting the
// room as there.
void Residency::learn_held_back(Device& d, uint64_t pages, uint64_t mark, uint64_t free_before) {
  const Engine::HeldBack learned = engine().learn_held_back(d.ordinal, pages, mark, free_before);
  if (!learned.learned) return;
  const uint64_t free_bytes = learned.free_bytes, seen = learned.bytes;
  const bool first = learned.first;
  const std::string message = "device " + std::to_string(d.ordinal) + " refused " +
                              byte_size(pages) + " of pages with " + byte_size(free_bytes) +
                              " reported free (cuMemGetInfo); vaswap leaves " + byte_size(seen) +
                              " of its free memory out of the device's room from now on";
  if (!first) {
    log().info("{}", message);  // grown: the warning was given
    return;
  }
  log().warn("{}", message);
  if (trace::enabled()) {
    trace::Record(trace::Event::notice).add("device", d.ordinal).add("message", message).emit();
  }
}

// The device's room for slots now (d.limit): the auto budget, less the reserve; the bound on a
// size budget. Returns the room it read (slot_room), for a caller that needs it too; empty where
// it could not be read (the last figure is kept).
std::optional<uint64_t> Residency::refresh_budget(Device& d) {
  const std::optional<uint64_t> room = slot_room(d);
  if (!room) return std::nullopt;
  std::lock_guard<std::mutex> lock(mutex_);
  d.limit = *room;
  d.room_read = true;
  d.room_read_ns = trace::now_ns();
  d.reserve = reserve_locked(d);
  return room;
}

// Whether a decision that adds `pages` to what slots hold must read the device's room first: always
// under the auto budget; under a size budget (which the room only bounds) where the figure is
// older than kRoomEveryNs or the decision goes beyond it. Read at every launch (fa43d4b), the
// per-layer PyTorch job measured +5.3% on one H100 (+2.3% in session 54); read at most every
// 50 ms, +2.5% on another H100. The cause was not isolated (two machines, no A/B):
// bench/results/overhead_torch_layers_session55_*_h100.md.
bool Residency::room_stale_locked(const Device& d, uint64_t pages) const {
  if (settings_.budget_bytes == 0 || !d.room_read) return true;
  return trace::now_ns() - d.room_read_ns > kRoomEveryNs || d.committed + pages > d.limit;
}

std::optional<uint64_t> Residency::device_room(int ordinal) {
  std::lock_guard<std::mutex> submit(submit_);
  Device& d = device(ordinal);
  const std::optional<uint64_t> room = slot_room(d);
  if (!room) return std::nullopt;
  // Only a reserve the user set: the automatic one (a share of the whole GPU) is the auto
  // budget's headroom, not a bound on what a size budget's slots can have. On an H100 left
  // 100 MiB, windows peaking at 36 MiB ran under a 12 MiB budget beside an automatic reserve of
  // 512 MiB (bench/results/capacity_edges_session51_h100.md).
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t reserve = settings_.reserve_bytes;
  return *room > reserve ? *room - reserve : 0;
}

// Pinned copies for the victims that will copy data out, within host_pool.limit.
bool Residency::ensure_host_copies(const std::vector<Entry*>& victims, std::string* why) {
  std::vector<uint64_t> ids;
  {
    std::lock_guard<std::mutex> lock(mutex_);  // the callers hold submit_: no free meanwhile
    for (const Entry* e : victims) ids.push_back(e->id);
  }
  return ensure_host_copies(ids, why);
}

// A slot's host buffer, once set, never changes: its copy graphs are made on it, and the copies
// that read e->host later must name the same memory. Two threads may give one slot a buffer at
// once (the mover's evict_idle, which holds no submit_, and an application thread that picked it
// as a victim before the mover pinned it): the second keeps the first's and frees its own. (Both
// were written once, the second over the first: the copy graphs named one buffer and the unmapper
// the other, so a restore read a buffer its eviction never wrote, with an earlier slot's data;
// the H200's wrong checksum in bench/results/handshake_staged_h200.md.) A second thread waits for
// the first's allocation (bounded) instead of making its own: the bytes are counted against
// host_pool.limit before the allocation, so that threads cannot pass the limit together, and two
// allocations for one slot would count twice (and refuse one wrongly). Looked up by id, as the
// slot may be freed while the buffer is allocated.
bool Residency::ensure_host_copies(const std::vector<uint64_t>& ids, std::string* why) {
  for (uint64_t id : ids) {
    uint64_t bytes = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      Entry* e = by_id_locked(id);
      if (e != nullptr && e->host_pending) {
        changed_.wait_for(lock, std::chrono::nanoseconds(settings_.wait_limit_ns), [&] {
          e = by_id_locked(id);
          return e == nullptr || !e->host_pending;
        });
      }
      if (e == nullptr || e->forgotten || !e->has_data || e->host != nullptr) continue;
      bytes = e->pages;
      if (settings_.host_limit_bytes != 0 &&
          stats_.host_bytes + bytes > settings_.host_limit_bytes) {
        *why = "host_pool.limit (" + byte_size(settings_.host_limit_bytes) +
               ") is reached: evicting slot " + std::to_string(id) + " needs " + byte_size(bytes) +
               " more pinned host memory, and " + byte_size(stats_.host_bytes) +
               " is held. Raise host_pool.limit or the budget";
        return false;
      }
      stats_.host_bytes += bytes;  // counted before the allocation: two threads cannot both pass
      e->host_pending = true;
    }
    void* host = nullptr;
    std::string failed;
    try {
      host = engine().host_alloc(bytes);
    } catch (const Error& error) {
      failed = error.what();
    } catch (...) {
      finish_host_copy(id, bytes, nullptr);
      throw;
    }
    if (!finish_host_copy(id, bytes, host) && host != nullptr) {
      engine().host_free(host);  // given one meanwhile (past a wait's limit), or freed
    }
    if (host == nullptr) {
      *why = failed.empty() ? "the pinned allocation of " + byte_size(bytes) + " failed" : failed;
      return false;
    }
  }
  return true;
}

// Ends ensure_host_copies' allocation for slot `id`: gives the slot `host` if it still has no
// buffer (true), else takes the bytes off the count (false). Wakes threads waiting for it.
bool Residency::finish_host_copy(uint64_t id, uint64_t bytes, void* host) {
  bool kept = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Entry* e = by_id_locked(id);
    if (e != nullptr) e->host_pending = false;
    if (host != nullptr && e != nullptr && !e->forgotten && e->host == nullptr) {
      e->host = host;
      kept = true;
    } else {
      stats_.host_bytes -= bytes;
    }
  }
  changed_.notify_all();
  return kept;
}

// Turns marks into events, enqueues the device handshake's copies, queues the jobs for the
// workers, and makes `stream` (if any) wait.
void Residency::carry_out(Actions& a, bool waits, CUstream stream) {
  for (size_t i = 0; i < a.jobs.size(); ++i) {
    for (const Mark& m : a.marks[i]) {
      if (!m.record->closed()) close_mark(m.stream);  // still pending: close it now
      a.jobs[i].waits.push_back(m.record);
    }
    a.jobs[i].last_uses = a.marks[i];
  }
  if (!a.jobs.empty()) {
    bool device_handshake = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      device_handshake = device_locked(a.device).device_handshake;
    }
    // In decision order: an eviction's D2H is on the offload stream before any restore decided
    // after it waits for its room.
    if (device_handshake) {
      Device& d = device(a.device);
      ContextScope scope(drv(), d.context);
      make_graphs_first(d, a.jobs);
      for (Job& job : a.jobs) {
        if (job.kind == JobKind::evict) {
          if (job.with_data) job.ahead = evict_ahead(d, job);
          if (job.ahead) {
            std::lock_guard<std::mutex> lock(mutex_);
            if (Entry* e = by_id_locked(job.slot)) e->eviction_ahead = true;
          }
        } else if (job.ahead) {
          bool host_path = false;
          {
            std::lock_guard<std::mutex> lock(mutex_);
            Entry* e = by_id_locked(job.slot);
            if (e == nullptr) continue;
            if (settling_ > 0 || host_path_evictions_pending_locked(d)) {
              host_path = true;
              job.ahead = e->ahead = false;
              ++stats_.host_path_restores;
              // The launch's thread waits for its submission instead of its stream for its copy.
              auto it = std::find(a.event_waits.begin(), a.event_waits.end(), e);
              if (it != a.event_waits.end()) {
                a.event_waits.erase(it);
                a.host_waits.push_back(e);
              }
            } else {
              // Counted as parked from now, under the lock that saw no settle waiting: a settle
              // that begins before the wait is enqueued waits for it too.
              FlagWait wait;
              wait.flag = e->flag;
              wait.value = job.ready;
              wait.slot = job.slot;
              wait.device = d.ordinal;
              wait.since = trace::now_ns();
              parked_[StreamKey{d.ahead_in, 0}].push_back(wait);
              e->ahead_ready = job.ready;
            }
          }
          if (!host_path) restore_ahead(d, job);
        }
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    Device& d = device_locked(a.device);
    for (Job& job : a.jobs) d.jobs.push_back(std::move(job));
    d.jobs_cv.notify_all();
  }
  if (!waits) return;
  const Driver& driver = drv();
  for (Entry* e : a.event_waits) {
    CUevent event = nullptr;
    uint64_t id = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      event = e->ready_event;
      id = e->id;
    }
    const CUresult rc = with_retries([&] { return driver.cuStreamWaitEvent(stream, event, 0); });
    if (rc != CUDA_SUCCESS) {
      die(cuda_failure("cuStreamWaitEvent", rc,
                       "the wait of stream " + hex(reinterpret_cast<uintptr_t>(stream)) +
                           " for the restore of slot " + std::to_string(id)) +
          ". Its data is safe in pinned host memory");
    }
  }
}

// The device handshake's eviction: the D2H enqueued now on the offload stream, behind the slot's
// last uses and the restore it follows (waits on the device for their events, all recorded
// before), so that no copy a parked stream's restore needs is enqueued after that stream parked
// (docs/PLANNER.md, "Handshakes"). False when it cannot be: a last use not recorded (its stream
// captures), the restore it follows took the host path, or no copy graph can be made (the slot
// has no pages now, before its first eviction); the unmapper then enqueues the copy once the
// host sees its dependencies done.
bool Residency::evict_ahead(Device& d, Job& job) {
  Slot* slot = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Entry* e = by_id_locked(job.slot);
    // No copy graphs: make_graphs_first could not make them before this batch (a stream was
    // parked for longer than residency.wait_limit).
    if (e == nullptr || e->forgotten || e->host == nullptr || e->d2h_exec == nullptr) return false;
    slot = e->slot;
  }
  for (const MarkRef& m : job.waits) {
    if (!m->closed()) return false;
  }
  CUgraphExec exec = nullptr;
  CUevent after = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const Entry* e = by_id_locked(job.slot);
    if (e == nullptr) return false;
    exec = e->d2h_exec;
    if (job.after_restore && static_cast<int32_t>(e->landed - job.ready) < 0) {
      // The host path's restore records its event only once the mover submits it: then the
      // unmapper waits for it on the host. The graphs made now serve the slot's next moves.
      // (One that has landed needs no wait: a host-path restore does not make the slot's next
      // eviction take the host path too, which would send every restore after it there.)
      if (!e->ahead || e->ready_event == nullptr) return false;
      after = e->ready_event;
    }
  }
  const Driver& driver = drv();
  const std::string subject = "the eviction of " + slot->describe();
  const bool same_waits = after == nullptr && d.last_out != nullptr &&
                          std::is_permutation(job.waits.begin(), job.waits.end(),
                                              d.last_out_waits.begin(), d.last_out_waits.end());
  const CUstream out = same_waits ? d.last_out : idle_out_stream(d);
  d.last_out = after == nullptr ? out : nullptr;
  d.last_out_waits = job.waits;
  const auto wait_for = [&](CUevent event) {
    const CUresult rc = with_retries([&] { return driver.cuStreamWaitEvent(out, event, 0); });
    if (rc != CUDA_SUCCESS) die(cuda_failure("cuStreamWaitEvent", rc, subject));
  };
  for (const MarkRef& m : job.waits) wait_for(m->event.load(std::memory_order_acquire));
  if (after != nullptr) wait_for(after);
  if (d.gate.host != nullptr) {
    // residency.d2h_gate: not while the mover maps into room a D2H before this one frees.
    const CUresult gated = with_retries(
        [&] { return driver.cuStreamWaitValue32(out, d.gate.device, 0, CU_STREAM_WAIT_VALUE_EQ); });
    if (gated != CUDA_SUCCESS) die(cuda_failure("cuStreamWaitValue32", gated, subject));
  }
  job.start = spare_event(d);
  job.done = spare_event(d);
  job.out = out;
  record_or_die(driver, job.start, out, subject);
  const CUresult rc = with_retries([&] { return driver.cuGraphLaunch(exec, out); });
  if (rc != CUDA_SUCCESS) {
    // Nothing after this may take the host copy for the slot's data: the process ends.
    die(cuda_failure("cuGraphLaunch", rc, subject + " (its D2H)") +
        ". The slot's pages and data were not touched");
  }
  record_or_die(driver, job.done, out, subject);
  return true;
}

// A stream of `ahead_out` with nothing left to run, or a new one (up to kAheadStreams; past that,
// the one used longest ago, behind whatever it still holds). Under the device handshake all of
// them were made at start_device.
CUstream Residency::idle_out_stream(Device& d) {
  const Driver& driver = drv();
  for (size_t i = 0; i < d.ahead_out.size(); ++i) {
    if (driver.cuStreamQuery(d.ahead_out[i]) == CUDA_SUCCESS) {
      CUstream s = d.ahead_out[i];
      d.ahead_out.erase(d.ahead_out.begin() + static_cast<std::ptrdiff_t>(i));
      d.ahead_out.push_back(s);  // most recently used last
      return s;
    }
  }
  if (d.ahead_out.size() < kAheadStreams) {
    CUstream s = nullptr;
    const CUresult rc =
        with_retries([&] { return driver.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING); });
    if (rc == CUDA_SUCCESS) {
      d.ahead_out.push_back(s);
      return s;
    }
    if (d.ahead_out.empty()) {
      die(cuda_failure("cuStreamCreate", rc,
                       "vaswap's eviction streams on device " + std::to_string(d.ordinal)));
    }
  }
  CUstream s = d.ahead_out.front();
  d.ahead_out.erase(d.ahead_out.begin());
  d.ahead_out.push_back(s);
  return s;
}

// The copy graphs of the slots this batch evicts for the first time, made before the batch parks
// any stream, once none is parked, and with none parked meanwhile (the quiet). Instantiating a
// graph is first-time work: on the H200 a cuGraphInstantiate made while a stream was parked spun
// inside the driver, holding a lock that the mover's next cuEventRecord waited for, so the flag
// the parked stream waited for was never written (bench/results/stall_dump_h200.md). Earlier
// batches' parked restores are the mover's already, so they drain; this thread waits for that
// once per slot, at its first eviction. Made after this batch parked a restore, they could wait
// for a restore whose job the mover does not have yet.
void Residency::make_graphs_first(Device& d, const std::vector<Job>& jobs) {
  struct Make {
    uint64_t id;
    Slot* slot;
    void* host;
  };
  const auto wanted = [this, &jobs] {
    std::vector<Make> makes;
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Job& job : jobs) {
      if (job.kind != JobKind::evict || !job.with_data) continue;
      Entry* e = by_id_locked(job.slot);
      // Made while it has pages, and no earlier eviction of it could unmap them meanwhile.
      if (e == nullptr || e->forgotten || e->host == nullptr || e->d2h_exec != nullptr ||
          !(e->mapped && !e->unmapping && e->evictions_done + 1 == e->evictions_decided)) {
        continue;
      }
      makes.push_back({e->id, e->slot, e->host});
    }
    return makes;
  };
  if (wanted().empty()) return;
  std::string why;
  if (settle("the copy graphs of a slot's first eviction", &why, /*hold=*/true) != CUDA_SUCCESS) {
    log().debug("{}: its eviction and next restore take the host path", why);
    return;
  }
  for (const Make& m : wanted()) {  // again: the wait may have let others change them
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Entry* e = by_id_locked(m.id);
      if (e == nullptr) continue;
      ++e->busy;
    }
    const BusyHold hold(*this, m.id);
    make_copy_graphs(d, m.id, m.slot, m.host, idle_out_stream(d), d.ahead_in);
  }
  unquiet();
}

bool Residency::try_quiet() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (any_parked_locked()) return false;
  ++settling_;
  gates_.lower_all();
  return true;
}

// Makes the slot's copy graphs (once, at its first eviction, while it has pages); the callers
// hold the quiet (make_graphs_first, the mover's try_quiet). A graph of one memcpy node loads no
// module, and once made, uploading and launching it while a stream is parked runs
// (bench/results/park_probe_graphs_h200.txt). False, with a warning the first time, when they
// cannot be made: the slot is then evicted by the host path.
bool Residency::make_copy_graphs(Device& d, uint64_t id, Slot* slot, void* host,
                                 CUstream d2h_upload, CUstream h2d_upload) {
  std::string why;
  CUgraphExec d2h = nullptr, h2d = nullptr;
  try {
    d2h = make_copy_exec(drv(), d.context, d2h_upload, slot->va, host, slot->bytes, true,
                         "the D2H graph of " + slot->describe());
    h2d = make_copy_exec(drv(), d.context, h2d_upload, slot->va, host, slot->bytes, false,
                         "the H2D graph of " + slot->describe());
  } catch (const Error& error) {
    why = error.what();
  }
  if (h2d == nullptr) {
    if (d2h != nullptr) drv().cuGraphExecDestroy(d2h);
    std::lock_guard<std::mutex> lock(mutex_);
    if (!said_graphs_) {
      said_graphs_ = true;
      log().warn("{}; such slots take the host handshake", why);
    }
    return false;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  Entry* e = by_id_locked(id);
  // Made on the slot's host buffer, or not kept: every copy of the slot names that one buffer.
  if (e == nullptr || e->d2h_exec != nullptr || host == nullptr || e->host != host) {
    drv().cuGraphExecDestroy(d2h);
    drv().cuGraphExecDestroy(h2d);
    return e != nullptr && e->d2h_exec != nullptr;
  }
  e->d2h_exec = d2h;
  e->h2d_exec = h2d;
  return true;
}

// The device handshake's restore, enqueued now on the restore stream: a wait on the device for
// the slot's flag (the mover writes it once the pages are mapped), the H2D, and the slot's ready
// event, which launches that need the slot wait for. The application's thread waits for nothing.
void Residency::restore_ahead(Device& d, Job& job) {
  Flag flag;
  CUgraphExec exec = nullptr;
  CUevent ready = nullptr;
  Slot* slot = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Entry* e = by_id_locked(job.slot);
    if (e == nullptr) return;
    flag = e->flag;
    exec = e->h2d_exec;
    ready = e->ready_event;
    slot = e->slot;
  }
  const Driver& driver = drv();
  const std::string subject = "the restore of " + slot->describe();
  if (ready == nullptr) {
    const CUresult made = driver.cuEventCreate(&ready, CU_EVENT_DISABLE_TIMING);
    if (made != CUDA_SUCCESS) die(cuda_failure("cuEventCreate", made, subject));
    std::lock_guard<std::mutex> lock(mutex_);
    if (Entry* e = by_id_locked(job.slot)) e->ready_event = ready;
  }
  const CUresult waited = with_retries([&] {
    return driver.cuStreamWaitValue32(d.ahead_in, flag.device, job.ready, CU_STREAM_WAIT_VALUE_GEQ);
  });
  if (waited != CUDA_SUCCESS) die(cuda_failure("cuStreamWaitValue32", waited, subject));
  if (job.with_data && exec == nullptr) {
    // restore_locked goes ahead only with the slot's H2D graph: never a restore without its data.
    die(subject + ": its data has no copy graph to come back with");
  }
  if (job.with_data) {
    Copied copied{job.slot,  slot->va, slot->bytes, spare_event(d), spare_event(d), 0,
                  job.ready, flag,     true};
    record_or_die(driver, copied.start, d.ahead_in, subject);
    const CUresult rc = with_retries([&] { return driver.cuGraphLaunch(exec, d.ahead_in); });
    if (rc != CUDA_SUCCESS) {
      die(cuda_failure("cuGraphLaunch", rc, subject + " (its H2D)") +
          ". Its data is safe in pinned host memory");
    }
    record_or_die(driver, copied.end, d.ahead_in, subject);
    copied.queued_ns = trace::now_ns();
    std::lock_guard<std::mutex> lock(mutex_);
    ++d.h2d_in_flight;
    d.ahead_copies.push_back(copied);
    d.copies_cv.notify_all();
  }
  record_or_die(driver, ready, d.ahead_in, subject);
}

// Host handshake: until each restore was submitted; then the stream waits for its copy.
bool Residency::wait_submitted(const std::vector<Entry*>& entries, bool* blocked,
                               std::string* why) {
  *blocked = false;
  if (entries.empty()) return true;
  const uint64_t start = trace::now_ns();
  std::unique_lock<std::mutex> lock(mutex_);
  const auto submitted = [&] {
    return std::all_of(entries.begin(), entries.end(),
                       [](const Entry* e) { return e->submitted || e->forgotten; });
  };
  if (submitted()) return true;  // started ahead: the stream waits for the copy, not the thread
  *blocked = true;
  const auto limit = std::chrono::nanoseconds(settings_.wait_limit_ns);
  const bool done = changed_.wait_for(lock, limit, submitted);
  ++stats_.host_waits;
  stats_.host_wait_us += trace::us_since(start);
  if (!done) {
    *why = "a restore was not submitted within residency.wait_limit";
    return false;
  }
  return true;
}

// A slot's pages of its latest restore are mapped (its data may still be on its way).
bool Residency::mapped_now(const std::vector<Slot*>& slots) {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::all_of(slots.begin(), slots.end(),
                     [this](const Slot* slot) { return in_place_locked(slot); });
}

// An eager graph is made and launched on the program's stream: only one of the graph's device.
bool on_device_of(const Driver& driver, CUstream stream, int ordinal) {
  CUdevice device = -1;
  return driver.cuStreamGetDevice != nullptr &&
         driver.cuStreamGetDevice(stream, &device) == CUDA_SUCCESS && device == ordinal;
}

CUgraphExec Residency::eager_graph(const Device& d, const EagerShape& shape, CUstream stream) {
  if (!on_device_of(drv(), stream, d.ordinal)) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = eager_graphs_.find({d.ordinal, shape});
  return it == eager_graphs_.end() ? nullptr : it->second;
}

// Between device memory only (pinned or pageable host memory would change what the program's
// copy does), on the stream's device, within kEagerGraphs.
void Residency::make_eager_graph(Device& d, const EagerShape& shape, CUstream stream) {
  const Driver& driver = drv();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (eager_graphs_.size() >= kEagerGraphs || eager_graphs_.count({d.ordinal, shape}) != 0) {
      return;
    }
    auto tried = eager_tries_.find({d.ordinal, shape});
    if (tried != eager_tries_.end() && tried->second >= kEagerTries) return;
  }
  if (!on_device_of(driver, stream, d.ordinal)) return;
  const auto on_device = [&driver](CUdeviceptr p) {
    unsigned type = 0;
    return driver.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) ==
               CUDA_SUCCESS &&
           type == CU_MEMORYTYPE_DEVICE;
  };
  if (!on_device(shape.dst) || (!shape.memset && !on_device(shape.src))) return;
  // An instantiation is first-time work: only once no stream is parked, holding the quiet
  // (make_graphs_first says why; on the simulator, which stalls instantiations as the H200 did,
  // one made here while a restore was parked held the device its mover needed). The copy's own
  // stream is usually parked on the restore whose pages it waited for, whose copy is already
  // enqueued: this thread waits for that, once per copy, at most kEagerSettleNs (the restores it
  // waits for could need room this thread's pinned slots hold); past that, the copy's next wait
  // for its pages tries again, kEagerTries times in all (then the copy always waits for its
  // pages on the host, as without the device handshake).
  std::string why;
  if (settle("an eager copy made as a graph", &why, true, kEagerSettleNs) != CUDA_SUCCESS) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (eager_tries_.size() < kEagerGraphs) ++eager_tries_[{d.ordinal, shape}];
    return;
  }
  CUgraphExec exec = nullptr;
  try {
    ContextScope scope(driver, d.context);
    exec = shape.memset
               ? make_memset_exec(driver, d.context, stream, shape.dst, shape.value, shape.element,
                                  shape.count, "an eager memset made as a graph")
               : make_device_copy_exec(driver, d.context, stream, shape.dst, shape.src, shape.count,
                                       "an eager copy made as a graph");
  } catch (const Error& error) {
    log().debug("{}", error.what());
  }
  unquiet();
  if (exec == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!eager_graphs_.emplace(std::make_pair(d.ordinal, shape), exec).second) {
    driver.cuGraphExecDestroy(exec);
  }
}

// A copy or memset is checked against its addresses when it is enqueued: until each slot's pages
// of its latest restore are mapped (the stream still waits for their data on the device).
bool Residency::wait_mapped(const std::vector<Slot*>& slots, std::string* why, bool* blocked) {
  *blocked = false;
  std::unique_lock<std::mutex> lock(mutex_);
  const auto in_place = [this](const Slot* slot) { return in_place_locked(slot); };
  if (std::all_of(slots.begin(), slots.end(), in_place)) return true;
  *blocked = true;
  const uint64_t start = trace::now_ns();
  const bool done = changed_.wait_for(lock, std::chrono::nanoseconds(settings_.wait_limit_ns), [&] {
    return std::all_of(slots.begin(), slots.end(), in_place);
  });
  ++stats_.map_waits;
  stats_.map_wait_us += trace::us_since(start);
  if (!done) {
    *why =
        "the pages of a slot it copies into or out of were not mapped within "
        "residency.wait_limit";
    return false;
  }
  return true;
}

// =============================================================================================
// Public operations
// =============================================================================================

void Residency::adopt(Slot* slot, bool backed) {
  std::lock_guard<std::mutex> submit(submit_);
  Device& d = device(slot->device);
  const Flag flag = take_flag(d);
  std::lock_guard<std::mutex> lock(mutex_);
  Entry& e = entries_[slot];
  e.slot = slot;
  e.id = slot->id;
  e.device = slot->device;
  e.pages = slot->mapped_bytes;
  e.bytes = slot->bytes;
  e.flag = flag;
  // A flag is reused once its slot is gone: the new slot's restores continue its sequence, so no
  // value a wait asks for has been written before.
  e.ready = __atomic_load_n(flag.host, __ATOMIC_ACQUIRE);
  e.where = backed ? Where::resident : Where::unbacked;
  e.mapped = backed;
  e.lru = ++tick_;
  slot->managed = true;
  ids_[e.id] = slot;
  if (backed) {
    d.committed += e.pages;
    d.physical += e.pages;
    stats_.resident_bytes += e.pages;
    stats_.peak_resident = std::max(stats_.peak_resident, stats_.resident_bytes);
  }
}

void Residency::forget(Slot* slot) {
  std::lock_guard<std::mutex> submit(submit_);
  std::unique_lock<std::mutex> lock(mutex_);
  Entry* e = find_locked(slot);
  if (e == nullptr) return;
  e->forgotten = true;
  // Jobs still queued skip it (they find it no more); a driver call in flight on it finishes.
  const bool idle = changed_.wait_for(lock, std::chrono::nanoseconds(settings_.wait_limit_ns),
                                      [e] { return e->busy == 0; });
  if (!idle) {
    log().error("slot {} is freed while a worker still works on its pages", e->id);
  }
  Device& d = device_locked(e->device);
  if (e->where == Where::resident) d.committed -= e->pages;
  if (e->mapped) {
    d.physical -= e->pages;
    stats_.resident_bytes -= e->pages;
  }
  // Device handshake: the restore stream may wait for a restore of this slot that the mover will
  // now skip, with its H2D behind the wait. The slot gets pages for it (the engine unmaps them
  // when it destroys the slot) and the flag is written, so the synchronize below, and that
  // stream, do not wait forever, and the copy lands in pages.
  const bool unpublished = d.device_handshake && e->ahead_ready != 0 &&
                           static_cast<int32_t>(e->ahead_ready - e->flag.load()) > 0;
  const bool map_now = unpublished && !e->mapped;
  std::vector<CUgraphExec> copy_graphs = {e->d2h_exec, e->h2d_exec};
  // Eager copies and memsets made as graphs that name it go too.
  const auto names = [slot](const EagerShape& shape) {
    const size_t bytes = shape.memset ? shape.count * shape.element : shape.count;
    const auto overlaps = [slot, bytes](CUdeviceptr p) {
      return p < slot->va + slot->bytes && slot->va < p + bytes;
    };
    return overlaps(shape.dst) || (!shape.memset && overlaps(shape.src));
  };
  for (auto it = eager_graphs_.begin(); it != eager_graphs_.end();) {
    if (names(it->first.second)) {
      copy_graphs.push_back(it->second);
      it = eager_graphs_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = eager_tries_.begin(); it != eager_tries_.end();) {
    it = names(it->first.second) ? eager_tries_.erase(it) : std::next(it);
  }
  const Flag flag = e->flag;
  const uint32_t ready = e->ready;
  const uint64_t id = e->id;
  void* host = e->host;
  const uint64_t host_bytes = host != nullptr ? e->pages : 0;
  CUevent ready_event = e->ready_event;
  stats_.host_bytes -= host_bytes;
  ids_.erase(e->id);
  entries_.erase(slot);
  lock.unlock();
  // The program's free waits for the device (as cudaFree does) before the pages go; a copy into
  // or out of the host buffer finishes before it is reused.
  const Driver& driver = drv();
  ContextScope scope(driver, d.context);
  if (map_now) {
    try {
      engine().back(slot, std::nullopt);
    } catch (const Error& error) {
      die("slot " + std::to_string(id) +
          " is freed while its restore's copy waits on the device for its pages, and they cannot "
          "be mapped: " +
          error.what());
    }
  }
  if (unpublished) flag.store(ready);
  driver.cuCtxSynchronize();
  for (CUgraphExec exec : copy_graphs) {
    if (exec != nullptr) driver.cuGraphExecDestroy(exec);
  }
  // Its flag may be read by queued waits, and written by a restore's write or the one above,
  // until now: it is reused only after that. (Given back before, another thread's new slot took
  // it, started its sequence from the value it read, and a late write of this slot's value then
  // released that slot's waits before its data had landed: the stress suite read another
  // thread's data under the device handshake.)
  {
    std::lock_guard<std::mutex> relock(mutex_);
    d.free_flags.push_back(flag);
  }
  if (host != nullptr) engine().host_free(host);
  if (ready_event != nullptr) driver.cuEventDestroy(ready_event);
}

CUresult Residency::acquire(const std::vector<Slot*>& slots, CUstream stream,
                            const std::string& what, Acquired* acquired, std::string* message,
                            Checked checked, const EagerShape* shape) {
  acquired->slots.clear();
  acquired->stream = stream;
  if (slots.empty()) return CUDA_SUCCESS;
  std::unique_lock<std::mutex> submit(submit_);
  const StreamKey key = key_of(stream);
  // Everything enqueued on the stream so far is closed by one mark: last uses made there end here.
  close_mark(key);
  const int ordinal = slots[0]->device;
  Device& d = device(ordinal);
  bool refreshed = false;
  // Room held by other threads' launches being prepared (their slots pinned) comes back as soon
  // as they are enqueued: wait for it, up to residency.wait_limit, before refusing this launch.
  const uint64_t started = trace::now_ns();
  for (int attempt = 0; attempt < 4; ++attempt) {
    Actions actions;
    actions.device = ordinal;
    std::vector<Entry*> needed, victims;
    uint64_t need_pages = 0, new_pages = 0;
    bool refresh = false;
    bool pinned_elsewhere = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (Slot* slot : slots) {
        Entry* e = find_locked(slot);
        if (e == nullptr || e->device != ordinal) continue;  // not the preload's, or peer memory
        needed.push_back(e);
        need_pages += e->pages;
        if (e->where != Where::resident) new_pages += e->pages;
      }
      d.largest_launch = std::max(d.largest_launch, need_pages);
      refresh = new_pages > 0 && !refreshed && room_stale_locked(d, new_pages);
      const Budget budget = budget_locked(d);
      if (!refresh && need_pages > budget.limit) {
        ++stats_.oom_launches;
        *message = what + " needs " + byte_size(need_pages) + " of slots on device " +
                   std::to_string(ordinal) + " at once, more than " + budget_named_locked(budget) +
                   "; nothing was launched and every slot keeps its data. To fix: " +
                   budget_fix_locked(budget);
        if (trace::enabled()) {
          trace::Record(trace::Event::oom)
              .add("what", what)
              .add("need_bytes", need_pages)
              .add("budget_bytes", budget.limit)
              .add("device", ordinal)
              .emit();
        }
        return CUDA_ERROR_OUT_OF_MEMORY;
      }
      // Over the limit: evict down to the target, leaving the reserve as headroom (auto).
      if (!refresh && d.committed + new_pages > budget.limit) {
        const uint64_t to = std::max(budget.target, need_pages);
        uint64_t held_back = 0;
        victims = victims_locked(d, d.committed + new_pages - to, needed, false, &held_back);
        uint64_t freed = 0;
        for (const Entry* v : victims) freed += v->pages;
        // A launch whose slots all have their pages needs no room: it goes ahead with what
        // could be evicted evicted, however far over the limit the rest keeps the device (room
        // lent to a rewritten graph's executor, slots other launches hold). Refused, it would
        // fail a program that the budget asked for nothing (a torch.compile job on the H200 got
        // "needs 0 B more" and died of it).
        const bool short_of_room = new_pages > 0 && d.committed + new_pages - freed > budget.limit;
        // Room an executor holds unmapped for launches of its graph still queued comes back when
        // it has carried them out (its reserve is parked then): waited for too. The program may
        // enqueue the next launch before the executor has taken the last flags of the one
        // before, which the device has finished (the demo's --graph pair under load).
        const bool executors_owe = d.lent > d.executors_hold;
        if (short_of_room) {
          pinned_elsewhere = (held_back > 0 || executors_owe) &&
                             trace::now_ns() - started < settings_.wait_limit_ns;
        }
        if (!pinned_elsewhere && short_of_room) {
          ++stats_.oom_launches;
          uint64_t mine = 0, pinned = 0, open_marks = 0, parked = 0, not_ahead = 0;
          for (const auto& [slot, other] : entries_) {
            if (other.device != ordinal || other.where != Where::resident) continue;
            if (std::find(needed.begin(), needed.end(), &other) != needed.end()) {
              mine += other.pages;
            } else if (other.pins > 0) {
              pinned += other.pages;
            } else if (!evictable_during_capture_locked(other)) {
              open_marks += other.pages;
            } else if (held_by_parked_stream_locked(other)) {
              parked += other.pages;
            } else if (d.device_handshake && !evicts_ahead_locked(other)) {
              not_ahead += other.pages;
            }
          }
          *message = what + " needs " + byte_size(new_pages) + " more of slots on device " +
                     std::to_string(ordinal) + " within " + budget_named_locked(budget) +
                     ", but only " + byte_size(freed) + " can be evicted (" +
                     byte_size(d.committed) + " held: " + byte_size(mine) + " by this launch, " +
                     byte_size(pinned) + " pinned by other launches, " + byte_size(open_marks) +
                     " in use while a capture is open, " + byte_size(parked) +
                     " used behind a device wait for a restore, " + byte_size(not_ahead) +
                     " not yet evictable on the device, " + byte_size(d.lent) +
                     " lent to the executor; waited " +
                     std::to_string(trace::us_since(started) / 1000) + " ms, " +
                     std::to_string(capture_gate::open()) +
                     " captures open); nothing was launched" +
                     (d.lent > 0 ? std::string("; the executors of rewritten graphs keep their "
                                               "reserves while launches of theirs are queued, "
                                               "and the pages they map between launches (a "
                                               "warning at their rewrite names the budget that "
                                               "leaves room)")
                                 : std::string());
          return CUDA_ERROR_OUT_OF_MEMORY;
        }
      }
    }
    if (refresh) {
      refresh_budget(d);
      refreshed = true;
      continue;
    }
    if (pinned_elsewhere) {
      submit.unlock();
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait_for(lock, std::chrono::milliseconds(2));
      }
      submit.lock();
      --attempt;  // not a change of slots: a wait, bounded by residency.wait_limit
      continue;
    }
    {
      std::string why;
      if (!ensure_host_copies(victims, &why)) {
        ++stats_.oom_launches;
        message->assign(what).append(": cannot evict to make room: ").append(why);
        return CUDA_ERROR_OUT_OF_MEMORY;
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // Victims may have changed while the lock was dropped (a worker, another thread's free):
      // decide again from the start if so.
      const bool still = std::all_of(victims.begin(), victims.end(), [this](Entry* v) {
        return entries_.count(v->slot) != 0 && v->where == Where::resident && v->pins == 0;
      });
      if (!still) continue;
      evict_handing_off_locked(victims, needed, "budget", &actions);
      for (Entry* e : needed) {
        if (e->where != Where::resident) {
          if (e->has_data) {  // a restore, not a first map
            ++acquired->demanded;
            acquired->demanded_bytes += e->bytes;
          }
          restore_locked(*e, "demand", &actions);
        }
        wait_for_locked(*e, key, &actions);
        ++e->pins;
        acquired->slots.push_back(e->slot);
      }
      acquired->waits = actions.event_waits.size() + actions.host_waits.size();
      for (const auto* list : {&actions.event_waits, &actions.host_waits}) {
        for (const Entry* e : *list) acquired->waited.push_back(e->id);
      }
      stats_.peak_resident = std::max(stats_.peak_resident, d.committed);
    }
    carry_out(actions, true, stream);
    // Decided and enqueued; the slots are pinned. The waits below are for the workers, which may
    // need other threads to decide (close their marks, evict, free) before they can go on: no
    // thread holds submit_ while it waits.
    submit.unlock();
    if (!actions.host_waits.empty()) {
      std::string why;
      const uint64_t start = trace::now_ns();
      bool blocked = false;
      const bool submitted = wait_submitted(actions.host_waits, &blocked, &why);
      acquired->host_waited = blocked;
      acquired->host_wait_us = blocked ? trace::us_since(start) : 0;
      if (!submitted) {
        used(*acquired);
        acquired->slots.clear();
        message->assign(what).append(": ").append(why);
        return CUDA_ERROR_OUT_OF_MEMORY;
      }
      const Driver& driver = drv();
      for (Entry* e : actions.host_waits) {
        CUevent event = nullptr;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          event = e->ready_event;
        }
        if (event == nullptr) continue;
        const CUresult rc =
            with_retries([&] { return driver.cuStreamWaitEvent(stream, event, 0); });
        if (rc == CUDA_SUCCESS) continue;
        // The stream cannot be made to wait for the restore's copy: wait for it here instead,
        // before the launch is enqueued (invariant 1: no reader before the data).
        bool timed_out = false;
        const CUresult waited = wait_event(event, &timed_out);
        if (waited != CUDA_SUCCESS) {
          used(*acquired);
          acquired->slots.clear();
          message->assign(what)
              .append(": ")
              .append(cuda_failure("cuStreamWaitEvent", rc, "a restore's copy"))
              .append(", and ")
              .append(wait_failure(waited, timed_out, "the copy, waited for on the host,"));
          return waited == CUDA_ERROR_LAUNCH_TIMEOUT ? CUDA_ERROR_OUT_OF_MEMORY : waited;
        }
      }
    }
    if (checked == Checked::when_enqueued) {
      const bool as_graph = shape != nullptr && d.device_handshake;
      if (as_graph && !mapped_now(acquired->slots)) {
        acquired->substitute = eager_graph(d, *shape, stream);
        if (acquired->substitute != nullptr) return CUDA_SUCCESS;  // the stream waits for them
      }
      std::string why;
      const uint64_t start = trace::now_ns();
      bool blocked = false;
      if (!wait_mapped(acquired->slots, &why, &blocked)) {
        used(*acquired);
        acquired->slots.clear();
        message->assign(what).append(": ").append(why);
        return CUDA_ERROR_OUT_OF_MEMORY;
      }
      acquired->map_wait_us = trace::us_since(start);
      acquired->map_waited = blocked;
      // Pinned and mapped: the graph is made now, for the next time.
      if (as_graph && blocked) make_eager_graph(d, *shape, stream);
    }
    return CUDA_SUCCESS;
  }
  *message = what + ": the slots kept changing while room was made for them; try again";
  return CUDA_ERROR_OUT_OF_MEMORY;
}

void Residency::used(const Acquired& acquired) {
  if (acquired.slots.empty()) return;
  if (acquired.captured) {
    // Recorded into a capture: nothing ran, and no mark is due (the capturing stream could not
    // record one). Only the pins go.
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (Slot* slot : acquired.slots) {
        if (Entry* e = find_locked(slot)) --e->pins;
      }
    }
    changed_.notify_all();
    return;
  }
  std::lock_guard<std::mutex> submit(submit_);
  used_submitted(acquired);
}

void Residency::used_submitted(const Acquired& acquired) {
  const StreamKey key = key_of(acquired.stream);
  const MarkRef mark = marks_of(key).next;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++tick_;
    for (Slot* slot : acquired.slots) {
      Entry* e = find_locked(slot);
      if (e == nullptr) continue;
      --e->pins;
      e->lru = tick_;
      e->has_data = true;
      e->used_since_restore = true;
      bool found = false;
      for (Mark& m : e->marks) {
        if (m.stream == key) {
          m.record = mark;
          found = true;
        }
      }
      if (!found) e->marks.push_back(Mark{key, mark});
    }
  }
  changed_.notify_all();  // launches waiting for pinned room (acquire) look again
  if (special(acquired.stream)) close_mark(key);
}

bool Residency::lend(const std::vector<Slot*>& slots, uint64_t reserve, std::vector<Lent>* lent) {
  if (slots.empty()) return false;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    // An eviction or a restore of one of them under way (a capture's, under a tight budget)
    // ends first: bounded, and a lend refused then is tried again at the next launch.
    changed_.wait_for(lock, std::chrono::nanoseconds(settings_.wait_limit_ns), [&] {
      return std::all_of(slots.begin(), slots.end(), [this](const Slot* slot) {
        const Entry* e = find_locked(slot);
        return e == nullptr || e->where == Where::lent || settled(*e);
      });
    });
    for (Slot* slot : slots) {
      const Entry* e = find_locked(slot);
      // An offloaded slot with data has its host copy (the executor's copy starts from it).
      const bool ok = e != nullptr && e->device == slots[0]->device && settled(*e) &&
                      !(e->where == Where::offloaded && e->has_data && e->host == nullptr);
      if (!ok) {
        log().debug("slot {} cannot be lent: where {} mapped {} submitted {}",
                    e != nullptr ? e->id : 0, e != nullptr ? static_cast<int>(e->where) : -1,
                    e != nullptr && e->mapped, e != nullptr && e->submitted);
        return false;
      }
    }
    lent->assign(slots.size(), Lent{});
    Device& d = device_locked(slots[0]->device);
    for (size_t i = 0; i < slots.size(); ++i) {
      Entry& e = *find_locked(slots[i]);
      (*lent)[i].pages = e.where == Where::resident;
      (*lent)[i].data = e.where == Where::offloaded && e.has_data ? e.host : nullptr;
      if (e.where == Where::resident) {
        // Its pages are the executor's to count from now on (within `reserve`).
        d.committed -= e.pages;
        d.physical -= e.pages;
        stats_.resident_bytes -= e.pages;
      }
      e.where = Where::lent;
      e.mapped = false;
      e.marks.clear();
    }
    // The reserve stands for what the executor maps (an auto budget reads the device's free
    // memory, which its pages take, and adds back what slots hold).
    d.committed += reserve;
    d.physical += reserve;
    d.lent += reserve;
  }
  changed_.notify_all();
  return true;
}

void Residency::take_back(int device, const std::vector<Slot*>& slots, uint64_t reserve) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++tick_;
    for (Slot* slot : slots) {
      Entry* e = find_locked(slot);
      if (e == nullptr || e->where != Where::lent) continue;
      Device& d = device_locked(e->device);
      e->where = Where::resident;
      e->mapped = true;
      e->has_data = true;
      e->lru = tick_;
      d.committed += e->pages;
      d.physical += e->pages;
      stats_.resident_bytes += e->pages;
      stats_.peak_resident = std::max(stats_.peak_resident, stats_.resident_bytes);
    }
    if (reserve > 0) {
      Device& d = device_locked(device);
      d.committed -= std::min(reserve, d.committed);
      d.physical -= std::min(reserve, d.physical);
      d.lent -= std::min(reserve, d.lent);
    }
  }
  changed_.notify_all();
}

void Residency::unpark(int ordinal, uint64_t bytes, bool make_room) {
  if (bytes == 0) return;
  {
    // Counted under the state lock alone (as lend_more): a destroyed graph's executor calls this
    // holding its own lock.
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = devices_.find(ordinal);
    if (it == devices_.end()) return;
    Device& d = *it->second;
    bytes = std::min(bytes, d.parked);
    d.parked -= bytes;
    d.committed += bytes;
    d.physical += bytes;
    d.lent += bytes;
  }
  if (!make_room) return;
  std::lock_guard<std::mutex> submit(submit_);
  Device& d = device(ordinal);
  bool stale = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stale = room_stale_locked(d, 0);
  }
  if (stale) refresh_budget(d);
  std::vector<Entry*> victims;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const Budget budget = budget_locked(d);
    if (d.committed > budget.limit) {
      victims = victims_locked(d, d.committed - std::min(budget.target, d.committed), {});
    }
  }
  if (victims.empty()) return;
  std::string why;
  if (!ensure_host_copies(victims, &why)) {
    log().warn("device {}: no room made for a rewritten graph's reserve: {}", ordinal, why);
    return;
  }
  Actions actions;
  actions.device = ordinal;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    drop_unevictable_locked(&victims);
    evict_handing_off_locked(victims, {}, "budget", &actions);
  }
  carry_out(actions, false, nullptr);
}

void Residency::wait_settled_locked(const std::vector<Slot*>& slots,
                                    std::unique_lock<std::mutex>& lock) {
  auto idle = [this, &slots] {
    return std::all_of(slots.begin(), slots.end(), [this](const Slot* slot) {
      const Entry* e = find_locked(slot);
      return e == nullptr || (settled(*e) && e->busy == 0);
    });
  };
  if (!changed_.wait_for(lock, std::chrono::nanoseconds(settings_.wait_limit_ns), idle)) {
    std::string names;
    for (const Slot* slot : slots) names += (names.empty() ? "" : ", ") + slot->describe();
    fail(VASWAP_ERROR_INVALID_STATE,
         "an eviction or a restore of " + names + " did not end within residency.wait_limit");
  }
}

void Residency::wait_settled(const std::vector<Slot*>& slots) {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_settled_locked(slots, lock);
}

void Residency::with_pages(const std::vector<Slot*>& slots, const std::function<void()>& fn) {
  // A placeholder takes one granule (at most a slot's pages): on a full device, slots no launch
  // needs make room for it first, as for the program's own allocations.
  std::map<int, size_t> smallest;
  for (const Slot* slot : slots) {
    auto [it, added] = smallest.emplace(slot->device, slot->mapped_bytes);
    if (!added) it->second = std::min(it->second, slot->mapped_bytes);
  }
  for (const auto& [device, bytes] : smallest) {
    const std::optional<uint64_t> room = engine().allocatable_now(device);
    if (room && *room < bytes) make_room(device, bytes);  // not read: the map says what fails
  }
  std::lock_guard<std::mutex> submit(submit_);  // nothing new is decided meanwhile
  std::vector<Slot*> map;
  std::vector<std::unique_ptr<BusyHold>> holds;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    wait_settled_locked(slots, lock);
    for (Slot* slot : slots) {
      Entry* e = find_locked(slot);
      if (e == nullptr) continue;
      // A lent slot's pages are its executor's (inside::present brings it back).
      if (e->where != Where::resident && e->where != Where::lent) map.push_back(slot);
      ++e->busy;  // forget() waits for it
      holds.push_back(std::make_unique<BusyHold>(*this, e->id));
    }
  }
  // A placeholder (one granule of pages for all of them): the address is valid and no memory is
  // needed, however many slots there are. Where the driver refuses one, the slot's own pages
  // instead (without data). A map that fails both ways is thrown to the caller, which reports it,
  // not logged as an error here; what was mapped before it goes.
  std::vector<bool> own(map.size(), false);  // the slot's own pages, not a placeholder
  size_t mapped = 0;
  auto unmap = [&] {
    for (size_t i = 0; i < mapped; ++i) {
      if (own[i]) {
        engine().unback(map[i], std::nullopt);
      } else {
        engine().unmap_placeholder(map[i]);
      }
    }
  };
  try {
    for (; mapped < map.size(); ++mapped) {
      try {
        engine().map_placeholder(map[mapped]);
      } catch (const Error& error) {
        log().debug("{}; its own pages instead", error.what());
        engine().back(map[mapped], std::nullopt, /*report=*/false);
        own[mapped] = true;
      }
    }
    fn();
  } catch (...) {
    unmap();
    throw;
  }
  unmap();
}

void Residency::take_back_offloaded(Slot* slot, void* host) {
  void* spare = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Entry* e = find_locked(slot);
    if (e == nullptr || e->where != Where::lent) {
      spare = host;
    } else {
      if (e->host == nullptr) {
        e->host = host;
        stats_.host_bytes += e->pages;
      } else {
        std::memcpy(e->host, host, e->pages);
        spare = host;
      }
      e->where = Where::offloaded;
      e->mapped = false;
      e->has_data = true;
    }
  }
  if (spare != nullptr) engine().host_free(spare);
  changed_.notify_all();
}

std::vector<Slot*> Residency::evict(const std::vector<Slot*>& slots, const char* cause) {
  std::vector<Slot*> left;  // resident, and left so
  if (slots.empty()) return left;
  std::lock_guard<std::mutex> submit(submit_);
  Actions actions;
  actions.device = slots[0]->device;
  std::vector<Entry*> victims;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Slot* slot : slots) {
      Entry* e = find_locked(slot);
      if (e == nullptr || e->device != actions.device || e->where != Where::resident) continue;
      if (e->pins == 0 && (!device_locked(e->device).device_handshake || evicts_ahead_locked(*e))) {
        victims.push_back(e);
      } else {
        left.push_back(slot);
      }
    }
  }
  std::string why;
  if (!ensure_host_copies(victims, &why)) {
    log().warn("a planned eviction of {} slot(s) is skipped: {}", victims.size(), why);
    for (Entry* v : victims) left.push_back(v->slot);
    return left;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Entry* v : victims) {
      if (entries_.count(v->slot) == 0 || v->where != Where::resident) continue;
      if (v->pins == 0) {
        evict_locked(*v, cause, &actions);
      } else {
        left.push_back(v->slot);
      }
    }
  }
  carry_out(actions, false, nullptr);
  return left;
}

void Residency::prefetch(const std::vector<Slot*>& slots) {
  if (slots.empty()) return;
  std::lock_guard<std::mutex> submit(submit_);
  const int ordinal = slots[0]->device;
  Device& d = device(ordinal);
  bool stale = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stale = room_stale_locked(d, 0);
  }
  if (stale) refresh_budget(d);
  Actions actions;
  actions.device = ordinal;
  std::vector<Entry*> wanted, victims;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    uint64_t new_pages = 0;
    for (Slot* slot : slots) {
      Entry* e = find_locked(slot);
      if (e == nullptr || e->device != ordinal || e->where == Where::resident) continue;
      if (e->where == Where::unbacked) continue;  // nothing to bring back: mapped at first use
      if (e->where == Where::lent) continue;      // its executor brings it back
      wanted.push_back(e);
      new_pages += e->pages;
    }
    // Planned restores stay within the target: they evict others only under pressure.
    const uint64_t budget = budget_locked(d).target;
    if (!wanted.empty() && d.committed + new_pages > budget) {
      victims = victims_locked(d, d.committed + new_pages - budget, wanted);
    }
  }
  std::string why;
  if (!ensure_host_copies(victims, &why)) {
    log().warn("a planned restore is left to its use: {}", why);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    drop_unevictable_locked(&victims);
    evict_handing_off_locked(victims, wanted, "budget", &actions);
    const uint64_t budget = budget_locked(d).target;
    for (Entry* e : wanted) {
      if (entries_.count(e->slot) == 0 || e->where == Where::resident) continue;
      if (d.committed + e->pages > budget) break;  // the rest waits for its use
      restore_locked(*e, "prefetch", &actions);
    }
  }
  carry_out(actions, false, nullptr);
}

void Residency::set_schedule(const std::vector<std::vector<Slot*>>& uses) {
  std::lock_guard<std::mutex> lock(mutex_);
  schedule_.clear();
  period_ = static_cast<int>(uses.size());
  position_ = 0;
  for (size_t p = 0; p < uses.size(); ++p) {
    for (Slot* slot : uses[p]) schedule_[slot].push_back(static_cast<int>(p));
  }
}

uint64_t Residency::make_room(int ordinal, uint64_t bytes) {
  // Slots in use right now (pinned by a launch being prepared, or used since the last mark while
  // a capture is open) become evictable within moments: the program's allocation waits for them
  // a little (at most a second, or residency.wait_limit if shorter) before it fails.
  const uint64_t start = trace::now_ns();
  // Handles kept for reuse go first: releasing them copies nothing. Evicted pages would be kept
  // too, so they are released again once the evictions are done.
  uint64_t trimmed = 0;
  {
    // Room for the allocation and the reserve after it: the driver's own allocations (a kernel's
    // module loaded at its first launch, a library's workspace) need headroom too, and an H200
    // run failed in exactly that way when only the allocation's bytes were given back.
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = devices_.find(ordinal);
    if (it == devices_.end()) return 0;
    bytes += reserve_locked(*it->second);
  }
  trimmed = engine().trim_spares(ordinal, 0);
  if (trimmed >= bytes) return trimmed;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    bool busy_slots = false;
    uint64_t freed = make_room_once(ordinal, bytes - trimmed, &busy_slots);
    engine().trim_spares(ordinal, 0);
    freed += trimmed;
    uint64_t limit = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      limit = std::min<uint64_t>(settings_.wait_limit_ns, 1000000000ull);
    }
    if (freed > 0 || !busy_slots || trace::now_ns() - start > limit) return freed;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(32));
  }
}

uint64_t Residency::make_room_once(int ordinal, uint64_t bytes, bool* busy_slots) {
  std::vector<uint64_t> ids;
  {
    std::lock_guard<std::mutex> submit(submit_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (devices_.count(ordinal) == 0) return 0;
    }
    Device& d = device(ordinal);
    Actions actions;
    actions.device = ordinal;
    std::vector<Entry*> victims;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      uint64_t held_back = 0;
      victims = victims_locked(d, bytes, {}, false, &held_back);
      if (victims.empty()) *busy_slots = held_back > 0;
    }
    std::string why;
    if (!ensure_host_copies(victims, &why)) {
      log().warn("cannot make room for the program's allocation: {}", why);
      return 0;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (Entry* v : victims) {
        if (entries_.count(v->slot) != 0 && v->where == Where::resident && v->pins == 0) {
          evict_locked(*v, "program", &actions);
          ids.push_back(v->id);
        }
      }
    }
    carry_out(actions, false, nullptr);
  }
  // The program's call waits (its own out-of-memory path) until those pages are gone.
  uint64_t freed = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait_for(lock, std::chrono::nanoseconds(settings_.wait_limit_ns), [&] {
    freed = 0;
    bool all = true;
    for (uint64_t id : ids) {
      Entry* e = by_id_locked(id);
      if (e == nullptr) continue;
      if (e->mapped) {
        all = false;
      } else {
        freed += e->pages;
      }
    }
    return all;
  });
  return freed;
}

CUresult Residency::back_for_capture(const std::vector<Slot*>& slots, std::vector<Slot*>* pinned,
                                     std::string* message) {
  if (slots.empty()) return CUDA_SUCCESS;
  // The thread captures: what vaswap enqueues on its own streams for these slots (evictions,
  // restores ahead, their waits and copy graphs) must not count against its capture. On an H100,
  // under residency.budget=12MiB with every buffer a slot, the capture's first copy found it
  // invalidated ("a previous error during capture"); the simulator, which does not rule those
  // calls unsafe, ran it.
  const RelaxedCapture relaxed(drv());
  std::vector<uint64_t> ids;
  const uint64_t started = trace::now_ns();
  for (;;) {
    std::lock_guard<std::mutex> submit(submit_);
    const int ordinal = slots[0]->device;
    Device& d = device(ordinal);
    // What the device itself can give slots, read now: a size budget may allow more than the
    // program left.
    const std::optional<uint64_t> room = refresh_budget(d);
    Actions actions;
    actions.device = ordinal;
    std::vector<Entry*> needed, victims;
    const char* cause = "budget";  // the victims' eviction: over the budget, or the device's room
    bool settling = false;         // short of room for now only: wait, then decide again
    {
      std::lock_guard<std::mutex> lock(mutex_);
      uint64_t new_pages = 0;
      for (Slot* slot : slots) {
        Entry* e = find_locked(slot);
        if (e == nullptr || e->device != ordinal) continue;
        needed.push_back(e);
        if (e->where != Where::resident) new_pages += e->pages;
      }
      // Over the limit: evict slots whose last uses are closed by marks recorded already, so that
      // nothing is recorded on a stream (the capturing one would record it into the graph). The
      // limit is the budget's, or what the device itself can give slots where that is less (a
      // size budget may allow more than the program left): a map beyond the device fails out of
      // memory until residency.wait_limit. On an H100 left 24 MiB under a 16 MiB budget the
      // capture's first copy waited 30 s for 2 MiB of pages, then was refused
      // (bench/results/gpu_checks_session52_b663b48_h100.md).
      const Budget budget = budget_locked(d);
      const uint64_t limit = room ? std::min(budget.limit, *room) : budget.limit;
      uint64_t freed = 0;
      if (d.committed + new_pages > limit) {
        const uint64_t to = std::max(std::min(budget.target, limit), new_pages);
        victims = victims_locked(d, d.committed + new_pages - to, needed, /*recorded_only=*/true);
        for (const Entry* v : victims) freed += v->pages;
        cause = !budget.device_bound && d.committed + new_pages > budget.limit ? "budget" : "room";
      }
      if (new_pages > 0 && d.committed + new_pages - freed > limit) {
        // Slots passed over only until something in flight ends (a restore landing, another
        // launch's pins, a parked stream) make room soon: an earlier copy's restores were still
        // landing when a capture's next copy came, and the capture failed with room on its way.
        // Open marks are not among them: the capture keeps them open until it ends.
        const uint64_t landing = settling_pages_locked(d, needed);
        const uint64_t waited_ns = trace::now_ns() - started;
        settling = landing > 0 && waited_ns < settings_.wait_limit_ns;
        if (!settling) {
          ++stats_.oom_launches;
          const std::string evictable = " with " + byte_size(freed) + " that can be evicted now (" +
                                        byte_size(landing) + " more still in flight after " +
                                        std::to_string(waited_ns / 1000000) +
                                        " ms; the rest used while the capture is open)";
          *message = "a copy or memset recorded into a capture needs " + byte_size(new_pages) +
                     " of slots mapped, and ";
          if (!budget.device_bound && d.committed + new_pages - freed > budget.limit) {
            *message += budget_named_locked(budget) + " on device " + std::to_string(ordinal) +
                        " has " +
                        byte_size(budget.limit > d.committed ? budget.limit - d.committed : 0) +
                        " left" + evictable + "; " + budget_fix_locked(budget);
          } else {
            *message += "device " + std::to_string(ordinal) + " can give slots " +
                        byte_size(room ? *room : budget.limit) +
                        " in all (its free memory less what no allocation gets, what slots hold "
                        "and kept handles), " +
                        byte_size(d.committed) + " of it held or on its way" + evictable +
                        "; the rest of the device is the program's own memory. Free device " +
                        "memory before the capture, or capture with less of it in use";
          }
          return CUDA_ERROR_OUT_OF_MEMORY;
        }
      }
    }
    if (settling) {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait_for(lock, std::chrono::milliseconds(5));
      continue;
    }
    {
      std::string why;
      if (!ensure_host_copies(victims, &why)) {
        ++stats_.oom_launches;
        *message = "a copy or memset recorded into a capture: cannot evict to make room: " + why;
        return CUDA_ERROR_OUT_OF_MEMORY;
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (Entry* v : victims) {
        if (entries_.count(v->slot) != 0 && v->where == Where::resident && v->pins == 0) {
          evict_locked(*v, cause, &actions);
        }
      }
      for (Entry* e : needed) {
        if (entries_.count(e->slot) == 0) continue;
        // Held until the copy is recorded: a restore short of room (relieve) evicts idle
        // resident slots, and took one of these between its map and the driver's check.
        ++e->pins;
        pinned->push_back(e->slot);
        if (e->where == Where::resident) continue;
        restore_locked(*e, "capture", &actions);
        ids.push_back(e->id);
      }
    }
    carry_out(actions, false, nullptr);
    break;
  }
  // A copy or memset recorded into a capture is checked against its addresses now: wait until
  // the mover has mapped them (the launch will wait for their data as any launch does).
  std::unique_lock<std::mutex> lock(mutex_);
  const bool mapped =
      changed_.wait_for(lock, std::chrono::nanoseconds(settings_.wait_limit_ns), [&] {
        return std::all_of(ids.begin(), ids.end(), [this](uint64_t id) {
          const Entry* e = by_id_locked(id);
          return e == nullptr || e->mapped || !e->no_pages.empty();
        });
      });
  for (uint64_t id : ids) {
    Entry* e = by_id_locked(id);
    if (e == nullptr || e->no_pages.empty()) continue;
    *message = "a copy or memset recorded into a capture names slot " + std::to_string(id) +
               " (va " + hex(e->slot->va) + ", " + byte_size(e->pages) +
               "), whose pages the device could not give (" + e->no_pages +
               ") with nothing in flight that could give any back; free device memory before " +
               "the capture, or capture with less of it in use";
    for (uint64_t other : ids) {
      if (Entry* o = by_id_locked(other)) o->no_pages.clear();
    }
    ++stats_.oom_launches;
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (!mapped) {
    std::string names;
    size_t unmapped = 0;
    for (uint64_t id : ids) {
      const Entry* e = by_id_locked(id);
      if (e == nullptr || e->mapped) continue;
      if (++unmapped <= 4) {
        names += (names.empty() ? "" : ", ") + std::string("slot ") + std::to_string(id) + " (va " +
                 hex(e->slot->va) + ", " + byte_size(e->pages) + ")";
      }
    }
    if (unmapped > 4) names += " and " + std::to_string(unmapped - 4) + " more";
    *message = "a copy or memset recorded into a capture names " + names +
               ", which got no pages within residency.wait_limit (" +
               std::to_string(settings_.wait_limit_ns / 1000000) +
               " ms): the device had no room for them beside the slots the capture keeps mapped "
               "(used while it is open, or named by this copy) and the program's own memory; "
               "free device memory, or capture with less of it in use";
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return CUDA_SUCCESS;
}

// First-time work (a kernel's or a graph's first launch, an instantiation) may need the whole
// context: lazy module loading and graph upload do. On the H200 it hangs while a stream is parked
// on a flag, and the flag's writer never runs (docs/PLANNER.md, "Handshakes"). Such work waits
// here, on the host, until every flag a stream waits for is written. Once everything has run once
// nothing waits. The flags are written by the device, so the wait polls them (20 us, doubling to
// 1 ms), bounded by residency.wait_limit.
CUresult Residency::settle(const std::string& what, std::string* why, bool hold,
                           uint64_t limit_ns) {
  const uint64_t start = trace::now_ns();
  auto pause = std::chrono::microseconds(20);
  bool waited = false;
  // Counted from the first wait (held: from the start) until this returns, or, held, until the
  // caller's Quiet is released.
  struct Settling {
    Residency& r;
    bool counted = false;
    void count() {
      if (counted) return;
      std::lock_guard<std::mutex> lock(r.mutex_);
      ++r.settling_;
      r.gates_.lower_all();  // first-time work waits for every parked stream, these too
      counted = true;
    }
    ~Settling() {
      if (!counted) return;
      std::lock_guard<std::mutex> lock(r.mutex_);
      --r.settling_;
    }
  } settling{*this};
  if (hold) settling.count();
  for (;;) {
    uint64_t limit = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!any_parked_locked()) {
        if (waited) {
          ++stats_.settle_waits;
          stats_.settle_wait_us += trace::us_since(start);
        }
        if (hold) settling.counted = false;  // handed to the caller's Quiet
        return CUDA_SUCCESS;
      }
      limit = limit_ns != 0 ? std::min(limit_ns, settings_.wait_limit_ns) : settings_.wait_limit_ns;
    }
    waited = true;
    settling.count();
    if (trace::now_ns() - start > limit) {
      *why = what + " waited " + std::to_string(limit / 1000000) +
             " ms (residency.wait_limit) for streams parked on restores that did not land; "
             "first-time work cannot run while a stream is parked (docs/PLANNER.md, "
             "\"Handshakes\")";
      return CUDA_ERROR_LAUNCH_TIMEOUT;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

Stats Residency::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  Stats s = stats_;
  const D2hGates::Counts gates = gates_.counts();
  s.d2h_gate_raises = gates.raises;
  s.d2h_gate_timeouts = gates.timeouts;
  s.d2h_gate_us = gates.up_us;
  for (const auto& [ordinal, d] : devices_) {
    s.budget_bytes = budget_locked(*d).limit;
    break;
  }
  return s;
}

// =============================================================================================
// Workers
// =============================================================================================

bool Residency::start_watchdog(std::string* why) {
  // Started under mutex_ (the watchdog waits for it at its start): a device starting beside
  // this one then learns whether the watchdog runs before it counts on it, which a claim made
  // before the start would not tell it.
  std::lock_guard<std::mutex> lock(mutex_);
  if (watching_) return true;
  try {
    start_thread([this] { run_watchdog(); }).detach();
  } catch (const std::system_error& error) {
    *why = error.what();
    return false;
  }
  watching_ = true;
  return true;
}

void Residency::run_watchdog() {
  become_own_thread("vaswap-watch");
  for (;;) {
    std::string stalled;
    uint64_t limit = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      limit = settings_.wait_limit_ns;
      const uint64_t now = trace::now_ns();
      std::vector<StreamKey> keys;
      for (const auto& entry : parked_) keys.push_back(entry.first);
      for (const StreamKey& key : keys) {
        if (!parked_locked(key)) continue;  // every flag it waited for is written
        for (const FlagWait& w : parked_.at(key)) {
          if (now - w.since <= limit) continue;
          bool queued = false;  // the restore not yet taken by the mover
          uint64_t moving = 0;  // the slot whose restore the mover carries out now
          auto d = devices_.find(w.device);
          if (d != devices_.end()) {
            queued =
                std::any_of(d->second->jobs.begin(), d->second->jobs.end(), [&w](const Job& job) {
                  return job.kind == JobKind::restore && job.slot == w.slot;
                });
            moving = d->second->moving;
          }
          std::string mover_at;
          if (moving != 0 && moving != w.slot) {
            mover_at = " (the mover is at the restore of slot " + std::to_string(moving) + ")";
          } else if (moving == w.slot && d->second->mover_state.known) {
            mover_at = " (" + d->second->mover_state.describe() + ")";
          }
          // The flag is written once the mover has mapped the slot's pages.
          stalled = "vaswap's restore stream " + hex(reinterpret_cast<uintptr_t>(key.handle)) +
                    " has waited on the device (CUDA_ERROR_LAUNCH_TIMEOUT) for " +
                    std::to_string((now - w.since) / 1000000) + " ms (residency.wait_limit " +
                    std::to_string(limit / 1000000) + " ms) for the pages of the restore of slot " +
                    std::to_string(w.slot) + " on device " + std::to_string(w.device) +
                    ", whose flag holds " + std::to_string(w.flag.load()) + " and not yet " +
                    std::to_string(w.value) +
                    (queued ? "; the restore still waits for vaswap's mover" + mover_at
                            : "; the mover took it up and has not mapped the pages" + mover_at) +
                    ", and the launches that use the slot wait for its copy (device handshake: "
                    "docs/PLANNER.md, \"Handshakes\"; the host handshake, "
                    "residency.handshake=host, parks no stream)";
          break;
        }
        if (!stalled.empty()) break;
      }
    }
    if (!stalled.empty()) die(stalled);
    const uint64_t pause_ns = std::clamp<uint64_t>(limit / 8, 10000000, 250000000);
    std::this_thread::sleep_for(std::chrono::nanoseconds(pause_ns));
  }
}

[[noreturn]] void Residency::die(const std::string& message) {
  {
    // What the state was, for whoever debugs the hang (log.level: debug).
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (lock.owns_lock()) {
      for (const auto& [ordinal, d] : devices_) {
        log().debug(
            "device {}: committed {} physical {} (lent {}) jobs {} unmaps {} ({} in flight, the "
            "unmapper at slot {}, the mover at slot {}: {})",
            ordinal, d->committed, d->physical, d->lent, d->jobs.size(), d->unmaps.size(),
            d->unmaps_in_flight, d->unmapping, d->moving, d->mover_state.describe());
        for (const Job& job : d->jobs) {
          size_t open = 0, running = 0;
          for (const MarkRef& m : job.waits) {
            open += m->closed() ? 0 : 1;
            running += m->closed() && !m->complete(drv()) ? 1 : 0;
          }
          log().debug("  job: {} slot {} waits {} ({} open, {} running) ahead {} sequence {}",
                      job.kind == JobKind::restore ? "restore" : "evict", job.slot,
                      job.waits.size(), open, running, job.ahead, job.sequence);
        }
      }
      for (const auto& [key, waits] : parked_) {
        for (const FlagWait& w : waits) {
          log().debug(
              "stream {}: waits on the device for flag {} (slot {}) to reach {}; it holds {}",
              hex(reinterpret_cast<uintptr_t>(key.handle)), hex(w.flag.device), w.slot, w.value,
              w.flag.load());
        }
      }
      for (const auto& [slot, e] : entries_) {
        log().debug(
            "slot {}: where {} mapped {} evictions {}/{} (the last decided at {}) ready {} flag {} "
            "landed {} ahead {} pins {} busy {} graphs {}",
            e.id, static_cast<int>(e.where), e.mapped, e.evictions_done, e.evictions_decided,
            e.eviction_sequence, e.ready, *e.flag.host, e.landed, e.ahead, e.pins, e.busy,
            e.d2h_exec != nullptr);
      }
    }
  }
  end_process("residency", message);
}

// Polls an event with a short backoff, bounded by residency.wait_limit; an error (a device that
// faulted) ends the wait at once.
CUresult Residency::wait_event(CUevent event, bool* timed_out) {
  *timed_out = false;
  const Driver& driver = drv();
  const uint64_t start = trace::now_ns();
  auto pause = std::chrono::microseconds(5);
  uint64_t limit = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    limit = settings_.wait_limit_ns;
  }
  for (;;) {
    const CUresult rc = driver.cuEventQuery(event);
    if (rc != CUDA_ERROR_NOT_READY) return rc;
    if (trace::now_ns() - start > limit) {
      *timed_out = true;
      return CUDA_ERROR_LAUNCH_TIMEOUT;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(200));
  }
}

std::string Residency::wait_failure(CUresult rc, bool timed_out, const std::string& subject) {
  if (!timed_out) return cuda_failure("cuEventQuery", rc, subject);
  uint64_t limit = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    limit = settings_.wait_limit_ns;
  }
  return subject + " did not complete within residency.wait_limit (" +
         std::to_string(limit / 1000000) +
         " ms; CUDA_ERROR_LAUNCH_TIMEOUT): a copy engine or the device is stuck, or the limit is "
         "too short for this job (raise residency.wait_limit)";
}

void Residency::run_mover(Device& d) {
  const Driver& driver = drv();
  become_worker(driver, d.context, "vaswap-mov" + std::to_string(d.ordinal));
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      d.jobs_cv.wait(lock, [&d] { return !d.jobs.empty() || d.retired; });
      if (d.retired) return;
      job = std::move(d.jobs.front());
      d.jobs.pop_front();
      d.moving = job.kind == JobKind::restore ? job.slot : 0;
      d.mover_state = MoverState();
    }
    if (job.kind == JobKind::restore) {
      do_restore(d, job);
    } else {
      do_evict(d, job);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    d.moving = 0;
    d.mover_state = MoverState();
  }
}

// While a restore waits for room, the mover keeps memory moving: evictions queued behind it go
// first where they can (not past a restore of the same slot), and, failing that, a slot nothing
// in flight uses is evicted (its last uses recorded and complete). The auto budget moves with the
// program's own allocations after decisions were made; this is how a restore that counted on
// pages the program took since still gets room. True when something was set going.
bool Residency::relieve(Device& d, uint64_t restoring) {
  {
    // Evictions on their way free pages by themselves: wait for them before taking more.
    std::lock_guard<std::mutex> lock(mutex_);
    if (d.unmaps_in_flight > 0) return false;
  }
  // Evictions queued behind the stuck restore whose last uses are complete: their copies cannot
  // hold the offload stream behind work that waits for this very restore.
  struct Eligible {
    uint64_t slot;
    std::vector<MarkRef> waits;
    bool landed;  // the restore it follows (if any) has published
  };
  std::vector<Eligible> eligible;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<uint64_t> restores_before;
    for (const Job& job : d.jobs) {
      if (job.kind == JobKind::restore) {
        restores_before.push_back(job.slot);
        continue;
      }
      if (job.slot == restoring || std::find(restores_before.begin(), restores_before.end(),
                                             job.slot) != restores_before.end()) {
        continue;
      }
      bool landed = !job.after_restore;
      if (!landed) {
        // The restore it follows is done: the completion thread saw its copy end, or the mover
        // mapped it (no data).
        const Entry* e = by_id_locked(job.slot);
        landed = e != nullptr && static_cast<int32_t>(e->landed - job.ready) >= 0;
      }
      if (landed) eligible.push_back({job.slot, job.waits, landed});
    }
  }
  const Driver& driver = drv();
  for (const Eligible& candidate : eligible) {
    const uint64_t slot = candidate.slot;
    const auto& waits = candidate.waits;
    const bool complete = std::all_of(waits.begin(), waits.end(),
                                      [&driver](const MarkRef& m) { return m->complete(driver); });
    if (!complete) continue;
    Job ahead;
    bool taken = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto it = d.jobs.begin(); it != d.jobs.end(); ++it) {
        if (it->kind == JobKind::evict && it->slot == slot) {
          ahead = std::move(*it);
          d.jobs.erase(it);
          taken = true;
          break;
        }
      }
    }
    if (taken) {
      do_evict(d, ahead);
      return true;
    }
  }
  return evict_idle(d, restoring);
}

bool Residency::evict_idle(Device& d, uint64_t restoring) {
  struct Candidate {
    uint64_t id;  // looked up again under the lock: the slot may be freed meanwhile
    std::vector<MarkRef> marks;
  };
  std::vector<Candidate> candidates;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<Entry*> entries;
    for (auto& [slot, e] : entries_) {
      if (e.device != d.ordinal || e.id == restoring || e.where != Where::resident || !e.mapped ||
          e.pins > 0 || e.busy > 0 || e.evictions_done != e.evictions_decided) {
        continue;
      }
      const bool recorded = std::all_of(e.marks.begin(), e.marks.end(),
                                        [](const Mark& m) { return m.record->closed(); });
      if (recorded) entries.push_back(&e);
    }
    std::stable_sort(entries.begin(), entries.end(), [this](const Entry* a, const Entry* b) {
      return distance_locked(*a) > distance_locked(*b);
    });
    for (const Entry* e : entries) {
      Candidate c{e->id, {}};
      for (const Mark& m : e->marks) c.marks.push_back(m.record);
      candidates.push_back(std::move(c));
    }
  }
  const Driver& driver = drv();
  for (Candidate& c : candidates) {
    const bool done = std::all_of(c.marks.begin(), c.marks.end(),
                                  [&driver](const MarkRef& m) { return m->complete(driver); });
    if (!done) continue;
    Entry* entry = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      entry = by_id_locked(c.id);
      if (entry != nullptr) ++entry->pins;  // held while its host copy is made
    }
    if (entry == nullptr) continue;
    std::string why;
    bool copy = ensure_host_copies(std::vector<uint64_t>{c.id}, &why);  // no submit_ held
    // Device handshake: its copy graphs, so that its next restore goes ahead (a restore without
    // them would make a launch wait on the host). Uploaded on the host path's streams: the ones
    // of the device handshake belong to the application's threads.
    // (Looked up again: the program may have freed it meanwhile; a pin does not stop that.)
    if (copy && d.device_handshake) {
      Slot* slot = nullptr;
      void* host = nullptr;
      bool make = false;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (Entry* e = by_id_locked(c.id)) {
          slot = e->slot;
          host = e->host;
          make = e->has_data && e->host != nullptr && e->d2h_exec == nullptr && e->mapped &&
                 e->busy == 0;
          if (make) ++e->busy;
        }
      }
      // The mover sees to parked streams itself: it makes graphs only while none is parked
      // (make_graphs_first says why), and otherwise leaves them to the slot's next eviction.
      const BusyHold hold(*this, make ? c.id : 0);
      if (make && try_quiet()) {
        make_copy_graphs(d, c.id, slot, host, d.offload, d.restore);
        unquiet();
      }
    }
    Actions actions;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Entry* e = by_id_locked(c.id);
      if (e == nullptr) continue;
      --e->pins;
      if (!copy) continue;
      // Still idle, with the same last uses (an application thread may have used it meanwhile),
      // and, holding data, with its host buffer (never evicted without one).
      bool same = e->where == Where::resident && e->pins == 0 && e->mapped &&
                  e->marks.size() == c.marks.size() && (!e->has_data || e->host != nullptr);
      for (size_t i = 0; same && i < c.marks.size(); ++i) same = e->marks[i].record == c.marks[i];
      if (!same) continue;
      evict_locked(*e, "room", &actions);
    }
    for (const Mark& m : actions.marks[0]) actions.jobs[0].waits.push_back(m.record);
    actions.jobs[0].last_uses = actions.marks[0];
    do_evict(d, actions.jobs[0]);
    return true;
  }
  return false;
}

// residency.d2h_gate: while a restore waits for room, the evictions' D2Hs not yet begun wait on
// the device (evict_ahead) until it has mapped, so that its cuMemSetAccess does not wait behind
// one (docs/PERFORMANCE.md, fact 6). Raised once per restore, only while a D2H has begun and not
// ended (its room is on its way), never while first-time work settles (such work waits for every
// parked stream, on the H200 as in the simulator, and the map waits for it). Lowered once the
// restore has mapped, when it gives up, when first-time work begins to settle, and by the
// gatekeeper (plan/d2h_gate.h) at its limit: a restore whose room needs copies the gate holds, or
// a map that waits for a thread that waits for the parked copies, goes on then.
class Residency::GateHold {
 public:
  GateHold(Residency& r, Device& d) : r_(r), d_(d) {}
  GateHold(const GateHold&) = delete;
  GateHold& operator=(const GateHold&) = delete;
  ~GateHold() { lower(); }

  bool up() const { return raised_ && r_.gates_.up(d_.ordinal); }
  // Called while the restore waits for room.
  void consider() {
    if (d_.gate.host == nullptr || raised_) return;
    const uint64_t running = r_.d2h_running(d_);
    if (running > 0) raised_ = r_.raise_gate(d_, running);
  }
  void lower() {
    if (raised_) r_.gates_.lower(d_.ordinal);
  }

 private:
  Residency& r_;
  Device& d_;
  bool raised_ = false;
};

// For at most the time the largest D2H running should take (gate_limit_ns).
bool Residency::raise_gate(Device& d, uint64_t d2h_bytes) {
  const uint64_t limit_ns =
      gate_limit_ns(d2h_bytes, engine().device_costs().gbps(d.ordinal, true, 0.1));
  std::lock_guard<std::mutex> lock(mutex_);  // against settle's count: never up while it settles
  if (settling_ > 0) return false;
  return gates_.raise(d.ordinal, limit_ns);
}

// The bytes of the largest eviction whose D2H has begun on the device (its start event, recorded
// after the gate's wait, has completed) and not ended; 0 when none. The events are queried after
// the lock is dropped: every application thread's decision takes it, and a driver call may wait
// behind a map (docs/PERFORMANCE.md, fact 6). An eviction that ends meanwhile hands its events
// back as spares, and one recorded again by then gives a wrong answer, which only decides whether
// the gate goes up.
uint64_t Residency::d2h_running(Device& d) {
  std::vector<Device::CopyOut> copies;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    copies = d.copies_out;
  }
  const Driver& driver = drv();
  uint64_t largest = 0;
  for (const Device::CopyOut& c : copies) {
    if (c.bytes > largest && driver.cuEventQuery(c.start) == CUDA_SUCCESS &&
        driver.cuEventQuery(c.done) == CUDA_ERROR_NOT_READY) {
      largest = c.bytes;
    }
  }
  return largest;
}

// A restore decided for a copy recorded into a capture (back_for_capture waits for its map on the
// capturing thread) whose map keeps failing out of memory, with nothing in flight or queued that
// could give pages back: it is given up, the slot goes back where it was, and the copy is refused
// at once. On an H100 left 24 MiB, a 2 MiB cuMemCreate failed where cuMemGetInfo said there was
// room, and the copy waited residency.wait_limit (bench/results/gpu_checks_session53_84fc099_
// h100.md). Only a restore that nothing else waits for: none enqueued ahead on the restore stream
// (a capture's restores take the host path under the device handshake too: restore_locked), no
// stream waiting for it, no later restore of the slot, no pin but the copy's.
bool Residency::give_up_for_capture(Device& d, const Job& job, CUresult failed_with,
                                    const std::string& failure) {
  if (!job.for_capture || job.ahead || failed_with != CUDA_ERROR_OUT_OF_MEMORY) {
    return false;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  Entry* e = by_id_locked(job.slot);
  const bool evictions_queued = std::any_of(d.jobs.begin(), d.jobs.end(),
                                            [](const Job& j) { return j.kind == JobKind::evict; });
  if (e == nullptr || e->mapped || e->where != Where::resident || e->ready != job.ready ||
      !e->waited.empty() || e->pins > 1 || d.unmaps_in_flight > 0 || evictions_queued) {
    return false;
  }
  d.committed -= e->pages;
  e->where = job.before;
  e->no_pages = failure;
  --(job.before == Where::unbacked ? stats_.first_maps : stats_.restores);  // none took place
  d.mover_state = MoverState();
  changed_.notify_all();
  return true;
}

void Residency::do_restore(Device& d, const Job& job) {
  GateHold gate(*this, d);
  Slot* slot = nullptr;
  void* host = nullptr;
  Flag flag;
  std::string failure;
  CUresult failed_with = CUDA_SUCCESS;  // the last failed map's code
  const uint64_t start_ns = trace::now_ns();
  // Never skipped for a later decision: an eviction decided after it follows it in this queue and
  // copies out of the pages it maps.
  bool relief_failed = false;  // the last relieve() found nothing to set going
  for (int attempt = 0;; ++attempt) {
    bool ready = false;
    bool reusable = false;  // a kept handle of this size: mapping it adds nothing
    std::optional<uint64_t> trim_to;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Entry* e = by_id_locked(job.slot);
      if (e == nullptr || e->forgotten) return;
      slot = e->slot;
      flag = e->flag;
      host = e->host;
      if (e->evictions_done >= job.after_evictions) {  // its own eviction runs first
        if (e->mapped) {
          // That eviction could not unmap: pages and data stayed where they were. Publish (for
          // the latest restore only: see the end of this function).
          if (static_cast<int32_t>(job.ready - e->ready) >= 0) e->submitted = true;
          e->mapped_ready = job.ready;
          // In place already (a reclaim checked that the restore the eviction followed had
          // landed): a later eviction of the slot counts as one that can make room (relieve).
          // The device handshake's H2D, enqueued already, copies the same data again: it lands
          // when the completion thread sees it.
          if (!(job.ahead && job.with_data) && static_cast<int32_t>(job.ready - e->landed) > 0) {
            e->landed = job.ready;
          }
          if (d.device_handshake) flag.store(job.ready);
          changed_.notify_all();
          return;
        }
        // A size budget caps what slots hold at once. The auto one moves with the program's own
        // allocations: the device says whether there is room (cuMemCreate). Either way, handles
        // kept from evictions (a restore of the same size maps one: its copy then runs at the
        // link's speed, docs/PERFORMANCE.md) count within the budget: they are released first
        // when this restore needs their room.
        const uint64_t budget = budget_locked(d).target;
        const uint64_t kept = engine().spare_bytes(d.ordinal, e->pages, &reusable);
        const uint64_t adds = reusable ? 0 : e->pages;
        ready = settings_.budget_bytes == 0 || d.physical + e->pages <= settings_.budget_bytes;
        // Device handshake: the work that would give room back may be queued on the device behind
        // this very restore (a slot the program allocated meanwhile got pages at once, beyond
        // the decision's count; the other evictions wait for uses enqueued after this restore's
        // wait). With no eviction on its way that was decided before it (one decided after it
        // may be enqueued behind its wait: on a device where a waiting stream holds back later
        // work, as the H200 did, it never runs) and nothing to relieve, the restore maps beyond a
        // size budget rather than wait forever; the next decisions evict back under it.
        // The same for a restore that took the host path (no copy graphs yet, a host-path
        // eviction pending, a settle): it parks no stream itself, but the restores decided after
        // it queue behind it here, and an eviction decided after it may be enqueued behind their
        // waits (the stress probe under VASWAP_SIM_SINGLE_QUEUE=1, about one run in 20: such a
        // restore waited for the eviction of a slot whose D2H was held back by the parked
        // restores behind it, while slots the program allocated meanwhile filled the budget).
        const bool none_before =
            d.unmaps_in_flight == 0 || !evictions_before_locked(d, job.sequence);
        if (!ready && d.device_handshake && none_before && relief_failed &&
            trace::now_ns() - start_ns >
                std::min<uint64_t>(settings_.wait_limit_ns / 4, kOvershootAfterNs)) {
          ready = true;
          ++stats_.budget_overshoots;
          if (!said_overshoot_) {
            said_overshoot_ = true;
            log().warn(
                "device {}: the restore of slot {} maps beyond residency.budget ({} held, {} "
                "more): what would make room waits on the device behind it; later decisions "
                "evict back under the budget (the summary counts budget_overshoots)",
                d.ordinal, job.slot, byte_size(d.physical), byte_size(e->pages));
          }
        }
        // Mapping a kept handle adds nothing to what the device holds: nothing to trim for it.
        if (ready && !reusable && d.physical + kept + adds > budget) {
          trim_to = budget > d.physical + e->pages ? budget - d.physical - e->pages : 0;
        }
        if (ready) ++e->busy;
        MoverState& state = d.mover_state;
        state.known = true;
        state.mapping = ready;
        state.physical = d.physical;
        state.budget = settings_.budget_bytes;
        state.pages = e->pages;
        state.unmaps_in_flight = d.unmaps_in_flight;
        state.none_before = none_before;
        state.relief_failed = relief_failed;
        state.attempt = attempt;
        if (!failure.empty()) state.failure = failure;
      }
    }
    if (trim_to) engine().trim_spares(d.ordinal, *trim_to);
    if (ready) {
      // Map: pages are never visible before their data (DESIGN.md invariant 10): the copy
      // follows at once on the restore stream, and nothing waiting for the slot runs before it
      // lands.
      // What the device reports free before the map, for learn_held_back after a refused
      // cuMemCreate. A kept handle of the size is mapped without one: nothing to read (a
      // cuMemGetInfo per restore, on the path every restore's turnaround waits for).
      const std::optional<uint64_t> mark = reusable ? std::nullopt : engine().given_back_mark();
      const std::optional<uint64_t> free_before =
          mark ? engine().free_memory(d.ordinal) : std::nullopt;
      try {
        engine().back(slot, BatchTiming{job.slot, 0, trace::us_since(job.decided_ns)},
                      /*report=*/false);
        gate.lower();
        break;
      } catch (const Error& error) {
        failure = error.what();
        failed_with = error.driver_result();
        {
          std::lock_guard<std::mutex> lock(mutex_);
          if (Entry* e = by_id_locked(job.slot)) --e->busy;
        }
        // Only a refused cuMemCreate says the device kept pages back: a cuMemMap or
        // cuMemSetAccess out of memory had its pages and gave them back.
        const bool refused = failed_with == CUDA_ERROR_OUT_OF_MEMORY &&
                             error.driver_call() != nullptr &&
                             std::strcmp(error.driver_call(), "cuMemCreate") == 0;
        if (refused && mark && free_before) {
          learn_held_back(d, slot->mapped_bytes, *mark, *free_before);
        }
      }
    }
    uint64_t limit = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      limit = settings_.wait_limit_ns;
    }
    if (trace::now_ns() - start_ns > limit) {
      die("the restore of slot " + std::to_string(job.slot) + " on device " +
          std::to_string(d.ordinal) + " found no room for " + std::to_string(limit / 1000000) +
          " ms (" + std::to_string(attempt + 1) + " tries" +
          (failure.empty() ? std::string(", the budget full") : ": " + failure) +
          "). Its data is safe in pinned host memory, but the launch waiting for it cannot run");
    }
    // While the gate is up, the room comes from a D2H already running: relief would set going
    // copies the gate holds, or make copy graphs, which wait for every parked stream.
    relief_failed = gate.up() || !relieve(d, job.slot);
    if (relief_failed && !gate.up() && attempt >= 2 &&
        give_up_for_capture(d, job, failed_with, failure)) {
      return;
    }
    if (relief_failed) {
      gate.consider();
      // With the gate up, every millisecond: it comes down at its limit.
      const auto backoff = std::chrono::microseconds(
          gate.up() ? 1000 : 1000 * std::min(1 << std::min(attempt, 6), 64));
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait_for(lock, backoff);
    }
  }
  CUresult rc = CUDA_SUCCESS;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Entry* e = by_id_locked(job.slot);
    d.mover_state = MoverState();
    d.physical += slot->mapped_bytes;
    stats_.resident_bytes += slot->mapped_bytes;
    stats_.peak_resident = std::max(stats_.peak_resident, stats_.resident_bytes);
    if (e != nullptr) {
      e->mapped = true;
      e->mapped_ready = job.ready;
      if (!job.with_data) e->landed = job.ready;  // nothing to copy: in place once mapped
    }
  }
  changed_.notify_all();
  if (job.ahead) {
    // Its copy waits on the restore stream for the flag: pages are never visible before their
    // data (DESIGN.md invariant 10), as the launches that use them wait for its ready event.
    flag.store(job.ready);
    std::lock_guard<std::mutex> lock(mutex_);
    if (Entry* e = by_id_locked(job.slot)) {
      --e->busy;
      if (static_cast<int32_t>(job.ready - e->ready) >= 0) e->submitted = true;
    }
    changed_.notify_all();
    return;
  }
  if (d.device_handshake) flag.store(job.ready);  // flags only grow: no restore waits for it
  const Driver& driver = drv();
  CUevent ready_event = nullptr;
  if (job.with_data) {
    Copied copied{job.slot, slot->va,  slot->bytes, spare_event(d), spare_event(d),
                  0,        job.ready, Flag{},      false};
    driver.cuEventRecord(copied.start, d.restore);
    rc = with_retries(
        [&] { return driver.cuMemcpyHtoDAsync(slot->va, host, slot->bytes, d.restore); });
    if (rc != CUDA_SUCCESS) {
      die(cuda_failure("cuMemcpyHtoDAsync", rc, slot->describe()) +
          ". Its data is safe in pinned host memory");
    }
    record_or_die(driver, copied.end, d.restore,
                  "the end of the restore copy of " + slot->describe());
    copied.queued_ns = trace::now_ns();
    std::lock_guard<std::mutex> lock(mutex_);
    ++d.h2d_in_flight;
    d.copies.push_back(copied);
    d.copies_cv.notify_all();
  }
  if (job.with_data) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Entry* e = by_id_locked(job.slot);
      if (e != nullptr) ready_event = e->ready_event;
    }
    if (ready_event == nullptr) {
      const CUresult made = driver.cuEventCreate(&ready_event, CU_EVENT_DISABLE_TIMING);
      if (made != CUDA_SUCCESS) {
        die(cuda_failure("cuEventCreate", made, "the ready event of " + slot->describe()) +
            ". Its data is safe in pinned host memory");
      }
    }
    record_or_die(driver, ready_event, d.restore, "the ready event of " + slot->describe());
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Entry* e = by_id_locked(job.slot);
    if (e != nullptr) {
      --e->busy;
      // Submitted means the *latest* restore decided for the slot is: a launch waits for that one.
      // A restore overtaken by a later decision (a prefetch, then an eviction for room, then a
      // restore on demand) publishes nothing; a launch that took it for the latest ran while the
      // eviction between them unmapped the pages (the simulator's device fault in
      // capacity_test's tight_80, about one run in 400).
      if (static_cast<int32_t>(job.ready - e->ready) >= 0) e->submitted = true;
      if (job.with_data) e->ready_event = ready_event;
    } else if (ready_event != nullptr) {
      driver.cuEventDestroy(ready_event);
    }
  }
  changed_.notify_all();
}

// Queues the eviction for the unmapper, which copies the slot out once everything it waits for
// has completed: the unmapper checks the slot's last uses (its marks) and the restore it follows
// on the host, then enqueues the D2H (see submit_copy). Under the device handshake the D2H was
// enqueued when the eviction was decided (evict_ahead), and the unmapper waits for it.
void Residency::do_evict(Device& d, const Job& job) {
  Unmap unmap;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Entry* e = by_id_locked(job.slot);
    if (e == nullptr || e->forgotten) return;
    if (!e->mapped) {
      // Never mapped (a first map was decided and called off by this eviction before it ran):
      // nothing to copy or unmap.
      ++e->evictions_done;
      if (e->where == Where::releasing) e->where = Where::unbacked;
      changed_.notify_all();
      return;
    }
    unmap.slot = job.slot;
    unmap.bytes = e->bytes;
    unmap.copied = job.with_data;
    unmap.may_keep = std::string_view(job.cause) != "program";
    unmap.reclaimable = unmap.may_keep && std::string_view(job.cause) != "rule";
    unmap.hand_to = job.hand_to;
    unmap.waits = job.waits;
    unmap.last_uses = job.last_uses;
    unmap.after_restore = job.after_restore;
    unmap.restore = job.ready;
    // The device handshake enqueued its D2H when it was decided.
    unmap.submitted = job.ahead;
    unmap.start = job.start;
    unmap.done = job.done;
    unmap.out = job.ahead ? job.out : d.offload;
    unmap.queued_ns = trace::now_ns();
    if (unmap.start != nullptr && unmap.done != nullptr) {
      d.copies_out.push_back({unmap.start, unmap.done, unmap.bytes});
    }
    ++d.unmaps_in_flight;
    d.unmaps.push_back(std::move(unmap));
  }
  d.unmaps_cv.notify_all();
}

// True once the eviction's last uses have completed and the restore it follows has landed.
bool Residency::dependencies_done(const Unmap& unmap) {
  {
    // A slot the program freed meanwhile has nothing left to copy: its eviction is over. Held
    // busy while its events are read, so its free does not destroy them under this thread.
    std::lock_guard<std::mutex> lock(mutex_);
    Entry* e = by_id_locked(unmap.slot);
    if (e == nullptr || e->forgotten) return true;
    ++e->busy;
  }
  const BusyHold hold(*this, unmap.slot);
  const Driver& driver = drv();
  for (const MarkRef& mark : unmap.waits) {
    CUresult failure = CUDA_SUCCESS;
    if (!mark->complete(driver, &failure)) {
      if (failure != CUDA_SUCCESS) {
        die(cuda_failure("cuEventQuery", failure,
                         "the last use of slot " + std::to_string(unmap.slot) +
                             " before its eviction (the device faulted in the work it follows)"));
      }
      return false;  // not closed yet (its stream captures), or still running
    }
  }
  return restore_landed(unmap);
}

// True once the restore the eviction follows (if any) has landed: the completion thread saw its
// copy end, or the mover mapped it (no data). Not the slot's ready event: under the device
// handshake a later restore of the slot records it again when it is decided, before this
// eviction's pages are gone.
bool Residency::restore_landed(const Unmap& unmap) {
  if (!unmap.after_restore) return true;
  std::lock_guard<std::mutex> lock(mutex_);
  const Entry* e = by_id_locked(unmap.slot);
  return e == nullptr || static_cast<int32_t>(e->landed - unmap.restore) >= 0;
}

// A restore of the slot decided while its eviction had not yet unmapped (the plan's release and
// its next restore close together, or a launch that needs it again): the slot still has its pages
// and its data, so the eviction ends here, before its copy or after it, without an unmap. The
// restore then publishes at once (do_restore finds the slot mapped) and moves nothing: the
// application's thread, which waits for a restore's submission under the host handshake, does not
// wait for this eviction's device work, an unmap, a map and an H2D. Only once the restore the
// eviction follows has landed (its data is in the pages, and its flag will not be written again
// behind the new restore's), and only for the slot's one pending eviction.
// Never while another slot's restore is being carried out or queued ahead of this slot's: a
// restore decided after the eviction counts on the pages it gives back (the stress suite
// deadlocked so: that restore waited for room ahead of the eviction that would have made it),
// nor for the program's out-of-memory, whose retry waits for those pages, nor for a rule's
// offload (rules mode moves exactly what its rules say).
bool Residency::reclaim(Device& d, const Unmap& unmap, bool copied, CUdeviceptr* va) {
  if (!unmap.reclaimable) return false;
  {
    // Held busy while the restore's event is read, so a free does not destroy it meanwhile.
    std::lock_guard<std::mutex> lock(mutex_);
    Entry* e = by_id_locked(unmap.slot);
    if (e == nullptr || e->forgotten || e->where != Where::resident) return false;
    ++e->busy;
  }
  const BusyHold hold(*this, unmap.slot);
  if (!restore_landed(unmap)) return false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Entry* e = by_id_locked(unmap.slot);
    if (e == nullptr || e->forgotten || e->where != Where::resident || !e->mapped ||
        e->evictions_decided != e->evictions_done + 1) {
      return false;
    }
    if (d.moving != 0 && d.moving != unmap.slot) return false;
    for (const Job& job : d.jobs) {
      if (job.kind != JobKind::restore) continue;
      if (job.slot == unmap.slot) break;
      return false;  // another slot's restore is queued ahead of this one's
    }
    ++e->evictions_done;  // where, committed and physical already count the slot: resident
    if (va != nullptr) *va = e->slot->va;
    // The eviction took the slot's last uses with it; those still running (on other streams than
    // the uses since) are the slot's again, so that its next eviction waits for them too. A use
    // since on the same stream follows the old one there.
    for (const Mark& old : unmap.last_uses) {
      const bool newer = std::any_of(e->marks.begin(), e->marks.end(),
                                     [&old](const Mark& m) { return m.stream == old.stream; });
      if (!newer) e->marks.push_back(old);
    }
    ++stats_.reclaims;
    give_back_events_locked(d, unmap);
    --d.unmaps_in_flight;
    if (trace::enabled()) {
      trace::Record(trace::Event::reclaim)
          .add("slot", unmap.slot)
          .hex("va", e->slot->va)
          .add("bytes", e->pages)
          .add("device", d.ordinal)
          .add("copied", copied)
          .add("ready", static_cast<uint64_t>(e->ready))
          .add("lag_us", trace::us_since(unmap.queued_ns))
          .emit();
    }
  }
  changed_.notify_all();
  return true;
}

// The D2H of an eviction whose dependencies are done, on the offload stream, between two timing
// events. False when the copy could not be enqueued: the slot stays resident with its data
// (invariant 7), and the eviction is over.
bool Residency::submit_copy(Device& d, Unmap& unmap) {
  const Driver& driver = drv();
  Slot* slot = nullptr;
  void* host = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Entry* e = by_id_locked(unmap.slot);
    if (e != nullptr && !e->forgotten) {
      slot = e->slot;
      host = e->host;
      // The program's free waits until the copy is enqueued (then its synchronize covers it):
      // never a copy from a VA, or into a host buffer, that is gone.
      ++e->busy;
    }
  }
  const BusyHold hold(*this, slot != nullptr ? unmap.slot : 0);
  unmap.submitted = true;
  if (slot == nullptr || !unmap.copied) {
    // Nothing to copy (a slot never written, or freed meanwhile): nothing for the device to do.
    // Its last uses have completed (dependencies_done), so it is unmapped now. Events on the
    // offload stream would end only behind the copies enqueued there before them, and under
    // the device handshake a stream may be parked on a restore that counts on this slot's pages:
    // on the H200 such an eviction's events never completed while four threads' streams were
    // parked (bench/results/copy_h200.md), and the restores waiting for its room never landed.
    unmap.start = unmap.done = nullptr;
    return true;
  }
  unmap.start = spare_event(d);
  unmap.done = spare_event(d);
  driver.cuEventRecord(unmap.start, d.offload);
  const CUresult rc = with_retries(
      [&] { return driver.cuMemcpyDtoHAsync(host, slot->va, slot->bytes, d.offload); });
  if (rc != CUDA_SUCCESS) {
    log().error("{}; the slot stays resident",
                cuda_failure("cuMemcpyDtoHAsync", rc, slot->describe()));
    record_or_die(driver, unmap.done, d.offload,
                  "the end of the eviction of slot " + std::to_string(unmap.slot));
    return false;
  }
  record_or_die(driver, unmap.done, d.offload,
                "the end of the eviction of slot " + std::to_string(unmap.slot));
  std::lock_guard<std::mutex> lock(mutex_);
  d.copies_out.push_back({unmap.start, unmap.done, unmap.bytes});
  return true;
}

// Records an event that a worker waits for before it acts (unmaps, publishes): an event that was
// never recorded reads as complete, so a record that fails after retries ends the process
// instead of letting pages go or data show early.
void Residency::record_or_die(const Driver& driver, CUevent event, CUstream stream,
                              const std::string& subject) {
  const CUresult rc = with_retries([&] { return driver.cuEventRecord(event, stream); });
  if (rc != CUDA_SUCCESS) die(cuda_failure("cuEventRecord", rc, subject));
}

// A timing event from the device's spares, or a new one.
CUevent Residency::spare_event(Device& d) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!d.spare_events.empty()) {
      CUevent event = d.spare_events.back();
      d.spare_events.pop_back();
      return event;
    }
  }
  CUevent event = nullptr;
  ContextScope scope(drv(), d.context);
  const CUresult made = drv().cuEventCreate(&event, CU_EVENT_DEFAULT);
  if (made != CUDA_SUCCESS) {
    die(cuda_failure("cuEventCreate", made,
                     "a copy's timing on device " + std::to_string(d.ordinal)));
  }
  return event;
}

// Restore copies complete in order on their stream: this thread waits for each of `copies`,
// counts it and writes its `h2d` event with the time the device took.
void Residency::run_completions(Device& d, std::deque<Copied>& copies, const char* name) {
  const Driver& driver = drv();
  become_worker(driver, d.context, name + std::to_string(d.ordinal));
  for (;;) {
    Copied copied;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      d.copies_cv.wait(lock, [&] { return !copies.empty() || d.retired; });
      if (d.retired) return;
      copied = copies.front();
      copies.pop_front();
    }
    for (auto pause = std::chrono::microseconds(20);
         copied.ahead && static_cast<int32_t>(copied.flag.load() - copied.ready) < 0;) {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
    bool timed_out = false;
    const CUresult rc = wait_event(copied.end, &timed_out);
    if (rc != CUDA_SUCCESS) {
      die(wait_failure(rc, timed_out,
                       "the restore copy of slot " + std::to_string(copied.slot) + " on device " +
                           std::to_string(d.ordinal)));
    }
    const uint64_t done_ns = trace::now_ns();
    float ms = 0;
    driver.cuEventElapsedTime(&ms, copied.start, copied.end);
    engine().count_copy(d.ordinal, false, copied.bytes, static_cast<double>(ms) * 1e3);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (Entry* e = by_id_locked(copied.slot)) {
        if (static_cast<int32_t>(copied.ready - e->landed) > 0) e->landed = copied.ready;
      }
    }
    changed_.notify_all();
    if (trace::enabled()) {
      const auto back_ns = static_cast<uint64_t>(ms * 1e6f);
      trace::Record(trace::Event::h2d)
          .at(done_ns - std::min(back_ns, done_ns))
          .add("slot", copied.slot)
          .hex("va", copied.va)
          .add("bytes", copied.bytes)
          .add("device", d.ordinal)
          .hex("stream", stream_id(copied.ahead ? d.ahead_in : d.restore))
          .add("batch", copied.slot)
          .add("dur_us", static_cast<double>(ms) * 1e3)
          .emit();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --d.h2d_in_flight;
      d.spare_events.push_back(copied.start);
      d.spare_events.push_back(copied.end);
    }
    changed_.notify_all();
  }
}

// Evictions in the order they were decided: each one's D2H is enqueued once its last uses have
// completed and the restore it follows has landed (checked here, on the host), then its pages
// are unmapped once the copy is done. While waiting for the first, every later one whose
// dependencies are already done has its copy enqueued too, so the copies follow each other on the
// offload stream.
void Residency::run_unmapper(Device& d) {
  const Driver& driver = drv();
  become_worker(driver, d.context, "vaswap-unm" + std::to_string(d.ordinal));
  std::deque<Unmap> mine;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      d.unmaps_cv.wait(lock, [&] { return !d.unmaps.empty() || !mine.empty() || d.retired; });
      if (d.retired) return;
      while (!d.unmaps.empty()) {
        mine.push_back(std::move(d.unmaps.front()));
        d.unmaps.pop_front();
      }
    }
    // Under the device handshake copies were enqueued when decided, and end in any order: an
    // eviction whose copy has ended goes first. One waiting for a restore that waits for room
    // must not hold back the evictions that make it.
    const auto ended = [&driver](const Unmap& u) {
      return u.submitted && (u.done == nullptr || driver.cuEventQuery(u.done) == CUDA_SUCCESS);
    };
    const auto ended_behind = [&] { return std::any_of(mine.begin() + 1, mine.end(), ended); };
    // Evictions queued meanwhile, and those behind the first whose last uses are done, are
    // submitted while the first waits, whatever it waits for: one with nothing to copy then ends
    // at once (and goes first), one with a copy has it enqueued.
    const auto submit_behind = [&] {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        while (!d.unmaps.empty()) {
          mine.push_back(std::move(d.unmaps.front()));
          d.unmaps.pop_front();
        }
      }
      for (auto it = mine.begin() + 1; it != mine.end(); ++it) {
        if (!it->submitted && dependencies_done(*it)) it->failed = !submit_copy(d, *it);
      }
    };
    if (mine.size() > 1 && !ended(mine.front())) {
      auto first = std::find_if(mine.begin() + 1, mine.end(), ended);
      if (first != mine.end()) {
        Unmap moved = std::move(*first);
        mine.erase(first);
        mine.push_front(std::move(moved));
      }
    }
    Unmap& unmap = mine.front();
    uint64_t limit = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      d.unmapping = unmap.slot;
      limit = settings_.wait_limit_ns;
    }
    if (unmap.waiting_since == 0) unmap.waiting_since = trace::now_ns();
    if (!unmap.submitted) {
      auto pause = std::chrono::microseconds(5);
      bool reclaimed = false;
      bool behind = false;
      while (!(reclaimed = reclaim(d, unmap, false)) && !dependencies_done(unmap)) {
        submit_behind();
        if (ended_behind()) {
          behind = true;
          break;
        }
        if (trace::now_ns() - unmap.waiting_since > limit) {
          die(wait_failure(CUDA_ERROR_LAUNCH_TIMEOUT, true,
                           "the last uses before the eviction of slot " +
                               std::to_string(unmap.slot) + " on device " +
                               std::to_string(d.ordinal)) +
              stuck_part(driver, unmap));
        }
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(200));
      }
      if (behind) continue;
      if (reclaimed) {  // before its copy: nothing moved
        mine.pop_front();
        continue;
      }
      unmap.failed = !submit_copy(d, unmap);
    }
    bool timed_out = false;
    CUresult rc = CUDA_SUCCESS;
    for (auto pause = std::chrono::microseconds(5);;) {
      submit_behind();
      rc = unmap.done == nullptr ? CUDA_SUCCESS : driver.cuEventQuery(unmap.done);
      if (rc != CUDA_ERROR_NOT_READY || ended_behind()) break;
      if (trace::now_ns() - unmap.waiting_since > limit) {
        timed_out = true;
        rc = CUDA_ERROR_LAUNCH_TIMEOUT;
        break;
      }
      std::this_thread::sleep_for(pause);
      // A restore may be waiting for these pages: the copy's end is seen within 50 us of it
      // (up to 200 us added to each room's arrival before).
      pause = std::min(pause * 2, std::chrono::microseconds(50));
    }
    if (rc == CUDA_ERROR_NOT_READY) continue;   // another one's copy ended: it goes first
    const uint64_t ended_ns = trace::now_ns();  // the copy's end, seen within the poll's pause
    if (rc != CUDA_SUCCESS) {
      die(wait_failure(rc, timed_out,
                       "the eviction of slot " + std::to_string(unmap.slot) + " on device " +
                           std::to_string(d.ordinal)) +
          stuck_part(driver, unmap));
    }
    if (unmap.failed) {
      // The copy could not be enqueued: the slot keeps its pages and its data (invariant 7).
      {
        std::lock_guard<std::mutex> lock(mutex_);
        give_back_events_locked(d, unmap);
        Entry* e = by_id_locked(unmap.slot);
        if (e != nullptr) {
          ++e->evictions_done;
          if (e->where == Where::releasing) {
            e->where = Where::resident;
            d.committed += e->pages;
          }
        }
        --d.unmaps_in_flight;
      }
      mine.pop_front();
      changed_.notify_all();
      continue;
    }
    float ms = 0;
    if (unmap.start != nullptr) driver.cuEventElapsedTime(&ms, unmap.start, unmap.done);
    Slot* slot = nullptr;
    CUdeviceptr slot_va = 0;
    bool keep = false;
    // After its copy (the host copy is current too), still before the unmap.
    const bool reclaimed = reclaim(d, unmap, unmap.copied, &slot_va);
    if (!reclaimed) {
      std::lock_guard<std::mutex> lock(mutex_);
      give_back_events_locked(d, unmap);
      Entry* e = by_id_locked(unmap.slot);
      if (e != nullptr && !e->forgotten) {
        e->unmapping = true;
        ++e->busy;
        slot = e->slot;
        slot_va = slot->va;
        // Kept for the next restore of this size only while what slots hold, mapped or kept,
        // stays within the budget's target (the auto one leaves the reserve free): keeping moves
        // the pages from mapped to kept, so the sum is what it was.
        // Never for the program's out-of-memory: those pages are what it asked for (an H200 run
        // kept 400 of the 752 MiB evicted for an allocation, and its next launch failed).
        // A hand-off is kept whatever the budget: the slot this eviction makes room for maps it
        // next, so what slots hold does not change (and its copy runs at the link's speed:
        // docs/PERFORMANCE.md). Only while that slot still waits for its pages: a restore that
        // found room meanwhile made a handle of its own, and this one would be one too many.
        const Entry* to = unmap.hand_to != 0 ? by_id_locked(unmap.hand_to) : nullptr;
        const bool hand_off =
            to != nullptr && !to->forgotten && !to->mapped && to->where == Where::resident;
        keep = unmap.may_keep && (hand_off || d.physical + engine().spare_bytes(d.ordinal) <=
                                                  budget_locked(d).target);
      }
    }
    if (unmap.copied) {
      engine().count_copy(d.ordinal, true, unmap.bytes, static_cast<double>(ms) * 1e3);
      if (trace::enabled()) {
        trace::Record(trace::Event::d2h)
            .hex("va", slot_va)
            .at(ended_ns - std::min<uint64_t>(ended_ns, static_cast<uint64_t>(ms * 1e6f)))
            .add("slot", unmap.slot)
            .add("bytes", unmap.bytes)
            .add("device", d.ordinal)
            .hex("stream", stream_id(unmap.out != nullptr ? unmap.out : d.offload))
            .add("batch", unmap.slot)
            .add("dur_us", static_cast<double>(ms) * 1e3)
            .emit();
      }
    }
    if (reclaimed) {
      mine.pop_front();
      continue;
    }
    if (slot == nullptr) {  // freed meanwhile
      std::lock_guard<std::mutex> lock(mutex_);
      --d.unmaps_in_flight;
      mine.pop_front();
      continue;
    }
    std::string failure;
    const CUresult unmapped = with_retries([&] {
      try {
        engine().unback(slot, BatchTiming{unmap.slot, 0, trace::us_since(unmap.queued_ns)}, keep);
        return CUDA_SUCCESS;
      } catch (const Error& error) {
        failure = error.what();
        return CUDA_ERROR_UNKNOWN;
      }
    });
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Entry* e = by_id_locked(unmap.slot);
      if (e != nullptr) {
        --e->busy;
        e->unmapping = false;
        ++e->evictions_done;
        if (unmapped == CUDA_SUCCESS) {
          e->mapped = false;
          if (e->where == Where::releasing) e->where = Where::offloaded;  // else: restore queued
          d.physical -= e->pages;
          stats_.resident_bytes -= e->pages;
        } else {
          // Still mapped, data intact: it stays resident (invariant 7).
          if (e->where == Where::releasing) {
            e->where = Where::resident;
            d.committed += e->pages;
          }
          log().error("an eviction's unmap failed, the slot stays resident: {}", failure);
        }
      }
      --d.unmaps_in_flight;
    }
    mine.pop_front();
    changed_.notify_all();
  }
}

}  // namespace

// =============================================================================================
// The interface
// =============================================================================================

namespace {

// Calls `each` with one device's slots at a time (the residency's decisions are per device), the
// devices in one order for every thread; stops at the first failure. One device: one call, no
// copy.
template <class Each>
CUresult by_device(const std::vector<Slot*>& slots, Each each) {
  const bool one_device = std::all_of(slots.begin(), slots.end(), [&slots](const Slot* slot) {
    return slot->device == slots.front()->device;
  });
  if (one_device) return each(slots);
  std::vector<int> devices;
  for (const Slot* slot : slots) {
    if (std::find(devices.begin(), devices.end(), slot->device) == devices.end()) {
      devices.push_back(slot->device);
    }
  }
  std::sort(devices.begin(), devices.end());
  for (int device : devices) {
    std::vector<Slot*> group;
    for (Slot* slot : slots) {
      if (slot->device == device) group.push_back(slot);
    }
    const CUresult rc = each(group);
    if (rc != CUDA_SUCCESS) return rc;
  }
  return CUDA_SUCCESS;
}

}  // namespace

void configure(const Settings& settings) { the().configure(settings); }
bool can_hold_slots(int device, std::string* why, NoSlots* cause) {
  return the().can_hold_slots(device, why, cause);
}
void adopt(Slot* slot, bool backed) { the().adopt(slot, backed); }
void forget(Slot* slot) { the().forget(slot); }
CUresult acquire(const std::vector<Slot*>& slots, CUstream stream, const std::string& what,
                 Acquired* acquired, std::string* message, Checked checked,
                 const EagerShape* shape) {
  // One device's slots at a time: a peer copy names slots of two devices, and each device's
  // budget, workers and flags are its own. The stream waits for every group's restores (an event
  // or a flag of another device: both may be waited for across devices).
  const bool one_device = std::all_of(slots.begin(), slots.end(), [&slots](const Slot* slot) {
    return slot->device == slots.front()->device;
  });
  if (one_device) return the().acquire(slots, stream, what, acquired, message, checked, shape);
  std::vector<int> devices;  // a launch's own path above allocates nothing for this
  for (const Slot* slot : slots) {
    if (std::find(devices.begin(), devices.end(), slot->device) == devices.end()) {
      devices.push_back(slot->device);
    }
  }
  // In one order for every thread: two peer copies the other way round would each hold one
  // device's slots while waiting for room on the other.
  std::sort(devices.begin(), devices.end());
  acquired->slots.clear();
  acquired->stream = stream;
  for (int device : devices) {
    std::vector<Slot*> group;
    for (Slot* slot : slots) {
      if (slot->device == device) group.push_back(slot);
    }
    Acquired part;
    const CUresult rc = the().acquire(group, stream, what, &part, message, checked, nullptr);
    if (rc != CUDA_SUCCESS) {
      // The program's copy is not enqueued: the groups before give their pins back (the stream
      // waits they enqueued stay, and later work on the stream waits for them too).
      the().used(*acquired);
      acquired->slots.clear();
      return rc;
    }
    acquired->slots.insert(acquired->slots.end(), part.slots.begin(), part.slots.end());
    acquired->waits += part.waits;
    acquired->waited.insert(acquired->waited.end(), part.waited.begin(), part.waited.end());
    acquired->demanded += part.demanded;
    acquired->demanded_bytes += part.demanded_bytes;
    acquired->host_waited = acquired->host_waited || part.host_waited;
    acquired->host_wait_us += part.host_wait_us;
    acquired->map_wait_us += part.map_wait_us;
    acquired->map_waited = acquired->map_waited || part.map_waited;
  }
  return CUDA_SUCCESS;
}
[[noreturn]] void end_process(const char* who, const std::string& message) {
  if (driver_shut_down()) {
    // The program is exiting and the driver has gone (its failure is the teardown's): one of
    // vaswap's threads stops here, so that the exit keeps the program's status, and the exit
    // ends it. An application thread still ends the process, said.
    if (on_own_thread()) {
      for (;;) pause();
    }
    log().set_level(spdlog::level::err);
  }
  const std::string text = message +
                           ". vaswap cannot keep this process's device work correct past this "
                           "point, and ends it (DESIGN.md invariant 12)";
  log().error("{}", text);
  if (trace::enabled()) {
    trace::Record(trace::Event::error).add("call", who).add("message", text).emit();
  }
  // Where every thread was, for whoever debugs the end: a driver call that never returned, a lock.
  if (trace::enabled() || log().should_log(spdlog::level::debug)) {
    std::string error;
    for (const ThreadStack& stack : thread_stacks(24, 200, &error)) {
      std::string frames;
      for (const Frame& frame : stack.frames) {
        frames += (frames.empty() ? "" : " < ") + describe(frame);
      }
      if (!stack.answered) frames = "(did not answer)";
      log().debug("thread {} ({}): {}", stack.tid, stack.name, frames);
      if (trace::enabled()) {
        trace::Record(trace::Event::thread_stack)
            .add("tid_of", stack.tid)
            .add("name", stack.name)
            .add("answered", stack.answered)
            .add("frames", frames)
            .emit();
      }
    }
    if (!error.empty()) log().debug("no thread stacks: {}", error);
  }
  trace::close();
  std::fflush(nullptr);
  _exit(70);
}

void used(const Acquired& acquired) { the().used(acquired); }
bool lend(const std::vector<Slot*>& slots, uint64_t reserve, std::vector<Lent>* lent) {
  return the().lend(slots, reserve, lent);
}
void take_back(int device, const std::vector<Slot*>& slots, uint64_t reserve) {
  the().take_back(device, slots, reserve);
}
void take_back_offloaded(Slot* slot, void* host) { the().take_back_offloaded(slot, host); }
void wait_settled(const std::vector<Slot*>& slots) { the().wait_settled(slots); }

void with_pages(const std::vector<Slot*>& slots, const std::function<void()>& fn) {
  the().with_pages(slots, fn);
}
// The plan's moves at a position may name slots of several devices (one plan per device).
std::vector<Slot*> evict(const std::vector<Slot*>& slots, const char* cause) {
  std::vector<Slot*> left;
  by_device(slots, [cause, &left](const std::vector<Slot*>& group) {
    const std::vector<Slot*> kept = the().evict(group, cause);
    left.insert(left.end(), kept.begin(), kept.end());
    return CUDA_SUCCESS;
  });
  return left;
}
void prefetch(const std::vector<Slot*>& slots) {
  by_device(slots, [](const std::vector<Slot*>& group) {
    the().prefetch(group);
    return CUDA_SUCCESS;
  });
}
void set_schedule(const std::vector<std::vector<Slot*>>& uses) { the().set_schedule(uses); }
void at_position(int position) { the().at_position(position); }
uint64_t make_room(int device, uint64_t bytes) { return the().make_room(device, bytes); }
Budget budget(int device) { return the().budget(device); }
std::map<int, Budget> started_budgets() { return the().started_budgets(); }
void park(int device, uint64_t bytes) { the().park(device, bytes); }
void unpark(int device, uint64_t bytes, bool make_room) { the().unpark(device, bytes, make_room); }
void executors_hold(int device, uint64_t bytes) { the().executors_hold(device, bytes); }
Others others(int device) { return the().others(device); }
std::optional<uint64_t> device_room(int device) { return the().device_room(device); }
void lend_more(int device, uint64_t bytes) { the().lend_more(device, bytes); }
void capture_beginning(CUstream stream) { the().close_uses(stream); }
void stream_gone(CUstream stream) { the().close_uses(stream); }
CUresult back_for_capture(const std::vector<Slot*>& slots, CUstream stream, Acquired* held,
                          std::string* message) {
  *held = Acquired{};
  held->stream = stream;
  held->captured = true;
  // A peer copy recorded into a capture names slots of two devices: each needs its pages on its
  // own device.
  const CUresult rc = by_device(slots, [held, message](const std::vector<Slot*>& group) {
    return the().back_for_capture(group, &held->slots, message);
  });
  if (rc != CUDA_SUCCESS) {
    the().used(*held);  // a device done before the one that failed: its pins go
    *held = Acquired{};
  }
  return rc;
}
Stats stats() { return the().stats(); }
bool parks_streams() { return the().parks_streams(); }
CUresult settle(const std::string& what, std::string* why, Quiet* quiet) {
  if (quiet != nullptr) quiet->release();
  const CUresult rc = the().settle(what, why, quiet != nullptr);
  if (quiet != nullptr && rc == CUDA_SUCCESS) quiet->held_ = true;
  return rc;
}

void Quiet::release() {
  if (held_) the().unquiet();
  held_ = false;
}

}  // namespace vaswap::residency
