"""JAX device selection shared by the JAX test files."""
from __future__ import annotations

import pytest


def gpu_or_skip():
    """JAX's first GPU, or a skip with the reason."""
    import jax

    try:
        devices = jax.devices("gpu")
    except RuntimeError:
        devices = []
    if not devices:
        pytest.skip("JAX sees no GPU")
    return devices[0]
