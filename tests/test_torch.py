"""The PyTorch adapter: custom ops, autograd, compile, modules (CPU wiring, runs in CI) and
the CUDA path (zero copy, streams, graphs, training) on the GPU."""
from __future__ import annotations

import math

import numpy
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
import torch.nn.functional as F  # noqa: E402

import cunorm.torch as ct  # noqa: E402
from cunorm.torch._cpu import _numpy_view  # noqa: E402
from cunorm import reference  # noqa: E402
from tolerances import assert_close, reduction_tol, tol  # noqa: E402

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _np_dtype(dtype):
    return ct._NUMPY_DTYPE[dtype]


# ---- CPU wiring ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape,nd", [((4, 8), 1), ((3, 5, 8), 2), ((2, 1), 1)])
def test_cpu_values_match_torch(shape, nd):
    x = torch.randn(shape, dtype=torch.float64)
    w, b = torch.randn(shape[-nd:], dtype=torch.float64), torch.randn(shape[-nd:], dtype=torch.float64)
    torch.testing.assert_close(ct.layer_norm(x, shape[-nd:], w, b), F.layer_norm(x, shape[-nd:], w, b))
    torch.testing.assert_close(ct.rms_norm(x, shape[-nd:], w), F.rms_norm(x, shape[-nd:], w))
    torch.testing.assert_close(ct.rms_norm(x, shape[-nd:], None, 1e-3), F.rms_norm(x, shape[-nd:], None, 1e-3))


def test_cpu_eager_apply_takes_dead_functorch_wrappers():
    # the eager path skips Function.apply's Python layer; a tensor that escaped a finished
    # functorch transform (a dead wrapper) still gives torch's values and gradients
    x = torch.randn(3, 8, dtype=torch.float64)
    escaped = []
    torch.func.grad(lambda t: escaped.append(t * 2) or t.sum())(x)
    dead = escaped[0]
    assert torch._C._functorch.is_functorch_wrapped_tensor(dead)
    for ours, theirs, params in ((ct.layer_norm, F.layer_norm, 2), (ct.rms_norm, F.rms_norm, 1)):
        ps = [torch.randn(8, dtype=torch.float64, requires_grad=True) for _ in range(params)]
        y, y_ref = ours(dead, (8,), *ps), theirs(dead, (8,), *ps)
        torch.testing.assert_close(y, y_ref)
        got = torch.autograd.grad(y.square().sum(), ps)
        want = torch.autograd.grad(y_ref.square().sum(), ps)
        for g, h in zip(got, want):
            torch.testing.assert_close(g, h)


@pytest.mark.parametrize("weight,bias", [(True, True), (True, False), (False, False), (False, True)])
def test_cpu_gradcheck_layer_norm(weight, bias):
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, dtype=torch.float64, requires_grad=True) if weight else None
    b = torch.randn(6, dtype=torch.float64, requires_grad=True) if bias else None
    inputs = tuple(t for t in (x, w, b) if t is not None)

    def f(*args):
        it = iter(args)
        xx = next(it)
        ww = next(it) if weight else None
        bb = next(it) if bias else None
        return ct.layer_norm(xx, (6,), ww, bb)

    assert torch.autograd.gradcheck(f, inputs)


@pytest.mark.parametrize("weight", [True, False])
def test_cpu_gradcheck_rms_norm(weight):
    x = torch.randn(3, 2, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 5, dtype=torch.float64, requires_grad=True) if weight else None
    if weight:
        assert torch.autograd.gradcheck(lambda a, c: ct.rms_norm(a, (2, 5), c), (x, w))
    else:
        assert torch.autograd.gradcheck(lambda a: ct.rms_norm(a, (2, 5)), (x,))


def test_cpu_frozen_weight_gets_no_gradient():
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, dtype=torch.float64)  # frozen
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    ct.layer_norm(x, (6,), w, b).sum().backward()
    x2 = x.detach().requires_grad_()
    b2 = b.detach().requires_grad_()
    F.layer_norm(x2, (6,), w, b2).sum().backward()
    assert w.grad is None
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(b.grad, b2.grad)


def _opcheck_cases(device):
    x = torch.randn(3, 5, 8, device=device)
    w, b = torch.randn(8, device=device), torch.randn(8, device=device)
    _, stats = torch.ops.cunorm.layer_norm_fwd(x, 1, w, b, 1e-5)
    _, rstats = torch.ops.cunorm.rms_norm_fwd(x, 2, None, 1e-5)
    return [
        (torch.ops.cunorm.layer_norm_fwd.default, (x.requires_grad_(), 1, w.requires_grad_(), b, 1e-5)),
        (torch.ops.cunorm.layer_norm_fwd.default, (x, 2, None, None, 1e-3)),
        (torch.ops.cunorm.rms_norm_fwd.default, (x, 1, w, 1e-6)),
        (torch.ops.cunorm.layer_norm_bwd.default, (torch.randn_like(x), x.detach(), w.detach(), stats, 1, True)),
        (torch.ops.cunorm.rms_norm_bwd.default, (torch.randn_like(x), x.detach(), None, rstats, 2)),
    ]


def test_cpu_opcheck():
    for op, args in _opcheck_cases("cpu"):
        torch.library.opcheck(op, args)


def test_cpu_modules_state_dict_round_trip():
    ref = torch.nn.LayerNorm((4, 6), eps=1e-4, bias=False)
    ours = ct.LayerNorm((4, 6), eps=1e-4, bias=False)
    assert set(ref.state_dict()) == set(ours.state_dict())
    with torch.no_grad():
        ref.weight.uniform_()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 4, 6)
    torch.testing.assert_close(ours(x), ref(x))
    rms_ref, rms_ours = torch.nn.RMSNorm(6, eps=1e-5), ct.RMSNorm(6, eps=1e-5)
    rms_ref.load_state_dict(rms_ours.state_dict())
    torch.testing.assert_close(rms_ours(x), rms_ref(x))


def test_cpu_replace_norms_keeps_parameters():
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.LayerNorm(6),
                                torch.nn.Sequential(torch.nn.RMSNorm(6), torch.nn.LayerNorm(6, elementwise_affine=False)))
    x = torch.randn(3, 6)
    before = model(x)
    params = {n: p.data_ptr() for n, p in model.named_parameters()}
    assert ct.replace_norms(model) is model
    assert type(model[1]) is ct.LayerNorm and type(model[2][0]) is ct.RMSNorm and type(model[2][1]) is ct.LayerNorm
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == params
    torch.testing.assert_close(model(x), before)


def test_cpu_compile_fullgraph_forward_and_backward():
    model = ct.replace_norms(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.RMSNorm(8)))
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(4, 8, requires_grad=True)
    out = compiled(x)
    torch.testing.assert_close(out, model(x))
    out.sum().backward()
    assert x.grad is not None and model[1].weight.grad is not None


def _norm_pair(op, x, w, b):
    """cunorm's and torch's call of ``op`` on the same tensors (b only for LayerNorm)."""
    n = x.shape[-1:]
    if op == "layer_norm":
        return ct.layer_norm(x, n, w, b), F.layer_norm(x, n, w, b)
    return ct.rms_norm(x, n, w), F.rms_norm(x, n, w)


@pytest.mark.parametrize("mode", ["real", "fake", "symbolic"])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_cpu_make_fx_traces_the_custom_ops(op, mode):
    # make_fx records the custom ops, forward and backward; before, the eager shortcut ran
    # NumPy on the traced tensors (fake / symbolic: an error; real: y baked into the graph as
    # a constant, so the graph gave the traced call's y for any input)
    from torch.fx.experimental.proxy_tensor import make_fx

    def loss_and_grads(x, w, b):
        y = _norm_pair(op, x, w, b)[0]
        return (y,) + torch.autograd.grad(y.square().sum(), (x, w), create_graph=False)

    x, w, b = torch.randn(5, 7), torch.randn(7), torch.randn(7)
    graph = make_fx(loss_and_grads, tracing_mode=mode)(x.requires_grad_(), w.requires_grad_(), b)
    ops = {str(n.target) for n in graph.graph.nodes if n.op == "call_function"}
    assert f"cunorm.{op}_fwd.default" in ops and f"cunorm.{op}_bwd.default" in ops, ops
    x2, w2, b2 = torch.randn(5, 7, requires_grad=True), torch.randn(7, requires_grad=True), torch.randn(7)
    y2, dx2, dw2 = graph(x2, w2, b2)
    y_ref = _norm_pair(op, x2, w2, b2)[1]
    dx_ref, dw_ref = torch.autograd.grad(y_ref.square().sum(), (x2, w2))
    for got, want in ((y2, y_ref), (dx2, dx_ref), (dw2, dw_ref)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_cpu_meta_and_fake_tensors_take_the_fake_kernels(op):
    # shape inference on meta tensors (a model built under torch.device("meta")) and under
    # FakeTensorMode, as torch's own norms allow; gradients keep the parameters' shapes
    from torch._subclasses.fake_tensor import FakeTensorMode

    with torch.device("meta"):
        model = ct.replace_norms(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8),
                                                     torch.nn.RMSNorm(8)))
        x = torch.empty(3, 4, 8, requires_grad=True)
    y = model(x)
    assert y.device.type == "meta" and y.shape == (3, 4, 8)
    y.sum().backward()
    assert model[1].weight.grad.shape == (8,) and model[2].weight.grad.shape == (8,) and x.grad.shape == x.shape
    with FakeTensorMode() as fake:
        xf, wf, bf = (fake.from_tensor(t) for t in (torch.randn(6, 8, dtype=torch.bfloat16), torch.randn(8),
                                                     torch.randn(8)))
        ours, theirs = _norm_pair(op, xf, wf, bf)
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
        # fake CUDA tensors (no GPU needed): before, the CUDA launch path took them
        xc = torch.empty(6, 8, dtype=torch.bfloat16, device="cuda")
        wc, bc = torch.empty(8, device="cuda"), torch.empty(8, device="cuda")
        ours = _norm_pair(op, xc, wc, bc)[0]
        assert ours.device.type == "cuda" and ours.shape == xc.shape and ours.dtype == torch.bfloat16


def _func_transforms(x, w, W):
    """torch.func transforms of f(x, w) -> y, each a function of f giving one tensor."""
    func = torch.func
    return {
        "grad_x": lambda f: func.grad(lambda t: f(t, w).square().sum())(x),
        "grad_w": lambda f: func.grad(lambda v: f(x, v).square().sum())(w),
        "vjp": lambda f: func.vjp(lambda t: f(t, w), x)[1](x.cos())[0],
        "vmap": lambda f: func.vmap(lambda t: f(t, w))(x),
        "vmap_in_dim_1": lambda f: func.vmap(lambda t: f(t, w), in_dims=1)(x.t().contiguous()),
        "vmap_per_sample_weight": lambda f: func.vmap(f)(x, W),
        "per_sample_grads": lambda f: func.vmap(func.grad(lambda v, t: f(t, v).square().sum()),
                                                in_dims=(None, 0))(w, x),
        "jacrev": lambda f: func.jacrev(lambda t: f(t, w))(x[0]),
        "jacfwd": lambda f: func.jacfwd(lambda t: f(t, w))(x[0]),
        "jvp": lambda f: func.jvp(lambda t: f(t, w), (x,), (x.sin(),))[1],
        "hessian": lambda f: func.hessian(lambda t: f(t, w).square().sum())(x[0]),
    }


_TRANSFORMS = list(_func_transforms(*(torch.zeros(1, 1),) * 3))


@pytest.mark.parametrize("transform", _TRANSFORMS)
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_cpu_torch_func_transforms_match_torch(op, transform):
    # torch.func's transforms over cunorm's norms give torch's own values (float64): the
    # setup_context Function with a vmap rule and a backward / jvp in torch ops (cunorm.torch._func)
    torch.manual_seed(0)
    x, w, b = torch.randn(5, 9, dtype=torch.float64), torch.randn(9, dtype=torch.float64), torch.randn(9, dtype=torch.float64)
    W = torch.randn(5, 9, dtype=torch.float64)
    t = _func_transforms(x, w, W)[transform]
    if op == "layer_norm":
        ours, theirs = (lambda a, v: ct.layer_norm(a, (9,), v, b)), (lambda a, v: F.layer_norm(a, (9,), v, b))
    else:
        ours, theirs = (lambda a, v: ct.rms_norm(a, (9,), v)), (lambda a, v: F.rms_norm(a, (9,), v))
    torch.testing.assert_close(t(ours), t(theirs), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_cpu_torch_func_vmap_is_the_batched_call(dtype):
    # vmap's rule makes one call of the whole batch: the same bits as the call itself, half
    # precision with float32 parameters too; grad under vmap in the parameters' dtype
    x = torch.randn(4, 3, 16).to(dtype)
    w, b = torch.randn(16), torch.randn(16)
    torch.testing.assert_close(torch.func.vmap(lambda t: ct.layer_norm(t, (16,), w, b))(x),
                               ct.layer_norm(x, (16,), w, b), rtol=0, atol=0)
    torch.testing.assert_close(torch.func.vmap(lambda t: ct.rms_norm(t, (16,), w), in_dims=1)(x),
                               ct.rms_norm(x.transpose(0, 1), (16,), w), rtol=0, atol=0)
    dw = torch.func.vmap(torch.func.grad(lambda v, t: ct.rms_norm(t, (16,), v).float().sum()), in_dims=(None, 0))(w, x)
    assert dw.shape == (4, 16) and dw.dtype == torch.float32
    want = torch.stack([torch.autograd.grad(ct.rms_norm(x[i], (16,), w.requires_grad_()).float().sum(), w)[0]
                        for i in range(4)])
    torch.testing.assert_close(dw, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_cpu_double_backward_matches_torch(op):
    # a gradient penalty differentiates the gradient (create_graph): the eager backward then
    # runs in torch ops; before, its kernel gradients carried no graph, so the penalty's
    # gradients for x and w came back None and a layer before the norm got a wrong one
    torch.manual_seed(0)
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    w, b = (torch.randn(8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    lin = torch.nn.Linear(8, 8).double()
    results = []
    for f in (ct, F):
        y = f.layer_norm(lin(x), (8,), w, b) if op == "layer_norm" else f.rms_norm(lin(x), (8,), w)
        g, = torch.autograd.grad(y.square().sum(), x, create_graph=True)
        results.append(torch.autograd.grad((g.norm() - 1).square(), (x, w, lin.weight)))
    for ours, theirs in zip(*results):
        torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-10)
    args = (x, w, b) if op == "layer_norm" else (x, w)
    assert torch.autograd.gradgradcheck(lambda *a: getattr(ct, op)(a[0], (8,), *a[1:]), args)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_cpu_batched_backward_matches_torch(op):
    # is_grads_batched and jacobian(vectorize=True) run the backward on legacy vmap's batched
    # dy: the eager backward then takes torch ops (the kernels' NumPy views raised)
    torch.manual_seed(0)
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(5, 3, 8, dtype=torch.float64)
    ours, theirs = (lambda a: getattr(ct, op)(a, (8,), w)), (lambda a: getattr(F, op)(a, (8,), w))
    for got, want in zip(torch.autograd.grad(ours(x), (x, w), v, is_grads_batched=True),
                         torch.autograd.grad(theirs(x), (x, w), v, is_grads_batched=True)):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(torch.autograd.functional.jacobian(ours, x, vectorize=True),
                               torch.autograd.functional.jacobian(theirs, x, vectorize=True), rtol=1e-9, atol=1e-10)


def _forward_ad_tangent(f, primals, tangents):
    """f's output tangent through torch.autograd.forward_ad dual tensors (None: none came out)."""
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        duals = [p if t is None else fwAD.make_dual(p, t) for p, t in zip(primals, tangents)]
        return fwAD.unpack_dual(f(*duals)).tangent


FORWARD_MODE = {
    "forward_ad": _forward_ad_tangent,
    "func_jvp": lambda f, p, t: torch.func.jvp(f, tuple(p), tuple(t))[1],
    "jacfwd_x": lambda f, p, t: torch.func.jacfwd(lambda a: f(a, *p[1:]))(p[0]),
}


@pytest.mark.parametrize("tangents", ["x", "w", "x_w_b"])
@pytest.mark.parametrize("mode", list(FORWARD_MODE))
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_cpu_forward_mode_matches_torch(op, mode, tangents):
    # dual tensors took the eager shortcut, outside autograd: unpack_dual gave None for y's
    # tangent. Now _func's Function (its jvp) where a tangent is present
    torch.manual_seed(0)
    x, tx = torch.randn(3, 8, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64)
    w, tw, b, tb = (torch.randn(8, dtype=torch.float64) for _ in range(4))
    given = {"x": (tx, None, None), "w": (None, tw, None), "x_w_b": (tx, tw, tb)}[tangents]
    if mode == "jacfwd_x" and tangents != "x":
        pytest.skip("jacfwd here differentiates x alone")
    if op == "rms_norm":
        ours, theirs = (lambda a, v, _: ct.rms_norm(a, (8,), v)), (lambda a, v, _: F.rms_norm(a, (8,), v))
    else:
        ours, theirs = (lambda a, v, c: ct.layer_norm(a, (8,), v, c)), (lambda a, v, c: F.layer_norm(a, (8,), v, c))
    # torch.func.jvp wants a tangent for every primal
    t = [torch.zeros_like(p) if g is None and mode == "func_jvp" else g for p, g in zip((x, w, b), given)]
    got, want = FORWARD_MODE[mode](ours, [x, w, b], t), FORWARD_MODE[mode](theirs, [x, w, b], t)
    assert got is not None
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)


_NO_FORWARD_MODE = {
    "rms_norm_residual": (lambda a: ct.rms_norm(a, (8,), residual=a * 0.5)[0], (3, 8)),
    "layer_norm_weight_offset": (lambda a: ct.layer_norm(a, (8,), torch.ones(8, dtype=a.dtype), weight_offset=1.0),
                                 (3, 8)),
    "batch_norm_training": (lambda a: ct.batch_norm(a, None, None, training=True), (4, 3, 5)),
    "batch_norm_eval": (lambda a: ct.batch_norm(a, torch.zeros(3, dtype=a.dtype), torch.ones(3, dtype=a.dtype)),
                        (4, 3, 5)),
}


@pytest.mark.parametrize("mode", ["forward_ad", "func_jvp", "jacfwd_x", "jvp_of_vmap"])
@pytest.mark.parametrize("case", list(_NO_FORWARD_MODE))
def test_cpu_forward_mode_through_ops_without_a_rule_raises(case, mode):
    # custom ops with register_autograd have no forward-mode rule: torch dropped their
    # tangents silently (func.jvp returned zeros, forward_ad None); now a clear error
    f, shape = _NO_FORWARD_MODE[case]
    x = torch.randn(*shape, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="forward-mode AD"):
        if mode == "jvp_of_vmap":
            torch.func.jvp(torch.func.vmap(f), (x[None],), (x[None],))
        else:
            FORWARD_MODE[mode](lambda a, *_: f(a), [x], [torch.ones_like(x)])


def test_cpu_forward_ad_level_without_tangents_runs_every_op():
    # an open dual level alone refuses nothing: BatchNorm and the fused options run on plain
    # tensors there, and vmap of them outside any level still runs
    import torch.autograd.forward_ad as fwAD

    x = torch.randn(4, 3, 5, dtype=torch.float64)
    with fwAD.dual_level():
        torch.testing.assert_close(ct.batch_norm(x, None, None, training=True),
                                   F.batch_norm(x, None, None, training=True), rtol=1e-9, atol=1e-10)
        y, h = ct.rms_norm(x, (5,), residual=x)
        torch.testing.assert_close(y, F.rms_norm(2 * x, (5,)), rtol=1e-9, atol=1e-10)
    got = torch.func.vmap(lambda a: ct.batch_norm(a, None, None, training=True))(x[None])
    torch.testing.assert_close(got[0], F.batch_norm(x, None, None, training=True), rtol=1e-9, atol=1e-10)


def test_cpu_parameter_input_takes_the_custom_ops():
    # a Parameter (a Tensor subclass) as the input goes through the ops and still matches
    x = torch.nn.Parameter(torch.randn(4, 8, dtype=torch.float64))
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    for op in ("layer_norm", "rms_norm"):
        ours, theirs = _norm_pair(op, x, w, None)
        torch.testing.assert_close(ours, theirs)
        torch.testing.assert_close(torch.autograd.grad(ours.sum(), (x, w)), torch.autograd.grad(theirs.sum(), (x, w)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64],
                         ids=["fp16", "bf16", "fp32", "fp64"])
def test_cpu_rms_norm_default_eps_is_torchs(dtype):
    """eps=None (torch.nn.RMSNorm's default) must be torch's own: the computation dtype's
    epsilon, float32's for half inputs. Rows whose mean square (1e-6) is far under bfloat16's
    own epsilon (7.8e-3) show any other choice as an O(1) error in y."""
    x = (1e-3 * torch.randn(4, 64, dtype=torch.float64)).to(dtype)
    w = torch.rand(64, dtype=dtype) + 0.5
    want = F.rms_norm(x, (64,), w)
    torch.testing.assert_close(ct.rms_norm(x, (64,), w), want)
    torch.testing.assert_close(ct.RMSNorm(64, dtype=dtype)(x), torch.nn.RMSNorm(64, dtype=dtype)(x))
    # the CuPy / NumPy API's default, on the host
    import cunorm

    got = cunorm.rms_norm(ct._cpu._numpy_view(x), ct._cpu._numpy_view(w))
    torch.testing.assert_close(torch.from_numpy(numpy.asarray(got, dtype=numpy.float64)), want.double(),
                               **({} if dtype == torch.float64 else {"atol": 1e-2, "rtol": 1e-2}))


def test_cpu_bf16_round_trip():
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    w = torch.rand(16, dtype=torch.float32)
    torch.testing.assert_close(ct.layer_norm(x, (16,), w), F.layer_norm(x.float(), (16,), w).bfloat16(),
                               atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("call,error,name", [
    (lambda: ct.layer_norm([1.0], (1,)), TypeError, "input"),
    (lambda: ct.layer_norm(torch.ones(2, 4, dtype=torch.int32), (4,)), TypeError, "input"),
    (lambda: ct.layer_norm(torch.ones(2, 4), (3,)), ValueError, "normalized_shape"),
    (lambda: ct.layer_norm(torch.ones(2, 4), (2, 2, 4)), ValueError, "normalized_shape"),
    (lambda: ct.layer_norm(torch.ones(2, 4), (4,), torch.ones(3)), ValueError, "weight"),
    (lambda: ct.layer_norm(torch.ones(2, 4), (4,), None, torch.ones(4, dtype=torch.int64)), TypeError, "bias"),
    (lambda: ct.layer_norm(torch.ones(2, 4), (4,), eps=0.0), ValueError, "eps"),
    (lambda: ct.rms_norm(torch.ones(2, 4), (4,), eps=float("nan")), ValueError, "eps"),
    (lambda: ct.rms_norm(torch.ones(2, 4), (4,), torch.ones(4, 1)), ValueError, "weight"),
])
def test_bad_arguments_name_the_argument(call, error, name):
    with pytest.raises(error, match=rf"^{name}\b"):
        call()


# ---- GPU ----------------------------------------------------------------------------------

gpu = pytest.mark.gpu


def _reference_grads(op, x, params, dy):
    """torch's own op in float64 on upcast copies: (y, grads of x and params)."""
    x64 = x.detach().double().requires_grad_()
    p64 = [None if p is None else p.detach().double().requires_grad_(p.requires_grad) for p in params]
    # torch's default for x's own dtype (its computation dtype's epsilon), not float64's
    kwargs = {"eps": torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps} \
        if op == "rms_norm" else {}
    y = getattr(F, op)(x64, x.shape[-1:], *p64, **kwargs)
    y.backward(dy.double())
    return y, [t.grad for t in (x64, *p64)]


def _cuda_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")


@gpu
@pytest.mark.parametrize("dtype", list(TORCH_DTYPES.values()), ids=list(TORCH_DTYPES))
@pytest.mark.parametrize("shape", [(3, 7), (2049, 1536), (2, 65537), (4, 5, 256), (2, 131080)])
def test_gpu_values_and_grads_against_reference_and_torch(dtype, shape):
    _cuda_or_skip()
    n = shape[-1]
    x = torch.randn(shape, device="cuda").to(dtype).requires_grad_()
    w = (1 + 0.1 * torch.randn(n, device="cuda")).requires_grad_()
    b = (0.1 * torch.randn(n, device="cuda")).requires_grad_()
    dy = torch.randn(shape, device="cuda").to(dtype)
    for op in ("layer_norm", "rms_norm"):
        args = (w, b) if op == "layer_norm" else (w,)
        ours = getattr(ct, op)(x, (n,), *args)
        grads = torch.autograd.grad(ours, (x, *args), dy)
        theirs, their_grads = _reference_grads(op, x, args, dy)
        rtol, atol = tol(_np_dtype(dtype))
        assert ours.dtype == dtype
        assert_close(f"{op} y", ours.detach().cpu(), theirs.detach().cpu(), rtol, atol)
        assert_close(f"{op} dx", grads[0].cpu(), their_grads[0].cpu(), rtol, atol * 4)
        rows = math.prod(shape[:-1])
        for name, g, t in zip(("dweight", "dbias"), grads[1:], their_grads[1:]):
            assert g.dtype == torch.float32
            assert_close(f"{op} {name}", g.cpu(), t.cpu(), *reduction_tol(numpy.float32, rows))
        # and the NumPy reference
        xn = _numpy_view(x.detach().cpu())
        if op == "layer_norm":
            ry = reference.layer_norm(xn, w.detach().cpu().numpy(), b.detach().cpu().numpy())
        else:
            ry = reference.rms_norm(xn, w.detach().cpu().numpy())
        assert_close(f"{op} y vs reference", ours.detach().cpu(), ry, rtol, atol)


@gpu
def test_gpu_gradcheck_float64():
    _cuda_or_skip()
    x = torch.randn(5, 37, dtype=torch.float64, device="cuda", requires_grad=True)
    w = torch.randn(37, dtype=torch.float64, device="cuda", requires_grad=True)
    b = torch.randn(37, dtype=torch.float64, device="cuda", requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, c, d: ct.layer_norm(a, (37,), c, d), (x, w, b))
    assert torch.autograd.gradcheck(lambda a, c: ct.rms_norm(a, (37,), c), (x, w))
    # create_graph: the backward in torch ops, differentiable again
    assert torch.autograd.gradgradcheck(lambda a, c, d: ct.layer_norm(a, (37,), c, d), (x, w, b))
    assert torch.autograd.gradgradcheck(lambda a, c: ct.rms_norm(a, (37,), c), (x, w))


@gpu
@pytest.mark.parametrize("transform", _TRANSFORMS)
def test_gpu_torch_func_transforms_match_torch(transform):
    # the kernels under torch.func (the forward on plain tensors, vmap's one batched call)
    # against torch's own norms, float64 on CUDA; and make_fx's fake tracing of a CUDA call
    _cuda_or_skip()
    from torch.fx.experimental.proxy_tensor import make_fx

    torch.manual_seed(0)
    x, w, b, W = (torch.randn(*s, dtype=torch.float64, device="cuda") for s in ((5, 1533), (1533,), (1533,), (5, 1533)))
    t = _func_transforms(x, w, W)[transform]
    torch.testing.assert_close(t(lambda a, v: ct.layer_norm(a, (1533,), v, b)),
                               t(lambda a, v: F.layer_norm(a, (1533,), v, b)), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(t(lambda a, v: ct.rms_norm(a, (1533,), v)), t(lambda a, v: F.rms_norm(a, (1533,), v)),
                               rtol=1e-9, atol=1e-9)
    # w an argument of the traced function: fake tracing refuses a real tensor captured in a
    # closure, torch's own F.rms_norm alike (the fifty-ninth session's check failed on that)
    graph = make_fx(lambda a, v: ct.rms_norm(a, (1533,), v), tracing_mode="fake")(x, w)
    torch.testing.assert_close(graph(x + 1, w), ct.rms_norm(x + 1, (1533,), w), rtol=0, atol=0)


@gpu
@pytest.mark.parametrize("mode", list(FORWARD_MODE))
def test_gpu_forward_mode_matches_torch(mode):
    # dual tensors and torch.func's forward mode through the kernels (CUDA, float64)
    _cuda_or_skip()
    torch.manual_seed(0)
    x, tx = (torch.randn(5, 1533, dtype=torch.float64, device="cuda") for _ in range(2))
    w, tw, b, tb = (torch.randn(1533, dtype=torch.float64, device="cuda") for _ in range(4))
    t = [tx] if mode == "jacfwd_x" else [tx, tw, tb]
    for ours, theirs in ((lambda a, v, c: ct.layer_norm(a, (1533,), v, c), lambda a, v, c: F.layer_norm(a, (1533,), v, c)),
                         (lambda a, v, c: ct.rms_norm(a, (1533,), v), lambda a, v, c: F.rms_norm(a, (1533,), v))):
        if mode == "jacfwd_x":  # one row: jacfwd's Jacobian is rows x rows
            p = [x[:1], w, b]
        else:
            p = [x, w, b]
        torch.testing.assert_close(FORWARD_MODE[mode](ours, p, t), FORWARD_MODE[mode](theirs, p, t),
                                   rtol=1e-9, atol=1e-9)


@gpu
def test_gpu_opcheck():
    _cuda_or_skip()
    for op, args in _opcheck_cases("cuda"):
        torch.library.opcheck(op, args)


@gpu
def test_gpu_zero_copy_torch_memory_only():
    _cuda_or_skip()
    import cupy

    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(4096, device="cuda")
    ct.layer_norm(x, (4096,), w, w)  # compile and warm up
    torch.cuda.synchronize()
    pool = cupy.get_default_memory_pool()
    pool_before = pool.used_bytes() + pool.total_bytes()
    torch_before = torch.cuda.memory_allocated()
    y, stats = torch.ops.cunorm.layer_norm_fwd(x, 1, w, w, 1e-5)
    torch.cuda.synchronize()
    assert pool.used_bytes() + pool.total_bytes() == pool_before, "CuPy's pool was used"
    grown = torch.cuda.memory_allocated() - torch_before
    block = 512  # torch's caching allocator rounds every allocation up to 512 bytes
    outputs = sum(-(-t.untyped_storage().nbytes() // block) * block for t in (y, stats))
    assert grown == outputs, "copies or scratch leaked"


@gpu
def test_gpu_side_stream():
    _cuda_or_skip()
    x = torch.randn(256, 2048, device="cuda")
    want = F.layer_norm(x, (2048,))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = ct.layer_norm(x, (2048,))
        z = ct.layer_norm(x, (2048,))
    torch.cuda.current_stream().wait_stream(s)
    torch.testing.assert_close(y, want, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(z, want, atol=2e-5, rtol=2e-5)


@gpu
def test_gpu_cuda_graph_capture_and_replay():
    _cuda_or_skip()
    model = ct.replace_norms(torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.LayerNorm(512),
                                                 torch.nn.RMSNorm(512))).cuda()
    static_x = torch.randn(32, 512, device="cuda", requires_grad=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up: compile kernels outside the capture
        for _ in range(2):
            model(static_x).sum().backward()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = model(static_x)
        static_out.sum().backward()
    for _ in range(3):
        static_x.data.copy_(torch.randn(32, 512, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(static_out, model(static_x), atol=1e-5, rtol=1e-5)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_cuda_graph_replays_the_grid_rows(dtype):
    # rows of 131080 take the grid rows' backward (a cooperative launch after a memset of its
    # barrier counters): both captured in torch's graph, the counters zeroed on every replay
    _cuda_or_skip()
    n = 131080
    w = (1 + 0.1 * torch.randn(n, device="cuda")).requires_grad_()
    b = (0.1 * torch.randn(n, device="cuda")).requires_grad_()
    static_x = torch.randn(3, n, device="cuda").to(dtype).requires_grad_()
    static_dy = torch.randn(3, n, device="cuda").to(dtype)

    def step():
        y = ct.layer_norm(static_x, (n,), w, b) + ct.rms_norm(static_x, (n,), w)
        return torch.autograd.grad(y, (static_x, w, b), static_dy)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up: compile kernels outside the capture
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_grads = step()
    for _ in range(3):
        static_x.data.copy_(torch.randn(3, n, device="cuda").to(dtype))
        static_dy.copy_(torch.randn(3, n, device="cuda").to(dtype))
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(static_grads, step()):
            assert torch.equal(got, want)  # the grid rows fold in block order: the same bits


@gpu
def test_gpu_compile_reduce_overhead():
    _cuda_or_skip()
    model = ct.replace_norms(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.LayerNorm(256),
                                                 torch.nn.RMSNorm(256))).cuda()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    for _ in range(4):
        x = torch.randn(16, 256, device="cuda")
        torch.testing.assert_close(compiled(x).clone(), model(x), atol=1e-5, rtol=1e-5)


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_autocast_follows_torch_policy(dtype):
    _cuda_or_skip()
    x = torch.randn(8, 64, device="cuda", dtype=dtype)
    w = torch.ones(64, device="cuda")
    with torch.autocast("cuda", dtype=dtype):
        assert ct.layer_norm(x, (64,), w, w).dtype == F.layer_norm(x, (64,), w, w).dtype
        assert ct.rms_norm(x, (64,), w).dtype == F.rms_norm(x, (64,), w).dtype
        assert ct.layer_norm(x, (64,), w, w, autocast_to_fp32=False).dtype == dtype


@gpu
def test_gpu_transformer_block_training_matches_torch():
    _cuda_or_skip()
    torch.manual_seed(0)

    def block():
        return torch.nn.Sequential(
            torch.nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True, norm_first=True),
            torch.nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True, norm_first=True),
            torch.nn.RMSNorm(128), torch.nn.Linear(128, 1)).cuda()

    ref = block()
    ours = ct.replace_norms(block())
    ours.load_state_dict(ref.state_dict())
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (ref, ours)]
    data = torch.randn(8, 16, 128, device="cuda")
    target = torch.randn(8, 16, 1, device="cuda")
    for _ in range(5):
        losses = []
        for model, opt in zip((ref, ours), opts):
            opt.zero_grad()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.mse_loss(model(data).float(), target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=2e-2)


@gpu
def test_gpu_second_device():
    _cuda_or_skip()
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs: this machine has one")
    x = torch.randn(16, 1024, device="cuda:1")
    torch.testing.assert_close(ct.layer_norm(x, (1024,)), F.layer_norm(x, (1024,)), atol=2e-5, rtol=2e-5)


@gpu
@pytest.mark.parametrize("case", ["transposed_input", "misaligned_input", "row_strided_input", "cast_weight",
                                  "zero_stride_grad", "bias_dtype_differs", "frozen_weight"])
def test_gpu_general_path_layouts_and_dtypes(case):
    """Signatures the per-call fast path hands to the general one (copies, casts, odd dy),
    or takes itself with strided or misaligned rows: values and gradients against torch in
    float64."""
    _cuda_or_skip()
    n = 499
    dtype = torch.float16 if case in ("cast_weight", "misaligned_input") else torch.float32
    x = torch.randn(7, n, device="cuda").to(dtype)
    if case == "transposed_input":
        x = torch.randn(n, 7, device="cuda").t()
    if case == "row_strided_input":  # rows addressed in place, 512 elements apart
        x = torch.randn(7, 512, device="cuda")[:, :n]
    if case == "misaligned_input":
        x = torch.randn(7, n + 1, device="cuda").to(dtype)[:, 1:]
    x.requires_grad_()
    w = (1 + 0.1 * torch.randn(n, device="cuda")).requires_grad_(case != "frozen_weight")
    b = (0.1 * torch.randn(n, device="cuda")).requires_grad_()
    if case == "cast_weight":
        w = w.detach().bfloat16().requires_grad_()
    if case == "bias_dtype_differs":
        b = b.detach().double().requires_grad_()
    for op in ("layer_norm", "rms_norm"):
        params = (w, b) if op == "layer_norm" else (w,)
        y = getattr(ct, op)(x, (n,), *params)
        dy = torch.ones_like(y) if case == "zero_stride_grad" else torch.randn_like(y)
        if case == "zero_stride_grad":
            y.sum().backward()  # autograd hands the backward an expanded (stride 0) dy
        else:
            y.backward(dy)
        ref_y, ref_grads = _reference_grads(op, x, params, dy)
        rtol, atol = tol(_np_dtype(dtype))
        assert_close(f"{case} {op} y", y.detach().cpu(), ref_y.detach().cpu(), rtol, atol)
        for name, t, ref in zip(("dx", "dweight", "dbias"), (x, *params), ref_grads):
            if not t.requires_grad:
                assert t.grad is None and ref is None
                continue
            assert t.grad.dtype == t.dtype
            # half-precision gradients round once to their dtype; float64 dbias is an fp32 sum
            half = t.dtype in (torch.float16, torch.bfloat16)
            rtol, atol = reduction_tol(_np_dtype(t.dtype if half else torch.float32), 1 if name == "dx" else 7)
            assert_close(f"{case} {op} {name}", t.grad.cpu().double(), ref.cpu(), rtol, 4 * atol)
            t.grad = None


@gpu
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("rows", [7, 600])  # 600 x 499 fp32 is past PREPARED_DX_BYTES: dx made in the backward
def test_gpu_fast_backward_twice_on_one_graph(op, rows):
    """The forward allocates its backward's outputs; a second backward of one graph
    (retain_graph) must be right and leave the gradients the first returned as they were."""
    _cuda_or_skip()
    n = 499
    x = torch.randn(rows, n, device="cuda", requires_grad=True)
    params = tuple(torch.randn(n, device="cuda", requires_grad=True) for _ in range(2 if op == "layer_norm" else 1))
    dy1, dy2 = torch.randn(rows, n, device="cuda"), torch.randn(rows, n, device="cuda")
    y = getattr(ct, op)(x, (n,), *params)
    first = torch.autograd.grad(y, (x, *params), dy1, retain_graph=True)
    second = torch.autograd.grad(y, (x, *params), dy2)
    for dy, grads in ((dy1, first), (dy2, second)):
        _, ref_grads = _reference_grads(op, x, params, dy)
        for name, g, ref in zip(("dx", "dweight", "dbias"), grads, ref_grads):
            rtol, atol = reduction_tol(numpy.dtype(numpy.float32), 1 if name == "dx" else 7)
            assert_close(f"{op} rows={rows} {name}", g.cpu().double(), ref.cpu(), rtol, 4 * atol)


@gpu
@pytest.mark.parametrize("shape,dtype", [((64, 4096), torch.bfloat16), ((300, 512), torch.bfloat16),
                                         ((600, 1024), torch.float32), ((3, 7), torch.float32)],
                         ids=["column_plan", "row_plan_small_x", "row_plan_dx_in_backward", "odd_row"])
def test_gpu_prepared_backward_serves_plain_calls(shape, dtype, monkeypatch):
    """A plain eager call's backward runs what its forward prepared: the one-launch column
    plan's argument list (few rows), or the plan with its scratch made in the backward (more
    rows; dx too past PREPARED_DX_BYTES), never the signature-keyed general backward."""
    _cuda_or_skip()
    import cunorm.torch as package

    def general(*args, **kwargs):
        raise AssertionError("the general backward ran")

    monkeypatch.setattr(package, "_backward_impl", general)
    n = shape[-1]
    x = torch.randn(shape, device="cuda").to(dtype).requires_grad_()
    w = (1 + 0.1 * torch.randn(n, device="cuda")).to(dtype).requires_grad_()
    b = (0.1 * torch.randn(n, device="cuda")).to(dtype).requires_grad_()
    dy = torch.randn(shape, device="cuda").to(dtype)
    for op in ("layer_norm", "rms_norm"):
        params = (w, b) if op == "layer_norm" else (w,)
        for _ in range(2):  # the second call takes the cached signature and plan
            grads = torch.autograd.grad(getattr(ct, op)(x, (n,), *params), (x, *params), dy)
        _, ref_grads = _reference_grads(op, x, params, dy)
        for name, g, ref in zip(("dx", "dweight", "dbias"), grads, ref_grads):
            rtol, atol = reduction_tol(_np_dtype(dtype), 1 if name == "dx" else shape[0])
            assert_close(f"{op} {shape} {name}", g.cpu().double(), ref.cpu(), rtol, 4 * atol)


def _misaligned_copy(t):
    """t's values in memory one element past an allocation's start (16-byte alignment lost)."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:]
    return flat.view(t.shape).copy_(t)


@gpu
@pytest.mark.parametrize("unpack", ["contiguous_copy", "misaligned_copy"])
def test_gpu_fast_backward_checks_unpacked_tensors(unpack):
    """Saved-tensor hooks (activation offloading) hand the backward other memory than the
    forward saw: rows at another stride, or a pointer the plan's vector width cannot load.
    The backward must notice and take the general path; the same signature without hooks
    afterwards must still be right."""
    _cuda_or_skip()
    n = 499
    base = torch.randn(7, 512, device="cuda")
    x = base[:, :n].requires_grad_() if unpack == "contiguous_copy" else base[:, :496].clone().requires_grad_()
    n = x.shape[1]
    w, b = (torch.randn(n, device="cuda", requires_grad=True) for _ in range(2))
    dy = torch.randn(7, n, device="cuda")
    to_other_memory = (lambda t: t.contiguous().clone()) if unpack == "contiguous_copy" else _misaligned_copy
    for hooked in (True, False):
        if hooked:
            with torch.autograd.graph.saved_tensors_hooks(lambda t: t.detach().cpu(),
                                                          lambda t: to_other_memory(t.cuda())):
                y = ct.layer_norm(x, (n,), w, b)
        else:
            y = ct.layer_norm(x, (n,), w, b)
        grads = torch.autograd.grad(y, (x, w, b), dy)
        _, ref_grads = _reference_grads("layer_norm", x, (w, b), dy)
        for name, g, ref in zip(("dx", "dweight", "dbias"), grads, ref_grads):
            rtol, atol = reduction_tol(numpy.dtype(numpy.float32), 1 if name == "dx" else 7)
            assert_close(f"{unpack} hooked={hooked} {name}", g.cpu().double(), ref.cpu(), rtol, 4 * atol)


@gpu
def test_gpu_fresh_thread_and_repeated_signature():
    """A thread that never touched CUDA (its driver context unset) can call in, and a cached
    signature called with new tensors gives their results, not the first call's."""
    _cuda_or_skip()
    import threading

    results = []

    def work():
        for _ in range(2):
            x = torch.randn(3, 257, device="cuda")
            results.append((ct.layer_norm(x, (257,)), F.layer_norm(x, (257,))))

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert len(results) == 2
    for ours, theirs in results:
        torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=2e-5)
