#!/usr/bin/env bash
# The preload's guards, over the runtime probe (tests/integration/probe.cpp):
#   - an allocation made from libnccl is never a slot, even when it would be selected;
#   - PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is reported, in the log and the trace;
#   - a device reset frees the device's slots first;
#   - the engine's first look at a device failing (cuDeviceGet) gives it no slots for now;
#   - a host that can pin no memory for vaswap's handshake flags: the host handshake, and the
#     allocations passed through, each named; none for an eviction: the launch refused, named.
# (A malformed policy: tests/integration/policy_test.sh.)
# The program's output is the same as without vaswap in each case.
set -euo pipefail
build=$1
src=$2
source "$src/tests/integration/preload_common.sh"
probe=$build/bin/probe_runtime
plain=$("$probe")

# NCCL: the captured 8 MiB allocation comes from libnccl.so.
export PROBE_ALLOC_LIBRARY=$build/tests/fake/libnccl.so
[[ "$("$probe")" == "$plain" ]] || fail "nccl: the probe's output changed with the stand-in"
VASWAP_CONF="selection.min_bytes=4MiB" run --trace "$tmp/nccl.jsonl" -- "$probe" >"$tmp/out" 2>"$tmp/err"
[[ "$(cat "$tmp/out")" == "$plain" ]] || fail "nccl: output differs under vaswap"
grep -q "no slot behind B" "$tmp/err" || fail "nccl: NCCL's allocation became a slot"
[[ $(grep -c '"ev":"alloc"' "$tmp/nccl.jsonl") == 3 ]] || fail "nccl: not one alloc event per allocation"
grep -q '"ev":"alloc".*"bytes":8388608,.*"selected":false,"skipped":"nccl"' "$tmp/nccl.jsonl" ||
  fail "nccl: the trace does not say the allocation was skipped for NCCL"
echo "ok   an allocation from libnccl is passed through, and the trace says why"
unset PROBE_ALLOC_LIBRARY

# A device reset frees the device's slots first (the reset destroys the context that owns them).
VASWAP_CONF="selection.min_bytes=4MiB" PROBE_RESET=1 run --trace "$tmp/reset.jsonl" -- "$probe" \
  >"$tmp/out" 2>"$tmp/err" || fail "reset: the probe failed"
[[ "$(cat "$tmp/out")" == "$(PROBE_RESET=1 "$probe")" ]] || fail "reset: output differs"
grep -q "after reset: slot_find NOT_FOUND, slots_live=0" "$tmp/err" || fail "reset: the slot survived"
grep -q '"ev":"device_reset","tid":[0-9]*,"call":"cudaDeviceReset","api":"runtime","device":0,"regions":1,"slots":1' \
  "$tmp/reset.jsonl" || fail "reset: no device_reset event with the slot"
echo "ok   a device reset frees the device's slots first"

# expandable_segments: said once, on stderr and in the trace.
PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:64,expandable_segments:True" \
  run --trace "$tmp/exp.jsonl" -- "$probe" >"$tmp/out" 2>"$tmp/err"
[[ "$(cat "$tmp/out")" == "$plain" ]] || fail "expandable: output differs"
[[ $(grep -c "expandable_segments:True: PyTorch then maps its own memory" "$tmp/err") == 1 ]] ||
  fail "expandable: not reported exactly once on stderr"
grep -q '"ev":"notice".*expandable_segments:True' "$tmp/exp.jsonl" || fail "expandable: no notice in the trace"
echo "ok   expandable_segments:True is reported once, in the log and the trace"

# A host that can pin no more memory (VASWAP_SIM_PINNED_LIMIT=0; the program's own pinned buffers
# can fill a host): the device takes the host handshake, saying why once, and each allocation
# whose slot needs a handshake flag is passed through, the failure named and the trace saying why.
# Before, the process was ended from the program's cudaMalloc (exit 70).
VASWAP_CONF="selection.min_bytes=4MiB" VASWAP_SIM_PINNED_LIMIT=0 run --trace "$tmp/pinned.jsonl" \
  -- "$probe" >"$tmp/out" 2>"$tmp/err" || fail "pinned: the probe failed under vaswap"
[[ "$(cat "$tmp/out")" == "$plain" ]] || fail "pinned: output differs under vaswap"
grep -q "no slot behind B" "$tmp/err" || fail "pinned: B became a slot with no flag"
[[ $(grep -c "the host handshake, because its flags could not be pinned (cuMemHostAlloc failed with CUDA_ERROR_OUT_OF_MEMORY" "$tmp/err") == 1 ]] ||
  fail "pinned: the fallback is not said once"
grep -q "could not back an allocation with a slot .*cuMemHostAlloc failed with CUDA_ERROR_OUT_OF_MEMORY for vaswap's handshake flags on device 0" \
  "$tmp/err" || fail "pinned: the passed-through allocation's failure is not named"
grep -q '"ev":"alloc".*"bytes":8388608,.*"selected":false,"skipped":"flags"' "$tmp/pinned.jsonl" ||
  fail "pinned: the trace does not say the allocation was passed through for its flag"
echo "ok   a host that can pin nothing: the host handshake, allocations passed through, each named"
# Pinned memory for the flags, not for evictions (8 MiB: the demo's own 2 MiB, a few slots' copies)
# on a device too small for the demo: the launch whose eviction finds no pinned memory is refused
# out of memory, the call named with the fix, and the program ends by its own error check (1).
demo=$build/bin/train_layers
status=0
VASWAP_SIM_PINNED_LIMIT=8MiB VASWAP_SIM_DEVICE_MEMORY=100MiB \
  VASWAP_CONF="selection.min_bytes=1MiB,residency.wait_limit=5s" \
  run -- "$demo" --quiet --steps 4 >"$tmp/out" 2>"$tmp/err" || status=$?
[[ $status == 1 ]] || fail "pinned_evict: exit $status, not the demo's own error exit 1"
grep -q "cannot evict to make room: cuMemHostAlloc failed with CUDA_ERROR_OUT_OF_MEMORY for a pinned host buffer of 2 MiB; free host memory or lower the offloaded bytes" \
  "$tmp/err" || fail "pinned_evict: the refusal does not name the call and the fix"
grep -q "failed at .*cudaErrorMemoryAllocation" "$tmp/err" || fail "pinned_evict: not out of memory"
echo "ok   no pinned memory for an eviction: the launch refused out of memory, named"

# The engine's first look at the device fails (cuDeviceGet, as after a sticky device fault): the
# device gets no slots for now, each allocation is passed through with the failure named, and the
# demo gives its checksum. Before, the error was thrown out of the program's cudaMalloc and the
# process ended (SIGABRT; the fault matrix's device fault before the first slot, under ASan).
want=$("$demo" --quiet --steps 4)
got=$(VASWAP_CONF="selection.min_bytes=1MiB" VASWAP_SIM_FAULTS="cuDeviceGet:1:999" \
  run -- "$demo" --quiet --steps 4 2>"$tmp/err") || fail "device_get: the demo failed: $(cat "$tmp/err")"
[[ "$got" == "$want" ]] || fail "device_get: checksum '$got', without vaswap '$want'"
grep -q "injected fault: cuDeviceGet" "$tmp/err" || fail "device_get: the fault did not fire"
grep -q "could not back an allocation with a slot .*cuDeviceGet failed with CUDA_ERROR_UNKNOWN for device 0: device 0 gets no slots" \
  "$tmp/err" || fail "device_get: the failure is not named: $(cat "$tmp/err")"
echo "ok   the engine's first look at the device failing: no slots for now, named, $got"

