"""Host overhead of one small call through the PyTorch adapter, taken apart.

    python benchmarks/profile_host.py

Prints wall microseconds per call of torch primitives, of each layer of cunorm's torch path
and of torch's own layer_norm; then where a forward+backward spends its time: the hop to
torch's autograd device thread, the Python backward on that thread (profiled there, since a
cProfile of the caller sees only the engine's wait), and the hop back.
"""
from __future__ import annotations

import cProfile
import io
import pstats
import time

import torch

import cunorm.torch as ct
import cunorm.torch._cuda as tc
from cunorm.torch._common import _check_tensors
from cunorm._bench_torch import _wall_us as wall_us  # the GPU check's own wall-time method


class _Empty(torch.autograd.Function):
    """The floor of a Python autograd.Function: allocate the output, nothing else."""

    @staticmethod
    def forward(ctx, x):
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, dy):
        return torch.empty_like(dy)


class _Floor(torch.autograd.Function):
    """The floor of a LayerNorm-shaped autograd.Function: five arguments, three saved tensors,
    outputs allocated, no kernel."""

    @staticmethod
    def forward(ctx, x, nd, w, b, eps):
        ctx.save_for_backward(x, w, b)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, dy):
        x, w, b = ctx.saved_tensors
        return torch.empty_like(dy), None, torch.empty_like(w), torch.empty_like(b), None


def primitives(x, w):
    dev = x.device
    cases = {
        "x.shape": lambda: x.shape,
        "x.stride()": lambda: x.stride(),
        "x.data_ptr()": lambda: x.data_ptr(),
        "x.device": lambda: x.device,
        "x.dtype": lambda: x.dtype,
        "x.is_cuda": lambda: x.is_cuda,
        "torch.empty(shape,dtype,device)": lambda: torch.empty(x.shape, dtype=x.dtype, device=dev),
        "torch.empty_like": lambda: torch.empty_like(x),
        "x.new_empty": lambda: x.new_empty(x.shape),
        "is_autocast_enabled": lambda: torch.is_autocast_enabled("cuda"),
        "compiler.is_compiling": lambda: torch.compiler.is_compiling(),
        "is_grad_enabled": lambda: torch.is_grad_enabled(),
        "current_device": lambda: torch.cuda.current_device(),
        "raw stream": lambda: tc._stream(0),
        "_view(x)": lambda: tc._view(x),
        "_check_tensors": lambda: _check_tensors(x, 1, weight=w, bias=w),
        "_params": lambda: tc._params(x, w, w),
    }
    return cases


def hops(fn_cls, call, dy, label, n_calls=200):
    """One forward+backward cut at its seams (median of n_calls): the forward (``call()``,
    which returns the output of an ``fn_cls`` Function), backward() -> Python backward start
    (the hop to the autograd thread), the Python backward, its end -> backward() returning,
    and dropping the output (which frees the graph)."""
    marks = []
    orig = fn_cls.backward

    def timed_backward(ctx, g):
        t0 = time.perf_counter()
        r = orig(ctx, g)
        marks.append((t0, time.perf_counter()))
        return r

    fn_cls.backward = staticmethod(timed_backward)
    try:
        rows = []
        for _ in range(n_calls):
            t0 = time.perf_counter()
            y = call()
            t1 = time.perf_counter()
            y.backward(dy)
            t4 = time.perf_counter()
            del y
            t5 = time.perf_counter()
            t2, t3 = marks[-1]
            rows.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4))
        torch.cuda.synchronize()
    finally:
        fn_cls.backward = orig
    cols = list(zip(*rows))
    med = [sorted(c)[len(c) // 2] * 1e6 for c in cols]
    print(f"{label} (medians, us): forward {med[0]:.1f} | hop in {med[1]:.1f} | python backward {med[2]:.1f} "
          f"| hop out {med[3]:.1f} | free graph {med[4]:.1f}")


def profile_backward_thread(x, w, dy, n_calls=200):
    prof = cProfile.Profile()
    orig = ct._LayerNormFunction.backward

    def profiled(ctx, g):
        prof.enable()
        try:
            return orig(ctx, g)
        finally:
            prof.disable()

    ct._LayerNormFunction.backward = staticmethod(profiled)
    try:
        for _ in range(n_calls):
            ct.layer_norm(x, (x.shape[-1],), w, w).backward(dy)
        torch.cuda.synchronize()
    finally:
        ct._LayerNormFunction.backward = orig
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
    print(s.getvalue())


def main():
    n = 4096
    for m in (1, 64):
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.ones(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        xg = x.clone().requires_grad_()
        dy = torch.randn_like(x)
        print(f"--- ({m}, {n}) bfloat16")
        cases = dict(primitives(x, w)) if m == 1 else {}
        wd = w.detach()
        cases.update({
            "_forward_impl no stats": lambda: ct._forward_impl(x, 1, wd, wd, 1e-5, False, False),
            "_forward_impl stats": lambda: ct._forward_impl(x, 1, wd, wd, 1e-5, False),
            "ct.layer_norm no-grad": lambda: ct.layer_norm(x, (n,), wd, wd),
            "F.layer_norm no-grad": lambda: torch.nn.functional.layer_norm(x, (n,), wd, wd),
            "_Empty fwd+bwd": lambda: _Empty.apply(xg).backward(dy),
            "_Floor fwd+bwd": lambda: _Floor.apply(xg, 1, w, w, 1e-5).backward(dy),
            "ct.layer_norm fwd (grad mode)": lambda: ct.layer_norm(xg, (n,), w, w),
            "F.layer_norm fwd (grad mode)": lambda: torch.nn.functional.layer_norm(xg, (n,), w, w),
            "ct.layer_norm fwd+bwd": lambda: ct.layer_norm(xg, (n,), w, w).backward(dy),
            "F.layer_norm fwd+bwd": lambda: torch.nn.functional.layer_norm(xg, (n,), w, w).backward(dy),
        })
        _, stats = ct._forward_impl(x, 1, wd, wd, 1e-5, False)
        cases["_backward_impl (caller thread)"] = lambda: ct._backward_impl(dy, x, wd, stats, 1, False, True)
        yr = ct.layer_norm(xg, (n,), w, w)
        yt = torch.nn.functional.layer_norm(xg, (n,), w, w)
        cases["ct backward only (retain_graph)"] = lambda: yr.backward(dy, retain_graph=True)
        cases["F backward only (retain_graph)"] = lambda: yt.backward(dy, retain_graph=True)
        if m == 1:
            from cupy_backends.cuda.api import runtime

            from cunorm import _launch
            from cunorm.ops import _row_norm

            ct.layer_norm(x, (n,), wd, wd)
            plan = next(v for k, v in tc._forward_plans.items() if v and k[0] == x.shape)[0]
            y, stream = torch.empty_like(x), tc._stream(0)
            cases.update({
                "runtime.setDevice": lambda: runtime.setDevice(0),
                "make_current": lambda: _launch.make_current(0),
                "run_forward (cached plan)": lambda: _row_norm.run_forward(plan, x.data_ptr(), y.data_ptr(),
                                                                           wd.data_ptr(), wd.data_ptr(), 0, 0,
                                                                           None, stream),
            })
        for name, fn in cases.items():
            print(f"{name:34s} {wall_us(fn):8.1f} us/call", flush=True)
        hops(ct._LayerNormFunction, lambda: ct.layer_norm(xg, (n,), w, w), dy, "cunorm fwd+bwd")
    print("--- cProfile of the Python backward on the autograd thread, (64, 4096), 200 calls")
    x = torch.randn(64, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    profile_backward_thread(x, w, torch.randn_like(x))


if __name__ == "__main__":
    main()
