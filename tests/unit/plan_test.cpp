// The plan (core/plan.h): which windows of a learned period are offloaded, and where.
#include "plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace vaswap::plan {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

// `positions` launches of `each_us` each, back to back; uses[i] lists the regions position i uses.
Period evenly(int positions, double each_us, std::vector<std::vector<int>> uses,
              std::vector<uint64_t> bytes) {
  Period p;
  for (int i = 0; i < positions; ++i) {
    p.start_us.push_back(i * each_us);
    p.end_us.push_back((i + 1) * each_us);
  }
  p.length_us = positions * each_us;
  p.uses = std::move(uses);
  p.region_bytes = std::move(bytes);
  return p;
}

Model link(double gbps, double remap_us) { return {gbps, gbps, remap_us, "given"}; }

TEST(FindPeriod, NeedsTheRepeatsAndOneMoreLaunch) {
  const std::vector<int> two_steps = {1, 2, 3, 1, 2, 3};
  EXPECT_EQ(find_period(two_steps, 2), 0);  // the third step has not begun
  const std::vector<int> begun = {1, 2, 3, 1, 2, 3, 1};
  EXPECT_EQ(find_period(begun, 2), 3);
  EXPECT_EQ(find_period(begun, 3), 0);
}

TEST(FindPeriod, IgnoresAWarmUpBeforeTheRepeats) {
  const std::vector<int> keys = {9, 9, 7, 1, 2, 1, 2, 1, 2, 1};
  EXPECT_EQ(find_period(keys, 3), 2);
}

TEST(FindPeriod, AnEvaluationStepBreaksTheRepeat) {
  const std::vector<int> keys = {1, 2, 3, 4, 1, 2, 1, 2, 3, 4, 1};
  EXPECT_EQ(find_period(keys, 2), 0);
}

// Forward 0..3, backward 4..7: region r is used at r and at 7 - r, 10 ms per position, 64 MiB
// each, a 50 GB/s link: the long windows (regions 0 and 1) are taken.
TEST(Choose, TakesTheWindowsTheLinkCanHide) {
  const Period p = evenly(8, 10000, {{0}, {1}, {2}, {3}, {3}, {2}, {1}, {0}},
                          {64 * kMiB, 64 * kMiB, 64 * kMiB, 64 * kMiB});
  const Plan plan = choose(p, link(50, 100), Knobs{});
  ASSERT_FALSE(plan.windows.empty()) << plan.reason;
  bool region0 = false;
  for (const Window& w : plan.windows) {
    if (w.region == 0 && w.last_use == 0) {
      region0 = true;
      EXPECT_EQ(w.next_use, 7);
      EXPECT_EQ(w.release_at, 1);           // one launch after the last use
      EXPECT_GE(w.restore_at, 1);           // not before the release
      EXPECT_LE(w.restore_at, 6);           // at least one launch ahead of the next use
      EXPECT_DOUBLE_EQ(w.exposed_us, 0.0);  // 1.3 ms of copies in 60 ms
    }
    EXPECT_GT(w.freed_us, 0.0);
  }
  EXPECT_TRUE(region0);
  EXPECT_DOUBLE_EQ(plan.exposed_us, 0.0);
  EXPECT_GE(plan.peak_bytes, 64 * kMiB);
}

TEST(Choose, TakesNothingWhenTheWindowsAreTooShort) {
  const Period p = evenly(8, 100, {{0}, {1}, {2}, {3}, {3}, {2}, {1}, {0}},
                          {64 * kMiB, 64 * kMiB, 64 * kMiB, 64 * kMiB});
  Knobs knobs;
  knobs.max_overhead_percent = 0;
  const Plan plan = choose(p, link(50, 100), knobs);  // 1.3 ms each way against 0.8 ms
  EXPECT_TRUE(plan.windows.empty());
  EXPECT_EQ(plan.peak_bytes, 0u);
  EXPECT_NE(plan.reason.find("no window can hide"), std::string::npos) << plan.reason;
}

TEST(Choose, AdjacentUsesLeaveNoWindow) {
  // Used at 0 and 1 of a 2-launch period: a release at 1 + lag cannot precede a restore ahead of 1.
  const Period p = evenly(2, 100000, {{0}, {0}}, {64 * kMiB});
  const Plan plan = choose(p, link(50, 100), Knobs{});
  EXPECT_TRUE(plan.windows.empty());
}

TEST(Choose, RespectsTheByteBudget) {
  const Period p = evenly(8, 10000, {{0, 1, 2}, {}, {}, {}, {}, {}, {}, {0, 1, 2}},
                          {64 * kMiB, 64 * kMiB, 64 * kMiB});
  Knobs knobs;
  knobs.byte_budget = 128 * kMiB;
  const Plan plan = choose(p, link(50, 100), knobs);
  EXPECT_LE(plan.peak_bytes, 128 * kMiB);
  EXPECT_FALSE(plan.windows.empty());
  const Plan unlimited = choose(p, link(50, 100), Knobs{});
  EXPECT_GT(unlimited.peak_bytes, 128 * kMiB);
  knobs.byte_budget = 1;  // observe only: nothing fits
  const Plan none = choose(p, link(50, 100), knobs);
  EXPECT_TRUE(none.windows.empty());
  EXPECT_NE(none.reason.find("schedule.byte_budget"), std::string::npos) << none.reason;
}

TEST(Choose, MaxOverheadAdmitsSomeExposure) {
  // 64 MiB at 5 GB/s: 13.4 ms each way, used at 0 and 3 of eight 8 ms positions: neither the
  // 24 ms window nor the 40 ms one hides a D2H, a remap and an H2D.
  const Period p = evenly(8, 8000, {{0}, {}, {}, {0}, {}, {}, {}, {}}, {64 * kMiB});
  Knobs strict;
  strict.max_overhead_percent = 0;
  EXPECT_TRUE(choose(p, link(5, 100), strict).windows.empty());
  Knobs loose;
  loose.max_overhead_percent = 100;
  const Plan plan = choose(p, link(5, 100), loose);
  ASSERT_EQ(plan.windows.size(), 2u);  // 0 -> 3 and 3 -> 0 of the next period
  EXPECT_GT(plan.exposed_us, 0.0);
}

TEST(Choose, ReleaseLagAndPrefetchDistanceMoveTheActions) {
  const Period p = evenly(10, 10000, {{0}, {}, {}, {}, {}, {}, {}, {}, {}, {0}}, {8 * kMiB});
  Knobs knobs;
  knobs.release_lag = 2;
  knobs.prefetch_distance = 3;
  const Plan plan = choose(p, link(50, 100), knobs);
  ASSERT_FALSE(plan.windows.empty());
  const Window& w = plan.windows.front();
  EXPECT_EQ(w.last_use, 0);
  EXPECT_EQ(w.release_at, 3);
  EXPECT_EQ(w.restore_at, 6);
}

TEST(Choose, UnusedRegionsAreNeverOffloaded) {
  const Period p = evenly(4, 10000, {{0}, {}, {}, {}}, {8 * kMiB, 8 * kMiB});
  const Plan plan = choose(p, link(50, 100), Knobs{});
  for (const Window& w : plan.windows) EXPECT_EQ(w.region, 0);
}

}  // namespace
}  // namespace vaswap::plan
