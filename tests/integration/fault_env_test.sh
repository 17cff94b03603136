#!/usr/bin/env bash
# VASWAP_SIM_FAULTS makes the Nth call of a driver function fail; the demo reports the runtime
# call that failed and its error, and exits non-zero.
set -uo pipefail
build=$1
out=$(VASWAP_SIM_FAULTS=cuMemAlloc_v2:3:2 LD_LIBRARY_PATH=$build/sim \
  "$build/bin/train_layers" --layers 2 --elems 1024 --steps 1 2>&1)
rc=$?
echo "$out" | tail -2
[[ $rc -eq 1 ]] || { echo "expected exit 1, got $rc"; exit 1; }
grep -q 'cudaMalloc' <<<"$out" && grep -q 'cudaErrorMemoryAllocation' <<<"$out" || { echo "missing call or error name"; exit 1; }
