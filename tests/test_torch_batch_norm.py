"""cunorm.torch's BatchNorm: the functional op and BatchNorm1d/2d/3d against torch.nn's
semantics (running statistics, num_batches_tracked, momentum=None, eval, affine and
track_running_stats off), the fused residual and activation, autograd (gradcheck), opcheck
and torch.compile — on the CPU through the reference (CI), and on the GPU through the kernels."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import torch.nn.functional as F  # noqa: E402

import cunorm.torch as ct  # noqa: E402
from cunorm import activations  # noqa: E402

ACTS = {None: lambda z, p: z, "relu": lambda z, p: F.relu(z), "leaky_relu": lambda z, p: F.leaky_relu(z, p),
        "gelu": lambda z, p: F.gelu(z), "gelu_tanh": lambda z, p: F.gelu(z, approximate="tanh"),
        "silu": lambda z, p: F.silu(z), "sigmoid": lambda z, p: torch.sigmoid(z), "tanh": lambda z, p: torch.tanh(z),
        "mish": lambda z, p: F.mish(z), "elu": lambda z, p: F.elu(z, p), "hardswish": lambda z, p: F.hardswish(z),
        "softplus": lambda z, p: F.softplus(z, p)}


def _devices():
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _device_or_skip(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    return device


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("activation", list(ACTS), ids=[str(a) for a in ACTS])
def test_functional_matches_torch(device, activation):
    dev = _device_or_skip(device)
    dt = torch.float64 if dev == "cpu" else torch.float32
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 5, 6, 7, generator=g, dtype=dt) * 1.5 + 0.3).to(dev).requires_grad_()
    r = torch.randn(4, 5, 6, 7, generator=g, dtype=dt).to(dev).requires_grad_()
    w = (1 + 0.2 * torch.randn(5, generator=g, dtype=dt)).to(dev).requires_grad_()
    b = (0.2 * torch.randn(5, generator=g, dtype=dt)).to(dev).requires_grad_()
    p = activations.check(activation, None)[1]
    param = None if activations.ACTIVATIONS[activation][1] is None else p
    rm, rv = torch.zeros(5, dtype=dt, device=dev), torch.ones(5, dtype=dt, device=dev)
    rm2, rv2 = rm.clone(), rv.clone()
    y = ct.batch_norm(x, rm, rv, w, b, training=True, residual=r, activation=activation, activation_param=param)
    y2 = ACTS[activation](F.batch_norm(x, rm2, rv2, w, b, training=True) + r, p)
    dy = torch.randn_like(y)
    ours, theirs = torch.autograd.grad(y, (x, w, b, r), dy), torch.autograd.grad(y2, (x, w, b, r), dy)
    tol = 1e-9 if dt == torch.float64 else 2e-4
    for name, a, e in (("y", y, y2), ("running_mean", rm, rm2), ("running_var", rv, rv2),
                       *zip(("dx", "dweight", "dbias", "dresidual"), ours, theirs)):
        torch.testing.assert_close(a, e, rtol=tol, atol=tol, msg=name)


def test_gradcheck_and_opcheck_cpu():
    x = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True)
    r = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    rm, rv = torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda x, w, b, r: ct.batch_norm(x, None, None, w, b, training=True, residual=r, activation="silu"),
        (x, w, b, r))
    assert torch.autograd.gradcheck(lambda x, w, b: ct.batch_norm(x, rm, rv, w, b, activation="elu"), (x, w, b))
    torch.library.opcheck(torch.ops.cunorm.batch_norm_fwd.default,
                          (x.detach(), w.detach(), b.detach(), rm, rv, r.detach(), True, 0.1, 1e-5, "gelu", 0.0))
    st = torch.stack([torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)])
    torch.library.opcheck(torch.ops.cunorm.batch_norm_bwd.default,
                          (torch.randn_like(x), x.detach(), w.detach(), b.detach(), st, r.detach(), True, "gelu", 0.0,
                           True, True))


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("cls,shape", [(ct.BatchNorm1d, (6, 4)), (ct.BatchNorm1d, (3, 4, 7)),
                                       (ct.BatchNorm2d, (2, 4, 5, 3)), (ct.BatchNorm3d, (2, 4, 3, 2, 3))],
                         ids=["1d_NC", "1d_NCL", "2d", "3d"])
def test_module_matches_torch_nn(device, cls, shape):
    dev = _device_or_skip(device)
    dt = torch.float64 if dev == "cpu" else torch.float32
    theirs = getattr(torch.nn, cls.__name__)(4).to(dev, dt)
    ours = cls(4).to(dev, dt)
    ours.load_state_dict(theirs.state_dict())
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    tol = 1e-9 if dt == torch.float64 else 1e-4
    for momentum in (0.1, None):
        ours.momentum = theirs.momentum = momentum
        for _ in range(2):
            x = torch.randn(shape, dtype=dt, device=dev)
            torch.testing.assert_close(ours(x), theirs(x), rtol=tol, atol=tol)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(ours, name), getattr(theirs, name), rtol=tol, atol=tol, msg=name)
    ours.eval()
    theirs.eval()
    x = torch.randn(shape, dtype=dt, device=dev)
    torch.testing.assert_close(ours(x), theirs(x), rtol=tol, atol=tol)


@pytest.mark.parametrize("affine,track", [(False, True), (True, False), (False, False)])
def test_module_options_match_torch_nn(affine, track):
    theirs = torch.nn.BatchNorm2d(3, affine=affine, track_running_stats=track).double()
    ours = ct.BatchNorm2d(3, affine=affine, track_running_stats=track).double()
    for mode in ("train", "eval"):
        getattr(ours, mode)()
        getattr(theirs, mode)()
        x = torch.randn(2, 3, 4, 4, dtype=torch.float64)
        torch.testing.assert_close(ours(x), theirs(x))


def test_module_fused_residual_activation_and_replace_norms():
    m = ct.BatchNorm2d(3, activation="leaky_relu", activation_param=0.2).double()
    ref = torch.nn.BatchNorm2d(3).double()
    x, r = torch.randn(2, 3, 4, 4, dtype=torch.float64), torch.randn(2, 3, 4, 4, dtype=torch.float64)
    torch.testing.assert_close(m(x, residual=r), F.leaky_relu(ref(x) + r, 0.2))
    assert "activation='leaky_relu'" in repr(m)
    seq = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1), torch.nn.BatchNorm2d(3)).double()
    before = {k: v.clone() for k, v in seq.state_dict().items()}
    ct.replace_norms(seq)
    assert type(seq[1]) is ct.BatchNorm2d and seq[1].activation is None
    assert all(torch.equal(before[k], v) for k, v in seq.state_dict().items())
    seq(x)


def test_bad_arguments_name_the_argument():
    x = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match="^activation"):
        ct.BatchNorm1d(3, activation="swish")
    with pytest.raises(ValueError, match="^weight"):
        ct.batch_norm(x, None, None, torch.ones(4), training=True)
    with pytest.raises(ValueError, match="^running_mean"):
        ct.batch_norm(x, None, None, training=False)
    with pytest.raises(ValueError, match="^input"):
        ct.batch_norm(x[:1, :, :1], None, None, training=True)


def test_compile_fullgraph_cpu():
    import copy

    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), ct.BatchNorm2d(4, activation="relu")).double()
    twin = copy.deepcopy(m)
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    compiled = torch.compile(twin, fullgraph=True)
    torch.testing.assert_close(compiled(x), m(x))
    for name in ("running_mean", "running_var", "num_batches_tracked"):  # buffer updates traced too
        torch.testing.assert_close(getattr(twin[1], name), getattr(m[1], name), msg=name)


@pytest.mark.gpu
def test_gpu_channels_last_autocast_and_bf16():
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    m = ct.BatchNorm2d(8).cuda()
    ref = torch.nn.BatchNorm2d(8).cuda()
    x = torch.randn(4, 8, 6, 5, device="cuda").to(memory_format=torch.channels_last)
    y = m(x)
    assert y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y, ref(x), rtol=1e-4, atol=1e-4)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        xb = x.bfloat16()
        yb = m(xb)
    assert yb.dtype == torch.bfloat16 and m.weight.dtype == torch.float32
    torch.testing.assert_close(yb.float(), ref(xb.float()), rtol=2e-2, atol=2e-2)
