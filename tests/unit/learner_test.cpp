// The learned period's times without learning's waits, and the eager calls after a launch that
// use each slot, merged over the periods observed (core/plan/learner.h).
#include "plan/learner.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

namespace vaswap::planner {
namespace {

TEST(PeriodWithoutWaits, EachPositionMovesEarlierByTheWaitsBeforeIt) {
  // Three launches of 4 us each, 10 us apart as the program runs them; in learning the stream
  // waited 8 us for vaswap before the third (on-demand restores) and 5 us before the next
  // period's first launch.
  const std::vector<LaunchClock> window = {{0, 0, 4}, {0, 10, 14}, {8, 28, 32}, {5, 43, -1}};
  plan::Period p;
  EXPECT_DOUBLE_EQ(period_without_waits(window, &p), 13.0);
  EXPECT_EQ(p.start_us, (std::vector<double>{0, 10, 20}));
  EXPECT_EQ(p.end_us, (std::vector<double>{4, 14, 24}));
  EXPECT_DOUBLE_EQ(p.length_us, 30.0);
}

TEST(PeriodWithoutWaits, ALaunchWithoutAnEndEndsWhereTheNextBeganBeforeItsWait) {
  const std::vector<LaunchClock> window = {{0, 0, -1}, {6, 16, 20}, {0, 30, -1}};
  plan::Period p;
  EXPECT_DOUBLE_EQ(period_without_waits(window, &p), 6.0);
  EXPECT_EQ(p.start_us, (std::vector<double>{0, 10}));
  EXPECT_EQ(p.end_us, (std::vector<double>{10, 14}));
  EXPECT_DOUBLE_EQ(p.length_us, 24.0);
}

TEST(PeriodWithoutWaits, NoWaitsLeaveTheTimesAsMeasured) {
  const std::vector<LaunchClock> window = {{0, 0, 3}, {0, 7, 9}, {0, 12, -1}};
  plan::Period p;
  EXPECT_DOUBLE_EQ(period_without_waits(window, &p), 0.0);
  EXPECT_EQ(p.start_us, (std::vector<double>{0, 7}));
  EXPECT_EQ(p.end_us, (std::vector<double>{3, 9}));
  EXPECT_DOUBLE_EQ(p.length_us, 12.0);
}

TEST(AgreedTailCalls, ACountEveryPeriodSharesStands) {
  // Region 3 was used by two eager calls after the launch in each of three periods, region 5 by
  // one.
  const std::map<int, int> period = {{3, 2}, {5, 1}};
  EXPECT_EQ(agreed_tail_calls({period, period, period}), period);
}

TEST(AgreedTailCalls, PeriodsThatDifferGiveMinusOne) {
  // Region 3: two calls, then three (an evaluation step read it once more); region 5 is missing
  // from the second period's tail (0 calls there); region 7 is used once everywhere.
  const std::map<int, int> a = {{3, 2}, {5, 1}, {7, 1}}, b = {{3, 3}, {7, 1}};
  const std::map<int, int> want = {{3, -1}, {5, -1}, {7, 1}};
  EXPECT_EQ(agreed_tail_calls({a, b}), want);
  EXPECT_EQ(agreed_tail_calls({b, a}), want) << "the order of the periods must not matter";
}

TEST(AgreedTailCalls, NoPeriodsNoTail) {
  EXPECT_TRUE(agreed_tail_calls({}).empty());
  EXPECT_TRUE(agreed_tail_calls({{}, {}}).empty());
}

}  // namespace
}  // namespace vaswap::planner
