"""The Flax NNX modules (cunorm.jax.nnx): drop-in for flax.nnx.LayerNorm / RMSNorm — same
state, same values and gradients, Flax's dtype promotion — and an optax training loop that
matches Flax's own norms. The CPU cases run the NumPy reference behind the same callbacks."""
from __future__ import annotations

import numpy
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed (pip install jax)")
nnx = pytest.importorskip("flax.nnx", reason="Flax is not installed (pip install flax)")
import jax.numpy as jnp  # noqa: E402

from cunorm.jax import nnx as cnnx  # noqa: E402
from jax_devices import gpu_or_skip  # noqa: E402
from tolerances import assert_close  # noqa: E402

PAIRS = {"layer_norm": (cnnx.LayerNorm, nnx.LayerNorm), "rms_norm": (cnnx.RMSNorm, nnx.RMSNorm)}


def _device(kind):
    return jax.devices("cpu")[0] if kind == "cpu" else gpu_or_skip()


DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("op", sorted(PAIRS))
def test_state_matches_flax(op):
    ours, theirs = (cls(24, rngs=nnx.Rngs(0)) for cls in PAIRS[op])
    assert isinstance(ours, type(theirs))
    s_ours, s_theirs = nnx.state(ours), nnx.state(theirs)
    assert jax.tree.structure(s_ours) == jax.tree.structure(s_theirs)
    for a, b in zip(jax.tree.leaves(s_ours), jax.tree.leaves(s_theirs)):
        assert a.shape == b.shape and a.dtype == b.dtype and bool((a == b).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,module_dtype", [(jnp.float32, None), (jnp.bfloat16, None),
                                                (jnp.bfloat16, jnp.bfloat16)], ids=["fp32", "bf16_promoted", "bf16"])
@pytest.mark.parametrize("op", sorted(PAIRS))
def test_values_grads_and_dtype_match_flax(op, dtype, module_dtype, device):
    with jax.default_device(_device(device)):
        ours, theirs = (cls(96, dtype=module_dtype, rngs=nnx.Rngs(1)) for cls in PAIRS[op])
        # a checkpoint carries over: non-trivial parameters from Flax's module into ours
        state = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.key(2), p.shape, p.dtype),
                             nnx.state(theirs))
        nnx.update(theirs, state)
        nnx.update(ours, state)
        x = jax.random.normal(jax.random.key(3), (5, 7, 96)).astype(dtype)
        y_ours, y_theirs = ours(x), theirs(x)
        assert y_ours.dtype == y_theirs.dtype and y_ours.shape == y_theirs.shape
        half = jnp.dtype(y_ours.dtype).itemsize == 2
        rtol, atol = (2e-2, 2e-2) if half else (1e-5, 1e-5)
        assert_close("y", y_ours, y_theirs, rtol, atol)

        def loss(m):
            return (m(x).astype(jnp.float32) * jnp.cos(x.astype(jnp.float32))).sum()

        g_ours, g_theirs = nnx.grad(loss)(ours), nnx.grad(loss)(theirs)
        for a, b in zip(jax.tree.leaves(g_ours), jax.tree.leaves(g_theirs)):
            assert_close("grad", a, b, 5e-2 if half else 1e-4, 0.5 if half else 1e-3)


@pytest.mark.parametrize("op", sorted(PAIRS))
def test_default_configuration_runs_cunorm(op, monkeypatch):
    calls = []
    name = "_layer_norm" if op == "layer_norm" else "_rms_norm"
    real = getattr(cnnx, name)
    monkeypatch.setattr(cnnx, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    with jax.default_device(jax.devices("cpu")[0]):
        PAIRS[op][0](8, rngs=nnx.Rngs(0))(jnp.ones((2, 8)))
    assert calls == [1]


@pytest.mark.parametrize("op", sorted(PAIRS))
def test_configurations_the_kernels_do_not_serve_run_flax(op):
    # normalization over two axes and masks are Flax's own path, unchanged
    with jax.default_device(jax.devices("cpu")[0]):
        ours, theirs = (cls(6, reduction_axes=(-2, -1), rngs=nnx.Rngs(0)) for cls in PAIRS[op])
        x = jax.random.normal(jax.random.key(0), (3, 4, 6))
        assert_close("y, two axes", ours(x), theirs(x), 0, 0)
        ours, theirs = (cls(6, rngs=nnx.Rngs(0)) for cls in PAIRS[op])
        mask = jnp.arange(6) < 4
        mask = jnp.broadcast_to(mask, x.shape)
        assert_close("y, masked", ours(x, mask=mask), theirs(x, mask=mask), 0, 0)


class _MLP(nnx.Module):
    def __init__(self, layer_norm, rms_norm, rngs):
        self.lin1 = nnx.Linear(32, 128, rngs=rngs)
        self.norm1 = layer_norm(128, rngs=rngs)
        self.lin2 = nnx.Linear(128, 128, rngs=rngs)
        self.norm2 = rms_norm(128, rngs=rngs)
        self.out = nnx.Linear(128, 1, rngs=rngs)

    def __call__(self, x):
        h = self.norm1(self.lin1(x))
        h = self.norm2(self.lin2(jax.nn.gelu(h)))
        return self.out(jax.nn.gelu(h))


@pytest.mark.parametrize("device", DEVICES)
def test_optax_training_loop_matches_flax(device):
    optax = pytest.importorskip("optax", reason="optax is not installed (pip install optax)")
    with jax.default_device(_device(device)):
        k = jax.random.split(jax.random.key(0), 2)
        data = jax.random.normal(k[0], (256, 32))
        target = jnp.sin(data[:, :1]) + 0.1 * jax.random.normal(k[1], (256, 1))
        tx = optax.adam(3e-3)

        def trainer(layer_norm, rms_norm):
            graphdef, params = nnx.split(_MLP(layer_norm, rms_norm, nnx.Rngs(0)), nnx.Param)

            @jax.jit
            def step(params, opt_state):
                def loss_fn(p):
                    return ((nnx.merge(graphdef, p)(data) - target) ** 2).mean()
                loss, grads = jax.value_and_grad(loss_fn)(params)
                updates, opt_state = tx.update(grads, opt_state, params)
                return optax.apply_updates(params, updates), opt_state, loss
            return step, params, tx.init(params)

        runs = []
        for norms in ((cnnx.LayerNorm, cnnx.RMSNorm), (nnx.LayerNorm, nnx.RMSNorm)):
            step, params, opt_state = trainer(*norms)
            losses = []
            for _ in range(8):
                params, opt_state, loss = step(params, opt_state)
                losses.append(float(loss))
            runs.append(losses)
        ours, flax_losses = runs
        numpy.testing.assert_allclose(ours, flax_losses, rtol=1e-3)
        assert ours[-1] < ours[0], "the loop should learn"


# ---- BatchNorm ------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("axis,shape", [(-1, (8, 5, 5, 6)), (1, (8, 6, 5, 5)), (-1, (16, 6))],
                         ids=["nhwc", "nchw", "nc"])
def test_batch_norm_trains_and_evaluates_as_flax(device, axis, shape):
    """Three training steps (values, running mean and var as Flax updates them), then eval
    and the parameters' gradients, against flax.nnx.BatchNorm from the same state."""
    with jax.default_device(_device(device)):
        ours, theirs = (cls(6, axis=axis, momentum=0.9, rngs=nnx.Rngs(0)) for cls in (cnnx.BatchNorm, nnx.BatchNorm))
        assert isinstance(ours, nnx.BatchNorm)
        state = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.key(2), p.shape, p.dtype),
                             nnx.state(theirs, nnx.Param))
        nnx.update(theirs, state)
        nnx.update(ours, state)
        for step in range(3):
            x = 2 * jax.random.normal(jax.random.key(step), shape) + 1
            assert_close(f"y, step {step}", ours(x), theirs(x), 1e-5, 1e-5)
            assert_close("mean", ours.mean[...], theirs.mean[...], 1e-5, 1e-6)
            assert_close("var", ours.var[...], theirs.var[...], 1e-5, 1e-6)
        assert_close("eval y", ours(x, use_running_average=True), theirs(x, use_running_average=True), 1e-5, 1e-5)
        g_ours, g_theirs = (nnx.grad(lambda m: (m(x) ** 2).sum())(m) for m in (ours, theirs))
        for a, b in zip(jax.tree.leaves(g_ours), jax.tree.leaves(g_theirs)):
            assert_close("grad", a, b, 1e-4, 1e-3)


def test_batch_norm_default_configuration_runs_cunorm(monkeypatch):
    calls = []
    real = cnnx._batch_norm
    monkeypatch.setattr(cnnx, "_batch_norm", lambda *a, **k: calls.append(1) or real(*a, **k))
    with jax.default_device(jax.devices("cpu")[0]):
        cnnx.BatchNorm(4, rngs=nnx.Rngs(0))(jnp.arange(24.0).reshape(6, 4))
    assert calls == [1]


def test_batch_norm_configurations_the_kernels_do_not_serve_run_flax():
    # a feature axis other than 1 or -1 and masks are Flax's own path, unchanged
    with jax.default_device(jax.devices("cpu")[0]):
        x = jax.random.normal(jax.random.key(0), (4, 3, 5, 6))
        ours, theirs = (cls(5, axis=2, rngs=nnx.Rngs(0)) for cls in (cnnx.BatchNorm, nnx.BatchNorm))
        assert_close("y, axis 2", ours(x), theirs(x), 0, 0)
        ours, theirs = (cls(6, rngs=nnx.Rngs(0)) for cls in (cnnx.BatchNorm, nnx.BatchNorm))
        mask = jnp.broadcast_to((jnp.arange(4) < 3)[:, None, None, None], x.shape)
        assert_close("y, masked", ours(x, mask=mask), theirs(x, mask=mask), 0, 0)
