"""Where the eager forward + backward's excess over torch goes: Functions built up from the
floor (no kernels) to the least a kernel-launching Function can do, timed interleaved with
torch and the adapter, and the same pairs with torch's autograd device threads turned off.

    python benchmarks/profile_autograd_floor.py

Issue 3's target is forward + backward at most 1.5x torch's wall time at (1, 4096) and
(64, 4096) bf16. Variants (each a torch.autograd.Function called through its C++ apply):
  floor       save three tensors, allocate y; backward allocates three gradients
  prep        the forward allocates y, stats and the three gradients; backward returns them
  prep+fwd    prep, and the forward kernel launched from a prebuilt argument tuple
  prep+both   prep+fwd, and the backward kernel launched from a tuple the forward built
The hop columns cut one call at its seams (medians): forward, backward() to the Python
backward's start, the Python backward, its end to backward() returning. Where a copy of an
earlier adapter is importable as ``cunorm_old`` (its custom ops renamed ``cunorm_old::``,
benchmarks/NOTES.md says how), it runs interleaved as "old".
"""
from __future__ import annotations

import statistics
import sys

import torch
import torch.nn.functional as F

import cunorm.torch as ct
import cunorm.torch._cuda as tc
from cunorm import _bench_torch
from cunorm._launch import launch, make_current
from cunorm.ops._row_norm import column_launch
from profile_host import _Floor, hops  # the LayerNorm-shaped floor; a forward + backward cut at its seams

try:
    import cunorm_old.torch as old
except ImportError:
    old = None

ROUNDS = 31
CALLS = 100
_bench_torch.WALL_CALLS = CALLS
wall_us = _bench_torch._wall_us
_stream = tc._stream


def _make(fwd_kernel: bool, bwd_kernel: bool, fplan, bplan):
    """A Function with every output allocated by the forward, launching the kernels it is
    asked for from argument lists the forward built."""
    acc_bytes = fplan.m * fplan.acc.itemsize

    class _Prep(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, nd, w, b, eps):
            y = torch.empty_like(x)
            st = x.new_empty((2, fplan.m), dtype=torch.float32)
            dx, dw, db = torch.empty_like(x), torch.empty_like(w), torch.empty_like(b)
            xp, wp, sp = x.data_ptr(), w.data_ptr(), st.data_ptr()
            if fwd_kernel:
                make_current(0)
                launch(fplan.kernels[0], fplan.grid, fplan.block,
                       (xp, *fplan.row_args, y.data_ptr(), wp, b.data_ptr(), sp, sp + acc_bytes, *fplan.tail),
                       _stream(0), fplan.smem)
            if bwd_kernel:  # the adapter's own argument list (dy's slot 0 filled in by the backward)
                ctx.grid, ctx.args = column_launch(bplan, 0, xp, wp, sp, sp + acc_bytes, dx.data_ptr(), dw.data_ptr(),
                                                   db.data_ptr())
            ctx.save_for_backward(x, w, st)
            ctx.grads = (dx, None, dw, db, None)
            return y

        @staticmethod
        def backward(ctx, dy):
            ctx.saved_tensors
            if bwd_kernel:
                make_current(0)
                ctx.args[0] = dy.data_ptr()
                launch(bplan.main, ctx.grid, bplan.block, ctx.args, _stream(0))
            return ctx.grads

    return _Prep


def main():
    n = 4096
    print(torch.__version__, sys.version.split()[0])
    for m in (1, 64):
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.ones(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = torch.zeros(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        ref = torch.autograd.grad(ct.layer_norm(x, (n,), w, b), (x, w, b), dy)
        fplan = next(v for k, v in tc._forward_plans.items() if v and k[0] == x.shape)[0]
        fast = next(v for k, v in tc._forward_plans.items() if v and k[0] == x.shape)[3]
        bplan = fast.plan
        assert bplan is not None and bplan.column_blocks, bplan
        classes = {"floor": _Floor, "prep": _make(False, False, fplan, bplan),
                   "prep+fwd": _make(True, False, fplan, bplan), "prep+both": _make(True, True, fplan, bplan)}
        applies = {k: super(torch.autograd.Function, c).apply for k, c in classes.items()}
        got = torch.autograd.grad(applies["prep+both"](x, 1, w, b, 1e-5), (x, w, b), dy)
        torch.cuda.synchronize()
        assert all(torch.equal(g, r) for g, r in zip(got, ref)), "prep+both disagrees with the adapter"
        variants = {"torch": lambda: F.layer_norm(x, (n,), w, b).backward(dy),
                    "cunorm": lambda: ct.layer_norm(x, (n,), w, b).backward(dy),
                    "cunorm apply": lambda: ct._LAYER_NORM_APPLY(x, 1, w, b, 1e-5).backward(dy)}
        if old is not None:
            variants["old"] = lambda: old.layer_norm(x, (n,), w, b).backward(dy)
        for k, a in applies.items():
            variants[k] = lambda a=a: a(x, 1, w, b, 1e-5).backward(dy)
        single = {"torch 1-thread": variants["torch"], "cunorm 1-thread": variants["cunorm"],
                  "prep+both 1-thread": variants["prep+both"]}
        times = {k: [] for k in (*variants, *single)}
        for _ in range(ROUNDS):
            for k, fn in variants.items():
                times[k].append(wall_us(fn))
            with torch.autograd.set_multithreading_enabled(False):
                for k, fn in single.items():
                    times[k].append(wall_us(fn))
        print(f"--- ({m}, {n}) bf16 LayerNorm forward + backward, wall us: median [min .. max] of {ROUNDS} "
              f"rounds of {CALLS}; ratio of medians to torch's (1-thread rows: to torch 1-thread)")
        for k, t in times.items():
            base = statistics.median(times["torch 1-thread" if "1-thread" in k else "torch"])
            print(f"  {k:20s} {statistics.median(t):8.1f}  x{statistics.median(t) / base:.2f}   "
                  f"[{min(t):.1f} .. {max(t):.1f}]")
        for k in ("floor", "prep+both"):
            hops(classes[k], lambda k=k: applies[k](x, 1, w, b, 1e-5), dy, f"  hops {k}", 300)
        hops(ct._LayerNormFunction, lambda: ct._LAYER_NORM_APPLY(x, 1, w, b, 1e-5), dy, "  hops cunorm", 300)
        if old is not None:
            hops(old._LayerNormFunction, lambda: old._LAYER_NORM_APPLY(x, 1, w, b, 1e-5), dy, "  hops old", 300)
        nog = {"torch no-grad fwd": lambda: F.layer_norm(x.detach(), (n,), w.detach(), b.detach()),
               "cunorm no-grad fwd": lambda: ct.layer_norm(x.detach(), (n,), w.detach(), b.detach()),
               "torch grad fwd": lambda: F.layer_norm(x, (n,), w, b),
               "cunorm grad fwd": lambda: ct.layer_norm(x, (n,), w, b),
               **({"old grad fwd": lambda: old.layer_norm(x, (n,), w, b)} if old is not None else {}),
               "cunorm apply grad fwd": lambda: ct._LAYER_NORM_APPLY(x, 1, w, b, 1e-5),
               "prep+both grad fwd": lambda: applies["prep+both"](x, 1, w, b, 1e-5)}
        ft = {k: [] for k in nog}
        for _ in range(11):
            for k, fn in nog.items():
                ft[k].append(wall_us(fn))
        print("  forwards alone: " + ", ".join(f"{k} {statistics.median(t):.1f}" for k, t in ft.items()))
    primitives(x, w, b)
    sys.stdout.flush()


def primitives(x, w, b):
    """Host microseconds of the pieces a call is made of, on this machine's host."""
    import timeit

    import cunorm.torch._cuda as cu
    from cunorm import _checks

    y = torch.empty_like(x)
    st = x.new_empty((2, x.shape[0]), dtype=torch.float32)
    fplan = next(v for k, v in tc._forward_plans.items() if v and k[0] == x.shape)[0]
    sp = st.data_ptr()
    fargs = (x.data_ptr(), *fplan.row_args, y.data_ptr(), w.data_ptr(), b.data_ptr(), sp, sp + 4 * fplan.m,
             *fplan.tail)
    cases = {
        "empty_like(x)": lambda: torch.empty_like(x),
        "empty_like(w)": lambda: torch.empty_like(w),
        "x.new_empty(stats, dtype=)": lambda: x.new_empty((2, x.shape[0]), dtype=torch.float32),
        "x.data_ptr()": lambda: x.data_ptr(),
        "x.stride()": lambda: x.stride(),
        "x.shape": lambda: x.shape,
        "x.get_device()": lambda: x.get_device(),
        "_cuda_getDevice()": lambda: torch._C._cuda_getDevice(),
        "is_autocast_enabled('cuda')": lambda: torch.is_autocast_enabled("cuda"),
        "compiler.is_compiling()": lambda: torch.compiler.is_compiling(),
        "make_current(0)": lambda: make_current(0),
        "_stream(0)": lambda: _stream(0),
        "_normalized_ndim": lambda: ct._normalized_ndim(x, (x.shape[-1],)),
        "_checks.eps": lambda: _checks.eps(1e-5, None),
        "_autocast_fp32": lambda: ct._autocast_fp32(x, True, True),
        "unwrap_if_dead x3": lambda: (ct._unwrap_if_dead(x), ct._unwrap_if_dead(w), ct._unwrap_if_dead(b)),
        "forward key": lambda: (x.shape, x.stride(), x.dtype, 0, 1, False, 1e-5,
                                (w.dtype, w.shape, w.stride(), w.get_device()),
                                (b.dtype, b.shape, b.stride(), b.get_device()),
                                (x.data_ptr() | y.data_ptr()) & 15, (w.data_ptr() | b.data_ptr()) & 15),
        "launch (fwd plan, args built)": lambda: launch(fplan.kernels[0], fplan.grid, fplan.block, fargs,
                                                        _stream(0), fplan.smem),
        "_cuda_forward no stats": lambda: cu._cuda_forward(x, 1, w, b, 1e-5, False, False),
        "_cuda_forward stats": lambda: cu._cuda_forward(x, 1, w, b, 1e-5, False, True),
        "_cuda_forward prepared": lambda: cu._cuda_forward(x, 1, w, b, 1e-5, False, True, (True, True)),
    }
    print("--- host primitives, us a call (best of 5 x 2000)")
    for name, fn in cases.items():
        fn()
        best = min(timeit.repeat(fn, number=2000, repeat=5)) / 2000 * 1e6
        print(f"  {name:30s} {best:7.2f}")
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
