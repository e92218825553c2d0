#!/usr/bin/env bash
# The parked patches (benchmarks/experiments/INDEX.md, "Waiting for a GPU") measured in one
# device call of under ten minutes: each applied to the copied tree (the device's copy only;
# nothing here commits), then its GPU tests and its sweep. Per-step timeouts keep the whole
# under 590 s; a step that runs out says so in its log and the rest go on. (The thirty-sixth
# session ran v21-v23 and v110 this way; now v111.)
#
#     bash benchmarks/device_parked.sh            # results under $OUT (or ./parked-out)
#
# Land what wins on main afterwards (NOTES "v111"), then run the full GPU check on main's
# sources as they then are.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-parked-out}"
mkdir -p "$out"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
start=$SECONDS

for patch in v111-fp8-tensor-core-sums; do
    if git apply "benchmarks/experiments/$patch.patch" 2> "$out/apply-$patch.txt"; then
        echo "applied $patch"
    else
        echo "NOT applied $patch: $(head -2 "$out/apply-$patch.txt")"
    fi
done

step() {  # name seconds command...: one timed step, its log under $out
    local name="$1" limit="$2"
    shift 2
    if [ "$limit" -lt 30 ]; then
        echo "== $name skipped: $limit s left of the call"
        return
    fi
    timeout "$limit" "$@" > "$out/$name.txt" 2>&1
    local rc=$?
    echo "== $name (rc $rc, $((SECONDS - start)) s so far)"
    [ $rc -eq 124 ] && echo "   ran past its $limit s"
}

# v111: the FP8 fused forward's tests, then the float sums against the tensor cores' (two rounds)
step v111-tests 150 python3 -m pytest -q -p no:cacheprovider tests/test_fused.py -k fp8
tail -1 "$out/v111-tests.txt"; grep -E "^FAILED" "$out/v111-tests.txt" | head -5
step v111-sweep 300 python3 benchmarks/sweep_fused_variant.py --variants float_sums,mma_sums --json "$out/sweep-v111.json"
tail -15 "$out/v111-sweep.txt"

echo "total $((SECONDS - start)) s"
