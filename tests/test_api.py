"""The public functions on NumPy arrays (CPU path) and their argument checks: every bad
argument raises TypeError/ValueError naming it."""
from __future__ import annotations

import numpy
import pytest

import cunorm
from cunorm import reference
from cunorm._checks import BFLOAT16
from tolerances import assert_close, tol

DTYPES = [numpy.float16, BFLOAT16, numpy.float32, numpy.float64]


@pytest.mark.parametrize("dtype", DTYPES)
def test_numpy_layer_norm_dtypes(rng, dtype):
    x = rng.standard_normal((3, 7)).astype(dtype)
    w = rng.standard_normal(7).astype(numpy.float32)
    y, mean, rstd = cunorm.layer_norm(x, w, w, return_stats=True)
    acc = numpy.float64 if dtype == numpy.float64 else numpy.float32
    assert y.dtype == dtype and mean.dtype == acc and rstd.dtype == acc
    assert_close("y", y, reference.layer_norm(x, w, w), *tol(dtype))
    dx, dw, db = cunorm.layer_norm_backward(y, x, w, mean, rstd)
    assert dx.dtype == dtype and dw.dtype == numpy.float32 and db.dtype == numpy.float32


@pytest.mark.parametrize("dtype", DTYPES)
def test_numpy_rms_norm_dtypes(rng, dtype):
    x = rng.standard_normal((2, 3, 5)).astype(dtype)
    y, rstd = cunorm.rms_norm(x, normalized_ndim=2, return_stats=True)
    assert y.dtype == dtype and rstd.shape == (2,)
    dx, dw = cunorm.rms_norm_backward(y, x, None, rstd, normalized_ndim=2)
    assert dx.dtype == dtype and dw is None


def test_return_stats_shapes():
    x = numpy.ones((2, 3, 4), numpy.float32)
    y, mean, rstd = cunorm.layer_norm(x, return_stats=True)
    assert y.shape == x.shape and mean.shape == (2, 3) and rstd.shape == (2, 3)
    assert isinstance(cunorm.layer_norm(x), numpy.ndarray)


x32 = numpy.ones((2, 4), numpy.float32)


@pytest.mark.parametrize("call,error,name", [
    (lambda: cunorm.layer_norm([[1.0, 2.0]]), TypeError, "x"),
    (lambda: cunorm.layer_norm(numpy.ones((2, 4), numpy.int32)), TypeError, "x"),
    (lambda: cunorm.layer_norm(numpy.ones((2, 4), numpy.complex64)), TypeError, "x"),
    (lambda: cunorm.layer_norm(numpy.ones((2, 4), bool)), TypeError, "x"),
    (lambda: cunorm.layer_norm(numpy.float32(1.0)), TypeError, "x"),
    (lambda: cunorm.layer_norm(numpy.array(1.0, numpy.float32)), ValueError, "x"),
    (lambda: cunorm.layer_norm(x32, numpy.ones(3, numpy.float32)), ValueError, "weight"),
    (lambda: cunorm.layer_norm(x32, None, numpy.ones((1, 4), numpy.float32)), ValueError, "bias"),
    (lambda: cunorm.layer_norm(x32, numpy.ones(4, numpy.int64)), TypeError, "weight"),
    (lambda: cunorm.layer_norm(x32, eps=0.0), ValueError, "eps"),
    (lambda: cunorm.layer_norm(x32, eps=-1e-5), ValueError, "eps"),
    (lambda: cunorm.layer_norm(x32, eps=float("nan")), ValueError, "eps"),
    (lambda: cunorm.layer_norm(x32, eps=float("inf")), ValueError, "eps"),
    (lambda: cunorm.layer_norm(x32, eps="1e-5"), TypeError, "eps"),
    (lambda: cunorm.layer_norm(x32, normalized_ndim=0), ValueError, "normalized_ndim"),
    (lambda: cunorm.layer_norm(x32, normalized_ndim=3), ValueError, "normalized_ndim"),
    (lambda: cunorm.layer_norm(x32, normalized_ndim=1.0), TypeError, "normalized_ndim"),
    (lambda: cunorm.rms_norm(x32, eps=0), ValueError, "eps"),
    (lambda: cunorm.rms_norm(x32, numpy.ones(5, numpy.float32)), ValueError, "weight"),
    (lambda: cunorm.layer_norm_backward(numpy.ones((2, 3), numpy.float32), x32, None,
                                        numpy.zeros(2, numpy.float32), numpy.ones(2, numpy.float32)),
     ValueError, "dy"),
    (lambda: cunorm.layer_norm_backward(x32.astype(numpy.float16), x32, None,
                                        numpy.zeros(2, numpy.float32), numpy.ones(2, numpy.float32)),
     TypeError, "dy"),
    (lambda: cunorm.layer_norm_backward(x32, x32, None, numpy.zeros(3, numpy.float32),
                                        numpy.ones(2, numpy.float32)), ValueError, "mean"),
    (lambda: cunorm.layer_norm_backward(x32, x32, None, numpy.zeros(2, numpy.float32),
                                        numpy.ones(2, numpy.float64)), TypeError, "rstd"),
    (lambda: cunorm.rms_norm_backward(x32, x32, None, numpy.ones((2, 1), numpy.float32)), ValueError, "rstd"),
])
def test_bad_arguments_name_the_argument(call, error, name):
    with pytest.raises(error, match=rf"^{name}\b"):
        call()
