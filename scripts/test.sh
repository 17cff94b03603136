#!/usr/bin/env bash
# README's test command. Sets up what is missing, then builds and runs the whole suite twice:
# plain, and with AddressSanitizer + UndefinedBehaviorSanitizer; then the threaded tests (stress,
# residency, the simulator's streams) under ThreadSanitizer. Warnings are errors. Also
# checks formatting (clang-format) and lints (clang-tidy), and installs vaswap the ways its users
# do (the wheel into a fresh venv, cmake --install to a prefix) and uses it from outside the checkout.
#
#   scripts/test.sh              everything (what CI runs)
#   scripts/test.sh plain        one variant: plain | sanitize | tsan | lint | install
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh

jobs=$(nproc)
variants=("$@")
((${#variants[@]})) || variants=(lint plain sanitize tsan install)

build_and_test() {
  local name=$1
  shift
  echo "=== vaswap: $name build"
  cmake -S . -B "build/$name" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DVASWAP_WERROR=ON "$@" >/dev/null
  cmake --build "build/$name" -j"$jobs"
  echo "=== vaswap: $name tests"
  (cd "build/$name" && ctest --output-on-failure -j"$jobs" --timeout 900)
}

for v in "${variants[@]}"; do
  case "$v" in
    plain) build_and_test plain ;;
    sanitize)
      # LSan reports leaks at exit; UBSan stops at the first finding.
      ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
        build_and_test sanitize -DVASWAP_SANITIZE=ON ;;
    tsan)
      # The tests where threads meet: application threads against vaswap's workers (stress,
      # residency), and the simulator's stream threads. The whole suite under TSan would double
      # CI's time for little: the rest is single-threaded or covered by ASan.
      echo "=== vaswap: tsan build"
      cmake -S . -B build/tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DVASWAP_WERROR=ON -DVASWAP_TSAN=ON >/dev/null
      cmake --build build/tsan -j"$jobs" --target vaswap stress_probe residency_tests sim_tests train_layers
      echo "=== vaswap: tsan tests"
      (cd build/tsan && TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1} \
        ctest --output-on-failure -j"$jobs" --timeout 900 -R '^(integration\.stress|core\.Residency|StreamTest|MemopTest)') ;;
    lint) bash scripts/lint.sh ;;
    install)
      # Compared with the plain build's demo, simulator and library: built here if plain did not run.
      echo "=== vaswap: install (the wheel and cmake --install, tests/install/install_test.sh)"
      cmake -S . -B build/plain -DCMAKE_BUILD_TYPE=RelWithDebInfo -DVASWAP_WERROR=ON >/dev/null
      cmake --build build/plain -j"$jobs" --target vaswap train_layers >/dev/null
      bash tests/install/install_test.sh build/plain "$root" ;;
    *) echo "scripts/test.sh: unknown variant '$v' (plain, sanitize, tsan, lint, install)" >&2; exit 2 ;;
  esac
done
