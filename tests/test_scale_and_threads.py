"""Issue 8's scale and concurrency cases on the GPU: tensors past 2**31 elements (element
offsets that overflow 32 bits), a single row of 2**25 elements, 2**26 rows of 32; eight
threads on their own streams calling every op at once, against serial results, with each
kernel compiled once."""
from __future__ import annotations

import numpy
import pytest

import cunorm
from cunorm import reference
from cunorm._checks import BFLOAT16
from tolerances import assert_close, reduction_tol, tol

pytestmark = pytest.mark.gpu


def _normal(rng, shape, dtype, chunk_rows=1 << 16):
    """A large bf16 array without a float32 copy of the whole of it."""
    import cupy

    out = cupy.empty(shape, dtype)
    for r in range(0, shape[0], chunk_rows):
        out[r:r + chunk_rows] = rng.standard_normal((min(chunk_rows, shape[0] - r), *shape[1:]),
                                                    dtype=numpy.float32).astype(dtype)
    return out


def _check_large(op, shape, sample_rows):
    """Forward and backward of a bf16 (M, N) array: y and dx on sampled rows (the last ones sit
    past 2**31 elements) against the float64 reference, dweight against a float64 sum over
    all rows on the GPU."""
    import cupy

    rng = cupy.random.default_rng(7)
    m, n = shape
    x, dy = _normal(rng, shape, BFLOAT16), _normal(rng, shape, BFLOAT16)
    w = (1 + 0.1 * rng.standard_normal(n, dtype=numpy.float32))
    rms = op == "rms_norm"
    if rms:
        y, rstd = cunorm.rms_norm(x, w, return_stats=True)
        dx, dw = cunorm.rms_norm_backward(dy, x, w, rstd)
        mean = None
    else:
        y, mean, rstd = cunorm.layer_norm(x, w, None, return_stats=True)
        dx, dw, _ = cunorm.layer_norm_backward(dy, x, w, mean, rstd)
    hw = w.get()
    rows = cupy.asarray(sample_rows)
    hx, hdy = x[rows].get(), dy[rows].get()
    if rms:
        ry, rrstd = reference.rms_norm(hx, hw, return_stats=True)
        rdx, _ = reference.rms_norm_backward(hdy, hx, hw, rrstd)
    else:
        ry, rmean, rrstd = reference.layer_norm(hx, hw, None, return_stats=True)
        rdx, _, _ = reference.layer_norm_backward(hdy, hx, hw, rmean, rrstd)
    assert_close("y", y[rows], ry, *tol(BFLOAT16))
    assert_close("dx", dx[rows], rdx, *tol(BFLOAT16))
    want = cupy.zeros(n, numpy.float64)
    for r in range(0, m, 1 << 16):
        xs = x[r:r + (1 << 16)].astype(numpy.float64)
        mu = 0.0 if rms else mean[r:r + (1 << 16), None].astype(numpy.float64)
        want += (dy[r:r + (1 << 16)].astype(numpy.float64) * (xs - mu) * rstd[r:r + (1 << 16), None]).sum(0)
    assert_close("dweight", dw, want.get(), *reduction_tol(numpy.float32, m))


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_more_than_2_31_elements(op):
    m = (1 << 31) // 4096 + 1  # 2**31 + 4096 elements: the last row starts past 2**31
    _check_large(op, (m, 4096), [0, 1, m // 2, m - 2, m - 1])


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_one_row_of_2_25_elements(op):
    _check_large(op, (1, 1 << 25), [0])


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_2_26_rows_of_32(op):
    m = 1 << 26
    _check_large(op, (m, 32), [0, 12345, m // 2 + 1, m - 1])


def test_eight_threads_on_their_own_streams_match_serial_and_compile_once():
    """In a fresh interpreter (empty kernel and plan caches, so the threads race to compile):
    eight threads on their own non-blocking streams run every op family at once, then the
    same calls run serially; outputs must agree bitwise and no kernel may be built twice."""
    from fresh_interpreter import run_probe

    report = run_probe("_concurrency_probe.py")
    assert not report["errors"], report["errors"]
    assert not report["mismatches"], report["mismatches"]
    assert report["kernels_built"] > 0, "the threads compiled nothing: the probe did not start cold"
    assert not report["built_twice"], report["built_twice"]
