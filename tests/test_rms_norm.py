"""RMSNorm on the GPU against the float64 reference, one test per dispatch path (the same
kernels as LayerNorm without centring; see test_layer_norm.py for the path boundaries)."""
from __future__ import annotations

import numpy
import pytest

import cunorm
from norm_cases import DTYPE_IDS, DTYPES, VIEWS, bitwise_equal, check

pytestmark = pytest.mark.gpu
OP = "rms_norm"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rows", [1, 3, 2049])
@pytest.mark.parametrize("n", [1, 7, 32, 256])
def test_warp_path(rng, dtype, rows, n):
    check(OP, rng, (rows, n), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rows", [1, 3, 2049])
@pytest.mark.parametrize("n", [200, 499, 1533, 2048, 4096, 8192])
def test_block_path(rng, dtype, rows, n):
    check(OP, rng, (rows, n), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("n", [16385, 65537, 262144])
def test_split_path(rng, dtype, rows, n):
    check(OP, rng, (rows, n), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_split_path_2049_rows(rng, dtype):
    # 2049 x 65537: many rows of scalar (odd N) tiles; 2049 x 262144 is left out, its float64
    # reference alone would take tens of seconds per dtype
    check(OP, rng, (2049, 65537), dtype)


def test_split_path_million_row(rng):
    check(OP, rng, (2, 1 << 20), numpy.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("n", [7, 1024, 65537])
def test_without_weight(rng, dtype, n):
    check(OP, rng, (5, n), dtype, weight=False)


@pytest.mark.parametrize("dtype,param_dtype", [("bfloat16", "float32"), ("float16", "bfloat16"),
                                               ("float32", "float64")])
@pytest.mark.parametrize("n", [40, 2048, 40000])
def test_mixed_param_dtypes(rng, dtype, param_dtype, n):
    from cunorm._checks import BFLOAT16

    as_dtype = lambda s: BFLOAT16 if s == "bfloat16" else numpy.dtype(s)
    check(OP, rng, (9, n), as_dtype(dtype), param_dtype=as_dtype(param_dtype))


@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("n", [64, 1536, 20000])
def test_views(rng, view, n):
    check(OP, rng, (6, 5, n), numpy.float32, view=view)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_normalized_ndim_2(rng, dtype):
    check(OP, rng, (3, 16, 256), dtype, nd=2)


def test_default_eps_is_the_computation_dtypes(rng):
    # torch's default: float32's epsilon for half x (float16's own, 9.8e-4, would swamp a mean
    # square of 1e-6)
    import cupy

    hx = (1e-3 * rng.standard_normal((4, 64))).astype(numpy.float16)
    y = cunorm.rms_norm(cupy.asarray(hx))
    ms = (hx.astype(numpy.float64) ** 2).mean(-1, keepdims=True)
    want = hx / numpy.sqrt(ms + numpy.finfo(numpy.float32).eps)
    numpy.testing.assert_allclose(y.get().astype(numpy.float64), want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("n", [256, 4096, 65537])
def test_backward_bitwise_deterministic(rng, n):
    import cupy

    x = cupy.asarray(rng.standard_normal((1031, n)).astype(numpy.float32))
    w = cupy.asarray(rng.standard_normal(n).astype(numpy.float32))
    dy = cupy.asarray(rng.standard_normal((1031, n)).astype(numpy.float32))
    _, rstd = cunorm.rms_norm(x, w, return_stats=True)
    first = cunorm.rms_norm_backward(dy, x, w, rstd)
    for _ in range(3):
        again = cunorm.rms_norm_backward(dy, x, w, rstd)
        assert all(bitwise_equal(a, b) for a, b in zip(first, again))
