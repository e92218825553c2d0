"""BatchNorm for JAX (``cunorm.jax.batch_norm``): the CuPy API's options on JAX arrays, inside
``jax.jit``, ``jax.grad`` and ``jax.vmap``, through ``buffer_callback`` as the row norms
(``_callbacks``): on a GPU the BatchNorm kernels read XLA's buffers in place on XLA's
stream, scratch sized at trace time from the launch plan; on the CPU the float64 NumPy
reference fills the outputs. JAX arrays are immutable, so the running statistics a training
call updates come back as new arrays (the kernels update a copy in place, in their own
double-precision arithmetic). Gradients come from a ``jax.custom_vjp`` whose backward runs
the backward kernels (pre-activation recomputed from x, as the CuPy API's). Under ``vmap``
each batch element is its own BatchNorm (its own statistics), one launch each.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy

from .. import _checks, reference
from .._compile import KernelPlans, held_with_modules
from .._launch import Arena, arena_bytes, contiguous_strides, make_current, remember
from ..ops import _batch_norm
from ..ops.batch_norm import checked_forward
from . import _callbacks
from ._args import as_array


class _Static(NamedTuple):
    """A call's non-array arguments (hashable: the custom_vjp's static argument)."""

    training: bool
    activation: str | None
    act: int  # the kernels' activation id
    param: float
    eps: float
    axis: int
    factor: float  # the running statistics' update factor (0: no update)
    running: tuple  # (running_mean given, running_var given)
    has_bias: bool


def batch_norm(x, weight=None, bias=None, running_mean=None, running_var=None, *, training=True, momentum=0.1,
               eps=1e-5, residual=None, activation=None, activation_param=None, channel_axis=1,
               num_batches_tracked=None, return_stats=False):
    """Batch normalization of ``x`` (N, C, ...spatial; ``channel_axis`` 1 or -1) per channel,
    then ``+ residual`` and ``activation``: :func:`cunorm.batch_norm`'s arguments and
    semantics on JAX arrays.

    Training normalizes with the batch's mean and biased variance; eval
    (``training=False``) with ``running_mean`` / ``running_var``. JAX arrays are immutable:
    a training call given running statistics returns ``(y, new_running_mean,
    new_running_var)`` (None for one not given), updated with the unbiased variance and
    factor ``momentum`` (or ``1 / num_batches_tracked`` for ``momentum=None``), as PyTorch
    does in place. ``return_stats`` appends ``(mean, rstd)``, the per-channel statistics
    used (float32, float64 for float64 x; not differentiated). Gradients flow to ``x``,
    ``weight``, ``bias`` and ``residual``.
    """
    x, weight, bias, running_mean, running_var, residual = (
        as_array(n, a) for n, a in (("x", x), ("weight", weight), ("bias", bias), ("running_mean", running_mean),
                                     ("running_var", running_var), ("residual", residual)))
    axis, act, param, eps, factor = checked_forward(x, weight, bias, running_mean, running_var, training, momentum,
                                                    eps, residual, activation, activation_param, channel_axis,
                                                    num_batches_tracked)
    channels = x.shape[axis]
    tracked = bool(training) and (running_mean is not None or running_var is not None)
    # the kernels' dtypes for parameters and running statistics (C elements; JAX
    # differentiates through the cast)
    pdt = _batch_norm.param_dtype(x.dtype, *(None if p is None else p.dtype for p in (weight, bias)))
    rdt = _batch_norm.param_dtype(x.dtype, *(None if p is None else p.dtype for p in (running_mean, running_var)))
    w, b = (None if p is None else p.astype(pdt) for p in (weight, bias))
    rm, rv = (None if p is None else jax.lax.stop_gradient(p).astype(rdt) for p in (running_mean, running_var))
    static = _Static(bool(training), activation, act, param, eps, axis, factor,
                     (running_mean is not None, running_var is not None), bias is not None)
    if math.prod(x.shape):
        y, mean, rstd, new_rm, new_rv = _bn(x, w, b, residual, rm, rv, static)
    else:  # no element: no statistics (NaN), running statistics unchanged, as the CuPy API
        acc = _checks.acc_dtype(numpy.dtype(x.dtype))
        y, new_rm, new_rv = jnp.zeros_like(x), rm, rv
        mean = rstd = jnp.full((channels,), numpy.nan, acc)
    out = (y,)
    if tracked:
        out += (None if running_mean is None else new_rm.astype(running_mean.dtype),
                None if running_var is None else new_rv.astype(running_var.dtype))
    if return_stats:
        out += (jax.lax.stop_gradient(mean), jax.lax.stop_gradient(rstd))
    return out if len(out) > 1 else y


# ---- the op and its gradient ---------------------------------------------------------------

def _forward(x, w, b, r, rm, rv, s: _Static):
    """(y, mean, rstd, new running_mean or None, new running_var or None)."""
    acc = _checks.acc_dtype(numpy.dtype(x.dtype))
    C = x.shape[s.axis]
    updates = [p for p in (rm, rv) if p is not None] if s.training else []
    scratch = _scratch_forward(tuple(x.shape), numpy.dtype(x.dtype), _dt(w, b, x), _dt(rm, rv, x), s, r is not None)
    shapes = ([jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct((C,), acc),
               jax.ShapeDtypeStruct((C,), acc)] + [jax.ShapeDtypeStruct(p.shape, p.dtype) for p in updates]
              + [jax.ShapeDtypeStruct((scratch,), jnp.uint8)])
    call = _callbacks.callback_op(_forward_callback(tuple(x.shape), numpy.dtype(x.dtype), s), shapes)
    outs = call(x, r, w, b, rm, rv)
    new = iter(outs[3:-1])
    new_rm = next(new) if updates and rm is not None else None
    new_rv = next(new) if updates and rv is not None else None
    return outs[0], outs[1], outs[2], new_rm, new_rv


def _backward(dy, x, w, b, r, mean, rstd, s: _Static):
    """(dx, dweight or None, dbias or None, dresidual or None)."""
    gdt = _dt(w, b, x)
    C = x.shape[s.axis]
    wanted = [w is not None, s.has_bias, r is not None]
    scratch = _scratch_backward(tuple(x.shape), numpy.dtype(x.dtype), gdt, s, r is not None)
    shapes = ([jax.ShapeDtypeStruct(x.shape, x.dtype)]
              + [jax.ShapeDtypeStruct((C,), gdt)] * (wanted[0] + wanted[1])
              + [jax.ShapeDtypeStruct(x.shape, x.dtype)] * wanted[2] + [jax.ShapeDtypeStruct((scratch,), jnp.uint8)])
    call = _callbacks.callback_op(_backward_callback(tuple(x.shape), numpy.dtype(x.dtype), s, tuple(wanted)), shapes)
    outs = iter(call(dy, x, r, w, b, mean, rstd)[:-1])
    dx = next(outs)
    return (dx, *(next(outs) if want else None for want in wanted))


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _bn(x, w, b, r, rm, rv, s):
    return _forward(x, w, b, r, rm, rv, s)


def _bn_fwd(x, w, b, r, rm, rv, s):
    out = _forward(x, w, b, r, rm, rv, s)
    return out, (x, w, b, r, out[1], out[2])


def _bn_bwd(s, saved, cotangents):
    x, w, b, r, mean, rstd = saved
    dx, dw, db, dr = _backward(cotangents[0], x, w, b, r, mean, rstd, s)
    # the statistics and the running statistics are not differentiated (as torch's)
    return dx, dw, db, dr, None, None


_bn.defvjp(_bn_fwd, _bn_bwd)


def _dt(p, q, x) -> numpy.dtype:
    """The dtype of the first given of p, q, else x's."""
    return numpy.dtype(next((a.dtype for a in (p, q) if a is not None), x.dtype))


# ---- scratch, sized at trace time from the launch plan ------------------------------------

def _scratch(shape, dtype, pdt, axis: int, blocks) -> int:
    """Scratch bytes for a dense x of this shape: the most any of its plans (aligned
    pointers, and not: the callback sees the real ones) takes, ``blocks(plan, device)``
    listing its allocations; the least an Arena takes without a device (the CPU path)."""
    dev = _callbacks._plan_device()
    need = 256
    if dev is not None:
        lay = _batch_norm.dense_layout(shape, contiguous_strides(shape), axis)
        for phase in (0, -1):
            need = max(need, arena_bytes(blocks(_batch_norm.plan(lay, dtype, pdt, phase, dev), dev)))
    return need


@held_with_modules
@functools.lru_cache(maxsize=256)
def _scratch_forward(shape, dtype, pdt, rdt, s: _Static, residual: bool) -> int:
    return _scratch(shape, dtype, pdt, s.axis, lambda p, dev: _batch_norm.forward_scratch(
        p, s.training, s.act, s.param, rdt, dev, residual))


@held_with_modules
@functools.lru_cache(maxsize=256)
def _scratch_backward(shape, dtype, pdt, s: _Static, residual: bool) -> int:
    return _scratch(shape, dtype, pdt, s.axis, lambda p, dev: _batch_norm.backward_scratch(
        p, s.training, s.act, s.param, dev, residual))


# ---- the callbacks -------------------------------------------------------------------------

@_callbacks.per_signature
def _forward_callback(x_shape, x_dtype, s: _Static):
    """outs = (y, mean, rstd, [new running_mean,] [new running_var,] scratch); args = (x,
    residual, weight, bias, running_mean, running_var), each but x possibly None."""
    update = s.training

    def callback(ctx, outs, x, r, w, b, rm, rv):
        if not _callbacks._executing(ctx):
            return
        y, mean, rstd, scratch = outs[0], outs[1], outs[2], outs[-1]
        new = iter(outs[3:-1])
        new_rm = next(new) if update and rm is not None else None
        new_rv = next(new) if update and rv is not None else None
        stream = _callbacks._gpu_stream(ctx)
        if stream is None:
            _cpu(y, mean, rstd, new_rm, new_rv, x, r, w, b, rm, rv)
        else:
            _gpu(stream, y, mean, rstd, new_rm, new_rv, scratch, x, r, w, b, rm, rv)

    def _cpu(y, mean, rstd, new_rm, new_rv, x, r, w, b, rm, rv):
        batch = _callbacks._Batch(y, len(x_shape))
        ins = [(None if a is None else numpy.asarray(a), a) for a in (x, r, w, b, rm, rv)]
        outs = [None if o is None else numpy.asarray(o) for o in (y, mean, rstd, new_rm, new_rv)]
        for i in numpy.ndindex(*batch.shape):
            xa, ra, wa, ba, rma, rva = (None if a is None else a[batch.index(buf, i)] for a, buf in ins)
            rm64 = None if rma is None else numpy.array(rma, dtype=numpy.float64)  # updated in place below
            rv64 = None if rva is None else numpy.array(rva, dtype=numpy.float64)
            yv, mv, sv = reference.batch_norm(xa, wa, ba, rm64, rv64, training=s.training,
                                              momentum=s.factor if s.training else 0.1, eps=s.eps, residual=ra,
                                              activation=s.activation, activation_param=s.param, channel_axis=s.axis,
                                              return_stats=True)
            outs[0][i], outs[1][i], outs[2][i] = yv, mv, sv
            for out, value in ((outs[3], rm64), (outs[4], rv64)):
                if out is not None:
                    out[i] = value

    plans = KernelPlans()

    def _gpu(stream, y, mean, rstd, new_rm, new_rv, scratch, x, r, w, b, rm, rv):
        from cupy_backends.cuda.api import runtime

        batch = _callbacks._Batch(y, len(x_shape))
        ptr = _callbacks._ptr
        yp, mp, sp, xp, rp, wp, bp, rmp, rvp = map(ptr, (y, mean, rstd, x, r, w, b, rm, rv))
        nrm, nrv, scr = ptr(new_rm), ptr(new_rv), ptr(scratch)
        dev = _callbacks._device_of(yp)
        make_current(dev)
        rdt = numpy.dtype((rm if rm is not None else rv).dtype) if (rm is not None or rv is not None) else x_dtype
        pdt = numpy.dtype((w if w is not None else b).dtype) if (w is not None or b is not None) else x_dtype
        step = batch.element_bytes(scratch)
        for i in range(batch.size):
            at = _callbacks._offsets(batch, i)
            for out, optr, buf, src in ((new_rm, nrm, rm, rmp), (new_rv, nrv, rv, rvp)):
                if out is not None:  # the kernels update a copy in place (vmap: each element's own)
                    runtime.memcpyAsync(at(out, optr), at(buf, src), batch.element_bytes(buf),
                                        runtime.memcpyDeviceToDevice, stream)
            key = (dev, _batch_norm.pointer_phase(at(x, xp), at(y, yp), at(r, rp)))
            plan = plans.get(key)
            if plan is None:
                lay = _batch_norm.dense_layout(x_shape, contiguous_strides(x_shape), s.axis)
                plan = remember(plans, key, _batch_norm.plan(lay, x_dtype, pdt, key[1], dev), 8)
            _batch_norm.forward(plan, at(x, xp), at(r, rp), at(y, yp), at(w, wp), at(b, bp),
                                at(new_rm, nrm) if s.training else at(rm, rmp),
                                at(new_rv, nrv) if s.training else at(rv, rvp), rdt, at(mean, mp), at(rstd, sp),
                                s.training, s.factor, s.eps, s.act, s.param, Arena(scr + i * step, step), stream, dev)

    return callback


@_callbacks.per_signature
def _backward_callback(x_shape, x_dtype, s: _Static, wanted: tuple):
    """outs = (dx, [dweight,] [dbias,] [dresidual,] scratch); args = (dy, x, residual, weight,
    bias, mean, rstd)."""

    def split(outs):
        it = iter(outs[:-1])
        dx = next(it)
        return (dx, *(next(it) if want else None for want in wanted), outs[-1])

    def callback(ctx, outs, dy, x, r, w, b, mean, rstd):
        if not _callbacks._executing(ctx):
            return
        stream = _callbacks._gpu_stream(ctx)
        if stream is None:
            _cpu(split(outs), dy, x, r, w, b, mean, rstd)
        else:
            _gpu(stream, split(outs), dy, x, r, w, b, mean, rstd)

    def _cpu(outs, dy, x, r, w, b, mean, rstd):
        dx, dw, db, dr, _ = outs
        batch = _callbacks._Batch(dx, len(x_shape))
        arrays = [None if o is None else numpy.asarray(o) for o in (dx, dw, db, dr)]
        ins = [(None if a is None else numpy.asarray(a), a) for a in (dy, x, r, w, b, mean, rstd)]
        for i in numpy.ndindex(*batch.shape):
            a = [None if arr is None else arr[batch.index(buf, i)] for arr, buf in ins]
            grads = reference.batch_norm_backward(a[0], a[1], a[3], a[4], a[5], a[6], residual=a[2],
                                                  activation=s.activation, activation_param=s.param,
                                                  training=s.training, channel_axis=s.axis, has_bias=s.has_bias)
            for out, g in zip(arrays, grads):
                if out is not None:
                    out[i] = g

    plans = KernelPlans()

    def _gpu(stream, outs, dy, x, r, w, b, mean, rstd):
        dx, dw, db, dr, scratch = outs
        ptr = _callbacks._ptr
        dyp, xp, rp, wp, bp, mp, sp, dxp, dwp, dbp, drp, scr = map(ptr, (dy, x, r, w, b, mean, rstd, dx, dw, db, dr,
                                                                       scratch))
        dev = _callbacks._device_of(dxp)
        make_current(dev)
        batch = _callbacks._Batch(dx, len(x_shape))
        pdt = numpy.dtype((w if w is not None else b).dtype) if (w is not None or b is not None) else x_dtype
        step = batch.element_bytes(scratch)
        for i in range(batch.size):
            at = _callbacks._offsets(batch, i)
            key = (dev, _batch_norm.pointer_phase(at(x, xp), at(dy, dyp), at(r, rp), at(dx, dxp), at(dr, drp)))
            plan = plans.get(key)
            if plan is None:
                lay = _batch_norm.dense_layout(x_shape, contiguous_strides(x_shape), s.axis)
                plan = remember(plans, key, _batch_norm.plan(lay, x_dtype, pdt, key[1], dev), 8)
            _batch_norm.backward(plan, at(dy, dyp), at(x, xp), at(r, rp), at(dx, dxp), at(dr, drp), at(w, wp),
                                 at(b, bp), at(mean, mp), at(rstd, sp), at(dw, dwp), at(db, dbp), s.training, s.act,
                                 s.param, Arena(scr + i * step, step), stream, dev)

    return callback
