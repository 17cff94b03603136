// The trace: one JSON object per line, written through an asynchronous spdlog logger so that the
// threads that emit events (workers, API callers) only format and enqueue. docs/TRACE.md defines
// the format; VASWAP_TRACE_EVENTS below is the single list of event names, and a unit test checks
// the document against it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

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
  X(learn) X(model) X(plan_input) X(plan) X(plan_window) X(plan_offload) X(plan_restore) X(restore_wait)         \
  X(guard_hit) X(deviation) X(mem_sample) X(summary) X(residency) X(evict) X(fetch) X(oom)     \
  X(reclaim) X(signal) X(inside_input) X(graph_rewrite) X(inside_launch) X(inside_demand) X(launch_time) \
  X(thread_stack)
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
// when the file cannot be created, is a symbolic link, or is a trace that exists (not empty) and
// `overwrite` is false (trace_file.h).
bool open(const std::string& path, std::string* error, bool overwrite = false);
// Opens the trace named by VASWAP_TRACE, or else `policy_path` (the policy's trace.path), once per
// process; later calls do nothing. Nothing is read in secure-execution mode (AT_SECURE: a setuid
// or capability-raising exec), on every path: the preload's and the C API's.
void open_from_environment(const std::string& policy_path = "", bool overwrite = false);

// Where a trace from the environment goes. `variable` reads the environment; `secure` is
// AT_SECURE; `inherited_owner` is the VASWAP_TRACE_OWNER this process was started with (0 if
// none). The path is VASWAP_TRACE or else `policy_path`, expanded; "" when there is none or when
// `secure`. Children inherit VASWAP_TRACE, so a path without %p would be one file for a whole
// process tree: the first process that loads vaswap with a trace configured exports
// VASWAP_TRACE_OWNER=<its pid>, and a process that finds another pid there writes
// "<path>.<pid><extension>" instead, and says so in `notice`.
struct EnvironmentTrace {
  std::string file;    // expanded; "" for no trace
  std::string source;  // "VASWAP_TRACE" or "trace.path"
  std::string notice;  // set when the pid was added
};
EnvironmentTrace environment_trace(bool secure,
                                   const std::function<const char*(const char*)>& variable,
                                   const std::string& policy_path, pid_t inherited_owner,
                                   pid_t self);

// "%p" becomes the pid, "%r" the rank (RANK, OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID;
// 0 when none is set), "%h" the host name, "%%" a percent sign.
std::string expand_path(const std::string& path);
// Writes trace_end and everything queued, then closes the file.
void close();

// What a failed write (a full disk) cost: events not written, and the error. For the exit summary.
struct Losses {
  uint64_t events = 0;
  int error_number = 0;
  std::string file;
};
Losses losses();

// True in a child made by fork() (before any exec): vaswap's threads did not survive the fork,
// so the child starts with the trace closed and must not wait for them (no summary either).
bool forked_child();

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

// A list field of an event (plan_input, inside_input): each item as `text` writes it, between
// separators, read back by bench/replay_fields.h.
template <class T, class F>
std::string joined(const std::vector<T>& items, F&& text, const char* separator = ",") {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += separator;
    out += text(items[i]);
  }
  return out;
}

}  // namespace vaswap::trace
