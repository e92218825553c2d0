#!/usr/bin/env bash
# BatchNorm v21 + v22 (and v23 where its patch is applied too) on the GPU, in two device
# calls of under ten minutes each (NOTES "BatchNorm v21 + v22", "BatchNorm v23"):
#
#     bash benchmarks/device_bn_v21.sh tests    # the BatchNorm GPU tests (~3-5 minutes fresh)
#     bash benchmarks/device_bn_v21.sh sweeps   # v21's, v22's (and v23's) sweeps, racecheck
#
# Results under $OUT (or ./bn-v21-out); a short summary last.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bn-v21-out}"
mkdir -p "$out"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
sweep() {  # name shapes layouts variants seconds
    BN_SWEEP_SHAPES="$2" BN_SWEEP_LAYOUTS="$3" timeout "$5" python3 benchmarks/sweep_bn_variants.py \
        --variants "$4" --json "$out/sweep-$1.json" > "$out/sweep-$1.txt" 2>&1
    echo "== $1 (fwd / bwd of copy)"; sed -n '/^case |/,$p' "$out/sweep-$1.txt"; tail -2 "$out/sweep-$1.txt"
}

case "${1:-}" in
tests)
    timeout 520 python3 -m pytest -q -p no:cacheprovider tests/test_batch_norm.py -k gpu > "$out/tests.txt" 2>&1
    echo "tests rc=$?" >> "$out/tests.txt"
    grep -E "FAILED|ERROR" "$out/tests.txt" | head -20
    tail -3 "$out/tests.txt"
    ;;
sweeps)
    sweep v21 64x1024x14x14,256x2048x7x7 nhwc default,staged_cl_off,staged_cl_resident_1,staged_cl_spans_32 170
    sweep v22 32x256x56x56,64x1024x14x14 nchw default,staged_narrow_loads 90
    if grep -q CUNORM_BN_CL_RING kernels/batch_norm.cu; then
        sweep v23 32x256x56x56,128x64x112x112 nchw,nhwc default,cl_ring_4,cl_ring_off 150
    fi
    timeout 150 compute-sanitizer --tool racecheck python3 benchmarks/sanitize_bn_staged_cl.py > "$out/racecheck.txt" 2>&1
    echo "== racecheck"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|worst scaled" "$out/racecheck.txt"
    ;;
*)
    echo "usage: bash benchmarks/device_bn_v21.sh tests|sweeps" >&2
    exit 2
    ;;
esac
