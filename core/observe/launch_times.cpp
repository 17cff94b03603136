#include "observe/launch_times.h"

#include <atomic>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>

#include "base/capture_gate.h"
#include "base/driver.h"
#include "base/errors.h"
#include "base/log.h"
#include "base/trace.h"
#include "slots/engine.h"

namespace vaswap::launch_times {

struct Event {
  CUevent handle = nullptr;
  Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() {
    if (handle != nullptr) load_driver(nullptr)->cuEventDestroy(handle);
  }
};

namespace {

// A launch enqueued and not yet traced.
struct Pending {
  CUgraphExec exec = nullptr;
  uintptr_t stream = 0;
  uint64_t enqueued_ns = 0;
  std::shared_ptr<Event> before_waits, before_graph, after, previous;  // previous: may be empty
};

struct State {
  std::atomic<bool> on{false};
  std::mutex mutex;  // guards the rest
  std::deque<Pending> pending;
  // Per stream, the end event of its latest timed launch: the next launch's since_us starts there.
  std::unordered_map<uintptr_t, std::shared_ptr<Event>> last_end;
};

State& state() {
  static auto* s = new State;  // leaked: launches may come while static destructors run
  return *s;
}

// Past this many untraced launches (a stream that never completes), the oldest are dropped.
constexpr size_t kMaxPending = 4096;
// Launches looked at per poll, oldest first: a poll costs a few event queries, not thousands.
constexpr size_t kPollPerLaunch = 64;
// Streams remembered for since_us; past this many (streams made and destroyed), forgotten.
constexpr size_t kMaxStreams = 4096;

void stop(const std::string& why) {
  if (state().on.exchange(false)) {
    log().warn("trace.launch_times: {}; graph launches are not timed from now on", why);
  }
}

// An event in `stream`'s own context (DESIGN.md invariant 6), recorded there now.
std::shared_ptr<Event> record(CUstream stream) {
  const Driver& driver = *load_driver(nullptr);
  CUcontext context = nullptr;
  if (driver.cuStreamGetCtx(stream, &context) != CUDA_SUCCESS) driver.cuCtxGetCurrent(&context);
  ContextScope scope(driver, context);
  auto event = std::make_shared<Event>();
  CUresult rc = driver.cuEventCreate(&event->handle, CU_EVENT_DEFAULT);
  if (rc != CUDA_SUCCESS) {
    event->handle = nullptr;
    stop(cuda_failure("cuEventCreate", rc, "a launch timing event"));
    return nullptr;
  }
  rc = driver.cuEventRecord(event->handle, stream);
  if (rc != CUDA_SUCCESS) {
    stop(cuda_failure("cuEventRecord", rc, "a launch timing event"));
    return nullptr;
  }
  return event;
}

bool completed(const Driver& driver, const Pending& p) {
  return driver.cuEventQuery(p.after->handle) == CUDA_SUCCESS;
}

void emit(const Driver& driver, const Pending& p) {
  if (!trace::enabled()) return;
  auto r = trace::Record(trace::Event::launch_time);
  r.hex("exec", reinterpret_cast<uintptr_t>(p.exec))
      .hex("stream", p.stream)
      .add("enqueued_ns", p.enqueued_ns)
      .add("parked_us", elapsed_us(driver, p.before_waits->handle, p.before_graph->handle))
      .add("graph_us", elapsed_us(driver, p.before_graph->handle, p.after->handle));
  if (p.previous) r.add("since_us", elapsed_us(driver, p.previous->handle, p.before_waits->handle));
  r.emit();
}

// Streams complete out of order: every completed launch among the oldest goes, whatever its
// place. Not while a capture is open: an event query from a thread in the global capture mode
// would invalidate another thread's capture (the launches are traced at a later poll).
void trace_completed_locked(const Driver& driver, State& s, size_t most) {
  if (capture_gate::open() > 0) return;
  size_t looked = 0;
  for (auto it = s.pending.begin(); it != s.pending.end() && looked < most; ++looked) {
    if (completed(driver, *it)) {
      emit(driver, *it);
      it = s.pending.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace

void configure(bool on) { state().on.store(on && trace::enabled(), std::memory_order_release); }

bool enabled() { return state().on.load(std::memory_order_acquire); }

Timing begin(CUstream stream) {
  Timing timing;
  if (!enabled()) return timing;
  timing.enqueued_ns = trace::now_ns();
  timing.before_waits = record(stream);
  return timing;
}

void before_graph(Timing& timing, CUstream stream) {
  if (!timing.before_waits) return;
  timing.before_graph = record(stream);
  if (!timing.before_graph) timing.before_waits.reset();
}

void end(Timing& timing, CUgraphExec exec, CUstream stream, bool enqueued) {
  if (!timing.before_graph) {
    timing = Timing{};
    return;
  }
  std::shared_ptr<Event> after = enqueued ? record(stream) : nullptr;
  State& s = state();
  const Driver& driver = *load_driver(nullptr);
  std::lock_guard<std::mutex> lock(s.mutex);
  if (after) {
    Pending p;
    p.exec = exec;
    p.stream = reinterpret_cast<uintptr_t>(stream);
    p.enqueued_ns = timing.enqueued_ns;
    p.before_waits = std::move(timing.before_waits);
    p.before_graph = std::move(timing.before_graph);
    p.after = after;
    if (s.last_end.size() > kMaxStreams) s.last_end.clear();
    std::shared_ptr<Event>& last = s.last_end[p.stream];
    p.previous = std::move(last);
    last = std::move(after);
    s.pending.push_back(std::move(p));
    while (s.pending.size() > kMaxPending) s.pending.pop_front();
  }
  timing = Timing{};
  trace_completed_locked(driver, s, kPollPerLaunch);
}

void finish() {
  if (!enabled()) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  trace_completed_locked(*load_driver(nullptr), s, s.pending.size());
  s.on.store(false, std::memory_order_release);
}

}  // namespace vaswap::launch_times
