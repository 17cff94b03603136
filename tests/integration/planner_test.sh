#!/usr/bin/env bash
# The planner over the simulator (issue 6): the layered demo (examples/train_layers: a forward and
# a backward graph per layer, eager input copies between layers, eager gradient accumulation) run
# under vaswap with no change, its checksum compared with a plain run of the same options.
#   1. 50 steps, the link given as 50 GB/s: a plan with windows is made and carried out (and
#      bench/plan_replay chooses it again from the trace); the checksum is identical; cuMemGetInfo (sampled by vaswap every 100 us) shows device memory
#      given back in the steps, at least half the plan's peak; nothing was restored on demand;
#      with schedule.release_after_use, releases are issued right after their slots' last use;
#      without it (the default), or with the guard off, at their launch.
#   2. The same with a link so slow that no window can hide a copy: the plan takes nothing.
#   3. An eager kernel reads an offloaded activation in step 30 (--peek-step): the guard restores
#      it on demand (guard_hit) and the checksum is identical.
#   4. An evaluation pass every 7 steps (forward graphs only): launches out of the learned order
#      (deviation events) stay correct.
#   5. The default policy with a budget the slots exceed: the model is measured by the copy test.
#   6. rules mode: two rules from a policy file offload and restore exactly where they say.
#   7. The exit summary says so at log.level info, and nothing at the default level.
# Usage: planner_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
source "$src/tests/integration/preload_common.sh"
demo=$build/bin/train_layers
# 32 slots of one 2 MiB page each (64 MiB); a 40 MiB budget makes a good part leave every step.
given="selection.min_bytes=1MiB,schedule.model=given,schedule.h2d_gbps=50,schedule.d2h_gbps=50,schedule.remap_latency=50us,residency.budget=40MiB"

# plain_and_vaswap NAME CONF DEMO-ARGS...: both checksums must agree; the trace is $tmp/NAME.jsonl.
plain_and_vaswap() {
  local name=$1 conf=$2
  shift 2
  local plain with
  plain=$("$demo" --quiet "$@")
  with=$(VASWAP_CONF=$conf run --trace "$tmp/$name.jsonl" -- "$demo" --quiet "$@" 2>"$tmp/err") ||
    fail "$name: the demo failed under vaswap"
  [[ "$plain" == "$with" && "$plain" == checksum* ]] ||
    fail "$name: checksum differs: plain '$plain', vaswap '$with'"
  echo "ok   $name: $with"
}

# check NAME PYTHON: runs the assertions in PYTHON with `ev` (the trace's events, in time order),
# `count(name)` and `first(name)` defined.
check() {
  local name=$1 body=$2
  python3 - "$tmp/$name.jsonl" <<PY || fail "$name"
import json, sys
ev = sorted((json.loads(line) for line in open(sys.argv[1])), key=lambda e: e["t_ns"])
def count(n): return sum(1 for e in ev if e["ev"] == n)
def first(n): return next(e for e in ev if e["ev"] == n)
$body
PY
}

# 1. The plan carried out, with the device handshake (the default: the stream waits for restores
#    on the device; the host handshake is checked after).
plain_and_vaswap steady "$given,trace.memory_interval=100us,schedule.release_after_use=true" --steps 50
check steady '
import bisect
plan = first("plan")
assert plan["period"] == 16, plan
assert plan["windows"] > 0 and plan["peak_bytes"] > 0, plan
assert plan["budget"] == 40 << 20 and plan["total_pages"] == 64 << 20, plan
assert plan["resident_peak"] <= plan["budget"] and plan["short_pages"] == 0, plan
# What the plan asks of the link: the slot of each window once each way per period, at the given
# 50 GB/s, against the device time of the graphs of the period (within the period).
windows = [e for e in ev if e["ev"] == "plan_window" and e["plan"] == plan["plan"]]
assert len(windows) == plan["windows"] and plan["moved_bytes"] == sum(w["bytes"] for w in windows), plan
assert abs(plan["copy_us"] - plan["moved_bytes"] / 50e3) < 1, plan
assert 0 < plan["graphs_us"] <= plan["period_us"], plan
assert count("plan_offload") > 0 and count("plan_restore") > 0
offloaded = sum(e["bytes"] for e in ev if e["ev"] == "d2h")
restored = sum(e["bytes"] for e in ev if e["ev"] == "h2d")
assert offloaded > 0 and restored > 0, (offloaded, restored)
waits = [e for e in ev if e["ev"] == "restore_wait"]
# Each names the slots its stream waited for, as many as it counts, each a slot of the run.
made = {e["slot"] for e in ev if e["ev"] == "slot_create"}
for w in waits:
    ids = [int(s) for s in w["waited"].split(",")] if w["waited"] else []
    assert len(ids) == w["slots"] and set(ids) <= made, (w, sorted(made))
# In steady state (from the second step after the plan) every restore was started ahead: the
# application thread never had to wait for one to be submitted (the host handshake).
starts = [e["t_ns"] for e in ev if e["ev"] == "graph_launch" and e["t_ns"] > plan["t_ns"]]
first_exec = next(e["exec"] for e in ev if e["ev"] == "graph_launch" and e["t_ns"] > plan["t_ns"])
starts = [e["t_ns"] for e in ev if e["ev"] == "graph_launch" and e["exec"] == first_exec and e["t_ns"] > plan["t_ns"]]
late = [e for e in waits if e["on_demand"] and bisect.bisect_right(starts, e["t_ns"]) > 2]
# Under the device handshake the thread of the program is not held back by restores and runs
# ahead of the device; on a loaded machine (CI, the sanitizer builds) a planned restore then
# sometimes finds the budget still full and is left to its use: one or two in some runs, none in
# ten unloaded ones. More than that is the plan not being carried out.
planned = count("plan_restore")
assert len(late) <= 2, f"{len(late)} restores on demand in steady state ({planned} planned)"
blocked = [e for e in waits if e["host_wait"] and bisect.bisect_right(starts, e["t_ns"]) > 2]
assert not blocked, f"{len(blocked)} host waits for a restore in steady state"
# Nor for pages: the eager copies and memsets between layers whose slots were not mapped yet went
# ahead as graphs (the device handshake makes one of each the first time it waits).
paged = [e for e in waits if e.get("map_waited") and bisect.bisect_right(starts, e["t_ns"]) > 2]
assert not paged, f"{len(paged)} copies or memsets waited for pages in steady state"
assert any(e.get("as_graph") for e in waits), "no copy or memset went ahead as a graph"
# What slots held never went over the budget (whole pages, the exit summary).
summary = first("summary")
assert summary["peak_resident"] <= 40 << 20 and summary["handshake"] == "device", summary
last = max(e["t_ns"] for e in ev if e["ev"] == "graph_launch")
# Pages that left went back to the driver (cuMemGetInfo shows them free) or were kept for the next
# restore of their size (release events with "kept"): residency keeps them only within the
# budget, so the device may show nothing freed. Either way some left, and never more than all.
samples = [e for e in ev if e["ev"] == "mem_sample"]
before = [e["free"] for e in samples if e["t_ns"] <= plan["t_ns"]][-1]
during = [e["free"] for e in samples if plan["t_ns"] < e["t_ns"] <= last]
freed = max(during + [before]) - before
slot_pages = 32 * (2 << 20)  # 32 captured 1 MiB buffers, one 2 MiB granule each
kept = sum(1 for e in ev if e["ev"] == "release" and e.get("kept"))
reused = sum(1 for e in ev if e["ev"] == "remap" and e.get("reused"))
assert 0 <= freed <= slot_pages, (freed, plan["peak_bytes"])
assert freed > 0 or (kept > 0 and reused > 0), (freed, kept, reused)
# schedule.release_after_use (on here): the releases of each layer are issued right after the
# launch or the eager call (gradient accumulation, input copies) that used their slots last, not at
# the next launch; a release whose slot the eager work after its last launch used a varying number
# of times in learning waits for its launch.
issued = {}
for e in ev:
    if e["ev"] == "plan_offload":
        issued[e["issued"]] = issued.get(e["issued"], 0) + e["slots"]
early = issued.get("after_launch", 0) + issued.get("after_eager", 0)
assert early >= 0.9 * sum(issued.values()), issued
windows, peak = plan["windows"], plan["peak_bytes"] >> 20
print(f"     plan: {windows} windows, {peak} MiB away at once; cuMemGetInfo: {freed >> 20} MiB "
      f"more free during the steps; {kept} evictions kept their pages, {reused} restores reused "
      f"them; {offloaded >> 20} MiB offloaded, {restored >> 20} MiB restored; "
      f"{early} of {sum(issued.values())} releases issued after their last use")
'

# 1a. Without schedule.release_after_use (the default), and with it but the guard off (eager work
#     not scanned in steady state, so learning's view of it is not trusted): every planned release
#     at its own launch, the same checksum.
plain_and_vaswap at_launch "$given" --steps 30
check at_launch '
kinds = {e["issued"] for e in ev if e["ev"] == "plan_offload"}
assert kinds == {"launch"}, kinds
'
plain_and_vaswap unguarded "$given,schedule.release_after_use=true,guard=false" --steps 30
check unguarded '
kinds = {e["issued"] for e in ev if e["ev"] == "plan_offload"}
assert kinds == {"launch"}, kinds
'

# 1b. The same plan with the host handshake: the same checksum (plain_and_vaswap), the slots
#     within the budget, every restore of the plan carried out.
plain_and_vaswap steady_host "$given,residency.handshake=host" --steps 30
check steady_host '
summary = first("summary")
assert summary["handshake"] == "host" and summary["peak_resident"] <= 40 << 20, summary
assert count("plan_restore") > 0 and summary["errors"] == 0, summary
'

# 1c. trace.launch_times: every graph launch's device times (launch_time), and vaswap report's
#     table of them by phase. The demo launches its graphs on one stream, so each launch's
#     since_us + parked_us + graph_us adds up, launch after launch, to the device time from the
#     first launch to the last one traced: no more than the host saw pass meanwhile.
plain_and_vaswap launch_times "$given,trace.launch_times=true" --steps 30
check launch_times '
launches = [e for e in ev if e["ev"] == "graph_launch"]
times = sorted((e for e in ev if e["ev"] == "launch_time"), key=lambda e: e["enqueued_ns"])
execs = {e["exec"] for e in launches}
# Written at later launches: only the last few, still running at exit, may be missing.
assert len(launches) - 4 <= len(times) <= len(launches), (len(launches), len(times))
assert all(e["exec"] in execs for e in times)
assert len({e["stream"] for e in times}) == 1, {e["stream"] for e in times}
assert all(e["graph_us"] > 0 and e["parked_us"] >= 0 for e in times)
assert "since_us" not in times[0] and all(e["since_us"] >= 0 for e in times[1:]), times[:2]
device_ms = sum(e["parked_us"] + e["graph_us"] + e.get("since_us", 0) for e in times) / 1e3
host_ms = (max(e["t_ns"] for e in times) - times[0]["enqueued_ns"]) / 1e6
span_ms = (times[-1]["enqueued_ns"] - times[0]["enqueued_ns"]) / 1e6
assert 0.5 * span_ms <= device_ms <= host_ms + 1, (device_ms, span_ms, host_ms)
print(f"     {len(times)} of {len(launches)} launches timed: {device_ms:.1f} ms of device time "
      f"between the first and the last, within the {host_ms:.1f} ms the host saw")
'
"$vaswap" report --no-progress "$tmp/launch_times.jsonl" >"$tmp/report" 2>&1 || fail "launch_times: vaswap report failed: $(tail -3 "$tmp/report")"
python3 - "$tmp/report" "$tmp/launch_times.jsonl" <<'PY' || fail "launch_times: the report's table"
import json, re, sys
text = open(sys.argv[1]).read()
assert "## Launch times of" in text, text[-2000:]
rows = {m.group(1): int(m.group(2)) for m in re.finditer(r"^\| (before a plan|plan in force) \| (\d+) \|", text, re.M)}
timed = sum(1 for line in open(sys.argv[2]) if '"ev":"launch_time"' in line)
assert set(rows) == {"before a plan", "plan in force"} and sum(rows.values()) == timed, (rows, timed)
# Where the stream waited under the plan: a line either way, naming only graphs the trace launched.
line = next(l for l in text.splitlines() if l.startswith("- with the plan in force, "))
execs = {json.loads(l)["exec"] for l in open(sys.argv[2]) if '"ev":"launch_time"' in l}
named = re.findall(r"#\d+ (0x[0-9a-f]+) ", line)
assert set(named) <= execs and ("no graph" in line) == (not named), (line, execs)
print(f"     vaswap report: {rows['before a plan']} launches before the plan, {rows['plan in force']} with it")
PY

# 1b. The trace holds the whole of the choice: bench/plan_replay chooses the plan again from its
#     plan_input event and finds the run's windows; with a budget changed in the input it finds
#     other windows and says so.
"$build/bin/plan_replay" "$tmp/steady.jsonl" --check >"$tmp/replay" ||
  { cat "$tmp/replay"; fail "plan_replay: the plan chosen again from the trace differs from the run's"; }
grep -q "same [1-9][0-9]* windows" "$tmp/replay" || { cat "$tmp/replay"; fail "plan_replay: no windows compared"; }
sed 's/"budget":\([0-9]*\),"limit"/"budget":20971520,"limit"/' "$tmp/steady.jsonl" >"$tmp/halved.jsonl"
if "$build/bin/plan_replay" "$tmp/halved.jsonl" --check >"$tmp/replay2"; then
  cat "$tmp/replay2"
  fail "plan_replay: a 20 MiB budget in the input chose the run's 40 MiB plan"
fi
grep -q "now only:" "$tmp/replay2" || fail "plan_replay: the difference is not shown"
# --budget chooses for another budget without editing the trace: at 20 MiB the windows chosen for
# the edited input; at 1 GiB (more than the slots) none.
"$build/bin/plan_replay" "$tmp/steady.jsonl" --budget 20MiB >"$tmp/replay3" || true
[ "$(grep "chosen now" "$tmp/replay3")" = "$(grep "chosen now" "$tmp/replay2")" ] ||
  { cat "$tmp/replay2" "$tmp/replay3"; fail "plan_replay --budget 20MiB chose otherwise than a 20 MiB input"; }
"$build/bin/plan_replay" "$tmp/steady.jsonl" --budget 1GiB >"$tmp/replay4" || true
grep -q "chosen now: 0 windows, 0 MiB each way" "$tmp/replay4" ||
  { cat "$tmp/replay4"; fail "plan_replay --budget 1GiB still moves slots"; }
if "$build/bin/plan_replay" "$tmp/steady.jsonl" --budget 12XB 2>"$tmp/replay5"; then
  fail "plan_replay took --budget 12XB"
fi
grep -q "takes a size such as" "$tmp/replay5" || { cat "$tmp/replay5"; fail "plan_replay: no clear error for --budget 12XB"; }
echo "ok   plan_replay: the run's plan chosen again from its trace; a changed budget changes it; --budget"

# 2. The default budget (auto: what the 16 GiB simulated device has) fits every slot: the plan
#    takes no window and nothing moves, whatever the link.
plain_and_vaswap fits "selection.min_bytes=1MiB,schedule.model=given,schedule.h2d_gbps=0.001,schedule.d2h_gbps=0.001" --steps 12
check fits '
plan = first("plan")
assert plan["windows"] == 0 and "fit the budget" in plan["reason"], plan
assert count("plan_offload") == 0 and count("d2h") == 0 and count("evict") == 0
assert count("model") == 0, "a copy test ran where the slots fit the budget"
print("     plan:", plan["reason"])
'

# 3. The guard: with 16 MiB of budget the activations leave between forward and backward too, and
#    the eager kernel of step 30 reads the first layer's.
plain_and_vaswap guard "${given/residency.budget=40MiB/residency.budget=16MiB}" --steps 40 --peek-step 30
check guard '
# The peeking kernel is the one eager kernel that finds its slot away. (An eager copy between
# layers may find one away too: under the device handshake the thread of the application runs
# ahead of the device, and a budget this tight evicts for room what the plan did not.)
hits = [e for e in ev if e["ev"] == "guard_hit" and e["call"] == "cudaLaunchKernel"]
assert len(hits) == 1, hits
plan = first("plan")
eager = [e for e in ev if e["ev"] == "restore_wait" and e["on_demand"] and e["reason"] == "eager"
         and e["call"] == "cudaLaunchKernel" and e["t_ns"] > plan["t_ns"]]
assert len(eager) == 1 and eager[0]["restored"] == 1, eager
print("     guard hit at position", hits[0]["position"])
'

# 4. Evaluation passes.
plain_and_vaswap evaluation "$given" --steps 40 --eval-every 7
check evaluation '
assert count("plan") == 1 and count("plan_offload") > 0
assert count("deviation") >= 4, count("deviation")
print("    ", count("deviation"), "deviations")
'

# 4b. A graph built through the graph API (not captured) reads the first layer's activation between
#     forward and backward; at step 10 its node is re-pointed at the second layer's
#     (cudaGraphExecKernelNodeSetParams: the new arguments are scanned and join what the
#     executable uses), at step 20 it is updated from a graph reading the third layer's
#     (cudaGraphExecUpdate: scanned again, exactly).
#     - Ten steps, under a budget that makes slots leave: the scan sees the activation it reads.
plain_and_vaswap api_graph "$given" --steps 10 --api-graph
check api_graph '
api = [e for e in ev if e["ev"] == "graph_scan" and e["capture"] == 0]
assert len(api) == 1 and api[0]["slot_regions"] == 1 and not api[0]["opaque"], api
assert count("plan_offload") > 0
'
#     - The whole run under the same budget: the changed node names the second activation (the
#       first stays counted: the executable cannot be asked what it dropped), the update the
#       third alone; no launch needs every slot, and the same checksum.
plain_and_vaswap api_graph_all "$given" --steps 40 --api-graph
check api_graph_all '
api = [e for e in ev if e["ev"] == "graph_scan" and e["capture"] == 0]
assert len(api) == 2 and all(e["slot_regions"] == 1 and not e["opaque"] for e in api), api
updates = [e for e in ev if e["ev"] == "graph_update"]
assert [(u["opaque"], u["slots"]) for u in updates] == [(False, 2), (False, 1)], updates
assert updates[0]["call"] == "cudaGraphExecKernelNodeSetParams", updates[0]
opaque = [e for e in ev if e["ev"] == "graph_launch" and e.get("opaque")]
assert not opaque, len(opaque)
learns = [e["why"] for e in ev if e["ev"] == "learn"]
assert learns.count("a graph of the pattern was changed") == 2, learns
assert count("plan_offload") > 0
plans, offloads = count("plan"), count("plan_offload")
print(f"     {plans} plans, {offloads} planned offloads")
'

# 5. The measured model. The copy test runs on the planning worker once learning ends (about step
#    6), for a device whose slots do not all fit the budget (40 MiB here); 80 steps leave it about
#    a second on the simulator, where 20 left 50 ms and a loaded CI machine once ended the demo
#    before the plan (and its `model` event) was made. Where they fit (test 2) there is no copy test.
plain_and_vaswap measured "selection.min_bytes=1MiB,residency.budget=40MiB" --steps 80
check measured '
models = [e for e in ev if e["ev"] == "model"]
assert models, "no model event: the demo ended before the planning worker made its plan"
m = models[0]
assert m["source"] == "measured" and m["h2d_gbps"] > 0 and m["d2h_gbps"] > 0 and m["remap_us"] > 0, m
d2h, h2d, remap = m["d2h_gbps"], m["h2d_gbps"], m["remap_us"]
print(f"     copy test: D2H {d2h:.1f} GB/s, H2D {h2d:.1f} GB/s, remap {remap:.0f} us")
'

# 6. rules mode (tests/integration/rules_policy.yaml names the captures).
plain=$("$demo" --quiet --steps 20)
with=$(VASWAP_POLICY=$src/tests/integration/rules_policy.yaml VASWAP_CONF=log.level=info run --trace "$tmp/rules.jsonl" -- \
  "$demo" --quiet --steps 20 2>"$tmp/err") ||
  fail "rules: the demo failed under vaswap"
[[ "$plain" == "$with" ]] || fail "rules: checksum differs: plain '$plain', vaswap '$with'"
echo "ok   rules: $with"
check rules '
assert count("plan") == 0
offloads = [e for e in ev if e["ev"] == "plan_offload"]
assert len(offloads) == 2 * 20 and all(e["slots"] == 2 for e in offloads), len(offloads)
waits = [e for e in ev if e["ev"] == "restore_wait" and e["restored"] > 0]
assert len(waits) == 2 * 20 and all(e["reason"] == "rule" and e["restored"] == 2 for e in waits), len(waits)
# Each names the slots its stream waited for (as many as it counts), two of them slots the rules
# evicted; over the run, every evicted slot is named.
evicted = {e["slot"] for e in ev if e["ev"] == "evict"}
named = set()
for w in waits:
    ids = [int(s) for s in w["waited"].split(",")]
    assert len(ids) == w["slots"] and len(set(ids) & evicted) == 2, (w, sorted(evicted))
    named |= set(ids) & evicted
assert named == evicted, (sorted(named), sorted(evicted))
'
# 7. The exit summary: on the log at info level (log.level: info), never at the default level.
grep -q "summary: 32 slots selected; 4 offloaded (0 plans); 80 MiB offloaded, 80 MiB restored;" "$tmp/err" ||
  fail "rules: the exit summary at info level is missing or wrong"
grep -o "summary: .*" "$tmp/err" | sed 's/^/     /'
VASWAP_CONF=$given run -- "$demo" --quiet --steps 2 >/dev/null 2>"$tmp/err" || fail "quiet: the demo failed"
if grep -q "summary:" "$tmp/err"; then fail "the exit summary was printed at the default log level"; fi
echo "ok   exit summary: at info level only"
echo "planner: all checks passed"
