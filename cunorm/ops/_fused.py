"""Launch plans of the fused forward and backward (kernels/layer_norm_fused.cu): residual
add (its gradient dh added, the residual's gradient written), weight offset, another output
dtype (FP8 with a scale and amax). Framework-neutral like _row_norm:
pointers and element strides in, None where the fused kernel does not serve the call (rows
longer than one register tile, a pack width of one, a dtype combination not compiled) — the
frontend then composes the call from the plain kernels.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy

from .. import _config
from .._compile import c_type, function_ptr, held_with_modules
from .._launch import blocks_per_sm, fits_smem, launch, pick_vec, row_layout, scalar_bits, sm_count
from ._row_norm import KERNEL_FILE, TYPE_PAIRS, _b, _itemsize, partial_rows, reduce_partial_rows, stage_bytes

FUSED_FILE = "layer_norm_fused.cu"
FP8_TYPES = {"float8_e4m3fn": "__nv_fp8_e4m3", "float8_e5m2": "__nv_fp8_e5m2"}

# What the kernels compile for each x dtype: (residual, h) dtype pairs — the residual stream
# in x's dtype, x's dtype summed into float32 (the first pre-norm block), or float32 — and
# output dtypes: x's, float32, the FP8 pair, and for float32 x the half types.
_RESIDUAL_PAIRS = {"float16": (("float16", "float16"), ("float16", "float32"), ("float32", "float32")),
                   "bfloat16": (("bfloat16", "bfloat16"), ("bfloat16", "float32"), ("float32", "float32")),
                   "float32": (("float32", "float32"),)}
_OUT_TYPES = {"float16": ("float16", "float32", *FP8_TYPES), "bfloat16": ("bfloat16", "float32", *FP8_TYPES),
              "float32": ("float32", "bfloat16", "float16", *FP8_TYPES)}


def _c(name: str) -> str:
    return FP8_TYPES.get(name) or c_type(name)


def _name(t, r, h, o, w, cfg: _config.TileConfig, rms: bool) -> str:
    return (f"norm_fwd_fused<{_c(t)}, {_c(r)}, {_c(h)}, {_c(o)}, {_c(w)}, {cfg.vec}, {cfg.packs}, {cfg.tpr}, "
            f"{_b(rms)}>")


def fused_instantiations() -> list[str]:
    """Every name expression fused_forward_plan can launch (CI compiles them all)."""
    names = []
    for t, w in TYPE_PAIRS:
        if t not in _RESIDUAL_PAIRS:
            continue
        vec = _config.max_vec(_itemsize(t))
        for r, h in _RESIDUAL_PAIRS[t]:
            for o in _OUT_TYPES[t]:
                for cfg in _config.all_tile_configs(vec, _config.FWD):
                    names += [_name(t, r, h, o, w, cfg, rms) for rms in (False, True)]
    return names + [_cast_name(o) for o in FP8_TYPES] + fused_backward_instantiations()


def _cast_name(out_name: str) -> str:
    return f"cast_scaled<{_c(out_name)}>"


# The backward's dtypes for each dy dtype: (h, dx) pairs — h (with dh and the residual's
# gradient) in dy's dtype or float32, dx in dy's or h's.
_BWD_TYPES = {"float16": (("float16", "float16"), ("float32", "float16"), ("float32", "float32")),
              "bfloat16": (("bfloat16", "bfloat16"), ("float32", "bfloat16"), ("float32", "float32")),
              "float32": (("float32", "float32"),)}


def _bwd_name(t, h, x, w, cfg: _config.TileConfig, rms: bool) -> str:
    return (f"norm_bwd_fused<{_c(t)}, {_c(h)}, {_c(x)}, {_c(w)}, {cfg.vec}, {cfg.packs}, {cfg.tpr}, "
            f"{_b(rms)}>")


def _bwd_configs(vec: int, itemsize: int, rms: bool) -> list:
    return _config.all_tile_configs(vec, lambda n, v: _config.bwd_row_config(n, v, itemsize, rms))


def fused_backward_instantiations() -> list[str]:
    """Every name expression fused_backward_plan can launch."""
    names = []
    for t, w in TYPE_PAIRS:
        if t not in _BWD_TYPES:
            continue
        itemsize = _itemsize(t)
        for rms in (False, True):
            for cfg in _bwd_configs(_config.max_vec(itemsize), itemsize, rms):
                names += [_bwd_name(t, h, x, w, cfg, rms) for h, x in _BWD_TYPES[t]]
    return names


def serves(dtype, residual_dtype, h_dtype, out_dtype, wdtype) -> bool:
    """Whether this dtype combination is compiled (the residual and h dtypes: x's when there
    is no residual)."""
    t = numpy.dtype(dtype).name
    return ((t, numpy.dtype(wdtype).name) in TYPE_PAIRS and t in _RESIDUAL_PAIRS
            and (numpy.dtype(residual_dtype).name, numpy.dtype(h_dtype).name) in _RESIDUAL_PAIRS[t]
            and numpy.dtype(out_dtype).name in _OUT_TYPES[t])


class FusedPlan(NamedTuple):
    kernel: int
    grid: int
    block: int
    x_args: tuple
    r_args: tuple
    m: int
    n: int


@held_with_modules
@functools.lru_cache(maxsize=4096)
def fused_forward_plan(shape: tuple, x_strides: tuple, r_strides: tuple | None, dtype, rdtype, hdtype, odtype, wdtype,
                       nd: int, rms: bool, device: int, pointers: tuple) -> FusedPlan | None:
    """The plan of a fused forward over x (and the residual, when ``r_strides`` is given) of
    this layout; ``pointers`` = ((address mod 16, itemsize), ...) of every array the kernel
    reads or writes. None where the fused kernel does not serve it (see the module doc)."""
    names = [numpy.dtype(d).name for d in (dtype, rdtype, hdtype, odtype, wdtype)]
    if not serves(*names):
        return None
    xr = row_layout(tuple(shape), tuple(x_strides), nd)
    rr = xr if r_strides is None else row_layout(tuple(shape), tuple(r_strides), nd)
    if xr is None or rr is None or xr.rows == 0 or xr.n == 0:
        return None
    m, n = xr.rows, xr.n
    vec = pick_vec(numpy.dtype(dtype).itemsize, n, list(pointers), (*xr.strides, *rr.strides))
    cfg = _config.row_config(n, vec, _config.FWD) if vec > 1 else None
    if cfg is None:
        return None
    kernel = function_ptr(FUSED_FILE, _name(*names[:4], names[4], cfg, rms), device)
    grid = min(-(-m // cfg.rows_per_block), _config.MAX_GRID)
    if names[3] in FP8_TYPES:  # blocks walk several rows (see _config.FP8_FWD_GRID_WAVES)
        grid = min(grid, _config.FP8_FWD_GRID_WAVES * sm_count(device) * blocks_per_sm(kernel, cfg.block))
    return FusedPlan(kernel, grid, cfg.block, xr.args(), rr.args(), m, n)


def run_fused_forward(plan: FusedPlan, x: int, residual: int, h: int, y: int, weight: int, bias: int, mean: int,
                      rstd: int, amax: int, eps: float, weight_offset: float, out_scale: float, stream: int) -> None:
    """Launches a fused forward; residual, h, mean, rstd and amax may be 0 (null). amax, when
    given, must hold 0 (a uint32 holding float bits) before the launch."""
    launch(plan.kernel, plan.grid, plan.block,
           (x, *plan.x_args, residual, *plan.r_args, h, y, weight, bias, mean, rstd, amax, plan.m, plan.n,
            scalar_bits(eps, numpy.float32), scalar_bits(weight_offset, numpy.float32),
            scalar_bits(out_scale, numpy.float32)), stream)


CAST_BLOCK = 256  # a grid-stride copy: any full block keeps the loads in flight


def run_cast_fp8(src: int, dst: int, n: int, out_dtype, out_scale: float, device: int, stream: int) -> None:
    """dst[i] = saturating FP8 cast of src[i] * out_scale over n contiguous float32 values
    (the composed path's FP8 output)."""
    if n == 0:
        return
    kernel = function_ptr(FUSED_FILE, _cast_name(numpy.dtype(out_dtype).name), device)
    grid = min(-(-n // CAST_BLOCK), _config.MAX_GRID)
    launch(kernel, grid, CAST_BLOCK, (src, dst, n, scalar_bits(out_scale, numpy.float32)), stream)


class FusedBackwardPlan(NamedTuple):
    kernel: int
    blocks: int
    block: int
    groups: int  # rows of dW/dB partials
    reduce: int  # norm_reduce_partials into the gradient dtype
    dy_args: tuple
    h_args: tuple
    m: int
    n: int
    smem: int  # dynamic shared memory (rows staged, _row_norm.stage_bytes)


@held_with_modules
@functools.lru_cache(maxsize=4096)
def fused_backward_plan(shape: tuple, h_strides: tuple, dy_strides: tuple, dydtype, hdtype, dxdtype, wdtype,
                        grad_dtype, nd: int, rms: bool, device: int, pointers: tuple) -> FusedBackwardPlan | None:
    """The plan of a fused backward (dy and h of this layout, dh, dx and the residual's
    gradient contiguous); ``pointers`` as fused_forward_plan's. None where the kernel does not
    serve it: rows past one register tile, packs under 16 bytes, dtypes not compiled, or a
    block whose staged rows do not fit the device's shared memory (float32 h at rows of
    4097-8192 elements on GPUs of 99 KiB a block: 144 KiB of ring)."""
    t, h, x, w = (numpy.dtype(d).name for d in (dydtype, hdtype, dxdtype, wdtype))
    if (h, x) not in _BWD_TYPES.get(t, ()) or (t, w) not in TYPE_PAIRS:
        return None
    hr, dyr = row_layout(tuple(shape), tuple(h_strides), nd), row_layout(tuple(shape), tuple(dy_strides), nd)
    if hr is None or dyr is None or hr.rows == 0 or hr.n == 0:
        return None
    m, n = hr.rows, hr.n
    itemsize = numpy.dtype(dydtype).itemsize
    vec = pick_vec(itemsize, n, list(pointers), (*hr.strides, *dyr.strides))
    if vec != _config.max_vec(itemsize):  # compiled for 16-byte packs only
        return None
    cfg = _config.bwd_row_config(n, vec, itemsize, rms)
    if cfg is None:
        return None
    kernel = function_ptr(FUSED_FILE, _bwd_name(t, h, x, w, cfg, rms), device)
    reduce = function_ptr(KERNEL_FILE, f"norm_reduce_partials<float, {c_type(numpy.dtype(grad_dtype).name)}>", device)
    smem = stage_bytes(cfg, itemsize, numpy.dtype(hdtype).itemsize, rms)
    if not fits_smem(kernel, smem, device):
        return None
    blocks = min(-(-m // cfg.rows_per_block), sm_count(device) * blocks_per_sm(kernel, cfg.block, smem))
    return FusedBackwardPlan(kernel, blocks, cfg.block, blocks * cfg.rows_per_block, reduce, dyr.args(), hr.args(),
                             m, n, smem)


def run_fused_backward(plan: FusedBackwardPlan, dy: int, h: int, dh: int, weight: int, mean: int, rstd: int,
                       dx: int, dres: int, dw: int, db: int, weight_offset: float, alloc, stream: int) -> None:
    """Launches a fused backward and, for dweight / dbias (pointers, 0: not wanted), the
    partial reduction; dh, weight, mean (RMSNorm) and dres may be 0. ``alloc(shape, dtype)
    -> pointer`` gives the partials' scratch."""
    groups, n = plan.groups, plan.n
    dw_part, db_part = partial_rows(dw, db, groups, n, numpy.dtype(numpy.float32), alloc)
    launch(plan.kernel, plan.blocks, plan.block,
           (dy, *plan.dy_args, h, *plan.h_args, dh, weight, mean, rstd, dx, dres, dw_part, db_part, plan.m, n,
            scalar_bits(weight_offset, numpy.float32)), stream, plan.smem)
    reduce_partial_rows(plan.reduce, dw_part, dw, db_part, db, groups, n, stream)
