#!/usr/bin/env python3
"""Medians of the driver-call times in a vaswap trace's remap and release events.

    python3 bench/trace_vmm_medians.py bench/results/slot_bench_trace_h200.jsonl.gz
"""
import gzip
import json
import statistics
import sys


def main(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = [json.loads(line) for line in f]
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


if __name__ == "__main__":
    main(sys.argv[1])
