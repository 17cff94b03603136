#!/usr/bin/env bash
# Issue 4 on a real GPU. Expects the builds in build/gpu (made on a machine with the toolkit):
#   cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=Release -DVASWAP_CUDA_EXAMPLES=ON
#   cmake --build build/gpu --target vaswap probe_runtime probe_procaddr probe_dlopen \
#     passthrough_cuda train_layers_static_cuda
# Runs, writing logs to $OUT (or bench/results/):
#   1. the interposition probe over real CUDA, three ways (tests/integration/preload_ways_test.sh)
#   2. the demo built with nvcc's default static cudart, with and without vaswap: same checksum,
#      and the trace shows the driver-level hooks saw its allocations, captures and launches
#   3. examples/pytorch/graphed_layers.py (per-layer make_graphed_callables) with and without
#      vaswap, selection on: losses compared bit for bit, the trace summarized
#   4. the passthrough bench, alternating runs without and with the preload
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/bench/results}
mkdir -p "$out"
cd "$root"
lib=$root/build/gpu/lib/libvaswap.so
bin=$root/build/gpu/bin
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
log=$out/interpose_h200.log
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  echo "# commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); command: bash bench/run_interpose_h200.sh"
} | tee "$log"
status=0
counts() {  # counts TRACE: events per (event, call, api), and the selected allocations
  python3 - "$1" <<'PY'
import collections, json, sys
c = collections.Counter(); selected = 0; selected_bytes = 0
for line in open(sys.argv[1]):
    e = json.loads(line)
    if "call" in e:
        c[(e["ev"], e["call"], e["api"])] += 1
    if e["ev"] == "alloc" and e.get("selected"):
        selected += 1; selected_bytes += e["bytes"]
for (ev, call, api), n in sorted(c.items()):
    print(f"  {n:6d}  {ev:18s} {call:38s} {api}")
print(f"  slots: {selected} allocations, {selected_bytes / 2**20:.1f} MiB")
PY
}

echo "== 1. probe: runtime / cuGetProcAddress / dlopen ways over real CUDA" | tee -a "$log"
mkdir -p build/gpu/sim  # the test puts it on LD_LIBRARY_PATH; empty here, so real CUDA answers
bash tests/integration/preload_ways_test.sh "$root/build/gpu" "$root" 2>&1 | tee -a "$log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1

echo "== 2. demo built with static cudart (driver-level hooks only)" | tee -a "$log"
nm "$bin/train_layers_static_cuda" | grep -c ' T cudaMalloc$' | sed 's/^/  cudaMalloc defined in the binary: /' | tee -a "$log"
args="--layers 8 --elems 4194304 --steps 10 --seed 1"
plain=$("$bin/train_layers_static_cuda" $args | tail -1)
under=$(VASWAP_CONF="selection.min_bytes=8MiB" scripts/vaswap run --library "$lib" \
  --trace "$out/interpose_static_trace.jsonl" -- "$bin/train_layers_static_cuda" $args | tail -1)
echo "  without vaswap: $plain" | tee -a "$log"
echo "  with vaswap:    $under" | tee -a "$log"
[[ "$plain" == "$under" ]] || { echo "  FAIL: checksums differ" | tee -a "$log"; status=1; }
counts "$out/interpose_static_trace.jsonl" | tee -a "$log"

echo "== 3. PyTorch $(python3 -c 'import torch; print(torch.__version__)'): per-layer make_graphed_callables" | tee -a "$log"
targs="--layers 8 --steps 20"
python3 examples/pytorch/graphed_layers.py $targs --out "$out/torch_plain.json" | tail -2 | tee -a "$log"
scripts/vaswap run --library "$lib" --trace "$out/interpose_torch_trace.jsonl" -- \
  python3 examples/pytorch/graphed_layers.py $targs --out "$out/torch_vaswap.json" 2>&1 | tail -3 | tee -a "$log"
python3 - "$out/torch_plain.json" "$out/torch_vaswap.json" <<'PY' | tee -a "$log"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
same = a["losses"] == b["losses"]
print(f"  losses bit-identical over {len(a['losses'])} steps: {same}")
print(f"  step time: {a['ms_per_step']:.2f} ms without, {b['ms_per_step']:.2f} ms with vaswap (selection on, no offload)")
sys.exit(0 if same else 1)
PY
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
counts "$out/interpose_torch_trace.jsonl" | tee -a "$log"
echo "  expandable_segments:True is reported:" | tee -a "$log"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True scripts/vaswap run --library "$lib" -- \
  python3 examples/pytorch/graphed_layers.py --layers 2 --steps 2 2>&1 | grep -m1 vaswap | tee -a "$log"

echo "== 4. passthrough cost (bin/passthrough_cuda), alternating runs" | tee -a "$log"
python3 - "$bin/passthrough_cuda" "$lib" "$out/passthrough_h200.md" <<'PY' 2>&1 | tee -a "$log"
import os, statistics, subprocess, sys
exe, lib, md = sys.argv[1:]
modes = {"without vaswap": {}, "vaswap, mode=off": {"LD_PRELOAD": lib, "VASWAP_CONF": "mode=off"},
         "vaswap, on (unselected)": {"LD_PRELOAD": lib}}
runs = {m: [] for m in modes}
for _ in range(7):
    for mode, extra in modes.items():
        env = dict(os.environ, **extra)
        out = subprocess.run([exe], env=env, capture_output=True, text=True, check=True).stdout
        runs[mode].append({k: float(v) for k, v in (line.split() for line in out.splitlines())})
calls = list(runs["without vaswap"][0])
med = {m: {c: statistics.median(r[c] for r in runs[m]) for c in calls} for m in modes}
lines = ["| call | " + " | ".join(f"{m} (ns)" for m in modes) + " | added, off | added, on |",
         "|---|" + "---:|" * (len(modes) + 2)]
base = med["without vaswap"]
for c in calls:
    row = [f"{med[m][c]:.1f}" for m in modes]
    lines.append(f"| {c} | " + " | ".join(row) +
                 f" | {med['vaswap, mode=off'][c] - base[c]:+.1f} | {med['vaswap, on (unselected)'][c] - base[c]:+.1f} |")
text = "\n".join(lines)
print(text)
with open(md, "w") as f:
    f.write("# Passthrough cost per call, H200\n\n")
    f.write("`bash bench/run_interpose_h200.sh` (section 4): `bin/passthrough_cuda` (31 batches of 256 "
            "calls, median per batch) run 7 times per mode, alternating; the median of the 7 runs.\n\n")
    f.write(text + "\n")
PY
echo "status=$status" | tee -a "$log"
exit $status
