#!/usr/bin/env bash
# The preload over three kinds of program (tests/integration/probe.cpp): linked against libcudart,
# reaching the driver through cuGetProcAddress, and dlopen()ing libcuda. For each:
#   - stdout (what the program computed, and the calls it made) is identical with and without
#     vaswap, and with vaswap off;
#   - every call is intercepted exactly once: vaswap's counters equal the program's own counts,
#     and the trace has one event per call, all at the level the program called;
#   - the allocation made during the capture is a slot at its own address, mapped when the capture
#     records a copy into it (not before); the other one is passed through;
#   - with a residency budget smaller than that slot, its launch gets the API's out-of-memory
#     error, with a message, and nothing runs.
# Then a driver older than a hooked revision (batch_probe.cpp): its own revision passes through.
set -euo pipefail
build=$1
src=$2
source "$src/tests/integration/preload_common.sh"

for way in runtime procaddr dlopen; do
  probe=$build/bin/probe_$way
  case $way in runtime) api=runtime ;; *) api=driver ;; esac

  plain=$("$probe") || { echo "FAIL $way: the probe failed without vaswap (exit $?)"; exit 1; }
  VASWAP_CONF="selection.min_bytes=4MiB" run --trace "$tmp/$way.jsonl" -- "$probe" \
    >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/err"; exit 1; }
  if [[ "$plain" != "$(cat "$tmp/out")" ]]; then
    echo "FAIL $way: output differs under vaswap"; diff <(echo "$plain") "$tmp/out"; exit 1
  fi
  grep -q "mapped after its first launch" "$tmp/err" ||
    { echo "FAIL $way: no mapped slot behind B"; cat "$tmp/err"; exit 1; }

  # The program's own counts against vaswap's.
  calls=$(sed -n 's/^calls //p' "$tmp/out")
  seen=$(sed -n 's/^seen //p' "$tmp/err")
  [[ "$seen" == "$calls slots=1" ]] ||
    { echo "FAIL $way: program made [$calls], vaswap counted [$seen]"; exit 1; }

  # The trace: one event per call, at the program's level, nothing counted twice.
  python3 - "$tmp/$way.jsonl" "$api" "$way" <<'PY'
import collections, json, sys
path, api, way = sys.argv[1:]
events = [json.loads(line) for line in open(path)]
hooked = [e for e in events if "api" in e]  # the hooks write call and api
levels = collections.Counter(e["api"] for e in hooked)
assert set(levels) == {api}, f"{way}: events at levels {dict(levels)}, expected only {api}"
count = collections.Counter(e["ev"] for e in hooked)
want = {"alloc": 3, "free": 3, "capture_begin": 1, "capture_end": 1, "graph_instantiate": 1,
        "graph_launch": 2}
for ev, n in want.items():
    assert count[ev] == n, f"{way}: {count[ev]} {ev} events, expected {n}: {dict(count)}"
allocs = [e for e in hooked if e["ev"] == "alloc"]
selected = [e for e in allocs if e["selected"]]
assert len(selected) == 1 and selected[0]["bytes"] == 8 << 20, f"{way}: selected {selected}"
assert "capture" in selected[0] and selected[0]["capture"] > 0, f"{way}: no capture id {selected[0]}"
begin = next(e for e in hooked if e["ev"] == "capture_begin")
assert selected[0]["capture"] == begin["capture"], f"{way}: the slot's capture is not the capture"
other = [e for e in allocs if not e["selected"]]
assert other[0]["bytes"] == 1 << 20 and "capture" not in other[0] and "stream" not in other[0], other
# The stream-ordered allocation: as large as B, never a slot, recorded with its stream.
pooled = other[1]
assert pooled["bytes"] == 8 << 20 and "stream" in pooled and "capture" not in pooled, pooled
pooled_free = [e for e in hooked if e["ev"] == "free" and e["va"] == pooled["va"]]
assert len(pooled_free) == 1 and pooled_free[0]["stream"] == pooled["stream"], pooled_free
end = next(e for e in hooked if e["ev"] == "capture_end")
assert end["slots"] == 1 and end["allocations"] == 1, f"{way}: capture_end {end}"
inst = next(e for e in hooked if e["ev"] == "graph_instantiate")
assert inst["capture"] == begin["capture"] and inst["graph"] == end["graph"], f"{way}: {inst}"
assert all(e["exec"] == inst["exec"] for e in hooked if e["ev"] == "graph_launch")
scans = [e for e in events if e["ev"] == "graph_scan"]
assert len(scans) == 1, f"{way}: {len(scans)} graph scans"
scan = scans[0]
# The graph: a memset of B and a copy from A into B. Both regions, B the slot.
assert (scan["graph"], scan["capture"]) == (end["graph"], begin["capture"]), f"{way}: {scan}"
assert (scan["nodes"], scan["memset_nodes"], scan["memcpy_nodes"], scan["kernel_nodes"]) == (2, 1, 1, 0), scan
assert (scan["regions"], scan["slot_regions"], scan["region_bytes"]) == (2, 1, 9 << 20), scan
slot_events = collections.Counter(e["ev"] for e in events if "api" not in e)
# One slot: made without pages, mapped once (the capture recorded a copy into it), never evicted
# (the budget had room), destroyed by the program's free.
for ev, n in (("slot_create", 1), ("remap", 1), ("release", 0), ("slot_destroy", 1), ("graph_scan", 1)):
    assert slot_events[ev] == n, f"{way}: {slot_events[ev]} {ev} events, expected {n}"
create = next(e for e in events if e["ev"] == "slot_create")
assert create["backed"] is False, create
fetch = next(e for e in events if e["ev"] == "fetch")
assert fetch["cause"] == "capture" and fetch["data"] is False, fetch
print(f"ok   {way}: {len(hooked)} hooked calls traced once each at the {api} level")
PY

  # A budget smaller than B: the copy the capture records into it is refused with out-of-memory
  # (2 in both APIs), with a message, and nothing is lost or left hanging.
  if VASWAP_CONF="selection.min_bytes=4MiB,residency.budget=4MiB" run -- "$probe" >"$tmp/out" 2>"$tmp/err"; then
    echo "FAIL $way: a copy into a slot over the budget was captured"; cat "$tmp/err"; exit 1
  fi
  grep -q "failed with 2" "$tmp/err" ||
    { echo "FAIL $way: the copy did not fail with out-of-memory"; cat "$tmp/err"; exit 1; }
  grep -q "needs 8 MiB of slots mapped, and the residency budget of 4 MiB (residency.budget) on device 0 has 4 MiB left.*raise residency.budget" "$tmp/err" ||
    { echo "FAIL $way: no message for the refused copy"; cat "$tmp/err"; exit 1; }
  echo "ok   $way: a capture's copy into a slot over the budget gets out-of-memory and a message"

  # Off: the same output, nothing selected, nothing counted.
  VASWAP_CONF="mode=off" run -- "$probe" >"$tmp/out" 2>"$tmp/err"
  [[ "$plain" == "$(cat "$tmp/out")" ]] || { echo "FAIL $way: output differs with mode=off"; exit 1; }
  grep -q "no slot behind B" "$tmp/err" || { echo "FAIL $way: a slot with mode=off"; exit 1; }
  grep -q "seen allocations=0 frees=0 captures=0 instantiations=0 launches=0 slots=0" "$tmp/err" ||
    { echo "FAIL $way: mode=off still counted calls"; cat "$tmp/err"; exit 1; }
  echo "ok   $way: identical with vaswap off, and nothing seen"
done

# An older driver answers an older ABI revision under a hooked name. On a simulator that says it is
# a CUDA 12.8 driver, cuGetProcAddress("cuMemcpyBatchAsync", 12080) is the 9-argument form (a
# failure index before the stream): vaswap must hand out the driver's function, not its wrapper
# of CUDA 13's 8-argument form (which would take the failure index for the stream).
VASWAP_SIM_DRIVER_VERSION=12080 run -- "$build/bin/batch_probe" >"$tmp/out" 2>"$tmp/err" ||
  { echo "FAIL batch_probe: CUDA 12.8's cuMemcpyBatchAsync failed under vaswap"; cat "$tmp/err"; exit 1; }
grep -q "batch v1: ok (driver 12080)" "$tmp/out" || { echo "FAIL batch_probe"; cat "$tmp/out"; exit 1; }
echo "ok   an older driver's revision of a hooked name passes through: $(cat "$tmp/out")"
