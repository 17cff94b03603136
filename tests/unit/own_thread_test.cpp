// become_own_thread()/on_own_thread(): what end_process reads to tell vaswap's threads from the
// program's at the exit. The mark, not the name, decides.
#include <gtest/gtest.h>
#include <pthread.h>

#include <string>
#include <thread>

#include "base/own_thread.h"

namespace vaswap {
namespace {

std::string thread_name() {
  char name[16] = {};
  pthread_getname_np(pthread_self(), name, sizeof name);
  return name;
}

TEST(OwnThreadTest, MarksOnlyTheThreadThatBecameOne) {
  bool marked = false, before = true;
  std::string name;
  std::thread([&] {
    before = on_own_thread();
    become_own_thread("vaswap-unm12345678");
    marked = on_own_thread();
    name = thread_name();
  }).join();
  EXPECT_FALSE(before);
  EXPECT_TRUE(marked);
  EXPECT_EQ(name, "vaswap-unm12345");  // the kernel keeps 15 characters
  EXPECT_FALSE(on_own_thread());       // this thread never became one
}

TEST(OwnThreadTest, AProgramThreadNamedLikeOneIsNotOne) {
  bool marked = true;
  std::thread([&] {
    pthread_setname_np(pthread_self(), "vaswap-mov0");
    marked = on_own_thread();
  }).join();
  EXPECT_FALSE(marked);
}

}  // namespace
}  // namespace vaswap
