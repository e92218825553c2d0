"""The CuPy frontend of the row norms: CuPy arrays in (validated), CuPy arrays out, on CuPy's
current stream and x's device. Copies what the kernels cannot address in place, casts
parameters to a compiled dtype, allocates from CuPy's pool."""
from __future__ import annotations

import math

import numpy

from .._checks import acc_dtype
from .._launch import cupy_view, rows_of
from . import _row_norm

# Tests set this to NaN-fill every buffer allocated here, so an element a kernel forgot to
# write shows up as NaN instead of as stale memory that happens to look right.
POISON_OUTPUTS = False


def _empty(shape, dtype):
    import cupy

    out = cupy.empty(shape, dtype)
    if POISON_OUTPUTS:  # FP8 outputs are uint8 bit patterns: 0x7f is NaN in e4m3 and e5m2
        out.fill(numpy.nan if out.dtype.kind == "f" else 0x7F)
    return out


class _Scratch:
    """Scratch buffers for one call: CuPy arrays kept until the call returns (CuPy's pool
    reuses freed memory in stream order, so the launches queued before that are safe)."""

    def __init__(self):
        self.keep = []

    def __call__(self, shape, dtype) -> int:
        a = _empty(shape, dtype)
        self.keep.append(a)
        return a.data.ptr


def _addressable(a, nd):
    """``a``, or a C-contiguous copy when the kernels cannot address its rows in place."""
    import cupy

    return a if rows_of(cupy_view(a), nd) is not None else cupy.ascontiguousarray(a)


def _params(x, weight, bias):
    """The parameters contiguous in the dtype the kernels read (a copy only where needed:
    ``ascontiguousarray`` costs microseconds even when it copies nothing)."""
    import cupy

    wdt = _row_norm.param_dtype(x.dtype, None if weight is None else weight.dtype,
                                None if bias is None else bias.dtype)
    return [p if p is None or (p.dtype == wdt and p.flags.c_contiguous) else cupy.ascontiguousarray(p, dtype=wdt)
            for p in (weight, bias)]


def _stream_ptr() -> int:
    import cupy

    return cupy.cuda.get_current_stream().ptr


def forward(x, weight, bias, eps: float, nd: int, rms: bool, stats: bool = True):
    """(y, mean or None, rstd or None): y C-contiguous in x's dtype, statistics (when
    ``stats``; no mean for rms) of shape x.shape[:-nd] in float32 (float64 for float64 x).
    Without ``stats`` the kernels skip writing them."""
    with x.device:
        lead = x.shape[: x.ndim - nd]
        acc = acc_dtype(x.dtype)
        y = _empty(x.shape, x.dtype)
        mean = None if rms or not stats else _empty(lead, acc)
        rstd = _empty(lead, acc) if stats else None
        if math.prod(lead) == 0:
            return y, mean, rstd
        if math.prod(x.shape[x.ndim - nd:]) == 0:  # statistics of an empty row are undefined
            for s in (mean, rstd):
                if s is not None:
                    s.fill(numpy.nan)
            return y, mean, rstd
        x = _addressable(x, nd)
        w, b = _params(x, weight, bias)
        _row_norm.forward(cupy_view(x), cupy_view(w), cupy_view(b), y.data.ptr, 0 if mean is None else mean.data.ptr,
                          0 if rstd is None else rstd.data.ptr, eps, nd, rms, _Scratch(), _stream_ptr(), x.device.id)
    return y, mean, rstd


def backward(dy, x, weight, mean, rstd, nd: int, rms: bool, need_dw: bool, need_db: bool, grad_dtype):
    """(dx, dweight or None, dbias or None): dx C-contiguous in x's dtype, the parameter
    gradients of shape x.shape[-nd:] in ``grad_dtype``."""
    import cupy

    with x.device:
        norm_shape = x.shape[x.ndim - nd:]
        dx = _empty(x.shape, x.dtype)
        dw = _empty(norm_shape, grad_dtype) if need_dw else None
        db = _empty(norm_shape, grad_dtype) if need_db else None
        if math.prod(x.shape[: x.ndim - nd]) == 0 or math.prod(norm_shape) == 0:
            for g in (dw, db):  # a sum over no rows is zero
                if g is not None:
                    g.fill(0)
            return dx, dw, db
        x, dy = _addressable(x, nd), _addressable(dy, nd)
        w, _ = _params(x, weight, None)
        mean = None if rms else cupy.ascontiguousarray(mean)
        rstd = cupy.ascontiguousarray(rstd)
        _row_norm.backward(cupy_view(dy), cupy_view(x), cupy_view(w), cupy_view(mean), cupy_view(rstd),
                           dx.data.ptr, 0 if dw is None else dw.data.ptr, 0 if db is None else db.data.ptr,
                           grad_dtype, nd, rms, _Scratch(), _stream_ptr(), x.device.id)
    return dx, dw, db
