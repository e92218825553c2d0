"""LayerNorm on the GPU against the float64 reference, one test per dispatch path.

Row lengths pick the path (bf16/fp16 pack 8 elements, fp32 4, fp64 2 when aligned; odd N
forces scalar packs): N <= 32 packs share a warp (warp path), up to 1024 threads x 16 values
hold a row in one block (block path), longer rows are cut into tiles (split path)."""
from __future__ import annotations

import numpy
import pytest

import cunorm
from norm_cases import DTYPE_IDS, DTYPES, VIEWS, bitwise_equal, check

pytestmark = pytest.mark.gpu
OP = "layer_norm"


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


def test_split_path_many_rows(rng):
    check(OP, rng, (257, 20000), numpy.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_split_path_2049_rows(rng, dtype):
    # 2049 x 65537: many rows of scalar (odd N) tiles; 2049 x 262144 is left out, its float64
    # reference alone would take tens of seconds per dtype
    check(OP, rng, (2049, 65537), dtype)


def test_split_path_million_row(rng):
    check(OP, rng, (2, 1 << 20), numpy.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("weight,bias", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("n", [7, 1024, 65537])
def test_affine_variants(rng, dtype, weight, bias, n):
    check(OP, rng, (5, n), dtype, weight=weight, bias=bias)


@pytest.mark.parametrize("dtype,param_dtype", [
    ("bfloat16", "float32"), ("float16", "float32"), ("float64", "float32"),  # compiled pairs
    ("float16", "bfloat16"), ("float32", "float16"), ("float32", "float64"),  # cast to fp32
])
@pytest.mark.parametrize("n", [40, 2048, 40000])
def test_mixed_param_dtypes(rng, dtype, param_dtype, n):
    from cunorm._checks import BFLOAT16

    as_dtype = lambda s: BFLOAT16 if s == "bfloat16" else numpy.dtype(s)
    check(OP, rng, (9, n), as_dtype(dtype), param_dtype=as_dtype(param_dtype))


@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("n", [64, 1536, 20000])
def test_views(rng, view, n):
    check(OP, rng, (6, 5, n), numpy.float32, view=view)
    check(OP, rng, (6, 5, n), numpy.float16, view=view)


def test_many_leading_axes_copy(rng):
    # five non-mergeable leading axes: more than the kernels address, copied once
    import cupy

    hx = rng.standard_normal((2, 3, 2, 3, 2, 64)).astype(numpy.float32)
    x = cupy.asarray(hx).transpose(4, 3, 2, 1, 0, 5)
    y = cunorm.layer_norm(x)
    ref = cunorm.layer_norm(numpy.ascontiguousarray(hx.transpose(4, 3, 2, 1, 0, 5)))
    numpy.testing.assert_allclose(y.get(), ref, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [(4, 3, 7), (3, 16, 256), (2, 5, 4099)])
def test_normalized_ndim_2(rng, dtype, shape):
    check(OP, rng, shape, dtype, nd=2)


@pytest.mark.parametrize("n", [1536, 16384, 65536])  # register tile, shared memory, cluster or split
def test_large_mean_two_pass_variance(rng, n):
    # E[x^2] - E[x]^2 would lose every digit here
    check(OP, rng, (4, n), numpy.float32, x_offset=1e4)


@pytest.mark.parametrize("rows", [100, 1031], ids=["column", "partial_rows"])
@pytest.mark.parametrize("n", [256, 4096, 65537])
def test_backward_bitwise_deterministic(rng, n, rows):
    import cupy

    x = cupy.asarray(rng.standard_normal((rows, n)).astype(numpy.float32))
    w = cupy.asarray(rng.standard_normal(n).astype(numpy.float32))
    b = cupy.asarray(rng.standard_normal(n).astype(numpy.float32))
    dy = cupy.asarray(rng.standard_normal((rows, n)).astype(numpy.float32))
    _, mean, rstd = cunorm.layer_norm(x, w, b, return_stats=True)
    first = cunorm.layer_norm_backward(dy, x, w, mean, rstd)
    for _ in range(3):
        again = cunorm.layer_norm_backward(dy, x, w, mean, rstd)
        assert all(bitwise_equal(a, b) for a, b in zip(first, again))


def test_zero_rows():
    import cupy

    x = cupy.empty((0, 5), numpy.float32)
    w = cupy.ones(5, numpy.float32)
    y, mean, rstd = cunorm.layer_norm(x, w, w, return_stats=True)
    assert y.shape == (0, 5) and mean.shape == (0,) and rstd.shape == (0,)
    dx, dw, db = cunorm.layer_norm_backward(x, x, w, mean, rstd)
    assert dx.shape == (0, 5) and dw.get().tolist() == [0] * 5 and db.get().tolist() == [0] * 5


def test_zero_length_rows():
    import cupy

    x = cupy.empty((3, 0), numpy.float32)
    y, mean, rstd = cunorm.layer_norm(x, return_stats=True)
    assert y.shape == (3, 0) and numpy.isnan(mean.get()).all() and numpy.isnan(rstd.get()).all()


def test_current_stream_is_used(rng):
    import cupy

    hx = rng.standard_normal((64, 1024)).astype(numpy.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        x = cupy.asarray(hx)
        y = cunorm.layer_norm(x)
    stream.synchronize()
    numpy.testing.assert_allclose(y.get(), cunorm.layer_norm(hx), rtol=2e-5, atol=2e-5)


def test_numpy_and_cupy_mix_rejected():
    import cupy

    with pytest.raises(TypeError, match="weight"):
        cunorm.layer_norm(cupy.ones((2, 4), numpy.float32), numpy.ones(4, numpy.float32))
