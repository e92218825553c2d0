"""Host side of kernels/layer_norm.cu, shared by LayerNorm and RMSNorm (``rms`` flag).

Framework-neutral: arrays arrive as ``_launch.View``s the frontend prepared (rows addressable
in place, see ``_launch.rows_of``; parameters contiguous, in the dtype ``param_dtype`` names),
outputs as pointers to memory the frontend allocated, scratch through ``alloc(shape, dtype)
-> pointer``, and the frontend's stream. Picks the path by row length:
  full row : the whole row in one register tile (``_config.row_config``), one launch
             forward; backward one launch plus the dW/dB partial reduction.
  split    : longer rows, cut into tiles of one block each; forward = tile statistics,
             finalize, apply; backward = tile sums, finalize, apply, partial reduction.
"""
from __future__ import annotations

import functools
import math

import numpy

from .. import _config
from .._checks import acc_dtype
from .._compile import c_type, function_ptr
from .._launch import View, blocks_per_sm, launch, make_current, pick_vec, rows_of, scalar_bits, sm_count

KERNEL_FILE = "layer_norm.cu"
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


def _acc_name(t: str) -> str:
    return "double" if t == "float64" else "float"


def instantiations() -> list[str]:
    """Every name expression the dispatcher below can launch (CI compiles them all)."""
    names: list[str] = []
    for t, w in TYPE_PAIRS:
        itemsize = numpy.dtype(_np_name(t)).itemsize
        for vec in _config.vec_choices(itemsize):
            split = _config.split_config(vec)
            for rms in (False, True):
                names += [_tile_name("norm_fwd", t, w, c, rms, FULL_ROW)
                          for c in _config.all_tile_configs(vec, _config.FWD)]
                names += [_tile_name("norm_bwd", t, w, c, rms, FULL_ROW)
                          for c in _config.all_tile_configs(vec, _config.BWD)]
                names += [_tile_name("norm_fwd", t, w, split, rms, CHUNK_STATS),
                          _tile_name("norm_fwd", t, w, split, rms, CHUNK_APPLY),
                          _tile_name("norm_bwd_tile_sums", t, w, split, rms),
                          _tile_name("norm_bwd", t, w, split, rms, CHUNK_APPLY)]
    for acc in ("float32", "float64"):
        a = c_type(acc)
        for rms in (False, True):
            names.append(f"norm_fwd_finalize<{a}, {_b(rms)}>")
        names.append(f"norm_bwd_finalize<{a}>")
        names += [f"norm_reduce_partials<{a}, {c_type(_np_name(g))}>" for g in GRAD_TYPES]
    return names


def _np_name(name: str):
    from .._checks import BFLOAT16

    return BFLOAT16 if name == "bfloat16" else numpy.dtype(name)


def param_dtype(x_dtype, weight_dtype, bias_dtype):
    """The parameter dtype the kernels read: the parameters' own when they agree and the pair
    with x is compiled, else float32 (the frontend casts them first; N elements)."""
    dtypes = {d for d in (weight_dtype, bias_dtype) if d is not None}
    if not dtypes:
        return numpy.dtype(x_dtype)
    if len(dtypes) == 1:
        (d,) = dtypes
        if (numpy.dtype(x_dtype).name, numpy.dtype(d).name) in TYPE_PAIRS:
            return numpy.dtype(d)
    return numpy.dtype(numpy.float32)


def _p(v) -> int:
    return 0 if v is None else v.ptr


@functools.lru_cache(maxsize=4096)
def _forward_plan(t: str, wn: str, n: int, vec: int, rms: bool, device: int):
    """(config, kernel pointers) of a forward: the per-shape work done once."""
    cfg = _config.row_config(n, vec, _config.FWD)
    if cfg is not None:
        return cfg, (function_ptr(KERNEL_FILE, _tile_name("norm_fwd", t, wn, cfg, rms, FULL_ROW), device),)
    cfg = _config.split_config(vec)
    return cfg, (function_ptr(KERNEL_FILE, _tile_name("norm_fwd", t, wn, cfg, rms, CHUNK_STATS), device),
                 function_ptr(KERNEL_FILE, f"norm_fwd_finalize<{_acc_name(t)}, {_b(rms)}>", device),
                 function_ptr(KERNEL_FILE, _tile_name("norm_fwd", t, wn, cfg, rms, CHUNK_APPLY), device))


# Launches of the full-row paths by call signature (layout, dtypes, options, alignment class):
# a repeated call only fills in its pointers. Small batches spend more time here than on
# the GPU, so this is what keeps the host from being the bottleneck (benchmarks/NOTES.md).
_calls: dict = {}
_MAX_CALLS = 4096


def _remember(key, plan) -> None:
    if len(_calls) >= _MAX_CALLS:
        _calls.clear()
    _calls[key] = plan


def forward(x: View, weight: View | None, bias: View | None, y: int, mean: int, rstd: int, eps: float,
            nd: int, rms: bool, alloc, stream: int, device: int) -> None:
    """Writes y (contiguous, x's shape and dtype) and, where their pointers are non-null,
    mean (LayerNorm) and rstd (one per row, fp32/fp64). ``x`` must satisfy ``rows_of``."""
    make_current(device)
    wp, bp = _p(weight), _p(bias)
    # Pointer alignment enters only through the pack width (a power of two up to 16 bytes),
    # so pointers mod 16 (ORed per element size) is all of it the key needs.
    key = (x.shape, x.strides, x.dtype, None if weight is None else weight.dtype,
           None if bias is None else bias.dtype, nd, rms, eps, device, (x.ptr | y) & 15, (wp | bp) & 15)
    plan = _calls.get(key)
    if plan is not None:
        kernel, grid, block, row_args, tail = plan
        launch(kernel, grid, block, (x.ptr, *row_args, y, wp, bp, 0 if rms else mean, rstd, 0, 0, *tail), stream)
        return
    rows = rows_of(x, nd)
    m, n = rows.rows, rows.n
    if m == 0:
        return
    acc = acc_dtype(x.dtype)
    wdt = next((p.dtype for p in (weight, bias) if p is not None), x.dtype)
    vec = pick_vec(x.itemsize, n, [(x.ptr, x.itemsize), (y, x.itemsize), (_p(weight), wdt.itemsize),
                                   (_p(bias), wdt.itemsize)], rows.strides)
    t = x.dtype.name
    cfg, kernels = _forward_plan(t, wdt.name, n, vec, rms, device)
    eps_bits = scalar_bits(eps, acc)
    head = (x.ptr, *rows.args(), y, _p(weight), _p(bias), 0 if rms else mean, rstd)
    if len(kernels) == 1:
        grid = min(-(-m // cfg.rows_per_block), _config.MAX_GRID)
        tail = (m, n, 1, eps_bits)
        _remember(key, (kernels[0], grid, cfg.block, rows.args(), tail))
        launch(kernels[0], grid, cfg.block, (*head, 0, 0, *tail), stream)
        return
    tiles = -(-n // cfg.tile)
    tile_stats = alloc((m, tiles, 2), acc)
    row_shift = 0 if rms else alloc((m, 2), acc)
    if rstd == 0:  # the split path passes the statistics between its kernels
        rstd = alloc((m,), acc)
        mean = 0 if rms else alloc((m,), acc)
        head = (*head[:-2], mean, rstd)
    grid = min(m * tiles, _config.MAX_GRID)
    launch(kernels[0], grid, cfg.block, (*head, tile_stats, row_shift, m, n, tiles, eps_bits), stream)
    launch(kernels[1], min(-(-m // 4), _config.MAX_GRID), 128,
           (tile_stats, row_shift, 0 if rms else mean, rstd, m, n, tiles, cfg.tile, eps_bits), stream)
    launch(kernels[2], grid, cfg.block, (*head, tile_stats, row_shift, m, n, tiles, eps_bits), stream)


@functools.lru_cache(maxsize=4096)
def _backward_plan(t: str, wn: str, gn: str, n: int, vec: int, rms: bool, device: int):
    cfg = _config.row_config(n, vec, _config.BWD)
    reduce = function_ptr(KERNEL_FILE, f"norm_reduce_partials<{_acc_name(t)}, {c_type(gn)}>", device)
    if cfg is not None:
        main = function_ptr(KERNEL_FILE, _tile_name("norm_bwd", t, wn, cfg, rms, FULL_ROW), device)
        return cfg, main, None, None, reduce, sm_count(device) * blocks_per_sm(main, cfg.block)
    cfg = _config.split_config(vec)
    main = function_ptr(KERNEL_FILE, _tile_name("norm_bwd", t, wn, cfg, rms, CHUNK_APPLY), device)
    sums = function_ptr(KERNEL_FILE, _tile_name("norm_bwd_tile_sums", t, wn, cfg, rms), device)
    finalize = function_ptr(KERNEL_FILE, f"norm_bwd_finalize<{_acc_name(t)}>", device)
    return cfg, main, sums, finalize, reduce, sm_count(device) * blocks_per_sm(main, cfg.block)


def backward(dy: View, x: View, weight: View | None, mean: View | None, rstd: View, dx: int, dw: int, db: int,
             grad_dtype, nd: int, rms: bool, alloc, stream: int, device: int) -> None:
    """Writes dx (contiguous, x's shape and dtype) and, where their pointers are non-null,
    dweight and dbias (contiguous, ``grad_dtype``). Deterministic: fixed reduction trees, no
    atomics. ``x`` and ``dy`` must satisfy ``rows_of``; mean and rstd are contiguous."""
    make_current(device)
    wp = _p(weight)
    key = (x.shape, x.strides, dy.strides, x.dtype, None if weight is None else weight.dtype, grad_dtype, nd, rms,
           device, (x.ptr | dy.ptr | dx) & 15, wp & 15)
    plan = _calls.get(key)
    if plan is None:
        plan = _backward_call(dy, x, weight, dx, grad_dtype, nd, rms, device)
        if plan[-1] is None:  # full-row path: a plan without per-call scratch but the partials
            _remember(key, plan)
    main, blocks, block, groups, reduce, dy_args, x_args, m, n, split = plan
    stats = (wp, _p(mean), rstd.ptr)
    acc = acc_dtype(x.dtype)
    row_sums, tiles = 0, 1
    if split is not None:
        sums, finalize, tiles, sums_block = split
        tile_sums = alloc((m, tiles, 2), acc)
        launch(sums, min(m * tiles, _config.MAX_GRID), sums_block,
               (dy.ptr, *dy_args, x.ptr, *x_args, *stats, tile_sums, m, n, tiles), stream)
        row_sums = alloc((m, 2), acc)
        launch(finalize, min(-(-m // 4), _config.MAX_GRID), 128, (tile_sums, row_sums, m, tiles), stream)
    dw_part = alloc((groups, n), acc) if dw else 0
    db_part = alloc((groups, n), acc) if db else 0
    launch(main, blocks * tiles, block,
           (dy.ptr, *dy_args, x.ptr, *x_args, *stats, row_sums, dx, dw_part, db_part, m, n, tiles), stream)
    if dw or db:
        launch(reduce, (-(-n // 32), 2), (32, 32), (dw_part, dw, db_part, db, groups, n), stream)


def _backward_call(dy, x, weight, dx, grad_dtype, nd, rms, device):
    """The launch plan of one backward: kernels, grid, partial rows; ``split`` (tile-sum and
    finalize kernels, tile count, block) on the split path, else None."""
    xr, dyr = rows_of(x, nd), rows_of(dy, nd)
    m, n = xr.rows, xr.n
    wdt = x.dtype if weight is None else weight.dtype
    vec = pick_vec(x.itemsize, n, [(x.ptr, x.itemsize), (dy.ptr, x.itemsize), (dx, x.itemsize),
                                   (_p(weight), wdt.itemsize)], (*xr.strides, *dyr.strides))
    cfg, main, sums, finalize, reduce, resident = _backward_plan(x.dtype.name, wdt.name, numpy.dtype(grad_dtype).name,
                                                                 n, vec, rms, device)
    if sums is None:
        blocks = min(-(-m // cfg.rows_per_block), resident)
        return main, blocks, cfg.block, blocks * cfg.rows_per_block, reduce, dyr.args(), xr.args(), m, n, None
    tiles = -(-n // cfg.tile)
    blocks = max(1, min(m, -(-resident // tiles)))
    return main, blocks, cfg.block, blocks, reduce, dyr.args(), xr.args(), m, n, (sums, finalize, tiles, cfg.block)
