// The policy (config/policy.h): every key, every unit form, precedence, the malformed-policy
// messages, docs/POLICY.md against the schema, and what the preload reads from the environment.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "base/log.h"
#include "observe/intercept.h"
#include "policy.h"

namespace vaswap {
namespace {

// A policy file in the temporary directory, removed with the object.
class PolicyFile {
 public:
  explicit PolicyFile(const std::string& text) {
    static int n = 0;
    path_ = ::testing::TempDir() + "policy_" + std::to_string(::getpid()) + "_" +
            std::to_string(n++) + ".yaml";
    std::ofstream(path_) << text;
  }
  PolicyFile(const PolicyFile&) = delete;
  PolicyFile& operator=(const PolicyFile&) = delete;
  ~PolicyFile() { ::unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---------------------------------------------------------------------------------------------
// Units
// ---------------------------------------------------------------------------------------------

TEST(Sizes, AcceptEveryUnitForm) {
  const std::map<std::string, uint64_t> cases = {
      {"4096", 4096},          {"0", 0},
      {"512B", 512},           {"2k", 2048},
      {"2KiB", 2048},          {"2kB", 2000},
      {"16MiB", 16ull << 20},  {"16M", 16ull << 20},
      {"16MB", 16000000},      {"2GiB", 2ull << 30},
      {"2G", 2ull << 30},      {"2GB", 2000000000},
      {"1TiB", 1ull << 40},    {"1TB", 1000000000000},
      {" 8 mib ", 8ull << 20},
  };
  for (const auto& [text, bytes] : cases) {
    uint64_t got = 1;
    EXPECT_TRUE(parse_size(text, &got)) << text;
    EXPECT_EQ(got, bytes) << text;
  }
}

TEST(Sizes, RejectWhatIsNotASize) {
  for (const char* text :
       {"", "MiB", "-1", "1.5GiB", "16 MiBs", "0x10", "99999999999999999999", "20000000TiB"}) {
    uint64_t got = 7;
    EXPECT_FALSE(parse_size(text, &got)) << text;
    EXPECT_EQ(got, 7u) << text;
  }
}

TEST(Durations, AcceptEveryUnitForm) {
  const std::map<std::string, uint64_t> cases = {
      {"800ns", 800},   {"50us", 50000},    {"50µs", 50000},       {"1.5us", 1500},
      {"2ms", 2000000}, {"1s", 1000000000}, {"0.25 s", 250000000}, {"0ms", 0},
  };
  for (const auto& [text, ns] : cases) {
    uint64_t got = 1;
    EXPECT_TRUE(parse_duration(text, &got)) << text;
    EXPECT_EQ(got, ns) << text;
  }
  for (const char* text : {"", "50", "us", "5 minutes", "-1ms", "1e3us", "2h", "1..5ms"}) {
    uint64_t got = 7;
    EXPECT_FALSE(parse_duration(text, &got)) << text;
  }
}

// ---------------------------------------------------------------------------------------------
// Every key
// ---------------------------------------------------------------------------------------------

Policy from_conf(const std::string& conf) {
  PolicyLoad load = load_policy("", conf);
  EXPECT_TRUE(load.ok()) << conf << ": " << (load.errors.empty() ? "" : load.errors[0]);
  return load.policy;
}

TEST(Keys, DefaultsAreTheDocumentedOnes) {
  const Policy p = from_conf("");
  EXPECT_EQ(p.mode, Mode::auto_);
  EXPECT_EQ(p.on_error, OnError::abort);
  EXPECT_EQ(p.min_bytes, 16ull << 20);
  EXPECT_TRUE(p.captured_only);
  EXPECT_EQ(p.device, -1);
  EXPECT_TRUE(p.include.empty());
  EXPECT_TRUE(p.exclude.empty());
  EXPECT_EQ(p.learning_steps, 3);
  EXPECT_EQ(p.prefetch_distance, 2);
  EXPECT_EQ(p.release_lag, 0);
  EXPECT_EQ(p.model, Model::measured);
  EXPECT_EQ(p.remap_latency_ns, 600000u);
  EXPECT_EQ(p.residency_budget, 0u);
  EXPECT_EQ(p.residency_reserve, 0u);
  EXPECT_EQ(p.handshake, Handshake::automatic);
  EXPECT_EQ(p.wait_limit_ns, 60000000000u);
  EXPECT_TRUE(p.guard);
  EXPECT_EQ(p.host_pool_limit, 0u);
  EXPECT_EQ(p.host_pool_numa, -1);
  EXPECT_EQ(p.release_workers, 1);
  EXPECT_EQ(p.remap_workers, 1);
  EXPECT_TRUE(p.serial_driver_calls);
  EXPECT_EQ(p.trace_path, "");
  EXPECT_FALSE(p.trace_overwrite);
  EXPECT_EQ(p.trace_level, "events");
  EXPECT_EQ(p.memory_interval_ns, 0u);
  EXPECT_FALSE(p.launch_times);
  EXPECT_EQ(p.log_level, "warn");
  EXPECT_EQ(p.log_destination, "stderr");
}

TEST(Keys, EverySchemaKeyIsSetFromVaswapConf) {
  const Policy p = from_conf(
      "mode=off,on_error=passthrough,selection.min_bytes=64MiB,selection.captured_only=false,"
      "selection.device=1,selection.include=libtorch*;*forward*,selection.exclude=libnccl*,"
      "schedule.learning_steps=5,schedule.prefetch_distance=3,schedule.release_lag=1,"
      "schedule.model=given,schedule.h2d_gbps=50.5,schedule.d2h_gbps=48,"
      "schedule.remap_latency=250us,residency.budget=8GiB,residency.reserve=1GiB,"
      "residency.handshake=host,residency.wait_limit=5s,"
      "guard=false,host_pool.limit=32GiB,host_pool.numa=1,workers.release=2,workers.remap=3,"
      "workers.serial_driver_calls=false,trace.path=/tmp/t_%p_%r_%h.jsonl,trace.level=verbose,"
      "trace.overwrite=true,trace.memory_interval=50us,trace.launch_times=true,log.level=info,"
      "log.destination=stdout");
  EXPECT_EQ(p.mode, Mode::off);
  EXPECT_EQ(p.on_error, OnError::passthrough);
  EXPECT_EQ(p.min_bytes, 64ull << 20);
  EXPECT_FALSE(p.captured_only);
  EXPECT_EQ(p.device, 1);
  EXPECT_EQ(p.include, (std::vector<std::string>{"libtorch*", "*forward*"}));
  EXPECT_EQ(p.exclude, (std::vector<std::string>{"libnccl*"}));
  EXPECT_EQ(p.learning_steps, 5);
  EXPECT_EQ(p.prefetch_distance, 3);
  EXPECT_EQ(p.release_lag, 1);
  EXPECT_EQ(p.model, Model::given);
  EXPECT_DOUBLE_EQ(p.h2d_gbps, 50.5);
  EXPECT_DOUBLE_EQ(p.d2h_gbps, 48);
  EXPECT_EQ(p.remap_latency_ns, 250000u);
  EXPECT_EQ(p.residency_budget, 8ull << 30);
  EXPECT_EQ(p.residency_reserve, 1ull << 30);
  EXPECT_EQ(p.handshake, Handshake::host);
  EXPECT_EQ(p.wait_limit_ns, 5000000000u);
  EXPECT_FALSE(p.guard);
  EXPECT_EQ(p.host_pool_limit, 32ull << 30);
  EXPECT_EQ(p.host_pool_numa, 1);
  EXPECT_EQ(p.release_workers, 2);
  EXPECT_EQ(p.remap_workers, 3);
  EXPECT_FALSE(p.serial_driver_calls);
  EXPECT_EQ(p.trace_path, "/tmp/t_%p_%r_%h.jsonl");
  EXPECT_EQ(p.trace_level, "verbose");
  EXPECT_TRUE(p.trace_overwrite);
  EXPECT_EQ(p.memory_interval_ns, 50000u);
  EXPECT_TRUE(p.launch_times);
  EXPECT_EQ(p.log_level, "info");
  EXPECT_EQ(p.log_destination, "stdout");
  EXPECT_EQ(from_conf("selection.device=all").device, -1);
  EXPECT_EQ(from_conf("host_pool.numa=none").host_pool_numa, -2);
  EXPECT_FALSE(load_policy("", "mode=rules").ok()) << "rules mode without rules must fail";
}

TEST(Keys, EveryKeyIsReadFromAFileWithListsAndRules) {
  PolicyFile f(R"(mode: rules
selection:
  min_bytes: 2MiB
  include: [libtorch_cuda.so, "*Linear*"]
  exclude:
    - libnccl*
schedule:
  remap_latency: 1ms
rules:
  - offload: capture:2
    after: graph:2
    before: graph:9
  - {offload: capture:3, after: graph:3, before: graph:8}
)");
  PolicyLoad load = load_policy(f.path(), "");
  ASSERT_TRUE(load.ok()) << load.errors[0];
  EXPECT_EQ(load.policy.mode, Mode::rules);
  EXPECT_EQ(load.policy.min_bytes, 2ull << 20);
  EXPECT_EQ(load.policy.include, (std::vector<std::string>{"libtorch_cuda.so", "*Linear*"}));
  EXPECT_EQ(load.policy.exclude, (std::vector<std::string>{"libnccl*"}));
  EXPECT_EQ(load.policy.remap_latency_ns, 1000000u);
  ASSERT_EQ(load.policy.rules.size(), 2u);
  EXPECT_EQ(load.policy.rules[1].offload, "capture:3");
  EXPECT_EQ(load.policy.rules[1].after, "graph:3");
  EXPECT_EQ(load.policy.rules[1].before, "graph:8");
}

// ---------------------------------------------------------------------------------------------
// Precedence
// ---------------------------------------------------------------------------------------------

TEST(Precedence, ConfOverFileOverDefaults) {
  PolicyFile f("selection:\n  min_bytes: 2MiB\n  captured_only: false\nguard: false\n");
  PolicyLoad load = load_policy(f.path(), "selection.min_bytes=8MiB");
  ASSERT_TRUE(load.ok());
  EXPECT_EQ(load.policy.min_bytes, 8ull << 20);  // VASWAP_CONF
  EXPECT_FALSE(load.policy.captured_only);       // the file
  EXPECT_FALSE(load.policy.guard);               // the file
  EXPECT_EQ(load.policy.learning_steps, 3);      // the default
  const std::string text = explain(load);
  EXPECT_NE(text.find("selection.min_bytes: 8MiB  # VASWAP_CONF"), std::string::npos) << text;
  EXPECT_NE(text.find("selection.captured_only: false  # " + f.path() + ":3:18"), std::string::npos)
      << text;
  EXPECT_NE(text.find("schedule.learning_steps: 3  # default"), std::string::npos) << text;
}

TEST(Precedence, ALaterListReplacesTheWholeList) {
  PolicyFile f("selection:\n  exclude: [a*, b*]\n");
  PolicyLoad load = load_policy(f.path(), "selection.exclude=c*");
  ASSERT_TRUE(load.ok());
  EXPECT_EQ(load.policy.exclude, (std::vector<std::string>{"c*"}));
}

TEST(Precedence, AFailedValueKeepsTheEarlierOne) {
  PolicyFile f("selection:\n  min_bytes: 2MiB\n");
  PolicyLoad load = load_policy(f.path(), "selection.min_bytes=lots");
  ASSERT_EQ(load.errors.size(), 1u);
  EXPECT_EQ(load.policy.min_bytes, 2ull << 20);
}

// ---------------------------------------------------------------------------------------------
// Malformed policies: each with its message
// ---------------------------------------------------------------------------------------------

struct Malformed {
  const char* yaml;     // the file's text
  const char* message;  // the expected error, with FILE for the file's path
};

// clang-format off
const Malformed kMalformed[] = {
  {"mode: sometimes\n", "FILE:1:7: mode must be off, auto or rules, got \"sometimes\""},
  {"mod: auto\n", "FILE:1:6: unknown key \"mod\"; did you mean \"mode\"?"},
  {"on_error: ignore\n", "FILE:1:11: on_error must be abort or passthrough, got \"ignore\""},
  {"selection:\n  min_bytes: lots\n", "FILE:2:14: selection.min_bytes must be a size such as 16MiB, 2GB or 4096, got \"lots\""},
  {"selection:\n  min_bytes: 16 MiBs\n", "FILE:2:14: selection.min_bytes must be a size such as 16MiB, 2GB or 4096, got \"16 MiBs\""},
  {"selection:\n  min_bytes: -1\n", "FILE:2:14: selection.min_bytes must be a size such as 16MiB, 2GB or 4096, got \"-1\""},
  {"selection:\n  min_byte: 1MiB\n", "FILE:2:13: unknown key \"selection.min_byte\"; did you mean \"selection.min_bytes\"?"},
  {"selction:\n  min_bytes: 1MiB\n", "FILE:2:14: unknown key \"selction.min_bytes\"; did you mean \"selection.min_bytes\"?"},
  {"selection:\n  captured_only: maybe\n", "FILE:2:18: selection.captured_only must be true or false, got \"maybe\""},
  {"selection:\n  device: gpu0\n", "FILE:2:11: selection.device must be all or a device ordinal >= 0, got \"gpu0\""},
  {"selection:\n  device: -2\n", "FILE:2:11: selection.device must be all or a device ordinal >= 0, got \"-2\""},
  {"selection:\n  include: [\"lib[torch\"]\n", "FILE:2:13: selection.include must be a list of non-empty glob patterns ([ ] balanced), got \"lib[torch\""},
  {"selection:\n  exclude: [\"\"]\n", "FILE:2:13: selection.exclude must be a list of non-empty glob patterns ([ ] balanced), got \"\""},
  {"schedule:\n  learning_steps: 0\n", "FILE:2:19: schedule.learning_steps must be an integer from 1 to 1000, got \"0\""},
  {"schedule:\n  learning_steps: two\n", "FILE:2:19: schedule.learning_steps must be an integer from 1 to 1000, got \"two\""},
  {"schedule:\n  prefetch_distance: 1.5\n", "FILE:2:22: schedule.prefetch_distance must be an integer from 0 to 1000, got \"1.5\""},
  {"schedule:\n  prefech_distance: 2\n", "FILE:2:21: unknown key \"schedule.prefech_distance\"; did you mean \"schedule.prefetch_distance\"?"},
  {"schedule:\n  release_lag: 1001\n", "FILE:2:16: schedule.release_lag must be an integer from 0 to 1000, got \"1001\""},
  {"schedule:\n  model: guessed\n", "FILE:2:10: schedule.model must be measured or given, got \"guessed\""},
  {"schedule:\n  h2d_gbps: 0\n", "FILE:2:13: schedule.h2d_gbps must be a number of GB/s greater than 0 and at most 10000, got \"0\""},
  {"schedule:\n  d2h_gbps: fast\n", "FILE:2:13: schedule.d2h_gbps must be a number of GB/s greater than 0 and at most 10000, got \"fast\""},
  {"schedule:\n  remap_latency: 600\n", "FILE:2:18: schedule.remap_latency must be a duration such as 600us, 2ms or 1s, got \"600\""},
  {"schedule:\n  remap_latency: 5min\n", "FILE:2:18: schedule.remap_latency must be a duration such as 600us, 2ms or 1s, got \"5min\""},
  {"schedule:\n  max_overhead: 3%\n", "FILE:2:17: \"schedule.max_overhead\" was removed in vaswap 0.2: what leaves the device is now what residency.budget requires; remove the key"},
  {"schedule:\n  byte_budget: 1GiB\n", "FILE:2:16: \"schedule.byte_budget\" was removed in vaswap 0.2: set residency.budget to the device memory the slots may hold instead"},
  {"residency:\n  budget: 0\n", "FILE:2:11: residency.budget must be auto or a size such as 40GiB, got \"0\""},
  {"residency:\n  budget: most\n", "FILE:2:11: residency.budget must be auto or a size such as 40GiB, got \"most\""},
  {"residency:\n  reserve: lots\n", "FILE:2:12: residency.reserve must be auto or a size such as 1GiB, got \"lots\""},
  {"residency:\n  handshake: fast\n", "FILE:2:14: residency.handshake must be auto, device or host, got \"fast\""},
  {"residency:\n  wait_limit: 1ms\n", "FILE:2:15: residency.wait_limit must be a duration of at least 100ms, such as 60s, got \"1ms\""},
  {"guard: sometimes\n", "FILE:1:8: guard must be true or false, got \"sometimes\""},
  {"host_pool:\n  limit: 10 GB per rank\n", "FILE:2:10: host_pool.limit must be a size such as 16MiB, 2GB or 4096, got \"10 GB per rank\""},
  {"host_pool:\n  numa: near\n", "FILE:2:9: host_pool.numa must be auto, none or a NUMA node >= 0, got \"near\""},
  {"workers:\n  release: 0\n", "FILE:2:12: workers.release must be an integer from 1 to 8, got \"0\""},
  {"workers:\n  remap: 9\n", "FILE:2:10: workers.remap must be an integer from 1 to 8, got \"9\""},
  {"workers:\n  serial_driver_calls: sometimes\n", "FILE:2:24: workers.serial_driver_calls must be true or false, got \"sometimes\""},
  {"trace:\n  path: /tmp/t_%d.jsonl\n", "FILE:2:9: trace.path must be a file path in which % is followed only by p, r, h or %, got \"/tmp/t_%d.jsonl\""},
  {"trace:\n  overwrite: sometimes\n", "FILE:2:14: trace.overwrite must be true or false, got \"sometimes\""},
  {"trace:\n  memory_interval: 1ns\n", "FILE:2:20: trace.memory_interval must be 0 (off) or a duration of at least 50us, such as 200us, 2ms or 1s, got \"1ns\""},
  {"trace:\n  memory_interval: 49.9us\n", "FILE:2:20: trace.memory_interval must be 0 (off) or a duration of at least 50us, such as 200us, 2ms or 1s, got \"49.9us\""},
  {"trace:\n  level: all\n", "FILE:2:10: trace.level must be off, events or verbose, got \"all\""},
  {"log:\n  level: loud\n", "FILE:2:10: log.level must be trace, debug, info, warn, error or off, got \"loud\""},
  {"log:\n  destination: \"\"\n", "FILE:2:16: log.destination must be stderr, stdout or a file path, got \"\""},
  {"mode: rules\nrules:\n  - offload: layer3\n    after: graph:1\n    before: graph:2\n", "FILE:3:14: rules[0].offload must be a capture selector such as capture:3, got \"layer3\""},
  {"mode: rules\nrules:\n  - offload: capture:1\n    after: graph:0\n    before: graph:2\n", "FILE:4:12: rules[0].after must be a launch selector such as graph:3, got \"graph:0\""},
  {"mode: rules\nrules:\n  - offload: capture:1\n    after: graph:1\n", "FILE:3:14: rules[0] needs offload, after and before (got offload \"capture:1\", after \"graph:1\", before \"\")"},
  {"mode: rules\nrules:\n  - offload: capture:1\n    after: graph:1\n    before: graph:2\n    when: always\n", "FILE:6:11: unknown key \"rules[0].when\"; a rule has offload, after and before"},
  {"mode: rules\n", "FILE: mode is rules, but no rules are given; add a rules list (offload, after, before) or use mode: auto"},
  {"rules:\n  - offload: capture:1\n    after: graph:1\n    before: graph:2\n", "FILE: rules are given, but mode is not rules; set mode: rules"},
  {"schedule:\n  model: given\n  h2d_gbps: 50\n", "FILE: schedule.model is given, so schedule.h2d_gbps and schedule.d2h_gbps must both be set (> 0)"},
  {"just a string\n", "FILE:1:1: a policy is a mapping of keys (mode: auto, selection: ...), got \"just a string\""},
  {"mode: auto\nmode: off\n", "FILE:2:7: mode is given twice"},
  {"mode: [auto\n", "FILE:2:1: end of sequence flow not found"},
  {"mode: &m auto\nguard: true\n", "FILE:1:7: anchor &m: anchors and aliases are not allowed in a vaswap policy; write the value out"},
  {"selection: &s\n  min_bytes: 2MiB\n", "FILE:1:12: anchor &s: anchors and aliases are not allowed in a vaswap policy; write the value out"},
  {"a: [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n", "FILE:1:35: the policy nests deeper than 32 levels; a policy needs three at most"},
  {"? [a, b]\n: c\n", "FILE:1:3: a key must be a plain word such as mode or selection, not a list or a mapping"},
};
// clang-format on

TEST(Malformed, EachCaseGivesItsMessage) {
  ASSERT_GE(sizeof kMalformed / sizeof kMalformed[0], 30u);
  for (const Malformed& m : kMalformed) {
    PolicyFile f(m.yaml);
    PolicyLoad load = load_policy(f.path(), "");
    std::string want = m.message;
    want.replace(want.find("FILE"), 4, f.path());
    ASSERT_FALSE(load.ok()) << m.yaml;
    EXPECT_EQ(load.errors[0], want) << m.yaml;
  }
}

TEST(Malformed, EveryErrorIsReportedNotJustTheFirst) {
  PolicyFile f("mode: sometimes\nguard: maybe\nselection:\n  min_bytes: lots\n");
  EXPECT_EQ(load_policy(f.path(), "").errors.size(), 3u);
}

TEST(Malformed, VaswapConfErrorsNameTheSource) {
  const std::map<std::string, std::string> cases = {
      {"mode=on", "VASWAP_CONF: mode must be off, auto or rules, got \"on\""},
      {"mode",
       "VASWAP_CONF: \"mode\" is not key=value; write for example mode=off or "
       "selection.min_bytes=64MiB"},
      {"min_bytes=1", "VASWAP_CONF: unknown key \"min_bytes\"; see docs/POLICY.md for the keys"},
      {"rules[0].after=graph:1",
       "VASWAP_CONF: rules[0].after: rules can only be given in a policy file (VASWAP_POLICY)"},
  };
  for (const auto& [conf, message] : cases) {
    PolicyLoad load = load_policy("", conf);
    ASSERT_FALSE(load.ok()) << conf;
    EXPECT_EQ(load.errors[0], message);
  }
  PolicyLoad missing = load_policy("/nonexistent/policy.yaml", "");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.errors[0].find("/nonexistent/policy.yaml"), std::string::npos)
      << missing.errors[0];
}

// ---------------------------------------------------------------------------------------------
// docs/POLICY.md lists exactly the schema's keys
// ---------------------------------------------------------------------------------------------

TEST(Docs, PolicyMdListsExactlyTheSchemaKeys) {
  std::ifstream doc(std::string(VASWAP_SOURCE_DIR) + "/docs/POLICY.md");
  ASSERT_TRUE(doc.good());
  std::set<std::string> documented;
  std::string line;
  while (std::getline(doc, line)) {
    if (line.rfind("| `", 0) != 0) continue;
    const size_t end = line.find('`', 3);
    documented.insert(line.substr(3, end - 3));
  }
  std::set<std::string> schema;
  for (const KeyDoc& k : schema_docs()) schema.insert(k.key);
  EXPECT_EQ(documented, schema);
}

// ---------------------------------------------------------------------------------------------
// What the preload reads from the environment
// ---------------------------------------------------------------------------------------------

intercept::Environment read(bool secure, const std::map<std::string, std::string>& vars) {
  return intercept::read_environment(secure, [&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it != vars.end() ? it->second.c_str() : nullptr;
  });
}

TEST(Environment, OnByDefault) {
  const auto e = read(false, {});
  EXPECT_TRUE(e.on);
  EXPECT_TRUE(e.notices.empty());
  EXPECT_TRUE(e.abort_message.empty());
}

TEST(Environment, SecureExecutionIgnoresEverything) {
  const auto e = read(true, {{"VASWAP_CONF", "selection.min_bytes=1"},
                             {"VASWAP_POLICY", "/nonexistent.yaml"},
                             {"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"}});
  EXPECT_FALSE(e.on);
  EXPECT_TRUE(e.notices.empty());
  EXPECT_TRUE(e.abort_message.empty());
  EXPECT_EQ(e.policy.min_bytes, Policy{}.min_bytes);
}

TEST(Environment, MalformedPolicyAbortsByDefault) {
  const auto e = read(false, {{"VASWAP_CONF", "mode=sometimes"}});
  EXPECT_TRUE(e.on) << "on, so that the first hooked call stops the program";
  EXPECT_EQ(e.abort_message,
            "the vaswap policy has 1 error:\n  VASWAP_CONF: mode must be off, auto or rules, got "
            "\"sometimes\"\nvaswap stops the program (on_error: abort). Fix the policy, check it "
            "with `vaswap check-policy FILE`, or set on_error: passthrough.");
}

TEST(Environment, MalformedPolicyWithPassthroughTurnsItOffAndSaysWhy) {
  const auto e = read(false, {{"VASWAP_CONF", "on_error=passthrough,mode=sometimes"}});
  EXPECT_FALSE(e.on);
  EXPECT_TRUE(e.abort_message.empty());
  ASSERT_EQ(e.notices.size(), 1u);
  EXPECT_EQ(e.notices[0],
            "the vaswap policy has 1 error:\n  VASWAP_CONF: mode must be off, auto or rules, got "
            "\"sometimes\"\nvaswap is passing every call through (on_error: passthrough)");
}

TEST(Environment, ExpandableSegmentsIsReportedForEitherVariable) {
  for (const char* name : {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}) {
    const auto e = read(false, {{name, "expandable_segments:True"}});
    EXPECT_TRUE(e.on);
    ASSERT_EQ(e.notices.size(), 1u) << name;
    EXPECT_EQ(e.notices[0].rfind(std::string(name) + " has expandable_segments:True", 0), 0u);
  }
  EXPECT_TRUE(expandable_segments_enabled("max_split_size_mb:128, expandable_segments:true"));
  EXPECT_FALSE(expandable_segments_enabled("expandable_segments:True,expandable_segments:False"));
  EXPECT_FALSE(expandable_segments_enabled("max_split_size_mb:128"));
}

TEST(Environment, OffMeansOff) {
  const auto e = read(false, {{"VASWAP_CONF", "mode=off"}});
  EXPECT_FALSE(e.on);
  EXPECT_TRUE(e.notices.empty());
}

// ---------------------------------------------------------------------------------------------
// Hostile inputs: each answered with a located error in bounded time and memory
// ---------------------------------------------------------------------------------------------

// 1 MiB takes about 0.3 s on an idle machine; the bound leaves room for a loaded CI machine (and
// the sanitizers slow the parser several times over) while still catching quadratic work.
#if defined(__SANITIZE_ADDRESS__)
constexpr double kBoundSeconds = 15.0;
#else
constexpr double kBoundSeconds = 3.0;
#endif

// Runs `body` in a child process that an alarm ends after `seconds`, so that an input that
// explodes (as aliases once did: minutes and gigabytes) fails this test instead of hanging it.
// The child exits 0 when `body` returns true.
template <class Body>
void in_bounded_time(int seconds, Body body) {
  EXPECT_EXIT(
      {
        alarm(static_cast<unsigned>(seconds));
        std::_Exit(body() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

// The "billion laughs": nine levels of nine aliases, 9^9 scalars once expanded, in 342 bytes.
std::string billion_laughs() {
  std::string text =
      "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n";
  for (char name = 'b'; name <= 'i'; ++name) {
    text += std::string(1, name) + ": &" + name + " [";
    for (int i = 0; i < 9; ++i) text += std::string(i ? ",*" : "*") + static_cast<char>(name - 1);
    text += "]\n";
  }
  return text;
}

TEST(Hostile, BillionLaughsIsRefusedAtItsFirstAnchorInBoundedTime) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  PolicyFile f(billion_laughs());
  in_bounded_time(10, [&] {
    const PolicyLoad load = load_policy(f.path(), "");
    return load.errors.size() == 1 &&
           load.errors[0] == f.path() +
                                 ":1:4: anchor &a: anchors and aliases are not allowed in a "
                                 "vaswap policy; write the value out";
  });
}

TEST(Hostile, APolicyOverOneMibIsRefusedWithItsSize) {
  PolicyFile f("# " + std::string(1 << 20, 'x') + "\n");
  const PolicyLoad load = load_policy(f.path(), "");
  ASSERT_EQ(load.errors.size(), 1u);
  EXPECT_EQ(load.errors[0], f.path() +
                                ": the policy is more than 1048576 bytes, over the 1 MiB (1048576 "
                                "bytes) vaswap reads; a policy needs a few hundred bytes: check "
                                "that this is the policy file");
  std::vector<std::string> errors;
  text_values(std::string((1 << 20) + 1, ' '), "big.yaml", &errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].rfind("big.yaml: the policy is 1048577 bytes, over the 1 MiB", 0), 0u)
      << errors[0];
}

TEST(Hostile, OneMibOfKeysIsAnsweredInBoundedTime) {
  std::string text;
  for (int i = 0; text.size() < (1 << 20) - 32; ++i) text += "key" + std::to_string(i) + ": 1\n";
  PolicyFile f(text);
  const auto start = std::chrono::steady_clock::now();
  const PolicyLoad load = load_policy(f.path(), "");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GT(load.errors.size(), 50000u);
  EXPECT_EQ(load.errors[0],
            f.path() + ":1:7: unknown key \"key0\"; see docs/POLICY.md for the keys");
  EXPECT_LT(seconds, kBoundSeconds);
}

TEST(Hostile, AHugeValueIsQuotedByItsStartAndSize) {
  PolicyFile f("mode: " + std::string(500000, 'x') + "\n");
  const PolicyLoad load = load_policy(f.path(), "");
  ASSERT_EQ(load.errors.size(), 1u);
  EXPECT_EQ(load.errors[0], f.path() + ":1:7: mode must be off, auto or rules, got \"" +
                                std::string(100, 'x') + "...\" (500000 bytes)");
}

TEST(Hostile, ALongVaswapConfListThenManyValuesIsLinear) {
  // Each value once copied the whole policy, lists included: 40000 patterns times 80000 values.
  std::string conf = "selection.include=";
  for (int i = 0; i < 40000; ++i) conf += (i ? ";p" : "p") + std::to_string(i);
  while (conf.size() < 1000000) conf += ",guard=true";
  in_bounded_time(10, [&] {
    const PolicyLoad load = load_policy("", conf);
    return load.ok() && load.policy.include.size() == 40000;
  });
  const PolicyLoad big = load_policy("", std::string((1 << 20) + 1, ','));
  ASSERT_EQ(big.errors.size(), 1u);
  EXPECT_EQ(big.errors[0],
            "VASWAP_CONF: 1048577 bytes, over the 1 MiB (1048576 bytes) vaswap reads; put the "
            "settings in a policy file (VASWAP_POLICY)");
}

// ---------------------------------------------------------------------------------------------
// VASWAP_LOG_LEVEL
// ---------------------------------------------------------------------------------------------

TEST(LogLevel, EveryDocumentedNameInAnyCase) {
  const std::map<std::string, spdlog::level::level_enum> cases = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},   {"INFO", spdlog::level::info},
      {"Warn", spdlog::level::warn},   {"error", spdlog::level::err},
      {"off", spdlog::level::off},
  };
  for (const auto& [name, level] : cases) {
    spdlog::level::level_enum got = spdlog::level::critical;
    EXPECT_TRUE(log_level_from_name(name, &got)) << name;
    EXPECT_EQ(got, level) << name;
  }
}

TEST(LogLevel, AnUnknownNameIsAnErrorThatListsTheValidOnes) {
  // spdlog's from_str turns these into off, which silenced every error.
  for (const char* name : {"loud", "warning", "err", "critical", "", "3"}) {
    spdlog::level::level_enum got = spdlog::level::critical;
    EXPECT_FALSE(log_level_from_name(name, &got)) << name;
    EXPECT_EQ(got, spdlog::level::critical) << name;
  }
  EXPECT_EQ(unknown_log_level("loud"),
            "VASWAP_LOG_LEVEL must be trace, debug, info, warn, error or off, got \"loud\"; the "
            "log stays at warn");
}

}  // namespace
}  // namespace vaswap
