#!/usr/bin/env bash
# scripts/vaswap run: LD_PRELOAD order, options, exit status and signals, and an unchanged demo.
set -euo pipefail
build=$1
src=$2
vaswap=$src/scripts/vaswap
lib=$build/lib/libvaswap.so
# Any library harmless to preload, and not instrumented: the launcher (python3) runs with it.
other=$(ldd /bin/sh | awk '/libc\.so/ {print $3}')
asan=$(ldd "$lib" | awk '/libasan/ {print $3}')
# In sanitizer builds the launched shells run with the ASan runtime preloaded; their own
# intentional leaks at exit are not this test's subject, and would change their exit status.
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
check() {  # check NAME EXPECTED ACTUAL
  if [[ "$2" != "$3" ]]; then echo "FAIL $1: expected [$2], got [$3]"; exit 1; fi
  echo "ok   $1"
}

# libvaswap.so goes first (after the ASan runtime in sanitizer builds); what was there stays.
got=$(LD_PRELOAD=$other "$vaswap" run --library "$lib" -- sh -c 'echo "$LD_PRELOAD"')
check "preload order" "${asan:+$asan:}$lib:$other" "$got"
# A libvaswap.so already listed (here one that does not exist, which ld.so skips with a warning)
# is replaced, not repeated.
got=$(LD_PRELOAD="/elsewhere/libvaswap.so:$other" "$vaswap" run --library "$lib" -- \
  sh -c 'echo "$LD_PRELOAD"' 2>/dev/null)
check "no duplicate" "${asan:+$asan:}$lib:$other" "$got"

# Options become the environment.
got=$("$vaswap" run --library "$lib" --trace rel_%p.jsonl -- sh -c 'echo "$VASWAP_TRACE"')
check "trace path made absolute" "$PWD/rel_%p.jsonl" "$got"
policy=$(mktemp)
got=$("$vaswap" run --library "$lib" --policy "$policy" -- sh -c 'echo "$VASWAP_POLICY"')
check "policy path" "$policy" "$got"
rm -f "$policy"
set +e
msg=$("$vaswap" run --library "$lib" --policy /nonexistent/p.yaml -- true 2>&1); rc=$?
check "missing policy status" 2 "$rc"
[[ "$msg" == *"the policy file /nonexistent/p.yaml does not exist"* ]] || { echo "FAIL message: $msg"; exit 1; }
msg=$("$vaswap" run --library "$lib" 2>&1); rc=$?
check "no command status" 2 "$rc"
msg=$("$vaswap" run --library /nonexistent/libvaswap.so -- true 2>&1); rc=$?
check "missing library status" 2 "$rc"
[[ "$msg" == *"cannot find libvaswap.so"* ]] || { echo "FAIL message: $msg"; exit 1; }
"$vaswap" run --library "$lib" -- /nonexistent/program >/dev/null 2>&1; rc=$?
check "missing program status" 127 "$rc"

# The exit status and a signal pass through: the program replaces the launcher.
"$vaswap" run --library "$lib" -- sh -c 'exit 7'; rc=$?
check "exit status" 7 "$rc"
"$vaswap" run --library "$lib" -- sh -c 'kill -TERM $$'; rc=$?
check "killed by SIGTERM" 143 "$rc"
"$vaswap" run --library "$lib" -- sleep 30 & pid=$!
for _ in $(seq 50); do [[ "$(cat /proc/$pid/comm 2>/dev/null)" == sleep ]] && break; sleep 0.1; done
check "same process id" sleep "$(cat /proc/$pid/comm)"
# (SIGTERM: a background job of a non-interactive shell ignores SIGINT.)
kill -TERM "$pid"; wait "$pid"; rc=$?
check "SIGTERM to the launcher's pid" 143 "$rc"
set -e

# The demo under the launcher prints what it prints without it.
args="--layers 4 --elems 65536 --steps 6 --seed 3"
plain=$(LD_LIBRARY_PATH=$build/sim "$build/bin/train_layers" $args | grep -v '^device memory')
under=$(LD_LIBRARY_PATH=$build/sim "$vaswap" run --library "$lib" -- "$build/bin/train_layers" $args |
  grep -v '^device memory')
check "demo output unchanged" "$plain" "$under"
