// The D2H gate's flags and gatekeeper (core/plan/d2h_gate.h): what the device's D2Hs wait on, how
// long a gate may stay up, and that it comes down at its limit whatever other threads do.
#include "plan/d2h_gate.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <thread>

#include "base/trace.h"

namespace vaswap::residency {
namespace {

uint32_t read(const uint32_t& flag) { return __atomic_load_n(&flag, __ATOMIC_ACQUIRE); }

TEST(D2hGates, RaisedIsOneUntilLoweredAndOnlyOncePerRaise) {
  uint32_t flag = 7;  // whatever the word held: down once added
  D2hGates gates;
  gates.add(0, &flag);
  EXPECT_EQ(0u, read(flag));
  EXPECT_FALSE(gates.up(0));
  EXPECT_TRUE(gates.raise(0, 1000000000));
  EXPECT_EQ(1u, read(flag));
  EXPECT_TRUE(gates.up(0));
  EXPECT_FALSE(gates.raise(0, 1000000000)) << "raised while up";
  gates.lower(0);
  EXPECT_EQ(0u, read(flag));
  EXPECT_FALSE(gates.up(0));
  gates.lower(0);  // down already: nothing counted
  const D2hGates::Counts counts = gates.counts();
  EXPECT_EQ(1u, counts.raises);
  EXPECT_EQ(0u, counts.timeouts);
  EXPECT_GT(counts.up_us, 0);
  EXPECT_FALSE(gates.raise(3, 1000000)) << "a device without a gate";
}

TEST(D2hGates, TheGatekeeperLowersAGateAtItsOwnLimit) {
  uint32_t a = 0, b = 0;
  D2hGates gates;
  gates.add(0, &a);
  gates.add(1, &b);
  const uint64_t start = trace::now_ns();
  ASSERT_TRUE(gates.raise(0, 20000000));    // 20 ms
  ASSERT_TRUE(gates.raise(1, 2000000000));  // 2 s: still up when the test ends
  while (read(a) != 0 && trace::now_ns() - start < 5000000000) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const uint64_t down_ns = trace::now_ns() - start;
  EXPECT_EQ(0u, read(a));
  EXPECT_GE(down_ns, 20000000u) << "lowered before its limit";
  EXPECT_LT(down_ns, 1000000000u) << "lowered long after its limit";
  EXPECT_EQ(1u, read(b)) << "the other device's gate has a later limit";
  EXPECT_EQ(1u, gates.counts().timeouts);
  gates.lower_all();
  EXPECT_EQ(0u, read(b));
  EXPECT_EQ(1u, gates.counts().timeouts) << "lowered by a call, not at its limit";
}

TEST(D2hGates, ALimitFollowsTheRunningCopysTime) {
  // 128 MiB at 50 GB/s: 2.68 ms, one and a half times that.
  EXPECT_EQ(4026532u, gate_limit_ns(uint64_t{128} << 20, 50.0));
  EXPECT_EQ(1000000u, gate_limit_ns(uint64_t{2} << 20, 50.0)) << "at least 1 ms";
  EXPECT_EQ(20000000u, gate_limit_ns(uint64_t{4} << 30, 50.0)) << "at most 20 ms";
  EXPECT_EQ(4000000u, gate_limit_ns(uint64_t{128} << 20, 0.0)) << "no figure yet: 4 ms";
}

}  // namespace
}  // namespace vaswap::residency
