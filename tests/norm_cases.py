"""One forward + backward check against the float64 reference, shared by the LayerNorm and
RMSNorm GPU tests. Inputs are built on the host, then the same view is taken on both sides,
so strided and misaligned device views are compared with exactly the values they hold."""
from __future__ import annotations

import math

import numpy

import cunorm
from cunorm import reference
from cunorm._checks import BFLOAT16, acc_dtype
from tolerances import assert_close, reduction_tol, stats_tol, tol

DTYPES = [numpy.dtype(numpy.float32), numpy.dtype(numpy.float16), BFLOAT16, numpy.dtype(numpy.float64)]
DTYPE_IDS = ["fp32", "fp16", "bf16", "fp64"]

# Views of a host base array; each returns the view for a NumPy or CuPy base of the same values.
VIEWS = {
    "contiguous": (lambda shape: shape, lambda a: a),
    "row_stride": (lambda s: (s[0] * 2, *s[1:]), lambda a: a[::2]),
    "negative_row_stride": (lambda s: s, lambda a: a[::-1]),
    # 1-element offset: the data pointer is misaligned for any pack wider than one element
    "offset": (lambda s: (math.prod(s) + 1,), None),
    "transposed_leading": (lambda s: (s[1], s[0], *s[2:]), lambda a: a.swapaxes(0, 1)),
    "strided_last": (lambda s: (*s[:-1], s[-1] * 2), lambda a: a[..., ::2]),
}


def _view(name, base, shape):
    make_shape, fn = VIEWS[name]
    if fn is None:  # offset view
        return base[1:].reshape(shape)
    return fn(base)


def host_array(rng, shape, dtype, offset=0.0):
    return (rng.standard_normal(shape) + offset).astype(dtype)


def check(op, rng, shape, dtype, *, nd=1, weight=True, bias=True, param_dtype=None, view="contiguous",
          x_offset=0.0):
    """Run op forward and backward on a CuPy view and compare with the reference."""
    import cupy

    rms = op == "rms_norm"
    dtype = numpy.dtype(dtype)
    pdt = numpy.dtype(param_dtype) if param_dtype is not None else dtype
    base_shape = VIEWS[view][0](tuple(shape))
    hbase = host_array(rng, base_shape, dtype, x_offset)
    hx = _view(view, hbase, shape)
    dx_base = cupy.asarray(hbase)
    x = _view(view, dx_base, shape)
    assert x.shape == tuple(shape)
    norm_shape = tuple(shape[len(shape) - nd:])
    hw = (1 + 0.1 * rng.standard_normal(norm_shape)).astype(pdt) if weight else None
    hb = (0.1 * rng.standard_normal(norm_shape)).astype(pdt) if (bias and not rms) else None
    w = None if hw is None else cupy.asarray(hw)
    b = None if hb is None else cupy.asarray(hb)

    if rms:
        y, rstd = cunorm.rms_norm(x, w, normalized_ndim=nd, return_stats=True)
        ry, rrstd = reference.rms_norm(hx, hw, normalized_ndim=nd, return_stats=True)
        mean = rmean = None
    else:
        y, mean, rstd = cunorm.layer_norm(x, w, b, normalized_ndim=nd, return_stats=True)
        ry, rmean, rrstd = reference.layer_norm(hx, hw, hb, normalized_ndim=nd, return_stats=True)
    assert y.dtype == dtype and y.shape == tuple(shape)
    assert rstd.dtype == acc_dtype(dtype) and rstd.shape == tuple(shape[: len(shape) - nd])
    assert_close("y", y, ry, *tol(dtype))
    st = stats_tol(dtype)
    assert_close("rstd", rstd, rrstd, st, st)
    if mean is not None:
        assert mean.dtype == acc_dtype(dtype)
        assert_close("mean", mean, rmean, st, st * (1 + abs(x_offset)))

    hdy = host_array(rng, shape, dtype)
    dy = cupy.asarray(hdy)
    hmean = None if mean is None else cupy.asnumpy(mean)
    if rms:
        dx, dw = cunorm.rms_norm_backward(dy, x, w, rstd, normalized_ndim=nd)
        rdx, rdw = reference.rms_norm_backward(hdy, hx, hw, cupy.asnumpy(rstd), normalized_ndim=nd)
        db = rdb = None
    else:
        dx, dw, db = cunorm.layer_norm_backward(dy, x, w, mean, rstd, normalized_ndim=nd, has_bias=hb is not None)
        rdx, rdw, rdb = reference.layer_norm_backward(hdy, hx, hw, hmean, cupy.asnumpy(rstd), normalized_ndim=nd,
                                                      has_bias=hb is not None)
    assert dx.dtype == dtype and dx.shape == tuple(shape)
    # dx = rstd * (terms of order 1): its rounding error scales with rstd (316 for N=1, eps=1e-5)
    rtol, atol = tol(dtype)
    assert_close("dx", dx, rdx, rtol, atol * max(1.0, float(rstd.max()) if rstd.size else 1.0))
    rows = math.prod(shape[: len(shape) - nd])
    for name, got, want in (("dweight", dw, rdw), ("dbias", db, rdb)):
        if want is None:
            assert got is None, f"{name} should be None"
            continue
        assert got.dtype == pdt and got.shape == norm_shape
        # rounded once to the parameter dtype, or computed in fp32 when that is coarser
        acc = acc_dtype(dtype)
        rtol, atol = reduction_tol(pdt if pdt.itemsize <= acc.itemsize else acc, rows)
        assert_close(name, got, want, rtol, atol)
    return dict(y=y, dx=dx, dw=dw, db=db)


def bitwise_equal(a, b) -> bool:
    import cupy

    if a is None or b is None:
        return a is None and b is None
    return bool(cupy.array_equal(a.view(cupy.uint8), b.view(cupy.uint8)))


def column_backward_edge(op, rng, n, dtype):
    """The most rows the one-launch column backward takes at this row length, and one more
    (the partial-row backward): check both and that the dispatcher picked each path."""
    from cunorm import _config
    from cunorm.ops import _row_norm

    dtype = numpy.dtype(dtype)
    vec = _config.max_vec(dtype.itemsize)
    vec = vec if n % vec == 0 else 1
    edge = _config.column_bwd_max_rows(_config.row_config(n, vec, _config.COLUMN_BWD))
    for rows, column in ((edge, True), (edge + 1, False)):
        plan = _row_norm.backward_plan((rows, n), (n, 1), (n, 1), dtype, dtype, dtype, 1, op == "rms_norm", 0,
                                       0, 0)
        assert (plan.column_blocks > 0) == column, (rows, n, plan)
        check(op, rng, (rows, n), dtype)


def check_layer_norm_rows(rng, hx):
    """LayerNorm of the host rows hx with a weight and bias drawn here, y / mean / rstd against
    the float64 reference (mean within 50x the statistics' tolerance: rows far from zero);
    returns the weight."""
    import cupy

    n, dtype = hx.shape[-1], hx.dtype
    hw = (1 + 0.1 * rng.standard_normal(n)).astype(dtype)
    hb = (0.1 * rng.standard_normal(n)).astype(dtype)
    y, mean, rstd = cunorm.layer_norm(cupy.asarray(hx), cupy.asarray(hw), cupy.asarray(hb), return_stats=True)
    ry, rmean, rrstd = reference.layer_norm(hx, hw, hb, return_stats=True)
    st = stats_tol(dtype)
    assert_close("rstd", rstd, rrstd, st, st)
    assert_close("mean", mean, rmean, st, st * 50)
    assert_close("y", y, ry, *tol(dtype))
    return hw
