"""The float64 references (CPU): against the textbook formula row by row, and their
gradients against central finite differences."""
from __future__ import annotations

import numpy
import pytest

from cunorm import reference


def _loop_layer_norm(x, w, b, eps):
    out = numpy.empty_like(x)
    for i, row in enumerate(x):
        mu = sum(row) / len(row)
        var = sum((v - mu) ** 2 for v in row) / len(row)
        out[i] = [(v - mu) / numpy.sqrt(var + eps) * w[j] + b[j] for j, v in enumerate(row)]
    return out


@pytest.mark.parametrize("n", [1, 7, 33])
def test_layer_norm_matches_formula(rng, n):
    x = rng.standard_normal((5, n))
    w, b = rng.standard_normal(n), rng.standard_normal(n)
    y, mean, rstd = reference.layer_norm(x, w, b, 1e-5, return_stats=True)
    numpy.testing.assert_allclose(y, _loop_layer_norm(x, w, b, 1e-5), rtol=1e-12, atol=1e-12)
    numpy.testing.assert_allclose(mean, x.mean(-1), rtol=1e-12, atol=1e-12)
    numpy.testing.assert_allclose(rstd, 1 / numpy.sqrt(x.var(-1) + 1e-5), rtol=1e-12)


def test_rms_norm_matches_formula(rng):
    x, w = rng.standard_normal((4, 9)), rng.standard_normal(9)
    y, rstd = reference.rms_norm(x, w, 1e-6, return_stats=True)
    want_rstd = 1 / numpy.sqrt((x**2).mean(-1) + 1e-6)
    numpy.testing.assert_allclose(rstd, want_rstd, rtol=1e-12)
    numpy.testing.assert_allclose(y, x * want_rstd[:, None] * w, rtol=1e-12)


def test_rms_norm_default_eps():
    x = numpy.full((1, 4), 1e-3, dtype=numpy.float32)
    _, rstd = reference.rms_norm(x, return_stats=True)
    assert rstd[0] == pytest.approx(1 / numpy.sqrt(1e-6 + numpy.finfo(numpy.float32).eps), rel=1e-6)


def test_normalized_ndim_2_is_flattened_rows(rng):
    x = rng.standard_normal((3, 4, 5))
    w = rng.standard_normal((4, 5))
    y = reference.layer_norm(x, w, None, normalized_ndim=2)
    flat = reference.layer_norm(x.reshape(3, 20), w.reshape(20))
    numpy.testing.assert_allclose(y.reshape(3, 20), flat, rtol=1e-12)


def _numeric_grads(f, arrays, dy, h=1e-6):
    grads = []
    for a in arrays:
        g = numpy.zeros_like(a)
        for i in numpy.ndindex(a.shape):
            old = a[i]
            a[i] = old + h
            up = (f() * dy).sum()
            a[i] = old - h
            down = (f() * dy).sum()
            a[i] = old
            g[i] = (up - down) / (2 * h)
        grads.append(g)
    return grads


@pytest.mark.parametrize("nd,shape", [(1, (3, 6)), (2, (2, 3, 4)), (1, (2, 1))])
def test_layer_norm_backward_finite_differences(rng, nd, shape):
    x = rng.standard_normal(shape)
    w = rng.standard_normal(shape[len(shape) - nd:])
    b = rng.standard_normal(shape[len(shape) - nd:])
    dy = rng.standard_normal(shape)
    _, mean, rstd = reference.layer_norm(x, w, b, 1e-3, normalized_ndim=nd, return_stats=True)
    dx, dw, db = reference.layer_norm_backward(dy, x, w, mean, rstd, normalized_ndim=nd)
    f = lambda: reference.layer_norm(x, w, b, 1e-3, normalized_ndim=nd)
    ndx, ndw, ndb = _numeric_grads(f, [x, w, b], dy)
    numpy.testing.assert_allclose(dx, ndx, rtol=1e-5, atol=1e-6)
    numpy.testing.assert_allclose(dw, ndw, rtol=1e-5, atol=1e-6)
    numpy.testing.assert_allclose(db, ndb, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm_backward_finite_differences(rng, with_weight):
    x = rng.standard_normal((3, 5))
    w = rng.standard_normal(5) if with_weight else None
    dy = rng.standard_normal((3, 5))
    _, rstd = reference.rms_norm(x, w, 1e-3, return_stats=True)
    dx, dw = reference.rms_norm_backward(dy, x, w, rstd)
    f = lambda: reference.rms_norm(x, w, 1e-3)
    numeric = _numeric_grads(f, [x] + ([w] if with_weight else []), dy)
    numpy.testing.assert_allclose(dx, numeric[0], rtol=1e-5, atol=1e-6)
    if with_weight:
        numpy.testing.assert_allclose(dw, numeric[1], rtol=1e-5, atol=1e-6)
    else:
        assert dw is None


def test_empty_rows_and_columns():
    y, mean, rstd = reference.layer_norm(numpy.zeros((3, 0)), return_stats=True)
    assert y.shape == (3, 0) and numpy.isnan(mean).all() and numpy.isnan(rstd).all()
    dx, dw, db = reference.layer_norm_backward(numpy.zeros((0, 4)), numpy.zeros((0, 4)), numpy.ones(4),
                                               numpy.zeros(0), numpy.zeros(0))
    assert dx.shape == (0, 4) and (dw == 0).all() and (db == 0).all()


# ---- fused transformer variants (issue 7): residual add, weight offset, FP8 quantization ----

@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_residual_is_the_norm_of_the_sum(rng, op):
    x, r = rng.standard_normal((4, 9)), rng.standard_normal((4, 9))
    w = rng.standard_normal(9)
    fn = getattr(reference, op)
    y, h = fn(x, w, residual=r)
    numpy.testing.assert_array_equal(h, x + r)
    numpy.testing.assert_allclose(y, fn(x + r, w), rtol=1e-12)
    stats = fn(x, w, residual=r, return_stats=True)
    want = fn(x + r, w, return_stats=True)
    assert len(stats) == len(want) + 1, "(y, h, stats...)"
    for got, ref in zip(stats[2:], want[1:]):
        numpy.testing.assert_allclose(got, ref, rtol=1e-12)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_weight_offset_adds_to_the_weight(rng, op):
    x, w = rng.standard_normal((3, 8)), 0.01 * rng.standard_normal(8)
    fn = getattr(reference, op)
    numpy.testing.assert_allclose(fn(x, w, weight_offset=1.0), fn(x, w + 1.0), rtol=1e-12)
    with pytest.raises(ValueError, match="weight_offset"):
        fn(x, None, weight_offset=1.0)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_residual_backward_finite_differences(rng, op):
    """Loss sum(y * dy) + sum(h * dh): the backward's dx (given h and dh) is the gradient of
    both x and the residual, and the weight's gradient ignores the offset."""
    rms = op == "rms_norm"
    x, r = rng.standard_normal((3, 6)), rng.standard_normal((3, 6))
    w = rng.standard_normal(6)
    b = None if rms else rng.standard_normal(6)
    dy, dh = rng.standard_normal((3, 6)), rng.standard_normal((3, 6))
    params = (w,) if rms else (w, b)
    kw = dict(residual=r, weight_offset=0.5)
    out = getattr(reference, op)(x, *params, 1e-3, return_stats=True, **kw)
    h = out[1]
    if rms:
        dx, dw = reference.rms_norm_backward(dy, h, w, out[2], dh=dh, weight_offset=0.5)
    else:
        dx, dw, _ = reference.layer_norm_backward(dy, h, w, out[2], out[3], dh=dh, weight_offset=0.5)

    def loss_terms():
        y, hh = getattr(reference, op)(x, *params, 1e-3, **kw)
        return numpy.concatenate([y, hh])

    both = numpy.concatenate([dy, dh])
    ndx, ndr, ndw = _numeric_grads(loss_terms, [x, r, w], both)
    numpy.testing.assert_allclose(dx, ndx, rtol=1e-5, atol=1e-6)
    numpy.testing.assert_allclose(dx, ndr, rtol=1e-5, atol=1e-6)
    numpy.testing.assert_allclose(dw, ndw, rtol=1e-5, atol=1e-6)


def test_quantize_saturates_and_rounds_to_the_fp8_grid():
    import ml_dtypes

    y = numpy.array([0.0, 1.0, -3.3, 500.0, -1e6, 0.1])
    q, amax = reference.quantize(y, ml_dtypes.float8_e4m3fn, scale=2.0)
    assert amax == 1e6, "amax before scaling"
    assert q[3] == 448.0 and q[4] == -448.0, "saturating, not NaN"
    assert q[1] == 2.0 and q[0] == 0.0
    assert q[2] == -6.5, "-6.6 rounds to the nearest e4m3 value (step 0.5 in [4, 8))"
    assert q[5] == pytest.approx(0.203125), "0.2 rounds to 13/64 (step 1/64 in [0.125, 0.25))"
    q5, _ = reference.quantize(numpy.array([1e6]), ml_dtypes.float8_e5m2)
    assert q5[0] == 57344.0
