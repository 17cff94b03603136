"""`vaswap report`: what vaswap freed, moved and cost, from its traces.

    vaswap report [--perfetto FILE] [--plots DIR] [--no-progress] TRACE [TRACE...]

One trace per process (one per rank in a multi-rank job). The format is docs/TRACE.md: the reader
takes the event names and their fields from that page, checks every line against it, and says
which line is wrong and why; whatever can still be read is reported. The exit status is 0, or 1
when a trace had bad lines or was truncated (the report is still printed).
"""

import bisect
import collections
import json
import os
import pathlib
import re
import statistics
import sys

from . import _layout

DOC = _layout.trace_doc()  # docs/TRACE.md; installed beside this module
# Format versions this reader understands. A later version only adds fields and events
# (docs/TRACE.md, Versions), so an unknown newer version is read with a warning.
KNOWN_VERSIONS = {1}
COMMON = ("t_ns", "ev", "tid")
# The fields the report relies on, per event: a line without one is rejected with its name.
NEEDED = {
    "d2h": ("slot", "bytes", "dur_us"),
    "h2d": ("slot", "bytes", "dur_us"),
    "release": ("slot", "bytes"),
    "remap": ("slot", "bytes"),
    "slot_create": ("slot", "bytes"),
    "restore_wait": ("dur_us", "host_wait", "on_demand"),
    "mem_sample": ("free", "total"),
    "mem_info": ("free", "total"),
    "graph_launch": ("exec",),
    "launch_time": ("exec", "enqueued_ns", "parked_us", "graph_us"),
    "plan": ("plan",),
    "plan_window": ("slot", "bytes"),
    "trace_begin": ("version",),
}


class TraceError(Exception):
    """A trace that cannot be read at all."""


def documented_events(doc=DOC):
    """The event names and their documented fields, from docs/TRACE.md's Events table."""
    events = {}
    in_events = False
    for line in doc.read_text().splitlines():
        if line.startswith("## "):
            in_events = line == "## Events"
        if not in_events or not line.startswith("| `"):
            continue
        cells = line.split("|")
        name = cells[1].strip().strip("`")
        events[name] = set(re.findall(r"`([a-z_0-9]+)`", cells[3]))
    if not events:
        raise TraceError(f"{doc}: no Events table found")
    return events


class Run:
    """One trace, read and checked."""

    def __init__(self, path):
        self.path = str(path)
        self.events = []
        self.problems = []  # "file:line: what was wrong"
        self.truncated = False
        self.version = None
        self.pid = None
        self.host = None

    @property
    def name(self):
        return f"{self.host or '?'}:{self.pid}" if self.pid is not None else os.path.basename(self.path)

    def of(self, kind):
        return [e for e in self.events if e["ev"] == kind]


def read_trace(path, events_doc, progress=None):
    run = Run(path)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if progress is not None:
                progress.update(len(raw))
            where = f"{path}:{number}"
            if not raw.endswith(b"\n"):
                run.truncated = True
                run.problems.append(f"{where}: the last line is cut off (the process was killed?); "
                                    "it is skipped")
                break
            text = raw.strip()
            if not text:
                continue
            try:
                event = json.loads(text)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                run.problems.append(f"{where}: not JSON ({e.msg if hasattr(e, 'msg') else e}); "
                                    "the line is skipped")
                continue
            problem = check_event(event, events_doc)
            if problem:
                run.problems.append(f"{where}: {problem}; the line is skipped")
                continue
            if event["ev"] == "trace_begin":
                run.version = event["version"]
                run.pid = event.get("pid")
                run.host = event.get("host")
                if run.version not in KNOWN_VERSIONS:
                    run.problems.append(f"{where}: format version {run.version} is newer than this "
                                        f"reader ({max(KNOWN_VERSIONS)}); fields it does not know "
                                        "are ignored")
            run.events.append(event)
    if size == 0 or run.version is None:
        run.problems.append(f"{path}:1: no trace_begin: not a vaswap trace, or its start is missing")
    if run.events and not any(e["ev"] == "trace_end" for e in run.events) and not run.truncated:
        run.truncated = True
        run.problems.append(f"{path}: no trace_end: the trace is truncated (the process did not "
                            "exit normally); the report covers what was written")
    run.events.sort(key=lambda e: e["t_ns"])
    return run


def check_event(event, events_doc):
    if not isinstance(event, dict):
        return f"expected a JSON object, got {type(event).__name__}"
    for field in COMMON:
        if field not in event:
            return f"missing `{field}`"
    if not isinstance(event["t_ns"], int) or event["t_ns"] < 0:
        return f"`t_ns` must be a non-negative integer, got {event['t_ns']!r}"
    name = event["ev"]
    if name not in events_doc:
        return f"unknown event `{name}` (docs/TRACE.md lists {len(events_doc)} events)"
    for field in NEEDED.get(name, ()):
        if field not in event:
            return f"`{name}` without `{field}`"
    for field in ("bytes", "dur_us", "free", "total"):
        if field in event and not isinstance(event[field], (int, float)):
            return f"`{name}.{field}` must be a number, got {event[field]!r}"
    return None


def read_traces(paths, show_progress=True):
    events_doc = documented_events()
    total = sum(os.path.getsize(p) for p in paths)
    progress = None
    if show_progress:
        try:
            from tqdm import tqdm
            progress = tqdm(total=total, unit="B", unit_scale=True, desc="reading traces",
                            file=sys.stderr, disable=total < (8 << 20))
        except ImportError:
            progress = None
    try:
        return [read_trace(p, events_doc, progress) for p in paths]
    finally:
        if progress is not None:
            progress.close()


# =================================================================================================
# Numbers
# =================================================================================================

MiB = float(1 << 20)


def gbps(total_bytes, total_us):
    return total_bytes / (total_us * 1e3) if total_us > 0 else 0.0


def memory_series(run):
    """Device memory in use over time (driver-measured: total - free), in seconds from the start,
    and what the job would have held without vaswap: that plus the pages released at the time."""
    samples = [e for e in run.events if e["ev"] in ("mem_sample", "mem_info")]
    if not samples:
        return [], [], []
    start = run.events[0]["t_ns"]
    # Released pages over time: a release gives a slot's pages back; a remap maps them again. A
    # slot's first pages (it reserves its address alone until its first use) are no return.
    changes, away_slots = [], set()
    for e in run.events:
        if e["ev"] == "release":
            changes.append((e["t_ns"], e["bytes"]))
            away_slots.add(e["slot"])
        elif e["ev"] == "remap" and e["slot"] in away_slots:
            changes.append((e["t_ns"], -e["bytes"]))
            away_slots.discard(e["slot"])
    times = [t for t, _ in changes]
    released, level = [], 0
    for _, delta in changes:
        level += delta
        released.append(level)
    xs, used, without = [], [], []
    for s in samples:
        i = bisect.bisect_right(times, s["t_ns"])
        away = released[i - 1] if i > 0 else 0
        xs.append((s["t_ns"] - start) / 1e9)
        used.append(s["total"] - s["free"])
        without.append(s["total"] - s["free"] + max(0, away))
    return xs, used, without


def steps(run):
    """Step boundaries (t_ns): launches of the graph that begins the period. The period's first
    graph is the one launched first after the plan came into force (or the first one launched)."""
    launches = run.of("graph_launch")
    if not launches:
        return []
    plans = run.of("plan")
    after = [e for e in launches if plans and e["t_ns"] >= plans[0]["t_ns"]]
    first = (after or launches)[0]["exec"]
    return [e["t_ns"] for e in launches if e["exec"] == first]


def summary(run):
    ev = collections.Counter(e["ev"] for e in run.events)
    d2h, h2d = run.of("d2h"), run.of("h2d")
    waits = run.of("restore_wait")
    model = run.of("model")
    plans = run.of("plan")
    xs, used, without = memory_series(run)
    duration = (run.events[-1]["t_ns"] - run.events[0]["t_ns"]) / 1e9 if run.events else 0
    row = {
        "run": run.name,
        "duration_s": duration,
        "slots": ev["slot_create"],
        "slot_bytes": sum(e["bytes"] for e in run.of("slot_create")),
        "graph_launches": ev["graph_launch"],
        # The last plan's windows, over its events (one per device)
        "plan_windows": sum(e.get("windows", 0) for e in plans if e.get("plan") == plans[-1].get("plan"))
        if plans else None,
        "offloaded_bytes": sum(e["bytes"] for e in d2h),
        "restored_bytes": sum(e["bytes"] for e in h2d),
        "d2h_gbps": gbps(sum(e["bytes"] for e in d2h), sum(e["dur_us"] for e in d2h)),
        "h2d_gbps": gbps(sum(e["bytes"] for e in h2d), sum(e["dur_us"] for e in h2d)),
        "model_d2h_gbps": model[-1]["d2h_gbps"] if model else None,
        "model_h2d_gbps": model[-1]["h2d_gbps"] if model else None,
        "host_waits": sum(1 for e in waits if e["host_wait"]),
        "wait_ms": sum(e["dur_us"] for e in waits if e["host_wait"]) / 1e3,
        "on_demand": sum(e.get("restored", e.get("slots", 0)) for e in waits if e["on_demand"]),
        "guard_hits": ev["guard_hit"],
        "deviations": ev["deviation"],
        "errors": ev["error"],
        "peak_used": max(used) if used else None,
        "peak_without": max(without) if without else None,
        # The exit summary read cuMemGetInfo at every map and unmap: better peaks when present.
        "problems": len(run.problems),
    }
    final = run.of("summary")
    if final:
        row["peak_used"] = final[-1].get("peak_used", row["peak_used"])
        row["peak_without"] = final[-1].get("peak_without_releases", row["peak_without"])
    return row


def per_graph(run):
    graphs = collections.OrderedDict()
    scans = {e.get("graph"): e for e in run.of("graph_scan")}
    for e in run.of("graph_launch"):
        g = graphs.setdefault(e["exec"], {"exec": e["exec"], "graph": e.get("graph"), "launches": 0,
                                           "slots": e.get("slots", 0), "waits": 0, "wait_ms": 0.0})
        g["launches"] += 1
    # Restore waits and the planner's offloads and restores are issued just before a graph
    # launch, on the launching thread: each belongs to the graph launched next on its thread.
    launches = collections.defaultdict(list)
    for e in run.of("graph_launch"):
        launches[e["tid"]].append((e["t_ns"], e["exec"]))

    def next_graph(event):
        mine = launches.get(event["tid"], [])
        i = bisect.bisect_left(mine, (event["t_ns"], ""))
        return mine[i][1] if i < len(mine) else None

    for g in graphs.values():
        g.update(offloaded=0, restored=0)
    for w in run.of("restore_wait"):
        exec_ = next_graph(w)
        if exec_ in graphs and w["host_wait"] and w.get("reason") != "eager":
            graphs[exec_]["waits"] += 1
            graphs[exec_]["wait_ms"] += w["dur_us"] / 1e3
    for kind, key in (("plan_offload", "offloaded"), ("plan_restore", "restored")):
        for e in run.of(kind):
            exec_ = next_graph(e)
            if exec_ in graphs:
                graphs[exec_][key] += e.get("bytes", 0)
    for g in graphs.values():
        scan = scans.get(g["graph"])
        g["nodes"] = scan["nodes"] if scan else None
    return list(graphs.values())


def launch_phases(run):
    """trace.launch_times: the device times of graph launches, by phase. A launch belongs to the
    phase in force when it was enqueued: "before a plan" until a `plan` event, "plan in force"
    from it until the next `learn`. Per phase: launches, the medians and sums of `graph_us`,
    `parked_us` and `since_us`, the graph and parked times per executable (medians), the
    executables in the order first launched in the phase, and the launches per period of the
    plan last in force (to give per-step figures)."""
    times = run.of("launch_time")
    if not times:
        return []
    changes = sorted([(e["t_ns"], "plan in force") for e in run.of("plan")] +
                     [(e["t_ns"], "before a plan") for e in run.of("learn")])
    keys = [t for t, _ in changes]
    plans = run.of("plan")
    period = plans[-1].get("period") if plans else None
    phases = collections.OrderedDict((name, []) for name in ("before a plan", "plan in force"))
    for e in times:
        i = bisect.bisect_right(keys, e["enqueued_ns"]) - 1
        phases[changes[i][1] if i >= 0 else "before a plan"].append(e)
    rows = []
    for name, launches in phases.items():
        if not launches:
            continue
        by_exec = collections.defaultdict(list)
        parked = collections.defaultdict(list)
        for e in sorted(launches, key=lambda e: e["enqueued_ns"]):
            by_exec[e["exec"]].append(e["graph_us"])
            parked[e["exec"]].append(e["parked_us"])
        rows.append({
            "phase": name,
            "launches": len(launches),
            "graph_us": [e["graph_us"] for e in launches],
            "parked_us": [e["parked_us"] for e in launches],
            "since_us": [e["since_us"] for e in launches if "since_us" in e],
            "exec_graph_us": {x: statistics.median(v) for x, v in by_exec.items()},
            "exec_parked_us": {x: statistics.median(v) for x, v in parked.items()},
            "order": list(by_exec),
            "period": period,
        })
    return rows


def per_region(run):
    regions = collections.OrderedDict()
    for e in run.of("slot_create"):
        regions[e["slot"]] = {"slot": e["slot"], "va": e.get("va"), "bytes": e["bytes"], "windows": 0,
                              "offloads": 0, "restores": 0, "d2h_bytes": 0, "d2h_us": 0.0,
                              "h2d_bytes": 0, "h2d_us": 0.0}
    for e in run.of("plan_window"):
        if e["slot"] in regions:
            regions[e["slot"]]["windows"] += 1
    for e in run.of("d2h"):
        r = regions.get(e["slot"])
        if r:
            r["offloads"] += 1
            r["d2h_bytes"] += e["bytes"]
            r["d2h_us"] += e["dur_us"]
    for e in run.of("h2d"):
        r = regions.get(e["slot"])
        if r:
            r["restores"] += 1
            r["h2d_bytes"] += e["bytes"]
            r["h2d_us"] += e["dur_us"]
    return [r for r in regions.values() if r["offloads"] or r["windows"]]


def stalls_per_step(run):
    bounds = steps(run)
    waits = [e for e in run.of("restore_wait") if e["host_wait"]]
    per = [0.0] * len(bounds)
    for w in waits:
        i = bisect.bisect_right(bounds, w["t_ns"]) - 1
        if i >= 0:
            per[i] += w["dur_us"] / 1e3
    return per


# =================================================================================================
# Output: tables
# =================================================================================================

def mib(value):
    return "-" if value is None else f"{value / MiB:.0f}"


def num(value, fmt="{:.1f}"):
    return "-" if value is None else fmt.format(value)


PARKED_SHOWN_US = 20.0


def parked_line(steady):
    """Where the stream waited with a plan in force: each graph whose median parked time is over
    PARKED_SHOWN_US, numbered by the order in which the phase first launched it (#1 first)."""
    shown = [(i + 1, x, steady["exec_parked_us"][x]) for i, x in enumerate(steady["order"])
             if steady["exec_parked_us"][x] > PARKED_SHOWN_US]
    if not shown:
        return (f"- with the plan in force, no graph's stream waited more than "
                f"{PARKED_SHOWN_US:.0f} us (median per launch)")
    total = sum(us for _, _, us in shown)
    return (f"- with the plan in force, the graphs whose stream waited more than "
            f"{PARKED_SHOWN_US:.0f} us (median per launch; #k: the k-th graph first launched "
            f"under the plan): " + "; ".join(f"#{k} {x} {us / 1e3:.3f} ms" for k, x, us in shown)
            + f"; {total / 1e3:.2f} ms in all")


def tables(runs):
    out = ["## Runs", "",
           "| run | s | slots (MiB) | graph launches | windows | offloaded MiB | restored MiB | "
           "D2H GB/s (model) | H2D GB/s (model) | host waits (ms) | on-demand | guard hits | "
           "deviations | errors | peak used MiB | peak without vaswap MiB |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        s = summary(run)
        out.append(
            f"| {s['run']} | {s['duration_s']:.2f} | {s['slots']} ({mib(s['slot_bytes'])}) | "
            f"{s['graph_launches']} | {num(s['plan_windows'], '{}')} | {mib(s['offloaded_bytes'])} | "
            f"{mib(s['restored_bytes'])} | {s['d2h_gbps']:.1f} ({num(s['model_d2h_gbps'])}) | "
            f"{s['h2d_gbps']:.1f} ({num(s['model_h2d_gbps'])}) | {s['host_waits']} "
            f"({s['wait_ms']:.1f}) | {s['on_demand']} | {s['guard_hits']} | {s['deviations']} | "
            f"{s['errors']} | {mib(s['peak_used'])} | {mib(s['peak_without'])} |")
    for run in runs:
        out += ["", f"## Graphs of {run.name}", "",
                "| exec | nodes | slots referenced | launches | offloaded before it MiB | "
                "restores started before it MiB | host waits before it (ms) |",
                "|---|---:|---:|---:|---:|---:|---:|"]
        for g in per_graph(run):
            out.append(f"| {g['exec']} | {num(g['nodes'], '{}')} | {g['slots']} | {g['launches']} | "
                       f"{mib(g['offloaded'])} | {mib(g['restored'])} | "
                       f"{g['waits']} ({g['wait_ms']:.1f}) |")
        out += ["", f"## Regions of {run.name} (offloaded or planned)", "",
                "| slot | va | MiB | windows | offloads | restores | D2H GB/s | H2D GB/s |",
                "|---:|---|---:|---:|---:|---:|---:|---:|"]
        for r in per_region(run):
            out.append(f"| {r['slot']} | {r['va']} | {mib(r['bytes'])} | {r['windows']} | "
                       f"{r['offloads']} | {r['restores']} | {gbps(r['d2h_bytes'], r['d2h_us']):.1f} | "
                       f"{gbps(r['h2d_bytes'], r['h2d_us']):.1f} |")
    for run in runs:
        rewrites = run.of("graph_rewrite")
        if not rewrites:
            continue
        launches = run.of("inside_launch")
        demands = run.of("inside_demand")
        final = run.of("summary")
        held = final[-1].get("inside_peak_held") if final else None
        out += ["", f"## Offload inside graphs of {run.name}", "",
                "| graph | nodes | windows | slots lent (MiB) | held without windows MiB | "
                "held at most MiB (schedule) | moved each way per launch MiB |",
                "|---|---:|---:|---:|---:|---:|---:|"]
        for r in rewrites:
            out.append(f"| {r['graph']} | {r['nodes']} | {r['windows']} | {r['slots']} "
                       f"({mib(r['bytes'])}) | {mib(r['held_without'])} | {mib(r['held_peak'])} | "
                       f"{mib(r['moved_bytes'])} |")
        durations = sorted(e["dur_us"] for e in launches)
        median = durations[len(durations) // 2] / 1e3 if durations else None
        out += ["", f"- launches carried out: {len(launches)} (median {num(median)} ms from the "
                    f"executor taking one up to its last step); lent slots held at most "
                    f"{mib(held)} MiB at once (exit summary)",
                f"- other work brought lent slots back {len(demands)} times, "
                f"{sum(e['dur_us'] for e in demands) / 1e3:.1f} ms waited"]
    for run in runs:
        phases = launch_phases(run)
        if not phases:
            continue
        out += ["", f"## Launch times of {run.name} (trace.launch_times)", "",
                "Device time per graph launch: *parked* is the time its stream waited for vaswap "
                "before the graph began (restores, room), *graph* the graph itself, *between* the "
                "time from the stream's previous launch to this one (eager work, host gaps). Per "
                "period: the mean per launch times the launches of one period of the last plan.", "",
                "| phase | launches | graph ms (median) | parked ms (median; mean) | "
                "between ms (median; mean) | per period: graph + parked + between ms |",
                "|---|---:|---:|---:|---:|---:|"]
        for r in phases:
            n = r["period"] or 1

            def mean(v):
                return sum(v) / len(v) if v else 0.0

            def med(v):
                return statistics.median(v) if v else 0.0

            out.append(
                f"| {r['phase']} | {r['launches']} | {med(r['graph_us']) / 1e3:.3f} | "
                f"{med(r['parked_us']) / 1e3:.3f}; {mean(r['parked_us']) / 1e3:.3f} | "
                f"{med(r['since_us']) / 1e3:.3f}; {mean(r['since_us']) / 1e3:.3f} | "
                f"{n * mean(r['graph_us']) / 1e3:.2f} + {n * mean(r['parked_us']) / 1e3:.2f} + "
                f"{n * mean(r['since_us']) / 1e3:.2f} |")
        if len(phases) == 2:
            before, after = phases[0]["exec_graph_us"], phases[1]["exec_graph_us"]
            both = [x for x in after if x in before]
            if both:
                was = sum(before[x] for x in both)
                now = sum(after[x] for x in both)
                out += ["", f"- the same {len(both)} graphs, summed medians: {was / 1e3:.2f} ms "
                            f"before a plan, {now / 1e3:.2f} ms with one in force "
                            f"({100 * (now / was - 1):+.1f}%: the graphs' own device time "
                            "with vaswap's copies and driver calls beside them)"]
        steady = next((r for r in phases if r["phase"] == "plan in force"), None)
        if steady:
            out += [parked_line(steady)]
    for run in runs:
        out += plan_lines(run) + selection_lines(run) + handshake_lines(run) + ending_lines(run)
    problems = [p for run in runs for p in run.problems]
    if problems:
        out += ["", "## Problems", ""] + [f"- {p}" for p in problems]
    return "\n".join(out) + "\n"


def plan_lines(run):
    """Per plan with windows: what its copies need of the link, against the device time of the
    period's graphs (a period whose copies take longer than its graphs and host gaps shows them)."""
    plans = [e for e in run.of("plan") if e.get("windows") and "moved_bytes" in e]
    if not plans:
        return []
    out = ["", f"## Plans of {run.name}", ""]
    for e in plans:
        out.append(
            f"- plan {e['plan']} (device {e.get('device', 0)}): {e['windows']} windows, "
            f"{mib(e['moved_bytes'])} MiB each way per period: {e['copy_us'] / 1e3:.1f} ms of "
            f"copies each way at the model's speed, in a {e['period_us'] / 1e3:.1f} ms period "
            f"whose graphs run {e['graphs_us'] / 1e3:.1f} ms; {mib(e['peak_bytes'])} MiB of pages "
            f"away at once; {e['exposed_us'] / 1e3:.1f} ms of restores the model cannot hide")
    return out


SKIPPED = {"nccl": "NCCL's own", "include": "no frame matched selection.include",
           "exclude": "a frame matched selection.exclude", "callsite": "the stack could not be walked",
           "streams": "vaswap's copy streams could not be made on the device",
           "flags": "no pinned host memory for the slot's handshake flag"}


def selection_lines(run):
    """Allocations the size and capture rules chose that were passed through, and why (the alloc
    events' `skipped`), and evictions by cause."""
    skipped = collections.Counter(e["skipped"] for e in run.of("alloc") if e.get("skipped"))
    causes = collections.Counter(e.get("cause", "?") for e in run.of("evict"))
    if not skipped and not causes:
        return []
    out = ["", f"## Selection and eviction of {run.name}", ""]
    if skipped:
        out.append("- allocations chosen by size and capture but passed through (not slots): " +
                   "; ".join(f"{n} ({SKIPPED.get(why, why)})" for why, n in skipped.most_common()))
    if causes:
        out.append("- evictions by cause: " +
                   ", ".join(f"{cause} {n}" for cause, n in sorted(causes.items())))
    return out


def handshake_lines(run):
    """The device handshake's exit figures: first-time work that waited, restores on the host path,
    and the D2H gate where it was up."""
    final = run.of("summary")
    if not final or final[-1].get("handshake") != "device":
        return []
    f = final[-1]
    return ["", f"## Device handshake of {run.name}", "",
            f"- first-time work (loads, instantiations, copy graphs) that waited for parked "
            f"streams: {f.get('settle_waits', 0)} times, {f.get('settle_wait_us', 0) / 1e3:.1f} ms",
            f"- restores that took the host path: {f.get('host_path_restores', 0)}; host waits "
            f"for restores: {f.get('waits', 0)} ({f.get('wait_us', 0) / 1e3:.1f} ms); budget "
            f"overshoots: {f.get('budget_overshoots', 0)}"] + (
        [f"- the D2H gate (residency.d2h_gate): up for {f['d2h_gate_raises']} restores, "
         f"{f.get('d2h_gate_us', 0) / 1e3:.1f} ms in all; {f.get('d2h_gate_timeouts', 0)} came "
         f"down at their limit rather than at the map"]
        if f.get("d2h_gate_raises") else [])


def ending_lines(run, frames_shown=4):
    """Where every thread was when vaswap ended the process (thread_stack events, invariant 12)."""
    stacks = run.of("thread_stack")
    if not stacks:
        return []
    ended = [e for e in run.of("error") if e["t_ns"] <= stacks[0]["t_ns"]]
    out = ["", f"## How {run.name} ended", ""]
    if ended:
        out += [f"vaswap ended the process ({ended[-1].get('call', '?')}): "
                f"{ended[-1].get('message', '')}", ""]
    out += ["| thread | name | where it was (innermost first) |", "|---:|---|---|"]
    for e in stacks:
        if not e.get("answered", False):
            where = "(did not answer)"
        else:
            frames = [f if len(f) <= 100 else f[:97] + "..."
                      for f in e.get("frames", "").split(" < ") if f]
            where = " < ".join(frames[:frames_shown]) + (" < ..." if len(frames) > frames_shown else "")
        out.append(f"| {e['tid_of']} | {e.get('name', '')} | {where.replace('|', '/')} |")
    return out


# =================================================================================================
# Output: Perfetto / Chrome trace
# =================================================================================================

def perfetto(runs):
    """Chrome trace-event JSON (Perfetto reads it): one process per run; a track per stream and
    per vaswap worker; copies, remaps, releases and host waits as slices; device memory as a
    counter; graph launches as instants on their stream."""
    events = []
    for index, run in enumerate(runs):
        pid = run.pid if run.pid is not None else index + 1
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": run.name}})
        tracks = {}

        def track(key, name):
            if key not in tracks:
                tracks[key] = len(tracks) + 1
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tracks[key],
                               "args": {"name": name}})
            return tracks[key]

        start = run.events[0]["t_ns"] if run.events else 0

        def us(t_ns):
            return (t_ns - start) / 1e3

        for e in run.events:
            kind = e["ev"]
            if kind in ("d2h", "h2d"):
                tid = track(("stream", e.get("stream")), f"stream {e.get('stream')} ({kind.upper()})")
                events.append({"ph": "X", "name": f"{kind.upper()} slot {e['slot']}", "pid": pid,
                               "tid": tid, "ts": us(e["t_ns"]), "dur": e["dur_us"],
                               "args": {"bytes": e["bytes"], "batch": e.get("batch")}})
            elif kind in ("release", "remap"):
                dur = sum(e.get(k, 0.0) for k in ("unmap_us", "release_us", "create_us", "map_us",
                                                    "access_us"))
                tid = track(("worker", e["tid"]), f"vaswap worker {e['tid']}")
                events.append({"ph": "X", "name": f"{kind} slot {e['slot']}", "pid": pid, "tid": tid,
                               "ts": us(e["t_ns"]), "dur": dur, "args": {"bytes": e["bytes"]}})
            elif kind == "restore_wait" and e["host_wait"]:
                tid = track(("stream", e.get("stream")), f"stream {e.get('stream')}")
                events.append({"ph": "X", "name": "wait for restore", "pid": pid, "tid": tid,
                               "ts": us(e["t_ns"]), "dur": e["dur_us"],
                               "args": {"on_demand": e["on_demand"], "slots": e.get("slots")}})
            elif kind == "graph_launch":
                tid = track(("stream", e.get("stream")), f"stream {e.get('stream')}")
                events.append({"ph": "i", "s": "t", "name": f"graph {e['exec']}", "pid": pid,
                               "tid": tid, "ts": us(e["t_ns"])})
            elif kind == "guard_hit":
                tid = track(("stream", e.get("stream")), f"stream {e.get('stream')}")
                events.append({"ph": "i", "s": "t", "name": "guard hit", "pid": pid, "tid": tid,
                               "ts": us(e["t_ns"])})
        xs, used, without = memory_series(run)
        for x, u, w in zip(xs, used, without):
            events.append({"ph": "C", "name": "device memory (MiB)", "pid": pid, "ts": x * 1e6,
                           "args": {"in use": round(u / MiB, 1), "without vaswap": round(w / MiB, 1)}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


# =================================================================================================
# Output: plots
# =================================================================================================

def copy_bandwidth(run, kind):
    """(seconds, GB/s) of one direction's copies, each copy's bytes spread over the bins it spans."""
    copies = run.of(kind)
    if not copies:
        return [], []
    start = run.events[0]["t_ns"]
    end = max(e["t_ns"] + e["dur_us"] * 1e3 for e in copies)
    bin_ns = max(1_000_000, int((end - start) / 400))
    bins = collections.Counter()
    for e in copies:
        a, b = e["t_ns"], e["t_ns"] + max(1, int(e["dur_us"] * 1e3))
        t = a
        while t < b:
            edge = min(b, (t // bin_ns + 1) * bin_ns)
            bins[t // bin_ns] += e["bytes"] * (edge - t) / (b - a)
            t = edge
    keys = sorted(bins)
    return [(k * bin_ns - start) / 1e9 for k in keys], [bins[k] / bin_ns for k in keys]


def plots(runs, directory):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)

    def figure(name, title, xlabel, ylabel, draw, grid_axis="both"):
        fig, ax = plt.subplots(figsize=(9, 4.5))
        draw(ax)
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        ax.legend(loc="best", fontsize="small")
        ax.grid(alpha=0.3, axis=grid_axis)
        fig.tight_layout()
        fig.savefig(directory / name, dpi=110)
        plt.close(fig)
        return directory / name

    def memory(ax):
        for run in runs:
            xs, used, without = memory_series(run)
            if xs:
                line = ax.plot(xs, [u / 2**30 for u in used], label=f"{run.name}: with vaswap")[0]
                ax.plot(xs, [w / 2**30 for w in without], linestyle="--", color=line.get_color(),
                        label=f"{run.name}: without vaswap (released pages added back)")

    def bandwidth(ax):
        for run in runs:
            for kind in ("d2h", "h2d"):
                xs, ys = copy_bandwidth(run, kind)
                if xs:
                    ax.plot(xs, ys, label=f"{run.name}: {kind.upper()}")

    def stalls(ax):
        width = 0.8 / max(1, len(runs))
        for i, run in enumerate(runs):
            per = stalls_per_step(run)
            ax.bar([s + i * width for s in range(len(per))], per, width=width, label=run.name)

    return [
        figure("memory.png", "Device memory", "time (s)", "device memory in use (GiB, cuMemGetInfo)",
               memory),
        figure("bandwidth.png", "vaswap's copies", "time (s)", "copy bandwidth (GB/s)", bandwidth),
        figure("stalls.png", "Stalls per step", "step", "host waiting for restores (ms)", stalls,
               grid_axis="y"),
    ]


def main(args):
    missing = [p for p in args.traces if not os.path.isfile(p)]
    if missing:
        print(f"vaswap report: no such trace: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("vaswap report: --plots needs matplotlib, an extra: pip install 'vaswap[report]'",
                  file=sys.stderr)
            return 2
    try:
        runs = read_traces(args.traces, show_progress=not args.no_progress)
    except TraceError as e:
        print(f"vaswap report: {e}", file=sys.stderr)
        return 2
    for run in runs:
        for problem in run.problems:
            print(f"vaswap report: {problem}", file=sys.stderr)
    sys.stdout.write(tables(runs))
    if args.perfetto:
        with open(args.perfetto, "w") as f:
            json.dump(perfetto(runs), f)
        print(f"\nPerfetto / Chrome trace: {args.perfetto} (open it at https://ui.perfetto.dev)")
    if args.plots:
        for path in plots(runs, args.plots):
            print(f"plot: {path}")
    return 1 if any(run.problems for run in runs) else 0
