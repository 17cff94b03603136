#!/usr/bin/env bash
# Issue 15 on the H200: a device fault injected mid-step (an out-of-bounds kernel:
# train_layers --fault-step, which writes 1 TiB past an activation) must end the run with a
# clear error and a non-zero exit, never a hang, a crash without a message or exit status 0.
# The fault matrix (tests/integration/fault_matrix.py) asserts the same outcome on the simulator.
#
# Cases, each under `timeout 180` and each with vaswap offloading (residency.budget below what
# the slots need, so evictions and restores are in flight when the fault happens):
#   without vaswap; under vaswap with the host handshake; with the device handshake (a stream
#   parked on a restore's flag when the context dies); fault in the first step (before a plan
#   exists) and in a later one (under the plan). Where the machine has two GPUs
#   (nvidia-h200-x2), also the demo spread over both from one thread (--devices 2), with no fault
#   (checksum equal to a run without vaswap) and with a fault on the first GPU in step 4, and with
#   peer access enabled and kernels reading the other GPU's buffers (--peer-kernels).
# Expects build/gpu/bin/train_layers_static_cuda and build/gpu/lib (carried). Writes
# $OUT (else bench/results)/fault_h200.log and fault_h200.md.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/commit.sh"
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-$root/bench/results}
mkdir -p "$out"
lib=${VASWAP_LIB:-build/gpu/lib/libvaswap.so}
demo=${DEMO:-build/gpu/bin/train_layers_static_cuda}
log=$out/fault_h200.log
md=$out/fault_h200.md
work=$(mktemp -d)
args=(--layers 8 --elems 8388608 --steps 10)
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), commit $(bench_commit)"
  echo "# command: bash bench/run_fault_h200.sh"
} | tee "$log"
cat >"$md" <<'MD'
| case | exit status | seconds | outcome | first error line |
|---|---:|---:|---|---|
MD
status=0
# case NAME UNDER(0|1) FAULT_STEP EXTRA_CONF [DEMO ARGS...]
case_() {
  local name=$1 under=$2 step=$3 conf=$4
  shift 4
  local cmd=("$demo" "${args[@]}" --quiet "$@")
  [[ $step -ge 0 ]] && cmd+=(--fault-step "$step")
  local start end rc
  start=$(date +%s.%N)
  if [[ $under == 1 ]]; then
    VASWAP_CONF="selection.captured_only=false,residency.budget=512MiB,residency.wait_limit=20s${conf:+,$conf}" \
      timeout 180 scripts/vaswap run --library "$lib" -- "${cmd[@]}" >"$work/$name.out" 2>"$work/$name.err"
  else
    timeout 180 "${cmd[@]}" >"$work/$name.out" 2>"$work/$name.err"
  fi
  rc=$?
  end=$(date +%s.%N)
  local secs
  secs=$(python3 -c "print(f'{$end - $start:.1f}')")
  local first
  first=$(grep -m1 -iE 'error|fault|illegal' "$work/$name.err" | cut -c1-220 | tr '|' '/')
  local outcome
  if [[ $step -lt 0 ]]; then
    outcome=$([[ $rc == 0 ]] && echo "trains: $(cat "$work/$name.out")" || echo "FAILS without a fault")
    [[ $rc == 0 ]] || status=1
  elif [[ $rc == 124 || $rc == 137 ]]; then
    outcome="HANG (killed by timeout)"
    status=1
  elif [[ $rc == 0 ]]; then
    outcome="WRONG: exit 0 after a device fault"
    status=1
  elif [[ $rc -gt 128 ]]; then
    outcome="crash: signal $((rc - 128))$([[ -n $first ]] && echo ", with a message" || echo ", NO message")"
    [[ -n $first ]] || status=1
  elif [[ -n $first ]]; then
    outcome="clear error, non-zero exit"
  else
    outcome="non-zero exit, NO message"
    status=1
  fi
  echo "| $name | $rc | $secs | $outcome | \`$first\` |" | tee -a "$md"
  {
    echo "== $name (exit $rc, ${secs}s)"
    sed 's/^/   out: /' "$work/$name.out"
    tail -25 "$work/$name.err" | sed 's/^/   err: /'
  } >>"$log"
}
case_ no_fault_under_vaswap 1 -1 ""
case_ without_vaswap_fault_step4 0 4 ""
case_ host_handshake_fault_step0 1 0 "residency.handshake=host"
case_ host_handshake_fault_step4 1 4 "residency.handshake=host"
case_ device_handshake_fault_step0 1 0 "residency.handshake=device"
case_ device_handshake_fault_step4 1 4 "residency.handshake=device"
if [[ $(nvidia-smi -L | wc -l) -ge 2 ]]; then
  # Two GPUs from one thread (issue 15): 16 layers, 8 on each, peer copies between them, the
  # same 512 MiB budget on each; the fault on the first GPU.
  case_ two_devices_without_vaswap 0 -1 "" --layers 16 --devices 2
  case_ two_devices_no_fault 1 -1 "" --layers 16 --devices 2
  case_ two_devices_fault_step4 1 4 "residency.handshake=host" --layers 16 --devices 2
  # Peer access enabled, kernels on each GPU reading the other's buffers (not copies).
  case_ two_devices_peer_kernels_without_vaswap 0 -1 "" --layers 16 --devices 2 --peer-kernels
  case_ two_devices_peer_kernels 1 -1 "" --layers 16 --devices 2 --peer-kernels
fi
cat "$md" >>"$log"
rm -rf "$work"
echo "status=$status" | tee -a "$log"
exit $status
