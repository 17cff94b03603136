#!/usr/bin/env bash
# Graph analysis under PyTorch on the H200: examples/pytorch/graphed_layers.py (8 layers,
# per-layer make_graphed_callables) under vaswap run, then the graph_scan events summarized:
# nodes, kernels with packed extra buffers (cuBLAS), regions and slots referenced, scan time. Also
# checks the losses against the plain run. Expects build/gpu/lib (carried). Writes
# $OUT/graph_scan_h200.log (or bench/results/).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/bench/results}
mkdir -p "$out"
cd "$root"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
args="--layers 8 --steps 10"
log=$out/graph_scan_h200.log
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  echo "# command: bash bench/run_graph_scan_h200.sh"
} | tee "$log"
python3 examples/pytorch/graphed_layers.py $args --out "$out/scan_plain.json" >/dev/null 2>&1
rm -f "$out/scan_trace.jsonl"  # vaswap does not replace a trace file
scripts/vaswap run --library build/gpu/lib/libvaswap.so --trace "$out/scan_trace.jsonl" -- \
  python3 examples/pytorch/graphed_layers.py $args --out "$out/scan_vaswap.json" >/dev/null 2>&1
python3 - "$out" <<'PY' | tee -a "$log"
import json, statistics, sys
out = sys.argv[1]
a, b = (json.load(open(f"{out}/scan_{n}.json"))["losses"] for n in ("plain", "vaswap"))
print(f"losses bit-identical to the plain run: {a == b}")
scans = [json.loads(l) for l in open(f"{out}/scan_trace.jsonl")]
scans = [e for e in scans if e["ev"] == "graph_scan"]
print(f"{len(scans)} graphs scanned (8 forward, 8 backward)")
print("| capture | nodes | kernel nodes | of which packed extra | memcpy | memset | unscanned | regions | slot regions | scan (us) |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for s in scans:
    print(f"| {s['capture']} | {s['nodes']} | {s['kernel_nodes']} | {s['extra_buffers']} | {s['memcpy_nodes']} | "
          f"{s['memset_nodes']} | {s['unscanned_nodes']} | {s['regions']} | {s['slot_regions']} | {s['dur_us']:.1f} |")
print(f"median scan {statistics.median(s['dur_us'] for s in scans):.1f} us; "
      f"{sum(s['nodes'] for s in scans)} nodes in {sum(s['dur_us'] for s in scans) / 1e3:.2f} ms in all")
sys.exit(0 if a == b else 1)
PY
