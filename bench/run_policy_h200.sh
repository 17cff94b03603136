#!/usr/bin/env bash
# Issue 5 on the H200: the policy under a real PyTorch job (examples/pytorch/graphed_layers.py).
# Expects build/gpu/lib (libvaswap.so and its helpers), built elsewhere and carried. Writes
# $OUT/policy_h200.log (or bench/results/).
#   - graphed_training.yaml through `vaswap run --policy`: losses bit-identical to the plain run,
#     and its trace.path (vaswap_%h_%r.jsonl) written;
#   - call-site selection: include libc10_cuda.so (PyTorch's caching allocator) selects the same
#     segments; exclude it selects none;
#   - a malformed policy stops the job before any CUDA work (on_error: abort).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/bench/results}
mkdir -p "$out"
cd "$root"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
lib=$root/build/gpu/lib/libvaswap.so
example=$root/examples/pytorch/graphed_layers.py
args="--layers 8 --steps 10"
log=$out/policy_h200.log
status=0
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  echo "# command: bash bench/run_policy_h200.sh"
} | tee "$log"
selected() { python3 -c "import json,sys; e=[json.loads(l) for l in open(sys.argv[1])]; a=[x for x in e if x['ev']=='alloc' and x.get('selected')]; print(len(a), 'slots,', sum(x['bytes'] for x in a)>>20, 'MiB;', 'callsite_us median', sorted(x.get('callsite_us',0) for x in a)[len(a)//2] if a else '-')" "$1"; }
same() { python3 -c "import json,sys; a,b=(json.load(open(p))['losses'] for p in sys.argv[1:]); print('losses bit-identical:', a==b); sys.exit(a!=b)" "$1" "$2"; }

python3 "$example" $args --out "$out/policy_plain.json" >/dev/null 2>&1 || status=1
echo "== graphed_training.yaml" | tee -a "$log"
scripts/vaswap check-policy --library "$lib" examples/policies/graphed_training.yaml | head -4 | tee -a "$log"
work=$(mktemp -d)
(cd "$work" && "$root/scripts/vaswap" run --library "$lib" --policy "$root/examples/policies/graphed_training.yaml" -- \
  python3 "$example" $args --out "$out/policy_training.json" >/dev/null 2>&1) || status=1
same "$out/policy_plain.json" "$out/policy_training.json" | tee -a "$log" || status=1
trace=$(ls "$work"/vaswap_*_0.jsonl 2>/dev/null | head -1)
[[ -n "$trace" ]] && echo "  trace.path vaswap_%h_%r.jsonl wrote $(basename "$trace"): $(selected "$trace")" | tee -a "$log" || { echo "  no trace" | tee -a "$log"; status=1; }

echo "== call sites" | tee -a "$log"
for conf in "selection.include=libc10_cuda.so" "selection.exclude=libc10_cuda.so"; do
  rm -f "$work/cs.jsonl"  # vaswap does not replace a trace file
  VASWAP_CONF="$conf" scripts/vaswap run --library "$lib" --trace "$work/cs.jsonl" -- \
    python3 "$example" $args --out "$out/policy_cs.json" >/dev/null 2>&1 || status=1
  echo "  $conf: $(selected "$work/cs.jsonl"); $(same "$out/policy_plain.json" "$out/policy_cs.json")" | tee -a "$log"
done

echo "== a malformed policy (on_error: abort)" | tee -a "$log"
printf 'mode: auto\nselection:\n  min_byte: 1MiB\n' >"$work/bad.yaml"
scripts/vaswap run --library "$lib" --policy "$work/bad.yaml" -- python3 "$example" --steps 1 >"$work/o" 2>"$work/e"
rc=$?
sed "s|$work/||" "$work/e" | grep -v Warning | head -5 | tee -a "$log"
echo "  exit status $rc; lines on stdout: $(wc -l <"$work/o")" | tee -a "$log"
[[ $rc == 1 ]] || status=1
echo "status=$status" | tee -a "$log"
exit $status
