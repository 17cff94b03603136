// plan_replay: chooses a traced run's plans again, offline, from their `plan_input` events
// (docs/TRACE.md), with the schedule this build has (core/plan/schedule.cpp).
//
//   plan_replay TRACE [--check] [--remap-seen US] [--budget SIZE]
//
// For each `plan_input` it prints the plan the schedule chooses now: windows, bytes moved each way
// per period, pages away at the worst position, what the replay says shows. It compares that with
// the run's own `plan` and `plan_window` events (slot, last use, next use, release and restore
// points) and prints "same" or what differs. With --check it exits 1 when any plan differs: the
// planner test uses that to show a trace's inputs are the whole of the choice. Without it, a
// schedule changed since the run shows what the change would have chosen for that run.
// --remap-seen US chooses as if the run's own maps and unmaps had cost US per region (the model's
// remap_seen_us; traces made before it was traced have none). --budget SIZE (bytes, or with KiB,
// MiB or GiB) chooses for that budget instead of the run's (its limit too): what another budget
// would have moved and shown for the same learned period.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "plan/schedule.h"
#include "replay_fields.h"

namespace {

using vaswap::plan::Knobs;
using vaswap::plan::Model;
using vaswap::plan::Period;
using vaswap::plan::Plan;
using vaswap::plan::Window;

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "plan_replay: %s\n", message.c_str());
  std::exit(2);
}

using vaswap::replay::numbers;
using vaswap::replay::split;

// One window as the trace names it: slot id, last use, next use, release point, restore point.
using Key = std::tuple<uint64_t, int, int, int, int>;

struct Input {
  uint64_t line = 0;
  int device = 0;
  Period period;
  Model model;
  Knobs knobs;
  std::vector<uint64_t> slots;  // region -> slot id
};

Input read_input(const YAML::Node& e, uint64_t line) {
  Input in;
  in.line = line;
  in.device = e["device"].as<int>();
  Period& p = in.period;
  p.length_us = YAML::Node(e["period_us"].as<std::string>()).as<double>();
  p.start_us = numbers<double>(e["start_us"].as<std::string>());
  p.end_us = numbers<double>(e["end_us"].as<std::string>());
  p.region_bytes = numbers<uint64_t>(e["region_bytes"].as<std::string>());
  p.region_pages = numbers<uint64_t>(e["region_pages"].as<std::string>());
  for (const std::string& at : split(e["uses"].as<std::string>(), ';')) {
    p.uses.push_back(numbers<int>(at));
  }
  if (p.uses.empty()) p.uses.resize(p.start_us.size());  // one position that uses nothing
  in.slots = numbers<uint64_t>(e["slots"].as<std::string>());
  const std::vector<double> model = numbers<double>(e["model"].as<std::string>());
  // Three figures before the run's own remap cost was traced (then 0: none seen).
  if (model.size() != 3 && model.size() != 4) {
    die("line " + std::to_string(line) + ": `model` is not three or four figures");
  }
  in.model = Model{model[0], model[1], model[2], "traced", model.size() == 4 ? model[3] : 0.0};
  in.knobs.budget_pages = e["budget"].as<uint64_t>();
  in.knobs.limit_pages = e["limit"].as<uint64_t>();
  in.knobs.prefetch_distance = e["prefetch_distance"].as<int>();
  in.knobs.release_lag = e["release_lag"].as<int>();
  if (p.start_us.size() != p.end_us.size() || p.start_us.size() != p.uses.size() ||
      p.region_bytes.size() != in.slots.size() ||
      (!p.region_pages.empty() && p.region_pages.size() != p.region_bytes.size())) {
    die("line " + std::to_string(line) + ": the plan_input's lists do not agree in length");
  }
  return in;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  bool check = false;
  std::optional<double> remap_seen_us;
  std::optional<uint64_t> budget;
  const char* usage = "usage: plan_replay TRACE [--check] [--remap-seen US] [--budget SIZE]";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--check") {
      check = true;
    } else if (arg == "--remap-seen" && i + 1 < argc) {
      char* end = nullptr;
      remap_seen_us = std::strtod(argv[++i], &end);
      if (end == argv[i] || *end != '\0' || *remap_seen_us < 0) {
        die(std::string("--remap-seen takes microseconds >= 0, got '") + argv[i] + "'");
      }
    } else if (arg == "--budget" && i + 1 < argc) {
      char* end = nullptr;
      const double value = std::strtod(argv[++i], &end);
      const std::string unit = end != nullptr ? end : "";
      const double scale = unit.empty()    ? 1.0
                           : unit == "KiB" ? 1024.0
                           : unit == "MiB" ? 1024.0 * 1024
                           : unit == "GiB" ? 1024.0 * 1024 * 1024
                                           : 0.0;
      if (end == argv[i] || scale == 0 || value <= 0) {
        die(std::string("--budget takes a size such as 1536MiB or 2GiB, got '") + argv[i] + "'");
      }
      budget = static_cast<uint64_t>(value * scale);
    } else if (arg == "-h" || arg == "--help") {
      std::printf(
          "%s\n"
          "Chooses each plan of a vaswap trace again from its plan_input events and compares\n"
          "it with the run's plan_window events; --check: exit 1 when one differs;\n"
          "--remap-seen: choose as if the run's maps and unmaps had cost US per region;\n"
          "--budget: choose for that budget (and limit) instead of the run's.\n",
          usage);
      return 0;
    } else if (path.empty()) {
      path = arg;
    } else {
      die("unexpected argument '" + arg + "' (" + usage + ")");
    }
  }
  if (path.empty()) die(usage);
  std::ifstream file(path);
  if (!file) die("cannot open " + path);

  // The trace in file order: each plan_input, then its plan (same device) and plan_windows.
  std::vector<Input> inputs;
  std::map<uint64_t, std::vector<Key>> traced;  // plan number -> its windows
  // Per input, the run's plan made from it: the next plan event of its device. A plan dropped
  // because learning began again leaves its inputs without one; the next inputs then match.
  std::vector<int64_t> plan_of;
  std::map<int, size_t> pending;  // device -> its latest input not yet matched
  std::string text;
  uint64_t line = 0;
  while (std::getline(file, text)) {
    ++line;
    if (text.find("\"ev\":\"plan") == std::string::npos) continue;
    YAML::Node e;
    try {
      e = YAML::Load(text);
    } catch (const YAML::Exception& error) {
      die(path + ":" + std::to_string(line) + ": not an event: " + error.what());
    }
    const std::string ev = e["ev"].as<std::string>();
    if (ev == "plan_input") {
      inputs.push_back(read_input(e, line));
      plan_of.push_back(-1);
      pending[inputs.back().device] = inputs.size() - 1;
    } else if (ev == "plan" && e["device"]) {
      const auto it = pending.find(e["device"].as<int>());
      if (it != pending.end()) {
        plan_of[it->second] = e["plan"].as<int64_t>();
        pending.erase(it);
      }
    } else if (ev == "plan_window") {
      traced[e["plan"].as<uint64_t>()].emplace_back(
          e["slot"].as<uint64_t>(), e["last_use"].as<int>(), e["next_use"].as<int>(),
          e["release_at"].as<int>(), e["restore_at"].as<int>());
    }
  }
  if (inputs.empty()) die(path + " has no plan_input event (a trace of a planned run is needed)");

  int differ = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Input& in = inputs[i];
    if (remap_seen_us) in.model.remap_seen_us = *remap_seen_us;
    if (budget) in.knobs.budget_pages = in.knobs.limit_pages = *budget;
    const Plan plan = vaswap::plan::choose(in.period, in.model, in.knobs);
    uint64_t moved = 0;
    std::vector<Key> mine;
    for (const Window& w : plan.windows) {
      moved += in.period.region_bytes[static_cast<size_t>(w.region)];
      mine.emplace_back(in.slots[static_cast<size_t>(w.region)], w.last_use, w.next_use,
                        w.release_at, w.restore_at);
    }
    std::printf("plan_input (line %llu), device %d: %zu positions, %zu regions, budget %llu MiB\n",
                static_cast<unsigned long long>(in.line), in.device, in.period.start_us.size(),
                in.period.region_bytes.size(),
                static_cast<unsigned long long>(in.knobs.budget_pages >> 20));
    std::printf(
        "  chosen now: %zu windows, %llu MiB each way per period, %llu MiB resident at "
        "the worst position, %.1f us shown%s%s\n",
        plan.windows.size(), static_cast<unsigned long long>(moved >> 20),
        static_cast<unsigned long long>(plan.resident_peak >> 20), plan.exposed_us,
        plan.reason.empty() ? "" : "; ", plan.reason.c_str());
    if (plan_of[i] < 0) {
      std::printf(
          "  the run: no plan event follows (learning began again, or the program ended)\n");
      continue;
    }
    const uint64_t run = static_cast<uint64_t>(plan_of[i]);
    std::vector<Key> theirs;
    for (const Key& k : traced[run]) {
      for (uint64_t slot : in.slots) {
        if (std::get<0>(k) == slot) theirs.push_back(k);
      }
    }
    std::sort(mine.begin(), mine.end());
    std::sort(theirs.begin(), theirs.end());
    if (mine == theirs) {
      std::printf("  the run (plan %llu): same %zu windows\n", static_cast<unsigned long long>(run),
                  theirs.size());
      continue;
    }
    ++differ;
    std::printf("  the run (plan %llu): %zu windows; differs:\n",
                static_cast<unsigned long long>(run), theirs.size());
    const auto show = [](const char* which, const Key& k) {
      std::printf("    %s slot %llu: last use %d, next use %d, released at %d, restored at %d\n",
                  which, static_cast<unsigned long long>(std::get<0>(k)), std::get<1>(k),
                  std::get<2>(k), std::get<3>(k), std::get<4>(k));
    };
    for (const Key& k : theirs) {
      if (!std::binary_search(mine.begin(), mine.end(), k)) show("run only:", k);
    }
    for (const Key& k : mine) {
      if (!std::binary_search(theirs.begin(), theirs.end(), k)) show("now only:", k);
    }
  }
  return check && differ > 0 ? 1 : 0;
}
