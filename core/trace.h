// The trace: one JSON object per line, written through an asynchronous spdlog logger so that the
// threads that emit events (workers, API callers) only format and enqueue. docs/TRACE.md defines
// the format; VASWAP_TRACE_EVENTS below is the single list of event names, and a unit test checks
// the document against it.
#pragma once

#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace vaswap::trace {

// Format version, written in trace_begin. Raise it when a field changes meaning or disappears.
constexpr int kFormatVersion = 1;

// clang-format off
#define VASWAP_TRACE_EVENTS(X)                                                                   \
  X(trace_begin) X(trace_end) X(slot_create) X(slot_destroy) X(release_queued) X(d2h) X(release)  \
  X(remap_queued) X(remap) X(h2d) X(adopt) X(remap_discard) X(host_alloc) X(error) X(notice)      \
  X(alloc) X(free) X(capture_begin) X(capture_end) X(capture_mode) X(graph_instantiate)           \
  X(graph_update) X(graph_launch) X(graph_destroy) X(mem_info) X(device_reset) X(graph_scan) X(eager)             \
  X(learn) X(model) X(plan) X(plan_window) X(plan_offload) X(plan_restore) X(restore_wait)         \
  X(guard_hit) X(deviation) X(mem_sample) X(summary) X(residency) X(evict) X(fetch) X(oom)
// clang-format on

enum class Event {
#define VASWAP_TRACE_ENUM(name) name,
  VASWAP_TRACE_EVENTS(VASWAP_TRACE_ENUM)
#undef VASWAP_TRACE_ENUM
};

const char* event_name(Event event);

// True while a trace is open. Cheap: check it before building a Record.
bool enabled();

// Opens `path` ("%p" becomes the pid), replacing an open trace. Returns false and fills `error`
// when the file cannot be created.
bool open(const std::string& path, std::string* error);
// Opens the trace named by VASWAP_TRACE, or else `policy_path` (the policy's trace.path), once per
// process; later calls do nothing.
void open_from_environment(const std::string& policy_path = "");

// "%p" becomes the pid, "%r" the rank (RANK, OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID;
// 0 when none is set), "%h" the host name, "%%" a percent sign.
std::string expand_path(const std::string& path);
// Writes trace_end and everything queued, then closes the file.
void close();

// Monotonic nanoseconds (CLOCK_MONOTONIC), the trace's time base.
uint64_t now_ns();

// Microseconds from `start_ns` (a now_ns() reading) to now.
inline double us_since(uint64_t start_ns) { return static_cast<double>(now_ns() - start_ns) / 1e3; }

// One event: Record(Event::release).add("slot", 3).hex("va", va).emit(). "t_ns" is now unless
// at() says otherwise, "ev" is the event's name, "tid" the emitting thread.
class Record {
 public:
  explicit Record(Event event);
  Record& at(uint64_t t_ns);
  Record& add(const char* key, uint64_t value);
  Record& add(const char* key, int64_t value);
  Record& add(const char* key, int value) { return add(key, static_cast<int64_t>(value)); }
  Record& add(const char* key, double value);
  Record& add(const char* key, const std::string& value);  // JSON-escaped
  Record& add(const char* key, const char* value) { return add(key, std::string(value)); }
  Record& add(const char* key, bool value);
  Record& hex(const char* key, uint64_t value);  // "0x…" string, for addresses and handles
  void emit();

 private:
  Event event_;
  uint64_t t_ns_;
  fmt::memory_buffer fields_;
};

}  // namespace vaswap::trace
