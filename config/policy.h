// The policy: what vaswap offloads, when and how. Knows nothing of CUDA.
//
// Sources, later ones winning key by key: the defaults, the YAML file named by VASWAP_POLICY, and
// VASWAP_CONF ("key=value,key=value"). Every key is in one table (policy.cpp, kSchema); the
// parser, the explanation `vaswap check-policy` prints, and docs/POLICY.md (tested against it)
// all come from that table.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vaswap {

enum class Mode { off, auto_, rules };
enum class OnError { abort, passthrough };
enum class Model { measured, given };
enum class Handshake { automatic, device, host };
enum class Inside { off, auto_, on };

// rules mode: offload `offload` after the launch `after`, restore it before the launch `before`.
// Selectors name captures by their order in the process: "capture:3" is the third capture begun;
// launches name the graph that capture made: "graph:3".
struct Rule {
  std::string offload;
  std::string after;
  std::string before;
};

struct Policy {
  Mode mode = Mode::auto_;
  OnError on_error = OnError::abort;
  // selection
  uint64_t min_bytes = uint64_t{16} << 20;
  bool captured_only = true;
  int device = -1;                            // -1: every device
  std::vector<std::string> include, exclude;  // call-site patterns (fnmatch globs)
  // schedule
  int learning_steps = 3;
  // 2: under the device handshake a restore maps only once an earlier release's D2H has ended
  // and its pages are unmapped; one launch ahead left the step waiting for it (H200, PyTorch per
  // layer: +12.2% at 1, +5.4% at 2, +5.5% at 3; bench/results/prefetch_distance_h200.md).
  int prefetch_distance = 2;
  int release_lag = 0;
  Model model = Model::measured;
  double h2d_gbps = 0, d2h_gbps = 0;  // 0: measure
  uint64_t remap_latency_ns = 600000;
  // residency
  uint64_t residency_budget = 0;   // 0: auto (what the device has, less the reserve)
  uint64_t residency_reserve = 0;  // 0: auto
  Handshake handshake = Handshake::automatic;
  uint64_t wait_limit_ns = uint64_t{60} * 1000000000;
  bool d2h_gate = false;
  bool release_after_use = false;  // schedule.release_after_use (here, beside a bool: no padding)
  // offload inside one graph (rewritten graphs)
  Inside inside = Inside::auto_;
  int inside_lead = 8;
  int inside_min_gap = 4;
  int inside_lag = 0;
  // guard
  bool guard = true;
  // host pool
  uint64_t host_pool_limit = 0;  // 0: no limit
  int host_pool_numa = -1;       // -1: the device's node; -2: no binding; N: node N
  // workers
  int release_workers = 1, remap_workers = 1;
  bool serial_driver_calls = true;
  // trace and log
  std::string trace_path;        // "" : no trace; %p pid, %r rank, %h host
  bool trace_overwrite = false;  // replace a trace file that exists
  std::string trace_level = "events";
  uint64_t memory_interval_ns = 0;  // 0: no cuMemGetInfo sampling
  bool launch_times = false;        // timing events around every graph launch (launch_time)
  std::string log_level = "warn";
  std::string log_destination = "stderr";
  std::vector<Rule> rules;
};

// One input value: a key from the schema ("schedule.prefetch_distance", "rules[0].after",
// "selection.include[1]"), its text, and where it came from.
struct PolicyValue {
  std::string key;
  std::string value;
  std::string where;  // "policy.yaml:7:3" or "VASWAP_CONF"
};

// The result of reading every source.
struct PolicyLoad {
  Policy policy;
  std::vector<std::string> errors;   // each names where, the key, what was expected, what was given
  std::vector<std::string> origins;  // "key = value  (where)" for every key set by a source
  bool ok() const { return errors.empty(); }
};

// Applies values to `load->policy`, in order; every error is collected, not just the first.
void apply_values(const std::vector<PolicyValue>& values, PolicyLoad* load);
// Splits VASWAP_CONF into values. Lists are written a;b;c (rules only come from a file).
std::vector<PolicyValue> conf_values(const std::string& text, std::vector<std::string>* errors);
// Reads the YAML file into values (the YAML parser lives in libvaswap_yaml.so).
std::vector<PolicyValue> file_values(const std::string& file, std::vector<std::string>* errors);
// The same for a YAML document in memory; `name` stands for the file in messages.
std::vector<PolicyValue> text_values(const std::string& text, const std::string& name,
                                     std::vector<std::string>* errors);
// Defaults, then `file` (if not empty), then `conf`.
PolicyLoad load_policy(const std::string& file, const std::string& conf);

// The effective policy, one "key: value" line per schema key, with where each value came from.
std::string explain(const PolicyLoad& load);

// The schema's keys in table order, with their type, default and meaning (docs/POLICY.md).
struct KeyDoc {
  std::string key, type, default_value, meaning;
};
std::vector<KeyDoc> schema_docs();

// "16MiB", "2GB", "512k", "4096" -> bytes. Binary (KiB, MiB, GiB, TiB; also K, M, G, T) and
// decimal (kB, MB, GB, TB) units, optional B. Returns false on anything else or on overflow.
bool parse_size(const std::string& text, uint64_t* bytes);
// "50us", "2ms", "1.5s", "800ns" -> nanoseconds. A unit is required.
bool parse_duration(const std::string& text, uint64_t* ns);

// True when PyTorch's allocator config (PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF syntax:
// "key:value,key:value") turns expandable segments on.
bool expandable_segments_enabled(const std::string& alloc_conf);

}  // namespace vaswap
