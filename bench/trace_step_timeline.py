#!/usr/bin/env python3
"""One steady-state step of a per-layer job, as a timeline of its launches and residency's moves.

Reads a trace recorded with trace.launch_times=true and prints, for step STEP after the first
plan came into force (trace_parked_steps.steps_in_force counts them: PERIOD launches each, from
the trace's first launch), every graph launch (its position, parked and graph device time) and
every residency event around it (evict, d2h, release, fetch, remap, h2d, plan_offload,
plan_restore, restore_wait), in microseconds on the host clock from the step's first launch.
A d2h's or h2d's time is its copy's start (its end minus dur_us); a remap's and a release's are
when the call was made; a launch's is when it was enqueued. Reading the parks of one position
against the restores of the slots it uses (the plan_window events name each slot's next use)
shows which chain of copies and maps it waited for.

Usage: python3 bench/trace_step_timeline.py [--period N] [--step S] TRACE.jsonl
"""
import argparse
import json

from trace_events import load
from trace_parked_steps import steps_in_force

KINDS = ("evict", "d2h", "release", "fetch", "remap", "h2d", "plan_offload", "plan_restore",
         "restore_wait")
DROP = ("t_ns", "ev", "tid", "va", "device", "stream", "api")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--period", type=int, default=16, help="graph launches per step (16)")
    ap.add_argument("--step", type=int, default=5, help="the step after the plan's first (5)")
    ap.add_argument("trace")
    args = ap.parse_args()
    p = args.period
    events = load(args.trace)
    steps = steps_in_force(events, p)
    if steps is None:
        raise SystemExit(f"{args.trace}: no plan or no launch_time events")
    if args.step >= len(steps):
        raise SystemExit(f"{args.trace}: no step {args.step} after the plan")
    step = steps[args.step]
    t0 = step[0]["enqueued_ns"]
    after = (steps[args.step + 1][0]["enqueued_ns"] if args.step + 1 < len(steps)
             else step[-1]["enqueued_ns"])
    rows = [(e["enqueued_ns"], f"LAUNCH position {k}: parked {e['parked_us']:.0f} us, "
             f"graph {e['graph_us']:.0f} us") for k, e in enumerate(step)]
    for e in events:
        if e["ev"] in KINDS and t0 - 5e6 <= e["t_ns"] <= after + 5e6:
            fields = {k: v for k, v in e.items() if k not in DROP}
            rows.append((e["t_ns"], f"{e['ev']} {json.dumps(fields)}"))
    for t, row in sorted(rows, key=lambda r: r[0]):
        print(f"{(t - t0) / 1e3:9.0f} {row}")


if __name__ == "__main__":
    main()
