"""JAX adapter: LayerNorm, RMSNorm and BatchNorm on cunorm's kernels, inside ``jax.jit``,
``jax.grad`` and ``jax.vmap``.

    import cunorm.jax as cj
    y = cj.layer_norm(x, weight, bias)            # eager or under jit
    g = jax.grad(lambda w: cj.rms_norm(x, w).sum())(w)

The ops go through ``jax.experimental.buffer_callback``: on a GPU our kernels run on XLA's
stream and read XLA's buffers in place (zero copy); on the CPU the float64 NumPy reference
fills the outputs, so the same wiring works without a GPU. Gradients come from
``jax.custom_vjp`` whose backward runs the backward kernels. Under ``vmap`` a batched input
is more rows for the same launch (see ``_callbacks`` for batched parameters).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy

from .. import _checks
from ..ops import _row_norm
from . import _callbacks, _fused, _jvp
from ._args import as_array
from ._batch_norm import batch_norm

__all__ = ["batch_norm", "layer_norm", "rms_norm"]


def _acc(dtype) -> numpy.dtype:
    return _checks.acc_dtype(numpy.dtype(dtype))


_FUSED_DOC = """

    Keyword options (the CuPy API's, default off): ``residual=r`` normalizes h = x + r and
    returns ``(y, h)``, h in ``residual_dtype`` (default r's); ``weight_offset=c`` uses
    weight + c in float32; ``out_dtype`` writes y in another float dtype, FP8
    (``jnp.float8_e4m3fn`` / ``jnp.float8_e5m2``) scaled by ``out_scale`` with saturation;
    ``return_amax=True`` appends max |y| before the scale. Outputs: y, h, amax, each when
    asked for. The fused kernels where they serve the call, else composed (``_fused``)."""


def layer_norm(x, weight=None, bias=None, eps=1e-5, *, normalized_ndim=1, residual=None, residual_dtype=None,
               weight_offset=0.0, out_dtype=None, out_scale=None, return_amax=False):
    x, weight, bias = as_array("x", x), as_array("weight", weight), as_array("bias", bias)
    _checks.float_dtype("x", x)
    nd = _checks.normalized_ndim(x, normalized_ndim)
    _checks.param("weight", weight, x, nd)
    _checks.param("bias", bias, x, nd)
    eps = _checks.eps(eps, x.dtype)
    opts = _fused.options(x, weight, as_array("residual", residual), residual_dtype, weight_offset, out_dtype,
                          out_scale, return_amax)
    if opts is not None:
        return _fused.apply(lambda h, w, b: _apply(h, w, b, eps, nd, False), x, weight, bias, opts, eps, nd, False)
    return _apply(x, weight, bias, eps, nd, False)


def rms_norm(x, weight=None, eps=None, *, normalized_ndim=1, residual=None, residual_dtype=None, weight_offset=0.0,
             out_dtype=None, out_scale=None, return_amax=False):
    x, weight = as_array("x", x), as_array("weight", weight)
    _checks.float_dtype("x", x)
    nd = _checks.normalized_ndim(x, normalized_ndim)
    _checks.param("weight", weight, x, nd)
    eps = _checks.eps(eps, x.dtype, default_to_finfo=True)
    opts = _fused.options(x, weight, as_array("residual", residual), residual_dtype, weight_offset, out_dtype,
                          out_scale, return_amax)
    if opts is not None:
        return _fused.apply(lambda h, w, b: _apply(h, w, None, eps, nd, True), x, weight, None, opts, eps, nd, True)
    return _apply(x, weight, None, eps, nd, True)


layer_norm.__doc__ = ("""Layer normalization over the last ``normalized_ndim`` axes of ``x`` (a JAX array);
    ``weight``/``bias`` of shape ``x.shape[-normalized_ndim:]``, any float dtype. Returns y
    with x's shape and dtype.""" + _FUSED_DOC)
rms_norm.__doc__ = ("""RMS normalization over the last ``normalized_ndim`` axes of ``x``; ``eps=None`` is
    the machine epsilon of the computation dtype, float32's for half and float32 x, float64's for
    float64 (as ``torch.nn.functional.rms_norm`` computes it).""" + _FUSED_DOC)


def _apply(x, weight, bias, eps: float, nd: int, rms: bool):
    if math.prod(x.shape) == 0:  # nothing to normalize (an empty row has no statistics)
        return jnp.zeros_like(x)
    pdt = _row_norm.param_dtype(x.dtype, None if weight is None else weight.dtype,
                                None if bias is None else bias.dtype)
    # parameters in a compiled dtype; JAX differentiates through the cast
    weight = None if weight is None else weight.astype(pdt)
    bias = None if bias is None else bias.astype(pdt)
    return _norm(x, weight, bias, eps, nd, rms)


def _forward_kernels(x, weight, bias, eps, nd, rms):
    """(y, stats): stats = (rstd,) for RMSNorm, (mean, rstd) for LayerNorm, one per row."""
    lead = x.shape[: x.ndim - nd]
    acc = _acc(x.dtype)
    pdt = numpy.dtype(x.dtype if weight is None and bias is None else (weight if weight is not None else bias).dtype)
    scratch = _callbacks.scratch_bytes_forward(tuple(x.shape), numpy.dtype(x.dtype), pdt, nd, rms, eps)
    shapes = ([jax.ShapeDtypeStruct(x.shape, x.dtype)] + [jax.ShapeDtypeStruct(lead, acc)] * (1 if rms else 2)
              + [jax.ShapeDtypeStruct((scratch,), jnp.uint8)])
    call = _callbacks.callback_op(_callbacks.forward(tuple(x.shape), numpy.dtype(x.dtype), nd, rms, eps), shapes)
    outs = call(x, weight, bias)
    return outs[0], tuple(outs[1:-1])


def _backward_kernels(dy, x, weight, stats, nd, rms, has_bias):
    norm_shape = x.shape[x.ndim - nd:]
    gdt = numpy.dtype(x.dtype if weight is None else weight.dtype)
    scratch = _callbacks.scratch_bytes_backward(tuple(x.shape), numpy.dtype(x.dtype), gdt, nd, rms,
                                                weight is not None, has_bias)
    shapes = ([jax.ShapeDtypeStruct(x.shape, x.dtype)]
              + [jax.ShapeDtypeStruct(norm_shape, gdt)] * ((weight is not None) + has_bias)
              + [jax.ShapeDtypeStruct((scratch,), jnp.uint8)])
    call = _callbacks.callback_op(_callbacks.backward(tuple(x.shape), numpy.dtype(x.dtype), nd, rms,
                                                      weight is not None, has_bias), shapes)
    outs = call(dy, x, weight, *stats)
    dx = outs[0]
    grads = iter(outs[1:-1])
    dw = next(grads) if weight is not None else None
    db = next(grads) if has_bias else None
    return dx, dw, db


# the kernel calls with forward-mode rules in jax.numpy, for derivatives of the gradient
_forward = _jvp.with_jnp_tangents(_forward_kernels, _jvp.forward, 3, 3)
_backward = _jvp.with_jnp_tangents(_backward_kernels, _jvp.backward, 4, 3)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _norm(x, weight, bias, eps, nd, rms):
    return _forward(x, weight, bias, eps, nd, rms)[0]


def _norm_fwd(x, weight, bias, eps, nd, rms):
    y, stats = _forward(x, weight, bias, eps, nd, rms)
    return y, (x, weight, bias, stats)


def _norm_bwd(eps, nd, rms, residuals, dy):
    x, weight, bias, stats = residuals
    dx, dw, db = _backward(dy, x, weight, stats, nd, rms, bias is not None)
    # the kernels write both gradients in weight's dtype (x's without one)
    return dx, None if dw is None else dw.astype(weight.dtype), None if db is None else db.astype(bias.dtype)


_norm.defvjp(_norm_fwd, _norm_bwd)
