#!/usr/bin/env bash
# Eager copies that name slots, on the H200: the stress probe (tests/integration/stress_probe.cu,
# four threads, three 1 MiB buffers each, eight rounds) built with nvcc, its cudart linked
# statically (stress_probe_cuda: the copies reach vaswap's driver hooks) and dynamically
# (stress_probe_shared_cuda: its runtime hooks), reading each round's result back through
# cudaMemcpy2DAsync (--copy2d) or through cudaMemcpy3DPeerAsync into another buffer
# (--copy3dpeer), or through a graph built node by node with the runtime's calls (--nodes; their
# hooks give the slots named pages for each call). Under vaswap every buffer is a slot and the budget holds fewer than the four
# threads use, so slots are away when the copies name them. Each probe and mode runs once without
# vaswap (the checksum to match), then under each library given, RUNS times. MODES="--jit" with
# EXTRA_CONF=residency.handshake=device runs the probe loading a module through the driver each
# round while streams are parked (as Triton does) instead.
# Usage: bash bench/run_copy_h200.sh [LIBRARY...]   (default build/gpu/lib/libvaswap.so)
# Environment: BUDGET (12MiB), WAIT_LIMIT (30s), EXTRA_CONF (none), PROBES (stress_probe_cuda
#   stress_probe_shared_cuda), MODES (--copy2d --copy3dpeer), ROUNDS (8), RUNS (1),
#   NAME (copy_h200).
# Writes $OUT (else bench/results)/$NAME.md: per run, the exit status, whether the checksum
# matches, the copies that waited for their slots (restore_wait events), the first-time work that
# waited for parked streams (the summary's settle_waits) and the first error line; and
# $NAME_failed.tar.gz: the trace and stderr of each run that did not exit 0.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-$root/bench/results}
mkdir -p "$out"
libs=("$@")
[[ ${#libs[@]} -gt 0 ]] || libs=(build/gpu/lib/libvaswap.so)
read -r -a probes <<<"${PROBES:-stress_probe_cuda stress_probe_shared_cuda}"
read -r -a modes <<<"${MODES:---copy2d --copy3dpeer}"
rounds=${ROUNDS:-8}
runs=${RUNS:-1}
name=${NAME:-copy_h200}
conf="selection.captured_only=false,selection.min_bytes=1MiB,residency.budget=${BUDGET:-12MiB},residency.wait_limit=${WAIT_LIMIT:-30s}${EXTRA_CONF:+,$EXTRA_CONF}"
tmp=$(mktemp -d)
mkdir -p "$tmp/failed"
trap 'if [[ -n "$(ls -A "$tmp/failed")" ]]; then tar -C "$tmp/failed" -czf "$out/${name}_failed.tar.gz" .; fi; rm -rf "$tmp"' EXIT
run=0
md=$out/$name.md
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  echo "# command: PROBES=\"${probes[*]}\" MODES=\"${modes[*]}\" ROUNDS=$rounds RUNS=$runs NAME=$name bash bench/run_copy_h200.sh ${libs[*]}   (VASWAP_CONF=$conf)"
  echo
  echo "| probe | mode | library | exit | checksum | copies that waited for their slots | settles that waited | first error |"
  echo "|---|---|---|---:|---|---:|---:|---|"
} >"$md"
for probe in "${probes[@]}"; do
  for mode in "${modes[@]}"; do
    want=$(timeout 120 "build/gpu/bin/$probe" --threads 4 --rounds "$rounds" "$mode" 2>"$tmp/err")
    for lib in "${libs[@]}"; do
      for _ in $(seq "$runs"); do
        run=$((run + 1))
        rm -f "$tmp/t.jsonl"
        got=$(VASWAP_CONF=$conf timeout 300 scripts/vaswap run --library "$lib" --trace "$tmp/t.jsonl" -- \
          "build/gpu/bin/$probe" --threads 4 --rounds "$rounds" "$mode" 2>"$tmp/err")
        rc=$?
        if [[ $rc -ne 0 ]]; then
          cp "$tmp/t.jsonl" "$tmp/failed/run$run.jsonl" 2>/dev/null
          cp "$tmp/err" "$tmp/failed/run$run.err"
        fi
        same=differs
        [[ -n "$want" && "$got" == "$want" ]] && same=matches
        key=Memcpy2D  # the runtime's call or the driver's, by its name
        [[ $mode == --copy3dpeer ]] && key=Memcpy3DPeer
        [[ $mode == --jit ]] && key=cuLaunchKernel
        read -r waited settles < <(python3 -c 'import json,sys
ev=[json.loads(line) for line in open(sys.argv[1])]
s=[e for e in ev if e["ev"]=="summary"]
print(sum(1 for e in ev if e["ev"]=="restore_wait" and sys.argv[2] in e["call"]),
      s[0].get("settle_waits", "-") if s else "-")' "$tmp/t.jsonl" "$key" 2>/dev/null || echo "- -")
        error=$(grep -m1 -iE "failed|error" "$tmp/err" | cut -c1-160 | tr '|' '/')
        echo "| $probe | $mode | $lib (run $run) | $rc | $same | ${waited:--} | ${settles:--} | ${error:--} |" >>"$md"
      done
    done
  done
done
cat "$md"
