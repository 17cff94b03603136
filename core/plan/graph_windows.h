// The in-graph schedule: which gaps between a slot's uses inside one graph launch it spends off
// the device (DESIGN.md section 5, "Inside one graph"). Pure: it plans over positions (a graph's
// top-level nodes in a topological order, core/observe/graph_scan.h) and makes no driver call; the
// rewritten graph (core/transform/graph_rewrite.h) and the executor (core/plan/inside.h) carry
// the choice out.
//
// A window is a gap between two uses of one slot. Its release follows the uses before the gap (a
// D2H node, then a flag the host unmaps on); its restore is mapped once the launch passes the
// trigger, `lead` positions ahead of the next use (a flag the host maps on, then a wait node and
// an H2D node before the uses after the gap). The wrap window runs from a slot's last use in a
// launch to its first use in the next, so that a slot used late in the graph is not held from
// the start of the launch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace vaswap::windows {

struct Candidate {
  uint64_t bytes = 0;
  std::vector<size_t> uses;  // positions of the nodes that reference it, ascending, not empty
};

struct Settings {
  size_t lead = 8;     // positions between a restore's trigger and the use it restores for
  size_t min_gap = 4;  // positions a window keeps the slot away, at least
  // Positions a release takes to give its pages back (its D2H, then the unmap): the schedule
  // counts the slot held through that many positions after its last use, and a restore counts
  // only on the room of releases at least that far before its trigger (the graph's trigger then
  // follows just those releases, so it never waits for a copy that has only just begun).
  size_t lag = 0;
  // The candidates' bytes held at once that the choice aims at: windows are added, each the
  // largest that covers the current peak, until the peak is at most this. 0: every window.
  uint64_t target = 0;
};

struct Window {
  size_t candidate = 0;       // index into the candidates
  bool wrap = false;          // from the last use in one launch to the first use in the next
  size_t release_after = 0;   // the last use before the gap
  size_t restore_before = 0;  // the first use after the gap
  // The position after which the restore's pages are mapped; none: when the launch begins
  // (a wrap window whose next use is within `lead` of the start).
  bool trigger_at_start = false;
  size_t trigger = 0;
  // The uses the release's D2H follows (since the slot's previous restore, or the first use),
  // and the uses that wait for the restore's H2D (until its next release, or the last use).
  std::vector<size_t> before, after;
};

struct Choice {
  std::vector<Window> windows;  // by candidate; each candidate's wrap window first
  uint64_t total_bytes = 0;     // the candidates' bytes (what the graph holds without windows)
  uint64_t peak_bytes = 0;      // the most the candidates hold at once with the windows chosen
  uint64_t moved_bytes = 0;     // copied each way per launch
  size_t lag = 0;               // the settings' lag: a release's room counts from that far on
};

// Whether the restore of window `w` counts on the room of window `r`'s release: `r` gives its
// pages back `lag` positions after its last use, before `w`'s trigger (in the same launch).
bool counts_on(const Window& w, const Window& r, size_t lag);

// The windows of `candidates` over `positions` positions (every use < positions).
Choice choose(const std::vector<Candidate>& candidates, size_t positions, const Settings& settings);

}  // namespace vaswap::windows
