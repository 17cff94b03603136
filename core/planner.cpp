#include "planner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include "engine.h"
#include "errors.h"
#include "log.h"
#include "plan.h"
#include "trace.h"
#include "worker.h"

namespace vaswap::planner {

namespace {

// Launches observed without finding a period before the planner gives up (and stays out of the
// way: launches still get invariant 2).
constexpr size_t kMaxLearningLaunches = 4096;
// The copy test: one region of this size each way, twice (the first warms the path).
constexpr size_t kModelBytes = size_t{64} << 20;

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

enum class Where { resident, offloaded, restoring };

// A slot the planner has seen used.
struct Held {
  Where where = Where::resident;
  void* host = nullptr;           // its pinned copy, allocated when a plan first offloads it
  RemapBatch* restore = nullptr;  // while restoring
  std::vector<CUstream> streams;  // streams that used it since its last offload
};

// One graph launch observed while learning, with the slots it and the eager work after it use.
struct Seen {
  CUgraphExec exec = nullptr;
  std::vector<Slot*> uses;
  CUevent start = nullptr, end = nullptr;  // around the launch, on its stream
};

// The plan in force, by position.
struct Active {
  uint64_t id = 0;
  std::vector<CUgraphExec> keys;
  std::vector<std::vector<Slot*>> needs, releases, restores;
};

// vaswap's own stream on a device for the D2H bursts after release points (restores copy on the
// engine's copy stream).
struct Streams {
  CUstream offload = nullptr;
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
    if (policy.mode == Mode::rules) eager_.store(policy.guard, std::memory_order_relaxed);
  }

  bool wants_eager() const { return eager_.load(std::memory_order_relaxed); }

  void before_graph(const char* symbol, CUgraphExec exec, CUstream stream,
                    const std::vector<Slot*>& slots, uint64_t capture);
  void after_graph(CUgraphExec exec, CUstream stream, uint64_t capture);
  void before_eager(const char* symbol, CUstream stream, const std::vector<Slot*>& slots);
  void capture_begun();
  void exec_changed(CUgraphExec exec);
  void forget(Slot* slot);
  Counters counters() {
    std::lock_guard<std::mutex> lock(mutex_);
    return counters_;
  }

 private:
  // Everything below runs under mutex_.
  void set_phase(Phase phase) {
    phase_ = phase;
    eager_.store(phase == Phase::learning || (phase == Phase::steady && policy_.guard),
                 std::memory_order_relaxed);
  }
  Held& held(Slot* slot) { return held_[slot]; }
  void used(const std::vector<Slot*>& slots, CUstream stream);
  // Invariant 2 for one launch: returns the number of slots that had to be restored on demand.
  size_t make_resident(const std::vector<Slot*>& slots, CUstream stream, const char* symbol,
                       const char* reason);
  void await(RemapBatch* batch, CUstream stream, const char* symbol, const char* reason,
             bool on_demand);
  void wait_submitted(RemapBatch* batch, CUstream stream);
  void offload(const std::vector<Slot*>& slots, CUstream stream, int position);
  void restore(const std::vector<Slot*>& slots, CUstream stream, int position);
  void settle(const std::vector<Slot*>& batch, Where where, RemapBatch* restore, int position,
              CUstream stream);
  Streams& streams(int device);
  // Destroys an adopted (or orphaned) restore on a worker: that waits for its copies to complete.
  void reap(RemapBatch* batch);
  CUevent new_event();
  void drop_events(std::vector<Seen>& seen);
  void learn(const char* why);
  void observe(CUgraphExec exec, CUstream stream, const std::vector<Slot*>& slots);
  void start_planning(int period);
  void advance(const char* symbol, CUgraphExec exec, CUstream stream,
               const std::vector<Slot*>& slots);
  void start_sampler(const Driver& driver);

  // On the planning worker, without mutex_ (takes it to publish).
  struct Job;
  void plan(Job& job);
  plan::Model model_for(int device);

  std::mutex mutex_;
  Policy policy_;
  Phase phase_ = Phase::off;
  std::atomic<bool> eager_{false};
  std::unordered_map<Slot*, Held> held_;
  std::vector<Seen> seen_;
  std::vector<CUgraphExec> keys_;  // the period being planned or in force
  Active active_;
  int position_ = 0;
  uint64_t generation_ = 0;  // bumped whenever learning starts over; stale plans are dropped
  std::map<int, Streams> streams_;
  std::unique_ptr<Worker> planning_worker_, reaper_;
  std::unique_ptr<MemorySampler> sampler_;
  bool sampler_tried_ = false;
  std::optional<plan::Model> measured_;
  Counters counters_;
  std::set<uint64_t> offloaded_ever_;  // slot ids
  // rules mode
  struct ParsedRule {
    unsigned long capture = 0, after = 0, before = 0;
  };
  std::vector<ParsedRule> rules_;
  std::function<std::vector<Slot*>(uint64_t)> slots_of_capture_;
  void rules_before(const char* symbol, CUstream stream, uint64_t capture);
  void rules_after(CUstream stream, uint64_t capture);
};

Planner& planner() {
  static auto* p = new Planner;  // leaked: hooks run from atexit handlers and other threads
  return *p;
}

// =============================================================================================
// Residency (invariant 2)
// =============================================================================================

void Planner::used(const std::vector<Slot*>& slots, CUstream stream) {
  for (Slot* slot : slots) {
    auto& streams = held(slot).streams;
    if (std::find(streams.begin(), streams.end(), stream) == streams.end()) {
      streams.push_back(stream);
    }
  }
}

size_t Planner::make_resident(const std::vector<Slot*>& slots, CUstream stream, const char* symbol,
                              const char* reason) {
  std::vector<RemapBatch*> batches;
  std::vector<Slot*> missing;
  std::vector<void*> hosts;
  for (Slot* slot : slots) {
    auto it = held_.find(slot);
    if (it == held_.end() || it->second.where == Where::resident) continue;
    if (it->second.where == Where::restoring) {
      if (std::find(batches.begin(), batches.end(), it->second.restore) == batches.end()) {
        batches.push_back(it->second.restore);
      }
    } else {
      missing.push_back(slot);
      hosts.push_back(it->second.host);
    }
  }
  if (!missing.empty()) {
    // Not expected here: restore now (the worker maps at once and the copies start at once).
    Engine& e = engine();
    RemapBatch* batch = e.remap_when(missing, hosts, nullptr);
    for (Slot* slot : missing) {
      Held& h = held(slot);
      h.where = Where::restoring;
      h.restore = batch;
    }
    counters_.on_demand_restores += missing.size();
    await(batch, stream, symbol, reason, true);
  }
  for (RemapBatch* batch : batches) await(batch, stream, symbol, reason, false);
  return missing.size();
}

// The stream waits for the batch's H2D (stream-ordered); the host waits only until the copies
// are submitted, which needs the worker to have mapped the pages.
void Planner::await(RemapBatch* batch, CUstream stream, const char* symbol, const char* reason,
                    bool on_demand) {
  Engine& e = engine();
  const uint64_t start = trace::now_ns();
  bool waited = false;
  try {
    if (!e.try_wait_on_stream(batch, stream)) {
      waited = true;
      wait_submitted(batch, stream);
    }
    e.adopt(batch);
  } catch (const Error& error) {
    // Invariant 7: the host copies are intact. Drop the failed remap and restore once more,
    // synchronously; if that fails too the launch goes ahead and the error is on the log.
    log().error("{}: restoring for {} failed: {}; retrying", symbol, reason, error.what());
    std::vector<Slot*> retry;
    std::vector<void*> hosts;
    for (auto& [slot, h] : held_) {
      if (h.restore == batch && h.where == Where::restoring) {
        retry.push_back(slot);
        hosts.push_back(h.host);
      }
    }
    try {
      e.destroy_remap(batch);
      batch = nullptr;
      if (!retry.empty()) {
        RemapBatch* again = e.remap_when(retry, hosts, nullptr);
        for (Slot* slot : retry) held(slot).restore = again;
        wait_submitted(again, stream);
        e.adopt(again);
        batch = again;
      }
    } catch (const Error& again) {
      log().error("{}: restoring for {} failed again: {}", symbol, reason, again.what());
      return;
    }
  }
  uint64_t bytes = 0, count = 0;
  for (auto& [slot, h] : held_) {
    if (h.restore != batch || batch == nullptr) continue;
    h.where = Where::resident;
    h.restore = nullptr;
    bytes += slot->bytes;
    ++count;
  }
  if (batch != nullptr) reap(batch);
  const double waited_us = trace::us_since(start);
  if (waited) {
    ++counters_.stalls;
    counters_.stall_us += waited_us;
  }
  if (trace::enabled()) {
    trace::Record(trace::Event::restore_wait)
        .add("call", symbol)
        .add("reason", reason)
        .add("on_demand", on_demand)
        .add("slots", count)
        .add("bytes", bytes)
        .add("host_wait", waited)
        .add("dur_us", waited_us)
        .hex("stream", stream_id(stream))
        .emit();
  }
}

void Planner::reap(RemapBatch* batch) {
  if (!reaper_) {
    reaper_ = std::make_unique<Worker>(*load_driver(nullptr),
                                       engine().context(batch->device->ordinal), "vaswap-reap");
  }
  reaper_->post([batch] {
    try {
      engine().destroy_remap(batch);
    } catch (const Error& error) {
      log().warn("cleaning up a restore: {}", error.what());
    }
  });
}

// Waits until the batch's copies are submitted, then makes the stream wait for them. A device
// that has faulted (a sticky error: an illegal address) stops running callbacks and copies, so
// the worker might never submit; every 20 ms the wait checks the launching stream and fails
// instead of hanging the program.
void Planner::wait_submitted(RemapBatch* batch, CUstream stream) {
  Engine& e = engine();
  const Driver& driver = *load_driver(nullptr);
  CUevent probe = new_event();
  driver.cuEventRecord(probe, stream);
  while (!e.wait_submitted_for(batch, 20)) {
    const CUresult rc = driver.cuEventQuery(probe);
    if (rc != CUDA_SUCCESS && rc != CUDA_ERROR_NOT_READY) {
      driver.cuEventDestroy(probe);
      fail(VASWAP_ERROR_CUDA, cuda_failure("cuEventQuery", rc, "the launching stream") +
                                  ", while waiting for a restore: the device has failed (a "
                                  "kernel faulted?); vaswap stops waiting");
    }
  }
  driver.cuEventDestroy(probe);
  if (!e.try_wait_on_stream(batch, stream)) {
    fail(VASWAP_ERROR_INVALID_STATE, "a restore was submitted but its copies are not ready");
  }
}

Streams& Planner::streams(int device) {
  Streams& s = streams_[device];
  if (s.offload == nullptr) {
    const Driver& driver = *load_driver(nullptr);
    ContextScope scope(driver, engine().context(device));
    if (driver.cuStreamCreate(&s.offload, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
      fail(VASWAP_ERROR_CUDA,
           "cuStreamCreate failed for the planner's stream on device " + std::to_string(device));
    }
  }
  return s;
}

// =============================================================================================
// The plan's actions
// =============================================================================================

// Offloads after everything already queued on the streams that used the slots (invariant 3):
// the D2H stream waits for an event recorded on each of them now.
void Planner::offload(const std::vector<Slot*>& slots, CUstream stream, int position) {
  std::vector<Slot*> batch;
  std::vector<void*> hosts;
  std::vector<CUstream> after{stream};
  for (Slot* slot : slots) {
    Held& h = held(slot);
    if (h.where != Where::resident || h.host == nullptr) continue;
    batch.push_back(slot);
    hosts.push_back(h.host);
    for (CUstream s : h.streams) {
      if (std::find(after.begin(), after.end(), s) == after.end()) after.push_back(s);
    }
  }
  if (batch.empty()) return;
  const Driver& driver = *load_driver(nullptr);
  const int device = batch[0]->device;
  Streams& own = streams(device);
  try {
    for (CUstream s : after) {
      CUevent event = new_event();
      driver.cuEventRecord(event, s);
      driver.cuStreamWaitEvent(own.offload, event, 0);
      driver.cuEventDestroy(event);  // released once the wait has seen it
    }
    engine().offload_after(batch, hosts, own.offload);
  } catch (const Error& error) {
    log().error("planned offload at position {} failed, the slots stay resident: {}", position,
                error.what());
    return;
  }
  settle(batch, Where::offloaded, nullptr, position, stream);
  counters_.planned_offloads += batch.size();
  for (Slot* slot : batch) {
    if (offloaded_ever_.insert(slot->id).second) ++counters_.regions_offloaded;
  }
}

// The slots of an action are now `where`; the action goes to the trace.
void Planner::settle(const std::vector<Slot*>& batch, Where where, RemapBatch* restore,
                     int position, CUstream stream) {
  uint64_t bytes = 0;
  for (Slot* slot : batch) {
    Held& h = held(slot);
    h.where = where;
    h.restore = restore;
    if (where == Where::offloaded) h.streams.clear();
    bytes += slot->bytes;
  }
  if (!trace::enabled()) return;
  trace::Record(where == Where::offloaded ? trace::Event::plan_offload : trace::Event::plan_restore)
      .add("plan", active_.id)
      .add("position", position)
      .add("slots", static_cast<uint64_t>(batch.size()))
      .add("bytes", bytes)
      .hex("stream", stream_id(stream))
      .emit();
}

// Starts restores when the launching stream reaches this point; the launch that needs them waits.
void Planner::restore(const std::vector<Slot*>& slots, CUstream stream, int position) {
  std::vector<Slot*> batch;
  std::vector<void*> hosts;
  for (Slot* slot : slots) {
    Held& h = held(slot);
    if (h.where != Where::offloaded) continue;
    batch.push_back(slot);
    hosts.push_back(h.host);
  }
  if (batch.empty()) return;
  const Driver& driver = *load_driver(nullptr);
  RemapBatch* remap = nullptr;
  try {
    // The pages are mapped as soon as the releases are done; the H2D waits for this point.
    CUevent point = nullptr;
    if (driver.cuEventCreate(&point, CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING) !=
        CUDA_SUCCESS) {
      fail(VASWAP_ERROR_CUDA, "cuEventCreate failed for a restore point");
    }
    driver.cuEventRecord(point, stream);
    remap = engine().remap_when(batch, hosts, point);
  } catch (const Error& error) {
    log().warn("planned restore at position {} failed; the next use restores on demand: {}",
               position, error.what());
    return;
  }
  settle(batch, Where::restoring, remap, position, stream);
  counters_.planned_restores += batch.size();
}

CUevent Planner::new_event() {
  CUevent event = nullptr;
  if (load_driver(nullptr)->cuEventCreate(&event, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
    fail(VASWAP_ERROR_CUDA, "cuEventCreate failed for a planner timing event");
  }
  return event;
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
  set_phase(Phase::learning);
  if (trace::enabled()) {
    trace::Record(trace::Event::learn)
        .add("why", why)
        .add("from", phase_name(was))
        .add("generation", generation_)
        .emit();
  }
}

void Planner::observe(CUgraphExec exec, CUstream stream, const std::vector<Slot*>& slots) {
  const Driver& driver = *load_driver(nullptr);
  Seen s;
  s.exec = exec;
  s.uses = slots;
  s.start = new_event();
  driver.cuEventRecord(s.start, stream);
  seen_.push_back(std::move(s));
  std::vector<CUgraphExec> keys;
  keys.reserve(seen_.size());
  for (const Seen& seen : seen_) keys.push_back(seen.exec);
  if (const int period = plan::find_period(keys, policy_.learning_steps)) {
    start_planning(period);
  } else if (seen_.size() >= kMaxLearningLaunches) {
    log().warn(
        "no periodic pattern in {} graph launches; vaswap offloads nothing (launches stay "
        "correct)",
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
  if (job->regions.empty()) {
    // No slot is used in the period: nothing to plan, and no copy test to run.
    drop_events(job->window);
    active_ = Active{};
    active_.id = ++counters_.plans;
    active_.keys = keys_;
    active_.needs.resize(static_cast<size_t>(period));
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
  if (measured_) return *measured_;
  // The copy test: one 64 MiB slot, D2H then H2D twice on a stream of its own (the second pair
  // counts), then one unmap and map of its pages.
  const Driver& driver = *load_driver(nullptr);
  Engine& e = engine();
  plan::Model m{0, 0, 0, "measured"};
  Slot* slot = nullptr;
  void* host = nullptr;
  CUstream stream = nullptr;
  CUevent events[3] = {};
  try {
    ContextScope scope(driver, e.context(device));
    slot = e.create_slot(device, kModelBytes);
    host = e.host_alloc(kModelBytes);
    if (driver.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
      fail(VASWAP_ERROR_CUDA, "cuStreamCreate failed");
    }
    for (CUevent& event : events) driver.cuEventCreate(&event, CU_EVENT_DEFAULT);
    for (int round = 0; round < 2; ++round) {
      driver.cuEventRecord(events[0], stream);
      driver.cuMemcpyDtoHAsync(host, slot->va, kModelBytes, stream);
      driver.cuEventRecord(events[1], stream);
      driver.cuMemcpyHtoDAsync(slot->va, host, kModelBytes, stream);
      driver.cuEventRecord(events[2], stream);
      if (driver.cuEventSynchronize(events[2]) != CUDA_SUCCESS) {
        fail(VASWAP_ERROR_CUDA, "the copy test did not complete");
      }
    }
    const double d2h_us = elapsed_us(driver, events[0], events[1]);
    const double h2d_us = elapsed_us(driver, events[1], events[2]);
    const uint64_t start = trace::now_ns();
    e.unmap_and_release(slot);
    e.create_and_remap(slot);
    m.remap_us = trace::us_since(start);
    m.d2h_gbps = d2h_us > 0 ? static_cast<double>(kModelBytes) / (d2h_us * 1e3) : 0;
    m.h2d_gbps = h2d_us > 0 ? static_cast<double>(kModelBytes) / (h2d_us * 1e3) : 0;
  } catch (const Error& error) {
    log().warn("the copy test failed ({}); planning with the policy's numbers", error.what());
    m.source = "measured (failed)";
  }
  for (CUevent event : events) {
    if (event != nullptr) driver.cuEventDestroy(event);
  }
  if (host != nullptr) e.host_free(host);
  if (slot != nullptr) {
    try {
      e.destroy_slot(slot);
    } catch (const Error& error) {
      log().warn("the copy test's slot: {}", error.what());
    }
  }
  if (m.h2d_gbps <= 0 || m.d2h_gbps <= 0) {
    // Nothing measured: the policy's numbers, or nothing offloads.
    m = given;
    m.source = "given (copy test failed)";
  }
  measured_ = m;
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
  const plan::Model model = model_for(job.device);
  if (trace::enabled()) {
    trace::Record(trace::Event::model)
        .add("source", model.source)
        .add("h2d_gbps", model.h2d_gbps)
        .add("d2h_gbps", model.d2h_gbps)
        .add("remap_us", model.remap_us)
        .add("device", job.device)
        .emit();
  }
  const plan::Knobs knobs{policy.prefetch_distance, policy.release_lag, policy.max_overhead_percent,
                          policy.byte_budget};
  const plan::Plan chosen = plan::choose(job.period, model, knobs);

  // Pinned copies for every region the plan offloads, before the plan is in force.
  std::map<Slot*, void*> hosts;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const plan::Window& w : chosen.windows) {
      Slot* slot = job.regions[static_cast<size_t>(w.region)];
      auto it = held_.find(slot);
      if (it != held_.end() && it->second.host != nullptr) hosts[slot] = it->second.host;
    }
  }
  try {
    for (const plan::Window& w : chosen.windows) {
      Slot* slot = job.regions[static_cast<size_t>(w.region)];
      // The job's copy of the size: the slot may be freed meanwhile (the plan is then dropped).
      const uint64_t bytes = job.period.region_bytes[static_cast<size_t>(w.region)];
      if (hosts.count(slot) == 0) hosts[slot] = engine().host_alloc(bytes);
    }
  } catch (const Error& error) {
    log().warn("pinned host memory for the plan: {}; offloading nothing", error.what());
    hosts.clear();
  }

  std::lock_guard<std::mutex> lock(mutex_);
  if (job.generation != generation_ || phase_ != Phase::planning) {  // learning again
    for (auto& [slot, host] : hosts) {
      auto it = held_.find(slot);
      if (it == held_.end() || it->second.host != host) engine().host_free(host);
    }
    return;
  }
  Active active;
  active.id = ++counters_.plans;
  active.keys = keys_;
  active.needs.resize(period);
  active.releases.resize(period);
  active.restores.resize(period);
  for (size_t i = 0; i < period; ++i) {
    for (int region : job.period.uses[i]) {
      active.needs[i].push_back(job.regions[static_cast<size_t>(region)]);
    }
  }
  for (const plan::Window& w : chosen.windows) {
    Slot* slot = job.regions[static_cast<size_t>(w.region)];
    if (hosts.count(slot) == 0) continue;
    held(slot).host = hosts[slot];
    active.releases[static_cast<size_t>(w.release_at)].push_back(slot);
    active.restores[static_cast<size_t>(w.restore_at)].push_back(slot);
  }
  active_ = std::move(active);
  set_phase(Phase::steady);
  if (!trace::enabled()) return;
  uint64_t bytes = 0;
  for (uint64_t b : job.period.region_bytes) bytes += b;
  trace::Record(trace::Event::plan)
      .add("plan", active_.id)
      .add("period", static_cast<uint64_t>(period))
      .add("period_us", job.period.length_us)
      .add("regions", static_cast<uint64_t>(job.regions.size()))
      .add("region_bytes", bytes)
      .add("candidates", chosen.candidates)
      .add("windows", static_cast<uint64_t>(chosen.windows.size()))
      .add("peak_bytes", chosen.peak_bytes)
      .add("exposed_us", chosen.exposed_us)
      .add("reason", chosen.reason)
      .emit();
  for (const plan::Window& w : chosen.windows) {
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

// Steady state and planning: where the launch sits in the period.
void Planner::advance(const char* symbol, CUgraphExec exec, CUstream stream,
                      const std::vector<Slot*>& slots) {
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
      make_resident(slots, stream, symbol, "learning");
      observe(exec, stream, slots);
      return;
    }
    position_ = found;
  }
  const auto p = static_cast<size_t>(position_);
  if (phase_ == Phase::steady) {
    std::vector<Slot*> needs = active_.needs[p];
    for (Slot* slot : slots) {
      if (std::find(needs.begin(), needs.end(), slot) == needs.end()) needs.push_back(slot);
    }
    make_resident(needs, stream, symbol, "graph");
    used(slots, stream);
    offload(active_.releases[p], stream, position_);
    restore(active_.restores[p], stream, position_);
  } else {
    make_resident(slots, stream, symbol, "graph");
    used(slots, stream);
  }
  position_ = (position_ + 1) % period;
}

// rules mode: restore what a rule brings back before this graph (on demand: rules name no order
// to prefetch by), and offload after it what a rule sends away.
void Planner::rules_before(const char* symbol, CUstream stream, uint64_t capture) {
  for (const ParsedRule& rule : rules_) {
    if (rule.before == capture)
      make_resident(slots_of_capture_(rule.capture), stream, symbol, "rule");
  }
}

void Planner::rules_after(CUstream stream, uint64_t capture) {
  for (const ParsedRule& rule : rules_) {
    if (rule.after != capture) continue;
    std::vector<Slot*> slots = slots_of_capture_(rule.capture);
    try {
      for (Slot* slot : slots) {
        Held& h = held(slot);
        if (h.host == nullptr) h.host = engine().host_alloc(slot->bytes);
      }
    } catch (const Error& error) {
      log().warn("rules: pinned host memory for capture:{}: {}", rule.capture, error.what());
      continue;
    }
    offload(slots, stream, -1);
  }
}

void Planner::before_graph(const char* symbol, CUgraphExec exec, CUstream stream,
                           const std::vector<Slot*>& slots, uint64_t capture) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Driver& driver = *load_driver(nullptr);
  if (!sampler_tried_) start_sampler(driver);
  try {
    switch (phase_) {
      case Phase::off:
        if (policy_.mode == Mode::rules) rules_before(symbol, stream, capture);
        make_resident(slots, stream, symbol, "graph");
        used(slots, stream);
        break;
      case Phase::learning:
        make_resident(slots, stream, symbol, "learning");
        used(slots, stream);
        observe(exec, stream, slots);
        break;
      case Phase::planning:
      case Phase::steady: advance(symbol, exec, stream, slots); break;
    }
  } catch (const Error& error) {
    log().error("{}: {}", symbol, error.what());
  }
}

void Planner::after_graph(CUgraphExec exec, CUstream stream, uint64_t capture) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (policy_.mode == Mode::rules) {
    try {
      rules_after(stream, capture);
    } catch (const Error& error) {
      log().error("rules: {}", error.what());
    }
    return;
  }
  if (phase_ != Phase::learning || seen_.empty() || seen_.back().exec != exec ||
      seen_.back().end != nullptr) {
    return;
  }
  try {
    seen_.back().end = new_event();
    load_driver(nullptr)->cuEventRecord(seen_.back().end, stream);
  } catch (const Error& error) {
    log().warn("a learning timing event: {}", error.what());
  }
}

void Planner::before_eager(const char* symbol, CUstream stream, const std::vector<Slot*>& slots) {
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    const size_t restored = make_resident(slots, stream, symbol, "eager");
    used(slots, stream);
    if (phase_ == Phase::learning && !seen_.empty()) {
      auto& uses = seen_.back().uses;
      for (Slot* slot : slots) {
        if (std::find(uses.begin(), uses.end(), slot) == uses.end()) uses.push_back(slot);
      }
    }
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
  } catch (const Error& error) {
    log().error("{}: {}", symbol, error.what());
  }
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
  auto it = held_.find(slot);
  if (it == held_.end()) return;
  Held h = it->second;
  held_.erase(it);
  // A copy may still be in flight into or out of the pinned buffer: only a resident slot's goes
  // back to the pool (programs free graph-pool memory rarely, and never mid-step).
  if (h.host != nullptr && h.where == Where::resident) engine().host_free(h.host);
  if (h.where == Where::restoring) {
    bool shared = false;
    for (const auto& [other, oh] : held_) shared = shared || oh.restore == h.restore;
    if (!shared) reap(h.restore);
  }
  bool planned = false;
  for (const auto& list : active_.releases) {
    planned = planned || std::find(list.begin(), list.end(), slot) != list.end();
  }
  for (Seen& s : seen_) s.uses.erase(std::remove(s.uses.begin(), s.uses.end(), slot), s.uses.end());
  if (planned || phase_ == Phase::planning) learn("a slot in the plan was freed");
}

}  // namespace

void configure(const Policy& policy,
               std::function<std::vector<Slot*>(uint64_t capture)> slots_of_capture) {
  planner().configure(policy, std::move(slots_of_capture));
}
bool wants_eager() { return planner().wants_eager(); }
void before_graph(const char* symbol, CUgraphExec exec, CUstream stream,
                  const std::vector<Slot*>& slots, uint64_t capture) {
  planner().before_graph(symbol, exec, stream, slots, capture);
}
void after_graph(CUgraphExec exec, CUstream stream, uint64_t capture) {
  planner().after_graph(exec, stream, capture);
}
void before_eager(const char* symbol, CUstream stream, const std::vector<Slot*>& slots) {
  planner().before_eager(symbol, stream, slots);
}
void capture_begun() { planner().capture_begun(); }
void exec_changed(CUgraphExec exec) { planner().exec_changed(exec); }
void forget(Slot* slot) { planner().forget(slot); }
Counters counters() { return planner().counters(); }

}  // namespace vaswap::planner
