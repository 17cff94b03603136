#!/usr/bin/env bash
# Issue 3 on a real GPU: the slot suite (tests/core/slot_test.cu built with nvcc), the Python
# binding's tests with torch, and the slot benchmark. Expects the nvcc builds in build/gpu:
#   cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=Release -DVASWAP_CUDA_EXAMPLES=ON
#   cmake --build build/gpu --target vaswap core_tests_cuda slot_bench_cuda vmm_interference_cuda
# Writes logs to $OUT (or bench/results/) and prints the benchmark table last.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/bench/results}
mkdir -p "$out"
cd "$root"
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
  echo "# command: bash bench/run_core_h200.sh"
} | tee "$out/core_h200.log"

echo "== core suite (bin/core_tests_cuda)" | tee -a "$out/core_h200.log"
build/gpu/bin/core_tests_cuda 2>&1 | tee -a "$out/core_h200.log" | grep -E '^\[  (PASSED|FAILED|SKIPPED) |tests ran'
core=${PIPESTATUS[0]}

echo "== python binding (pytest, torch $(python3 -c 'import torch; print(torch.__version__)'))" | tee -a "$out/core_h200.log"
VASWAP_LIBRARY=$root/build/gpu/lib/libvaswap.so PYTHONUNBUFFERED=1 \
  python3 -m pytest -v -p no:cacheprovider tests/python 2>&1 | tee -a "$out/core_h200.log" | tail -12
py=${PIPESTATUS[0]}

echo "== VMM calls beside a running copy (bin/vmm_interference_cuda)" | tee -a "$out/core_h200.log"
build/gpu/bin/vmm_interference_cuda 2>&1 | tee "$out/vmm_interference_h200.md" >>"$out/core_h200.log"
probe=${PIPESTATUS[0]}

echo "== slot bench (SLOT_BENCH_DIAG=1 adds the restore-submission variants)" | tee -a "$out/core_h200.log"
rm -f "$out/slot_bench_trace.jsonl"  # vaswap does not replace a trace file
SLOT_BENCH_DIAG=1 VASWAP_TRACE=$out/slot_bench_trace.jsonl build/gpu/bin/slot_bench_cuda \
  --out "$out/slot_bench_h200.md" 2>&1 | tee -a "$out/core_h200.log"
bench=${PIPESTATUS[0]}
echo "core=$core python=$py probe=$probe bench=$bench" | tee -a "$out/core_h200.log"
[[ $core -eq 0 && $py -eq 0 && $probe -eq 0 && $bench -eq 0 ]]
