#!/usr/bin/env bash
# Capacity (issue 13): the most layers that train in a fixed amount of device memory, without
# vaswap and under it, for the static-cudart demo and examples/pytorch/graphed_layers.py
# (per-layer graphs with one shared pool, and with a pool per layer), and on two GPUs
# (nvidia-h200-x2): the demo spread over both from one thread (demo2: --devices 2, LIMIT on each)
# and the shared-pool job as two data-parallel ranks (torch_ranks: torchrun, NCCL all-reduce, LIMIT
# on each rank's GPU, every rank's losses compared; `vaswap report` over both ranks' traces).
#
# How the memory is limited: each program first holds all but LIMIT of the device's free memory,
# before it builds anything (graphed_layers --limit-gib and train_layers --limit-mib: one
# cudaMallocAsync block, which vaswap never makes a slot whatever the policy, so EXTRA_CONF may set
# selection.captured_only=false). To the job and to vaswap's auto budget the GPU is LIMIT large.
# (The PyTorch runs in bench/results/capacity, run1 to run4, held torch.empty instead: a cudaMalloc
# outside any capture, which only the default selection leaves alone.)
#
# For each program:
#   1. L0, the most layers without vaswap: probes up from 1 (doubling, then halving the gap),
#      PROBE_STEPS steps each; L0 trains and L0+1 runs out of memory.
#   2. Under vaswap (`vaswap run`, default policy but for the demo's selection; nothing about
#      the budget set) at the same LIMIT: ceil(2.5 L0) layers, and once 4 L0; the losses (demo:
#      checksum) must equal those of a run of the same layers with no limit and no vaswap.
#   3. At L0, RUNS runs each without and with vaswap: the median of each run's median step time
#      (steps after the first SKIP), and the median over runs: vaswap's overhead where the job
#      fits.
# Usage: bash bench/run_capacity_h200.sh [demo] [torch_shared] [torch_own] [demo2] [torch_ranks]
#   (default: the first three, which need one GPU)
# Environment: TORCH_LIMIT_GIB (8), DEMO_LIMIT_MIB (2048), DEMO_ELEMS (8388608: 32 MiB buffers),
#   STEPS (12), PROBE_STEPS (STEPS: 3 steps of 15 layers trained where 12 ran out), SKIP (4), RUNS (3), FACTORS ("2.5 4": the sizes tried under
#   vaswap, times L0), KNOWN_L0 (start the search there, one layer at a time), VASWAP_LIB
#   (build/gpu/lib/libvaswap.so),
#   DEMO (build/gpu/bin/train_layers_static_cuda), EXTRA_CONF (more VASWAP_CONF for every run).
# Writes $OUT (else bench/results/capacity)/: capacity_h200.log, capacity_h200.md (the table), and
# capacity_h200_runs.tar.gz (every run's output, JSON and vaswap trace); for torch_ranks also
# capacity_two_ranks_report.txt (`vaswap report` over both ranks' traces of the largest run).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/commit.sh"
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-$root/bench/results/capacity}
mkdir -p "$out"
runs_dir=$(mktemp -d)
trap 'tar -C "$runs_dir" -czf "$out/capacity_h200_runs.tar.gz" . 2>/dev/null; rm -rf "$runs_dir"' EXIT
lib=${VASWAP_LIB:-build/gpu/lib/libvaswap.so}
demo_bin=${DEMO:-build/gpu/bin/train_layers_static_cuda}
torch_limit=${TORCH_LIMIT_GIB:-8}
demo_limit=${DEMO_LIMIT_MIB:-2048}
demo_elems=${DEMO_ELEMS:-8388608}
steps=${STEPS:-12}
probe_steps=${PROBE_STEPS:-$steps}  # a shorter probe can pass where the full run runs out
skip=${SKIP:-4}
repeats=${RUNS:-3}
programs=("$@")
[[ ${#programs[@]} -gt 0 ]] || programs=(demo torch_shared torch_own)
log=$out/capacity_h200.log
exec > >(tee -a "$log") 2>&1
echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,memory.total,driver_version \
  --format=csv,noheader 2>/dev/null | head -1), commit $(bench_commit)"
echo "# command: bash bench/run_capacity_h200.sh ${programs[*]}"
status=0
[[ -s $out/capacity_h200.md ]] || cat >"$out/capacity_h200.md" <<'MD'
| program | device memory | layers without vaswap (L0) | layers under vaswap | step time at L0: without / with vaswap (median of runs) | L0 losses | at the largest size under vaswap |
|---|---|---|---|---|---|---|
MD

# launch PROGRAM NAME LAYERS STEPS LIMIT(0: none) VASWAP(0|1): runs one job; its JSON at
# $runs_dir/NAME.json, output at NAME.txt, vaswap's log and trace at NAME.err / NAME.jsonl.
launch() {
  local program=$1 name=$2 layers=$3 n=$4 limit=$5 under=$6
  local cmd trace=$runs_dir/$name.jsonl
  case $program in
    demo | demo2)
      cmd=("$demo_bin" --layers "$layers" --elems "$demo_elems" --steps "$n" --quiet
        --out "$runs_dir/$name.json")
      [[ $program == demo2 ]] && cmd+=(--devices 2)
      [[ $limit != 0 ]] && cmd+=(--limit-mib "$limit")
      ;;
    torch_shared | torch_own | torch_ranks)
      cmd=(python3 examples/pytorch/graphed_layers.py --layers "$layers" --steps "$n"
        --pool "$([[ $program == torch_own ]] && echo own || echo shared)" --out "$runs_dir/$name.json")
      [[ $limit != 0 ]] && cmd+=(--limit-gib "$limit")
      if [[ $program == torch_ranks ]]; then
        cmd=(python3 -m torch.distributed.run --standalone --nproc-per-node 2 "${cmd[@]:1}")
        trace=$runs_dir/$name.rank%r.jsonl  # one per rank
      fi
      ;;
  esac
  if [[ $under == 1 ]]; then
    local conf="log.level=info${EXTRA_CONF:+,$EXTRA_CONF}"
    # The demo's static buffers (inputs, weights, gradients) are cudaMalloc'd outside any
    # capture: only with captured_only off can they be slots too.
    [[ $program == demo* ]] && conf="selection.captured_only=false,$conf"
    VASWAP_CONF="$conf" timeout 400 scripts/vaswap run --library "$lib" \
      --trace "$trace" -- "${cmd[@]}" >"$runs_dir/$name.txt" 2>"$runs_dir/$name.err"
  else
    timeout 400 "${cmd[@]}" >"$runs_dir/$name.txt" 2>"$runs_dir/$name.err"
  fi
}

limit_of() { [[ $1 == demo* ]] && echo "$demo_limit" || echo "$torch_limit"; }
unit_of() { [[ $1 == demo* ]] && echo MiB || echo GiB; }

# median_ms NAME: the median step time after the first $skip steps.
median_ms() {
  python3 - "$runs_dir/$1.json" "$skip" <<'PY'
import json, statistics, sys
d = json.load(open(sys.argv[1]))
print(f"{statistics.median(d['step_ms'][int(sys.argv[2]):]):.3f}")
PY
}

# same NAME_A NAME_B: identical losses (PyTorch) or checksum (demo).
same() {
  python3 - "$runs_dir/$1.json" "$runs_dir/$2.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
key = "losses" if "losses" in a else "checksum"
sys.exit(0 if a[key] == b[key] else 1)
PY
}

for program in "${programs[@]}"; do
  limit=$(limit_of "$program")
  unit=$(unit_of "$program")
  echo "== $program: ${limit} $unit of device memory"
  # 1. L0 without vaswap.
  # KNOWN_L0 starts the search there and steps by one layer (both neighbours are run: L0 must
  # train and L0+1 must not, each for the full STEPS).
  good=0 bad=0 layers=${KNOWN_L0:-1}
  while :; do
    if launch "$program" "${program}_plain_probe_$layers" "$layers" "$probe_steps" "$limit" 0; then
      good=$layers
      echo "   without vaswap, $layers layers: trains"
    else
      bad=$layers
      echo "   without vaswap, $layers layers: fails ($(grep -m1 -oiE 'out of memory|OutOfMemoryError|cudaErrorMemoryAllocation' \
        "$runs_dir/${program}_plain_probe_$layers.err" || echo "see ${program}_plain_probe_$layers.err"))"
    fi
    if [[ $good != 0 && $bad != 0 && $((bad - good)) -le 1 ]]; then
      break
    elif [[ $bad == 0 ]]; then
      if [[ -n ${KNOWN_L0:-} ]]; then layers=$((layers + 1)); else layers=$((layers * 2)); fi
      [[ $layers -le 512 ]] || break
    elif [[ $good == 0 ]]; then
      if [[ -n ${KNOWN_L0:-} ]]; then layers=$((layers - 1)); else layers=$((layers / 2)); fi
      [[ $layers -ge 1 ]] || break
    else
      layers=$(((good + bad) / 2))
    fi
  done
  if [[ $good == 0 || $bad == 0 ]]; then
    echo "   FAIL: no bracket for L0 (good $good, bad $bad)"
    status=1
    continue
  fi
  l0=$good
  echo "   L0 = $l0 layers without vaswap"

  # 2. Under vaswap at the same limit: 2.5 x L0, then 4 x L0.
  best=0
  for factor in ${FACTORS:-2.5 4}; do
    layers=$(python3 -c "import math; print(math.ceil($factor * $l0))")
    name=${program}_vaswap_$layers
    if ! launch "$program" "$name" "$layers" "$steps" "$limit" 1; then
      echo "   under vaswap, $layers layers: FAILS"
      grep -E "error|summary" "$runs_dir/$name.err" | head -5 | cut -c1-400
      [[ $best == 0 ]] && status=1
      break
    fi
    launch "$program" "${program}_free_$layers" "$layers" "$steps" 0 0 ||
      echo "   (the unconstrained run of $layers layers failed)"
    if same "${program}_free_$layers" "$name"; then
      best=$layers
      if [[ $program == torch_ranks ]]; then
        scripts/vaswap report --no-progress "$runs_dir/$name".rank*.jsonl \
          >"$out/capacity_two_ranks_report.txt" 2>&1 ||
          echo "   vaswap report over both ranks' traces failed (capacity_two_ranks_report.txt)"
      fi
      echo "   under vaswap, $layers layers: trains, losses identical to an unconstrained run;" \
        "$(median_ms "$name") ms/step (unconstrained $(median_ms "${program}_free_$layers"))"
      grep -m1 "summary:" "$runs_dir/$name.err" | cut -c1-700
    else
      echo "   under vaswap, $layers layers: trains, but the losses DIFFER from an unconstrained run"
      status=1
      break
    fi
  done

  # 3. Overhead at L0.
  failed=""
  for i in $(seq 1 "$repeats"); do
    launch "$program" "${program}_l0_plain_$i" "$l0" "$steps" "$limit" 0 || failed+=" ${program}_l0_plain_$i"
    launch "$program" "${program}_l0_vaswap_$i" "$l0" "$steps" "$limit" 1 || failed+=" ${program}_l0_vaswap_$i"
  done
  if [[ -n $failed ]]; then
    echo "   FAIL: at L0 = $l0 layers these runs failed (their .err in the runs archive):$failed"
    status=1
    continue
  fi
  python3 - "$runs_dir" "$program" "$l0" "$best" "$repeats" "$skip" "$limit $unit" \
    >>"$out/capacity_h200.md" <<'PY' || status=1
import glob, json, os, statistics, sys
d, program, l0, best, repeats, skip, limit = sys.argv[1:]
l0, best, repeats, skip = int(l0), int(best), int(repeats), int(skip)
def load(name):
    return json.load(open(os.path.join(d, name + ".json")))
def med(name):
    return statistics.median(load(name)["step_ms"][skip:])
def summary(name):  # rank 0's for two ranks (vaswap run names each rank's trace NAME.rank0.PID)
    path = os.path.join(d, name + ".jsonl")
    if not os.path.exists(path):
        path = glob.glob(os.path.join(d, name + ".rank0.*jsonl"))[0]
    for line in open(path):
        e = json.loads(line)
        if e.get("ev") == "summary":
            return e
    return {}
plain = [med(f"{program}_l0_plain_{i}") for i in range(1, repeats + 1)]
under = [med(f"{program}_l0_vaswap_{i}") for i in range(1, repeats + 1)]
same = all(load(f"{program}_l0_plain_{i}").get("losses", load(f"{program}_l0_plain_{i}").get("checksum"))
           == load(f"{program}_l0_vaswap_{i}").get("losses", load(f"{program}_l0_vaswap_{i}").get("checksum"))
           for i in range(1, repeats + 1))
p, u = statistics.median(plain), statistics.median(under)
row = (f"| {program} | {limit} | {l0} | {best} ({best / l0:.2f}x) | "
       f"{p:.2f} / {u:.2f} ms ({100 * (u / p - 1):+.1f}%; runs {', '.join(f'{x:.2f}' for x in plain)} / "
       f"{', '.join(f'{x:.2f}' for x in under)}) | {'identical' if same else 'DIFFERENT'} |")
if best:
    s = summary(f"{program}_vaswap_{best}")
    free = med(f"{program}_free_{best}")
    top = med(f"{program}_vaswap_{best}")
    held = load(f"{program}_vaswap_{best}").get("held_bytes", 0)
    row += f" {top:.2f} ms vs {free:.2f} ms unconstrained ({100 * (top / free - 1):+.0f}%); "
    if load(f"{program}_vaswap_{best}").get("devices", 1) == 1:  # the summary's peak: one device's
        row += (f"peak {(s.get('peak_used', 0) - held) / 2**20:.0f} MiB in use besides the hold, "
                f"{(s.get('peak_without_releases', 0) - held) / 2**20:.0f} MiB without vaswap's "
                f"releases; ")
    row += (f"{s.get('evictions', 0)} evictions, {s.get('bytes_offloaded', 0) / 2**30:.1f} GiB "
            f"offloaded{' (rank 0)' if program == 'torch_ranks' else ''} |")
else:
    row += " - |"
print(row)
sys.exit(0 if same else 1)
PY
  tail -1 "$out/capacity_h200.md"
done
echo "status=$status"
exit $status
