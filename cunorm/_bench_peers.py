"""Other implementations ``python -m cunorm bench --compare`` times next to cunorm, by the
same bytes model and method as ``_bench`` (forward: x read, y written; backward: x and dy
read, dx written; dW/dB computed too, as autograd's backward does).

    torch    torch.nn.functional.layer_norm / rms_norm, eager
    compile  the same functions through torch.compile (default mode)
"""
from __future__ import annotations

import functools

PEERS = ("torch", "compile")
_TORCH_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}


def unavailable(name: str) -> str | None:
    """Why ``name`` cannot be timed here, or None when it can."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "PyTorch sees no CUDA device"
    if name == "compile" and not hasattr(torch, "compile"):
        return "this PyTorch has no torch.compile"
    return None


def _functional(op: str, compiled: bool):
    import torch
    import torch.nn.functional as F

    if op == "layer_norm":
        def fn(x, w, b):
            return F.layer_norm(x, x.shape[-1:], w, b, 1e-5)
    else:
        def fn(x, w, b):
            return F.rms_norm(x, x.shape[-1:], w, 1e-5)
    return torch.compile(fn, dynamic=False) if compiled else fn


@functools.lru_cache(maxsize=None)
def _fn(name: str, op: str):
    return _functional(op, compiled=name == "compile")


def time_peer(name: str, op: str, dtype: str, m: int, n: int) -> dict:
    """{"fwd_ms", "bwd_ms"}: median kernel-stream time per call on torch's current stream."""
    import torch

    from ._bench_torch import _event_ms

    tdt = getattr(torch, _TORCH_DTYPES[dtype])
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, n, device="cuda", generator=gen).to(tdt).requires_grad_()
    dy = torch.randn(m, n, device="cuda", generator=gen).to(tdt)
    w = (1 + 0.1 * torch.randn(n, device="cuda", generator=gen)).to(tdt).requires_grad_()
    b = (0.1 * torch.randn(n, device="cuda", generator=gen)).to(tdt).requires_grad_()
    fn = _fn(name, op)
    inputs = (x, w, b) if op == "layer_norm" else (x, w)

    def fwd():
        with torch.no_grad():
            return fn(x, w, b)

    y = fn(x, w, b)

    def bwd():
        return torch.autograd.grad(y, inputs, dy, retain_graph=True)

    return {"fwd_ms": _event_ms(fwd), "bwd_ms": _event_ms(bwd)}
