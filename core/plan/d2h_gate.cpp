#include "plan/d2h_gate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <system_error>

#include "base/own_thread.h"
#include "base/trace.h"

namespace vaswap::residency {

namespace {

void store(uint32_t* flag, uint32_t value) { __atomic_store_n(flag, value, __ATOMIC_RELEASE); }

}  // namespace

D2hGates::~D2hGates() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (keeper_.joinable()) keeper_.join();
}

void D2hGates::add(int device, uint32_t* flag) {
  std::lock_guard<std::mutex> lock(mutex_);
  store(flag, 0);
  gates_[device] = Gate{flag, 0, 0};
}

bool D2hGates::raise(int device, uint64_t limit_ns) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = gates_.find(device);
    if (it == gates_.end() || it->second.since_ns != 0) return false;
    if (!keeper_.joinable()) {
      // Without the gatekeeper nothing would bound the gate: not raised.
      try {
        keeper_ = start_thread([this] { keep(); });
      } catch (const std::system_error&) {
        return false;
      }
    }
    Gate& gate = it->second;
    gate.since_ns = trace::now_ns();
    gate.deadline_ns = gate.since_ns + limit_ns;
    store(gate.flag, 1);
    ++counts_.raises;
  }
  changed_.notify_all();
  return true;
}

void D2hGates::lower_locked(Gate& gate, bool at_limit) {
  if (gate.since_ns == 0) return;  // down already
  store(gate.flag, 0);
  counts_.up_us += static_cast<double>(trace::now_ns() - gate.since_ns) / 1e3;
  if (at_limit) ++counts_.timeouts;
  gate.since_ns = gate.deadline_ns = 0;
}

void D2hGates::lower(int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = gates_.find(device);
  if (it != gates_.end()) lower_locked(it->second, false);
}

void D2hGates::lower_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [device, gate] : gates_) lower_locked(gate, false);
}

bool D2hGates::up(int device) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = gates_.find(device);
  return it != gates_.end() && it->second.since_ns != 0;
}

D2hGates::Counts D2hGates::counts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

// Sleeps until the earliest deadline of a gate that is up (or until one is raised), then lowers
// every gate past its own. trace::now_ns is the monotonic clock the deadlines were taken on.
void D2hGates::keep() {
  become_own_thread("vaswap-gate");
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    uint64_t next = 0;
    const uint64_t now = trace::now_ns();
    for (auto& [device, gate] : gates_) {
      if (gate.since_ns == 0) continue;
      if (now >= gate.deadline_ns) {
        lower_locked(gate, true);
      } else if (next == 0 || gate.deadline_ns < next) {
        next = gate.deadline_ns;
      }
    }
    if (next == 0) {
      changed_.wait(lock);
    } else {
      changed_.wait_for(lock, std::chrono::nanoseconds(next - now));
    }
  }
}

uint64_t gate_limit_ns(uint64_t bytes, double d2h_gbps) {
  constexpr uint64_t kNoFigureNs = 4000000, kLeastNs = 1000000, kMostNs = 20000000;
  if (!(d2h_gbps > 0) || bytes == 0) return kNoFigureNs;
  const double copy_ns = static_cast<double>(bytes) / d2h_gbps;  // bytes / (GB/s) = ns
  const double limit = std::ceil(1.5 * copy_ns);                 // clamped as a double: no overflow
  return static_cast<uint64_t>(
      std::clamp(limit, static_cast<double>(kLeastNs), static_cast<double>(kMostNs)));
}

}  // namespace vaswap::residency
