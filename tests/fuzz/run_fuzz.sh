#!/usr/bin/env bash
# Builds the policy fuzzer with clang (libFuzzer + AddressSanitizer + UndefinedBehaviorSanitizer)
# and runs it for a bounded time from the seed corpus (the example policies, a few VASWAP_CONF
# strings, and the hostile inputs of hostile_policies.py: nested aliases, deep nesting, huge
# scalars and keys, long lists). Fails on a crash, a leak, an input slower than 5 s, or over 2 GiB
# of memory. Inputs are cut at 16 KiB (the 1 MiB ones are checked whole, for time, by
# tests/integration/policy_limits_test.sh).
#   run_fuzz.sh BUILD SOURCE [SECONDS]
set -euo pipefail
build=$(cd "$1" && pwd)
src=$2
seconds=${3:-60}
command -v clang++ >/dev/null || { echo "clang++ not found: scripts/setup.sh installs clang"; exit 1; }
out=$build/fuzz
mkdir -p "$out/corpus"
cuda=${CUDA_HOME:-/usr/local/cuda}/include
# The fuzzer sits beside libvaswap_yaml.so, which the YAML reader opens from its own directory.
clang++ -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$src/config" -I"$src/core" -I"$src/include" -I"$cuda" \
  "$src/tests/fuzz/policy_fuzz.cpp" "$src/config/policy.cpp" "$src/config/yaml_document.cpp" \
  "$src/core/base/private_library.cpp" -ldl -o "$build/lib/policy_fuzz"
for f in "$src"/examples/policies/*.yaml; do cp "$f" "$out/corpus/"; done
printf 'Cmode=auto,selection.min_bytes=16MiB' >"$out/corpus/conf1"
printf 'Cselection.include=lib*;*main*,schedule.remap_latency=1.5ms,on_error=passthrough' >"$out/corpus/conf2"
printf 'mode: rules\nrules:\n  - {offload: capture:1, after: graph:1, before: graph:2}\n' >"$out/corpus/rules.yaml"
python3 "$src/tests/fuzz/hostile_policies.py" "$out/corpus"
cd "$out"
ASAN_OPTIONS=detect_leaks=1 "$build/lib/policy_fuzz" -max_total_time="$seconds" -timeout=5 -max_len=16384 \
  -rss_limit_mb=2048 -print_final_stats=1 corpus 2>&1 | tail -15
