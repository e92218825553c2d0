"""Issue 8's catalogue of hostile inputs, on the CPU paths of every frontend (the CuPy API on
NumPy arrays, cunorm.torch on CPU tensors, cunorm.jax on CPU arrays): each case either raises
a TypeError / ValueError whose message starts with the argument's name, or returns a correct
result (checked against the reference). tests/test_api.py holds the CuPy API's own table."""
from __future__ import annotations

import math

import numpy
import pytest

import cunorm
from cunorm import reference

NAN, INF = math.nan, math.inf
x24 = numpy.ones((2, 4), numpy.float32)
ones4 = numpy.ones(4, numpy.float32)

# ---- the CuPy API's BatchNorm (NumPy path) ----------------------------------------------------
x4d = numpy.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(numpy.float32)
c3 = numpy.ones(3, numpy.float32)

def _read_only(a):
    a = a.copy()
    a.flags.writeable = False
    return a


def _same_running_stats():
    stats = c3.copy()
    return cunorm.batch_norm(x4d, running_mean=stats, running_var=stats)


def _var_inside_x():
    x = x4d.copy()
    return cunorm.batch_norm(x, running_mean=c3.copy(), running_var=x.reshape(-1)[5:8])


def _mean_over_weight():
    buf = numpy.ones(6, numpy.float32)
    return cunorm.batch_norm(x4d, buf[:3], running_mean=buf[2:5], running_var=c3.copy())


BATCH_NORM_CASES = [
    ("int x", lambda: cunorm.batch_norm(x4d.astype(numpy.int32)), TypeError, "x"),
    ("complex x", lambda: cunorm.batch_norm(x4d.astype(numpy.complex64)), TypeError, "x"),
    ("bool x", lambda: cunorm.batch_norm(x4d > 0), TypeError, "x"),
    ("rank-1 x", lambda: cunorm.batch_norm(numpy.ones(3, numpy.float32)), ValueError, "x"),
    ("rank-6 x", lambda: cunorm.batch_norm(numpy.ones((1,) * 6, numpy.float32)), ValueError, "x"),
    ("0-d x", lambda: cunorm.batch_norm(numpy.ones((), numpy.float32)), ValueError, "x"),
    ("weight of 4 channels", lambda: cunorm.batch_norm(x4d, numpy.ones(4, numpy.float32)), ValueError, "weight"),
    ("int bias", lambda: cunorm.batch_norm(x4d, c3, numpy.ones(3, numpy.int64)), TypeError, "bias"),
    ("running_var of 2", lambda: cunorm.batch_norm(x4d, running_mean=c3.copy(),
                                                   running_var=numpy.ones(2, numpy.float32)),
     ValueError, "running_var"),
    ("nan eps", lambda: cunorm.batch_norm(x4d, eps=NAN), ValueError, "eps"),
    ("zero eps", lambda: cunorm.batch_norm(x4d, eps=0.0), ValueError, "eps"),
    ("negative eps", lambda: cunorm.batch_norm(x4d, eps=-1.0), ValueError, "eps"),
    ("inf eps", lambda: cunorm.batch_norm(x4d, eps=INF), ValueError, "eps"),
    ("negative momentum", lambda: cunorm.batch_norm(x4d, running_mean=c3.copy(), running_var=c3.copy(),
                                                    momentum=-0.1), ValueError, "momentum"),
    ("nan momentum", lambda: cunorm.batch_norm(x4d, running_mean=c3.copy(), running_var=c3.copy(), momentum=NAN),
     ValueError, "momentum"),
    ("string momentum without running stats", lambda: cunorm.batch_norm(x4d, momentum="0.1"), ValueError,
     "momentum"),
    ("momentum past 1 in eval", lambda: cunorm.batch_norm(x4d, running_mean=c3.copy(), running_var=c3.copy() + 1,
                                                          training=False, momentum=2.0), ValueError, "momentum"),
    ("channel_axis 2", lambda: cunorm.batch_norm(x4d, channel_axis=2), ValueError, "channel_axis"),
    ("residual of another shape", lambda: cunorm.batch_norm(x4d, residual=x4d[:1]), ValueError, "residual"),
    ("unknown activation", lambda: cunorm.batch_norm(x4d, activation="swishy"), ValueError, "activation"),
    ("eval without running stats", lambda: cunorm.batch_norm(x4d, training=False), ValueError, "running_mean"),
    ("training not a bool", lambda: cunorm.batch_norm(x4d, training="yes"), TypeError, "training"),
    ("list x", lambda: cunorm.batch_norm(x4d.tolist()), TypeError, "x"),
    ("read-only running_mean", lambda: cunorm.batch_norm(x4d, running_mean=_read_only(c3), running_var=c3.copy()),
     ValueError, "running_mean"),
    ("running_var is running_mean", lambda: _same_running_stats(), ValueError, "running_mean"),
    ("running_var inside x", lambda: _var_inside_x(), ValueError, "running_var"),
    ("running_mean inside weight's buffer", lambda: _mean_over_weight(), ValueError, "running_mean"),
    ("backward dy of another shape", lambda: cunorm.batch_norm_backward(x4d[:1], x4d, c3, c3, c3, c3),
     ValueError, "dy"),
    ("backward without statistics", lambda: cunorm.batch_norm_backward(x4d, x4d, c3, c3, None, c3),
     ValueError, "mean"),
]


def test_batch_norm_zero_size_batch_gives_nan_statistics_not_a_crash():
    # PyTorch raises for one value a channel in training; an empty batch has no statistics
    x = numpy.ones((0, 3, 4, 4), numpy.float32)
    y, mean, rstd = cunorm.batch_norm(x, return_stats=True)
    assert y.shape == x.shape and numpy.isnan(mean).all()


def test_row_norm_zero_size_axes_give_empty_results():
    y, mean, rstd = cunorm.layer_norm(numpy.ones((0, 4), numpy.float32), return_stats=True)
    assert y.shape == (0, 4) and mean.shape == (0,) and rstd.shape == (0,)
    y = cunorm.rms_norm(numpy.ones((3, 0), numpy.float32))
    assert y.shape == (3, 0)


# ---- cunorm.torch on CPU tensors ---------------------------------------------------------------

def _torch_cases():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
    import cunorm.torch as ct

    t = torch.ones(2, 4)
    w4 = torch.ones(4)
    cases = [
        ("int input", lambda: ct.layer_norm(t.int(), (4,)), TypeError, "input"),
        ("bool input", lambda: ct.layer_norm(t.bool(), (4,)), TypeError, "input"),
        ("complex input", lambda: ct.rms_norm(t.to(torch.complex64), (4,)), TypeError, "input"),
        ("numpy input", lambda: ct.layer_norm(numpy.ones((2, 4), numpy.float32), (4,)), TypeError, "input"),
        ("normalized_shape mismatch", lambda: ct.layer_norm(t, (5,)), ValueError, "normalized_shape"),
        ("normalized_shape longer than input", lambda: ct.layer_norm(t, (1, 2, 4)), ValueError, "normalized_shape"),
        ("empty normalized_shape", lambda: ct.layer_norm(t, ()), ValueError, "normalized_shape"),
        ("weight of 3", lambda: ct.layer_norm(t, (4,), torch.ones(3)), ValueError, "weight"),
        ("int weight", lambda: ct.layer_norm(t, (4,), torch.ones(4, dtype=torch.int32)), TypeError, "weight"),
        ("bias of (1, 4)", lambda: ct.layer_norm(t, (4,), w4, torch.ones(1, 4)), ValueError, "bias"),
        ("nan eps", lambda: ct.layer_norm(t, (4,), eps=NAN), ValueError, "eps"),
        ("zero eps", lambda: ct.rms_norm(t, (4,), eps=0.0), ValueError, "eps"),
        ("negative eps", lambda: ct.rms_norm(t, (4,), eps=-1e-6), ValueError, "eps"),
        ("string eps", lambda: ct.layer_norm(t, (4,), eps="1e-5"), TypeError, "eps"),
        ("0-d input", lambda: ct.layer_norm(torch.tensor(1.0), (1,)), ValueError, "normalized_shape"),
        ("batch norm int input", lambda: ct.batch_norm(torch.ones(2, 3, 4, dtype=torch.int32), None, None,
                                                       training=True), TypeError, "input"),
        ("batch norm weight of 4", lambda: ct.batch_norm(torch.ones(2, 3, 4), None, None, torch.ones(4),
                                                         training=True), ValueError, "weight"),
        ("batch norm negative eps", lambda: ct.batch_norm(torch.ones(2, 3, 4), None, None, training=True, eps=-1.0),
         ValueError, "eps"),
        ("batch norm negative momentum", lambda: ct.batch_norm(torch.ones(2, 3, 4), torch.zeros(3), torch.ones(3),
                                                               training=True, momentum=-0.5), ValueError, "momentum"),
    ]
    return cases


def test_torch_zero_size_rows_give_empty_results():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
    import cunorm.torch as ct

    x = torch.ones(0, 4, requires_grad=True)
    y = ct.layer_norm(x, (4,), torch.ones(4, requires_grad=True))
    assert y.shape == (0, 4)
    y.sum().backward()
    assert x.grad.shape == (0, 4)


# ---- cunorm.jax on CPU arrays ------------------------------------------------------------------

def _jax_cases():
    try:
        import jax.numpy as jnp
    except ImportError:
        return []
    import cunorm.jax as cj

    a = jnp.ones((2, 4), jnp.float32)
    return [
        ("int x", lambda: cj.layer_norm(jnp.ones((2, 4), jnp.int32)), TypeError, "x"),
        ("bool x", lambda: cj.rms_norm(jnp.ones((2, 4), bool)), TypeError, "x"),
        ("weight of 3", lambda: cj.layer_norm(a, jnp.ones(3)), ValueError, "weight"),
        ("bias of (1, 4)", lambda: cj.layer_norm(a, jnp.ones(4), jnp.ones((1, 4))), ValueError, "bias"),
        ("int weight", lambda: cj.rms_norm(a, jnp.ones(4, jnp.int32)), TypeError, "weight"),
        ("nan eps", lambda: cj.layer_norm(a, eps=NAN), ValueError, "eps"),
        ("zero eps", lambda: cj.rms_norm(a, eps=0.0), ValueError, "eps"),
        ("normalized_ndim 3", lambda: cj.layer_norm(a, normalized_ndim=3), ValueError, "normalized_ndim"),
        ("normalized_ndim 0", lambda: cj.rms_norm(a, normalized_ndim=0), ValueError, "normalized_ndim"),
        ("0-d x", lambda: cj.layer_norm(jnp.ones(())), ValueError, "x"),
    ]


def _frontend_cases(prefix, make, missing):
    """make()'s cases named after their frontend; one case that skips with ``missing`` when
    the framework is not installed (the cases skip, they do not vanish)."""
    try:
        cases = make()
    except pytest.skip.Exception:
        cases = []
    if not cases:
        return [(f"{prefix}: not installed", lambda: pytest.skip(missing), None, None)]
    return [(f"{prefix}: {case}", *rest) for case, *rest in cases]


CASES = (_frontend_cases("cupy api batch_norm", lambda: BATCH_NORM_CASES, "")
         + _frontend_cases("torch", _torch_cases, "PyTorch is not installed (pip install torch)")
         + _frontend_cases("jax", _jax_cases, "JAX is not installed (pip install jax)"))


@pytest.mark.parametrize("case,call,error,name", CASES, ids=[c[0] for c in CASES])
def test_rejects_naming_the_argument(case, call, error, name):
    if error is None:
        call()  # skips
    with pytest.raises(error, match=rf"^{name}\b"):
        call()


def test_reference_is_what_the_numpy_path_returns():
    # the "correct result" side of the catalogue: a valid call equals the reference
    y = cunorm.layer_norm(x24 * numpy.arange(4, dtype=numpy.float32), ones4, ones4)
    numpy.testing.assert_allclose(y, reference.layer_norm(x24 * numpy.arange(4), ones4, ones4), rtol=1e-6)


# ---- running statistics updated in place: interleaved is fine, shared is refused ------------

def _interleaved_running_stats(xp):
    """running_mean and running_var interleaved in one buffer (no element shared) give what
    separate arrays give; the same buffer twice, or a view of x, is refused."""
    x = xp.asarray(x4d)
    buf = xp.asarray(numpy.array([0.0, 1.0] * 3, numpy.float32))
    apart = [xp.zeros(3, numpy.float32), xp.ones(3, numpy.float32)]
    y = cunorm.batch_norm(x, running_mean=buf[0::2], running_var=buf[1::2])
    y_apart = cunorm.batch_norm(x, running_mean=apart[0], running_var=apart[1])
    numpy.testing.assert_array_equal(_host(y), _host(y_apart))
    numpy.testing.assert_array_equal(_host(buf[0::2]), _host(apart[0]))
    numpy.testing.assert_array_equal(_host(buf[1::2]), _host(apart[1]))
    with pytest.raises(ValueError, match="^running_mean: shares memory with running_var"):
        cunorm.batch_norm(x, running_mean=buf[0:3], running_var=buf[2:5])
    with pytest.raises(ValueError, match="^running_var: shares memory with x"):
        cunorm.batch_norm(x, running_mean=apart[0], running_var=x.reshape(-1)[:3])
    cunorm.batch_norm(x, running_mean=buf[0:3], running_var=buf[3:6], training=False)  # eval only reads them


def _host(a):
    return a.get() if hasattr(a, "get") else a


def test_numpy_running_stats_interleaved_or_shared():
    _interleaved_running_stats(numpy)


@pytest.mark.gpu
def test_cupy_running_stats_interleaved_or_shared():
    import cupy

    _interleaved_running_stats(cupy)


@pytest.mark.gpu
def test_cupy_mixed_with_numpy_names_the_argument():
    import cupy

    with pytest.raises(TypeError, match="^weight: a NumPy array where x is a CuPy array"):
        cunorm.layer_norm(cupy.ones((2, 4), numpy.float32), numpy.ones(4, numpy.float32))
    with pytest.raises(TypeError, match="^running_var: a CuPy array where x is a NumPy array"):
        cunorm.batch_norm(x4d, running_mean=c3.copy(), running_var=cupy.ones(3, numpy.float32))
