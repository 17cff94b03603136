// SIGTERM and SIGINT while a trace is open. Without help, a signal that ends the process loses
// the trace's queue and cuts its last line. While a trace is open, vaswap's handler runs first:
// it wakes a flusher thread through a pipe (write(2) and poll(2) are async-signal-safe; spdlog's
// locks and malloc are not), waits a bounded time for the final events to reach the file, and
// then does what the program would have done: the program's own handler, or the default action
// (the handler is reset and the signal raised again, so the exit status stays "killed by
// SIGTERM"). A signal that arrives while its thread holds the trace's lock is held back until
// the lock is released. Ignored signals stay ignored. A program that installs its own handler
// later keeps it: the flusher finds it within a second and puts vaswap's in front of it again.
#pragma once

#include <signal.h>

namespace vaswap::trace::signals {

// Writes the final events for `signo` and waits (bounded) until they are in the file. `fatal`:
// the default action follows (the program has no handler), so the trace ends there.
using Finish = void (*)(int signo, bool fatal);

// Starts the flusher and installs the handlers. Called when a trace opens; again is harmless.
void install(Finish finish);
// Puts back the program's handlers (where vaswap's are still the ones installed) and stops the
// flusher. Called when the trace closes.
void remove();
// In a child made by fork(): the flusher did not survive; the program's handlers come back.
void after_fork_in_child();

// Held by a thread while it holds the trace's lock: a flush signal is deferred until it ends.
class LockScope {
 public:
  LockScope();
  ~LockScope();
  LockScope(const LockScope&) = delete;
  LockScope& operator=(const LockScope&) = delete;
};

// Blocks the flush signals in the calling thread while it lives, so that the threads it starts
// (the trace's writer) inherit a mask that keeps the handler off them.
class BlockedScope {
 public:
  BlockedScope();
  ~BlockedScope();
  BlockedScope(const BlockedScope&) = delete;
  BlockedScope& operator=(const BlockedScope&) = delete;

 private:
  sigset_t saved_;
};

}  // namespace vaswap::trace::signals
