#!/usr/bin/env bash
# The parked patches (benchmarks/experiments/INDEX.md, "Waiting for a GPU") measured in one
# device call of under ten minutes: each applied to the copied tree (the device's copy only;
# nothing here commits), then its GPU tests and its sweep. Per-step timeouts keep the whole
# under 590 s; a step that runs out says so in its log and the rest go on. (The thirty-sixth
# session ran v21-v23 and v110 this way, the thirty-ninth v24, v25 and v111; v24 and v25 are on
# main since the fortieth, so their steps now apply nothing.)
#
#     bash benchmarks/device_parked.sh [STEP...]   # results under $OUT (or ./parked-out)
#
# Steps (default: prof rounds4; v31, v33, v36 and v35 are on main since the forty-second to forty-fourth
# sessions; replay43, mixed, crash and eager chased the pytest worker crash, found in the
# forty-fourth, NOTES "The pytest worker crash"): replay43 (no patch: the forty-third session's crashing worker's 171 tests, in
# their order, in one process, ~1-2 min), mixed (eight processes of
# benchmarks/probe_bn_coop_crash.py cycling the crashing test's launch settings, ~1 min),
# crash (no patch: the pytest worker crash, NOTES "The pytest worker crash": the
# BatchNorm test file under 8 workers with MALLOC_CHECK_=3 MALLOC_PERTURB_=165, up to four
# rounds, each crashing worker's tests listed in order, then the first list replayed in one
# process, ~2-4 min), eager (the same with CUDA_MODULE_LOADING=EAGER), v38 (on main since the forty-sixth session, no patch:
# a refused grid-only stage runs the passes; its GPU tests, ~1 min), v41 (experiments/bn-v41-cl-fp32-bwd-grid-only-rounds.patch,
# lost on the H200: its sweep and the channels-last GPU tests, ~1 min), v42 (on main since the forty-seventh session, no patch:
# the channels-last stages' direct stores, lean apply loops and row-stepped copies swept against them off, and their GPU tests, ~1-2 min), v35 (on main since the forty-fourth session, no patch: the
# channels-last stages over 16-128 blocks meeting in global memory; the whole BatchNorm test
# file three times under 8 workers, then its NHWC sweep against the passes, ~4 min), fill
# (no patch: v30's pieces filling the block against the fewest, NCHW, ~1 min), v31 (experiments/bn-v31-staged-dz-written-back.patch: the staged
# backwards' first walk writes dz over the staged dy, the second reads it back: the residual
# read once; its GPU test and the staged / span backward tests, both sanitizers over the span
# cases, the sweep at NCHW 7 x 7 / 14 x 14 / 28 x 28 / 56 x 56 with residual + ReLU timed,
# ~2-3 min), v33 (experiments/bn-v33-span-forward-pieces.patch: the span forward in pieces; its
# GPU tests, the sweep at NCHW 56 x 56 / 28 x 28 / 7 x 7 against v33's build with M fixed at 1
# and v32's span_all_words, ~2 min), prof (ncu's warp stalls of six BatchNorm kernels issue 5 still misses with, ~2 min), dram (ncu: the DRAM bytes of each kernel of the passes, the L2 as the kernel before left it, ~1-2 min), v47 (on main since the forty-eighth session with v46, no patch: the grid fallback rounds' sweep and the channels-last GPU tests, ~2 min), v112 (on main since the forty-ninth session as v112b, no patch: float32 LayerNorm cluster rows in one pass, its sweep and the cluster path's GPU tests, ~2 min), v113 (on main since the fiftieth session, no patch: rows far from their pivot re-pivoted; its tests, the outlier probe, its sweep, ~3 min), bnpivot (no patch: BatchNorm channels with an outlier first element, the probe, ~30 s), l2probe (no patch: probe_l2_retention.py, then bn_l2_reuse.py and split_l2_reuse.py, ~2 min), v58 (lost in the fifty-sixth session: experiments/l2-hints-v58-v118.patch's BatchNorm hunks: the channels-last BatchNorm apply passes' evict-first copies and streaming stores; tests, NHWC sweep against the hints off, ~3 min), v118 (on main since the fifty-sixth session, no patch: the split row forward's apply loading and storing with .cs; tests, sweep at 524288 / 1M against loads alone and off, ~3 min), shapes (no patch: sweep_cluster_shapes.py, committed / blocks512 / blocks512_slots, ~2 min), waves (no patch: probe_cluster_waves.py, does the persistent cluster forward run every counted cluster at once; main's tiles, then float32 in clusters of nine, ~1-2 min), bwaves (no patch: probe_cluster_waves.py --backward, the same for the persistent cluster backward: bf16 65536's wide clusters and rows in clusters of 9, 12 and 16, ~1-2 min), bnshare (no patch: probe_bn_sm_share.py, BatchNorm's passes planned on 60-100% of the SMs, ~2 min), v122 (on main since the sixty-second session, no patch: the persistent cluster backward's grid at a share of the SMs, bf16 clusters of four; the sweep of main's share against the count and six other shares, ~4-5 min), bwaves2 (no patch: probe_cluster_waves.py --more, backward and forward, twice: the benchmark's persistent rows of 16384-131072 with 1 .. the count + 1 units, ~2-3 min), v121 (experiments/v121-cluster-fwd-eight-param-slots.patch over v120's: LayerNorm's portable clusters of eight with w + b in slots, float32 and half precision with float32 w + b; tests, racecheck, sweep against v120, ~2-3 min), v120 (experiments/v120-cluster-fwd-nonportable-half.patch: half-precision LayerNorm / RMSNorm and float32 RMSNorm forward rows of 131073-262144 in v119's sixteen-block clusters with their parameters in slots; tests, racecheck, sweep, ~6-7 min), racecost (no patch: benchmarks/probe_racecheck_cost.py under racecheck, each call of the sanitizer's slowest row cases timed alone, ~3-4 min), v119 (on main since the fifty-seventh session, no patch: float32 LayerNorm forward rows of 131073-262144 in non-portable clusters of sixteen 512-thread blocks with w + b in slots; tests, racecheck, sweep, ~3 min), v53 (on main since the fiftieth session, no patch: its outlier tests, the probe, the sweep against the kernels before it, the BatchNorm GPU tests, ~2 min), v54 (on main since the fifty-first session, no patch: the stages' far vote at their constants' barrier; tests and sweep, ~2 min), v55 (on main since the fifty-first session, no patch: the channels-last sums passes' block totals spread over the threads; its tests, racecheck, NHWC sweep, ~2 min), applyflight (no patch: probe_bn_bench_vs_sweep.py, then the NHWC sweep of the apply passes' 64 bytes in flight, ~2-3 min), v56 (its patch: the channels-last apply passes through cp.async rings; racecheck, the NHWC sweep with residual + ReLU, ~2-3 min; V56_TESTS=1 adds their GPU tests, V56_VARIANTS the sweep's variants), v57 (its patch over v56's: the channels-last passes' finalize and apply launched early, forward and backward; tests, graph replay, sweep, ~2-3 min), v114 (its patch: half-precision LayerNorm / RMSNorm rows past 262144 in long cluster tiles; tests, racecheck, the sweep against the split path, ~3-4 min), v115 (on main since the fifty-third session, no patch: the half-precision backward of rows of 131073-262144 in non-portable clusters of 9-16 wide blocks; tests, racecheck, the sweep against the grid rows, ~3 min), race117 (on main since the fifty-fifth session, no patch: the sanitizer's whole racecheck run naming each case as it starts, then racecheck of float32 and bf16 rows of 150000 in the clusters of ten alone, ~8-10 min), v116 (on main since the fifty-fourth session, no patch: those clusters' collect loop four ranks at a time; tests, racecheck, the sweep against the whole unroll, ~3-4 min), v117 (on main since the fifty-fourth session, no patch: float32 rows of 131073-262144 in non-portable clusters of v93's 16384-column blocks; tests, the sweep against the grid rows, ~2 min), v48 (on main since the forty-eighth session, no patch: the channels-last forward's sums as its copies land, its sweep and tests, ~2 min), v49 (no patch: the channel-major passes' grids against one wave, probe_bn_passes_112.py, ~1-2 min), v50 (on main since the forty-ninth session as v52, channel-major, no patch: the training forward's passes in one cooperative launch; its tests, both sanitizers over its cases, the 112 x 112 sweep, ~3-4 min; v51 lost, NOTES "BatchNorm v52"),
# v32 (probe, no patch: the span kernels for whole-word NCHW planes,
# STAGED_MIN_WORD 16 / 32 as sweep variants, its GPU test, ~1-2 min), v30 (on main since the forty-first session, no patch: bn_bwd_staged_span
# walking a one-channel plane in pieces, float32 56 x 56 through it, the pieces that fill a
# block; the span GPU tests, racecheck and memcheck of the span cases, the sweep at NCHW 56 x
# 56 and 28 x 28 with the residual + ReLU calls timed, ~1 min on a warm H200), v111 (its patch, FP8 fused tests, float_sums / mma_sums sweep, ~3
# min), p8b (its patch, sweep main / p8 / p8b, then racecheck of p8b, ~8 min), stagedcl (the
# GPU test a6960f4 fixed, test_gpu_staged_cl_forward_and_backward, no patch, ~1 min), clwaves
# (benchmarks/probe_bn_staged_cl_waves.py: the staged channels-last BatchNorm's waves, ~1-2
# min, no patch), v24 (on main: the staged channels-last GPU tests, the probe in both
# exchanges, ~4-5 min; its sanitizer runs are the full check's), v25 (on main: the span-word
# forward's and backward's GPU tests, racecheck and memcheck of their cunorm._sanitize cases, the sweep
# at NCHW short planes against v25b's filled grids and the passes: measured twice, ~1 min on an
# H200), v27 (experiments/bn-v26-span-fwd-defaults.patch, then bn-v27-span-fwd-lean-apply.patch:
# the span forward's y stored straight out for float32 alone, one group of copies, its apply
# loop without the residual's loads where none is given, half precision's mean folded; the
# span tests, both sanitizers over the span cases, the sweep against v25's forward, v26's
# defaults alone, direct stores for every dtype and in word order, ~2-3 min). Patches of the
# steps asked for are applied together before any step runs (v26, v27, v111, p8b in that
# order). v28 (experiments/bn-v28-span-wide-backward.patch, a planner flag: bf16 56 x 56 NCHW
# backward through bn_bwd_staged_span's clusters; its GPU test, the sweep at two such shapes
# with and without the flag, ~1-2 min). v29 (experiments/bn-v29-residual-l2-prefetch.patch, over
# v26's and v27's: the staged forwards prefetch the residual's share into L2; staged forward GPU
# tests, then the bench's shapes with the residual + ReLU calls timed, with and without, ~2-3 min).
#
# Land what wins on main afterwards, then run the full GPU check on main's sources as they
# then are.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-parked-out}"
mkdir -p "$out"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
start=$SECONDS

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(prof rounds4)
declare -A patch_of=([v111]=v111-fp8-tensor-core-sums [p8b]=p8b-wide-push-row-barrier [v26]=bn-v26-span-fwd-defaults
                     [v27]=bn-v27-span-fwd-lean-apply [v28]=bn-v28-span-wide-backward
                     [v29]=bn-v29-residual-l2-prefetch [v41]=bn-v41-cl-fp32-bwd-grid-only-rounds
                     [v57]=bn-v57-early-launches [v114]=v114-long-cluster-fwd [v58]=l2-hints-v58-v118
                     [v120]=v120-cluster-fwd-nonportable-half [v121]=v121-cluster-fwd-eight-param-slots)
# v27 is made over v26, v29 over both: asking for one applies what it is made over (its steps
# run only where asked); v41 is made over main since v38 and v39 landed; v46-v48 are on main
# since the forty-eighth session, v50 (as v52, channel-major) and v112b since the forty-ninth
# (their steps apply nothing; v51 lost, its step is gone)
apply=("${steps[@]}")
[[ " ${apply[*]} " == *" v29 "* ]] && apply+=(v27)
[[ " ${apply[*]} " == *" v27 "* ]] && apply+=(v26)
[[ " ${apply[*]} " == *" v121 "* ]] && apply+=(v120)  # v121 is made over v120
# v118 is on main since the fifty-sixth session, v119 since the fifty-seventh, v122 since the
# sixty-second (its step applies nothing); v58 (lost in the
# fifty-sixth) applies its patch's BatchNorm hunks alone (below; stale since the fold landed)
for name in v26 v27 v29 v28 v41 v111 p8b v57 v114 v58 v120 v121; do  # in this order, whatever the order asked
    [[ " ${apply[*]} " == *" $name "* ]] || continue
    patch="${patch_of[$name]}"
    only=()
    [ "$name" = v58 ] && only=(--include=kernels/batch_norm.cu --include=kernels/common.cuh --include=benchmarks/sweep_bn_variants.py)
    if git apply "${only[@]}" "benchmarks/experiments/$patch.patch" 2> "$out/apply-$patch.txt"; then
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
tests_step() {  # name seconds pytest-args...: a pytest step, then its count line and first failures
    local name="$1" limit="$2"
    shift 2
    step "$name" "$limit" python3 -m pytest -q -p no:cacheprovider "$@"
    tail -1 "$out/$name.txt"; grep -E "^FAILED" "$out/$name.txt" | head -5
}
left() { echo $((${PARKED_BUDGET:-585} - (SECONDS - start))); }  # what the call has left (PARKED_BUDGET s, default 585), capped per step below
cap() { local l; l=$(left); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }

# bn_fwd_staged_span's cunorm._sanitize cases alone
v25_cases="import cupy; from cunorm import _sanitize; _sanitize.staged_span_calls(cupy.random.default_rng(0)); \
cupy.cuda.runtime.deviceSynchronize(); print('v25 sanitizer cases done')"

# racecheck of 9 rows of N (DTYPE, a Python expression: bf16 unless given), LayerNorm and
# RMSNorm forward and backward (the wide clusters past eight blocks take rows of
# 131073-262144), within LIMIT s (90 unless given), after PRELUDE (Python, none unless
# given), log NAME-race
wide_race() {
    local name="$1" n="$2" dtype="${3:-ml_dtypes.bfloat16}" limit="${4:-90}" prelude="${5:-pass}"
    step "$name-race" "$(cap "$limit")" compute-sanitizer --tool racecheck --error-exitcode 9 python3 -c \
"import cupy, numpy, ml_dtypes, cunorm; $prelude; g = cupy.random.default_rng(0); \
x, dy = (g.standard_normal((9, $n), dtype=numpy.float32).astype($dtype) for _ in range(2)); \
w = cupy.ones($n, $dtype); _, m, r = cunorm.layer_norm(x, w, w, return_stats=True); \
cunorm.layer_norm_backward(dy, x, w, m, r); _, r = cunorm.rms_norm(x, w, return_stats=True); \
cunorm.rms_norm_backward(dy, x, w, r); cupy.cuda.runtime.deviceSynchronize(); print('$name race cases done')"
    tail -3 "$out/$name-race.txt"
}

# racecheck and memcheck of the two-phase cases (cunorm._sanitize.two_phase_calls: v50's
# forwards, with v51 their backwards), logs NAME-TOOL
two_phase_tools() {
    local name="$1" tool
    local cases="import cupy; from cunorm import _sanitize; _sanitize.two_phase_calls(cupy.random.default_rng(0)); \
cupy.cuda.runtime.deviceSynchronize(); print('two-phase sanitizer cases done')"
    for tool in racecheck memcheck; do
        step "$name-$tool" "$(cap 120)" compute-sanitizer --tool "$tool" python3 -c "$cases"
        tail -2 "$out/$name-$tool.txt"
    done
}

# racecheck and memcheck of the span cases (cunorm._sanitize.staged_span_calls), logs NAME-TOOL;
# PARKED_NO_TOOLS=1 leaves them to the full check
span_tools() {
    local name="$1" tool
    for tool in racecheck memcheck; do
        [ -n "${PARKED_NO_TOOLS:-}" ] && break
        step "$name-$tool" "$(cap 120)" compute-sanitizer --tool "$tool" python3 -c "$v25_cases"
        tail -2 "$out/$name-$tool.txt"
    done
}

# crash_rounds NAME VAR=VALUE...: the BatchNorm file under 8 workers with these variables set,
# up to four rounds, each crashing worker's tests listed in order ($out/NAME-order-R-gwN.txt,
# the last the test that crashed); then the first list replayed in one process
crash_rounds() {
    local name="$1" list="" round w
    shift
    for round in 1 2 3 4; do
        step "$name-tests-$round" "$(cap 60)" env "$@" python3 -m pytest -v -n 8 -p no:cacheprovider \
            tests/test_batch_norm.py
        tail -1 "$out/$name-tests-$round.txt"
        for w in $(grep -o "worker 'gw[0-9]*' crashed" "$out/$name-tests-$round.txt" | grep -o "gw[0-9]*"); do
            grep "^\[$w\] .*\(PASSED\|FAILED\|SKIPPED\|ERROR\) tests/" "$out/$name-tests-$round.txt" \
                | grep -o "tests/[^ ]*" > "$out/$name-order-$round-$w.txt"
            echo "   $w crashed after $(wc -l < "$out/$name-order-$round-$w.txt") tests"
            grep -m1 -A6 "Current thread" "$out/$name-tests-$round.txt"
            grep -m3 -i "malloc\|free()\|corrupt" "$out/$name-tests-$round.txt"
            [ -z "$list" ] && list="$out/$name-order-$round-$w.txt"
        done
    done
    if [ -n "$list" ]; then  # pytest runs node ids given on its command line in that order
        step "$name-replay" "$(cap 200)" env "$@" python3 -m pytest -q -p no:xdist -p no:cacheprovider $(cat "$list")
        tail -1 "$out/$name-replay.txt"; grep -m1 -A6 "Current thread" "$out/$name-replay.txt"
    fi
}

for name in "${steps[@]}"; do
    case "$name" in
    v111)  # the FP8 fused forward's tests, then the float sums against the tensor cores' (two rounds)
        tests_step v111-tests "$(cap 150)" tests/test_fused.py -k fp8
        step v111-sweep "$(cap 300)" python3 benchmarks/sweep_fused_variant.py --variants float_sums,mma_sums \
            --json "$out/sweep-v111.json"
        tail -15 "$out/v111-sweep.txt" ;;
    p8b)  # pushed warp sums with a row barrier: the sweep, then racecheck of p8b's build
        step p8b-sweep "$(cap 200)" python3 benchmarks/sweep_wide_push_p8b.py --json "$out/sweep-p8b.json"
        tail -15 "$out/p8b-sweep.txt"
        step p8b-racecheck "$(cap 330)" compute-sanitizer --tool racecheck python3 -c \
            "from cunorm import _compile; _compile.COMPILE_OPTIONS = ('-DCUNORM_WIDE_PUSH_SUMS=3',); from cunorm import _sanitize; _sanitize.run()"
        tail -8 "$out/p8b-racecheck.txt" ;;
    v24)  # BatchNorm v24: the staged channels-last GPU tests, then the waves probe in both exchanges
        tests_step v24-tests "$(cap 200)" tests/test_batch_norm.py -k "staged_cl"
        step v24-probe "$(cap 200)" python3 benchmarks/probe_bn_staged_cl_waves.py --json "$out/v24-probe.json"
        sed -n '/^case |/,$p' "$out/v24-probe.txt" ;;
    clwaves)  # do the channels-last staged BatchNorm kernels run in one wave? (probe, ~1-2 min)
        step clwaves "$(cap 200)" python3 benchmarks/probe_bn_staged_cl_waves.py --json "$out/clwaves.json"
        tail -20 "$out/clwaves.txt" ;;
    v25)  # BatchNorm v25: the span-word kernels' GPU tests, racecheck and memcheck of their
          # cunorm._sanitize cases alone, then the sweep at NCHW short planes
        tests_step v25-tests "$(cap 150)" tests/test_batch_norm.py -k "staged_span or span_word"
        for tool in racecheck memcheck; do
            step "v25-$tool" "$(cap 90)" compute-sanitizer --tool "$tool" python3 -c "$v25_cases"
            tail -2 "$out/v25-$tool.txt"
        done
        BN_SWEEP_SHAPES=256x2048x7x7,128x512x7x7,64x1024x7x7,256x256x9x9,32x512x11x11 BN_SWEEP_LAYOUTS=nchw \
            step v25-sweep "$(cap 200)" python3 benchmarks/sweep_bn_variants.py --variants default,staged_span_fill,staged_span_off \
            --json "$out/sweep-v25.json"
        sed -n '/^case |/,$p' "$out/v25-sweep.txt" ;;
    v26) ;;  # applied for v27 (its sweep runs there)
    v27)  # BatchNorm v26's defaults + v27: the span GPU tests, both sanitizers, then the sweep
        tests_step v26-tests "$(cap 150)" tests/test_batch_norm.py -k "staged_span or span_word"
        span_tools v26
        BN_SWEEP_SHAPES=256x2048x7x7,64x1024x7x7,256x256x9x9,32x512x11x11 BN_SWEEP_LAYOUTS=nchw \
            step v26-sweep "$(cap 240)" python3 benchmarks/sweep_bn_variants.py \
            --variants default,span_fwd_v25,span_fwd_not_lean,span_fwd_direct_all,span_fwd_direct_in_order \
            --json "$out/sweep-v26.json"
        sed -n '/^case |/,$p' "$out/v26-sweep.txt" ;;
    v29)  # BatchNorm v29: the residual asked of the L2: staged forwards' GPU tests with a residual, then the
          # bench's shapes with the residual + ReLU calls timed against the plain ones
        tests_step v29-tests "$(cap 150)" -n 8 tests/test_batch_norm.py -k "staged and (forward or activations)"
        BN_SWEEP_FUSED=1 step v29-sweep "$(cap 200)" python3 benchmarks/sweep_bn_variants.py \
            --variants default,no_residual_prefetch --json "$out/sweep-v29.json"
        sed -n '/^case |/,$p' "$out/v29-sweep.txt" ;;
    v28)  # BatchNorm v28 (probe): bf16 56 x 56 backward through the span backward's clusters
        tests_step v28-tests "$(cap 120)" tests/test_batch_norm.py -k "span_wide_backward"
        BN_SWEEP_SHAPES=32x256x56x56,16x512x56x56 BN_SWEEP_LAYOUTS=nchw \
            step v28-sweep "$(cap 150)" python3 benchmarks/sweep_bn_variants.py --variants default,span_wide_bwd \
            --json "$out/sweep-v28.json"
        sed -n '/^case |/,$p' "$out/v28-sweep.txt" ;;
    v30)  # BatchNorm v30: the span backward's pieces: span GPU tests, both sanitizers over the span cases
          # (v30's two among them), then the sweep with the residual + ReLU calls timed
        tests_step v30-tests "$(cap 150)" -n 4 tests/test_batch_norm.py -k "span"
        span_tools v30
        BN_SWEEP_SHAPES=32x256x56x56,16x512x56x56,64x128x28x28 BN_SWEEP_LAYOUTS=nchw BN_SWEEP_FUSED=1 \
            step v30-sweep "$(cap 200)" python3 benchmarks/sweep_bn_variants.py \
            --variants default,span_v28 --json "$out/sweep-v30.json"
        sed -n '/^case |/,$p' "$out/v30-sweep.txt" ;;
    v31)  # BatchNorm v31: dz written back over the staged dy: its tests, both sanitizers, the fused sweep
        tests_step v31-tests "$(cap 200)" -n 8 tests/test_batch_norm.py -k "staged"
        span_tools v31
        BN_SWEEP_SHAPES=256x2048x7x7,64x1024x14x14,64x128x28x28,32x256x56x56 BN_SWEEP_LAYOUTS=nchw BN_SWEEP_FUSED=1 \
            step v31-sweep "$(cap 200)" python3 benchmarks/sweep_bn_variants.py \
            --variants default,staged_dz_recompute --json "$out/sweep-v31.json"
        sed -n '/^case |/,$p' "$out/v31-sweep.txt" ;;
    v33)  # BatchNorm v33: the span forward in pieces: its GPU tests, then the sweep
        tests_step v33-tests "$(cap 150)" -n 8 tests/test_batch_norm.py -k "span"
        BN_SWEEP_SHAPES=32x256x56x56,16x512x56x56,64x128x28x28,256x2048x7x7 BN_SWEEP_LAYOUTS=nchw BN_SWEEP_FUSED=1 \
            step v33-sweep "$(cap 200)" python3 benchmarks/sweep_bn_variants.py \
            --variants default,span_fwd_no_pieces,span_all_words,span_fwd_pieces,span_fwd_only_pieces \
            --json "$out/sweep-v33.json"
        sed -n '/^case |/,$p' "$out/v33-sweep.txt" ;;
    v47)  # (on main since the forty-eighth session with v46, no patch): grid-only stages in up to four rounds where nothing else fits in two (the
        # passes before), swept against it off (twice) and v46's order off, at the NHWC shapes it
        # replans (float32 56 x 56 forward, bf16 56 x 56 backward) and the ones it should leave
        # alone; then its GPU tests and the channels-last ones, ~2 min
        BN_SWEEP_SHAPES=32x256x56x56,64x256x28x28,64x1024x14x14,256x2048x7x7,128x256x14x14 BN_SWEEP_LAYOUTS=nhwc \
            BN_SWEEP_FUSED=1 step v47-sweep "$(cap 200)" python3 benchmarks/sweep_bn_variants.py \
            --variants default,cl_fallback_off,cl_clusters_first,default_again,cl_fallback_off_again \
            --json "$out/sweep-v47.json"
        sed -n '/^case |/,$p' "$out/v47-sweep.txt"
        tests_step v47-tests "$(cap 200)" -n 8 tests/test_batch_norm.py -m gpu -k "staged_cl or grid or cl_" ;;
    v113)  # (on main since the fiftieth session, no patch): LayerNorm rows whose
        # pivot lies far from their mean taken again about pivot + mu; its tests with the
        # cluster and shared-memory rows' and the fused outlier cases, the probe (every forward
        # path, three dtypes: FAIL lines counted), the sweep against -DCUNORM_REPIVOT=0, ~3 min
        tests_step v113-tests "$(cap 150)" -n 8 tests/test_outlier_pivot.py tests/test_cluster_path.py \
            tests/test_smem_row_path.py tests/test_layer_norm.py -m gpu
        step v113-probe "$(cap 40)" python3 benchmarks/probe_outlier_pivot.py
        echo "probe FAIL lines: $(grep -c FAIL "$out/v113-probe.txt")"
        step v113-sweep "$(cap 200)" python3 benchmarks/sweep_repivot.py --json "$out/sweep-v113.json"
        tail -13 "$out/v113-sweep.txt" ;;
    v53)  # (no patch: on main's tree) BatchNorm's passes summing their statistics in double,
        # the staged kernels re-pivoting far channels: the outlier-pivot tests, the probe, the
        # sweep of the bench's shapes against the kernels before v53 (default plans and every
        # forward through the passes), then the BatchNorm file's GPU tests, ~3 min
        tests_step v53-outlier "$(cap 120)" -n 8 tests/test_batch_norm.py -m gpu -k outlier_pivot
        step v53-probe "$(cap 60)" python3 benchmarks/probe_bn_outlier_pivot.py
        echo "bn probe FAIL lines: $(grep -c FAIL "$out/v53-probe.txt") of $(grep -c "nchw\|nhwc" "$out/v53-probe.txt")"
        step v53-sweep "$(cap 260)" python3 benchmarks/sweep_bn_variants.py --json "$out/sweep-v53.json" \
            --variants default,bn_before_v53,passes_forward_all,passes_forward_all_before_v53,default_again
        tail -40 "$out/v53-sweep.txt"
        tests_step v53-tests "$(cap 200)" -n 8 tests/test_batch_norm.py -m gpu ;;
    v55)  # on main since the fifty-first session (no patch; NOTES "BatchNorm v55 outcome"): the
        # channels-last and outlier GPU tests, racecheck of the channels-last passes (the
        # statistics pass's ring reused for its sums, the block totals spread over the
        # threads), the NHWC sweep against the totals by row 0's threads, ~2 min
        tests_step v55-tests "$(cap 120)" -n 8 tests/test_batch_norm.py -m gpu -k "cl or nhwc or outlier or passes"
        local_case="import cupy, numpy, cunorm; from cunorm._checks import BFLOAT16; from cunorm.ops import _batch_norm as b
b.USE_STAGED_CL = False; b.USE_STAGED_CL_BWD = False; b.USE_TWO_PHASE = False
for dt, C in ((BFLOAT16, 64), (numpy.float32, 24), (numpy.float16, 7)):
    x = cupy.asarray(numpy.random.default_rng(0).standard_normal((3, 33, 35, C)).astype(dt))
    y, mean, rstd = cunorm.batch_norm(x, training=True, channel_axis=-1, return_stats=True)
    cunorm.batch_norm_backward(y, x, None, None, mean, rstd, channel_axis=-1)
cupy.cuda.runtime.deviceSynchronize(); print('v55 racecheck cases done')"
        step v55-racecheck "$(cap 90)" compute-sanitizer --tool racecheck python3 -c "$local_case"
        tail -2 "$out/v55-racecheck.txt"
        BN_SWEEP_LAYOUTS=nhwc step v55-sweep "$(cap 200)" python3 benchmarks/sweep_bn_variants.py --json "$out/sweep-v55.json" \
            --variants default,rows_by_row_0,default_again
        tail -14 "$out/v55-sweep.txt" ;;
    applyflight)  # no patch: why the check's benchmark read bf16 NHWC (128, 64, 112, 112)'s forward
        # at 0.568 where the sweep read 0.582 (probe_bn_bench_vs_sweep.py), then the NHWC sweep
        # of the apply passes' bytes in flight (64 against 32), ~2-3 min
        step applyflight-probe "$(cap 120)" python3 benchmarks/probe_bn_bench_vs_sweep.py
        grep -v -i warn "$out/applyflight-probe.txt" | tail -10
        BN_SWEEP_LAYOUTS=nhwc step applyflight-sweep "$(cap 200)" python3 benchmarks/sweep_bn_variants.py \
            --json "$out/sweep-applyflight.json" --variants default,apply_inflight_64,default_again
        tail -10 "$out/applyflight-sweep.txt" ;;
    v56)  # (on main since the fifty-third session, no patch) bn_apply_cl and bn_bwd_apply_cl through cp.async rings: the
        # channels-last apply and activation tests (V56_TESTS=1; the check runs them), racecheck of the NHWC passes, the
        # 112 x 112 NHWC sweep with the residual + ReLU calls against the register walk, ~3 min
        [ -n "${V56_TESTS:-}" ] && tests_step v56-tests "$(cap 90)" -n 8 tests/test_batch_norm.py -m gpu \
            -k "activations or apply_without_residual or chunked_walks or passes_outlier or own_grids or shapes_dtypes or half_channels_last_backward"
        step v56-race "$(cap 90)" compute-sanitizer --tool racecheck --error-exitcode 9 python3 -c \
            "import cupy, cunorm; from cunorm.ops import _batch_norm as b; b.USE_STAGED_CL = b.USE_STAGED_CL_BWD = False; \
x = cupy.random.default_rng(0).standard_normal((3, 5, 7, 64), dtype=cupy.float32).astype(cupy.float16); \
r = cupy.ones_like(x); y, m, s = cunorm.batch_norm(x, training=True, channel_axis=-1, return_stats=True); \
cunorm.batch_norm_backward(y, x, None, None, m, s, channel_axis=-1); \
y, m, s = cunorm.batch_norm(x, training=True, channel_axis=-1, residual=r, activation='relu', return_stats=True); \
cunorm.batch_norm_backward(y, x, None, None, m, s, channel_axis=-1, residual=r, activation='relu'); \
cupy.cuda.runtime.deviceSynchronize(); print('v56 race cases done')"
        tail -3 "$out/v56-race.txt"
        BN_SWEEP_LAYOUTS=nhwc BN_SWEEP_SHAPES=128x64x112x112,32x256x56x56 BN_SWEEP_FUSED=1 step v56-sweep "$(cap 200)" \
            python3 benchmarks/sweep_bn_variants.py --json "$out/sweep-v56.json" \
            --variants ${V56_VARIANTS:-default,before_v56,apply_cl_reg_walk,bwd_apply_cl_reg_walk,default_again}
        tail -18 "$out/v56-sweep.txt" ;;
    v114)  # (its patch, experiments/v114-long-cluster-fwd.patch) half-precision rows past
        # 262144 in clusters of 512-thread blocks at 128 values a thread (eight blocks to
        # 524288, sixteen non-portable to 1M): its GPU tests, racecheck of 9 rows of 600000,
        # the forward sweep against the split path, ~3-4 min
        tests_step v114-tests "$(cap 150)" -n 4 tests/test_cluster_path.py -m gpu \
            -k "long_cluster or one_pass_falls_back"
        step v114-race "$(cap 90)" compute-sanitizer --tool racecheck --error-exitcode 9 python3 -c \
"import cupy, numpy, ml_dtypes, cunorm; x = cupy.random.default_rng(0).standard_normal((9, 600000), dtype=numpy.float32); \
x = x.astype(ml_dtypes.bfloat16); cunorm.layer_norm(x); cunorm.rms_norm(x); cupy.cuda.runtime.deviceSynchronize(); \
print('v114 race cases done')"
        tail -3 "$out/v114-race.txt"
        step v114-sweep "$(cap 240)" python3 benchmarks/sweep_long_cluster_fwd.py --json "$out/sweep-v114.json" \
            ${V114_VARIANTS:+--variants "$V114_VARIANTS"}
        tail -16 "$out/v114-sweep.txt" ;;
    v116)  # (on main since the fifty-fourth session, no patch) the non-portable wide
        # clusters' collect loop four ranks at a time: their GPU tests (v100's and v115's),
        # racecheck of bf16 LayerNorm in sixteen blocks, the sweep against the whole unroll, ~3-4 min
        tests_step v116-tests "$(cap 150)" -n 4 tests/test_cluster_path.py -m gpu \
            -k "past_eight or without_nonportable"
        wide_race v116 262144
        step v116-sweep "$(cap 240)" python3 benchmarks/sweep_half_wide_cluster_nonportable.py \
            --json "$out/sweep-v116.json" --variants "${V116_VARIANTS:-clusters16,full_unroll}"
        tail -14 "$out/v116-sweep.txt" ;;
    v117)  # (on main since the fifty-fourth session, no patch) float32 rows of 131073-262144 in non-portable
        # clusters of 9-16 of v93's 16384-column blocks: their GPU tests, the sweep against
        # the grid rows, ~2 min
        tests_step v117-tests "$(cap 120)" -n 4 tests/test_cluster_path.py -m gpu -k "wide_blocks_past_eight and float32"
        step v117-sweep "$(cap 150)" python3 benchmarks/sweep_half_wide_cluster_nonportable.py \
            --json "$out/sweep-v117.json" --variants clusters16,f32_grid_rows
        tail -6 "$out/v117-sweep.txt" ;;
    race117)  # (on main since the fifty-fifth session, no patch: cunorm._sanitize prints each
        # case as it starts, with the seconds so far) the fifty-fourth session's check lost racecheck
        # past 380 s (and 315 s alone) once v117 sent float32 rows of 150000 through clusters
        # of ten 16384-column blocks: the sanitizer's whole run as the check runs it, its log
        # naming the case it was in, then racecheck of 9 such rows alone (float32, then bf16 in v115's
        # same clusters as the control, then float32 in v93's portable clusters of seven)
        # in what is left; PARKED_BUDGET=585, ~10 min
        # first the check's own racecheck run (a record with the sources' digest, mergeable
        # into the check's), its log naming each case and its seconds
        lim=$(cap 400)
        step race117-all "$lim" python3 -m cunorm.gpucheck --out "$out/race117-record" --no-tests --no-bench \
            --sanitizer racecheck --sanitizer-timeout "$((lim - 20))"
        tail -3 "$out/race117-all.txt"
        grep -E "^case |calls done|SUMMARY" "$out/race117-record/sanitizer-racecheck.txt" | tail -8
        # then, in what is left, the float32 rows alone, bf16's as the control, and v93's float32
        # tile (x staged, dy loaded) in a portable cluster of seven, as where the driver runs
        # no larger one: is it the tile or the cluster's size?
        wide_race race117-f32 150000 numpy.float32 120
        wide_race race117-bf16 150000 ml_dtypes.bfloat16 60
        wide_race race117-f32-portable 100000 numpy.float32 60 \
            "from cunorm.ops import _row_norm; _row_norm.allow_nonportable_clusters = lambda ptr: False" ;;
    v115)  # (on main since the fifty-third session, no patch) the half-precision backward of rows of 131073-262144 in non-portable clusters
        # of 9-16 wide blocks: its GPU tests, racecheck of 9 rows of 200000, the backward
        # sweep against the grid rows, ~3 min
        tests_step v115-tests "$(cap 150)" -n 4 tests/test_cluster_path.py -m gpu \
            -k "(wide_blocks_past_eight and not float32) or past_eight_wide or without_nonportable or past_the_wide_clusters"
        wide_race v115 200000
        step v115-sweep "$(cap 200)" python3 benchmarks/sweep_half_wide_cluster_nonportable.py \
            --json "$out/sweep-v115.json" ${V115_VARIANTS:+--variants "$V115_VARIANTS"}
        tail -10 "$out/v115-sweep.txt" ;;
    racecost)  # (no patch) racecheck's seconds per call in the
        # sanitizer's slowest row cases: float32 then bf16 rows of 150000 and 100000, 1 and 9
        # rows in at most two clusters, each call timed alone (benchmarks/probe_racecheck_cost.py), ~3-4 min
        step racecost "$(cap 240)" compute-sanitizer --tool racecheck --error-exitcode 9 \
            python3 benchmarks/probe_racecheck_cost.py
        tail -18 "$out/racecost.txt" ;;
    shapes)  # (no patch; v120 / v121's where asked with them) the cluster forward's shapes:
        # committed against 512-thread blocks from 16385 on, without and with every tile's
        # parameters in slots (sweep_cluster_shapes.py), ~2 min
        step shapes "$(cap 200)" python3 benchmarks/sweep_cluster_shapes.py \
            --variants committed,blocks512,blocks512_slots --json "$out/sweep-shapes.json"
        tail -18 "$out/shapes.txt" ;;
    waves)  # (no patch; v120's where asked with it) the persistent cluster forward timed with 1
        # .. the counted clusters + 1 in its grid: float32 LayerNorm / RMSNorm and bf16
        # LayerNorm at 147456, float32 LayerNorm 262144; its main tiles, then float32 in
        # clusters of nine (--fit), ~1-2 min (benchmarks/probe_cluster_waves.py)
        step waves "$(cap 90)" python3 benchmarks/probe_cluster_waves.py --json "$out/waves.json"
        step waves-fit "$(cap 90)" python3 benchmarks/probe_cluster_waves.py --fit --json "$out/waves-fit.json"
        tail -12 "$out/waves-fit.txt" ;;
    bwaves)  # (no patch) the persistent cluster backward timed with 1 .. the counted clusters + 1
        # in its grid: bf16 65536 (wide clusters), float32 / bf16 rows in clusters of 9, 12, 16
        # (benchmarks/probe_cluster_waves.py --backward), ~1-2 min
        step bwaves "$(cap 120)" python3 benchmarks/probe_cluster_waves.py --backward --json "$out/bwaves.json"
        tail -30 "$out/bwaves.txt" ;;
    bnshare)  # (no patch) BatchNorm's passes planned on a share of the SMs (1 .. 0.6), training
        # forward and backward at 56 x 56 and 112 x 112 in both layouts (probe_bn_sm_share.py), ~2 min
        step bnshare "$(cap 180)" python3 benchmarks/probe_bn_sm_share.py
        tail -40 "$out/bnshare.txt" ;;
    v122)  # (no patch: on main) the persistent cluster backward's grid at a share of the SMs:
        # main's 0.67 against the count and shares of 0.55-1.33 (18-44 clusters of four on 132
        # SMs), bf16 65536 and v109's 512-thread clusters (RMSNorm 32768, float32 weight), ~4-5 min
        step v122-sweep "$(cap 300)" python3 benchmarks/sweep_bwd_cluster_cap.py --json "$out/sweep-v122.json"
        tail -20 "$out/v122-sweep.txt" ;;
    bwaves2)  # (no patch) bwaves' sequel: the benchmark's persistent backwards of 16384-131072
        # (the single wide block a unit at 16384) and forwards of 65536-131072 timed with 1 ..
        # the count + 1 units, each read twice (probe_cluster_waves.py --more), ~2-3 min
        for round in 1 2; do
            step bwaves2-bwd-$round "$(cap 120)" python3 benchmarks/probe_cluster_waves.py --backward --more \
                --json "$out/bwaves2-bwd-$round.json"
            step bwaves2-fwd-$round "$(cap 60)" python3 benchmarks/probe_cluster_waves.py --more \
                --json "$out/bwaves2-fwd-$round.json"
        done
        tail -8 "$out/bwaves2-bwd-2.txt" ;;
    v121)  # (its patch, over v120's) LayerNorm's portable clusters of eight keep w + b in slots
        # (float32 rows, half-precision rows with float32 w + b in 512-thread blocks): its GPU
        # tests, racecheck of 9 float32 rows of 100000, the sweep against v120's tiles, ~2-3 min
        tests_step v121-tests "$(cap 150)" -n 4 -m gpu \
            -k "eight_blocks_with_slots or without_weight_slots or staged_rows or weight_slots" tests/test_cluster_path.py
        wide_race v121 100000 numpy.float32 90
        step v121-sweep "$(cap 200)" python3 benchmarks/sweep_cluster_fwd_param_slots.py --variants v121,v120 \
            --json "$out/sweep-v121.json"
        tail -18 "$out/v121-sweep.txt" ;;
    v120)  # (its patch) half-precision LayerNorm / RMSNorm and float32 RMSNorm forward rows of
        # 131073-262144 in v119's non-portable clusters of sixteen 512-thread blocks with their
        # parameters in slots: its GPU tests (the sixteen-block cases, the fallback, the
        # pipelined walk's mid-walk fallback), racecheck of 9 bf16 rows of 200000, then the
        # sweep (fit / sixteen / half_no_slots / rms32_unstaged / v119_only, two rounds), ~3-4 min
        tests_step v120-tests "$(cap 150)" -n 4 -m gpu \
            -k "sixteen or without_nonportable or pipelined_walk or weight_slots or staged_rows" \
            tests/test_cluster_path.py
        wide_race v120 200000 ml_dtypes.bfloat16 90
        step v120-sweep "$(cap 330)" python3 benchmarks/sweep_cluster_fwd_nonportable.py \
            --json "$out/sweep-v120.json" ${V120_VARIANTS:+--variants "$V120_VARIANTS"}
        tail -12 "$out/v120-sweep.txt" ;;
    v119)  # (on main, no patch) float32 LayerNorm forward rows of 131073-262144 in non-portable clusters
        # of sixteen 512-thread blocks with w + b in slots: its GPU tests and the float32
        # cluster forward's, racecheck of 9 float32 rows of 200000 (forward and backward), the
        # sweep against the same tile without slots and the portable 1024 x 8 tile, ~3 min
        tests_step v119-tests "$(cap 150)" -n 4 -m gpu -k float32 tests/test_cluster_path.py::test_cluster_path \
            tests/test_cluster_path.py::test_cluster_forward_sixteen_blocks_with_slots \
            tests/test_cluster_path.py::test_cluster_forward_without_nonportable_clusters \
            tests/test_cluster_path.py::test_cluster_forward_staged_rows \
            tests/test_cluster_path.py::test_cluster_forward_float32_one_pass_falls_back
        wide_race v119 200000 numpy.float32 120
        step v119-sweep "$(cap 200)" python3 benchmarks/sweep_cluster_fwd_nonportable.py \
            --json "$out/sweep-v119.json" ${V119_VARIANTS:+--variants "$V119_VARIANTS"}
        tail -8 "$out/v119-sweep.txt" ;;
    v118)  # (on main since the fifty-sixth session, no patch) the split forward's apply pass
        # (N past the clusters) loading x and storing y with .cs: the split path's GPU tests,
        # then the sweep at 524288 / 1M against loads alone and no hints, two rounds, ~3 min
        tests_step v118-tests "$(cap 120)" -n 4 tests/test_layer_norm.py tests/test_rms_norm.py \
            tests/test_outlier_pivot.py -m gpu -k "split_path"
        step v118-sweep "$(cap 240)" python3 benchmarks/sweep_split_l2_hints.py --json "$out/sweep-v118.json" \
            ${V118_VARIANTS:+--variants "$V118_VARIANTS"}
        tail -12 "$out/v118-sweep.txt" ;;
    v58)  # (its patch's BatchNorm hunks; lost in the fifty-sixth session) the channels-last apply passes' evict-first copies and streaming stores
        # (so the chunk tails the statistics / sums pass left in L2 stay until the apply reads
        # them): the channels-last GPU tests, then the NHWC sweep of the bench's four shapes
        # with residual + ReLU timed against the hints off, each twice, ~3 min
        tests_step v58-tests "$(cap 150)" -n 4 tests/test_batch_norm.py -m gpu -k "channels_last or nhwc or _cl"
        BN_SWEEP_LAYOUTS=nhwc BN_SWEEP_FUSED=1 step v58-sweep "$(cap 240)" \
            python3 benchmarks/sweep_bn_variants.py --json "$out/sweep-v58.json" \
            --variants ${V58_VARIANTS:-default,apply_l2_hints_off,default_again,apply_l2_hints_off_again}
        tail -12 "$out/v58-sweep.txt" ;;
    v57)  # (its patch; v56 is on main since the fifty-third session) the channels-last passes' finalize and
        # apply launched early (programmatic dependent launch): its GPU tests and torch's graph
        # replay of it, the NHWC 112 x 112 sweep against launch_early_off (main), each
        # twice (one reading of each lay within the run's drift), ~2-3 min
        tests_step v57-tests "$(cap 120)" -n 4 tests/test_batch_norm.py tests/test_torch_batch_norm.py -m gpu \
            -k "launched_early or early_launches or rings_match"
        BN_SWEEP_LAYOUTS=nhwc BN_SWEEP_SHAPES=128x64x112x112 BN_SWEEP_FUSED=1 step v57-sweep "$(cap 200)" \
            python3 benchmarks/sweep_bn_variants.py --json "$out/sweep-v57.json" \
            --variants ${V57_VARIANTS:-default,launch_early_off,default_again,launch_early_off_again}
        tail -10 "$out/v57-sweep.txt" ;;
    v54)  # on main since the fifty-first session (no patch; was experiments/bn-v54-folded-vote.patch): the span and
        # channels-last stages' far vote (v53) asked at the barrier that publishes their
        # constants: the outlier tests, the staged GPU tests, the sweep of the bench's shapes
        # against v53's own vote and the kernels before v53 (two rounds of the default), ~2-3 min
        tests_step v54-outlier "$(cap 60)" -n 8 tests/test_batch_norm.py -m gpu -k "outlier_pivot or span or staged_cl"
        step v54-sweep "$(cap 200)" python3 benchmarks/sweep_bn_variants.py --json "$out/sweep-v54.json" \
            --variants default,v53_own_vote,bn_before_v53,default_again
        tail -18 "$out/v54-sweep.txt" ;;
    l2probe)  # (no patch) how much of a buffer one kernel read the next finds in L2, by size,
        # order and with the second kernel writing (benchmarks/probe_l2_retention.py), then
        # the BatchNorm apply passes (bn_l2_reuse.py) and the split row forward's apply
        # (split_l2_reuse.py) timed with L2 flushed before them and not; ~2 min
        step l2probe "$(cap 60)" python3 benchmarks/probe_l2_retention.py --json "$out/l2-retention.json"
        tail -8 "$out/l2probe.txt"
        # as built (with v58 / v118 where their patch is applied too), then with their hints
        # off (defines unknown to main's kernels change nothing there)
        step bnl2 "$(cap 90)" python3 benchmarks/bn_l2_reuse.py
        tail -17 "$out/bnl2.txt"
        step splitl2 "$(cap 60)" python3 benchmarks/split_l2_reuse.py
        tail -9 "$out/splitl2.txt"
        if [ -n "$(git diff --name-only -- kernels/)" ]; then
            step bnl2-off "$(cap 90)" python3 benchmarks/bn_l2_reuse.py -D CUNORM_BN_APPLY_L2_HINTS=0
            tail -17 "$out/bnl2-off.txt"
            step splitl2-off "$(cap 60)" python3 benchmarks/split_l2_reuse.py -D CUNORM_SPLIT_L2_HINTS=0
            tail -9 "$out/splitl2-off.txt"
        fi ;;
    bnpivot)  # (no patch) BatchNorm channels whose first element is an outlier against float64
        # (NOTES "BatchNorm's pivots"): the probe, FAIL lines counted, ~20-40 s
        step bnpivot "$(cap 90)" python3 benchmarks/probe_bn_outlier_pivot.py
        echo "bn probe FAIL lines: $(grep -c FAIL "$out/bnpivot.txt") of $(grep -c "nchw\|nhwc" "$out/bnpivot.txt")"
        grep FAIL "$out/bnpivot.txt" | cut -c1-220 | head -8 ;;
    v112)  # (on main since the forty-ninth session as v112b, no patch):
        # float32 LayerNorm cluster forward rows in one pass within two sigma of zero; its sweep
        # against the two passes (two rounds, best of each) and the cluster path's GPU tests, ~2 min
        step v112-sweep "$(cap 200)" python3 benchmarks/sweep_cluster_fwd_f32_one_pass.py --json "$out/sweep-v112.json"
        tail -12 "$out/v112-sweep.txt"
        tests_step v112-tests "$(cap 200)" -n 8 tests/test_cluster_path.py -m gpu ;;
    v48)  # (on main since the forty-eighth session, no patch): the channels-last forward sums each group of its own copies as it lands; swept
        # against the wait for the whole stage (twice) and one / two groups at the NHWC shapes,
        # then its bits test and the channels-last GPU tests, ~2 min
        BN_SWEEP_SHAPES=32x256x56x56,64x256x28x28,64x1024x14x14,256x2048x7x7,128x256x14x14 BN_SWEEP_LAYOUTS=nhwc \
            step v48-sweep "$(cap 200)" python3 benchmarks/sweep_bn_variants.py \
            --variants default,cl_fused_sums_off,cl_groups_1,cl_groups_2,cl_fused_sums_off_again,default_again \
            --json "$out/sweep-v48.json"
        sed -n '/^case |/,$p' "$out/v48-sweep.txt"
        tests_step v48-tests "$(cap 200)" -n 8 tests/test_batch_norm.py -m gpu -k "copies_land or staged_cl" ;;
    v49)  # (no patch) BatchNorm v49: the channel-major passes' grids held to one wave
        # (NC_GRID_FITS; the backward's sums pass alone on main, NC_GRID_FITS_BWD_SUMS): its GPU tests, then the probe of the
        # (128, 64, 112, 112) passes (each pass's time under the grids' settings, a read and a
        # copy of the same bytes), ~2 min
        tests_step v49-tests "$(cap 90)" -n 8 tests/test_batch_norm.py -m gpu -k "own_grids"
        step v49-probe "$(cap 200)" python3 benchmarks/probe_bn_passes_112.py \
            --variants "${V49_VARIANTS:-default,nc_fits_off,nc_blocks_12,nc_blocks_16,nc_blocks_24,default_again}"
        cat "$out/v49-probe.txt" ;;
    v50)  # (on main since the forty-ninth session as v52, no patch): the channel-major training
        # forward's passes in one cooperative launch (bn_fwd_two_phase_nc); its GPU tests (and the
        # passes' own, which keep it off), both sanitizers over its cases, the sweep at 112 x 112
        # (the only bench shape it takes) with residual + ReLU timed, ~3-4 min
        tests_step v50-tests "$(cap 150)" -n 8 tests/test_batch_norm.py -m gpu -k "two_phase or chunked_walks or flat_apply or own_grids"
        two_phase_tools v50
        BN_SWEEP_SHAPES=128x64x112x112,32x256x56x56 BN_SWEEP_FUSED=1 \
            step v50-sweep "$(cap 200)" python3 benchmarks/sweep_bn_variants.py \
            --variants default,two_phase_off,two_phase_trips_16,default_again,two_phase_off_again \
            --json "$out/sweep-v50.json"
        sed -n '/^case |/,$p' "$out/v50-sweep.txt" ;;
    dram)  # (no patch) the DRAM bytes each BatchNorm kernel of the passes reads and writes, in
        # tensors' bytes, with the L2 as the kernel before left it (profile_stalls.py --dram): does
        # the apply's walk last to first find x (and dy) in L2 where the statistics pass left it?
        # Issue 5's misses that the passes serve, the NCHW 56 x 56 staged span for contrast, and
        # the row norms' 1M split forward (x read twice), ~1-2 min
        step dram "$(cap 240)" python3 benchmarks/profile_stalls.py --dram --out "$out/dram" \
            batch_norm:bfloat16:32x256x56x56:nhwc:bwd batch_norm:float32:32x256x56x56:nhwc:fwd \
            batch_norm:bfloat16:128x64x112x112:nchw:fwd batch_norm:bfloat16:128x64x112x112:nhwc:fwd \
            batch_norm:bfloat16:32x256x56x56:nchw:fwd layer_norm:bfloat16:1048576:fwd
        tail -20 "$out/dram.txt" ;;
    prof)  # ncu's stalls of the BatchNorm kernels issue 5 still misses with (staged channels last,
           # the NHWC passes, the span backward's pieces, the NCHW 14 x 14 staged forward), ~2 min
        step prof "$(cap 300)" python3 benchmarks/profile_stalls.py --out "$out/stalls" \
            batch_norm:bfloat16:64x1024x14x14:nhwc:fwd batch_norm:bfloat16:64x1024x14x14:nhwc:bwd \
            batch_norm:bfloat16:32x256x56x56:nhwc:fwd batch_norm:bfloat16:32x256x56x56:nchw:bwd \
            batch_norm:bfloat16:64x1024x14x14:nchw:fwd batch_norm:float32:32x256x56x56:nchw:bwd
        tail -40 "$out/prof.txt" ;;
    v32)  # BatchNorm v32 (probe, no patch): the span kernels for whole-word planes (14 x 14, 28 x 28)
        tests_step v32-tests "$(cap 150)" -n 4 tests/test_batch_norm.py -k "whole_word_planes"
        BN_SWEEP_SHAPES=64x1024x14x14,128x256x14x14,32x512x28x28,64x128x28x28 BN_SWEEP_LAYOUTS=nchw BN_SWEEP_FUSED=1 \
            step v32-sweep "$(cap 200)" python3 benchmarks/sweep_bn_variants.py \
            --variants default,span_8byte_words,span_all_words --json "$out/sweep-v32.json"
        sed -n '/^case |/,$p' "$out/v32-sweep.txt" ;;
    v35)  # BatchNorm v35 (over v36, on main): the whole BatchNorm file under 8 workers, three
          # rounds, then the NHWC sweep against the passes where no cluster fits
        for round in 1 2 3; do
            tests_step "v35-tests-$round" "$(cap 150)" -n 8 tests/test_batch_norm.py
        done
        BN_SWEEP_SHAPES=32x256x56x56,20x128x56x56,64x128x28x28,64x256x28x28,32x512x28x28,128x256x14x14,8x256x56x56,128x128x28x28 \
            BN_SWEEP_LAYOUTS=nhwc BN_SWEEP_FUSED=1 step v35-sweep "$(cap 220)" python3 benchmarks/sweep_bn_variants.py \
            --variants default,cl_grid_shares_off --json "$out/sweep-v35.json"
        sed -n '/^case |/,$p' "$out/v35-sweep.txt" ;;
    crash)  # the pytest worker crash (NOTES "The pytest worker crash"; no patch), under glibc's heap checks
        crash_rounds crash MALLOC_CHECK_=3 MALLOC_PERTURB_=165 ;;
    eager)  # the same rounds with CUDA's lazy module loading off
        crash_rounds eager CUDA_MODULE_LOADING=EAGER ;;
    mixed)  # eight processes cycling through the crashing test's five launch settings (probe, 60 s)
        pids=()
        for i in 1 2 3 4 5 6 7 8; do
            timeout 90 python3 benchmarks/probe_bn_coop_crash.py mixed 60 > "$out/mixed-$i.txt" 2>&1 & pids+=($!)
        done
        for i in "${!pids[@]}"; do
            wait "${pids[$i]}"; echo "   mixed process $((i + 1)): rc $? $(tail -1 "$out/mixed-$((i + 1)).txt")"
        done
        grep -h -m1 -A6 "Current thread" "$out"/mixed-*.txt | head -8 ;;
    replay43)  # the forty-third session's crashing worker's 171 tests in that order, in one process
        step replay43 "$(cap 240)" python3 -m pytest -q -p no:xdist -p no:cacheprovider \
            $(cat benchmarks/results/crash-bn-43-h100-order.txt)
        tail -1 "$out/replay43.txt"; grep -m1 -A6 "Current thread" "$out/replay43.txt" ;;
    v38)  # v38 (landed in the forty-sixth session): a grid-only stage's refused cooperative
        # launch runs the passes; the driver's refusal code checked (the new GPU test inflates the
        # grid past what the GPU holds), and the grid-exchange / grid-only tests, ~1 min
        tests_step v38-tests "$(cap 150)" -p no:xdist tests/test_batch_norm.py -m gpu \
            -k "grid_only or grid_exchange or scratch_lists" ;;
    v41)  # experiments/bn-v41-cl-fp32-bwd-grid-only-rounds.patch (over main): the sweep at
        # NHWC shapes against v41 undone and float32's staged backward alone, then the
        # channels-last staged and grid GPU tests (float32's staged backward among them), ~2-3 min
        BN_SWEEP_SHAPES=32x256x56x56,64x256x28x28,64x1024x14x14,256x2048x7x7 BN_SWEEP_LAYOUTS=nhwc BN_SWEEP_FUSED=1 \
            step v41-sweep "$(cap 120)" python3 benchmarks/sweep_bn_variants.py \
            --variants default,v41_off,v41_fp32_bwd_alone --json "$out/sweep-v41.json"
        sed -n '/^case |/,$p' "$out/v41-sweep.txt"
        tests_step v41-tests "$(cap 240)" -n 8 tests/test_batch_norm.py -m gpu -k "staged_cl or grid or scratch_lists" ;;
    v42)  # on main since the forty-seventh session (no patch; NOTES "BatchNorm v42, v43, v44
        # outcome"): the channels-last stages' y / dx stored from registers (v42), their lean
        # apply loops (v43) and row-stepped copies in (v44), each off and all off against the
        # defaults, all off and on twice over, at the NHWC shapes (and `cl_block_256`:
        # 256-thread blocks, four an SM), then the channels-last and grid GPU tests, ~1-2 min
        BN_SWEEP_SHAPES=32x256x56x56,64x256x28x28,64x1024x14x14,256x2048x7x7 BN_SWEEP_LAYOUTS=nhwc BN_SWEEP_FUSED=1 \
            step v42-sweep "$(cap 200)" python3 benchmarks/sweep_bn_variants.py \
            --variants default,cl_block_256,cl_copy_out,cl_lean_off,cl_copy_rows_off,cl_before_v42,default_again,cl_before_v42_again \
            --json "$out/sweep-v42.json"
        sed -n '/^case |/,$p' "$out/v42-sweep.txt"
        tests_step v42-tests "$(cap 150)" -n 8 tests/test_batch_norm.py -m gpu -k "staged_cl or grid or cl_" ;;
    rounds4)  # v37 (measured in the forty-fifth session, NOTES "BatchNorm v38, v39, v40 outcome"; a
        # sweep variant, no patch): grid-only channels-last stages over up to
        # four rounds, NHWC 56 x 56 and 7 x 7 with residual + ReLU timed; then the channels-last
        # BatchNorm GPU tests in one process under the setting (set on the planner's module before
        # pytest starts: xdist's workers would import it afresh), ~2-3 min
        BN_SWEEP_SHAPES=32x256x56x56,256x2048x7x7,64x1024x14x14 BN_SWEEP_LAYOUTS=nhwc BN_SWEEP_FUSED=1 \
            step rounds4-sweep "$(cap 260)" python3 benchmarks/sweep_bn_variants.py \
            --variants default,cl_grid_rounds_4,cl_bwd_fp32,cl_bwd_fp32_rounds_4 --json "$out/sweep-rounds4.json"
        sed -n '/^case |/,$p' "$out/rounds4-sweep.txt"
        step rounds4-tests "$(cap 150)" python3 -c "import sys, pytest; from cunorm.ops import _batch_norm; \
_batch_norm.STAGED_CL_GRID_MAX_ROUNDS = 4; sys.exit(pytest.main(['-q', '-p', 'no:xdist', '-p', 'no:cacheprovider', \
'tests/test_batch_norm.py', '-m', 'gpu', '-k', 'staged_cl or grid or cl_']))"
        tail -1 "$out/rounds4-tests.txt" ;;
    fill)  # v30's pieces filling the block against the fewest, NCHW backward (no patch), ~1 min
        BN_SWEEP_SHAPES=32x256x56x56,16x512x56x56,64x128x28x28,256x2048x7x7 BN_SWEEP_LAYOUTS=nchw BN_SWEEP_FUSED=1 \
            step fill-sweep "$(cap 150)" python3 benchmarks/sweep_bn_variants.py \
            --variants default,span_split_fewest --json "$out/sweep-fill.json"
        sed -n '/^case |/,$p' "$out/fill-sweep.txt" ;;
    stagedcl)
        tests_step stagedcl-tests "$(cap 150)" tests/test_batch_norm.py -k test_gpu_staged_cl_forward_and_backward ;;
    *) echo "unknown step $name" ;;
    esac
done

echo "total $((SECONDS - start)) s"
