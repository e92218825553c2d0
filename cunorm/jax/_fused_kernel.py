"""The fused kernels (kernels/layer_norm_fused.cu) from JAX: residual add, weight offset and
output dtype in one pass forward (x, r read once; y, h written once) and one backward (h,
dy, dh read once; dx and the residual's gradient written once), through buffer callbacks
and a custom_vjp, as cunorm.jax's plain ops do (see ``_callbacks``).

Used where both fused plans exist for the call's signature (rows of one register tile,
16-byte packs, compiled dtypes; decided at trace time on the planning device) and y is not
FP8; ``_fused`` composes everything else. Without a GPU the callbacks run the float64
references, so the wiring is tested on the CPU. Under ``vmap`` the batch axes are more rows
(one launch) when the parameters are shared, else one launch per batch element.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy

from .. import reference
from .._checks import BFLOAT16
from .._compile import KernelPlans, held_with_modules
from .._launch import Arena, arena_bytes, contiguous_strides, make_current, remember
from ..ops import _fused, _fused_api, _row_norm
from . import _callbacks
from ._callbacks import _GENERAL, _MAX_PLANS, _Batch, _device_of, _executing, _gpu_stream, _offsets, _ptr, _shape


class Config(NamedTuple):  # static: the custom_vjp's non-differentiable argument
    eps: float
    nd: int
    rms: bool
    x_dtype: numpy.dtype
    r_dtype: numpy.dtype | None  # None: no residual
    h_dtype: numpy.dtype | None  # None: no residual
    weight_offset: float
    out_dtype: numpy.dtype


def _pointers(*dtypes) -> tuple:
    return tuple((0, numpy.dtype(d).itemsize) for d in dtypes if d is not None)  # XLA's buffers are aligned


@held_with_modules
@functools.lru_cache(maxsize=1024)
def _plans(shape: tuple, x_dtype, r_dtype, w_dtype, has_bias: bool, cfg: Config, dev: int):
    """(forward plan, backward plan) for one unbatched call on ``dev``, either None where the
    fused kernel does not serve it."""
    strides = contiguous_strides(shape)
    h = cfg.h_dtype or x_dtype
    fwd = _fused.fused_forward_plan(shape, strides, None if r_dtype is None else strides, x_dtype, r_dtype or x_dtype,
                                    h, cfg.out_dtype, w_dtype or x_dtype, cfg.nd, cfg.rms, dev,
                                    _pointers(x_dtype, r_dtype, cfg.h_dtype, cfg.out_dtype, w_dtype,
                                              w_dtype if has_bias else None))
    bwd = _fused.fused_backward_plan(shape, strides, strides, cfg.out_dtype, h, x_dtype, w_dtype or cfg.out_dtype,
                                     w_dtype or h, cfg.nd, cfg.rms, dev,
                                     _pointers(cfg.out_dtype, h, cfg.h_dtype, w_dtype))
    return fwd, bwd


_ACTIVATIONS = (numpy.dtype(numpy.float16), numpy.dtype(numpy.float32), BFLOAT16)


def serves(x, r, w, b, cfg: Config) -> bool:
    """Trace time: whether this call takes the fused kernels (float32 statistics: half and
    float32 x; a bias goes with a weight; FP8 y, which carries no gradient, composes)."""
    if (cfg.out_dtype in _fused_api.FP8_DTYPES or math.prod(x.shape) == 0 or cfg.x_dtype not in _ACTIVATIONS
            or (b is not None and w is None)):
        return False
    if w is not None and _row_norm.param_dtype(cfg.out_dtype, numpy.dtype(w.dtype), None) != numpy.dtype(w.dtype):
        return False  # the backward pairs the weight with dy's (y's) dtype
    dev = _callbacks._plan_device()
    if dev is None:
        return True  # no GPU: the callbacks run the references
    fwd, bwd = _plans(tuple(x.shape), numpy.dtype(x.dtype), None if r is None else numpy.dtype(r.dtype),
                      None if w is None else numpy.dtype(w.dtype), b is not None, cfg, dev)
    return fwd is not None and bwd is not None


def _stats_structs(lead, rms):
    return [jax.ShapeDtypeStruct(lead, jnp.float32)] * (1 if rms else 2)


def _forward(x, r, w, b, cfg: Config):
    """(y, h or None, stats)."""
    lead = x.shape[: x.ndim - cfg.nd]
    shapes = ([jax.ShapeDtypeStruct(x.shape, cfg.out_dtype)]
              + ([jax.ShapeDtypeStruct(x.shape, cfg.h_dtype)] if r is not None else [])
              + _stats_structs(lead, cfg.rms))
    call = _callbacks.callback_op(_forward_callback(tuple(x.shape), cfg, r is not None), shapes)
    outs = call(x, r, w, b)
    y, rest = outs[0], list(outs[1:])
    h = rest.pop(0) if r is not None else None
    return y, h, tuple(rest)


def _scratch_bytes(shape, w_dtype, has_bias, cfg: Config) -> int:
    """The dW / dB partial rows' scratch of the backward plan (a few bytes where there is none
    or no GPU to plan on)."""
    dev = _callbacks._plan_device()
    bwd = None if dev is None or w_dtype is None else _plans(tuple(shape), cfg.x_dtype, cfg.r_dtype, w_dtype,
                                                                has_bias, cfg, dev)[1]
    return 16 if bwd is None else arena_bytes([((1 + has_bias, bwd.groups, bwd.n), numpy.float32)])


def _backward(dy, dh, h, w, stats, cfg: Config, has_bias: bool):
    """(dx, the residual's gradient in h's dtype or None, dweight or None, dbias or None); a
    bias comes with a weight (serves)."""
    norm_shape = h.shape[h.ndim - cfg.nd:]
    wdt = None if w is None else numpy.dtype(w.dtype)
    scratch = _scratch_bytes(tuple(h.shape), wdt, has_bias, cfg)
    shapes = ([jax.ShapeDtypeStruct(h.shape, cfg.x_dtype)]
              + ([jax.ShapeDtypeStruct(h.shape, cfg.h_dtype)] if cfg.h_dtype is not None else [])
              + [jax.ShapeDtypeStruct(norm_shape, wdt)] * ((w is not None) + has_bias)
              + [jax.ShapeDtypeStruct((scratch,), jnp.uint8)])
    call = _callbacks.callback_op(_backward_callback(tuple(h.shape), cfg, w is not None, has_bias), shapes)
    outs = list(call(dy, dh, h, w, *stats)[:-1])
    dx = outs.pop(0)
    dres = outs.pop(0) if cfg.h_dtype is not None else None
    dw = outs.pop(0) if w is not None else None
    db = outs.pop(0) if has_bias else None
    return dx, dres, dw, db


# ---- the custom_vjp ---------------------------------------------------------------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def fused_norm(x, r, w, b, cfg: Config):
    """(y, h): h is None without a residual."""
    y, h, _ = _forward(x, r, w, b, cfg)
    return y, h


def _fused_fwd(x, r, w, b, cfg):
    y, h, stats = _forward(x, r, w, b, cfg)
    return (y, h), (x if h is None else h, w, b, stats)


def _fused_bwd(cfg, residuals, grads):
    h, w, b, stats = residuals
    dy, dh = grads
    dx, dres, dw, db = _backward(dy, dh, h, w, stats, cfg, b is not None)
    # the kernel writes the residual's gradient in h's dtype
    return dx, None if dres is None else dres.astype(cfg.r_dtype), dw, db


fused_norm.defvjp(_fused_fwd, _fused_bwd)


# ---- callbacks --------------------------------------------------------------------------------

def _aligned(ptrs) -> None:
    """The plans assume 16-byte aligned buffers (XLA allocates them so); say so rather than
    launch 16-byte loads on anything else."""
    if any(p % 16 for p in ptrs):
        raise RuntimeError("cunorm.jax: an XLA buffer is not 16-byte aligned; the fused kernels' plans assume it "
                           "(please report)")


@_callbacks.per_signature
def _forward_callback(x_shape, cfg: Config, has_residual: bool):
    x_dtype = cfg.x_dtype
    def split(outs):
        rest = list(outs[1:])
        h = rest.pop(0) if has_residual else None
        mean, rstd = (None, rest[0]) if cfg.rms else rest
        return outs[0], h, mean, rstd

    def callback(ctx, outs, x, r, w, b):
        if not _executing(ctx):
            return
        stream = _gpu_stream(ctx)
        (_cpu if stream is None else functools.partial(_gpu, stream))(split(outs), x, r, w, b)

    def _cpu(outs, x, r, w, b):
        y, h, mean, rstd = outs
        batch = _Batch(y, len(x_shape))
        arrays = [None if o is None else numpy.asarray(o) for o in (y, h, mean, rstd)]
        ins = [(None if a is None else numpy.asarray(a), a) for a in (x, r, w, b)]
        for i in numpy.ndindex(*batch.shape):
            xa, ra, wa, ba = (None if arr is None else arr[batch.index(buf, i)] for arr, buf in ins)
            opts = _fused_api.FusedOptions(ra, cfg.h_dtype, cfg.weight_offset, cfg.out_dtype, 1.0, False)
            yi, hi, stats, _ = _fused_api.numpy_forward(xa, wa, ba, cfg.eps, cfg.nd, cfg.rms, opts)
            values = [yi, hi] + ([None] if cfg.rms else []) + list(stats)
            for out, value in zip(arrays, values):
                if out is not None:
                    out[i] = value

    plans = KernelPlans()

    def _gpu(stream, outs, x, r, w, b):
        y, h, mean, rstd = outs
        ptrs = xp, rp, wp, bp, yp, hp, mp, sp = [_ptr(a) for a in (x, r, w, b, y, h, mean, rstd)]
        _aligned(ptrs)
        dev = _device_of(xp)
        key = (dev, tuple(_shape(a) for a in (x, r, w, b, y)))
        entry = plans.get(key)
        if entry is None:
            entry = remember(plans, key, _forward_entry(dev, x, r, w, b, y), _MAX_PLANS)
        make_current(dev)
        if entry is not _GENERAL:
            _fused.run_fused_forward(entry, xp, rp, hp, yp, wp, bp, mp, sp, 0, cfg.eps, cfg.weight_offset, 1.0,
                                     stream)
            return
        batch = _Batch(y, len(x_shape))
        plan = _element_plan(dev, x, r, w, b)
        for i in range(batch.size):
            at = _offsets(batch, i)
            p = [at(a, ptr) for a, ptr in zip((x, r, w, b, y, h, mean, rstd), ptrs)]
            _fused.run_fused_forward(plan, p[0], p[1], p[5], p[4], p[2], p[3], p[6], p[7], 0, cfg.eps,
                                     cfg.weight_offset, 1.0, stream)

    def _element_plan(dev, x, r, w, b):
        return _plans(tuple(x_shape), x_dtype, None if r is None else numpy.dtype(r.dtype),
                      None if w is None else numpy.dtype(w.dtype), b is not None, cfg, dev)[0]

    def _forward_entry(dev, x, r, w, b, y):
        """One launch over every row (vmap's batch axes are more rows) or _GENERAL."""
        batch = _Batch(y, len(x_shape))
        shared = all(p is None or math.prod(p.shape[: batch.k]) == 1 for p in (w, b))
        if batch.size > 1 and not (shared and batch.batched(x) and (r is None or batch.batched(r))):
            return _GENERAL
        shape = (*batch.shape, *x_shape)
        plan = _plans(shape, x_dtype, None if r is None else numpy.dtype(r.dtype),
                      None if w is None else numpy.dtype(w.dtype), b is not None, cfg, dev)[0]
        return _GENERAL if plan is None else plan

    return callback


@_callbacks.per_signature
def _backward_callback(x_shape, cfg: Config, has_weight: bool, has_bias: bool):
    has_residual = cfg.h_dtype is not None

    def split(outs):
        rest = list(outs[:-1])
        dx = rest.pop(0)
        dres = rest.pop(0) if has_residual else None
        dw = rest.pop(0) if has_weight else None
        db = rest.pop(0) if has_bias else None
        return dx, dres, dw, db, outs[-1]

    def callback(ctx, outs, dy, dh, h, w, *stats):
        if not _executing(ctx):
            return
        mean, rstd = (None, stats[0]) if cfg.rms else stats
        stream = _gpu_stream(ctx)
        (_cpu if stream is None else functools.partial(_gpu, stream))(split(outs), dy, dh, h, w, mean, rstd)

    def _cpu(outs, dy, dh, h, w, mean, rstd):
        dx, dres, dw, db, _ = outs
        batch = _Batch(dx, len(x_shape))
        arrays = [None if o is None else numpy.asarray(o) for o in (dx, dres, dw, db)]
        ins = [(None if a is None else numpy.asarray(a), a) for a in (dy, dh, h, w, mean, rstd)]
        for i in numpy.ndindex(*batch.shape):
            a = [None if arr is None else arr[batch.index(buf, i)] for arr, buf in ins]
            g, gw, gb = reference.layer_norm_backward(a[0], a[2], a[3], a[4], a[5], normalized_ndim=cfg.nd,
                                                      has_bias=has_bias, dh=a[1],
                                                      weight_offset=cfg.weight_offset, _rms=cfg.rms)
            for out, value in zip(arrays, (g, g, gw, gb)):
                if out is not None:
                    out[i] = value

    plans = KernelPlans()

    def _gpu(stream, outs, dy, dh, h, w, mean, rstd):
        dx, dres, dw, db, scratch = outs
        bufs = (dy, dh, h, w, mean, rstd, dx, dres, dw, db, scratch)
        ptrs = [_ptr(a) for a in bufs]
        _aligned(ptrs)
        dev = _device_of(ptrs[2])
        key = (dev, tuple(_shape(a) for a in bufs))
        entry = plans.get(key)
        if entry is None:
            entry = remember(plans, key, _backward_entry(dev, dy, dh, h, w, mean, rstd, dx), _MAX_PLANS)
        make_current(dev)
        nbytes = math.prod(scratch.shape)
        if entry is not _GENERAL:
            _run(entry, ptrs, Arena(ptrs[-1], nbytes), stream)
            return
        batch = _Batch(dx, len(x_shape))
        plan = _element_plan(dev, w)
        step = batch.element_bytes(scratch)
        for i in range(batch.size):
            at = _offsets(batch, i)
            _run(plan, [at(a, p) for a, p in zip(bufs, ptrs)], Arena(ptrs[-1] + i * step, step), stream)

    def _run(plan, p, arena, stream):
        dyp, dhp, hp, wp, mp, rp, dxp, dresp, dwp, dbp, _ = p
        _fused.run_fused_backward(plan, dyp, hp, dhp, wp, mp, rp, dxp, dresp, dwp, dbp, cfg.weight_offset, arena,
                                  stream)

    def _element_plan(dev, w):
        return _plans(tuple(x_shape), cfg.x_dtype, cfg.r_dtype, None if w is None else numpy.dtype(w.dtype), has_bias,
                      cfg, dev)[1]

    def _backward_entry(dev, dy, dh, h, w, mean, rstd, dx):
        batch = _Batch(dx, len(x_shape))
        rows = all(batch.batched(a) for a in (dy, dh, h, mean, rstd) if a is not None)
        per_example_grads = batch.size > 1 and has_weight  # vmap made dW/dB per element
        shared = w is None or math.prod(w.shape[: batch.k]) == 1
        if batch.size > 1 and not (rows and shared and not per_example_grads):
            return _GENERAL
        shape = (*batch.shape, *x_shape)
        plan = _plans(shape, cfg.x_dtype, cfg.r_dtype, None if w is None else numpy.dtype(w.dtype), has_bias, cfg,
                      dev)[1]
        return _GENERAL if plan is None else plan

    return callback
