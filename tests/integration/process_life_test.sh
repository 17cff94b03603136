#!/usr/bin/env bash
# Process life, files and environment (docs/RELIABILITY.md), over the simulator:
#   - the trace is never written through a symbolic link, never replaces a trace that exists
#     (unless trace.overwrite), and is close-on-exec;
#   - processes that inherit one VASWAP_TRACE without %p write one file each;
#   - a child forked after the trace opened neither hangs nor touches the parent's file;
#   - SIGTERM ends the trace with trace_end (signal) and still kills the program by SIGTERM; an
#     ignored SIGINT stays ignored; a handler the program installs later still runs, after a flush;
#   - a full disk (/dev/full) is one error on the log and a count in the exit summary;
#   - a program that fails while vaswap's copies run exits with its own status, vaswap silent as
#     the driver shuts down;
#   - an unknown VASWAP_LOG_LEVEL is an error that lists the valid ones, not silence;
#   - a setuid program on the C API path does not write where VASWAP_TRACE says.
set -euo pipefail
build=$1
src=$2
source "$src/tests/integration/preload_common.sh"
life=$build/bin/life_probe
probe=$build/bin/probe_runtime
plain=$("$probe")

# jsonl FILE: every line is a JSON object; prints "LINES FIRST-EV LAST-EV LAST-SIGNAL".
jsonl() {
  python3 - "$1" <<'PY'
import json, sys
lines = open(sys.argv[1], encoding="utf-8").read().split("\n")
if lines[-1] != "":
    sys.exit(f"{sys.argv[1]}: the last line is cut: {lines[-1][:80]!r}")
events = []
for number, line in enumerate(lines[:-1], 1):
    try:
        events.append(json.loads(line))
    except ValueError as e:
        sys.exit(f"{sys.argv[1]}:{number}: not JSON ({e}): {line[:80]!r}")
print(len(events), events[0]["ev"], events[-1]["ev"], events[-1].get("signal", "-"))
PY
}
# ready FILE: waits (30 s at most) until the program printed "ready".
ready() {
  for _ in $(seq 300); do
    grep -q ready "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "the program never got ready"
}

# --- Files --------------------------------------------------------------------------------------
printf 'precious\n' >"$tmp/target"
ln -s "$tmp/target" "$tmp/link.jsonl"
run --trace "$tmp/link.jsonl" -- "$probe" >"$tmp/out" 2>"$tmp/err" || fail "link: the probe failed"
[[ "$(cat "$tmp/out")" == "$plain" ]] || fail "link: output differs"
[[ "$(cat "$tmp/target")" == precious ]] || fail "link: the link's target was written"
grep -qF "the trace file $tmp/link.jsonl is a symbolic link; vaswap does not write a trace through a link" \
  "$tmp/err" || fail "link: no message"
echo "ok   a trace path that is a symbolic link is refused, and its target kept"

run --trace "$tmp/again.jsonl" -- "$probe" >"$tmp/out" 2>"$tmp/err" || fail "again: first run"
first=$(jsonl "$tmp/again.jsonl")
cp "$tmp/again.jsonl" "$tmp/again.first"
run --trace "$tmp/again.jsonl" -- "$probe" >"$tmp/out" 2>"$tmp/err" || fail "again: second run"
[[ "$(cat "$tmp/out")" == "$plain" ]] || fail "again: output differs"
cmp -s "$tmp/again.jsonl" "$tmp/again.first" || fail "again: the first trace was replaced"
grep -qF "the trace file $tmp/again.jsonl exists" "$tmp/err" || fail "again: no message"
grep -qF "remove it, put %p in the path for one file per process, or set trace.overwrite=true (from VASWAP_TRACE); tracing is off" \
  "$tmp/err" || fail "again: the message does not say what to do"
VASWAP_CONF=trace.overwrite=true run --trace "$tmp/again.jsonl" -- "$probe" >"$tmp/out" 2>"$tmp/err" ||
  fail "again: overwrite run"
! cmp -s "$tmp/again.jsonl" "$tmp/again.first" || fail "again: trace.overwrite=true did not replace it"
[[ "$(jsonl "$tmp/again.jsonl" | cut -d' ' -f2-)" == "trace_begin trace_end -" ]] || fail "again: replaced trace"
echo "ok   an existing trace is kept and the log says what to do; trace.overwrite=true replaces it ($first)"

run --trace "$tmp/exec.jsonl" -- "$life" exec sh -c 'ls -l /proc/$$/fd' >"$tmp/out" 2>"$tmp/err" ||
  fail "exec: failed"
grep -q ' 0 -> ' "$tmp/out" || fail "exec: no descriptor listing"
! grep -q "exec.jsonl" "$tmp/out" || fail "exec: the program that exec'd passed on the trace's descriptor"
echo "ok   the trace's descriptor is close-on-exec"

# Three processes given one VASWAP_TRACE without %p by a shell that loaded vaswap first.
run --trace "$tmp/shared.jsonl" -- sh -c '"$0" >/dev/null & "$0" >/dev/null & "$0" >/dev/null; wait; true' \
  "$probe" 2>"$tmp/err" || fail "shared: failed"
[[ ! -e "$tmp/shared.jsonl" ]] || fail "shared: the shell's path was written"
files=("$tmp"/shared.*.jsonl)
[[ ${#files[@]} == 3 ]] || fail "shared: ${#files[@]} files, not 3: ${files[*]}"
for f in "${files[@]}"; do
  pid=${f#"$tmp/shared."}
  pid=${pid%.jsonl}
  [[ "$(jsonl "$f" | cut -d' ' -f2-)" == "trace_begin trace_end -" ]] || fail "shared: $f"
  grep -q "\"ev\":\"trace_begin\",.*\"pid\":$pid," "$f" || fail "shared: $f is not process $pid's"
  grep -qF "so this process ($pid) writes $f; put %p in the path" "$tmp/err" || fail "shared: $pid not said"
done
echo "ok   processes that inherit one trace path without %p write one file each, and say so"

# --- Fork ---------------------------------------------------------------------------------------
status=0
timeout 120 "$vaswap" run --library "$lib" --trace "$tmp/fork.jsonl" -- "$life" fork 20 >"$tmp/out" 2>"$tmp/err" ||
  status=$?
[[ $status == 0 ]] || fail "fork: exit status $status (124: a child or the parent hung)"
[[ $(grep -c '^child ' "$tmp/out") == 20 ]] || fail "fork: not 20 children"
summary=$(jsonl "$tmp/fork.jsonl") || fail "fork: $summary"
[[ "$(cut -d' ' -f2- <<<"$summary")" == "trace_begin trace_end -" ]] || fail "fork: $summary"
[[ $(grep -c '"ev":"trace_begin"' "$tmp/fork.jsonl") == 1 && $(grep -c '"ev":"trace_end"' "$tmp/fork.jsonl") == 1 ]] ||
  fail "fork: a child wrote into the parent's trace"
for pid in $(sed -n 's/^child //p' "$tmp/out"); do
  ! grep -q "\"pid\":$pid[,}]" "$tmp/fork.jsonl" || fail "fork: child $pid is in the trace"
done
echo "ok   20 children forked while the trace is busy: none hangs, the parent's trace is whole ($summary)"

# --- Signals ------------------------------------------------------------------------------------
"$vaswap" run --library "$lib" --trace "$tmp/term.jsonl" -- "$life" loop >"$tmp/out" 2>"$tmp/err" &
pid=$!
ready "$tmp/out"
kill -INT "$pid"  # ignored: a shell starts background jobs with SIGINT ignored
sleep 0.3
kill -0 "$pid" 2>/dev/null || fail "term: an ignored SIGINT ended the program"
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
[[ $status == 143 ]] || fail "term: exit status $status, not 143 (killed by SIGTERM)"
summary=$(jsonl "$tmp/term.jsonl") || fail "term: $summary"
[[ "$(cut -d' ' -f2- <<<"$summary")" == "trace_begin trace_end SIGTERM" ]] || fail "term: $summary"
(($(grep -c '"ev":"graph_launch"' "$tmp/term.jsonl") >= 20)) || fail "term: launches missing"
echo "ok   SIGTERM: the trace ends with trace_end (signal SIGTERM), every line whole; killed by SIGTERM ($summary)"

"$vaswap" run --library "$lib" --trace "$tmp/handler.jsonl" -- "$life" handler >"$tmp/out" 2>"$tmp/err" &
pid=$!
ready "$tmp/out"
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
[[ $status == 3 ]] || fail "handler: exit status $status, not 3 (the program's handler did not run)"
grep -q '^handled$' "$tmp/out" || fail "handler: the program's handler did not run"
summary=$(jsonl "$tmp/handler.jsonl") || fail "handler: $summary"
[[ "$(cut -d' ' -f2- <<<"$summary")" == "trace_begin trace_end -" ]] || fail "handler: $summary"
[[ $(grep -c '"ev":"signal",.*"signal":"SIGTERM"' "$tmp/handler.jsonl") == 1 ]] || fail "handler: no signal event"
echo "ok   a SIGTERM handler the program installed later runs, after vaswap flushed the trace ($summary)"

# --- A full disk --------------------------------------------------------------------------------
VASWAP_CONF=log.level=info run --trace /dev/full -- "$probe" >"$tmp/out" 2>"$tmp/err" || fail "full: the probe failed"
[[ "$(cat "$tmp/out")" == "$plain" ]] || fail "full: output differs"
[[ $(grep -c '^\[vaswap\] error:' "$tmp/err") == 1 ]] || fail "full: not exactly one error on the log"
grep -qF '[vaswap] error: trace: writing /dev/full failed: No space left on device (errno 28)' "$tmp/err" ||
  fail "full: the error does not name the file and errno"
grep -qE '; 0 errors; trace: [0-9]+ events lost \(/dev/full: No space left on device\)$' "$tmp/err" ||
  fail "full: the summary does not count the lost events"
echo "ok   a full disk: one error naming the file and errno, the loss in the summary, the program unaffected"

# --- Exit while vaswap works ----------------------------------------------------------------------
# The program fails and exits while an eviction's copy is still running (a copy engine held
# 400 ms). The simulated driver shuts down at exit, after the atexit handlers, as a GPU's does:
# vaswap's threads then meet CUDA_ERROR_DEINITIALIZED. The exit keeps the program's status (1)
# and vaswap says nothing about the teardown. (A completion thread ended such a process with
# vaswap's 70 on an H100, and on the simulator in 5 of 6 of these runs before.)
demo=$build/bin/train_layers
for n in 40 80 120; do
  set +e
  VASWAP_SIM_FAULTS=copy_stall:3:400,cudaLaunchKernel:$n:2 VASWAP_SIM_DEVICE_MEMORY=100MiB \
    VASWAP_CONF=selection.min_bytes=1MiB,residency.budget=28MiB \
    run -- "$demo" --quiet --steps 20 >/dev/null 2>"$tmp/err"
  rc=$?
  set -e
  grep -q "injected fault: copy_stall" "$tmp/err" || fail "exit at launch $n: the copy was not held"
  grep -q "train_layers: cudaLaunchKernel.* failed" "$tmp/err" || fail "exit at launch $n: the program did not fail: $(cat "$tmp/err")"
  [[ $rc == 1 ]] || fail "exit at launch $n: exit status $rc, the program's is 1: $(cat "$tmp/err")"
  ! grep -q "^\[vaswap\]" "$tmp/err" || fail "exit at launch $n: vaswap spoke at the teardown: $(grep "^\[vaswap\]" "$tmp/err")"
done
echo "ok   a program that fails while vaswap copies exits with its own status (1), vaswap silent at the teardown"

# --- The environment ----------------------------------------------------------------------------
VASWAP_LOG_LEVEL=loud PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True run -- "$probe" >"$tmp/out" 2>"$tmp/err" ||
  fail "log level: the probe failed"
[[ $(grep -c 'VASWAP_LOG_LEVEL must be trace, debug, info, warn, error or off, got "loud"; the log stays at warn' "$tmp/err") == 1 ]] ||
  fail "log level: the unknown level is not said once"
grep -q 'warning: PYTORCH_CUDA_ALLOC_CONF has expandable_segments:True' "$tmp/err" ||
  fail "log level: warnings are silenced"
echo "ok   an unknown VASWAP_LOG_LEVEL is an error listing the valid levels; warnings still show"

# A setuid program (root running a copy owned by nobody: AT_SECURE) on the C API path.
mkdir -m 755 "$tmp/suid" && mkdir -m 1777 "$tmp/suid/out" && chmod 755 "$tmp"
cp "$build/bin/secure_probe" "$tmp/suid/"
secure() {  # secure WHO: runs the copy, setuid nobody (secure) or as it is (plain)
  VASWAP_TRACE=$tmp/suid/out/$1.jsonl VASWAP_TRACE_OWNER= "$tmp/suid/secure_probe" "$build/sim/libcuda.so.1" "$lib" \
    >"$tmp/out" 2>"$tmp/err" || fail "secure $1: the probe failed"
}
secure plain
grep -q "^secure 0 slot ok" "$tmp/out" || fail "secure plain: $(cat "$tmp/out")"
[[ -s "$tmp/suid/out/plain.jsonl" ]] || fail "secure plain: VASWAP_TRACE not honoured without setuid"
if chown nobody "$tmp/suid/secure_probe" && chmod 4755 "$tmp/suid/secure_probe" &&
  "$tmp/suid/secure_probe" "$build/sim/libcuda.so.1" "$lib" 2>/dev/null | grep -q '^secure 1 '; then
  secure setuid
  grep -q "^secure 1 slot ok" "$tmp/out" || fail "secure setuid: $(cat "$tmp/out")"
  [[ ! -e "$tmp/suid/out/setuid.jsonl" ]] || fail "secure setuid: VASWAP_TRACE honoured in a setuid program"
  echo "ok   a setuid program on the C API path ignores VASWAP_TRACE (the same program without setuid honours it)"
else
  # (Under the sanitizers: a setuid process cannot read its own environment for ASAN_OPTIONS,
  # and LeakSanitizer cannot run in it.)
  echo "skip a setuid program cannot run here (the unit test TraceEnvironment.SecureExecutionReadsNoTracePath covers the reader)"
fi
