#!/usr/bin/env bash
# Hostile policies (tests/fuzz/hostile_policies.py writes them: a 342-byte "billion laughs" of
# nested aliases, deep nesting, huge scalars and keys, 1 MiB of keys, a file over 1 MiB) each get
# their located message from `vaswap check-policy` within a few seconds and a bounded amount of
# memory, where the alias document once ran for minutes into gigabytes. The preload reads the
# same policy at start-up: it stops the program with that message before any CUDA work.
set -euo pipefail
build=$1
src=$2
source "$src/tests/integration/preload_common.sh"
python3 "$src/tests/fuzz/hostile_policies.py" "$tmp/hostile"
# Bounded memory too, where the sanitizers' shadow memory does not need the address space; and
# time: each answer takes under a second on an idle machine, several under the sanitizers.
limit_ms=5000
# (Not `ldd | grep -q`: grep's early exit fails the pipe under pipefail.)
if [[ "$(ldd "$lib")" == *libasan* ]]; then limit_ms=30000; else ulimit -v 2000000; fi

check() {  # check FILE EXPECTED-STATUS FIRST-LINE-PREFIX
  local file=$tmp/hostile/$1 start end status=0
  start=$(date +%s%N)
  timeout 60 "$vaswap" check-policy --library "$lib" "$file" >"$tmp/out" 2>"$tmp/err" || status=$?
  end=$(date +%s%N)
  [[ $status != 124 ]] || fail "$1: check-policy did not answer within 60 s"
  [[ $status == "$2" ]] || fail "$1: check-policy exited $status, not $2"
  (((end - start) / 1000000 < limit_ms)) || fail "$1: check-policy took $(((end - start) / 1000000)) ms"
  local first
  first=$(head -c 400 "$tmp/err" | head -1)
  [[ $status == 0 ]] && first=$(head -1 "$tmp/out")
  [[ "$first" == "$3"* ]] || fail "$1: the first line is \"${first:0:300}\", not \"$3...\""
  echo "ok   $1: $(((end - start) / 1000000)) ms: ${first:0:140}"
}
h=$tmp/hostile
check billion_laughs.yaml 1 "$h/billion_laughs.yaml:1:4: anchor &a: anchors and aliases are not allowed in a vaswap policy; write the value out"
check alias_only.yaml 1 "$h/alias_only.yaml:1:7: anchor &m: anchors and aliases are not allowed"
check anchor_in_rules.yaml 1 "$h/anchor_in_rules.yaml:3:5: anchor &r: anchors and aliases are not allowed"
check deep_block.yaml 1 "$h/deep_block.yaml:33:33: the policy nests deeper than 32 levels"
check deep_flow.yaml 1 "$h/deep_flow.yaml:1:"
check huge_scalar.yaml 1 "$h/huge_scalar.yaml:1:7: mode must be off, auto or rules, got \"xxxxxxxx"
check huge_key.yaml 1 "$h/huge_key.yaml:1:"
check many_keys.yaml 1 "$h/many_keys.yaml:1:13: unknown key \"key0000000\"; see docs/POLICY.md for the keys"
check long_list.yaml 0 "# $h/long_list.yaml: valid"
check over_limit.yaml 1 "$h/over_limit.yaml: the policy is more than 1048576 bytes, over the 1 MiB"

# The preload: the alias document stops the program at its first CUDA call, with the message.
status=0
timeout 20 "$vaswap" run --library "$lib" --policy "$h/billion_laughs.yaml" -- "$build/bin/probe_runtime" \
  >"$tmp/out" 2>"$tmp/err" || status=$?
[[ $status == 1 ]] || fail "preload: exit status $status, not 1"
[[ ! -s "$tmp/out" ]] || fail "preload: the program ran"
grep -qF "$h/billion_laughs.yaml:1:4: anchor &a: anchors and aliases are not allowed" "$tmp/err" ||
  fail "preload: no message"
echo "ok   the preload stops at the alias document with its message"
