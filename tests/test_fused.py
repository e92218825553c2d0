"""The fused options of layer_norm and rms_norm (residual add, weight offset, output dtype,
FP8 with scale and amax): argument checks and the NumPy path on the CPU; on the GPU the fused
kernel (plans asserted to hold it) and the composed path (long rows, odd N) against the
float64 references."""
from __future__ import annotations

import math

import ml_dtypes
import numpy
import pytest

import cunorm
from cunorm import reference
from cunorm._checks import BFLOAT16
from tolerances import assert_close, fp8_step, reduction_tol, stats_tol, to_numpy, tol

E4M3, E5M2 = numpy.dtype(ml_dtypes.float8_e4m3fn), numpy.dtype(ml_dtypes.float8_e5m2)
OPS = ["layer_norm", "rms_norm"]


def _call(op, x, w, b=None, **kw):
    return cunorm.layer_norm(x, w, b, **kw) if op == "layer_norm" else cunorm.rms_norm(x, w, **kw)


# ---- CPU: checks and the NumPy path ----------------------------------------------------------

@pytest.mark.parametrize("kw,err,name", [
    (dict(residual=numpy.zeros((3, 7), numpy.float32)), ValueError, "residual"),
    (dict(residual=numpy.zeros((3, 8), numpy.int32)), TypeError, "residual"),
    (dict(residual_dtype=numpy.float32), ValueError, "residual_dtype"),
    (dict(residual=numpy.zeros((3, 8), numpy.float32), residual_dtype=numpy.int8), TypeError, "residual_dtype"),
    (dict(weight_offset=math.inf), TypeError, "weight_offset"),
    (dict(weight_offset=True), TypeError, "weight_offset"),
    (dict(out_dtype=numpy.int16), TypeError, "out_dtype"),
    (dict(out_scale=2.0), ValueError, "out_scale"),
    (dict(out_dtype=E4M3, out_scale=0.0), ValueError, "out_scale"),
    (dict(out_dtype=E4M3, out_scale=math.nan), ValueError, "out_scale"),
    (dict(return_amax=True), ValueError, "return_amax"),
])
@pytest.mark.parametrize("op", OPS)
def test_bad_options_name_the_argument(op, kw, err, name):
    x, w = numpy.ones((3, 8), numpy.float32), numpy.ones(8, numpy.float32)
    with pytest.raises(err, match=name):
        _call(op, x, w, **kw)


def test_weight_offset_needs_a_weight():
    with pytest.raises(ValueError, match="weight_offset"):
        cunorm.rms_norm(numpy.ones((2, 4), numpy.float32), None, weight_offset=1.0)


@pytest.mark.parametrize("op", OPS)
def test_numpy_outputs_in_order(rng, op):
    x, r = rng.standard_normal((4, 16)).astype(numpy.float32), rng.standard_normal((4, 16)).astype(BFLOAT16)
    w, b = (0.1 * rng.standard_normal(16)).astype(numpy.float32), rng.standard_normal(16).astype(numpy.float32)
    out = _call(op, x, w, b if op == "layer_norm" else None, residual=r, residual_dtype=numpy.float32,
                weight_offset=1.0, out_dtype=E4M3, out_scale=4.0, return_stats=True, return_amax=True)
    want = _reference(op, x, w, b, r, 1.0)
    y64 = want[0]
    q, amax = reference.quantize(y64, E4M3, 4.0)
    assert out[0].dtype == E4M3 and out[1].dtype == numpy.float32
    numpy.testing.assert_array_equal(out[0].astype(numpy.float64), q)
    numpy.testing.assert_allclose(out[1], x.astype(numpy.float64) + r.astype(numpy.float64), rtol=1e-7)
    assert len(out) == (5 if op == "layer_norm" else 4)
    assert out[-1].dtype == numpy.float32 and float(out[-1]) == pytest.approx(amax, rel=1e-6)


def _reference(op, x, w, b, r, offset):
    """(y[, h], *stats) in float64 for the op with these fused options, at the op's default eps."""
    if op == "layer_norm":
        return reference.layer_norm(x, w, b, 1e-5, residual=r, weight_offset=offset, return_stats=True)
    return reference.rms_norm(x, w, None, residual=r, weight_offset=offset, return_stats=True)


@pytest.mark.parametrize("optin,served", [(101376, False), (232448, True)])
def test_fused_backward_plan_only_where_its_ring_fits(monkeypatch, optin, served):
    """v77: float32 h at 1024-thread rows stages 144 KiB of ring; where a block may not opt
    in to that and the kernel's static bytes (sm_86 / sm_89: 99 KiB), the plan is None and
    the callers compose the plain kernels instead of failing to launch. The device is faked
    (no GPU needed): kernel pointers, SM count, occupancy and shared-memory sizes."""
    pytest.importorskip("cupy", reason="CuPy is not installed")
    from cunorm import _launch
    from cunorm.ops import _fused

    monkeypatch.setattr(_fused, "function_ptr", lambda f, name, dev: 1)
    monkeypatch.setattr(_fused, "sm_count", lambda dev: 132)
    monkeypatch.setattr(_fused, "blocks_per_sm", lambda fn, block, smem: 1)
    monkeypatch.setattr(_launch, "static_smem", lambda fn: 1024)
    monkeypatch.setattr(_launch, "smem_limits", lambda dev: (optin, optin + 1024))
    _fused.fused_backward_plan.cache_clear()
    try:
        n = 8192
        plan = _fused.fused_backward_plan((64, n), (n, 1), (n, 1), BFLOAT16, numpy.float32, BFLOAT16, BFLOAT16,
                                          numpy.float32, 1, False, 0, ((0, 2), (0, 4), (0, 2)))
    finally:
        _fused.fused_backward_plan.cache_clear()
    assert (plan is not None) == served
    if served:
        assert plan.smem == 3 * 1024 * 8 * (2 + 4), "three rows of bf16 dy and float32 h"


# ---- GPU -----------------------------------------------------------------------------------

def _check_fused(op, rng, shape, dtype, *, r_dtype=None, h_dtype=None, out_dtype=None, offset=0.0, scale=None,
                 expect_fused=None, hx=None, mean_atol=None):
    import cupy

    from cunorm.ops import _fused

    n = shape[-1]
    hx = rng.standard_normal(shape).astype(dtype) if hx is None else hx
    hr = None if r_dtype is None else rng.standard_normal(shape).astype(r_dtype)
    hw = ((0.1 if offset else 1.0) * rng.standard_normal(n)).astype(numpy.float32)
    hb = rng.standard_normal(n).astype(numpy.float32) if op == "layer_norm" else None
    x, w = cupy.asarray(hx), cupy.asarray(hw)
    b = None if hb is None else cupy.asarray(hb)
    r = None if hr is None else cupy.asarray(hr)
    fp8 = out_dtype in (E4M3, E5M2)
    kw = dict(residual=r, residual_dtype=h_dtype, weight_offset=offset, out_dtype=out_dtype, return_stats=True)
    if fp8:
        kw.update(out_scale=scale, return_amax=True)
    if expect_fused is not None:
        arrays = [a for a in (x, r, w, b) if a is not None]
        plan = _fused.fused_forward_plan(
            x.shape, (n, 1), None if r is None else (n, 1), x.dtype, (r if r is not None else x).dtype,
            numpy.dtype(h_dtype or (r.dtype if r is not None else x.dtype)), numpy.dtype(out_dtype or x.dtype),
            numpy.float32, 1, op == "rms_norm", 0,
            tuple((a.data.ptr % 16, a.itemsize) for a in arrays))
        assert (plan is not None) == expect_fused, "the fused kernel" if expect_fused else "the composed path"
    out = list(_call(op, x, w, b, **kw))
    want = list(_reference(op, hx, hw, hb, hr, offset))
    y, y64 = out.pop(0), want.pop(0)
    if r is not None:
        h, h64 = out.pop(0), want.pop(0)
        assert h.dtype == numpy.dtype(h_dtype or r_dtype)
        assert_close("h", h, h64, *tol(h.dtype))
    amax = out.pop() if fp8 else None
    for name, got, ref in zip(("mean", "rstd") if op == "layer_norm" else ("rstd",), out, want):
        atol = mean_atol if name == "mean" and mean_atol is not None else stats_tol(dtype)
        assert_close(name, got, ref, stats_tol(dtype), atol)
    # y comes from the float32 sum (not h rounded to its dtype), as the reference's from the
    # float64 one: its error is its own rounding
    rounding = numpy.dtype(out_dtype or dtype)
    if fp8:
        q_ref, amax_ref = reference.quantize(y64, rounding, scale)
        # CuPy has no FP8 dtype: the CuPy API hands back the bit patterns as uint8
        assert y.dtype == numpy.uint8
        got = y.get().view(rounding).astype(numpy.float64)
        # Against y from the kernel's own statistics (checked above against float64): where
        # y is near 0 at a large scale, the float32 statistics' error alone moves y by
        # several steps of the fine grid there (seed 64384196: mean off by 1e-7 of a row of
        # 2048, y = 1.5e-7 read 2.4e-7 at scale 1e4). Then one FP8 step where float32
        # arithmetic put a value across a rounding boundary, plus that arithmetic's
        # rounding of y's terms, scaled.
        src = (h64 if r is not None else hx).astype(numpy.float64)
        stats = [to_numpy(a).astype(numpy.float64).reshape(-1, 1) for a in out]
        centred = src - stats[0] if op == "layer_norm" else src
        b64 = 0.0 if hb is None else hb.astype(numpy.float64)
        y_k = centred * stats[-1] * (hw.astype(numpy.float64) + offset) + b64
        q_ref, _ = reference.quantize(y_k, rounding, scale)
        terms = numpy.abs(y_k - b64) + numpy.abs(b64)
        slack = fp8_step(q_ref, rounding) * 1.001 + scale * 4 * 2.0**-24 * terms
        bad = numpy.abs(got - q_ref) > slack
        assert not bad.any(), f"FP8 y off by more than one step at {numpy.argwhere(bad)[:5].tolist()}"
        assert float(to_numpy(amax)) == pytest.approx(amax_ref, rel=tol(dtype)[0] * 4)
    else:
        assert y.dtype == rounding
        assert_close("y", y, y64, *tol(rounding))


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [BFLOAT16, numpy.dtype(numpy.float16), numpy.dtype(numpy.float32)],
                         ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("n", [512, 1536, 4096])
def test_fused_kernel_residual(rng, op, dtype, n):
    # the residual stream in x's dtype, then summed into float32 (a half x's first block)
    _check_fused(op, rng, (37, n), dtype, r_dtype=dtype, expect_fused=True)
    if dtype != numpy.float32:
        _check_fused(op, rng, (37, n), dtype, r_dtype=dtype, h_dtype=numpy.float32, expect_fused=True)
        _check_fused(op, rng, (37, n), dtype, r_dtype=numpy.float32, expect_fused=True)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [BFLOAT16, numpy.dtype(numpy.float32)], ids=["bf16", "fp32"])
def test_fused_kernel_weight_offset_and_out_dtype(rng, op, dtype):
    _check_fused(op, rng, (33, 1024), dtype, offset=1.0, expect_fused=True)
    other = numpy.float32 if dtype == BFLOAT16 else BFLOAT16
    _check_fused(op, rng, (33, 1024), dtype, out_dtype=numpy.dtype(other), expect_fused=True)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("fp8", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("scale", [1.0, 64.0, 1e4])  # 1e4 saturates most of y
def test_fused_kernel_fp8(rng, op, fp8, scale):
    _check_fused(op, rng, (65, 2048), BFLOAT16, r_dtype=BFLOAT16, h_dtype=numpy.float32, out_dtype=fp8,
                 offset=1.0, scale=scale, expect_fused=True)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("fp8", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype, n", [(numpy.dtype(numpy.float32), 1532), (numpy.dtype(numpy.float16), 1528),
                                      (BFLOAT16, 8)], ids=["fp32-1532", "fp16-1528", "bf16-8"])
def test_fused_kernel_fp8_word_stores(rng, op, fp8, dtype, n):
    # FP8 packs go out as 32-bit words (v48): one word a pack of float32 x (4 values), two of
    # half x (8), at odd row counts and lengths whose last pack ends the row
    _check_fused(op, rng, (7, n), dtype, out_dtype=fp8, scale=16.0, expect_fused=True)
    _check_fused(op, rng, (1, n), dtype, r_dtype=dtype, out_dtype=fp8, scale=0.5, expect_fused=True)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_fused_kernel_fp8_blocks_walk_rows(rng, op):
    # FP8 out runs on a grid of a few waves of resident blocks (_config.FP8_FWD_GRID_WAVES):
    # twice a grid's rows and three more make every block walk two rows or more, and the row
    # whose y holds the amax is the last one, reached on a block's last step
    from cunorm import _config
    from cunorm._launch import blocks_per_sm, sm_count
    from cunorm.ops import _fused

    n = 256
    cfg = _config.row_config(n, 8, _config.FWD)

    def plan(m):
        return _fused.fused_forward_plan((m, n), (n, 1), None, BFLOAT16, BFLOAT16, BFLOAT16, E4M3,
                                         numpy.dtype(numpy.float32), 1, op == "rms_norm", 0, ((0, 2), (0, 4)))

    resident = sm_count(0) * blocks_per_sm(plan(1).kernel, cfg.block)
    m = 2 * _config.FP8_FWD_GRID_WAVES * resident * cfg.rows_per_block + 3
    assert plan(m).grid * cfg.rows_per_block * 2 < m, "blocks walk several rows"
    hx = rng.standard_normal((m, n)).astype(BFLOAT16)
    hx[-1, 5] = 40.0  # |y| there is the tensor's largest
    _check_fused(op, rng, hx.shape, BFLOAT16, out_dtype=E4M3, scale=2.0, expect_fused=True, hx=hx)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [512, 1024, 2048, 4096, 8192])  # warp rows, two rows a block, a row a block
@pytest.mark.parametrize("fp8", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_fused_kernel_layer_norm_one_pass_falls_back(rng, n, fp8):
    # Half-precision LayerNorm rows with FP8 out take their statistics in one pass over x
    # (v95; about the row's first element before, v60) unless the row's mean lies far from
    # zero (mean^2 > 64 var); then the row, and every row that shares its warp or block
    # barriers, take the two passes. An outlier first element next to an ordinary row (one
    # pass now: its mean^2 / var is ~1e-3), a constant row, a +50 offset (two passes), a
    # 6-sigma first element, and a +7 offset (mean^2 / var = 49, one pass at the edge of its
    # trust), against the float64 reference. The outlier row's mean kept the pivot's wider
    # absolute tolerance (~2^-24 of a sum of x - pivot near 1e6), as the cluster forward's
    # test; over x its sum is ~1e3. At every N the +50 row sends the rows sharing its
    # barriers (all seven in a block, or its warp's) through the fallback.
    hx = rng.standard_normal((7, n)).astype(numpy.float32)
    hx[1, 0] = 1000.0  # ~1e3 sigma from the mean
    hx[2] = 3.0  # constant: var 0
    hx[3] += 50.0
    hx[4, 0] = 6.0
    hx[5] += 7.0
    hx = hx.astype(BFLOAT16)
    _check_fused("layer_norm", rng, hx.shape, BFLOAT16, out_dtype=fp8, scale=8.0, expect_fused=True, hx=hx,
                 mean_atol=50 * stats_tol(BFLOAT16))


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape", [(5, 7), (3, 65536), (2, 1 << 17)])
def test_composed_path(rng, op, shape):
    # odd N (pack width one) and rows past the full-row tile: the plain kernels composed
    _check_fused(op, rng, shape, BFLOAT16, r_dtype=BFLOAT16, h_dtype=numpy.float32, offset=1.0,
                 expect_fused=False)
    _check_fused(op, rng, shape, BFLOAT16, out_dtype=E4M3, scale=8.0, expect_fused=False)


@pytest.mark.gpu
def test_fused_float64_takes_the_composed_path(rng):
    _check_fused("layer_norm", rng, (4, 256), numpy.dtype(numpy.float64), r_dtype=numpy.float64, offset=0.5,
                 expect_fused=False)


# ---- the backward of the fused options ---------------------------------------------------------

@pytest.mark.parametrize("kw,err,name", [
    (dict(dh=numpy.zeros((3, 7), numpy.float32)), ValueError, "dh"),
    (dict(dh=numpy.zeros((3, 8), numpy.int32)), TypeError, "dh"),
    (dict(dx_dtype=numpy.int8), TypeError, "dx_dtype"),
    (dict(residual_dtype=numpy.complex64), TypeError, "residual_dtype"),
    (dict(weight_offset=math.nan), TypeError, "weight_offset"),
])
@pytest.mark.parametrize("op", OPS)
def test_backward_bad_options_name_the_argument(op, kw, err, name):
    x, w = numpy.ones((3, 8), numpy.float32), numpy.ones(8, numpy.float32)
    stats = numpy.ones(3, numpy.float32)
    with pytest.raises(err, match=name):
        if op == "layer_norm":
            cunorm.layer_norm_backward(x, x, w, stats, stats, **kw)
        else:
            cunorm.rms_norm_backward(x, x, w, stats, **kw)


def _grads(op, dy, h, w, stats, **kw):
    if op == "layer_norm":
        return cunorm.layer_norm_backward(dy, h, w, *stats, **kw)
    return cunorm.rms_norm_backward(dy, h, w, stats[-1], **kw)


def _fused_round_trip(op, rng, shape, dtype, xp):
    """A residual forward (h in float32, weight offset) and its backward with dh, on ``xp``
    arrays: (outputs, the float64 references of dx and dweight)."""
    n = shape[-1]
    hx = rng.standard_normal(shape).astype(dtype)
    hr = rng.standard_normal(shape).astype(dtype)
    hw = (0.1 * rng.standard_normal(n)).astype(numpy.float32)
    hb = rng.standard_normal(n).astype(numpy.float32) if op == "layer_norm" else None
    hdy = rng.standard_normal(shape).astype(dtype)
    hdh = rng.standard_normal(shape).astype(numpy.float32)
    x, r, w, dy, dh = (xp.asarray(a) for a in (hx, hr, hw, hdy, hdh))
    b = None if hb is None else xp.asarray(hb)
    fwd = _call(op, x, w, b, residual=r, residual_dtype=numpy.float32, weight_offset=1.0, return_stats=True)
    h, stats = fwd[1], fwd[2:]
    out = _grads(op, dy, h, w, stats, dh=dh, weight_offset=1.0, dx_dtype=dtype, residual_dtype=numpy.float32)
    h64 = hx.astype(numpy.float64) + hr.astype(numpy.float64)
    st64 = [to_numpy(s) for s in stats]
    if op == "layer_norm":
        want = reference.layer_norm_backward(hdy, h64, hw, *st64, dh=hdh, weight_offset=1.0)
    else:
        want = reference.rms_norm_backward(hdy, h64, hw, st64[-1], dh=hdh, weight_offset=1.0)
    return out, want


@pytest.mark.parametrize("op", OPS)
def test_numpy_residual_backward(rng, op):
    out, want = _fused_round_trip(op, rng, (4, 16), numpy.float32, numpy)
    dx, dr = out[0], out[-1]
    assert dx.dtype == numpy.float32 and dr.dtype == numpy.float32 and len(out) == (4 if op == "layer_norm" else 3)
    numpy.testing.assert_allclose(dx, want[0], rtol=1e-5, atol=1e-5)
    numpy.testing.assert_array_equal(dr, dx)
    numpy.testing.assert_allclose(out[1], want[1], rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape", [(37, 1024), (3, 65536)])
def test_residual_backward(rng, op, shape):
    import cupy

    out, want = _fused_round_trip(op, rng, shape, BFLOAT16, cupy)
    dx, dr = out[0], out[-1]
    assert dx.dtype == BFLOAT16 and dr.dtype == numpy.float32
    assert_close("dx", dx, want[0], *tol(BFLOAT16))
    # dr is float32 all the way (h, dh and the sum), against the float64 sum's reference
    assert_close("dresidual", dr, want[0], 1e-4, 1e-4)
    assert_close("dweight", out[1], want[1], *reduction_tol(numpy.dtype(numpy.float32), math.prod(shape[:-1])))


F16, F32 = numpy.dtype(numpy.float16), numpy.dtype(numpy.float32)
# (dy, h, dx) dtypes the fused backward compiles: h (with dh and the residual's gradient) in
# dy's dtype or float32, dx in dy's or h's
FUSED_BWD_TYPES = [(BFLOAT16, BFLOAT16, BFLOAT16), (F16, F16, F16), (F32, F32, F32),
                   (BFLOAT16, F32, BFLOAT16), (BFLOAT16, F32, F32), (F16, F32, F16)]


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("types", FUSED_BWD_TYPES, ids=lambda t: "-".join(d.name for d in t))
@pytest.mark.parametrize("shape", [(1, 8), (7, 2048), (499, 1024)])
@pytest.mark.parametrize("with_dh,offset,affine", [(True, 1.0, True), (False, 0.0, True), (True, 0.0, False)])
def test_fused_backward_kernel(rng, monkeypatch, op, types, shape, with_dh, offset, affine):
    _check_fused_backward(rng, monkeypatch, op, types, shape, with_dh, offset, affine)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("types", FUSED_BWD_TYPES[::3], ids=lambda t: "-".join(d.name for d in t))
@pytest.mark.parametrize("n", [504, 2048, 8184])
def test_fused_backward_staged_rows_walk_many(rng, monkeypatch, op, types, n):
    # half-precision dy: rows staged through shared memory, each staging of StagePolicy (warp
    # rows, 256-thread rows, 1024-thread rows with their statistics staged); 4099 rows, so
    # each persistent group walks several (132-1056 resident on the H200)
    _check_fused_backward(rng, monkeypatch, op, types, (4099, n), True, 1.0, True)


def _check_fused_backward(rng, monkeypatch, op, types, shape, with_dh, offset, affine):
    import cupy

    from cunorm.ops import _fused_cupy

    def no_composition(*args):
        raise AssertionError("the composed backward ran: the fused kernel should serve this call")

    monkeypatch.setattr(_fused_cupy, "_composed_backward", no_composition)
    dy_t, h_t, dx_t = types
    n = shape[-1]
    hh = rng.standard_normal(shape).astype(h_t)
    hdy = rng.standard_normal(shape).astype(dy_t)
    hdh = rng.standard_normal(shape).astype(h_t) if with_dh else None
    hw = (0.1 * rng.standard_normal(n) + (0 if offset else 1)).astype(F32) if affine else None
    h64 = hh.astype(numpy.float64)
    stats = reference.layer_norm(h64, None, None, 1e-5, return_stats=True)[1:] if op == "layer_norm" else \
        reference.rms_norm(h64, None, 1e-5, return_stats=True)[1:]
    stats = [s.astype(numpy.float32) for s in stats]
    kw = dict(dh=None if hdh is None else cupy.asarray(hdh), weight_offset=offset, dx_dtype=dx_t, residual_dtype=h_t)
    if op == "layer_norm":
        out = cunorm.layer_norm_backward(cupy.asarray(hdy), cupy.asarray(hh), None if hw is None else cupy.asarray(hw),
                                         *(cupy.asarray(s) for s in stats), has_bias=affine, **kw)
        want = reference.layer_norm_backward(hdy, h64, hw, *stats, has_bias=affine, dh=hdh, weight_offset=offset)
    else:
        out = cunorm.rms_norm_backward(cupy.asarray(hdy), cupy.asarray(hh), None if hw is None else cupy.asarray(hw),
                                       cupy.asarray(stats[-1]), **kw)
        want = reference.rms_norm_backward(hdy, h64, hw, stats[-1], dh=hdh, weight_offset=offset)
    dx, dres = out[0], out[-1]
    assert dx.dtype == dx_t and dres.dtype == h_t
    # float32 outputs come from float32 arithmetic on exact inputs: a few float32 steps of
    # the row sums
    close = (lambda d: (1e-4, 1e-4) if d == F32 else tol(d))
    assert_close("dx", dx, want[0], *close(dx_t))
    assert_close("dresidual", dres, want[0], *close(h_t))
    grads = [g for g in out[1:-1] if g is not None]
    for name, got, ref in zip(("dweight", "dbias"), grads, [g for g in want[1:] if g is not None]):
        assert got.dtype == F32
        assert_close(name, got, ref, *reduction_tol(F32, shape[0]))
    assert len(grads) == (0 if not affine else 2 if op == "layer_norm" else 1)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape", [(5, 1533), (3, 2049)])
def test_fused_backward_odd_rows_compose(rng, op, shape):
    # pack width one (odd N): the plain kernels composed, same results
    out, want = _fused_round_trip(op, rng, shape, BFLOAT16, __import__("cupy"))
    assert_close("dx", out[0], want[0], *tol(BFLOAT16))
    assert_close("dresidual", out[-1], want[0], 1e-4, 1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_fused_backward_float32_dy_of_bf16_h_composes_in_float32(rng, op):
    # out_dtype=float32 from bf16 x: dy is float32, h bf16; the composed backward must not
    # round dy to bf16 (it runs both in float32)
    import cupy

    shape = (9, 256)
    hh = rng.standard_normal(shape).astype(BFLOAT16)
    hdy = rng.standard_normal(shape).astype(numpy.float32)
    hw = rng.standard_normal(shape[-1]).astype(numpy.float32)
    h64 = hh.astype(numpy.float64)
    if op == "layer_norm":
        _, mean, rstd = reference.layer_norm(h64, None, None, 1e-5, return_stats=True)
        stats = [mean.astype(numpy.float32), rstd.astype(numpy.float32)]
        out = cunorm.layer_norm_backward(cupy.asarray(hdy), cupy.asarray(hh), cupy.asarray(hw),
                                         *(cupy.asarray(s) for s in stats), weight_offset=1.0)
        want = reference.layer_norm_backward(hdy, h64, hw, *stats, weight_offset=1.0)
    else:
        _, rstd = reference.rms_norm(h64, None, 1e-5, return_stats=True)
        stats = [rstd.astype(numpy.float32)]
        out = cunorm.rms_norm_backward(cupy.asarray(hdy), cupy.asarray(hh), cupy.asarray(hw),
                                       cupy.asarray(stats[0]), weight_offset=1.0, dx_dtype=numpy.float32)
        want = reference.rms_norm_backward(hdy, h64, hw, stats[0], weight_offset=1.0)
    dx = out[0]
    # dx_dtype float32 (rms) keeps float32 precision; bf16 dx is rounded once at the end
    assert_close("dx", dx, want[0], *((1e-4, 1e-4) if dx.dtype == numpy.float32 else tol(BFLOAT16)))


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_fused_forward_many_rows(rng, op):
    # 4099 rows of bf16 x with a residual kept in float32 and with FP8 out: more rows than
    # one wave of blocks, on the full-row tile
    _check_fused(op, rng, (4099, 2048), BFLOAT16, r_dtype=BFLOAT16, h_dtype=numpy.float32, offset=1.0,
                 expect_fused=True)
    _check_fused(op, rng, (4099, 2048), BFLOAT16, out_dtype=E4M3, scale=8.0, expect_fused=True)
