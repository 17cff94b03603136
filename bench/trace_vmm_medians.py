#!/usr/bin/env python3
"""The driver-call times in vaswap traces' remap and release events.

    python3 bench/trace_vmm_medians.py TRACE.jsonl[.gz]
        Medians of each call (create, map, access, unmap, release) for synchronous remaps, worker
        remaps and worker releases (docs/PERFORMANCE.md).

    python3 bench/trace_vmm_medians.py --by-phase TRACE.jsonl[.gz]...
        What a run's own maps, unmaps and copies cost against the copy test's figures
        (docs/PLANNER.md, "The model"). Per trace, a Markdown row: the `model` event's copy test
        figures (H2D and D2H GB/s as the test measured them, where the event has them; remap_us: an
        idle map, the best of three), the 90th percentile of the speeds of the run's own copies of
        8 MiB or more before the first plan, each way, then for the remaps (create + map + access)
        and the releases (unmap + release) made before the first plan (learning) and after it, the
        count, median and 90th percentile, and the figure the planner's model takes at the first
        plan (remap_seen_us: the 90th percentile of the last 128 maps plus that of the last 128
        unmaps before it, nearest rank).

    python3 bench/trace_vmm_medians.py --beside-copies TRACE.jsonl[.gz]...
        Per trace, a Markdown row: each remap's cuMemSetAccess time (access_us) by what vaswap's
        copies were doing when it began: a D2H in flight, an H2D only, or neither (count, median,
        90th percentile; a copy counts when it began within 50 us after the remap's start or
        before it, and ended after it). On the H200 the call waits about 0.74 ms whenever a D2H
        runs (bench/results/access_beside_copy_h200.md).
"""
import argparse
import gzip
import json
import math
import statistics


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f]


def medians(path):
    events = load(path)
    groups = {
        "synchronous remaps": [e for e in events if e["ev"] == "remap" and e.get("sync")],
        "worker remaps": [e for e in events if e["ev"] == "remap" and not e.get("sync")],
        "worker releases": [e for e in events if e["ev"] == "release" and not e.get("sync")],
    }
    print("| events | count | create_us | map_us | access_us | unmap_us | release_us |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, group in groups.items():
        cells = []
        for key in ("create_us", "map_us", "access_us", "unmap_us", "release_us"):
            values = [e[key] for e in group if key in e]
            cells.append(f"{statistics.median(values):.0f}" if values else "")
        print(f"| {name} | {len(group)} | " + " | ".join(cells) + " |")

def quantile(values, q):
    """Nearest rank, as core/slots/device_costs.cpp."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def cells(values):
    if not values:
        return "0, -, -"
    return "%d, %.0f, %.0f" % (len(values), statistics.median(values), quantile(values, 0.9))


def row(path):
    events = load(path)
    plans = [e["t_ns"] for e in events if e["ev"] == "plan"]
    first_plan = plans[0] if plans else math.inf
    model = next((e for e in events if e["ev"] == "model"), None)
    maps = [(e["t_ns"], e["create_us"] + e["map_us"] + e["access_us"]) for e in events
            if e["ev"] == "remap"]
    unmaps = [(e["t_ns"], e["unmap_us"] + e["release_us"]) for e in events if e["ev"] == "release"]
    before = lambda xs: [us for t, us in xs if t < first_plan]
    after = lambda xs: [us for t, us in xs if t >= first_plan]
    seen_maps, seen_unmaps = before(maps)[-128:], before(unmaps)[-128:]
    seen = (quantile(seen_maps, 0.9) + quantile(seen_unmaps, 0.9)
            if len(seen_maps) >= 16 and len(seen_unmaps) >= 16 else 0)
    test = "%.0f" % model["remap_us"] if model else "-"
    # The copy test's own speeds: where the event has the run's (h2d_seen_gbps), the larger of the
    # two is in h2d_gbps and the test's is not recorded apart.
    link = ("%.1f / %.1f" % (model["h2d_gbps"], model["d2h_gbps"])
            if model and "h2d_seen_gbps" not in model else "-")
    speeds = {}
    for way in ("h2d", "d2h"):
        gbps = [e["bytes"] / (e["dur_us"] * 1e3) for e in events
                if e["ev"] == way and e["t_ns"] < first_plan and e["bytes"] >= 8 << 20
                and e.get("dur_us", 0) > 0][-128:]
        speeds[way] = "%.1f" % quantile(gbps, 0.9) if len(gbps) >= 16 else "-"
    name = path.rsplit("/", 1)[-1]
    return (f"| {name} | {link} | {speeds['h2d']} / {speeds['d2h']} | {test} | {cells(before(maps))} | {cells(before(unmaps))} | "
            f"{cells(after(maps))} | {cells(after(unmaps))} | {seen:.0f} |")


def by_phase(paths):
    print("| trace | copy test H2D / D2H GB/s | the run's copies before the plan, p90 H2D / D2H GB/s | "
          "copy test remap us | learning maps: n, median, p90 us | learning unmaps | "
          "planned maps | planned unmaps | remap_seen_us at the first plan |")
    print("|---|---|---|---:|---|---|---|---|---:|")
    for path in paths:
        print(row(path))


def beside_copies(paths):
    print("| trace | remaps beside a D2H: n, median, p90 access us | beside an H2D only | "
          "beside no copy |")
    print("|---|---|---|---|")
    for path in paths:
        events = load(path)
        spans = {way: [(e["t_ns"], e["t_ns"] + e["dur_us"] * 1e3) for e in events
                       if e["ev"] == way and e.get("dur_us")] for way in ("d2h", "h2d")}
        groups = {"d2h": [], "h2d": [], "none": []}
        for e in events:
            if e["ev"] != "remap" or "access_us" not in e:
                continue
            t = e["t_ns"]
            in_flight = {way: any(s <= t + 50e3 and t < f for s, f in spans[way])
                         for way in spans}
            key = "d2h" if in_flight["d2h"] else "h2d" if in_flight["h2d"] else "none"
            groups[key].append(e["access_us"])
        name = path.rsplit("/", 1)[-1]
        print(f"| {name} | " + " | ".join(cells(groups[k]) for k in ("d2h", "h2d", "none")) + " |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--by-phase", action="store_true",
                        help="a row per trace: learning's and the plan's maps, unmaps and copies")
    parser.add_argument("--beside-copies", action="store_true",
                        help="a row per trace: cuMemSetAccess beside a D2H, an H2D, or neither")
    parser.add_argument("traces", nargs="+")
    args = parser.parse_args()
    if args.by_phase:
        by_phase(args.traces)
    elif args.beside_copies:
        beside_copies(args.traces)
    else:
        for path in args.traces:
            medians(path)


if __name__ == "__main__":
    main()
