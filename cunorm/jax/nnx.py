"""Flax NNX modules on cunorm's kernels: ``LayerNorm`` and ``RMSNorm``.

    from cunorm.jax.nnx import LayerNorm, RMSNorm
    norm = LayerNorm(768, rngs=nnx.Rngs(0))     # flax.nnx.LayerNorm's constructor

They subclass ``flax.nnx.LayerNorm`` / ``flax.nnx.RMSNorm``: same constructor, same
parameters (``scale``, ``bias``) and state, so a checkpoint or an ``nnx.state`` carries over
either way, and dtype promotion follows Flax (``dtype=None`` computes in the promoted dtype of
the input and the parameters; ``dtype=jnp.bfloat16`` keeps bf16 activations and parameters).
The kernels serve normalization over the last axis (``reduction_axes`` and ``feature_axes``
-1, Flax's default) without ``axis_name`` or ``mask``; any other configuration runs Flax's own
implementation, unchanged.
"""
from __future__ import annotations

try:
    from flax import nnx as _flax_nnx
except ImportError as err:  # pragma: no cover - exercised where flax is absent
    raise ImportError("cunorm.jax.nnx needs Flax (pip install flax)") from err

from . import layer_norm as _layer_norm
from . import rms_norm as _rms_norm

__all__ = ["LayerNorm", "RMSNorm"]


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
