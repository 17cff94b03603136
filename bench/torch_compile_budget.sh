#!/usr/bin/env bash
# torch.compile(mode="reduce-overhead") under residency budgets, on the GPU: one run of
# examples/pytorch/graphed_layers.py --graph compile (8 layers, default sizes) without vaswap, then
# one under vaswap per budget and handshake, every allocation above selection.min_bytes a slot
# (CUDA graph trees allocate their pools while warming up, outside any capture).
# Per run: exit status, ms/step, whether the losses equal the run without vaswap, from the trace's
# exit summary the launches refused for want of memory, restores mapped beyond the budget and the
# inside graphs' figures, and from the log what the rewrites said (the budget a rewritten graph
# needs to leave the rest of the program room) and the first error.
# Usage: BUDGETS="1GiB 2GiB 4GiB" HANDSHAKES="device host" STEPS=16 bash bench/torch_compile_budget.sh
# Environment: BUDGETS (2GiB 3GiB 4GiB), HANDSHAKES (device), STEPS (16), RUN_TIMEOUT (240 s),
#   LOG_LEVEL (info), VASWAP_LIB (build/gpu/lib/libvaswap.so), OUT (bench/results).
# Writes $OUT/torch_compile_budget.md and torch_compile_budget_runs.tar.gz (outputs, logs, traces).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/commit.sh"
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-$root/bench/results}
mkdir -p "$out"
runs_dir=$(mktemp -d)
trap 'tar -C "$runs_dir" -czf "$out/torch_compile_budget_runs.tar.gz" . 2>/dev/null; rm -rf "$runs_dir"' EXIT
lib=${VASWAP_LIB:-build/gpu/lib/libvaswap.so}
steps=${STEPS:-16}
limit=${RUN_TIMEOUT:-240}
read -r -a budgets <<<"${BUDGETS:-2GiB 3GiB 4GiB}"
read -r -a handshakes <<<"${HANDSHAKES:-device}"
cmd=(python3 examples/pytorch/graphed_layers.py --layers 8 --graph compile --steps "$steps")
md=$out/torch_compile_budget.md
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), commit $(bench_commit)"
  echo "# command: BUDGETS=\"${budgets[*]}\" HANDSHAKES=\"${handshakes[*]}\" STEPS=$steps bash bench/torch_compile_budget.sh"
  echo
} >"$md"
timeout "$limit" "${cmd[@]}" --out "$runs_dir/without.json" >"$runs_dir/without.out" 2>&1
echo "without vaswap: exit $?, $(tail -1 "$runs_dir/without.out")" >>"$md"
echo >>"$md"
echo "| budget | handshake | exit | ms/step | losses | refused launches | mapped beyond the budget | inside graphs: rewritten, windows, lent MiB, held at most MiB | what the log said |" >>"$md"
echo "|---|---|---:|---:|---|---:|---:|---|---|" >>"$md"
for budget in "${budgets[@]}"; do
  for handshake in "${handshakes[@]}"; do
    name="$budget-$handshake"
    conf="selection.captured_only=false,residency.budget=$budget,residency.handshake=$handshake"
    conf+=",residency.wait_limit=10s,log.level=${LOG_LEVEL:-info}"
    VASWAP_CONF=$conf timeout "$limit" scripts/vaswap run --library "$lib" \
      --trace "$runs_dir/$name.jsonl" -- "${cmd[@]}" --out "$runs_dir/$name.json" \
      >"$runs_dir/$name.out" 2>&1
    rc=$?
    python3 - "$runs_dir" "$name" "$budget" "$handshake" "$rc" >>"$md" <<'PY'
import json, os, re, sys
d, name, budget, handshake, rc = sys.argv[1:]
def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None
without, run = load(f"{d}/without.json"), load(f"{d}/{name}.json")
ms = f"{run['ms_per_step']:.1f}" if run else "-"
same = "-" if not (run and without) else ("equal" if run["losses"] == without["losses"] else "**differ**")
s = {}
try:
    for line in open(f"{d}/{name}.jsonl"):
        e = json.loads(line)
        if e.get("ev") == "summary":
            s = e
except OSError:
    pass
log = open(f"{d}/{name}.out", errors="replace").read().splitlines()
said = [l for l in log if "leaves the rest of the program" in l]
said += [l for l in log if re.search(r"\] (error|critical)", l)][:1]
def cut(l):
    l = re.sub(r"^\[vaswap\] ", "", l)
    return (l[:400] + " ...") if len(l) > 400 else l
inside = "-"
if s.get("inside_graphs"):
    inside = (f"{s['inside_graphs']}, {s.get('inside_windows', '-')}, "
              f"{s.get('inside_lent_bytes', 0) >> 20}, {s.get('inside_peak_held', 0) >> 20}")
text = "<br>".join(cut(l).replace("|", "\\|") for l in said) or "-"
print(f"| {budget} | {handshake} | {rc} | {ms} | {same} | {s.get('oom_launches', '-')} | "
      f"{s.get('budget_overshoots', '-')} | {inside} | {text} |")
PY
  done
done
cat "$md"
