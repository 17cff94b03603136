// residency.d2h_gate (docs/PLANNER.md, "The D2H gate"): per device, a word of pinned memory that
// every eviction's D2H enqueued ahead waits on, on the device, to be 0. Residency's mover raises
// it while a restore waits for room that a D2H already running will free, so that the restore's
// cuMemSetAccess does not wait behind the next D2H (0.74 ms on the H200, docs/PERFORMANCE.md
// fact 6), and lowers it once that restore has mapped.
//
// This file holds the gates' state and the gatekeeper: a thread that lowers a gate once it has
// been up for its limit, whatever other threads do (invariant 12). No driver calls; the lock here
// is held only for a few stores, never across a wait, so the gatekeeper cannot be held by a thread
// that waits, in the driver, for the streams a gate parks. When to raise (a D2H running, nothing
// settling) is residency's decision.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>

namespace vaswap::residency {

class D2hGates {
 public:
  D2hGates() = default;
  D2hGates(const D2hGates&) = delete;
  D2hGates& operator=(const D2hGates&) = delete;
  ~D2hGates();  // stops the gatekeeper

  // The device's gate is `flag` (its host side; it must outlive this object): down (0) now.
  void add(int device, uint32_t* flag);
  // Raises the device's gate for at most `limit_ns` (trace::now_ns time). False where the device
  // has no gate or it is up already.
  bool raise(int device, uint64_t limit_ns);
  void lower(int device);
  void lower_all();
  bool up(int device) const;

  struct Counts {
    uint64_t raises = 0;
    uint64_t timeouts = 0;  // lowered by the gatekeeper at their limit
    double up_us = 0;       // time gates were up
  };
  Counts counts() const;

 private:
  struct Gate {
    uint32_t* flag = nullptr;
    uint64_t since_ns = 0;     // raised then; 0: down
    uint64_t deadline_ns = 0;  // the gatekeeper lowers it then
  };
  void lower_locked(Gate& gate, bool at_limit);
  void keep();  // the gatekeeper's loop

  mutable std::mutex mutex_;
  std::condition_variable changed_;  // a gate was raised, or the object is going
  std::map<int, Gate> gates_;
  Counts counts_;
  std::thread keeper_;  // started at the first raise
  bool stopping_ = false;
};

// How long a gate may hold D2Hs back for one restore: the longest the D2H it waits for should take
// (`bytes` at `d2h_gbps`, the slowest tenth of the run's copies), one and a half times, within
// 1 to 20 ms; 4 ms while the run has no figure (a 128 MiB D2H takes 2.4 to 2.9 ms on the H200).
uint64_t gate_limit_ns(uint64_t bytes, double d2h_gbps);

}  // namespace vaswap::residency
