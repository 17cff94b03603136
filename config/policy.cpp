#include "policy.h"

#include <fnmatch.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>

#include "yaml_document.h"

namespace vaswap {

namespace {

// =============================================================================================
// Text helpers
// =============================================================================================

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b])) != 0) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1])) != 0) --e;
  return s.substr(b, e - b);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return parts;
}

bool parse_int(const std::string& text, long long lo, long long hi, int* out) {
  const std::string t = trim(text);
  if (t.empty() || t.size() > 12) return false;
  size_t i = t[0] == '-' ? 1 : 0;
  if (i == t.size()) return false;
  for (size_t k = i; k < t.size(); ++k) {
    if (std::isdigit(static_cast<unsigned char>(t[k])) == 0) return false;
  }
  const long long v = std::stoll(t);
  if (v < lo || v > hi) return false;
  *out = static_cast<int>(v);
  return true;
}

bool parse_double(const std::string& text, double lo, double hi, double* out) {
  const std::string t = trim(text);
  if (t.empty() || t.size() > 32) return false;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || !std::isfinite(v) || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool parse_bool(const std::string& text, bool* value) {
  const std::string t = lower(trim(text));
  if (t == "true" || t == "yes" || t == "on" || t == "1") {
    *value = true;
    return true;
  }
  if (t == "false" || t == "no" || t == "off" || t == "0") {
    *value = false;
    return true;
  }
  return false;
}

// A call-site pattern: an fnmatch glob, not empty, brackets balanced.
bool valid_pattern(const std::string& p) {
  if (p.empty()) return false;
  int depth = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == '\\') {
      if (++i == p.size()) return false;  // a trailing escape
    } else if (p[i] == '[') {
      ++depth;
    } else if (p[i] == ']' && depth > 0) {
      --depth;
    }
  }
  return depth == 0 && fnmatch(p.c_str(), "", 0) != -1;
}

// A path template: % may only be followed by p (pid), r (rank), h (host) or %.
bool valid_path_template(const std::string& p) {
  if (p.empty()) return true;  // no trace
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != '%') continue;
    if (i + 1 == p.size() || std::string("prh%").find(p[i + 1]) == std::string::npos) return false;
    ++i;
  }
  return true;
}

bool valid_selector(const std::string& text, const char* kind) {
  const std::string prefix = std::string(kind) + ":";
  if (text.rfind(prefix, 0) != 0) return false;
  int n = 0;
  return parse_int(text.substr(prefix.size()), 1, 1000000000, &n);
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// =============================================================================================
// The schema: every key, once
// =============================================================================================

// Sets the key from `value`; on failure returns false and leaves the policy unchanged. `expected`
// is filled with what the key takes ("an integer >= 0").
using Setter = bool (*)(Policy&, const std::string& value);

struct Key {
  const char* key;
  const char* type;           // as docs/POLICY.md shows it
  const char* expected;       // completes "must be ..."
  const char* default_value;  // as a user would write it
  const char* meaning;
  Setter set;
  std::string (*show)(const Policy&);
};

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ";") + item;
  return out;
}

std::string show_size(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (unit < 4 && bytes != 0 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++unit;
  }
  return std::to_string(bytes) + kUnits[unit];
}

std::string show_duration(uint64_t ns) {
  if (ns != 0 && ns % 1000000000 == 0) return std::to_string(ns / 1000000000) + "s";
  if (ns != 0 && ns % 1000000 == 0) return std::to_string(ns / 1000000) + "ms";
  if (ns != 0 && ns % 1000 == 0) return std::to_string(ns / 1000) + "us";
  return std::to_string(ns) + "ns";
}

std::string show_double(double v) {
  std::string s = std::to_string(v);
  while (s.size() > 1 && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

bool set_patterns(std::vector<std::string>* out, const std::string& value) {
  std::vector<std::string> patterns;
  for (const std::string& raw : split(value, ';')) {
    const std::string p = trim(raw);
    if (!valid_pattern(p)) return false;
    patterns.push_back(p);
  }
  *out = patterns;
  return true;
}

// The shortest memory sampling interval: each sample is a cuMemGetInfo call on the sampler thread.
constexpr uint64_t kMinMemoryIntervalNs = 50000;

// clang-format off
const Key kSchema[] = {
  {"mode", "off | auto | rules", "off, auto or rules", "auto",
   "off: every call passes straight through. auto: vaswap selects, learns and plans by itself. "
   "rules: offload and restore only where `rules` says.",
   [](Policy& p, const std::string& v) {
     const std::string t = trim(v);
     if (t == "off") p.mode = Mode::off; else if (t == "auto") p.mode = Mode::auto_;
     else if (t == "rules") p.mode = Mode::rules; else return false;
     return true; },
   [](const Policy& p) { return std::string(p.mode == Mode::off ? "off" : p.mode == Mode::auto_ ? "auto" : "rules"); }},
  {"on_error", "abort | passthrough", "abort or passthrough", "abort",
   "What a malformed policy does: abort stops the process with the message before any CUDA work; "
   "passthrough says so once and leaves every call alone.",
   [](Policy& p, const std::string& v) {
     const std::string t = trim(v);
     if (t == "abort") p.on_error = OnError::abort; else if (t == "passthrough") p.on_error = OnError::passthrough;
     else return false;
     return true; },
   [](const Policy& p) { return std::string(p.on_error == OnError::abort ? "abort" : "passthrough"); }},
  {"selection.min_bytes", "size", "a size such as 16MiB, 2GB or 4096", "16MiB",
   "Allocations at least this large can become slots.",
   [](Policy& p, const std::string& v) { return parse_size(v, &p.min_bytes); },
   [](const Policy& p) { return show_size(p.min_bytes); }},
  {"selection.captured_only", "bool", "true or false", "true",
   "Only allocations made while the allocating thread captures a graph (graph-pool segments).",
   [](Policy& p, const std::string& v) { return parse_bool(v, &p.captured_only); },
   [](const Policy& p) { return std::string(p.captured_only ? "true" : "false"); }},
  {"selection.device", "all | integer >= 0", "all or a device ordinal >= 0", "all",
   "Only allocations on this device.",
   [](Policy& p, const std::string& v) {
     if (trim(v) == "all") { p.device = -1; return true; }
     return parse_int(v, 0, 1023, &p.device); },
   [](const Policy& p) { return p.device < 0 ? std::string("all") : std::to_string(p.device); }},
  {"selection.include", "list of patterns", "a list of non-empty glob patterns ([ ] balanced)", "[]",
   "If given, only allocations whose call stack has a frame whose object file name or function "
   "name matches one of these fnmatch globs. Needs a stack walk per candidate allocation.",
   [](Policy& p, const std::string& v) { return set_patterns(&p.include, v); },
   [](const Policy& p) { return "[" + join(p.include) + "]"; }},
  {"selection.exclude", "list of patterns", "a list of non-empty glob patterns ([ ] balanced)", "[]",
   "Allocations whose call stack matches one of these are never slots.",
   [](Policy& p, const std::string& v) { return set_patterns(&p.exclude, v); },
   [](const Policy& p) { return "[" + join(p.exclude) + "]"; }},
  {"schedule.learning_steps", "integer 1..1000", "an integer from 1 to 1000", "3",
   "Steps observed before the first plan.",
   [](Policy& p, const std::string& v) { return parse_int(v, 1, 1000, &p.learning_steps); },
   [](const Policy& p) { return std::to_string(p.learning_steps); }},
  {"schedule.prefetch_distance", "integer 0..1000", "an integer from 0 to 1000", "2",
   "Launches ahead of its next use that a region's restore is started, at least: further "
   "ahead when the model says its map and copy need longer.",
   [](Policy& p, const std::string& v) { return parse_int(v, 0, 1000, &p.prefetch_distance); },
   [](const Policy& p) { return std::to_string(p.prefetch_distance); }},
  {"schedule.release_lag", "integer 0..1000", "an integer from 0 to 1000", "0",
   "Launches after its last use that a region is released.",
   [](Policy& p, const std::string& v) { return parse_int(v, 0, 1000, &p.release_lag); },
   [](const Policy& p) { return std::to_string(p.release_lag); }},
  {"schedule.release_after_use", "bool", "true or false", "false",
   "A release due at a launch is issued as soon as its slot's last use before that launch has "
   "been enqueued (the launch before it, or the eager call after it that learning saw use the "
   "slot last), so that its copy can run while the program works on the host in between. It "
   "trusts that learning saw every use there: a use vaswap cannot see (docs/PLANNER.md, \"Not "
   "seen\") would run after the release. Needs the guard (ignored with guard: false). On the H200 "
   "it changed nothing measurable (docs/BENCHMARKS.md, 2026-12-05 11:23 UTC).",
   [](Policy& p, const std::string& v) { return parse_bool(v, &p.release_after_use); },
   [](const Policy& p) { return std::string(p.release_after_use ? "true" : "false"); }},
  {"schedule.model", "measured | given", "measured or given", "measured",
   "Where the copy and remap model comes from: a short copy test at start-up, or the two "
   "bandwidths and the latency below.",
   [](Policy& p, const std::string& v) {
     const std::string t = trim(v);
     if (t == "measured") p.model = Model::measured; else if (t == "given") p.model = Model::given;
     else return false;
     return true; },
   [](const Policy& p) { return std::string(p.model == Model::measured ? "measured" : "given"); }},
  {"schedule.h2d_gbps", "number > 0", "a number of GB/s greater than 0 and at most 10000", "0 (measured)",
   "Host-to-device bandwidth for a given model.",
   [](Policy& p, const std::string& v) { return parse_double(v, 1e-9, 10000, &p.h2d_gbps); },
   [](const Policy& p) { return show_double(p.h2d_gbps); }},
  {"schedule.d2h_gbps", "number > 0", "a number of GB/s greater than 0 and at most 10000", "0 (measured)",
   "Device-to-host bandwidth for a given model.",
   [](Policy& p, const std::string& v) { return parse_double(v, 1e-9, 10000, &p.d2h_gbps); },
   [](const Policy& p) { return show_double(p.d2h_gbps); }},
  {"schedule.remap_latency", "duration", "a duration such as 600us, 2ms or 1s", "600us",
   "Time to unmap a region's pages and map them again, for a given model.",
   [](Policy& p, const std::string& v) { return parse_duration(v, &p.remap_latency_ns); },
   [](const Policy& p) { return show_duration(p.remap_latency_ns); }},
  {"residency.budget", "auto | size", "auto or a size such as 40GiB", "auto",
   "Device memory the slots may hold at once. auto: what the device has free, so a job that "
   "fits pays nothing and vaswap offloads only what memory pressure requires (then down to "
   "residency.reserve below it). A size: the slots stay within it even when the device has "
   "room, and within what the device has for them where that is less.",
   [](Policy& p, const std::string& v) {
     if (trim(v) == "auto") { p.residency_budget = 0; return true; }
     uint64_t bytes = 0;
     if (!parse_size(v, &bytes) || bytes == 0) return false;
     p.residency_budget = bytes;
     return true; },
   [](const Policy& p) { return p.residency_budget == 0 ? std::string("auto") : show_size(p.residency_budget); }},
  {"residency.reserve", "auto | size", "auto or a size such as 1GiB", "auto",
   "With an auto budget, the headroom left to the program's own allocations once slots fill "
   "the device: evictions then bring the slots this far below it. auto is 1/32 of the device, "
   "at most 512MiB, and at most half of what slots could have (free memory plus what slots "
   "hold); a rewritten graph's windows may take part of it rather than be refused.",
   [](Policy& p, const std::string& v) {
     if (trim(v) == "auto") { p.residency_reserve = 0; return true; }
     uint64_t bytes = 0;
     if (!parse_size(v, &bytes) || bytes == 0) return false;
     p.residency_reserve = bytes;
     return true; },
   [](const Policy& p) { return p.residency_reserve == 0 ? std::string("auto") : show_size(p.residency_reserve); }},
  {"residency.handshake", "auto | device | host", "auto, device or host", "auto",
   "How a launch waits for its slots' restores: device (the stream waits on a flag the restore "
   "writes: the application's thread never waits), host (the application's thread waits until "
   "the restore is submitted), auto (device, unless stream memory operations are unavailable or "
   "CUDA_DEVICE_MAX_CONNECTIONS=1 would let a waiting stream block vaswap's copies).",
   [](Policy& p, const std::string& v) {
     const std::string t = trim(v);
     if (t == "auto") p.handshake = Handshake::automatic;
     else if (t == "device") p.handshake = Handshake::device;
     else if (t == "host") p.handshake = Handshake::host;
     else return false;
     return true; },
   [](const Policy& p) {
     return std::string(p.handshake == Handshake::automatic ? "auto" : p.handshake == Handshake::device ? "device" : "host"); }},
  {"residency.d2h_gate", "bool", "true or false", "false",
   "Device handshake only: while a restore waits for room that an eviction's copy already "
   "running will free, the evictions' copies not yet begun wait on the device until it has "
   "mapped (at most 1.5 times what the running copy should take, 1 to 20 ms), so that its "
   "cuMemSetAccess does not wait behind a D2H (0.74 ms on "
   "the H200, docs/PERFORMANCE.md fact 6). Experimental: on the H200 it made the per-layer "
   "PyTorch job no faster (docs/BENCHMARKS.md, 2026-12-05 11:23 UTC).",
   [](Policy& p, const std::string& v) { return parse_bool(v, &p.d2h_gate); },
   [](const Policy& p) { return std::string(p.d2h_gate ? "true" : "false"); }},
  {"residency.wait_limit", "duration >= 100ms", "a duration of at least 100ms, such as 60s", "60s",
   "The longest any wait of vaswap's may last (a restore's copy, an eviction's last use, room in "
   "the budget). Past it the wait is a named error and the process ends: never a silent hang.",
   [](Policy& p, const std::string& v) {
     uint64_t ns = 0;
     if (!parse_duration(v, &ns) || ns < 100000000) return false;
     p.wait_limit_ns = ns;
     return true; },
   [](const Policy& p) { return show_duration(p.wait_limit_ns); }},
  {"inside.mode", "off | auto | on", "off, auto or on", "auto",
   "Offload inside one graph: instantiate a rewritten copy of a captured graph whose slots leave "
   "the device between their uses within a launch (copies and flags added as graph nodes). "
   "on: every gap of inside.min_gap nodes or more, for the slots only that graph uses. auto: "
   "only with a residency.budget size that the graph's slots do not fit, just the gaps that "
   "bring them within it. off: graphs are instantiated as captured.",
   [](Policy& p, const std::string& v) {
     const std::string t = trim(v);
     if (t == "off") p.inside = Inside::off;
     else if (t == "auto") p.inside = Inside::auto_;
     else if (t == "on") p.inside = Inside::on;
     else return false;
     return true; },
   [](const Policy& p) {
     return std::string(p.inside == Inside::off ? "off" : p.inside == Inside::on ? "on" : "auto"); }},
  {"inside.lead", "integer 1..100000", "an integer from 1 to 100000", "8",
   "Inside one graph: how many nodes (in a topological order) before a slot's next use its pages "
   "are mapped again, so that the graph rarely waits for the map.",
   [](Policy& p, const std::string& v) { return parse_int(v, 1, 100000, &p.inside_lead); },
   [](const Policy& p) { return std::to_string(p.inside_lead); }},
  {"inside.min_gap", "integer 1..100000", "an integer from 1 to 100000", "4",
   "Inside one graph: the fewest nodes a slot must stay away for a gap between its uses to be "
   "offloaded.",
   [](Policy& p, const std::string& v) { return parse_int(v, 1, 100000, &p.inside_min_gap); },
   [](const Policy& p) { return std::to_string(p.inside_min_gap); }},
  {"inside.lag", "integer 0..100000", "an integer from 0 to 100000", "0",
   "Inside one graph: how many nodes after a slot's last use before a gap its pages count as "
   "given back (its copy out and unmap take that long): a restore counts only on the room of "
   "releases at least this far before its map, and the graph's map signal waits only for them.",
   [](Policy& p, const std::string& v) { return parse_int(v, 0, 100000, &p.inside_lag); },
   [](const Policy& p) { return std::to_string(p.inside_lag); }},
  {"guard", "bool", "true or false", "true",
   "Check eager launches against offloaded regions and restore on demand instead of faulting.",
   [](Policy& p, const std::string& v) { return parse_bool(v, &p.guard); },
   [](const Policy& p) { return std::string(p.guard ? "true" : "false"); }},
  {"host_pool.limit", "size", "a size such as 16MiB, 2GB or 4096", "0 (no limit)",
   "Pinned host memory the pool may hold.",
   [](Policy& p, const std::string& v) { return parse_size(v, &p.host_pool_limit); },
   [](const Policy& p) { return show_size(p.host_pool_limit); }},
  {"host_pool.numa", "auto | none | integer >= 0", "auto, none or a NUMA node >= 0", "auto",
   "Where pinned buffers live: the device's NUMA node, no binding, or a given node.",
   [](Policy& p, const std::string& v) {
     const std::string t = trim(v);
     if (t == "auto") { p.host_pool_numa = -1; return true; }
     if (t == "none") { p.host_pool_numa = -2; return true; }
     return parse_int(t, 0, 1023, &p.host_pool_numa); },
   [](const Policy& p) {
     return p.host_pool_numa == -1 ? std::string("auto") : p.host_pool_numa == -2 ? std::string("none")
                                                                               : std::to_string(p.host_pool_numa); }},
  {"workers.release", "integer 1..8", "an integer from 1 to 8", "1",
   "Release workers per device.",
   [](Policy& p, const std::string& v) { return parse_int(v, 1, 8, &p.release_workers); },
   [](const Policy& p) { return std::to_string(p.release_workers); }},
  {"workers.remap", "integer 1..8", "an integer from 1 to 8", "1",
   "Remap workers per device.",
   [](Policy& p, const std::string& v) { return parse_int(v, 1, 8, &p.remap_workers); },
   [](const Policy& p) { return std::to_string(p.remap_workers); }},
  {"workers.serial_driver_calls", "bool", "true or false", "true",
   "Serialize VMM driver calls process-wide (two at once have shown 40 ms cuMemSetAccess tails).",
   [](Policy& p, const std::string& v) { return parse_bool(v, &p.serial_driver_calls); },
   [](const Policy& p) { return std::string(p.serial_driver_calls ? "true" : "false"); }},
  {"trace.path", "path", "a file path in which % is followed only by p, r, h or %", "\"\" (no trace)",
   "Write the trace here: %p is the pid, %r the rank (RANK, LOCAL_RANK), %h the host name. "
   "VASWAP_TRACE sets it too.",
   [](Policy& p, const std::string& v) {
     if (!valid_path_template(trim(v))) return false;
     p.trace_path = trim(v);
     return true; },
   [](const Policy& p) { return "\"" + p.trace_path + "\""; }},
  {"trace.overwrite", "bool", "true or false", "false",
   "Replace a trace file that exists. Off, a trace that would replace one says so and is not "
   "written (a re-run with the same path keeps the earlier trace); put %p in the path for one "
   "file per process.",
   [](Policy& p, const std::string& v) { return parse_bool(v, &p.trace_overwrite); },
   [](const Policy& p) { return std::string(p.trace_overwrite ? "true" : "false"); }},
  {"trace.level", "off | events | verbose", "off, events or verbose", "events",
   "How much the trace holds: verbose adds every capture-mode change and memory query.",
   [](Policy& p, const std::string& v) {
     const std::string t = trim(v);
     if (t != "off" && t != "events" && t != "verbose") return false;
     p.trace_level = t;
     return true; },
   [](const Policy& p) { return p.trace_level; }},
  {"trace.memory_interval", "0 | duration >= 50us", "0 (off) or a duration of at least 50us, such as 200us, 2ms or 1s", "0 (off)",
   "Sample the device's free memory (cuMemGetInfo) this often and trace each change. Shorter "
   "than 50us would keep a core busy sampling.",
   [](Policy& p, const std::string& v) {
     if (trim(v) == "0") { p.memory_interval_ns = 0; return true; }
     uint64_t ns = 0;
     if (!parse_duration(v, &ns) || (ns != 0 && ns < kMinMemoryIntervalNs)) return false;
     p.memory_interval_ns = ns;
     return true; },
   [](const Policy& p) { return p.memory_interval_ns == 0 ? std::string("0") : show_duration(p.memory_interval_ns); }},
  {"trace.launch_times", "bool", "true or false", "false",
   "Time every graph launch on the device and trace it (launch_time): how long its stream waited "
   "for vaswap before the graph, the graph itself, and the time since the stream's previous "
   "launch. A diagnostic: three timing events per launch. vaswap report sums them per step and "
   "names the graphs whose stream waited with the plan in force.",
   [](Policy& p, const std::string& v) { return parse_bool(v, &p.launch_times); },
   [](const Policy& p) { return std::string(p.launch_times ? "true" : "false"); }},
  {"log.level", "trace | debug | info | warn | error | off", "trace, debug, info, warn, error or off", "warn",
   "The log's level (VASWAP_LOG_LEVEL sets it too).",
   [](Policy& p, const std::string& v) {
     const std::string t = trim(v);
     static const std::set<std::string> kLevels = {"trace", "debug", "info", "warn", "error", "off"};
     if (kLevels.count(t) == 0) return false;
     p.log_level = t;
     return true; },
   [](const Policy& p) { return p.log_level; }},
  {"log.destination", "stderr | stdout | path", "stderr, stdout or a file path", "stderr",
   "Where the log goes.",
   [](Policy& p, const std::string& v) {
     const std::string t = trim(v);
     if (t.empty() || !valid_path_template(t)) return false;
     p.log_destination = t;
     return true; },
   [](const Policy& p) { return p.log_destination; }},
};
// clang-format on

constexpr const char* kRuleFields[] = {"offload", "after", "before"};

const Key* find_key(const std::string& key) {
  for (const Key& k : kSchema) {
    if (key == k.key) return &k;
  }
  return nullptr;
}

std::string suggestion(const std::string& key) {
  std::string best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  const size_t limit = std::max<size_t>(2, key.size() / 4);
  auto consider = [&](const std::string& candidate) {
    // The length difference bounds the distance from below: skip what cannot be close, so that
    // a long key costs no quadratic work per schema key.
    const size_t gap = key.size() > candidate.size() ? key.size() - candidate.size()
                                                     : candidate.size() - key.size();
    if (gap > limit) return;
    const size_t d = edit_distance(key, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  };
  for (const Key& k : kSchema) consider(k.key);
  for (const char* field : kRuleFields) consider(std::string("rules[0].") + field);
  // A misspelt last component ("selection.min_byte") or section ("selction.min_bytes").
  if (best_distance <= limit) return "; did you mean \"" + best + "\"?";
  return "; see docs/POLICY.md for the keys";
}

// A value or key as a message quotes it: whole when short, else its start and its size.
std::string quoted(const std::string& text) {
  constexpr size_t kShown = 100;
  if (text.size() <= kShown) return '"' + text + '"';
  return '"' + text.substr(0, kShown) + "...\" (" + std::to_string(text.size()) + " bytes)";
}

// Keys that existed and were taken out, with what replaces them.
std::string removed_or_unknown(const std::string& key) {
  static const std::pair<const char*, const char*> kRemoved[] = {
      {"schedule.max_overhead",
       "what leaves the device is now what residency.budget requires; remove the key"},
      {"schedule.byte_budget",
       "set residency.budget to the device memory the slots may hold instead"},
  };
  for (const auto& [old_key, instead] : kRemoved) {
    if (key == old_key) return "\"" + key + "\" was removed in vaswap 0.2: " + instead;
  }
  return "unknown key " + quoted(key) + suggestion(key);
}

std::string must(const PolicyValue& v, const char* expected) {
  std::string m = v.where;
  m += ": ";
  m += v.key.size() <= 100 ? v.key : quoted(v.key);
  m += " must be ";
  m += expected;
  m += ", got ";
  m += quoted(v.value);
  return m;
}

// "rules[3].after" -> index 3, field "after".
bool rule_key(const std::string& key, size_t* index, std::string* field) {
  if (key.rfind("rules[", 0) != 0) return false;
  const size_t close = key.find(']');
  if (close == std::string::npos || close + 1 >= key.size() || key[close + 1] != '.') return false;
  int n = 0;
  if (!parse_int(key.substr(6, close - 6), 0, 100000, &n)) return false;
  *index = static_cast<size_t>(n);
  *field = key.substr(close + 2);
  return true;
}

}  // namespace

// =============================================================================================
// Parsing values
// =============================================================================================

bool parse_size(const std::string& text, uint64_t* bytes) {
  const std::string t = trim(text);
  size_t digits = 0;
  while (digits < t.size() && std::isdigit(static_cast<unsigned char>(t[digits])) != 0) ++digits;
  if (digits == 0 || digits > 19) return false;
  const uint64_t number = std::stoull(t.substr(0, digits));
  const std::string unit = lower(trim(t.substr(digits)));
  struct Unit {
    const char* name;
    uint64_t scale;
  };
  static const Unit kUnits[] = {
      {"", 1},
      {"b", 1},
      {"k", 1ULL << 10},
      {"kib", 1ULL << 10},
      {"kb", 1000ULL},
      {"m", 1ULL << 20},
      {"mib", 1ULL << 20},
      {"mb", 1000ULL * 1000},
      {"g", 1ULL << 30},
      {"gib", 1ULL << 30},
      {"gb", 1000ULL * 1000 * 1000},
      {"t", 1ULL << 40},
      {"tib", 1ULL << 40},
      {"tb", 1000ULL * 1000 * 1000 * 1000},
  };
  for (const Unit& u : kUnits) {
    if (unit != u.name) continue;
    if (number > std::numeric_limits<uint64_t>::max() / u.scale) return false;
    *bytes = number * u.scale;
    return true;
  }
  return false;
}

bool parse_duration(const std::string& text, uint64_t* ns) {
  const std::string t = lower(trim(text));
  size_t end = 0;
  while (end < t.size() &&
         (std::isdigit(static_cast<unsigned char>(t[end])) != 0 || t[end] == '.')) {
    ++end;
  }
  if (end == 0 || end > 20) return false;
  double number = 0;
  if (!parse_double(t.substr(0, end), 0, 1e12, &number)) return false;
  const std::string unit = trim(t.substr(end));
  double scale = 0;
  if (unit == "ns") {
    scale = 1;
  } else if (unit == "us" || unit == "µs") {
    scale = 1e3;
  } else if (unit == "ms") {
    scale = 1e6;
  } else if (unit == "s") {
    scale = 1e9;
  } else {
    return false;
  }
  const double value = number * scale;
  if (value > 3.6e15) return false;  // an hour is plenty
  *ns = static_cast<uint64_t>(std::llround(value));
  return true;
}

bool expandable_segments_enabled(const std::string& alloc_conf) {
  bool enabled = false;  // the last occurrence wins, as in PyTorch's parser
  for (const std::string& raw : split(alloc_conf, ',')) {
    const size_t colon = raw.find(':');
    if (colon == std::string::npos) continue;
    if (trim(raw.substr(0, colon)) != "expandable_segments") continue;
    const std::string value = lower(trim(raw.substr(colon + 1)));
    enabled = value == "true" || value == "1";
  }
  return enabled;
}

// =============================================================================================
// Sources
// =============================================================================================

std::vector<PolicyValue> conf_values(const std::string& text, std::vector<std::string>* errors) {
  std::vector<PolicyValue> values;
  if (text.size() > kMaxPolicyBytes) {
    errors->push_back("VASWAP_CONF: " + std::to_string(text.size()) + " bytes, over the 1 MiB (" +
                      std::to_string(kMaxPolicyBytes) +
                      " bytes) vaswap reads; put the settings in a policy file (VASWAP_POLICY)");
    return values;
  }
  for (const std::string& raw : split(text, ',')) {
    const std::string item = trim(raw);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      errors->push_back("VASWAP_CONF: \"" + item +
                        "\" is not key=value; write for example mode=off or "
                        "selection.min_bytes=64MiB");
      continue;
    }
    const std::string key = trim(item.substr(0, eq));
    if (key.rfind("rules", 0) == 0) {
      errors->push_back("VASWAP_CONF: " + key +
                        ": rules can only be given in a policy file (VASWAP_POLICY)");
      continue;
    }
    values.push_back({key, trim(item.substr(eq + 1)), "VASWAP_CONF"});
  }
  return values;
}

namespace {

std::vector<PolicyValue> scalar_values(const std::string& file,
                                       const std::vector<YamlScalar>& scalars,
                                       std::vector<std::string>* errors) {
  std::vector<PolicyValue> values;
  std::map<std::string, size_t> lists;  // list key -> index of its joined value
  std::set<std::string> seen;
  for (const YamlScalar& s : scalars) {
    const std::string where = file + ":" + std::to_string(s.line) + ":" + std::to_string(s.column);
    if (s.path.empty()) {
      errors->push_back(where +
                        ": a policy is a mapping of keys (mode: auto, selection: ...), got \"" +
                        s.value + "\"");
      continue;
    }
    if (!seen.insert(s.path).second) {
      errors->push_back(where + ": " + (s.path.size() <= 100 ? s.path : quoted(s.path)) +
                        " is given twice");
      continue;
    }
    // selection.include[2] -> one value "a;b;c" for selection.include
    const size_t bracket = s.path.find('[');
    if (bracket != std::string::npos && s.path.rfind("rules[", 0) != 0 && s.path.back() == ']') {
      const std::string list = s.path.substr(0, bracket);
      auto it = lists.find(list);
      if (it == lists.end()) {
        lists[list] = values.size();
        values.push_back({list, s.value, where});
      } else {
        values[it->second].value += ";" + s.value;
      }
      continue;
    }
    values.push_back({s.path, s.value, where});
  }
  return values;
}

}  // namespace

std::vector<PolicyValue> file_values(const std::string& file, std::vector<std::string>* errors) {
  std::vector<YamlScalar> scalars;
  std::string error;
  if (!read_yaml_file(file, &scalars, &error)) {
    errors->push_back(error);
    return {};
  }
  return scalar_values(file, scalars, errors);
}

std::vector<PolicyValue> text_values(const std::string& text, const std::string& name,
                                     std::vector<std::string>* errors) {
  std::vector<YamlScalar> scalars;
  std::string error;
  if (!read_yaml_text(text, name, &scalars, &error)) {
    errors->push_back(error);
    return {};
  }
  return scalar_values(name, scalars, errors);
}

void apply_values(const std::vector<PolicyValue>& values, PolicyLoad* load) {
  std::map<size_t, std::string> rule_where;
  for (const PolicyValue& v : values) {
    size_t index = 0;
    std::string field;
    if (rule_key(v.key, &index, &field)) {
      auto& rules = load->policy.rules;
      if (index > rules.size()) {
        load->errors.push_back(v.where + ": " + v.key + ": rules are numbered from 0 without gaps");
        continue;
      }
      if (index == rules.size()) rules.emplace_back();
      rule_where.emplace(index, v.where);
      Rule& rule = rules[index];
      const std::string value = trim(v.value);
      if (field == "offload") {
        if (!valid_selector(value, "capture")) {
          load->errors.push_back(must(v, "a capture selector such as capture:3"));
          continue;
        }
        rule.offload = value;
      } else if (field == "after" || field == "before") {
        if (!valid_selector(value, "graph")) {
          load->errors.push_back(must(v, "a launch selector such as graph:3"));
          continue;
        }
        (field == "after" ? rule.after : rule.before) = value;
      } else {
        load->errors.push_back(v.where + ": unknown key " + quoted(v.key) +
                               "; a rule has offload, after and before");
        continue;
      }
      load->origins.push_back(v.key + " = " + value + "  (" + v.where + ")");
      continue;
    }
    const Key* key = find_key(v.key);
    if (key == nullptr) {
      load->errors.push_back(v.where + ": " + removed_or_unknown(v.key));
      continue;
    }
    // Setters leave the policy unchanged when they fail, so no copy is needed (a copy per value
    // made a long VASWAP_CONF quadratic: every value copied every list set before it).
    if (!key->set(load->policy, v.value)) {
      load->errors.push_back(must(v, key->expected));
      continue;
    }
    load->origins.push_back(v.key + " = " + key->show(load->policy) + "  (" + v.where + ")");
  }
  for (size_t i = 0; i < load->policy.rules.size(); ++i) {
    const Rule& r = load->policy.rules[i];
    if (r.offload.empty() || r.after.empty() || r.before.empty()) {
      load->errors.push_back(rule_where[i] + ": rules[" + std::to_string(i) +
                             "] needs offload, after and before (got offload \"" + r.offload +
                             "\", after \"" + r.after + "\", before \"" + r.before + "\")");
    }
  }
}

PolicyLoad load_policy(const std::string& file, const std::string& conf) {
  PolicyLoad load;
  if (!file.empty()) apply_values(file_values(file, &load.errors), &load);
  apply_values(conf_values(conf, &load.errors), &load);
  const Policy& p = load.policy;
  const std::string source = file.empty() ? "VASWAP_CONF" : file;
  if (p.mode == Mode::rules && p.rules.empty()) {
    load.errors.push_back(source +
                          ": mode is rules, but no rules are given; add a rules list "
                          "(offload, after, before) or use mode: auto");
  }
  if (p.mode != Mode::rules && !p.rules.empty()) {
    load.errors.push_back(source + ": rules are given, but mode is not rules; set mode: rules");
  }
  if (p.model == Model::given && (p.h2d_gbps <= 0 || p.d2h_gbps <= 0)) {
    load.errors.push_back(source +
                          ": schedule.model is given, so schedule.h2d_gbps and "
                          "schedule.d2h_gbps must both be set (> 0)");
  }
  return load;
}

std::string explain(const PolicyLoad& load) {
  std::map<std::string, std::string> where;
  for (const std::string& origin : load.origins) {
    const size_t eq = origin.find(" = ");
    const size_t paren = origin.rfind("  (");
    where[origin.substr(0, eq)] = origin.substr(paren + 3, origin.size() - paren - 4);
  }
  std::string out;
  for (const Key& k : kSchema) {
    out += std::string(k.key) + ": " + k.show(load.policy);
    auto it = where.find(k.key);
    out += it != where.end() ? "  # " + it->second : "  # default";
    out += '\n';
  }
  for (size_t i = 0; i < load.policy.rules.size(); ++i) {
    const Rule& r = load.policy.rules[i];
    out += "rules[" + std::to_string(i) + "]: offload " + r.offload + " after " + r.after +
           ", restore before " + r.before + '\n';
  }
  return out;
}

std::vector<KeyDoc> schema_docs() {
  std::vector<KeyDoc> docs;
  for (const Key& k : kSchema) docs.push_back({k.key, k.type, k.default_value, k.meaning});
  for (const char* field : kRuleFields) {
    docs.push_back({std::string("rules[].") + field,
                    std::string(field) == std::string("offload") ? "capture:N" : "graph:N", "-",
                    std::string(field) == std::string("offload")
                        ? "rules mode: the allocations of the N-th capture of the process"
                    : std::string(field) == std::string("after")
                        ? "rules mode: offload them after each launch of the graph of capture N"
                        : "rules mode: restore them before each launch of the graph of capture N"});
  }
  return docs;
}

}  // namespace vaswap
