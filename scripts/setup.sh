#!/usr/bin/env bash
# Installs what building and testing vaswap needs on a fresh Debian machine.
# Idempotent: a package already present is not touched, and nothing is fetched when all are there.
# Never downloads anything but Debian packages; the CUDA toolkit must already be installed
# (CUDA_HOME, default /usr/local/cuda), since only its headers are used here.
set -euo pipefail

packages=(
  cmake g++ make pkg-config
  libgtest-dev libgmock-dev googletest   # unit and simulator tests
  libspdlog-dev libfmt-dev               # logging, used header-only and hidden
  libyaml-cpp-dev                        # policy files, reached only through libvaswap_yaml.so
  libunwind-dev                          # call sites, reached only through libvaswap_unwind.so
  clang-format clang-tidy                # style gates run by CI
  clang                                  # the policy fuzzer (libFuzzer)
  binutils                               # nm/readelf for the export-hygiene test
  python3 python3-pytest                 # the Python binding's tests
  python3-venv                           # the wheel's build tools and its install test (venvs)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "vaswap setup: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The python3 on PATH may not be Debian's (pyenv, a venv): give it the pinned requirements of
# the tests and of `vaswap report`.
if ! python3 -c 'import pytest, matplotlib, tqdm' 2>/dev/null; then
  echo "vaswap setup: installing Python requirements (tests, vaswap report) for $(command -v python3)"
  python3 -m pip install --quiet -r "$(dirname "$0")/requirements-test.txt" \
    -r "$(dirname "$0")/requirements-report.txt"
fi

cuda_home=${CUDA_HOME:-/usr/local/cuda}
if [[ ! -f "$cuda_home/include/cuda.h" || ! -f "$cuda_home/include/cuda_runtime_api.h" ]]; then
  echo "vaswap setup: CUDA headers not found under $cuda_home/include." >&2
  echo "  Install the CUDA Toolkit (13.x) or set CUDA_HOME to its root." >&2
  exit 1
fi
