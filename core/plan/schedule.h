// The plan: which regions to offload in which windows of a learned period (DESIGN.md section 5).
//
// Pure computation, no CUDA: the planner (planner.h) measures a period of graph launches and
// which regions each position uses, and this file decides. Position i is the launch of the i-th
// graph of the period together with the eager work that follows it before the next graph launch;
// a region used there must be resident before that graph is launched.
//
// For each region and each window between two consecutive uses u and v, the release is issued
// just before the launch u + 1 + release_lag and its D2H follows the work before it; the restore
// is issued just before the launch v - prefetch_distance, earlier when the positions in between
// are shorter than what it waits for (the release that makes its room, its D2H and unmap; its
// own map and its own copy), and earlier still while its copy, behind those already on the link,
// would land after v begins. The stream waits for it before the launch v. Copies are placed on
// links that carry one copy at a time in each direction, with the measured times of the
// positions in between.
//
// What must leave is what the residency budget says: a period whose slots fit takes no window.
// Otherwise windows are taken, those the link hides first and the most pages away for the
// longest first among them, until at every position the pages of the slots not away fit the
// budget. The windows taken are replayed together in time (a restore maps only once the releases
// before it have made room within the budget, and its copy queues on the link), three ways of
// taking them are compared by what the replay shows, and the plan's exposed time is the replay's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vaswap::plan {

// The copy and remap model: bandwidths in GB/s (1e9 bytes per second), the map-and-unmap cost of
// one region in microseconds, and where the numbers came from ("measured" or "given").
// `remap_us` is the copy test's (a map on an idle device, the best of three) or the policy's; the
// schedule allows a margin on it. `remap_seen_us` is what this run's own maps and unmaps have
// cost (DeviceCosts, a high quantile; 0: too few seen): beside the run's copies they are slower,
// and where that exceeds the margin it is what the schedule allows. The `_seen_gbps` figures are
// the run's own copies' (a high quantile; 0: too few seen): the planner takes the link's speed
// as the larger of them and the copy test's, and the schedule reads only h2d_gbps and d2h_gbps.
struct Model {
  double h2d_gbps = 0;
  double d2h_gbps = 0;
  double remap_us = 0;
  std::string source;
  double remap_seen_us = 0;
  double h2d_seen_gbps = 0, d2h_seen_gbps = 0;

  double h2d_us(uint64_t bytes) const { return static_cast<double>(bytes) / (h2d_gbps * 1e3); }
  double d2h_us(uint64_t bytes) const { return static_cast<double>(bytes) / (d2h_gbps * 1e3); }
};

struct Knobs {
  int prefetch_distance = 1;
  int release_lag = 0;
  uint64_t budget_pages = 0;  // device memory the period's slots may hold at once; 0: no limit
  // When the period's slots all fit this much (residency's limit, at least budget_pages), nothing
  // leaves; past it, the windows bring every position within budget_pages (residency's target).
  uint64_t limit_pages = 0;
};

// One learned period.
struct Period {
  // Per position, on the device's clock, in microseconds from the start of position 0: when the
  // graph began and when it ended. `length_us` is from position 0 to position 0 of the next period.
  std::vector<double> start_us, end_us;
  double length_us = 0;
  // Per position, the regions it uses (indices into `region_bytes`).
  std::vector<std::vector<int>> uses;
  std::vector<uint64_t> region_bytes;  // the bytes a region's copies move
  // The device memory a region's release gives back (its pages, whole granules); empty: the bytes.
  std::vector<uint64_t> region_pages;
};

struct Window {
  int region = 0;
  int last_use = 0, next_use = 0;      // positions, 0..P-1
  int release_at = 0, restore_at = 0;  // positions where the actions are issued, 0..P-1
  double gap_us = 0;                   // from the release point to the next use
  double d2h_us = 0, h2d_us = 0;       // the model's copy times, link waits included
  double freed_us = 0;                 // how long the pages are away
  double exposed_us = 0;               // restore time the window cannot hide
  // Kept though every position it keeps away would be within the budget without it: its release
  // is the room another window's restore maps into, which without it would wait and show more.
  bool for_room = false;
};

struct Plan {
  std::vector<Window> windows;  // by region, then position
  uint64_t peak_bytes = 0;      // most device memory away at once (pages), in the model
  uint64_t moved_bytes = 0;     // copied each way per period: every window's region, once
  uint64_t total_pages = 0;     // the pages of every region the period uses
  uint64_t resident_peak = 0;   // most pages resident at a position, with the windows taken
  uint64_t short_pages = 0;     // at the worst position, how far over the budget that still is
  double exposed_us = 0;        // sum of the windows' exposed time
  uint64_t candidates = 0;      // windows considered
  std::string reason;           // why nothing was taken, or why the budget is not met
};

// Whether every page the period uses fits the budget, so that nothing has to leave: the plan then
// takes no window whatever the model, and the copy test need not run.
bool fits(const Period& period, const Knobs& knobs);

Plan choose(const Period& period, const Model& model, const Knobs& knobs);

// The order in which the restores a plan issues at one position go to residency, as choose()'s
// replay assumes: the nearest next use first, then the smaller copy, then as given. Residency
// maps them in this order as the releases give room, so a restore needed later no longer takes
// the room of one needed sooner. `region_bytes` is indexed by Window::region; `period` is the
// number of positions. Returns indices into `windows`, sorted by restore_at and then this order.
std::vector<size_t> restore_order(const std::vector<Window>& windows, int period,
                                  const std::vector<uint64_t>& region_bytes);

// The smallest period P such that the last `repeats` periods were the same, and one key more has
// begun the next one: the last repeats * P + 1 keys repeat with period P. 0 when there is none.
template <class Key>
int find_period(const std::vector<Key>& keys, int repeats) {
  const int n = static_cast<int>(keys.size());
  for (int p = 1; static_cast<int64_t>(p) * repeats + 1 <= n; ++p) {
    bool periodic = true;
    for (int j = 0; j < p * (repeats - 1) + 1 && periodic; ++j) {
      periodic = keys[static_cast<size_t>(n - 1 - j)] == keys[static_cast<size_t>(n - 1 - j - p)];
    }
    if (periodic) return p;
  }
  return 0;
}

}  // namespace vaswap::plan
