// Learning's timing (core/plan/learner.h) on the simulator: the period's device times leave out
// the time the launching stream stood idle while the program's thread waited for vaswap, before a
// launch and before an eager call after it.
#include <cuda.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "../sim/tests/sim_test.h"
#include "base/errors.h"
#include "plan/learner.h"

namespace vaswap::planner {
namespace {

// Host work on a stream: it stands for a launch's or an eager call's device time.
void busy(CUstream stream, uintptr_t ms) {
  const auto sleep_fn = [](void* arg) {
    std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<uintptr_t>(arg)));
  };
  ASSERT_CU(cuLaunchHostFunc(stream, sleep_fn, reinterpret_cast<void*>(ms)));
}

class LearnerTimesTest : public SimTest {
 protected:
  void SetUp() override {
    SimTest::SetUp();
    ASSERT_CU(cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
    ASSERT_CU(cuStreamCreate(&other_, CU_STREAM_NON_BLOCKING));
  }
  void TearDown() override {
    cuStreamSynchronize(stream_);
    cuStreamSynchronize(other_);
    cuStreamDestroy(stream_);
    cuStreamDestroy(other_);
    SimTest::TearDown();
  }

  // Graphs 1 and 2 take 2 ms each on the device; after graph 1 an eager call of 1 ms, before
  // which the program's thread waits 30 ms for vaswap (on `eager_stream`; `waited`: what the
  // acquire said). Launched until learning finds the period; returns its times.
  std::shared_ptr<Learned> learn(CUstream eager_stream, bool waited) {
    Learner learner;
    const auto graph = [](uintptr_t n) { return reinterpret_cast<CUgraphExec>(n); };
    for (int launch = 0; launch < 20; ++launch) {
      const CUgraphExec exec = graph(1 + launch % 2);
      learner.ask(stream_);
      const int period = learner.observe(exec, stream_, {}, 2);
      busy(stream_, 2);
      learner.launched(exec, stream_);
      if (period != 0) {
        std::shared_ptr<Learned> learned = learner.take(period, 2);
        learned_times(*learned);
        return learned;
      }
      if (exec == graph(1)) {
        const CUevent before = learner.ask_eager(eager_stream);
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        learner.eager_acquired(before, eager_stream, waited);
        busy(eager_stream, 1);
      }
    }
    ADD_FAILURE() << "no period in 20 launches";
    return nullptr;
  }

  CUstream stream_ = nullptr, other_ = nullptr;
};

TEST_F(LearnerTimesTest, AnEagerCallsWaitIsTakenOutOfThePeriod) {
  const auto learned = learn(stream_, true);
  ASSERT_NE(nullptr, learned);
  const plan::Period& p = learned->period;
  ASSERT_EQ(2u, p.start_us.size());
  // 2 + 1 + 2 ms of work; the stream stood idle about 28 of the 30 ms the thread waited (the
  // first 2 it still ran graph 1).
  EXPECT_GE(learned->parked_us, 20000) << "the eager call's wait was not taken out";
  EXPECT_LT(p.length_us, 15000) << "the period still holds the wait: " << p.length_us << " us";
  EXPECT_GE(p.length_us, 4500);
  // Graph 2 starts after graph 1 and the eager call, without the wait between them.
  EXPECT_GE(p.start_us[1], 2500);
  EXPECT_LT(p.start_us[1], 12000) << p.start_us[1];
}

TEST_F(LearnerTimesTest, AnEagerCallThatDidNotWaitLeavesTheTimesAsMeasured) {
  // The thread was held 30 ms by the program itself (host work), not by vaswap: that is the
  // program's time, and stays in.
  const auto learned = learn(stream_, false);
  ASSERT_NE(nullptr, learned);
  EXPECT_LT(learned->parked_us, 1000);
  EXPECT_GE(learned->period.length_us, 25000);
}

TEST_F(LearnerTimesTest, AWaitOnAnotherStreamStaysIn) {
  // The eager call ran on a stream other than the launches': its wait held that stream, and the
  // launches only through the program's own ordering, which learning does not see.
  const auto learned = learn(other_, true);
  ASSERT_NE(nullptr, learned);
  EXPECT_LT(learned->parked_us, 1000);
  EXPECT_GE(learned->period.length_us, 25000);
}

// A launch whose start event cannot be recorded fails by name, and the event asked for it before
// is not lost: every event learning made is destroyed with the learner.
TEST_F(LearnerTimesTest, AFailedStartRecordKeepsTheAskedEvent) {
  const unsigned long long before = vaswapSimLiveEvents();
  {
    Learner learner;
    learner.ask(stream_);
    EXPECT_EQ(before + 1, vaswapSimLiveEvents()) << "ask() records one event";
    ASSERT_EQ(0, vaswapSimInjectFault("cuEventRecordWithFlags", 1, CUDA_ERROR_LAUNCH_FAILED));
    try {
      learner.observe(reinterpret_cast<CUgraphExec>(1), stream_, {}, 2);
      ADD_FAILURE() << "observe() went on without its start event";
    } catch (const Error& e) {
      EXPECT_NE(std::string::npos, std::string(e.what()).find("cuEventRecord")) << e.what();
    }
    vaswapSimClearFaults();
    EXPECT_EQ(before + 1, vaswapSimLiveEvents()) << "the failed record leaked or lost an event";
  }
  EXPECT_EQ(before, vaswapSimLiveEvents()) << "the learner left events behind";
}

}  // namespace
}  // namespace vaswap::planner
