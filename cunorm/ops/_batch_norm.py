"""Host side of kernels/batch_norm.cu: the (outer, channel, inner) layout of x, pack width,
chunking, and the three launches each way (partial sums, per-channel finalize, apply).

Framework-neutral like _row_norm: pointers in, the frontend's stream, scratch through
``alloc(shape, dtype) -> pointer``.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy

from .._checks import acc_dtype
from .._compile import c_type, function_ptr
from .._launch import launch, make_current, pick_vec, sm_count

KERNEL_FILE = "batch_norm.cu"
BLOCK = 256  # = kBnBlock
ROWS = BLOCK // 32  # = kBnRows
MAX_GRID_Y = 65535
# Blocks a pass aims for: enough to fill the GPU several times over (first choice; the
# persistent one-read version of issue 5's targets replaces this).
BLOCKS_PER_SM = 8
DTYPES = ("float16", "bfloat16", "float32", "float64")


def _param_types(t: str) -> tuple:
    """Parameter / running-statistics dtypes compiled with x dtype ``t``: its own and float32."""
    return (t,) if t in ("float32",) else (t, "float32")


def instantiations() -> list[str]:
    """Every name expression the host below can launch (CI compiles them all)."""
    names = []
    for t in DTYPES:
        ct = c_type(t)
        acc = "double" if t == "float64" else "float"
        for vec in _vec_choices(t):
            names += [f"bn_stats_nc<{ct}, {vec}>", f"bn_stats_cl<{ct}, {vec}>"]
            for w in _param_types(t):
                cw = c_type(w)
                names += [f"{k}<{ct}, {cw}, {vec}>" for k in ("bn_apply_nc", "bn_apply_cl", "bn_bwd_sums_nc",
                                                            "bn_bwd_sums_cl", "bn_bwd_apply_nc", "bn_bwd_apply_cl")]
        for w in _param_types(t):
            cw = c_type(w)
            names += [f"bn_finalize<{ct}, {cw}>", f"bn_running_stats<{acc}, {cw}>", f"bn_bwd_finalize<{acc}, {cw}>"]
    return names


def _vec_choices(t: str) -> tuple:
    from .._config import vec_choices

    return vec_choices(numpy.dtype(_np(t)).itemsize)


def _np(name: str):
    from .._checks import BFLOAT16

    return BFLOAT16 if name == "bfloat16" else numpy.dtype(name)


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


class Plan(NamedTuple):
    lay: Layout
    vec: int
    chunks: int
    per_chunk: int
    grid_y: int  # channels (nc, launched in slices of MAX_GRID_Y) or channel tiles (cl)
    t: str
    w: str
    acc: numpy.dtype


@functools.lru_cache(maxsize=1024)
def plan(lay: Layout, dtype, wdtype, align: int, device: int) -> Plan:
    """Pack width (``align`` = all data pointers ORed, mod 16), chunking and grid."""
    dtype = numpy.dtype(dtype)
    itemsize = dtype.itemsize
    sms = sm_count(device)
    if lay.channels_last:
        vec = pick_vec(itemsize, lay.C, [(align, itemsize)], (lay.so,))
        grid_y = -(-lay.C // (32 * vec))
        chunks = max(1, min(-(-BLOCKS_PER_SM * sms // grid_y), -(-lay.O // (ROWS * 4))))
        per_chunk = -(-lay.O // chunks)
    else:
        vec = pick_vec(itemsize, lay.I, [(align, itemsize)], (lay.so, lay.sc))
        per_channel = lay.O * lay.I
        grid_y = lay.C
        chunks = max(1, min(-(-BLOCKS_PER_SM * sms // lay.C), -(-per_channel // (BLOCK * vec * 4))))
        per_chunk = -(-per_channel // chunks // vec) * vec
        chunks = -(-per_channel // per_chunk)
    if grid_y > MAX_GRID_Y and lay.channels_last:
        raise ValueError(f"x: {lay.C} channels is more than the channels-last kernels address")
    return Plan(lay, vec, chunks, per_chunk, grid_y, dtype.name, numpy.dtype(wdtype).name, acc_dtype(dtype))


def _kernel(name: str, p: Plan, device: int, with_w: bool = True) -> int:
    args = [c_type(p.t)] + ([c_type(p.w)] if with_w else []) + [str(p.vec)]
    return function_ptr(KERNEL_FILE, f"{name}<{', '.join(args)}>", device)


def _slices(p: Plan):
    """(first channel, channel count) of each launch: grid.y holds at most MAX_GRID_Y."""
    if p.lay.channels_last:
        yield 0, p.lay.C
        return
    for c0 in range(0, p.lay.C, MAX_GRID_Y):
        yield c0, min(MAX_GRID_Y, p.lay.C - c0)


def inner_divider(d: int, count: int) -> tuple:
    """(imul, ishift) with e // d == (umulhi(e, imul) + e) >> ishift for every 0 <= e < 2**32
    (round-up reciprocal), or (0, 0) when a channel's ``count`` elements reach 2**32 and the
    kernels divide in 64 bits."""
    if count >= 1 << 32 or d >= 1 << 31:
        return 0, 0
    shift = (d - 1).bit_length()
    mul = ((1 << 32) * ((1 << shift) - d)) // d + 1
    return mul, shift


def _shape_args(p: Plan):
    """The layout arguments after a kernel's pointers."""
    lay = p.lay
    if lay.channels_last:
        return (lay.so, lay.C, lay.O, p.per_chunk)
    return (lay.so, lay.sc, lay.O, lay.I, *inner_divider(lay.I, lay.O * lay.I), p.per_chunk)


def _off(ptr: int, elements: int, itemsize: int) -> int:
    return ptr + elements * itemsize if ptr else 0


def forward(p: Plan, x: int, res: int, y: int, w: int, b: int, running_mean: int, running_var: int, rdtype,
            mean: int, rstd: int, training: bool, factor: float, eps: float, act: int, param: float, alloc,
            stream: int, device: int) -> None:
    """Writes y and mean/rstd (per channel, acc dtype); training also updates the running
    statistics in place (where given)."""
    make_current(device)
    lay, t_size = p.lay, numpy.dtype(_np(p.t)).itemsize
    w_size, a_size = numpy.dtype(_np(p.w)).itemsize, p.acc.itemsize
    kind = "cl" if lay.channels_last else "nc"
    pivot_stride = 1 if lay.channels_last else lay.sc
    if training:
        part = alloc((lay.C, p.chunks, 3), p.acc)
        stats = _kernel(f"bn_stats_{kind}", p, device, with_w=False)
        for c0, cn in _slices(p):
            xo = _off(x, c0 * lay.sc, t_size) if not lay.channels_last else x
            launch(stats, (p.chunks, cn if not lay.channels_last else p.grid_y), BLOCK,
                   (xo, *_shape_args(p), _off(part, c0 * p.chunks * 3, a_size)), stream)
        rname = f"bn_finalize<{c_type(p.t)}, {c_type(numpy.dtype(rdtype).name)}>"
        launch(function_ptr(KERNEL_FILE, rname, device), -(-lay.C // 4), 128,
               (x, pivot_stride, part, p.chunks, lay.C, _f64(eps), _f64(factor), running_mean, running_var, mean,
                rstd), stream)
    else:
        acc = "double" if p.acc == numpy.float64 else "float"
        rname = f"bn_running_stats<{acc}, {c_type(numpy.dtype(rdtype).name)}>"
        launch(function_ptr(KERNEL_FILE, rname, device), -(-lay.C // 128), 128,
               (running_mean, running_var, lay.C, _f64(eps), mean, rstd), stream)
    apply = _kernel(f"bn_apply_{kind}", p, device)
    for c0, cn in _slices(p):
        xo = 0 if lay.channels_last else c0 * lay.sc
        launch(apply, (p.chunks, cn if not lay.channels_last else p.grid_y), BLOCK,
               (_off(x, xo, t_size), _off(res, xo, t_size), _off(y, xo, t_size), *_shape_args(p),
                _off(mean, c0, a_size), _off(rstd, c0, a_size), _off(w, c0, w_size), _off(b, c0, w_size), act,
                _acc_bits(param, p.acc)), stream)


def backward(p: Plan, dy: int, x: int, res: int, dx: int, dres: int, w: int, b: int, mean: int, rstd: int,
             dw: int, db: int, training: bool, act: int, param: float, alloc, stream: int, device: int) -> None:
    """Writes dx, and dweight / dbias / dresidual where their pointers are non-null."""
    make_current(device)
    lay, t_size = p.lay, numpy.dtype(_np(p.t)).itemsize
    w_size, a_size = numpy.dtype(_np(p.w)).itemsize, p.acc.itemsize
    kind = "cl" if lay.channels_last else "nc"
    part = alloc((lay.C, p.chunks, 2), p.acc)
    coef = alloc((lay.C, 2), p.acc)
    sums = _kernel(f"bn_bwd_sums_{kind}", p, device)
    pbits = _acc_bits(param, p.acc)
    for c0, cn in _slices(p):
        xo = 0 if lay.channels_last else c0 * lay.sc
        launch(sums, (p.chunks, cn if not lay.channels_last else p.grid_y), BLOCK,
               (_off(dy, xo, t_size), _off(x, xo, t_size), _off(res, xo, t_size), *_shape_args(p),
                _off(mean, c0, a_size), _off(rstd, c0, a_size), _off(w, c0, w_size), _off(b, c0, w_size), act, pbits,
                _off(part, c0 * p.chunks * 2, a_size)), stream)
    acc = "double" if p.acc == numpy.float64 else "float"
    count = lay.O * lay.I
    launch(function_ptr(KERNEL_FILE, f"bn_bwd_finalize<{acc}, {c_type(p.w)}>", device), -(-lay.C // 4), 128,
           (part, p.chunks, lay.C, _f64(float(count)), int(training), dw, db, coef), stream)
    apply = _kernel(f"bn_bwd_apply_{kind}", p, device)
    for c0, cn in _slices(p):
        xo = 0 if lay.channels_last else c0 * lay.sc
        launch(apply, (p.chunks, cn if not lay.channels_last else p.grid_y), BLOCK,
               (_off(dy, xo, t_size), _off(x, xo, t_size), _off(res, xo, t_size), _off(dx, xo, t_size),
                _off(dres, xo, t_size), *_shape_args(p), _off(mean, c0, a_size), _off(rstd, c0, a_size),
                _off(w, c0, w_size), _off(b, c0, w_size), act, pbits, _off(coef, c0 * 2, a_size)), stream)


def _f64(v: float) -> int:
    return int(numpy.float64(v).view(numpy.int64))


def _acc_bits(v: float, acc) -> int:
    if numpy.dtype(acc) == numpy.float64:
        return _f64(v)
    return int(numpy.float32(v).view(numpy.int32))
