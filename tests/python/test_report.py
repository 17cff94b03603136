"""`vaswap report` over traces the simulator makes (python/vaswap/_report.py).

The traces come from the layered demo (examples/train_layers) run under vaswap on the simulated
device, as tests/integration/planner_test.sh runs it: once in rules mode, whose offloads are
exactly known, and once with the planner and cuMemGetInfo sampling. VASWAP_BUILD names the build
directory (ctest sets it)."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
from vaswap import _report as vaswap_report  # noqa: E402

BUILD = pathlib.Path(os.environ.get("VASWAP_BUILD", ROOT / "build" / "plain"))
DEMO = BUILD / "bin" / "train_layers"
LIBRARY = BUILD / "lib" / "libvaswap.so"
MiB = 1 << 20
STEPS = 20

pytestmark = pytest.mark.skipif(not (DEMO.is_file() and LIBRARY.is_file()),
                                reason=f"needs the plain build in {BUILD}")

RULES = (ROOT / "tests" / "integration" / "rules_policy.yaml").read_text()
# 32 slots of one 2 MiB page each, 24 MiB of budget: a quarter must be away at any time.
PLANNED = ("selection.min_bytes=1MiB,trace.memory_interval=100us,schedule.model=given,"
           "schedule.h2d_gbps=50,schedule.d2h_gbps=50,schedule.remap_latency=50us,"
           "residency.budget=48MiB")


def run_demo(tmp, name, policy=None, conf=None, args=()):
    trace = tmp / f"{name}.jsonl"
    env = dict(os.environ, LD_LIBRARY_PATH=str(BUILD / "sim"))
    env.pop("VASWAP_SIM_DEVICES", None)
    env.pop("VASWAP_SIM_DEVICE_MEMORY", None)
    if policy:
        path = tmp / f"{name}.yaml"
        path.write_text(policy)
        env["VASWAP_POLICY"] = str(path)
    if conf:
        env["VASWAP_CONF"] = conf
    subprocess.run([sys.executable, str(ROOT / "scripts" / "vaswap"), "run", "--library", str(LIBRARY),
                    "--trace", str(trace), "--", str(DEMO), "--quiet", "--steps", str(STEPS), *args],
                   env=env, check=True, capture_output=True, text=True)
    return trace


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    return {"rules": run_demo(tmp, "rules", policy=RULES),
            "planned": run_demo(tmp, "planned", conf=PLANNED),
            "inside": run_demo(tmp, "inside", conf="selection.min_bytes=1MiB,inside.mode=on",
                               args=("--graph", "whole")),
            "dir": tmp}


def report(*args):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "vaswap"), "report", "--no-progress",
                           *map(str, args)], capture_output=True, text=True)


def read(path):
    return vaswap_report.read_traces([str(path)], show_progress=False)[0]


# ---------------------------------------------------------------------------------------------
# Numbers
# ---------------------------------------------------------------------------------------------

def test_rules_run_moves_exactly_what_the_rules_say(traces):
    run = read(traces["rules"])
    assert run.problems == []
    s = vaswap_report.summary(run)
    # Two rules, two 1 MiB buffers each (the activation and the output), every step.
    assert s["slots"] == 32
    assert s["slot_bytes"] == 32 * MiB
    assert s["offloaded_bytes"] == 2 * 2 * STEPS * MiB
    assert s["restored_bytes"] == 2 * 2 * STEPS * MiB
    assert s["on_demand"] == 2 * 2 * STEPS  # rules restore on demand before the named graph
    assert s["guard_hits"] == 0 and s["errors"] == 0
    assert s["graph_launches"] == 16 * STEPS
    regions = vaswap_report.per_region(run)
    assert len(regions) == 4
    assert all(r["offloads"] == STEPS and r["restores"] == STEPS for r in regions)
    assert all(r["d2h_bytes"] == STEPS * MiB for r in regions)
    # The rules offload after graphs 3 and 5 (capture order): the offloads sit before the graph
    # launched next, layer 2's and layer 3's forward.
    graphs = vaswap_report.per_graph(run)
    assert sorted(g["offloaded"] for g in graphs if g["offloaded"]) == [2 * STEPS * MiB] * 2
    final = run.of("summary")[0]
    assert final["regions_offloaded"] == 4 and final["bytes_offloaded"] == 80 * MiB


def test_rules_table_shows_those_numbers(traces):
    result = report(traces["rules"])
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines()
               if line.startswith("| ") and "(32)" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "32 (32)"     # slots (MiB)
    assert cells[3] == str(16 * STEPS)  # graph launches
    assert cells[5] == "80"          # offloaded MiB
    assert cells[6] == "80"          # restored MiB
    assert "## Graphs of" in result.stdout and "## Regions of" in result.stdout


def test_planned_run_reports_its_plan_and_memory(traces):
    run = read(traces["planned"])
    assert run.problems == []
    s = vaswap_report.summary(run)
    plan = run.of("plan")[0]
    assert s["plan_windows"] == plan["windows"] > 0
    assert s["offloaded_bytes"] == sum(e["bytes"] for e in run.of("d2h")) > 0
    # The exit summary's peaks are the report's, when the trace has them.
    final = run.of("summary")[0]
    assert s["peak_used"] == final["peak_used"] > 0
    assert s["peak_without"] == final["peak_without_releases"] >= s["peak_used"]
    xs, used, without = vaswap_report.memory_series(run)
    assert len(xs) == len(run.of("mem_sample")) + len(run.of("mem_info"))
    assert max(w - u for u, w in zip(used, without)) > 0  # pages were away at some sample
    per_step = vaswap_report.stalls_per_step(run)
    assert len(per_step) >= STEPS - 5


def test_a_whole_graph_run_reports_its_rewritten_graph(traces):
    run = read(traces["inside"])
    assert run.problems == []
    rewrite = run.of("graph_rewrite")
    assert len(rewrite) == 1 and rewrite[0]["slots"] == 32 and rewrite[0]["windows"] > 0
    assert rewrite[0]["held_peak"] < rewrite[0]["held_without"] == 32 * 2 * MiB
    assert len(run.of("inside_launch")) == STEPS
    out = report(traces["inside"])
    assert out.returncode == 0, out.stderr
    assert f"## Offload inside graphs of {run.name}" in out.stdout
    row = next(line for line in out.stdout.splitlines() if line.startswith(f"| {rewrite[0]['graph']} |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:4] == [str(rewrite[0]["nodes"]), str(rewrite[0]["windows"]), "32 (64)"]
    assert f"launches carried out: {STEPS}" in out.stdout


def test_launch_times_are_split_at_the_plan_and_summed_per_period(tmp_path):
    # Two graphs A and B, one period of 2 launches: two launches before the plan, four with it
    # (written out of time order, as the preload writes them), then learning again for one more.
    def ev(t_ns, name, **fields):
        return json.dumps({"t_ns": t_ns, "ev": name, "tid": 1, **fields})

    def timed(t_ns, enqueued_ns, exec_, graph_us, parked_us, since_us=None):
        extra = {} if since_us is None else {"since_us": since_us}
        return ev(t_ns, "launch_time", exec=exec_, stream="0x1", enqueued_ns=enqueued_ns,
                  graph_us=graph_us, parked_us=parked_us, **extra)

    lines = [ev(0, "trace_begin", format="vaswap-trace", version=1),
             ev(1, "learn", why="start", generation=1),
             timed(30, 10, "0xa", 1000.0, 0.0), timed(40, 20, "0xb", 2000.0, 0.0, 100.0),
             ev(50, "plan", plan=1, period=2),
             timed(95, 70, "0xb", 2400.0, 300.0, 300.0), timed(90, 60, "0xa", 1200.0, 100.0, 100.0),
             timed(120, 80, "0xa", 1400.0, 500.0, 100.0), timed(130, 90, "0xb", 2600.0, 100.0, 300.0),
             ev(140, "learn", why="deviation", generation=2),
             timed(160, 150, "0xa", 1000.0, 0.0, 1000.0),
             ev(200, "trace_end")]
    path = tmp_path / "times.jsonl"
    path.write_text("\n".join(lines) + "\n")
    run = read(path)
    assert run.problems == []
    before, steady = vaswap_report.launch_phases(run)
    assert (before["phase"], before["launches"]) == ("before a plan", 3)
    assert (steady["phase"], steady["launches"]) == ("plan in force", 4)
    assert sorted(steady["graph_us"]) == [1200.0, 1400.0, 2400.0, 2600.0]
    assert steady["exec_graph_us"] == {"0xa": 1300.0, "0xb": 2500.0}
    assert before["exec_graph_us"] == {"0xa": 1000.0, "0xb": 2000.0}
    out = report(path)
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith("| plan in force |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # Medians 1.9 ms graph, 0.2 parked; means 0.25 parked, 0.2 between; per period of 2 launches:
    # 3.8 ms of graphs (7.6 / 4 * 2), 0.5 parked, 0.4 between.
    assert cells == ["plan in force", "4", "1.900", "0.200; 0.250", "0.200; 0.200",
                     "3.80 + 0.50 + 0.40"]
    assert "summed medians: 3.00 ms before a plan, 3.80 ms with one in force (+26.7%" in out.stdout
    # Where the stream waited under the plan: A first launched (enqueued at 60), parked 100 and
    # 500 us (median 300); B parked 300 and 100 (median 200).
    assert steady["order"] == ["0xa", "0xb"]
    assert steady["exec_parked_us"] == {"0xa": 300.0, "0xb": 200.0}
    assert ("(median per launch; #k: the k-th graph first launched under the plan): "
            "#1 0xa 0.300 ms; #2 0xb 0.200 ms; 0.50 ms in all") in out.stdout


def test_plans_say_what_their_copies_need_of_the_link(tmp_path):
    def ev(t_ns, name, **fields):
        return json.dumps({"t_ns": t_ns, "ev": name, "tid": 1, **fields})

    lines = [ev(0, "trace_begin", format="vaswap-trace", version=1),
             ev(5, "plan", plan=1, device=0, period=16, period_us=56733.6, windows=23,
                peak_bytes=608 << 20, exposed_us=1500.0, moved_bytes=736 << 20,
                copy_us=13976.1, graphs_us=1702.4),
             ev(6, "plan", plan=2, device=0, period=4, period_us=100.0, windows=0,
                peak_bytes=0, exposed_us=0.0, moved_bytes=0, copy_us=0.0, graphs_us=80.0),
             ev(100, "trace_end")]
    path = tmp_path / "plans.jsonl"
    path.write_text("\n".join(lines) + "\n")
    out = report(path)
    assert out.returncode == 0, out.stderr
    plan_lines = [line for line in out.stdout.splitlines() if line.startswith("- plan ")]
    assert plan_lines == [
        "- plan 1 (device 0): 23 windows, 736 MiB each way per period: 14.0 ms of copies each way "
        "at the model's speed, in a 56.7 ms period whose graphs run 1.7 ms; 608 MiB of pages away "
        "at once; 1.5 ms of restores the model cannot hide"]


def test_launch_times_show_no_graph_when_none_waited(tmp_path):
    def ev(t_ns, name, **fields):
        return json.dumps({"t_ns": t_ns, "ev": name, "tid": 1, **fields})

    lines = [ev(0, "trace_begin", format="vaswap-trace", version=1),
             ev(1, "learn", why="start", generation=1),
             ev(5, "plan", plan=1, period=1),
             ev(20, "launch_time", exec="0xa", stream="0x1", enqueued_ns=10, graph_us=900.0,
                parked_us=19.0),
             ev(40, "launch_time", exec="0xa", stream="0x1", enqueued_ns=30, graph_us=900.0,
                parked_us=400.0, since_us=5.0),
             ev(60, "launch_time", exec="0xa", stream="0x1", enqueued_ns=50, graph_us=900.0,
                parked_us=3.0, since_us=5.0),
             ev(100, "trace_end")]
    path = tmp_path / "times.jsonl"
    path.write_text("\n".join(lines) + "\n")
    out = report(path)
    assert out.returncode == 0, out.stderr
    assert "no graph's stream waited more than 20 us (median per launch)" in out.stdout


def test_a_process_vaswap_ended_shows_where_each_thread_was(tmp_path):
    # The executor's map hangs in the driver (the simulator holds the 300th cuMemCreate for a
    # minute) past residency.wait_limit (5 s: room for a loaded machine before it): vaswap ends
    # the process (exit 70) and writes each other thread's stack; the report names the error and
    # shows the executor inside cuMemCreate.
    trace = tmp_path / "ended.jsonl"
    env = dict(os.environ, LD_LIBRARY_PATH=str(BUILD / "sim"),
               VASWAP_SIM_FAULTS="cuMemCreate:300:-60000",
               VASWAP_CONF="selection.min_bytes=1MiB,residency.wait_limit=5s,inside.mode=on")
    ran = subprocess.run([sys.executable, str(ROOT / "scripts" / "vaswap"), "run", "--library",
                          str(LIBRARY), "--trace", str(trace), "--", str(DEMO), "--quiet", "--steps",
                          str(STEPS), "--graph", "whole"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode == 70, ran.stderr
    run = read(trace)
    stacks = run.of("thread_stack")
    inside = [e for e in stacks if e["name"] == "vaswap-inside"]
    assert len(inside) == 1 and inside[0]["answered"], stacks
    assert "cuMemCreate" in inside[0]["frames"], inside[0]
    out = report(trace)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    start = lines.index(f"## How {run.name} ended")
    assert "the executor has been mapping slot" in lines[start + 2], lines[start + 2]
    row = next(line for line in lines[start:] if line.startswith(f"| {inside[0]['tid_of']} |"))
    assert "vaswap-inside" in row and "cuMemCreate" in row, row
    assert sum(1 for line in lines[start:] if line.startswith("| ") and "|---" not in line) \
        == len(stacks) + 1  # the header, then one row per thread


def test_a_device_handshake_run_reports_its_settles_and_host_path_restores(tmp_path):
    def ev(t_ns, name, **fields):
        return json.dumps({"t_ns": t_ns, "ev": name, "tid": 1, **fields})

    lines = [ev(0, "trace_begin", format="vaswap-trace", version=1),
             ev(10, "summary", slots=4, handshake="device", settle_waits=3, settle_wait_us=2500.0,
                host_path_restores=7, waits=2, wait_us=1500.0, budget_overshoots=1),
             ev(20, "trace_end")]
    path = tmp_path / "handshake.jsonl"
    path.write_text("\n".join(lines) + "\n")
    out = report(path)
    assert out.returncode == 0, out.stderr
    assert ("first-time work (loads, instantiations, copy graphs) that waited for parked streams: "
            "3 times, 2.5 ms") in out.stdout
    assert ("restores that took the host path: 7; host waits for restores: 2 (1.5 ms); budget "
            "overshoots: 1") in out.stdout
    assert "D2H gate" not in out.stdout  # never raised: no line
    path.write_text("\n".join([lines[0], ev(10, "summary", slots=4, handshake="device",
                                            d2h_gate_raises=5, d2h_gate_us=2400.0,
                                            d2h_gate_timeouts=1), lines[2]]) + "\n")
    assert ("the D2H gate (residency.d2h_gate): up for 5 restores, 2.4 ms in all; 1 came down at "
            "their limit rather than at the map") in report(path).stdout
    # The host handshake's runs have no such section.
    path.write_text("\n".join([lines[0], ev(10, "summary", slots=4, handshake="host"), lines[2]]) + "\n")
    assert "## Device handshake" not in report(path).stdout


def test_allocations_passed_through_and_evictions_are_counted_by_why(tmp_path):
    def ev(t_ns, name, **fields):
        return json.dumps({"t_ns": t_ns, "ev": name, "tid": 1, **fields})

    alloc = dict(call="cudaMalloc", api="runtime", bytes=1 << 20, device=0, selected=False)
    evict = dict(va="0x10", bytes=2 << 20, device=0, position=0, data=True)
    lines = [ev(0, "trace_begin", format="vaswap-trace", version=1)]
    lines += [ev(1 + i, "alloc", va=hex(0x1000 + i), skipped="streams", **alloc) for i in range(3)]
    lines += [ev(5, "alloc", va="0x2000", skipped="nccl", **alloc),
              ev(6, "alloc", va="0x3000", **alloc)]
    lines += [ev(7 + i, "evict", slot=i, cause=c, **evict)
              for i, c in enumerate(["budget", "room", "room", "plan"])]
    lines += [ev(20, "trace_end")]
    path = tmp_path / "passed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    out = report(path)
    assert out.returncode == 0, out.stderr
    assert ("- allocations chosen by size and capture but passed through (not slots): 3 (vaswap's "
            "copy streams could not be made on the device); 1 (NCCL's own)") in out.stdout, out.stdout
    assert "- evictions by cause: budget 1, plan 1, room 2" in out.stdout, out.stdout
    # Neither: no section.
    path.write_text("\n".join([lines[0], ev(6, "alloc", va="0x3000", **alloc), lines[-1]]) + "\n")
    assert "## Selection and eviction" not in report(path).stdout


def test_two_traces_are_two_runs(traces):
    result = report(traces["rules"], traces["planned"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("## Graphs of") == 2


# ---------------------------------------------------------------------------------------------
# Timeline and plots
# ---------------------------------------------------------------------------------------------

def test_perfetto_export_has_tracks_slices_and_the_memory_counter(traces):
    out = traces["dir"] / "timeline.json"
    result = report("--perfetto", out, traces["planned"])
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    events = doc["traceEvents"]
    run = read(traces["planned"])
    names = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert any(n.endswith("(D2H)") for n in names) and any(n.endswith("(H2D)") for n in names)
    assert any(n.startswith("vaswap worker") for n in names)
    slices = [e for e in events if e["ph"] == "X"]
    assert sum(1 for e in slices if e["name"].startswith("D2H")) == len(run.of("d2h"))
    assert sum(1 for e in slices if e["name"].startswith("H2D")) == len(run.of("h2d"))
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in slices)
    counters = [e for e in events if e["ph"] == "C"]
    assert counters and all(e["name"] == "device memory (MiB)" for e in counters)
    assert sum(1 for e in events if e["ph"] == "i" and e["name"].startswith("graph")) == 16 * STEPS


def test_plots_are_written(traces):
    out = traces["dir"] / "plots"
    result = report("--plots", out, traces["planned"])
    assert result.returncode == 0, result.stderr
    for name in ("memory.png", "bandwidth.png", "stalls.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------

def damaged(traces, name, edit):
    lines = traces["rules"].read_text().splitlines(keepends=True)
    path = traces["dir"] / name
    path.write_text("".join(edit(lines)))
    return path


def test_a_corrupt_line_is_named_and_the_rest_reported(traces):
    path = damaged(traces, "corrupt.jsonl", lambda l: l[:4] + ['{"t_ns": 12, "ev": "d2h", oops\n'] + l[5:])
    result = report(path)
    assert result.returncode == 1
    assert f"{path}:5: not JSON" in result.stderr
    assert "## Runs" in result.stdout and "## Problems" in result.stdout


def test_a_truncated_trace_is_named_and_the_rest_reported(traces):
    text = traces["rules"].read_text()
    path = traces["dir"] / "truncated.jsonl"
    cut = len(text) // 2
    path.write_text(text[:cut] + '{"t_ns": 1, "ev": "d2')
    lines = text[:cut].count("\n") + 1
    result = report(path)
    assert result.returncode == 1
    assert f"{path}:{lines}: the last line is cut off" in result.stderr
    run = read(path)
    assert run.truncated and 0 < vaswap_report.summary(run)["offloaded_bytes"] < 80 * MiB


def test_an_event_without_a_needed_field_is_rejected_with_its_line(traces):
    def drop_bytes(lines):
        out = list(lines)
        i = next(i for i, line in enumerate(out) if '"ev":"d2h"' in line)
        event = json.loads(out[i])
        del event["bytes"]
        out[i] = json.dumps(event) + "\n"
        return out

    path = damaged(traces, "fields.jsonl", drop_bytes)
    result = report(path)
    assert result.returncode == 1
    assert "`d2h` without `bytes`" in result.stderr
    assert vaswap_report.summary(read(path))["offloaded_bytes"] == (2 * 2 * STEPS - 1) * MiB


def test_an_unknown_event_is_rejected_and_a_newer_version_read(traces):
    def edit(lines):
        first = json.loads(lines[0])
        first["version"] = 2
        return [json.dumps(first) + "\n", '{"t_ns": 5, "ev": "teleport", "tid": 1}\n'] + lines[1:]

    path = damaged(traces, "newer.jsonl", edit)
    result = report(path)
    assert result.returncode == 1
    assert "format version 2 is newer" in result.stderr
    assert f"{path}:2: unknown event `teleport`" in result.stderr
    assert vaswap_report.summary(read(path))["offloaded_bytes"] == 80 * MiB


def test_a_file_that_is_not_a_trace(traces):
    path = traces["dir"] / "empty.jsonl"
    path.write_text("")
    result = report(path)
    assert result.returncode == 1
    assert "no trace_begin" in result.stderr
    missing = report(traces["dir"] / "nope.jsonl")
    assert missing.returncode == 2 and "no such trace" in missing.stderr


def test_the_reader_takes_its_events_from_trace_md():
    events = vaswap_report.documented_events()
    assert {"d2h", "h2d", "plan", "summary", "mem_sample"} <= set(events)
    assert {"bytes", "dur_us", "slot"} <= events["d2h"]
    copy = shutil.copy(vaswap_report.DOC, pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / "TRACE.md")
    text = pathlib.Path(copy).read_text().replace("| `d2h` |", "| `dtwoh` |")
    pathlib.Path(copy).write_text(text)
    changed = vaswap_report.documented_events(pathlib.Path(copy))
    assert "dtwoh" in changed and "d2h" not in changed
