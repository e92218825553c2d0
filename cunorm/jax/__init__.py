"""JAX adapter: LayerNorm and RMSNorm on cunorm's kernels, inside ``jax.jit``, ``jax.grad``
and ``jax.vmap``.

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
from jax.experimental.buffer_callback import buffer_callback

from .. import _checks
from ..ops import _row_norm
from . import _callbacks

__all__ = ["layer_norm", "rms_norm"]


def _as_array(name: str, a):
    if a is None:
        return None
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
        try:
            a = jnp.asarray(a)
        except TypeError:
            raise TypeError(f"{name}: expected a JAX array, got {type(a).__name__}") from None
    return a


def _acc(dtype) -> numpy.dtype:
    return _checks.acc_dtype(numpy.dtype(dtype))


def layer_norm(x, weight=None, bias=None, eps=1e-5, *, normalized_ndim=1):
    """Layer normalization over the last ``normalized_ndim`` axes of ``x`` (a JAX array);
    ``weight``/``bias`` of shape ``x.shape[-normalized_ndim:]``, any float dtype. Returns y
    with x's shape and dtype."""
    x, weight, bias = _as_array("x", x), _as_array("weight", weight), _as_array("bias", bias)
    _checks.float_dtype("x", x)
    nd = _checks.normalized_ndim(x, normalized_ndim)
    _checks.param("weight", weight, x, nd)
    _checks.param("bias", bias, x, nd)
    return _apply(x, weight, bias, _checks.eps(eps, x.dtype), nd, False)


def rms_norm(x, weight=None, eps=None, *, normalized_ndim=1):
    """RMS normalization over the last ``normalized_ndim`` axes of ``x``; ``eps=None`` is
    the machine epsilon of x's dtype (as ``torch.nn.functional.rms_norm``)."""
    x, weight = _as_array("x", x), _as_array("weight", weight)
    _checks.float_dtype("x", x)
    nd = _checks.normalized_ndim(x, normalized_ndim)
    _checks.param("weight", weight, x, nd)
    return _apply(x, weight, None, _checks.eps(eps, x.dtype, default_to_finfo=True), nd, True)


def _apply(x, weight, bias, eps: float, nd: int, rms: bool):
    if math.prod(x.shape) == 0:  # nothing to normalize (an empty row has no statistics)
        return jnp.zeros_like(x)
    pdt = _row_norm.param_dtype(x.dtype, None if weight is None else weight.dtype,
                                None if bias is None else bias.dtype)
    # parameters in a compiled dtype; JAX differentiates through the cast
    weight = None if weight is None else weight.astype(pdt)
    bias = None if bias is None else bias.astype(pdt)
    return _norm(x, weight, bias, eps, nd, rms)


def _forward(x, weight, bias, eps, nd, rms):
    """(y, stats): stats = (rstd,) for RMSNorm, (mean, rstd) for LayerNorm, one per row."""
    lead = x.shape[: x.ndim - nd]
    acc = _acc(x.dtype)
    pdt = numpy.dtype(x.dtype if weight is None and bias is None else (weight if weight is not None else bias).dtype)
    scratch = _callbacks.scratch_bytes_forward(tuple(x.shape), numpy.dtype(x.dtype), pdt, nd, rms, eps)
    shapes = ([jax.ShapeDtypeStruct(x.shape, x.dtype)] + [jax.ShapeDtypeStruct(lead, acc)] * (1 if rms else 2)
              + [jax.ShapeDtypeStruct((scratch,), jnp.uint8)])
    call = buffer_callback(_callbacks.forward(tuple(x.shape), numpy.dtype(x.dtype), nd, rms, eps), shapes,
                           vmap_method="expand_dims")
    outs = call(x, weight, bias)
    return outs[0], tuple(outs[1:-1])


def _backward(dy, x, weight, stats, nd, rms, has_bias):
    norm_shape = x.shape[x.ndim - nd:]
    gdt = numpy.dtype(x.dtype if weight is None else weight.dtype)
    scratch = _callbacks.scratch_bytes_backward(tuple(x.shape), numpy.dtype(x.dtype), gdt, nd, rms,
                                                weight is not None, has_bias)
    shapes = ([jax.ShapeDtypeStruct(x.shape, x.dtype)]
              + [jax.ShapeDtypeStruct(norm_shape, gdt)] * ((weight is not None) + has_bias)
              + [jax.ShapeDtypeStruct((scratch,), jnp.uint8)])
    call = buffer_callback(_callbacks.backward(tuple(x.shape), numpy.dtype(x.dtype), nd, rms, weight is not None,
                                               has_bias), shapes, vmap_method="expand_dims")
    outs = call(dy, x, weight, *stats)
    dx = outs[0]
    grads = iter(outs[1:-1])
    dw = next(grads) if weight is not None else None
    db = next(grads) if has_bias else None
    return dx, dw, db


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
