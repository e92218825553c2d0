"""Flax NNX modules on cunorm's kernels: ``LayerNorm``, ``RMSNorm`` and ``BatchNorm``.

    from cunorm.jax.nnx import LayerNorm, RMSNorm, BatchNorm
    norm = LayerNorm(768, rngs=nnx.Rngs(0))     # flax.nnx.LayerNorm's constructor

They subclass ``flax.nnx.LayerNorm`` / ``flax.nnx.RMSNorm`` / ``flax.nnx.BatchNorm``: same
constructor, same parameters (``scale``, ``bias``) and state (BatchNorm's ``mean`` / ``var``,
updated as Flax updates them: ``momentum`` the old value's weight, the batch's biased
variance), so a checkpoint or an ``nnx.state`` carries over either way, and dtype promotion
follows Flax (``dtype=None`` computes in the promoted dtype of the input and the parameters;
``dtype=jnp.bfloat16`` keeps bf16 activations and parameters). The kernels serve
normalization over the last axis (``reduction_axes`` and ``feature_axes`` -1, Flax's default;
BatchNorm: one feature ``axis``, 1 or -1, of 2-5 dimensional inputs) without ``axis_name`` or
``mask``; any other configuration runs Flax's own implementation, unchanged.
"""
from __future__ import annotations

import jax as _jax
import jax.numpy as _jnp

try:
    from flax import nnx as _flax_nnx
except ImportError as err:  # pragma: no cover - exercised where flax is absent
    raise ImportError("cunorm.jax.nnx needs Flax (pip install flax)") from err

from . import batch_norm as _batch_norm
from . import layer_norm as _layer_norm
from . import rms_norm as _rms_norm

__all__ = ["BatchNorm", "LayerNorm", "RMSNorm"]


def _last_axis_only(module, x) -> bool:
    """Whether ``module``'s configuration is the one the kernels serve for input ``x``."""
    last = (x.ndim - 1,)

    def axes(a):
        return tuple(sorted(i % x.ndim for i in ((a,) if isinstance(a, int) else a)))

    return (x.ndim >= 1 and axes(module.reduction_axes) == last and axes(module.feature_axes) == last
            and module.axis_name is None)


class LayerNorm(_flax_nnx.LayerNorm):
    """``flax.nnx.LayerNorm`` with cunorm's LayerNorm kernels (see the module docstring)."""

    def __call__(self, x, *, mask=None):
        if mask is not None or not _last_axis_only(self, x):
            return super().__call__(x, mask=mask)
        scale = self.scale[...] if self.scale else None
        bias = self.bias[...] if self.bias else None
        x, scale, bias = self.promote_dtype((x, scale, bias), dtype=self.dtype)
        return _layer_norm(x, scale, bias, eps=self.epsilon)


class RMSNorm(_flax_nnx.RMSNorm):
    """``flax.nnx.RMSNorm`` with cunorm's RMSNorm kernels (see the module docstring)."""

    def __call__(self, x, mask=None):
        if mask is not None or not _last_axis_only(self, x):
            return super().__call__(x, mask=mask)
        scale = self.scale[...] if self.scale else None
        x, scale = self.promote_dtype((x, scale), dtype=self.dtype)
        return _rms_norm(x, scale, eps=self.epsilon)


class BatchNorm(_flax_nnx.BatchNorm):
    """``flax.nnx.BatchNorm`` with cunorm's BatchNorm kernels (see the module docstring). The
    batch's variance for the running update is recovered from the kernels' rstd (1 / rstd^2 -
    epsilon: float32 rounding of var + epsilon, about 1e-7 of it)."""

    def __call__(self, x, use_running_average=None, *, mask=None):
        use_ra = self.use_running_average if use_running_average is None else use_running_average
        axis = _channel_axis(self.axis, x)
        if use_ra is None or mask is not None or self.axis_name is not None or axis is None:
            return super().__call__(x, use_running_average, mask=mask)
        scale = self.scale[...] if self.scale is not None else None
        bias = self.bias[...] if self.bias is not None else None
        x, mean, var, scale, bias = self.promote_dtype((x, self.mean[...], self.var[...], scale, bias),
                                                       dtype=self.dtype)
        if use_ra:
            return _batch_norm(x, scale, bias, mean, var, training=False, eps=self.epsilon, channel_axis=axis)
        y, batch_mean, rstd = _batch_norm(x, scale, bias, eps=self.epsilon, channel_axis=axis, return_stats=True)
        batch_var = _jnp.maximum(1 / _jnp.square(rstd) - self.epsilon, 0)
        stop = _jax.lax.stop_gradient if (self.mean._can_update or self.var._can_update) else (lambda v: v)
        self.mean[...] = stop(self.momentum * self.mean[...] + (1 - self.momentum) * batch_mean.astype(mean.dtype))
        self.var[...] = stop(self.momentum * self.var[...] + (1 - self.momentum) * batch_var.astype(var.dtype))
        return y


def _channel_axis(axis, x):
    """BatchNorm's feature axis as the kernels' channel_axis (1 or -1), or None where they do
    not serve it (several feature axes, another one, or x outside 2-5 dimensions)."""
    if not 2 <= x.ndim <= 5:
        return None
    axes = {a % x.ndim for a in ((axis,) if isinstance(axis, int) else tuple(axis))}
    if axes == {x.ndim - 1}:
        return -1
    return 1 if axes == {1} else None
