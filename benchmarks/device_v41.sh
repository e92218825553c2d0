#!/usr/bin/env bash
# BatchNorm v41's GPU tests and sweep in one device call (forty-fifth session): v38, v39 and
# v41's patches applied to the device's copy, the channels-last staged and grid GPU tests
# (float32's staged backward now among them), then the sweep at NHWC shapes against v41 undone.
# Results under $OUT (or ./v41-out).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-v41-out}"
mkdir -p "$out"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
for p in bn-v38-grid-only-refused-passes bn-v39-cl-grid-fold-spread bn-v41-cl-fp32-bwd-grid-only-rounds; do
    git apply "benchmarks/experiments/$p.patch" || echo "NOT applied $p"
done
python3 -c "import cunorm.gpucheck as g; print('digest', g.source_digest()[:12])"
BN_SWEEP_SHAPES=32x256x56x56,64x256x28x28,64x1024x14x14,256x2048x7x7 BN_SWEEP_LAYOUTS=nhwc BN_SWEEP_FUSED=1 \
    timeout 120 python3 benchmarks/sweep_bn_variants.py --variants default,v41_off,v41_fp32_bwd_alone \
    --json "$out/sweep-v41.json" > "$out/sweep-v41.txt" 2>&1
echo "sweep rc $?"; sed -n '/^case |/,$p' "$out/sweep-v41.txt"
timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_batch_norm.py -m gpu \
    -k "staged_cl or grid or scratch_lists" > "$out/tests-v41.txt" 2>&1
echo "tests rc $?"; tail -1 "$out/tests-v41.txt"; grep -E "^(FAILED|ERROR)" "$out/tests-v41.txt" | head -8
