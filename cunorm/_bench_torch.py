"""PyTorch adapter measurements for the GPU check: host overhead on small shapes against
torch.nn.functional.layer_norm, kernel time under CUDA-graph replay, and the adapter's
bandwidth on large shapes next to the CuPy API's (the _bench model and method)."""
from __future__ import annotations

import time

SMALL_SHAPES = ((1, 4096), (64, 4096))
WALL_CALLS = 300
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
    """Kernel time per call: GRAPH_CALLS calls captured in one graph, replays timed by events."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(7):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / GRAPH_CALLS)
    return sorted(samples)[len(samples) // 2]


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
        for name, fn in (("torch", F.layer_norm), ("cunorm", ct.layer_norm)):
            def fwd(fn=fn):
                with torch.no_grad():
                    return fn(x, (n,), w, b)

            def fwd_bwd(fn=fn):
                fn(x, (n,), w, b).backward(dy)

            row[f"{name}_fwd_wall_us"] = round(_wall_us(fwd), 2)
            row[f"{name}_fwdbwd_wall_us"] = round(_wall_us(fwd_bwd), 2)
            row[f"{name}_fwd_graph_us"] = round(_graph_us(fwd), 2)
        row["fwd_wall_ratio"] = round(row["cunorm_fwd_wall_us"] / row["torch_fwd_wall_us"], 2)
        row["fwdbwd_wall_ratio"] = round(row["cunorm_fwdbwd_wall_us"] / row["torch_fwdbwd_wall_us"], 2)
        log(f"torch overhead {shape}: fwd {row['cunorm_fwd_wall_us']} vs {row['torch_fwd_wall_us']} us "
            f"(x{row['fwd_wall_ratio']}), fwd+bwd {row['cunorm_fwdbwd_wall_us']} vs {row['torch_fwdbwd_wall_us']} us "
            f"(x{row['fwdbwd_wall_ratio']}), graph kernel {row['cunorm_fwd_graph_us']} vs {row['torch_fwd_graph_us']} us")
        rows.append(row)
    return rows


def bandwidth(cupy_rows: list[dict], row_lengths=(1024, 4096, 16384), log=print) -> list[dict]:
    """LayerNorm through the torch adapter's eager path at the benchmark's shapes, next to the
    CuPy API row."""
    import torch

    import cunorm.torch as ct

    from ._bench import TOTAL_ELEMENTS

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
            ref = next((r for r in cupy_rows if r["op"] == "layer_norm" and r["dtype"] == name and r["N"] == n), None)
            if ref:
                row["fwd_vs_cupy"] = round(row["fwd_GBps"] / ref["fwd_GBps"], 3)
                row["bwd_vs_cupy"] = round(row["bwd_GBps"] / ref["bwd_GBps"], 3)
            log(f"torch path {name} N={n}: fwd {row['fwd_GBps']} GB/s ({row.get('fwd_vs_cupy')} of CuPy API), "
                f"bwd {row['bwd_GBps']} GB/s ({row.get('bwd_vs_cupy')})")
            out.append(row)
    return out


def _event_ms(fn) -> float:
    from ._bench import time_ms, torch_events

    return time_ms(fn, torch_events)
