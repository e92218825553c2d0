"""The JAX adapter: jit, grad and vmap wiring on CPU JAX (the NumPy reference behind the same
buffer callbacks, runs in CI) and the kernels on the GPU, against pure-jax.numpy norms."""
from __future__ import annotations

import numpy
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed (pip install jax)")
import jax.numpy as jnp  # noqa: E402

import cunorm.jax as cj  # noqa: E402
from cunorm._checks import BFLOAT16  # noqa: E402
from jax_devices import gpu_or_skip  # noqa: E402
from tolerances import assert_close, reduction_tol, tol  # noqa: E402


def _jnp_norm(x, w, b, eps, nd, rms):
    """LayerNorm / RMSNorm over the last nd axes in x's own dtype (float64: the reference of
    the second-derivative tests)."""
    axes = tuple(range(x.ndim - nd, x.ndim))
    if rms:
        y = x * jax.lax.rsqrt((x * x).mean(axes, keepdims=True) + eps)
    else:
        c = x - x.mean(axes, keepdims=True)
        y = c * jax.lax.rsqrt((c * c).mean(axes, keepdims=True) + eps)
    y = y if w is None else y * w
    return y if b is None else y + b


def _jnp_layer_norm(x, w, b, eps=1e-5):
    return _jnp_norm(x.astype(jnp.float32), w, b, eps, 1, False).astype(x.dtype)


def _jnp_rms_norm(x, w, eps):
    return _jnp_norm(x.astype(jnp.float32), w, None, eps, 1, True).astype(x.dtype)


def _ops(eps_rms):
    return {"layer_norm": (lambda x, w, b: cj.layer_norm(x, w, b), _jnp_layer_norm),
            "rms_norm": (lambda x, w, b: cj.rms_norm(x, w, eps_rms), lambda x, w, b: _jnp_rms_norm(x, w, eps_rms))}


def _inputs(shape, dtype, key=0):
    k = jax.random.split(jax.random.key(key), 4)
    n = shape[-1]
    x = jax.random.normal(k[0], shape).astype(dtype)
    w = 1 + 0.1 * jax.random.normal(k[1], (n,))
    b = 0.1 * jax.random.normal(k[2], (n,))
    dy = jax.random.normal(k[3], shape).astype(dtype)
    return x, w, b, dy


def _check_values_and_grads(x, w, b, dy, op, rows, transform=lambda f: f):
    ours, theirs = _ops(1e-6)[op]
    rtol, atol = tol(numpy.dtype(x.dtype))

    def loss(f):
        return lambda x, w, b: (f(x, w, b).astype(jnp.float32) * dy.astype(jnp.float32)).sum()

    y = transform(ours)(x, w, b)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert_close(f"{op} y", numpy.asarray(y.astype(jnp.float32)), numpy.asarray(theirs(x, w, b).astype(jnp.float32)),
                 rtol, atol)
    g_ours = transform(jax.grad(loss(ours), (0, 1, 2)))(x, w, b)
    g_ref = jax.grad(loss(theirs), (0, 1, 2))(x, w, b)
    assert_close(f"{op} dx", numpy.asarray(g_ours[0].astype(jnp.float32)),
                 numpy.asarray(g_ref[0].astype(jnp.float32)), rtol, 4 * atol)
    for name, a, r in zip(("dweight", "dbias"), g_ours[1:], g_ref[1:]):
        if op == "rms_norm" and name == "dbias":
            continue
        assert_close(f"{op} {name}", numpy.asarray(a), numpy.asarray(r), *reduction_tol(numpy.float32, rows))


# ---- CPU wiring (the NumPy reference behind the callbacks) --------------------------------

@pytest.fixture
def cpu():
    with jax.default_device(jax.devices("cpu")[0]):
        yield


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_cpu_values_and_grads(cpu, op, jit):
    x, w, b, dy = _inputs((3, 7, 33), jnp.float32)
    _check_values_and_grads(x, w, b, dy, op, 21, jax.jit if jit else (lambda f: f))


def test_cpu_grad_matches_finite_differences(cpu):
    from jax.test_util import check_grads

    with jax.enable_x64(True):
        x, w, b, _ = _inputs((4, 9), jnp.float64)
        w, b = w.astype(jnp.float64), b.astype(jnp.float64)
        check_grads(lambda x, w, b: cj.layer_norm(x, w, b), (x, w, b), order=1, modes=["rev"])
        check_grads(lambda x, w: cj.rms_norm(x, w, normalized_ndim=1), (x, w), order=1, modes=["rev"])


VMAP_CASES = ["x_only", "x_and_weight", "per_example_grads", "nested"]


def _vmap_case(case, n, rtol):
    """vmap over x alone (more rows), over x and weight (a launch per element), per-example
    weight gradients, and nested vmaps batching different arguments."""
    x, w, b, _ = _inputs((4, 5, n), jnp.float32)
    ws = jnp.stack([w, 2 * w, 0.5 * w, -w])
    f = jax.jit(lambda x, w, b: cj.layer_norm(x, w, b))
    if case == "x_only":
        got, want = jax.vmap(f, (0, None, None))(x, w, b), _jnp_layer_norm(x, w, b)
    elif case == "x_and_weight":
        got, want = jax.vmap(f, (0, 0, None))(x, ws, b), jax.vmap(_jnp_layer_norm, (0, 0, None))(x, ws, b)
    elif case == "per_example_grads":
        loss = lambda g: lambda x, w, b: (g(x, w, b) ** 2).sum()  # noqa: E731
        got = jax.jit(jax.vmap(jax.grad(loss(f), 1), (0, None, None)))(x, w, b)
        want = jax.vmap(jax.grad(loss(_jnp_layer_norm), 1), (0, None, None))(x, w, b)
    else:
        x2 = x[:2, :4]
        got = jax.vmap(lambda xi: jax.vmap(lambda w: f(xi, w, b))(ws))(x2)
        want = jax.vmap(lambda xi: jax.vmap(lambda w: _jnp_layer_norm(xi, w, b))(ws))(x2)
    assert_close(case, numpy.asarray(got), numpy.asarray(want), rtol, rtol)


@pytest.mark.parametrize("case", VMAP_CASES)
def test_cpu_vmap(cpu, case):
    _vmap_case(case, 16, 2e-5)


def test_cpu_bfloat16_and_mixed_parameters(cpu):
    x, w, b, dy = _inputs((6, 40), jnp.bfloat16)
    _check_values_and_grads(x, w.astype(jnp.bfloat16), b, dy, "layer_norm", 6)


def test_cpu_rms_norm_default_eps_is_float32s_for_half_x(cpu):
    # as torch's rms_norm: the computation dtype's epsilon (bfloat16's own, 7.8e-3, would
    # swamp these rows' mean square of 1e-6)
    x = (1e-3 * jax.random.normal(jax.random.key(7), (4, 64))).astype(jnp.bfloat16)
    got = numpy.asarray(cj.rms_norm(x).astype(jnp.float32))
    want = numpy.asarray(_jnp_rms_norm(x, None, float(jnp.finfo(jnp.float32).eps)).astype(jnp.float32))
    assert_close("y", got, want, *tol(BFLOAT16))


def test_cpu_normalized_ndim_2_and_empty(cpu):
    x, _, _, _ = _inputs((3, 4, 8), jnp.float32)
    w = jnp.ones((4, 8))
    got = cj.layer_norm(x, w, normalized_ndim=2)
    want = _jnp_layer_norm(x.reshape(3, 32), None, None).reshape(3, 4, 8)
    assert_close("nd=2", numpy.asarray(got), numpy.asarray(want), 2e-5, 2e-5)
    assert cj.layer_norm(jnp.zeros((0, 8))).shape == (0, 8)
    assert jax.grad(lambda x: cj.rms_norm(x).sum())(jnp.zeros((0, 8))).shape == (0, 8)


@pytest.mark.parametrize("call,error,name", [
    (lambda: cj.layer_norm(object()), TypeError, "x"),
    (lambda: cj.layer_norm(jnp.ones((2, 4), jnp.int32)), TypeError, "x"),
    (lambda: cj.layer_norm(jnp.ones((2, 4)), jnp.ones(3)), ValueError, "weight"),
    (lambda: cj.layer_norm(jnp.ones((2, 4)), None, jnp.ones((4,), jnp.int32)), TypeError, "bias"),
    (lambda: cj.layer_norm(jnp.ones((2, 4)), normalized_ndim=3), ValueError, "normalized_ndim"),
    (lambda: cj.rms_norm(jnp.ones((2, 4)), eps=-1.0), ValueError, "eps"),
])
def test_bad_arguments_name_the_argument(cpu, call, error, name):
    with pytest.raises(error, match=rf"^{name}\b"):
        call()


# ---- derivatives of the gradient (the kernel calls' forward-mode rules, ``_jvp``) ----------

def _ours(x, w, b, eps, nd, rms):
    if rms:
        return cj.rms_norm(x, w, eps, normalized_ndim=nd)
    return cj.layer_norm(x, w, b, eps, normalized_ndim=nd)


SECOND_ORDER = {
    # a gradient penalty: the gradient of |d loss / d x|^2 (reverse over reverse)
    "grad_of_grad": lambda loss, x, w, b: jax.grad(
        lambda x, w: (jax.grad(loss, (0, 1))(x, w, b)[0] ** 2).sum(), (0, 1))(x, w),
    # Hessian-vector product (forward over reverse)
    "hvp": lambda loss, x, w, b: jax.jvp(jax.grad(loss, (0, 1)), (x, w, b), (0.3 * x, w, b))[1],
    "hessian": lambda loss, x, w, b: jax.hessian(loss, (0, 1))(x, w, b),
    "jit_vmap_hessian": lambda loss, x, w, b: jax.jit(jax.vmap(jax.hessian(loss), (0, None, None)))(
        jnp.stack([x, -2 * x]), w, b),
    "jacrev_of_jacrev": lambda loss, x, w, b: jax.jacrev(jax.jacrev(loss))(x, w, b),
}
# (shape, normalized_ndim, weight, bias); RMSNorm takes no bias
SECOND_ORDER_CASES = [((3, 8), 1, True, True), ((2, 3, 4), 2, True, False), ((5, 7), 1, False, False)]


def _second_order(transform, op, shape, nd, has_w, has_b, dtype, key=0):
    """Our norm's second derivatives against jax.numpy's norm in the same dtype."""
    rms = op == "rms_norm"
    k = jax.random.split(jax.random.key(key), 3)
    x = jax.random.normal(k[0], shape, dtype)
    pshape = shape[len(shape) - nd:]
    w = 1 + 0.5 * jax.random.normal(k[1], pshape, dtype) if has_w else None
    b = 0.5 * jax.random.normal(k[2], pshape, dtype) if has_b and not rms else None
    eps = 1e-5

    def loss(norm):  # not quadratic in y, so its second derivatives reach the norm's own
        return lambda x, w, b: (jnp.sin(norm(x, w, b, eps, nd, rms)) * x).sum()

    if w is None and transform in ("grad_of_grad", "hvp"):
        pytest.skip("w is the second argument of this transform")
    got = SECOND_ORDER[transform](loss(_ours), x, w, b)
    want = SECOND_ORDER[transform](loss(_jnp_norm), x, w, b)
    return jax.tree.leaves(got), jax.tree.leaves(want)


@pytest.mark.parametrize("case", SECOND_ORDER_CASES, ids=["2d", "nd2_no_bias", "no_params"])
@pytest.mark.parametrize("transform", list(SECOND_ORDER))
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_cpu_second_derivatives_match_jax_numpy(cpu, op, transform, case):
    with jax.enable_x64(True):
        got, want = _second_order(transform, op, *case, jnp.float64)
    assert len(got) == len(want) > 0
    for i, (a, r) in enumerate(zip(got, want)):
        assert_close(f"{op} {transform} [{i}]", numpy.asarray(a), numpy.asarray(r), 1e-10, 1e-10)


def test_cpu_forward_mode_of_the_norm_itself_is_jaxs_custom_vjp_error(cpu):
    # the first derivative is a custom_vjp (the backward kernels); JAX refuses forward mode
    # on one with its own message, which names the cause
    x = jnp.ones((2, 8))
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.jvp(cj.layer_norm, (x,), (x,))


def test_cpu_eager_calls_outside_transformations_skip_the_forward_mode_rule(cpu, monkeypatch):
    # the custom_jvp's dispatch doubled an eager forward's host time; concrete arrays cannot
    # be differentiated later, so they call the kernels directly
    from cunorm.jax import _jvp

    wrapped = []
    real = jax.custom_jvp
    monkeypatch.setattr(_jvp.jax, "custom_jvp", lambda f, **kw: wrapped.append(f) or real(f, **kw))
    calls = []
    kernels = lambda a, k: calls.append(type(a).__name__) or a * k  # noqa: E731
    op = _jvp.with_jnp_tangents(kernels, lambda a, k: a * k, 1, 1)
    assert wrapped == [kernels]
    x = jnp.ones(3)
    op(x, 2.0)
    assert len(calls) == 1 and "Tracer" not in calls[0]
    assert float(jax.grad(lambda a: op(a, 2.0).sum())(x)[0]) == 2.0  # traced: the custom_jvp


# ---- GPU ----------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(3, 7), (2049, 1536), (2, 65537), (4, 5, 256), (2, 131080)])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_gpu_jit_values_and_grads_against_jax_numpy(op, shape, dtype):
    with jax.default_device(gpu_or_skip()):
        x, w, b, dy = _inputs(shape, dtype)
        _check_values_and_grads(x, w, b, dy, op, int(numpy.prod(shape[:-1])), jax.jit)


@pytest.mark.gpu
@pytest.mark.parametrize("case", VMAP_CASES)
def test_gpu_vmap(case):
    with jax.default_device(gpu_or_skip()):
        _vmap_case(case, 1040, 1e-4)


@pytest.mark.gpu
def test_gpu_training_loop_matches_jax_numpy():
    """A two-layer MLP with LayerNorm and RMSNorm, plain SGD for a few steps: cunorm's norms
    and the jax.numpy ones give the same losses."""
    with jax.default_device(gpu_or_skip()):
        k = jax.random.split(jax.random.key(0), 4)
        # a well-conditioned problem (loss of order 1, small steps), so five steps do not
        # amplify fp32 rounding differences between the two norms into different losses
        params = {"w1": 0.1 * jax.random.normal(k[0], (64, 256)), "w2": 0.02 * jax.random.normal(k[1], (256, 1)),
                  "g1": jnp.ones(256), "b1": jnp.zeros(256), "g2": jnp.ones(256)}
        data = jax.random.normal(k[2], (128, 64))
        target = 0.5 * jax.random.normal(k[3], (128, 1))

        def model(ln, rms):
            def loss(p):
                h = ln(data @ p["w1"], p["g1"], p["b1"])
                h = rms(jax.nn.gelu(h), p["g2"])
                return ((h @ p["w2"] - target) ** 2).mean()
            return jax.jit(jax.value_and_grad(loss))

        ours = model(cj.layer_norm, lambda h, g: cj.rms_norm(h, g, 1e-6))
        theirs = model(_jnp_layer_norm, lambda h, g: _jnp_rms_norm(h, g, 1e-6))
        p_ours, p_theirs = params, params
        losses = []
        for step in range(5):
            l1, g1 = ours(p_ours)
            l2, g2 = theirs(p_theirs)
            losses.append(float(l1))
            assert float(l1) == pytest.approx(float(l2), rel=1e-5 if step == 0 else 1e-3), f"step {step}"
            p_ours = jax.tree.map(lambda p, g: p - 0.01 * g, p_ours, g1)
            p_theirs = jax.tree.map(lambda p, g: p - 0.01 * g, p_theirs, g2)
        assert losses[-1] < losses[0], "the loop should learn"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("transform", ["grad_of_grad", "hvp", "jit_vmap_hessian"])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_gpu_second_derivatives_match_jax_numpy(op, transform, dtype):
    """The kernels' values under the jax.numpy tangents, on the GPU: rows of 499 (one tile)
    for the Hessians, 7 x 1533 otherwise."""
    with jax.default_device(gpu_or_skip()), jax.enable_x64(dtype == jnp.float64):
        shape = (3, 499) if transform == "jit_vmap_hessian" else (7, 1533)
        got, want = _second_order(transform, op, shape, 1, True, True, dtype)
    rtol = 1e-9 if dtype == jnp.float64 else 2e-3
    for i, (a, r) in enumerate(zip(got, want)):
        assert_close(f"{op} {transform} [{i}]", numpy.asarray(a), numpy.asarray(r), rtol, rtol)


def test_bfloat16_dtype_is_ml_dtypes():
    assert numpy.dtype(jnp.bfloat16) == BFLOAT16


def test_callbacks_ask_xla_to_record_them(monkeypatch, request):
    """Every callback op asks to be recorded into XLA's command buffers (so a recorded
    program replays our launches with no Python), unless COMMAND_BUFFER is off; a JAX
    without the flag gets none."""
    from cunorm.jax import _callbacks

    seen = []
    monkeypatch.setattr(_callbacks, "buffer_callback", lambda fn, shapes, **kw: seen.append(kw) or fn)
    _callbacks._callback_op.cache_clear()  # ops made with the real buffer_callback (and ours, after)
    request.addfinalizer(_callbacks._callback_op.cache_clear)
    _callbacks.callback_op(print, [])
    assert seen[-1] == {"vmap_method": "expand_dims", "command_buffer_compatible": True}
    monkeypatch.setattr(_callbacks, "COMMAND_BUFFER", False)
    _callbacks.callback_op(print, [])
    assert seen[-1] == {"vmap_method": "expand_dims"}
    monkeypatch.setattr(_callbacks, "COMMAND_BUFFER", True)
    monkeypatch.setattr(_callbacks, "_TAKES_COMMAND_BUFFER_FLAG", False)
    _callbacks.callback_op(print, [])
    assert seen[-1] == {"vmap_method": "expand_dims"}


# XLA records even a one-op program: what a model's jit gets where its program is recorded
RECORD_EVERYTHING = "--xla_gpu_graph_min_graph_size=1 --xla_gpu_enable_command_buffer=+CUSTOM_CALL"


@pytest.mark.gpu
def test_gpu_command_buffer_replays_and_rerecords():
    """A jitted forward + backward that XLA records into a command buffer: values and
    gradients match jax.numpy's over 20 distinct input buffers, visited twice (XLA records
    again for new addresses, replays for known ones), and replays of one input run no
    Python callback. XLA may record once more when an output lands at a new address (one
    of ten calls ran its two callbacks in one check), so two such calls are allowed; without
    replay every call runs two."""
    gpu_or_skip()
    from fresh_interpreter import run_probe

    report = run_probe("_jax_command_buffer_probe.py", XLA_FLAGS=RECORD_EVERYTHING)
    assert report["platform"] == "gpu"
    for name, err in report["worst"].items():
        assert err < 1e-5, (name, report)
    per_replay = report["callbacks_per_replay"]
    assert sum(1 for c in per_replay if c) <= 2 and max(per_replay) <= 2, report


@pytest.mark.gpu
def test_gpu_command_buffer_records_the_grid_rows():
    """bf16 rows of 262152: the backward is the grid rows' cooperative launch, recorded into
    the command buffer and replayed (values within bf16's reach of jax.numpy's)."""
    gpu_or_skip()
    from fresh_interpreter import run_probe

    report = run_probe("_jax_command_buffer_probe.py", "long-rows", XLA_FLAGS=RECORD_EVERYTHING)
    assert report["platform"] == "gpu"
    for name, err in report["worst"].items():
        assert err < 2e-2, (name, report)


def _first(out):
    return out[0] if isinstance(out, tuple) else out


EAGER_CALLS = {
    "layer_norm": lambda x, w: cj.layer_norm(x, w),
    "rms_norm_residual": lambda x, w: cj.rms_norm(x, w, residual=x * 0.5),
    "batch_norm": lambda x, w: cj.batch_norm(x.reshape(4, 64, 1, 1), w, channel_axis=1),
}


@pytest.mark.parametrize("name", list(EAGER_CALLS))
def test_eager_calls_reuse_their_callbacks(name):
    # JAX keys its caches on the callback object: a closure made afresh each eager call was
    # traced and compiled again every call (13-23 ms a call on the CPU) and kept in JAX's caches,
    # with its plan dict; now one callback per signature, forward and backward
    from cunorm import _compile
    from cunorm.jax import _callbacks

    op = EAGER_CALLS[name]
    x = jnp.asarray(numpy.random.default_rng(0).standard_normal((4, 64)), jnp.float32)
    w = jnp.ones(64, jnp.float32)
    step = jax.grad(lambda a, b: _first(op(a, b)).astype(jnp.float32).sum(), argnums=(0, 1))
    jax.block_until_ready((op(x, w), step(x, w)))
    made, live = _callbacks._callback_op.cache_info().misses, len(_compile._plan_dicts)
    for _ in range(4):
        jax.block_until_ready((op(x, w), step(x, w)))
    assert _callbacks._callback_op.cache_info().misses == made, "an eager call made a new callback"
    assert len(_compile._plan_dicts) == live
