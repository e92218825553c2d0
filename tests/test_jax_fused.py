"""The fused options from JAX (issue 7): residual add, weight offset, output dtype, FP8 with
scale and amax — under jit, grad and vmap on CPU JAX (the reference behind the callbacks) and
on the GPU, against a jax.numpy composition."""
from __future__ import annotations

import math

import ml_dtypes
import numpy
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed (pip install jax)")
import jax.numpy as jnp  # noqa: E402

import cunorm.jax as cj  # noqa: E402
from cunorm import reference  # noqa: E402
from jax_devices import gpu_or_skip  # noqa: E402
from tolerances import assert_close, fp8_step, reduction_tol, tol  # noqa: E402

OPS = ["layer_norm", "rms_norm"]


@pytest.fixture
def cpu():
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def _call(op, x, w, b=None, **kw):
    return cj.layer_norm(x, w, b, **kw) if op == "layer_norm" else cj.rms_norm(x, w, 1e-6, **kw)


def _composition(op, x, r, w, b, offset):
    """jax.numpy in float32: (y, h)."""
    h = x.astype(jnp.float32) + r.astype(jnp.float32)
    w = w.astype(jnp.float32) + offset
    if op == "layer_norm":
        mean = h.mean(-1, keepdims=True)
        y = (h - mean) * jax.lax.rsqrt(((h - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * w + b
    else:
        y = h * jax.lax.rsqrt((h * h).mean(-1, keepdims=True) + 1e-6) * w
    return y, h


def _inputs(shape, dtype, key=0):
    k = jax.random.split(jax.random.key(key), 5)
    n = shape[-1]
    x = jax.random.normal(k[0], shape).astype(dtype)
    r = jax.random.normal(k[1], shape).astype(dtype)
    w = 0.1 * jax.random.normal(k[2], (n,))
    b = 0.1 * jax.random.normal(k[3], (n,))
    dy = jax.random.normal(k[4], shape)
    return x, r, w, b, dy


def _check_residual(op, shape, dtype, h_dtype, transform=lambda f: f):
    x, r, w, b, dy = _inputs(shape, dtype)
    b = b if op == "layer_norm" else None

    def ours(x, r, w, b):
        return _call(op, x, w, b, residual=r, residual_dtype=h_dtype, weight_offset=1.0)

    def theirs(x, r, w, b):
        y, h = _composition(op, x, r, w, 0 if b is None else b, 1.0)
        return y.astype(dtype), h.astype(h_dtype or dtype)

    y, h = transform(ours)(x, r, w, b)
    y_ref, h_ref = theirs(x, r, w, b)
    assert y.dtype == dtype and h.dtype == (h_dtype or dtype)
    rt, at = tol(numpy.dtype(dtype))
    assert_close("y", numpy.asarray(y.astype(jnp.float32)), numpy.asarray(y_ref.astype(jnp.float32)), rt, at)
    assert_close("h", numpy.asarray(h.astype(jnp.float32)), numpy.asarray(h_ref.astype(jnp.float32)),
                 *tol(numpy.dtype(h.dtype)))

    def loss(f):
        def run(x, r, w, b):
            y, h = f(x, r, w, b)
            return (y.astype(jnp.float32) * dy).sum() + (h.astype(jnp.float32) * dy[::-1]).sum()
        return run

    args = (0, 1, 2, 3) if b is not None else (0, 1, 2)
    g = transform(jax.grad(loss(ours), args))(x, r, w, b)
    g_ref = jax.grad(loss(theirs), args)(x, r, w, b)
    for name, a, want in zip(("dx", "dresidual"), g[:2], g_ref[:2]):
        assert a.dtype == dtype
        assert_close(name, numpy.asarray(a.astype(jnp.float32)), numpy.asarray(want.astype(jnp.float32)), rt, 4 * at)
    # the fused kernel's backward reads h rounded to its dtype, the composition's x_hat comes
    # from the exact sum: with h in half precision each x_hat is off by up to half an ulp of h,
    # so dweight is a reduction over h's dtype (measured 4.7e-3 off at (7, 2048) bf16, where
    # float32's allowance is 3.8e-3; torch's test rounds h in its reference, so needs less)
    rtol, atol = reduction_tol(h.dtype if numpy.dtype(h.dtype).itemsize == 2 else numpy.float32,
                               math.prod(shape[:-1]))
    for name, a, want in zip(("dweight", "dbias"), g[2:], g_ref[2:]):
        assert_close(name, numpy.asarray(a), numpy.asarray(want), rtol, atol)


# ---- CPU wiring -------------------------------------------------------------------------------

@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_cpu_residual_offset_values_and_grads(cpu, op, jit):
    _check_residual(op, (3, 5, 24), jnp.float32, None, jax.jit if jit else (lambda f: f))


def test_cpu_residual_stream_in_float32(cpu):
    _check_residual("rms_norm", (4, 32), jnp.bfloat16, jnp.float32)


@pytest.mark.parametrize("fp8", [jnp.float8_e4m3fn, jnp.float8_e5m2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("scale", [1.0, 1e4])
def test_cpu_fp8_output_scale_and_amax(cpu, fp8, scale):
    x = jax.random.normal(jax.random.key(3), (6, 32)).astype(jnp.bfloat16)
    q, amax = jax.jit(lambda x: cj.layer_norm(x, out_dtype=fp8, out_scale=scale, return_amax=True))(x)
    assert q.dtype == fp8 and amax.dtype == jnp.float32 and amax.shape == ()
    y64 = reference.layer_norm(numpy.asarray(x), None, None, 1e-5)
    want, amax_ref = reference.quantize(y64, numpy.dtype(fp8), scale)
    got = numpy.asarray(q).astype(numpy.float64)
    assert not (numpy.abs(got - want) > fp8_step(want, numpy.dtype(fp8)) * 1.001).any()
    assert float(amax) == pytest.approx(amax_ref, rel=1e-6)
    assert numpy.abs(got).max() <= float(ml_dtypes.finfo(numpy.dtype(fp8)).max)


def test_cpu_vmap_over_a_residual(cpu):
    x, r, w, _, _ = _inputs((3, 4, 16), jnp.float32)
    f = jax.vmap(lambda x, r: cj.rms_norm(x, w, residual=r)[0])
    want = jax.vmap(lambda x, r: cj.rms_norm(x + r, w))(x, r)
    assert_close("vmap", numpy.asarray(f(x, r)), numpy.asarray(want), 2e-6, 2e-6)


@pytest.mark.parametrize("kw,error,name", [
    (dict(residual=jnp.ones((2, 3))), ValueError, "residual"),
    (dict(residual=jnp.ones((2, 4), jnp.int32)), TypeError, "residual"),
    (dict(residual=object()), TypeError, "residual"),
    (dict(residual_dtype=jnp.float32), ValueError, "residual_dtype"),
    (dict(out_dtype=jnp.int8), TypeError, "out_dtype"),
    (dict(out_scale=2.0), ValueError, "out_scale"),
    (dict(return_amax=True), ValueError, "return_amax"),
    (dict(weight_offset=math.inf), TypeError, "weight_offset"),
])
def test_cpu_bad_fused_options_name_the_argument(cpu, kw, error, name):
    with pytest.raises(error, match=rf"^{name}\b"):
        cj.layer_norm(jnp.ones((2, 4)), jnp.ones(4), **kw)


# ---- GPU --------------------------------------------------------------------------------------

def _kernel_against_composed(op, shape, dtype, h_dtype, residual=True, batch=None):
    """The fused-kernel path (asserted taken) against the composed one, values and gradients
    under jit (and vmap over a leading axis of x and r when ``batch``)."""
    from cunorm.jax import _fused_kernel

    x, r, w, b, dy = _inputs((batch, *shape) if batch else shape, dtype)
    b = b if op == "layer_norm" else None
    kw = dict(residual=r if residual else None, residual_dtype=h_dtype if residual else None, weight_offset=1.0)

    def loss(x, r, w, b):
        f = lambda x, r: _call(op, x, w, b, **dict(kw, residual=r if residual else None))  # noqa: E731
        out = jax.vmap(f)(x, r) if batch else f(x, r)
        y, h = out if residual else (out, x)
        return (y.astype(jnp.float32) * dy).sum() + (h.astype(jnp.float32) * dy[..., ::-1]).sum()

    args = (0, 1, 2, 3) if b is not None else (0, 1, 2)
    taken = []
    real = _fused_kernel.fused_norm
    try:
        _fused_kernel.fused_norm = lambda *a: taken.append(1) or real(*a)
        got = jax.jit(jax.value_and_grad(loss, args))(x, r, w, b)
    finally:
        _fused_kernel.fused_norm = real
    assert taken, "the fused kernel path was not taken"
    serves = _fused_kernel.serves
    try:
        _fused_kernel.serves = lambda *a: False
        want = jax.jit(jax.value_and_grad(loss, args))(x, r, w, b)
    finally:
        _fused_kernel.serves = serves
    # the composed path normalizes h rounded to its dtype (the kernel, the exact sum) and its
    # own reduction order: y may differ by an ulp of its dtype, summed over y's elements
    # (measured 0.06-0.21 off on losses of 9-203 at (7, 2048) bf16)
    assert_close("loss", numpy.asarray(got[0]), numpy.asarray(want[0]), 1e-3,
                 reduction_tol(numpy.dtype(dtype), x.size)[1])
    rt, at = tol(numpy.dtype(dtype))
    for name, a, ref in zip(("dx", "dresidual", "dweight", "dbias"), got[1], want[1]):
        scale = math.sqrt(math.prod(x.shape[:-1])) if a.ndim == 1 else 1.0
        assert a.dtype == ref.dtype, name
        assert_close(name, numpy.asarray(a.astype(jnp.float32)), numpy.asarray(ref.astype(jnp.float32)), rt,
                     4 * at * scale)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("case", ["residual", "h-fp32", "offset-only", "vmap"])
def test_cpu_fused_kernel_path_matches_the_composition(cpu, op, case):
    # without a GPU the fused callbacks run the references: the wiring (outputs, custom_vjp,
    # vmap's batch axes) is what this checks
    _kernel_against_composed(op, (5, 16), jnp.float32, jnp.float32 if case == "h-fp32" else None,
                             residual=case != "offset-only", batch=3 if case == "vmap" else None)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("case", ["bf16", "bf16-h-fp32", "fp32", "offset-only", "vmap"])
def test_gpu_fused_kernel_path_matches_the_composition(op, case):
    with jax.default_device(gpu_or_skip()):
        dtype = jnp.float32 if case == "fp32" else jnp.bfloat16
        _kernel_against_composed(op, (7, 2048), dtype, jnp.float32 if case == "bf16-h-fp32" else None,
                                 residual=case != "offset-only", batch=3 if case == "vmap" else None)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype,h_dtype", [(jnp.bfloat16, None), (jnp.bfloat16, jnp.float32), (jnp.float32, None)],
                         ids=["bf16", "bf16-h-fp32", "fp32"])
@pytest.mark.parametrize("shape", [(7, 2048), (5, 1533)])
def test_gpu_residual_values_and_grads(op, dtype, h_dtype, shape):
    with jax.default_device(gpu_or_skip()):
        _check_residual(op, shape, dtype, h_dtype, jax.jit)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [jnp.float8_e4m3fn, jnp.float8_e5m2], ids=["e4m3", "e5m2"])
def test_gpu_fp8_output(fp8):
    with jax.default_device(gpu_or_skip()):
        x = jax.random.normal(jax.random.key(4), (65, 2048)).astype(jnp.bfloat16)
        q, amax = jax.jit(lambda x: cj.rms_norm(x, out_dtype=fp8, out_scale=8.0, return_amax=True))(x)
        y64 = reference.rms_norm(numpy.asarray(x), None, float(jnp.finfo(jnp.float32).eps))  # bf16's default
        want, amax_ref = reference.quantize(y64, numpy.dtype(fp8), 8.0)
        got = numpy.asarray(q).astype(numpy.float64)
        assert not (numpy.abs(got - want) > fp8_step(want, numpy.dtype(fp8)) * 1.001).any()
        assert float(amax) == pytest.approx(amax_ref, rel=1e-2)
