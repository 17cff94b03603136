#!/usr/bin/env bash
# The demo prints, for each configuration in bench/demo_configs.txt, the checksum recorded from an
# H200 run of the same source (bench/results/train_layers_h200.log, made by bench/run_demo_h200.sh).
#
#   demo_checksum_test.sh BUILD SOURCE          on the simulator: the demo linked against the real
#                                               toolkit's libcudart.so.13, run with LD_LIBRARY_PATH
#   demo_checksum_test.sh BUILD SOURCE --gpu    on a real GPU: built with nvcc; exits 77 (skipped)
#                                               where there is no GPU or no nvcc
set -euo pipefail
build=$1 source=$2 mode=${3:-sim}
log=$source/bench/results/train_layers_h200.log

if [[ "$mode" == --gpu ]]; then
  if ! command -v nvcc >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "skipped: no GPU or no nvcc on this machine"
    exit 77
  fi
  demo=$build/bin/train_layers_cuda
  mkdir -p "$build/bin"
  nvcc -O2 -std=c++17 -gencode arch=compute_90,code=[sm_90,compute_90] -I"$source/tests/sim/include" \
    "$source/examples/train_layers/train_layers.cu" -o "$demo"
  run() { "$demo" "$@"; }
else
  demo=$build/bin/train_layers
  readelf -d "$demo" | grep -q 'NEEDED.*\[libcudart.so.13\]' || { echo "demo does not need libcudart.so.13"; exit 1; }
  run() { LD_LIBRARY_PATH=$build/sim "$demo" "$@"; }
fi

failures=0
while read -r args; do
  expected=$(awk -v want="## train_layers_cuda $args" '$0 == want {found=1; next} found && /^checksum/ {print $2; exit}' "$log")
  [[ -n "$expected" ]] || { echo "no H200 checksum recorded for: $args"; exit 1; }
  got=$(run $args --quiet | awk '/^checksum/ {print $2}')
  if [[ "$got" == "$expected" ]]; then
    echo "ok   $args -> $got"
  else
    echo "FAIL $args -> here $got, recorded H200 $expected"
    failures=$((failures + 1))
  fi
done < "$source/bench/demo_configs.txt"
exit $failures
