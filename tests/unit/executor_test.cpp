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

// A period of graphs 1, 2, 3 with three releases at position 2 (after graph 2, before graph 3):
// slot 4 right after graph 2's launch, slot 5 after the second eager call that uses it since that
// launch, slot 6 only at graph 3's launch.
Executor early_releases() {
  Executor e;
  e.follow({graph(1), graph(2), graph(3)});
  e.install(1, {{}, {}, {slot(4), slot(5), slot(6)}}, {{}, {}, {}}, {{}, {}, {0, 2, -1}});
  int expected = -1;
  e.locate(graph(2), &expected);
  e.next();  // graph 2 launched: position 2 is next
  return e;
}

TEST(ExecutorTest, ReleasesAreDueAfterTheLaunchOrTheEagerCallThatUsedTheirSlotsLast) {
  Executor e = early_releases();
  EXPECT_EQ(e.position(), 2);
  EXPECT_EQ(e.due_after_launch(), std::vector<Slot*>{slot(4)});
  EXPECT_TRUE(e.due_after_launch().empty()) << "issued twice";
  EXPECT_TRUE(e.due_after_eager({slot(7)}).empty());
  EXPECT_TRUE(e.due_after_eager({slot(5), slot(4)}).empty()) << "slot 5's first call";
  EXPECT_EQ(e.due_after_eager({slot(5)}), std::vector<Slot*>{slot(5)});
  EXPECT_TRUE(e.due_after_eager({slot(5)}).empty()) << "a third call issues nothing more";
  // At graph 3's launch only slot 6 is left.
  int expected = -1;
  EXPECT_EQ(e.locate(graph(3), &expected), 2);
  EXPECT_EQ(e.releases(), std::vector<Slot*>{slot(6)});
  e.next();
  e.locate(graph(1), &expected);
  e.next();
  e.locate(graph(2), &expected);
  e.next();
  // The next period counts again from nothing.
  EXPECT_EQ(e.releases(), (std::vector<Slot*>{slot(4), slot(5), slot(6)}));
  EXPECT_EQ(e.due_after_launch(), std::vector<Slot*>{slot(4)});
  EXPECT_TRUE(e.due_after_eager({slot(5)}).empty());
  EXPECT_EQ(e.releases(), (std::vector<Slot*>{slot(5), slot(6)}));
}

TEST(ExecutorTest, ALaunchOutOfOrderForgetsWhatTheExpectedPositionIssuedEarly) {
  Executor e = early_releases();
  EXPECT_EQ(e.due_after_launch(), std::vector<Slot*>{slot(4)});
  int expected = -1;
  // Graph 3 is skipped: graph 1 comes next. Position 0 has no releases, and position 2's counts
  // start over when it comes again.
  EXPECT_EQ(e.locate(graph(1), &expected), 0);
  EXPECT_TRUE(e.releases().empty());
  EXPECT_TRUE(e.due_after_eager({slot(5)}).empty());
  e.next();
  e.locate(graph(2), &expected);
  e.next();
  EXPECT_TRUE(e.due_after_eager({slot(5)}).empty());
  EXPECT_EQ(e.due_after_eager({slot(5)}), std::vector<Slot*>{slot(5)});
}

TEST(ExecutorTest, WithoutAfterCallsEveryReleaseWaitsForItsLaunch) {
  Executor e = three_positions();
  EXPECT_TRUE(e.due_after_launch().empty());
  EXPECT_TRUE(e.due_after_eager({slot(7)}).empty());
  EXPECT_EQ(e.releases(), std::vector<Slot*>{slot(7)});
}

TEST(ExecutorTest, AFreedSlotLeavesTheEarlyCountsOfItsPosition) {
  Executor e = early_releases();
  EXPECT_TRUE(e.forget(slot(4)));
  EXPECT_TRUE(e.due_after_launch().empty());
  EXPECT_TRUE(e.due_after_eager({slot(5)}).empty());
  EXPECT_EQ(e.due_after_eager({slot(5)}), std::vector<Slot*>{slot(5)});
  EXPECT_EQ(e.releases(), std::vector<Slot*>{slot(6)});
}

TEST(ExecutorTest, AFreedSlotIssuedEarlyLeavesTheRestDueAtTheLaunch) {
  Executor e = early_releases();
  EXPECT_EQ(e.due_after_launch(), std::vector<Slot*>{slot(4)});
  EXPECT_EQ(e.releases(), (std::vector<Slot*>{slot(5), slot(6)}));
  // Slot 4 was issued early and is now freed: nothing issued early is left, and both others are
  // still due at graph 3's launch.
  EXPECT_TRUE(e.forget(slot(4)));
  EXPECT_EQ(e.releases(), (std::vector<Slot*>{slot(5), slot(6)}));
  EXPECT_TRUE(e.due_after_eager({slot(5)}).empty());
  EXPECT_EQ(e.due_after_eager({slot(5)}), std::vector<Slot*>{slot(5)});
  EXPECT_EQ(e.releases(), std::vector<Slot*>{slot(6)});
}

}  // namespace
}  // namespace vaswap::planner
