#!/usr/bin/env python3
"""Median and range across separate runs of slot_bench (issue 17: one run's figure is the median
of its repetitions, but runs differ by several points, so a quoted figure is the median of runs).

    python3 bench/slot_bench_summary.py RUN1.md RUN2.md RUN3.md [--out FILE]

Each input is a table written by `slot_bench_cuda --out`. Prints one table: per measurement the
median value across runs, and its share of the raw baseline measured in the same run (median and
range across runs).
"""
import argparse
import re
import statistics
import sys


def read(path):
    rows = {}
    header = ""
    with open(path) as f:
        for line in f:
            if line.startswith("vaswap slot bench:"):
                header = line.strip()
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) != 5 or cells[0] in ("measurement", "---") or set(cells[1]) <= set("-:"):
                continue
            pct = lambda c: float(c.rstrip("%")) if c else None
            rows[cells[0]] = (float(cells[1]), cells[2], pct(cells[3]), pct(cells[4]))
    if not rows:
        sys.exit(f"slot_bench_summary: no table in {path}")
    return header, rows


def span(values):
    return f"{statistics.median(values):.1f}% ({min(values):.1f}-{max(values):.1f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--out")
    ap.add_argument("--note", help="a line under the title: the command, the machine, the date")
    a = ap.parse_args()
    runs = [read(p) for p in a.runs]
    n = len(runs)
    lines = [f"{runs[0][0]}; median across {n} separate runs (range in brackets)", ""]
    if a.note:
        lines += [a.note, ""]
    lines += ["| measurement | value (median) | unit | vs raw | vs raw on the slots' memory |",
              "|---|---:|---|---:|---:|"]
    for name, (_, unit, _, _) in runs[0][1].items():
        got = [r[1][name] for r in runs if name in r[1]]
        value = statistics.median(g[0] for g in got)
        raw = [g[2] for g in got if g[2] is not None]
        slots = [g[3] for g in got if g[3] is not None]
        lines.append(f"| {name} | {value:.2f} | {unit} | {span(raw) if raw else ''} | "
                     f"{span(slots) if slots else ''} |")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
