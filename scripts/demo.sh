#!/usr/bin/env bash
# README's main-job command. Sets up what is missing, builds, and runs the layered-graph demo:
# on the GPU when one is present (built with nvcc), otherwise on vaswap's simulated device.
# Arguments are passed to the demo (see: scripts/demo.sh --help).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && command -v nvcc >/dev/null 2>&1; then
  mkdir -p build/gpu
  nvcc -O2 -std=c++17 -gencode arch=compute_90,code=[sm_90,compute_90] -I tests/sim/include \
    examples/train_layers/train_layers.cu -o build/gpu/train_layers_cuda
  echo "vaswap demo: running on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  exec build/gpu/train_layers_cuda "$@"
fi
bash scripts/setup.sh
cmake -S . -B build/plain -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build/plain -j"$(nproc)" --target train_layers
echo "vaswap demo: no GPU here; running on the simulated CUDA device (build/plain/sim)"
LD_LIBRARY_PATH=build/plain/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec build/plain/bin/train_layers "$@"
