"""The fused options from torch (issue 7): residual add, weight offset, output dtype, FP8 with
scale and amax — CPU wiring (values, gradcheck, opcheck, compile, argument checks) and, on the
GPU, the fused kernels and the composed path against a float64 torch composition."""
from __future__ import annotations

import math

import ml_dtypes
import numpy
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
import torch.nn.functional as F  # noqa: E402

import cunorm.torch as ct  # noqa: E402
from cunorm import reference  # noqa: E402
from tolerances import assert_close, fp8_step, reduction_tol, tol  # noqa: E402

OPS = ["layer_norm", "rms_norm"]
FP8 = {torch.float8_e4m3fn: numpy.dtype(ml_dtypes.float8_e4m3fn), torch.float8_e5m2: numpy.dtype(ml_dtypes.float8_e5m2)}


def _call(op, x, w, b=None, **kw):
    n = x.shape[-1]
    return ct.layer_norm(x, (n,), w, b, **kw) if op == "layer_norm" else ct.rms_norm(x, (n,), w, **kw)


def _default_rms_eps(dtype) -> float:
    """torch.nn.functional.rms_norm's eps=None for x of this dtype: its computation dtype's
    epsilon (float32's for half inputs)."""
    return torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps


def _composition(op, x, r, w, b, offset, eps=None, h_dtype=None):
    """torch's unfused ops in float64: (y, h). With h_dtype, h is rounded to it as stored (the
    gradient passes the rounding unchanged), so dweight sees the h the backward reads."""
    h = x.double() + (0 if r is None else r.double())
    if h_dtype is not None:
        h = h + (h.to(h_dtype).double() - h).detach()
    n = x.shape[-1]
    w64 = None if w is None else w.double() + offset
    if op == "layer_norm":
        return F.layer_norm(h, (n,), w64, None if b is None else b.double()), h
    return F.rms_norm(h, (n,), w64, _default_rms_eps(x.dtype) if eps is None else eps), h


# ---- CPU wiring -------------------------------------------------------------------------------

@pytest.mark.parametrize("op", OPS)
def test_cpu_residual_and_offset_match_the_composition(op):
    x, r = torch.randn(5, 12, dtype=torch.float64), torch.randn(5, 12, dtype=torch.float64)
    w, b = torch.randn(12, dtype=torch.float64), torch.randn(12, dtype=torch.float64)
    y, h = _call(op, x, w, b if op == "layer_norm" else None, residual=r, weight_offset=1.0)
    y64, h64 = _composition(op, x, r, w, b, 1.0)
    torch.testing.assert_close(y, y64)
    torch.testing.assert_close(h, h64)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("residual", [True, False])
def test_cpu_fused_gradcheck(op, residual):
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    r = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)

    def f(x, r, w, b):
        return _call(op, x, w, b if op == "layer_norm" else None, residual=r if residual else None,
                     weight_offset=0.5)

    assert torch.autograd.gradcheck(f, (x, r, w, b) if op == "layer_norm" else (x, r, w, None))


def test_cpu_residual_stream_in_float32():
    x, r = torch.randn(4, 16).bfloat16().requires_grad_(), torch.randn(4, 16).bfloat16().requires_grad_()
    w = torch.ones(16, requires_grad=True)
    y, h = ct.rms_norm(x, (16,), w, residual=r, residual_dtype=torch.float32)
    assert y.dtype == torch.bfloat16 and h.dtype == torch.float32
    (y.float().sum() + h.sum()).backward()
    assert x.grad.dtype == torch.bfloat16 and r.grad.dtype == torch.bfloat16 and w.grad.dtype == torch.float32
    torch.testing.assert_close(x.grad, r.grad)  # h = x + r: one gradient for both


@pytest.mark.parametrize("fp8", list(FP8), ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("scale", [1.0, 1e4])
def test_cpu_fp8_output_scale_and_amax(fp8, scale):
    x = torch.randn(6, 32).bfloat16().requires_grad_()
    q, amax = ct.layer_norm(x, (32,), out_dtype=fp8, out_scale=scale, return_amax=True)
    assert q.dtype == fp8 and amax.dtype == torch.float32 and amax.shape == ()
    assert not q.requires_grad and not amax.requires_grad, "quantized outputs and amax carry no gradient"
    y64 = reference.layer_norm(x.detach().double().numpy(), None, None, 1e-5)
    want, amax_ref = reference.quantize(y64, FP8[fp8], scale)
    numpy.testing.assert_array_equal(q.float().numpy(), want.astype(numpy.float32))
    assert float(amax) == pytest.approx(amax_ref, rel=1e-6)
    top = float(ml_dtypes.finfo(FP8[fp8]).max)
    assert q.float().abs().max() <= top


def test_cpu_out_dtype():
    x = torch.randn(3, 8).bfloat16()
    assert ct.layer_norm(x, (8,), out_dtype=torch.float32).dtype == torch.float32
    assert ct.rms_norm(x.float(), (8,), out_dtype=torch.bfloat16).dtype == torch.bfloat16


def _opcheck_args(device):
    x = torch.randn(3, 8, device=device, requires_grad=True)
    r = torch.randn(3, 8, device=device, requires_grad=True)
    w = torch.randn(8, device=device, requires_grad=True)
    fwd = (x, r, w, None, 1, True, 1e-6, torch.float32, 1.0, torch.float32, 1.0, False, True)
    y, h, stats, _ = torch.ops.cunorm.fused_norm_fwd(*fwd)
    bwd = (torch.randn_like(y), torch.randn_like(h), h.detach(), w.detach(), stats, 1, True, False, 1.0,
           torch.float32, torch.float32)
    inference = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in fwd[:-1]) + (False,)
    return [(torch.ops.cunorm.fused_norm_fwd.default, fwd), (torch.ops.cunorm.fused_norm_bwd.default, bwd),
            (torch.ops.cunorm.fused_norm_fwd.default, inference)]


def _inference_skips_statistics(device):
    """Without a backward to come (no_grad, or nothing requiring grad) the fused forward
    writes no statistics and gives the same outputs."""
    x, r = torch.randn(5, 64, device=device), torch.randn(5, 64, device=device)
    w = torch.randn(64, device=device)
    for op, args in (("layer_norm", (w, torch.randn(64, device=device))), ("rms_norm", (w,))):
        rms = op == "rms_norm"
        full = torch.ops.cunorm.fused_norm_fwd(x, r, *args, *((None,) if rms else ()), 1, rms, 1e-5, x.dtype, 1.0,
                                               x.dtype, 1.0, False, True)
        lean = torch.ops.cunorm.fused_norm_fwd(x, r, *args, *((None,) if rms else ()), 1, rms, 1e-5, x.dtype, 1.0,
                                               x.dtype, 1.0, False, False)
        assert full[2].numel() == 5 * (1 if rms else 2) and lean[2].numel() == 0
        torch.testing.assert_close(lean[0], full[0], rtol=0, atol=0)
        torch.testing.assert_close(lean[1], full[1], rtol=0, atol=0)
        y, h = getattr(ct, op)(x, (64,), *args, 1e-5, residual=r, weight_offset=1.0)  # nothing requires grad
        torch.testing.assert_close(y, full[0], rtol=0, atol=0)


def test_cpu_inference_skips_statistics():
    _inference_skips_statistics("cpu")


def test_cpu_fused_opcheck():
    for op, args in _opcheck_args("cpu"):
        torch.library.opcheck(op, args)


def test_cpu_fused_compile_fullgraph():
    def block(x, r, w):
        y, h = ct.rms_norm(x, (8,), w, residual=r, weight_offset=1.0)
        return (y * 2).sum() + h.sum()

    x, r, w = (torch.randn(4, 8, requires_grad=True), torch.randn(4, 8, requires_grad=True),
               torch.randn(8, requires_grad=True))
    compiled = torch.compile(block, fullgraph=True)
    out = compiled(x, r, w)
    torch.testing.assert_close(out, block(x, r, w))
    out.backward()
    assert x.grad is not None and r.grad is not None and w.grad is not None


@pytest.mark.parametrize("kw,error,name", [
    (dict(residual=torch.ones(2, 3)), ValueError, "residual"),
    (dict(residual=torch.ones(2, 4, dtype=torch.int32)), TypeError, "residual"),
    (dict(residual=[1.0]), TypeError, "residual"),
    (dict(residual_dtype=torch.float32), ValueError, "residual_dtype"),
    (dict(residual=torch.ones(2, 4), residual_dtype=torch.int8), TypeError, "residual_dtype"),
    (dict(residual=torch.ones(2, 4), residual_dtype="float32"), TypeError, "residual_dtype"),
    (dict(out_dtype=torch.int8), TypeError, "out_dtype"),
    (dict(out_scale=2.0), ValueError, "out_scale"),
    (dict(out_dtype=torch.float8_e4m3fn, out_scale=-1.0), ValueError, "out_scale"),
    (dict(return_amax=True), ValueError, "return_amax"),
    (dict(weight_offset=math.nan), TypeError, "weight_offset"),
])
def test_cpu_bad_fused_options_name_the_argument(kw, error, name):
    with pytest.raises(error, match=rf"^{name}\b"):
        ct.layer_norm(torch.ones(2, 4), (4,), torch.ones(4), **kw)


def test_cpu_weight_offset_needs_a_weight():
    with pytest.raises(ValueError, match="^weight_offset"):
        ct.rms_norm(torch.ones(2, 4), (4,), weight_offset=1.0)


# ---- GPU --------------------------------------------------------------------------------------

gpu = pytest.mark.gpu
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _cuda_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")


def _np(dtype):
    return ct._NUMPY_DTYPE[dtype]


@gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("shape", [(7, 2048), (499, 1024), (5, 1533)])  # the last: odd N, composed
@pytest.mark.parametrize("h_dtype", [None, torch.float32], ids=["h-as-x", "h-fp32"])
def test_gpu_residual_forward_and_backward(op, dtype, shape, h_dtype):
    _cuda_or_skip()
    n = shape[-1]
    x = torch.randn(shape, device="cuda").to(dtype).requires_grad_()
    r = torch.randn(shape, device="cuda").to(dtype).requires_grad_()
    w = (0.1 * torch.randn(n, device="cuda")).requires_grad_()
    b = torch.randn(n, device="cuda").requires_grad_() if op == "layer_norm" else None
    y, h = _call(op, x, w, b, residual=r, residual_dtype=h_dtype, weight_offset=1.0)
    assert y.dtype == dtype and h.dtype == (h_dtype or dtype)
    dy, dh = torch.randn_like(y), torch.randn_like(h)
    torch.autograd.backward((y, h), (dy, dh))
    leaves = [t for t in (x, r, w, b) if t is not None]
    ref = [t.detach().double().requires_grad_() for t in leaves]
    y64, h64 = _composition(op, ref[0], ref[1], ref[2], ref[3] if b is not None else None, 1.0,
                            eps=_default_rms_eps(dtype), h_dtype=h.dtype)
    torch.autograd.backward((y64, h64), (dy.double(), dh.double()))
    assert_close("y", y.detach(), y64.detach().cpu().numpy(), *tol(_np(dtype)))
    assert_close("h", h.detach(), h64.detach().cpu().numpy(), *tol(_np(h.dtype)))
    # dx and dr are one float32 gradient rounded to x's and r's dtype
    for name, got, want in (("dx", x.grad, ref[0].grad), ("dresidual", r.grad, ref[1].grad)):
        assert_close(name, got, want.cpu().numpy(), *tol(_np(dtype)))
    rtol, atol = reduction_tol(numpy.float32, shape[0])
    if h.dtype != torch.float32:
        # the statistics come from the exact float32 sum, the backward reads h rounded to its
        # dtype: a row's normalized h is off by the mean rounding (about tol(h) / sqrt(N)),
        # and dweight sums that over the rows; x 4 for the tails (|dy * x_hat| reaches ~9 in a
        # few of 1533 columns: measured 1e-3 off at (5, 1533) bf16 against 0.9e-3 without it)
        atol += 4 * tol(_np(h.dtype))[1] * math.sqrt(shape[0] / n)
    for name, got, want in zip(("dweight", "dbias"), (w.grad, None if b is None else b.grad), ref[2:]):
        if got is not None:
            assert_close(name, got, want.grad.cpu().numpy(), rtol, atol)


@gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("fp8", list(FP8), ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("n", [2048, 1533])
def test_gpu_fp8_output(op, fp8, n):
    _cuda_or_skip()
    x = torch.randn(65, n, device="cuda").bfloat16()
    w = torch.rand(n, device="cuda")
    q, amax = _call(op, x, w, out_dtype=fp8, out_scale=8.0, return_amax=True)
    assert q.dtype == fp8 and q.device == x.device
    y64, _ = _composition(op, x, None, w, None, 0.0, eps=_default_rms_eps(x.dtype))
    want, amax_ref = reference.quantize(y64.cpu().numpy(), FP8[fp8], 8.0)
    got = q.float().cpu().numpy().astype(numpy.float64)
    bad = numpy.abs(got - want) > fp8_step(want, FP8[fp8]) * 1.001
    assert not bad.any(), f"FP8 y off by more than one FP8 step at {numpy.argwhere(bad)[:5].tolist()}"
    assert float(amax) == pytest.approx(amax_ref, rel=1e-2)


@gpu
def test_gpu_inference_skips_statistics():
    _cuda_or_skip()
    _inference_skips_statistics("cuda")


@gpu
def test_gpu_fused_opcheck():
    _cuda_or_skip()
    for op, args in _opcheck_args("cuda"):
        torch.library.opcheck(op, args)


@gpu
def test_gpu_fused_compile_fullgraph():
    _cuda_or_skip()

    def block(x, r, w):
        y, h = ct.rms_norm(x, (256,), w, residual=r, residual_dtype=torch.float32)
        return y.float().sum() + h.sum()

    x, r = (torch.randn(16, 256, device="cuda").bfloat16().requires_grad_() for _ in range(2))
    w = torch.randn(256, device="cuda", requires_grad=True)
    out = torch.compile(block, fullgraph=True)(x, r, w)
    torch.testing.assert_close(out, block(x, r, w), rtol=1e-3, atol=1e-2)
    out.backward()
    assert x.grad is not None and r.grad is not None and w.grad is not None
