#!/usr/bin/env python3
"""Chooses the plans of recorded GPU runs again with this build's schedule, and compares.

    python3 bench/plan_replay_corpus.py PLAN_REPLAY ARCHIVE.tar.gz [ARCHIVE.tar.gz ...]

Each archive is a runs archive of bench/run_overhead_h200.sh (torch_layers_plain_N.json and
torch_layers_vaswap*_N.json/.jsonl). For every traced vaswap run it prints one row: the run's
median step (steps after the fifth) against the median of the same archive's plain runs; what the
run's own plan said would show (its `plan` event); what the run's windows show replayed by this
build's schedule (`plan_replay`'s "the run's windows, replayed now"); and what the set this build
chooses shows by the same replay, with its windows and resident peak. The last two are measured by
one replay in one process: the baseline is the run's own set. No GPU is needed.
"""
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile

SKIP = 5  # the steps before the plan is in force (learning), as run_overhead_h200.sh reports


def step_ms(path):
    return statistics.median(json.load(open(path))["step_ms"][SKIP:])


def first_plan_exposed(trace):
    with open(trace) as f:
        for line in f:
            if '"ev":"plan"' in line:
                return json.loads(line)["exposed_us"]
    return None


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    plan_replay = sys.argv[1]
    print("| archive | run | step ms | vs plain | run's plan said (us) | run's windows replayed now (us) "
          "| chosen now (us) | windows | resident at worst (MiB) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    ratios = []
    for archive in sys.argv[2:]:
        with tempfile.TemporaryDirectory() as d:
            with tarfile.open(archive) as t:
                t.extractall(d)  # the project's own archives
            plain = [step_ms(p) for p in sorted(glob.glob(os.path.join(d, "**/*_plain_*.json"), recursive=True))]
            base = statistics.median(plain) if plain else None
            for trace in sorted(glob.glob(os.path.join(d, "**/*_vaswap*_[0-9].jsonl"), recursive=True)):
                run = os.path.basename(trace)[: -len(".jsonl")]
                step = step_ms(trace[: -len(".jsonl")] + ".json")
                out = subprocess.run([plan_replay, trace], capture_output=True, text=True).stdout
                chosen = re.search(r"chosen now: (\d+) windows, \d+ MiB each way per period, (\d+) MiB "
                                   r"resident at the worst position, ([0-9.]+) us shown", out)
                theirs = re.search(r"the run's windows, replayed now: ([0-9.]+) us shown", out)
                if not chosen or not theirs:
                    print(f"| {os.path.basename(archive)} | {run} | no plan replayed | | | | | | |")
                    continue
                said = first_plan_exposed(trace)
                vs = f"{100 * (step / base - 1):+.1f}%" if base else "-"
                ratios.append(float(chosen[3]) / max(float(theirs[1]), 1e-9))
                print(f"| {os.path.basename(archive)} | {run} | {step:.2f} | {vs} | {said:.0f} | "
                      f"{float(theirs[1]):.0f} | {float(chosen[3]):.0f} | {chosen[1]} | {chosen[2]} |")
    if ratios:
        print(f"\n{len(ratios)} runs: the set chosen now shows {statistics.median(ratios):.2f} of what the "
              f"run's windows show (median; range {min(ratios):.2f}-{max(ratios):.2f}), by the same replay")


if __name__ == "__main__":
    main()
