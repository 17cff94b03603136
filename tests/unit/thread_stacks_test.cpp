// thread_stacks(): where every other thread of the process is, as vaswap writes it when it ends a
// process (the trace's thread_stack events).
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "observe/callsite.h"

namespace vaswap {
namespace {

std::mutex parked_mutex;
std::condition_variable parked_cv;
bool let_go = false;

// Blocks in a futex wait until let go, as a thread stuck in a lock does.
__attribute__((noinline)) void vaswap_test_parked_here(std::atomic<int>* tid) {
  tid->store(static_cast<int>(syscall(SYS_gettid)));
  std::unique_lock<std::mutex> lock(parked_mutex);
  parked_cv.wait(lock, [] { return let_go; });
}

TEST(ThreadStacksTest, NamesABlockedThreadAndTheFunctionItWaitsIn) {
  std::atomic<int> tid{0};
  std::thread parked([&tid] {
    pthread_setname_np(pthread_self(), "vaswap-test-pk");
    vaswap_test_parked_here(&tid);
  });
  while (tid.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // into its wait

  std::string error;
  const std::vector<ThreadStack> stacks = thread_stacks(32, 1000, &error);
  ASSERT_TRUE(error.empty()) << error;
  const auto it = std::find_if(stacks.begin(), stacks.end(),
                               [&tid](const ThreadStack& s) { return s.tid == tid.load(); });
  ASSERT_NE(it, stacks.end()) << "the parked thread is not listed";
  EXPECT_EQ(it->name, "vaswap-test-pk");
  ASSERT_TRUE(it->answered);
  std::string frames;
  for (const Frame& frame : it->frames) frames += describe(frame) + " < ";
  EXPECT_NE(frames.find("vaswap_test_parked_here"), std::string::npos) << frames;
  // The innermost frame is where it waits (libc's futex wait), not the handler that unwound it.
  ASSERT_FALSE(it->frames.empty());
  EXPECT_EQ(frames.find("answer"), std::string::npos) << frames;
  // The calling thread is not listed.
  const int self = static_cast<int>(syscall(SYS_gettid));
  EXPECT_TRUE(std::none_of(stacks.begin(), stacks.end(),
                           [self](const ThreadStack& s) { return s.tid == self; }));

  // The thread goes on once let go: its wait survived the signal.
  {
    std::lock_guard<std::mutex> lock(parked_mutex);
    let_go = true;
  }
  parked_cv.notify_all();
  parked.join();
}

// Threads that block the signal (as vaswap's trace writer does) are listed without frames and
// are not asked, so they cost no wait: a thread asked after them still gets the full wait, and
// answers.
TEST(ThreadStacksTest, ThreadsBlockingTheSignalAreListedWithoutFramesAndCostNoWait) {
  constexpr int kSilent = 4, kWaitMs = 500;
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::atomic<int> ready{0};
  std::vector<std::thread> silent;
  std::vector<int> silent_tids(kSilent, 0);
  for (int i = 0; i < kSilent; ++i) {
    silent.emplace_back([&, i] {
      sigset_t block;
      sigemptyset(&block);
      sigaddset(&block, SIGRTMIN + 5);
      pthread_sigmask(SIG_BLOCK, &block, nullptr);
      silent_tids[static_cast<size_t>(i)] = static_cast<int>(syscall(SYS_gettid));
      ready.fetch_add(1);
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return done; });
    });
  }
  while (ready.load() < kSilent) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  {
    std::lock_guard<std::mutex> lock(parked_mutex);
    let_go = false;
  }
  std::atomic<int> tid{0};
  std::thread parked([&tid] { vaswap_test_parked_here(&tid); });  // a later tid than theirs
  while (tid.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));

  std::string error;
  const auto start = std::chrono::steady_clock::now();
  const std::vector<ThreadStack> stacks = thread_stacks(32, kWaitMs, &error);
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
  ASSERT_TRUE(error.empty()) << error;
  for (int silent_tid : silent_tids) {
    const auto it = std::find_if(stacks.begin(), stacks.end(), [silent_tid](const ThreadStack& s) {
      return s.tid == silent_tid;
    });
    ASSERT_NE(it, stacks.end()) << "silent thread " << silent_tid << " is not listed";
    EXPECT_FALSE(it->answered);
    EXPECT_TRUE(it->frames.empty());
  }
  const auto it = std::find_if(stacks.begin(), stacks.end(),
                               [&tid](const ThreadStack& s) { return s.tid == tid.load(); });
  ASSERT_NE(it, stacks.end());
  EXPECT_TRUE(it->answered);
  // Not one wait for the four of them (before, each cost the full 500 ms).
  EXPECT_LT(took, kWaitMs) << "ms";

  {
    std::lock_guard<std::mutex> lock(m);
    done = true;
  }
  cv.notify_all();
  for (std::thread& t : silent) t.join();
  {
    std::lock_guard<std::mutex> lock(parked_mutex);
    let_go = true;
  }
  parked_cv.notify_all();
  parked.join();
}

TEST(ThreadStacksTest, AFrameWithoutAFunctionNamesItsObjectAndOffset) {
  Frame frame;
  frame.object = "libcuda.so.1";
  frame.offset = 0x2a4f10;
  EXPECT_EQ(describe(frame), "libcuda.so.1+0x2a4f10");
  frame.function = "cuMemMap";
  EXPECT_EQ(describe(frame), "cuMemMap (libcuda.so.1)");
}

}  // namespace
}  // namespace vaswap
