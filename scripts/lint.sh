#!/usr/bin/env bash
# Style gates: clang-format must leave every source unchanged; clang-tidy must be quiet.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mapfile -t sources < <(git ls-files '*.cpp' '*.h' '*.cu')
echo "=== vaswap: clang-format (${#sources[@]} files)"
clang-format --dry-run --Werror "${sources[@]}"
echo "=== vaswap: clang-tidy"
cmake -S . -B build/lint -DCMAKE_BUILD_TYPE=Debug -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
mapfile -t tidy < <(git ls-files 'core/*.cpp' 'config/*.cpp' 'interpose/*.cpp' 'tests/sim/driver/*.cpp' 'tests/sim/runtime/*.cpp')
clang-tidy -p build/lint --quiet "${tidy[@]}" 2>/dev/null
echo "lint: clean"
