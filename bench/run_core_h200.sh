#!/usr/bin/env bash
# The slot core on a real GPU: the slot suite (tests/core/slot_test.cu built with nvcc) twice in a
# row, the Python binding's tests with torch, the VMM interference probe, and the slot benchmark
# RUNS times (default 3) as separate processes, summarized as the median and range across runs
# (bench/slot_bench_summary.py; issue 17: run on a freshly started machine). Expects the nvcc
# builds in build/gpu:
#   cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=Release -DVASWAP_CUDA_EXAMPLES=ON
#   cmake --build build/gpu --target vaswap core_tests_cuda slot_bench_cuda vmm_interference_cuda
# Writes logs to $OUT (or bench/results/) and prints the benchmark table last.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/commit.sh"
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/bench/results}
mkdir -p "$out"
cd "$root"
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
  echo "# command: bash bench/run_core_h200.sh"
} | tee "$out/core_h200.log"

core=0
for pass in 1 2; do
  echo "== core suite (bin/core_tests_cuda), pass $pass of 2" | tee -a "$out/core_h200.log"
  build/gpu/bin/core_tests_cuda 2>&1 | tee -a "$out/core_h200.log" | grep -E '^\[  (PASSED|FAILED|SKIPPED) |tests ran'
  [[ ${PIPESTATUS[0]} -eq 0 ]] || core=1
done

echo "== python binding (pytest, torch $(python3 -c 'import torch; print(torch.__version__)'))" | tee -a "$out/core_h200.log"
VASWAP_LIBRARY=$root/build/gpu/lib/libvaswap.so PYTHONUNBUFFERED=1 \
  python3 -m pytest -v -p no:cacheprovider tests/python 2>&1 | tee -a "$out/core_h200.log" | tail -12
py=${PIPESTATUS[0]}

echo "== VMM calls beside a running copy (bin/vmm_interference_cuda)" | tee -a "$out/core_h200.log"
build/gpu/bin/vmm_interference_cuda 2>&1 | tee "$out/vmm_interference_h200.md" >>"$out/core_h200.log"
probe=${PIPESTATUS[0]}

bench=0
runs=${RUNS:-3}
tables=()
for run in $(seq 1 "$runs"); do
  echo "== slot bench, run $run of $runs (SLOT_BENCH_DIAG=1 adds the restore-submission variants)" | tee -a "$out/core_h200.log"
  trace=$out/slot_bench_trace.jsonl
  rm -f "$trace"  # vaswap does not replace a trace file; the last run's is kept
  SLOT_BENCH_DIAG=1 VASWAP_TRACE=$trace build/gpu/bin/slot_bench_cuda \
    --out "$out/slot_bench_h200_run$run.md" 2>&1 | tee -a "$out/core_h200.log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || bench=1
  tables+=("$out/slot_bench_h200_run$run.md")
done
note="command: bash bench/run_core_h200.sh; $(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), commit $(bench_commit)"
python3 bench/slot_bench_summary.py "${tables[@]}" --note "$note" --out "$out/slot_bench_h200.md" | tee -a "$out/core_h200.log"
echo "core=$core python=$py probe=$probe bench=$bench" | tee -a "$out/core_h200.log"
[[ $core -eq 0 && $py -eq 0 && $probe -eq 0 && $bench -eq 0 ]]
