"""Argument conversion the JAX frontends share."""
from __future__ import annotations

import jax.numpy as jnp


def as_array(name: str, a):
    """``a`` as an array (anything with shape and dtype passes as it is); None stays None;
    a TypeError naming the argument where JAX cannot make one."""
    if a is None:
        return None
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
        try:
            a = jnp.asarray(a)
        except TypeError:
            raise TypeError(f"{name}: expected a JAX array, got {type(a).__name__}") from None
    return a
