#!/usr/bin/env bash
# The demo, linked against the real toolkit's libcudart.so.13, runs on the simulator through
# LD_LIBRARY_PATH and prints, for each recorded configuration, the checksum the same source
# printed on an H200 (bench/results/train_layers_h200.log, made by bench/run_demo_h200.sh).
set -euo pipefail
build=$1 source=$2
demo=$build/bin/train_layers
log=$source/bench/results/train_layers_h200.log

readelf -d "$demo" | grep -q 'NEEDED.*\[libcudart.so.13\]' || { echo "demo does not need libcudart.so.13"; exit 1; }
failures=0
while read -r args; do
  expected=$(awk -v want="## train_layers_cuda $args" '$0 == want {found=1; next} found && /^checksum/ {print $2; exit}' "$log")
  [[ -n "$expected" ]] || { echo "no H200 checksum recorded for: $args"; exit 1; }
  got=$(LD_LIBRARY_PATH=$build/sim "$demo" $args --quiet | awk '/^checksum/ {print $2}')
  if [[ "$got" == "$expected" ]]; then
    echo "ok   $args -> $got"
  else
    echo "FAIL $args -> simulator $got, H200 $expected"
    failures=$((failures + 1))
  fi
done < "$source/bench/demo_configs.txt"
exit $failures
