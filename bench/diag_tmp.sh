export LD_LIBRARY_PATH=/usr/local/cuda/lib64
PROBE_DEBUG=1 build/gpu/bin/probe_procaddr 2>&1 | tail -4
E=examples/pytorch/graphed_layers.py; A="--layers 8 --steps 8"
L=build/gpu/lib/libvaswap.so
run(){ n=$1; shift; "$@" --out $OUT/$n.json > $OUT/$n.log 2>&1; echo "$n: $(tail -1 $OUT/$n.log)"; }
run plain python3 $E $A
run plain_shift python3 $E $A --shift-mib 6
run plain_blocking env CUDA_LAUNCH_BLOCKING=1 python3 $E $A
run math python3 $E $A --sdpa math
run math_shift python3 $E $A --sdpa math --shift-mib 6
run vs_math scripts/vaswap run --library $L -- python3 $E $A --sdpa math
run vs scripts/vaswap run --library $L -- python3 $E $A
run vs2 scripts/vaswap run --library $L -- python3 $E $A
python3 - <<'PY'
import json, os
o = os.environ["OUT"]
r = {n: json.load(open(f"{o}/{n}.json"))["losses"] for n in
     ("plain", "plain_shift", "plain_blocking", "math", "math_shift", "vs_math", "vs", "vs2")}
for n, l in r.items():
    for ref in ("plain", "math"):
        d = next((i for i, (a, b) in enumerate(zip(r[ref], l)) if a != b), None)
        print(f"{n:15s} vs {ref:6s}: first differing step {d}")
print("vs vs vs2:", r["vs"] == r["vs2"])
PY
