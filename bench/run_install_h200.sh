#!/usr/bin/env bash
# Issue 16 on the H200: the wheel built elsewhere (scripts/build_wheel.sh), installed with pip and
# nothing else, runs a real PyTorch job bit-identically. No build tool is used here: no compiler,
# no CMake, no network (pip --no-index --no-deps). Writes $OUT/install_h200.log (or bench/results/)
# and the runs' losses next to it.
#
#   bash bench/run_install_h200.sh dist/vaswap-VERSION-py3-none-manylinux_2_XX_x86_64.whl
#
#   - a fresh venv that sees the system python's packages (torch), the wheel installed into it;
#   - from a directory outside the checkout, with nothing set: `vaswap --version`, `import vaswap`,
#     `vaswap check-policy` (libvaswap_yaml.so and its yaml-cpp from the wheel: this machine has no
#     yaml-cpp), the export test on the installed library;
#   - examples/pytorch/graphed_layers.py without vaswap, under `vaswap run` (default policy: the
#     planner), and under `vaswap run --policy graphed_training.yaml` with call-site selection
#     (libvaswap_unwind.so, libunwind and liblzma from the wheel): losses bit-identical.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[[ $# == 1 && -f "$1" ]] || { echo "usage: $0 WHEEL (dist/vaswap-*.whl, from scripts/build_wheel.sh)"; exit 2; }
wheel=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
out=${OUT:-$root/bench/results}
mkdir -p "$out"
log=$out/install_h200.log
example=$root/examples/pytorch/graphed_layers.py
args=(--layers 8 --steps 20)
work=$(mktemp -d)
venv=$work/venv
status=0
unset VASWAP_LIBRARY VASWAP_CONF VASWAP_POLICY VASWAP_TRACE PYTHONPATH
say() { echo "$*" | tee -a "$log"; }
run() {  # run COMMAND...: the command and its output into the log
  echo "\$ $*" | tee -a "$log"
  "$@" 2>&1 | tee -a "$log"
  return "${PIPESTATUS[0]}"
}
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  echo "# command: bash bench/run_install_h200.sh $1"
  echo "# $(python3 --version) at $(command -v python3); wheel $(basename "$wheel")"
} | tee "$log"

# The venv. python3 here may itself be a venv (the one that holds torch); --system-site-packages
# then reaches only its base interpreter, so its site-packages are added by a .pth file.
say "== a fresh venv; the wheel installed with pip --no-index --no-deps"
python3 -m venv --system-site-packages "$venv" 2>/dev/null || python3 -m venv --without-pip --system-site-packages "$venv"
if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  python3 -c 'import site, torch; print("\n".join(site.getsitepackages()))' \
    >"$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/outer_site.pth"
fi
if "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  run "$venv/bin/python" -m pip install --no-index --no-deps --no-cache-dir "$wheel" || status=1
else  # a venv made without pip: the system's pip installs into it
  run python3 -m pip --python "$venv/bin/python" install --no-index --no-deps --no-cache-dir "$wheel" || status=1
fi
cd "$work" || exit 1  # outside the checkout
export PATH=$venv/bin:$PATH
say "vaswap: $(command -v vaswap); torch $(python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name())')"

say "== the installed command, module and library"
run vaswap --version || status=1
run python3 -c 'import vaswap; print(vaswap.__file__, vaswap.__version__, vaswap.version(), vaswap._lib.load()._name)' || status=1
pkg=$(python3 -c 'import pathlib, vaswap; print(pathlib.Path(vaswap.__file__).parent)')
run vaswap check-policy "$root/examples/policies/graphed_training.yaml" || status=1
for lib in "$pkg"/lib/*.so*; do
  echo "$ ldd $(basename "$lib") (not the C/C++ runtime)" | tee -a "$log"
  ldd "$lib" | grep -Ev 'lib(c|m|stdc\+\+|gcc_s|dl|pthread)\.so|linux-vdso|ld-linux' | tee -a "$log"
  ldd "$lib" | grep -q 'not found' && status=1
done
if command -v nm >/dev/null && command -v readelf >/dev/null; then
  run bash "$root/tests/integration/check_exports_test.sh" "$pkg" "$root" || status=1
else
  say "(no nm/readelf here: the export test ran on the same wheel in CI, tests/install/install_test.sh)"
fi

same() { python3 -c 'import json,sys; a,b=(json.load(open(p))["losses"] for p in sys.argv[1:]); print("losses bit-identical:", a==b, f"({len(a)} steps, last {a[-1]})"); sys.exit(a!=b)' "$1" "$2"; }
train() {  # train NAME [vaswap run OPTIONS... --]: one run of the example, its output in $out
  local name=$1
  shift
  echo "\$ ${VASWAP_CONF:+VASWAP_CONF=$VASWAP_CONF }${*:+$* }python3 examples/pytorch/graphed_layers.py ${args[*]}" | tee -a "$log"
  "$@" python3 "$example" "${args[@]}" --out "$out/install_$name.json" >"$out/install_$name.log" 2>&1 || status=1
  grep -h ' steps in ' "$out/install_$name.log" | sed 's/^/  /' | tee -a "$log"
  grep -h 'info: summary' "$out/install_$name.log" | sed 's/.*info: /  /' | tee -a "$log"
}
say "== graphed_layers.py ${args[*]}: without vaswap, under vaswap run (the installed command, default"
say "   policy: the planner), and with a policy file and call-site selection"
train plain
VASWAP_CONF=log.level=info train vaswap vaswap run --
same "$out/install_plain.json" "$out/install_vaswap.json" | tee -a "$log" || status=1
VASWAP_CONF=log.level=info,selection.include=libc10_cuda.so \
  train policy vaswap run --policy "$root/examples/policies/graphed_training.yaml" --
same "$out/install_plain.json" "$out/install_policy.json" | tee -a "$log" || status=1
for name in vaswap policy; do  # the installed library did its job: slots selected (by call site in policy)
  grep -Eq 'summary: [1-9][0-9]* slots selected' "$out/install_$name.log" || {
    say "install_$name: no slot selected"
    status=1
  }
done
say "status=$status"
rm -rf "$work"
exit $status
