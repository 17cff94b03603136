#!/usr/bin/env python3
"""Residency's driver calls against its restore copies, in steady state, from vaswap traces.

    python3 bench/trace_h2d_overlap.py TRACE.jsonl[.gz] ...

docs/PERFORMANCE.md, fact 1: any VMM call halves an H2D copy that runs at the time (measured
with bench/vmm_interference.cu), and residency, unlike the C API's workers, does not hold its
calls back while its restores copy. Per trace, after the first plan came into force: the steps
(launches of the period's first graph), the remaps (cuMemCreate, cuMemMap, cuMemSetAccess) and
releases (cuMemUnmap, cuMemRelease) per step with the calls' median times, the host time spent
in them per step, and the restores' H2D copies that overlapped one of those calls (their time
intervals on the host clock, trace_events.copy_interval) against those that did not, with
the copies' median GB/s.
"""
import statistics
import sys

from trace_events import copy_interval, first_plan_ns, load, overlap_ns


def analyse(path):
    ev = load(path)
    after = first_plan_ns(ev)
    if after is None:
        return None
    launches = [e for e in ev if e["ev"] == "graph_launch" and e["t_ns"] > after]
    if not launches:
        return None
    first = launches[0]["exec"]
    steps = sum(1 for e in launches if e["exec"] == first)
    remaps = [e for e in ev if e["ev"] == "remap" and e["t_ns"] > after]
    releases = [e for e in ev if e["ev"] == "release" and e["t_ns"] > after]
    calls = [(e["t_ns"], e["t_ns"] + 1e3 * (e.get("create_us", 0) + e.get("map_us", 0) +
                                             e.get("access_us", 0))) for e in remaps]
    calls += [(e["t_ns"], e["t_ns"] + 1e3 * (e.get("unmap_us", 0) + e.get("release_us", 0)))
              for e in releases]
    overlapped, clean = [], []
    for e in ev:
        if e["ev"] != "h2d" or e["t_ns"] <= after or e["dur_us"] <= 0:
            continue
        overlap_us = overlap_ns(copy_interval(e), calls) / 1e3
        gbps = e["bytes"] / e["dur_us"] / 1e3
        (overlapped if overlap_us > 0 else clean).append((gbps, overlap_us))

    def med(values):
        return statistics.median(values) if values else float("nan")

    return {
        "trace": path.split("/")[-1],
        "steps": steps,
        "remaps": len(remaps) / steps,
        "releases": len(releases) / steps,
        "access_us": med([e.get("access_us", 0) for e in remaps]),
        "map_us": med([e.get("map_us", 0) for e in remaps]),
        "create_us": med([e.get("create_us", 0) for e in remaps]),
        "unmap_us": med([e.get("unmap_us", 0) for e in releases]),
        "calls_ms": sum(b - a for a, b in calls) / 1e6 / steps,
        "overlapped": len(overlapped),
        "clean": len(clean),
        "overlap_us": med([o for _, o in overlapped]),
        "overlapped_gbps": med([g for g, _ in overlapped]),
        "clean_gbps": med([g for g, _ in clean]),
    }


def main(paths):
    print("| trace | steps | remaps, releases per step | median create / map / access / unmap us | "
          "VMM call time per step ms | H2D overlapping a call (median overlap us) | "
          "their GB/s | H2D with none | their GB/s |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|")
    for path in paths:
        r = analyse(path)
        if r is None:
            print(f"| {path.split('/')[-1]} | no plan in force | | | | | | | |")
            continue
        print(f"| {r['trace']} | {r['steps']} | {r['remaps']:.1f}, {r['releases']:.1f} | "
              f"{r['create_us']:.0f} / {r['map_us']:.0f} / {r['access_us']:.0f} / "
              f"{r['unmap_us']:.0f} | {r['calls_ms']:.1f} | {r['overlapped']} "
              f"({r['overlap_us']:.0f}) | {r['overlapped_gbps']:.1f} | {r['clean']} | "
              f"{r['clean_gbps']:.1f} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
