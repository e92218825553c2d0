#!/usr/bin/env bash
# The parked patches (benchmarks/experiments/INDEX.md, "Waiting for a GPU") measured in one
# device call of under ten minutes: each applied to the copied tree (the device's copy only;
# nothing here commits), then its GPU tests where they are quick and its sweep, then the
# racecheck of the BatchNorm v21 kernels (which also checks their values). Per-step timeouts
# keep the whole under 590 s; a step that runs out says so in its log and the rest go on.
#
#     bash benchmarks/device_parked.sh            # results under $OUT (or ./parked-out)
#
# Land what wins on main afterwards (NOTES "v110 + v110b", "BatchNorm v21 + v22",
# "BatchNorm v23"), then run the full GPU check on main's sources as they then are.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-parked-out}"
mkdir -p "$out"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
start=$SECONDS

for patch in bn-v21-v22-staged-cl bn-v23-cl-sums-ring v110-split-fwd-l2-chunks; do
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

# v110 + v110b: its tests (bits against main's launches), then its sweep: main, v110b alone,
# three shares with v110b (two rounds; the 0.2 / 0.8 shares and share 0.4 with the finalize
# kernel are left to a later call where one of these wins)
step v110-tests 90 python3 -m pytest -q -p no:cacheprovider tests/test_split_chunks.py
tail -1 "$out/v110-tests.txt"; grep -E "^FAILED" "$out/v110-tests.txt" | head -5
step v110-sweep 130 python3 benchmarks/sweep_split_chunks.py --variants main,merged,share_0.3,share_0.4,share_0.6 \
    --json "$out/sweep-v110.json"
sed -n '/^op dtype N/,$p' "$out/v110-sweep.txt"

# BatchNorm v21 (NHWC 14 x 14 and 7 x 7: staged against the passes and 32-byte spans) and v23
# (56 x 56 and 112 x 112, both layouts: the ring against the register walk); v21's
# staged_cl_resident_1, v23's cl_ring_4 and v22's sweep (predicted +0.00-0.03) are left to a
# later call
bn_sweep() {  # name seconds shapes layouts variants
    BN_SWEEP_SHAPES="$3" BN_SWEEP_LAYOUTS="$4" step "sweep-$1" "$2" python3 benchmarks/sweep_bn_variants.py \
        --variants "$5" --json "$out/sweep-$1.json"
    sed -n '/^case |/,$p' "$out/sweep-$1.txt"
}
bn_sweep v21 120 64x1024x14x14,256x2048x7x7 nhwc default,staged_cl_off,staged_cl_spans_32
bn_sweep v23 100 32x256x56x56,128x64x112x112 nchw,nhwc default,cl_ring_off

step racecheck-bn-v21 $((585 - (SECONDS - start))) compute-sanitizer --tool racecheck python3 \
    benchmarks/sanitize_bn_staged_cl.py
grep -E "RACECHECK SUMMARY|ERROR SUMMARY|worst scaled" "$out/racecheck-bn-v21.txt"
echo "total $((SECONDS - start)) s"
