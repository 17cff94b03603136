#!/usr/bin/env bash
# With libvaswap.so preloaded (and nothing to do), the demo's output is byte-identical.
set -euo pipefail
build=$1
args="--layers 4 --elems 65536 --steps 6 --seed 3"
plain=$(LD_LIBRARY_PATH=$build/sim "$build/bin/train_layers" $args | grep -v '^device memory')
# A sanitizer build of libvaswap.so needs the ASan runtime loaded first, as any ASan preload does.
asan=$(ldd "$build/lib/libvaswap.so" | awk '/libasan/ {print $3}')
preload="${asan:+$asan:}$build/lib/libvaswap.so${LD_PRELOAD:+:$LD_PRELOAD}"
preloaded=$(LD_PRELOAD="$preload" LD_LIBRARY_PATH=$build/sim \
  "$build/bin/train_layers" $args | grep -v '^device memory')
echo "$preloaded" | tail -1
[[ "$plain" == "$preloaded" ]] || { echo "output differs under LD_PRELOAD"; diff <(echo "$plain") <(echo "$preloaded"); exit 1; }
