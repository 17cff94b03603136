#!/usr/bin/env bash
# README's main-job command. Sets up what is missing, builds, and runs the layered-graph demo under
# vaswap (scripts/vaswap run): on the GPU when one is present (the demo built with nvcc, cudart
# linked statically, so vaswap sees it through its driver-level hooks), otherwise on vaswap's
# simulated device. Arguments go to the demo (scripts/demo.sh --help). Without arguments, on the
# simulator, the device is made too small for the demo (100 MiB) so that vaswap has to offload.
# Afterwards it says what vaswap saw, from the trace (build/demo_trace.jsonl).
#
# VASWAP_CONF is passed on; unless it says otherwise, buffers of 1 MiB and up made during a
# capture become slots (the demo's buffers are 1 MiB by default), vaswap samples the device's
# free memory every 200 us, and on the simulator the planner uses the H200's measured link
# (schedule.model=given: simulated copies run at host memcpy speed, which would plan nothing).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
conf_given=${VASWAP_CONF+yes}
export VASWAP_CONF=${VASWAP_CONF:-selection.min_bytes=1MiB,trace.memory_interval=200us}
trace=$root/build/demo_trace.jsonl

# The libvaswap.so to preload: VASWAP_LIBRARY, a GPU build, the plain build, or build it.
find_library() {
  for lib in "${VASWAP_LIBRARY:-}" build/gpu/lib/libvaswap.so build/plain/lib/libvaswap.so; do
    [[ -n "$lib" && -f "$lib" ]] && { echo "$lib"; return; }
  done
  bash scripts/setup.sh >&2
  cmake -S . -B build/plain -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build/plain -j"$(nproc)" --target vaswap >&2
  echo build/plain/lib/libvaswap.so
}

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && command -v nvcc >/dev/null 2>&1; then
  mkdir -p build/gpu
  nvcc -O2 -std=c++17 -gencode arch=compute_90,code=[sm_90,compute_90] -I tests/sim/include \
    examples/train_layers/train_layers.cu -o build/gpu/train_layers_cuda
  lib=$(find_library)
  echo "vaswap demo: running on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) under vaswap ($lib)"
  demo=(build/gpu/train_layers_cuda)
else
  bash scripts/setup.sh
  cmake -S . -B build/plain -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build/plain -j"$(nproc)" --target train_layers vaswap
  lib=build/plain/lib/libvaswap.so
  echo "vaswap demo: no GPU here; running on the simulated CUDA device (build/plain/sim) under vaswap"
  [[ -n "$conf_given" ]] || VASWAP_CONF+=",schedule.model=given,schedule.h2d_gbps=55,schedule.d2h_gbps=55,schedule.remap_latency=600us"
  export LD_LIBRARY_PATH=build/plain/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  demo=(build/plain/bin/train_layers)
  # What people offload for: a job that does not fit. With the demo's own sizes (8 layers of 1 MiB
  # buffers: 64 MiB of slots and 66 MiB of its own) the simulated device gets 100 MiB, where the
  # demo alone runs out of memory; vaswap's default budget then evicts and restores every step.
  # Given arguments or VASWAP_SIM_DEVICE_MEMORY, the device is left as asked (16 GiB by default).
  if [[ $# -eq 0 && -z ${VASWAP_SIM_DEVICE_MEMORY:-} ]]; then
    export VASWAP_SIM_DEVICE_MEMORY=100MiB
    set -- --steps 20
    if "${demo[@]}" --quiet "$@" >/dev/null 2>&1; then
      echo "vaswap demo: the demo fits a 100 MiB simulated device without vaswap (unexpected)"
    else
      echo "vaswap demo: on a simulated device of 100 MiB the demo alone runs out of memory" \
        "(it needs ~130 MiB); now under vaswap:"
    fi
  fi
fi

status=0
rm -f "$trace"  # the demo's own trace, each run anew (vaswap does not replace a trace file)
scripts/vaswap run --library "$lib" --trace "$trace" -- "${demo[@]}" "$@" || status=$?
if [[ -s "$trace" ]]; then
  python3 - "$trace" <<'PY'
import collections, json, sys
n = collections.Counter(); slot_bytes = 0; levels = set()
for line in open(sys.argv[1]):
    e = json.loads(line)
    n[e["ev"]] += 1
    if "api" in e:
        levels.add(e["api"])
    if e["ev"] == "alloc" and e.get("selected"):
        n["slots"] += 1
        slot_bytes += e["bytes"]
print(f"vaswap saw {n['alloc']} allocations ({n['slots']} backed by slots, "
      f"{slot_bytes / 2**20:.0f} MiB), {n['capture_begin']} captures and {n['graph_launch']} graph "
      f"launches, through its {' and '.join(sorted(levels)) or 'no'} hooks; trace: {sys.argv[1]}")
events = sorted((json.loads(line) for line in open(sys.argv[1])), key=lambda e: e["t_ns"])
plans = [e for e in events if e["ev"] == "plan"]
if not plans:
    print("planner: no plan yet (it learns for 3 identical steps first; try --steps 20)")
else:
    plan = plans[0]
    moved = lambda ev: sum(e["bytes"] for e in events if e["ev"] == ev) / 2**20
    last = max(e["t_ns"] for e in events if e["ev"] == "graph_launch")
    samples = [e for e in events if e["ev"] == "mem_sample"]
    before = [e["free"] for e in samples if e["t_ns"] <= plan["t_ns"]]
    during = [e["free"] for e in samples if plan["t_ns"] < e["t_ns"] <= last]
    freed = f"; cuMemGetInfo showed {(max(during) - before[-1]) / 2**20:.0f} MiB given back during the steps" \
        if before and during else ""
    print(f"planner: a period of {plan['period']} graph launches, {plan['windows']} windows "
          f"({plan['peak_bytes'] / 2**20:.0f} MiB away at once){', ' + plan['reason'] if plan.get('reason') else ''}; "
          f"{moved('d2h'):.0f} MiB offloaded and {moved('h2d'):.0f} MiB restored{freed}")
PY
fi
exit $status
