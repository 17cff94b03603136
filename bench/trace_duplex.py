#!/usr/bin/env python3
"""The link in both directions at once, from vaswap traces: each copy's speed alone and beside one
the other way.

Reads traces of a run under residency (any program; bench/run_overhead_h200.sh keeps them in its
runs archive) and prints, per trace, a Markdown row: for the D2H and the H2D copies of 8 MiB or
more made after the first plan came into force, how many ran alone and how many beside a copy the
other way (overlapping it for more than 30% of their own time), and the median GB/s of each
group, with the share the second keeps of the first.

A copy's interval is taken on the host clock (trace_events.copy_interval: `t_ns` is its start).
The planner's model is one way (the copy test
times each direction alone, docs/PLANNER.md); the shares say what copies beside each other got.

Usage: python3 bench/trace_duplex.py TRACE.jsonl...
"""
import statistics
import sys

from trace_events import copy_interval, first_plan_ns, load, overlap_ns

MIN_BYTES = 8 << 20
BESIDE = 0.3  # of a copy's own time, overlapped by copies the other way


def copies(path):
    events = load(path)
    after = first_plan_ns(events) or 0
    out = []
    for e in events:
        if e["ev"] in ("d2h", "h2d") and e["t_ns"] > after and e["bytes"] >= MIN_BYTES:
            if e["dur_us"] > 0:
                out.append((copy_interval(e), e["ev"], e["bytes"] / (e["dur_us"] * 1e3)))
    return out


def row(path):
    cs = copies(path)
    cells = []
    for kind in ("d2h", "h2d"):
        alone, beside = [], []
        other = [interval for interval, k, _ in cs if k != kind]
        for interval, k, gbps in cs:
            if k != kind:
                continue
            overlap = overlap_ns(interval, other)
            (beside if overlap > BESIDE * (interval[1] - interval[0]) else alone).append(gbps)
        a = statistics.median(alone) if alone else 0.0
        b = statistics.median(beside) if beside else 0.0
        share = f"{b / a:.2f}" if a > 0 and b > 0 else "-"
        cells += [f"{len(alone)}", f"{a:.1f}", f"{len(beside)}", f"{b:.1f}", share]
    name = "/".join(path.rstrip("/").split("/")[-2:])  # the run's folder and file
    return "| " + " | ".join([name] + cells) + " |"


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    print("| trace | D2H alone | GB/s | D2H beside H2D | GB/s | share | H2D alone | GB/s "
          "| H2D beside D2H | GB/s | share |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for path in sys.argv[1:]:
        print(row(path))


if __name__ == "__main__":
    main()
