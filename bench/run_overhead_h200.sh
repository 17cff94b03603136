#!/usr/bin/env bash
# Issue 14's step overhead on the H200, under a residency budget that makes vaswap offload (the
# default budget acts only under memory pressure, so a job that fits would offload nothing):
#   torch_layers: examples/pytorch/graphed_layers.py, 8 layers, per-layer graphs with one shared
#                 pool, batch 8, seq 1024, d_model 2048, bf16, PyTorch's default attention;
#   demo:         the static-cudart demo (eager copies and kernels between its layer graphs),
#                 8 layers of 32 MiB buffers, every buffer a slot;
#   torch_compile, torch_compile_all: graphed_layers.py through torch.compile(mode=
#                 "reduce-overhead"), 8 layers, default sizes, no budget: what selecting costs
#                 where nothing can be offloaded (one graph per iteration), with the default
#                 selection (allocations made during a capture) and with every allocation above
#                 selection.min_bytes a slot (selection.captured_only=false), which is what CUDA
#                 graph trees' pools need, since they allocate while warming up;
#   torch_whole:  graphed_layers.py as torch_layers, but one whole-iteration torch.cuda.graph
#                 (forward, backward and optimizer step), under INSIDE_CONF (default
#                 inside.mode=on: every gap inside the graph offloaded);
#   demo_whole:   the static-cudart demo with --graph whole (one graph per step), under
#                 INSIDE_CONF too.
# Each program runs RUNS times without vaswap and RUNS times under it, alternating, on one machine.
# Per run: the median step after the first SKIP steps; the table gives the median over runs, each
# run's figure, whether the losses (checksum) equal the run without vaswap, and from each vaswap
# run's trace: host waits for restores after the plan came into force (restore_wait events with
# host_wait), evictions, evictions called off by a restore before the unmap (reclaims), and the
# device memory freed in steady state (the exit summary's peak without releases minus its peak),
# for rewritten graphs the share of the lent slots' bytes (the graph pool's) away from the
# device at their peak (1 - the executor's peak held / the bytes lent), and the first plan's
# windows and bytes moved each way with the remap figures it was chosen with (the copy test's,
# and the 90th percentiles of the run's own maps and unmaps).
# Usage: bash bench/run_overhead_h200.sh [torch_layers] [demo] [torch_compile] [torch_compile_all]
#   [torch_whole] [demo_whole]
#   (default: the first two)
# Environment: RUNS (3), STEPS (20), SKIP (5), TORCH_BUDGET (3GiB), DEMO_BUDGET (512MiB),
#   VASWAP_LIB (build/gpu/lib/libvaswap.so), DEMO (build/gpu/bin/train_layers_static_cuda),
#   WORK (0: the demos' --work, rounds of integer mixing per element in each layer kernel, so
#   that their layers compute for as long as a real model's do beside the copies),
#   INSIDE_CONF (inside.mode=on), RUN_TIMEOUT (300 s per run), EXTRA_CONF_B (a second arm under
#   vaswap: the program's policy with these keys instead of EXTRA_CONF's, run after the first in
#   each run on the same machine, and given a row of its own against the same runs without
#   vaswap: an A/B of two settings), VASWAP_LIB_B (the second arm's library, with EXTRA_CONF's
#   keys unless EXTRA_CONF_B is set: an A/B of two builds; rows then name each library),
#   EXTRA_CONF (policy keys added to
#   every program's, e.g. residency.handshake=device; with trace.launch_times=true each program's
#   table row is followed by the "Launch times" section of `vaswap report` for each vaswap run:
#   where a step's device time went. TORCH_BUDGET=auto (nothing moves) gives the same figures
#   for the graphs with nothing offloaded beside them).
# Writes $OUT (else bench/results)/overhead_h200.md (the table, with its command) and
# overhead_h200_runs.tar.gz (outputs, JSON and traces).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/commit.sh"
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-$root/bench/results}
mkdir -p "$out"
runs_dir=$(mktemp -d)
trap 'tar -C "$runs_dir" -czf "$out/overhead_h200_runs.tar.gz" . 2>/dev/null; rm -rf "$runs_dir"' EXIT
lib=${VASWAP_LIB:-build/gpu/lib/libvaswap.so}
demo_bin=${DEMO:-build/gpu/bin/train_layers_static_cuda}
runs=${RUNS:-3}
steps=${STEPS:-20}
skip=${SKIP:-5}
programs=("$@")
[[ ${#programs[@]} -gt 0 ]] || programs=(torch_layers demo)
md=$out/overhead_h200.md
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), commit $(bench_commit)"
  echo "# command: ${VASWAP_LIB:+VASWAP_LIB=$VASWAP_LIB }${VASWAP_LIB_B:+VASWAP_LIB_B=$VASWAP_LIB_B }RUNS=$runs STEPS=$steps SKIP=$skip${INSIDE_CONF:+ INSIDE_CONF=$INSIDE_CONF}${EXTRA_CONF:+ EXTRA_CONF=$EXTRA_CONF}${EXTRA_CONF_B:+ EXTRA_CONF_B=$EXTRA_CONF_B}${RUN_TIMEOUT:+ RUN_TIMEOUT=$RUN_TIMEOUT}${WORK:+ WORK=$WORK}${DEMO_BUDGET:+ DEMO_BUDGET=$DEMO_BUDGET}${TORCH_BUDGET:+ TORCH_BUDGET=$TORCH_BUDGET} bash bench/run_overhead_h200.sh ${programs[*]}"
  echo
  echo "| program | policy | without vaswap (ms/step) | under vaswap (ms/step) | overhead | results | slots selected | host waits: for restores after the plan, for the pages of copies and memsets in the whole run (per run) | evictions / reclaims (per run) | freed in steady state (MiB) | inside graphs: lent MiB, away at peak, on-demand, room waits (windows mapped beyond the reserve after 100 ms) (per run) | first plan: windows, MiB each way, remap us of the copy test / of the run's own maps (per run) |"
  echo "|---|---|---|---|---:|---|---|---|---|---|---|---|"
} >"$md"
status=0
for program in "${programs[@]}"; do
  case $program in
    torch_layers)
      cmd=(python3 examples/pytorch/graphed_layers.py --layers 8 --batch 8 --seq 1024 --d-model 2048
        --dtype bfloat16 --sdpa default --steps "$steps")
      conf="residency.budget=${TORCH_BUDGET:-3GiB}"
      ;;
    demo)
      cmd=("$demo_bin" --layers 8 --elems 8388608 --work "${WORK:-0}" --steps "$steps" --quiet)
      conf="selection.captured_only=false,residency.budget=${DEMO_BUDGET:-512MiB}"
      ;;
    torch_whole)
      cmd=(python3 examples/pytorch/graphed_layers.py --layers 8 --batch 8 --seq 1024 --d-model 2048
        --dtype bfloat16 --sdpa default --graph iteration --steps "$steps")
      conf="${INSIDE_CONF:-inside.mode=on}"
      ;;
    demo_whole)
      cmd=("$demo_bin" --layers 8 --elems 8388608 --work "${WORK:-0}" --graph whole --steps "$steps"
        --quiet)
      conf="${INSIDE_CONF:-inside.mode=on}"
      ;;
    torch_compile | torch_compile_all)
      cmd=(python3 examples/pytorch/graphed_layers.py --layers 8 --graph compile --steps "$steps")
      conf=""
      [[ $program == torch_compile_all ]] && conf="selection.captured_only=false"
      ;;
    *) echo "run_overhead_h200.sh: unknown program $program" >&2; exit 2 ;;
  esac
  base_conf=$conf
  conf="${base_conf}${EXTRA_CONF:+${base_conf:+,}$EXTRA_CONF}"
  # The arms under vaswap: "vaswap" (EXTRA_CONF), and "vaswapB" (EXTRA_CONF_B) where set.
  arms=(vaswap)
  declare -A arm_conf=([vaswap]=$conf)
  declare -A arm_lib=([vaswap]=$lib)
  if [[ -n ${EXTRA_CONF_B:-} || -n ${VASWAP_LIB_B:-} ]]; then
    arms+=(vaswapB)
    arm_conf[vaswapB]=$conf
    [[ -n ${EXTRA_CONF_B:-} ]] && arm_conf[vaswapB]="${base_conf}${base_conf:+,}$EXTRA_CONF_B"
    arm_lib[vaswapB]=${VASWAP_LIB_B:-$lib}
  fi
  for i in $(seq 1 "$runs"); do
    timeout "${RUN_TIMEOUT:-300}" "${cmd[@]}" --out "$runs_dir/${program}_plain_$i.json" >"$runs_dir/${program}_plain_$i.txt" 2>&1 ||
      { echo "$program plain run $i failed"; status=1; }
    for arm in "${arms[@]}"; do
      run_conf=${arm_conf[$arm]}
      VASWAP_CONF="${run_conf:+$run_conf,}log.level=info" timeout "${RUN_TIMEOUT:-300}" scripts/vaswap run --library "${arm_lib[$arm]}" \
        --trace "$runs_dir/${program}_${arm}_$i.jsonl" -- "${cmd[@]}" --out "$runs_dir/${program}_${arm}_$i.json" \
        >"$runs_dir/${program}_${arm}_$i.txt" 2>"$runs_dir/${program}_${arm}_$i.err" ||
        { echo "$program $arm run $i failed: $(grep -m2 error "$runs_dir/${program}_${arm}_$i.err")"; status=1; }
      grep -m1 "summary:" "$runs_dir/${program}_${arm}_$i.err" | cut -c1-600
    done
  done
  for arm in "${arms[@]}"; do
  python3 - "$runs_dir" "$program" "$runs" "$skip" "${arm_conf[$arm]}" "$arm" "${VASWAP_LIB_B:+${arm_lib[$arm]}}" >>"$md" <<'PY' || status=1
import glob, json, os, statistics, sys
d, program, runs, skip, policy, arm, library = sys.argv[1:]
runs, skip = int(runs), int(skip)
def load(name):
    return json.load(open(os.path.join(d, name + ".json")))
def med(name):
    return statistics.median(load(name)["step_ms"][skip:])
def events(name):
    path = glob.glob(os.path.join(d, name + ".jsonl")) + glob.glob(os.path.join(d, name + ".rank0.*jsonl"))
    path = path[0]
    return [json.loads(line) for line in open(path)]
plain = [med(f"{program}_plain_{i}") for i in range(1, runs + 1)]
under = [med(f"{program}_{arm}_{i}") for i in range(1, runs + 1)]
key = "losses" if "losses" in load(f"{program}_plain_1") else "checksum"
same = all(load(f"{program}_plain_{i}")[key] == load(f"{program}_{arm}_{i}")[key]
           for i in range(1, runs + 1))
waits, moved, freed, slots, inside, shape = [], [], [], [], [], []
for i in range(1, runs + 1):
    ev = events(f"{program}_{arm}_{i}")
    plans = [e["t_ns"] for e in ev if e["ev"] == "plan"]
    after = plans[0] if plans else float("inf")
    restores = sum(1 for e in ev if e["ev"] == "restore_wait" and e.get("host_wait")
                   and e["t_ns"] >= after)
    s = next(e for e in ev if e["ev"] == "summary")
    waits.append(f"{restores}, {s.get('map_waits', 0)}")
    s = next(e for e in ev if e["ev"] == "summary")
    moved.append(f"{s['evictions']} / {s.get('reclaims', 0)}")
    slots.append(s["slots"])
    freed.append((s["peak_without_releases"] - s["peak_used"]) >> 20)
    lent = s.get("inside_lent_bytes", 0)
    inside.append(f"{lent >> 20}, {100 * (1 - s['inside_peak_held'] / lent):.0f}%, "
                  f"{s['inside_on_demand']}, {s.get('inside_room_waits', 0)} "
                  f"({s.get('inside_room_overshoots', 0)})" if lent else "-")
    # The plan's shape and the remap figures it was chosen with: a copy test whose map met a D2H
    # once made plans of more windows than the budget needed (bench/results/remap_margin_session44.md).
    plan = next((e for e in ev if e["ev"] == "plan" and "windows" in e), None)
    model = next((e for e in ev if e["ev"] == "model"), None)
    shape.append("-" if plan is None else
                 f"{plan['windows']}, {plan.get('moved_bytes', 0) >> 20}, "
                 + (f"{model['remap_us']:.0f} / {model.get('remap_seen_us', 0):.0f}" if model else "-"))
p, u = statistics.median(plain), statistics.median(under)
print(f"| {program}{f' ({library})' if library else ''} | `{policy or 'the default policy'}` | "
      f"{p:.2f} ({', '.join(f'{x:.2f}' for x in plain)}) | "
      f"{u:.2f} ({', '.join(f'{x:.2f}' for x in under)}) | {100 * (u / p - 1):+.1f}% | "
      f"{'identical' if same else 'DIFFERENT'} | {', '.join(map(str, sorted(set(slots))))} | "
      f"{'; '.join(waits)} | "
      f"{', '.join(moved)} | {', '.join(map(str, freed))} | {'; '.join(inside)} | "
      f"{'; '.join(shape)} |")
sys.exit(0 if same else 1)
PY
  tail -1 "$md"
  done
  for arm in "${arms[@]}"; do
    [[ ${arm_conf[$arm]} == *trace.launch_times=true* ]] || continue
    for i in $(seq 1 "$runs"); do
      {
        echo
        echo "<!-- $program, $arm run $i: scripts/vaswap report on its trace -->"
        scripts/vaswap report --no-progress "$runs_dir/${program}_${arm}_$i.jsonl" 2>/dev/null |
          sed -n '/^## Launch times/,/^## /p' | sed '$ { /^## /d }' | sed "s/^## Launch times of .*/### $program, $arm run $i: launch times/"
      } >>"$md"
    done
  done
done
echo "status=$status"
exit $status
