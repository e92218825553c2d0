"""Host side of kernels/layer_norm.cu, shared by LayerNorm and RMSNorm (``rms`` flag).

CuPy arrays in (already validated), CuPy arrays out. Picks the path by row length:
  full row : the whole row in one register tile (``_config.row_config``), one launch
             forward; backward one launch plus the dW/dB partial reduction.
  split    : longer rows, cut into tiles of one block each; forward = tile statistics,
             finalize, apply; backward = tile sums, finalize, apply, partial reduction.
"""
from __future__ import annotations

import math

import numpy

from .. import _config
from .._checks import acc_dtype
from .._compile import c_type, get_function
from .._launch import blocks_per_sm, contiguous, empty, launch, pick_vec, ptr, rows_of, sm_count

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
                          for c in _config.all_tile_configs(vec, _config.FWD_MAX_TPR)]
                names += [_tile_name("norm_bwd", t, w, c, rms, FULL_ROW)
                          for c in _config.all_tile_configs(vec, _config.BWD_MAX_TPR)]
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


def _param_dtype(x, weight, bias, alloc):
    """The parameter storage dtype the kernels read, and weight/bias in it."""
    params = [p for p in (weight, bias) if p is not None]
    if not params:
        return x.dtype, weight, bias
    dtypes = {p.dtype for p in params}
    if len(dtypes) == 1 and (x.dtype.name, params[0].dtype.name) in TYPE_PAIRS:
        wdt = params[0].dtype
    else:
        wdt = numpy.dtype(numpy.float32)
    cast = [None if p is None else contiguous(p, alloc, wdt) for p in (weight, bias)]
    return wdt, cast[0], cast[1]


def forward(x, weight, bias, eps: float, nd: int, rms: bool, *, out=None, alloc=empty):
    """y (x's dtype, contiguous), mean (None for rms) and rstd (leading shape, fp32/fp64).

    ``out``: (y, mean, rstd) to write instead of allocating them (C-contiguous, those shapes
    and dtypes); ``alloc(shape, dtype)`` provides every other buffer."""
    with x.device:  # allocations, compiled modules and launches all on x's device
        return _forward(x, weight, bias, eps, nd, rms, out, alloc)


def _forward(x, weight, bias, eps, nd, rms, out, alloc):
    lead = x.shape[: x.ndim - nd]
    acc = acc_dtype(x.dtype)
    if out is None:
        out = (alloc(x.shape, x.dtype), None if rms else alloc(lead, acc), alloc(lead, acc))
    y, mean, rstd = out
    n = math.prod(x.shape[x.ndim - nd:])
    m = math.prod(lead)
    if m == 0:
        return y, mean, rstd
    if n == 0:  # statistics of an empty row are undefined
        rstd.fill(numpy.nan)
        if mean is not None:
            mean.fill(numpy.nan)
        return y, mean, rstd

    rows = rows_of(x, nd, alloc)
    wdt, w, b = _param_dtype(x, weight, bias, alloc)
    vec = pick_vec(x.itemsize, n, [(rows.array, x.itemsize), (y, x.itemsize), (w, wdt.itemsize),
                                   (b, wdt.itemsize)], list(rows.strides))
    t, wn = x.dtype.name, wdt.name
    eps_arg = acc.type(eps)
    cfg = _config.row_config(n, vec, _config.FWD_MAX_TPR)
    if cfg is not None:
        grid = min(-(-m // cfg.rows_per_block), _config.MAX_GRID)
        launch(get_function(KERNEL_FILE, _tile_name("norm_fwd", t, wn, cfg, rms, FULL_ROW)), grid, cfg.block,
               (*rows.args(), y, ptr(w), ptr(b), ptr(mean), rstd, ptr(None), ptr(None),
                numpy.int64(m), numpy.int64(n), numpy.int64(1), eps_arg))
        return y, mean, rstd

    cfg = _config.split_config(vec)
    tiles = -(-n // cfg.tile)
    tile_stats = alloc((m, tiles, 2), acc)
    row_shift = None if rms else alloc((m, 2), acc)
    grid = min(m * tiles, _config.MAX_GRID)
    common = (numpy.int64(m), numpy.int64(n), numpy.int64(tiles), eps_arg)
    launch(get_function(KERNEL_FILE, _tile_name("norm_fwd", t, wn, cfg, rms, CHUNK_STATS)), grid, cfg.block,
           (*rows.args(), y, ptr(w), ptr(b), ptr(mean), rstd, tile_stats, ptr(row_shift), *common))
    launch(get_function(KERNEL_FILE, f"norm_fwd_finalize<{_acc_name(t)}, {_b(rms)}>"),
           min(-(-m // 4), _config.MAX_GRID), 128,
           (tile_stats, ptr(row_shift), ptr(mean), rstd, numpy.int64(m), numpy.int64(n), numpy.int64(tiles),
            numpy.int64(cfg.tile), eps_arg))
    launch(get_function(KERNEL_FILE, _tile_name("norm_fwd", t, wn, cfg, rms, CHUNK_APPLY)), grid, cfg.block,
           (*rows.args(), y, ptr(w), ptr(b), ptr(mean), rstd, tile_stats, ptr(row_shift), *common))
    return y, mean, rstd


def backward(dy, x, weight, mean, rstd, nd: int, rms: bool, need_dw: bool, need_db: bool, grad_dtype,
             *, out=None, alloc=empty):
    """dx (x's dtype, contiguous), dweight and dbias (shape x.shape[-nd:], ``grad_dtype``; None
    where not needed). Deterministic: fixed reduction trees, no atomics. ``out`` and ``alloc``
    as in :func:`forward`, ``out`` = (dx, dweight or None, dbias or None)."""
    with x.device:
        return _backward(dy, x, weight, mean, rstd, nd, rms, need_dw, need_db, grad_dtype, out, alloc)


def _backward(dy, x, weight, mean, rstd, nd, rms, need_dw, need_db, grad_dtype, out, alloc):
    acc = acc_dtype(x.dtype)
    norm_shape = x.shape[x.ndim - nd:]
    n = math.prod(norm_shape)
    m = math.prod(x.shape[: x.ndim - nd])
    if out is None:
        out = (alloc(x.shape, x.dtype), alloc(norm_shape, grad_dtype) if need_dw else None,
               alloc(norm_shape, grad_dtype) if need_db else None)
    dx, dw, db = out
    if m == 0 or n == 0:  # a sum over no rows is zero
        for g in (dw, db):
            if g is not None:
                g.fill(0)
        return dx, dw, db

    xr, dyr = rows_of(x, nd, alloc), rows_of(dy, nd, alloc)
    wdt, w, _ = _param_dtype(x, weight, None, alloc)
    mean = None if rms else contiguous(mean, alloc)
    rstd = contiguous(rstd, alloc)
    vec = pick_vec(x.itemsize, n, [(xr.array, x.itemsize), (dyr.array, x.itemsize), (dx, x.itemsize),
                                   (w, wdt.itemsize)], [*xr.strides, *dyr.strides])
    t, wn = x.dtype.name, wdt.name
    sms = sm_count(x.device.id)
    dims = (numpy.int64(m), numpy.int64(n))
    cfg = _config.row_config(n, vec, _config.BWD_MAX_TPR)
    if cfg is not None:
        kernel = get_function(KERNEL_FILE, _tile_name("norm_bwd", t, wn, cfg, rms, FULL_ROW))
        resident = sms * blocks_per_sm(kernel, cfg.block)
        blocks = min(-(-m // cfg.rows_per_block), resident)
        groups, tiles, row_sums = blocks * cfg.rows_per_block, 1, None
    else:
        cfg = _config.split_config(vec)
        tiles = -(-n // cfg.tile)
        tile_sums = alloc((m, tiles, 2), acc)
        launch(get_function(KERNEL_FILE, _tile_name("norm_bwd_tile_sums", t, wn, cfg, rms)),
               min(m * tiles, _config.MAX_GRID), cfg.block,
               (*dyr.args(), *xr.args(), ptr(w), ptr(mean), rstd, tile_sums, *dims, numpy.int64(tiles)))
        row_sums = alloc((m, 2), acc)
        launch(get_function(KERNEL_FILE, f"norm_bwd_finalize<{_acc_name(t)}>"), min(-(-m // 4), _config.MAX_GRID),
               128, (tile_sums, row_sums, numpy.int64(m), numpy.int64(tiles)))
        kernel = get_function(KERNEL_FILE, _tile_name("norm_bwd", t, wn, cfg, rms, CHUNK_APPLY))
        resident = sms * blocks_per_sm(kernel, cfg.block)
        blocks = max(1, min(m, -(-resident // tiles)))
        groups = blocks
    dw_part = alloc((groups, n), acc) if need_dw else None
    db_part = alloc((groups, n), acc) if need_db else None
    launch(kernel, blocks * tiles, cfg.block,
           (*dyr.args(), *xr.args(), ptr(w), ptr(mean), rstd, ptr(row_sums), dx, ptr(dw_part), ptr(db_part),
            *dims, numpy.int64(tiles)))
    if need_dw or need_db:
        reduce = get_function(KERNEL_FILE, f"norm_reduce_partials<{_acc_name(t)}, {c_type(grad_dtype)}>")
        launch(reduce, (-(-n // 32), 2), (32, 32),
               (ptr(dw_part), ptr(dw), ptr(db_part), ptr(db), numpy.int64(groups), numpy.int64(n)))
    return dx, dw, db
