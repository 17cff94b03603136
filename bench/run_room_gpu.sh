#!/usr/bin/env bash
# Restores short of room inside one graph, on a GPU, for one library or an A/B of two: the
# static demo with --graph whole (32 slots of 2 MiB) under a 40 MiB budget, so that its rewritten
# graph's restores that open a launch find the reserve full (a slot the demo reads between
# launches stays on the device beyond the schedule), with the GPU's queues and with one
# (CUDA_DEVICE_MAX_CONNECTIONS=1). Per library and queue setting: exit status, wall time, the
# checksum against the run without vaswap, and the summary's room waits and overshoots (windows
# mapped beyond the reserve after 100 ms; a library before dee365f waits residency.wait_limit
# instead, here 5 s, and has no overshoot count); the last column counts the log lines that
# say a restore was mapped beyond the reserve.
# Usage: bash bench/run_room_gpu.sh LIBRARY [LIBRARY_B]   (from the repository root)
# Environment: OUT (a folder for the logs; default a temporary one), STEPS (20), TIMEOUT (90 s
#   per run), DEMO (build/gpu/bin/train_layers_static_cuda).
set -uo pipefail
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
demo=${DEMO:-build/gpu/bin/train_layers_static_cuda}
steps=${STEPS:-20}
plain=$("$demo" --quiet --steps "$steps" --graph whole 2>&1)
echo "without vaswap: $plain"
for lib in "$@"; do
  for connections in default 1; do
    log="$out/room_$(basename "$(dirname "$(dirname "$lib")")")_$connections.err"
    start=$(date +%s%N)
    under=$( (if [[ $connections != default ]]; then export CUDA_DEVICE_MAX_CONNECTIONS=$connections; fi
      VASWAP_CONF=selection.min_bytes=1MiB,residency.budget=40MiB,residency.wait_limit=5s,log.level=info \
        LD_PRELOAD=$lib timeout "${TIMEOUT:-90}" "$demo" --quiet --steps "$steps" --graph whole) \
      2>"$log")
    rc=$?
    end=$(date +%s%N)
    same=DIFFERENT
    [[ "$plain" == checksum* && "$plain" == "$under" ]] && same=identical
    room=$(grep -o "[0-9]* restores waited for room ([0-9.]* ms[^)]*)" "$log" | head -1)
    beyond=$(grep -c "is mapped beyond" "$log")
    echo "| $lib | $connections | $rc | $(((end - start) / 1000000)) | $same | ${room:--} | $beyond |"
  done
done
