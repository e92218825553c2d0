"""The fused options (issue 7) from JAX: residual add, weight offset, output dtype, FP8 with
scale and amax — the same keywords and outputs as the CuPy API.

The fused kernels (``_fused_kernel``: one pass over x, r, y and h forward, over h, dy, dh,
dx and dr backward) where they serve the call; otherwise composed in JAX around cunorm's
norm kernels: h = x + residual and weight + offset in the accumulation dtype, the norm of
h, then the output cast (FP8: scaled, clipped to the format's range).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy

from .. import _checks
from ..ops import _fused_api, _row_norm
from . import _fused_kernel


def options(x, weight, residual, residual_dtype, weight_offset, out_dtype, out_scale, return_amax):
    """The checked options, or None when none is set (the plain call)."""
    if (residual is None and residual_dtype is None and not weight_offset and out_dtype is None
            and out_scale is None and not return_amax):
        return None
    return _fused_api.options(x, weight, residual, residual_dtype, weight_offset, out_dtype, out_scale, return_amax)


def apply(norm, x, weight, bias, opts, eps: float, nd: int, rms: bool):
    """y, then h with a residual, then amax with return_amax: through the fused kernels where
    they serve the call (``_fused_kernel``), else composed around ``norm(h, weight, bias)``,
    the plain op (its eps and normalized_ndim bound)."""
    x_dtype = numpy.dtype(x.dtype)
    r = opts.residual
    cfg = _fused_kernel.Config(float(eps), nd, rms, x_dtype, None if r is None else numpy.dtype(r.dtype),
                               None if r is None else numpy.dtype(opts.residual_dtype), float(opts.weight_offset),
                               numpy.dtype(opts.out_dtype))
    pdt = _row_norm.param_dtype(x_dtype, None if weight is None else weight.dtype,
                                None if bias is None else bias.dtype)
    w, b = (None if p is None else p.astype(pdt) for p in (weight, bias))  # JAX differentiates the cast
    if _fused_kernel.serves(x, r, w, b, cfg):
        y, h = _fused_kernel.fused_norm(x, r, w, b, cfg)
        return (y, h) if r is not None else y
    return _composed(norm, x, weight, bias, opts)


def _composed(norm, x, weight, bias, opts):
    acc = _checks.acc_dtype(numpy.dtype(x.dtype))
    h = x.astype(acc) if opts.residual is None else x.astype(acc) + opts.residual.astype(acc)
    w = weight
    if weight is not None and opts.weight_offset:
        w = weight.astype(acc) + opts.weight_offset
    y = norm(h, w, bias)
    amax = jnp.max(jnp.abs(y)).astype(jnp.float32) if y.size else jnp.zeros((), jnp.float32)
    if opts.out_dtype in _fused_api.FP8_DTYPES:
        top = float(_checks.ml_finfo(opts.out_dtype).max)
        y = jnp.clip(y.astype(jnp.float32) * opts.out_scale, -top, top)
    out = (y.astype(opts.out_dtype),)
    out += (h.astype(opts.residual_dtype),) if opts.residual is not None else ()
    out += (amax,) if opts.return_amax else ()
    return out if len(out) > 1 else out[0]
