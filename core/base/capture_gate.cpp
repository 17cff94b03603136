#include "base/capture_gate.h"

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace vaswap::capture_gate {

namespace {

struct Gate {
  std::mutex mutex;
  std::condition_variable changed;
  int open = 0;
  bool held = false;
};

Gate& gate() {
  static auto* g = new Gate;  // leaked: hooks run from atexit handlers and other threads
  return *g;
}

}  // namespace

void beginning() {
  Gate& g = gate();
  std::unique_lock<std::mutex> lock(g.mutex);
  g.changed.wait(lock, [&g] { return !g.held; });
  ++g.open;
}

void closed(int count) {
  Gate& g = gate();
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    g.open = g.open > count ? g.open - count : 0;
  }
  g.changed.notify_all();
}

int open() {
  Gate& g = gate();
  std::lock_guard<std::mutex> lock(g.mutex);
  return g.open;
}

Exclusive::Exclusive(uint64_t wait_ns) {
  Gate& g = gate();
  std::unique_lock<std::mutex> lock(g.mutex);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(wait_ns);
  for (;;) {
    if (!g.held && g.open == 0) {
      g.held = held_ = true;
      return;
    }
    if (g.held) {  // another holder: its synchronize is brief, always wait for it
      g.changed.wait(lock);
      continue;
    }
    if (wait_ns == 0 || std::chrono::steady_clock::now() >= deadline) return;  // captures open
    g.changed.wait_until(lock, deadline);
  }
}

Exclusive::~Exclusive() {
  if (!held_) return;
  Gate& g = gate();
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    g.held = false;
  }
  g.changed.notify_all();
}

}  // namespace vaswap::capture_gate
