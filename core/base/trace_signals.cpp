#include "base/trace_signals.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <initializer_list>
#include <system_error>
#include <thread>

#include "base/own_thread.h"

namespace vaswap::trace::signals {

namespace {

constexpr int kSignals[] = {SIGTERM, SIGINT};
// How long a handler waits for the flusher (DESIGN.md invariant 12): the final events are a few
// lines, so this only runs out when the file cannot be written.
constexpr int kFlushWaitMs = 2000;
// How often the flusher checks that vaswap's handlers are still the installed ones.
constexpr int kRechainMs = 1000;
constexpr unsigned char kStop = 0;
constexpr unsigned char kFatal = 0x80;

struct State {
  int wake_read = -1, wake_write = -1;  // handler -> flusher: the signal, kFatal if fatal
  int ack_read = -1, ack_write = -1;    // flusher -> handler: done
  std::atomic<bool> alive{false};       // the flusher runs
  std::atomic<bool> flushing{false};
  Finish finish = nullptr;
  std::thread flusher;
};

// Leaked on purpose: a forked child replaces it without destroying a thread that is not there,
// and a handler may run while static destructors do.
State* g_state = new State;
// What the program had installed, per signal; read by the handler.
struct sigaction g_previous[NSIG];
bool g_installed[NSIG];
std::atomic<int> g_deferred{0};
// Initial-exec: read inside a signal handler, where a dynamic TLS lookup could allocate.
__attribute__((tls_model("initial-exec"))) thread_local int t_lock_depth = 0;

bool ends_the_process(const struct sigaction& action) {
  return (action.sa_flags & SA_SIGINFO) == 0 && action.sa_handler == SIG_DFL;
}

void wait_for_flush(State& s, int signo, bool fatal) {
  if (!s.alive.load() || s.flushing.exchange(true)) return;
  unsigned char stale = 0;
  while (::read(s.ack_read, &stale, 1) == 1) {
  }  // an answer that came after an earlier wait gave up
  const unsigned char message = static_cast<unsigned char>(signo) | (fatal ? kFatal : 0);
  if (::write(s.wake_write, &message, 1) == 1) {
    pollfd ack{s.ack_read, POLLIN, 0};
    if (::poll(&ack, 1, kFlushWaitMs) == 1) {
      unsigned char done = 0;
      (void)!::read(s.ack_read, &done, 1);
    }
  }
  s.flushing.store(false);
}

void on_signal(int signo, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  if (t_lock_depth > 0) {  // this thread holds the trace's lock: finish when it lets go
    g_deferred.store(signo);
    errno = saved_errno;
    return;
  }
  const struct sigaction previous = g_previous[signo];
  const bool fatal = ends_the_process(previous);
  wait_for_flush(*g_state, signo, fatal);
  if (fatal) {
    // The signal is blocked while its handler runs: raised now, it ends the process with the
    // default action as soon as this returns.
    struct sigaction action {};
    action.sa_handler = SIG_DFL;
    sigemptyset(&action.sa_mask);
    ::sigaction(signo, &action, nullptr);
    ::raise(signo);
  } else if ((previous.sa_flags & SA_SIGINFO) != 0) {
    previous.sa_sigaction(signo, info, context);
  } else if (previous.sa_handler != SIG_IGN) {
    previous.sa_handler(signo);
  }
  errno = saved_errno;
}

bool is_ours(const struct sigaction& action) {
  return (action.sa_flags & SA_SIGINFO) != 0 && action.sa_sigaction == on_signal;
}

struct sigaction our_action() {
  struct sigaction action {};
  action.sa_sigaction = on_signal;
  // SA_RESTART: the interrupted thread's system calls carry on; SA_ONSTACK: programs with an
  // alternate signal stack (Go's runtime requires it) keep using it.
  action.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  for (const int signo : kSignals) sigaddset(&action.sa_mask, signo);
  return action;
}

// Puts vaswap's handler in front of whatever the program installed since, unless it ignores
// the signal. One sigaction call swaps them, so a handler installed meanwhile is not lost.
void install_handler(int signo) {
  const struct sigaction ours = our_action();
  struct sigaction current {};
  if (::sigaction(signo, nullptr, &current) != 0 || is_ours(current)) return;
  if ((current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler == SIG_IGN) return;
  g_previous[signo] = current;
  struct sigaction replaced {};
  if (::sigaction(signo, &ours, &replaced) != 0) return;
  g_installed[signo] = true;
  if ((replaced.sa_flags & SA_SIGINFO) == 0 && replaced.sa_handler == SIG_IGN) {
    ::sigaction(signo, &replaced, nullptr);  // ignored since the check: leave it so
    g_installed[signo] = false;
  } else if (!is_ours(replaced)) {
    g_previous[signo] = replaced;
  }
}

void restore_handlers() {
  for (const int signo : kSignals) {
    struct sigaction current {};
    if (g_installed[signo] && ::sigaction(signo, nullptr, &current) == 0 && is_ours(current)) {
      ::sigaction(signo, &g_previous[signo], nullptr);
    }
    g_installed[signo] = false;
  }
}

void flusher_main(State* s) {
  while (true) {
    pollfd wake{s->wake_read, POLLIN, 0};
    const int ready = ::poll(&wake, 1, kRechainMs);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return;
    if (ready == 0) {
      for (const int signo : kSignals) install_handler(signo);
      continue;
    }
    unsigned char message = kStop;
    if (::read(s->wake_read, &message, 1) != 1 || message == kStop) return;
    s->finish(message & ~kFatal, (message & kFatal) != 0);
    const unsigned char done = 1;
    (void)!::write(s->ack_write, &done, 1);
  }
}

void close_pipes(State& s) {
  for (int* fd : {&s.wake_read, &s.wake_write, &s.ack_read, &s.ack_write}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

}  // namespace

LockScope::LockScope() { ++t_lock_depth; }

LockScope::~LockScope() {
  if (--t_lock_depth == 0 && g_deferred.load(std::memory_order_relaxed) != 0) {
    const int signo = g_deferred.exchange(0);
    if (signo != 0) ::raise(signo);
  }
}

BlockedScope::BlockedScope() {
  sigset_t blocked;
  sigemptyset(&blocked);
  for (const int signo : kSignals) sigaddset(&blocked, signo);
  pthread_sigmask(SIG_BLOCK, &blocked, &saved_);
}

BlockedScope::~BlockedScope() { pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }

void install(Finish finish) {
  State& s = *g_state;
  if (s.alive.load()) return;
  int wake[2], ack[2];
  if (::pipe2(wake, O_CLOEXEC) != 0) return;
  if (::pipe2(ack, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(wake[0]);
    ::close(wake[1]);
    return;
  }
  s.wake_read = wake[0];
  s.wake_write = wake[1];
  s.ack_read = ack[0];
  s.ack_write = ack[1];
  s.finish = finish;
  {
    // Every signal blocked in the flusher: a handler on it would wait for itself.
    sigset_t all, saved;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &saved);
    bool started = true;
    try {
      s.flusher = start_thread([&s] { flusher_main(&s); });
    } catch (const std::system_error&) {
      started = false;  // a thread limit: no handlers, as where the pipes cannot be made
    }
    pthread_sigmask(SIG_SETMASK, &saved, nullptr);
    if (!started) {
      close_pipes(s);  // and forgets them: a forked child closes the numbers it finds there
      return;
    }
  }
  s.alive.store(true);
  for (const int signo : kSignals) install_handler(signo);
}

void remove() {
  State& s = *g_state;
  if (!s.alive.exchange(false)) return;
  const unsigned char stop = kStop;
  (void)!::write(s.wake_write, &stop, 1);
  if (s.flusher.joinable()) s.flusher.join();  // first, so that it re-installs nothing
  restore_handlers();
  close_pipes(s);
}

void after_fork_in_child() {
  State* parent = g_state;
  g_state = new State;  // the parent's thread object names a thread this process does not have
  close_pipes(*parent);
  restore_handlers();
}

}  // namespace vaswap::trace::signals
