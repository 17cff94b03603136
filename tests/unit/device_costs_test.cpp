// What the engine's maps, unmaps and copies cost (core/slots/device_costs.h), as the planner's
// model reads it.
#include "slots/device_costs.h"

#include <gtest/gtest.h>

namespace vaswap {
namespace {

TEST(DeviceCosts, NoFigureUntilEnoughOfBothKindsWereSeen) {
  DeviceCosts costs;
  for (size_t i = 0; i + 1 < DeviceCosts::kEnough; ++i) {
    costs.mapped(0, 100);
    costs.unmapped(0, 50);
  }
  EXPECT_EQ(costs.remap_us(0, 0.9), 0.0);
  costs.mapped(0, 100);
  EXPECT_EQ(costs.remap_us(0, 0.9), 0.0);  // one unmap short
  costs.unmapped(0, 50);
  EXPECT_DOUBLE_EQ(costs.remap_us(0, 0.9), 150.0);
}

TEST(DeviceCosts, TheQuantileOfMapsPlusThatOfUnmaps) {
  DeviceCosts costs;
  // Maps of 1..100 us, unmaps of 10..1000 us (in steps of 10), in shuffled-ish order.
  for (int i = 0; i < 100; ++i) {
    const int k = (i * 37) % 100 + 1;
    costs.mapped(0, k);
    costs.unmapped(0, 10.0 * k);
  }
  EXPECT_DOUBLE_EQ(costs.remap_us(0, 0.9), 90.0 + 900.0);  // the 90th of 100, nearest rank
  EXPECT_DOUBLE_EQ(costs.remap_us(0, 0.5), 50.0 + 500.0);
  EXPECT_DOUBLE_EQ(costs.remap_us(0, 1.0), 100.0 + 1000.0);
  EXPECT_DOUBLE_EQ(costs.remap_us(0, 0.0), 1.0 + 10.0);
}

TEST(DeviceCosts, OnlyTheLatestSamplesCount) {
  DeviceCosts costs;
  for (size_t i = 0; i < DeviceCosts::kSamples; ++i) {
    costs.mapped(0, 5000);  // a slow start (a busy device), since forgotten
    costs.unmapped(0, 5000);
  }
  for (size_t i = 0; i < DeviceCosts::kSamples; ++i) {
    costs.mapped(0, 200);
    costs.unmapped(0, 60);
  }
  EXPECT_DOUBLE_EQ(costs.remap_us(0, 0.9), 260.0);
}

TEST(DeviceCosts, StallsAreLeftOutOfTheRemapFigure) {
  DeviceCosts costs;
  // As the static demo's learning saw them under a budget: maps of 130 us, a tenth of them 900 us
  // (beside a D2H); 110 unmaps of 50 us and 18 stalls of 10-27 ms.
  for (int i = 0; i < 128; ++i) {
    costs.mapped(0, i % 10 == 0 ? 900 : 130);
    costs.unmapped(0, i < 18 ? 10000.0 + 1000.0 * i : 50);
  }
  // Maps: 13 of 900 us, all kept (below 20 x 130); their 90th (the 116th of 128) is 900. Unmaps:
  // the stalls are above 20 x 50 us and left out, so the 90th of the other 110 is 50 (with them
  // it would be the sixth stall, 15 ms).
  EXPECT_DOUBLE_EQ(costs.remap_us(0, 0.9), 900.0 + 50.0);

  // Maps beside D2Hs, 11 times an idle one, are a cost the figure keeps.
  DeviceCosts beside;
  for (int i = 0; i < 128; ++i) {
    beside.mapped(0, i < 90 ? 100 : 1100);
    beside.unmapped(0, 60);
  }
  EXPECT_DOUBLE_EQ(beside.remap_us(0, 0.9), 1100.0 + 60.0);
  EXPECT_DOUBLE_EQ(beside.remap_us(0, 0.5), 100.0 + 60.0);
}

TEST(DeviceCosts, DevicesAreKeptApart) {
  DeviceCosts costs;
  for (size_t i = 0; i < DeviceCosts::kEnough; ++i) {
    costs.mapped(1, 700);
    costs.unmapped(1, 100);
  }
  EXPECT_EQ(costs.remap_us(0, 0.9), 0.0);
  EXPECT_DOUBLE_EQ(costs.remap_us(1, 0.9), 800.0);
}

TEST(DeviceCosts, CopySpeedsEachWayFromBytesAndDeviceTime) {
  DeviceCosts costs;
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  for (size_t i = 0; i < DeviceCosts::kEnough; ++i) {
    // 128 MiB in 2684.35 us is 50 GB/s (1e9 bytes a second); the tenth onwards at 55.
    costs.copied(0, /*to_host=*/true, 128 * kMiB, i < 9 ? 2684.35456 : 2440.32233);
  }
  EXPECT_EQ(costs.gbps(0, /*to_host=*/false, 0.9), 0.0);  // nothing seen the other way
  EXPECT_NEAR(costs.gbps(0, /*to_host=*/true, 0.9), 55.0, 1e-6);
  EXPECT_NEAR(costs.gbps(0, /*to_host=*/true, 0.5), 50.0, 1e-6);
}

TEST(DeviceCosts, SmallOrUntimedCopiesAreNotCounted) {
  DeviceCosts costs;
  for (size_t i = 0; i < DeviceCosts::kEnough; ++i) {
    costs.copied(0, false, DeviceCosts::kMinCopyBytes - 1, 10);  // latency, not the link
    costs.copied(0, false, 64 << 20, 0);                         // no device time
  }
  EXPECT_EQ(costs.gbps(0, false, 0.9), 0.0);
  for (size_t i = 0; i < DeviceCosts::kEnough; ++i) {
    costs.copied(0, false, DeviceCosts::kMinCopyBytes, 1000);
  }
  EXPECT_NEAR(costs.gbps(0, false, 0.9), static_cast<double>(DeviceCosts::kMinCopyBytes) / 1e6,
              1e-9);
}

}  // namespace
}  // namespace vaswap
