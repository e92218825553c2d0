"""JAX device selection shared by the JAX test files."""
from __future__ import annotations

import pytest


def gpus() -> list:
    """JAX's GPUs (none where its GPU backend is absent)."""
    import jax

    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


def gpu_or_skip():
    """JAX's first GPU, or a skip with the reason."""
    devices = gpus()
    if not devices:
        pytest.skip("JAX sees no GPU")
    return devices[0]
