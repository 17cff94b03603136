// Learning (DESIGN.md section 5): the planner's first phase. It records every graph launch, with
// the slots the launch and the eager work after it use and device timing events around it, until
// the launches repeat with one period schedule.learning_steps times in a row. What it found (the
// last complete period: its uses per position and, once the events have completed, its timing)
// is what the pure schedule (schedule.h) plans over.
//
// Not thread-safe: the planner calls it under its own lock, except learned_times(), which the
// planning worker calls on a Learned that nobody else holds.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "plan/schedule.h"

namespace vaswap {

struct Slot;

namespace planner {

// One graph launch observed while learning, with the slots it and the eager work after it use.
struct Seen {
  CUgraphExec exec = nullptr;
  CUstream stream = nullptr;  // the launch's
  std::vector<Slot*> uses;
  CUevent start = nullptr, end = nullptr;  // around the launch, on its stream
  // Before vaswap's waits for the launch's slots: from it to `start` the stream waited for
  // learning's own restores and room, which the plan's steady state does not.
  CUevent asked = nullptr;
  // The eager calls after the launch (before the next one) that used each slot, in call order of
  // their last use: how many calls used it.
  std::vector<std::pair<Slot*, int>> tail;
  // Around each of those calls that waited for vaswap (restores, pages): events on its stream
  // before and after its wait, taken out of the times like `asked`.
  std::vector<std::pair<CUevent, CUevent>> tail_waits;
};

// The period learning found. `window` is the last complete period and the launch that began the
// next (whose start event ends the period); it owns their events until learned_times() drops them.
struct Learned {
  int device = 0;              // the device of the first slot used (the planning worker's)
  std::vector<Seen> window;    // period + 1 launches
  std::vector<Slot*> regions;  // index -> slot
  std::vector<int> devices;    // index -> the slot's device (read while the slots surely live)
  std::vector<uint64_t> ids;   // index -> the slot's id (likewise: for the trace)
  plan::Period period;         // uses per position (the union over the periods observed)
  // Per position, the eager calls after its launch that used each region (index -> calls), where
  // every period observed agrees; -1 where they differ. A region the tail never used is absent.
  std::vector<std::map<int, int>> tail_calls;
  double parked_us = 0;  // learning's waits taken out of the period's times
};

class Learner {
 public:
  Learner() = default;
  Learner(const Learner&) = delete;
  Learner& operator=(const Learner&) = delete;
  ~Learner() { clear(); }

  // Before vaswap waits for the next launch's slots on `stream`: an event that observe() gives
  // that launch, so that the time the stream then waits is not counted in the period's times.
  // Never throws: where the event cannot be made or recorded, the launch has none.
  void ask(CUstream stream) noexcept;
  // A graph launch on `stream` (enqueued next) that uses `slots`: a timing event is recorded on
  // the stream before it. Returns the period once the launches repeat `repeats` times with it
  // (then take() hands it over), else 0.
  int observe(CUgraphExec exec, CUstream stream, const std::vector<Slot*>& slots, int repeats);
  // The launch of `exec` observed last was enqueued: a timing event after it.
  void launched(CUgraphExec exec, CUstream stream);
  // Eager work after the last launch observed uses `slots` too.
  void also_uses(const std::vector<Slot*>& slots);
  // Before and after an eager call's slots are made resident on `stream`, as ask() for a launch:
  // where it `waited` (on the host, or a wait enqueued on the stream), the stream's wait is timed
  // and taken out of the period's times. Only on the stream of the last launch: a wait on another
  // stream holds the launches back only where the program orders them after it. ask_eager()'s
  // event (null: none) is the caller's, so that calls from several threads keep their own; it
  // goes back through eager_acquired(), which keeps or destroys it. Never throw: without the
  // events the wait stays in.
  CUevent ask_eager(CUstream stream) noexcept;
  void eager_acquired(CUevent before, CUstream stream, bool waited) noexcept;
  // The period observe() returned, with its events; learning is empty again.
  std::shared_ptr<Learned> take(int period, int repeats);

  bool empty() const { return seen_.empty(); }
  size_t size() const { return seen_.size(); }
  bool saw(CUgraphExec exec) const;
  void forget(Slot* slot);
  void clear();  // drops what was seen and its events

 private:
  std::vector<Seen> seen_;
  CUevent asked_ = nullptr;  // ask()'s, until observe() takes it
};

// On the planning worker: the period's timing on the device's clock (it waits for the last
// launch's start event), into learned.period, without the time streams waited for vaswap before
// each launch and before the eager calls after it while learning (learning restores on demand;
// the plan's restores are ahead): each position is moved earlier by the waits before it, and the
// period is shortened by all of them (learned.parked_us). Then the window's events are destroyed.
void learned_times(Learned& learned);

// One learned launch on the device's clock, in microseconds from the first launch's start: the
// time its stream waited for vaswap before it (0: none recorded), its start, and its end (< 0:
// no end event; the next launch's start, before that one's wait, stands for it).
struct LaunchClock {
  double waited_us = 0;
  double start_us = 0;
  double end_us = -1;
};
// learned_times()'s arithmetic: `window` is a period and the launch that began the next; the
// period's start_us, end_us and length_us go into `period`, without the waits. Returns the waits
// taken out.
double period_without_waits(const std::vector<LaunchClock>& window, plan::Period* period);

// Per region, the eager calls after one position's launch that used it, merged over the periods
// observed (`periods`: each period's counts at that position): the count where every period has
// the same (a region a period's tail did not use counts 0 there), else -1.
std::map<int, int> agreed_tail_calls(const std::vector<std::map<int, int>>& periods);

// Destroys the launches' timing events.
void drop_events(std::vector<Seen>& seen);

}  // namespace planner
}  // namespace vaswap
