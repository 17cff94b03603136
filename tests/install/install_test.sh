#!/usr/bin/env bash
# vaswap installed the two ways its users install software, used from outside the checkout with
# nothing set (issue 16; docs/BUILD.md, Installing). BUILD is the plain build: its demo, its
# simulated device and its libvaswap.so are what the installed copies are compared with.
#
#   install_test.sh BUILD SOURCE
#
# The wheel: built from scratch by scripts/build_wheel.sh (CMake through scikit-build-core, then
# auditwheel), installed into a fresh venv with `pip install --no-index --no-deps`, as on the GPU
# machine. Then, from a directory outside the checkout, with the venv's bin/ first on PATH:
#   - `vaswap --version` names the header's version and the venv's library; so does the metadata,
#     which also lists the [report] extra;
#   - `vaswap check-policy` passes every example policy and reports a malformed one;
#   - `vaswap run` of the demo on the simulated device prints the checksum of the build tree's
#     run, of the run without vaswap and of the recorded H200 run; it preloaded the venv's library
#     and its planner offloaded; call-site selection works (libvaswap_unwind.so, libunwind and the
#     liblzma auditwheel added);
#   - `vaswap report` reads that run's trace; `--plots` without the extra says how to get it;
#   - `import vaswap` loads the venv's library; tests/python/test_binding.py passes against the
#     installed package;
#   - every library in the package finds its dependencies inside it (only the C/C++ runtime from
#     the system); its libvaswap.so passes the export test and exports what the build tree's does.
# `cmake --install` of BUILD to a temporary prefix:
#   - exactly the expected files: no simulator, test or example;
#   - <prefix>/bin/vaswap finds <prefix>/lib/libvaswap.so and runs the demo; the export test;
#   - tests/install/consumer builds with find_package(vaswap) (and refuses another version) and
#     with pkg-config, and runs on the simulated device; the package imports from the prefix.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset VASWAP_LIBRARY VASWAP_CONF VASWAP_POLICY VASWAP_TRACE PYTHONPATH LD_PRELOAD
passed=0
ok() {
  echo "ok   $1"
  passed=$((passed + 1))
  rm -f "$tmp/err"  # what a failure shows is then its own step's
}
fail() {
  echo "FAIL $1"
  [[ -s "$tmp/err" ]] && tail -20 "$tmp/err"
  echo "install: $passed passed, 1 failed"
  exit 1
}
same() {  # same WHAT EXPECTED ACTUAL
  [[ "$2" == "$3" ]] || fail "$1: expected [$2], got [$3]"
  ok "$1"
}
part() { sed -nE "s/^#define VASWAP_VERSION_$1 ([0-9]+)$/\1/p" "$src/include/vaswap/vaswap.h"; }
version="$(part MAJOR).$(part MINOR).$(part PATCH)"
sim=$build/sim
demo=$build/bin/train_layers
for f in "$demo" "$sim/libcuda.so.1" "$build/lib/libvaswap.so"; do
  [[ -e "$f" ]] || fail "the plain build lacks $f (scripts/test.sh install builds it)"
done

# The demo's first configuration, whose H200 checksum bench/results/train_layers_h200.log records,
# with the planner on the H200's measured link (as scripts/demo.sh runs it on the simulator).
config=$(head -1 "$src/bench/demo_configs.txt")
read -ra args <<<"$config"
h200=$(awk -v want="## train_layers_cuda $config" '$0 == want {found=1; next} found && /^checksum/ {print $2; exit}' \
  "$src/bench/results/train_layers_h200.log")
# A residency budget of half the demo's 64 MiB of slots: on the simulator's roomy device the auto
# budget would offload nothing (a job that fits pays nothing), and this test is about offload.
conf=selection.min_bytes=1MiB,schedule.model=given,schedule.h2d_gbps=55,schedule.d2h_gbps=55
conf+=,schedule.remap_latency=600us,residency.budget=32MiB
run_demo() {  # run_demo [LAUNCHER...]: the demo's checksum on the simulated device (under LAUNCHER)
  LD_LIBRARY_PATH=$sim "$@" "$demo" "${args[@]}" --quiet | awk '/^checksum/ {print $2}'
}
plain=$(run_demo)
tree=$(VASWAP_CONF=$conf run_demo "$src/scripts/vaswap" run --library "$build/lib/libvaswap.so" \
  --trace "$tmp/tree.jsonl" --)
same "the build tree's demo under vaswap: the checksum without it and the H200's" "$plain $h200" "$tree $tree"

# =================================================================================================
# The wheel, in a fresh venv
# =================================================================================================
bash "$src/scripts/build_wheel.sh" >"$tmp/err" 2>&1 || fail "scripts/build_wheel.sh"
wheel=$(ls "$src"/dist/vaswap-"$version"-py3-none-manylinux_*_x86_64.whl)
ok "wheel built and repaired: $(basename "$wheel")"
python3 -m venv "$tmp/venv"
venv=$tmp/venv
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-index --no-deps "$wheel" >"$tmp/err" 2>&1 ||
  fail "pip install --no-index --no-deps $wheel"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
site=$(realpath "$site")
pkg=$site/vaswap
outside=$tmp/outside
mkdir -p "$outside"
cd "$outside"
export PATH=$venv/bin:$PATH

same "vaswap on PATH is the venv's" "$venv/bin/vaswap" "$(command -v vaswap)"
same "vaswap --version" "vaswap $version (libvaswap.so: $pkg/lib/libvaswap.so)" "$(vaswap --version)"
same "the wheel's metadata: version and the [report] extra" \
  "$version matplotlib>=3.5; extra == \"report\"|tqdm>=4.60; extra == \"report\"" \
  "$(python -c 'import importlib.metadata as m; print(m.version("vaswap"), "|".join(m.requires("vaswap")))')"

policies=("$src"/examples/policies/*.yaml)
for policy in "${policies[@]}"; do
  vaswap check-policy "$policy" >"$tmp/out" 2>"$tmp/err" || fail "vaswap check-policy $policy"
  if [[ "$(head -1 "$tmp/out")" != "# $policy: valid; the effective policy:" ]] || ! grep -q '^mode: ' "$tmp/out"; then
    fail "vaswap check-policy $policy printed no effective policy"
  fi
done
ok "vaswap check-policy passes every example policy (${#policies[@]})"
printf 'mode: auto\nselection:\n  min_byte: 2MiB\n' >"$tmp/bad.yaml"
status=0
vaswap check-policy "$tmp/bad.yaml" >"$tmp/out" 2>"$tmp/err" || status=$?
same "vaswap check-policy of a malformed policy: status and message" \
  "1 $tmp/bad.yaml:3:13: unknown key \"selection.min_byte\"; did you mean \"selection.min_bytes\"?" \
  "$status $(head -1 "$tmp/err")"

# shellcheck disable=SC2016 # the launched shell expands it
same "vaswap run preloads the venv's library" "$pkg/lib/libvaswap.so" "$(vaswap run -- sh -c 'echo "$LD_PRELOAD"')"
installed=$(VASWAP_CONF=$conf run_demo vaswap run --trace run.jsonl --)
same "vaswap run of the demo on the simulated device: the build tree's checksum" "$tree" "$installed"
offloaded() {  # offloaded TRACE -> "slots N, planned M" from the trace's summary and plan events
  python3 -c 'import json, sys
e = [json.loads(l) for l in open(sys.argv[1])]
s = [x for x in e if x["ev"] == "summary"][0]
print("slots", s["slots"], "plans", s["plans"], "offloaded", "yes" if s["bytes_offloaded"] > 0 else "no")' "$1"
}
same "the planner offloaded under the installed library as under the build tree's" \
  "$(offloaded "$tmp/tree.jsonl")" "$(offloaded run.jsonl)"
[[ "$(offloaded run.jsonl)" == *"offloaded yes" ]] || fail "nothing offloaded under the installed library"
for rule in include exclude; do
  VASWAP_CONF=selection.min_bytes=1MiB,selection.$rule=train_layers run_demo vaswap run --trace "cs_$rule.jsonl" -- \
    >/dev/null 2>"$tmp/err" || fail "selection.$rule"
done
same "call-site selection (libvaswap_unwind.so from the wheel): include selects, exclude skips" "32 0" \
  "$(grep -c '"selected":true,"slot":[0-9]*,"callsite_us":' cs_include.jsonl) $(grep -c '"selected":true' cs_exclude.jsonl)"
grep -q '"selected":false,"skipped":"exclude"' cs_exclude.jsonl || fail "selection.exclude: no allocation skipped"

vaswap report --no-progress run.jsonl >"$tmp/out" 2>"$tmp/err" || fail "vaswap report"
grep -qE "^\| [^|]+:$(sed -nE '1s/.*"pid":([0-9]+).*/\1/p' run.jsonl) \|" "$tmp/out" || fail "vaswap report: no row for the run"
status=0
vaswap report --no-progress --plots plots run.jsonl >"$tmp/out" 2>"$tmp/err" || status=$?
same "vaswap report reads the trace; --plots without matplotlib names the extra" \
  "2 vaswap report: --plots needs matplotlib, an extra: pip install 'vaswap[report]'" "$status $(cat "$tmp/err")"

same "import vaswap: the package and the library from the venv" \
  "$pkg/__init__.py $version $version $pkg/lib/libvaswap.so" \
  "$(python -c 'import vaswap; print(vaswap.__file__, vaswap.__version__, vaswap.version(), vaswap._lib.load()._name)')"
python -m pip install --quiet --disable-pip-version-check -r "$src/scripts/requirements-test.txt" >"$tmp/err" 2>&1 ||
  fail "pip install pytest"
VASWAP_TEST_INSTALLED=1 VASWAP_SIM_DEVICES=2 VASWAP_SIM_DEVICE_MEMORY=1GiB,512MiB LD_LIBRARY_PATH=$sim \
  python -m pytest -q -p no:cacheprovider "$src/tests/python/test_binding.py" >"$tmp/err" 2>&1 ||
  fail "tests/python/test_binding.py against the installed package"
expected="$(grep -c '^@needs_sim' "$src/tests/python/test_binding.py") passed, $(grep -c '^@needs_torch' "$src/tests/python/test_binding.py") skipped"
same "tests/python/test_binding.py against the installed package" "$expected" \
  "$(tail -1 "$tmp/err" | sed -E 's/^=* *//; s/ in [0-9.]+s.*//')"

# Each library in the package, and what auditwheel put in vaswap.libs/, finds everything but the
# C/C++ runtime inside the package (the GPU machine has no yaml-cpp, libunwind or liblzma to lend).
runtime='^(libc|libm|libstdc\+\+|libgcc_s|libdl|libpthread|linux-vdso|ld-linux-x86-64)\.so'
libraries=("$pkg"/lib/*.so* "$site"/vaswap.libs/*.so*)
for lib in "${libraries[@]}"; do
  while read -r name _ path _; do
    [[ "$name" =~ $runtime || "$name" == /* ]] && continue
    [[ "$path" == "$site"/* ]] || fail "$(basename "$lib") finds $name at $path, outside the package"
  done < <(ldd "$lib")
done
ok "every library in the package (${#libraries[@]}) finds its dependencies inside it"
bash "$src/tests/integration/check_exports_test.sh" "$pkg" "$src" >"$tmp/err" 2>&1 || fail "export test on the wheel's libvaswap.so"
exports() { nm -D --defined-only "$1" | awk '{print $3}' | sort | md5sum; }
same "the wheel's libvaswap.so: $(tr "\n" " " <"$tmp/err")and the build tree's exports" \
  "$(exports "$build/lib/libvaswap.so")" "$(exports "$pkg/lib/libvaswap.so")"

# =================================================================================================
# cmake --install to a prefix, and a project that uses it
# =================================================================================================
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >"$tmp/err" 2>&1 || fail "cmake --install"
build_type=$(sed -nE 's/^CMAKE_BUILD_TYPE:[A-Z]+=(.*)/\1/p' "$build/CMakeCache.txt" | tr '[:upper:]' '[:lower:]')
bundled=("$build"/lib/libyaml-cpp.so* "$build"/lib/libunwind.so*)
expected=$(printf '%s\n' bin/vaswap include/vaswap/vaswap.h lib/cmake/vaswap/vaswapConfig.cmake \
  lib/cmake/vaswap/vaswapConfigVersion.cmake lib/cmake/vaswap/vaswapTargets.cmake \
  "lib/cmake/vaswap/vaswapTargets-${build_type:-noconfig}.cmake" lib/libvaswap.so lib/libvaswap_unwind.so \
  lib/libvaswap_yaml.so lib/pkgconfig/vaswap.pc "${bundled[@]/#$build\//}" \
  share/vaswap/python/vaswap/{TRACE.md,__init__.py,_cli.py,_dlpack.py,_installed.py,_layout.py,_lib.py,_report.py} | sort)
same "cmake --install: exactly the runtime, launcher, python and development files" \
  "$expected" "$(cd "$prefix" && find . -type f | sed 's|^\./||' | sort)"
export PATH=${PATH#"$venv/bin:"}
same "<prefix>/bin/vaswap --version" "vaswap $version (libvaswap.so: $prefix/lib/libvaswap.so)" \
  "$("$prefix/bin/vaswap" --version)"
installed=$(VASWAP_CONF=$conf run_demo "$prefix/bin/vaswap" run --)
same "<prefix>/bin/vaswap run of the demo: the build tree's checksum" "$tree" "$installed"
bash "$src/tests/integration/check_exports_test.sh" "$prefix" "$src" >"$tmp/err" 2>&1 || fail "export test on <prefix>/lib/libvaswap.so"
ok "the export test on <prefix>/lib/libvaswap.so"
same "the package from <prefix>/share/vaswap/python loads <prefix>/lib/libvaswap.so" "$version $prefix/lib/libvaswap.so" \
  "$(PYTHONPATH=$prefix/share/vaswap/python python3 -c 'import vaswap; print(vaswap.version(), vaswap._lib.load()._name)')"

consumer_output=$(printf '%s\n' "version $version" "slot: 3145728 bytes asked, 4194304 mapped, address aligned to 2 MiB: yes" \
  "zero bytes: VASWAP_ERROR_INVALID_ARGUMENT: vaswap_slot_create: bytes must be > 0")
cmake -S "$src/tests/install/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
  -DVASWAP_EXPECTED_VERSION="$version" >"$tmp/err" 2>&1 || fail "consumer: configure"
cmake --build "$tmp/consumer" >"$tmp/err" 2>&1 || fail "consumer: build"
same "a project built with find_package(vaswap) runs against <prefix>/lib" "$consumer_output" \
  "$(LD_LIBRARY_PATH=$sim "$tmp/consumer/consumer")"
if cmake -S "$src/tests/install/consumer" -B "$tmp/consumer_other" -DCMAKE_PREFIX_PATH="$prefix" \
  -DVASWAP_EXPECTED_VERSION=9.9.9 >"$tmp/err" 2>&1; then
  fail "find_package(vaswap 9.9.9 EXACT) found $version"
fi
ok "find_package(vaswap 9.9.9 EXACT) refuses $version"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
same "pkg-config --modversion vaswap" "$version" "$(pkg-config --modversion vaswap)"
read -ra flags < <(pkg-config --cflags --libs vaswap)
cc -o "$tmp/consumer_pc" "$src/tests/install/consumer/consumer.c" "${flags[@]}" 2>"$tmp/err" ||
  fail "consumer: build with pkg-config"
same "a program built with pkg-config vaswap runs against <prefix>/lib" "$consumer_output" \
  "$(LD_LIBRARY_PATH=$prefix/lib:$sim "$tmp/consumer_pc")"

echo "install: $passed passed, 0 failed"
