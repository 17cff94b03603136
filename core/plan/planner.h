// The planner (DESIGN.md section 5): it learns the periodic order of graph launches and which
// slots each launch and the eager work after it use, has plan.h choose what must leave the
// device for the slots to fit the residency budget, and carries the schedule out launch by launch
// through residency.h, which holds the pages, evicts and restores.
//
// Phases: learning (schedule.learning_steps identical periods observed, with device timing
// events around each graph launch), planning (the schedule is computed on a worker thread while
// launches go on), steady (the schedule in force), off (no period found: residency alone, least
// recently used first). A new capture, a launch of a graph the schedule does not know, a changed
// graph or a freed slot sends it back to learning.
//
// Whatever the phase, invariant 2 holds: before a graph launch, and before an eager kernel, copy
// or memset the hooks see, every slot it uses is resident and the launching stream waits (on the
// device) for its data. A launch that cannot fit the budget gets the API's out-of-memory error.
// Calls come from the preload's hooks (intercept.h), on the application's threads, outside any
// capture.
//
// Its parts: learning (learner.h) records the launches until they repeat; the copy test
// (copy_test.h) measures the link once per device; the pure schedule (schedule.h) chooses the
// windows on the planning worker; the executor (executor.h) follows the period and says what is
// due at each launch, which this file has residency carry out.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "observe/launch_times.h"
#include "plan/residency.h"
#include "policy.h"

namespace vaswap {

struct Slot;

namespace planner {

// Takes the policy's mode, schedule, guard, rules, residency and trace.memory_interval. Called
// once, at start. `slots_of_capture` answers rules mode: the slots allocated during the N-th
// capture.
void configure(const Policy& policy,
               std::function<std::vector<Slot*>(uint64_t capture)> slots_of_capture);

// True while eager launches and copies must be scanned for the slots they use: always, except in
// steady state with the guard off. One relaxed load.
bool wants_eager();

// What a launch holds between before_* and after_*: its slots, pinned resident.
struct Ticket {
  CUresult result = CUDA_SUCCESS;  // not success: do not launch; `message` says why
  std::string message;
  residency::Acquired acquired;
  launch_times::Timing timing;  // a graph launch's timing events (trace.launch_times)
  residency::Quiet quiet;       // a first launch's: no stream parked until it is enqueued
  // An eager call's: planned releases whose slots it uses last before the next launch
  // (schedule.release_after_use), issued once it is enqueued, if learning has not begun again.
  std::vector<Slot*> release_after;
  // Its slots lent to a rewritten graph's executor (inside.h): they are not in `acquired`, and
  // inside::used_elsewhere orders that graph's next launch after this work.
  std::vector<Slot*> borrowed;
  uint64_t generation = 0;
  int next_position = -1;  // a steady launch's: the executor's position once it was handled
};

// Before and after the real graph launch. `slots`: the slots the graph's nodes reference.
// `capture` is the position of the capture that made the graph among the process's captures
// (1 for the first; 0 when unknown), which is how rules name graphs.
Ticket before_graph(const char* symbol, CUgraphExec exec, CUstream stream,
                    const std::vector<Slot*>& slots, uint64_t capture);
void after_graph(CUgraphExec exec, CUstream stream, uint64_t capture, const Ticket& ticket);

// Before and after an eager kernel, copy or memset on `stream` that uses `slots` (never empty).
// `shape`: a copy or memset the device handshake may make as a graph instead
// (residency::EagerShape; the ticket's acquired.substitute says so).
Ticket before_eager(const char* symbol, CUstream stream, const std::vector<Slot*>& slots,
                    residency::Checked checked, const residency::EagerShape* shape = nullptr);
void after_eager(const Ticket& ticket);

// A capture began: the launch pattern may change, so learning starts over.
void capture_begun();

// An executable graph was changed (updated, or a node given new parameters): what it uses may
// differ, so a plan or a learned pattern that contains it starts over.
void exec_changed(CUgraphExec exec);

// `slot` is about to be destroyed: the planner lets go of it (and learns again if a plan used it).
void forget(Slot* slot);

// Counts for the C API's stats and the tests.
struct Counters {
  uint64_t plans = 0, planned_offloads = 0, planned_restores = 0, on_demand_restores = 0,
           guard_hits = 0, deviations = 0, stalls = 0;
  uint64_t regions_offloaded = 0;  // distinct slots evicted at least once
  double stall_us = 0;             // host time spent waiting for restores to be submitted
  uint64_t map_waits = 0;          // copies and memsets that waited for pages to be mapped
  double map_wait_us = 0;
};
Counters counters();

}  // namespace planner
}  // namespace vaswap
