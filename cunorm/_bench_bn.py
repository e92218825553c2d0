"""BatchNorm measurements for the GPU check (issue 5's shapes): training forward and
backward through the CuPy API in NCHW and channels-last layouts, bf16 and fp32, parameters in
the input dtype, next to torch eager (cuDNN / native) and torch.compile's forward. Bytes
model: forward 2 * numel * s (x read, y written), backward 3 * numel * s (x and dy read, dx
written). Kernel time, for ours and torch's alike, by _bench.queued_time_ms: these tensors are
small enough that a call's host time (Python, allocation, launches) can exceed its kernels'
time, and back-to-back calls would then time the host; each row also reports our host
microseconds per call."""
from __future__ import annotations

SHAPES = ((32, 256, 56, 56), (128, 64, 112, 112), (64, 1024, 14, 14), (256, 2048, 7, 7))


def bn_calls(shape, dtype, channels_last):
    """The timed CuPy calls on one case (x, dy, a residual and parameters drawn once, the
    statistics made once for the backward): forward, backward, and forward and backward with
    the residual and ReLU. ``shape`` is logical (N, C, H, W); channels last stores it as
    (N, H, W, C). The residual has its own buffer: the backward reads dy and the residual, and
    one buffer passed as both could be read from the cache the second time."""
    import cupy
    import numpy

    import cunorm

    rng = cupy.random.default_rng(0)
    n, c, h, w = shape
    phys = (n, h, w, c) if channels_last else shape
    x = rng.standard_normal(phys, dtype=numpy.float32).astype(dtype)
    dy = rng.standard_normal(phys, dtype=numpy.float32).astype(dtype)
    res = rng.standard_normal(phys, dtype=numpy.float32).astype(dtype)
    wt, b = cupy.ones(c, dtype), cupy.zeros(c, dtype)
    rm, rv = cupy.zeros(c, dtype), cupy.ones(c, dtype)
    axis = -1 if channels_last else 1
    _, mean, rstd = cunorm.batch_norm(x, wt, b, rm, rv, channel_axis=axis, return_stats=True)
    fwd = lambda: cunorm.batch_norm(x, wt, b, rm, rv, channel_axis=axis)  # noqa: E731
    bwd = lambda: cunorm.batch_norm_backward(dy, x, wt, b, mean, rstd, channel_axis=axis)  # noqa: E731
    fwd_relu = lambda: cunorm.batch_norm(x, wt, b, rm, rv, channel_axis=axis, residual=res,  # noqa: E731
                                         activation="relu")
    bwd_relu = lambda: cunorm.batch_norm_backward(dy, x, wt, b, mean, rstd, channel_axis=axis,  # noqa: E731
                                                  residual=res, activation="relu")
    return fwd, bwd, fwd_relu, bwd_relu


def _cupy_case(shape, dtype, channels_last):
    import cupy

    from ._bench import host_us, queued_time_ms

    calls = bn_calls(shape, dtype, channels_last)
    stream = cupy.cuda.get_current_stream().ptr
    times = tuple(queued_time_ms(f, stream) for f in calls)
    fwd, bwd = calls[:2]
    return times + (host_us(fwd), host_us(bwd))


def _torch_case(shape, dtype, channels_last):
    import torch
    import torch.nn.functional as F

    from ._bench import queued_time_ms, torch_events

    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(shape, device="cuda", dtype=dtype).to(memory_format=fmt).requires_grad_()
    w = torch.ones(shape[1], device="cuda", dtype=dtype, requires_grad=True)
    b = torch.zeros(shape[1], device="cuda", dtype=dtype, requires_grad=True)
    rm, rv = torch.zeros(shape[1], device="cuda", dtype=dtype), torch.ones(shape[1], device="cuda", dtype=dtype)
    dy = torch.randn_like(x)

    def fwd():
        with torch.no_grad():
            return F.batch_norm(x, rm, rv, w, b, training=True)

    y = F.batch_norm(x, rm, rv, w, b, training=True)
    bwd = lambda: torch.autograd.grad(y, (x, w, b), dy, retain_graph=True)  # noqa: E731
    # a fresh compile for each case: one code object recompiled for each shape would reach
    # dynamo's recompile limit and fall back to eager, or go dynamic
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), dynamic=False)

    def fwd_compiled():
        with torch.no_grad():
            return compiled(x, w, b)

    yc = compiled(x, w, b)  # with grad: the compiled backward graph below
    bwd_compiled = lambda: torch.autograd.grad(yc, (x, w, b), dy, retain_graph=True)  # noqa: E731
    stream = torch.cuda.current_stream().cuda_stream
    return tuple(queued_time_ms(f, stream, torch_events) for f in (fwd, bwd, fwd_compiled, bwd_compiled))


def run(copy_gbps: float, dtypes=("bfloat16", "float32"), peers=("torch", "compile"), log=print) -> list[dict]:
    """One row per shape, dtype and layout; torch eager's and torch.compile's times where
    ``peers`` names them and torch has CUDA."""
    import numpy

    from ._checks import BFLOAT16

    torch_dtypes = None
    if peers:
        try:
            import torch
            if torch.cuda.is_available():
                torch_dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
        except ImportError:
            pass
    rows = []
    for shape in SHAPES:
        numel = int(numpy.prod(shape))
        for name in dtypes:
            dtype = BFLOAT16 if name == "bfloat16" else numpy.dtype(name)
            for channels_last in (False, True):
                s = dtype.itemsize
                f_ms, b_ms, relu_ms, relu_b_ms, f_host, b_host = _cupy_case(shape, dtype, channels_last)
                row = {"op": "batch_norm", "shape": list(shape), "dtype": name,
                       "layout": "nhwc" if channels_last else "nchw",
                       "fwd_GBps": round(2 * numel * s / f_ms / 1e6, 1),
                       "bwd_GBps": round(3 * numel * s / b_ms / 1e6, 1),
                       "fwd_ms": round(f_ms, 4), "bwd_ms": round(b_ms, 4),
                       "fused_relu_residual_vs_plain": round(relu_ms / f_ms, 3),
                       "fused_relu_residual_bwd_vs_plain": round(relu_b_ms / b_ms, 3),
                       "host_us_fwd": round(f_host, 1), "host_us_bwd": round(b_host, 1)}
                row["fwd_of_copy"] = round(row["fwd_GBps"] / copy_gbps, 3)
                row["bwd_of_copy"] = round(row["bwd_GBps"] / copy_gbps, 3)
                if torch_dtypes:
                    tf, tb, tc, tcb = _torch_case(shape, torch_dtypes[name], channels_last)
                    row.update(torch_fwd_ms=round(tf, 4), torch_bwd_ms=round(tb, 4), compile_fwd_ms=round(tc, 4),
                               compile_bwd_ms=round(tcb, 4), fwd_speedup_vs_best=round(min(tf, tc) / f_ms, 3),
                               bwd_speedup_vs_best=round(min(tb, tcb) / b_ms, 3))
                log(f"batch_norm {name} {row['layout']} {shape}: fwd {row['fwd_of_copy']} / bwd {row['bwd_of_copy']} "
                    f"of copy; vs torch fwd x{row.get('fwd_speedup_vs_best')}, bwd x{row.get('bwd_speedup_vs_best')}; "
                    f"residual+relu x{row['fused_relu_residual_vs_plain']} / "
                    f"x{row['fused_relu_residual_bwd_vs_plain']} of plain")
                rows.append(row)
    return rows


def _two_places(value) -> str:
    """A ratio in four characters; "   -" where the record has none (before BatchNorm v20's
    check the residual + ReLU backward was not timed)."""
    return "   -" if value is None else f"{value:4.2f}"


def table(rows: list[dict]) -> str:
    """The BatchNorm part of the bench table."""
    lines = [f"{'batch_norm':10s} {'dtype':8s} {'layout':6s} {'shape':>20s} {'fwd copy':>8s} {'bwd copy':>8s} "
             f"{'vs torch f/b':>15s} {'res+relu f/b':>12s} {'host us f/b':>12s}"]
    for r in rows:
        vs = (f"x{r['fwd_speedup_vs_best']:.2f} / x{r['bwd_speedup_vs_best']:.2f}"
              if "fwd_speedup_vs_best" in r else "-")
        lines.append(f"{'':10s} {r['dtype']:8s} {r['layout']:6s} {str(tuple(r['shape'])):>20s} "
                     f"{r['fwd_of_copy']:8.2f} {r['bwd_of_copy']:8.2f} {vs:>15s} "
                     f"{r['fused_relu_residual_vs_plain']:5.2f} / {_two_places(r.get('fused_relu_residual_bwd_vs_plain'))} "
                     f"{r['host_us_fwd']:5.0f} / {r['host_us_bwd']:4.0f}")
    lines.append("kernel time (calls queued behind a spin kernel, ours and torch's alike); vs torch: the best of "
                 "torch eager and torch.compile, forward and backward; res+relu: fused residual + ReLU "
                 "time / plain, forward and backward (which also writes dresidual); host us: our host time per call")
    return "\n".join(lines)
