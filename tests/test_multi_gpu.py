"""A second GPU in every frontend (issue 8): inputs on device 1 give correct results there,
on that device's current stream, and leave device 0 alone — the caller's current device is
unchanged and nothing is allocated on device 0. Skipped with a reason on one-GPU machines.

Stream order is the device assertion: each call is queued on a non-blocking stream of
device 1 behind a spin and the copy that fills its input, so a launch on any other stream
or device reads the input before it is written and the values come out wrong."""
from __future__ import annotations

import numpy
import pytest

import cunorm
from cunorm._checks import BFLOAT16
from tolerances import assert_close, reduction_tol, tol

gpu = pytest.mark.gpu
SPIN_NS = 20_000_000  # 20 ms: far longer than queuing the calls behind it takes


def _two_gpus_or_skip():
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    if count < 2:
        pytest.skip(f"needs two GPUs: this machine has {count}")


def _spin(stream_ptr: int) -> None:
    from cunorm._bench import _spin as spin

    spin(SPIN_NS, stream_ptr)


def _pool_bytes_on_device0() -> int:
    import cupy

    with cupy.cuda.Device(0):
        return cupy.get_default_memory_pool().used_bytes()


def _cupy_calls(op, x, w, b, dy, r):
    """(name, outputs) of each CuPy call family on the same inputs (NumPy or CuPy)."""
    if op == "layer_norm":
        y, mean, rstd = cunorm.layer_norm(x, w, b, return_stats=True)
        grads = cunorm.layer_norm_backward(dy, x, w, mean, rstd)
        fused = cunorm.layer_norm(x, w, b, residual=r, weight_offset=1.0)
    elif op == "rms_norm":
        y, rstd = cunorm.rms_norm(x, w, return_stats=True)
        grads = cunorm.rms_norm_backward(dy, x, w, rstd)
        fused = cunorm.rms_norm(x, w, residual=r, weight_offset=1.0)
    else:
        x4, dy4, r4 = (a.reshape(8, 8, 32, -1) for a in (x, dy, r))  # N, C = 8, 8
        w, b = w[:8], b[:8]
        # no activation: a ReLU mask can flip where the float32 and float64 pre-activations
        # straddle zero, which is test_batch_norm's business, not this file's
        y, mean, rstd = cunorm.batch_norm(x4, w, b, residual=r4, return_stats=True)
        grads = cunorm.batch_norm_backward(dy4, x4, w, b, mean, rstd, residual=r4)
        return [("y", y)] + [(f"grad{i}", g) for i, g in enumerate(grads) if g is not None]
    return ([("y", y)] + [(f"grad{i}", g) for i, g in enumerate(grads) if g is not None]
            + [(f"fused{i}", g) for i, g in enumerate(fused)])


@gpu
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "batch_norm"])
@pytest.mark.parametrize("dtype", [numpy.float32, BFLOAT16], ids=["fp32", "bf16"])
def test_cupy_on_device_1(rng, op, dtype):
    _two_gpus_or_skip()
    import cupy

    shape = (64, 1024)
    host = [rng.standard_normal(shape).astype(dtype) for _ in range(3)]  # x, dy, residual
    w, b = (rng.standard_normal(shape[1]).astype(numpy.float32) for _ in range(2))
    want = dict(_cupy_calls(op, host[0], w, b, host[1], host[2]))
    before = _pool_bytes_on_device0()
    with cupy.cuda.Device(1):
        stream = cupy.cuda.Stream(non_blocking=True)
        src = [cupy.asarray(a) for a in host]
        dst = [cupy.zeros_like(a) for a in src]
        wd, bd = cupy.asarray(w), cupy.asarray(b)
        cupy.cuda.Device().synchronize()
        with stream:
            _spin(stream.ptr)
            for d, s in zip(dst, src):
                d[...] = s  # queued behind the spin: read early, the inputs are zeros
            got = _cupy_calls(op, dst[0], wd, bd, dst[1], dst[2])
        stream.synchronize()
    assert cupy.cuda.Device().id == 0, "the call changed the caller's current device"
    assert _pool_bytes_on_device0() == before, "memory was allocated on device 0"
    # x's tolerances throughout: a launch on the wrong stream or device reads zeros or
    # garbage, far outside them
    for name, out in got:
        assert out.device.id == 1, f"{name} is on device {out.device.id}"
        t = tol(dtype)
        if name.startswith("grad") and out.ndim == 1:  # dweight / dbias: sums over the rows
            t = reduction_tol(dtype, host[0].size // out.size)
        assert_close(f"{op} {name}", out, want[name], *t)


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_on_device_1(dtype):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import torch.nn.functional as F

    import cunorm.torch as ct

    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs two GPUs: torch sees {torch.cuda.device_count()}")
    dt = getattr(torch, dtype)
    dev = torch.device("cuda:1")
    torch.cuda.set_device(0)
    src = torch.randn(64, 1024, device=dev).to(dt)
    res = torch.randn(64, 1024, device=dev).to(dt)
    w = (1 + 0.1 * torch.randn(1024, device=dev)).requires_grad_()
    b = (0.1 * torch.randn(1024, device=dev)).requires_grad_()
    bn = ct.BatchNorm2d(8).to(dev)
    bn_ref = torch.nn.BatchNorm2d(8).to(dev)
    img = torch.randn(4, 8, 5, 7, device=dev)
    torch.cuda.synchronize(dev)
    before = torch.cuda.memory_allocated(0)
    stream = torch.cuda.Stream(device=dev)
    with torch.cuda.stream(stream):
        torch.cuda._sleep(50_000_000)  # cycles: holds the stream while the work below queues
        x = torch.zeros_like(src).copy_(src).requires_grad_()
        r = torch.zeros_like(res).copy_(res).requires_grad_()
        y_ln = ct.layer_norm(x, (1024,), w, b)
        y_rms = ct.rms_norm(x, (1024,), w)
        y_fused, h = ct.rms_norm(x, (1024,), w, residual=r, weight_offset=1.0)
        (y_ln.float().sum() + y_rms.float().square().sum() + y_fused.float().sum() + h.float().sum()).backward()
        y_bn = bn(img)
    stream.synchronize()
    assert torch.cuda.current_device() == 0, "the call changed the caller's current device"
    assert torch.cuda.memory_allocated(0) == before, "memory was allocated on device 0"
    for t in (y_ln, y_rms, y_fused, h, x.grad, r.grad, w.grad, b.grad, y_bn):
        assert t.device == dev

    # the same work in float64 with torch's own ops
    x64, r64 = (t.detach().double().requires_grad_() for t in (src, res))
    w64, b64 = (t.detach().double().requires_grad_() for t in (w, b))
    eps = torch.finfo(torch.float32).eps  # torch's rms_norm default for float32 and half inputs
    want_ln = F.layer_norm(x64, (1024,), w64, b64)
    want_rms = F.rms_norm(x64, (1024,), w64, eps)
    h64 = x64 + r64
    want_fused = F.rms_norm(h64, (1024,), w64 + 1.0, eps)
    (want_ln.sum() + want_rms.square().sum() + want_fused.sum() + h64.sum()).backward()
    t = tol(numpy.float32 if dt == torch.float32 else BFLOAT16)
    for name, got, ref in (("layer_norm", y_ln, want_ln), ("rms_norm", y_rms, want_rms),
                           ("fused y", y_fused, want_fused), ("fused h", h, h64)):
        assert_close(name, got, ref.detach(), *t)
    if dt == torch.float32:  # half inputs' gradients go through rounded h; the fp32 case checks the sums
        for name, got, ref in (("dx", x.grad, x64.grad), ("dresidual", r.grad, r64.grad)):
            assert_close(name, got, ref, 1e-3, 1e-3)
        assert_close("dbias", b.grad, b64.grad, *reduction_tol(numpy.float32, 64))
    assert_close("batch_norm", y_bn.detach(), bn_ref(img).detach(), 1e-4, 1e-4)
    # called with device 0 current (no stream or device context): the runtime's current
    # device is still 0 afterwards
    y_plain = ct.layer_norm(src, (1024,))
    assert torch.cuda.current_device() == 0, "the call left device 1 current"
    assert_close("layer_norm, device 0 current", y_plain, F.layer_norm(src.double(), (1024,)), *t)


@gpu
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_jax_on_device_1(op):
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    import jax.numpy as jnp

    import cunorm.jax as cj

    from jax_devices import gpus

    devices = gpus()
    if len(devices) < 2:
        pytest.skip(f"needs two GPUs: JAX sees {len(devices)}")
    rng = numpy.random.default_rng(0)
    hx, hdy = (rng.standard_normal((64, 1536)).astype(numpy.float32) for _ in range(2))
    hw = (1 + 0.1 * rng.standard_normal(1536)).astype(numpy.float32)
    x, dy, w = (jax.device_put(a, devices[1]) for a in (hx, hdy, hw))
    fn = (lambda x, w: cj.layer_norm(x, w)) if op == "layer_norm" else (lambda x, w: cj.rms_norm(x, w, 1e-6))
    y, vjp = jax.vjp(jax.jit(fn), x, w)
    dx, dw = vjp(dy)
    for a in (y, dx, dw):
        assert a.devices() == {devices[1]}
    if op == "layer_norm":  # the NumPy reference through the CuPy API's NumPy path
        want_y, mean, rstd = cunorm.layer_norm(hx, hw, None, return_stats=True)
        want_dx, want_dw = cunorm.layer_norm_backward(hdy, hx, hw, mean, rstd, has_bias=False)[:2]
    else:
        want_y, rstd = cunorm.rms_norm(hx, hw, 1e-6, return_stats=True)
        want_dx, want_dw = cunorm.rms_norm_backward(hdy, hx, hw, rstd)
    assert_close("y", numpy.asarray(y), want_y, *tol(numpy.float32))
    assert_close("dx", numpy.asarray(dx), want_dx, 1e-4, 1e-4)
    assert_close("dweight", numpy.asarray(dw), want_dw, *reduction_tol(numpy.float32, 64))
    # and under jit(grad): the same gradients
    loss = lambda x, w: jnp.vdot(fn(x, w), dy)  # noqa: E731
    gx, gw = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
    assert gx.devices() == {devices[1]}
    assert_close("jit(grad) dx", numpy.asarray(gx), want_dx, 1e-4, 1e-4)


@gpu
def test_arrays_on_two_devices_name_the_argument():
    _two_gpus_or_skip()
    import cupy

    # both devices named: the first two-GPU run of this test, with weight made on "the current
    # device", raised nothing (another test in the worker may have left device 1 current)
    current = cupy.cuda.runtime.getDevice()
    with cupy.cuda.Device(1):
        x = cupy.ones((2, 4), numpy.float32)
    with cupy.cuda.Device(0):
        w, zeros = cupy.ones(4, numpy.float32), cupy.zeros(4, numpy.float32)
    assert (x.device.id, w.device.id, x.data.device_id, w.data.device_id) == (1, 0, 1, 0), current
    with pytest.raises(ValueError, match="^weight: on cuda:0 where x is on cuda:1"):
        cunorm.layer_norm(x, w)
    with pytest.raises(ValueError, match="^running_mean: on cuda:0 where x is on cuda:1"):
        cunorm.batch_norm(x, running_mean=zeros, running_var=x[0].copy())
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import cunorm.torch as ct

    with pytest.raises(ValueError, match="^weight: on cuda:0, input on cuda:1"):
        ct.layer_norm(torch.ones(2, 4, device="cuda:1"), (4,), torch.ones(4, device="cuda:0"))
