"""Forward + backward wall time of a small LayerNorm through variants of the eager
autograd.Function, interleaved in rounds (host timings drift; each variant keeps its median).

    python benchmarks/profile_autograd_variants.py

Issue 3's target is forward + backward at most 1.5x torch's wall time at (1, 4096) and
(64, 4096) bf16. The variants separate what the Python backward on torch's autograd thread
costs: the adapter; a lean Function (no wrapper checks, a direct launch) with everything
made in the backward; the same with the parameter gradients, then dx too, allocated by the
forward on the caller's thread; and with the saved tensors kept as ctx attributes instead
of save_for_backward (what moving allocations off the autograd thread and the saved-tensor
machinery are worth: benchmarks/NOTES.md, v14).
"""
from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.nn.functional as F

import cunorm.torch as ct
from cunorm import _bench_torch
import cunorm.torch._cuda as tc
from cunorm._launch import launch, make_current
from profile_host import _Floor  # the LayerNorm-shaped Function floor

ROUNDS = 41  # short rounds, many of them: the host drifts within a run
CALLS = 100
_bench_torch.WALL_CALLS = CALLS  # the GPU check's own wall-time method, shorter rounds
wall_us = _bench_torch._wall_us


def _lean_class(prealloc_grads: bool, prealloc_dx: bool, attrs: bool, stamps: list | None = None):
    class _Lean(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, nd, w, b, eps):
            fast = []
            y, stats = ct._forward_impl(x, nd, w, b, eps, rms=False, backward_state=fast)
            plan = fast[0]._backward_plan(x, w)
            sp = stats.data_ptr()
            ctx.pre = (x.data_ptr(), *plan.x_args, w.data_ptr(), sp, sp + plan.m * plan.acc.itemsize)
            ctx.plan, ctx.dev, ctx.w = plan, fast[0].dev, w
            if attrs:
                ctx.keep, ctx.version = (x, w, stats), x._version
            else:
                ctx.save_for_backward(x, w, stats)
            ctx.grads = (torch.empty_like(w), torch.empty_like(b)) if prealloc_grads else None
            ctx.dx = torch.empty_like(x) if prealloc_dx else None
            return y

        @staticmethod
        def backward(ctx, dy):
            t0 = time.perf_counter()
            if attrs:
                if ctx.keep[0]._version != ctx.version:
                    raise RuntimeError("input modified in place")
            else:
                ctx.saved_tensors
            dx = ctx.dx if ctx.dx is not None else torch.empty_like(dy)
            dw, db = ctx.grads if ctx.grads is not None else (torch.empty_like(ctx.w), torch.empty_like(ctx.w))
            dyp, dxp = dy.data_ptr(), dx.data_ptr()
            if not dy.is_contiguous() or (dyp | dxp) & 15:
                raise RuntimeError("experiment: dy not contiguous and aligned")
            plan, dev = ctx.plan, ctx.dev
            make_current(dev)
            t1 = time.perf_counter()
            launch(plan.main, plan.blocks + plan.column_blocks, plan.block,
                   (dyp, *plan.dy_args, *ctx.pre, dxp, dw.data_ptr(), db.data_ptr(), plan.m, plan.n, plan.blocks),
                   tc._stream(dev))
            if stamps is not None:
                stamps.append((t0, t1, time.perf_counter()))
            return dx, None, dw, db, None

    return _Lean


def main():
    n = 4096
    for m in (1, 64):
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.ones(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = torch.zeros(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        # the experimental variants must agree with the adapter before their time means anything
        ref = torch.autograd.grad(ct.layer_norm(x, (n,), w, b), (x, w, b), dy)
        variants = {
            "torch F.layer_norm": lambda: F.layer_norm(x, (n,), w, b).backward(dy),
            "floor Function": lambda: _Floor.apply(x, 1, w, b, 1e-5).backward(dy),
            "cunorm": lambda: ct.layer_norm(x, (n,), w, b).backward(dy),
            "torch F.rms_norm": lambda: F.rms_norm(x, (n,), w).backward(dy),
            "cunorm rms_norm": lambda: ct.rms_norm(x, (n,), w).backward(dy),
        }
        for name, flags in (("lean", (False, False, False)), ("lean, grads in fwd", (True, False, False)),
                            ("lean, grads+dx in fwd", (True, True, False)), ("lean, ctx attrs", (False, False, True))):
            cls = _lean_class(*flags)
            got = torch.autograd.grad(cls.apply(x, 1, w, b, 1e-5), (x, w, b), dy)
            torch.cuda.synchronize()
            assert all(torch.equal(g, r) for g, r in zip(got, ref)), name
            variants[name] = lambda cls=cls: cls.apply(x, 1, w, b, 1e-5).backward(dy)
        times = {k: [] for k in variants}
        for _ in range(ROUNDS):
            for k, fn in variants.items():
                times[k].append(wall_us(fn))
        print(f"--- ({m}, {n}) bf16, forward + backward wall us: median [min .. max] of {ROUNDS} rounds of {CALLS}, "
              f"ratio of medians to torch's same op")
        for k, t in times.items():
            base = statistics.median(times["torch F.rms_norm" if "rms" in k else "torch F.layer_norm"])
            med = statistics.median(t)
            print(f"{k:24s} {med:8.1f}  x{med / base:.2f}   [{min(t):.1f} .. {max(t):.1f}]")
        stamps = []
        cls = _lean_class(True, False, False, stamps)
        for _ in range(200):
            cls.apply(x, 1, w, b, 1e-5).backward(dy)
        torch.cuda.synchronize()
        pre = statistics.median(s[1] - s[0] for s in stamps) * 1e6
        lau = statistics.median(s[2] - s[1] for s in stamps) * 1e6
        print(f"prepared grads, backward on the autograd thread: before launch {pre:.1f} us, launch {lau:.1f} us")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
