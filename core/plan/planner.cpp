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
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "base/capture_gate.h"
#include "base/errors.h"
#include "base/log.h"
#include "base/trace.h"
#include "observe/memory_sampler.h"
#include "plan/copy_test.h"
#include "plan/executor.h"
#include "plan/inside.h"
#include "plan/learner.h"
#include "plan/schedule.h"
#include "slots/engine.h"
#include "slots/worker.h"

namespace vaswap::planner {

namespace {

// Launches observed without finding a period before the planner gives up (and stays out of the
// way: residency alone keeps launches correct and within the budget).
constexpr size_t kMaxLearningLaunches = 4096;
// Of the maps and unmaps the run has made, the share that the schedule's remap cost should cover;
// of its copies, the speed below which that share of them ran (a busy link only slows a copy).
constexpr double kSeenQuantile = 0.9;

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
  void after_eager(const Ticket& ticket, CUstream stream);
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
  void observe(CUgraphExec exec, CUstream stream, const std::vector<Slot*>& slots);
  void start_planning(int period);
  Ticket advance(std::unique_lock<std::mutex>& lock, const char* symbol, CUgraphExec exec,
                 CUstream stream, const std::vector<Slot*>& slots, const std::string& what);
  void start_sampler(const Driver& driver);
  // `issued` (releases): "launch" at their own position's launch, "after_launch" or
  // "after_eager" early, once their slots' last use before it was enqueued.
  void trace_action(trace::Event event, const std::vector<Slot*>& slots, CUstream stream,
                    const char* issued = nullptr) const {
    if (!trace::enabled()) return;
    uint64_t bytes = 0;
    for (const Slot* slot : slots) bytes += slot->bytes;
    trace::Record record(event);
    record.add("plan", executor_.plan())
        .add("position", executor_.position())
        .add("slots", static_cast<uint64_t>(slots.size()))
        .add("bytes", bytes)
        .hex("stream", stream_id(stream));
    if (issued != nullptr) record.add("issued", issued);
    record.emit();
  }
  // schedule.release_after_use, which trusts learning's view of the eager work after a launch:
  // with the guard off that work is not scanned in steady state, and a use of a slot that learning
  // did not see would run after its release.
  bool releases_after_use() const { return policy_.release_after_use && policy_.guard; }
  // A release issued before its position's launch. Those residency leaves resident (a launch of
  // another thread still pins the slot) are issued again at the next launch.
  void release_early(const std::vector<Slot*>& slots, CUstream stream, const char* issued) {
    if (slots.empty()) return;
    const std::vector<Slot*> left = residency::evict(slots, "plan");
    std::vector<Slot*> released;
    for (Slot* slot : slots) {
      if (std::find(left.begin(), left.end(), slot) == left.end()) released.push_back(slot);
    }
    retry_releases_.insert(retry_releases_.end(), left.begin(), left.end());
    counters_.planned_offloads += released.size();
    if (!released.empty()) trace_action(trace::Event::plan_offload, released, stream, issued);
  }

  // On the planning worker, without mutex_ (takes it to publish).
  void plan(Learned& learned, uint64_t generation);
  plan::Model model_for(int device);

  std::mutex mutex_;
  Policy policy_;
  Phase phase_ = Phase::off;
  std::atomic<bool> eager_{true};
  Learner learner_;
  Executor executor_;                  // the period being planned or in force, and its plan
  std::vector<Slot*> retry_releases_;  // early releases left resident: again at the next launch
  uint64_t generation_ = 0;  // bumped whenever learning starts over; stale plans are dropped
  std::unique_ptr<Worker> planning_worker_;
  std::unique_ptr<MemorySampler> sampler_;
  bool sampler_tried_ = false;
  std::map<int, plan::Model>
      measured_;  // per device: each has its own link (the planning worker's)
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
  if (rest.size() < slots.size()) {
    for (Slot* slot : slots) {
      if (std::find(rest.begin(), rest.end(), slot) == rest.end()) ticket.borrowed.push_back(slot);
    }
  }
  lock.lock();
  if (ticket.result != CUDA_SUCCESS) return ticket;
  const residency::Acquired& a = ticket.acquired;
  if (phase_ == Phase::steady) counters_.on_demand_restores += a.demanded;
  if ((a.waits > 0 || a.map_waited || a.substitute != nullptr) && trace::enabled()) {
    std::string waited;
    for (const uint64_t id : a.waited) waited += (waited.empty() ? "" : ",") + std::to_string(id);
    trace::Record(trace::Event::restore_wait)
        .add("call", what)
        .add("reason", reason)
        .add("on_demand", a.demanded > 0)
        .add("slots", static_cast<uint64_t>(a.waits))
        .add("waited", waited)
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
  learner_.clear();
  executor_.clear();
  retry_releases_.clear();
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

void Planner::observe(CUgraphExec exec, CUstream stream, const std::vector<Slot*>& slots) {
  if (const int period = learner_.observe(exec, stream, slots, policy_.learning_steps)) {
    start_planning(period);
  } else if (learner_.size() >= kMaxLearningLaunches) {
    log().warn(
        "no periodic pattern in {} graph launches; vaswap keeps slots within the budget by least "
        "recent use, without a schedule (launches stay correct)",
        learner_.size());
    if (trace::enabled()) {
      trace::Record(trace::Event::notice)
          .add("message", "no periodic launch pattern found; the planner stops learning")
          .emit();
    }
    learner_.clear();
    set_phase(Phase::off);
  }
}

void Planner::start_planning(int period) {
  std::shared_ptr<Learned> learned = learner_.take(period, policy_.learning_steps);
  const uint64_t generation = generation_;
  std::vector<CUgraphExec> keys;
  for (size_t i = 0; i < static_cast<size_t>(period); ++i) keys.push_back(learned->window[i].exec);
  executor_.follow(std::move(keys));  // the launch that completed the repeat was position 0
  set_phase(Phase::planning);
  // The positions' uses go to residency at once: eviction picks the farthest next use.
  {
    std::vector<std::vector<Slot*>> uses(static_cast<size_t>(period));
    for (int i = 0; i < period; ++i) {
      for (int region : learned->period.uses[static_cast<size_t>(i)]) {
        uses[static_cast<size_t>(i)].push_back(learned->regions[static_cast<size_t>(region)]);
      }
    }
    residency::set_schedule(uses);
    residency::at_position(executor_.position());
  }
  if (learned->regions.empty()) {
    // No slot is used in the period: nothing to plan, and no copy test to run.
    drop_events(learned->window);
    executor_.install(++counters_.plans, {}, {});
    set_phase(Phase::steady);
    if (trace::enabled()) {
      trace::Record(trace::Event::plan)
          .add("plan", executor_.plan())
          .add("period", static_cast<uint64_t>(period))
          .add("regions", uint64_t{0})
          .add("windows", uint64_t{0})
          .add("reason", "no slot is used in the period")
          .emit();
    }
    return;
  }
  if (!planning_worker_) {
    // Plans are made on a thread of their own. Where the system starts none (a thread limit),
    // there is no plan: as where no pattern is found; before, std::system_error left the
    // program's graph launch and ended the process.
    try {
      const Driver& driver = *load_driver(nullptr);
      CUcontext context = engine().context(learned->device);
      planning_worker_ = std::make_unique<Worker>(driver, context, "vaswap-plan");
    } catch (const std::system_error& error) {
      log().warn(
          "the planner's thread could not be started ({}); vaswap keeps slots within the "
          "budget by least recent use, without a schedule (launches stay correct)",
          error.what());
      drop_events(learned->window);
      residency::set_schedule({});  // eviction by least recent use, as the warning says
      learner_.clear();
      set_phase(Phase::off);
      return;
    }
  }
  planning_worker_->post([this, learned, generation] { plan(*learned, generation); });
}

plan::Model Planner::model_for(int device) {
  plan::Model given{policy_.h2d_gbps, policy_.d2h_gbps,
                    static_cast<double>(policy_.remap_latency_ns) / 1e3, "given"};
  if (policy_.model == Model::given) return given;  // as given: plans a test can predict
  auto it = measured_.find(device);
  if (it == measured_.end()) it = measured_.emplace(device, copy_test(device, given)).first;
  plan::Model model = it->second;
  const DeviceCosts& seen = engine().device_costs();
  // The maps and unmaps of learning (and of earlier plans) were made beside the run's copies, as
  // the plan's will be: a high quantile of them, so that a restore's lead covers most of its
  // maps, not the median one.
  model.remap_seen_us = seen.remap_us(device, kSeenQuantile);
  // A copy shares the link with whatever else runs and is only slowed by it, so the run's own
  // copies show what the link gives at least. The copy test can find the link busy with
  // learning's copies for all its rounds: on the H200 one run measured 2.3 GB/s D2H where the
  // run's own copies went at 55 (bench/results/remap_seen_session40_h200.md).
  model.h2d_seen_gbps = seen.gbps(device, /*to_host=*/false, kSeenQuantile);
  model.d2h_seen_gbps = seen.gbps(device, /*to_host=*/true, kSeenQuantile);
  model.h2d_gbps = std::max(model.h2d_gbps, model.h2d_seen_gbps);
  model.d2h_gbps = std::max(model.d2h_gbps, model.d2h_seen_gbps);
  return model;
}

namespace {

using trace::joined;

// What one device's schedule was chosen from, so that a run's plan can be chosen again offline
// (bench/plan_replay): the period's times, each region's slot, bytes, pages and uses, the knobs.
// Figures in full precision ("{}": the shortest that reads back exactly), so that the same choice
// is made again.
// `ids`: the regions' slot ids, noted while learning (a slot may be freed meanwhile).
void trace_plan_input(int device, const plan::Period& sub, const plan::Model& model,
                      const plan::Knobs& knobs, const std::vector<uint64_t>& ids,
                      const std::vector<int>& global) {
  const auto us = [](double t) { return fmt::format("{}", t); };
  const auto number = [](uint64_t v) { return std::to_string(v); };
  trace::Record(trace::Event::plan_input)
      .add("device", device)
      .add("period_us", us(sub.length_us))
      .add("model", fmt::format("{},{},{},{}", model.h2d_gbps, model.d2h_gbps, model.remap_us,
                                model.remap_seen_us))
      .add("start_us", joined(sub.start_us, us))
      .add("end_us", joined(sub.end_us, us))
      .add("slots",
           joined(global, [&](int r) { return std::to_string(ids[static_cast<size_t>(r)]); }))
      .add("region_bytes", joined(sub.region_bytes, number))
      .add("region_pages", joined(sub.region_pages, number))
      .add("uses", joined(
                       sub.uses,
                       [](const std::vector<int>& at) {
                         return joined(at, [](int r) { return std::to_string(r); });
                       },
                       ";"))
      .add("budget", knobs.budget_pages)
      .add("limit", knobs.limit_pages)
      .add("prefetch_distance", knobs.prefetch_distance)
      .add("release_lag", knobs.release_lag)
      .emit();
}

}  // namespace

// schedule.release_after_use: where a window's release may be issued before its position's
// launch (Executor::install's after_calls). Only where the slot's last use is the position just
// before (a release_lag keeps it at its launch): 0 when that launch used it last, k when the k-th
// eager call after the launch that used it did (in every period learning saw), else -1.
int release_after_calls(const Learned& learned, const plan::Window& w) {
  const int n = static_cast<int>(learned.period.uses.size());
  if (n == 0 || w.last_use != (w.release_at + n - 1) % n) return -1;
  const auto& tail = learned.tail_calls[static_cast<size_t>(w.last_use)];
  const auto it = tail.find(w.region);
  return it == tail.end() ? 0 : it->second;
}

// On the planning worker.
void Planner::plan(Learned& learned, uint64_t generation) {
  const size_t period = learned.window.size() - 1;
  learned_times(learned);  // the times of the last complete period, on the device's clock

  Policy policy;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    policy = policy_;
  }
  // One schedule per device: a device's slots fit its own budget and move over its own link (one
  // process may use several GPUs; each position's timing is the same for all).
  // The slots may be freed meanwhile (the plan is then dropped below): their devices were noted.
  std::vector<int> devices;
  for (int device : learned.devices) {
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
    double copy_us = 0;  // the plan's copies each way, back to back at the model's slower speed
  };
  std::vector<Part> parts;
  std::vector<plan::Window> windows;  // regions: indices into learned.regions
  for (int device : devices) {
    plan::Period sub;
    sub.start_us = learned.period.start_us;
    sub.end_us = learned.period.end_us;
    sub.length_us = learned.period.length_us;
    std::vector<int> global;
    std::vector<int> local(learned.regions.size(), -1);
    Part part;
    part.device = device;
    for (size_t r = 0; r < learned.regions.size(); ++r) {
      if (learned.devices[r] != device) continue;
      local[r] = static_cast<int>(global.size());
      global.push_back(static_cast<int>(r));
      sub.region_bytes.push_back(learned.period.region_bytes[r]);
      sub.region_pages.push_back(learned.period.region_pages[r]);
      part.region_bytes += learned.period.region_bytes[r];
    }
    part.regions = global.size();
    for (const std::vector<int>& uses : learned.period.uses) {
      auto& mine = sub.uses.emplace_back();
      for (int r : uses) {
        if (local[static_cast<size_t>(r)] >= 0) mine.push_back(local[static_cast<size_t>(r)]);
      }
    }
    part.budget = residency::budget(device);
    const plan::Knobs knobs{policy.prefetch_distance, policy.release_lag, part.budget.target,
                            part.budget.limit};
    // Where the device's slots fit its budget nothing leaves, whatever the link: the copy test
    // (a slot of up to 64 MiB and about 100 ms of the link) is not run for it.
    plan::Model model;
    if (!plan::fits(sub, knobs)) {
      model = model_for(device);
      if (trace::enabled()) {
        trace::Record(trace::Event::model)
            .add("source", model.source)
            .add("h2d_gbps", model.h2d_gbps)
            .add("d2h_gbps", model.d2h_gbps)
            .add("remap_us", model.remap_us)
            .add("remap_seen_us", model.remap_seen_us)
            .add("h2d_seen_gbps", model.h2d_seen_gbps)
            .add("d2h_seen_gbps", model.d2h_seen_gbps)
            .add("device", device)
            .emit();
      }
    }
    part.plan = plan::choose(sub, model, knobs);
    if (part.plan.moved_bytes > 0) {
      part.copy_us =
          std::max(model.h2d_us(part.plan.moved_bytes), model.d2h_us(part.plan.moved_bytes));
    }
    if (trace::enabled()) trace_plan_input(device, sub, model, knobs, learned.ids, global);
    for (plan::Window w : part.plan.windows) {
      w.region = global[static_cast<size_t>(w.region)];
      windows.push_back(w);
    }
    parts.push_back(std::move(part));
  }

  std::lock_guard<std::mutex> lock(mutex_);
  if (generation != generation_ || phase_ != Phase::planning) return;  // learning again
  std::vector<std::vector<Slot*>> releases(period), restores(period);
  std::vector<std::vector<int>> after_calls(period);
  // Releases issued together, the smallest first: their D2Hs follow each other on the link, so
  // the first room comes soonest (the schedule's replay assumes this order).
  std::vector<plan::Window> by_size = windows;
  std::stable_sort(by_size.begin(), by_size.end(),
                   [&](const plan::Window& a, const plan::Window& b) {
                     return learned.regions[static_cast<size_t>(a.region)]->mapped_bytes <
                            learned.regions[static_cast<size_t>(b.region)]->mapped_bytes;
                   });
  for (const plan::Window& w : by_size) {
    Slot* slot = learned.regions[static_cast<size_t>(w.region)];
    releases[static_cast<size_t>(w.release_at)].push_back(slot);
    after_calls[static_cast<size_t>(w.release_at)].push_back(
        policy.release_after_use ? release_after_calls(learned, w) : -1);
  }
  // Restores issued together, the nearest use first: the order the schedule's replay assumes
  // (docs/PLANNER.md; on the H100 it changed the per-layer PyTorch job's step time by nothing
  // measurable against smallest first).
  std::vector<uint64_t> mapped(learned.regions.size());
  for (size_t r = 0; r < mapped.size(); ++r) mapped[r] = learned.regions[r]->mapped_bytes;
  for (size_t i : plan::restore_order(windows, static_cast<int>(period), mapped)) {
    const plan::Window& w = windows[i];
    restores[static_cast<size_t>(w.restore_at)].push_back(
        learned.regions[static_cast<size_t>(w.region)]);
  }
  executor_.install(++counters_.plans, std::move(releases), std::move(restores),
                    std::move(after_calls));
  set_phase(Phase::steady);
  if (!trace::enabled()) return;
  // The device time the period's graphs run, what copies can hide behind besides host gaps.
  double graphs_us = 0;
  for (size_t i = 0; i < learned.period.start_us.size(); ++i) {
    graphs_us += learned.period.end_us[i] - learned.period.start_us[i];
  }
  for (const Part& part : parts) {  // one event per device, under the one plan number
    const plan::Plan& chosen = part.plan;
    trace::Record(trace::Event::plan)
        .add("plan", executor_.plan())
        .add("device", part.device)
        .add("period", static_cast<uint64_t>(period))
        .add("period_us", learned.period.length_us)
        .add("learned_parked_us", learned.parked_us)
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
        .add("moved_bytes", chosen.moved_bytes)
        .add("copy_us", part.copy_us)
        .add("graphs_us", graphs_us)
        .add("reason", chosen.reason)
        .emit();
  }
  for (const plan::Window& w : windows) {
    const Slot* slot = learned.regions[static_cast<size_t>(w.region)];
    trace::Record(trace::Event::plan_window)
        .add("plan", executor_.plan())
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
        .add("for_room", w.for_room)
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
  try {
    sampler_ = std::make_unique<MemorySampler>(driver, context, static_cast<int>(device),
                                               policy_.memory_interval_ns);
  } catch (const std::system_error& error) {
    log().warn("the memory sampler's thread could not be started ({}): no memory samples",
               error.what());
    return;
  }
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
  int expected = 0;
  const int found = executor_.locate(exec, &expected);
  if (found != expected) {
    // Out of order: a known graph resynchronizes (an evaluation step, a skipped graph); an
    // unknown one means a new pattern.
    ++counters_.deviations;
    if (trace::enabled()) {
      trace::Record(trace::Event::deviation)
          .add("call", symbol)
          .hex("exec", reinterpret_cast<uintptr_t>(exec))
          .add("expected", expected)
          .add("found", found)
          .emit();
    }
    if (found < 0) {
      learn("a graph the plan does not know was launched");
      learner_.ask(stream);
      Ticket ticket = acquire(lock, slots, stream, what, "learning");
      if (ticket.result == CUDA_SUCCESS && phase_ == Phase::learning) observe(exec, stream, slots);
      return ticket;
    }
  }
  residency::at_position(executor_.position());
  const uint64_t generation = generation_;
  // Early releases residency left resident: again here, where they were due (not after a launch
  // out of order, which may use them).
  std::vector<Slot*> retry;
  retry.swap(retry_releases_);
  if (phase_ == Phase::steady) {
    // Those not issued early (the executor's own list: no copy unless a retry joins it).
    const std::vector<Slot*>* due = &executor_.releases();
    std::vector<Slot*> with_retry;
    if (found == expected && !retry.empty()) {
      with_retry = *due;
      for (Slot* slot : retry) {
        if (std::find(with_retry.begin(), with_retry.end(), slot) == with_retry.end()) {
          with_retry.push_back(slot);
        }
      }
      due = &with_retry;
    }
    const std::vector<Slot*>& releases = *due;
    if (!releases.empty()) {
      residency::evict(releases, "plan");
      counters_.planned_offloads += releases.size();
      trace_action(trace::Event::plan_offload, releases, stream, "launch");
    }
  }
  // The launch's own slots only: the eager work that follows it (and that the period counts at
  // this position) acquires its own, one call at a time.
  Ticket ticket = acquire(lock, slots, stream, what, "graph");
  if (generation_ != generation) return ticket;  // learning again meanwhile: no plan to follow
  if (phase_ == Phase::steady && ticket.result == CUDA_SUCCESS && !executor_.restores().empty()) {
    const std::vector<Slot*>& restores = executor_.restores();
    residency::prefetch(restores);
    counters_.planned_restores += restores.size();
    trace_action(trace::Event::plan_restore, restores, stream);
  }
  executor_.next();
  ticket.next_position = executor_.position();
  ticket.generation = generation_;
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
        learner_.ask(stream);
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
  inside::used_elsewhere(ticket.borrowed, stream);
  std::lock_guard<std::mutex> lock(mutex_);
  if (phase_ == Phase::steady && ticket.result == CUDA_SUCCESS && releases_after_use() &&
      ticket.generation == generation_ && ticket.next_position == executor_.position()) {
    // The next position's releases whose slots this launch used last: their D2H may begin as
    // soon as the launch ends, whatever the program does on the host before the next one. Not
    // where another thread's launch was handled meanwhile: the position is no longer this one's.
    release_early(executor_.due_after_launch(), stream, "after_launch");
  }
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
  if (phase_ != Phase::learning) return;
  try {
    learner_.launched(exec, stream);
  } catch (const Error& error) {
    log().warn("a learning timing event: {}", error.what());
  }
}

Ticket Planner::before_eager(const char* symbol, CUstream stream, const std::vector<Slot*>& slots,
                             residency::Checked checked, const residency::EagerShape* shape) {
  std::unique_lock<std::mutex> lock(mutex_);
  // Learning times the stream's waits for this call's slots, as a launch's (no event into a
  // capture: invariant 5).
  const uint64_t generation = generation_;
  const CUevent asked =
      phase_ == Phase::learning && capture_gate::open() == 0 ? learner_.ask_eager(stream) : nullptr;
  Ticket ticket = acquire(lock, slots, stream, symbol, "eager", checked, shape);
  if (asked != nullptr) {
    // Kept only while the same learning goes on (it may have started over meanwhile).
    const residency::Acquired& a = ticket.acquired;
    const bool waited = ticket.result == CUDA_SUCCESS &&
                        (a.waits > 0 || a.host_waited || a.map_waited) &&
                        phase_ == Phase::learning && generation_ == generation;
    learner_.eager_acquired(asked, stream, waited);
  }
  if (ticket.result != CUDA_SUCCESS) {
    log().error("{}", ticket.message);
    return ticket;
  }
  if (phase_ == Phase::learning) learner_.also_uses(slots);
  if (phase_ == Phase::steady && releases_after_use()) {
    ticket.release_after = executor_.due_after_eager(slots);
    ticket.generation = generation_;
  }
  const size_t restored = ticket.acquired.demanded;
  if (restored > 0 && phase_ == Phase::steady) {
    counters_.guard_hits += restored;
    if (trace::enabled()) {
      trace::Record(trace::Event::guard_hit)
          .add("call", symbol)
          .add("slots", static_cast<uint64_t>(restored))
          .add("position", executor_.position())
          .hex("stream", stream_id(stream))
          .emit();
    }
  }
  return ticket;
}

// The releases before_eager found due, once the call is enqueued (used() has marked it). Not if
// learning began again meanwhile: freeing a planned slot does that, so the slots still live. The
// executor may have moved on (another thread launched): they were counted as issued all the same.
void Planner::after_eager(const Ticket& ticket, CUstream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (phase_ != Phase::steady || ticket.generation != generation_) return;
  release_early(ticket.release_after, stream, "after_eager");
}

void Planner::capture_begun() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (phase_ == Phase::planning || phase_ == Phase::steady ||
      (phase_ == Phase::learning && !learner_.empty())) {
    learn("a capture began");
  }
}

void Planner::exec_changed(CUgraphExec exec) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (executor_.knows(exec) || learner_.saw(exec)) learn("a graph of the pattern was changed");
}

void Planner::forget(Slot* slot) {
  std::lock_guard<std::mutex> lock(mutex_);
  const bool planned = executor_.forget(slot);
  learner_.forget(slot);
  retry_releases_.erase(std::remove(retry_releases_.begin(), retry_releases_.end(), slot),
                        retry_releases_.end());
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
  settings.d2h_gate = policy.d2h_gate;
  settings.host_limit_bytes = policy.host_pool_limit;
  settings.captured_only = policy.captured_only;
  settings.min_bytes = policy.min_bytes;
  residency::configure(settings);
  inside::Settings in;
  in.mode = policy.inside == Inside::off  ? inside::Mode::off
            : policy.inside == Inside::on ? inside::Mode::on
                                          : inside::Mode::automatic;
  in.lead = static_cast<size_t>(policy.inside_lead);
  in.min_gap = static_cast<size_t>(policy.inside_min_gap);
  in.lag = static_cast<size_t>(policy.inside_lag);
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
void after_eager(const Ticket& ticket) {
  residency::used(ticket.acquired);
  inside::used_elsewhere(ticket.borrowed, ticket.acquired.stream);
  if (!ticket.release_after.empty()) planner().after_eager(ticket, ticket.acquired.stream);
}
void capture_begun() { planner().capture_begun(); }
void exec_changed(CUgraphExec exec) { planner().exec_changed(exec); }
void forget(Slot* slot) { planner().forget(slot); }
Counters counters() { return planner().counters(); }

}  // namespace vaswap::planner
