// The executor (DESIGN.md section 5): the schedule in force, launch by launch. Learning gives it
// the period's graphs in order; once the planning worker has chosen (schedule.h), it holds each
// position's releases and restores. The planner asks it where a launch sits and what is due there;
// residency carries the actions out. No driver calls; not thread-safe (the planner's lock).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace vaswap {

struct Slot;

namespace planner {

class Executor {
 public:
  // Learning found this period (the graphs by position); the launch that completed it was
  // position 0. Positions are followed from here; nothing is due until install().
  void follow(std::vector<CUgraphExec> keys);
  // Plan number `id`: per position, the slots whose release or restore is issued there.
  // `after_calls` (optional), per release: where it may be issued before its position's launch,
  // as soon as its slot's last use in the position before has been enqueued (invariant 3 counts
  // from there): 0 right after that position's launch, k after the k-th eager call since that
  // launch that uses the slot; -1 only at its own launch.
  void install(uint64_t id, std::vector<std::vector<Slot*>> releases,
               std::vector<std::vector<Slot*>> restores,
               std::vector<std::vector<int>> after_calls = {});
  // Learning again: no period, no plan.
  void clear();

  // Where the launch of `exec` sits: the position expected next, or, out of order, the next one
  // that launches it (the executor goes on from there; an evaluation step, a skipped graph). -1
  // when the period has no such graph (a new pattern). `expected` gets the position expected.
  int locate(CUgraphExec exec, int* expected);
  // What is due at the current position (empty until a plan is installed): its releases not
  // issued early (below), and its restores. Valid until the executor changes.
  const std::vector<Slot*>& releases() const;
  const std::vector<Slot*>& restores() const;
  // The launch at the current position was handled: on to the next.
  void next();

  // Early releases, for the position the executor is at (the launch before it was enqueued last).
  // Each returns the releases that may be issued now and counts them as issued: after that launch,
  // and after an eager call that uses `used`.
  std::vector<Slot*> due_after_launch();
  std::vector<Slot*> due_after_eager(const std::vector<Slot*>& used);

  int position() const { return position_; }
  uint64_t plan() const { return plan_; }
  bool knows(CUgraphExec exec) const;
  // `slot` is being freed: it leaves every window. True if one named it.
  bool forget(Slot* slot);

 private:
  std::vector<CUgraphExec> keys_;  // the period being planned or in force
  std::vector<std::vector<Slot*>> releases_, restores_;
  std::vector<std::vector<int>> after_calls_;  // per release, as installed
  uint64_t plan_ = 0;
  int position_ = 0;
  // The current position's releases: eager calls counted for each, and which were issued early.
  std::vector<int> calls_;
  std::vector<bool> issued_;
  size_t issued_count_ = 0;
  mutable std::vector<Slot*> left_;  // releases(), where some were issued early
  void reset_early();
  // Marks as issued, and returns, the current position's releases not yet issued for which
  // `due(i)` holds (i: the release's index in its position).
  template <class Due>
  std::vector<Slot*> take_due(Due due);
};

}  // namespace planner
}  // namespace vaswap
