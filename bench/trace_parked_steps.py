#!/usr/bin/env python3
"""Per step of a per-layer job's steady state, where the stream waited for vaswap.

Reads traces recorded with trace.launch_times=true (bench/run_overhead_h200.sh with
EXTRA_CONF=trace.launch_times=true) and prints, per trace, a Markdown row: the parked time of each
step after the first plan came into force, the graphs' own device time per step (median), and the
positions whose median parked time from the third step in force on exceeds 20 us.

Launches are ordered by when they were enqueued (`enqueued_ns`; an event's `t_ns` is when it was
written, at a later launch). Steps are counted from the trace's first launch, PERIOD launches each
(16 by default: the per-layer PyTorch job's eight forward and eight backward graphs), so the
program must launch exactly PERIOD graphs per step from its first; a step is "in force" when it
was enqueued after the first plan event.

Usage: python3 bench/trace_parked_steps.py [--period N] TRACE.jsonl...
"""
import argparse
import statistics

from trace_events import load


def steps_in_force(events, period):
    """The whole steps enqueued after the first plan: lists of PERIOD launch_time events each,
    counted from the trace's first launch, in the order they were enqueued. None when the trace
    has no plan or no launch_time events."""
    plans = [e["t_ns"] for e in events if e["ev"] == "plan"]
    times = sorted((e for e in events if e["ev"] == "launch_time"),
                   key=lambda e: e["enqueued_ns"])
    if not plans or not times:
        return None
    first = next((i for i, e in enumerate(times) if e["enqueued_ns"] > plans[0]), len(times))
    first = -(-first // period) * period  # the first whole step enqueued after the plan
    return [times[i:i + period] for i in range(first, len(times) - period + 1, period)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--period", type=int, default=16, help="graph launches per step (16)")
    ap.add_argument("traces", nargs="+")
    args = ap.parse_args()
    p = args.period
    print("| trace | parked ms per step, from the plan's first step | graphs ms per step (median) "
          "| positions parked > 20 us from the third step in force (median us) |")
    print("|---|---|---:|---|")
    for path in args.traces:
        events = load(path)
        steps = steps_in_force(events, p)
        if steps is None:
            print(f"| {path} | no plan or no launch_time events | | |")
            continue
        parked = [sum(e["parked_us"] for e in s) / 1e3 for s in steps]
        graphs = [sum(e["graph_us"] for e in s) / 1e3 for s in steps]
        per = [[] for _ in range(p)]
        for s in steps[2:]:
            for k, e in enumerate(s):
                per[k].append(e["parked_us"])
        where = ", ".join(f"{k}: {statistics.median(v):.0f}" for k, v in enumerate(per)
                          if v and statistics.median(v) > 20)
        row = " ".join(f"{x:.1f}" for x in parked)
        med = statistics.median(graphs) if graphs else 0.0
        print(f"| {path.split('/')[-1]} | {row} | {med:.1f} | {where} |")


if __name__ == "__main__":
    main()
