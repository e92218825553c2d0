"""The fused options of layer_norm and rms_norm (issue 7): their argument checks, the NumPy
path (the references) and the CuPy path (kernels/layer_norm_fused.cu where it serves the
call, else the plain kernels composed with CuPy element-wise work — slower, same results).

Outputs, in order: y (``out_dtype``), h = x + residual (``residual_dtype``; with a residual),
then mean (LayerNorm) and rstd with ``return_stats``, then amax (a 0-d float32 array: max |y|
before ``out_scale``) with ``return_amax``.
"""
from __future__ import annotations

import math
import numbers
from typing import NamedTuple, Optional

import numpy

from .. import _checks, reference

try:
    import ml_dtypes

    FP8_DTYPES = (numpy.dtype(ml_dtypes.float8_e4m3fn), numpy.dtype(ml_dtypes.float8_e5m2))
except ImportError:  # pragma: no cover - ml_dtypes is a declared dependency
    FP8_DTYPES = ()


class FusedOptions(NamedTuple):
    residual: object
    residual_dtype: Optional[numpy.dtype]
    weight_offset: float
    out_dtype: numpy.dtype
    out_scale: float
    return_amax: bool


def options(x, weight, residual, residual_dtype, weight_offset, out_dtype, out_scale,
            return_amax) -> FusedOptions | None:
    """The checked options, or None when none is set (the plain path serves the call)."""
    if (residual is None and residual_dtype is None and not weight_offset and out_dtype is None
            and out_scale is None and not return_amax):
        return None
    if residual is not None:
        _checks.float_dtype("residual", residual)
        if tuple(residual.shape) != tuple(x.shape):
            raise ValueError(f"residual: shape {tuple(residual.shape)} does not match x's {tuple(x.shape)}")
        residual_dtype = residual.dtype if residual_dtype is None else _float_dtype("residual_dtype", residual_dtype)
    elif residual_dtype is not None:
        raise ValueError("residual_dtype: given without a residual")
    if isinstance(weight_offset, bool) or not isinstance(weight_offset, numbers.Real) \
            or not math.isfinite(weight_offset):
        raise TypeError(f"weight_offset: expected a finite real number, got {weight_offset!r}")
    if weight_offset and weight is None:
        raise ValueError("weight_offset: needs a weight")
    out = x.dtype if out_dtype is None else numpy.dtype(out_dtype)
    fp8 = out in FP8_DTYPES
    if not fp8:
        out = _float_dtype("out_dtype", out)
    if out_scale is not None:
        if not fp8:
            raise ValueError("out_scale: applies to an FP8 out_dtype only")
        if isinstance(out_scale, bool) or not isinstance(out_scale, numbers.Real) \
                or not (math.isfinite(out_scale) and out_scale > 0):
            raise ValueError(f"out_scale: expected a finite number > 0, got {out_scale!r}")
    if return_amax and not fp8:
        raise ValueError("return_amax: applies to an FP8 out_dtype only")
    return FusedOptions(residual, residual_dtype, float(weight_offset), out,
                        1.0 if out_scale is None else float(out_scale), bool(return_amax))


def _float_dtype(name: str, dtype) -> numpy.dtype:
    d = numpy.dtype(dtype)
    if d not in _checks.FLOAT_DTYPES:
        raise TypeError(f"{name}: {d} is not supported (float16, bfloat16, float32, float64, or for "
                        "out_dtype float8_e4m3fn / float8_e5m2)")
    return d


def _cast_out(y, opts: FusedOptions):
    """y (float64, NumPy) in the output dtype: FP8 scaled with saturation; the amax."""
    amax = numpy.abs(y).max() if y.size else numpy.zeros((), y.dtype)
    if opts.out_dtype in FP8_DTYPES:
        top = float(_checks.ml_finfo(opts.out_dtype).max)
        y = numpy.clip(y * opts.out_scale, -top, top)
    return y.astype(opts.out_dtype), amax.astype(numpy.float32)


def numpy_forward(x, weight, bias, eps: float, nd: int, rms: bool, opts: FusedOptions) -> tuple:
    """The outputs (module doc) from the float64 references."""
    kw = dict(normalized_ndim=nd, return_stats=True, residual=opts.residual, weight_offset=opts.weight_offset)
    out = (reference.rms_norm(x, weight, eps, **kw) if rms else reference.layer_norm(x, weight, bias, eps, **kw))
    y, rest = out[0], list(out[1:])
    h = rest.pop(0).astype(opts.residual_dtype) if opts.residual is not None else None
    acc = _checks.acc_dtype(x.dtype)
    stats = [s.astype(acc) for s in rest]
    y, amax = _cast_out(y, opts)
    return y, h, stats, amax


def run(kind: str, x, weight, bias, eps: float, nd: int, rms: bool, return_stats: bool, opts: FusedOptions):
    """The call's outputs (module doc) on its backend ('numpy' or 'cupy')."""
    if kind == "numpy":
        y, h, stats, amax = numpy_forward(x, weight, bias, eps, nd, rms, opts)
    else:
        from . import _fused_cupy

        y, h, stats, amax = _fused_cupy.forward(x, weight, bias, eps, nd, rms, return_stats, opts)
    return _outputs(y, h, stats, amax, return_stats, opts)


def _outputs(y, h, stats, amax, return_stats: bool, opts: FusedOptions):
    out = (y,) + ((h,) if opts.residual is not None else ())
    out += tuple(stats) if return_stats else ()
    out += (amax,) if opts.return_amax else ()
    return out if len(out) > 1 else y


# ---- backward --------------------------------------------------------------------------------
# With a residual the caller passes the forward's h as ``x`` and, as ``dh``, the gradient of
# the h output from the next layer; dx (= dh + the norm's gradient) is then the gradient of
# both x and the residual: ``residual_dtype`` appends it again in the residual's dtype, and
# ``dx_dtype`` gives dx x's own dtype where h had another.

class FusedGradOptions(NamedTuple):
    dh: object
    weight_offset: float
    dx_dtype: numpy.dtype
    residual_dtype: Optional[numpy.dtype]


def grad_options(dy, x, weight, dh, weight_offset, dx_dtype, residual_dtype) -> FusedGradOptions | None:
    """The checked backward options, or None when none is set (the plain backward)."""
    if dh is None and not weight_offset and dx_dtype is None and residual_dtype is None:
        return None
    _checks.float_dtype("dy", dy)
    if tuple(dy.shape) != tuple(x.shape):
        raise ValueError(f"dy: shape {tuple(dy.shape)} does not match x's {tuple(x.shape)}")
    if dh is not None:
        _checks.float_dtype("dh", dh)
        if tuple(dh.shape) != tuple(x.shape):
            raise ValueError(f"dh: shape {tuple(dh.shape)} does not match x's {tuple(x.shape)}")
    if isinstance(weight_offset, bool) or not isinstance(weight_offset, numbers.Real) \
            or not math.isfinite(weight_offset):
        raise TypeError(f"weight_offset: expected a finite real number, got {weight_offset!r}")
    if weight_offset and weight is None:
        raise ValueError("weight_offset: needs a weight")
    return FusedGradOptions(dh, float(weight_offset),
                            x.dtype if dx_dtype is None else _float_dtype("dx_dtype", dx_dtype),
                            None if residual_dtype is None else _float_dtype("residual_dtype", residual_dtype))


def run_backward(kind: str, dy, x, weight, mean, rstd, nd: int, rms: bool, has_bias: bool, opts: FusedGradOptions):
    """(dx, dweight, dbias[, dresidual]) for LayerNorm, (dx, dweight[, dresidual]) for RMSNorm."""
    grad_dtype = x.dtype if weight is None else weight.dtype
    if kind == "numpy":
        dx, dw, db = reference.layer_norm_backward(dy, x, weight, mean, rstd, normalized_ndim=nd,
                                                   has_bias=has_bias and not rms, dh=opts.dh,
                                                   weight_offset=opts.weight_offset, _rms=rms)
        dw = None if dw is None else dw.astype(grad_dtype)
        db = None if db is None else db.astype(grad_dtype)
        dres = None if opts.residual_dtype is None else dx.astype(opts.residual_dtype)
        dx = dx.astype(opts.dx_dtype)
    else:
        from . import _fused_cupy

        dx, dw, db, dres = _fused_cupy.backward(dy, x, weight, mean, rstd, nd, rms, has_bias and not rms, grad_dtype,
                                                opts)
    return (dx, dw) + (() if rms else (db,)) + (() if dres is None else (dres,))
