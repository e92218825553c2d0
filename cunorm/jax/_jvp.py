"""Forward-mode rules for the norm's kernel calls, so that derivatives of the gradient work:
``jax.hessian``, Hessian-vector products (``jax.jvp`` of ``jax.grad``) and gradients of a
gradient (gradient penalties).

The kernels run through buffer callbacks, which JAX cannot differentiate; the first
derivative comes from the custom_vjp in ``cunorm.jax``. Differentiating that gradient once
more differentiates the forward call (its statistics feed the backward) and the backward
call. Each is a ``jax.custom_jvp`` here: its value comes from the kernels, its tangent from
the same function written in ``jax.numpy`` (``forward`` / ``backward``) on the same inputs.
The backward takes the forward's statistics as inputs, and its ``jax.numpy`` form is exact
for any statistics consistent with x, so the chain rule through the statistics' own tangents
gives the true second derivative. First-order calls never evaluate a tangent: ``jax.grad``
alone runs the kernels as before, and an eager call outside any transformation calls them
directly.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy

from .. import _checks

try:
    from jax.core import Tracer
except ImportError:  # a JAX that no longer exports it
    from jax._src.core import Tracer


def with_jnp_tangents(kernels, jnp_form, n_diff: int, n_static: int):
    """``kernels`` as a custom_jvp whose tangent is ``jnp_form``'s: both take ``n_diff``
    differentiable arguments, then ``n_static`` static ones, and return the same structure,
    shapes and dtypes."""
    call = jax.custom_jvp(kernels, nondiff_argnums=tuple(range(n_diff, n_diff + n_static)))

    def rule(*args):
        static, (primals, tangents) = args[:n_static], args[n_static:]
        _, tangents_out = jax.jvp(lambda *p: jnp_form(*p, *static), primals, tangents)
        return call(*primals, *static), tangents_out

    call.defjvp(rule)

    def dispatch(*args):
        # concrete arrays (an eager call outside any transformation) can never be
        # differentiated later, and the custom_jvp's dispatch added ~0.5 ms to an eager
        # forward of ~0.8 ms (CPU JAX, 2 cores, float32 (4, 64))
        if any(isinstance(a, Tracer) for a in jax.tree.leaves(args[:n_diff])):
            return call(*args)
        return kernels(*args)

    return dispatch


def _axes(x, nd: int) -> tuple:
    return tuple(range(x.ndim - nd, x.ndim))


def forward(x, weight, bias, eps: float, nd: int, rms: bool):
    """The kernels' forward in jax.numpy: (y, stats), stats (rstd,) for RMSNorm and
    (mean, rstd) for LayerNorm, one per row in the accumulation dtype."""
    acc = _checks.acc_dtype(numpy.dtype(x.dtype))
    axes = _axes(x, nd)
    xa = x.astype(acc)
    if rms:
        rstd = jax.lax.rsqrt(jnp.mean(xa * xa, axis=axes) + jnp.asarray(eps, acc))
        xhat = xa * _expand(rstd, nd)
    else:
        mean = jnp.mean(xa, axis=axes)
        centred = xa - _expand(mean, nd)
        rstd = jax.lax.rsqrt(jnp.mean(centred * centred, axis=axes) + jnp.asarray(eps, acc))
        xhat = centred * _expand(rstd, nd)
    y = xhat if weight is None else xhat * weight.astype(acc)
    y = y if bias is None else y + bias.astype(acc)
    return y.astype(x.dtype), ((rstd,) if rms else (mean, rstd))


def backward(dy, x, weight, stats, nd: int, rms: bool, has_bias: bool):
    """The kernels' backward in jax.numpy, from the forward's statistics: (dx, dweight, dbias),
    None where there is no such parameter; the parameters' gradients in weight's dtype (x's
    without one), as the kernels write them."""
    acc = _checks.acc_dtype(numpy.dtype(x.dtype))
    axes = _axes(x, nd)
    lead = tuple(range(x.ndim - nd))
    rstd = _expand(stats[-1], nd)
    xa = x.astype(acc)
    xhat = (xa if rms else xa - _expand(stats[0], nd)) * rstd
    dya = dy.astype(acc)
    g = dya if weight is None else dya * weight.astype(acc)
    # d/dx of (x - mean) * rstd against g: rstd * (g - mean(g) - xhat * mean(g * xhat)),
    # exact for any eps (RMSNorm has no mean term)
    proj = xhat * _expand(jnp.mean(g * xhat, axis=axes), nd)
    dx = rstd * (g - proj if rms else g - _expand(jnp.mean(g, axis=axes), nd) - proj)
    gdt = x.dtype if weight is None else weight.dtype
    dweight = None if weight is None else jnp.sum(dya * xhat, axis=lead).astype(gdt)
    dbias = jnp.sum(dya, axis=lead).astype(gdt) if has_bias else None
    return dx.astype(x.dtype), dweight, dbias


def _expand(row_values, nd: int):
    """One value per row, broadcast over the row's nd axes."""
    return row_values.reshape(row_values.shape + (1,) * nd)
