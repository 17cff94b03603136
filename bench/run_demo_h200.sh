#!/usr/bin/env bash
# Builds examples/train_layers with nvcc (static cudart, sm_90) on a machine with a GPU and runs
# it in the configurations whose checksums bench/results/train_layers_h200.txt records.
# tests/integration/demo_checksum_test.sh runs the same configurations on the simulator and
# requires the same checksums.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$here/build-gpu}
mkdir -p "$out"
nvcc -O2 -std=c++17 -gencode arch=compute_90,code=[sm_90,compute_90] \
  -I"$here/tests/sim/include" "$here/examples/train_layers/train_layers.cu" -o "$out/train_layers_cuda"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
nvcc --version | tail -1
while read -r args; do
  echo "## train_layers_cuda $args"
  "$out/train_layers_cuda" $args
done < "$here/bench/demo_configs.txt"
