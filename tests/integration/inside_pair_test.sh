#!/usr/bin/env bash
# Two rewritten graphs that share slots, over the simulator: the demo with --graph pair (a forward
# graph with every layer's forward, and a backward graph with the loss's gradient and every
# layer's backward, accumulation and update, as torch.compile's CUDA graph trees in training;
# 32 slots of one 2 MiB page each, captured). The saved activations are written by the forward
# graph and read by the backward graph.
#   1. Without vaswap, --graph pair gives the per-layer checksum, with --peek-step and with
#      --eval-every (the forward graph launched twice in a row).
#   2. inside.mode=on: both graphs are rewritten with windows of their own (16 slots each). The
#      slots the forward graph lent and the backward graph uses (the activations and the last
#      output: 9) are brought back for the backward graph once each, then stay on the device
#      (no window reaches across the two graphs: docs/PLANNER.md, "Which slots"); every launch's
#      windows are carried out; the checksum is the per-layer one. The same with an eager read of
#      an activation between the graphs, and with the forward graph launched alone every third
#      step. Under a size budget that both graphs' windows need (24 MiB): the checksum, both
#      rewritten; the shared slots, with no room to stay, come back at each use.
#   3. Capacity: on a 100 MiB device, where the two graphs run out of memory without vaswap, the
#      auto budget rewrites the backward graph only (the forward graph fits when it is
#      instantiated) and the job runs to the same checksum: between the backward graph's launches
#      its executor's unmapped reserve is parked, the forward graph's launch brings its slots back
#      into it, and the backward graph's next launch evicts them again before its executor maps
#      (before, the room counted that reserve twice and nothing evicted for the executor: its map
#      waited residency.wait_limit and the process was ended).
#   4. A size budget that cannot hold the forward graph's launch beside what the backward graph's
#      executor keeps mapped between launches (40 MiB: 32 MiB beside 14 MiB) is refused at the
#      forward graph's launch, at once and by name.
# Usage: inside_pair_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
source "$src/tests/integration/preload_common.sh"
demo=$build/bin/train_layers
base="selection.min_bytes=1MiB,residency.wait_limit=20s"

# 1. Without vaswap.
declare -A want  # by the demo's extra arguments ("none": none)
for extra in none "--peek-step 3" "--eval-every 3"; do
  [[ $extra != none ]] || extra=""
  # shellcheck disable=SC2086
  per_layer=$("$demo" --quiet --steps 20 $extra)
  [[ "$per_layer" == checksum* ]] || fail "the per-layer demo failed ($extra)"
  # shellcheck disable=SC2086
  got=$("$demo" --quiet --steps 20 --graph pair $extra) || fail "--graph pair $extra failed"
  [[ "$got" == "$per_layer" ]] || fail "--graph pair $extra gives '$got', per layer '$per_layer'"
  want[${extra:-none}]=$per_layer
  echo "ok   without vaswap, --graph pair $extra gives the per-layer checksum: $got"
done
[[ "${want[--peek-step 3]}" != "${want[none]}" && "${want[--eval-every 3]}" != "${want[none]}" ]] ||
  fail "--peek-step and --eval-every do not change the checksum: their cases prove nothing"

# pair NAME CONF EXTRA: the two-graph demo under vaswap must give the checksum without it, and
# its trace must show both graphs rewritten, every launch carried out and the shared slots
# brought back once each.
pair() {
  local name=$1 conf=$2 extra=$3 launches=$4 kept=$5
  # shellcheck disable=SC2086
  got=$(VASWAP_CONF="$conf,log.level=info" \
    run --trace "$tmp/$name.jsonl" -- "$demo" --quiet --steps 20 --graph pair $extra 2>"$tmp/err") ||
    fail "$name: the two-graph demo failed under vaswap"
  [[ "$got" == "${want[${extra:-none}]}" ]] ||
    fail "$name: checksum '$got', without vaswap '${want[${extra:-none}]}'"
  python3 - "$tmp/$name.jsonl" "$launches" "$kept" <<'PY' || fail "$name"
import json, sys
ev = sorted((json.loads(line) for line in open(sys.argv[1])), key=lambda e: e["t_ns"])
s = next(e for e in ev if e["ev"] == "summary")
rw = [e for e in ev if e["ev"] == "graph_rewrite"]
assert [r["nodes"] for r in rw] == [15, 32], rw  # the forward graph, then the backward graph
assert all(r["slots"] == 16 and r["windows"] > 0 for r in rw), rw
assert s["inside_graphs"] == 2 and s["inside_lent_slots"] == 32, s
assert s["inside_launches"] == int(sys.argv[2]), s  # every launch's windows carried out
assert s["inside_releases"] > 0 and s["inside_restores"] > 0, s
assert s["errors"] == 0 and s["inside_failures"] == 0 and s["oom_launches"] == 0, s
demands = [e["slot"] for e in ev if e["ev"] == "inside_demand"]
# The forward graph's activations and its last output, read by the backward graph, are the only
# lent slots other work brings back (9 at most). Kept: each once, at the backward graph's first
# launch, then on the device; under a size budget with no room to keep them, at every use.
assert 0 < len(set(demands)) <= 9, demands
if sys.argv[3] == "1":
    assert len(demands) == len(set(demands)) == 9, demands
print(f"     2 graphs rewritten, {s['inside_releases']} releases and {s['inside_restores']} "
      f"restores in {s['inside_launches']} launches; {len(set(demands))} shared slots brought "
      f"back {len(demands)} times")
PY
  echo "ok   $name: $got"
}

# 2. Every gap, in both graphs.
pair on "$base,inside.mode=on" "" 40 1
pair peek "$base,inside.mode=on" "--peek-step 3" 40 1
# Every third step the forward graph runs once more alone (20 + 20 + 6 launches).
pair eval "$base,inside.mode=on" "--eval-every 3" 46 1
# A size budget below what both graphs' slots hold: the windows it needs, in both graphs; the
# shared slots have no room to stay, and come back at each use.
pair budget "$base,residency.budget=24MiB" "" 40 0

# 3. Capacity under the auto budget.
if VASWAP_SIM_DEVICE_MEMORY=100MiB "$demo" --quiet --steps 20 --graph pair >/dev/null 2>"$tmp/err"; then
  fail "the two graphs fit a 100 MiB device without vaswap: the case proves nothing"
fi
grep -q "cudaErrorMemoryAllocation" "$tmp/err" || fail "without vaswap: not an out-of-memory"
got=$(VASWAP_SIM_DEVICE_MEMORY=100MiB VASWAP_CONF="$base,log.level=info" \
  run --trace "$tmp/auto.jsonl" -- "$demo" --quiet --steps 20 --graph pair 2>"$tmp/err") ||
  fail "auto: the two-graph demo failed under vaswap on a 100 MiB device"
[[ "$got" == "${want[none]}" ]] || fail "auto: checksum '$got', without vaswap '${want[none]}'"
python3 - "$tmp/auto.jsonl" <<'PY' || fail "auto"
import json, sys
ev = sorted((json.loads(line) for line in open(sys.argv[1])), key=lambda e: e["t_ns"])
s = next(e for e in ev if e["ev"] == "summary")
rw = [e for e in ev if e["ev"] == "graph_rewrite"]
assert [r["nodes"] for r in rw] == [32], rw  # the backward graph only
assert s["inside_launches"] == 20 and s["inside_releases"] > 0, s
assert s["errors"] == 0 and s["inside_failures"] == 0 and s["oom_launches"] == 0, s
# The executor's maps wait for the evictions its launch's unpark started (they are not waited for
# on the application's thread), each far below residency.wait_limit (20 s).
assert s["inside_map_wait_us"] < 1e6 * max(1, s["inside_map_waits"]), s
print(f"     the backward graph rewritten; {s['inside_releases']} releases in 20 launches; "
      f"{s['evictions']} evictions; the executor waited for pages {s['inside_map_waits']} times "
      f"({s['inside_map_wait_us'] / 1e3:.1f} ms)")
PY
echo "ok   auto: on a 100 MiB device, $got"

# 4. A budget too small for the forward graph beside what the backward graph's executor keeps.
set +e
VASWAP_CONF="$base,residency.budget=40MiB" \
  run -- "$demo" --quiet --steps 20 --graph pair >/dev/null 2>"$tmp/err"
rc=$?
set -e
[[ $rc != 0 ]] || fail "tight: the demo ran under a 40 MiB budget: the case proves nothing"
grep -q "cudaGraphLaunch of graph .* needs 14 MiB more of slots on device 0 within the residency budget of 40 MiB" "$tmp/err" ||
  fail "tight: the refusal does not say what the launch needed"
grep -q "14 MiB lent to the executor" "$tmp/err" || fail "tight: the refusal does not name the executor's share"
echo "ok   tight: under 40 MiB the forward graph's launch is refused by name (exit status $rc)"
