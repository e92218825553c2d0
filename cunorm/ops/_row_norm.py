"""Host side of kernels/layer_norm.cu, shared by LayerNorm and RMSNorm (``rms`` flag).

Framework-neutral: arrays arrive as ``_launch.View``s the frontend prepared (rows addressable
in place, see ``_launch.rows_of``; parameters contiguous, in the dtype ``param_dtype`` names),
outputs as pointers to memory the frontend allocated, scratch through ``alloc(shape, dtype)
-> pointer``, and the frontend's stream. Picks the path by row length:
  full row : the whole row in one register tile (``_config.row_config``), one launch
             forward; backward one launch for few rows (dx blocks and dW/dB column blocks,
             ``_config.column_bwd_max_rows``), else one launch plus the dW/dB partial
             reduction.
  split    : longer rows, cut into tiles of one block each; forward = tile statistics,
             finalize, apply; backward = tile sums, finalize, apply, partial reduction.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy

from .. import _config
from . import _grid_rows
from .._checks import acc_dtype
from .._compile import c_type, function_ptr, held_with_modules
from .._launch import (View, allow_nonportable_clusters, allow_smem, blocks_per_sm, launch, make_current,
                       max_active_clusters, pick_vec, row_layout, scalar_bits, sm_count, smem_limits)

KERNEL_FILE = "layer_norm.cu"
CLUSTER_FILE = "layer_norm_cluster.cu"  # sm_90+ only
# A split forward tile's summary: its pivot, its mean less the pivot, its M2 (v113: tiles
# each about their own pivot, merged in double; kTileStatWords in layer_norm.cu)
TILE_STAT_WORDS = 3
# Long rows on sm_90+ through a thread-block cluster (x read once) instead of the split path,
# up to the largest cluster tile (_config.CLUSTER_SHAPES): measured in benchmarks/NOTES.md, v13.
USE_CLUSTERS = True
# The cluster backward is correct (tests/test_cluster_path.py turns it on) but slower than the
# split path: bf16 0.14-0.22 of copy against 0.30-0.42, fp32 0.36-0.43 against 0.46-0.54 (v16).
USE_CLUSTER_BACKWARD = False
# Half-precision rows of 8193-65536 elements through norm_bwd_cluster_staged (sm_90+, v46):
# the 1024-thread full-row tile, staged, each block of a cluster 8192 columns, against the
# split path in two rounds (results/sweep-cluster-bwd-staged-occupancy-h200.txt, backward of
# copy): bf16 LayerNorm N = 16384 / 32768 / 65536 0.40 / 0.39 / 0.39 -> 0.47 / 0.41-0.43 /
# 0.41-0.42, RMSNorm 0.41-0.42 / 0.39-0.41 / 0.40 -> 0.44-0.45 / 0.39-0.40 / 0.40-0.42; fp16
# +0.02-0.09. It serves before USE_CLUSTER_BACKWARD's kernel. Since v63 and v68 the wide
# block and its clusters take all these rows first, so it serves only with them switched off
# (USE_WIDE_BACKWARD = False), as a fallback.
USE_STAGED_CLUSTER_BACKWARD = True
# Rows of 8193-16384 elements through norm_bwd_wide (v63 half precision, v65 float32; v66
# half-precision RMSNorm to 32768: _config.wide_bwd_tiles), before the staged cluster;
# WIDE_DEPTH forces its ring's rows (the sweeps), None: the policy.
USE_WIDE_BACKWARD = True
WIDE_DEPTH = None
# Rows past one wide block through a cluster of them (sm_90+, v68: _config.
# wide_cluster_bwd_config), before the staged cluster.
USE_WIDE_CLUSTER_BACKWARD = True
# Full-row backward tiles of 16-byte half-precision packs copy the next row into shared memory
# (cp.async) while reducing the current one: kernels/row_norm.cuh ``Staged``, which this
# mirrors (CUNORM_BWD_STAGE); measured in benchmarks/NOTES.md, v19.
STAGE_BACKWARD = True
# Rows a staged backward holds in its buffers: None, _config.bwd_stage_depth's choice a tile
# (as the kernels' StagePolicy); a number forces it, set by the sweeps together with
# -DCUNORM_BWD_STAGE_DEPTH (benchmarks/sweep_bwd_stage.py).
STAGE_DEPTH = None
# The split backward's persistent grid holds at most the resident blocks: bf16 backward at
# N = 65536 / 131072 / 262144 0.30 / 0.29 / 0.26 -> 0.38 / 0.35 / 0.31 of copy (LayerNorm),
# where rounding up ran a second wave (benchmarks/NOTES.md, v27; sweeps set it off).
SPLIT_BACKWARD_ONE_WAVE = True
# Full-row forward tiles of 16-byte packs hold their row in shared memory (kernels/layer_norm.cu
# norm_fwd_smem) instead of registers where _config.SMEM_FWD_FROM says: bf16 RMSNorm forward
# 0.62-0.82 -> 0.85-0.87 of copy at N = 512-16384, LayerNorm N = 8192 / 16384 0.64 / 0.55 ->
# 0.76 / 0.75, the rest unchanged (benchmarks/NOTES.md, v22; float32, v31).
HOLD_ROWS_IN_SMEM = True
# Bytes of (dynamic) shared memory a block: bf16 rows up to N = 32768 (v29; 32 KiB, N = 16384,
# before: N = 32768 took the register tile at 0.48-0.51 of copy).
ROW_SMEM_MAX = 65536
FULL_ROW, CHUNK_STATS, CHUNK_APPLY = 0, 1, 2

# (x dtype, parameter dtype) pairs compiled as such; any other parameter dtype is cast to
# float32 first (a copy of N elements, nothing per row).
TYPE_PAIRS = (
    ("float16", "float16"), ("float16", "float32"),
    ("bfloat16", "bfloat16"), ("bfloat16", "float32"),
    ("float32", "float32"),
    ("float64", "float64"), ("float64", "float32"),
)
GRAD_TYPES = ("float16", "bfloat16", "float32", "float64")


def _b(flag: bool) -> str:
    return "true" if flag else "false"


def _tile_name(kernel: str, t: str, w: str, cfg: _config.TileConfig, rms: bool, *extra) -> str:
    args = [c_type(t), c_type(w), str(cfg.vec), str(cfg.packs), str(cfg.tpr), _b(rms), *map(str, extra)]
    return f"{kernel}<{', '.join(args)}>"


def smem_row_config(n: int, vec: int, itemsize: int) -> _config.TileConfig | None:
    """norm_fwd_smem's tile for a row of ``n`` elements (kernels/row_norm.cuh FwdInSmem),
    or None where the register tile serves the row."""
    return _config.smem_fwd_config(n, vec, itemsize, ROW_SMEM_MAX) if HOLD_ROWS_IN_SMEM else None


def smem_row_bytes(cfg: _config.TileConfig) -> int:
    """norm_fwd_smem's dynamic shared memory: the block's 16-byte packs of one row set."""
    return _config._smem_bytes(cfg)


def _acc_name(t: str) -> str:
    return "double" if t == "float64" else "float"


def instantiations() -> list[str]:
    """Every name expression the dispatcher below can launch (CI compiles them all)."""
    names: list[str] = []
    for t, w in TYPE_PAIRS:
        itemsize = _itemsize(t)
        for vec in _config.vec_choices(itemsize):
            split = _config.split_config(vec)
            for rms in (False, True):
                names += [_tile_name("norm_fwd", t, w, c, rms, FULL_ROW)
                          for c in _config.all_tile_configs(vec, _config.FWD)]
                names += [_tile_name("norm_fwd_smem", t, w, c, rms)
                          for c in _config.all_smem_fwd_configs(vec, itemsize, ROW_SMEM_MAX)]
                names += [_tile_name("norm_bwd", t, w, c, rms, FULL_ROW)
                          for c in _config.all_tile_configs(
                              vec, lambda n, v: _config.bwd_row_config(n, v, itemsize, rms))]
                names += [_tile_name("norm_bwd_columns", t, w, c, rms)
                          for c in _config.all_tile_configs(vec, _config.COLUMN_BWD)]
                split_fwd = _config.split_fwd_config(vec)
                names += [_tile_name("norm_fwd", t, w, split_fwd, rms, CHUNK_STATS),
                          _tile_name("norm_fwd", t, w, split_fwd, rms, CHUNK_APPLY),
                          _tile_name("norm_bwd_tile_sums", t, w, split, rms),
                          _tile_name("norm_bwd", t, w, split, rms, CHUNK_APPLY)]
        if itemsize in (2, 4):
            names += [_wide_name(t, w, rms, d, tile) for rms in (False, True)
                      for tile in _config.wide_bwd_tiles(itemsize, rms) for d in _config.WIDE_BWD_DEPTHS]
    for acc in ("float32", "float64"):
        a = c_type(acc)
        for rms in (False, True):
            names.append(f"norm_fwd_finalize<{a}, {_b(rms)}>")
        names.append(f"norm_bwd_finalize<{a}>")
        names += [f"norm_reduce_partials<{a}, {c_type(_np_name(g))}>" for g in GRAD_TYPES]
    return names


def cluster_instantiations() -> list[str]:
    """The cluster kernels the dispatcher can launch (compiled for sm_90 only)."""
    names = []
    for t, w in TYPE_PAIRS:
        if t == "float64":
            continue
        vec = _config.max_vec(_itemsize(t))
        for kernel, configs in (("norm_fwd_cluster", _config.all_cluster_configs(vec)),
                                ("norm_bwd_cluster", _config.all_cluster_bwd_configs(vec))):
            for cfg in configs:
                for rms in (False, True):
                    names.append(_cluster_name(kernel, t, w, cfg, rms))
        names += [_cluster_name("norm_fwd_cluster", t, w, cfg, rms)  # v119's, v120's non-portable tile
                  for cfg in _config.all_nonportable_cluster_fwd_configs(vec, _itemsize(t)) for rms in (False, True)]
        itemsize = _itemsize(t)
        for cfg in _config.all_cluster_staged_bwd_configs(vec, itemsize):
            names += [_staged_cluster_name(t, w, cfg, rms) for rms in (False, True)]
        for rms in (False, True):
            names += [_wide_cluster_name(t, w, rms, d, cfg)
                      for cfg in _config.wide_cluster_bwd_configs(itemsize, _itemsize(w), rms)
                      for d in _config.WIDE_BWD_DEPTHS]
    return names


def _itemsize(name: str) -> int:
    return numpy.dtype(_np_name(name)).itemsize


def _wide_name(t: str, w: str, rms: bool, depth: int, tile: _config.TileConfig) -> str:
    return f"norm_bwd_wide<{c_type(t)}, {c_type(w)}, {_b(rms)}, {depth}, {tile.tile}>"


def _wide_depth(tile: _config.TileConfig, rms: bool, n: int, itemsize: int, device: int, cluster: bool,
                w_itemsize: int) -> int | None:
    """Rows in a wide block's ring for rows of n columns a block (WIDE_DEPTH forces it)."""
    return WIDE_DEPTH or _config.wide_bwd_depth(tile, rms, n, itemsize, smem_limits(device)[0], cluster, w_itemsize)


def _wide_plan(itemsize: int, w_itemsize: int, n: int, vec: int, rms: bool,
               device: int) -> tuple[_config.TileConfig, int] | None:
    """The wide backward's (tile, ring depth) for this row, or None where it does not serve."""
    tile = _config.wide_bwd_tile(n, vec, itemsize, rms) if USE_WIDE_BACKWARD and STAGE_BACKWARD else None
    depth = None if tile is None else _wide_depth(tile, rms, n, itemsize, device, False, w_itemsize)
    return None if depth is None else (tile, depth)


def _wide_cluster_name(t: str, w: str, rms: bool, depth: int, cfg: _config.ClusterConfig) -> str:
    return (f"norm_bwd_wide_cluster<{c_type(t)}, {c_type(w)}, {_b(rms)}, {depth}, {cfg.block_columns}, {cfg.cluster}, "
            f"{cfg.block}>")


def _wide_cluster_plan(t: str, wn: str, itemsize: int, n: int, vec: int, rms: bool, device: int):
    """The wide cluster backward's (cluster config, its blocks' wide tile, ring depth) for
    this row, or None where it does not serve. The ring's depth is the wide block's for a
    full tile."""
    if not (USE_WIDE_CLUSTER_BACKWARD and USE_WIDE_BACKWARD and STAGE_BACKWARD and _clusters_serve(t, device)):
        return None
    for nonportable in (True, False):  # v100's clusters of 9-16 blocks where the GPU runs them
        cfg = _config.wide_cluster_bwd_config(n, vec, itemsize, rms, nonportable, _itemsize(wn))
        tile = _config.wide_cluster_bwd_tile(itemsize, n, nonportable, _itemsize(wn), rms)
        depth = None if cfg is None else _wide_depth(tile, rms, tile.tile, itemsize, device, True, _itemsize(wn))
        if depth is not None and (cfg.cluster <= 8 or
                                  _nonportable_clusters_run(t, wn, itemsize, rms, depth, cfg, tile, device)):
            return cfg, tile, depth
    return None


def _nonportable_clusters_run(t: str, wn: str, itemsize: int, rms: bool, depth: int, cfg, tile, device: int) -> bool:
    """Whether the driver allows and runs at least one cluster of this wide kernel past the
    portable eight blocks (allowing it on the kernel first)."""
    main = function_ptr(CLUSTER_FILE, _wide_cluster_name(t, wn, rms, depth, cfg), device)
    smem = _config.wide_bwd_smem(tile, itemsize, depth, smem_limits(device)[0], rms, True, _itemsize(wn))
    if not allow_nonportable_clusters(main):
        return False
    allow_smem(main, smem)
    return (max_active_clusters(main, cfg.block, smem, cfg.cluster) or 0) >= 1


def _staged_cluster_name(t: str, w: str, cfg: _config.ClusterConfig, rms: bool) -> str:
    return f"norm_bwd_cluster_staged<{c_type(t)}, {c_type(w)}, {cfg.cluster}, {_b(rms)}>"


def _cluster_name(kernel: str, t: str, w: str, cfg: _config.ClusterConfig, rms: bool) -> str:
    return f"{kernel}<{c_type(t)}, {c_type(w)}, {cfg.vec}, {cfg.packs}, {cfg.tpb}, {cfg.cluster}, {_b(rms)}>"


def _clusters_serve(t: str, device: int) -> bool:
    return USE_CLUSTERS and t != "float64" and _compute_capability(device) >= _config.CLUSTER_MIN_SM


@functools.lru_cache(maxsize=None)
def _compute_capability(device: int) -> int:
    import cupy

    return int(cupy.cuda.Device(device).compute_capability)


def _np_name(name: str):
    from .._checks import BFLOAT16

    return BFLOAT16 if name == "bfloat16" else numpy.dtype(name)


def param_dtype(x_dtype, weight_dtype, bias_dtype):
    """The parameter dtype the kernels read: the parameters' own when they agree and the pair
    with x is compiled, else x's accumulation dtype (the frontend casts them first; N
    elements): float64 parameters for float64 x keep a mixed pair exact."""
    dtypes = {d for d in (weight_dtype, bias_dtype) if d is not None}
    if not dtypes:
        return numpy.dtype(x_dtype)
    if len(dtypes) == 1:
        (d,) = dtypes
        if (numpy.dtype(x_dtype).name, numpy.dtype(d).name) in TYPE_PAIRS:
            return numpy.dtype(d)
    return numpy.dtype(numpy.float64 if numpy.dtype(x_dtype) == numpy.float64 else numpy.float32)


def _p(v) -> int:
    return 0 if v is None else v.ptr


@held_with_modules
@functools.lru_cache(maxsize=4096)
def _forward_kernels(t: str, wn: str, n: int, vec: int, rms: bool, device: int):
    """(config, kernel pointers, dynamic shared memory) of a forward: one kernel on the
    full-row paths (its row in shared memory or in registers), three (tile statistics,
    finalize, apply) on the split path."""
    itemsize, w_itemsize = _itemsize(t), _itemsize(wn)
    if _config.fwd_cluster_for_wide_params(itemsize, w_itemsize, n) and _clusters_serve(t, device):
        cluster = _cluster_forward(t, wn, n, vec, rms, device)
        if cluster is not None:  # v106
            return cluster
    scfg = smem_row_config(n, vec, itemsize)
    if scfg is not None:
        return scfg, (function_ptr(KERNEL_FILE, _tile_name("norm_fwd_smem", t, wn, scfg, rms), device),), \
            smem_row_bytes(scfg)
    cfg = _config.row_config(n, vec, _config.FWD)
    if cfg is not None:
        return cfg, (function_ptr(KERNEL_FILE, _tile_name("norm_fwd", t, wn, cfg, rms, FULL_ROW), device),), 0
    cluster = _cluster_forward(t, wn, n, vec, rms, device) if _clusters_serve(t, device) else None
    if cluster is not None:
        return cluster
    grid = _grid_rows.grid_plan(False, t, wn, itemsize, n, vec, rms, device)
    if grid is not None:
        return grid, (grid.kernel,), grid.smem
    cfg = _config.split_fwd_config(vec)
    return cfg, (function_ptr(KERNEL_FILE, _tile_name("norm_fwd", t, wn, cfg, rms, CHUNK_STATS), device),
                 function_ptr(KERNEL_FILE, f"norm_fwd_finalize<{_acc_name(t)}, {_b(rms)}>", device),
                 function_ptr(KERNEL_FILE, _tile_name("norm_fwd", t, wn, cfg, rms, CHUNK_APPLY), device)), 0


def _cluster_forward(t: str, wn: str, n: int, vec: int, rms: bool, device: int):
    """_forward_kernels' answer for a row a cluster tile holds (None past them): v119's and
    v120's sixteen blocks where they serve and the driver runs them, else the portable tile."""
    ccfg = _config.cluster_config(n, vec)
    if ccfg is None:
        return None
    wide = _config.nonportable_cluster_fwd_config(n, vec, _itemsize(t), rms)
    if wide is not None and _nonportable_forward_runs(t, wn, wide, rms, device):
        ccfg = wide
    return _cluster_forward_kernel(t, wn, ccfg, rms, device)


def _nonportable_forward_runs(t: str, wn: str, cfg: _config.ClusterConfig, rms: bool, device: int) -> bool:
    """Whether the driver allows and runs at least one cluster of this non-portable cluster
    forward (v119, v120; allowing it on the kernel first)."""
    main = function_ptr(CLUSTER_FILE, _cluster_name("norm_fwd_cluster", t, wn, cfg, rms), device)
    smem = _config.cluster_fwd_smem(cfg, _itemsize(t), _itemsize(wn), rms, smem_limits(device)[0])
    if not allow_nonportable_clusters(main):
        return False
    allow_smem(main, smem)
    return (max_active_clusters(main, cfg.block, smem, cfg.cluster) or 0) >= 1


def _cluster_forward_kernel(t: str, wn: str, ccfg: _config.ClusterConfig, rms: bool, device: int):
    """_forward_kernels' answer for the cluster forward."""
    return ccfg, (function_ptr(CLUSTER_FILE, _cluster_name("norm_fwd_cluster", t, wn, ccfg, rms), device),), \
        _config.cluster_fwd_smem(ccfg, _itemsize(t), _itemsize(wn), rms, smem_limits(device)[0])


class ForwardPlan(NamedTuple):
    """Everything about a forward launch but its pointers."""

    kernels: tuple  # (full row,) or (tile statistics, finalize, apply)
    grid: int
    block: int
    row_args: tuple
    tail: tuple  # the full-row kernel's trailing scalar arguments
    m: int
    n: int
    tiles: int  # 1 on the full-row path
    tile: int  # elements per tile on the split path
    rms: bool
    eps_bits: int
    acc: numpy.dtype
    smem: int = 0  # dynamic shared memory of the full-row kernel (norm_fwd_smem)
    grid_rows: _grid_rows.GridPlan | None = None  # the grid-row kernel's launch (kernels[0])


# Plans are cached by call signature (layout, dtypes, options, alignment class): small batches
# spend more time on the host than on the GPU, so a repeated call only fills in its pointers
# (benchmarks/NOTES.md, v3 and v5). Pointer alignment enters only through the pack width (a
# power of two up to 16 bytes), so each pointer group's addresses ORed, mod 16, is all of it
# a plan depends on.
@held_with_modules
@functools.lru_cache(maxsize=4096)
def forward_plan(shape: tuple, strides: tuple, dtype, wdtype, nd: int, rms: bool, eps: float, device: int,
                 x_align: int, p_align: int) -> ForwardPlan | None:
    """The launch plan of a forward over x of this layout (element strides) and dtype with
    contiguous parameters of ``wdtype``; ``x_align`` = (x | y) mod 16, ``p_align`` = (weight |
    bias) mod 16. None when the kernels cannot address the rows in place (the frontend copies
    x first) or there is no element."""
    rows = row_layout(tuple(shape), tuple(strides), nd)
    if rows is None or rows.rows == 0 or rows.n == 0:
        return None
    m, n = rows.rows, rows.n
    dtype, wdtype = numpy.dtype(dtype), numpy.dtype(wdtype)
    vec = pick_vec(dtype.itemsize, n, [(x_align, dtype.itemsize), (p_align, wdtype.itemsize)], rows.strides)
    cfg, kernels, smem = _forward_kernels(dtype.name, wdtype.name, n, vec, rms, device)
    acc = acc_dtype(dtype)
    eps_bits = scalar_bits(eps, acc)
    if isinstance(cfg, _grid_rows.GridPlan):
        return ForwardPlan(kernels, cfg.blocks, cfg.block, rows.args(), (m, n, eps_bits), m, n, 1, n, rms, eps_bits,
                           acc, cfg.smem, cfg)
    if isinstance(cfg, _config.ClusterConfig):
        clusters = min(m, _config.MAX_GRID // cfg.cluster)  # a cluster a row, looping past the grid
        if smem:  # rows staged ahead (v49): persistent, as many clusters as run at once
            allow_smem(kernels[0], smem)
            active = max_active_clusters(kernels[0], cfg.block, smem, cfg.cluster) or \
                blocks_per_sm(kernels[0], cfg.block, smem) * sm_count(device) // cfg.cluster
            clusters = max(1, min(clusters, active))
        return ForwardPlan(kernels, clusters * cfg.cluster, cfg.block, rows.args(), (0, 0, m, n, 1, eps_bits), m, n,
                           1, cfg.tile, rms, eps_bits, acc, smem)
    if len(kernels) == 1:
        grid, tiles = min(-(-m // cfg.rows_per_block), _config.MAX_GRID), 1
        if smem:
            allow_smem(kernels[0], smem)
            return ForwardPlan(kernels, grid, cfg.block, rows.args(), (0, 0, m, n, 1, eps_bits), m, n, tiles,
                               cfg.tile, rms, eps_bits, acc, smem)
    else:
        tiles = -(-n // cfg.tile)
        grid = min(m * tiles, _config.MAX_GRID)
    return ForwardPlan(kernels, grid, cfg.block, rows.args(), (0, 0, m, n, 1, eps_bits), m, n, tiles,
                       cfg.tile, rms, eps_bits, acc)


def run_forward(plan: ForwardPlan, x: int, y: int, weight: int, bias: int, mean: int, rstd: int, alloc,
                stream: int) -> None:
    """Launches a forward: writes y and, where their pointers are non-null, mean (LayerNorm)
    and rstd. ``alloc(shape, dtype) -> pointer`` is called on the split path only."""
    mean = 0 if plan.rms else mean
    head = (x, *plan.row_args, y, weight, bias, mean, rstd)
    if plan.grid_rows is not None:
        _grid_rows.run(plan.grid_rows, head, plan.tail, alloc, stream)
        return
    if plan.tiles == 1:
        launch(plan.kernels[0], plan.grid, plan.block, (*head, *plan.tail), stream, plan.smem)
        return
    m, n, tiles, acc, eps_bits = plan.m, plan.n, plan.tiles, plan.acc, plan.eps_bits
    tile_stats = alloc((m, tiles, TILE_STAT_WORDS), acc)
    row_shift = 0 if plan.rms else alloc((m, 2), acc)
    if rstd == 0:  # the split path passes the statistics between its kernels
        rstd = alloc((m,), acc)
        mean = 0 if plan.rms else alloc((m,), acc)
        head = (*head[:-2], mean, rstd)
    stats, finalize, apply = plan.kernels
    launch(stats, plan.grid, plan.block, (*head, tile_stats, row_shift, m, n, tiles, eps_bits), stream)
    launch(finalize, min(-(-m // 4), _config.MAX_GRID), 128,
           (tile_stats, row_shift, mean, rstd, m, n, tiles, plan.tile, eps_bits), stream)
    launch(apply, plan.grid, plan.block, (*head, tile_stats, row_shift, m, n, tiles, eps_bits), stream)


def forward_scratch(plan: ForwardPlan, stats: bool) -> list:
    """The (shape, dtype) of each ``alloc`` run_forward makes with this plan, in order, for a
    frontend that must hand out scratch it allocated beforehand (JAX)."""
    if plan.grid_rows is not None:
        return [_grid_rows.scratch(plan.grid_rows)]
    if plan.tiles == 1:
        return []
    m, acc = plan.m, plan.acc
    out = [((m, plan.tiles, TILE_STAT_WORDS), acc)] + ([] if plan.rms else [((m, 2), acc)])
    if not stats:
        out += [((m,), acc)] + ([] if plan.rms else [((m,), acc)])
    return out


def forward(x: View, weight: View | None, bias: View | None, y: int, mean: int, rstd: int, eps: float,
            nd: int, rms: bool, alloc, stream: int, device: int) -> None:
    """Writes y (contiguous, x's shape and dtype) and, where their pointers are non-null,
    mean (LayerNorm) and rstd (one per row, fp32/fp64). ``x`` must satisfy ``rows_of`` and
    have an element; the parameters are contiguous in one ``param_dtype``."""
    make_current(device)
    wp, bp = _p(weight), _p(bias)
    wdt = next((p.dtype for p in (weight, bias) if p is not None), x.dtype)
    plan = forward_plan(x.shape, x.strides, x.dtype, wdt, nd, rms, eps, device, (x.ptr | y) & 15, (wp | bp) & 15)
    if plan is None:
        raise ValueError("x: rows not addressable in place or empty (the frontend must copy it first)")
    run_forward(plan, x.ptr, y, wp, bp, mean, rstd, alloc, stream)


def stage_bytes(cfg: _config.TileConfig, dy_itemsize: int, x_itemsize: int, rms: bool) -> int:
    """Dynamic shared memory of a full-row backward tile: a buffer of the x (or h) and dy
    packs for each row the kernel stages (``Staged``: 16-byte packs of a half-precision dy;
    as many as _config.bwd_stage_depth says), else 0."""
    if not (STAGE_BACKWARD and dy_itemsize == 2 and cfg.vec * dy_itemsize == 16):
        return 0
    depth = STAGE_DEPTH or _config.bwd_stage_depth(cfg.tpr, rms)
    return depth * cfg.packs * cfg.block * cfg.vec * (dy_itemsize + x_itemsize)


def _backward_kernels(t: str, wn: str, gn: str, n: int, vec: int, rms: bool, device: int):
    """(config, main, tile-sum, finalize, partial-reduce, resident main blocks, dynamic shared
    memory of main); tile-sum and finalize on the split path only."""
    itemsize = _itemsize(t)
    cfg = _config.bwd_row_config(n, vec, itemsize, rms)
    reduce = function_ptr(KERNEL_FILE, f"norm_reduce_partials<{_acc_name(t)}, {c_type(gn)}>", device)
    if cfg is not None:
        main = function_ptr(KERNEL_FILE, _tile_name("norm_bwd", t, wn, cfg, rms, FULL_ROW), device)
        smem = stage_bytes(cfg, itemsize, itemsize, rms)
        return cfg, main, None, None, reduce, sm_count(device) * blocks_per_sm(main, cfg.block, smem), smem
    # the wide clusters first: from _config.wide_cluster_bwd_from on they take rows the single
    # wide block also holds (where clusters exist)
    wide_cluster = _wide_cluster_plan(t, wn, itemsize, n, vec, rms, device)
    if wide_cluster is not None:
        ccfg, tile, depth = wide_cluster
        main = function_ptr(CLUSTER_FILE, _wide_cluster_name(t, wn, rms, depth, ccfg), device)
        smem = _config.wide_bwd_smem(tile, itemsize, depth, smem_limits(device)[0], rms, True, _itemsize(wn))
        return ccfg, main, None, None, reduce, sm_count(device) * blocks_per_sm(main, ccfg.block, smem), smem
    wide = _wide_plan(itemsize, _itemsize(wn), n, vec, rms, device)
    if wide is not None:
        cfg, depth = wide
        main = function_ptr(KERNEL_FILE, _wide_name(t, wn, rms, depth, cfg), device)
        smem = _config.wide_bwd_smem(cfg, itemsize, depth, smem_limits(device)[0], rms, False, _itemsize(wn))
        return cfg, main, None, None, reduce, sm_count(device) * blocks_per_sm(main, cfg.block, smem), smem
    scfg = _config.cluster_staged_bwd_config(n, vec, itemsize) \
        if USE_STAGED_CLUSTER_BACKWARD and STAGE_BACKWARD and _clusters_serve(t, device) else None
    if scfg is not None:
        main = function_ptr(CLUSTER_FILE, _staged_cluster_name(t, wn, scfg, rms), device)
        smem = stage_bytes(_config.CLUSTER_STAGED_BWD_TILE, itemsize, itemsize, rms)
        return scfg, main, None, None, reduce, sm_count(device) * blocks_per_sm(main, scfg.block, smem), smem
    ccfg = _config.cluster_bwd_config(n, vec) if USE_CLUSTER_BACKWARD and _clusters_serve(t, device) else None
    if ccfg is not None:
        main = function_ptr(CLUSTER_FILE, _cluster_name("norm_bwd_cluster", t, wn, ccfg, rms), device)
        return ccfg, main, None, None, reduce, sm_count(device) * blocks_per_sm(main, ccfg.block), 0
    grid = _grid_rows.grid_plan(True, t, wn, itemsize, n, vec, rms, device)
    if grid is not None:
        return grid, grid.kernel, None, None, reduce, grid.blocks, grid.smem
    cfg = _config.split_config(vec)
    main = function_ptr(KERNEL_FILE, _tile_name("norm_bwd", t, wn, cfg, rms, CHUNK_APPLY), device)
    sums = function_ptr(KERNEL_FILE, _tile_name("norm_bwd_tile_sums", t, wn, cfg, rms), device)
    finalize = function_ptr(KERNEL_FILE, f"norm_bwd_finalize<{_acc_name(t)}>", device)
    return cfg, main, sums, finalize, reduce, sm_count(device) * blocks_per_sm(main, cfg.block), 0


def _column_backward(t: str, wn: str, n: int, vec: int, rms: bool, m: int, device: int):
    """(config, kernel) of the one-launch column backward, or None where M is too large for it
    or the row does not fit its tile."""
    cfg = _config.row_config(n, vec, _config.COLUMN_BWD)
    if cfg is None or m > _config.column_bwd_max_rows(cfg):
        return None
    return cfg, function_ptr(KERNEL_FILE, _tile_name("norm_bwd_columns", t, wn, cfg, rms), device)


class BackwardPlan(NamedTuple):
    """Everything about a backward launch but its pointers."""

    main: int
    blocks: int  # main-kernel blocks (row blocks of the column kernel)
    block: int
    groups: int  # rows of dW/dB partials the main kernel writes (0: the column kernel)
    reduce: int
    dy_args: tuple
    x_args: tuple
    m: int
    n: int
    split: tuple | None  # (tile-sum kernel, finalize kernel, tiles) on the split path
    acc: numpy.dtype
    column_blocks: int  # > 0: `main` is norm_bwd_columns, dW/dB in the same launch
    smem: int = 0  # dynamic shared memory of `main` (rows staged, stage_bytes)
    grid_rows: _grid_rows.GridPlan | None = None  # `main` is the grid-row kernel: one partial row


@held_with_modules
@functools.lru_cache(maxsize=4096)
def backward_plan(shape: tuple, x_strides: tuple, dy_strides: tuple, dtype, wdtype, grad_dtype, nd: int,
                  rms: bool, device: int, x_align: int, p_align: int) -> BackwardPlan | None:
    """The launch plan of a backward (dy of x's shape); ``x_align`` = (x | dy | dx) mod 16,
    ``p_align`` = weight mod 16. None when x or dy cannot be addressed in place or there is
    no element."""
    xr, dyr = row_layout(tuple(shape), tuple(x_strides), nd), row_layout(tuple(shape), tuple(dy_strides), nd)
    if xr is None or dyr is None or xr.rows == 0 or xr.n == 0:
        return None
    m, n = xr.rows, xr.n
    dtype, wdtype = numpy.dtype(dtype), numpy.dtype(wdtype)
    vec = pick_vec(dtype.itemsize, n, [(x_align, dtype.itemsize), (p_align, wdtype.itemsize)],
                   (*xr.strides, *dyr.strides))
    acc = acc_dtype(dtype)
    # the column kernel writes dW/dB in the kernel's parameter dtype only
    columns = _column_backward(dtype.name, wdtype.name, n, vec, rms, m, device) \
        if numpy.dtype(grad_dtype) == wdtype else None
    if columns is not None:
        cfg, kernel = columns
        return BackwardPlan(kernel, -(-m // cfg.rows_per_block), cfg.block, 0, 0, dyr.args(), xr.args(), m, n, None,
                            acc, -(-n // (_config.COLUMN_LANES * vec)))
    cfg, main, sums, finalize, reduce, resident, smem = _backward_kernels(
        dtype.name, wdtype.name, numpy.dtype(grad_dtype).name, n, vec, rms, device)
    if isinstance(cfg, _grid_rows.GridPlan):
        return BackwardPlan(main, cfg.blocks, cfg.block, 1, reduce, dyr.args(), xr.args(), m, n, None, acc, 0,
                            smem, cfg)
    if isinstance(cfg, _config.ClusterConfig):  # persistent clusters, one partial row each
        # as many as run at once: more ran a second wave at 4 and 8 blocks a cluster (v46)
        active = max_active_clusters(main, cfg.block, smem, cfg.cluster) or resident // cfg.cluster
        # and fewer where more read slower (v122, _config.PERSISTENT_BWD_SM_SHARE)
        clusters = max(1, min(m, _config.persistent_bwd_clusters(active, dtype.itemsize, cfg.cluster,
                                                                 sm_count(device))))
        return BackwardPlan(main, clusters * cfg.cluster, cfg.block, clusters, reduce, dyr.args(), xr.args(), m, n,
                            None, acc, 0, smem)
    if sums is None:
        if _config.bwd_row_config(n, vec, dtype.itemsize, rms) is None:  # the single wide block
            resident = _config.persistent_bwd_clusters(resident, dtype.itemsize, 1, sm_count(device))
        blocks = min(-(-m // cfg.rows_per_block), resident)
        return BackwardPlan(main, blocks, cfg.block, blocks * cfg.rows_per_block, reduce, dyr.args(), xr.args(),
                            m, n, None, acc, 0, smem)
    tiles = -(-n // cfg.tile)
    # row groups of `tiles` blocks each, as many as are resident at once: one more group
    # than that (rounding up, before v27) ran a second wave of a few groups, each walking
    # M / groups rows alone
    blocks = max(1, min(m, (resident if SPLIT_BACKWARD_ONE_WAVE else resident + tiles - 1) // tiles))
    return BackwardPlan(main, blocks, cfg.block, blocks, reduce, dyr.args(), xr.args(), m, n,
                        (sums, finalize, tiles), acc, 0)


def run_backward(plan: BackwardPlan, dy: int, x: int, weight: int, mean: int, rstd: int, dx: int, dw: int,
                 db: int, alloc, stream: int) -> None:
    """Launches a backward: writes dx and, where their pointers are non-null, dweight and
    dbias. Deterministic: fixed reduction trees, no atomics. ``alloc(shape, dtype) ->
    pointer`` gives the scratch (dW/dB partials; tile sums on the split path)."""
    if plan.column_blocks:
        grid, args = column_launch(plan, dy, x, weight, mean, rstd, dx, dw, db)
        launch(plan.main, grid, plan.block, args, stream)
        return
    stats = (weight, mean, rstd)
    m, n, groups, acc = plan.m, plan.n, plan.groups, plan.acc
    if plan.grid_rows is not None:
        dw_part, db_part = partial_rows(dw, db, 1, n, acc, alloc)
        _grid_rows.run(plan.grid_rows, (dy, *plan.dy_args, x, *plan.x_args, *stats, dx, dw_part, db_part), (m, n),
                       alloc, stream)
        reduce_partial_rows(plan.reduce, dw_part, dw, db_part, db, 1, n, stream)
        return
    row_sums, tiles = 0, 1
    if plan.split is not None:
        sums, finalize, tiles = plan.split
        tile_sums = alloc((m, tiles, 2), acc)
        launch(sums, min(m * tiles, _config.MAX_GRID), plan.block,
               (dy, *plan.dy_args, x, *plan.x_args, *stats, tile_sums, m, n, tiles), stream)
        row_sums = alloc((m, 2), acc)
        launch(finalize, min(-(-m // 4), _config.MAX_GRID), 128, (tile_sums, row_sums, m, tiles), stream)
    dw_part, db_part = partial_rows(dw, db, groups, n, acc, alloc)
    launch(plan.main, plan.blocks * tiles, plan.block,
           (dy, *plan.dy_args, x, *plan.x_args, *stats, row_sums, dx, dw_part, db_part, m, n, tiles), stream, plan.smem)
    reduce_partial_rows(plan.reduce, dw_part, dw, db_part, db, groups, n, stream)


def column_launch(plan: BackwardPlan, dy: int, x: int, weight: int, mean: int, rstd: int, dx: int, dw: int,
                  db: int) -> tuple[int, list]:
    """(grid, arguments) of a column plan's one launch (``plan.column_blocks``): dy's pointer
    is the first argument, so a caller that prepares the list before dy exists fills in
    slot 0 (torch's prepared backward)."""
    grid = plan.blocks + (plan.column_blocks if dw or db else 0)
    return grid, [dy, *plan.dy_args, x, *plan.x_args, weight, mean, rstd, dx, dw, db, plan.m, plan.n, plan.blocks]


def partial_rows(dw: int, db: int, groups: int, n: int, acc: numpy.dtype, alloc) -> tuple[int, int]:
    """Scratch for the persistent row groups' dW / dB partial rows ([groups, n] each, in one
    buffer), for the gradients asked for (pointers; 0 where not)."""
    if not (dw or db):
        return 0, 0
    part = alloc(((dw != 0) + (db != 0), groups, n), acc)
    return (part if dw else 0), ((part + groups * n * acc.itemsize if dw else part) if db else 0)


def reduce_partial_rows(reduce: int, dw_part: int, dw: int, db_part: int, db: int, groups: int, n: int,
                        stream: int) -> None:
    """norm_reduce_partials: the partial rows folded into dweight / dbias, fixed order (the
    same bits for any lane count of at least ``groups``)."""
    if dw or db:
        lanes = min(32, 1 << max(0, (groups - 1).bit_length()))
        width = 1024 // lanes
        launch(reduce, (-(-n // width), 2), (width, lanes), (dw_part, dw, db_part, db, groups, n), stream)


def backward_scratch(plan: BackwardPlan, dw: bool, db: bool) -> list:
    """The (shape, dtype) of each ``alloc`` run_backward makes with this plan, in order."""
    out = []
    if plan.column_blocks:
        return out
    if plan.split is not None:
        out += [((plan.m, plan.split[2], 2), plan.acc), ((plan.m, 2), plan.acc)]
    if dw or db:
        out.append(((int(dw) + int(db), plan.groups, plan.n), plan.acc))
    if plan.grid_rows is not None:
        out.append(_grid_rows.scratch(plan.grid_rows))
    return out


def backward(dy: View, x: View, weight: View | None, mean: View | None, rstd: View, dx: int, dw: int, db: int,
             grad_dtype, nd: int, rms: bool, alloc, stream: int, device: int) -> None:
    """Writes dx (contiguous, x's shape and dtype) and, where their pointers are non-null,
    dweight and dbias (contiguous, ``grad_dtype``). ``x`` and ``dy`` must satisfy ``rows_of``
    and have an element; mean and rstd are contiguous."""
    make_current(device)
    wp = _p(weight)
    wdt = x.dtype if weight is None else weight.dtype
    plan = backward_plan(x.shape, x.strides, dy.strides, x.dtype, wdt, grad_dtype, nd, rms, device,
                         (x.ptr | dy.ptr | dx) & 15, wp & 15)
    if plan is None:
        raise ValueError("x, dy: rows not addressable in place or empty (the frontend must copy them first)")
    run_backward(plan, dy.ptr, x.ptr, wp, _p(mean), rstd.ptr, dx, dw, db, alloc, stream)
