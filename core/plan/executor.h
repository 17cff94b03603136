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
  void install(uint64_t id, std::vector<std::vector<Slot*>> releases,
               std::vector<std::vector<Slot*>> restores);
  // Learning again: no period, no plan.
  void clear();

  // Where the launch of `exec` sits: the position expected next, or, out of order, the next one
  // that launches it (the executor goes on from there; an evaluation step, a skipped graph). -1
  // when the period has no such graph (a new pattern). `expected` gets the position expected.
  int locate(CUgraphExec exec, int* expected);
  // What is due at the current position (empty until a plan is installed).
  const std::vector<Slot*>& releases() const;
  const std::vector<Slot*>& restores() const;
  // The launch at the current position was handled: on to the next.
  void next();

  int position() const { return position_; }
  uint64_t plan() const { return plan_; }
  bool knows(CUgraphExec exec) const;
  // `slot` is being freed: it leaves every window. True if one named it.
  bool forget(Slot* slot);

 private:
  std::vector<CUgraphExec> keys_;  // the period being planned or in force
  std::vector<std::vector<Slot*>> releases_, restores_;
  uint64_t plan_ = 0;
  int position_ = 0;
};

}  // namespace planner
}  // namespace vaswap
