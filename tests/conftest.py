"""Shared fixtures: GPU detection (GPU tests skip with a reason, never vanish), fresh random
inputs per test, and NaN-poisoned outputs for every op call in GPU tests."""
from __future__ import annotations

import functools
import os
import sys

import numpy
import pytest

pytest_plugins = ("pytester",)  # (test_kernel_cache runs this conftest over a made-up test file)

# JAX takes 75% of GPU memory at start by default; the CuPy and torch tests share the GPU
# with it (and pytest-xdist runs several processes).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


@functools.lru_cache(maxsize=None)
def gpu_missing_reason() -> str | None:
    try:
        import cupy
    except ImportError as err:
        return f"CuPy is not installed ({err})"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device visible to CuPy"
    except Exception as err:  # no driver on CPU-only machines
        return f"no CUDA device ({type(err).__name__}: {err})"
    return None


def pytest_collection_modifyitems(config, items):
    reason = gpu_missing_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped with a reason without one)")


@pytest.fixture
def rng():
    # A fresh seed each run: the kernels must compute the same function on any input.
    # CUNORM_TEST_SEED replays the seed a failure printed.
    replay = os.environ.get("CUNORM_TEST_SEED")
    seed = int(replay) if replay else numpy.random.SeedSequence().entropy % (2**32)
    print(f"rng seed {seed}")
    return numpy.random.default_rng(seed)


@pytest.fixture(autouse=True)
def _forget_device_stubs(request):
    """CPU tests stand in for the device with stubs (a kernel pointer of 1, a fixed occupancy
    or SM count); what the host's caches kept of them must not reach a later GPU test of the
    same process. A stub pointer that test_scratch_lists_are_the_allocations left in
    _staged_cl_kernel's cache, handed to the driver by a GPU test with an equal plan, was the
    pytest worker crash (a segfault in cuOccupancyMaxActiveClusters or a cooperative
    cuLaunchKernelEx; NOTES "The pytest worker crash"). So every cache of kernel pointers and
    plans is emptied after each test that is not a GPU test (drop_modules; the GPU tests
    after it get the same kernels back from CuPy's module memo, no compile)."""
    yield
    if "gpu" in request.keywords:
        return
    compiled = sys.modules.get("cunorm._compile")
    if compiled is not None:
        compiled.drop_modules()


@pytest.fixture(autouse=True)
def _poison_outputs(request):
    if "gpu" not in request.keywords:
        yield
        return
    from cunorm.ops import _row_norm_cupy

    _row_norm_cupy.POISON_OUTPUTS = True
    yield
    _row_norm_cupy.POISON_OUTPUTS = False
