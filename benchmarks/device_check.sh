#!/usr/bin/env bash
# The full GPU check in one device call, after a gate: parked patches (CHECK_PATCHES, names under
# benchmarks/experiments/, each made over the ones before it) applied to the device's copy in
# order, then one pytest run of their GPU tests (CHECK_GATE, a -k expression over
# tests/test_batch_norm.py -m gpu). Where the gate fails, the last patch is taken back and the
# gate runs again, until it passes or none is left; the check then measures the sources as they
# stand (its digest says which: the patches kept are printed). The forty-fifth session made it
# when machines came rarely (each refused start cost 90 s of the session's 30 device minutes):
# one call does what a gate call and a check call did.
#
#     CHECK_PATCHES="bn-v41-cl-fp32-bwd-grid-only-rounds" \
#         CHECK_GATE="grid_only or grid_fold or staged_cl" bash benchmarks/device_check.sh
#
# Time: on an H200 the tests and tools take ~360 s and the benchmark ~160 s (the forty-sixth
# session: 422 s without a gate); a gate of ~50 tests adds ~80 s and then the benchmark may not
# fit: a second call runs `python3 -m cunorm.gpucheck --tests-from` the first's record.
# On an H100 (the forty-seventh session) the call took 519 s and racecheck, beside the tests,
# ran past its 330 s (recorded as not run); alone on the same sources it took 300 s:
#     python3 -m cunorm.gpucheck --out $OUT/r --no-tests --no-bench --sanitizer racecheck \
#         --sanitizer-timeout 570
# and its entry replaces the first record's (with its own date):
#     python3 benchmarks/merge_sanitizer_record.py FIRST/gpu-latest.json SECOND/gpu-latest.json OUT.json
#
# Results under $OUT (or ./check-out): gate-N.txt, c.log, c/gpu-latest.json (commit it as
# benchmarks/results/gpu-latest.json with the same patches applied on main).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-check-out}"
mkdir -p "$out"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
start=$SECONDS
kept=()
for name in ${CHECK_PATCHES:-}; do
    if git apply "benchmarks/experiments/$name.patch" 2> "$out/apply-$name.txt"; then
        kept+=("$name")
    else
        echo "NOT applied $name: $(head -2 "$out/apply-$name.txt")"
    fi
done
round=0
while [ -n "${CHECK_GATE:-}" ] && [ ${#kept[@]} -gt 0 ]; do
    round=$((round + 1))
    timeout 200 python3 -m pytest -q -p no:xdist -p no:cacheprovider tests/test_batch_norm.py -m gpu \
        -k "$CHECK_GATE" > "$out/gate-$round.txt" 2>&1
    rc=$?
    echo "gate $round with ${kept[*]} (rc $rc, $((SECONDS - start)) s): $(tail -1 "$out/gate-$round.txt")"
    [ $rc -eq 0 ] && break
    grep -E "^(FAILED|ERROR)" "$out/gate-$round.txt" | head -5
    last="${kept[-1]}"
    git apply -R "benchmarks/experiments/$last.patch" && echo "took back $last"
    unset 'kept[-1]'
done
echo "kept: ${kept[*]:-none}"
python3 -c "import cunorm.gpucheck as g; print('digest', g.source_digest()[:12])"
# the tools' timeout: 420 s (gpucheck's default is 330): on an H100 racecheck beside the tests
# ran past 330 s once and finished inside it once (the forty-seventh session), and took 374 s
# in the fifty-sixth (its rows in two clusters); the benchmark after it took ~145 s there,
# so 420 + 145 stays under the call's 590 without a gate
# CHECK_SANITIZERS: the tools (memcheck,racecheck unless given; memcheck alone where an earlier
# call of the same sources ran racecheck alone, its record merged after with
# benchmarks/merge_sanitizer_record.py)
# CHECK_TOOLS_ONLY=1: the tools alone (no tests, no benchmark), up to 570 s: the second call
# of a check whose first ran CHECK_SANITIZERS=memcheck, e.g.
#     CHECK_PATCHES="..." CHECK_SANITIZERS=racecheck CHECK_TOOLS_ONLY=1 OUT=$OUT/r bash benchmarks/device_check.sh
# then benchmarks/merge_sanitizer_record.py joins $OUT/r/c/gpu-latest.json into the first record
only=() tools_s=420
[ -n "${CHECK_TOOLS_ONLY:-}" ] && only=(--no-tests --no-bench) tools_s=570
timeout $((590 - (SECONDS - start))) python3 -m cunorm.gpucheck --out "$out/c" "${only[@]}" \
    --sanitizer "${CHECK_SANITIZERS:-memcheck,racecheck}" \
    --sanitizer-timeout "${CHECK_SANITIZER_TIMEOUT:-$tools_s}" > "$out/c.log" 2>&1
echo "check rc $? ($((SECONDS - start)) s)"
grep -E "passed|failed" "$out/c.log" | tail -3
tail -45 "$out/c.log"
