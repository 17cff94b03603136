#!/usr/bin/env bash
# Residency on the H200: correctness of the budget and the handshakes on real CUDA.
#   1. the slot suite (bin/core_tests_cuda)
#   2. the static-cudart demo (8 layers x 32 MiB buffers: 1 GiB of slots), plain and under
#      `vaswap run` with the auto budget (fits: nothing moves), a 384 MiB budget (slots must leave
#      every step) with the device handshake, the host handshake, and CUDA_DEVICE_MAX_CONNECTIONS=1
#   3. examples/pytorch/graphed_layers.py (8 layers, per-layer graphs), plain, auto, and a budget
#      under the slots' total (TORCH_BUDGET, 2GiB)
# Checksums and losses must be identical; prints each run's step time and vaswap's exit summary.
# Expects build/gpu/{bin,lib} (bench/README.md). Writes $OUT (else bench/results/)/
# residency_h200.log and residency_h200_runs.tar.gz (each run's output, JSON and trace).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/commit.sh"
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/bench/results}
mkdir -p "$out"
cd "$root"
runs=$(mktemp -d)
trap 'tar -C "$runs" -czf "$out/residency_h200_runs.tar.gz" . 2>/dev/null; rm -rf "$runs"' EXIT
log=$out/residency_h200.log
lib=build/gpu/lib/libvaswap.so
status=0
exec > >(tee "$log") 2>&1
echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), commit $(bench_commit)"
echo "# command: bash bench/run_residency_h200.sh"

echo "== slot suite"
build/gpu/bin/core_tests_cuda >"$runs/core_tests.txt" 2>&1 || status=1
grep -E '^\[  (PASSED|FAILED|SKIPPED) |tests ran|FAILED' "$runs/core_tests.txt"

checksum() { python3 -c "import json;print(json.load(open('$1'))['checksum'])" 2>/dev/null; }
ms() { python3 -c "import json;print('%.2f ms/step' % json.load(open('$1'))['ms_per_step'])" 2>/dev/null; }
demo=(build/gpu/bin/train_layers_static_cuda --layers 8 --elems 8388608 --steps 30 --quiet)
vrun() {  # name conf program...
  local name=$1 conf=$2
  shift 2
  VASWAP_CONF="$conf,log.level=info" timeout 300 scripts/vaswap run --library "$lib" \
    --trace "$runs/$name.jsonl" -- "$@" 2>"$runs/$name.err"
  local rc=$?
  grep -E "summary:|error" "$runs/$name.err" | cut -c1-700 >&2
  return $rc
}
echo "== static-cudart demo (1 GiB of slots)"
plain=$("${demo[@]}" --out "$runs/demo_plain.json") || status=1
echo "plain: $plain $(ms "$runs/demo_plain.json")"
for variant in "auto:selection.min_bytes=16MiB" \
    "budget:selection.min_bytes=16MiB,residency.budget=384MiB" \
    "host:selection.min_bytes=16MiB,residency.budget=384MiB,residency.handshake=host" \
    "one_queue:selection.min_bytes=16MiB,residency.budget=384MiB"; do
  name=${variant%%:*}
  conf=${variant#*:}
  if [[ $name == one_queue ]]; then export CUDA_DEVICE_MAX_CONNECTIONS=1; fi
  vrun "demo_$name" "$conf" "${demo[@]}" --out "$runs/demo_$name.json" >/dev/null || status=1
  unset CUDA_DEVICE_MAX_CONNECTIONS
  same=DIFFERENT
  [[ "$(checksum "$runs/demo_$name.json")" == "$(checksum "$runs/demo_plain.json")" ]] &&
    same=identical
  [[ $same == identical ]] || status=1
  echo "$name: $same $(ms "$runs/demo_$name.json")"
done

echo "== PyTorch, 8 layers, per-layer graphs"
py=(python3 examples/pytorch/graphed_layers.py --layers 8 --steps 30)
timeout 300 "${py[@]}" --out "$runs/torch_plain.json" >"$runs/torch_plain.txt" 2>&1 || status=1
tail -1 "$runs/torch_plain.txt"
for variant in "auto:" "budget:residency.budget=${TORCH_BUDGET:-2GiB}"; do
  name=${variant%%:*}
  conf=${variant#*:}
  vrun "torch_$name" "trace.memory_interval=200us${conf:+,$conf}" "${py[@]}" \
    --out "$runs/torch_$name.json" >"$runs/torch_$name.txt" || status=1
  tail -1 "$runs/torch_$name.txt"
  python3 - "$runs/torch_plain.json" "$runs/torch_$name.json" <<'PY' || status=1
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
same = a["losses"] == b["losses"]
print(f"{sys.argv[2].rsplit('/', 1)[-1]}: losses {'identical' if same else 'DIFFERENT'}; "
      f"{a['ms_per_step']:.2f} -> {b['ms_per_step']:.2f} ms/step")
sys.exit(0 if same else 1)
PY
done
echo "status=$status"
exit $status
