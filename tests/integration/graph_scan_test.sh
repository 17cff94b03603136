#!/usr/bin/env bash
# Graph analysis over the demo (examples/train_layers): each layer's forward graph is one kernel
# reading x and w and writing act and y (act and y allocated during its capture: slots); each
# backward graph is one kernel reading gy, act and w and writing gx and gw (gx and gw its own
# slots, act the forward's). The scan at the end of each capture must find exactly those.
set -euo pipefail
build=$1
src=$2
source "$src/tests/integration/preload_common.sh"
VASWAP_CONF="selection.min_bytes=64KiB" "$src/scripts/vaswap" run --library "$build/lib/libvaswap.so" \
  --trace "$tmp/t.jsonl" -- "$build/bin/train_layers" --layers 3 --steps 2 --elems 65536 >/dev/null
python3 - "$tmp/t.jsonl" <<'PY'
import json, sys
events = [json.loads(line) for line in open(sys.argv[1])]
scans = [e for e in events if e["ev"] == "graph_scan"]
assert len(scans) == 6, f"{len(scans)} scans for 3 layers"
forward = [s for s in scans if s["regions"] == 4]
backward = [s for s in scans if s["regions"] == 5]
assert len(forward) == 3 and len(backward) == 3, [(s["regions"], s["slot_regions"]) for s in scans]
for s in scans:
    assert (s["nodes"], s["kernel_nodes"], s["unscanned_nodes"]) == (1, 1, 0), s
    assert s["region_bytes"] == s["regions"] * 65536 * 4, s
assert all(s["slot_regions"] == 2 for s in forward), forward
assert all(s["slot_regions"] == 3 for s in backward), backward
# The demo destroys each graph once instantiated, so graph handles repeat; captures do not.
ends = [(e["graph"], e["capture"]) for e in events if e["ev"] == "capture_end"]
assert ends == [(s["graph"], s["capture"]) for s in scans], "a scan names another capture"
print(f"ok   6 graphs scanned: forward 4 regions (2 slots), backward 5 (3 slots), "
      f"median {sorted(s['dur_us'] for s in scans)[3]:.1f} us a scan")
PY
