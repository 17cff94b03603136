#!/usr/bin/env python3
"""How a job's steady steps begin: what moved while the program worked on the host before a step's
first launch, and how far into the step its restores mapped.

Reads traces (any run under vaswap; trace.launch_times is not needed) and prints, per trace, one
Markdown row of medians over the steps after the first plan came into force (from the third):
- releases (unmaps) and maps made in the WINDOW ms before the step's first launch (10 by
  default; the host's work between steps, such as the static demo's 30 ms hash of its output:
  a host that runs ahead of the device enqueues a step's launches long before they run, so the
  time since its last launch says nothing about when the device went idle);
- when the step's first and K-th maps were made (K=5 by default), from its first launch;
- the planned releases by where they were issued (plan_offload's `issued`: at their launch, or
  right after their slots' last use with schedule.release_after_use), per step.
A step begins at each launch of the graph launched first after the plan (the program must launch
it once per step). With schedule.release_after_use the releases due at a step's first launch run
in the gap before it, and its first maps no longer wait for their room
(docs/PLANNER.md, "Releases after the last use").

Usage: python3 bench/trace_step_start.py [--window MS] [--kth K] TRACE.jsonl...
"""
import argparse
import json
import statistics


def steps(events):
    """(first launch, last launch) host times of each step after the first plan, in order."""
    plans = [e["t_ns"] for e in events if e["ev"] == "plan"]
    if not plans:
        return []
    launches = [e for e in events if e["ev"] == "graph_launch" and e["t_ns"] > plans[0]]
    if not launches:
        return []
    first = launches[0]["exec"]
    out = []
    for e in launches:
        if e["exec"] == first:
            out.append([e["t_ns"], e["t_ns"]])
        else:
            out[-1][1] = e["t_ns"]
    return out


def row(path, window_ms, kth):
    with open(path) as f:
        events = sorted((json.loads(line) for line in f), key=lambda e: e["t_ns"])
    bounds = steps(events)
    if len(bounds) < 4:
        return f"| {path} | fewer than 4 steps after the plan | | | |"
    unmaps, maps, first_map, kth_map, issued = [], [], [], [], {}
    for (start, _), (next_start, _) in zip(bounds[2:], bounds[3:]):
        since = start - window_ms * 1e6
        unmaps.append(sum(1 for e in events if e["ev"] == "release" and since < e["t_ns"] < start))
        maps.append(sum(1 for e in events if e["ev"] == "remap" and since < e["t_ns"] < start))
        step_maps = [e["t_ns"] for e in events if e["ev"] == "remap" and start <= e["t_ns"] < next_start]
        if step_maps:
            first_map.append((step_maps[0] - start) / 1e6)
        if len(step_maps) >= kth:
            kth_map.append((step_maps[kth - 1] - start) / 1e6)
        for e in events:
            if e["ev"] == "plan_offload" and start <= e["t_ns"] < next_start:
                kind = e.get("issued", "launch")
                issued.setdefault(kind, []).append(e["slots"])
    n = len(unmaps)
    med = lambda xs: f"{statistics.median(xs):.2f}" if xs else "-"
    kinds = ", ".join(f"{k} {sum(v) / n:.1f}" for k, v in sorted(issued.items()))
    return (f"| {path} | {n} | {med(unmaps)}, {med(maps)} | {med(first_map)}, "
            f"{med(kth_map)} | {kinds or '-'} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=float, default=10, help="ms before a step counted (10)")
    ap.add_argument("--kth", type=int, default=5, help="the map whose time into the step is shown (5)")
    ap.add_argument("traces", nargs="+")
    args = ap.parse_args()
    print(f"| trace | steps | unmaps, maps in the {args.window:g} ms before the step | first, "
          f"{args.kth}th map into the step (ms) | planned releases per step, by where issued |")
    print("|---|---:|---|---|---|")
    for path in args.traces:
        print(row(path, args.window, args.kth))


if __name__ == "__main__":
    main()
