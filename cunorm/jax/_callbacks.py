"""The ``buffer_callback`` bodies behind cunorm.jax: XLA hands over its buffers (and, on a GPU,
its stream); we read the inputs in place and write the outputs it allocated.

GPU: cunorm's kernels on XLA's stream, from the buffers' raw pointers; scratch (dW/dB
partials, split-path statistics) is an extra output XLA allocates, sized at trace time from
the launch plan (``scratch_bytes_*``), never an allocation inside the callback. CPU: the
float64 NumPy reference, so the jit/grad/vmap wiring runs without a GPU.

Under ``jax.vmap`` the callbacks are batched with ``vmap_method="expand_dims"``: every
buffer gains the leading batch axes, size 1 where that argument is not batched. A batched x
with unbatched parameters is more rows (one launch); batched parameters, and per-example
parameter gradients (what a vmapped backward returns), take one launch per batch element.
"""
from __future__ import annotations

import ctypes
import functools
import inspect
import math

import numpy
from jax.experimental.buffer_callback import buffer_callback

from .. import reference
from .._compile import KernelPlans, held_with_modules
from .._launch import ARENA_ALIGN, Arena, View, arena_bytes, contiguous_strides, make_current, remember
from ..ops import _row_norm


# XLA may record our callbacks into its command buffers (CUDA graphs): the Python body then
# runs while XLA records, and every later run of the program replays the recorded launches
# with no Python at all (a callback's host work is about as long as a bf16 kernel of 128
# MiB, benchmarks/NOTES.md v8 and v40). Sound because a callback's launches depend only on
# its buffers' shapes, dtypes and addresses, for which XLA records again, and because a
# kernel compiled and loaded while a stream is captured (a first call) works (v40's probe).
COMMAND_BUFFER = True
_TAKES_COMMAND_BUFFER_FLAG = "command_buffer_compatible" in inspect.signature(buffer_callback).parameters


# One callback (and one buffer_callback over it) per static signature, made once: JAX keys
# its caches on the callback object, so a closure made afresh each call re-traced and
# re-compiled every eager call and kept each in its caches (CPU, float32 (4, 64): LayerNorm,
# RMSNorm with a residual, BatchNorm 13-23 ms an eager call before, 0.41-0.52 ms with these
# caches; jnp.tanh 0.37 ms).
# (Dropped with the kernels, as their plans are: a rebuild makes them afresh.)
def per_signature(factory):
    """``factory`` (static arguments -> a callback) made once per signature."""
    return held_with_modules(functools.lru_cache(maxsize=1024)(factory))


def callback_op(callback, result_shapes):
    """``buffer_callback`` over one of this module's callbacks (or the fused kernels'): vmap's
    batch axes as leading size-1-or-batch axes, recorded into XLA's command buffers where
    this JAX can (COMMAND_BUFFER); the same object for the same callback, shapes and setting."""
    return _callback_op(callback, tuple(result_shapes), COMMAND_BUFFER and _TAKES_COMMAND_BUFFER_FLAG)


@per_signature
def _callback_op(callback, result_shapes: tuple, recorded: bool):
    flags = {"command_buffer_compatible": True} if recorded else {}
    return buffer_callback(callback, list(result_shapes), vmap_method="expand_dims", **flags)


@functools.lru_cache(maxsize=None)
def _plan_device() -> int | None:
    """The device whose launch plans size the scratch at trace time, or None without one."""
    try:
        from cupy_backends.cuda.api import runtime

        return 0 if runtime.getDeviceCount() > 0 else None
    except Exception:
        return None


@held_with_modules
@functools.lru_cache(maxsize=1024)
def scratch_bytes_forward(shape, dtype, pdt, nd, rms, eps) -> int:
    """Scratch a forward of this signature may need: the larger of the plans for aligned and
    for unaligned buffers (the callback sees the real pointers)."""
    dev = _plan_device()
    need = ARENA_ALIGN
    if dev is not None:
        for align in (0, 1):
            plan = _row_norm.forward_plan(tuple(shape), contiguous_strides(tuple(shape)), dtype, pdt, nd, rms, eps,
                                          dev, align, align)
            if plan is not None:
                need = max(need, arena_bytes(_row_norm.forward_scratch(plan, stats=True)))
    return need


@held_with_modules
@functools.lru_cache(maxsize=1024)
def scratch_bytes_backward(shape, dtype, wdt, nd, rms, has_weight, has_bias) -> int:
    dev = _plan_device()
    need = ARENA_ALIGN
    if dev is not None:
        for align in (0, 1):
            strides = contiguous_strides(tuple(shape))
            plan = _row_norm.backward_plan(tuple(shape), strides, strides, dtype, wdt, wdt, nd, rms, dev, align, align)
            if plan is not None:
                need = max(need, arena_bytes(_row_norm.backward_scratch(plan, has_weight, has_bias)))
    return need


# ---- buffers ------------------------------------------------------------------------------

class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("dtype", ctypes.c_uint32), ("shape", ctypes.c_void_p),
                ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]


def _dlpack_ptr(buf) -> int:
    """The data pointer of a DLPack capsule (for dtypes __cuda_array_interface__ cannot name)."""
    capsule = buf.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    tensor = _DLTensor.from_address(get(capsule, b"dltensor"))
    return tensor.data + tensor.byte_offset


def _ptr(buf) -> int:
    if buf is None:
        return 0
    try:
        return buf.__cuda_array_interface__["data"][0]
    except Exception:
        return _dlpack_ptr(buf)


def _gpu_stream(ctx) -> int | None:
    """XLA's stream on a GPU, None on the CPU (where the context has none)."""
    try:
        return ctx.stream
    except Exception:
        return None


@functools.lru_cache(maxsize=None)
def _execute_stage():
    from jax.experimental.buffer_callback import ExecutionStage

    return ExecutionStage.EXECUTE


def _executing(ctx) -> bool:
    return ctx.stage == _execute_stage()


# Each callback keeps its launch plans by call signature (device, alignment classes, buffer
# shapes): XLA runs the callback on its execution thread, in the critical path of every
# call, so a repeated call only reads its pointers and launches (benchmarks/NOTES.md, v8).
_MAX_PLANS = 64
_GENERAL = False  # a signature that takes the general path (views, per-element loops)




def _shape(buf):
    return None if buf is None else tuple(buf.shape)


class _Batch:
    """The leading batch axes vmap added (``k`` of them, total ``size``). Each buffer has
    them too, size 1 along the axes it is not batched over (nested vmaps can batch
    different arguments over different axes)."""

    def __init__(self, out, unbatched_ndim: int):
        self.k = out.ndim - unbatched_ndim
        self.shape = tuple(out.shape[: self.k])
        self.size = math.prod(self.shape)

    def batched(self, buf) -> bool:
        """Batched over every batch axis (so its batch elements are consecutive rows)."""
        return buf is not None and tuple(buf.shape[: self.k]) == self.shape

    def element_bytes(self, buf) -> int:
        return math.prod(buf.shape[self.k:]) * numpy.dtype(buf.dtype).itemsize

    def index(self, buf, i: tuple) -> tuple:
        """Batch index ``i`` into ``buf``: 0 along the axes ``buf`` is not batched over."""
        return tuple(ix if size != 1 else 0 for ix, size in zip(i, buf.shape[: self.k]))

    def offset(self, buf, i: int) -> int:
        """Byte offset of flat batch element ``i`` in ``buf``."""
        idx = self.index(buf, numpy.unravel_index(i, self.shape)) if self.k else ()
        off, stride = 0, self.element_bytes(buf)
        for ix, size in zip(reversed(idx), reversed(buf.shape[: self.k])):
            off += int(ix) * stride
            stride *= size
        return off


def _offsets(batch: _Batch, i: int):
    """at(buf, ptr): the pointer of flat batch element ``i`` of ``buf`` (0 when absent)."""
    def at(buf, ptr):
        return 0 if buf is None else ptr + batch.offset(buf, i)
    return at


def _view(ptr: int, shape, dtype) -> View:
    return View(ptr, tuple(shape), contiguous_strides(tuple(shape)), numpy.dtype(dtype))


def _device_of(ptr: int) -> int:
    from cupy_backends.cuda.api import runtime

    return runtime.pointerGetAttributes(ptr).device


# ---- forward ------------------------------------------------------------------------------

@per_signature
def forward(x_shape, x_dtype, nd: int, rms: bool, eps: float):
    """The callback of a forward: outs = (y, [mean,] rstd, scratch), args = (x, weight, bias)."""

    def callback(ctx, outs, x, weight, bias):
        if not _executing(ctx):
            return
        stream = _gpu_stream(ctx)
        if stream is None:
            _forward_cpu(outs, x, weight, bias)
        else:
            _forward_gpu(stream, outs, x, weight, bias)

    def _forward_cpu(outs, x, weight, bias):
        batch = _Batch(outs[0], len(x_shape))
        arrays = [numpy.asarray(b) for b in outs[:-1]]
        xa, wa, ba = (None if a is None else numpy.asarray(a) for a in (x, weight, bias))
        for i in numpy.ndindex(*batch.shape):
            pick = lambda a, buf: None if a is None else a[batch.index(buf, i)]  # noqa: E731
            y, mean, rstd = reference.layer_norm(pick(xa, x), pick(wa, weight), pick(ba, bias), eps,
                                                 normalized_ndim=nd, return_stats=True, _rms=rms)
            for out, value in zip(arrays, [y, rstd] if rms else [y, mean, rstd]):
                out[i] = value

    plans = KernelPlans()

    def _forward_gpu(stream, outs, x, weight, bias):
        y, stats, scratch = outs[0], outs[1:-1], outs[-1]
        mean, rstd = (None, stats[0]) if rms else stats
        xp, wp, bp, yp, mp, rp, sp = map(_ptr, (x, weight, bias, y, mean, rstd, scratch))
        dev = _device_of(xp)
        key = (dev, (xp | yp) & 15, (wp | bp) & 15, _shape(x), _shape(y), _shape(weight), _shape(bias),
               _shape(scratch))
        entry = plans.get(key)
        if entry is None:
            entry = remember(plans, key, _forward_entry(key, x, weight, bias, y, scratch), _MAX_PLANS)
        if entry is not _GENERAL:
            make_current(dev)
            plan, nbytes = entry
            _row_norm.run_forward(plan, xp, yp, wp, bp, mp, rp, Arena(sp, nbytes), stream)
            return
        batch = _Batch(y, len(x_shape))
        wdt = next((p.dtype for p in (weight, bias) if p is not None), x_dtype)
        pv = lambda buf, ptr: None if buf is None else _view(ptr, buf.shape[batch.k:], wdt)  # noqa: E731
        step = batch.element_bytes(scratch)
        for i in range(batch.size):
            at = _offsets(batch, i)
            _row_norm.forward(_view(at(x, xp), x_shape, x_dtype), pv(weight, at(weight, wp)), pv(bias, at(bias, bp)),
                              at(y, yp), at(mean, mp), at(rstd, rp), eps, nd, rms, Arena(sp + i * step, step),
                              stream, dev)

    def _forward_entry(key, x, weight, bias, y, scratch):
        """The launch plan of one kernel call over all rows, or _GENERAL (per-element loop:
        vmap batched the parameters, or x is broadcast over a batch axis)."""
        batch = _Batch(y, len(x_shape))
        params_shared = all(p is None or math.prod(p.shape[: batch.k]) == 1 for p in (weight, bias))
        if not (batch.size == 1 or (params_shared and batch.batched(x))):
            return _GENERAL
        wdt = next((p.dtype for p in (weight, bias) if p is not None), x_dtype)
        shape = (*batch.shape, *x_shape)  # vmap's batch axes are more rows
        plan = _row_norm.forward_plan(shape, contiguous_strides(shape), x_dtype, wdt, nd, rms, eps, key[0], key[1],
                                      key[2])
        return _GENERAL if plan is None else (plan, math.prod(scratch.shape))

    return callback


# ---- backward -----------------------------------------------------------------------------

@per_signature
def backward(x_shape, x_dtype, nd: int, rms: bool, has_weight: bool, has_bias: bool):
    """The callback of a backward: outs = (dx, [dweight,] [dbias,] scratch), args = (dy, x,
    weight, [mean,] rstd)."""

    def split_outs(outs):
        it = iter(outs[:-1])
        dx = next(it)
        dw = next(it) if has_weight else None
        db = next(it) if has_bias else None
        return dx, dw, db, outs[-1]

    def callback(ctx, outs, dy, x, weight, *stats):
        if not _executing(ctx):
            return
        mean, rstd = (None, stats[0]) if rms else stats
        stream = _gpu_stream(ctx)
        if stream is None:
            _backward_cpu(split_outs(outs), dy, x, weight, mean, rstd)
        else:
            _backward_gpu(stream, split_outs(outs), dy, x, weight, mean, rstd)

    def _backward_cpu(outs, dy, x, weight, mean, rstd):
        dx, dw, db, _ = outs
        batch = _Batch(dx, len(x_shape))
        arrays = [None if o is None else numpy.asarray(o) for o in (dx, dw, db)]
        ins = [(None if b is None else numpy.asarray(b), b) for b in (dy, x, weight, mean, rstd)]
        for i in numpy.ndindex(*batch.shape):
            a = [None if arr is None else arr[batch.index(buf, i)] for arr, buf in ins]
            grads = reference.layer_norm_backward(a[0], a[1], a[2], a[3], a[4], normalized_ndim=nd,
                                                  has_bias=has_bias, _rms=rms)
            for out, g in zip(arrays, grads):
                if out is not None:
                    out[i] = g

    plans = KernelPlans()

    def _backward_gpu(stream, outs, dy, x, weight, mean, rstd):
        dx, dw, db, scratch = outs
        dyp, xp, wp, mp, rp, dxp, dwp, dbp, sp = map(_ptr, (dy, x, weight, mean, rstd, dx, dw, db, scratch))
        dev = _device_of(xp)
        key = (dev, (xp | dyp | dxp) & 15, wp & 15, _shape(dy), _shape(x), _shape(weight), _shape(mean),
               _shape(rstd), _shape(dx), _shape(scratch))
        entry = plans.get(key)
        if entry is None:
            entry = remember(plans, key, _backward_entry(key, dy, x, weight, mean, rstd, dx, scratch), _MAX_PLANS)
        if entry is not _GENERAL:
            make_current(dev)
            plan, nbytes = entry
            _row_norm.run_backward(plan, dyp, xp, wp, mp, rp, dxp, dwp, dbp, Arena(sp, nbytes), stream)
            return
        batch = _Batch(dx, len(x_shape))
        wdt = x_dtype if weight is None else weight.dtype
        step = batch.element_bytes(scratch)
        lead = tuple(x_shape[: len(x_shape) - nd])
        for i in range(batch.size):
            at = _offsets(batch, i)
            _row_norm.backward(_view(at(dy, dyp), x_shape, x_dtype), _view(at(x, xp), x_shape, x_dtype),
                               None if weight is None else _view(at(weight, wp), weight.shape[batch.k:], wdt),
                               None if mean is None else _view(at(mean, mp), lead, mean.dtype),
                               _view(at(rstd, rp), lead, rstd.dtype), at(dx, dxp), at(dw, dwp), at(db, dbp),
                               wdt, nd, rms, Arena(sp + i * step, step), stream, dev)

    def _backward_entry(key, dy, x, weight, mean, rstd, dx, scratch):
        """As _forward_entry: one kernel call over all rows, or _GENERAL."""
        batch = _Batch(dx, len(x_shape))
        rows_batched = all(batch.batched(b) for b in (dy, x, mean, rstd) if b is not None)
        per_example_grads = batch.size > 1 and (has_weight or has_bias)  # vmap made dW/dB per element
        weight_shared = weight is None or math.prod(weight.shape[: batch.k]) == 1
        if not (batch.size == 1 or (rows_batched and not per_example_grads and weight_shared)):
            return _GENERAL
        wdt = x_dtype if weight is None else weight.dtype
        shape = (*batch.shape, *x_shape)  # more rows
        strides = contiguous_strides(shape)
        plan = _row_norm.backward_plan(shape, strides, strides, x_dtype, wdt, wdt, nd, rms, key[0], key[1], key[2])
        return _GENERAL if plan is None else (plan, math.prod(scratch.shape))

    return callback
