#include "base/own_thread.h"

#include <pthread.h>

namespace vaswap {
namespace {
thread_local bool own = false;
}  // namespace

void become_own_thread(const std::string& name) {
  own = true;
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

bool on_own_thread() { return own; }

}  // namespace vaswap
