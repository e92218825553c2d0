"""Launch configurations: one place for every threshold the dispatcher uses.

A row (or, on the split path, a tile of a row) is held in registers by a group of ``tpr``
threads, each holding ``packs`` packs of ``vec`` elements. These functions pick the group
from the row length; ``all_tile_configs`` enumerates every configuration they can return,
so CI compiles exactly what the dispatcher may launch.

Thresholds are first choices from the register budget, not yet tuned on a GPU: the
measurements that move them belong in benchmarks/NOTES.md and the comment next to each.
"""
from __future__ import annotations

import dataclasses
import functools

# Packs of 16 bytes give the widest single memory access; at most 4 packs a thread.
MAX_PACK_BYTES = 16
MAX_PACKS = 4


@dataclasses.dataclass(frozen=True)
class PathLimits:
    """How much of a row one thread and one group may hold in registers."""

    max_tpr: int  # threads per row group (a block of that many for the block path)
    max_values: int  # values per thread
    min_block_tpr: int  # the smallest multi-warp row group


# Forward keeps one value array: 32 values (4 packs of 8 half-precision elements) fit in a
# 1024-thread block's 64 registers a thread without spilling (NVRTC -Xptxas -v, sm_90), and
# fewer, fuller threads keep more loads in flight per barrier: the v1 bf16 forward with 16
# values ran at 0.46-0.67 of copy for N <= 4096 (benchmarks/NOTES.md, v4 tests this).
# Two 64-thread rows per block: bf16 N = 2048 forward 0.60 -> 0.75 of copy (v4).
FWD = PathLimits(max_tpr=1024, max_values=32, min_block_tpr=64)
# Backward holds x, dy and two gradient accumulators per value: 16 values keep a 512-thread
# block under the 128 registers a thread may use at that size (measured: 127-128, no spills).
# 64-thread groups made backward slower (bf16 N = 1024: 0.60 -> 0.50 of copy, v4): 128.
BWD = PathLimits(max_tpr=512, max_values=16, min_block_tpr=128)
# Half precision on the partial-row path: one pack of 8 a thread, blocks up to 1024 threads
# (64 registers): LayerNorm bf16 N = 2048 / 4096 / 8192 0.49-0.51 / 0.37-0.39 / 0.31-0.32 ->
# 0.56-0.57 / 0.51-0.54 / 0.43-0.46 of copy in two runs (NOTES v7); fp32 lost with it
# (N = 4096: 0.88-0.90 -> 0.58-0.79). RMSNorm bf16 did not gain then (N = 4096: 0.55 ->
# 0.52), but with rows staged through shared memory its two-pack tiles fell to 0.45 / 0.39 at
# N = 4096 / 8192 where LayerNorm's one-pack tiles rose to 0.63 / 0.53 (v19): both ops now.
BWD_HALF = PathLimits(max_tpr=1024, max_values=8, min_block_tpr=128)


# The full-row forward holds its row in shared memory (norm_fwd_smem, v22) for 16-byte packs
# of these element sizes where the register tile (FWD, whose shape it keeps) spans at least
# this many elements, up to the host's byte limit (_row_norm.ROW_SMEM_MAX). Half precision
# from N = 1: bf16 RMSNorm 0.62-0.82 -> 0.85-0.87 of copy (v22), N = 32768 0.49 -> 0.71 /
# 0.82 (v29). float32 past N = 8192, where the register tile needs 1024-thread blocks:
# LayerNorm 0.74 -> 0.86, RMSNorm 0.77 -> 0.92; at N <= 8192 the two were equal within 0.01
# (0.90-0.92 both), so the register tile stays. Eight packs a thread instead of four lost
# 0.01-0.06 at every N but 512-1024, both dtypes (v31, results/sweep-fwd-smem-tiles-h200.txt).
SMEM_FWD_FROM = {2: 1, 4: 16384}


def smem_fwd_config(n: int, vec: int, itemsize: int, max_bytes: int) -> TileConfig | None:
    """The shared-memory forward's tile for a row of ``n`` elements in packs of ``vec``, or
    None (the register tile, or past it, serves the row)."""
    start = SMEM_FWD_FROM.get(itemsize)
    if start is None or vec * itemsize != MAX_PACK_BYTES:
        return None
    cfg = row_config(n, vec, FWD)
    return cfg if cfg is not None and cfg.tile >= start and _smem_bytes(cfg) <= max_bytes else None


def all_smem_fwd_configs(vec: int, itemsize: int, max_bytes: int) -> list[TileConfig]:
    """Every tile ``smem_fwd_config`` can return for this vec and element size."""
    start = SMEM_FWD_FROM.get(itemsize)
    if start is None or vec * itemsize != MAX_PACK_BYTES:
        return []
    return [c for c in all_tile_configs(vec, FWD) if c.tile >= start and _smem_bytes(c) <= max_bytes]


def _smem_bytes(cfg: TileConfig) -> int:
    return cfg.block * cfg.packs * MAX_PACK_BYTES


# How the staged backward tiles (half-precision 16-byte packs, norm_bwd and norm_bwd_fused)
# stage their rows, by threads a row (kernels/row_norm.cuh StagePolicy, which this mirrors;
# benchmarks/sweep_bwd_stage.py, NOTES v44; two rounds, bf16 / fp16, backward of copy):
# - rows in the buffers (the current and depth - 1 in flight): 3 for warp rows (N = 512:
#   LayerNorm 0.61-0.72 -> 0.74-0.76, RMSNorm 0.59-0.72 -> 0.79-0.81) and for LayerNorm rows
#   of a block an SM (N = 8192 with the statistics staged: bf16 0.56-0.58 -> 0.62); else 2.
#   RMSNorm rows between took 3 from v44 (fused residual backward N = 2048 / 4096 0.77-0.81 ->
#   0.82-0.85) until v75: with v70-v74's weight and statistics in shared memory, 2 measured
#   bf16 N = 1024 / 4096 0.83 / 0.77 -> 0.87 / 0.83 and the fused backward at 2048 / 4096
#   0.87 -> 0.89-0.90; only N = 2048 lost, 0.85 -> 0.83 (benchmarks/sweep_bwd_depth.py).
# - (the kernels alone decide this one) each row's mean and rstd staged with it, for rows of a
#   block an SM at first (v44: N = 8192 LayerNorm 0.53 -> 0.56-0.66, RMSNorm 0.56-0.64 ->
#   0.67-0.71; narrower rows lost up to 0.1 with it), and since v74 for rows of 128 threads
#   or more (with the weight in shared memory, v71: bf16 LayerNorm N = 1024-4096 0.71-0.77 ->
#   0.85-0.88; warp rows, N = 512, still lose, row_norm.cuh StagePolicy).
def bwd_stage_depth(tpr: int, rms: bool) -> int:
    if tpr <= 32:
        return 3
    if tpr >= 1024:
        return 2 if rms else 3
    return 2


def bwd_limits(itemsize: int, rms: bool) -> PathLimits:
    """The partial-row backward's register-tile limits for this element size (both ops: the
    flag stays for sweep_bwd_config's per-op candidates)."""
    return BWD_HALF if itemsize == 2 else BWD
# Split-path tiles: 16 values a thread (the same tile shape forward and backward).
SPLIT_MAX_VALUES = 16

# Row groups smaller than 128 threads share a 128-thread block (4 warps), so the scheduler
# has whole warps to hide latency with and a block-wide barrier serves two 64-thread rows.
SMALL_ROW_BLOCK = 128

# Split path (rows longer than one register tile): one 256-thread block per tile.
SPLIT_TPR = 256

# Backward for few rows (norm_bwd_columns): dx blocks plus column blocks of COLUMN_LANES
# threads x one pack wide that sum dW/dB over all rows, in one launch, with the BWD tiles
# (bf16 N = 4096, M = 1: 4.0 us with 256-thread blocks, 5.7 us with BWD_HALF's 512). Each
# column thread steps down rows / (block / COLUMN_LANES) rows; up to COLUMN_ROW_STEPS steps
# this beat the partial-row path at every N and dtype measured (bf16/fp32, N = 1024, 4096,
# 8192: ×0.44-0.96 of its time); at 16 steps it lost two of six (benchmarks/
# sweep_bwd_rows.py, NOTES v6).
COLUMN_LANES = 8
COLUMN_ROW_STEPS = 8
COLUMN_BWD = BWD


def column_bwd_max_rows(cfg: "TileConfig") -> int:
    """The most rows the one-launch column backward takes with this row config."""
    return cfg.block // COLUMN_LANES * COLUMN_ROW_STEPS


# Forward grid-stride loops start at most this many blocks (rows beyond are looped over).
MAX_GRID = 1 << 20

# The fused forward with an FP8 output runs on a grid of this many waves of resident blocks,
# each block walking several rows, so a block's prologue and its amax fold (a block reduction
# and an atomic) are paid once for its rows: ncu found that kernel issue-bound, about a third
# of its instructions outside the element work at one row a block (NOTES v57). bf16 FP8 out,
# N = 2048 / 4096 / 8192, fraction of copy, a block a row group -> 4 waves: RMSNorm 0.766 /
# 0.771 / 0.743 -> 0.817 / 0.816 / 0.783, LayerNorm 0.668 / 0.668 / 0.644 -> 0.695 / 0.694 /
# 0.662 (1, 2 and 8 waves: within 0.02 of 4, 1 the lowest). Other outputs keep a block a row
# group: the residual forward, bound by memory, lost 0.01-0.05 on every capped grid.
FP8_FWD_GRID_WAVES = 4

# The torch adapter's eager forward allocates its backward's dx when x is at most this big,
# moving the allocation off torch's autograd thread (host-bound calls: a 1 MiB forward +
# backward is ~4 us of kernels against ~150 us of host work); dx then lives from forward to
# backward as x does. In an interleaved profile of lean test Functions, allocating the
# parameter gradients and dx in the forward took bf16 (1, 4096) / (64, 4096) forward +
# backward from x1.45 / x1.42 to x1.37 / x1.33 of torch's wall time; the GPU checks did not
# show the gain beyond their run-to-run spread (benchmarks/NOTES.md, v14).
PREPARED_DX_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class TileConfig:
    vec: int
    packs: int
    tpr: int

    @property
    def block(self) -> int:
        return max(SMALL_ROW_BLOCK, self.tpr)

    @property
    def rows_per_block(self) -> int:
        return self.block // self.tpr

    @property
    def tile(self) -> int:
        return self.tpr * self.packs * self.vec


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def max_vec(itemsize: int) -> int:
    return MAX_PACK_BYTES // itemsize


def packs_cap(vec: int, max_values: int) -> int:
    return max(1, min(MAX_PACKS, max_values // vec))


def row_config(n: int, vec: int, limits: PathLimits) -> TileConfig | None:
    """The register tile that holds a whole row of ``n`` elements, or None (split path)."""
    packs_total = -(-n // vec)
    pmax = packs_cap(vec, limits.max_values)
    max_tpr = limits.max_tpr
    if packs_total <= 32:
        return TileConfig(vec, 1, _next_pow2(packs_total))
    if packs_total <= 32 * pmax:
        return TileConfig(vec, _next_pow2(-(-packs_total // 32)), 32)
    tpr = max(limits.min_block_tpr, _next_pow2(-(-packs_total // pmax)))
    if tpr > max_tpr:
        return None
    return TileConfig(vec, _next_pow2(-(-packs_total // tpr)), tpr)


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """A long row held by a thread-block cluster (sm_90+, kernels/layer_norm_cluster.cu):
    ``cluster`` blocks of ``tpb`` threads, each thread ``packs`` packs of ``vec``."""

    vec: int
    packs: int
    tpb: int
    cluster: int

    @property
    def block(self) -> int:
        return self.tpb

    @property
    def block_columns(self) -> int:
        """The columns of the row each block holds."""
        return self.tpb * self.packs * self.vec

    @property
    def capacity(self) -> int:
        return self.cluster * self.block_columns

    tile = capacity  # the row length one launch unit covers, as TileConfig.tile


# Rows past the full-row tile on sm_90: the smallest cluster tile that holds them. 32 values
# a thread (8 fp32 packs, 4 half packs): with 8 half packs (64 values) the kernel spilled
# 136-168 bytes under its 64-register bound (NVRTC -Xptxas -v, sm_90) and the bf16 forward
# fell to 0.16-0.46 of copy against the split path's 0.37-0.51; fp32 at 8 packs used 62-64
# registers, no spills. Against the split path (benchmarks/results/sweep-cluster-fwd-h200.txt,
# fraction of copy, N = 65536 / 131072): bf16 LayerNorm 0.38 -> 0.49 / 0.44, RMSNorm 0.43 ->
# 0.60 / 0.57; fp32 LayerNorm 0.58 -> 0.67 / 0.62, RMSNorm 0.60 -> 0.80 / 0.70. Clusters of
# eight 1024-thread blocks (one an SM at 64 registers: 56-64 used, no spills) hold rows up to
# 262144: they lost fp32 LayerNorm N = 262144 to the split path when the clusters loaded
# their rows straight into registers (0.58 -> 0.51), and won once rows were staged in shared
# memory and the half-precision exchange pipelined (v49, v90; v92 on the H200, two rounds:
# bf16 LayerNorm 0.50 -> 0.62, RMSNorm 0.55 -> 0.71-0.72, fp32 LayerNorm 0.62 -> 0.64-0.65,
# RMSNorm 0.63 -> 0.65-0.66). Longer rows keep the split path.
CLUSTER_VALUES = 32
CLUSTER_SHAPES = ((256, 2), (256, 4), (256, 8), (512, 8), (1024, 8))  # (threads a block, blocks): cluster <= 8, portable
CLUSTER_MIN_SM = 90


# v49: the cluster forward copies its next rows' slices into shared memory (cp.async) while it
# reduces and writes the current one; its clusters are then persistent (as many as run at
# once). Rows staged ahead, a policy a tile that mirrors kernels/layer_norm_cluster.cu
# ClusterFwdStage, whose comment holds the measurements (benchmarks/NOTES.md v49): one for
# half precision and for float32 LayerNorm in 512-thread blocks, none (v48: a cluster a row,
# loaded straight into registers) for the other float32 tiles. An int here forces a count on
# every tile; the sweep sets it with the kernels' CUNORM_CLUSTER_FWD_STAGE.
CLUSTER_FWD_STAGE_ROWS: int | None = None


def cluster_fwd_stage_rows(cfg: ClusterConfig, itemsize: int, rms: bool) -> int:
    if CLUSTER_FWD_STAGE_ROWS is not None:
        return CLUSTER_FWD_STAGE_ROWS
    nonportable_rms = CLUSTER_FWD_F32_RMS_NONPORTABLE_STAGE and cfg.cluster > 8  # v120
    return 1 if itemsize == 2 or (not rms and cfg.tpb >= 512) or nonportable_rms else 0


# v90: half-precision cluster forwards whose rows are staged keep two more rows in shared
# memory (the row whose y is written, the row being summed), mirroring ClusterFwdStage::pipe
# and ::buffers in kernels/layer_norm_cluster.cu (the measurements there and in NOTES v90).
# False here with the kernels built -DCUNORM_CLUSTER_FWD_PIPE=0 gives v50's loop.
CLUSTER_FWD_PIPE = True


def cluster_fwd_stage_bytes(cfg: ClusterConfig, itemsize: int, rms: bool) -> int:
    """Dynamic shared memory a block of the cluster forward takes for its staged rows (0: the
    v48 kernel, a cluster a row)."""
    rows = cluster_fwd_stage_rows(cfg, itemsize, rms)
    buffers = rows + 2 if CLUSTER_FWD_PIPE and itemsize == 2 and rows > 0 else rows
    return buffers * cfg.block_columns * itemsize


def slot_value_bytes(own_half: bool) -> int:
    """Shared memory a parameter value takes in the slots of the cluster forward and the wide
    backward: its own two bytes where the slots keep a half-precision parameter as it is, else
    a float (kernels/row_norm.cuh OwnSlot::kValueBytes)."""
    return 2 if own_half else 4


# v105: RMSNorm cluster forward blocks stage their slice of the weight once, after their rows
# (kernels/layer_norm_cluster.cu ClusterFwdParamSlots, which this mirrors and where the
# measurements are): float32 rows (blocks of up to 512 threads; v107 adds the 1024-thread
# tile), half-precision rows in 256-thread blocks with a weight in x's type, where rows and
# slots fit a block's opt-in shared memory (the kernel's 2 KiB for static buffers are
# WIDE_BWD_STATIC_SMEM's). The other tiles lost resident blocks to the slots, and more than
# the loads cost. False with the kernels built -DCUNORM_CLUSTER_FWD_PARAM_SLOTS=0; SERVE_ALL
# (a sweep's) drops the choice of tiles on the host, as the kernels'
# -DCUNORM_CLUSTER_FWD_PARAM_SLOTS_ALL=1 does.
CLUSTER_FWD_PARAM_SLOTS = True
CLUSTER_FWD_PARAM_SLOTS_SERVE_ALL = False


# v106: half-precision rows with float32 parameters (torch.autocast's) from this length take
# the cluster forward instead of the shared-memory forward, whose blocks hold the whole row
# and so reload all of its parameters every row; the clusters' LayerNorm 256-thread tiles
# then keep float32 w + b in slots. Its sweep (results/sweep-fwd-wide-params-v106-h200.txt,
# bf16 rows, forward of copy): LayerNorm 24576 / 32768 / 65536 0.533 / 0.576 / 0.644 ->
# 0.581 / 0.701 / 0.685, RMSNorm 24576 / 32768 0.658 / 0.699 -> 0.690 / 0.779; from 8193
# instead lost at 12288 / 16384 (LayerNorm 0.761 / 0.809 -> 0.607 / 0.714), where the
# shared-memory forward stays. None: the shared-memory forward throughout.
FWD_CLUSTER_WIDE_PARAMS_FROM: int | None = 16385
CLUSTER_FWD_WIDE_PARAM_SLOTS = True  # kernels' -DCUNORM_CLUSTER_FWD_WIDE_PARAM_SLOTS
# v121: LayerNorm's portable clusters of eight keep w + b in slots for float32 rows and for
# half-precision rows with float32 w + b in 512-thread blocks (kernels/layer_norm_cluster.cu
# CUNORM_CLUSTER_FWD_EIGHT_PARAM_SLOTS, where the measurements are: float32 65536 / 131072
# 0.878 / 0.859 -> 0.905 / 0.914 of copy on an H100). False: v120's tiles.
CLUSTER_FWD_EIGHT_PARAM_SLOTS = True


def fwd_cluster_for_wide_params(itemsize: int, w_itemsize: int, n: int) -> bool:
    """Whether a forward row of ``n`` elements takes the cluster forward for its parameters'
    width (v106)."""
    return FWD_CLUSTER_WIDE_PARAMS_FROM is not None and itemsize == 2 and w_itemsize > 2 and \
        n >= FWD_CLUSTER_WIDE_PARAMS_FROM


def cluster_fwd_param_slots_serve(cfg: ClusterConfig, itemsize: int, w_itemsize: int, rms: bool) -> bool:
    if CLUSTER_FWD_PARAM_SLOTS_SERVE_ALL:
        return True
    if CLUSTER_FWD_F32_NONPORTABLE_SLOTS and not rms and itemsize == 4 and cfg.cluster > 8:
        return True  # v119
    if CLUSTER_FWD_HALF_NONPORTABLE_SLOTS and itemsize == 2 and cfg.cluster > 8:
        return True  # v120
    if CLUSTER_FWD_WIDE_PARAM_SLOTS and not rms and itemsize == 2 and w_itemsize == 4 and cfg.tpb == 256:
        return True  # v106
    if CLUSTER_FWD_EIGHT_PARAM_SLOTS and not rms and cfg.cluster == 8 and \
            (itemsize == 4 or (w_itemsize == 4 and cfg.tpb == 512)):
        return True  # v121
    return rms and (itemsize == 4 or (cfg.tpb == 256 and w_itemsize == 2))


def cluster_fwd_param_bytes(cfg: ClusterConfig, itemsize: int, w_itemsize: int, rms: bool, smem_optin: int) -> int:
    """The cluster forward's parameter slots after its rows: a half-precision weight (and
    bias) in its own type, wider ones as floats; 0 where the tile keeps loading them
    (cluster_fwd_param_slots_serve) or they do not fit."""
    if not CLUSTER_FWD_PARAM_SLOTS or not cluster_fwd_param_slots_serve(cfg, itemsize, w_itemsize, rms):
        return 0
    slots = (1 if rms else 2) * cfg.block_columns * slot_value_bytes(w_itemsize == 2)
    rows = cluster_fwd_stage_bytes(cfg, itemsize, rms)
    return slots if rows + slots + WIDE_BWD_STATIC_SMEM <= smem_optin else 0


def cluster_fwd_smem(cfg: ClusterConfig, itemsize: int, w_itemsize: int, rms: bool, smem_optin: int) -> int:
    """Dynamic shared memory of a cluster forward block: its staged rows and parameter slots."""
    return cluster_fwd_stage_bytes(cfg, itemsize, rms) + \
        cluster_fwd_param_bytes(cfg, itemsize, w_itemsize, rms, smem_optin)


# v119: float32 LayerNorm rows past the portable 1024 x 8 tile's first half (131073-262144
# elements) in non-portable clusters of sixteen 512-thread blocks, where the driver runs them:
# a block stages a 64 KiB row slice and keeps its w and b slices in slots after it (128 KiB;
# the kernels' ClusterFwdParamSlots, CUNORM_CLUSTER_FWD_F32_NONPORTABLE_SLOTS), where the
# portable tile stages 128 KiB and loads w + b from the L2 every row (float32 LayerNorm 262144
# forward 0.79 of copy in check f0ecddfb2bd3 against RMSNorm's 0.90 with its weight in slots).
# Measured in benchmarks/NOTES.md, "v119". False: the portable tile; SLOTS False with the
# kernels built -DCUNORM_CLUSTER_FWD_F32_NONPORTABLE_SLOTS=0: the non-portable tile without
# slots (a sweep's control).
CLUSTER_FWD_NONPORTABLE = True
CLUSTER_FWD_F32_NONPORTABLE_SLOTS = True
CLUSTER_FWD_NONPORTABLE_SHAPE = (512, 16)
# v120: the same blocks for half-precision LayerNorm and RMSNorm rows of 131073-262144, whose
# portable 1024 x 8 tile stages v90's three rows (192 KiB) and so has no room for parameter
# slots; in these blocks the three rows take 96 KiB and w (+ b) fit after them, in x's type
# or as floats (torch.autocast's parameters: 224 KiB in all). Two sweeps on an H100 (NOTES
# "v120 outcome"), forward of copy at 262144 against the portable tile: bf16 LayerNorm 0.822
# -> 0.896, RMSNorm 0.877 -> 0.886, with float32 w + b 0.765 -> 0.884, fp16 LayerNorm 0.853
# -> 0.902; float32 RMSNorm (F32_RMS: its weight has slots on either tile) 0.894 -> 0.941.
# HALF False: the portable tile; HALF_SLOTS False with the kernels built
# -DCUNORM_CLUSTER_FWD_HALF_NONPORTABLE_SLOTS=0: these blocks loading their parameters every
# row (bf16 LayerNorm 262144 0.857, with float32 w + b 0.797).
CLUSTER_FWD_NONPORTABLE_HALF = True
CLUSTER_FWD_HALF_NONPORTABLE_SLOTS = True
CLUSTER_FWD_NONPORTABLE_F32_RMS = True
# v120: float32 RMSNorm there stages its next row beside the weight's slots, as v119's LayerNorm
# (kernels' CUNORM_CLUSTER_FWD_F32_RMS_NONPORTABLE_STAGE; the first sweep, H100: 196608 /
# 262144 0.936 / 0.939 -> 0.950 / 0.950 of copy, the portable tile 0.867 / 0.901).
CLUSTER_FWD_F32_RMS_NONPORTABLE_STAGE = True
# v120: half-precision rows in the fewest of these blocks that hold them (9-16) rather than
# sixteen: a row of 147456 filled 9 of sixteen blocks, the other seven SMs of each cluster
# idle. The second sweep (H100, forward of copy, sixteen -> fit): bf16 LayerNorm 147456
# 0.611 -> 0.709, RMSNorm 0.756 -> 0.831, LayerNorm with float32 parameters 0.566 -> 0.674,
# level at 196608 / 262144; float32 lost it (LayerNorm 147456 0.927 -> 0.761, RMSNorm 0.938
# -> 0.770, 196608 -0.005-0.008; NOTES "v120 outcome"), so float32 keeps sixteen. False:
# sixteen blocks for half precision too.
CLUSTER_FWD_NONPORTABLE_FIT = True
CLUSTER_FWD_NONPORTABLE_SIZES = tuple(range(9, 17))


def nonportable_cluster_fwd_config(n: int, vec: int, itemsize: int, rms: bool) -> ClusterConfig | None:
    """v119's (v120's) tile for this row, or None where it does not serve (the caller then
    checks that the driver runs one such cluster before taking it)."""
    if not CLUSTER_FWD_NONPORTABLE or vec == 1:
        return None
    serves = {4: CLUSTER_FWD_NONPORTABLE_F32_RMS if rms else True, 2: CLUSTER_FWD_NONPORTABLE_HALF}
    if not serves.get(itemsize, False):
        return None
    portable = cluster_config(n, vec)
    tile = _cluster_tiles(vec, CLUSTER_VALUES, (CLUSTER_FWD_NONPORTABLE_SHAPE,))[0]
    if portable is None or portable.tpb < 1024 or n > tile.capacity or n <= tile.capacity // 2:
        return None
    if CLUSTER_FWD_NONPORTABLE_FIT and itemsize == 2:
        return dataclasses.replace(tile, cluster=-(-n // tile.block_columns))
    return tile


def all_nonportable_cluster_fwd_configs(vec: int, itemsize: int) -> list[ClusterConfig]:
    tpb, sixteen = CLUSTER_FWD_NONPORTABLE_SHAPE
    sizes = CLUSTER_FWD_NONPORTABLE_SIZES if itemsize == 2 else (sixteen,)
    return _cluster_tiles(vec, CLUSTER_VALUES, [(tpb, c) for c in sizes])


def cluster_config(n: int, vec: int) -> ClusterConfig | None:
    """The cluster tile for a row of ``n`` elements in packs of ``vec`` (None: too long, or
    scalar packs, which would need too many registers; the split path serves them)."""
    return _smallest_holding(n, all_cluster_configs(vec))


def all_cluster_configs(vec: int) -> list[ClusterConfig]:
    return _cluster_tiles(vec, CLUSTER_VALUES, CLUSTER_SHAPES)


def _cluster_tiles(vec: int, values: int, shapes) -> list[ClusterConfig]:
    """Cluster tiles of ``values`` per thread over ``shapes``, smallest first (none for
    scalar packs)."""
    return [] if vec == 1 else [ClusterConfig(vec, values // vec, tpb, c) for tpb, c in shapes]


def _smallest_holding(n: int, tiles) -> ClusterConfig | None:
    return next((c for c in tiles if c.capacity >= n), None)


# Backward rows past the full-row backward tile (N > 8192) on sm_90: a cluster holds x and dy
# at the BWD tile's 16 values a thread each, plus the dW / dB accumulators (~100 registers
# under a 128-register bound); clusters of 4 or 8 blocks cover N up to 65536. Prepared,
# measured in benchmarks/NOTES.md, v16.
CLUSTER_BWD_VALUES = 16
CLUSTER_BWD_SHAPES = ((256, 4), (256, 8), (512, 8))


def cluster_bwd_config(n: int, vec: int) -> ClusterConfig | None:
    """The backward cluster tile for a row of ``n`` elements (None: scalar packs or too long)."""
    return _smallest_holding(n, all_cluster_bwd_configs(vec))


def all_cluster_bwd_configs(vec: int) -> list[ClusterConfig]:
    return _cluster_tiles(vec, CLUSTER_BWD_VALUES, CLUSTER_BWD_SHAPES)


# Half-precision backward rows of 8193-16384 elements, v63: one 1024-thread block a row, two
# 16-byte packs a thread, the row's x and dy staged in shared memory (64 KiB a row) and read
# from there in both passes (kernels/layer_norm.cu norm_bwd_wide). It serves before the staged
# cluster below, on any GPU whose blocks may opt in to two rows' buffers: H200, two rounds
# (results/sweep-wide-bwd-v63-h200.txt), backward of copy, bf16 N = 9216 / 12288 / 16384,
# LayerNorm 0.31 / 0.40 / 0.51 -> 0.54 / 0.61 / 0.66, RMSNorm 0.33 / 0.42 / 0.54 -> 0.67 /
# 0.77 / 0.77 (fp16 alike).
WIDE_BWD_TILE = TileConfig(8, 2, 1024)
WIDE_BWD_DEPTHS = (2, 3)
WIDE_BWD_STATIC_SMEM = 2048  # the kernel's static buffers (reductions, staged statistics), rounded up
# Rows in the ring: two, but three for half-precision RMSNorm rows past WIDE_BWD_RMS_DEEP_FROM
# elements (float32, v65: three rows even or worse, RMSNorm 0.79 / 0.79 at 16384). Same
# sweep: LayerNorm lost 0.04-0.10 with three at every N measured; RMSNorm lost 0.05-0.06 with
# three at N = 9216 and 12288 and gained 0.05-0.07 at 16384 (not explained; the change-over
# between 12288 and 16384 is not measured).
WIDE_BWD_RMS_DEEP_FROM = 12289


# float32 rows of 8193-16384 elements the same way (v65): four packs of 4 a thread, x staged
# (64 KiB a row) and dy loaded in each pass, since both would take 128 KiB a row. H200, two
# rounds (results/sweep-wide-bwd-fp32-v65-h200.txt), against the split path, N = 9216 / 12288
# / 16384: LayerNorm 0.56 / 0.54 / 0.56 -> 0.63 / 0.67 / 0.62, RMSNorm 0.56 / 0.56 / 0.57 ->
# 0.84 / 0.87 / 0.79.
WIDE_BWD_TILE_FP32 = TileConfig(4, 4, 1024)
# Half-precision RMSNorm rows of 16385-32768 elements the float32 way (v66): four packs of 8
# a thread, x staged (64 KiB a row), dy loaded in each pass. RMSNorm has no dB, so its 32 dW
# accumulators a thread fit; LayerNorm's 64 would not. H200, two rounds (results/sweep-wide-
# bwd-rms-long-v66-h200.txt), against the staged cluster, bf16 N = 20480 / 24576 / 32768:
# 0.33 / 0.39 / 0.49 -> 0.54 / 0.58 / 0.56 with three rows in the ring (two: 0.52 / 0.55 /
# 0.54; fp16 alike), so these rows keep WIDE_BWD_RMS_DEEP_FROM's three. Since v102 the wide
# clusters take these rows from 20480 where clusters exist (WIDE_CLUSTER_BWD_FROM).
WIDE_BWD_TILE_RMS_LONG = TileConfig(8, 4, 1024)


def wide_bwd_tiles(itemsize: int, rms: bool) -> tuple[TileConfig, ...]:
    """The wide backward's tiles for this element size and op, narrowest first."""
    if itemsize == 2:
        return (WIDE_BWD_TILE, WIDE_BWD_TILE_RMS_LONG) if rms else (WIDE_BWD_TILE,)
    return (WIDE_BWD_TILE_FP32,) if itemsize == 4 else ()


def wide_bwd_tile(n: int, vec: int, itemsize: int, rms: bool) -> TileConfig | None:
    """The narrowest wide backward tile holding a row of ``n`` elements in ``vec``-packs
    (None: rows of at most 8192 elements, other packs, or too long: it does not serve)."""
    if n <= 8192:
        return None
    return next((t for t in wide_bwd_tiles(itemsize, rms) if t.vec == vec and n <= t.tile), None)


def wide_bwd_row_bytes(tile: TileConfig, itemsize: int) -> int:
    """Shared memory of one staged row of the wide backward: x and dy packs where a row's x
    takes at most 32 KiB (half precision up to 16384 elements), else x alone (kernels/
    layer_norm.cu norm_bwd_wide kStageDy)."""
    x_bytes = tile.tile * itemsize
    return (2 if x_bytes <= 32768 else 1) * x_bytes


# v81: the wide block's weight in float slots of shared memory after the ring, where both fit
# (kernels/row_norm.cuh WideWeightSlots, CUNORM_WIDE_WEIGHT_SMEM: keep the two alike).
WIDE_BWD_WEIGHT_SMEM = True
# v101: in the wide clusters, a half-precision weight of half-precision rows in its own type
# (kernels/row_norm.cuh WideHalfSlots, CUNORM_WIDE_HALF_SLOTS: keep the two alike), and then
# three rows in the ring for LayerNorm too. H200, two rounds (results/sweep-wide-half-slots-
# v101-h200.txt, half slots in every wide block then), backward of copy, bf16: RMSNorm
# clusters at 65536 / 131072 0.580 / 0.587 -> 0.637 / 0.639; LayerNorm 32768 / 65536 /
# 131072 0.583 / 0.534 / 0.535 -> 0.596 / 0.543 / 0.545 with two rows, 0.656 / 0.558 / 0.565
# with three; the single block's RMSNorm ring of three at 16384 0.777 -> 0.745, so it keeps
# none.
WIDE_BWD_HALF_SLOTS = True
# v104: half-precision RMSNorm rows with a float32 weight (torch autocast's parameters) keep
# two rows in the wide ring where the weight's float slots fit beside them, instead of
# WIDE_BWD_RMS_DEEP_FROM's three without slots (v101's half slots need a half weight). H200,
# two rounds (results/sweep-wide-float-weight-v104-h200.txt), bf16 RMSNorm backward with a
# float32 weight, of copy, three rows -> two and the slots: single block 16384 0.733 ->
# 0.751; clusters 20480 / 24576 / 32768 / 65536 / 131072 0.442 / 0.517 / 0.616 / 0.552 /
# 0.560 -> 0.539 / 0.610 / 0.682 / 0.622 / 0.614. v66's 32768-column tile has no room for
# the slots at two rows either and keeps three.
WIDE_BWD_FLOAT_WEIGHT_TWO_ROWS = True


def half_slots(itemsize: int, w_itemsize: int, cluster: bool) -> bool:
    """Whether the wide backward keeps the weight in its own half-precision type (v101)."""
    return WIDE_BWD_HALF_SLOTS and cluster and itemsize == 2 and w_itemsize == 2


def wide_bwd_slot_bytes(tile: TileConfig, itemsize: int, w_itemsize: int, cluster: bool) -> int:
    """Bytes of the wide backward's weight slots: a float a column, or the weight's own two
    bytes (half_slots)."""
    return tile.tile * slot_value_bytes(half_slots(itemsize, w_itemsize, cluster))


def wide_bwd_weight_bytes(tile: TileConfig, itemsize: int, depth: int, smem_optin: int, rms: bool,
                          cluster: bool, w_itemsize: int) -> int:
    """The wide backward's weight slots after its ring of ``depth`` rows (wide_bwd_slot_bytes)
    where ring, slots and the kernel's static buffers fit ``smem_optin``, else none (the
    weight loaded in each pass). ``cluster``: a block of norm_bwd_wide_cluster; ``w_itemsize``:
    the weight's element size."""
    ring, slots = depth * wide_bwd_row_bytes(tile, itemsize), wide_bwd_slot_bytes(tile, itemsize, w_itemsize, cluster)
    # v83: half-precision LayerNorm's single wide block keeps loading its weight: with the
    # slots it lost 0.04 of copy at 12288-16384 (H200, against main before v81), while its
    # clusters gained 0.02-0.03 (NOTES v83)
    serves = itemsize == 4 or rms or cluster
    budget = wide_block_smem_budget(tile, smem_optin)
    return slots if WIDE_BWD_WEIGHT_SMEM and serves and ring + slots + WIDE_BWD_STATIC_SMEM <= budget else 0


def wide_block_smem_budget(tile: TileConfig, smem_optin: int) -> int:
    """Shared memory one wide backward block may take: what a block may opt in to, or for
    blocks of fewer than 1024 threads (v109), which share their SM with a second block, half
    of the SM's (the opt-in plus the KiB the GPU reserves a block) less their own reserved
    KiB (kernels/row_norm.cuh WideBlockSmem)."""
    return smem_optin if tile.tpr >= 1024 else (smem_optin + 1024) // 2 - 1024


def wide_bwd_smem(tile: TileConfig, itemsize: int, depth: int, smem_optin: int, rms: bool, cluster: bool,
                  w_itemsize: int) -> int:
    """Dynamic shared memory of one wide backward block: its ring of ``depth`` rows and the
    weight's slots where they fit (wide_bwd_weight_bytes)."""
    return depth * wide_bwd_row_bytes(tile, itemsize) + \
        wide_bwd_weight_bytes(tile, itemsize, depth, smem_optin, rms, cluster, w_itemsize)


def wide_bwd_depth(tile: TileConfig, rms: bool, n: int, itemsize: int, smem_optin: int, cluster: bool,
                   w_itemsize: int) -> int | None:
    """Rows the wide backward's ring holds for this tile on a GPU whose blocks may opt in to
    ``smem_optin`` bytes of shared memory (None: not even two rows fit); ``cluster``: a block
    of the wide clusters; ``w_itemsize``: the weight's element size."""
    depth = 3 if rms and itemsize == 2 and n >= WIDE_BWD_RMS_DEEP_FROM else 2
    if half_slots(itemsize, w_itemsize, cluster):
        depth = 3  # v101
    elif depth == 3 and w_itemsize == 4 and WIDE_BWD_FLOAT_WEIGHT_TWO_ROWS and \
            wide_bwd_weight_bytes(tile, itemsize, 2, smem_optin, rms, cluster, w_itemsize):
        depth = 2  # v104: two rows and the float32 weight's slots beside them
    if tile == WIDE_CLUSTER_BWD_NARROW.get(itemsize):
        depth = WIDE_CLUSTER_BWD_NARROW_DEPTH
    budget = wide_block_smem_budget(tile, smem_optin)
    while depth >= min(WIDE_BWD_DEPTHS) and depth * wide_bwd_row_bytes(tile, itemsize) + WIDE_BWD_STATIC_SMEM > budget:
        depth -= 1
    return depth if depth >= min(WIDE_BWD_DEPTHS) else None


# Rows past one wide block on sm_90 (v68): a cluster of 2-8 wide blocks of 16384 columns a
# row (kernels/layer_norm_cluster.cu norm_bwd_wide_cluster), each staged as the wide backward
# stages it, the row sums exchanged once. The fewest blocks that hold the row, so every
# block holds part of it (the kernel relies on that); clusters of 3, 5-7 are legal on sm_90.
# It serves before the staged cluster below, which then serves no row by default. H200, two
# rounds (results/sweep-wide-cluster-bwd-v68-h200.txt), backward of copy: bf16 LayerNorm
# N = 32768 / 65536 0.45 / 0.45 -> 0.55 / 0.48 and RMSNorm 65536 0.48 -> 0.50 (against the
# staged cluster); float32 N = 32768 / 65536 LayerNorm 0.51 / 0.50 -> 0.61 / 0.56, RMSNorm
# 0.53 / 0.52 -> 0.71 / 0.63 (against the split path). Blocks of v66's 32768 columns lost:
# bf16 RMSNorm 65536 0.45, and 131072 0.39 against the split path's 0.41. v93: clusters of
# five to eight blocks take rows of 65537-131072 from the split path (half precision below
# 131072) and the grid rows (float32, and half precision at 131072): H200, two rounds
# (results/sweep-wide-cluster-sizes-v93-h200.txt), backward of copy at N = 81920 / 131072:
# bf16 LayerNorm 0.40 / 0.44 -> 0.48 / 0.51, RMSNorm 0.42 / 0.52 -> 0.55 / 0.59; float32
# LayerNorm 0.43 / 0.53 -> 0.54 / 0.58, RMSNorm 0.45 / 0.54 -> 0.69 / 0.71; fp16 RMSNorm
# 100000 0.40 -> 0.50.
WIDE_CLUSTER_BWD_SIZES = (2, 3, 4, 5, 6, 7, 8)


# The shortest row the wide clusters take, before the single wide block (norm_bwd_wide),
# {(element size, RMSNorm): length}: half precision past the wide block's 16384 columns
# (RMSNorm's kept one block to 32768, v66, until v102 below). v99: float32 in two narrow blocks from 12288
# (LayerNorm) / 16384 (RMSNorm). H200, two rounds (results/sweep-wide-cluster-narrow2-v99-
# h200.txt), backward of copy at N = 9216 / 12288 / 16384, one wide block -> two narrow:
# LayerNorm 0.636 / 0.719 / 0.718 -> 0.602 / 0.775 / 0.879, RMSNorm 0.812 / 0.859 / 0.825 ->
# 0.666 / 0.820 / 0.910; the lengths between those measured are not. v102: half-precision
# RMSNorm from 20480 in two blocks of 16384 columns (v101's ring of three beside a
# half-precision weight) instead of v66's single block of 32768 (dy loaded in both passes).
# H200, two rounds (results/sweep-wide-from-v102-h200.txt), backward of copy, bf16 N = 18432
# / 20480 / 24576 / 28672 / 32768: 0.542 / 0.567 / 0.592 / 0.582 / 0.585 -> 0.527 / 0.581 /
# 0.663 / 0.721 / 0.761; fp16 20480 / 24576 / 32768 0.569 / 0.591 / 0.586 -> 0.590 / 0.670 /
# 0.764. Rows of 18433-20479 are not measured and keep the single block.
WIDE_CLUSTER_BWD_FROM = {(2, False): 16385, (2, True): 20480, (4, False): 12288, (4, True): 16384}
# v99: float32 rows up to WIDE_CLUSTER_BWD_NARROW_TO elements in clusters of blocks of 8192
# columns (two packs of 4 a thread), where a row's x and dy both fit the ring (32 KiB each, as
# half precision's 16384 columns) and a thread holds 16 dW / dB accumulators instead of 32;
# v68's float32 blocks of 16384 columns load dy from global memory in both passes and spill
# 8-20 bytes (LayerNorm). Twice the blocks a row. {element size: narrow tile}; an element
# size left out keeps v68's blocks for every row.
WIDE_CLUSTER_BWD_NARROW = {4: TileConfig(4, 2, 1024)}
WIDE_CLUSTER_BWD_NARROW_TO = 65536
# v100: narrow blocks in non-portable clusters of 9-16 (sm_90 runs 16 where the driver allows
# it, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED) for rows to 16 * 8192 = 131072;
# the host falls back to v93's blocks of 16384 where the driver says no cluster of that size
# runs. H200, two rounds (results/sweep-wide-cluster-nonportable-v100-h200.txt), backward of
# copy at float32 N = 73728 / 98304 / 131072 against v93's 5-8 blocks of 16384: LayerNorm
# 0.521 / 0.517 / 0.583 -> 0.627 / 0.653 / 0.802, RMSNorm 0.659 / 0.679 / 0.719 -> 0.712 /
# 0.735 / 0.841. 0: portable sizes only (rows past WIDE_CLUSTER_BWD_NARROW_TO: v93's blocks).
WIDE_CLUSTER_BWD_NONPORTABLE_TO = 131072
WIDE_CLUSTER_BWD_NONPORTABLE_SIZES = tuple(range(9, 17))
# v115: half-precision rows past eight wide blocks (131072) in non-portable clusters of 9-16
# of them (16384 columns each, as v100 did for float32's narrow blocks), to 16 * 16384 =
# 262144, instead of the grid rows. Where the driver runs no such cluster, the grid rows as
# before. H100, backward of copy against the grid rows, best of two rounds
# (results/sweep-v115-53-h100.json; NOTES "Fifty-third session's device calls"): bf16 RMSNorm
# 147456 / 196608 / 262144 0.491 / 0.603 / 0.630 -> 0.714 / 0.839 / 0.796, LayerNorm 0.452 /
# 0.567 / 0.591 -> 0.646 / 0.606 / 0.608, fp16 RMSNorm 262144 0.613 -> 0.805, bf16 LayerNorm
# with float32 w + b 262144 0.585 -> 0.731. 0: off (the sweep's baseline).
WIDE_CLUSTER_BWD_HALF_NONPORTABLE_TO = 262144
# v99: rows in the narrow blocks' ring. Three fit beside the float32 weight slots (226 KiB)
# and take v91's pipelined loop. H200, two rounds (results/sweep-wide-cluster-narrow-v99-
# h200.txt), backward of copy at float32 N = 24576 / 32768 / 65536 against v93's blocks of
# 16384: LayerNorm 0.585 / 0.698 / 0.607 -> 0.838 / 0.832 / 0.834 (two rows: 0.73 / 0.71 /
# 0.72), RMSNorm 0.746 / 0.799 / 0.747 -> 0.879 / 0.879 / 0.876 (two rows: 0.78-0.82). Half
# precision in blocks of 8192 columns lost (bf16 LayerNorm 32768 / 65536 0.58 / 0.54 ->
# 0.47-0.48, RMSNorm 65536 0.58 -> 0.48-0.55), so it keeps v68's.
WIDE_CLUSTER_BWD_NARROW_DEPTH = 3
# v117: float32 rows of 131073-262144 in non-portable clusters of 9-16 of v93's float32
# blocks of 16384 columns (x staged, dy loaded in both passes; two rows in the ring; no spill
# with v116's collect loop, NVRTC 13 sm_90) instead of the grid rows. H100, backward of copy
# against the grid rows, best of two rounds (results/sweep-v116-v117-54-h100.json; NOTES
# "Fifty-fourth session's device calls"): LayerNorm 196608 / 262144 0.591 / 0.605 -> 0.627 /
# 0.659, RMSNorm 0.603 / 0.638 -> 0.661 / 0.696. {RMSNorm: longest row}; 0: the grid rows.
WIDE_CLUSTER_BWD_F32_NONPORTABLE_TO = {False: 262144, True: 262144}
# v109: half-precision RMSNorm rows with float32 parameters (torch.autocast's) to
# WIDE_CLUSTER_BWD_HALF_FLOAT_PARAMS_TO in blocks of 512 threads and 8192 columns (two packs
# of 8 a thread, as the 1024-thread blocks of 16384 hold), two blocks an SM, each with two rows
# in its ring and the weight's float slots (96 KiB of the half SM wide_block_smem_budget
# allows). H200, backward of copy, bf16 rows with float32 parameters; first with the fenced
# exchange (results/sweep-wide-cluster-half-blocks-v109-h200.txt): RMSNorm 24576 / 32768 /
# 65536 / 131072 0.617 / 0.712 / 0.633 / 0.621 -> 0.730 / 0.727 / 0.670 / 0.633, LayerNorm
# 32768 / 65536 / 131072 0.578 / 0.523 / 0.522 -> 0.593 / 0.551 / 0.528; with a weight in x's
# dtype (v101's half slots) the same blocks lost 0.01-0.10 in every case but RMSNorm 65536.
# Then with the pushed row sums ((p8), (p9): kernels/layer_norm_cluster.cu
# WideClusterExchange; results/sweep-wide-push-rule-h200.txt), these blocks against v93's:
# RMSNorm 24576 / 32768 0.678 / 0.729 -> 0.793 / 0.766, but 65536 / 131072 0.771 / 0.740 ->
# 0.742 / 0.698, and LayerNorm 32768 / 65536 / 131072 0.667 / 0.624 / 0.598 -> 0.627 / 0.604
# / 0.568: so RMSNorm alone, to 32768. None: v93's blocks for every half-precision row.
WIDE_CLUSTER_BWD_HALF_FLOAT_PARAMS = TileConfig(8, 2, 512)
WIDE_CLUSTER_BWD_HALF_FLOAT_PARAMS_TO = 32768


def _wide_cluster_narrow(itemsize: int, w_itemsize: int | None, rms: bool) -> TileConfig | None:
    """The narrow tile of the wide clusters for these element sizes (x's, the parameters';
    None: x's), if any: v99's float32 one, v109's for half-precision RMSNorm rows with float32
    parameters."""
    if itemsize == 2 and w_itemsize == 4 and rms and WIDE_CLUSTER_BWD_HALF_FLOAT_PARAMS is not None:
        return WIDE_CLUSTER_BWD_HALF_FLOAT_PARAMS
    return WIDE_CLUSTER_BWD_NARROW.get(itemsize)


def _wide_cluster_narrow_to(itemsize: int, nonportable: bool) -> int:
    """The longest row the narrow tile takes (v99's float32 tile: in non-portable clusters of
    9-16 blocks too, where they run; v109's: WIDE_CLUSTER_BWD_HALF_FLOAT_PARAMS_TO)."""
    if itemsize == 2:
        return WIDE_CLUSTER_BWD_HALF_FLOAT_PARAMS_TO
    return max(WIDE_CLUSTER_BWD_NARROW_TO, WIDE_CLUSTER_BWD_NONPORTABLE_TO if nonportable else 0)


def wide_cluster_bwd_tiles(itemsize: int, w_itemsize: int | None = None, rms: bool = False) -> tuple[TileConfig, ...]:
    """The tiles a wide cluster block may hold for these element sizes, narrowest first."""
    wide = {2: WIDE_BWD_TILE, 4: WIDE_BWD_TILE_FP32}.get(itemsize)
    narrow = _wide_cluster_narrow(itemsize, w_itemsize, rms)
    return tuple(t for t in (narrow, wide) if t is not None)


def wide_cluster_bwd_tile(itemsize: int, n: int, nonportable: bool = False,
                          w_itemsize: int | None = None, rms: bool = False) -> TileConfig | None:
    """The wide tile a cluster block holds for rows of ``n`` elements (None: float64);
    ``nonportable``: clusters of 9-16 blocks may run (v100); ``w_itemsize``: the parameters'
    element size (None: x's)."""
    tiles = wide_cluster_bwd_tiles(itemsize, w_itemsize, rms)
    if not tiles:
        return None
    return tiles[0] if n <= _wide_cluster_narrow_to(itemsize, nonportable) else tiles[-1]


def _nonportable_tiles(itemsize: int, rms: bool) -> dict[TileConfig, int]:
    """{tile: the longest row it takes in non-portable clusters of 9-16 blocks} for this
    element size: v100's narrow float32 tile, v115's half-precision and v117's float32 wide
    ones (read when asked, so a sweep's switches count; 0: portable sizes only)."""
    if itemsize == 2:
        return {WIDE_BWD_TILE: WIDE_CLUSTER_BWD_HALF_NONPORTABLE_TO}
    if itemsize == 4:
        narrow = WIDE_CLUSTER_BWD_NARROW.get(4)
        return {**({narrow: WIDE_CLUSTER_BWD_NONPORTABLE_TO} if narrow is not None else {}),
                WIDE_BWD_TILE_FP32: WIDE_CLUSTER_BWD_F32_NONPORTABLE_TO.get(rms, 0)}
    return {}


def wide_cluster_bwd_configs(itemsize: int, w_itemsize: int | None = None, rms: bool = False) -> list[ClusterConfig]:
    """Every cluster the wide cluster backward may take for these element sizes: the
    portable sizes of each tile (v109's up to the blocks its rows to
    WIDE_CLUSTER_BWD_HALF_FLOAT_PARAMS_TO need), and the non-portable ones of
    _nonportable_tiles' (v115's and v117's whatever their switches say, so a sweep can turn
    them on; v100's while it is on)."""
    nonportable = [(t, c) for t, to in _nonportable_tiles(itemsize, rms).items()
                   if to or t != WIDE_CLUSTER_BWD_NARROW.get(itemsize) for c in WIDE_CLUSTER_BWD_NONPORTABLE_SIZES]
    tiles = wide_cluster_bwd_tiles(itemsize, w_itemsize, rms)
    half_narrow = WIDE_CLUSTER_BWD_HALF_FLOAT_PARAMS if itemsize == 2 else None

    def sizes(t: TileConfig) -> tuple[int, ...]:
        most = -(-WIDE_CLUSTER_BWD_HALF_FLOAT_PARAMS_TO // t.tile) if t == half_narrow else max(WIDE_CLUSTER_BWD_SIZES)
        return tuple(c for c in WIDE_CLUSTER_BWD_SIZES if c <= most)

    return [ClusterConfig(t.vec, t.packs, t.tpr, c)
            for t, c in [(t, c) for t in tiles for c in sizes(t)] + nonportable]


def wide_cluster_bwd_from(itemsize: int, rms: bool) -> int:
    """The shortest row the wide clusters take (shorter rows: the single wide block)."""
    return WIDE_CLUSTER_BWD_FROM.get((itemsize, rms), 0)


def wide_cluster_bwd_config(n: int, vec: int, itemsize: int, rms: bool = False, nonportable: bool = False,
                            w_itemsize: int | None = None) -> ClusterConfig | None:
    """The fewest wide blocks that hold a row of ``n`` elements in ``vec``-packs, or None
    (the single wide block takes it, or eight blocks, or with ``nonportable`` sixteen
    blocks (v100's narrow float32 ones, v115's half-precision and v117's float32 wide ones),
    do not hold it);
    ``w_itemsize``: the parameters' element size (None: x's)."""
    t = wide_cluster_bwd_tile(itemsize, n, nonportable, w_itemsize, rms)
    blocks = -(-n // t.tile) if t is not None and t.vec == vec and n >= wide_cluster_bwd_from(itemsize, rms) else 0
    past_eight = nonportable and n <= _nonportable_tiles(itemsize, rms).get(t, 0)
    sizes = WIDE_CLUSTER_BWD_SIZES + (WIDE_CLUSTER_BWD_NONPORTABLE_SIZES if past_eight else ())
    return ClusterConfig(t.vec, t.packs, t.tpr, blocks) if blocks in sizes else None


# v122: the persistent cluster backward's grid takes fewer clusters than the GPU runs at once
# where more read slower (bwaves, sixty-first session, benchmarks/results/bwaves-61-h100.txt,
# probe_cluster_waves.py --backward on an H100, 132 SMs): bf16 rows of 65536 in the wide
# clusters of four 1024-thread blocks (30 counted) read, backward of copy, LayerNorm 0.625 /
# 0.717 / 0.755 / 0.710 / 0.662 and RMSNorm 0.735 / 0.834 / 0.781 / 0.737 / 0.753 at 16 / 21 /
# 23 / 24 / 30 clusters, rising to ~22 and falling past it. Clusters of 9, 12 and 16 blocks
# (rows of 147456-262144) still rose at their counts of 7-9, so they keep them. The cap is a
# share of the SMs (blocks = share x SMs, rounded down to whole clusters) for (x's element
# size, blocks a cluster); a cluster size of 1 names the single wide block (rows of
# 8193-16384, backward_plan's resident blocks); absent: the count.
PERSISTENT_BWD_SM_SHARE: dict[tuple[int, int], float] = {(2, 4): 0.67}


def persistent_bwd_clusters(active: int, itemsize: int, cluster: int, sms: int) -> int:
    """The clusters (``cluster`` 1: single wide blocks) a persistent backward's grid takes:
    the ``active`` the GPU runs at once, at most PERSISTENT_BWD_SM_SHARE's share of the
    ``sms`` (never fewer than one)."""
    share = PERSISTENT_BWD_SM_SHARE.get((itemsize, cluster))
    if share is None:
        return active
    return max(1, min(active, int(share * sms) // cluster))


# Half-precision backward rows past the full-row tile (N > 8192) on sm_90, v46: a cluster of
# 2, 4 or 8 blocks, each the full-row backward's 1024-thread one-pack tile of 8192 columns
# staged as that tile is (bwd_stage_depth), the row sums exchanged once (kernels/
# layer_norm_cluster.cu norm_bwd_cluster_staged); the persistent grid holds the clusters the
# GPU runs at once (cuOccupancyMaxActiveClusters: 30 of 4 and 15 of 8 blocks on the H200, where
# the resident blocks over the cluster size, 33 and 16, ran a second wave and read 0.23-0.28
# of copy instead of 0.39-0.46). Measured in benchmarks/NOTES.md, v46.
CLUSTER_STAGED_BWD_TILE = TileConfig(8, 1, 1024)
CLUSTER_STAGED_BWD_SIZES = (2, 4, 8)


def cluster_staged_bwd_config(n: int, vec: int, itemsize: int) -> ClusterConfig | None:
    """The staged backward cluster for a row of ``n`` elements (None: not half precision in
    16-byte packs, or longer than 8 tiles)."""
    return _smallest_holding(n, all_cluster_staged_bwd_configs(vec, itemsize))


def all_cluster_staged_bwd_configs(vec: int, itemsize: int) -> list[ClusterConfig]:
    t = CLUSTER_STAGED_BWD_TILE
    if itemsize != 2 or vec != t.vec:
        return []
    return [ClusterConfig(t.vec, t.packs, t.tpr, c) for c in CLUSTER_STAGED_BWD_SIZES]


# The grid-row kernels (kernels/layer_norm_grid.cu, v79): rows past the cluster and wide
# tiles, the whole grid on a few rows at a time, x (and dy) read once. One block an SM of
# GRID_THREADS threads in row groups of QPAD (GRID_QPADS: the smallest that holds the block's
# slice of the row, one 16-byte pack a thread); each group takes GRID_STEP_ROWS rows a step
# (forward, backward), so a step stages 64 KiB a block, and the ring holds GRID_DEPTH steps
# (192 KiB): each step waits on a grid barrier and its partials' fold, microseconds that only
# the steps in flight keep memory busy through. GRID_LAG: steps between a step's sums and
# its finish, so the barrier's wait and the fold overlap later steps' sums and loads; the
# ring keeps GRID_DEPTH - GRID_LAG - 1 steps in flight. H200 (results/sweep-grid-rows-
# v79b-h200.txt): steps of 64 KiB in a ring of three, lag 1, beat steps of 32 KiB in a ring
# of six, lag 2 or 3, by 0.05-0.12 of copy backward. Measured in NOTES v79.
GRID_THREADS = 1024
GRID_QPADS = (128, 256, 512, 1024)
GRID_STEP_ROWS = {False: 4, True: 2}
GRID_DEPTH = 3
GRID_LAG = 1
GRID_MAX_BLOCKS = 160  # kernels/layer_norm_grid.cu kGridMaxBlocks: the partials a folding lane loads
# The passes and element sizes the grid rows serve ({backward: itemsizes}): on the H200, with
# the side words staged (v79d, results/sweep-grid-rows-v79d-h200.txt), the backward beats the
# split path in both element sizes (bf16 0.44-0.52 of copy against 0.40-0.42, float32
# 0.50-0.55 against 0.49-0.52; float32 rows past 132 x 1024 packs, 540672 elements, do not
# fit a block and stay split); the forward does not (0.36-0.56 against 0.49-0.63 at N >=
# 262144; level at 131072, where the clusters serve it anyway). The tests turn every pass on.
GRID_SERVES = {False: (), True: (2, 4)}
# The shortest row they take: the sweeps measured rows of 256 KiB and up (bf16 131072, float32
# 131072-262144). On sm_90 the clusters serve every row below it; on sm_80 (no clusters) a
# shorter row's slice leaves most of a 128-thread row group idle for a grid barrier each step
# (bf16 16424: 16 packs a block), unmeasured, so those rows keep the split path.
GRID_MIN_ROW_BYTES = 256 * 1024


def grid_serves(backward: bool, itemsize: int, n: int) -> bool:
    """Whether the grid rows take this pass of rows of ``n`` elements of ``itemsize`` bytes
    (before the row's fit in a block: grid_qpad)."""
    return itemsize in GRID_SERVES[backward] and n * itemsize >= GRID_MIN_ROW_BYTES


GRID_MIN_SM = 80  # cp.async and acquire loads


def grid_qpad(packs: int, blocks: int) -> int | None:
    """The row group's threads for a row of ``packs`` 16-byte packs over ``blocks`` blocks
    (None: a slice wider than one block's threads, or blocks without a pack)."""
    if packs < blocks:
        return None
    q = -(-packs // blocks)  # the widest slice
    return next((t for t in GRID_QPADS if t >= q), None)


def grid_stage_rows(qpad: int, backward: bool) -> int:
    """Rows a grid-row step stages (R): every group's GRID_STEP_ROWS."""
    return GRID_THREADS // qpad * GRID_STEP_ROWS[backward]


def grid_stage_bytes(backward: bool) -> int:
    """The grid-row kernel's dynamic shared memory: a ring of GRID_DEPTH steps of 16-byte
    packs (x, and dy in the backward)."""
    return GRID_DEPTH * GRID_STEP_ROWS[backward] * GRID_THREADS * 16 * (2 if backward else 1)


def grid_scratch_words(rows: int, blocks: int) -> tuple[int, int]:
    """(barrier counters, partial floats) of a grid-row launch: GRID_LAG + 1 counters, and
    2 * GRID_LAG + 2 slots of each row's (two) partials a block."""
    return GRID_LAG + 1, (2 * GRID_LAG + 2) * rows * blocks * 2


def split_config(vec: int) -> TileConfig:
    """The split backward's tile (and, before v26, the forward's)."""
    return TileConfig(vec, packs_cap(vec, SPLIT_MAX_VALUES), SPLIT_TPR)


# The split forward's tile: 32 values a thread, so half-precision 16-byte packs take four a
# thread (16 KiB of x a 256-thread block, as fp32's four 4-packs) instead of two; only vec 8
# changes. bf16 split forward at N >= 65536: LayerNorm 0.38 -> 0.46 of copy, RMSNorm 0.44 ->
# 0.51-0.52, fp32 unchanged (benchmarks/NOTES.md, v26).
SPLIT_FWD_MAX_VALUES = 32


def split_fwd_config(vec: int) -> TileConfig:
    return TileConfig(vec, packs_cap(vec, SPLIT_FWD_MAX_VALUES), SPLIT_TPR)


@functools.lru_cache(maxsize=None)
def vec_choices(itemsize: int) -> tuple[int, ...]:
    """Vector widths the dispatcher uses: the widest pack, or scalar when alignment forbids."""
    return (1, max_vec(itemsize)) if max_vec(itemsize) > 1 else (1,)


def bwd_row_config(n: int, vec: int, itemsize: int, rms: bool) -> TileConfig | None:
    """The partial-row backward's full-row tile (None: split path). Rows a warp holds keep the
    BWD warp tile: with BWD_HALF's one pack a thread, bf16 N = 512 took a 128-thread group
    and fell from 0.63 to 0.35 of copy (GPU check after v7)."""
    cfg = row_config(n, vec, BWD)
    limits = bwd_limits(itemsize, rms)
    if limits is BWD or (cfg is not None and cfg.tpr < BWD.min_block_tpr):
        return cfg
    return row_config(n, vec, limits)


def all_tile_configs(vec: int, limits) -> list[TileConfig]:
    """Every full-row config ``row_config`` can return for this vec and these limits (or
    ``limits(n, vec)`` can, for a function)."""
    pick = limits if callable(limits) else (lambda n, v: row_config(n, v, limits))
    seen = []
    n = 1
    while True:
        cfg = pick(n, vec)
        if cfg is None:
            return seen
        if cfg not in seen:
            seen.append(cfg)
        n += vec
