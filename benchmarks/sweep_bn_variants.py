"""BatchNorm kernel variants compiled side by side at issue 5's shapes: the flat apply
passes against the per-channel ones, their piece length and register bound, the statistics
pass's own in-flight bytes and the block size, bn_stats_flat's settings, against the defaults. Kernel time
(_bench.queued_time_ms), training forward and backward, fractions of copy.

    [BN_SWEEP_SHAPES=NxCxHxW,...] [BN_SWEEP_LAYOUTS=nhwc] [BN_SWEEP_FUSED=1] \
        python benchmarks/sweep_bn_variants.py [--json out.json] [--variants a,b]

BN_SWEEP_FUSED=1 also times the bench's residual + ReLU calls and gives each direction's time
as a multiple of the plain call's (issue 5: at most 1.2x forward).
"""
from __future__ import annotations

import os

import numpy

from cunorm import _bench, _compile
from cunorm._checks import BFLOAT16
from cunorm.ops import _batch_norm
from _sweep_cli import rebuild_batch_norm  # benchmarks/ is the script's directory
from sweep_bn_config import SHAPES, _case, _gbps

# v42-v44 (on main since the forty-seventh session) all off: the channels-last stages as before them
_CL_BEFORE_V42 = ("-DCUNORM_BN_CL_DIRECT=0", "-DCUNORM_BN_CL_LEAN=0", "-DCUNORM_BN_CL_COPY_ROWS=0")

# name: (NVRTC defines, host BLOCK, host settings of _batch_norm)
VARIANTS = {
    "default": ((), 256, {}),
    # the defaults once more, later in a sweep (the machine's drift between the two)
    "default_again": ((), 256, {}),
    "passes_forward": ((), 256, {"USE_STAGED": False}),
    # v53: the kernels as before it (float sums in the passes and the two-phase forward, the
    # host's partials still double; no re-pivot vote in the staged kernels), on the default
    # plans and with every training forward through the passes
    "bn_before_v53": (("-DCUNORM_BN_WIDE_SUMS=0", "-DCUNORM_REPIVOT=0"), 256, {}),
    "passes_forward_all": ((), 256, {"USE_STAGED": False, "USE_STAGED_CL": False, "USE_TWO_PHASE": False}),
    "passes_forward_all_before_v53": (("-DCUNORM_BN_WIDE_SUMS=0", "-DCUNORM_REPIVOT=0"), 256,
                                      {"USE_STAGED": False, "USE_STAGED_CL": False, "USE_TWO_PHASE": False}),
    # v54 (on main since the fifty-first session): the span and channels-last stages' far vote
    # asked at the barrier that publishes their constants; this is v53's vote of its own
    "v53_own_vote": (("-DCUNORM_BN_FOLDED_VOTE=0",), 256, {}),
    # v55: the channels-last passes' grids aiming at six blocks an SM (each held to what its
    # kernel fits); the channels-last sums passes' block totals summed by row 0's threads
    # alone, as before v55 (a chain of VEC * 2 * rows adds a thread). (v55's Welford state
    # for bn_stats_cl lost to v53's double sums and is gone: NOTES "BatchNorm v55 outcome".)
    "cl_passes_6_per_sm": ((), 256, {"BLOCKS_PER_SM_CL": 6}),
    "rows_by_row_0": (("-DCUNORM_BN_ROWS_SPREAD=0",), 256, {}),
    # the apply passes' (forward and backward, every layout) packs in flight a thread: 64 bytes
    # (four 16-byte packs) against the default 32, the statistics and sums passes kept at 32
    # (bn_apply_cl's stalls are the long scoreboard: results/prof-bn-47-h100.txt)
    "apply_inflight_64": (("-DCUNORM_BN_INFLIGHT_BYTES=64", "-DCUNORM_BN_STATS_INFLIGHT_BYTES=32",
                           "-DCUNORM_BN_SUMS_INFLIGHT_BYTES=32"), 256, {}),
    # v56 (on main since the fifty-third session): bn_apply_cl's loads through a cp.async ring
    # of 8 slots a thread (the default; 4 a stream with the residual), of 4, and the register
    # walk of 32 bytes a trip (before v56)
    "apply_cl_reg_walk": (("-DCUNORM_BN_APPLY_CL_RING=0",), 256, {}),
    "apply_cl_ring_4": (("-DCUNORM_BN_APPLY_CL_RING=4",), 256, {}),
    # v56's bn_bwd_apply_cl ring (4 slots a stream) against its register walk, and both off
    "bwd_apply_cl_reg_walk": (("-DCUNORM_BN_BWD_APPLY_CL_RING=0",), 256, {}),
    "before_v56": (("-DCUNORM_BN_APPLY_CL_RING=0", "-DCUNORM_BN_BWD_APPLY_CL_RING=0"), 256, {}),
    # v57 (experiments/bn-v57-early-launches.patch applied; without it the setting is absent
    # and the variant runs as default): the channels-last passes' finalize and apply kernels
    # (forward and backward) launched early (programmatic dependent launch) off
    "launch_early_off": ((), 256, {"LAUNCH_EARLY_MIN_ELEMENTS": None}),
    "launch_early_off_again": ((), 256, {"LAUNCH_EARLY_MIN_ELEMENTS": None}),
    # both off: the kernels and launches as on main before v56
    "before_v56_v57": (("-DCUNORM_BN_APPLY_CL_RING=0", "-DCUNORM_BN_BWD_APPLY_CL_RING=0"), 256,
                       {"LAUNCH_EARLY_MIN_ELEMENTS": None}),
    "passes": ((), 256, {"USE_STAGED": False, "USE_STAGED_BWD": False}),
    "staged_block_256": ((), 256, {"STAGED_BLOCKS": (256, 256)}),
    "staged_block_512": ((), 256, {"STAGED_BLOCKS": (512, 512)}),
    "staged_1536_threads": (("-DCUNORM_BN_STAGED_THREADS_PER_SM=1536",), 256, {}),
    "staged_resident_4": ((), 256, {"STAGED_MIN_RESIDENT": 4}),
    "staged_fewest_channels": ((), 256, {"STAGED_PREFER_WIDE": False}),
    "staged_any_word": ((), 256, {"STAGED_MIN_WORD": 1}),
    "staged_no_clusters": ((), 256, {"STAGED_CLUSTERS": ()}),
    "staged_clusters_2": ((), 256, {"STAGED_CLUSTERS": (2,)}),
    "per_channel_apply": ((), 256, {"USE_FLAT": False}),
    "flat_packs_4": ((), 256, {"FLAT_PACKS": 4}),
    "flat_packs_16": ((), 256, {"FLAT_PACKS": 16}),
    "flat_min_blocks_4": (("-DCUNORM_BN_FLAT_MIN_BLOCKS=4",), 256, {}),
    "flat_min_blocks_2": (("-DCUNORM_BN_FLAT_MIN_BLOCKS=2",), 256, {}),
    "stats_inflight_64": (("-DCUNORM_BN_STATS_INFLIGHT_BYTES=64",), 256, {}),
    "sums_inflight_64": (("-DCUNORM_BN_SUMS_INFLIGHT_BYTES=64",), 256, {}),
    "block_128": (("-DCUNORM_BN_BLOCK_LOG2=7",), 128, {}),
    "block_128_stats_64": (("-DCUNORM_BN_BLOCK_LOG2=7", "-DCUNORM_BN_STATS_INFLIGHT_BYTES=64"), 128, {}),
    "flat_stats_off": ((), 256, {"USE_FLAT_STATS": False}),
    "flat_stats_fold": ((), 256, {"FLAT_FOLD_CHUNKS": 10**9}),
    "flat_stats_4_per_sm": ((), 256, {"FLAT_STATS_BLOCKS_PER_SM": 4}),
    "flat_stats_8_per_sm": ((), 256, {"FLAT_STATS_BLOCKS_PER_SM": 8}),
    "flat_stats_depth_2": (("-DCUNORM_BN_FLAT_STATS_DEPTH=2",), 256, {"FLAT_STATS_BLOCKS_PER_SM": 4}),
    "flat_stats_depth_2_8_per_sm": (("-DCUNORM_BN_FLAT_STATS_DEPTH=2",), 256, {"FLAT_STATS_BLOCKS_PER_SM": 8}),
    "flat_stats_packs_1": (("-DCUNORM_BN_FLAT_STATS_PACKS=1",), 256, {"FLAT_STATS_PACKS": 1}),
    "flat_stats_max_i_4096": ((), 256, {"FLAT_STATS_MAX_I": 4096}),
    "flat_sums_off": ((), 256, {"USE_FLAT_SUMS": False}),
    "flat_sums_packs_2": (("-DCUNORM_BN_FLAT_SUMS_PACKS=2", "-DCUNORM_BN_FLAT_SUMS_MIN_BLOCKS=3"), 256,
                          {"FLAT_SUMS_PACKS": 2}),
    "flat_sums_float32": ((), 256, {"FLAT_STATS_DTYPES": ("float16", "bfloat16", "float32"), "USE_FLAT_STATS": False}),
    # v18: the apply passes' residual build for every call (v18b's mean fold, measured as
    # no_fold_half against the default, lost and was taken out)
    "runtime_residual": ((), 256, {"SPECIALIZE_RESIDUAL": False}),
    # cl-grid: every channels-last pass on the plan's one grid, as before it
    "one_cl_grid": ((), 256, {"CL_GRID_FITS": False}),
    # v82: the channels-last sums pass's 64 in-flight bytes (the default) against the shared 32
    "sums_cl_inflight_32": (("-DCUNORM_BN_SUMS_CL_INFLIGHT_BYTES=32",), 256, {}),
    # BatchNorm v23: the sums passes' cp.async ring, 8 slots (the default; the backward sums
    # 4), 4 (2), and off (the walks' packs in registers, as before)
    "cl_ring_4": (("-DCUNORM_BN_CL_RING=4",), 256, {}),
    "cl_ring_off": (("-DCUNORM_BN_CL_RING=0",), 256, {}),
    # v49: the channel-major passes' grids held to what their kernels fit at once (all of
    # them), and none (main: the backward's sums pass alone)
    "nc_grid_fits": ((), 256, {"NC_GRID_FITS": True, "NC_GRID_FITS_BWD_SUMS": True}),
    "nc_grid_fits_off": ((), 256, {"NC_GRID_FITS": False, "NC_GRID_FITS_BWD_SUMS": False}),
    # v50 / v52: the channel-major training forward's passes in one cooperative launch, off (the passes), and in
    # fewer, longer chunks (each block's walk past its ring sooner)
    "two_phase_off": ((), 256, {"USE_TWO_PHASE": False}),
    "two_phase_off_again": ((), 256, {"USE_TWO_PHASE": False}),
    "two_phase_trips_16": ((), 256, {"MIN_TRIPS": 16}),
    # BatchNorm v19: the half-precision channels-last backward apply with x's mean folded
    # into a constant (the default) against x - mean an element
    "bwd_cl_no_fold": (("-DCUNORM_BN_BWD_FOLD_MEAN=0",), 256, {}),
    # BatchNorm v21: channels-last stages (the default) against the passes, one block an SM
    # (wider spans), narrower spans, the forward staged alone
    "staged_cl_off": ((), 256, {"USE_STAGED_CL": False, "USE_STAGED_CL_BWD": False}),
    "staged_cl_forward_only": ((), 256, {"USE_STAGED_CL_BWD": False}),
    # float32's channels-last backward staged too (lost 0.04-0.05 before v24's grid exchange)
    "staged_cl_bwd_fp32": ((), 256, {"STAGED_CL_BWD_MAX_ITEMSIZE": 4}),
    "staged_cl_resident_1": ((), 256, {"STAGED_CL_MIN_RESIDENT": 1}),
    "staged_cl_spans_64": ((), 256, {"STAGED_CL_SPANS": (64, 32, 16)}),
    "staged_cl_spans_32": ((), 256, {"STAGED_CL_SPANS": (32, 16)}),
    # BatchNorm v24: a channels-last stage's blocks meeting in global memory where the grid fits
    # at once (the default) against thread-block clusters (before it)
    "staged_cl_clusters": ((), 256, {"USE_STAGED_CL_GRID": False}),
    # BatchNorm v22: the NCHW staged walks' words read through a reference (narrow loads)
    "staged_narrow_loads": (("-DCUNORM_BN_STAGED_WORD_LOADS=0",), 256, {}),
    # BatchNorm v25: planes of no whole 8-byte word (7 x 7) through bn_fwd_staged_span and
    # bn_bwd_staged_span (the default) against the passes they took before (each direction's
    # column says whether its kernel wins: the two switches are independent)
    "staged_span_off": ((), 256, {"USE_STAGED_SPAN": False, "USE_STAGED_SPAN_BWD": False}),
    # v25b: grids under one wave split further over clusters (off by default: measured mixed)
    "staged_span_fill": ((), 256, {"STAGED_SPAN_FILL": True}),
    # ... and their words: in order (every warp both kinds of word) or in classes (one-channel
    # words first); the default: classes for the half-precision forward alone (v25's outcome)
    "span_words_in_order": (("-DCUNORM_BN_SPAN_CLASSES_FWD=0",), 256, {}),
    "span_word_classes": (("-DCUNORM_BN_SPAN_CLASSES_FWD=2", "-DCUNORM_BN_SPAN_CLASSES_BWD=1"), 256, {}),
    # v26: the span forward's share staged in parts (1, 2 or 4 groups of copies) and y stored
    # straight to global memory or back through the stage (DIRECT 0; 1: 4- and 8-byte x; 2:
    # always); v27: its apply loop without the residual's loads where none is given and half
    # precision's mean folded (LEAN 1, the default) or as v26's (0)
    "span_fwd_v25": (("-DCUNORM_BN_SPAN_FWD_PARTS=1", "-DCUNORM_BN_SPAN_FWD_DIRECT=0",
                      "-DCUNORM_BN_SPAN_FWD_LEAN=0"), 256, {}),
    "span_fwd_not_lean": (("-DCUNORM_BN_SPAN_FWD_LEAN=0",), 256, {}),
    "span_fwd_direct_all": (("-DCUNORM_BN_SPAN_FWD_DIRECT=2",), 256, {}),
    "span_fwd_direct_in_order": (("-DCUNORM_BN_SPAN_FWD_DIRECT=2", "-DCUNORM_BN_SPAN_CLASSES_FWD=0"), 256, {}),
    "span_fwd_two_parts": (("-DCUNORM_BN_SPAN_FWD_PARTS=2",), 256, {}),
    "span_fwd_four_parts": (("-DCUNORM_BN_SPAN_FWD_PARTS=4",), 256, {}),
    "span_fwd_staged_out": (("-DCUNORM_BN_SPAN_FWD_DIRECT=0",), 256, {}),
    # v29 (its patch): the staged forwards' residual asked of the L2 ahead of the apply (the
    # default there) or not
    "no_residual_prefetch": (("-DCUNORM_BN_PREFETCH_RESIDUAL=0",), 256, {}),
    # v28 (its patch): the backward of planes past a block (56 x 56) through the span backward's clusters
    "span_wide_bwd": ((), 256, {"STAGED_SPAN_WIDE_BWD": True}),
    # v30: float32 planes past a block's threads (56 x 56: 784 words) through the span
    # backward walked in pieces; and every one-channel plane split to fill the block's threads
    "span_wide_bwd_fp32": ((), 256, {"STAGED_SPAN_WIDE_BWD_ITEMSIZES": (2, 4)}),
    "span_split_fill": ((), 256, {"STAGED_SPAN_SPLIT_FILL": True}),
    # the fewest pieces (v30 before its fill), for the H100's bf16 56 x 56 backward (0.68 -> 0.63
    # between its checks around v30, where the H200 gained 0.014-0.022)
    "span_split_fewest": ((), 256, {"STAGED_SPAN_SPLIT_FILL": False}),
    "span_wide_bwd_fp32_fill": ((), 256, {"STAGED_SPAN_WIDE_BWD_ITEMSIZES": (2, 4), "STAGED_SPAN_SPLIT_FILL": True}),
    "span_v28": ((), 256, {"STAGED_SPAN_WIDE_BWD_ITEMSIZES": (2,), "STAGED_SPAN_SPLIT_FILL": False}),
    # v32 (probe): the span kernels for planes whose channel walk has 8-byte words (bf16 14 x
    # 14: 392-byte runs; bn_fwd_staged / bn_bwd_staged there), or for every staged plane whose
    # span fits a block's threads (float32 14 x 14 too); planes past it keep their kernels'
    # fallbacks (the forward's span has no pieces: float32 56 x 56 then takes the passes)
    # v31 (its patch): the staged backwards' second walk reading dz from the stage (the
    # default there) or recomputing it from x and the residual read again (v30's)
    "staged_dz_recompute": (("-DCUNORM_BN_STAGED_DZ_BACK=0",), 256, {}),
    # v33 (its patch): the span forward in pieces, so whole-word planes past 512 words (float32
    # 56 x 56) take the span kernels too; and v33's build with M fixed at 1 (v32's code)
    "span_fwd_pieces": ((), 256, {"STAGED_MIN_WORD": 32, "STAGED_SPAN_FWD_PIECES": True}),
    "span_fwd_no_pieces": (("-DCUNORM_BN_SPAN_FWD_PIECES=0",), 256, {}),
    "span_fwd_only_pieces": ((), 256, {"STAGED_FWD_MIN_WORD": 32, "STAGED_SPAN_FWD_PIECES": True}),
    "span_8byte_words": ((), 256, {"STAGED_MIN_WORD": 16}),
    "span_all_words": ((), 256, {"STAGED_MIN_WORD": 32}),
    # v34: the forward alone through the span kernels for 8-byte-word planes (bf16 14 x 14),
    # and every plane's forward in pieces as few as fit a block (not those filling it)
    "span_fwd_8byte_words": ((), 256, {"STAGED_FWD_MIN_WORD": 16}),
    "span_fwd_only_fewest_pieces": ((), 256, {"STAGED_FWD_MIN_WORD": 32, "STAGED_SPAN_FWD_PIECES": True,
                                              "STAGED_SPAN_SPLIT_FILL": False}),
    # v35: no stage over more blocks than a cluster holds (the passes where no cluster fits)
    "cl_grid_shares_off": ((), 256, {"STAGED_CL_GRID_SHARES": ()}),
    # v37 (planned, forty-fourth session): channels-last stages in global memory over up to four
    # rounds (bf16 NHWC 56 x 56 backward and float32 forward: 128-block stages of 32 channels,
    # 4 rounds; bf16 / float32 7 x 7's clustered grids where the rule finds 4 rounds pay)
    "cl_grid_rounds_4": ((), 256, {"STAGED_CL_GRID_MAX_ROUNDS": 4}),
    # float32 channels-last backward staged (lost to the passes by 0.04-0.05 in v21, before the
    # persistent grid): cuDNN's persistent NHWC float32 backward reads 0.60-0.69 of an H100's
    # copy at the bench's shapes where the passes read 0.55-0.59
    "cl_bwd_fp32": ((), 256, {"STAGED_CL_BWD_MAX_ITEMSIZE": 4}),
    "cl_bwd_fp32_rounds_4": ((), 256, {"STAGED_CL_BWD_MAX_ITEMSIZE": 4, "STAGED_CL_GRID_MAX_ROUNDS": 4}),
    # v39 (on main since the forty-sixth session): grid-only stages' fold in rank order by 2 G threads (before v39)
    "cl_fold_rank_order": (("-DCUNORM_BN_CL_GRID_FOLD=0",), 256, {}),
    "cl_rounds_4_fold_rank_order": (("-DCUNORM_BN_CL_GRID_FOLD=0",), 256, {"STAGED_CL_GRID_MAX_ROUNDS": 4}),
    # channels-last stages of 256-thread blocks, four an SM (half the stage a block, twice the
    # blocks): more blocks an SM at different points of their stage
    "cl_block_256": ((), 256, {"STAGED_CL_BLOCK": 256, "STAGED_CL_MIN_RESIDENT": 4}),
    # v48: the channels-last forward's wait for the whole stage before its sums (main's before
    # v48), its copies in one or two groups (four by default), and v48 off once more
    "cl_fused_sums_off": (("-DCUNORM_BN_CL_FUSED_SUMS=0",), 256, {}),
    "cl_groups_1": (("-DCUNORM_BN_CL_GROUPS=1",), 256, {}),
    "cl_groups_2": (("-DCUNORM_BN_CL_GROUPS=2",), 256, {}),
    "cl_fused_sums_off_again": (("-DCUNORM_BN_CL_FUSED_SUMS=0",), 256, {}),
    # v42: the channels-last stages' y (dx) written over the stage and copied out; v43: their
    # apply loops as before (the residual's loads in every call, the mean apart); v44: their
    # copies in through stage_in's general walk; all three (main's before v42, which landed in the
    # forty-seventh session with all three on: NOTES "BatchNorm v42, v43, v44 outcome"); then all
    # three off once more (with default_again: the machine's drift; the forty-seventh's sweep
    # named that column cl_v44_again)
    "cl_copy_out": (("-DCUNORM_BN_CL_DIRECT=0",), 256, {}),
    "cl_lean_off": (("-DCUNORM_BN_CL_LEAN=0",), 256, {}),
    "cl_copy_rows_off": (("-DCUNORM_BN_CL_COPY_ROWS=0",), 256, {}),  # v44: stage_in's general walk
    "cl_before_v42": (_CL_BEFORE_V42, 256, {}),
    "cl_before_v42_again": (_CL_BEFORE_V42, 256, {}),
    # v36: the 16-byte channels-last spans back (main's plans before the forty-third session)
    "cl_spans_16": ((), 256, {"STAGED_CL_SPANS": (128, 64, 32, 16)}),
    # v46 probe (forty-seventh session): whole-line (128-byte) or 64-byte spans a position only,
    # so that a stage too large for a cluster of 8 goes to the grid-only stages over 16-64
    # blocks where main's planner takes a narrower span's cluster (bf16 64x1024x14x14's
    # backward: 32-byte spans over clusters of 8 -> 128-byte spans over 32 blocks). cl_block_256
    # read that backward 0.544 -> 0.604 on an H100 with 128-byte spans over 64 blocks
    # v46: the spans tried widest first across clusters and grid-only stages; this variant is
    # the order before it (every span's clusters first)
    "cl_clusters_first": ((), 256, {"STAGED_CL_SPAN_FIRST": False}),
    # v47: no grid-only stages past two rounds (the passes there, main's before v47)
    "cl_fallback_off": ((), 256, {"STAGED_CL_GRID_FALLBACK_ROUNDS": 2}),
    "cl_fallback_off_again": ((), 256, {"STAGED_CL_GRID_FALLBACK_ROUNDS": 2}),
    "cl_spans_128": ((), 256, {"STAGED_CL_SPANS": (128,)}),
    "cl_spans_128_64": ((), 256, {"STAGED_CL_SPANS": (128, 64)}),
    "cl_spans_128_again": ((), 256, {"STAGED_CL_SPANS": (128,)}),
    "cl_copy_rows_off_again": (("-DCUNORM_BN_CL_COPY_ROWS=0",), 256, {}),
    # v34's defaults undone: the forward's span kernels for words under 8 bytes alone, no pieces (v32's plans)
    "span_fwd_v32": ((), 256, {"STAGED_FWD_MIN_WORD": None, "STAGED_SPAN_FWD_WHOLE_WORDS": False,
                               "STAGED_SPAN_FWD_PIECES": False}),
}
# Every host setting a variant sets, put back after the sweep and before each variant (a
# hand-kept list missed v57's LAUNCH_EARLY_MIN_ELEMENTS, so the variants after
# launch_early_off kept it off)
HOST_SETTINGS = tuple(dict.fromkeys(k for _, _, settings in VARIANTS.values() for k in settings))


def _use(options, block: int, settings: dict) -> None:
    _batch_norm.BLOCK = block
    for k, v in settings.items():
        setattr(_batch_norm, k, v)
    rebuild_batch_norm(options)


def _shapes() -> tuple:
    """The bench's shapes, or BN_SWEEP_SHAPES's (``NxCxHxW,...``)."""
    given = os.environ.get("BN_SWEEP_SHAPES")
    return tuple(tuple(int(d) for d in s.split("x")) for s in given.split(",")) if given else SHAPES


def _layouts() -> tuple:
    """(False, True): NCHW and NHWC, or BN_SWEEP_LAYOUTS's (``nchw``, ``nhwc`` or both)."""
    given = os.environ.get("BN_SWEEP_LAYOUTS", "nchw,nhwc").split(",")
    return tuple(cl for cl, name in ((False, "nchw"), (True, "nhwc")) if name in given)


def _fused() -> bool:
    return os.environ.get("BN_SWEEP_FUSED", "") not in ("", "0")


def _plain_row(shape, dtype, cl, copy) -> dict:
    f, b = _case(shape, dtype, cl)
    return {"fwd_of_copy": round(f / copy, 3), "bwd_of_copy": round(b / copy, 3)}


def _fused_row(shape, dtype, cl, copy) -> dict:
    """The plain calls' fractions of copy and the residual + ReLU calls' times over theirs."""
    from cunorm._bench_bn import _cupy_case

    f, b, fr, br = _cupy_case(shape, dtype, cl)[:4]
    gf, gb = _gbps(shape, dtype, f, b)
    return {"fwd_of_copy": round(gf / copy, 3), "bwd_of_copy": round(gb / copy, 3),
            "fused_fwd_x": round(fr / f, 3), "fused_bwd_x": round(br / b, 3)}


def sweep(log=print, names=None) -> list[dict]:
    # (a setting a parked patch adds is absent without it)
    defaults = (_compile.COMPILE_OPTIONS, _batch_norm.BLOCK,
                {k: getattr(_batch_norm, k) for k in HOST_SETTINGS if hasattr(_batch_norm, k)})
    copy = _bench.copy_gbps()
    rows = []
    try:
        for name, (options, block, settings) in VARIANTS.items():
            if names and name not in names:
                continue
            _use(options, block, {**defaults[2], **settings})
            for shape in _shapes():
                for dtype in (BFLOAT16, numpy.dtype(numpy.float32)):
                    for cl in _layouts():
                        row = {"variant": name, "shape": list(shape), "dtype": dtype.name,
                               "layout": "nhwc" if cl else "nchw"}
                        row.update(_fused_row(shape, dtype, cl, copy) if _fused() else _plain_row(shape, dtype, cl, copy))
                        log(f"{name:20s} {dtype.name:8s} {row['layout']} {shape}: fwd {row['fwd_of_copy']:.3f} "
                            f"bwd {row['bwd_of_copy']:.3f}" + (f" fused x{row['fused_fwd_x']:.3f} / "
                                                               f"x{row['fused_bwd_x']:.3f}" if _fused() else ""))
                        rows.append(row)
    finally:
        _use(*defaults)
    log(_table(rows))
    return rows


def _table(rows: list[dict]) -> str:
    """A line a case, forward / backward a column a variant."""
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    cases: dict = {}
    for r in rows:
        key = f"{r['dtype'][:4]} {r['layout']} {'x'.join(map(str, r['shape']))}"
        cell = f"{r['fwd_of_copy']:.3f} / {r['bwd_of_copy']:.3f}"
        if "fused_fwd_x" in r:
            cell += f" (x{r['fused_fwd_x']:.2f} / x{r['fused_bwd_x']:.2f})"
        cases.setdefault(key, {})[r["variant"]] = cell
    lines = ["case | " + " | ".join(variants)]
    lines += [k + " | " + " | ".join(c.get(v, "nan") for v in variants) for k, c in cases.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
