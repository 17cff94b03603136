// The executor (core/plan/executor.h): where a launch sits in the learned period, what is due
// there, and how it follows a program that skips or repeats graphs.
#include "plan/executor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace vaswap::planner {
namespace {

// Graph handles and slots stand for themselves: the executor only compares them.
CUgraphExec graph(uintptr_t n) { return reinterpret_cast<CUgraphExec>(n); }
Slot* slot(uintptr_t n) { return reinterpret_cast<Slot*>(n * 64); }

// A period of graphs 1, 2, 3: slot 7 leaves at position 1 and comes back at position 2.
Executor three_positions() {
  Executor e;
  e.follow({graph(1), graph(2), graph(3)});
  e.install(5, {{}, {slot(7)}, {}}, {{}, {}, {slot(7)}});
  return e;
}

TEST(ExecutorTest, FollowsThePeriodFromTheLaunchAfterTheOneThatCompletedIt) {
  Executor e = three_positions();
  EXPECT_EQ(e.position(), 1);  // graph 1 completed the repeat: position 0
  EXPECT_EQ(e.plan(), 5u);
  int expected = -1;
  EXPECT_EQ(e.locate(graph(2), &expected), 1);
  EXPECT_EQ(expected, 1);
  EXPECT_EQ(e.releases(), std::vector<Slot*>{slot(7)});
  EXPECT_TRUE(e.restores().empty());
  e.next();
  EXPECT_EQ(e.locate(graph(3), &expected), 2);
  EXPECT_EQ(e.restores(), std::vector<Slot*>{slot(7)});
  e.next();
  EXPECT_EQ(e.locate(graph(1), &expected), 0);  // wraps around
  EXPECT_TRUE(e.releases().empty());
}

TEST(ExecutorTest, AKnownGraphOutOfOrderResynchronizesAndAnUnknownOneIsNotFound) {
  Executor e = three_positions();
  int expected = -1;
  EXPECT_EQ(e.locate(graph(3), &expected), 2);  // graph 2 was skipped
  EXPECT_EQ(expected, 1);
  EXPECT_EQ(e.position(), 2);
  EXPECT_EQ(e.restores(), std::vector<Slot*>{slot(7)});
  e.next();
  EXPECT_EQ(e.locate(graph(9), &expected), -1);
  EXPECT_EQ(expected, 0);
  EXPECT_EQ(e.position(), 0) << "an unknown graph moved the position";
  EXPECT_TRUE(e.knows(graph(2)));
  EXPECT_FALSE(e.knows(graph(9)));
}

TEST(ExecutorTest, AFreedSlotLeavesEveryWindowAndNothingIsDueBeforeAPlan) {
  Executor e = three_positions();
  EXPECT_TRUE(e.forget(slot(7)));
  EXPECT_FALSE(e.forget(slot(7)));
  int expected = -1;
  e.locate(graph(2), &expected);
  EXPECT_TRUE(e.releases().empty());
  Executor planning;
  planning.follow({graph(1), graph(2)});
  EXPECT_EQ(planning.locate(graph(2), &expected), 1);
  EXPECT_TRUE(planning.releases().empty());
  EXPECT_TRUE(planning.restores().empty());
  planning.clear();
  EXPECT_EQ(planning.locate(graph(1), &expected), -1);
}

}  // namespace
}  // namespace vaswap::planner
