#!/usr/bin/env bash
# Offload inside one graph (issue 14) over the simulator: the demo with --graph whole (one graph
# per step: every layer's forward and backward, the copies between layers, gradient accumulation
# and the update; 32 slots of one 2 MiB page each, captured).
#   1. Without vaswap, --graph whole gives the per-layer demo's checksum.
#   2. inside.mode=on: the graph is rewritten with windows; same checksum; each launch's windows
#      are carried out (releases and restores); the slots hold at most half their bytes at once
#      (the executor's peak); after the first launches the application's thread never waits for
#      a restore (no restore_wait with host_wait, the output's one read brought back once only).
#   3. Capacity: a 100 MiB device, where the whole graph runs out of memory without vaswap, runs
#      it under residency.budget=28MiB (automatic mode: only the windows the budget needs), same
#      checksum, the lent slots within the reserve; bench/inside_replay, choosing again from the
#      trace's inside_input, finds the run's number of windows, peak and bytes moved.
#      A slot kept on the device beyond the schedule (inside.mode=on) grows the graph's reserve,
#      so the restores that open the launch never wait for room behind the graph (one queue or
#      not); under a size budget the windows fill, it is not kept (the budget holds).
#      Beside eager work of its own (--eager-mib 8, as torch.compile's between its graphs, its
#      buffer a slot too): the rewrite's reserve leaves that work's room, which it first needs
#      before the capture (evicted while the graph is captured: its pinned copy is made in the
#      relaxed capture mode); a budget too small for both is named at the rewrite, with the
#      budget that would do, and runs (the graph's reserve is parked between its launches); one
#      too small for the eager work beside what the executor keeps mapped: the refused launch
#      says why.
#      Every buffer a slot (selection.captured_only=false) at 12 MiB and on a 40 MiB device: the
#      capture's copies wait for room still in flight, and their slots stay mapped until recorded.
#      A size budget below the windows' peak on a 40 MiB device runs (nothing kept beyond the
#      reserve); on a 24 MiB device the windows cannot fit at all: refused at once, named; the
#      same where the program leaves 24 MiB of a 16 GiB device (the automatic reserve is no bound
#      on a size budget's room). Streams that cost device memory (VASWAP_SIM_STREAM_BYTES): with
#      no room for vaswap's device-handshake streams, the host handshake, said, and the checksum.
#   4. Fallbacks: without stream memory operations the graph is instantiated as captured, said
#      once as a warning, same checksum; with CUDA_DEVICE_MAX_CONNECTIONS=1 (one hardware queue)
#      the rewritten graph runs to the same checksum (its copies are its own nodes, enqueued
#      before any wait).
#      A node of it changed by the program: its windows' copies go off in the executable
#      (cuGraphNodeSetEnabled), so a node changed to write a slot inside its window keeps what
#      it wrote (--retarget-step); a copy that cannot be disabled refuses the change, named.
#      cudaGraphExecUpdate of it from a graph with the captured graph's nodes: updated from that
#      graph with the same windows added (the driver refuses the graph as given); where the
#      slots are used where they were, the windows go on, else their copies go off.
#   5. A map that fails once (out of memory) is retried: same checksum. A map that hangs in the
#      driver past residency.wait_limit ends the process with exit status 70 and names it.
#      Buffers freed before the executable that uses them: nothing mapped for the slots off the
#      device (as many pages made as when the executable goes first).
#   6. Each stream creation of the run failing in turn: the checksum, or the failed call named;
#      the rewrite's own stream failing leaves the graph instantiated as captured, said. Each
#      thread vaswap starts failing in turn: the checksum, the failure said (the device without
#      slots, the host handshake, the graph instantiated as captured, or no plan).
#   7. Another stream reads a lent slot without ordering (both only read it): the graph's next
#      launch waits for it on the device; the same with launches on two streams in turn.
# Usage: inside_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
source "$src/tests/integration/preload_common.sh"
demo=$build/bin/train_layers
base="selection.min_bytes=1MiB,residency.wait_limit=20s"

want=$("$demo" --quiet --steps 20)
[[ "$want" == checksum* ]] || fail "the per-layer demo failed"
got=$("$demo" --quiet --steps 20 --graph whole) || fail "--graph whole failed without vaswap"
[[ "$got" == "$want" ]] || fail "--graph whole gives '$got', per layer '$want'"
echo "ok   without vaswap, one graph per step gives the per-layer checksum: $got"

# whole NAME CONF [ENV...]: the whole-graph demo under vaswap must give `want`.
whole() {
  local name=$1 conf=$2
  shift 2
  got=$(
    for setting in "$@"; do export "${setting?}"; done
    VASWAP_CONF="$conf,log.level=info" \
      run --trace "$tmp/$name.jsonl" -- "$demo" --quiet --steps 20 --graph whole 2>"$tmp/err"
  ) || fail "$name: the whole-graph demo failed under vaswap"
  [[ "$got" == "$want" ]] || fail "$name: checksum '$got', without vaswap '$want'"
  echo "ok   $name: $got"
}

# check NAME PYTHON: assertions on the exit summary `s`, the events `ev`, the rewrite `rw`.
check() {
  python3 - "$tmp/$1.jsonl" <<PY || fail "$1"
import json, sys
ev = sorted((json.loads(line) for line in open(sys.argv[1])), key=lambda e: e["t_ns"])
s = next(e for e in ev if e["ev"] == "summary")
rw = [e for e in ev if e["ev"] == "graph_rewrite"]
launches = [e["t_ns"] for e in ev if e["ev"] == "graph_launch"]
MiB = 1 << 20
$2
PY
}

# refused NAME CONF [ENV...] -- [DEMO ARGS...]: the whole-graph demo under vaswap must fail
# (its log in $tmp/err); a run that succeeds proves nothing.
refused() {
  local name=$1 conf=$2
  shift 2
  local env=()
  while [[ $1 != -- ]]; do env+=("$1"); shift; done
  shift
  set +e
  (
    for setting in "${env[@]}"; do export "${setting?}"; done
    VASWAP_CONF="$conf" run -- "$demo" --quiet --steps 20 --graph whole "$@" >/dev/null 2>"$tmp/err"
  )
  local rc=$?
  set -e
  [[ $rc != 0 ]] || fail "$name: the demo ran under vaswap: the case proves nothing"
}

# 2. Every gap.
whole on "$base,inside.mode=on"
check on '
assert len(rw) == 1 and rw[0]["windows"] > 0 and rw[0]["slots"] == 32, rw
assert s["inside_graphs"] == 1 and s["inside_lent_slots"] == 32, s
assert s["inside_launches"] == 20, s  # every launch carried out
assert s["inside_releases"] >= 20 * 16 and s["inside_restores"] >= 20 * 16, s
assert s["inside_peak_held"] * 2 <= s["inside_lent_bytes"], s  # at least half away at the peak
assert s["errors"] == 0 and s["inside_failures"] == 0, s
late = launches[2]
waits = [e for e in ev if e["ev"] == "restore_wait" and e.get("host_wait") and e["t_ns"] > late]
demands = [e for e in ev if e["ev"] == "inside_demand"]
assert not waits, waits
assert len(demands) <= 1, demands  # the last output read once; then it stays on the device
away = 1 - s["inside_peak_held"] / s["inside_lent_bytes"]
windows, releases, restores = rw[0]["windows"], s["inside_releases"], s["inside_restores"]
print(f"     {windows} windows; {away:.0%} of the slots away at their peak; "
      f"{releases} releases, {restores} restores, 0 host waits")
'
grep -q "rewritten with" "$tmp/err" || fail "the log does not say the graph was rewritten"

# 3. Capacity: does not fit without vaswap.
if VASWAP_SIM_DEVICE_MEMORY=100MiB "$demo" --quiet --steps 20 --graph whole >/dev/null 2>"$tmp/err"; then
  fail "the whole graph fits a 100 MiB device without vaswap: the test proves nothing"
fi
grep -q "cudaErrorMemoryAllocation" "$tmp/err" || fail "without vaswap: not an out-of-memory"
echo "ok   without vaswap the whole graph runs out of memory on a 100 MiB device"
whole capacity "$base,residency.budget=28MiB,inside.lead=2" VASWAP_SIM_DEVICE_MEMORY=100MiB
check capacity '
assert len(rw) == 1 and rw[0]["held_peak"] <= 28 * MiB < rw[0]["held_without"], rw
assert s["inside_peak_held"] <= 28 * MiB, s
assert s["oom_launches"] == 0 and s["errors"] == 0, s
held, without = s["inside_peak_held"] / MiB, rw[0]["held_without"] / MiB
print(f"     slots held at most {held:.0f} MiB of {without:.0f}")
'
# The output, read between launches, does not fit the budget beside the windows' peak: it is not
# kept on the device (kept, it took the slots to 30 MiB in a run under load).
grep -q "is used between launches, but residency.budget leaves graph .* no room to keep it" \
  "$tmp/err" || fail "capacity: the slot not kept is not said"
# The trace holds the whole of the choice: bench/inside_replay chooses the windows again from its
# inside_input event and finds the run's rewrite; with another target it finds another choice.
"$build/bin/inside_replay" "$tmp/capacity.jsonl" --check >"$tmp/replay" ||
  { cat "$tmp/replay"; fail "inside_replay: the windows chosen again from the trace differ from the run's"; }
grep -q "lead 2, min_gap 4, lag 0, target 28 MiB" "$tmp/replay" || { cat "$tmp/replay"; fail "inside_replay: not the run's settings"; }
grep -q "moved: same" "$tmp/replay" || { cat "$tmp/replay"; fail "inside_replay: nothing compared"; }
if "$build/bin/inside_replay" "$tmp/capacity.jsonl" --check --target $((16 << 20)) >"$tmp/replay2"; then
  cat "$tmp/replay2"
  fail "inside_replay: a 16 MiB target chose the run's 28 MiB windows"
fi
grep -q "target 16 MiB (given)" "$tmp/replay2" || fail "inside_replay: the given target is not used"
echo "ok   inside_replay: the run's windows chosen again from its trace; another target changes them"

# The same with a lag (inside.lag): a restore counts only on releases two nodes before its
# trigger, and its trigger follows only those; the data is the same.
whole lag "$base,residency.budget=28MiB,inside.lead=2,inside.lag=2" VASWAP_SIM_DEVICE_MEMORY=100MiB
check lag '
assert len(rw) == 1 and rw[0]["windows"] > 0 and rw[0]["held_peak"] < rw[0]["held_without"], rw
assert s["inside_launches"] == 20 and s["inside_restores"] >= 20, s
assert s["oom_launches"] == 0 and s["errors"] == 0 and s["inside_failures"] == 0, s
windows, held = rw[0]["windows"], s["inside_peak_held"] / MiB
print(f"     {windows} windows; held at most {held:.0f} MiB")
'

# A slot the demo reads between launches stays on the device beyond the schedule (every window
# taken, inside.mode=on): the graph's reserve covers the schedule's peak and it (22 MiB), so the
# restores that open the launch find the room the schedule gave them. Before, they waited for
# releases behind their own wait nodes, and in one hardware queue (the simulator's always;
# CUDA_DEVICE_MAX_CONNECTIONS=1 too) each such window waited 100 ms once and then mapped beyond
# the reserve (before that, residency.wait_limit, here 20 s, in every launch). Under a size budget
# that the windows fill (case "capacity"), the slot is not kept: brought back for each use.
for queues in own one; do
  if [[ $queues == one ]]; then
    whole room_$queues "$base,inside.mode=on" CUDA_DEVICE_MAX_CONNECTIONS=1
  else
    whole room_$queues "$base,inside.mode=on"
  fi
  check room_$queues '
assert s["inside_launches"] == 20 and s["inside_room_overshoots"] == 0, s
assert s["inside_room_wait_us"] < 1e6, s
assert s["inside_peak_held"] <= rw[0]["held_peak"] + 2 * MiB, (s, rw)
held, n, ms = s["inside_peak_held"] >> 20, s["inside_room_waits"], s["inside_room_wait_us"] / 1e3
print(f"     held at most {held} MiB; {n} room waits, {ms:.1f} ms in all")
'
  grep -q "is used between launches: it stays on the device then (graph .*'s reserve is 22 MiB)" \
    "$tmp/err" || fail "room_$queues: the kept slot's reserve is not said"
done

# Eager work beside the graph: the demo's buffers by call site, the graph's and the optimizer's.
eager="$base,selection.captured_only=false,selection.include=*::malloc_*,inside.lead=2"
got=$(VASWAP_SIM_DEVICE_MEMORY=100MiB VASWAP_CONF="$eager,residency.budget=28MiB,log.level=info" \
    run --trace "$tmp/eager.jsonl" -- "$demo" --quiet --steps 20 --graph whole --eager-mib 8 \
    2>"$tmp/err") || fail "eager: the demo failed under vaswap: $(grep error "$tmp/err")"
[[ "$got" == "$want" ]] || fail "eager: checksum '$got', without vaswap '$want'"
echo "ok   eager: $got"
check eager '
assert s["slots"] == 33 and len(rw) == 1, (s, rw)
assert rw[0]["held_peak"] <= (28 - 8) * MiB, rw  # the eager launch keeps its 8 MiB
assert s["inside_launches"] == 20 and s["oom_launches"] == 0 and s["errors"] == 0, s
held = rw[0]["held_peak"] // MiB
print(f"     the graph held at most {held} MiB of the 28, the eager work 8")
'
# 12 MiB: too little for the eager work beside the graph's windows, and the rewrite says so,
# naming the budget that leaves room; but between the graph's launches, where the eager work
# runs, its reserve is parked, so the job runs (before 2026-12-08 its launch was refused).
got=$(VASWAP_SIM_DEVICE_MEMORY=100MiB \
  VASWAP_CONF="$eager,residency.budget=12MiB,residency.wait_limit=2s,log.level=info" \
  run -- "$demo" --quiet --steps 20 --graph whole --eager-mib 8 2>"$tmp/err") ||
  fail "eager at 12 MiB: the demo failed under vaswap: $(grep error "$tmp/err")"
[[ "$got" == "$want" ]] || fail "eager at 12 MiB: checksum '$got', without vaswap '$want'"
grep -q "leaves the rest of the program too little of residency.budget (12 MiB).*a budget of at least 16 MiB" \
  "$tmp/err" || fail "eager at 12 MiB: the rewrite does not name the budget that leaves room"
echo "ok   eager at 12 MiB: the rewrite names a budget of 16 MiB; the job runs: $got"
# 8 MiB: the eager work's 8 MiB do not fit beside the pages the executor keeps mapped between
# launches: its launch is refused by name.
refused "eager at 8 MiB" "$eager,residency.budget=8MiB,residency.wait_limit=2s" \
  VASWAP_SIM_DEVICE_MEMORY=100MiB -- --eager-mib 8
grep -q "cudaLaunchKernel needs 8 MiB more of slots on device 0 within the residency budget of 8 MiB" \
  "$tmp/err" || fail "eager at 8 MiB: the refusal does not say what the launch needed"
grep -q "keep their reserves while launches of theirs are queued" "$tmp/err" ||
  fail "eager at 8 MiB: refusal unnamed"
echo "ok   eager at 8 MiB: the eager launch is refused, and says why"

# Every buffer a slot under a budget of 12 MiB: the capture's copies need their slots mapped
# while the restores made for the copies before them are still landing (each stream operation up
# to 1 ms late). The capture waits for that room (bounded by residency.wait_limit); it was
# refused with "2 MiB that can be evicted now", in 5 runs of 5 with this jitter. vaswap's own calls
# for those copies on the capturing thread (stream and event queries among them, which invalidate
# its capture on an H100 and in the simulator) run in relaxed mode: without, the capture's first
# copy found it invalidated, on the H100 and here (3 runs of 3).
whole capture_room "$base,selection.captured_only=false,residency.budget=12MiB" \
  VASWAP_SIM_DEVICE_MEMORY=100MiB VASWAP_SIM_JITTER_US=1000
check capture_room '
cap = [e["t_ns"] for e in ev if e["ev"] in ("capture_begin", "capture_end")]
assert len(cap) == 2, cap
during = [e for e in ev if cap[0] < e["t_ns"] < cap[1]]
fetched = [e for e in during if e["ev"] == "fetch" and e["cause"] == "capture"]
evicted = [e for e in during if e["ev"] == "evict" and e["cause"] == "budget"]
assert fetched and evicted, (len(fetched), len(evicted))
assert s["oom_launches"] == 0 and s["errors"] == 0, s
print(f"     the capture mapped {len(fetched)} slots for its copies, evicting {len(evicted)}")
'
# The same on a 40 MiB device with the automatic budget: restores short of pages evict idle
# slots, never one a copy being recorded names (pinned until it is recorded; a restore once took
# a copy's source between its map and the driver's check, and the capture waited
# residency.wait_limit, then failed).
whole capture_device "$base,selection.captured_only=false" \
  VASWAP_SIM_DEVICE_MEMORY=40MiB VASWAP_SIM_JITTER_US=1000
check capture_device '
assert s["oom_launches"] == 0 and s["errors"] == 0, s
assert s["inside_graphs"] == 1 and s["inside_launches"] == 20, s
held = s["inside_peak_held"] // MiB
print(f"     rewritten; the graph held at most {held} MiB at once on the 40 MiB device")
'
# A size budget below the windows' peak (36 MiB) on a 40 MiB device: no pages beyond the reserve,
# so slots used between launches are brought back each time, never kept beyond it (kept, the
# executor mapped past its reserve every launch, ran out of pages and ended the process, 70).
whole size_below "$base,selection.captured_only=false,residency.budget=28MiB" \
  VASWAP_SIM_DEVICE_MEMORY=40MiB
check size_below '
assert s["inside_launches"] == 20 and s["errors"] == 0, s
assert s["inside_room_overshoots"] == 0, s
assert s["inside_peak_held"] <= rw[0]["held_peak"] + 2 * MiB, (s, rw)
held, peak = s["inside_peak_held"] // MiB, rw[0]["held_peak"] // MiB
print(f"     held at most {held} MiB, the windows peak {peak}; 0 windows mapped beyond the reserve")
'
# too_small NAME [ENV...] -- [DEMO ARGS...]: every buffer a slot under a 16 MiB budget, where the
# device cannot hold the windows' 36 MiB whatever the budget says: the graph is instantiated as
# captured, said, and its launch refused at once (it waited residency.wait_limit for pages that
# never came).
too_small() {
  local name=$1 start=$SECONDS
  shift
  refused "$name" "$base,selection.captured_only=false,residency.budget=16MiB" "$@"
  grep -q "instantiated as captured: with its windows its slots still hold 36 MiB at once, more than the device could give slots at all" \
    "$tmp/err" || fail "$name: the rewrite's refusal is not said: $(cat "$tmp/err")"
  grep -q "cudaGraphLaunch of graph .* needs 128 MiB of slots on device 0 at once" "$tmp/err" ||
    fail "$name: the launch's refusal is not named"
  ((SECONDS - start < 10)) || fail "$name: refused only after $((SECONDS - start)) s"
}
too_small "24 MiB device" VASWAP_SIM_DEVICE_MEMORY=24MiB --
echo "ok   24 MiB device under a 16 MiB budget: instantiated as captured, the launch refused at once"
# The same 24 MiB left on a 16 GiB device by the program itself (--limit-mib, as a job that has
# filled the GPU), each stream holding 2 MiB (VASWAP_SIM_STREAM_BYTES: a GPU's streams cost device
# memory). The automatic residency.reserve (1/32 of the GPU, 512 MiB) is the auto budget's
# headroom, not a bound on a size budget's room: counted so, it hid the room check. vaswap's
# device-handshake streams do not fit: it takes the host handshake and says why (on an H100 left
# 24 MiB the process ended, exit 70).
too_small "24 MiB left" VASWAP_SIM_STREAM_BYTES=2MiB -- --limit-mib 24
handshake_fallback="the host handshake, because vaswap's own streams for it could not be made (cuStreamCreate gave CUDA_ERROR_OUT_OF_MEMORY)"
grep -q "$handshake_fallback" "$tmp/err" ||
  fail "24 MiB left: the host handshake is not said: $(cat "$tmp/err")"
echo "ok   24 MiB left on a 16 GiB device: the host handshake said, the launch refused at once"
# A capture's copy on a device the program left too little, under residency.budget=16MiB and
# 2 MiB a stream: refused within 10 s with a message that matches $2.
copy_refused_at_once() {
  local name=$1 pattern=$2 start=$SECONDS
  shift 2
  refused "$name" "$base,selection.captured_only=false,residency.budget=16MiB" \
    VASWAP_SIM_STREAM_BYTES=2MiB "$@"
  grep -q "$pattern" "$tmp/err" || fail "$name: not refused as '$pattern': $(cat "$tmp/err")"
  ((SECONDS - start < 10)) || fail "$name: refused only after $((SECONDS - start)) s"
}
room_refusal="recorded into a capture needs 4 MiB of slots mapped, and device 0 can give slots 2 MiB in all"
# 6 MiB left: vaswap's copy streams leave slots 2 MiB, and the capture's first copy names two
# slots. Within the budget but beyond the device, it is refused at once, named. Before, its second
# slot's restore waited residency.wait_limit for pages that never came (here and on an H100 left
# 24 MiB), and the refusal said only that.
copy_refused_at_once "6 MiB left" "$room_refusal" -- --limit-mib 6
grep -q "Free device memory before the capture" "$tmp/err" || fail "6 MiB left: no fix given"
echo "ok   6 MiB left: the capture's copy refused at once for the device's room, named"
# 8 MiB left, and the device keeps 2 MiB of its free memory back from every allocation
# (VASWAP_SIM_HOLDBACK), as an H100 did at every fill (about 2.2 MiB,
# bench/results/create_room_session54_h100.txt). vaswap does not count that much of cuMemGetInfo's
# free memory as room, so the capture's copy is refused at once for the device's room, as at
# 6 MiB left, and no map is tried. Before, the map of its new slot failed, and the copy waited
# residency.wait_limit (22 s here, 32 s on an H100 left 24 MiB) or, since 2914446, for three
# failed maps.
copy_refused_at_once "8 MiB left, 2 MiB held back" "$room_refusal" VASWAP_SIM_HOLDBACK=2MiB -- \
  --limit-mib 8
grep -q "cuMemCreate failed" "$tmp/err" &&
  fail "8 MiB left, 2 MiB held back: a map was tried into the memory held back: $(cat "$tmp/err")"
echo "ok   8 MiB left, 2 MiB held back: the capture's copy refused at once for the device's room, named"
# 10 MiB left, and the device keeps 4 MiB back: more than vaswap leaves out of its room, so the
# room it counts covers the capture's copy and the map of its new slot fails. Either the failed
# map teaches the room the 4 MiB and the copy, deciding again, is refused for the device's room;
# or, with nothing in flight that could give pages back, the mover gives that restore up first
# and the copy is refused naming the failed call. Either way at once, named.
copy_refused_at_once "10 MiB left, 4 MiB held back" \
  "recorded into a capture names slot .*, whose pages the device could not give (cuMemCreate failed with CUDA_ERROR_OUT_OF_MEMORY\|$room_refusal" \
  VASWAP_SIM_HOLDBACK=4MiB -- --limit-mib 10
echo "ok   10 MiB left, 4 MiB held back: the capture's copy refused at once, named"
# 12 MiB left, 4 MiB held back (more than vaswap leaves out of its room): the rewrite does not
# fit, and the graph as captured is instantiated while its copies' slots can get no pages (the
# capture's copy may also be refused first: one run in ten here). Either way the program is told it ran out of memory: before, the
# instantiation gave the driver's cudaErrorInvalidValue (an address without pages).
refused "12 MiB left, 4 MiB held back" "$base,selection.captured_only=false,residency.budget=16MiB" \
  VASWAP_SIM_STREAM_BYTES=2MiB VASWAP_SIM_HOLDBACK=4MiB -- --limit-mib 12
grep -q "failed at .*: cudaErrorMemoryAllocation" "$tmp/err" ||
  fail "12 MiB left, 4 MiB held back: not out of memory: $(cat "$tmp/err")"
if grep -q "cudaGraphInstantiate.*failed" "$tmp/err"; then
  grep -q "could not be given pages for the call (cuMemCreate failed with CUDA_ERROR_OUT_OF_MEMORY" \
    "$tmp/err" || fail "12 MiB left, 4 MiB held back: the pages' failure not named: $(cat "$tmp/err")"
fi
echo "ok   12 MiB left, 4 MiB held back: out of memory, named"
# 56 MiB left, 4 MiB a stream: vaswap's copy streams fit, its 17 device-handshake streams do not.
# The host handshake runs the rewritten graph to the checksum.
got=$(VASWAP_SIM_STREAM_BYTES=4MiB \
  VASWAP_CONF="$base,selection.captured_only=false,residency.budget=12MiB,log.level=info" \
  run --trace "$tmp/streams_oom.jsonl" -- "$demo" --quiet --steps 20 --graph whole \
  --limit-mib 56 2>"$tmp/err") || fail "streams_oom: the demo failed under vaswap: $(cat "$tmp/err")"
[[ "$got" == "$want" ]] || fail "streams_oom: checksum '$got', without vaswap '$want'"
[[ $(grep -c "$handshake_fallback" "$tmp/err") == 1 ]] || fail "streams_oom: the host handshake not said once"
check streams_oom '
r = next(e for e in ev if e["ev"] == "residency")
assert r["handshake"] == "host" and "could not be made" in r["why"], r
assert len(rw) == 1 and s["inside_launches"] == 20 and s["inside_failures"] == 0, (rw, s)
assert s["errors"] == 0 and s["inside_room_overshoots"] == 0, s
'
echo "ok   streams_oom: 56 MiB left, the handshake streams out of memory: the host handshake, $got"
# With only the capture's buffers slots, the program's own fill a 64 MiB device: the capture's
# first copy is refused, named, with the fix that applies to the automatic budget.
refused "64 MiB device" "$base" VASWAP_SIM_DEVICE_MEMORY=64MiB --
grep -q "recorded into a capture needs 2 MiB of slots mapped, and the residency budget of 0 B (what the device has free with every slot evicted).*selection.captured_only: false" \
  "$tmp/err" || fail "64 MiB device: the refused capture copy is not named with its fix: $(cat "$tmp/err")"
echo "ok   64 MiB device, capture's buffers only: the capture's copy refused, named"
# 100 MiB left on the 16 GiB device, every buffer a slot, the auto budget: its reserve (1/32 of
# the GPU, at most 512 MiB) is at most half of what slots could have, and windows that need part
# of it take it. Before, the reserve took all 100 MiB: the auto budget's target was 0, no windows
# were tried and the launch was refused (as on an H100 left 100 MiB), where a 12 MiB budget ran.
got=$(VASWAP_SIM_STREAM_BYTES=2MiB \
  VASWAP_CONF="$base,selection.captured_only=false,log.level=info" \
  run --trace "$tmp/auto_100.jsonl" -- "$demo" --quiet --steps 20 --graph whole \
  --limit-mib 100 2>"$tmp/err") || fail "auto_100: the demo failed under vaswap: $(cat "$tmp/err")"
[[ "$got" == "$want" ]] || fail "auto_100: checksum '$got', without vaswap '$want'"
grep -q "of it from residency.reserve" "$tmp/err" || fail "auto_100: the reserve's share not said"
check auto_100 '
assert len(rw) == 1 and rw[0]["windows"] > 0, rw
assert s["inside_launches"] == 20 and s["inside_failures"] == 0 and s["errors"] == 0, s
assert s["inside_peak_held"] * 2 <= s["inside_lent_bytes"], s
'
echo "ok   auto_100: 100 MiB left, the auto budget: windows inside the graph, $got"

# 4. Fallbacks.
whole no_memops "$base,inside.mode=on" VASWAP_SIM_MEMOPS=0
check no_memops 'assert not rw and s["inside_graphs"] == 0, (rw, s)'
[[ $(grep -c "is instantiated as captured" "$tmp/err") == 1 ]] || fail "no_memops: not said once"
grep "is instantiated as captured" "$tmp/err" | grep -q "warning" || fail "no_memops: not a warning"
whole one_queue "$base,inside.mode=on" CUDA_DEVICE_MAX_CONNECTIONS=1
check one_queue 'assert s["inside_launches"] == 20 and s["inside_restores"] > 0, s'

# A node of the rewritten executable changed by the program, named by the captured graph's node
# handle: the call reaches the copy's node; from then on nothing is unmapped; same checksum. The
# demo also reads and sets again whether that node is enabled (cudaGraphNode{Get,Set}Enabled,
# named the same way): without vaswap naming the copy's node, the driver refuses both.
got=$(VASWAP_CONF="$base,inside.mode=on,log.level=info" \
    run --trace "$tmp/set_params.jsonl" -- "$demo" --quiet --steps 20 --graph whole \
    --set-params-step 10 2>"$tmp/err") || fail "set_params: the demo failed under vaswap"
[[ "$got" == "$want" ]] || fail "set_params: checksum '$got', without vaswap '$want'"
grep -q "a node of graph .* is changed" "$tmp/err" || fail "set_params: the change was not seen"
check set_params '
first = [e for e in ev if e["ev"] == "release" and e["t_ns"] > launches[11]]
assert s["inside_launches"] == 20 and not first, (s, len(first))  # nothing unmapped after it
'
echo "ok   set_params: the executable's node changed through the captured node; nothing unmapped after"

# A node changed to write a slot in the middle of that slot's window (--retarget-step: the last
# layer's forward now writes the first layer's activation, which the graph otherwise leaves alone
# between the first layer's forward and backward): the window's restore would put back the data
# from before the gap, so the windows' copies go off with the change. The checksum is the
# changed program's without vaswap. When a copy cannot be disabled, the change is refused with
# the error named, never made with a restore that undoes it.
retarget=$("$demo" --quiet --steps 20 --graph whole --retarget-step 5)
[[ "$retarget" == checksum* && "$retarget" != "$want" ]] || fail "retarget: '$retarget' without vaswap"
got=$(VASWAP_CONF="$base,inside.mode=on,log.level=info" \
    run --trace "$tmp/retarget.jsonl" -- "$demo" --quiet --steps 20 --graph whole \
    --retarget-step 5 2>"$tmp/err") || fail "retarget: the demo failed under vaswap"
[[ "$got" == "$retarget" ]] || fail "retarget: checksum '$got', without vaswap '$retarget'"
grep -q "copies are off" "$tmp/err" || fail "retarget: the copies were not turned off"
check retarget 'assert s["inside_launches"] == 20 and s["inside_windows"] > 0, s'
rc=0
VASWAP_SIM_FAULTS=cuGraphNodeSetEnabled:1:801 VASWAP_CONF="$base,inside.mode=on" \
    run -- "$demo" --quiet --steps 20 --graph whole --retarget-step 5 >"$tmp/out" 2>"$tmp/err" || rc=$?
[[ $rc != 0 ]] || fail "retarget_refused: the change went ahead: $(cat "$tmp/out")"
grep -q "cuGraphNodeSetEnabled failed with CUDA_ERROR_NOT_SUPPORTED.* is refused" "$tmp/err" ||
  fail "retarget_refused: the failed call is not named: $(tail -3 "$tmp/err")"
# The program gets the driver's error in the runtime's words (to_status).
grep -q "cudaGraphExecKernelNodeSetParams.*failed.*cudaErrorNotSupported" "$tmp/err" ||
  fail "retarget_refused: the program did not get the error: $(tail -3 "$tmp/err")"
echo "ok   retarget: a node changed to write inside a window: the copies go off, $got; refused and named when they cannot"

# The program updates the rewritten executable (cudaGraphExecUpdate) from a copy of its captured
# graph, which the driver refuses as given (the executable has the windows' nodes too): vaswap
# updates it from that graph with the same windows added. Used where it was, the windows go on
# (releases after the update); retargeted as above, the copies go off and nothing is unmapped.
for kind in same retarget; do
  args=(--update-step 5)
  expect=$want
  if [[ $kind == retarget ]]; then
    args+=(--update-retarget)
    expect=$retarget
  fi
  plain=$("$demo" --quiet --steps 20 --graph whole "${args[@]}")
  [[ "$plain" == "$expect" ]] || fail "update_$kind: '$plain' without vaswap, expected '$expect'"
  got=$(VASWAP_CONF="$base,inside.mode=on,log.level=info" \
      run --trace "$tmp/update_$kind.jsonl" -- "$demo" --quiet --steps 20 --graph whole \
      "${args[@]}" 2>"$tmp/err") || fail "update_$kind: the demo failed under vaswap: $(tail -3 "$tmp/err")"
  [[ "$got" == "$expect" ]] || fail "update_$kind: checksum '$got', without vaswap '$expect'"
  said="the slots are used where they were: the windows go on"
  [[ $kind == retarget ]] && said="it uses its slots elsewhere now"
  grep -q "is updated from graph .* with its windows added.*$said" "$tmp/err" ||
    fail "update_$kind: the update was not logged with its outcome ($said)"
done
check update_same '
after = [e for e in ev if e["ev"] == "release" and e["t_ns"] > launches[6]]
assert s["inside_launches"] == 20 and len(after) > 0, (s, len(after))  # the windows go on
'
check update_retarget '
after = [e for e in ev if e["ev"] == "release" and e["t_ns"] > launches[6]]
assert s["inside_launches"] == 20 and not after, (s, len(after))  # nothing unmapped after
'
# An update the driver refuses (injected) changes nothing, whatever the new graph does with the
# slots: the executable runs as it was, and its windows go on.
refuse=cuGraphExecUpdate_v2:1:910
plain=$(VASWAP_SIM_FAULTS=$refuse "$demo" --quiet --steps 20 --graph whole --update-step 5 --update-retarget \
  2>/dev/null)
[[ "$plain" == "$want" ]] || fail "update_refused: '$plain' without vaswap, expected '$want'"
got=$(VASWAP_SIM_FAULTS=$refuse VASWAP_CONF="$base,inside.mode=on,log.level=info" \
    run --trace "$tmp/update_refused.jsonl" -- "$demo" --quiet --steps 20 --graph whole \
    --update-step 5 --update-retarget 2>"$tmp/err") ||
  fail "update_refused: the demo failed under vaswap: $(tail -3 "$tmp/err")"
[[ "$got" == "$want" ]] || fail "update_refused: checksum '$got', without vaswap '$want'"
grep -q "cudaGraphExecUpdate refused (cudaErrorGraphExecUpdateFailure)" "$tmp/err" ||
  fail "update_refused: the update was not refused: $(tail -3 "$tmp/err")"
grep -q "the driver refused its update from graph" "$tmp/err" ||
  fail "update_refused: the refusal is not in vaswap's log"
! grep -q "is updated from graph" "$tmp/err" ||
  fail "update_refused: vaswap's log says the refused update was made"
check update_refused '
after = [e for e in ev if e["ev"] == "release" and e["t_ns"] > launches[6]]
assert s["inside_launches"] == 20 and len(after) > 0, (s, len(after))  # the windows go on
'
# After the update the program still names the nodes of the graph it instantiated (a node's new
# parameters, its enabled state), as CUDA asks: they reach the executable's nodes.
got=$(VASWAP_CONF="$base,inside.mode=on" run -- "$demo" --quiet --steps 20 --graph whole \
    --update-step 5 --set-params-step 10 2>"$tmp/err") ||
  fail "update_then_set: the demo failed under vaswap: $(tail -3 "$tmp/err")"
[[ "$got" == "$want" ]] || fail "update_then_set: checksum '$got', without vaswap '$want'"
echo "ok   update: from the captured graph the windows go on; retargeted, their copies go off; refused, they go on; a node changed after it; checksums as without vaswap"

# 5. Failed and stuck maps.
whole map_fails "$base,inside.mode=on" VASWAP_SIM_FAULTS=cuMemCreate:300:2
grep -q "injected fault: cuMemCreate" "$tmp/err" || fail "map_fails: the fault was not injected"
# A restore's map tried again later by the executor (1 ms on), not in a loop under its lock.
check map_fails '
assert s["inside_map_waits"] == 1 and s["inside_map_wait_us"] >= 1000, s
'
# The limit leaves a loaded machine (sanitizers, parallel tests) room for the launches before it:
# only the stuck map may reach it.
set +e
VASWAP_SIM_FAULTS=cuMemCreate:300:-120000 \
  VASWAP_CONF="selection.min_bytes=1MiB,residency.wait_limit=5s,inside.mode=on" \
  run -- "$demo" --quiet --steps 20 --graph whole >/dev/null 2>"$tmp/err"
rc=$?
set -e
grep -q "injected fault: cuMemCreate" "$tmp/err" || fail "a map stuck in the driver: not reached"
[[ $rc == 70 ]] || fail "a map stuck in the driver: exit status $rc, not 70"
grep -q "the executor has been mapping slot" "$tmp/err" || fail "a stuck map is not named"
echo "ok   a map stuck in the driver past the wait limit: exit 70, named"

# A program that frees the buffers before the executable that uses them (CUDA allows it once no
# launch is to come): slots off the device are freed as they are, nothing mapped for them (the
# device may have no room left, and their data is not needed). As many pages made as when the
# executable goes first, which gives them back offloaded.
creates() {
  local got
  got=$(VASWAP_SIM_COUNT=cuMemCreate VASWAP_CONF="$base,inside.mode=on" \
    run -- "$demo" --quiet --steps 20 --graph whole "$@" 2>"$tmp/err") ||
    fail "free_first: the demo failed under vaswap ($*)"
  [[ "$got" == "$want" ]] || fail "free_first: checksum '$got', without vaswap '$want' ($*)"
  sed -n 's/.*cuMemCreate=\([0-9]*\).*/\1/p' "$tmp/err"
}
first=$(creates)
freed=$(creates --free-first)
[[ "$first" =~ ^[0-9]+$ && "$freed" =~ ^[0-9]+$ ]] || fail "free_first: no counts ($first, $freed)"
[[ $freed == "$first" ]] ||
  fail "free_first: $freed pages made when the buffers go first, $first when the executable does"
echo "ok   free_first: buffers freed before their executable: $freed pages made, as with it first ($first)"

# 6. Every stream creation failing in turn (the program's, vaswap's workers', the stream that
# copies lent slots; CUDA_ERROR_UNKNOWN): each run gives the checksum or stops with the failed
# call named, never a wrong result. The rewrite's own stream failing leaves the graph
# instantiated as captured, said. Failing out of memory instead, that stream is made again after
# slots make room: the graph is rewritten and the run gives the checksum.
set +e
VASWAP_SIM_COUNT=cuStreamCreateWithPriority VASWAP_CONF="$base,inside.mode=on" \
  run -- "$demo" --quiet --steps 20 --graph whole >/dev/null 2>"$tmp/err"
rc=$?
set -e
[[ $rc == 0 ]] || fail "stream_fails: the run that counts stream creations failed (exit $rc)"
creates=$(sed -n 's/.*cuStreamCreateWithPriority=\([0-9]*\).*/\1/p' "$tmp/err")
[[ "$creates" =~ ^[0-9]+$ && $creates -gt 1 ]] || fail "stream_fails: no count of stream creations ($creates)"
captured=0
for n in $(seq 1 "$creates"); do
  set +e
  got=$(VASWAP_SIM_FAULTS=cuStreamCreateWithPriority:$n:999 VASWAP_CONF="$base,inside.mode=on" \
    run -- "$demo" --quiet --steps 20 --graph whole 2>"$tmp/err")
  rc=$?
  set -e
  grep -q "injected fault: cuStreamCreateWithPriority" "$tmp/err" ||
    fail "stream_fails: creation $n of $creates was not failed"
  if [[ $rc == 0 ]]; then
    [[ "$got" == "$want" ]] || fail "stream_fails: creation $n failed: checksum '$got', without vaswap '$want'"
  else
    grep -qi "stream.*out of memory\|cuStreamCreate" "$tmp/err" ||
      fail "stream_fails: creation $n failed: exit $rc without the call named"
  fi
  if grep -q "instantiated as captured: cuStreamCreate failed" "$tmp/err"; then
    captured=$((captured + 1))
    rewrite_stream=$n
  fi
done
[[ $captured == 1 ]] || fail "stream_fails: the rewrite's stream failing was said $captured times, not once"
got=$(VASWAP_SIM_FAULTS=cuStreamCreateWithPriority:$rewrite_stream:2 \
  VASWAP_CONF="$base,inside.mode=on,log.level=info" run -- "$demo" --quiet --steps 20 --graph whole \
  2>"$tmp/err") || fail "stream_fails: the rewrite's stream out of memory: the run failed: $(cat "$tmp/err")"
[[ "$got" == "$want" ]] || fail "stream_fails: the rewrite's stream out of memory: checksum '$got'"
grep -q "injected fault: cuStreamCreateWithPriority" "$tmp/err" && grep -q "rewritten with" "$tmp/err" &&
  ! grep -q "instantiated as captured" "$tmp/err" ||
  fail "stream_fails: the rewrite's stream out of memory was not made again: $(cat "$tmp/err")"
echo "ok   stream_fails: each of $creates stream creations failed in turn: the checksum or the call named; the rewrite's own instantiated as captured, or made again after room where out of memory"

# Every thread vaswap starts failing in turn (the simulator's "vaswap_thread" fault, thrown as
# std::system_error is where the system starts no thread, errno 11; errno 12 as the std::bad_alloc
# of std::thread's state, which start_thread turns into the same), one graph per step and per-layer
# graphs: the device's four (it gets no slots for now), the watchdog (the host handshake), the
# executor's two (the graph instantiated as captured), the planner's (no plan). Each run gives
# the checksum, the failure said on the log; before, the error left the program's cudaMalloc, or
# a launch, and ended the process.
for graphs in whole layer; do
  args=(--quiet --steps 20)
  expect="device device device device watchdog executor executor planner"
  if [[ $graphs == whole ]]; then
    args+=(--graph whole)
  else
    expect="device device device device watchdog planner"
  fi
  VASWAP_SIM_COUNT=vaswap_thread VASWAP_CONF="$base,inside.mode=on" \
    run -- "$demo" "${args[@]}" >/dev/null 2>"$tmp/err" ||
    fail "thread_fails $graphs: the run that counts thread starts failed"
  starts=$(sed -n 's/.*vaswap_thread=\([0-9]*\).*/\1/p' "$tmp/err")
  [[ "$starts" =~ ^[0-9]+$ ]] || fail "thread_fails $graphs: no count of thread starts"
  for err in 11 12; do
    said=()
    for n in $(seq 1 "$starts"); do
      got=$(VASWAP_SIM_FAULTS=vaswap_thread:$n:$err VASWAP_CONF="$base,inside.mode=on" \
        run -- "$demo" "${args[@]}" 2>"$tmp/err") ||
        fail "thread_fails $graphs errno $err: start $n of $starts failing: the demo failed"
      [[ "$got" == "$want" ]] ||
        fail "thread_fails $graphs errno $err: start $n: checksum '$got', without vaswap '$want'"
      grep -q "injected fault: vaswap_thread" "$tmp/err" || fail "thread_fails $graphs errno $err: start $n was not failed"
      # 12: std::thread's bad_alloc (no memory for its state), handled as the system's refusal.
      [[ $err == 11 ]] || grep -q "simulator injected (no memory): Cannot allocate memory" "$tmp/err" ||
        fail "thread_fails $graphs errno $err: start $n without memory (std::bad_alloc) was not said: $(cat "$tmp/err")"
      if grep -q "vaswap's threads for device 0 could not be started (a fault the simulator injected" "$tmp/err"; then
        said+=(device)
      elif grep -q "the host handshake, because vaswap's watchdog thread could not be started" "$tmp/err"; then
        said+=(watchdog)
      elif grep -q "instantiated as captured: vaswap's executor threads could not be started" "$tmp/err"; then
        said+=(executor)
      elif grep -q "the planner's thread could not be started" "$tmp/err"; then
        said+=(planner)
      else
        fail "thread_fails $graphs errno $err: start $n failing was not said"
      fi
    done
    [[ "${said[*]}" == "$expect" ]] || fail "thread_fails $graphs errno $err: the failures said: ${said[*]}; expected $expect"
    echo "ok   thread_fails $graphs errno $err: each of $starts thread starts failed in turn: the checksum, the failure said (${said[*]})"
  done
done

# 7. Another stream (side_stream_probe.cu): a long kernel on stream X reads a table that the graph
# reads too and that a window of the graph takes off the device in the middle of each launch; the
# program orders nothing between X and the next launch (both only read it). The next launch waits
# on the device for X's kernel before it moves the table (without that wait the kernel faults on
# the simulator: an illegal address on a GPU). --alternate launches the graph on two streams in
# turn, ordered only as CUDA orders one executable's launches (a correctness check: its hand-off
# waits for the last launch on the other stream, which this probe cannot tell from no wait).
side=$build/bin/side_stream_probe
side_want=$("$side") || fail "side_stream_probe failed without vaswap"
side_conf="selection.captured_only=false,selection.min_bytes=1MiB,inside.mode=on,inside.lead=2,log.level=info"
for mode in "" --alternate; do
  [[ $("$side" $mode) == "$side_want" ]] || fail "side_stream_probe $mode differs without vaswap"
  got=$(VASWAP_CONF="$side_conf" run --trace "$tmp/side.jsonl" -- "$side" $mode 2>"$tmp/err") ||
    fail "side_stream $mode: the probe failed under vaswap"
  [[ "$got" == "$side_want" ]] || fail "side_stream $mode: '$got', without vaswap '$side_want'"
  check side '
assert len(rw) == 1 and rw[0]["windows"] > 0, rw
assert s["inside_launches"] == 12 and s["inside_releases"] >= 12, s
assert s["errors"] == 0 and s["inside_failures"] == 0, s
'
  echo "ok   side_stream $mode: a second stream reads a lent slot unordered: $got"
done
