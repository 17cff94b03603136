#include "base/capture_gate.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

namespace vaswap::capture_gate {

namespace {

struct Gate {
  std::mutex mutex;
  std::condition_variable changed;
  std::atomic<int> open{0};  // changed under `mutex`; read without it by open()
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
  g.open.fetch_add(1, std::memory_order_acq_rel);
}

void closed(int count) {
  Gate& g = gate();
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    const int now = g.open.load(std::memory_order_relaxed);
    g.open.store(now > count ? now - count : 0, std::memory_order_release);
  }
  g.changed.notify_all();
}

int open() { return gate().open.load(std::memory_order_acquire); }

Exclusive::Exclusive(uint64_t wait_ns) {
  Gate& g = gate();
  std::unique_lock<std::mutex> lock(g.mutex);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(wait_ns);
  for (;;) {
    if (!g.held && g.open.load(std::memory_order_relaxed) == 0) {
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
