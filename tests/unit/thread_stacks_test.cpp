// thread_stacks(): where every other thread of the process is, as vaswap writes it when it ends a
// process (the trace's thread_stack events).
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

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
