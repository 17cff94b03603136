// inside_replay: chooses the windows inside a traced run's rewritten graphs again, offline, from
// their `inside_input` events (docs/TRACE.md), with the in-graph schedule this build has
// (core/plan/graph_windows.cpp).
//
//   inside_replay TRACE [--check] [--target BYTES]
//
// For each `inside_input` it prints what the schedule chooses now (windows, the most the slots
// hold at once, bytes moved each way per launch) and compares it with the run's `graph_rewrite`
// for that graph: "same", or what differs. --check: exit 1 when any differs (the inside test uses
// that to show a trace's inputs are the whole of the choice). --target: choose for that many
// bytes held at once instead of the run's target (0: every window), to see what another budget
// would cost a graph, such as a whole-iteration graph traced once on a GPU.
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "plan/graph_windows.h"
#include "replay_fields.h"

namespace {

namespace windows = vaswap::windows;
using vaswap::replay::numbers;
using vaswap::replay::split;

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "inside_replay: %s\n", message.c_str());
  std::exit(2);
}

struct Input {
  uint64_t line = 0;
  std::string graph;
  size_t positions = 0;
  windows::Settings settings;
  std::vector<windows::Candidate> candidates;
  // The run's rewrite of that graph, when one followed: windows, held at once, moved.
  std::optional<uint64_t> windows, peak, moved;
};

Input read_input(const YAML::Node& e, uint64_t line) {
  Input in;
  in.line = line;
  in.graph = e["graph"].as<std::string>();
  in.positions = e["positions"].as<size_t>();
  in.settings.lead = e["lead"].as<size_t>();
  in.settings.min_gap = e["min_gap"].as<size_t>();
  in.settings.lag = e["lag"].as<size_t>();
  in.settings.target = e["target"].as<uint64_t>();
  const std::vector<uint64_t> bytes = numbers<uint64_t>(e["slot_bytes"].as<std::string>());
  const std::vector<std::string> uses = split(e["uses"].as<std::string>(), ';');
  if (bytes.size() != uses.size()) {
    die("line " + std::to_string(line) + ": the inside_input's slot_bytes and uses do not agree");
  }
  for (size_t i = 0; i < bytes.size(); ++i) {
    windows::Candidate c;
    c.bytes = bytes[i];
    c.uses = numbers<size_t>(uses[i]);
    for (size_t u : c.uses) {
      if (u >= in.positions) die("line " + std::to_string(line) + ": a use past the positions");
    }
    if (c.uses.empty()) die("line " + std::to_string(line) + ": a candidate without uses");
    in.candidates.push_back(std::move(c));
  }
  return in;
}

uint64_t mib(uint64_t bytes) { return bytes >> 20; }

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  bool check = false;
  std::optional<uint64_t> target;
  const char* usage = "usage: inside_replay TRACE [--check] [--target BYTES]";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--check") {
      check = true;
    } else if (arg == "--target" && i + 1 < argc) {
      try {
        target = std::stoull(argv[++i]);
      } catch (const std::exception&) {
        die(std::string("--target needs a whole number of bytes, got '") + argv[i] + "'");
      }
    } else if (arg == "-h" || arg == "--help") {
      std::printf(
          "%s\n"
          "Chooses the windows of each rewritten graph in a vaswap trace again from its\n"
          "inside_input events and compares them with the run's graph_rewrite; --check: exit 1\n"
          "when one differs; --target: choose for that many bytes held at once instead.\n",
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

  std::vector<Input> inputs;
  std::string text;
  uint64_t line = 0;
  while (std::getline(file, text)) {
    ++line;
    const bool input = text.find("\"ev\":\"inside_input\"") != std::string::npos;
    if (!input && text.find("\"ev\":\"graph_rewrite\"") == std::string::npos) continue;
    YAML::Node e;
    try {
      e = YAML::Load(text);
    } catch (const YAML::Exception& error) {
      die(path + ":" + std::to_string(line) + ": not an event: " + error.what());
    }
    if (input) {
      inputs.push_back(read_input(e, line));
      continue;
    }
    // The rewrite that followed the latest input for that graph.
    for (auto it = inputs.rbegin(); it != inputs.rend(); ++it) {
      if (it->graph == e["graph"].as<std::string>() && !it->windows) {
        it->windows = e["windows"].as<uint64_t>();
        it->peak = e["held_peak"].as<uint64_t>();
        it->moved = e["moved_bytes"].as<uint64_t>();
        break;
      }
    }
  }
  if (inputs.empty())
    die(path + " has no inside_input event (a trace of a rewritten graph is needed)");

  int differ = 0;
  for (Input& in : inputs) {
    windows::Settings s = in.settings;
    if (target) s.target = *target;
    const windows::Choice c = windows::choose(in.candidates, in.positions, s);
    std::printf(
        "inside_input (line %llu), graph %s: %zu positions, %zu slots, %llu MiB; lead %zu, "
        "min_gap %zu, lag %zu, target %llu MiB%s\n",
        static_cast<unsigned long long>(in.line), in.graph.c_str(), in.positions,
        in.candidates.size(), static_cast<unsigned long long>(mib(c.total_bytes)), s.lead,
        s.min_gap, s.lag, static_cast<unsigned long long>(mib(s.target)), target ? " (given)" : "");
    std::printf(
        "  chosen now: %zu windows, at most %llu MiB held at once, %llu MiB moved each way\n",
        c.windows.size(), static_cast<unsigned long long>(mib(c.peak_bytes)),
        static_cast<unsigned long long>(mib(c.moved_bytes)));
    if (!in.windows) {
      std::printf("  the run: no graph_rewrite follows (instantiated as captured)\n");
      continue;
    }
    const bool same =
        *in.windows == c.windows.size() && *in.peak == c.peak_bytes && *in.moved == c.moved_bytes;
    std::printf("  the run: %llu windows, at most %llu MiB held at once, %llu MiB moved: %s\n",
                static_cast<unsigned long long>(*in.windows),
                static_cast<unsigned long long>(mib(*in.peak)),
                static_cast<unsigned long long>(mib(*in.moved)), same ? "same" : "differs");
    if (!same) ++differ;
  }
  return check && differ > 0 ? 1 : 0;
}
