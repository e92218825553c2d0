"""PyTorch adapter measurements for the GPU check: host overhead on small shapes against
torch.nn.functional.layer_norm, kernel time under CUDA-graph replay, and the adapter's
bandwidth on large shapes next to the CuPy API's (the _bench model and method)."""
from __future__ import annotations

import statistics
import time

SMALL_SHAPES = ((1, 4096), (64, 4096))
WALL_CALLS = 300
WALL_ROUNDS = 11  # the host drifts by ±20% within a run (NOTES v14): a median of many alternating rounds
GRAPH_CALLS = 20


def _wall_us(fn) -> float:
    import torch

    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(WALL_CALLS):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / WALL_CALLS * 1e6


def _graph_us(fn) -> float:
    """Kernel time per call: GRAPH_CALLS calls captured in one graph (warmed up on a side
    stream first, as capture requires), replays timed by the _bench method."""
    import torch

    from ._bench import time_ms, torch_events

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    return time_ms(graph.replay, torch_events) * 1e3 / GRAPH_CALLS


SMALL_BATCH_ROWS = (1, 16, 128)
SMALL_BATCH_N = (4096, 8192)


def small_batches(log=print) -> list[dict]:
    """Issue 4's small batches (M = 1, 16, 128 at N = 4096, 8192, bf16): kernel time under
    CUDA-graph replay, cunorm's kernels (through the torch adapter) against torch eager's,
    forward, and forward + backward (dx, dW, dB through torch.autograd.grad; the forward is
    inside the captured call because backward kernels run on the forward's stream)."""
    import torch
    import torch.nn.functional as F

    import cunorm.torch as ct

    rows = []
    for op in ("layer_norm", "rms_norm"):
        for n in SMALL_BATCH_N:
            for m in SMALL_BATCH_ROWS:
                x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                w = (1 + 0.1 * torch.randn(n, device="cuda")).bfloat16().requires_grad_()
                b = (0.1 * torch.randn(n, device="cuda")).bfloat16().requires_grad_()
                dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
                params = (w, b) if op == "layer_norm" else (w,)
                row = {"op": op, "dtype": "bfloat16", "M": m, "N": n}
                for name, lib in (("cunorm", ct), ("torch", F)):
                    fn = getattr(lib, op)

                    def fwd(fn=fn):
                        with torch.no_grad():
                            return fn(x, (n,), *params)

                    def fwd_bwd(fn=fn):
                        return torch.autograd.grad(fn(x, (n,), *params), (x, *params), dy)

                    row[f"{name}_fwd_us"] = round(_graph_us(fwd), 2)
                    row[f"{name}_fwdbwd_us"] = round(_graph_us(fwd_bwd), 2)
                row["fwd_ratio"] = round(row["cunorm_fwd_us"] / row["torch_fwd_us"], 3)
                row["fwdbwd_ratio"] = round(row["cunorm_fwdbwd_us"] / row["torch_fwdbwd_us"], 3)
                log(f"small batch {op} M={m} N={n}: graph kernel time fwd {row['cunorm_fwd_us']} vs "
                    f"{row['torch_fwd_us']} us, fwd+bwd {row['cunorm_fwdbwd_us']} vs {row['torch_fwdbwd_us']} us")
                rows.append(row)
    return rows


def overhead(log=print) -> list[dict]:
    import torch
    import torch.nn.functional as F

    import cunorm.torch as ct

    rows = []
    for shape in SMALL_SHAPES:
        n = shape[-1]
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.ones(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = torch.zeros(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        row = {"shape": list(shape), "dtype": "bfloat16"}
        calls = {}
        for name, fn in (("torch", F.layer_norm), ("cunorm", ct.layer_norm)):
            def fwd(fn=fn):
                with torch.no_grad():
                    return fn(x, (n,), w, b)

            def fwd_bwd(fn=fn):
                fn(x, (n,), w, b).backward(dy)

            calls[name] = {"fwd": fwd, "fwdbwd": fwd_bwd}
            row[f"{name}_fwd_graph_us"] = round(_graph_us(fwd), 2)
        # host timings drift with the machine's state: the two libraries take turns, WALL_ROUNDS
        # rounds each, and each keeps its median
        for kind in ("fwd", "fwdbwd"):
            times = {name: [] for name in calls}
            for _ in range(WALL_ROUNDS):
                for name in calls:
                    times[name].append(_wall_us(calls[name][kind]))
            for name, t in times.items():
                row[f"{name}_{kind}_wall_us"] = round(statistics.median(t), 2)
        row["fwd_wall_ratio"] = round(row["cunorm_fwd_wall_us"] / row["torch_fwd_wall_us"], 2)
        row["fwdbwd_wall_ratio"] = round(row["cunorm_fwdbwd_wall_us"] / row["torch_fwdbwd_wall_us"], 2)
        log(f"torch overhead {shape}: fwd {row['cunorm_fwd_wall_us']} vs {row['torch_fwd_wall_us']} us "
            f"(x{row['fwd_wall_ratio']}), fwd+bwd {row['cunorm_fwdbwd_wall_us']} vs {row['torch_fwdbwd_wall_us']} us "
            f"(x{row['fwdbwd_wall_ratio']}), graph kernel {row['cunorm_fwd_graph_us']} vs "
            f"{row['torch_fwd_graph_us']} us")
        rows.append(row)
    return rows


def bandwidth(cupy_rows: list[dict], row_lengths=(1024, 4096, 16384), log=print) -> list[dict]:
    """LayerNorm through the torch adapter's eager path at the benchmark's shapes, next to the
    CuPy API row."""
    import torch

    import cunorm.torch as ct

    from ._bench import TOTAL_ELEMENTS, add_vs_cupy

    out = []
    for dtype, name in ((torch.bfloat16, "bfloat16"), (torch.float32, "float32")):
        for n in row_lengths:
            m = TOTAL_ELEMENTS // n
            x = torch.randn(m, n, device="cuda").to(dtype)
            dy = torch.randn(m, n, device="cuda").to(dtype)
            w = torch.ones(n, device="cuda", dtype=dtype)
            b = torch.zeros(n, device="cuda", dtype=dtype)
            # what eager callers run: the functional forward, and the backward autograd calls
            _, stats = ct._forward_impl(x, 1, w, b, 1e-5, rms=False)
            fwd = lambda: ct.layer_norm(x, (n,), w, b)
            bwd = lambda: ct._backward_impl(dy, x, w, stats, 1, False, True)
            s = x.element_size()
            row = {"op": "layer_norm", "dtype": name, "M": m, "N": n,
                   "fwd_GBps": round(2 * m * n * s / _event_ms(fwd) / 1e6, 1),
                   "bwd_GBps": round(3 * m * n * s / _event_ms(bwd) / 1e6, 1)}
            add_vs_cupy(row, cupy_rows)
            log(f"torch path {name} N={n}: fwd {row['fwd_GBps']} GB/s ({row.get('fwd_vs_cupy')} of CuPy API), "
                f"bwd {row['bwd_GBps']} GB/s ({row.get('bwd_vs_cupy')})")
            out.append(row)
    return out


def _event_ms(fn) -> float:
    """Kernel milliseconds per call of ``fn`` on torch's current stream (queued behind a
    spin, as the CuPy rows are timed)."""
    import torch

    from ._bench import queued_time_ms, torch_events

    return queued_time_ms(fn, torch.cuda.current_stream().cuda_stream, torch_events)
