"""The CuPy path of the fused options (see _fused_api): one launch of the fused kernel where it
serves the call, else the plain kernels composed with CuPy element-wise work (rows longer
than a register tile, a pack width of one, float64, a dtype combination not compiled).

CuPy has no FP8 dtype (14.x refuses to allocate one): an FP8 y is a uint8 array of the FP8
bit patterns (``FP8_STORAGE``); ``.get().view(ml_dtypes.float8_e4m3fn)`` reads it on the host,
and torch/JAX frontends view the same bytes as their FP8 dtypes."""
from __future__ import annotations

import math

import numpy

from .._checks import acc_dtype
from .._launch import cupy_view
from . import _fused, _row_norm_cupy
from ._fused_api import FP8_DTYPES, FusedOptions

FP8_STORAGE = numpy.dtype(numpy.uint8)


def storage_dtype(dtype) -> numpy.dtype:
    """The CuPy dtype holding an output of ``dtype`` (FP8 as its bit patterns)."""
    return FP8_STORAGE if numpy.dtype(dtype) in FP8_DTYPES else numpy.dtype(dtype)
from ._row_norm_cupy import _Scratch, _addressable, _empty, _params, _stream_ptr


def forward(x, weight, bias, eps: float, nd: int, rms: bool, stats: bool, opts: FusedOptions) -> tuple:
    """(y, h or None, [mean, rstd] or [rstd] or [], amax or None) on x's device and CuPy's
    current stream."""
    import cupy

    with x.device:
        lead = x.shape[: x.ndim - nd]
        acc = acc_dtype(x.dtype)
        y = _empty(x.shape, storage_dtype(opts.out_dtype))
        h = None if opts.residual is None else _empty(x.shape, opts.residual_dtype)
        mean = None if rms or not stats else _empty(lead, acc)
        rstd = _empty(lead, acc) if stats else None
        bits = cupy.zeros((), numpy.uint32) if opts.return_amax else None
        stat_list = [s for s in (mean, rstd) if s is not None]
        if math.prod(x.shape) == 0:
            for s in stat_list:  # statistics of an empty row are undefined
                s.fill(numpy.nan)
            return y, h, stat_list, None if bits is None else bits.view(numpy.float32)
        x = _addressable(x, nd)
        r = None if opts.residual is None else _addressable(opts.residual, nd)
        w, b = _params(x, weight, bias)
        arrays = [a for a in (x, r, h, y, w, b) if a is not None]
        plan = _fused.fused_forward_plan(
            x.shape, cupy_view(x).strides, None if r is None else cupy_view(r).strides, x.dtype,
            x.dtype if r is None else r.dtype, x.dtype if h is None else h.dtype, opts.out_dtype,
            x.dtype if w is None else w.dtype, nd, rms, x.device.id,
            tuple((a.data.ptr % 16, a.itemsize) for a in arrays))
        if plan is None:
            amax = _composed(x, r, h, y, w, b, mean, rstd, eps, nd, rms, opts)
            if bits is not None:
                bits = amax.view(numpy.uint32)
        else:
            ptr = lambda a: 0 if a is None else a.data.ptr  # noqa: E731
            _fused.run_fused_forward(plan, x.data.ptr, ptr(r), ptr(h), y.data.ptr, ptr(w), ptr(b), ptr(mean),
                                     ptr(rstd), ptr(bits), eps, opts.weight_offset, opts.out_scale, _stream_ptr())
    return y, h, stat_list, None if bits is None else bits.view(numpy.float32)


def _composed(x, r, h, y, w, b, mean, rstd, eps, nd, rms, opts: FusedOptions):
    """The same outputs from the plain kernels: h summed in the accumulation dtype, the norm
    of it in that dtype (weight + offset in it too), then the output cast. Returns amax."""
    import cupy

    acc = acc_dtype(x.dtype)
    hs = x.astype(acc) if r is None else x.astype(acc) + r.astype(acc)
    if h is not None:
        h[...] = hs
    if w is not None and opts.weight_offset:
        w = w.astype(acc) + opts.weight_offset
    y_acc, m, s = _row_norm_cupy.forward(hs, w, b, eps, nd, rms, stats=rstd is not None)
    for out, got in ((mean, m), (rstd, s)):
        if out is not None:
            out[...] = got
    amax = (cupy.abs(y_acc).max() if y_acc.size else cupy.zeros((), y_acc.dtype)).astype(numpy.float32)
    if opts.out_dtype in FP8_DTYPES:  # y_acc is a fresh C-contiguous array, as y
        src = cupy.ascontiguousarray(y_acc, dtype=numpy.float32)
        _fused.run_cast_fp8(src.data.ptr, y.data.ptr, y.size, opts.out_dtype, opts.out_scale, x.device.id,
                            _stream_ptr())
    else:
        y[...] = y_acc
    return amax


def backward(dy, x, weight, mean, rstd, nd: int, rms: bool, has_bias: bool, grad_dtype, opts) -> tuple:
    """(dx in ``opts.dx_dtype``, dweight, dbias, the residual's gradient or None): one launch
    of the fused backward (plus the dW/dB partial reduction) where it serves the call, else
    the plain kernels composed."""
    import cupy

    with x.device:
        lead = x.shape[: x.ndim - nd]
        norm_shape = x.shape[x.ndim - nd:]
        if math.prod(lead) and math.prod(norm_shape):
            x, dy = _addressable(x, nd), _addressable(dy, nd)
            dh = None if opts.dh is None else cupy.ascontiguousarray(opts.dh)
            # the kernel pairs the weight with dy's dtype, as the plain kernels with x's
            w, _ = _params(dy, weight, None)
            arrays = [a for a in (dy, x, dh, w) if a is not None]
            plan = None
            if (dh is None or dh.dtype == x.dtype) and (opts.residual_dtype is None or opts.residual_dtype == x.dtype):
                plan = _fused.fused_backward_plan(
                    x.shape, cupy_view(x).strides, cupy_view(dy).strides, dy.dtype, x.dtype, opts.dx_dtype,
                    dy.dtype if w is None else w.dtype, grad_dtype, nd, rms, x.device.id,
                    tuple((a.data.ptr % 16, a.itemsize) for a in arrays))
            if plan is not None:
                dx = _empty(x.shape, opts.dx_dtype)  # fresh: 256-byte aligned like every output
                dres = None if opts.residual_dtype is None else _empty(x.shape, x.dtype)
                dw = _empty(norm_shape, grad_dtype) if weight is not None else None
                db = _empty(norm_shape, grad_dtype) if has_bias else None
                ptr = lambda a: 0 if a is None else a.data.ptr  # noqa: E731
                stat = lambda a: None if a is None else cupy.ascontiguousarray(a, dtype=numpy.float32)  # noqa: E731
                mean, rstd = stat(None if rms else mean), stat(rstd)
                _fused.run_fused_backward(plan, dy.data.ptr, x.data.ptr, ptr(dh), ptr(w), ptr(mean), rstd.data.ptr,
                                          dx.data.ptr, ptr(dres), ptr(dw), ptr(db), opts.weight_offset, _Scratch(),
                                          _stream_ptr())
                return dx, dw, db, dres
        dx, dw, db = _composed_backward(dy, x, weight, mean, rstd, nd, rms, has_bias, grad_dtype, opts)
        dres = None if opts.residual_dtype is None else dx.astype(opts.residual_dtype)
        return dx.astype(opts.dx_dtype), dw, db, dres


def _composed_backward(dy, x, weight, mean, rstd, nd: int, rms: bool, has_bias: bool, grad_dtype, opts) -> tuple:
    """(dx in the accumulation dtype, dweight, dbias) from the plain backward kernels: the
    weight offset folded into the weight (N elements; dweight = sum(dy * xhat) does not
    involve it), dy and x both in the wider of their dtypes (neither rounded to the other),
    then dh added."""
    wide = dy.dtype if dy.dtype.itemsize > x.dtype.itemsize else x.dtype
    acc = acc_dtype(wide)
    w = weight
    if weight is not None and opts.weight_offset:
        w = weight.astype(acc) + opts.weight_offset
    dy, x = dy.astype(wide, copy=False), x.astype(wide, copy=False)
    mean = None if mean is None else mean.astype(acc, copy=False)
    rstd = rstd.astype(acc, copy=False)
    dx, dw, db = _row_norm_cupy.backward(dy, x, w, mean, rstd, nd, rms, weight is not None, has_bias, grad_dtype)
    dx = dx.astype(acc)
    if opts.dh is not None:
        dx += opts.dh.astype(acc)
    return dx, dw, db
