#!/usr/bin/env bash
# The full GPU check of the copied tree in one device call, after a quick gate: the GPU tests
# of a change not yet committed (pytest -k expression in CHECK_GATE, of tests/test_batch_norm.py)
# run first; where they fail, the tree's uncommitted changes under cunorm/, kernels/ and
# tests/ are put back to HEAD's (the device's copy only) and the check measures HEAD's
# sources instead, so the call still yields a record. The forty-fifth session made it when
# machines came rarely (each refused start cost 90 s of the session's 30 device minutes):
# one call does what a gate call and a check call did.
#
#     CHECK_GATE="grid_only or grid_exchange" bash benchmarks/device_check.sh
#
# Results under $OUT (or ./check-out): gate.txt, c.log, c/gpu-latest.json (commit it as
# benchmarks/results/gpu-latest.json where its digest is the committed sources').
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-check-out}"
mkdir -p "$out"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
start=$SECONDS
if [ -n "${CHECK_GATE:-}" ]; then
    timeout 120 python3 -m pytest -q -p no:xdist -p no:cacheprovider tests/test_batch_norm.py -m gpu \
        -k "$CHECK_GATE" > "$out/gate.txt" 2>&1
    rc=$?
    echo "gate (rc $rc, $((SECONDS - start)) s): $(tail -1 "$out/gate.txt")"
    if [ $rc -ne 0 ]; then
        grep -E "^(FAILED|ERROR)" "$out/gate.txt" | head -5
        git checkout HEAD -- cunorm kernels tests && echo "gate failed: checking HEAD's sources"
    fi
fi
python3 -c "import cunorm.gpucheck as g; print('digest', g.source_digest()[:12])"
timeout $((590 - (SECONDS - start))) python3 -m cunorm.gpucheck --out "$out/c" --sanitizer memcheck,racecheck \
    --sanitizer-timeout 330 > "$out/c.log" 2>&1
echo "check rc $? ($((SECONDS - start)) s)"
grep -E "passed|failed" "$out/c.log" | tail -3
tail -45 "$out/c.log"
