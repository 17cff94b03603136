#!/usr/bin/env bash
# Issue 4 on a real GPU. Expects the builds in build/gpu (made on a machine with the toolkit):
#   cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=Release -DVASWAP_CUDA_EXAMPLES=ON
#   cmake --build build/gpu --target vaswap probe_runtime probe_procaddr probe_dlopen \
#     fake_nccl passthrough_cuda train_layers_static_cuda
# and carried: build/gpu/bin, build/gpu/lib, build/gpu/tests/fake.
# Runs, writing logs to $OUT (or bench/results/):
#   1. the interposition probe over real CUDA, three ways (tests/integration/preload_ways_test.sh)
#   2. the demo built with nvcc's default static cudart, with and without vaswap: same checksum,
#      and the trace shows the driver-level hooks saw its allocations, captures and launches
#   3. examples/pytorch/graphed_layers.py (per-layer make_graphed_callables) with and without
#      vaswap, selection on: losses compared bit for bit, the trace summarized
#   4. the passthrough bench, alternating runs without and with the preload
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/commit.sh"
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
  echo "# commit $(bench_commit); command: bash bench/run_interpose_h200.sh"
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

echo "== 1. probe: runtime / cuGetProcAddress / dlopen ways, and the guards, over real CUDA" | tee -a "$log"
mkdir -p build/gpu/sim  # the test puts it on LD_LIBRARY_PATH; empty here, so real CUDA answers
bash tests/integration/preload_ways_test.sh "$root/build/gpu" "$root" 2>&1 | tee -a "$log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
bash tests/integration/preload_guards_test.sh "$root/build/gpu" "$root" 2>&1 | tee -a "$log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1

echo "== 2. demo built with static cudart (driver-level hooks only)" | tee -a "$log"
nm "$bin/train_layers_static_cuda" | grep -c ' T cudaMalloc$' | sed 's/^/  cudaMalloc defined in the binary: /' | tee -a "$log"
args="--layers 8 --elems 4194304 --steps 10 --seed 1"
plain=$("$bin/train_layers_static_cuda" $args | tail -1)
rm -f "$out/interpose_static_trace.jsonl" "$out/interpose_torch_trace.jsonl"  # vaswap does not replace a trace file
under=$(VASWAP_CONF="selection.min_bytes=8MiB" scripts/vaswap run --library "$lib" \
  --trace "$out/interpose_static_trace.jsonl" -- "$bin/train_layers_static_cuda" $args | tail -1)
echo "  without vaswap: $plain" | tee -a "$log"
echo "  with vaswap:    $under" | tee -a "$log"
[[ "$plain" == "$under" ]] || { echo "  FAIL: checksums differ" | tee -a "$log"; status=1; }
counts "$out/interpose_static_trace.jsonl" | tee -a "$log"

echo "== 3. PyTorch $(python3 -c 'import torch; print(torch.__version__)'): per-layer make_graphed_callables" | tee -a "$log"
targs="--layers 8 --steps 20"
torch_run() {  # torch_run NAME EXTRA_ARGS [vaswap run options...]: losses to torch_NAME.json
  local name=$1 extra=$2
  shift 2
  local cmd=(python3 examples/pytorch/graphed_layers.py $targs $extra --out "$out/torch_$name.json")
  if [[ $name == plain* ]]; then
    "${cmd[@]}" >"$out/torch_$name.log" 2>&1
  else
    scripts/vaswap run --library "$lib" "$@" -- "${cmd[@]}" >"$out/torch_$name.log" 2>&1
  fi
  echo "  $name: $(tail -1 "$out/torch_$name.log")" | tee -a "$log"
}
torch_run plain ""
torch_run plain_again ""
VASWAP_CONF=mode=off torch_run vaswap_off ""
VASWAP_CONF=selection.min_bytes=1TiB torch_run vaswap_hooks_only ""
torch_run vaswap "" --trace "$out/interpose_torch_trace.jsonl"
torch_run plain_sdpa_default "--sdpa default"
torch_run plain_sdpa_default_again "--sdpa default"
torch_run vaswap_sdpa_default "--sdpa default"
torch_run vaswap_sdpa_default_again "--sdpa default"
python3 - "$out" <<'PY' | tee -a "$log"
import json, sys
out = sys.argv[1]
def table(names, ref):
    runs = {n: json.load(open(f"{out}/torch_{n}.json")) for n in names}
    base = runs[ref]["losses"]
    print(f"  | run | losses equal to {ref} | first differing step | ms/step |")
    print("  |---|---|---:|---:|")
    for name, r in runs.items():
        diff = next((i for i, (a, b) in enumerate(zip(base, r["losses"])) if a != b), None)
        print(f"  | {name} | {r['losses'] == base} | {'-' if diff is None else diff} | {r['ms_per_step']:.2f} |")
    return runs
runs = table(["plain", "plain_again", "vaswap_off", "vaswap_hooks_only", "vaswap"], "plain")
ok = all(r["losses"] == runs["plain"]["losses"] for r in runs.values())
print("  With PyTorch's default attention kernels (memory-efficient attention):")
table(["plain_sdpa_default", "plain_sdpa_default_again", "vaswap_sdpa_default",
       "vaswap_sdpa_default_again"], "plain_sdpa_default")
sys.exit(0 if ok else 1)
PY
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
counts "$out/interpose_torch_trace.jsonl" | tee -a "$log"
echo "  expandable_segments:True is reported:" | tee -a "$log"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True scripts/vaswap run --library "$lib" -- \
  python3 examples/pytorch/graphed_layers.py --layers 2 --steps 2 2>&1 | grep -m1 vaswap | tee -a "$log"

echo "== 4. passthrough cost (bin/passthrough_cuda): hooked symbol against libcudart's own function, in one process" | tee -a "$log"
python3 - "$bin/passthrough_cuda" "$lib" "$out/passthrough_h200.md" <<'PY' 2>&1 | tee -a "$log"
import os, subprocess, sys
exe, lib, md = sys.argv[1:]
modes = {"without the preload (noise floor)": {},
         "preloaded, VASWAP_CONF=mode=off": {"LD_PRELOAD": lib, "VASWAP_CONF": "mode=off"},
         "preloaded, on (calls not selected)": {"LD_PRELOAD": lib}}
text = []
for mode, extra in modes.items():
    r = subprocess.run([exe], env=dict(os.environ, **extra), capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stderr); sys.exit(1)
    rows = [line.split() for line in r.stdout.splitlines()[1:]]
    text += [f"### {mode}", "", "| call | through the symbol (ns) | libcudart's own (ns) | added (ns) |",
             "|---|---:|---:|---:|"]
    text += [f"| {c} | {float(a):.1f} | {float(b):.1f} | {float(d):+.1f} |" for c, a, b, d in rows]
    text.append("")
print("\n".join(text))
with open(md, "w") as f:
    f.write("# Passthrough cost per call, H200\n\n"
            "`bash bench/run_interpose_h200.sh` (section 4) runs `bin/passthrough_cuda` "
            "(bench/passthrough.cu) three ways. In one process, each call is made in 101 pairs of "
            "batches of 128: through its symbol (vaswap's hook when preloaded) and through "
            "libcudart's own function (dlvsym), alternating which goes first; 'added' is the "
            "median of the per-call differences of the pairs. Without the preload both sides are "
            "libcudart's function, so that column is the method's noise floor. "
            "cudaLaunchKernel is hooked since the planner: with mode=off it forwards after one "
            "load; on, this process's repeated graph launch is a one-launch period with no slots, "
            "so the planner is in steady state with the guard on and scans every eager launch "
            "(its parameters against the registry).\n\n")
    f.write("\n".join(text) + "\n")
PY
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
echo "status=$status" | tee -a "$log"
exit $status
