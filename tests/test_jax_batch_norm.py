"""cunorm.jax.batch_norm: the CuPy API's BatchNorm on JAX arrays (jit, grad, vmap), against
the float64 NumPy reference. CPU JAX runs the reference behind the same buffer callbacks
(the wiring: output structure, running statistics, gradients, vmap, argument checks); the
GPU tests run the kernels on XLA's buffers, both layouts, half precision with float32
parameters."""
from __future__ import annotations

import numpy
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed (pip install jax)")
import jax.numpy as jnp  # noqa: E402

import cunorm.jax as cj  # noqa: E402
from cunorm import reference  # noqa: E402
from jax_devices import gpu_or_skip  # noqa: E402
from tolerances import assert_close, reduction_tol, tol  # noqa: E402


@pytest.fixture
def cpu():
    with jax.default_device(jax.devices("cpu")[0]):
        yield


@pytest.fixture
def gpu():
    with jax.default_device(gpu_or_skip()):
        yield


def _inputs(shape, axis, dtype, key=0, pdtype=jnp.float32):
    k = jax.random.split(jax.random.key(key), 6)
    c = shape[axis]
    x = (jax.random.normal(k[0], shape) + 0.5).astype(dtype)
    w = (1 + 0.2 * jax.random.normal(k[1], (c,))).astype(pdtype)
    b = (0.2 * jax.random.normal(k[2], (c,))).astype(pdtype)
    r = jax.random.normal(k[3], shape).astype(dtype)
    rm = (0.1 * jax.random.normal(k[4], (c,))).astype(jnp.float32)
    rv = (1 + 0.1 * jax.random.uniform(k[5], (c,))).astype(jnp.float32)
    return x, w, b, r, rm, rv


def _h(a):
    return None if a is None else numpy.asarray(a.astype(jnp.float32) if a.dtype == jnp.bfloat16 else a,
                                                 dtype=numpy.float64)


def _check(shape, axis, dtype, training, residual, activation, param=None, jit=False, params=True):
    x, w, b, r, rm, rv = _inputs(shape, axis, dtype)
    w, b = (w, b) if params else (None, None)
    r = r if residual else None
    kw = dict(training=training, residual=r, activation=activation, activation_param=param, channel_axis=axis,
              momentum=0.25, return_stats=True)
    call = (lambda *a: cj.batch_norm(*a, **kw)) if not jit else jax.jit(lambda *a: cj.batch_norm(*a, **kw))
    out = call(x, w, b, rm, rv)
    hrm, hrv = _h(rm), _h(rv)
    ry, rmean, rrstd = reference.batch_norm(_h(x), _h(w), _h(b), hrm, hrv, training=training, momentum=0.25,
                                            residual=_h(r), activation=activation, activation_param=param,
                                            channel_axis=axis, return_stats=True)
    if training:
        y, new_rm, new_rv, mean, rstd = out
        assert new_rm.dtype == rm.dtype and new_rv.dtype == rv.dtype
        assert_close("running_mean", numpy.asarray(new_rm), hrm, 1e-5, 1e-6)
        assert_close("running_var", numpy.asarray(new_rv), hrv, 1e-5, 1e-6)
    else:
        y, mean, rstd = out
    assert y.dtype == x.dtype and y.shape == x.shape
    rtol, atol = tol(numpy.dtype(dtype))
    assert_close("y", numpy.asarray(y.astype(jnp.float32)), ry, rtol, atol)
    assert_close("mean", numpy.asarray(mean), rmean, 1e-5, 1e-5)
    assert_close("rstd", numpy.asarray(rstd), rrstd, 1e-4, 1e-5)

    # gradients of a random projection of y, against the reference backward
    dy = jax.random.normal(jax.random.key(9), shape).astype(dtype)
    args = [x, w, b] + ([r] if residual else [])

    def f(x, w, b, *rest):
        return cj.batch_norm(x, w, b, rm, rv, training=training, residual=rest[0] if rest else None,
                             activation=activation, activation_param=param, channel_axis=axis, momentum=0.25)[0] \
            if training else cj.batch_norm(x, w, b, rm, rv, training=False, residual=rest[0] if rest else None,
                                           activation=activation, activation_param=param, channel_axis=axis)

    _, vjp = jax.vjp(f, *args)
    grads = vjp(dy)
    rdx, rdw, rdb, rdr = reference.batch_norm_backward(
        _h(dy), _h(x), _h(w), _h(b), numpy.asarray(mean, numpy.float64), numpy.asarray(rstd, numpy.float64),
        residual=_h(r), activation=activation, activation_param=param, training=training, channel_axis=axis)
    count = x.size // shape[axis]
    assert_close("dx", numpy.asarray(grads[0].astype(jnp.float32)), rdx, rtol, 4 * atol * float(numpy.max(rstd)))
    if params:
        for name, g, want in (("dweight", grads[1], rdw), ("dbias", grads[2], rdb)):
            assert g.dtype == w.dtype
            assert_close(name, numpy.asarray(g), want, *reduction_tol(numpy.float32 if dtype != jnp.float64
                                                                      else numpy.float64, count))
    if residual:
        assert_close("dresidual", numpy.asarray(grads[-1].astype(jnp.float32)), rdr, rtol, atol)


CASES = [((6, 3, 5, 7), 1), ((6, 5, 7, 3), -1), ((9, 4), 1), ((2, 3, 4, 5, 2), 1)]


@pytest.mark.parametrize("shape,axis", CASES, ids=["nchw", "nhwc", "nc", "ncdhw"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_cpu_values_running_statistics_and_grads(cpu, shape, axis, training):
    _check(shape, axis, jnp.float32, training, residual=False, activation=None)


@pytest.mark.parametrize("activation,param", [("relu", None), ("leaky_relu", 0.2), ("gelu", None), ("silu", None)])
def test_cpu_residual_and_activation(cpu, activation, param):
    _check((4, 3, 6, 5), 1, jnp.float32, True, residual=True, activation=activation, param=param)


def test_cpu_jit_bfloat16_without_parameters(cpu):
    _check((4, 6, 3, 3), -1, jnp.bfloat16, True, residual=True, activation="relu", jit=True, params=False)


def test_cpu_outputs_without_running_statistics_or_stats(cpu):
    x, w, b, _, rm, rv = _inputs((4, 3, 5), 1, jnp.float32)
    y = cj.batch_norm(x, w, b)
    assert not isinstance(y, tuple) and y.shape == x.shape
    y2, new_rm, new_rv = cj.batch_norm(x, w, b, rm, None)  # only a running mean: its update, None for the other
    assert new_rv is None and new_rm.shape == rm.shape
    assert_close("y", numpy.asarray(y2), numpy.asarray(y), 0, 0)


def test_cpu_momentum_zero_returns_the_running_statistics_unchanged(cpu):
    x, _, _, _, rm, rv = _inputs((4, 3, 5), 1, jnp.float32)
    y, new_rm, new_rv = cj.batch_norm(x, None, None, rm, rv, momentum=0.0)
    assert bool((new_rm == rm).all()) and bool((new_rv == rv).all())


def test_cpu_cumulative_average_needs_the_batch_count(cpu):
    x, _, _, _, rm, rv = _inputs((4, 3, 5), 1, jnp.float32)
    _, new_rm, new_rv = cj.batch_norm(x, None, None, rm, rv, momentum=None, num_batches_tracked=4)
    hrm, hrv = _h(rm), _h(rv)
    reference.batch_norm(_h(x), None, None, hrm, hrv, momentum=None, num_batches_tracked=4)
    assert_close("running_mean", numpy.asarray(new_rm), hrm, 1e-6, 1e-7)
    with pytest.raises(ValueError, match="num_batches_tracked"):
        cj.batch_norm(x, None, None, rm, rv, momentum=None)


def test_cpu_vmap_normalizes_each_element_on_its_own(cpu):
    xs = jax.random.normal(jax.random.key(3), (3, 4, 2, 5)) * jnp.arange(1, 4)[:, None, None, None]
    w = jnp.linspace(0.5, 1.5, 2)
    got = jax.vmap(lambda x: cj.batch_norm(x, w, None))(xs)
    for i in range(3):
        assert_close(f"element {i}", numpy.asarray(got[i]), reference.batch_norm(_h(xs[i]), _h(w)), 1e-5, 1e-5)


def _vmap_with_running_statistics():
    """vmap over x and the running statistics' updates: x batched, the running statistics
    shared (each element's update starts from them)."""
    xs = jax.random.normal(jax.random.key(4), (3, 6, 5, 4)) + jnp.arange(3.0)[:, None, None, None]
    rm, rv = jnp.full(4, 0.5), jnp.full(4, 2.0)
    ys, rms, rvs = jax.jit(jax.vmap(lambda x: cj.batch_norm(x, None, None, rm, rv, channel_axis=-1, momentum=0.5)))(xs)
    for i in range(3):
        hrm, hrv = _h(rm), _h(rv)
        want = reference.batch_norm(_h(xs[i]), None, None, hrm, hrv, channel_axis=-1, momentum=0.5)
        assert_close(f"y {i}", numpy.asarray(ys[i]), want, 1e-5, 1e-5)
        assert_close(f"running_mean {i}", numpy.asarray(rms[i]), hrm, 1e-5, 1e-6)
        assert_close(f"running_var {i}", numpy.asarray(rvs[i]), hrv, 1e-5, 1e-6)


def test_cpu_vmap_updates_each_elements_running_statistics(cpu):
    _vmap_with_running_statistics()


def test_cpu_empty_batch(cpu):
    x = jnp.zeros((0, 3, 4))
    rm, rv = jnp.zeros(3), jnp.ones(3)
    y, new_rm, new_rv, mean, rstd = cj.batch_norm(x, None, None, rm, rv, return_stats=True)
    assert y.shape == x.shape and bool(jnp.isnan(mean).all()) and bool((new_rm == rm).all())


@pytest.mark.parametrize("call,error,name", [
    (lambda x, c: cj.batch_norm(x, channel_axis=2), ValueError, "channel_axis"),
    (lambda x, c: cj.batch_norm(x, jnp.ones(c + 1)), ValueError, "weight"),
    (lambda x, c: cj.batch_norm(x, residual=x.astype(jnp.bfloat16)), TypeError, "residual"),
    (lambda x, c: cj.batch_norm(x, training=False), ValueError, "running_mean"),
    (lambda x, c: cj.batch_norm(x[:1, :, :1]), ValueError, "x"),
    (lambda x, c: cj.batch_norm(x, None, None, jnp.zeros(c), jnp.ones(c), momentum=1.5), ValueError, "momentum"),
    (lambda x, c: cj.batch_norm(x, activation="swish"), ValueError, "activation"),
    (lambda x, c: cj.batch_norm(x.astype(jnp.int32)), TypeError, "x"),
    (lambda x, c: cj.batch_norm(x, eps=0.0), ValueError, "eps"),
])
def test_cpu_bad_arguments_name_the_argument(cpu, call, error, name):
    x = jnp.ones((4, 3, 5))
    with pytest.raises(error, match=name):
        call(x, 3)


# ---- GPU ----------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("shape,axis", [((8, 16, 14, 14), 1), ((8, 14, 14, 16), -1), ((32, 24), 1),
                                        ((4, 7, 13, 9), 1), ((4, 13, 9, 40), -1)],
                         ids=["nchw", "nhwc", "nc", "nchw_odd", "nhwc_odd"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_gpu_values_running_statistics_and_grads(gpu, shape, axis, dtype, training):
    _check(shape, axis, dtype, training, residual=False, activation=None, jit=True)


@pytest.mark.gpu
@pytest.mark.parametrize("axis", [1, -1], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("activation,param", [("relu", None), ("leaky_relu", 0.2), ("silu", None)])
def test_gpu_residual_and_activation(gpu, axis, activation, param):
    shape = (8, 16, 10, 10) if axis == 1 else (8, 10, 10, 16)
    _check(shape, axis, jnp.bfloat16, True, residual=True, activation=activation, param=param, jit=True)


@pytest.mark.gpu
def test_gpu_vmap_and_large_channels_last(gpu):
    xs = jax.random.normal(jax.random.key(5), (2, 4, 7, 7, 256), jnp.float32).astype(jnp.bfloat16)
    got = jax.jit(jax.vmap(lambda x: cj.batch_norm(x, None, None, channel_axis=-1)))(xs)
    for i in range(2):
        want = reference.batch_norm(_h(xs[i]), channel_axis=-1)
        assert_close(f"element {i}", numpy.asarray(got[i].astype(jnp.float32)), want, *tol(numpy.dtype(jnp.bfloat16)))


@pytest.mark.gpu
def test_gpu_vmap_updates_each_elements_running_statistics(gpu):
    _vmap_with_running_statistics()
