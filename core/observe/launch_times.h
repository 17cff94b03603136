// trace.launch_times: the device times of every graph launch (docs/TRACE.md, `launch_time`), for
// finding where a step's time goes under vaswap (docs/PERFORMANCE.md). Three timing events on the
// launching stream: before vaswap's waits for the launch's slots (either handshake), just before
// the graph, and after it. A launch whose events have completed is traced with
//   parked_us: first to second event: the stream waited for vaswap before the graph could start
//              (restores, room; under the host handshake, also the thread's own wait);
//   graph_us:  the graph itself (copies vaswap runs beside it slow it here, if at all);
//   since_us:  from the end of the stream's previous timed launch to the first event: the eager
//              work and host gaps between launches.
// A diagnostic: three events per launch, recorded by the launching thread; completed launches are
// traced at later launches (up to 64 looked at each time, none while a capture is open: an event
// query would invalidate another thread's global-mode capture) and at exit (those still running
// then are not). Off by default.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>

namespace vaswap::launch_times {

// Whether launches are timed (trace.launch_times, and a trace is open). Set once, at start.
void configure(bool on);
bool enabled();

struct Event;  // a recorded timing event; destroyed when the last holder lets go

// What a launch holds between begin() and end().
struct Timing {
  std::shared_ptr<Event> before_waits, before_graph;
  uint64_t enqueued_ns = 0;
};

// Before vaswap's waits for a launch on `stream` (not capturing): the first event. Empty when
// off, or when the event could not be recorded (the log says so once, and timing stops).
Timing begin(CUstream stream);
// Just before the real launch: the second event.
void before_graph(Timing& timing, CUstream stream);
// After the real launch (`enqueued` false: it failed, and its events are dropped): the third
// event; then every timed launch whose events have completed is traced.
void end(Timing& timing, CUgraphExec exec, CUstream stream, bool enqueued);
// At exit: the launches completed since the last launch are traced (queries only, no wait: a
// launch still running, or a context already gone, leaves its launch out).
void finish();

}  // namespace vaswap::launch_times
