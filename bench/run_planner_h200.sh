#!/usr/bin/env bash
# The planner end to end on the H200 (issue 6): each program plain and under `vaswap run` with the
# default policy (mode auto, measured model, guard on) and cuMemGetInfo sampled every 200 us.
#   - examples/pytorch/graphed_layers.py, 8 layers, per-layer make_graphed_callables (30 steps)
#   - the same layers graphed together (--graph whole: one graph each way, one pool)
#   - train_layers built with static cudart (8 layers x 32 MiB buffers, 50 steps, an evaluation
#     pass every 10 steps)
# Prints one table (bench/planner_summary.py), writes it with the command to docs/BENCHMARKS.md
# (on the device machine: $OUT/BENCHMARKS.md, copied back into docs/), and keeps the programs'
# outputs and the traces in bench/results/planner_h200_runs.tar.gz. Expects build/gpu/{bin,lib}
# (cmake -DVASWAP_CUDA_EXAMPLES=ON; see bench/README.md).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/commit.sh"
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/bench/results}
mkdir -p "$out"
cd "$root"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
conf=${PLANNER_CONF:-trace.memory_interval=200us}
lib=build/gpu/lib/libvaswap.so
status=0

run_pair() {  # name, then the program
  local name=$1
  shift
  timeout 200 "$@" --out "$out/${name}_plain.json" >"$out/${name}_plain.txt" 2>&1 || status=1
  rm -f "$out/${name}_trace.jsonl"  # vaswap does not replace a trace file
  VASWAP_CONF=$conf timeout 200 scripts/vaswap run --library "$lib" --trace "$out/${name}_trace.jsonl" -- \
    "$@" --out "$out/${name}_vaswap.json" >"$out/${name}_vaswap.txt" 2>&1 || status=1
  tail -2 "$out/${name}_vaswap.txt"
}

# PLANNER_RUNS picks some of the runs (default: all three).
runs=${PLANNER_RUNS:-pytorch_per_layer pytorch_whole static_cudart}
for name in $runs; do
  case $name in
    pytorch_per_layer) run_pair $name python3 examples/pytorch/graphed_layers.py --layers 8 --steps 30 ;;
    pytorch_whole) run_pair $name python3 examples/pytorch/graphed_layers.py --layers 8 --steps 30 --graph whole ;;
    static_cudart) run_pair $name build/gpu/bin/train_layers_static_cuda --layers 8 --elems 8388608 --steps 50 --eval-every 10 ;;
    *) echo "run_planner_h200.sh: unknown run $name" >&2; exit 2 ;;
  esac
done
declare -A label=([pytorch_per_layer]="pytorch per-layer" [pytorch_whole]="pytorch whole" [static_cudart]="static cudart")
specs=()
for name in $runs; do
  specs+=("${label[$name]}:$out/${name}_plain.json:$out/${name}_vaswap.json:$out/${name}_trace.jsonl")
done

{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), commit $(bench_commit)"
  echo "# command: bash bench/run_planner_h200.sh   (VASWAP_CONF=$conf)"
  echo
  python3 bench/planner_summary.py "${specs[@]}" || status=1
} | tee "$out/planner_h200.md"
doc=$root/docs/BENCHMARKS.md
[[ -n "${OUT:-}" ]] && doc=$OUT/BENCHMARKS.md
{
  echo "# Benchmarks: the planner end to end"
  echo
  echo "Written by \`bash bench/run_planner_h200.sh\` (DESIGN.md section 8 has the targets; docs/PLANNER.md"
  echo "explains the columns' terms). Each program runs plain and under \`vaswap run\` with the default"
  echo "policy (mode auto, measured model, guard on) and \`trace.memory_interval=200us\`. *identical*:"
  echo "losses (PyTorch) or checksum (C++) bit for bit. *step ms*: median over the second half of the"
  echo "steps (the plan is in force by then). *freed*: the most free device memory \`cuMemGetInfo\` showed"
  echo "during the steps with the plan in force, less the free memory just before it. *link could move*:"
  echo "one period's device time at the slower copy direction's measured bandwidth."
  echo
  cat "$out/planner_h200.md"
} >"$doc"
# The programs' outputs and the traces, in one archive (bench/results/planner_h200_runs.tar.gz).
(cd "$out" && tar czf planner_h200_runs.tar.gz ./*_plain.* ./*_vaswap.* ./*_trace.jsonl &&
  rm -f ./*_plain.* ./*_vaswap.* ./*_trace.jsonl)
exit $status
