#include "observe/intercept.h"

#include <dlfcn.h>
#include <sys/auxv.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "base/capture_gate.h"
#include "base/driver.h"
#include "base/errors.h"
#include "base/log.h"
#include "base/trace.h"
#include "observe/callsite.h"
#include "observe/graph_scan.h"
#include "observe/launch_times.h"
#include "plan/inside.h"
#include "plan/planner.h"
#include "plan/residency.h"
#include "policy.h"
#include "slots/engine.h"

namespace vaswap::intercept {

// =============================================================================================
// The environment, read once
// =============================================================================================

Environment read_environment(bool secure, const std::function<const char*(const char*)>& variable) {
  Environment e;
  if (secure) return e;
  auto env = [&](const char* name) {
    const char* value = variable(name);
    return std::string(value != nullptr ? value : "");
  };
  PolicyLoad load = load_policy(env("VASWAP_POLICY"), env("VASWAP_CONF"));
  e.policy = load.policy;
  if (!load.ok()) {
    std::string message = "the vaswap policy has " + std::to_string(load.errors.size()) +
                          (load.errors.size() == 1 ? " error" : " errors") + ":";
    for (const std::string& error : load.errors) message += "\n  " + error;
    if (load.policy.on_error == OnError::abort) {
      // Stop at the first hooked call, before any CUDA work reaches the driver.
      e.abort_message = message +
                        "\nvaswap stops the program (on_error: abort). Fix the policy, check it "
                        "with `vaswap check-policy FILE`, or set on_error: passthrough.";
      e.on = true;
      return e;
    }
    e.notices.push_back(message + "\nvaswap is passing every call through (on_error: passthrough)");
    e.policy.mode = Mode::off;
  }
  for (const char* name : {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}) {
    if (!expandable_segments_enabled(env(name))) continue;
    e.notices.push_back(
        std::string(name) +
        " has expandable_segments:True: PyTorch then maps its own memory with "
        "cuMemCreate/cuMemMap and never calls cudaMalloc for its segments, so vaswap cannot "
        "select, back or offload PyTorch's tensors. Remove the setting (or set "
        "expandable_segments:False) to let vaswap back graph-pool segments with slots");
  }
  e.on = e.policy.mode != Mode::off;
  return e;
}

namespace {

const Environment& environment() {
  static const Environment* e =  // read once, never freed
      new Environment(read_environment(getauxval(AT_SECURE) != 0, [](const char* name) {
        return static_cast<const char*>(std::getenv(name));
      }));
  return *e;
}

// Ends the process with `message`, without running its atexit handlers (which may call CUDA).
[[noreturn]] void stop(const std::string& message) {
  std::fprintf(stderr, "[vaswap] error: %s\n", message.c_str());
  std::fflush(stderr);
  _exit(1);
}

std::vector<Slot*> slots_of_capture(uint64_t ordinal);
void say_summary();

}  // namespace

bool stream_capturing(CUstream stream);

namespace {

// First hooked call: open the trace and say what needs saying, once.
void start() {
  static std::once_flag once;
  std::call_once(once, [] {
    const Environment& e = environment();
    if (!e.abort_message.empty()) stop(e.abort_message);
    configure_log(e.policy.log_level, e.policy.log_destination);
    trace::open_from_environment(e.policy.trace_path, e.policy.trace_overwrite);
    launch_times::configure(e.policy.launch_times);
    planner::configure(e.policy, &slots_of_capture);
    if (!e.policy.serial_driver_calls) {
      try {
        engine().set_serial_driver_calls(false);
      } catch (const Error& error) {
        log().warn("workers.serial_driver_calls: {}", error.what());
      }
    }
    for (const std::string& notice : environment().notices) {
      log().warn("{}", notice);
      if (trace::enabled()) trace::Record(trace::Event::notice).add("message", notice).emit();
    }
    // Registered after the trace opened, so it runs before the trace closes.
    std::atexit(say_summary);
  });
}

// =============================================================================================
// Tables
// =============================================================================================

uint64_t thread_id() {
  static thread_local const uint64_t tid = static_cast<uint64_t>(syscall(SYS_gettid));
  return tid;
}

struct LiveCapture {
  CaptureTag tag;
  uint64_t ordinal = 0;  // 1 for the process's first capture
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  uint64_t begin_ns = 0;
  uint64_t allocations = 0, bytes = 0, slots = 0;
};

// What a capture made: a graph, and the capture's place among the process's captures.
struct GraphFacts {
  uint64_t capture = 0;  // the capture that made the graph
  uint64_t ordinal = 0;  // that capture's position among the process's captures
  uint64_t allocations = 0, slots = 0;
};

// What an executable graph uses, from the scan of the graph it was instantiated (or last
// updated) from. `opaque`: something in it cannot be read (a kernel without a parameter layout,
// a node kind the scan does not know, a node changed after instantiation), so it counts as using
// every slot (DESIGN.md invariant 10).
struct ExecFacts {
  CUgraph graph = nullptr;
  uint64_t capture = 0, ordinal = 0;
  std::vector<Slot*> slots;  // what the planner makes resident before each launch
  bool opaque = false;
  const char* why_opaque = "";
  bool launched = false;  // launched before: its upload is done (first-time work, settle)
};

struct Tables {
  std::mutex mutex;  // guards the maps below; the registry has its own lock
  std::unordered_map<CUstream, LiveCapture> captures;  // live captures, by capturing stream
  std::unordered_map<CUgraph, GraphFacts> graphs;      // graphs that came from a capture
  std::unordered_map<CUgraphExec, ExecFacts> execs;
  RegionRegistry registry;
  // Kernel parameter layouts (offset, size), by function, for scanning eager launches.
  std::mutex layouts_mutex;
  std::unordered_map<const void*, std::vector<std::pair<size_t, size_t>>> layouts;
  // Kernels with a launch made (returned) in each context (a runtime kernel's module is loaded
  // per device, at its first launch there), kept only while the device handshake is in use.
  std::set<std::pair<const void*, CUcontext>> launched_functions;
  // Kernel lookups that returned (handle, name, context), likewise.
  std::set<std::tuple<const void*, std::string, CUcontext>> lookups;
  std::atomic<uint64_t> allocations{0}, frees{0}, slots{0}, captures_begun{0}, instantiations{0},
      launches{0};
  // Slots the program freed while a capture was open (guarded by mutex): destroyed once none is
  // (core/base/capture_gate.h).
  std::vector<Slot*> retired;
};

Tables& tables() {
  static auto* t = new Tables;  // leaked: hooks run from atexit handlers and other threads
  return *t;
}

// Streams this thread began capturing, newest last. An allocation belongs to the newest one that
// is still live and was begun by this thread.
thread_local std::vector<CUstream> tls_captures;

std::optional<LiveCapture*> current_capture_locked(Tables& t) {
  while (!tls_captures.empty()) {
    auto it = t.captures.find(tls_captures.back());
    if (it != t.captures.end() && it->second.tag.thread == thread_id()) return &it->second;
    tls_captures.pop_back();  // ended elsewhere (relaxed mode allows that) or by a reset
  }
  return std::nullopt;
}

// A null stream means the calling thread's per-thread stream in the _ptsz/_ptds entry points.
CUstream stream_of(const Call& call, CUstream stream) {
  return call.per_thread && stream == nullptr ? CU_STREAM_PER_THREAD : stream;
}

const char* api_name(Api api) { return api == Api::runtime ? "runtime" : "driver"; }

const char* mode_name(CUstreamCaptureMode mode) {
  switch (mode) {
    case CU_STREAM_CAPTURE_MODE_GLOBAL: return "global";
    case CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: return "thread_local";
    case CU_STREAM_CAPTURE_MODE_RELAXED: return "relaxed";
  }
  return "unknown";
}

trace::Record record(trace::Event event, const Call& call) {
  trace::Record r(event);
  r.add("call", call.symbol).add("api", api_name(call.api));
  return r;
}

int current_device() {
  const Driver* driver = load_driver(nullptr);
  CUdevice device = 0;
  if (driver == nullptr || driver->cuCtxGetDevice(&device) != CUDA_SUCCESS) return -1;
  return static_cast<int>(device);
}

// NCCL maps and registers its own buffers; remapping under a registered buffer hangs. An
// allocation whose call comes from libnccl is never a slot.
bool from_nccl(const void* caller) {
  Dl_info info{};
  if (caller == nullptr || dladdr(caller, &info) == 0 || info.dli_fname == nullptr) return false;
  const char* slash = std::strrchr(info.dli_fname, '/');
  return std::strncmp(slash != nullptr ? slash + 1 : info.dli_fname, "libnccl", 7) == 0;
}

// Registers `region`. A region already registered over the same bytes was freed through a path
// the hooks do not see (cuMemFree v1, a context destroyed): the driver has just handed these
// bytes out again, so the old entry is stale and goes.
void register_region(const Region& region) {
  RegionRegistry& registry = tables().registry;
  std::string error;
  if (registry.insert(region, &error)) return;
  for (const Region& stale : registry.overlapping(region.base, region.base + region.bytes)) {
    log().debug("dropping stale region [{}, +{}): {}", hex(stale.base), stale.bytes, error);
    registry.erase(stale.base);
  }
  if (!registry.insert(region, &error)) log().warn("cannot register a region: {}", error);
}

// A slot is about to be destroyed: no graph's facts, no plan and no residency may keep it.
void forget_slot(Tables& t, Slot* slot) {
  inside::forget(slot);
  planner::forget(slot);
  residency::forget(slot);
  std::lock_guard<std::mutex> lock(t.mutex);
  for (auto& [exec, facts] : t.execs) {
    auto& list = facts.slots;
    list.erase(std::remove(list.begin(), list.end(), slot), list.end());
  }
}

void warn_slot_failure(const std::string& why) {
  static std::atomic<uint64_t> failures{0};
  const uint64_t n = failures.fetch_add(1);
  if (n == 0 || (n & (n + 1)) == 0) {  // the 1st, 2nd, 4th, 8th... time
    log().warn("could not back an allocation with a slot ({} so far; it was passed through): {}",
               n + 1, why);
  }
}

// The slots allocated during the process's N-th capture (rules mode names them so).
std::vector<Slot*> slots_of_capture(uint64_t ordinal) {
  std::vector<Slot*> slots;
  for (const Region& region : tables().registry.overlapping(0, UINTPTR_MAX)) {
    if (region.kind == RegionKind::slot && region.capture && region.capture->ordinal == ordinal) {
      slots.push_back(static_cast<Slot*>(region.slot));
    }
  }
  return slots;
}

// At exit: what vaswap did, on the log at info level (shown with log.level: info, as NCCL's
// INFO lines are) and as the trace's `summary` event. No CUDA call is made here, but for the
// opt-in trace.launch_times: event queries, which wait for nothing and fail harmlessly once the
// program's context is gone.
void say_summary() {
  // A forked child has none of vaswap's threads, and the parent's counters: it says nothing.
  if (trace::forked_child()) return;
  launch_times::finish();
  const Tables& t = tables();
  const planner::Counters p = planner::counters();
  vaswap_stats s{};
  Engine::MemoryPeaks peaks;
  residency::Stats r;
  inside::Stats in;
  if (t.slots.load() > 0) {  // the engine exists; do not create one at exit
    s = engine().stats();
    peaks = engine().memory_peaks();
    r = residency::stats();
    in = inside::stats();
  }
  const double mib = 1024.0 * 1024.0;
  std::string trace_lost;  // a trace that could not be written (a full disk) says what it lost
  if (const trace::Losses lost = trace::losses(); lost.events > 0) {
    trace_lost = "; trace: " + std::to_string(lost.events) + " events lost (" + lost.file + ": " +
                 std::strerror(lost.error_number) + ")";
  }
  log().info(
      "summary: {} slots selected; {} offloaded ({} plan{}); {:.0f} MiB offloaded, {:.0f} MiB "
      "restored; device memory peak {:.0f} MiB in use, {:.0f} MiB with the released pages added "
      "back (cuMemGetInfo); residency budget {:.0f} MiB, slots held at most {:.0f} MiB; {} "
      "evictions ({} for room, {} planned, {} for the program's own allocations; {} called off "
      "by a restore before the unmap); {} launches refused for want of memory; {} handshake; host "
      "waited {:.1f} ms for restores ({} waits, "
      "{} slots on demand) and {:.1f} ms for the pages of copies and memsets ({} waits){}; {} "
      "guard hits; {} deviations; {} errors{}",
      t.slots.load(), p.regions_offloaded, p.plans, p.plans == 1 ? "" : "s",
      static_cast<double>(s.bytes_offloaded) / mib, static_cast<double>(s.bytes_restored) / mib,
      static_cast<double>(peaks.used) / mib, static_cast<double>(peaks.without_releases) / mib,
      static_cast<double>(r.budget_bytes) / mib, static_cast<double>(r.peak_resident) / mib,
      r.evictions, r.evictions_budget, r.evictions_plan, r.evictions_program, r.reclaims,
      r.oom_launches, r.device_handshake ? "device" : "host", p.stall_us / 1e3, p.stalls,
      p.on_demand_restores, p.map_wait_us / 1e3, p.map_waits,
      r.device_handshake ? fmt::format("; first-time work waited {:.1f} ms for parked streams ({} "
                                       "waits); {} restores mapped beyond the budget",
                                       r.settle_wait_us / 1e3, r.settle_waits, r.budget_overshoots)
                         : std::string(),
      p.guard_hits, p.deviations, s.errors, trace_lost);
  if (in.graphs > 0) {
    log().info(
        "summary, inside graphs: {} rewritten with {} windows; {} slots lent ({:.0f} MiB), held at "
        "most {:.0f} MiB at once; {} launches carried out, {} releases, {} restores, {:.0f} MiB "
        "moved each way; {} restores waited for room ({:.1f} ms; {} windows then mapped beyond "
        "the reserve) and {} for pages ({:.1f} ms); other work brought lent slots back {} times "
        "({:.1f} ms waited); {} unmaps failed",
        in.graphs, in.windows, in.lent_slots, static_cast<double>(in.lent_bytes) / mib,
        static_cast<double>(in.peak_lent_held) / mib, in.launches, in.releases, in.restores,
        static_cast<double>(in.moved_bytes) / mib, in.room_waits, in.room_wait_us / 1e3,
        in.room_overshoots, in.map_waits, in.map_wait_us / 1e3, in.on_demand,
        in.on_demand_wait_us / 1e3, in.failures);
  }
  if (!trace::enabled()) return;
  trace::Record(trace::Event::summary)
      .add("slots", t.slots.load())
      .add("regions_offloaded", p.regions_offloaded)
      .add("plans", p.plans)
      .add("bytes_offloaded", s.bytes_offloaded)
      .add("bytes_restored", s.bytes_restored)
      .add("peak_used", peaks.used)
      .add("peak_without_releases", peaks.without_releases)
      .add("budget", r.budget_bytes)
      .add("peak_resident", r.peak_resident)
      .add("evictions", r.evictions)
      .add("evictions_budget", r.evictions_budget)
      .add("evictions_plan", r.evictions_plan)
      .add("evictions_program", r.evictions_program)
      .add("reclaims", r.reclaims)
      .add("oom_launches", r.oom_launches)
      .add("handshake", r.device_handshake ? "device" : "host")
      .add("wait_us", p.stall_us)
      .add("waits", p.stalls)
      .add("map_wait_us", p.map_wait_us)
      .add("map_waits", p.map_waits)
      .add("settle_waits", r.settle_waits)
      .add("settle_wait_us", r.settle_wait_us)
      .add("budget_overshoots", r.budget_overshoots)
      .add("host_path_restores", r.host_path_restores)
      .add("d2h_gate_raises", r.d2h_gate_raises)
      .add("d2h_gate_timeouts", r.d2h_gate_timeouts)
      .add("d2h_gate_us", r.d2h_gate_us)
      .add("on_demand", p.on_demand_restores)
      .add("guard_hits", p.guard_hits)
      .add("deviations", p.deviations)
      .add("errors", s.errors)
      .add("inside_graphs", in.graphs)
      .add("inside_windows", in.windows)
      .add("inside_lent_slots", in.lent_slots)
      .add("inside_lent_bytes", in.lent_bytes)
      .add("inside_peak_held", in.peak_lent_held)
      .add("inside_launches", in.launches)
      .add("inside_releases", in.releases)
      .add("inside_restores", in.restores)
      .add("inside_moved_bytes", in.moved_bytes)
      .add("inside_on_demand", in.on_demand)
      .add("inside_on_demand_us", in.on_demand_wait_us)
      .add("inside_failures", in.failures)
      .add("inside_room_waits", in.room_waits)
      .add("inside_room_wait_us", in.room_wait_us)
      .add("inside_room_overshoots", in.room_overshoots)
      .add("inside_map_waits", in.map_waits)
      .add("inside_map_wait_us", in.map_wait_us)
      .emit();
}

// Every slot there is: what a launch that cannot be scanned may use.
std::vector<Slot*> every_slot(const RegionRegistry& registry) {
  std::vector<Slot*> slots;
  for (const Region& region : registry.overlapping(0, UINTPTR_MAX)) {
    if (region.kind == RegionKind::slot) slots.push_back(static_cast<Slot*>(region.slot));
  }
  return slots;
}

}  // namespace

// =============================================================================================
// Public
// =============================================================================================

bool routing_on() {
  // -1: not decided. Asked on every hooked call, so after the first it is one relaxed load.
  static std::atomic<int> state{-1};
  int s = state.load(std::memory_order_relaxed);
  if (s < 0) {
    const Environment& e = environment();
    // A malformed policy with on_error: abort stops the program at the first CUDA lookup or
    // call, before any CUDA work (a runtime's first act is to look up the driver's functions).
    if (!e.abort_message.empty()) stop(e.abort_message);
    s = e.on ? 1 : 0;
    state.store(s, std::memory_order_relaxed);
  }
  return s == 1;
}

bool on() {
  if (driver_shut_down()) return false;  // the process is exiting: every call goes straight on
  if (routing_on()) {
    start();
    return true;
  }
  // Off: say why once (a malformed policy with on_error: passthrough), then stay out of the way.
  static std::atomic<bool> said{false};
  if (!said.load(std::memory_order_relaxed) && !environment().notices.empty()) {
    said.store(true);
    for (const std::string& notice : environment().notices) log().warn("{}", notice);
  }
  return false;
}

bool try_slot(const Call& call, size_t bytes, CUdeviceptr* va, const char** skipped) {
  const Policy& policy = environment().policy;
  if (bytes < policy.min_bytes) return false;
  Tables& t = tables();
  std::optional<CaptureTag> capture;
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    if (auto live = current_capture_locked(t)) capture = (*live)->tag;
  }
  if (policy.captured_only && !capture) return false;
  if (from_nccl(call.caller)) {
    *skipped = "nccl";
    return false;
  }
  const int device = current_device();
  if (device < 0 || (policy.device >= 0 && device != policy.device)) return false;
  double callsite_us = -1;
  if (!policy.include.empty() || !policy.exclude.empty()) {
    const uint64_t start_ns = trace::now_ns();
    std::string error;
    const std::vector<Frame> stack = call_stack(48, &error);
    callsite_us = trace::us_since(start_ns);
    if (stack.empty()) {
      warn_slot_failure("cannot walk the stack for selection.include/exclude: " + error);
      *skipped = "callsite";
      return false;
    }
    if (!policy.include.empty() && !stack_matches(stack, policy.include)) {
      *skipped = "include";
      return false;
    }
    if (stack_matches(stack, policy.exclude)) {
      *skipped = "exclude";
      return false;
    }
  }
  std::string why;
  if (residency::NoSlots cause{}; !residency::can_hold_slots(device, &why, &cause)) {
    warn_slot_failure(why + ": device " + std::to_string(device) + " gets no slots");
    *skipped = cause == residency::NoSlots::flags ? "flags" : "streams";
    return false;
  }
  // Made during a capture, a slot reserves its address alone: its pages come before its first
  // use (residency.h), never at capture. Made outside one, it is used at once: backed now.
  const bool backed = !capture;
  Slot* slot = nullptr;
  try {
    // Backed now, on a full device: slots no launch in flight needs give their pages back
    // first, as for the program's own allocations (the first failure is quiet).
    slot = engine().create_slot(device, bytes, /*intercepted=*/true, backed, /*report=*/!backed);
  } catch (const Error& e) {
    if (!backed || residency::make_room(device, bytes) == 0) {
      warn_slot_failure(e.what());
      return false;
    }
    try {
      slot = engine().create_slot(device, bytes, /*intercepted=*/true, backed);
    } catch (const Error& again) {
      warn_slot_failure(again.what());
      return false;
    }
  }
  try {
    residency::adopt(slot, backed);
  } catch (const Error& e) {
    // No flag for its handshake (pinned host memory ran out): the program's memory comes without
    // a slot. Nothing has used the new slot, so nothing on the device waits for its pages.
    warn_slot_failure(e.what());
    try {
      engine().destroy_slot(slot, /*device_idle_for_it=*/true);
    } catch (const Error& again) {
      warn_slot_failure(again.what());
    }
    *skipped = "flags";
    return false;
  }
  register_region({slot->va, bytes, device, RegionKind::slot, capture, slot});
  t.allocations.fetch_add(1, std::memory_order_relaxed);
  t.slots.fetch_add(1, std::memory_order_relaxed);
  if (capture) {
    std::lock_guard<std::mutex> lock(t.mutex);
    if (auto live = current_capture_locked(t)) {
      (*live)->allocations++;
      (*live)->bytes += bytes;
      (*live)->slots++;
    }
  }
  if (trace::enabled()) {
    auto r = record(trace::Event::alloc, call);
    r.hex("va", slot->va).add("bytes", static_cast<uint64_t>(bytes)).add("device", device);
    if (capture) r.add("capture", capture->sequence);
    r.add("selected", true).add("slot", slot->id);
    if (callsite_us >= 0) r.add("callsite_us", callsite_us);
    r.emit();
  }
  *va = slot->va;
  return true;
}

void allocated(const Call& call, CUdeviceptr va, size_t bytes, CUstream stream,
               const char* skipped) {
  if (bytes == 0 || va == 0) return;
  Tables& t = tables();
  std::optional<CaptureTag> capture;
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    if (auto live = current_capture_locked(t)) {
      capture = (*live)->tag;
      (*live)->allocations++;
      (*live)->bytes += bytes;
    }
  }
  const RegionKind kind = stream != nullptr          ? RegionKind::stream_ordered
                          : call.api == Api::runtime ? RegionKind::runtime_malloc
                                                     : RegionKind::driver_malloc;
  const int device = current_device();
  register_region({va, bytes, device, kind, capture, nullptr});
  t.allocations.fetch_add(1, std::memory_order_relaxed);
  if (trace::enabled()) {
    auto r = record(trace::Event::alloc, call);
    r.hex("va", va).add("bytes", static_cast<uint64_t>(bytes)).add("device", device);
    if (capture) r.add("capture", capture->sequence);
    if (stream != nullptr) r.hex("stream", stream_id(stream_of(call, stream)));
    r.add("selected", false);
    if (skipped != nullptr) r.add("skipped", skipped);
    r.emit();
  }
}

// A slot the program freed: no graph, plan or residency keeps it, and its pages and address go
// back (the caller holds the capture gate, or a device reset runs).
CUresult destroy_slot(Tables& t, Slot* slot, const char* symbol) {
  const uintptr_t va = slot->va;
  forget_slot(t, slot);
  try {
    engine().destroy_slot(slot);
  } catch (const Error& e) {
    log().error("{} of {} failed: {}", symbol, hex(va), e.what());
    return CUDA_ERROR_UNKNOWN;
  }
  return CUDA_SUCCESS;
}

// Slots retired while a capture was open (of `device` only, when given): destroyed now if no
// capture is open; else they wait for the next capture's end or free.
void destroy_retired(Tables& t, std::optional<int> device) {
  if (!device && capture_gate::open() > 0) return;
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    if (t.retired.empty()) return;
  }
  capture_gate::Exclusive gate;
  if (!gate && !device) return;  // a capture began meanwhile (a device reset goes on regardless)
  std::vector<Slot*> now;
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    for (auto it = t.retired.begin(); it != t.retired.end();) {
      if (!device || (*it)->device == *device) {
        now.push_back(*it);
        it = t.retired.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (Slot* slot : now) destroy_slot(t, slot, "a retired slot's teardown");
}

std::optional<CUresult> free_slot(const Call& call, CUdeviceptr va) {
  Tables& t = tables();
  const std::optional<Region> region = t.registry.find(va);
  if (!region || region->base != va || region->kind != RegionKind::slot) return std::nullopt;
  t.registry.erase(va);
  auto* slot = static_cast<Slot*>(region->slot);
  const uint64_t id = slot->id;
  CUresult result = CUDA_SUCCESS;
  bool deferred = false;
  {
    // Its teardown synchronizes the context, as cudaFree does; while a capture is open that would
    // invalidate it (core/base/capture_gate.h). The slot is retired instead: its address is the
    // program's no more, and it is destroyed once the last capture has ended.
    capture_gate::Exclusive gate;
    if (gate) {
      result = destroy_slot(t, slot, call.symbol);
    } else {
      std::lock_guard<std::mutex> lock(t.mutex);
      t.retired.push_back(slot);
      deferred = true;
    }
  }
  if (!deferred) destroy_retired(t, std::nullopt);  // any a capture's end left behind
  t.frees.fetch_add(1, std::memory_order_relaxed);
  if (trace::enabled()) {
    auto r = record(trace::Event::free, call);
    r.hex("va", va)
        .add("bytes", static_cast<uint64_t>(region->bytes))
        .add("slot", id)
        .add("ok", result == CUDA_SUCCESS);
    if (deferred) r.add("deferred", true);
    r.emit();
  }
  return result;
}

void freed(const Call& call, CUdeviceptr va, CUstream stream) {
  if (va == 0) return;
  Tables& t = tables();
  const std::optional<Region> region = t.registry.erase(va);
  t.frees.fetch_add(1, std::memory_order_relaxed);
  if (trace::enabled()) {
    auto r = record(trace::Event::free, call);
    r.hex("va", va);
    if (region) r.add("bytes", static_cast<uint64_t>(region->bytes));
    if (stream != nullptr) r.hex("stream", stream_id(stream_of(call, stream)));
    r.emit();
  }
}

ProgramFree::ProgramFree() {
  if (tables().slots.load(std::memory_order_relaxed) == 0) return;
  engine().giving_back(true);
  held_ = true;
}

ProgramFree::~ProgramFree() {
  if (held_) engine().giving_back(false);
}

void capture_beginning(const Call& call, CUstream stream) {
  // Counted whether or not slots exist yet: a slot made during the capture and freed before its
  // end must not be torn down meanwhile.
  capture_gate::beginning();
  if (tables().slots.load(std::memory_order_relaxed) == 0) return;
  residency::capture_beginning(stream_of(call, stream));
}

void capture_refused() { capture_gate::closed(); }

void stream_destroying(const Call& call, CUstream stream) {
  if (tables().slots.load(std::memory_order_relaxed) == 0 || stream == nullptr) return;
  residency::stream_gone(stream_of(call, stream));
}

void capture_began(const Call& call, CUstream stream, CUstreamCaptureMode mode, CUgraph target) {
  stream = stream_of(call, stream);
  LiveCapture live;
  live.tag.thread = thread_id();
  live.tag.stream = reinterpret_cast<uintptr_t>(stream);
  live.mode = mode;
  live.begin_ns = trace::now_ns();
  live.ordinal = tables().captures_begun.load(std::memory_order_relaxed) + 1;
  live.tag.ordinal = live.ordinal;
  if (const Driver* driver = load_driver(nullptr)) {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t id = 0;
    if (driver->cuStreamGetCaptureInfo(stream, &status, &id, nullptr, nullptr, nullptr, nullptr) ==
        CUDA_SUCCESS) {
      live.tag.sequence = id;
    }
  }
  Tables& t = tables();
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    t.captures[stream] = live;
  }
  tls_captures.push_back(stream);
  t.captures_begun.fetch_add(1, std::memory_order_relaxed);
  planner::capture_begun();
  if (trace::enabled()) {
    auto r = record(trace::Event::capture_begin, call);
    r.hex("stream", stream_id(stream))
        .add("capture", live.tag.sequence)
        .add("mode", mode_name(mode));
    if (target != nullptr) r.hex("graph", reinterpret_cast<uintptr_t>(target));
    r.emit();
  }
}

void capture_ended(const Call& call, CUstream stream, CUgraph graph, CUresult result) {
  stream = stream_of(call, stream);
  Tables& t = tables();
  std::optional<LiveCapture> ended;
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    auto it = t.captures.find(stream);
    if (it != t.captures.end()) {
      ended = it->second;
      t.captures.erase(it);
    }
  }
  if (ended) capture_gate::closed();
  if (ended && result == CUDA_SUCCESS && graph != nullptr) {
    std::lock_guard<std::mutex> lock(t.mutex);
    t.graphs[graph] =
        GraphFacts{ended->tag.sequence, ended->ordinal, ended->allocations, ended->slots};
  }
  if (trace::enabled()) {
    auto r = record(trace::Event::capture_end, call);
    r.hex("stream", stream_id(stream)).add("ok", result == CUDA_SUCCESS);
    if (graph != nullptr) r.hex("graph", reinterpret_cast<uintptr_t>(graph));
    if (ended) {
      r.add("capture", ended->tag.sequence)
          .add("allocations", ended->allocations)
          .add("bytes", ended->bytes)
          .add("slots", ended->slots)
          .add("dur_us", trace::us_since(ended->begin_ns));
    }
    r.emit();
  }
  // Slots freed while a capture was open go now, if this was the last one.
  if (ended) destroy_retired(t, std::nullopt);
}

void capture_mode_exchanged(const Call& call, CUstreamCaptureMode before, CUstreamCaptureMode now) {
  if (!trace::enabled() || before == now) return;
  record(trace::Event::capture_mode, call)
      .add("from", mode_name(before))
      .add("to", mode_name(now))
      .emit();
}

namespace {

// The scan of `graph`: the one `scanned` holds when it is of this graph (with nodes, where asked),
// else a new one, kept there when `scanned` names this graph, else in `apart`.
const GraphScan& scan_once(const Driver& driver, CUgraph graph, Scanned* scanned, bool with_nodes,
                           GraphScan* apart) {
  const bool ours = scanned != nullptr && scanned->graph == graph;
  if (ours && scanned->scan && (scanned->with_nodes || !with_nodes)) return *scanned->scan;
  GraphScan scan = scan_graph(driver, graph, tables().registry, with_nodes);
  if (!ours) return *apart = std::move(scan);
  scanned->with_nodes = with_nodes;
  return scanned->scan.emplace(std::move(scan));
}

// Scans `graph` (graph_scan.h) into the facts of an executable made from it, and says so in the
// trace. Every instantiation and update is scanned: a graph may have been built or edited
// through the graph API, which vaswap does not follow node by node.
ExecFacts scan_into_facts(CUgraphExec exec, CUgraph graph, Scanned* scanned) {
  Tables& t = tables();
  ExecFacts facts;
  facts.graph = graph;
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    auto it = t.graphs.find(graph);
    if (it != t.graphs.end()) {
      facts.capture = it->second.capture;
      facts.ordinal = it->second.ordinal;
    }
  }
  const Driver* driver = load_driver(nullptr);
  if (driver == nullptr || graph == nullptr) {
    facts.opaque = true;
    facts.why_opaque = "the graph could not be scanned";
    return facts;
  }
  GraphScan apart;
  const GraphScan& scan = scan_once(*driver, graph, scanned, /*with_nodes=*/false, &apart);
  for (const Region& region : scan.regions) {
    if (region.kind == RegionKind::slot) facts.slots.push_back(static_cast<Slot*>(region.slot));
  }
  if (scan.opaque_kernels > 0) {
    facts.opaque = true;
    facts.why_opaque = "a kernel node has no parameter layout";
  } else if (scan.unscanned_nodes > 0) {
    facts.opaque = true;
    facts.why_opaque = "a node of a kind the scan cannot read";
  }
  if (trace::enabled()) {
    uint64_t slot_regions = 0, bytes = 0;
    for (const Region& region : scan.regions) {
      if (region.kind == RegionKind::slot) ++slot_regions;
      bytes += region.bytes;
    }
    trace::Record(trace::Event::graph_scan)
        .hex("graph", reinterpret_cast<uintptr_t>(graph))
        .hex("exec", reinterpret_cast<uintptr_t>(exec))
        .add("capture", facts.capture)
        .add("nodes", scan.nodes)
        .add("kernel_nodes", scan.kernel_nodes)
        .add("extra_buffers", scan.extra_buffers)
        .add("memcpy_nodes", scan.memcpy_nodes)
        .add("memset_nodes", scan.memset_nodes)
        .add("memop_nodes", scan.memop_nodes)
        .add("child_graphs", scan.child_graphs)
        .add("unscanned_nodes", scan.unscanned_nodes)
        .add("opaque_kernels", scan.opaque_kernels)
        .add("opaque_error", static_cast<int>(scan.opaque_error))
        .add("opaque", facts.opaque)
        .add("regions", static_cast<uint64_t>(scan.regions.size()))
        .add("slot_regions", slot_regions)
        .add("region_bytes", bytes)
        .add("dur_us", scan.dur_us)
        .emit();
  }
  return facts;
}

// The slots among the regions that contain these addresses, each once.
void add_slot(const RegionRegistry& registry, uintptr_t address, std::vector<Slot*>* slots) {
  if (address == 0) return;
  auto region = registry.find(address);
  if (!region || region->kind != RegionKind::slot) return;
  auto* slot = static_cast<Slot*>(region->slot);
  if (std::find(slots->begin(), slots->end(), slot) == slots->end()) slots->push_back(slot);
}

}  // namespace

CUgraph graph_to_instantiate(const Call& call, CUgraph graph, Scanned* scanned) {
  Tables& t = tables();
  if (graph == nullptr || t.slots.load(std::memory_order_relaxed) == 0) return graph;
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    if (t.graphs.count(graph) == 0) return graph;  // not from a capture
  }
  // After the capture check: under the auto budget it reads each started device's free memory.
  if (!inside::enabled()) return graph;
  const Driver* driver = load_driver(nullptr);
  if (driver == nullptr) return graph;
  GraphScan apart;
  const GraphScan& scan = scan_once(*driver, graph, scanned, /*with_nodes=*/true, &apart);
  if (scan.opaque_kernels > 0 || scan.unscanned_nodes > 0) return graph;  // invariant 10
  std::vector<Slot*> slots;
  for (const Region& region : scan.regions) {
    if (region.kind == RegionKind::slot) slots.push_back(static_cast<Slot*>(region.slot));
  }
  auto shared = [&t](const Slot* slot) {
    std::lock_guard<std::mutex> lock(t.mutex);
    for (const auto& [exec, facts] : t.execs) {
      if (facts.opaque ||
          std::find(facts.slots.begin(), facts.slots.end(), slot) != facts.slots.end()) {
        return true;
      }
    }
    return false;
  };
  std::string why;
  const CUgraph instead = inside::prepare(graph, scan, slots, shared, &why);
  if (instead == nullptr && !why.empty()) {
    // Said once as a warning (stream memory operations missing, a driver refusing the rewritten
    // graph): the between-launch planner still applies. Later ones go to the info level.
    static std::atomic<bool> said{false};
    const auto level = said.exchange(true) ? spdlog::level::info : spdlog::level::warn;
    log().log(level, "inside one graph: graph {} is instantiated as captured: {}",
              hex(reinterpret_cast<uintptr_t>(graph)), why);
    if (trace::enabled()) {
      record(trace::Event::notice, call)
          .add("message", "graph " + hex(reinterpret_cast<uintptr_t>(graph)) +
                              " is instantiated as captured: " + why)
          .emit();
    }
  }
  return instead != nullptr ? instead : graph;
}

namespace {

// Runs `fn` while `slots` have pages: lent ones come back (inside::present), the others get a
// placeholder or their own pages (residency::with_pages). Where they cannot be had, says so
// (`what`: what needed them), runs `fn` anyway (the driver then says what it says) and returns why
// they could not: the failed driver call's code (CUDA_ERROR_OUT_OF_MEMORY for a device without
// room), or CUDA_ERROR_UNKNOWN where no driver call failed. CUDA_SUCCESS: they had pages.
CUresult with_pages_for(const Call& call, const std::vector<Slot*>& slots, const std::string& what,
                        const std::function<void()>& fn) {
  if (slots.empty()) {
    fn();
    return CUDA_SUCCESS;
  }
  bool ran = false;
  const auto run = [&] {
    ran = true;
    fn();
  };
  std::string why;
  CUresult rc = CUDA_SUCCESS;
  const std::vector<Slot*> rest = inside::present(slots, &rc, &why);
  if (rc == CUDA_SUCCESS) {
    try {
      residency::with_pages(rest, run);
    } catch (const Error& error) {
      why = error.what();
      rc = error.driver_result() != CUDA_SUCCESS ? error.driver_result() : CUDA_ERROR_UNKNOWN;
    }
  }
  if (ran) return CUDA_SUCCESS;
  log().warn(
      "{}: the {} slot(s) that {} could not be given pages for the call ({}): the driver "
      "refuses an address without them",
      call.symbol, slots.size(), what, why);
  fn();
  return rc;
}

}  // namespace

CUresult with_pages_to_instantiate(const Call& call, CUgraph graph, Scanned* scanned,
                                   const std::function<void()>& instantiate) {
  Tables& t = tables();
  const Driver* driver = graph == nullptr || t.slots.load(std::memory_order_relaxed) == 0
                             ? nullptr
                             : load_driver(nullptr);
  if (driver == nullptr) {
    instantiate();
    return CUDA_SUCCESS;
  }
  GraphScan apart;
  const GraphScan& scan = scan_once(*driver, graph, scanned, /*with_nodes=*/false, &apart);
  std::vector<Slot*> slots;
  for (const uintptr_t base : scan.copied) add_slot(t.registry, base, &slots);
  return with_pages_for(
      call, slots,
      "copies or memsets of graph " + hex(reinterpret_cast<uintptr_t>(graph)) + " name",
      instantiate);
}

CUresult with_pages_named(const Call& call, const std::vector<uintptr_t>& words,
                          const std::function<void()>& fn) {
  Tables& t = tables();
  if (t.slots.load(std::memory_order_relaxed) == 0) {
    fn();
    return CUDA_SUCCESS;
  }
  std::vector<Slot*> slots;
  for (const uintptr_t word : words) add_slot(t.registry, word, &slots);
  return with_pages_for(call, slots, "the new parameters name", fn);
}

void instantiated(const Call& call, CUgraphExec exec, CUgraph graph, CUgraph instead,
                  Scanned* scanned) {
  if (instead != graph) inside::instantiated(instead, exec);
  if (exec == nullptr) return;
  Tables& t = tables();
  ExecFacts facts = scan_into_facts(exec, graph, scanned);
  const uint64_t capture = facts.capture;
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    t.execs[exec] = std::move(facts);
  }
  t.instantiations.fetch_add(1, std::memory_order_relaxed);
  if (trace::enabled()) {
    record(trace::Event::graph_instantiate, call)
        .hex("exec", reinterpret_cast<uintptr_t>(exec))
        .hex("graph", reinterpret_cast<uintptr_t>(graph))
        .add("capture", capture)
        .emit();
  }
}

namespace {

// An executable's facts changed (an update, a node's new parameters): the planner learns again
// if the executable is in its pattern, and the trace says what it uses now.
void exec_facts_changed(const Call& call, CUgraphExec exec, const ExecFacts& facts) {
  planner::exec_changed(exec);
  if (trace::enabled()) {
    record(trace::Event::graph_update, call)
        .hex("exec", reinterpret_cast<uintptr_t>(exec))
        .add("opaque", facts.opaque)
        .add("slots", static_cast<uint64_t>(facts.slots.size()))
        .emit();
  }
}

}  // namespace

CUgraph update_source(const Call& call, CUgraphExec exec, CUgraph graph, Scanned* scanned) {
  const Driver* driver = load_driver(nullptr);
  if (driver == nullptr || graph == nullptr || !inside::rewritten(exec)) return graph;
  GraphScan apart;
  const GraphScan& scan = scan_once(*driver, graph, scanned, /*with_nodes=*/true, &apart);
  std::string why;
  const CUgraph instead = inside::update_source(exec, graph, scan, &why);
  if (instead == nullptr && !why.empty()) {
    log().warn("inside one graph: graph {} cannot be updated from graph {} with its windows: {}",
               hex(reinterpret_cast<uintptr_t>(exec)), hex(reinterpret_cast<uintptr_t>(graph)),
               why);
    if (trace::enabled()) {
      record(trace::Event::notice, call)
          .add("message", "graph " + hex(reinterpret_cast<uintptr_t>(exec)) +
                              " cannot be updated with its windows: " + why)
          .emit();
    }
  }
  return instead != nullptr ? instead : graph;
}

CUresult exec_updated(const Call& call, CUgraphExec exec, CUgraph graph, CUgraph instead, bool made,
                      Scanned* scanned) {
  if (instead == graph) {
    if (made) exec_changed(call, exec, graph);
    return CUDA_SUCCESS;
  }
  std::string why;
  const CUresult rc = inside::updated(exec, instead, made, &why);
  if (!made) return CUDA_SUCCESS;
  // The executable runs the program's graph's nodes, with the windows' beside them.
  const ExecFacts facts = scan_into_facts(exec, graph, scanned);
  {
    std::lock_guard<std::mutex> lock(tables().mutex);
    tables().execs[exec] = facts;
  }
  exec_facts_changed(call, exec, facts);
  if (rc != CUDA_SUCCESS) {
    log().error("{}: {}; the call returns {}", call.symbol, why, cuda_error_name(rc));
    if (trace::enabled()) {
      record(trace::Event::error, call).add("code", cuda_error_name(rc)).add("message", why).emit();
    }
  }
  return rc;
}

void exec_changed(const Call& call, CUgraphExec exec, std::optional<CUgraph> graph) {
  Tables& t = tables();
  // A rewritten graph updated from another graph without its windows (update_source could not
  // add them) no longer runs the windows its executor follows: its slots come back and return
  // to residency before its next launch (launches in flight keep the graph they started with).
  // One whose node changed keeps its windows, with its copies off and nothing unmapped any more
  // (exec_node_changing, before the change).
  if (graph) inside::exec_destroyed(exec);
  ExecFacts facts;
  if (graph) {
    // cudaGraphExecUpdate: the executable now runs this graph's nodes.
    facts = scan_into_facts(exec, *graph, nullptr);
  } else {
    // A node's parameters changed in the executable alone: what it references now is unknown.
    std::lock_guard<std::mutex> lock(t.mutex);
    auto it = t.execs.find(exec);
    if (it != t.execs.end()) facts = it->second;
    facts.opaque = true;
    facts.why_opaque = "a node was changed after instantiation";
  }
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    t.execs[exec] = facts;
  }
  exec_facts_changed(call, exec, facts);
}

Ticket launched(const Call& call, CUgraphExec exec, CUstream stream) {
  Tables& t = tables();
  t.launches.fetch_add(1, std::memory_order_relaxed);
  stream = stream_of(call, stream);
  ExecFacts facts;
  bool capturing = false;
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    auto it = t.execs.find(exec);
    if (it != t.execs.end()) {
      facts = it->second;
      first = !it->second.launched;
    } else {
      // Instantiated where vaswap did not see it: nothing is known of what it uses.
      facts.opaque = true;
      facts.why_opaque = "its instantiation was not seen";
    }
  }
  capturing = stream_capturing(stream);
  if (facts.opaque) facts.slots = every_slot(t.registry);
  // A rewritten graph's own nodes restore the slots lent to its windows.
  const std::vector<Slot*> lent = capturing ? std::vector<Slot*>{} : inside::lent_to(exec);
  for (Slot* slot : lent) {
    facts.slots.erase(std::remove(facts.slots.begin(), facts.slots.end(), slot), facts.slots.end());
  }
  if (trace::enabled()) {
    auto r = record(trace::Event::graph_launch, call);
    r.hex("exec", reinterpret_cast<uintptr_t>(exec))
        .hex("graph", reinterpret_cast<uintptr_t>(facts.graph))
        .hex("stream", stream_id(stream))
        .add("slots", static_cast<uint64_t>(facts.slots.size()));
    if (facts.opaque) r.add("opaque", facts.why_opaque);
    r.emit();
  }
  // A launch into a capturing stream becomes a node of that graph; nothing runs now.
  if (capturing) return Ticket{};
  launch_times::Timing timing = launch_times::begin(stream);  // before any wait for its slots
  Ticket ticket = planner::before_graph(call.symbol, exec, stream, facts.slots, facts.ordinal);
  if (first && ticket.result == CUDA_SUCCESS) {
    // Its first launch uploads the graph. With the device handshake, not while a stream (this
    // one included, just now) is parked: that hangs on the H200.
    if (residency::parks_streams()) {
      const CUresult rc = settle(call, "the first launch of a graph", &ticket.quiet);
      if (rc != CUDA_SUCCESS) {
        residency::used(ticket.acquired);  // nothing will run: only the slots' pins go
        ticket.acquired = residency::Acquired{};
        ticket.result = rc;
        return ticket;
      }
    }
    std::lock_guard<std::mutex> lock(t.mutex);
    if (auto it = t.execs.find(exec); it != t.execs.end()) it->second.launched = true;
  }
  if (ticket.result == CUDA_SUCCESS) {
    const CUresult rc = inside::before_launch(exec, stream, &ticket.message);
    if (rc != CUDA_SUCCESS) {
      log().error("{}: {}", call.symbol, ticket.message);
      residency::used(ticket.acquired);  // nothing will run: only the slots' pins go
      ticket.acquired = residency::Acquired{};
      ticket.result = rc;
    }
  }
  if (ticket.result == CUDA_SUCCESS) {
    launch_times::before_graph(timing, stream);
    ticket.timing = std::move(timing);
  }
  return ticket;
}

void launch_returned(const Call& call, CUgraphExec exec, CUstream stream, const Ticket& ticket,
                     bool enqueued) {
  Tables& t = tables();
  stream = stream_of(call, stream);
  if (ticket.timing.before_graph) {
    launch_times::Timing timing = ticket.timing;
    launch_times::end(timing, exec, stream, enqueued);
  }
  uint64_t ordinal = 0;
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    auto it = t.execs.find(exec);
    if (it != t.execs.end()) ordinal = it->second.ordinal;
  }
  if (ticket.acquired.slots.empty() && stream_capturing(stream)) return;
  inside::launch_returned(exec, stream, enqueued);
  if (!enqueued) {
    residency::used(ticket.acquired);  // nothing ran: only the slots' pins go
    return;
  }
  planner::after_graph(exec, stream, ordinal, ticket);
}

bool out_of_memory(const Call& call, size_t bytes, const std::string& what) {
  if (tables().slots.load(std::memory_order_relaxed) == 0) return false;
  const int device = current_device();
  if (device < 0) return false;
  const uint64_t freed = residency::make_room(device, bytes);
  if (trace::enabled()) {
    record(trace::Event::notice, call)
        .add("message", "the program's " + what + " failed for want of memory; slots gave back " +
                            byte_size(freed))
        .emit();
  }
  return freed > 0;
}

bool room_beside_graphs(const Call& call, size_t bytes) {
  if (tables().slots.load(std::memory_order_relaxed) == 0) return true;
  const int device = current_device();
  if (device < 0) return true;
  const uint64_t owed = inside::unmapped_reserve(device);
  if (owed == 0) return true;
  const auto free_now = [device] {  // not known: the allocation goes ahead, as without graphs
    return engine().allocatable_now(device).value_or(uint64_t{SIZE_MAX});
  };
  uint64_t free_bytes = free_now();
  if (free_bytes >= bytes + owed) return true;
  residency::make_room(device, bytes + owed - free_bytes);
  free_bytes = free_now();
  if (free_bytes >= bytes + owed) return true;
  const std::string message =
      std::string(call.symbol) + " of " + byte_size(bytes) + " on device " +
      std::to_string(device) + " is refused for want of memory: the device has " +
      byte_size(free_bytes) + " free that allocations can have, and " + byte_size(owed) +
      " of that are pages that graphs rewritten under the auto budget map during their launches "
      "(no pages exist beyond them: taken, a launch would wait on the device for pages that never "
      "come). Allocate before the graph is captured, or free device memory";
  log().warn("{}", message);
  if (trace::enabled()) record(trace::Event::notice, call).add("message", message).emit();
  return false;
}

// =============================================================================================
// Eager work
// =============================================================================================

namespace {

void add_words(const RegionRegistry& registry, const void* data, size_t bytes,
               std::vector<Slot*>* slots) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t at = 0; at + sizeof(uint64_t) <= bytes; at += sizeof(uint64_t)) {
    uint64_t word = 0;
    std::memcpy(&word, p + at, sizeof word);
    add_slot(registry, static_cast<uintptr_t>(word), slots);
  }
}

}  // namespace

// True when work on `stream` would be recorded into a capture: the stream that began one, or a
// stream forked into it through an event (which vaswap's own tables do not name), so the
// driver is asked whenever any capture is open.
bool stream_capturing(CUstream stream) {
  if (capture_gate::open() == 0) return false;
  const Driver* driver = load_driver(nullptr);
  if (driver == nullptr) return false;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  const CUresult rc = driver->cuStreamIsCapturing(stream, &status);
  return rc == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT || status != CU_STREAM_CAPTURE_STATUS_NONE;
}

namespace {

Ticket hand_to_planner(const Call& call, CUstream stream, const std::vector<Slot*>& slots,
                       residency::Checked checked, const residency::EagerShape* shape = nullptr) {
  if (slots.empty()) return Ticket{};
  if (trace::enabled()) {
    record(trace::Event::eager, call)
        .hex("stream", stream_id(stream))
        .add("slots", static_cast<uint64_t>(slots.size()))
        .emit();
  }
  return planner::before_eager(call.symbol, stream, slots, checked, shape);
}

// A copy or memset on one device's stream that names another device's slot: that device gets
// access to the slot's pages (Engine::grant_access), as a cudaMalloc'd buffer needs none. The
// slots are mapped and held by the launch's ticket (recorded into a capture: mapped, not held).
void grant_peer_access(const Call& call, CUstream stream, const std::vector<Slot*>& slots,
                       bool capturing = false) {
  const Driver* driver = load_driver(nullptr);
  if (driver == nullptr) return;
  static const int devices = [driver] {
    int count = 0;
    return driver->cuDeviceGetCount(&count) == CUDA_SUCCESS ? count : 0;
  }();
  if (devices < 2) return;
  CUdevice device = -1;
  if (capturing || driver->cuStreamGetDevice == nullptr ||
      driver->cuStreamGetDevice(stream, &device) != CUDA_SUCCESS) {
    if (driver->cuCtxGetDevice(&device) != CUDA_SUCCESS) return;  // no context: nothing runs
  }
  try {
    for (Slot* slot : slots) {
      if (slot->device != device) engine().grant_access(slot, device);
    }
  } catch (const Error& e) {
    // The program's call is made all the same, and its own result stands: a device that cannot
    // map the peer's pages may still have the copy staged by the driver.
    static std::atomic<bool> said{false};
    if (!said.exchange(true)) {
      log().warn(
          "{}: device {} could not be given access to another device's slot ({}); the "
          "copy is made as the program asked, and the driver decides",
          call.symbol, static_cast<int>(device), e.what());
    }
  }
}

}  // namespace

// Until the preload has made a slot there is nothing for eager work to use: no scan.
bool eager_wanted() {
  const Tables& t = tables();
  return t.slots.load(std::memory_order_relaxed) != 0 &&
         (planner::wants_eager() || capture_gate::open() != 0);
}

bool access_wanted() { return tables().slots.load(std::memory_order_relaxed) != 0; }

void eager_done(const Ticket& ticket) { planner::after_eager(ticket); }

namespace {
CUcontext current_context() {
  CUcontext context = nullptr;
  if (const Driver* driver = load_driver(nullptr)) driver->cuCtxGetCurrent(&context);
  return context;
}
}  // namespace

bool first_launch(const void* function) {
  if (function == nullptr || !residency::parks_streams()) return false;
  const CUcontext context = current_context();
  Tables& t = tables();
  std::lock_guard<std::mutex> lock(t.mutex);
  return t.launched_functions.count({function, context}) == 0;
}

void launch_made(const void* function) {
  const CUcontext context = current_context();
  Tables& t = tables();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.launched_functions.emplace(function, context);
}

bool settles() { return routing_on() && residency::parks_streams(); }

bool first_lookup(const void* handle, const char* name) {
  const CUcontext context = current_context();
  Tables& t = tables();
  std::lock_guard<std::mutex> lock(t.mutex);
  return t.lookups.count({handle, name != nullptr ? name : "", context}) == 0;
}

void lookup_made(const void* handle, const char* name) {
  const CUcontext context = current_context();
  Tables& t = tables();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.lookups.emplace(handle, name != nullptr ? name : "", context);
}

CUresult settle(const Call& call, const char* work, residency::Quiet* quiet) {
  std::string why;
  const CUresult rc = residency::settle(std::string(work) + " (" + call.symbol + ")", &why, quiet);
  if (rc != CUDA_SUCCESS) {
    log().error("{}; the call returns {}", why, cuda_error_name(rc));
    if (trace::enabled()) {
      record(trace::Event::error, call).add("code", cuda_error_name(rc)).add("message", why).emit();
    }
  }
  return rc;
}

bool pageable(const uintptr_t* addresses, size_t count) {
  const Driver* driver = load_driver(nullptr);
  if (driver == nullptr) return false;
  const RegionRegistry& registry = tables().registry;
  for (size_t i = 0; i < count; ++i) {
    // Device memory vaswap tracks is not pageable, even where the driver refuses to describe it
    // (a slot whose pages are away).
    if (addresses[i] == 0 || registry.find(addresses[i])) continue;
    CUmemorytype type{};
    // Unregistered host memory is not a pointer the driver knows: CUDA_ERROR_INVALID_VALUE.
    if (driver->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                      static_cast<CUdeviceptr>(addresses[i])) != CUDA_SUCCESS) {
      return true;
    }
  }
  return false;
}

Param driver_param_info(const void* function, size_t index, size_t* offset, size_t* bytes) {
  const Driver* driver = load_driver(nullptr);
  if (driver == nullptr) return Param::unknown;
  CUresult failure = CUDA_SUCCESS;
  if (kernel_param_info(*driver, static_cast<CUfunction>(const_cast<void*>(function)), nullptr,
                        index, offset, bytes, &failure)) {
    return Param::found;
  }
  return failure == CUDA_ERROR_INVALID_VALUE ? Param::end : Param::unknown;
}

namespace {

// The slots a kernel's arguments name: its parameters, laid out as the kernel says, or its packed
// `extra` buffer. A kernel whose layout cannot be read names every slot (*opaque set).
std::vector<Slot*> kernel_slots(const Call& call, const Kernel& kernel, void** params, void** extra,
                                bool* opaque) {
  Tables& t = tables();
  *opaque = false;
  std::vector<Slot*> slots;
  if (extra != nullptr) {
    const void* buffer = nullptr;
    size_t size = 0;
    for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buffer = extra[i + 1];
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) size = *static_cast<const size_t*>(extra[i + 1]);
    }
    if (buffer != nullptr) add_words(t.registry, buffer, size, &slots);
  } else if (params != nullptr && kernel.key != nullptr) {
    std::vector<std::pair<size_t, size_t>> layout;
    {
      std::lock_guard<std::mutex> lock(t.layouts_mutex);
      auto it = t.layouts.find(kernel.key);
      if (it != t.layouts.end()) layout = it->second;
    }
    if (layout.empty()) {
      Param answer = Param::found;
      for (size_t i = 0;; ++i) {
        size_t offset = 0, size = 0;
        answer = kernel.param_info(kernel.key, i, &offset, &size);
        if (answer != Param::found) break;
        layout.emplace_back(offset, size);
      }
      if (layout.empty() && answer == Param::unknown) {
        // No layout: what the kernel uses is unknown, so every slot is made resident for it
        // (said once).
        static std::atomic<bool> said{false};
        if (!said.exchange(true)) {
          log().info(
              "{}: a kernel's parameter layout cannot be read; every slot is made "
              "resident before such eager kernels",
              call.symbol);
        }
        layout.emplace_back(SIZE_MAX, 0);
      } else if (layout.empty()) {
        layout.emplace_back(0, 0);  // no parameters: nothing to scan, remembered all the same
      }
      std::lock_guard<std::mutex> lock(t.layouts_mutex);
      t.layouts[kernel.key] = layout;
    }
    if (layout.size() == 1 && layout[0].first == SIZE_MAX) {
      *opaque = true;
      slots = every_slot(t.registry);
    } else {
      for (size_t i = 0; i < layout.size(); ++i) {
        if (layout[i].second != 0) add_words(t.registry, params[i], layout[i].second, &slots);
      }
    }
  }
  return slots;
}

}  // namespace

Ticket eager_kernel(const Call& call, CUstream stream, const Kernel& kernel, void** params,
                    void** extra) {
  stream = stream_of(call, stream);
  // Into a capture: a kernel node is fine with unmapped addresses (they are mapped before the
  // graph runs); nothing runs now.
  if (stream_capturing(stream) || !planner::wants_eager()) return Ticket{};
  bool opaque = false;
  const std::vector<Slot*> slots = kernel_slots(call, kernel, params, extra, &opaque);
  return hand_to_planner(call, stream, slots, residency::Checked::when_run);
}

CUgraphNode exec_node_changing(const Call& call, CUgraphExec exec, CUgraphNode node,
                               CUresult* refused) {
  std::string why;
  *refused = inside::node_changing(exec, &why);
  if (*refused != CUDA_SUCCESS) {
    log().error("{}: the call returns {}", call.symbol, cuda_error_name(*refused));
    if (trace::enabled()) {
      record(trace::Event::error, call)
          .add("code", cuda_error_name(*refused))
          .add("message", why)
          .emit();
    }
    return node;
  }
  return inside::node_in(exec, node);
}

CUgraphNode exec_node_in(CUgraphExec exec, CUgraphNode node) { return inside::node_in(exec, node); }

namespace {

// A node of `exec` was given new parameters naming `added`: they join what the executable uses.
// What the node named before stays counted (the executable alone cannot be asked): more residency
// than needed, never less. `why_opaque`: the parameters could not be read, and it uses every slot.
void exec_node_joined(const Call& call, CUgraphExec exec, const std::vector<Slot*>& added,
                      const char* why_opaque) {
  Tables& t = tables();
  ExecFacts facts;
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    auto it = t.execs.find(exec);
    if (it == t.execs.end()) return;  // not one vaswap saw: its launches already use every slot
    for (Slot* slot : added) {
      if (std::find(it->second.slots.begin(), it->second.slots.end(), slot) ==
          it->second.slots.end()) {
        it->second.slots.push_back(slot);
      }
    }
    if (why_opaque != nullptr) {
      it->second.opaque = true;
      it->second.why_opaque = why_opaque;
    }
    facts = it->second;
  }
  exec_facts_changed(call, exec, facts);
}

}  // namespace

void exec_kernel_changed(const Call& call, CUgraphExec exec, const Kernel& kernel, void** params,
                         void** extra) {
  bool opaque = kernel.key == nullptr || (params == nullptr && extra == nullptr);
  std::vector<Slot*> added;
  if (!opaque) added = kernel_slots(call, kernel, params, extra, &opaque);
  exec_node_joined(
      call, exec, added,
      opaque ? "a kernel node was given arguments whose layout cannot be read" : nullptr);
}

void exec_copy_changed(const Call& call, CUgraphExec exec, const std::vector<uintptr_t>& words) {
  std::vector<Slot*> added;
  for (const uintptr_t word : words) add_slot(tables().registry, word, &added);
  exec_node_joined(call, exec, added, nullptr);
}

Ticket eager_access(const Call& call, CUstream stream, const uintptr_t* addresses, size_t count,
                    const residency::EagerShape* shape) {
  Tables& t = tables();
  stream = stream_of(call, stream);
  std::vector<Slot*> slots;
  for (size_t i = 0; i < count; ++i) add_slot(t.registry, addresses[i], &slots);
  if (slots.empty()) return Ticket{};
  if (stream_capturing(stream)) {
    // A copy or memset node is checked against its addresses when it is recorded (measured on
    // the H200: a memcpy into a reserved, unmapped address fails to capture).
    Ticket ticket;
    const std::vector<Slot*> rest = inside::present(slots, &ticket.result, &ticket.message);
    if (ticket.result == CUDA_SUCCESS) {
      ticket.result = residency::back_for_capture(rest, stream, &ticket.acquired, &ticket.message);
    }
    if (ticket.result != CUDA_SUCCESS) {
      log().error("{}: {}", call.symbol, ticket.message);
      return ticket;
    }
    // The node copies on the capturing stream's device at every replay; it is not asked (a
    // capturing stream's device query ends the capture): the current context's is taken.
    grant_peer_access(call, nullptr, slots, /*capturing=*/true);
    return ticket;
  }
  Ticket ticket = hand_to_planner(call, stream, slots, residency::Checked::when_enqueued, shape);
  if (ticket.result == CUDA_SUCCESS) grant_peer_access(call, stream, slots);
  return ticket;
}

void exec_destroyed(const Call& call, CUgraphExec exec) {
  Tables& t = tables();
  inside::exec_destroyed(exec);
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    t.execs.erase(exec);
  }
  if (trace::enabled()) {
    record(trace::Event::graph_destroy, call).hex("exec", reinterpret_cast<uintptr_t>(exec)).emit();
  }
}

void graph_destroyed(const Call& call, CUgraph graph) {
  Tables& t = tables();
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    t.graphs.erase(graph);
  }
  if (trace::enabled()) {
    record(trace::Event::graph_destroy, call)
        .hex("graph", reinterpret_cast<uintptr_t>(graph))
        .emit();
  }
}

void memory_queried(const Call& call, size_t free_bytes, size_t total_bytes) {
  if (!trace::enabled()) return;
  record(trace::Event::mem_info, call)
      .add("free", static_cast<uint64_t>(free_bytes))
      .add("total", static_cast<uint64_t>(total_bytes))
      .emit();
}

bool slot_pointer_attribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  const auto region = tables().registry.find(static_cast<uintptr_t>(ptr));
  if (!region || region->kind != RegionKind::slot) return false;
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *static_cast<CUcontext*>(data) = engine().context(region->device);
      return true;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned int*>(data) = CU_MEMORYTYPE_DEVICE;
      return true;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *static_cast<CUdeviceptr*>(data) = ptr; return true;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *static_cast<unsigned int*>(data) = 0; return true;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = region->device;
      return true;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = static_cast<CUdeviceptr>(region->base);
      return true;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *static_cast<size_t*>(data) = region->bytes; return true;
    case CU_POINTER_ATTRIBUTE_MAPPED:  // as cudaMalloc'd memory: its pages come before its use
      *static_cast<int*>(data) = 1;
      return true;
    default: return false;  // host pointer, buffer ids, handles: the driver's refusal stands
  }
}

void slot_pointer_attributes(unsigned int count, const CUpointer_attribute* attributes, void** data,
                             CUdeviceptr ptr) {
  const auto region = tables().registry.find(static_cast<uintptr_t>(ptr));
  if (!region || region->kind != RegionKind::slot) return;
  const Driver* driver = load_driver(nullptr);
  unsigned int type = 0;
  if (driver == nullptr ||
      driver->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr) == CUDA_SUCCESS) {
    return;  // its pages are there: the driver's answers stand
  }
  for (unsigned int i = 0; i < count; ++i) {
    if (data[i] != nullptr) slot_pointer_attribute(data[i], attributes[i], ptr);
  }
}

void peer_access_enabled(const Call& call, int peer) {
  const int self = current_device();
  if (self < 0 || peer < 0 || self == peer) return;
  const uint64_t slots = engine().grant_device_access(peer, self);
  log().info(
      "{}: device {} may reach device {}'s memory: its slots are mapped for device {} "
      "too ({} now)",
      call.symbol, self, peer, self, slots);
  if (trace::enabled()) {
    record(trace::Event::notice, call)
        .add("message", "peer access: device " + std::to_string(self) + " may reach device " +
                            std::to_string(peer) + "'s slots")
        .emit();
  }
}

void peer_access_enabled(const Call& call, CUcontext peer) {
  const Driver* driver = load_driver(nullptr);
  if (driver == nullptr || peer == nullptr) return;
  CUdevice device = -1;
  {
    ContextScope scope(*driver, peer);
    if (driver->cuCtxGetDevice(&device) != CUDA_SUCCESS) return;
  }
  peer_access_enabled(call, static_cast<int>(device));
}

void device_resetting(const Call& call, std::optional<CUdevice> device) {
  const int ordinal = device ? static_cast<int>(*device) : current_device();
  Tables& t = tables();
  uint64_t slots = 0, regions = 0;
  for (const Region& region : t.registry.overlapping(0, UINTPTR_MAX)) {
    if (region.device != ordinal) continue;
    t.registry.erase(region.base);
    ++regions;
    if (region.kind != RegionKind::slot) continue;
    try {
      forget_slot(t, static_cast<Slot*>(region.slot));
      engine().destroy_slot(static_cast<Slot*>(region.slot));
      ++slots;
    } catch (const Error& e) {
      log().error("{}: freeing {} before the reset failed: {}", call.symbol, hex(region.base),
                  e.what());
    }
  }
  {
    // Graph and capture handles die with the context; forget them all (a reset is rare, and a
    // forgotten handle of another device only loses its capture id in the trace).
    std::lock_guard<std::mutex> lock(t.mutex);
    const int dropped = static_cast<int>(t.captures.size());
    t.captures.clear();
    capture_gate::closed(dropped);
    t.graphs.clear();
    t.execs.clear();
  }
  destroy_retired(t, ordinal);
  if (trace::enabled()) {
    record(trace::Event::device_reset, call)
        .add("device", ordinal)
        .add("regions", regions)
        .add("slots", slots)
        .emit();
  }
}

std::optional<Region> find_region(uintptr_t address) { return tables().registry.find(address); }

Counters counters() {
  Tables& t = tables();
  return {t.allocations.load(),    t.frees.load(),          t.slots.load(),
          t.captures_begun.load(), t.instantiations.load(), t.launches.load()};
}

}  // namespace vaswap::intercept
