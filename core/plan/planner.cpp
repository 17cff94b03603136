#include "plan/planner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include "base/errors.h"
#include "base/log.h"
#include "base/trace.h"
#include "plan/inside.h"
#include "plan/schedule.h"
#include "slots/engine.h"
#include "slots/worker.h"

namespace vaswap::planner {

namespace {

// Launches observed without finding a period before the planner gives up (and stays out of the
// way: residency alone keeps launches correct and within the budget).
constexpr size_t kMaxLearningLaunches = 4096;
// The copy test: one region of at most this size each way, kModelRounds times (the first warms
// the path); less when the device is short of memory, at least one page.
constexpr size_t kModelBytes = size_t{64} << 20;
constexpr size_t kModelMinBytes = size_t{2} << 20;
// The program's copies and vaswap's own may share the link while the test runs (under the device
// handshake the program is ahead of the device, and restores are in flight): each figure is the
// best of the rounds after the first, as sharing only slows them. One H200 run measured 28 GB/s
// H2D and a 58 ms remap in a single round, where the link gives 54 GB/s and a remap 0.3 ms, and
// planned no window at all.
constexpr int kModelRounds = 4;
// When nothing could be measured and the policy gives no figures: a PCIe 3 x16 link's, which
// every current system beats, so the plan errs towards starting restores early.
constexpr double kFallbackGbps = 12;

enum class Phase : int { off, learning, planning, steady };

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::off: return "off";
    case Phase::learning: return "learning";
    case Phase::planning: return "planning";
    case Phase::steady: return "steady";
  }
  return "?";
}

// One graph launch observed while learning, with the slots it and the eager work after it use.
struct Seen {
  CUgraphExec exec = nullptr;
  std::vector<Slot*> uses;
  CUevent start = nullptr, end = nullptr;  // around the launch, on its stream
};

// The schedule in force, by position.
struct Active {
  uint64_t id = 0;
  std::vector<CUgraphExec> keys;
  std::vector<std::vector<Slot*>> releases, restores;
};

double elapsed_us(const Driver& driver, CUevent from, CUevent to) {
  float ms = 0;
  if (driver.cuEventElapsedTime(&ms, from, to) != CUDA_SUCCESS) return 0;
  return static_cast<double>(ms) * 1e3;
}

// Samples cuMemGetInfo on a thread of its own and writes each change to the trace.
class MemorySampler {
 public:
  MemorySampler(const Driver& driver, CUcontext context, int device, uint64_t interval_ns)
      : thread_([this, &driver, context, device, interval_ns] {
          driver.cuCtxSetCurrent(context);
          // Invariant 5: like every vaswap thread, never able to invalidate a global capture.
          CUstreamCaptureMode relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
          driver.cuThreadExchangeStreamCaptureMode(&relaxed);
          size_t last = 0;
          std::unique_lock<std::mutex> lock(mutex_);
          while (!stop_) {
            size_t free_bytes = 0, total_bytes = 0;
            try {
              engine().note_memory();
            } catch (const Error&) {  // no engine: the samples alone
            }
            if (driver.cuMemGetInfo(&free_bytes, &total_bytes) == CUDA_SUCCESS &&
                free_bytes != last && trace::enabled()) {
              trace::Record(trace::Event::mem_sample)
                  .add("device", device)
                  .add("free", static_cast<uint64_t>(free_bytes))
                  .add("total", static_cast<uint64_t>(total_bytes))
                  .emit();
              last = free_bytes;
            }
            wake_.wait_for(lock, std::chrono::nanoseconds(interval_ns));
          }
        }) {}
  MemorySampler(const MemorySampler&) = delete;
  MemorySampler& operator=(const MemorySampler&) = delete;
  ~MemorySampler() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

// An event in `stream`'s own context (DESIGN.md invariant 6: events are made on the device of
// what they are recorded on), recorded there now.
CUevent record_on(const Driver& driver, CUstream stream, unsigned flags) {
  CUcontext context = nullptr;
  if (driver.cuStreamGetCtx(stream, &context) != CUDA_SUCCESS) driver.cuCtxGetCurrent(&context);
  ContextScope scope(driver, context);
  CUevent event = nullptr;
  if (driver.cuEventCreate(&event, flags) != CUDA_SUCCESS) {
    fail(VASWAP_ERROR_CUDA, "cuEventCreate failed for a planner timing event");
  }
  const CUresult rc = driver.cuEventRecord(event, stream);
  if (rc != CUDA_SUCCESS) {
    driver.cuEventDestroy(event);
    fail(VASWAP_ERROR_CUDA, cuda_failure("cuEventRecord", rc, "a planner timing event"));
  }
  return event;
}

class Planner {
 public:
  void configure(const Policy& policy,
                 std::function<std::vector<Slot*>(uint64_t)> slots_of_capture) {
    std::lock_guard<std::mutex> lock(mutex_);
    policy_ = policy;
    slots_of_capture_ = std::move(slots_of_capture);
    rules_.clear();
    for (const Rule& rule : policy.rules) {
      // The policy has checked the selectors' form ("capture:N", "graph:N").
      ParsedRule parsed;
      if (std::sscanf(rule.offload.c_str(), "capture:%lu", &parsed.capture) == 1 &&
          std::sscanf(rule.after.c_str(), "graph:%lu", &parsed.after) == 1 &&
          std::sscanf(rule.before.c_str(), "graph:%lu", &parsed.before) == 1) {
        rules_.push_back(parsed);
      }
    }
    set_phase(policy.mode == Mode::auto_ ? Phase::learning : Phase::off);
  }

  bool wants_eager() const { return eager_.load(std::memory_order_relaxed); }

  Ticket before_graph(const char* symbol, CUgraphExec exec, CUstream stream,
                      const std::vector<Slot*>& slots, uint64_t capture);
  void after_graph(CUgraphExec exec, CUstream stream, uint64_t capture, const Ticket& ticket);
  Ticket before_eager(const char* symbol, CUstream stream, const std::vector<Slot*>& slots,
                      residency::Checked checked, const residency::EagerShape* shape);
  void capture_begun();
  void exec_changed(CUgraphExec exec);
  void forget(Slot* slot);
  Counters counters() {
    std::lock_guard<std::mutex> lock(mutex_);
    Counters c = counters_;
    const residency::Stats r = residency::stats();
    c.stalls = r.host_waits;
    c.stall_us = r.host_wait_us;
    c.map_waits = r.map_waits;
    c.map_wait_us = r.map_wait_us;
    c.regions_offloaded = r.distinct_evicted;
    return c;
  }

 private:
  // Everything below runs under mutex_.
  void set_phase(Phase phase) {
    phase_ = phase;
    // Eager work is scanned whenever the schedule may not know it: always but in steady state
    // with the guard off.
    eager_.store(phase != Phase::steady || policy_.guard, std::memory_order_relaxed);
  }
  // Residency for one launch. `lock` (the planner's) is released while residency decides and
  // waits: residency's waits end when other threads get on (close their marks, enqueue, free),
  // and those threads take this lock first.
  Ticket acquire(std::unique_lock<std::mutex>& lock, const std::vector<Slot*>& slots,
                 CUstream stream, const std::string& what, const char* reason,
                 residency::Checked checked = residency::Checked::when_run,
                 const residency::EagerShape* shape = nullptr);
  void learn(const char* why);
  void drop_events(std::vector<Seen>& seen);
  void observe(CUgraphExec exec, CUstream stream, const std::vector<Slot*>& slots);
  void start_planning(int period);
  Ticket advance(std::unique_lock<std::mutex>& lock, const char* symbol, CUgraphExec exec,
                 CUstream stream, const std::vector<Slot*>& slots, const std::string& what);
  void start_sampler(const Driver& driver);
  void trace_action(trace::Event event, const std::vector<Slot*>& slots, CUstream stream) const {
    if (!trace::enabled()) return;
    uint64_t bytes = 0;
    for (const Slot* slot : slots) bytes += slot->bytes;
    trace::Record(event)
        .add("plan", active_.id)
        .add("position", position_)
        .add("slots", static_cast<uint64_t>(slots.size()))
        .add("bytes", bytes)
        .hex("stream", stream_id(stream))
        .emit();
  }

  // On the planning worker, without mutex_ (takes it to publish).
  struct Job;
  void plan(Job& job);
  plan::Model model_for(int device);

  std::mutex mutex_;
  Policy policy_;
  Phase phase_ = Phase::off;
  std::atomic<bool> eager_{true};
  std::vector<Seen> seen_;
  std::vector<CUgraphExec> keys_;  // the period being planned or in force
  Active active_;
  int position_ = 0;
  uint64_t generation_ = 0;  // bumped whenever learning starts over; stale plans are dropped
  std::unique_ptr<Worker> planning_worker_;
  std::unique_ptr<MemorySampler> sampler_;
  bool sampler_tried_ = false;
  std::map<int, plan::Model> measured_;  // per device: each has its own link
  Counters counters_;
  // rules mode
  struct ParsedRule {
    unsigned long capture = 0, after = 0, before = 0;
  };
  std::vector<ParsedRule> rules_;
  std::function<std::vector<Slot*>(uint64_t)> slots_of_capture_;
};

Planner& planner() {
  static auto* p = new Planner;  // leaked: hooks run from atexit handlers and other threads
  return *p;
}

std::string describe_graph(const char* symbol, CUgraphExec exec) {
  return std::string(symbol) + " of graph " + hex(reinterpret_cast<uintptr_t>(exec));
}

// =============================================================================================
// Residency for one launch (invariant 2)
// =============================================================================================

Ticket Planner::acquire(std::unique_lock<std::mutex>& lock, const std::vector<Slot*>& slots,
                        CUstream stream, const std::string& what, const char* reason,
                        residency::Checked checked, const residency::EagerShape* shape) {
  Ticket ticket;
  const uint64_t start = trace::now_ns();
  lock.unlock();
  // Slots lent to a rewritten graph's windows come back from its executor, the rest from
  // residency.
  const std::vector<Slot*> rest = inside::present(slots, &ticket.result, &ticket.message);
  if (ticket.result == CUDA_SUCCESS) {
    ticket.result =
        residency::acquire(rest, stream, what, &ticket.acquired, &ticket.message, checked, shape);
  }
  lock.lock();
  if (ticket.result != CUDA_SUCCESS) return ticket;
  const residency::Acquired& a = ticket.acquired;
  if (phase_ == Phase::steady) counters_.on_demand_restores += a.demanded;
  if ((a.waits > 0 || a.map_waited || a.substitute != nullptr) && trace::enabled()) {
    trace::Record(trace::Event::restore_wait)
        .add("call", what)
        .add("reason", reason)
        .add("on_demand", a.demanded > 0)
        .add("slots", static_cast<uint64_t>(a.waits))
        .add("restored", static_cast<uint64_t>(a.demanded))
        .add("bytes", a.demanded_bytes)
        .add("host_wait", a.host_waited)
        .add("dur_us", a.host_waited ? a.host_wait_us : trace::us_since(start))
        .add("map_wait_us", a.map_wait_us)
        .add("map_waited", a.map_waited)
        .add("as_graph", a.substitute != nullptr)
        .hex("stream", stream_id(stream))
        .emit();
  }
  return ticket;
}

// =============================================================================================
// Learning
// =============================================================================================

void Planner::learn(const char* why) {
  if (policy_.mode != Mode::auto_) return;
  const Phase was = phase_;
  drop_events(seen_);
  seen_.clear();
  keys_.clear();
  active_ = Active{};
  position_ = 0;
  ++generation_;
  residency::set_schedule({});
  set_phase(Phase::learning);
  if (trace::enabled()) {
    trace::Record(trace::Event::learn)
        .add("why", why)
        .add("from", phase_name(was))
        .add("generation", generation_)
        .emit();
  }
}

void Planner::drop_events(std::vector<Seen>& seen) {
  const Driver& driver = *load_driver(nullptr);
  for (Seen& s : seen) {
    for (CUevent event : {s.start, s.end}) {
      if (event != nullptr) driver.cuEventDestroy(event);
    }
    s.start = s.end = nullptr;
  }
}

void Planner::observe(CUgraphExec exec, CUstream stream, const std::vector<Slot*>& slots) {
  const Driver& driver = *load_driver(nullptr);
  Seen s;
  s.exec = exec;
  s.uses = slots;
  s.start = record_on(driver, stream, CU_EVENT_DEFAULT);
  seen_.push_back(std::move(s));
  std::vector<CUgraphExec> keys;
  keys.reserve(seen_.size());
  for (const Seen& seen : seen_) keys.push_back(seen.exec);
  if (const int period = plan::find_period(keys, policy_.learning_steps)) {
    start_planning(period);
  } else if (seen_.size() >= kMaxLearningLaunches) {
    log().warn(
        "no periodic pattern in {} graph launches; vaswap keeps slots within the budget by least "
        "recent use, without a schedule (launches stay correct)",
        seen_.size());
    if (trace::enabled()) {
      trace::Record(trace::Event::notice)
          .add("message", "no periodic launch pattern found; the planner stops learning")
          .emit();
    }
    drop_events(seen_);
    seen_.clear();
    set_phase(Phase::off);
  }
}

struct Planner::Job {
  uint64_t generation = 0;
  int device = 0;
  std::vector<Seen> window;    // the last complete period and the launch that began the next
  std::vector<Slot*> regions;  // index -> slot
  std::vector<int> devices;    // index -> the slot's device (read while the slots surely live)
  plan::Period period;
};

void Planner::start_planning(int period) {
  auto job = std::make_shared<Job>();
  job->generation = generation_;
  const size_t n = seen_.size();
  const size_t first = n - 1 - static_cast<size_t>(period);
  // Uses per position: the union over every period observed in the repeat.
  std::map<Slot*, int> index;
  job->period.uses.resize(static_cast<size_t>(period));
  for (size_t k = 1; static_cast<int64_t>(k) * period <= static_cast<int64_t>(n - 1) &&
                     static_cast<int>(k) <= policy_.learning_steps;
       ++k) {
    for (int i = 0; i < period; ++i) {
      const Seen& s = seen_[n - 1 - k * static_cast<size_t>(period) + static_cast<size_t>(i)];
      auto& uses = job->period.uses[static_cast<size_t>(i)];
      for (Slot* slot : s.uses) {
        auto [it, added] = index.emplace(slot, static_cast<int>(job->regions.size()));
        if (added) {
          job->regions.push_back(slot);
          job->devices.push_back(slot->device);
          job->period.region_bytes.push_back(slot->bytes);
          job->period.region_pages.push_back(slot->mapped_bytes);
        }
        if (std::find(uses.begin(), uses.end(), it->second) == uses.end()) {
          uses.push_back(it->second);
        }
      }
    }
  }
  job->device = job->regions.empty() ? 0 : job->regions[0]->device;
  for (size_t i = first; i < n; ++i) {
    job->window.push_back(seen_[i]);
    seen_[i].start = seen_[i].end = nullptr;  // the job owns these events now
  }
  drop_events(seen_);
  seen_.clear();
  keys_.clear();
  for (size_t i = 0; i < static_cast<size_t>(period); ++i) keys_.push_back(job->window[i].exec);
  position_ = 1 % period;  // the launch that completed the repeat was position 0
  set_phase(Phase::planning);
  // The positions' uses go to residency at once: eviction picks the farthest next use.
  {
    std::vector<std::vector<Slot*>> uses(static_cast<size_t>(period));
    for (int i = 0; i < period; ++i) {
      for (int region : job->period.uses[static_cast<size_t>(i)]) {
        uses[static_cast<size_t>(i)].push_back(job->regions[static_cast<size_t>(region)]);
      }
    }
    residency::set_schedule(uses);
    residency::at_position(position_);
  }
  if (job->regions.empty()) {
    // No slot is used in the period: nothing to plan, and no copy test to run.
    drop_events(job->window);
    active_ = Active{};
    active_.id = ++counters_.plans;
    active_.keys = keys_;
    active_.releases.resize(static_cast<size_t>(period));
    active_.restores.resize(static_cast<size_t>(period));
    set_phase(Phase::steady);
    if (trace::enabled()) {
      trace::Record(trace::Event::plan)
          .add("plan", active_.id)
          .add("period", static_cast<uint64_t>(period))
          .add("regions", uint64_t{0})
          .add("windows", uint64_t{0})
          .add("reason", "no slot is used in the period")
          .emit();
    }
    return;
  }
  if (!planning_worker_) {
    const Driver& driver = *load_driver(nullptr);
    CUcontext context = engine().context(job->device);
    planning_worker_ = std::make_unique<Worker>(driver, context, "vaswap-plan");
  }
  planning_worker_->post([this, job] { plan(*job); });
}

plan::Model Planner::model_for(int device) {
  plan::Model given{policy_.h2d_gbps, policy_.d2h_gbps,
                    static_cast<double>(policy_.remap_latency_ns) / 1e3, "given"};
  if (policy_.model == Model::given) return given;
  if (auto it = measured_.find(device); it != measured_.end()) return it->second;
  // The copy test: one slot of up to 64 MiB (a quarter of what the device has free, when that is
  // less), D2H then H2D kModelRounds times on a stream of its own, then as many unmaps and maps of
  // its pages; the best of each after the first round counts.
  const Driver& driver = *load_driver(nullptr);
  Engine& e = engine();
  plan::Model m{0, 0, 0, "measured"};
  Slot* slot = nullptr;
  void* host = nullptr;
  CUstream stream = nullptr;
  CUevent events[3] = {};
  size_t bytes = kModelBytes;
  try {
    ContextScope scope(driver, e.context(device));
    size_t free_bytes = 0, total_bytes = 0;
    if (driver.cuMemGetInfo(&free_bytes, &total_bytes) == CUDA_SUCCESS) {
      bytes = std::max(kModelMinBytes,
                       std::min(bytes, free_bytes / 4 / kModelMinBytes * kModelMinBytes));
    }
    // Quietly: under memory pressure the test may not fit, and the plan then uses other figures.
    slot = e.create_slot(device, bytes, /*intercepted=*/false, /*backed=*/true, /*report=*/false);
    host = e.host_alloc(bytes);
    if (driver.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
      fail(VASWAP_ERROR_CUDA, "cuStreamCreate failed");
    }
    for (CUevent& event : events) driver.cuEventCreate(&event, CU_EVENT_DEFAULT);
    double d2h_us = 0, h2d_us = 0;
    for (int round = 0; round < kModelRounds; ++round) {
      driver.cuEventRecord(events[0], stream);
      driver.cuMemcpyDtoHAsync(host, slot->va, bytes, stream);
      driver.cuEventRecord(events[1], stream);
      driver.cuMemcpyHtoDAsync(slot->va, host, bytes, stream);
      driver.cuEventRecord(events[2], stream);
      if (driver.cuEventSynchronize(events[2]) != CUDA_SUCCESS) {
        fail(VASWAP_ERROR_CUDA, "the copy test did not complete");
      }
      if (round == 0) continue;
      const double d2h = elapsed_us(driver, events[0], events[1]);
      const double h2d = elapsed_us(driver, events[1], events[2]);
      if (d2h > 0 && (d2h_us == 0 || d2h < d2h_us)) d2h_us = d2h;
      if (h2d > 0 && (h2d_us == 0 || h2d < h2d_us)) h2d_us = h2d;
    }
    for (int round = 1; round < kModelRounds; ++round) {
      const uint64_t start = trace::now_ns();
      e.unback(slot, std::nullopt);
      e.back(slot, std::nullopt, /*report=*/false);
      const double remap = trace::us_since(start);
      if (m.remap_us == 0 || remap < m.remap_us) m.remap_us = remap;
    }
    m.d2h_gbps = d2h_us > 0 ? static_cast<double>(bytes) / (d2h_us * 1e3) : 0;
    m.h2d_gbps = h2d_us > 0 ? static_cast<double>(bytes) / (h2d_us * 1e3) : 0;
  } catch (const Error& error) {
    log().info("the copy test could not run ({}); planning with the policy's numbers",
               error.what());
    m.source = "measured (failed)";
  }
  for (CUevent event : events) {
    if (event != nullptr) driver.cuEventDestroy(event);
  }
  if (stream != nullptr) driver.cuStreamDestroy(stream);
  if (host != nullptr) e.host_free(host);
  if (slot != nullptr) {
    try {
      e.destroy_slot(slot);
    } catch (const Error& error) {
      log().warn("the copy test's slot: {}", error.what());
    }
  }
  if (m.h2d_gbps <= 0 || m.d2h_gbps <= 0) {
    // Nothing measured: the policy's numbers, or a slow link's.
    m = given;
    m.source = "given (copy test failed)";
    if (m.h2d_gbps <= 0 || m.d2h_gbps <= 0) {
      m = plan::Model{kFallbackGbps, kFallbackGbps, 1000, "fallback (copy test failed)"};
    }
  }
  measured_[device] = m;
  return m;
}

// On the planning worker.
void Planner::plan(Job& job) {
  const Driver& driver = *load_driver(nullptr);
  const size_t period = job.window.size() - 1;
  // The times of the last complete period, on the device's clock.
  driver.cuEventSynchronize(job.window.back().start);
  CUevent origin = job.window[0].start;
  for (size_t i = 0; i < period; ++i) {
    job.period.start_us.push_back(elapsed_us(driver, origin, job.window[i].start));
    const CUevent end = job.window[i].end != nullptr ? job.window[i].end : job.window[i + 1].start;
    job.period.end_us.push_back(elapsed_us(driver, origin, end));
  }
  job.period.length_us = elapsed_us(driver, origin, job.window.back().start);
  drop_events(job.window);

  Policy policy;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    policy = policy_;
  }
  // One schedule per device: a device's slots fit its own budget and move over its own link (one
  // process may use several GPUs; each position's timing is the same for all).
  // The slots may be freed meanwhile (the plan is then dropped below): their devices were noted.
  std::vector<int> devices;
  for (int device : job.devices) {
    if (std::find(devices.begin(), devices.end(), device) == devices.end()) {
      devices.push_back(device);
    }
  }
  std::sort(devices.begin(), devices.end());
  struct Part {
    int device = 0;
    residency::Budget budget;
    plan::Plan plan;
    uint64_t region_bytes = 0;
    size_t regions = 0;
  };
  std::vector<Part> parts;
  std::vector<plan::Window> windows;  // regions: indices into job.regions
  for (int device : devices) {
    plan::Period sub;
    sub.start_us = job.period.start_us;
    sub.end_us = job.period.end_us;
    sub.length_us = job.period.length_us;
    std::vector<int> global;
    std::vector<int> local(job.regions.size(), -1);
    Part part;
    part.device = device;
    for (size_t r = 0; r < job.regions.size(); ++r) {
      if (job.devices[r] != device) continue;
      local[r] = static_cast<int>(global.size());
      global.push_back(static_cast<int>(r));
      sub.region_bytes.push_back(job.period.region_bytes[r]);
      sub.region_pages.push_back(job.period.region_pages[r]);
      part.region_bytes += job.period.region_bytes[r];
    }
    part.regions = global.size();
    for (const std::vector<int>& uses : job.period.uses) {
      auto& mine = sub.uses.emplace_back();
      for (int r : uses) {
        if (local[static_cast<size_t>(r)] >= 0) mine.push_back(local[static_cast<size_t>(r)]);
      }
    }
    const plan::Model model = model_for(device);
    if (trace::enabled()) {
      trace::Record(trace::Event::model)
          .add("source", model.source)
          .add("h2d_gbps", model.h2d_gbps)
          .add("d2h_gbps", model.d2h_gbps)
          .add("remap_us", model.remap_us)
          .add("device", device)
          .emit();
    }
    part.budget = residency::budget(device);
    const plan::Knobs knobs{policy.prefetch_distance, policy.release_lag, part.budget.target,
                            part.budget.limit};
    part.plan = plan::choose(sub, model, knobs);
    for (plan::Window w : part.plan.windows) {
      w.region = global[static_cast<size_t>(w.region)];
      windows.push_back(w);
    }
    parts.push_back(std::move(part));
  }

  std::lock_guard<std::mutex> lock(mutex_);
  if (job.generation != generation_ || phase_ != Phase::planning) return;  // learning again
  Active active;
  active.id = ++counters_.plans;
  active.keys = keys_;
  active.releases.resize(period);
  active.restores.resize(period);
  for (const plan::Window& w : windows) {
    Slot* slot = job.regions[static_cast<size_t>(w.region)];
    active.releases[static_cast<size_t>(w.release_at)].push_back(slot);
    active.restores[static_cast<size_t>(w.restore_at)].push_back(slot);
  }
  active_ = std::move(active);
  set_phase(Phase::steady);
  if (!trace::enabled()) return;
  for (const Part& part : parts) {  // one event per device, under the one plan number
    const plan::Plan& chosen = part.plan;
    trace::Record(trace::Event::plan)
        .add("plan", active_.id)
        .add("device", part.device)
        .add("period", static_cast<uint64_t>(period))
        .add("period_us", job.period.length_us)
        .add("regions", static_cast<uint64_t>(part.regions))
        .add("region_bytes", part.region_bytes)
        .add("budget", part.budget.target)
        .add("limit", part.budget.limit)
        .add("total_pages", chosen.total_pages)
        .add("resident_peak", chosen.resident_peak)
        .add("short_pages", chosen.short_pages)
        .add("candidates", chosen.candidates)
        .add("windows", static_cast<uint64_t>(chosen.windows.size()))
        .add("peak_bytes", chosen.peak_bytes)
        .add("exposed_us", chosen.exposed_us)
        .add("reason", chosen.reason)
        .emit();
  }
  for (const plan::Window& w : windows) {
    const Slot* slot = job.regions[static_cast<size_t>(w.region)];
    trace::Record(trace::Event::plan_window)
        .add("plan", active_.id)
        .add("slot", slot->id)
        .hex("va", slot->va)
        .add("bytes", static_cast<uint64_t>(slot->bytes))
        .add("last_use", w.last_use)
        .add("next_use", w.next_use)
        .add("release_at", w.release_at)
        .add("restore_at", w.restore_at)
        .add("gap_us", w.gap_us)
        .add("d2h_us", w.d2h_us)
        .add("h2d_us", w.h2d_us)
        .add("freed_us", w.freed_us)
        .add("exposed_us", w.exposed_us)
        .emit();
  }
}

// =============================================================================================
// Launches
// =============================================================================================

void Planner::start_sampler(const Driver& driver) {
  sampler_tried_ = true;
  if (policy_.memory_interval_ns == 0) return;
  CUcontext context = nullptr;
  CUdevice device = 0;
  if (driver.cuCtxGetCurrent(&context) != CUDA_SUCCESS || context == nullptr ||
      driver.cuCtxGetDevice(&device) != CUDA_SUCCESS) {
    return;
  }
  sampler_ = std::make_unique<MemorySampler>(driver, context, static_cast<int>(device),
                                             policy_.memory_interval_ns);
  static std::once_flag once;
  std::call_once(once, [] {
    std::atexit([] {
      std::lock_guard<std::mutex> lock(planner().mutex_);
      planner().sampler_.reset();
    });
  });
}

// Planning and steady state: where the launch sits in the period, and the schedule's actions
// there: releases first (their last use is behind), the launch's own slots, then the restores
// that must start now to land before their use.
Ticket Planner::advance(std::unique_lock<std::mutex>& lock, const char* symbol, CUgraphExec exec,
                        CUstream stream, const std::vector<Slot*>& slots, const std::string& what) {
  const int period = static_cast<int>(keys_.size());
  if (keys_[static_cast<size_t>(position_)] != exec) {
    // Out of order: a known graph resynchronizes (an evaluation step, a skipped graph); an
    // unknown one means a new pattern.
    int found = -1;
    for (int k = 1; k <= period && found < 0; ++k) {
      const int q = (position_ + k) % period;
      if (keys_[static_cast<size_t>(q)] == exec) found = q;
    }
    ++counters_.deviations;
    if (trace::enabled()) {
      trace::Record(trace::Event::deviation)
          .add("call", symbol)
          .hex("exec", reinterpret_cast<uintptr_t>(exec))
          .add("expected", position_)
          .add("found", found)
          .emit();
    }
    if (found < 0) {
      learn("a graph the plan does not know was launched");
      Ticket ticket = acquire(lock, slots, stream, what, "learning");
      if (ticket.result == CUDA_SUCCESS && phase_ == Phase::learning) observe(exec, stream, slots);
      return ticket;
    }
    position_ = found;
  }
  const auto p = static_cast<size_t>(position_);
  residency::at_position(position_);
  Ticket ticket;
  if (phase_ == Phase::steady) {
    if (!active_.releases[p].empty()) {
      residency::evict(active_.releases[p], "plan");
      counters_.planned_offloads += active_.releases[p].size();
      trace_action(trace::Event::plan_offload, active_.releases[p], stream);
    }
    // The launch's own slots only: the eager work that follows it (and that the period counts at
    // this position) acquires its own, one call at a time.
    const uint64_t generation = generation_;
    ticket = acquire(lock, slots, stream, what, "graph");
    if (generation_ != generation) return ticket;  // learning again meanwhile: no plan to follow
    if (ticket.result == CUDA_SUCCESS && !active_.restores[p].empty()) {
      residency::prefetch(active_.restores[p]);
      counters_.planned_restores += active_.restores[p].size();
      trace_action(trace::Event::plan_restore, active_.restores[p], stream);
    }
  } else {
    const uint64_t generation = generation_;
    ticket = acquire(lock, slots, stream, what, "graph");
    if (generation_ != generation) return ticket;
  }
  position_ = (position_ + 1) % period;
  return ticket;
}

Ticket Planner::before_graph(const char* symbol, CUgraphExec exec, CUstream stream,
                             const std::vector<Slot*>& slots, uint64_t capture) {
  std::unique_lock<std::mutex> lock(mutex_);
  const Driver& driver = *load_driver(nullptr);
  if (!sampler_tried_) start_sampler(driver);
  const std::string what = describe_graph(symbol, exec);
  Ticket ticket;
  try {
    switch (phase_) {
      case Phase::off: {
        std::vector<Slot*> needs = slots;
        if (policy_.mode == Mode::rules) {
          // rules mode: a rule's slots come back before the launch it names (on demand: rules
          // name no order to prefetch by).
          for (const ParsedRule& rule : rules_) {
            if (rule.before != capture) continue;
            for (Slot* slot : slots_of_capture_(rule.capture)) {
              if (std::find(needs.begin(), needs.end(), slot) == needs.end()) {
                needs.push_back(slot);
              }
            }
          }
        }
        ticket = acquire(lock, needs, stream, what, policy_.mode == Mode::rules ? "rule" : "graph");
        break;
      }
      case Phase::learning:
        ticket = acquire(lock, slots, stream, what, "learning");
        if (ticket.result == CUDA_SUCCESS && phase_ == Phase::learning) {
          observe(exec, stream, slots);
        }
        break;
      case Phase::planning:
      case Phase::steady: ticket = advance(lock, symbol, exec, stream, slots, what); break;
    }
  } catch (const Error& error) {
    log().error("{}: {}", symbol, error.what());
  }
  if (ticket.result != CUDA_SUCCESS) log().error("{}", ticket.message);
  return ticket;
}

void Planner::after_graph(CUgraphExec exec, CUstream stream, uint64_t capture,
                          const Ticket& ticket) {
  residency::used(ticket.acquired);
  std::lock_guard<std::mutex> lock(mutex_);
  if (policy_.mode == Mode::rules) {
    // A rule's slots leave after the launch it names.
    for (const ParsedRule& rule : rules_) {
      if (rule.after != capture) continue;
      const std::vector<Slot*> slots = slots_of_capture_(rule.capture);
      residency::evict(slots, "rule");
      if (trace::enabled()) {
        uint64_t bytes = 0;
        for (const Slot* slot : slots) bytes += slot->bytes;
        trace::Record(trace::Event::plan_offload)
            .add("plan", uint64_t{0})
            .add("position", -1)
            .add("slots", static_cast<uint64_t>(slots.size()))
            .add("bytes", bytes)
            .hex("stream", stream_id(stream))
            .emit();
      }
    }
    return;
  }
  if (phase_ != Phase::learning || seen_.empty() || seen_.back().exec != exec ||
      seen_.back().end != nullptr) {
    return;
  }
  try {
    seen_.back().end = record_on(*load_driver(nullptr), stream, CU_EVENT_DEFAULT);
  } catch (const Error& error) {
    log().warn("a learning timing event: {}", error.what());
  }
}

Ticket Planner::before_eager(const char* symbol, CUstream stream, const std::vector<Slot*>& slots,
                             residency::Checked checked, const residency::EagerShape* shape) {
  std::unique_lock<std::mutex> lock(mutex_);
  Ticket ticket = acquire(lock, slots, stream, symbol, "eager", checked, shape);
  if (ticket.result != CUDA_SUCCESS) {
    log().error("{}", ticket.message);
    return ticket;
  }
  if (phase_ == Phase::learning && !seen_.empty()) {
    auto& uses = seen_.back().uses;
    for (Slot* slot : slots) {
      if (std::find(uses.begin(), uses.end(), slot) == uses.end()) uses.push_back(slot);
    }
  }
  const size_t restored = ticket.acquired.demanded;
  if (restored > 0 && phase_ == Phase::steady) {
    counters_.guard_hits += restored;
    if (trace::enabled()) {
      trace::Record(trace::Event::guard_hit)
          .add("call", symbol)
          .add("slots", static_cast<uint64_t>(restored))
          .add("position", position_)
          .hex("stream", stream_id(stream))
          .emit();
    }
  }
  return ticket;
}

void Planner::capture_begun() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (phase_ == Phase::planning || phase_ == Phase::steady ||
      (phase_ == Phase::learning && !seen_.empty())) {
    learn("a capture began");
  }
}

void Planner::exec_changed(CUgraphExec exec) {
  std::lock_guard<std::mutex> lock(mutex_);
  const bool in_pattern =
      std::find(keys_.begin(), keys_.end(), exec) != keys_.end() ||
      std::any_of(seen_.begin(), seen_.end(), [exec](const Seen& s) { return s.exec == exec; });
  if (in_pattern) learn("a graph of the pattern was changed");
}

void Planner::forget(Slot* slot) {
  std::lock_guard<std::mutex> lock(mutex_);
  bool planned = false;
  for (auto* lists : {&active_.releases, &active_.restores}) {
    for (auto& list : *lists) {
      const auto it = std::find(list.begin(), list.end(), slot);
      if (it != list.end()) {
        planned = true;
        list.erase(it);
      }
    }
  }
  for (Seen& s : seen_) s.uses.erase(std::remove(s.uses.begin(), s.uses.end(), slot), s.uses.end());
  if (planned || phase_ == Phase::planning) learn("a slot in the plan was freed");
}

}  // namespace

void configure(const Policy& policy,
               std::function<std::vector<Slot*>(uint64_t capture)> slots_of_capture) {
  residency::Settings settings;
  settings.budget_bytes = policy.residency_budget;
  settings.reserve_bytes = policy.residency_reserve;
  settings.handshake = policy.handshake == Handshake::device ? residency::Handshake::device
                       : policy.handshake == Handshake::host ? residency::Handshake::host
                                                             : residency::Handshake::automatic;
  settings.wait_limit_ns = policy.wait_limit_ns;
  settings.host_limit_bytes = policy.host_pool_limit;
  residency::configure(settings);
  inside::Settings in;
  in.mode = policy.inside == Inside::off  ? inside::Mode::off
            : policy.inside == Inside::on ? inside::Mode::on
                                          : inside::Mode::automatic;
  in.lead = static_cast<size_t>(policy.inside_lead);
  in.min_gap = static_cast<size_t>(policy.inside_min_gap);
  in.budget_bytes = policy.residency_budget;
  in.wait_limit_ns = policy.wait_limit_ns;
  inside::configure(in);
  planner().configure(policy, std::move(slots_of_capture));
}
bool wants_eager() { return planner().wants_eager(); }
Ticket before_graph(const char* symbol, CUgraphExec exec, CUstream stream,
                    const std::vector<Slot*>& slots, uint64_t capture) {
  return planner().before_graph(symbol, exec, stream, slots, capture);
}
void after_graph(CUgraphExec exec, CUstream stream, uint64_t capture, const Ticket& ticket) {
  planner().after_graph(exec, stream, capture, ticket);
}
Ticket before_eager(const char* symbol, CUstream stream, const std::vector<Slot*>& slots,
                    residency::Checked checked, const residency::EagerShape* shape) {
  return planner().before_eager(symbol, stream, slots, checked, shape);
}
void after_eager(const Ticket& ticket) { residency::used(ticket.acquired); }
void capture_begun() { planner().capture_begun(); }
void exec_changed(CUgraphExec exec) { planner().exec_changed(exec); }
void forget(Slot* slot) { planner().forget(slot); }
Counters counters() { return planner().counters(); }

}  // namespace vaswap::planner
