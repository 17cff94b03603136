#!/usr/bin/env python3
"""Summarizes planner runs: one row per run, from the program's output and vaswap's trace.

    planner_summary.py NAME:PLAIN.json:VASWAP.json:TRACE.jsonl ...

PLAIN.json and VASWAP.json hold the program's results ({"losses" or "checksum", "step_ms" or
"ms_per_step"}); TRACE.jsonl is the vaswap run's trace, with trace.memory_interval set. Prints a
Markdown table and exits 1 when any run's results differ from its plain run.
"""
import json
import statistics
import sys


def load_trace(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def steady_ms(result):
    """Median step time over the second half of the steps (the plan is in force by then)."""
    steps = result.get("step_ms")
    if not steps:
        return result["ms_per_step"]
    return statistics.median(steps[len(steps) // 2:])


def summarize(name, plain, vaswap, events):
    plans = [e for e in events if e["ev"] == "plan"]
    model = next((e for e in events if e["ev"] == "model"), None)
    launches = [e["t_ns"] for e in events if e["ev"] == "graph_launch"]
    samples = [e for e in events if e["ev"] == "mem_sample"]
    row = {"run": name}
    same_key = "losses" if "losses" in plain else "checksum"
    row["identical"] = plain[same_key] == vaswap[same_key]
    row["plain_ms"] = steady_ms(plain)
    row["vaswap_ms"] = steady_ms(vaswap)
    row["overhead_pct"] = 100.0 * (row["vaswap_ms"] / row["plain_ms"] - 1.0)
    if plans:
        p = plans[-1]
        row.update(period=p["period"], period_us=p["period_us"], regions=p["regions"],
                   region_bytes=p["region_bytes"], windows=p["windows"],
                   planned_bytes=p["peak_bytes"], reason=p.get("reason", ""))
        t_plan = p["t_ns"]
        before = [s["free"] for s in samples if s["t_ns"] <= t_plan]
        after = [s["free"] for s in samples if t_plan < s["t_ns"] <= (launches[-1] if launches else 0)]
        if before and after:
            row["freed_bytes"] = max(0, max(after) - before[-1])
    if model:
        row["model"] = f"{model['source']}: D2H {model['d2h_gbps']:.1f} / H2D {model['h2d_gbps']:.1f} GB/s, remap {model['remap_us']:.0f} us"
        if "period_us" in row:
            row["link_bytes"] = int(row["period_us"] * 1e3 * min(model["d2h_gbps"], model["h2d_gbps"]))
    waits = [e for e in events if e["ev"] == "restore_wait"]
    row["on_demand"] = sum(e["slots"] for e in waits if e["on_demand"])
    row["host_waits"] = sum(1 for e in waits if e["host_wait"])
    row["guard_hits"] = sum(1 for e in events if e["ev"] == "guard_hit")
    row["deviations"] = sum(1 for e in events if e["ev"] == "deviation")
    row["offloads"] = sum(e["slots"] for e in events if e["ev"] == "plan_offload")
    return row


def mib(b):
    return f"{b / 2**20:.0f}" if b is not None else "-"


def main():
    rows = []
    for spec in sys.argv[1:]:
        name, plain, vaswap, trace = spec.split(":")
        try:
            rows.append(summarize(name, json.load(open(plain)), json.load(open(vaswap)), load_trace(trace)))
        except (OSError, ValueError, KeyError) as e:
            print(f"{name}: no result ({e})", file=sys.stderr)
            rows.append({"run": name, "failed": True, "identical": False})
    print("| run | identical | step ms plain | step ms vaswap | overhead | period | slots (MiB) | windows | "
          "planned away at once (MiB) | freed, cuMemGetInfo (MiB) | link could move in a period (MiB) | "
          "offloads | on-demand restores | host waits | guard hits | deviations |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if r.get("failed"):
            print(f"| {r['run']} | run failed |" + " - |" * 14)
            continue
        print(f"| {r['run']} | {'yes' if r['identical'] else 'NO'} | {r['plain_ms']:.2f} | {r['vaswap_ms']:.2f} | "
              f"{r['overhead_pct']:+.1f}% | {r.get('period', '-')} | {r.get('regions', '-')} ({mib(r.get('region_bytes'))}) | "
              f"{r.get('windows', '-')} | {mib(r.get('planned_bytes'))} | {mib(r.get('freed_bytes'))} | "
              f"{mib(r.get('link_bytes'))} | {r['offloads']} | {r['on_demand']} | {r['host_waits']} | "
              f"{r['guard_hits']} | {r['deviations']} |")
    print()
    for r in rows:
        if "model" in r:
            print(f"- {r['run']}: model {r['model']}" + (f"; plan: {r['reason']}" if r.get("reason") else ""))
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
