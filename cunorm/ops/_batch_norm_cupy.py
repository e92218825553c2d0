"""The CuPy frontend of BatchNorm: CuPy arrays in (validated by ops.batch_norm), CuPy arrays
out, on CuPy's current stream and x's device. Outputs keep x's memory layout; x is copied
only when its layout is not one the kernels address (see _batch_norm.layout), and residual
or dy only when their strides differ from x's."""
from __future__ import annotations

import numpy

from .._checks import acc_dtype
from . import _batch_norm
from ._row_norm_cupy import _Scratch, _empty, _stream_ptr


def _kernel_layout(shape: tuple, strides: tuple, itemsize: int, axis: int):
    """The kernels' layout of a dense array with these byte strides, else None."""
    if any(st % itemsize for st in strides):
        return None
    return _batch_norm.dense_layout(shape, tuple(st // itemsize for st in strides), axis)


def _like(a, x):
    """``a`` with x's strides (a copy when they differ)."""
    import cupy

    if a is None or a.strides == x.strides:
        return a
    out = cupy.empty_like(x)
    out[...] = a
    return out


def _prepared(x, axis):
    """(x, layout): x addressable in place, or copied to C order when it is not."""
    import cupy

    lay = _kernel_layout(x.shape, x.strides, x.itemsize, axis)
    if lay is None:
        x = cupy.ascontiguousarray(x)
        lay = _kernel_layout(x.shape, x.strides, x.itemsize, axis)
    return x, lay


def _params(x, *params):
    import cupy

    pdt = _batch_norm.param_dtype(x.dtype, *(None if p is None else p.dtype for p in params))
    return pdt, [p if p is None or (p.dtype == pdt and p.flags.c_contiguous) else cupy.ascontiguousarray(p, dtype=pdt)
                 for p in params]


def _ptr(a) -> int:
    return 0 if a is None else a.data.ptr


def _empty_output(x):
    """An uninitialised array with x's (dense) strides; NaN-filled under the tests' poison."""
    import cupy

    from . import _row_norm_cupy

    y = cupy.empty_like(x)
    if _row_norm_cupy.POISON_OUTPUTS:
        y.fill(numpy.nan)
    return y


def forward(x, weight, bias, running_mean, running_var, training, factor, eps, residual, act, param, axis):
    x, lay = _prepared(x, axis)
    residual = _like(residual, x)
    y = _empty_output(x)
    acc = acc_dtype(x.dtype)
    stats = _empty((2, lay.C), acc)  # one allocation for both
    mean, rstd = stats[0], stats[1]
    if x.size == 0:
        mean.fill(numpy.nan)
        rstd.fill(numpy.nan)
        return y, mean, rstd
    pdt, (w, b) = _params(x, weight, bias)
    rdt, (rm, rv) = _params(x, running_mean, running_var)
    device = x.data.device_id
    plan = _batch_norm.plan(lay, x.dtype, pdt, _batch_norm.pointer_phase(_ptr(x), _ptr(y), _ptr(residual)), device)
    _batch_norm.forward(plan, _ptr(x), _ptr(residual), _ptr(y), _ptr(w), _ptr(b), _ptr(rm), _ptr(rv), rdt,
                        stats.data.ptr, stats.data.ptr + lay.C * stats.itemsize, training, factor, eps, act, param,
                        _Scratch(), _stream_ptr(), device)
    # running statistics cast to the kernels' dtype were updated in the copy: write them back
    for given, used in ((running_mean, rm), (running_var, rv)):
        if training and given is not None and used is not given:
            given[...] = used
    return y, mean, rstd


def backward(dy, x, weight, bias, mean, rstd, residual, act, param, training, axis, has_bias, residual_grad,
             grad_dtype):
    import cupy

    x, lay = _prepared(x, axis)
    dy, residual = _like(dy, x), _like(residual, x)
    dx = _empty_output(x)
    dres = _empty_output(x) if residual_grad else None
    pdt, (w, b) = _params(x, weight, bias)
    acc = acc_dtype(x.dtype)
    if mean.dtype != acc or not mean.flags.c_contiguous:
        mean = cupy.ascontiguousarray(mean, dtype=acc)
    if rstd.dtype != acc or not rstd.flags.c_contiguous:
        rstd = cupy.ascontiguousarray(rstd, dtype=acc)
    dw = _empty((lay.C,), pdt) if weight is not None else None
    db = _empty((lay.C,), pdt) if has_bias else None
    if x.size == 0:
        for g in (dw, db):
            if g is not None:
                g.fill(0)
    else:
        device = x.data.device_id
        phase = _batch_norm.pointer_phase(_ptr(x), _ptr(dy), _ptr(residual), _ptr(dx), _ptr(dres))
        plan = _batch_norm.plan(lay, x.dtype, pdt, phase, device)
        _batch_norm.backward(plan, _ptr(dy), _ptr(x), _ptr(residual), _ptr(dx), _ptr(dres), _ptr(w), _ptr(b),
                             _ptr(mean), _ptr(rstd), _ptr(dw), _ptr(db), training, act, param, _Scratch(),
                             _stream_ptr(), device)
    cast = lambda g: None if g is None else (g if g.dtype == grad_dtype else g.astype(grad_dtype))  # noqa: E731
    return dx, cast(dw), cast(db), dres
