// vaswap's own threads (workers, watchdogs, the gatekeeper) mark themselves at their start, so
// that what runs on them can tell: a failure at the process's exit stops such a thread instead of
// ending the process (residency::end_process). The name is for debuggers and the trace's tid;
// the mark is what counts, whatever the program names its own threads.
#pragma once

#include <functional>
#include <string>
#include <thread>

namespace vaswap {

// Names the calling thread (at most 15 characters are kept) and marks it as vaswap's.
void become_own_thread(const std::string& name);
// Whether the calling thread marked itself with become_own_thread.
bool on_own_thread();

// Starts `body` on a new thread, as std::thread does, and throws std::system_error as it does
// where the system makes none (EAGAIN: the process's or its user's thread limit, a cgroup's
// pids.max, no memory for a stack); std::thread's std::bad_alloc (no memory for its state)
// becomes std::system_error (ENOMEM) too, so that a caller's one handler covers both (what the
// caller allocates around the call is its own: inside.cpp allocates a thread's holder first). Every
// thread vaswap starts from the program's calls starts here, so that its callers handle the failure
// instead of letting it end the program. On the simulator a fault armed for "vaswap_thread" fails
// the start the same way (tests): with ENOMEM as std::bad_alloc, with any other error as EAGAIN.
std::thread start_thread(std::function<void()> body);

}  // namespace vaswap
