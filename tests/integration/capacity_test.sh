#!/usr/bin/env bash
# Capacity (issue 13) over the simulator: the layered demo (examples/train_layers, 8 layers, 32
# captured 1 MiB buffers of one 2 MiB page each: 64 MiB of slots, and 66 MiB of the program's own
# memory) on a simulated device too small for it.
#   1. 100 MiB: without vaswap it runs out of memory; under vaswap, with the default (auto)
#      budget and nothing else set, it runs to the checksum of an unconstrained run, and the
#      device never held more than it has.
#   2. 80 MiB: the slots held at once stay under half of all slot bytes; same checksum.
#   3. The program's own allocation (20 MiB more after step 5) fails for want of memory: slots
#      give pages back and the allocation succeeds; same checksum. Copies in batches
#      (cudaMemcpyBatchAsync) bring their evicted slots back too. Likewise a kernel launch that
#      the driver refuses for want of memory (it grows a kernel's local memory at launch): the
#      simulator refuses the 150th cuLaunchKernel with CUDA_ERROR_OUT_OF_MEMORY. Copies through a
#      CUDA array and batches of 3D copies (copy_forms_probe.cpp) bring theirs back as well, through
#      the calls' per-thread-default-stream twins too (the probe built so).
#   4. The handshakes: the host one where asked (residency.handshake=host), the same checksum;
#      with CUDA_DEVICE_MAX_CONNECTIONS=1 the default falls back to it, says so once, and gives the
#      same checksum; the device one asked for with one hardware queue is a named error. With
#      residency.d2h_gate, evictions' D2Hs wait on the device while a restore maps into room a
#      running D2H frees: the same checksum, no gate past its limit.
#   5. Two devices driven from one thread (--devices 2: 16 layers, 8 on each 100 MiB device, peer
#      copies between them, every buffer a slot): without vaswap out of memory; under vaswap each
#      device's slots are evicted and restored on that device, and a copy on one device's stream
#      into or out of the other's slot finds access (a GPU refuses it otherwise), to the checksum
#      of one unconstrained device; the same with peer access enabled and kernels that read the
#      other device's buffers (--peer-kernels). And where each device's slots fit its own budget (though not
#      all of them one device's), one plan per device offloads nothing, and no copy test runs.
#   6. One graph per step on a device too small for it, the default budget: rewritten at its
#      instantiation, the checksum unchanged; one its windows cannot fit: refused by name. The
#      program's allocations after the rewrite: granted beside the graph's reserve, or refused
#      by name (out of memory) where they would take pages its restores need.
#   7. A size budget beyond what the program left the device (residency.budget=64MiB, where the
#      device has 32 MiB or less for slots): the device's room bounds it, so slots are evicted
#      to it and the demo runs to the checksum under either handshake; where even one launch's
#      slots exceed the room (70 MiB), the launch is refused at once, by name. Before, restores
#      were decided into pages the device would not give and the process was ended after
#      residency.wait_limit (exit 70). One graph per step with every buffer a slot under a
#      256 MiB budget on a 100 MiB device: rewritten for the device's room, as under the auto
#      budget, to the checksum; before, its windows aimed at the budget, it was instantiated as
#      captured, and its launch refused. A refusal's fix fits the selection: more slots where
#      only captured buffers are, smaller ones or a smaller launch where every buffer is a slot.
#   8. A device that keeps back more of its free memory than vaswap leaves out (8 MiB held back,
#      VASWAP_SIM_HOLDBACK, where vaswap leaves out 2 MiB), 24 MiB left, every buffer a slot: a
#      restore's map fails with room reported; vaswap learns the amount (said once) and leaves it
#      out from then on, and the demo runs to the checksum under the device handshake. Before,
#      the restore stream waited on the device for pages no eviction was decided to free, and the
#      process was ended after residency.wait_limit (exit 70). On a device that keeps nothing
#      back, 30 to 40 MiB left, nothing is learned (a release ending between a failed map and
#      the reading of free memory made it "learn" 4 MiB at 40 MiB).
# Usage: capacity_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
source "$src/tests/integration/preload_common.sh"
demo=$build/bin/train_layers
base="selection.min_bytes=1MiB,residency.wait_limit=20s"

want=$("$demo" --quiet --steps 20)
want_extra=$("$demo" --quiet --steps 20 --extra-mib 20)
[[ "$want" == checksum* && "$want_extra" == checksum* ]] || fail "the unconstrained runs failed"

# under MEMORY NAME CONF DEMO-ARGS...: vaswap's checksum must be `want` (or `want_extra`).
under() {
  local memory=$1 name=$2 conf=$3
  shift 3
  local got expect=$want
  [[ " $* " == *" --extra-mib "* ]] && expect=$want_extra
  got=$(VASWAP_SIM_DEVICE_MEMORY=$memory VASWAP_CONF="$conf,log.level=info" \
    run --trace "$tmp/$name.jsonl" -- "$demo" --quiet --steps 20 "$@" 2>"$tmp/err") ||
    fail "$name: the demo failed under vaswap on a $memory device"
  [[ "$got" == "$expect" ]] || fail "$name: checksum '$got', unconstrained '$expect'"
  echo "ok   $name ($memory): $got"
}

# summary NAME PYTHON: assertions on the exit summary `s` and the events `ev`.
summary() {
  python3 - "$tmp/$1.jsonl" <<PY || fail "$1"
import json, sys
ev = sorted((json.loads(line) for line in open(sys.argv[1])), key=lambda e: e["t_ns"])
s = next(e for e in ev if e["ev"] == "summary")
MiB = 1 << 20
$2
PY
}

# 1. Does not fit; runs under vaswap.
if VASWAP_SIM_DEVICE_MEMORY=100MiB "$demo" --quiet --steps 20 >/dev/null 2>"$tmp/err"; then
  fail "the demo fits a 100 MiB device without vaswap: the test proves nothing"
fi
grep -q "cudaErrorMemoryAllocation" "$tmp/err" || fail "without vaswap: not an out-of-memory"
echo "ok   without vaswap the demo runs out of memory on a 100 MiB device"
under 100MiB fits_100 "$base"
summary fits_100 '
assert s["peak_used"] <= 100 * MiB, s
assert s["peak_without_releases"] > 100 * MiB, s  # what it needed without vaswap
assert s["evictions"] > 0 and s["oom_launches"] == 0 and s["errors"] == 0, s
# The default where stream memory operations work (docs/PLANNER.md, "Handshakes"): the
# thread of the application never waited for a restore once the plan was in force. Before it,
# while the demo captures, a restore decided while an eviction with data could not go ahead
# (its last uses on the capturing stream) takes the host path, and its thread may wait for it.
assert s["handshake"] == "device", s
plan = next(e for e in ev if e["ev"] == "plan")
waited = [e for e in ev if e["ev"] == "restore_wait" and e["host_wait"]]
assert all(e["t_ns"] < plan["t_ns"] for e in waited), waited
assert not waited or s["host_path_restores"] > 0, (len(waited), s)
first = next(e for e in ev if e["ev"] == "slot_create")
assert first["backed"] is False, "a slot made during a capture got pages at once"
used, needed, n = s["peak_used"] / MiB, s["peak_without_releases"] / MiB, s["evictions"]
print(f"     peak {used:.0f} MiB in use, {needed:.0f} MiB needed without vaswap; {n} evictions")
'

# 2. Tighter: under half of the slot bytes resident at once.
under 80MiB tight_80 "$base"
summary tight_80 '
assert s["peak_resident"] < 32 * MiB, s  # 64 MiB of slots
assert s["peak_used"] <= 80 * MiB and s["errors"] == 0, s
held = s["peak_resident"] / MiB
print(f"     slots held at most {held:.0f} MiB of their 64")
'

# 3. The program's own allocation.
under 100MiB program_oom "$base" --extra-mib 20
summary program_oom '
assert s["evictions_program"] > 0, s
notes = [e for e in ev if e["ev"] == "notice" and "failed for want of memory" in e["message"]]
assert notes, "no notice for the retried allocation"
n, message = s["evictions_program"], notes[0]["message"]
print(f"     {n} slots evicted for the program: {message}")
'

# 3a. Copies in batches (cudaMemcpyBatchAsync, one copy a batch between layers and two at each
#     step's end): their slots come back as a single copy's do; without the hook the batch is
#     refused on an evicted slot.
under 100MiB batch_copies "$base" --batch-copies
summary batch_copies '
assert s["evictions"] > 0 and s["errors"] == 0, s
calls = {e.get("call") for e in ev if e["ev"] == "restore_wait"}
assert any("MemcpyBatchAsync" in (c or "") for c in calls), calls
print("     batch copies waited for restores: " + ", ".join(sorted(c for c in calls if c and "Batch" in c)))
'

# 3c. Copies through a CUDA array (cuMemcpyDtoA, cuMemcpyAtoD) and batches of 3D copies
#     (cuMemcpy3DBatchAsync, pointer and array operands), each naming a buffer that a budget of one
#     buffer has evicted: brought back first (the driver refuses them on unmapped pages), the
#     probe's checksum that of a run without vaswap. One batch's source is read during the call (not
#     in stream order); its slots are brought back on the host before it (the simulator reads
#     every batch in stream order, so only the data is checked here).
# The same probe built with per-thread default streams reaches the calls' _ptds/_ptsz twins.
for probe in copy_forms_probe copy_forms_probe_ptds; do
  suffix=""
  [[ $probe == *_ptds ]] && suffix=_ptds
  forms_want=$("$build/bin/$probe") || fail "$probe failed without vaswap"
  forms_got=$(VASWAP_CONF="selection.captured_only=false,selection.min_bytes=1MiB,residency.budget=4MiB,log.level=info" \
    run --trace "$tmp/$probe.jsonl" -- "$build/bin/$probe" 2>"$tmp/err") ||
    { cat "$tmp/err"; fail "$probe: the probe failed under vaswap"; }
  [[ "$forms_got" == "$forms_want" ]] || fail "$probe: '$forms_got', without vaswap '$forms_want'"
  summary "$probe" "
assert s['errors'] == 0, s
ptds = '$suffix' != ''
waits = [e for e in ev if e['ev'] == 'restore_wait']
calls = {e.get('call') for e in waits}
batch = 'cuMemcpy3DBatchAsync_v2' + ('_ptsz' if ptds else '')
for name in ('cuMemcpyDtoA_v2$suffix', 'cuMemcpyAtoD_v2$suffix', batch):
    assert name in calls, (name, calls)
assert sum(e.get('call') == batch for e in waits) >= 3, waits
print('     ' + ', '.join(sorted(c for c in calls if c and ('toA' in c or 'AtoD' in c or '3DBatch' in c))) + ' waited for their evicted buffers')
"
  echo "ok   $probe: $forms_got"
done

# 3b. A launch out of memory: retried at the driver after slots gave pages back, so the runtime
#     above never records the error (the demo checks every launch's result).
VASWAP_SIM_FAULTS=cuLaunchKernel:150:2 under 100MiB launch_oom "$base"
summary launch_oom '
assert s["evictions_program"] > 0, s
notes = [e for e in ev if e["ev"] == "notice" and "launch failed for want of memory" in e["message"]]
assert len(notes) == 1, notes
print("     " + notes[0]["message"])
'
if VASWAP_SIM_FAULTS=cuLaunchKernel:150:2 VASWAP_SIM_DEVICE_MEMORY=100MiB "$demo" --quiet \
  --steps 20 >/dev/null 2>"$tmp/err"; then
  fail "launch_oom: the injected launch failure did not reach the demo without vaswap"
fi
echo "ok   without vaswap the same injected launch failure ends the demo"

# 4. The handshakes: the host one where asked (the application's thread waits until a restore is
#    submitted), the same checksum; with one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1) the
#    default falls back to it and says so once; the device one asked for there is a named error and
#    a non-zero exit, never a hang.
under 80MiB host_handshake "$base,residency.handshake=host"
summary host_handshake '
assert s["handshake"] == "host" and s["settle_waits"] == 0, s
print("     the application thread waited for restores %d times" % s["waits"])
'
got=$(CUDA_DEVICE_MAX_CONNECTIONS=1 VASWAP_SIM_DEVICE_MEMORY=80MiB VASWAP_CONF="$base" \
  run --trace "$tmp/one_queue.jsonl" -- "$demo" --quiet --steps 20 2>"$tmp/err") ||
  fail "one_queue: the demo failed under vaswap with one hardware queue"
[[ "$got" == "$want" ]] || fail "one_queue: checksum '$got', unconstrained '$want'"
[[ $(grep -c "the host handshake, because CUDA_DEVICE_MAX_CONNECTIONS=1" "$tmp/err") == 1 ]] ||
  fail "one_queue: the fallback was not said once: $(cat "$tmp/err")"
summary one_queue 'assert s["handshake"] == "host", s'
if CUDA_DEVICE_MAX_CONNECTIONS=1 VASWAP_SIM_DEVICE_MEMORY=80MiB \
  VASWAP_CONF="$base,residency.handshake=device" run -- "$demo" --quiet --steps 2 \
  >/dev/null 2>"$tmp/err"; then
  fail "one_queue: the device handshake ran with one hardware queue"
fi
grep -q "residency.handshake is device, but CUDA_DEVICE_MAX_CONNECTIONS=1" "$tmp/err" ||
  fail "one_queue: no named error"
echo "ok   the host handshake where asked, and by default with one hardware queue (said once):"
echo "     same checksum; the device one asked for with one hardware queue: a named error"
# The D2H gate (residency.d2h_gate): evictions' copies wait on the device while a restore maps
# into room a running copy frees. The same checksum; restores held copies back, most gates came
# down at their map rather than at the limit, and nothing mapped beyond the budget. Off by default:
# the residency event says which.
under 80MiB d2h_gate "$base,residency.handshake=device,residency.d2h_gate=true"
summary d2h_gate '
r = next(e for e in ev if e["ev"] == "residency")
assert r["handshake"] == "device" and r["d2h_gate"] is True, r
assert s["errors"] == 0 and s["budget_overshoots"] == 0, s
assert s["d2h_gate_raises"] > 0, s
# Most gates come down at the map; one may reach its 4 ms limit on a slow build (ASan: 1 of 10).
assert s["d2h_gate_timeouts"] < s["d2h_gate_raises"], s
assert s["d2h_gate_us"] > 0, s
print("     %d restores held D2Hs back, %.1f ms in all, %d at the limit"
      % (s["d2h_gate_raises"], s["d2h_gate_us"] / 1e3, s["d2h_gate_timeouts"]))
'
summary fits_100 '
r = next(e for e in ev if e["ev"] == "residency")
assert r["d2h_gate"] is False and s["d2h_gate_raises"] == 0, (r, s)
'

# 5. Two devices from one thread.
want16=$("$demo" --quiet --steps 12 --layers 16)
if VASWAP_SIM_DEVICES=2 VASWAP_SIM_DEVICE_MEMORY=100MiB,100MiB "$demo" --quiet --steps 12 \
  --layers 16 --devices 2 >/dev/null 2>"$tmp/err"; then
  fail "two_devices: 8 layers on each 100 MiB device fit without vaswap: the test proves nothing"
fi
grep -q "cudaErrorMemoryAllocation" "$tmp/err" || fail "two_devices: without vaswap not an out-of-memory"
# Every buffer a slot (captured_only off): the peer copies write and read other devices' slots.
got=$(VASWAP_SIM_DEVICES=2 VASWAP_SIM_DEVICE_MEMORY=100MiB,100MiB \
  VASWAP_CONF="$base,selection.captured_only=false,log.level=info" \
  run --trace "$tmp/two_devices.jsonl" -- "$demo" --quiet --steps 12 --layers 16 --devices 2 \
  2>"$tmp/err") || fail "two_devices: the demo failed under vaswap: $(grep -m3 -i error "$tmp/err")"
[[ "$got" == "$want16" ]] || fail "two_devices: checksum '$got', one unconstrained device '$want16'"
summary two_devices '
assert s["errors"] == 0 and s["oom_launches"] == 0, s
for kind in ("slot_create", "release", "remap"):
    devices = {e["device"] for e in ev if e["ev"] == kind}
    assert devices == {0, 1}, (kind, devices)
slot_device = {e["slot"]: e["device"] for e in ev if e["ev"] == "slot_create"}
for e in ev:  # every eviction and restore on its slot`s own device
    if e["ev"] in ("release", "remap", "d2h", "h2d"):
        assert e["device"] == slot_device[e["slot"]], e
n = {d: sum(1 for e in ev if e["ev"] == "release" and e["device"] == d) for d in (0, 1)}
print(f"     releases on device 0: {n[0]}, on device 1: {n[1]}; checksum of one device")
'
echo "ok   two devices from one thread: out of memory without vaswap; under it, the checksum of one device"
# The same with peer access enabled and a kernel on the receiving device reading the other's
# buffer (--peer-kernels): vaswap sees the enabling call and maps every slot for the peer too.
got=$(VASWAP_SIM_DEVICES=2 VASWAP_SIM_DEVICE_MEMORY=100MiB,100MiB \
  VASWAP_CONF="$base,selection.captured_only=false,log.level=info" \
  run --trace "$tmp/peer_kernels.jsonl" -- "$demo" --quiet --steps 12 --layers 16 --devices 2 \
  --peer-kernels 2>"$tmp/err") || fail "peer_kernels: the demo failed under vaswap: $(grep -m3 -i error "$tmp/err")"
[[ "$got" == "$want16" ]] || fail "peer_kernels: checksum '$got', one unconstrained device '$want16'"
summary peer_kernels '
notes = [e["message"] for e in ev if e["ev"] == "notice" and e["message"].startswith("peer access")]
assert sorted(notes) == ["peer access: device 0 may reach device 1\x27s slots",
                         "peer access: device 1 may reach device 0\x27s slots"], notes
assert s["evictions"] > 0 and s["errors"] == 0, s
print("     " + "; ".join(sorted(notes)))
'
echo "ok   peer access enabled, kernels reading the other device: the checksum of one device"

# 5b. Each device's slots against its own budget: 8 layers, 4 on each 80 MiB device. Each device's
#     32 MiB of slot pages fit its budget; all 64 MiB would not fit one device's. Nothing is offloaded.
want8=$("$demo" --quiet --steps 20)
got=$(VASWAP_SIM_DEVICES=2 VASWAP_SIM_DEVICE_MEMORY=80MiB,80MiB VASWAP_CONF="$base,log.level=info" \
  run --trace "$tmp/two_devices_fit.jsonl" -- "$demo" --quiet --steps 20 --layers 8 --devices 2 \
  2>"$tmp/err") || fail "two_devices_fit: the demo failed under vaswap"
[[ "$got" == "$want8" ]] || fail "two_devices_fit: checksum '$got', one unconstrained device '$want8'"
summary two_devices_fit '
plans = [e for e in ev if e["ev"] == "plan"]
assert sorted(e["device"] for e in plans) == [0, 1], plans
for p in plans:
    assert p["total_pages"] <= p["budget"] and p["windows"] == 0, p
assert sum(p["total_pages"] for p in plans) > max(p["budget"] for p in plans), plans
assert s["evictions"] == 0 and s["bytes_offloaded"] == 0, s
assert not [e for e in ev if e["ev"] == "model"], "a copy test ran though each device\x27s slots fit"
print("     per device: %s MiB of slot pages, budgets %s MiB; nothing offloaded" % (
    [p["total_pages"] >> 20 for p in plans], [p["budget"] >> 20 for p in plans]))
'
echo "ok   two devices whose slots each fit their own budget: a plan per device, nothing offloaded"
# 6. One graph per step (--graph whole: every layer's forward and backward in one launch) on a
#    device too small for it, with the default (auto) budget and nothing else set: without vaswap
#    out of memory; under vaswap the graph is rewritten when it is instantiated (its slots leave
#    it between their uses within each launch, docs/PLANNER.md "Inside one graph"), the device
#    never holds more than it has, and the checksum is the unconstrained one. Before, the launch
#    was refused: a rewrite needed a residency.budget size.
wantw=$("$demo" --quiet --steps 18 --layers 4 --graph whole)
if VASWAP_SIM_DEVICE_MEMORY=56MiB "$demo" --quiet --steps 18 --layers 4 --graph whole >/dev/null 2>&1; then
  fail "the whole-step demo fits a 56 MiB device without vaswap: the test proves nothing"
fi
got=$(VASWAP_SIM_DEVICE_MEMORY=56MiB VASWAP_CONF="$base,log.level=info" \
  run --trace "$tmp/whole_auto.jsonl" -- "$demo" --quiet --steps 18 --layers 4 --graph whole \
  2>"$tmp/err") || fail "whole_auto: the demo failed under vaswap"
[[ "$got" == "$wantw" ]] || fail "whole_auto: checksum '$got', unconstrained '$wantw'"
summary whole_auto '
rewrites = [e for e in ev if e["ev"] == "graph_rewrite"]
assert len(rewrites) == 1 and rewrites[0]["held_peak"] < rewrites[0]["held_without"], rewrites
assert s["inside_graphs"] == 1 and s["inside_releases"] > 0 and s["inside_failures"] == 0, s
assert s["peak_used"] <= 56 * MiB < s["peak_without_releases"], s
assert s["oom_launches"] == 0 and s["errors"] == 0, s
r = rewrites[0]
print("     rewritten: %d windows; its slots hold %d of %d MiB at once; device peak %d MiB" % (
    r["windows"], r["held_peak"] >> 20, r["held_without"] >> 20, s["peak_used"] >> 20))
'
echo "ok   one graph per step on a device too small for it, auto budget: rewritten, the checksum of an unconstrained run"
# The same with one of vaswap's unmaps held 150 ms (a slow driver call, a loaded machine): the
# graph runs ahead meanwhile and writes the triggers of several restores before the executor
# takes any. It maps them in the order of their uses, as the schedule counted the room; taken
# in slot order, a later restore took the room of an earlier one, which then never got pages
# on this device, and the process was ended (3 of 4 runs before the fix; 2 of 8 under load).
got=$(VASWAP_SIM_FAULTS=cuMemUnmap:100:-150 VASWAP_SIM_DEVICE_MEMORY=56MiB VASWAP_CONF="$base" \
  run -- "$demo" --quiet --steps 18 --layers 4 --graph whole 2>"$tmp/err") ||
  fail "whole_auto_held: the demo failed under vaswap with an unmap held"
[[ "$got" == "$wantw" ]] || fail "whole_auto_held: checksum '$got', unconstrained '$wantw'"
grep -q "injected fault: cuMemUnmap" "$tmp/err" || fail "whole_auto_held: the unmap was not held"
echo "ok   the same with an unmap held 150 ms: restores mapped in the order of their uses, the same checksum"
# With every allocation a slot (selection.captured_only=false: the program's own buffers, which
# its eager work uses between launches, too) on a 91 MiB device: at the rewrite the device has
# no room even to map a slot while its copy nodes are added, so residency makes room first; and
# the lent slots that eager work uses between launches are brought back for it each time, not
# kept on the device where the schedule has them away (no pages exist beyond the reserve).
# Before: the rewrite failed and the launch was refused (4 of 6 runs), or a restore found no
# pages and the process was ended (2 of 6).
want9=$("$demo" --quiet --steps 24 --layers 9 --elems 257144 --seed 3 --graph whole)
got=$(VASWAP_SIM_DEVICE_MEMORY=91MiB VASWAP_CONF="selection.min_bytes=512KiB,residency.wait_limit=20s,selection.captured_only=false,log.level=info" \
  run --trace "$tmp/whole_all.jsonl" -- "$demo" --quiet --steps 24 --layers 9 --elems 257144 --seed 3 \
  --graph whole 2>"$tmp/err") || fail "whole_all: the demo failed under vaswap"
[[ "$got" == "$want9" ]] || fail "whole_all: checksum '$got', unconstrained '$want9'"
if grep -q "it stays on the device then" "$tmp/err"; then
  fail "whole_all: a lent slot was kept on the device beyond the reserve"
fi
grep -q "rewritten with" "$tmp/err" || fail "whole_all: no graph was rewritten"
summary whole_all '
assert s["inside_graphs"] >= 1 and s["inside_failures"] == 0 and s["errors"] == 0, s
assert s["peak_used"] <= 91 * MiB < s["peak_without_releases"], s
print("     %d graphs rewritten, %d slots lent; device peak %d MiB, %d MiB without releases" % (
    s["inside_graphs"], s["inside_lent_slots"], s["peak_used"] >> 20, s["peak_without_releases"] >> 20))
'
echo "ok   every allocation a slot, one graph per step, auto budget: room made for the rewrite, slots used between launches not kept"
# Where its windows bring the graph within the device only with part of residency.reserve
# (4 MiB buffers, 124 MiB: 40 MiB at once, 1.9 MiB of them from the 3.9 MiB reserve; 2 MiB of
# cuMemGetInfo's free memory is not counted, as no allocation gets it on an H100), the graph
# takes that part and runs to the checksum; before, it was instantiated as captured and its launch
# refused. Where even the reserve is not enough (120 MiB), it is instantiated as captured and its
# launch refused with a named error: a rewrite would leave its launch waiting for pages that
# never come, and the process would be ended.
want5=$("$demo" --quiet --steps 11 --layers 5 --elems 1048576 --graph whole)
got=$(VASWAP_SIM_DEVICE_MEMORY=124MiB VASWAP_CONF="$base,log.level=info" run -- "$demo" --quiet \
  --steps 11 --layers 5 --elems 1048576 --graph whole 2>"$tmp/err") ||
  fail "whole_reserve: the demo failed on a 124 MiB device: $(cat "$tmp/err")"
[[ "$got" == "$want5" ]] || fail "whole_reserve: checksum '$got', unconstrained '$want5'"
grep -q "windows hold 40 MiB at once, 1.9 MiB of it from residency.reserve" "$tmp/err" ||
  fail "whole_reserve: the reserve's share not said: $(cat "$tmp/err")"
echo "ok   one graph per step whose windows fit with part of the reserve: rewritten, $got"
if VASWAP_SIM_DEVICE_MEMORY=120MiB VASWAP_CONF="$base" run -- "$demo" --quiet --steps 11 --layers 5 \
  --elems 1048576 --graph whole >/dev/null 2>"$tmp/err"; then
  fail "whole_short: the demo ran on a 120 MiB device"
fi
grep -q "is instantiated as captured: with its windows its slots still hold 40 MiB at once" "$tmp/err" ||
  fail "whole_short: no word of why the graph was not rewritten"
grep -q "needs 80 MiB of slots on device 0 at once" "$tmp/err" || fail "whole_short: not the named refusal"
echo "ok   one graph per step that its windows cannot fit: instantiated as captured, its launch refused by name"
# The program allocates after the rewrite (--extra-mib 4 after step 5, as an optimizer's state
# grows). Under the auto budget no pages exist beyond the rewritten graph's reserve: with the
# headroom residency.reserve leaves (6 MiB) the allocation fits beside it, and the run gives the
# checksum; with 4 MiB it would take pages the graph's restores map during a launch, and it is
# refused for want of memory, by name, the program seeing its own out-of-memory error. Before,
# it was granted, and a restore the graph waited for on the device found no pages: the process
# was ended (exit 70) mid-launch, for every size of the allocation tried (1 to 8 MiB).
wantx=$("$demo" --quiet --steps 18 --layers 4 --graph whole --extra-mib 4)
got=$(VASWAP_SIM_DEVICE_MEMORY=60MiB VASWAP_CONF="$base,residency.reserve=6MiB,log.level=info" \
  run -- "$demo" --quiet --steps 18 --layers 4 --graph whole --extra-mib 4 2>"$tmp/err") ||
  fail "whole_grows: the demo failed under vaswap with room beside the graph"
[[ "$got" == "$wantx" ]] || fail "whole_grows: checksum '$got', unconstrained '$wantx'"
grep -q "rewritten with" "$tmp/err" || fail "whole_grows: no graph was rewritten"
set +e
VASWAP_SIM_DEVICE_MEMORY=60MiB VASWAP_CONF="$base,residency.reserve=4MiB" \
  run -- "$demo" --quiet --steps 18 --layers 4 --graph whole --extra-mib 4 >/dev/null 2>"$tmp/err"
rc=$?
set -e
[[ $rc != 0 && $rc != 70 ]] || fail "whole_grows: exit status $rc, not the program's own failure"
grep -q "cudaMalloc of 4 MiB on device 0 is refused for want of memory.*graphs rewritten under the auto budget" "$tmp/err" ||
  fail "whole_grows: the refusal is not named"
grep -q "train_layers.cu:[0-9]*: cudaErrorMemoryAllocation" "$tmp/err" ||
  fail "whole_grows: the program did not see its allocation fail"
echo "ok   the program allocating after the rewrite: beside the graph's reserve where it fits; refused by name where it would take it, not ended"
for handshake in device host; do
  start=$SECONDS
  under 100MiB "size_beyond_$handshake" "$base,residency.budget=64MiB,residency.handshake=$handshake"
  ((SECONDS - start < 10)) || fail "size_beyond_$handshake: took $((SECONDS - start)) s"
  summary "size_beyond_$handshake" '
assert s["evictions"] > 0 and s["errors"] == 0, s
assert s["peak_used"] <= 100 * MiB, s
print("     %d evictions, device peak %d MiB" % (s["evictions"], s["peak_used"] >> 20))
'
done
under 100MiB size_beyond_whole "$base,selection.captured_only=false,residency.budget=256MiB" \
  --graph whole
grep -q "rewritten with" "$tmp/err" || fail "size_beyond_whole: no graph was rewritten"
start=$SECONDS
set +e
VASWAP_SIM_DEVICE_MEMORY=70MiB VASWAP_CONF="$base,residency.budget=64MiB" \
  run -- "$demo" --quiet --steps 20 >/dev/null 2>"$tmp/err"
rc=$?
set -e
[[ $rc != 0 && $rc != 70 ]] || fail "size_beyond_short: exit status $rc, not the program's own failure"
grep -q "needs [0-9]* MiB of slots on device 0 at once, more than what the device can give slots, [0-9]* MiB (its free memory less what no allocation gets, what slots hold and kept handles; residency.budget allows 64 MiB)" \
  "$tmp/err" || fail "size_beyond_short: the refusal is not named: $(cat "$tmp/err")"
((SECONDS - start < 10)) || fail "size_beyond_short: refused only after $((SECONDS - start)) s"
grep -q "To fix: free device memory, or let more of the program's buffers be slots (selection.captured_only: false)" \
  "$tmp/err" || fail "size_beyond_short: the fix does not suggest more slots: $(cat "$tmp/err")"
# With every buffer of 1 MiB or more a slot already (selection.captured_only=false), a launch
# that needs more than the whole device at once: the fix names what is left (smaller buffers, or
# a launch that needs less), not the setting that is already so.
set +e
VASWAP_SIM_DEVICE_MEMORY=16MiB VASWAP_CONF="$base,selection.captured_only=false" \
  run -- "$demo" --quiet --steps 4 --elems 1048576 >/dev/null 2>"$tmp/err"
rc=$?
set -e
[[ $rc != 0 && $rc != 70 ]] || fail "all_slots_short: exit status $rc, not the program's own failure"
grep -q "needs 16 MiB of slots on device 0 at once, more than the residency budget of [0-9]* MiB (what the device has free with every slot evicted).*To fix: free device memory, or lower selection.min_bytes (now 1 MiB) so that smaller buffers can be slots and be evicted; with every buffer the selection takes a slot, the launch itself must need less at once (selection.captured_only is false already)" \
  "$tmp/err" || fail "all_slots_short: the refusal or its fix is not as expected: $(cat "$tmp/err")"
echo "ok   a size budget beyond the device: bounded by its room (the checksum, both handshakes, one graph per step rewritten); refused at once, by name, where a launch cannot fit, with a fix that fits the selection"
start=$SECONDS
got=$(VASWAP_SIM_HOLDBACK=8MiB VASWAP_CONF="$base,selection.captured_only=false,residency.wait_limit=10s" \
  run -- "$demo" --quiet --steps 20 --limit-mib 24 2>"$tmp/err") ||
  fail "held_back: the demo failed: $(cat "$tmp/err")"
[[ "$got" == "$want" ]] || fail "held_back: checksum '$got', unconstrained '$want'"
[[ $(grep -c "vaswap leaves .* of its free memory out of the device's room from now on" "$tmp/err") == 1 ]] ||
  fail "held_back: the learned amount is not said once: $(cat "$tmp/err")"
((SECONDS - start < 10)) || fail "held_back: took $((SECONDS - start)) s"
for limit in 30 36 40; do
  got=$(VASWAP_SIM_DEVICE_MEMORY=${limit}MiB VASWAP_CONF="$base,selection.captured_only=false" \
    run -- "$demo" --quiet --steps 20 2>"$tmp/err") || fail "nothing_held_$limit: the demo failed: $(cat "$tmp/err")"
  [[ "$got" == "$want" ]] || fail "nothing_held_$limit: checksum '$got', unconstrained '$want'"
  ! grep -q "of its free memory out of the device's room" "$tmp/err" ||
    fail "nothing_held_$limit: learned memory held back where the device keeps none: $(cat "$tmp/err")"
done
echo "ok   a device that keeps back more than vaswap leaves out: learned at the first failed map, said once, $got; nothing learned where it keeps none"
echo "capacity: all checks passed"
