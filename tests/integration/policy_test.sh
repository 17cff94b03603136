#!/usr/bin/env bash
# The policy end to end, over the runtime probe (tests/integration/probe.cpp) and the launcher:
#   - every example policy passes `vaswap check-policy`; a malformed one fails with its message;
#   - `vaswap run --policy FILE` applies the file, and VASWAP_CONF overrides it;
#   - selection.include / selection.exclude select and exclude by call site;
#   - on_error: abort stops the program before any CUDA work; passthrough leaves it untouched.
set -euo pipefail
build=$1
src=$2
source "$src/tests/integration/preload_common.sh"
probe=$build/bin/probe_runtime
plain=$("$probe")

# check-policy: the examples, and a malformed file.
for policy in "$src"/examples/policies/*.yaml; do
  "$vaswap" check-policy --library "$lib" "$policy" >"$tmp/out" 2>"$tmp/err" || fail "check-policy $policy"
  grep -q "^mode: " "$tmp/out" || fail "check-policy $policy printed no effective policy"
done
echo "ok   every example policy passes check-policy"
printf 'mode: auto\nselection:\n  min_byte: 2MiB\nguard: maybe\n' >"$tmp/bad.yaml"
set +e
"$vaswap" check-policy --library "$lib" "$tmp/bad.yaml" >"$tmp/out" 2>"$tmp/err"
status=$?
set -e
[[ $status == 1 ]] || fail "check-policy of a malformed file exited $status, not 1"
grep -qF "$tmp/bad.yaml:3:13: unknown key \"selection.min_byte\"; did you mean \"selection.min_bytes\"?" "$tmp/err" ||
  fail "check-policy: the unknown key"
grep -qF "$tmp/bad.yaml:4:8: guard must be true or false, got \"maybe\"" "$tmp/err" || fail "check-policy: the bad value"
grep -qF "$tmp/bad.yaml: 2 errors" "$tmp/err" || fail "check-policy: the count"
echo "ok   check-policy reports every error with file, line, column and key, and exits 1"

# --policy applies the file (and its trace.path, with %p); VASWAP_CONF overrides it.
printf 'selection:\n  min_bytes: 4MiB\ntrace:\n  path: %s/policy_trace_%%p.jsonl\n' "$tmp" >"$tmp/p.yaml"
run --policy "$tmp/p.yaml" -- "$probe" >"$tmp/out" 2>"$tmp/err" || fail "--policy: the probe failed"
[[ "$(cat "$tmp/out")" == "$plain" ]] || fail "--policy: output differs"
grep -q "mapped after its first launch" "$tmp/err" || fail "--policy: selection.min_bytes from the file not applied"
ls "$tmp"/policy_trace_[0-9]*.jsonl >/dev/null 2>&1 || fail "--policy: trace.path with %p not written"
VASWAP_CONF="selection.min_bytes=64MiB" run --policy "$tmp/p.yaml" -- "$probe" >"$tmp/out" 2>"$tmp/err"
grep -q "no slot behind B" "$tmp/err" || fail "VASWAP_CONF did not override the file"
echo "ok   --policy applies the file, its trace.path expands %p, and VASWAP_CONF overrides it"

# Call sites: the captured allocation is made from main() in probe_runtime.
callsite() {  # callsite CONF EXPECT(slot|SKIPPED-REASON)
  rm -f "$tmp/cs.jsonl"  # a trace that exists is not replaced (trace.overwrite)
  VASWAP_CONF="selection.min_bytes=4MiB,$1" run --trace "$tmp/cs.jsonl" -- "$probe" >"$tmp/out" 2>"$tmp/err" ||
    fail "callsite $1: the probe failed"
  [[ "$(cat "$tmp/out")" == "$plain" ]] || fail "callsite $1: output differs"
  if [[ $2 == slot ]]; then
    grep -q "mapped after its first launch" "$tmp/err" || fail "callsite $1: not selected"
    grep -q '"selected":true,"slot":[0-9]*,"callsite_us":' "$tmp/cs.jsonl" || fail "callsite $1: no callsite_us"
  else
    grep -q "no slot behind B" "$tmp/err" || fail "callsite $1: selected"
    grep -q "\"bytes\":8388608,.*\"selected\":false,\"skipped\":\"$2\"" "$tmp/cs.jsonl" ||
      fail "callsite $1: the trace does not say skipped $2"
  fi
}
callsite "selection.include=probe_runtime" slot
callsite "selection.include=main" slot
callsite "selection.include=libnothing*" include
callsite "selection.exclude=probe_run*" exclude
callsite "selection.exclude=main" exclude
callsite "selection.include=main;libnothing*,selection.exclude=libnothing*" slot
echo "ok   selection.include and selection.exclude select and exclude by object and function name"

# on_error: abort (the default) stops before any CUDA work; passthrough leaves the program alone.
set +e
VASWAP_CONF="mode=sometimes" run -- "$probe" >"$tmp/out" 2>"$tmp/err"
status=$?
set -e
[[ $status == 1 ]] || fail "abort: exit status $status, not 1"
[[ ! -s "$tmp/out" ]] || fail "abort: the program ran"
grep -qF '[vaswap] error: the vaswap policy has 1 error:' "$tmp/err" || fail "abort: message"
grep -qF 'VASWAP_CONF: mode must be off, auto or rules, got "sometimes"' "$tmp/err" || fail "abort: message"
VASWAP_CONF="on_error=passthrough,selection.min_bytes=lots" run -- "$probe" >"$tmp/out" 2>"$tmp/err"
[[ "$(cat "$tmp/out")" == "$plain" ]] || fail "passthrough: output differs"
[[ $(grep -c 'VASWAP_CONF: selection.min_bytes must be a size such as 16MiB, 2GB or 4096, got "lots"' "$tmp/err") == 1 ]] ||
  fail "passthrough: not said exactly once"
grep -q "vaswap is passing every call through (on_error: passthrough)" "$tmp/err" || fail "passthrough: message"
grep -q "seen allocations=0 frees=0 captures=0" "$tmp/err" || fail "passthrough: calls were handled"
echo "ok   on_error: abort stops the program with the message; passthrough leaves it untouched"
