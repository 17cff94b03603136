#!/usr/bin/env bash
# Where a stalled run sits: the stress probe under the device handshake (as bench/run_copy_h200.sh
# runs it), RUNS times per cudart; while a run is alive and its trace has not grown for STALL
# seconds (well below residency.wait_limit, so the watchdog has not ended it yet), every thread's
# name, kernel wait channel, system call and kernel stack (/proc), and, where gdb is installed,
# every thread's user-space backtrace, are written to $OUT/stall_runN.txt; after a run that failed,
# the stacks vaswap wrote when it ended the process (thread_stack events) and the trace's last
# events follow.
# Usage: bash bench/stall_dump_h200.sh [LIBRARY]   (default build/gpu/lib/libvaswap.so)
# Environment: RUNS (3), ROUNDS (24), MODE (--copy2d), STALL (5 s), WAIT_LIMIT (40s),
#   EXTRA_CONF (residency.handshake=device), PROBES (stress_probe_cuda stress_probe_shared_cuda).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-$root/bench/results}
mkdir -p "$out"
lib=${1:-build/gpu/lib/libvaswap.so}
read -r -a probes <<<"${PROBES:-stress_probe_cuda stress_probe_shared_cuda}"
runs=${RUNS:-3}
rounds=${ROUNDS:-24}
mode=${MODE:---copy2d}
stall=${STALL:-5}
conf="selection.captured_only=false,selection.min_bytes=1MiB,residency.budget=${BUDGET:-12MiB},residency.wait_limit=${WAIT_LIMIT:-40s},${EXTRA_CONF:-residency.handshake=device}"
gdb_bin=$(command -v gdb || true)
echo "# $(date -u +%FT%TZ) gdb: ${gdb_bin:-none}; VASWAP_CONF=$conf"
dump() {  # pid file
  local pid=$1 file=$2
  {
    echo "# stall dump of pid $pid at $(date -u +%FT%TZ)"
    for task in /proc/"$pid"/task/*; do
      echo "## thread $(basename "$task") $(cat "$task/comm" 2>/dev/null)" \
        "wchan=$(cat "$task/wchan" 2>/dev/null) syscall=$(cut -d' ' -f1 "$task/syscall" 2>/dev/null)"
      sed 's/^/    /' "$task/stack" 2>/dev/null
    done
    if [[ -n $gdb_bin ]]; then
      timeout 60 "$gdb_bin" -batch -p "$pid" -ex "thread apply all bt 30" 2>&1
    fi
  } >"$file"
}
run=0
for probe in "${probes[@]}"; do
  for _ in $(seq "$runs"); do
    run=$((run + 1))
    trace=$(mktemp)
    VASWAP_CONF=$conf scripts/vaswap run --library "$lib" --trace "$trace" -- \
      "build/gpu/bin/$probe" --threads 4 --rounds "$rounds" "$mode" >/dev/null 2>"$out/stall_run$run.err" &
    wrapper=$!
    dumped=no
    start=$(date +%s)
    while kill -0 "$wrapper" 2>/dev/null; do
      sleep 1
      pid=$(pgrep -n -f "build/gpu/bin/$probe" || true)
      [[ -n $pid && -s $trace ]] || continue
      age=$(($(date +%s) - $(stat -c %Y "$trace")))
      if [[ $dumped == no && $age -ge $stall ]]; then
        dump "$pid" "$out/stall_run$run.txt"
        dumped=yes
      fi
      (($(date +%s) - start > 200)) && kill "$wrapper"
    done
    wait "$wrapper"
    rc=$?
    echo "run $run ($probe): exit $rc, dumped $dumped, $(grep -m1 -iE 'error' "$out/stall_run$run.err" | cut -c1-200)"
    if [[ $rc -eq 0 ]]; then
      rm -f "$out/stall_run$run.err"
    else  # vaswap's own account of each thread at its end (thread_stack events), and the trace's end
      python3 -c 'import json,sys
ev=[json.loads(line) for line in open(sys.argv[1]) if line.strip()]
for e in ev[-300:]:
    if e["ev"] == "thread_stack":
        print("thread %s (%s): %s" % (e["tid_of"], e["name"], e["frames"]))
print("## the last 60 events")
for e in [e for e in ev if e["ev"] != "thread_stack"][-60:]:
    print(json.dumps(e))' "$trace" >>"$out/stall_run$run.txt" 2>&1
    fi
    rm -f "$trace"
  done
done
