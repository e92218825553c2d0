"""Host side of kernels/batch_norm.cu: the (outer, channel, inner) layout of x, pack width,
chunking, and the three launches each way (partial sums, per-channel finalize, apply).

Framework-neutral like _row_norm: pointers in, the frontend's stream, scratch through
``alloc(shape, dtype) -> pointer``.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy

from .._checks import acc_dtype
from .._compile import c_type, function_ptr, held_with_modules
from .._launch import (CooperativeLaunchRefused, allow_smem, blocks_per_sm, launch, launch_cluster,
                       launch_cooperative, make_current, max_active_clusters, pick_vec, scalar_bits, sm_count,
                       smem_limits, zero_async)
from ._row_norm import _b

KERNEL_FILE = "batch_norm.cu"
BLOCK = 256  # = kBnBlock
MAX_GRID_Y = 65535
# BatchNorm v53: the passes' and the two-phase forward's training statistics summed in double,
# their partials float64 for every x dtype (the kernels' StatSum, CUNORM_BN_WIDE_SUMS):
# summed about a channel's first element in float they lost up to 520x float32's tolerance
# where that element lay far from the mean (probe_bn_outlier_pivot.py on an H100, NOTES
# "BatchNorm's pivots"). The staged kernels keep float sums and re-pivot such a channel on
# chip (their grid exchange takes a second round: STAGED_CL_FWD_ROUNDS).
STAT_SUM_DTYPE = numpy.dtype(numpy.float64)
STAT_SUM_BYTES = STAT_SUM_DTYPE.itemsize
# Blocks a pass aims for, per SM: channel-major 8, channels-last 4 (sweep_bn_config.py on the
# H200, NOTES "BatchNorm v2": 4 lifted the nhwc cases by up to +0.08 of copy, bf16 (64, 1024,
# 14, 14) 0.27 -> 0.35, and cost nchw (128, 64, 112, 112) 0.04-0.07, so the layouts differ).
BLOCKS_PER_SM = 8
BLOCKS_PER_SM_CL = 4
# ... and each channels-last pass at most what its kernel fits on the GPU at once: a grid
# that spills a few blocks into a second wave pays a whole wave's latency for them. H200,
# results/sweep-bn-cl-grid-h200.txt: the bf16 backward's sums pass (80 registers then, three
# blocks an SM) and apply pass (95, two) ran 1.33 and 2 waves at four; a target of two took
# 8-20% off every bf16 NHWC backward; on their own grids, +0.02-0.06 of copy (v82,
# results/sweep-bn-cl-grid-v82-h200.txt, where the sums pass holds 123 registers with 64
# bytes in flight). False: every cl pass takes BLOCKS_PER_SM_CL.
CL_GRID_FITS = True
# The channel-major backward's sums pass the same way (BatchNorm v49): held to the blocks
# bn_bwd_sums_nc fits at once, (128, 64, 112, 112)'s backward read 448.5 -> 426.0 us in float32,
# 244.9 -> 241.9 in bf16 (H100, results/probe-bn-passes-112-48-h100.txt). The forward's
# statistics pass lost held so (float32 147.2 -> 160.5 us; BLOCKS_PER_SM 4 as slow: more
# blocks than fit read faster there, not understood), so NC_GRID_FITS (the statistics and
# per-channel apply passes) stays off.
NC_GRID_FITS_BWD_SUMS = True
NC_GRID_FITS = False
# cl kernels: at most this many channel packs across a block (one 512-byte row of a warp for
# 16-byte packs); fewer channels take narrower, taller blocks.
CL_MAX_LANES = 32
# A block's least work, in loop trips of its threads: below it the block's fixed costs (the
# pivot, the reduction, the partial's store) outweigh its loads (1 and 16 measured within
# -0.08 / +0.09 of 4 on single shapes, within 3% on average).
MIN_TRIPS = 4
# Dense channel-major tensors (so = C * I, sc = I, aligned, I >= the pack) take the flat apply
# passes (bn_apply_flat, bn_bwd_apply_flat: whole packs across channel boundaries, pieces of
# FLAT_PACKS packs a thread of one image) instead of the per-channel ones. NOTES "BatchNorm v4".
USE_FLAT = True
FLAT_PACKS = 8
FLAT_MIN_PACKS = 2
FLAT_CHANNELS = 512  # = kFlatChannels: a piece's channels at most
# Training statistics of such tensors with short planes (I <= FLAT_STATS_MAX_I, C * I a
# multiple of the pack) in half precision take bn_stats_flat: pieces of FLAT_STATS_PACKS
# packs a thread, G images a block, G picked for at most FLAT_STATS_BLOCKS_PER_SM blocks an
# SM; its partials are folded by the flat apply itself up to FLAT_FOLD_CHUNKS a channel, by
# bn_finalize past it (each of a channel's blocks re-reads them: 20-40 read 0.17-0.33 of
# copy against 0.34-0.39). NOTES "BatchNorm v8": bf16 (256, 2048, 7, 7) forward 0.359 ->
# 0.409, (64, 1024, 14, 14) 0.356 -> 0.353; float32 within -0.035 to +0.015 over four runs,
# so float32 and float64 keep bn_stats_nc (FLAT_STATS_DTYPES).
USE_FLAT_STATS = True
FLAT_STATS_DTYPES = ("float16", "bfloat16")
FLAT_STATS_MAX_I = 1024
FLAT_STATS_PACKS = 2  # = kFlatStatsPacks
FLAT_STATS_BLOCKS_PER_SM = 4  # 5 (five fit at 51 registers) read -0.01 to -0.02 against 4
FLAT_FOLD_CHUNKS = 8
# Their training backward's sums take bn_bwd_sums_flat the same way, pieces of
# FLAT_SUMS_PACKS packs a thread (NOTES "BatchNorm v10").
USE_FLAT_SUMS = True
FLAT_SUMS_PACKS = 1  # = CUNORM_BN_FLAT_SUMS_PACKS
# The training forward of dense channel-major x with short channels takes bn_fwd_staged: one
# launch reading x once (a block stages G whole channels in shared memory), in place of the
# statistics, finalize and apply passes. NOTES "BatchNorm v14c".
USE_STAGED = True
STAGED_MIN_RESIDENT = 2  # blocks an SM whose stages must fit its shared memory (overlap)
# The backward of the same x takes bn_bwd_staged (x and dy staged): one launch reading both
# once, in place of the sums, finalize and dx passes. NOTES "BatchNorm v15".
USE_STAGED_BWD = True
# 256-thread blocks where this many stages fit an SM, else 512 (CUNORM_BN_STAGED_THREADS_PER_SM
# threads an SM by registers either way): bf16 (64, 1024, 14, 14), 50 KB stages, 0.459 -> 0.515
# of copy at 256; fp32 (128, 256, 14, 14), 100 KB stages, 0.468 -> 0.527 at 512 (NOTES v14c).
STAGED_SMALL_BLOCK_MIN_RESIDENT = 4
STAGED_BLOCKS = (256, 512)
STAGED_RESERVED_SMEM = 1024  # shared memory the driver keeps a block (sm_80 / sm_90)
# The widest copies whose stage fits, then the fewest channels: bf16 14 x 14 0.467 -> 0.511
# of copy (16-byte copies of two channels against 8-byte ones of one).
STAGED_PREFER_WIDE = True
# Channel walks in words under 8 bytes lose to the passes: 7 x 7 planes (49-element runs,
# one-element words) read bf16 0.29 / fp32 0.41 of copy staged against the passes' 0.41 / 0.50.
STAGED_MIN_WORD = 8
# A forward stage too large for one block splits its images over a thread-block cluster of
# the fewest of these blocks whose shares fit (sm_90; bn_fwd_staged<..., true>, partial sums
# added through distributed shared memory): v16 measured bf16 (32, 256, 56, 56) 0.435 ->
# 0.527 of copy, fp32 0.520 -> 0.575. The clustered backward gained nothing (0.49 / 0.56) and
# is not built. Clustered stages take 512-thread blocks (a share fills half an SM).
STAGED_CLUSTERS = (2, 4, 8)
STAGED_CLUSTER_MIN_SM = 90
# Where the channel walk's words would be narrower than STAGED_MIN_WORD (7 x 7 planes), the
# training forward and the backward take bn_fwd_staged_span / bn_bwd_staged_span (BatchNorm
# v25): the same stages in 16-byte copies (the backward's over clusters too), walked in
# 16-byte words across the span's channels (a word in at most two), on STAGED_SPAN_BLOCK
# threads; where no stage of 16-byte copies fits (or a span has more words than threads, or
# runs are shorter than a word), the passes. Measured (H200, NOTES "BatchNorm v25 outcome"):
# they beat the passes in every case swept, bf16 (256, 2048, 7, 7) 0.409 / 0.459 -> 0.492 /
# 0.546 of copy, float32 0.503 / 0.538 -> 0.652 / 0.677.
USE_STAGED_SPAN = True
USE_STAGED_SPAN_BWD = True
STAGED_SPAN_BLOCK = 512  # = the kernel's BLOCK template argument (instantiated for it alone)
# v25's outcome (H200, NOTES "BatchNorm v25 outcome"): grids under one wave read 0.16-0.29 of
# copy in bf16 ((128, 512, 7, 7): 64 stages, 64 blocks on 132 SMs). STAGED_SPAN_FILL: a
# stage's images split over a larger cluster (of STAGED_CLUSTERS) while the grid stays within
# one wave of STAGED_SPAN_RESIDENT blocks an SM (= CUNORM_BN_STAGED_THREADS_PER_SM /
# STAGED_SPAN_BLOCK). Measured (H100, NOTES "BatchNorm v25b outcome"): mixed, float32
# forward +0.02-0.06 of copy, bf16 backward -0.13 at (128, 512, 7, 7) and (32, 512, 11, 11):
# off.
STAGED_SPAN_FILL = False
STAGED_SPAN_RESIDENT = 2
# v33: the span forward walks one-channel planes in pieces too (as _span_split gives them),
# so whole-word planes past a block's threads (float32 56 x 56: 784 words) can take it.
# Measured with the forward's STAGED_FWD_MIN_WORD at 32 (every staged forward to the span
# kernels; H100, NOTES "BatchNorm v33 and v34 outcome", results/sweep-bn-v34-h100.txt): bf16
# (32, 256, 56, 56) forward 0.693 -> 0.762 of copy, float32 0.804 -> 0.847; its build with
# M fixed at 1 reads as v32's: on.
STAGED_SPAN_FWD_PIECES = True
# v33: the forward's own STAGED_MIN_WORD (None: the backward's). 16: 8-byte-word planes (bf16
# 14 x 14) forward through the span kernels, the backward staged (v32's sweep: both through
# the span kernels, bf16 (128, 256, 14, 14) backward 0.752 -> 0.686). Measured (H100, v34's
# sweep): bf16 (64, 1024, 14, 14) forward 0.582 -> 0.642, (128, 256, 14, 14) 0.614 -> 0.668,
# (32, 256, 14, 14) 0.326 -> 0.337; backward unchanged.
STAGED_FWD_MIN_WORD = 16
# v34: a forward of 16-byte words takes the span kernels too (in pieces), where the batch has
# at least STAGED_SPAN_FWD_MIN_IMAGES images and the plane is float32, or has at least
# STAGED_SPAN_FWD_HALF_MIN_WORDS words, or its stage spans a cluster. Measured (H100, v34's
# sweep, all forwards of 16-byte words through the span kernels): float32 won at every
# NCHW shape with 16 or more images (28 x 28: +0.016-0.069 of copy; 56 x 56 +0.04-0.06;
# 14 x 14 +0.01-0.02), lost at (8, 256, 56, 56) 0.735 -> 0.698; bf16 won where the stage is
# clustered ((128, 128, 28, 28) 0.632 -> 0.684, (32, 64, 112, 112) 0.627 -> 0.681) or the
# plane has 392 words (56 x 56: +0.03-0.07), lost at 28 x 28's 98-word planes in one block
# ((64, 128, 28, 28) 0.713 -> 0.652, (32, 512, 28, 28) 0.680 -> 0.610), even at 8 images
# (8, 256, 56, 56). float64 has no span kernels.
STAGED_SPAN_FWD_WHOLE_WORDS = True
STAGED_SPAN_FWD_MIN_IMAGES = 16
STAGED_SPAN_FWD_HALF_MIN_WORDS = 256
# v28: the backward of planes whose whole-word stage fits no block (x and dy of every
# image: bf16 56 x 56 is 401 KB a channel) through bn_bwd_staged_span over a cluster (of
# STAGED_CLUSTERS), where its span has at most STAGED_SPAN_BLOCK words; the passes before.
# v16's clustered backward gained nothing there (0.49 of copy against the passes' 0.49);
# v25's span backward reads 0.68 of an H100's copy in clusters of 4 at 7 x 7. Measured (H100,
# NOTES "BatchNorm v28 outcome", results/sweep-bn-v27-h100.txt): bf16 (32, 256, 56, 56)
# backward 0.544 -> 0.698 of copy, (16, 512, 56, 56) 0.554 -> 0.721; float32 takes no span
# there (unchanged): on.
STAGED_SPAN_WIDE_BWD = True
# v30: the element sizes that take it: half precision (v28) and float32, whose planes past a
# block's threads (56 x 56: 784 words) bn_bwd_staged_span walks in pieces. Measured (H200,
# NOTES "BatchNorm v30 outcome", results/sweep-bn-v30-h200.txt): float32 NCHW backward
# (32, 256, 56, 56) 0.553 -> 0.679 of copy, (16, 512, 56, 56) 0.559 -> 0.721, (64, 128, 28,
# 28) 0.475 -> 0.546 (pieces filling the block: 0.670, 0.714, 0.550); the residual + ReLU
# backward's time there 0.98-1.12x the passes' (the residual read from global memory in both
# walks). float64 has no span kernels.
STAGED_SPAN_WIDE_BWD_ITEMSIZES = (2, 4)
# v30: split a one-channel plane into the pieces that fill a block's threads best
# (_span_split), not only where its words outnumber them (bf16 56 x 56: 392 words leave 120
# of 512 threads idle; 49 pieces of 8 words, none). Measured (H200, same sweep): bf16
# backward +0.014-0.022 of copy at 56 x 56 and 28 x 28, float32 -0.009 to +0.004, the
# residual + ReLU backward 2-7% faster: on.
STAGED_SPAN_SPLIT_FILL = True
# Channels last (BatchNorm v21): the training forward and the
# backward of x with its channels innermost take bn_fwd_staged_cl / bn_bwd_staged_cl, one
# launch each reading x (and dy) once: a stage is G channels of every position, the positions
# split over a cluster of blocks (any of STAGED_CL_CLUSTERS, sm_90; one block elsewhere). The
# widest span a position (STAGED_CL_SPANS, bytes: 128 is a whole line, narrower ones read
# sectors of lines 2 * C bytes apart) whose shares fit STAGED_CL_MIN_RESIDENT blocks an SM,
# then the fewest blocks a stage. Where nothing fits (bf16 (32, 256, 56, 56): 6.4 MB a 64-byte
# stage), the passes. Prediction in NOTES "BatchNorm v21".
USE_STAGED_CL = True
USE_STAGED_CL_BWD = True
# Measured (H200, thirty-sixth session, NOTES "BatchNorm v21-v23 outcome"), NHWC 14 x 14 / 7 x 7
# against the passes: forward +0.006-0.059 of copy in every dtype; backward bf16 +0.022-0.026,
# float32 -0.044 / -0.051: the staged backward serves half precision only.
STAGED_CL_BWD_MAX_ITEMSIZE = 2
STAGED_CL_BLOCK = 512  # = the kernels' BLOCK template argument (instantiated for it alone)
# v36: no 16-byte spans (one word of a position's channels) where a position holds more:
# measured (H100, forty-third session, results/sweep-bn-v36-h100.txt, NOTES "BatchNorm v36
# outcome"), bf16 NHWC forward (64, 128, 28, 28) 0.266 of copy in them -> 0.400 in the passes,
# (64, 256, 28, 28) 0.221 -> 0.449, float32 0.237 -> 0.535 and 0.210 -> 0.553; bf16 backward
# (32, 512, 28, 28) 0.265 -> 0.420, (128, 256, 14, 14) 0.309 -> 0.417. A position of one word
# (C <= 8 bf16) keeps its one-word span (the spans only cap a stage; the channels bound it).
# With v35 these shapes take grid-only stages of 128-byte spans (same sweep: bf16 forward
# 0.548 / 0.407, backward 0.680 / 0.739 at (64, 128, 28, 28) / (128, 256, 14, 14)).
STAGED_CL_SPANS = (128, 64, 32)
STAGED_CL_MIN_RESIDENT = 2
STAGED_CL_CLUSTERS = (2, 4, 8)
STAGED_CL_LINE = 128  # = kClStageBytes
# BatchNorm v24 (NOTES "BatchNorm v24"): a stage's blocks add
# their sums through global memory (per-stage arrival counters) instead of as a thread-block
# cluster, on a persistent cooperative grid of as many stages' blocks as are resident at
# once, each block walking its stages. Clusters must each fit one GPC: the H200 ran 30
# clusters of 4 and 15 of 8 one-SM blocks (120 of 132 SMs; _config, v46), so bf16
# (64, 1024, 14, 14)'s 32 stages of 8 two-an-SM blocks run as 30 clusters and then 2, where
# 33 stages' blocks fit at once on the grid (264).
USE_STAGED_CL_GRID = True
# Measured (H100, NOTES "BatchNorm v24 and v111 outcome", probe_bn_staged_cl_waves):
# the grid wins where it runs a direction's stages in fewer rounds than the clusters take
# waves, and in at most two (bf16 (64, 1024, 14, 14) NHWC forward 0.488 -> 0.574 of copy, 1
# round against 2 waves; backward 0.464 -> 0.512, 2 against 3; bf16 7 x 7 forward 0.582 ->
# 0.619); with as many rounds as waves, or four and more (a persistent block's stages run one
# after another), it lost 0.02-0.07 (float32 7 x 7 forward, 4 against 5: 0.692 -> 0.657), so
# there the planned grid launches as clusters (its scratch still made: one memset).
# False: the grid wherever planned.
STAGED_CL_GRID_RULE = True
STAGED_CL_GRID_MAX_ROUNDS = 2
# v35: where no stage fits a cluster's blocks (bf16 (32, 256, 56, 56) NHWC: 12.8 MB a
# 128-byte stage, 1.6 MB a 16-byte one), a stage over more blocks than a cluster holds,
# meeting in global memory alone: the fewest of these whose shares fit, planned only where
# the persistent grid walks the stages in at most STAGED_CL_GRID_MAX_ROUNDS rounds (sm_90,
# with USE_STAGED_CL_GRID) and the span is at least STAGED_CL_GRID_MIN_SPAN bytes or all of a
# position's channels. Such a plan has no cluster launch to fall back to. Measured (H100,
# NOTES "BatchNorm v35", results/sweep-bn-v35-h100.txt) against the passes: bf16 forward
# (32, 256, 56, 56) 0.515 -> 0.557 of copy, (20, 128, 56, 56) 0.416 -> 0.577, (32, 128, 56,
# 56) 0.463 -> 0.545, (64, 64, 56, 56) 0.448 -> 0.523 (64-byte spans); bf16 backward (64,
# 256, 28, 28) 0.419 -> 0.525, (16, 256, 56, 56) 0.419 -> 0.531, (32, 128, 56, 56) 0.445 ->
# 0.499, (20, 128, 56, 56) 0.440 -> 0.432; float32 forward -0.017 to +0.061. 32-byte spans
# of 128-byte positions lost (bf16 (32, 64, 112, 112) forward 0.510 -> 0.351, (64, 64, 56,
# 56) backward 0.441 -> 0.355): STAGED_CL_GRID_MIN_SPAN.
STAGED_CL_GRID_SHARES = (16, 32, 64, 128)
STAGED_CL_GRID_MIN_SPAN = 64
# v46: the spans are tried widest first across both kinds of stage: a span's clusters, then
# its grid-only stage (in at most STAGED_CL_GRID_MAX_ROUNDS rounds), then the next narrower
# span's; before, every span's clusters came before any grid-only stage, so a stage too
# large for a cluster of 8 at 128 bytes took a cluster of 32-byte spans. Measured (H100,
# forty-seventh session, results/sweep-bn-v46-h100.txt, the probe STAGED_CL_SPANS = (128,),
# NOTES "BatchNorm v46"), NHWC fraction of copy: bf16 (64, 1024, 14, 14) forward 0.618 ->
# 0.658, backward 0.542 -> 0.630; (128, 256, 14, 14) forward bf16 0.441 -> 0.628, float32
# 0.505 -> 0.670; float32 (64, 1024, 14, 14) forward 0.678 -> 0.725; bf16 (256, 2048, 7, 7)
# forward 0.672 -> 0.702; the shapes whose 128-byte grid-only stage would take more rounds
# (bf16 7 x 7's backward, float32 7 x 7's forward: 4) keep their clusters. False: as before.
STAGED_CL_SPAN_FIRST = True
# v47: where no stage of any span fits in STAGED_CL_GRID_MAX_ROUNDS rounds, the grid-only
# stages again, widest span first, in up to this many, before the passes (which read x, and
# dy, twice). The clustered grids and every plan of two rounds keep theirs: four rounds lost
# to them (v37 / v41: bf16 NHWC 7 x 7 backward 0.550 -> 0.508). Measured as v37's and v41's
# sweep variants, where it replaced the passes (NOTES "BatchNorm v38, v39, v40 outcome",
# "BatchNorm v41", "BatchNorm v47"): H100 float32 NHWC (32, 256, 56, 56) forward 0.578 ->
# 0.625, bf16 backward 0.483 -> 0.499; the H200 level. STAGED_CL_GRID_MAX_ROUNDS or less: off.
STAGED_CL_GRID_FALLBACK_ROUNDS = 4
# BatchNorm v50 / v52: where the channel-major training forward takes the passes with 16-byte
# packs (the statistics pass's ring), bn_fwd_two_phase_nc runs them in one cooperative launch:
# a block a (channel, chunk), all resident, each applying its own chunk last pack first after
# its channel's blocks meet (the ring's last packs from shared memory, the packs before them
# from what the L2 kept), where the passes read x from DRAM twice. H100 (128, 64, 112, 112)
# forward: bf16 0.583 -> 0.635 of copy, float32 0.615 -> 0.620 (NOTES "BatchNorm v52"). Its
# channels-last and backward siblings lost (benchmarks/experiments/bn-v52-two-phase-cl-bwd.patch).
# Where the driver refuses the launch, or the channels outnumber the blocks that fit, the
# passes. CUDA only.
USE_TWO_PHASE = True
TWO_PHASE_DTYPES = ("float16", "bfloat16", "float32")
DTYPES = ("float16", "bfloat16", "float32", "float64")


def _param_types(t: str) -> tuple:
    """Parameter / running-statistics dtypes compiled with x dtype ``t``: its own and float32."""
    return (t,) if t in ("float32",) else (t, "float32")


ACT_CLASSES = (0, 1, 2)  # kernels' ACT: none, ReLU, any other (the id then an argument)
APPLY_KERNELS = ("bn_bwd_sums_nc", "bn_bwd_sums_cl", "bn_bwd_apply_flat", "bn_bwd_sums_flat")
# Apply passes built with and without the residual (forward) or its gradient (backward): a
# run-time null pointer still held the residual's packs in registers. NVRTC 13.0 sm_90, bf16
# bn_apply_cl 91 -> 63 registers (two 256-thread blocks an SM -> four), bn_apply_nc 8 bytes
# spilled -> none, float32 bn_apply_cl 60 -> 46; bn_bwd_apply_cl 104 -> 95 (78 with
# BatchNorm v19's fold of x's mean), bn_bwd_apply_nc 80 -> 68. H200
# (results/sweep-bn-v18-h200.txt, runtime_residual against default): bf16 NHWC forward
# +0.02-0.04 of copy (64, 1024, 14, 14) 0.337 -> 0.356, (128, 64, 112, 112) 0.491 -> 0.533;
# float32 NHWC -0.00 to +0.01, NCHW and the backward the same (NOTES "BatchNorm v18").
# False takes the residual build for every call, as before v18.
RESIDUAL_APPLY_KERNELS = ("bn_apply_nc", "bn_apply_cl", "bn_bwd_apply_nc", "bn_bwd_apply_cl")
SPECIALIZE_RESIDUAL = True


def act_class(act: int) -> int:
    """The kernels' ACT for activation id ``act`` (cunorm.activations' ids: 0 none, 1 ReLU)."""
    return act if act in (0, 1) else 2


def instantiations() -> list[str]:
    """Every name expression the host below can launch (CI compiles them all)."""
    names = []
    for t in DTYPES:
        ct = c_type(t)
        acc = "double" if t == "float64" else "float"
        for vec in _vec_choices(t):
            names += [f"bn_stats_nc<{ct}, {vec}>", f"bn_stats_cl<{ct}, {vec}>", f"bn_stats_flat<{ct}, {vec}>"]
            for w in _param_types(t):
                cw = c_type(w)
                names += [f"{k}<{ct}, {cw}, {vec}, {a}>" for k in APPLY_KERNELS for a in ACT_CLASSES]
                names += [f"{k}<{ct}, {cw}, {vec}, {a}, {_b(r)}>" for k in RESIDUAL_APPLY_KERNELS
                          for a in ACT_CLASSES for r in (False, True)]
                names += [f"bn_apply_flat<{ct}, {cw}, {c_type(r)}, {vec}, {a}>" for r in _param_types(t)
                          for a in ACT_CLASSES]
        for w in _param_types(t):
            names += [f"bn_fwd_staged<{n}, {ct}, {c_type(w)}, {c_type(r)}, {e}, {a}, {_b(clustered)}>"
                      for n, clustered in ((STAGED_BLOCKS[0], False), (STAGED_BLOCKS[1], False),
                                           (STAGED_BLOCKS[1], True))
                      for r in _param_types(t) for e in _staged_words(t) for a in ACT_CLASSES]
            names += [f"bn_bwd_staged<{n}, {ct}, {c_type(w)}, {e}, {a}>" for n in STAGED_BLOCKS
                      for e in _staged_words(t) for a in ACT_CLASSES]
        for w in _param_types(t) if t != "float64" else ():  # float64 runs are whole 8-byte words
            names += [f"bn_fwd_staged_span<{STAGED_SPAN_BLOCK}, {ct}, {c_type(w)}, {c_type(r)}, {a}, {_b(k)}>"
                      for r in _param_types(t) for a in ACT_CLASSES for k in (False, True)]
            names += [f"bn_bwd_staged_span<{STAGED_SPAN_BLOCK}, {ct}, {c_type(w)}, {a}, {_b(k)}>"
                      for a in ACT_CLASSES for k in (False, True)]
        for w in _param_types(t):
            names += [f"bn_fwd_staged_cl<{STAGED_CL_BLOCK}, {ct}, {c_type(w)}, {c_type(r)}, {a}, {_b(k)}>"
                      for r in _param_types(t) for a in ACT_CLASSES for k in (False, True)]
            names += [f"bn_bwd_staged_cl<{STAGED_CL_BLOCK}, {ct}, {c_type(w)}, {a}, {_b(k)}>"
                      for a in ACT_CLASSES for k in (False, True)]
        if t in TWO_PHASE_DTYPES:
            vec = 16 // numpy.dtype(_np(t)).itemsize
            names += [f"bn_fwd_two_phase_nc<{ct}, {c_type(w)}, {c_type(r)}, {vec}, {a}, {_b(k)}>"
                      for w in _param_types(t) for r in _param_types(t)
                      for a in ACT_CLASSES for k in (False, True)]
        for w in _param_types(t):
            cw = c_type(w)
            names += [f"bn_finalize<{ct}, {cw}>", f"bn_running_stats<{acc}, {cw}>", f"bn_bwd_finalize<{acc}, {cw}>"]
    return names


def _staged_words(t: str) -> tuple:
    """bn_fwd_staged's and bn_bwd_staged's EPW choices (elements a word of its channel walk, 16 bytes at most)."""
    return tuple(e for e in (1, 2, 4, 8) if e * numpy.dtype(_np(t)).itemsize <= 16)


def _vec_choices(t: str) -> tuple:
    from .._config import vec_choices

    return vec_choices(numpy.dtype(_np(t)).itemsize)


def _np(name: str):
    from .._checks import BFLOAT16

    return BFLOAT16 if name == "bfloat16" else numpy.dtype(name)


@functools.lru_cache(maxsize=256)
def param_dtype(x_dtype, *dtypes):
    """The dtype the kernels read parameters (and running statistics) in: x's own when all
    given ones are, else float32 (the frontend casts; C elements)."""
    given = {numpy.dtype(d) for d in dtypes if d is not None}
    return numpy.dtype(x_dtype) if given <= {numpy.dtype(x_dtype)} else numpy.dtype(numpy.float32)


class Layout(NamedTuple):
    """x as (outer O, channel C, inner I): element (o, c, i) at o * so + c * sc + i."""

    channels_last: bool  # sc == 1 and I == 1: the cl kernels
    O: int
    C: int
    I: int
    so: int
    sc: int


@functools.lru_cache(maxsize=1024)
def layout(shape: tuple, strides: tuple, axis: int) -> Layout | None:
    """The kernels' view of x (element strides, ``axis`` the channel axis), or None when the
    other axes do not reduce to one outer axis plus a contiguous inner one, or to one
    position axis with the channels innermost (the frontend copies x first)."""
    C = shape[axis]
    others = [(shape[i], strides[i]) for i in range(len(shape)) if i != axis and shape[i] != 1]
    if strides[axis] == 1 or C == 1:
        merged = _merge(sorted(others, key=lambda d: -abs(d[1])))
        if merged is not None and len(merged) <= 1:
            n, st = merged[0] if merged else (1, C)
            return Layout(True, n, C, 1, st, 1)
    lead = [(shape[i], strides[i]) for i in range(axis) if shape[i] != 1]
    trail = [(shape[i], strides[i]) for i in range(axis + 1, len(shape)) if shape[i] != 1]
    lead_m, trail_m = _merge(lead), _merge(trail)
    if lead_m is None or trail_m is None or len(lead_m) > 1 or len(trail_m) > 1:
        return None
    I, si = trail_m[0] if trail_m else (1, 1)
    if si != 1:
        return None
    O, so = lead_m[0] if lead_m else (1, 0)
    return Layout(False, O, C, I, so, strides[axis])


@functools.lru_cache(maxsize=1024)
def dense_layout(shape: tuple, strides: tuple, axis: int) -> Layout | None:
    """layout() of an array with these element strides when it is dense (no gaps, no overlap,
    so outputs made like it share its strides), else None (the frontend copies it first)."""
    expected = 1
    for size, st in sorted(((n, abs(st)) for n, st in zip(shape, strides) if n != 1), key=lambda d: d[1]):
        if st != expected:
            return None
        expected *= size
    return layout(shape, strides, axis)


def _merge(dims):
    """Consecutive (size, stride) axes, outermost first, merged where nested; None if a
    stride is negative (not addressed)."""
    out = []
    for size, st in dims:
        if st < 0:
            return None
        if out and out[-1][1] == st * size:
            out[-1] = (out[-1][0] * size, st)
        else:
            out.append((size, st))
    return out


def pieces(lay, length: int) -> int:
    """The pieces of ``length`` elements an image of the flat passes falls into."""
    return -(-(lay.C * lay.I) // length)


class FlatStats(NamedTuple):
    """The launch of bn_stats_flat (or of bn_bwd_sums_flat): pieces of ``length`` elements,
    ``images`` a block, ``groups`` blocks a piece (the partials a channel: 2 * groups);
    ``fold``: the flat apply pass sums them (no bn_finalize / bn_bwd_finalize launch)."""

    length: int
    images: int
    groups: int
    fold: bool

    @property
    def chunks(self) -> int:
        return 2 * self.groups

    def grid(self, lay) -> int:
        return pieces(lay, self.length) * self.groups


class Staged(NamedTuple):
    """The launch of bn_fwd_staged or bn_bwd_staged: stages of ``channels`` (G), copies of ``cp`` bytes, channel
    walk words of ``epw`` elements, ``smem`` bytes a block, ``blocks`` blocks (a stage each,
    or ``cluster`` a stage) of ``threads`` threads. Past one block a stage (bn_fwd_staged_cluster)
    each block takes ``images`` of the stage's images. ``span``: bn_fwd_staged_span's or
    bn_bwd_staged_span's (words of ``epw`` elements across the span's channels); ``split``:
    the span kernels' M, the pieces they walk a one-channel plane in (_span_split)."""

    channels: int
    cp: int
    epw: int
    smem: int
    blocks: int
    threads: int
    cluster: int = 1
    images: int = 0
    span: bool = False
    split: int = 1


def compute_capability(device: int) -> int:
    from ._row_norm import _compute_capability

    return _compute_capability(device)


def _cluster_shares(O: int, clusters: tuple):
    """(K, OB) for one block a stage, then each of ``clusters``: K blocks a stage, OB of the O
    images (channels last: positions) a block; up to the first K that would leave a block of
    the cluster none."""
    for K in (1, *clusters):
        OB = -(-O // K)
        if K > 1 and (K - 1) * OB >= O:
            return
        yield K, OB


def _staged(lay: Layout, itemsize: int, acc_size: int, phase: int, device: int, tensors: int = 1) -> Staged | None:
    """bn_fwd_staged's launch (``tensors`` = 1: x staged) or bn_bwd_staged's (2: x and dy), or
    None where it does not apply: not dense channel-major within an image (sc == I), pointers
    off 16 bytes, image strides off 4 bytes, a stage too large for STAGED_MIN_RESIDENT blocks
    an SM (the forward's: even split over a cluster of STAGED_CLUSTERS), or channel walks in
    words under STAGED_MIN_WORD bytes (there: bn_fwd_staged_span's / bn_bwd_staged_span's). The widest copies whose stage fits (STAGED_PREFER_WIDE;
    else the fewest channels), G the fewest channels whose spans are whole copies; one block
    a stage where that fits, else the smallest cluster whose blocks' shares fit."""
    if not (USE_STAGED if tensors == 1 else USE_STAGED_BWD) or lay.channels_last or phase != 0 or lay.sc != lay.I:
        return None
    run = lay.I * itemsize
    strides = lay.so * itemsize if lay.O > 1 else 0
    per_block, per_sm = smem_limits(device)
    limit = min(per_block, per_sm // STAGED_MIN_RESIDENT - STAGED_RESERVED_SMEM)
    span_clusters = STAGED_CLUSTERS if compute_capability(device) >= STAGED_CLUSTER_MIN_SM else ()
    clusters = span_clusters if tensors == 1 else ()  # bn_bwd_staged takes none

    def span() -> Staged | None:  # the span kernels' launch for this plane
        return _staged_span(lay, itemsize, acc_size, limit, span_clusters, tensors,
                            STAGED_SPAN_RESIDENT * sm_count(device))

    # words: the widest that divide every run and image stride (the residual is read in them)
    word = next(w for w in (16, 8, 4, 2, 1) if w >= itemsize and w % itemsize == 0 and run % w == 0 and
                strides % w == 0)
    # the forward's own bound: float64 has no span kernels, and a plane they do not take
    # between the two bounds stays with bn_fwd_staged
    fwd_min_word = STAGED_MIN_WORD if STAGED_FWD_MIN_WORD is None or itemsize not in (2, 4) else STAGED_FWD_MIN_WORD
    if word < (STAGED_MIN_WORD if tensors == 2 else max(STAGED_MIN_WORD, fwd_min_word)):
        spanned = span()
        if spanned is not None or word < STAGED_MIN_WORD:
            return spanned
    best = None
    for K, OB in _cluster_shares(lay.O, clusters):
        for cp in (16, 8, 4):
            G = cp // math.gcd(cp, run)  # the fewest channels whose span is whole copies
            smem = tensors * OB * G * run
            if strides % cp or smem > limit:
                continue
            if best is None or G < best[0] and not STAGED_PREFER_WIDE:
                best = (G, cp, smem, K, OB)
        if best:
            break
    if best is None:
        if tensors == 2 and STAGED_SPAN_WIDE_BWD and itemsize in STAGED_SPAN_WIDE_BWD_ITEMSIZES and span_clusters:
            return span()
        return None
    G, cp, smem, K, OB = best
    if tensors == 1 and word == 16 and clusters and _span_forward_whole_words(lay, itemsize, K):
        spanned = span()
        if spanned is not None:
            return spanned
    small = (K == 1 and per_sm // (smem + STAGED_RESERVED_SMEM) >= STAGED_SMALL_BLOCK_MIN_RESIDENT
             and G <= STAGED_BLOCKS[0] // 32)
    return Staged(G, cp, word // itemsize, smem, -(-lay.C // G) * K, STAGED_BLOCKS[0] if small else STAGED_BLOCKS[1],
                  K, OB if K > 1 else 0)


def _span_forward_whole_words(lay: Layout, itemsize: int, cluster: int) -> bool:
    """Whether a forward of 16-byte words whose stage takes ``cluster`` blocks goes to the
    span kernels instead (STAGED_SPAN_FWD_WHOLE_WORDS; measured on sm_90 alone, where clusters are)."""
    if not STAGED_SPAN_FWD_WHOLE_WORDS or itemsize not in (2, 4) or lay.O < STAGED_SPAN_FWD_MIN_IMAGES:
        return False
    return itemsize == 4 or cluster > 1 or lay.I * itemsize // 16 >= STAGED_SPAN_FWD_HALF_MIN_WORDS


def staged_span_static_smem(acc_size: int, clustered: bool, backward: bool = False) -> int:
    """bn_fwd_staged_span's (bn_bwd_staged_span's) static shared memory, its SpanScratch: a
    word's four partial sums a thread, four (six) constants a channel, the cluster's exchange
    (one unused value unclustered), bytes, in 16-byte units as ptxas reports it
    (tests/test_compile.py checks the two agree)."""
    values = 4 * STAGED_SPAN_BLOCK + (6 if backward else 4) * 16 + (2 * 16 if clustered else 1)
    return -(-values * acc_size // 16) * 16


def _staged_span(lay: Layout, itemsize: int, acc_size: int, limit: int, clusters: tuple, tensors: int,
                 slots: int) -> Staged | None:
    """bn_fwd_staged_span's launch (``tensors`` = 1) or bn_bwd_staged_span's (2: x and dy),
    ``limit`` a block's dynamic shared memory, ``clusters`` the cluster sizes the device takes,
    ``slots`` the blocks it holds at once; or None where it does not apply: USE_STAGED_SPAN
    (_BWD) off, runs shorter than a 16-byte word (a word would touch three channels), image
    strides off 16 bytes, a span of more words than threads, or no stage of 16-byte copies
    that fits. G the fewest channels whose span is whole words; one block a stage where that
    fits, else the smallest cluster whose blocks' shares fit; then (STAGED_SPAN_FILL) the
    largest cluster whose grid still fits ``slots``."""
    vec = 16 // itemsize
    run = lay.I * itemsize
    G = 16 // math.gcd(16, run)
    words = G * lay.I // vec
    split = _span_split(words) if G == 1 and (tensors == 2 or STAGED_SPAN_FWD_PIECES) else 1
    if (not (USE_STAGED_SPAN if tensors == 1 else USE_STAGED_SPAN_BWD) or lay.I < vec
            or (lay.O > 1 and lay.so * itemsize % 16) or words // split > STAGED_SPAN_BLOCK):
        return None
    stages, chosen = -(-lay.C // G), None
    for K, OB in _cluster_shares(lay.O, clusters):
        smem = tensors * OB * G * run
        if smem > limit - staged_span_static_smem(acc_size, K > 1, tensors == 2):
            continue
        if chosen is not None and stages * K > slots:
            break
        chosen = (K, OB, smem)
        if not STAGED_SPAN_FILL or stages * K >= slots:
            break
    if chosen is None:
        return None
    K, OB, smem = chosen
    return Staged(G, 16, vec, smem, stages * K, STAGED_SPAN_BLOCK, K, OB if K > 1 else 0, True, split)


def _span_split(words: int) -> int:
    """The pieces the span kernels walk a one-channel plane of ``words`` 16-byte words in
    (their M; the forward's with STAGED_SPAN_FWD_PIECES): 1 where the plane has no more
    words than a block has threads (unless STAGED_SPAN_SPLIT_FILL), else the fewest pieces
    of whole words that do; with STAGED_SPAN_SPLIT_FILL, the pieces that leave the fewest
    threads without a word (the fewest pieces of those)."""
    pieces = [m for m in range(1, words + 1) if words % m == 0 and words // m <= STAGED_SPAN_BLOCK]
    if not STAGED_SPAN_SPLIT_FILL:  # (words pieces of one word always fit)
        return pieces[0]
    return min(pieces, key=lambda m: (STAGED_SPAN_BLOCK % (words // m), m))


class StagedCl(NamedTuple):
    """The launch of bn_fwd_staged_cl or bn_bwd_staged_cl: stages of ``channels`` (G; 1 <<
    ``wshift`` 16-byte words a position), ``smem`` bytes a block, ``blocks`` blocks of
    ``threads``, ``cluster`` blocks a stage, ``positions`` a block (OB); ``grid_blocks``: where
    nonzero, the stage's blocks meet in global memory (scratch from staged_cl_scratch), not
    as a thread-block cluster, and this many blocks (whole stages' worth, all resident: a
    cooperative launch) walk the stages."""

    channels: int
    wshift: int
    smem: int
    blocks: int
    threads: int
    cluster: int
    positions: int
    grid_blocks: int = 0

    @property
    def grid(self) -> bool:
        return self.grid_blocks > 0


_COUNTER_ALIGN = 256  # a scratch block's arrival counters, then its sums 256-byte aligned


def _counter_bytes(words: int) -> int:
    """A scratch block's ``words`` 4-byte arrival counters, rounded up so the sums after them
    align."""
    return -(-words * 4 // _COUNTER_ALIGN) * _COUNTER_ALIGN


def _cl_counter_bytes(st: StagedCl) -> int:
    """The grid exchange's counters: one a stage."""
    return _counter_bytes(st.blocks // st.cluster)


STAGED_CL_FWD_ROUNDS = 2  # the forward's exchange rounds: its sums, then (v53) again about far pivots


def staged_cl_scratch(st: StagedCl, acc, rounds: int = 1) -> tuple:
    """The (shape, dtype) of a grid-exchange launch's scratch block: a counter a stage (the
    host zeroes them), then 2 * G sums a block in the accumulation dtype, for each of
    ``rounds`` exchanges (the forward's STAGED_CL_FWD_ROUNDS, each its own region)."""
    acc = numpy.dtype(acc)
    return ((_cl_counter_bytes(st) // acc.itemsize + rounds * st.blocks * 2 * st.channels,), acc)


def _cl_exchange(st: StagedCl, acc, alloc, stream: int, rounds: int = 1) -> tuple:
    """(parts, counters) pointers for the kernels: a zeroed scratch block where the stage's
    blocks meet in global memory, (0, 0) where they are a cluster or one block."""
    if not st.grid:
        return 0, 0
    block = alloc(*staged_cl_scratch(st, acc, rounds))
    stages = st.blocks // st.cluster
    zero_async(block, 4 * stages, stream)
    return block + _cl_counter_bytes(st), block


def staged_cl_static_smem(itemsize: int, acc_size: int, clustered: bool, threads: int = 0) -> int:
    """The static shared memory of bn_fwd_staged_cl / bn_bwd_staged_cl (their ClScratch: red,
    xpart, the cluster's totals or one unused value, cons), bytes, in 16-byte units as ptxas
    reports it (tests/test_compile.py checks the two agree)."""
    most = STAGED_CL_LINE // itemsize
    values = most * (2 * (threads or STAGED_CL_BLOCK) // 32 + 2 + 3) + (2 * most if clustered else 1)
    return -(-values * acc_size // 16) * 16


def _staged_cl(lay: Layout, itemsize: int, acc_size: int, phase: int, device: int,
               tensors: int = 1) -> StagedCl | None:
    """bn_fwd_staged_cl's launch (``tensors`` = 1) or bn_bwd_staged_cl's (2: x and dy), or
    None where it does not apply: not channels last, pointers or the position stride off 16
    bytes, or no stage whose shares fit (see STAGED_CL_SPANS)."""
    if not (USE_STAGED_CL if tensors == 1 else USE_STAGED_CL_BWD) or not lay.channels_last or phase != 0:
        return None
    if tensors == 2 and itemsize > STAGED_CL_BWD_MAX_ITEMSIZE:
        return None
    if (lay.O > 1 and lay.so * itemsize % 16) or lay.O >= 2**31:
        return None
    vec = 16 // itemsize
    words = 1 << (-(-lay.C // vec) - 1).bit_length()  # a power of two covering the channels
    per_block, per_sm = smem_limits(device)
    clusters = STAGED_CL_CLUSTERS if compute_capability(device) >= STAGED_CLUSTER_MIN_SM else ()
    grid_only = STAGED_CL_GRID_SHARES if clusters and USE_STAGED_CL_GRID else ()
    kinds = ((clusters, False), (grid_only, True))
    # few channels: one narrower span covers them all (the same span tried once)
    spans = sorted({min(words, span // 16) for span in STAGED_CL_SPANS}, reverse=True)
    tries = ([(wpp, *kind, STAGED_CL_GRID_MAX_ROUNDS) for wpp in spans for kind in kinds] if STAGED_CL_SPAN_FIRST
             else [(wpp, *kind, STAGED_CL_GRID_MAX_ROUNDS) for kind in kinds for wpp in spans])
    if STAGED_CL_GRID_FALLBACK_ROUNDS > STAGED_CL_GRID_MAX_ROUNDS:  # v47: then more rounds, not the passes
        tries += [(wpp, grid_only, True, STAGED_CL_GRID_FALLBACK_ROUNDS) for wpp in spans]
    for wpp, shares, only_grid, max_rounds in tries:
        G = wpp * vec
        if only_grid and wpp < words and wpp * 16 < STAGED_CL_GRID_MIN_SPAN:
            continue
        for K, OB in _cluster_shares(lay.O, shares):
            if only_grid and K == 1:
                continue
            static = staged_cl_static_smem(itemsize, acc_size, K > 1)
            limit = min(per_block, per_sm // STAGED_CL_MIN_RESIDENT - STAGED_RESERVED_SMEM) - static
            smem = tensors * OB * G * itemsize
            if smem <= limit:
                stages = -(-lay.C // G)
                # the persistent grid: whole stages of blocks, as many an SM as their shared
                # memory allows, at most STAGED_CL_MIN_RESIDENT (the kernels' registers are
                # bounded for that many)
                resident = min(per_sm // (smem + static + STAGED_RESERVED_SMEM), STAGED_CL_MIN_RESIDENT)
                groups = min(stages, resident * sm_count(device) // K)
                if only_grid and (not groups or -(-stages // groups) > max_rounds):
                    break  # more blocks a stage only leave fewer stages a round
                grid_blocks = groups * K if USE_STAGED_CL_GRID and K > 1 and groups else 0
                return StagedCl(G, wpp.bit_length() - 1, smem, stages * K, STAGED_CL_BLOCK, K, OB, grid_blocks)
    return None


class Plan(NamedTuple):
    lay: Layout
    vec: int
    ip: int  # nc: packs covering a run of I elements (I / vec when every run starts aligned)
    chunks: int
    per_chunk: int  # packs (nc) or positions (cl) a block
    grid_y: int  # channels (nc, launched in slices of MAX_GRID_Y) or channel tiles (cl)
    cshift: int  # cl: log2 of the channel packs across a block
    t: str
    w: str
    acc: numpy.dtype
    flat_len: int  # the flat apply passes' piece length in elements, 0 when they do not apply
    stats: FlatStats | None  # bn_stats_flat's pieces, None when the statistics take bn_stats_nc / _cl
    sums: FlatStats | None  # bn_bwd_sums_flat's, None when the backward sums take bn_bwd_sums_nc / _cl
    staged: Staged | None  # bn_fwd_staged's launch, None when the training forward takes the passes
    staged_bwd: Staged | None  # bn_bwd_staged's, None when the backward takes the passes
    staged_cl: StagedCl | None = None  # bn_fwd_staged_cl's (channels last), None when the passes
    staged_cl_bwd: StagedCl | None = None  # bn_bwd_staged_cl's
    two_phase: bool = False  # the training forward's passes may take bn_fwd_two_phase_nc (v50)


def pointer_phase(*pointers: int) -> int:
    """The first pointer's address mod 16 when every non-null one shares it (the packs of
    all tensors then line up), else -1."""
    phase = pointers[0] % 16
    return phase if all(p % 16 == phase for p in pointers if p) else -1


def _even_chunks(total: int, chunks: int) -> tuple[int, int]:
    """(chunks, per_chunk): ``total`` split into at most ``chunks`` pieces of per_chunk each
    (the last shorter), none of them empty."""
    per_chunk = -(-total // chunks)
    return -(-total // per_chunk), per_chunk


@held_with_modules
@functools.lru_cache(maxsize=1024)
def plan(lay: Layout, dtype, wdtype, phase: int, device: int) -> Plan:
    """Pack width, block shape, chunking and grid; ``phase`` from pointer_phase."""
    from .._config import max_vec

    dtype = numpy.dtype(dtype)
    itemsize = dtype.itemsize
    target = (BLOCKS_PER_SM_CL if lay.channels_last else BLOCKS_PER_SM) * sm_count(device)
    if lay.channels_last:
        vec = pick_vec(itemsize, lay.C, [(1 if phase else 0, itemsize)], (lay.so,))
        lanes = -(-lay.C // vec)
        cshift = min(CL_MAX_LANES, 1 << (lanes - 1).bit_length()).bit_length() - 1
        grid_y = -(-lanes >> cshift)
        ip = 1
        total, trip = lay.O, BLOCK >> cshift  # positions; positions a loop trip of the block
    else:
        if lay.I >= 2**31 - 64:  # the kernels count a run's packs in 32 bits
            raise ValueError(f"x: {lay.I} elements a channel in one contiguous run is more than the kernels "
                             "address (2**31 - 64)")
        vec = max_vec(itemsize) if phase >= 0 and phase % itemsize == 0 else 1
        aligned = phase == 0 and lay.I % vec == 0 and lay.so % vec == 0 and lay.sc % vec == 0
        # runs off pack boundaries: enough packs for any start, the ends masked in the kernels
        ip = lay.I // vec if aligned else -(-(lay.I + vec - 1) // vec)
        cshift, grid_y = 0, lay.C
        total, trip = lay.O * ip, BLOCK  # packs of a channel; packs a trip
    chunks = max(1, min(-(-target // grid_y), total // (trip * MIN_TRIPS)))
    chunks, per_chunk = _even_chunks(total, chunks)
    if grid_y > MAX_GRID_Y and lay.channels_last:
        raise ValueError(f"x: {lay.C} channels is more than the channels-last kernels address")
    flat_len = _flat_len(lay, vec, phase, max_vec(itemsize))
    flat_dtype = dtype.name in FLAT_STATS_DTYPES
    stats = _flat_stats(lay, vec, flat_len, FLAT_STATS_PACKS, device) if flat_dtype and USE_FLAT_STATS else None
    sums = _flat_stats(lay, vec, flat_len, FLAT_SUMS_PACKS, device) if flat_dtype and USE_FLAT_SUMS else None
    acc = acc_dtype(dtype)
    return Plan(lay, vec, ip, chunks, per_chunk, grid_y, cshift, dtype.name, numpy.dtype(wdtype).name, acc,
                flat_len, stats, sums, _staged(lay, itemsize, acc.itemsize, phase, device),
                _staged(lay, itemsize, acc.itemsize, phase, device, 2),
                _staged_cl(lay, itemsize, acc.itemsize, phase, device),
                _staged_cl(lay, itemsize, acc.itemsize, phase, device, 2),
                _two_phase_applies(lay, dtype.name, vec * itemsize))


def _flat_stats(lay: Layout, vec: int, flat_len: int, packs: int, device: int) -> FlatStats | None:
    """bn_stats_flat's (or bn_bwd_sums_flat's) pieces of ``packs`` packs a thread and image
    groups, or None where it does not apply: not the flat passes, planes longer than
    FLAT_STATS_MAX_I (the per-channel sums' blocks then have packs enough), or C * I not a
    multiple of the pack (images would not share their packs)."""
    CI = lay.C * lay.I
    if not (flat_len and lay.I <= FLAT_STATS_MAX_I and CI % vec == 0):
        return None
    length = min(BLOCK * packs * vec, (FLAT_CHANNELS - 2) * lay.I // vec * vec)
    if lay.I > length:  # a channel would span three pieces
        return None
    n = pieces(lay, length)
    # as many image groups as keep the grid within the target (a second wave of a few blocks
    # would double the pass), the images spread evenly over them
    groups = max(1, min(lay.O, int(FLAT_STATS_BLOCKS_PER_SM * sm_count(device)) // n))
    images = -(-lay.O // groups)
    groups = -(-lay.O // images)
    return FlatStats(length, images, groups, 2 * groups <= FLAT_FOLD_CHUNKS)


def _flat_len(lay: Layout, vec: int, phase: int, widest: int) -> int:
    """The flat apply passes' piece length (elements of one image), or 0 where they do not
    apply: x not dense channel-major, a pointer off a 16-byte boundary, narrow packs, runs
    shorter than a pack (a pack would span more than two channels), or an image of 2^31
    elements or more (the kernels index within an image in 32 bits), or images too small to
    give a block FLAT_MIN_PACKS packs a thread (pieces do not span images)."""
    CI = lay.C * lay.I
    if (not USE_FLAT or lay.channels_last or phase != 0 or vec != widest or vec == 1 or lay.I < vec
            or lay.sc != lay.I or (lay.O > 1 and lay.so != CI) or CI >= 2**31 - BLOCK * vec
            or CI < FLAT_MIN_PACKS * BLOCK * vec):
        return 0
    per_channel_cap = (FLAT_CHANNELS - 2) * lay.I // vec * vec  # piece ends land anywhere in a run
    return min(BLOCK * FLAT_PACKS * vec, per_channel_cap)


def _kernel(name: str, p: Plan, device: int, act=None, residual=None) -> int:
    """A pass's kernel; ``act`` (an activation id) picks the ACT class of those that take one,
    ``residual`` the build with or without the residual of those that have both."""
    args = [c_type(p.t)] + ([c_type(p.w)] if act is not None else []) + [str(p.vec)]
    if act is not None:
        args.append(str(act_class(act)))
    if name in RESIDUAL_APPLY_KERNELS:
        args.append(_b(residual or not SPECIALIZE_RESIDUAL))
    return function_ptr(KERNEL_FILE, f"{name}<{', '.join(args)}>", device)


def _slices(p: Plan):
    """(first channel, channel count) of each launch: grid.y holds at most MAX_GRID_Y."""
    if p.lay.channels_last:
        yield 0, p.lay.C
        return
    for c0 in range(0, p.lay.C, MAX_GRID_Y):
        yield c0, min(MAX_GRID_Y, p.lay.C - c0)


def _shape_args(p: Plan, per_chunk: int | None = None):
    """The layout arguments after a kernel's pointers (``per_chunk``: a pass's own)."""
    lay = p.lay
    if lay.channels_last:
        return (lay.so, lay.C, lay.O, per_chunk or p.per_chunk, p.cshift)
    return (lay.so, lay.sc, lay.I, p.ip, lay.O * p.ip, per_chunk or p.per_chunk)


def _cl_chunks(p: Plan, kernel: int, device: int) -> tuple[int, int]:
    """(chunks, per_chunk) of a channels-last pass: the plan's, held to the blocks ``kernel``
    fits at once (CL_GRID_FITS), whole chunks of positions a channel tile, each at least
    MIN_TRIPS loop trips."""
    if not CL_GRID_FITS:
        return p.chunks, p.per_chunk
    fit = blocks_per_sm(kernel, BLOCK) * sm_count(device)
    total, trip = p.lay.O, BLOCK >> p.cshift
    chunks = max(1, min(p.chunks, fit // p.grid_y, total // (trip * MIN_TRIPS)))
    return _even_chunks(total, chunks)


def _nc_chunks(p: Plan, kernel: int, device: int, bwd_sums: bool = False) -> tuple[int, int | None]:
    """(chunks, per_chunk) of a channel-major per-channel pass: the plan's, held to the
    blocks ``kernel`` fits at once where NC_GRID_FITS (NC_GRID_FITS_BWD_SUMS for the
    backward's sums pass, ``bwd_sums``; per_chunk None: the plan's)."""
    if not (NC_GRID_FITS_BWD_SUMS if bwd_sums else NC_GRID_FITS):
        return p.chunks, None
    fit = blocks_per_sm(kernel, BLOCK) * sm_count(device)
    chunks = max(1, min(p.chunks, fit // min(p.lay.C, MAX_GRID_Y)))
    if chunks == p.chunks:
        return p.chunks, None
    total = p.lay.O * p.ip
    return _even_chunks(total, chunks)


def _two_phase_applies(lay: Layout, dtype: str, pack_bytes: int) -> bool:
    """Whether the training forward's passes may run as bn_fwd_two_phase_nc: channel-major x
    in 16-byte packs (its ring's), a dtype it is built for, a CUDA GPU (its grid barrier)."""
    return (USE_TWO_PHASE and not lay.channels_last and dtype in TWO_PHASE_DTYPES and pack_bytes == 16
            and not _on_hip())


def _on_hip() -> bool:
    from cupy_backends.cuda.api import runtime

    return bool(runtime.is_hip)


def _two_phase_kernel(p: Plan, act: int, rdtype: str, device: int, residual: bool) -> int:
    return function_ptr(KERNEL_FILE, f"bn_fwd_two_phase_nc<{c_type(p.t)}, {c_type(p.w)}, {c_type(rdtype)}, "
                        f"{p.vec}, {act_class(act)}, {_b(residual)}>", device)


@held_with_modules
@functools.lru_cache(maxsize=1024)
def _two_phase_grid(p: Plan, fn: int, device: int) -> tuple[int, int]:
    """(chunks, packs a chunk) of bn_fwd_two_phase_nc: every block resident at once (a block
    a channel and chunk: the plan's chunks at most, each at least MIN_TRIPS loop trips), or
    (0, 0) where the channels outnumber the blocks that fit."""
    fit = blocks_per_sm(fn, BLOCK) * sm_count(device)
    lay = p.lay
    if lay.C > fit:
        return 0, 0
    total = lay.O * p.ip
    return _even_chunks(total, max(1, min(p.chunks, fit // lay.C, total // (BLOCK * MIN_TRIPS))))


# Words from one channel's arrival counter to the next (kTwoPhaseCounterWords in
# kernels/batch_norm.cu): each on its own 128-byte L2 line.
TWO_PHASE_COUNTER_WORDS = 32


def _two_phase_counters(p: Plan) -> int:
    """Words of arrival counters, a channel's padded to its own line."""
    return p.lay.C * TWO_PHASE_COUNTER_WORDS


def _two_phase_counter_bytes(p: Plan) -> int:
    return _counter_bytes(_two_phase_counters(p))


def two_phase_scratch(p: Plan, chunks: int) -> tuple:
    """The (shape, dtype) of bn_fwd_two_phase_nc's scratch block: the arrival
    counters (the host zeroes them), then (sum, sum of squares) a channel and chunk in
    STAT_SUM_DTYPE."""
    return ((_two_phase_counter_bytes(p) // STAT_SUM_BYTES + p.lay.C * chunks * 2,), STAT_SUM_DTYPE)


def _launch_two_phase(p: Plan, x: int, res: int, y: int, w: int, b: int, running_mean: int, running_var: int,
                      rdtype: str, mean: int, rstd: int, factor: float, eps: float, act: int, param: float, alloc,
                      stream: int, device: int) -> bool:
    """bn_fwd_two_phase_nc's launch; False having launched nothing where its grid does not fit
    or the driver refuses it (the caller then runs the passes; forward_scratch lists both
    scratch blocks)."""
    fn = _two_phase_kernel(p, act, rdtype, device, bool(res))
    chunks, per_chunk = _two_phase_grid(p, fn, device)
    if not chunks:
        return False
    lay = p.lay
    block = alloc(*two_phase_scratch(p, chunks))
    zero_async(block, 4 * _two_phase_counters(p), stream)
    args = (x, res, y, lay.so, lay.sc, lay.I, p.ip, lay.O * p.ip, per_chunk, chunks, w, b, act,
            scalar_bits(param, p.acc), _f64(float(lay.O * lay.I)), _f64(eps), _f64(factor), running_mean,
            running_var, mean, rstd, block + _two_phase_counter_bytes(p), block)
    try:
        launch_cooperative(fn, lay.C * chunks, BLOCK, args, stream, 0)
    except CooperativeLaunchRefused:
        return False
    return True


def _off(ptr: int, elements: int, itemsize: int) -> int:
    return ptr + elements * itemsize if ptr else 0


class _Passes(NamedTuple):
    """What a direction launches for one plan, made once (kernel lookups, name strings and
    grids cost more host time than the launches): the first pass, the per-channel pass and
    the apply pass, with each slice's first channel and grid."""

    first: int  # bn_stats (0 in eval) / bn_bwd_sums
    channel: int  # bn_finalize or bn_running_stats / bn_bwd_finalize (0 where the flat pass finalizes)
    apply: int
    slices: tuple  # ((c0, grid), ...)
    shape_args: tuple
    first_chunks: int  # the per-channel first pass's chunks a channel (its partials' count)
    first_slices: tuple  # its ((c0, grid), ...) and layout arguments (a cl pass's own grid)
    first_shape_args: tuple
    t_size: int
    w_size: int
    a_size: int
    act_bits: int  # the activation parameter in the accumulation type's bits


def _flat_folds(p: Plan, first: FlatStats | None) -> bool:
    """Whether the flat apply pass sums the first pass's partials itself (no finalize launch):
    after the per-channel first pass always, after a flat one where its partials are few."""
    return bool(p.flat_len) and (first is None or first.fold)


@held_with_modules
@functools.lru_cache(maxsize=1024)
def _passes(p: Plan, backward: bool, training: bool, act: int, param: float, rdtype: str, device: int,
            residual: bool) -> _Passes:
    """``residual``: the call passes a residual (forward) or wants its gradient (backward)."""
    kind = "cl" if p.lay.channels_last else "nc"
    acc = "double" if p.acc == numpy.float64 else "float"
    if backward:
        first = _kernel(f"bn_bwd_sums_{'flat' if p.sums else kind}", p, device, act)
        # the flat pass takes the finalize's place (its blocks sum the partials they need)
        channel = 0 if _flat_folds(p, p.sums) else function_ptr(KERNEL_FILE, f"bn_bwd_finalize<{acc}, {c_type(p.w)}>",
                                                                 device)
        apply = _kernel(f"bn_bwd_apply_{'flat' if p.flat_len else kind}", p, device, act, residual)
    else:
        first = _kernel(f"bn_stats_{'flat' if p.stats else kind}", p, device) if training else 0
        if not training:
            channel = function_ptr(KERNEL_FILE, f"bn_running_stats<{acc}, {c_type(rdtype)}>", device)
        elif _flat_folds(p, p.stats):  # the flat pass takes the finalize's place
            channel = 0
        else:
            channel = function_ptr(KERNEL_FILE, f"bn_finalize<{c_type(p.t)}, {c_type(rdtype)}>", device)
        if p.flat_len:
            apply = function_ptr(KERNEL_FILE, f"bn_apply_flat<{c_type(p.t)}, {c_type(p.w)}, {c_type(rdtype)}, {p.vec}, "
                                 f"{act_class(act)}>", device)
        else:
            apply = _kernel(f"bn_apply_{kind}", p, device, act, residual)
    def grid(kernel, first_pass=False):  # (chunks, slices, shape arguments) of a per-channel pass
        if not kernel:
            chunks, per_chunk = p.chunks, None
        elif p.lay.channels_last:
            chunks, per_chunk = _cl_chunks(p, kernel, device)
        else:
            chunks, per_chunk = _nc_chunks(p, kernel, device, backward and first_pass)
        slices = tuple((c0, (chunks, cn if not p.lay.channels_last else p.grid_y)) for c0, cn in _slices(p))
        return chunks, slices, _shape_args(p, per_chunk)

    first_chunks, first_slices, first_shape_args = grid(first, True)
    _, slices, shape_args = grid(0 if p.flat_len else apply)
    return _Passes(first, channel, apply, slices, shape_args, first_chunks, first_slices, first_shape_args,
                   numpy.dtype(_np(p.t)).itemsize, numpy.dtype(_np(p.w)).itemsize, p.acc.itemsize,
                   scalar_bits(param, p.acc))


def forward_scratch(p: Plan, training: bool, act: int, param: float, rdtype, device: int, residual: bool) -> list:
    """The (shape, dtype) of each ``alloc`` forward makes with this plan, in order, for a
    frontend that must size its scratch beforehand (JAX): the first pass's partials. A
    grid-only stage, and bn_fwd_two_phase_nc, list the passes' after their own (the passes
    run where the driver refuses their launch, see _launch_staged and _launch_two_phase)."""
    listed = []
    if training and p.staged_cl:
        listed = [staged_cl_scratch(p.staged_cl, p.acc, STAGED_CL_FWD_ROUNDS)] if p.staged_cl.grid else []
        if not _grid_only(p.staged_cl):
            return listed
    elif not training or p.staged:
        return []
    elif p.two_phase:
        fn = _two_phase_kernel(p, act, numpy.dtype(rdtype).name, device, residual)
        chunks = _two_phase_grid(p, fn, device)[0]
        listed = [two_phase_scratch(p, chunks)] if chunks else []
    q = _passes(p, False, training, act, param, numpy.dtype(rdtype).name, device, residual)
    return [*listed, ((p.lay.C, p.stats.chunks if p.stats else q.first_chunks, 2), STAT_SUM_DTYPE)]


def backward_scratch(p: Plan, training: bool, act: int, param: float, device: int, residual_grad: bool) -> list:
    """backward's ``alloc`` calls, as forward_scratch: the partials, then coef."""
    listed = []
    if p.staged_cl_bwd:
        listed = [staged_cl_scratch(p.staged_cl_bwd, p.acc)] if p.staged_cl_bwd.grid else []
        if not _grid_only(p.staged_cl_bwd):
            return listed
    elif p.staged_bwd:
        return []
    q = _passes(p, True, training, act, param, "", device, residual_grad)
    return [*listed, ((p.lay.C, (p.sums.chunks if p.sums else q.first_chunks) + 1, 2), p.acc)]


def forward(p: Plan, x: int, res: int, y: int, w: int, b: int, running_mean: int, running_var: int, rdtype,
            mean: int, rstd: int, training: bool, factor: float, eps: float, act: int, param: float, alloc,
            stream: int, device: int) -> None:
    """Writes y and mean/rstd (per channel, acc dtype); training also updates the running
    statistics in place (where given)."""
    make_current(device)
    if training and p.staged:
        st, lay = p.staged, p.lay
        args = (x, res, y, lay.so, lay.I, lay.O, lay.C, st.channels, st.split if st.span else st.cp, st.cluster,
                st.images or lay.O, w, b, act,
                scalar_bits(param, p.acc), _f64(eps), _f64(factor), running_mean, running_var, mean, rstd)
        _launch_staged(_staged_kernel(p, act, numpy.dtype(rdtype).name, device), st, args, stream)
        return
    if training and p.staged_cl:
        st, lay = p.staged_cl, p.lay
        args = (x, res, y, lay.so, lay.O, lay.C, st.channels, st.wshift, st.cluster, st.positions, w, b, act,
                scalar_bits(param, p.acc), _f64(eps), _f64(factor), running_mean, running_var, mean, rstd,
                *_cl_exchange(st, p.acc, alloc, stream, STAGED_CL_FWD_ROUNDS))
        if _launch_staged(_staged_cl_kernel(p, act, numpy.dtype(rdtype).name, device), st, args, stream):
            return
        # (refused: a grid-only stage's cooperative launch, see _launch_staged) the passes
    elif training and p.two_phase and _launch_two_phase(p, x, res, y, w, b, running_mean, running_var,
                                                        numpy.dtype(rdtype).name, mean, rstd, factor, eps, act,
                                                        param, alloc, stream, device):
        return
    q = _passes(p, False, training, act, param, numpy.dtype(rdtype).name, device, bool(res))
    lay, t_size, a_size, w_size = p.lay, q.t_size, q.a_size, q.w_size
    sc = 0 if lay.channels_last else lay.sc  # cl: one launch, channel offsets inside
    part = 0
    count = _f64(float(lay.O * lay.I))
    chunks = p.stats.chunks if p.stats else q.first_chunks
    if training:
        part = alloc((lay.C, chunks, 2), STAT_SUM_DTYPE)
        if p.stats:
            st = p.stats
            launch(q.first, st.grid(lay), BLOCK,
                   (x, lay.C * lay.I, lay.I, st.length, lay.O, st.images, st.groups, part),
                   stream)
        else:
            for c0, grid in q.first_slices:
                launch(q.first, grid, BLOCK, (_off(x, c0 * sc, t_size), *q.first_shape_args,
                                              _off(part, c0 * chunks * 2, STAT_SUM_BYTES)), stream)
        if q.channel:
            launch(q.channel, -(-lay.C // 4), 128,
                   (x, 1 if lay.channels_last else lay.sc, part, chunks, lay.C, count, _f64(eps), _f64(factor),
                    running_mean, running_var, mean, rstd), stream)
    else:
        launch(q.channel, -(-lay.C // 128), 128, (running_mean, running_var, lay.C, _f64(eps), mean, rstd), stream)
    if p.flat_len:
        CI = lay.C * lay.I
        fold = training and not q.channel  # the apply sums the partials itself, else reads mean / rstd
        launch(q.apply, _flat_grid(p), BLOCK, (x, res, y, CI, lay.I, p.flat_len, lay.O, mean, rstd, w, b, act,
                                              q.act_bits, part if fold else 0, chunks, count, _f64(eps),
                                              _f64(factor), running_mean if fold else 0,
                                              running_var if fold else 0), stream)
        return
    for c0, grid in q.slices:
        xo = c0 * sc
        launch(q.apply, grid, BLOCK,
               (_off(x, xo, t_size), _off(res, xo, t_size), _off(y, xo, t_size), *q.shape_args,
                _off(mean, c0, a_size), _off(rstd, c0, a_size), _off(w, c0, w_size), _off(b, c0, w_size), act,
                q.act_bits), stream)


@held_with_modules
@functools.lru_cache(maxsize=1024)
def _staged_kernel(p: Plan, act: int, rdtype: str, device: int, backward: bool = False) -> int:
    """bn_fwd_staged (bn_bwd_staged) for the plan, allowed its shared memory."""
    st = p.staged_bwd if backward else p.staged
    if st.span:
        clustered = _b(st.cluster > 1)
        name = (f"bn_bwd_staged_span<{st.threads}, {c_type(p.t)}, {c_type(p.w)}, {act_class(act)}, {clustered}>"
                if backward else f"bn_fwd_staged_span<{st.threads}, {c_type(p.t)}, {c_type(p.w)}, {c_type(rdtype)}, "
                f"{act_class(act)}, {clustered}>")
        return _smem_kernel(name, st.smem, device)
    name = (f"bn_bwd_staged<{st.threads}, {c_type(p.t)}, {c_type(p.w)}, {st.epw}, {act_class(act)}>" if backward else
            f"bn_fwd_staged<{st.threads}, {c_type(p.t)}, {c_type(p.w)}, {c_type(rdtype)}, {st.epw}, {act_class(act)}, "
            f"{_b(st.cluster > 1)}>")
    return _smem_kernel(name, st.smem, device)


@held_with_modules
@functools.lru_cache(maxsize=1024)
def _staged_cl_kernel(p: Plan, act: int, rdtype: str, device: int, backward: bool = False) -> int:
    """bn_fwd_staged_cl (bn_bwd_staged_cl) for the plan, allowed its shared memory."""
    st = p.staged_cl_bwd if backward else p.staged_cl
    clustered = _b(st.cluster > 1)
    if backward:
        name = f"bn_bwd_staged_cl<{st.threads}, {c_type(p.t)}, {c_type(p.w)}, {act_class(act)}, {clustered}>"
    else:
        name = (f"bn_fwd_staged_cl<{st.threads}, {c_type(p.t)}, {c_type(p.w)}, {c_type(rdtype)}, {act_class(act)}, "
                f"{clustered}>")
    return _smem_kernel(name, st.smem, device)


def _smem_kernel(name: str, smem: int, device: int) -> int:
    """A staged kernel, allowed ``smem`` bytes of dynamic shared memory."""
    fn = function_ptr(KERNEL_FILE, name, device)
    allow_smem(fn, smem)
    return fn


def _grid_only(st: StagedCl) -> bool:
    """Whether a stage spans more blocks than a cluster holds (STAGED_CL_GRID_SHARES): only the
    cooperative grid's exchange in global memory serves it."""
    return st.cluster > max(STAGED_CL_CLUSTERS)


@held_with_modules
@functools.lru_cache(maxsize=1024)
def _grid_pays(fn: int, st: StagedCl) -> bool:
    """STAGED_CL_GRID_RULE for a planned grid: fewer rounds of the stages than the clusters'
    waves (the driver's count of clusters at once; without it, the grid's own), and at most
    STAGED_CL_GRID_MAX_ROUNDS."""
    if _grid_only(st):
        return True  # no cluster launch to compare with (STAGED_CL_GRID_SHARES: its rounds planned)
    stages, per_round = st.blocks // st.cluster, st.grid_blocks // st.cluster
    rounds = -(-stages // per_round)
    active = max_active_clusters(fn, st.threads, st.smem, st.cluster, at_launch=True) or per_round
    return rounds < -(-stages // active) and rounds <= STAGED_CL_GRID_MAX_ROUNDS


def _launch_staged(fn: int, st: Staged | StagedCl, args: tuple, stream: int) -> bool:
    """A staged kernel's launch: in thread-block clusters where its stages span several blocks,
    or as a cooperative grid where they meet in global memory (StagedCl.grid, where it pays).
    Where the driver refuses the cooperative launch (fewer blocks resident than planned: an
    MPS client's share of the SMs, a GPU's other work) a clustered stage takes the cluster
    exchange; a grid-only stage has none, and this returns False having launched nothing:
    the caller runs the passes (forward_scratch / backward_scratch list their scratch too)."""
    if isinstance(st, StagedCl) and st.grid:
        if not STAGED_CL_GRID_RULE or _grid_pays(fn, st):
            try:
                launch_cooperative(fn, st.grid_blocks, st.threads, args, stream, st.smem)
                return True
            except CooperativeLaunchRefused:
                if _grid_only(st):
                    return False
        args = (*args[:-2], 0, 0)
    if st.cluster > 1:
        launch_cluster(fn, st.blocks, st.threads, args, stream, st.smem, st.cluster)
    else:
        launch(fn, st.blocks, st.threads, args, stream, st.smem)
    return True


def _flat_grid(p: Plan) -> int:
    """The flat passes' blocks: every image's pieces."""
    return pieces(p.lay, p.flat_len) * p.lay.O


def backward(p: Plan, dy: int, x: int, res: int, dx: int, dres: int, w: int, b: int, mean: int, rstd: int,
             dw: int, db: int, training: bool, act: int, param: float, alloc, stream: int, device: int) -> None:
    """Writes dx, and dweight / dbias / dresidual where their pointers are non-null."""
    make_current(device)
    if p.staged_bwd:
        st, lay = p.staged_bwd, p.lay
        layout_args = (st.channels, st.cluster, st.images or lay.O, st.split) if st.span else (st.channels, st.cp)
        _launch_staged(_staged_kernel(p, act, "", device, True), st,
                       (dy, x, res, dx, dres, lay.so, lay.I, lay.O, lay.C, *layout_args, mean, rstd, w, b, act,
                        scalar_bits(param, p.acc), int(training), dw, db), stream)
        return
    if p.staged_cl_bwd:
        st, lay = p.staged_cl_bwd, p.lay
        args = (dy, x, res, dx, dres, lay.so, lay.O, lay.C, st.channels, st.wshift, st.cluster, st.positions, mean,
                rstd, w, b, act, scalar_bits(param, p.acc), int(training), dw, db,
                *_cl_exchange(st, p.acc, alloc, stream))
        if _launch_staged(_staged_cl_kernel(p, act, "", device, True), st, args, stream):
            return
        # (refused: a grid-only stage's cooperative launch, see _launch_staged) the passes
    q = _passes(p, True, training, act, param, "", device, bool(dres))
    lay, t_size, a_size, w_size = p.lay, q.t_size, q.a_size, q.w_size
    sc = 0 if lay.channels_last else lay.sc
    chunks = p.sums.chunks if p.sums else q.first_chunks
    part = alloc((lay.C, chunks + 1, 2), p.acc)  # the partials, then coef [C, 2]
    coef = part + lay.C * chunks * 2 * a_size
    if p.sums:
        st = p.sums
        launch(q.first, st.grid(lay), BLOCK, (dy, x, res, lay.C * lay.I, lay.I, st.length, lay.O, st.images, st.groups,
                                             mean, rstd, w, b, act, q.act_bits, part), stream)
    else:
        for c0, grid in q.first_slices:
            xo = c0 * sc
            launch(q.first, grid, BLOCK,
                   (_off(dy, xo, t_size), _off(x, xo, t_size), _off(res, xo, t_size), *q.first_shape_args,
                    _off(mean, c0, a_size), _off(rstd, c0, a_size), _off(w, c0, w_size), _off(b, c0, w_size), act,
                    q.act_bits, _off(part, c0 * chunks * 2, a_size)), stream)
    count = _f64(float(lay.O * lay.I))
    if q.channel:
        launch(q.channel, -(-lay.C // 4), 128, (part, chunks, lay.C, count, int(training), dw, db, coef), stream)
    if p.flat_len:  # folding the partials itself, or (after bn_bwd_finalize) reading coef
        launch(q.apply, _flat_grid(p), BLOCK, (dy, x, res, dx, dres, lay.C * lay.I, lay.I, p.flat_len, lay.O, mean,
                                              rstd, w, b, act, q.act_bits, 0 if q.channel else part, chunks, count,
                                              int(training), dw, db, coef), stream)
        return
    for c0, grid in q.slices:
        xo = c0 * sc
        launch(q.apply, grid, BLOCK,
               (_off(dy, xo, t_size), _off(x, xo, t_size), _off(res, xo, t_size), _off(dx, xo, t_size),
                _off(dres, xo, t_size), *q.shape_args, _off(mean, c0, a_size), _off(rstd, c0, a_size),
                _off(w, c0, w_size), _off(b, c0, w_size), act, q.act_bits, _off(coef, c0 * 2, a_size)), stream)


def _f64(v: float) -> int:
    return scalar_bits(v, numpy.float64)
