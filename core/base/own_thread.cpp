#include "base/own_thread.h"

#include <pthread.h>

#include <cerrno>
#include <new>
#include <system_error>
#include <utility>

#include "base/driver.h"

namespace vaswap {
namespace {
thread_local bool own = false;
}  // namespace

void become_own_thread(const std::string& name) {
  own = true;
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

bool on_own_thread() { return own; }

std::thread start_thread(std::function<void()> body) {
  const Driver* driver = loaded_driver();  // not loaded for this: trace_open starts threads too
  const int injected = driver != nullptr && driver->sim_fault_check != nullptr
                           ? driver->sim_fault_check("vaswap_thread")
                           : 0;
  try {
    if (injected == ENOMEM) throw std::bad_alloc();  // as std::thread's own state allocation
    if (injected != 0) {
      throw std::system_error(EAGAIN, std::generic_category(), "a fault the simulator injected");
    }
    return std::thread(std::move(body));
  } catch (const std::bad_alloc&) {
    // std::thread allocates its state before the system starts anything: no memory for it is a
    // thread that cannot start, as EAGAIN is, for every caller's handler.
    throw std::system_error(ENOMEM, std::generic_category(),
                            injected != 0 ? "a fault the simulator injected (no memory)"
                                          : "no memory for the thread's state");
  }
}

}  // namespace vaswap
