# Sourced by the preload tests (preload_ways, preload_guards, policy, graph_scan) after setting
# build=$1 and src=$2: the simulator on the library path, the launcher as `run`, a scratch
# directory $tmp removed at exit, and `fail MESSAGE` (prints the last stderr, exits 1).
export LD_LIBRARY_PATH=$build/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# Under the sanitizer build the probes run with the ASan runtime; their leaks at exit are not
# these tests' subject.
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
vaswap=$src/scripts/vaswap
lib=$build/lib/libvaswap.so
run() { "$vaswap" run --library "$lib" "$@"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL $1"
  cat "$tmp/err" 2>/dev/null
  exit 1
}
