"""Bandwidth benchmark: median time of the public ops on the GPU, as GB/s of the bytes that
must move (forward 2*M*N*s: read x, write y; backward 3*M*N*s: read x and dy, write dx),
next to a device-to-device copy measured in the same run.

Inputs are 64 Mi elements (128 MiB in bf16), several times the H200's 60 MB L2, so repeated
calls do not run from cache. Each sample times a batch of back-to-back calls between two
events, so the host's launch work overlaps the GPU's and the number is kernel time."""
from __future__ import annotations

import statistics

import numpy

TOTAL_ELEMENTS = 64 * 2**20
# issue 4 lists N = 512 ... 131072 and asks for 262144 and 1,048,576 (M = 256 and 64 rows)
ROW_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 1048576)
BATCH = 10
SAMPLES = 7


def cupy_events():
    """(start, end, elapsed_ms(start, end)) events on CuPy's current stream."""
    import cupy

    return cupy.cuda.Event(), cupy.cuda.Event(), cupy.cuda.get_elapsed_time


def torch_events():
    """The same on torch's current stream."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    return start, end, lambda a, b: a.elapsed_time(b)


def time_ms(fn, events=cupy_events) -> float:
    """Median milliseconds per call of ``fn``, after one warm-up call: SAMPLES batches of
    BATCH back-to-back calls, each batch between two events."""
    fn()
    start, end, elapsed = events()
    samples = []
    for _ in range(SAMPLES):
        start.record()
        for _ in range(BATCH):
            fn()
        end.record()
        end.synchronize()
        samples.append(elapsed(start, end) / BATCH)
    return statistics.median(samples)


def copy_gbps(nbytes: int = 2 * 2**30) -> float:
    """Device-to-device copy bandwidth, bytes read plus bytes written."""
    import cupy

    src = cupy.empty(nbytes, numpy.uint8)
    dst = cupy.empty_like(src)
    src.fill(1)
    ms = time_ms(lambda: cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes,
                                                       cupy.cuda.runtime.memcpyDeviceToDevice,
                                                       cupy.cuda.get_current_stream().ptr))
    return 2 * nbytes / ms / 1e6


def bench_row_norm(op: str, dtype, n: int, m: int | None = None) -> dict:
    import cupy

    import cunorm

    m = m or TOTAL_ELEMENTS // n
    rng = cupy.random.default_rng(0)
    x = rng.standard_normal((m, n), dtype=numpy.float32).astype(dtype)
    dy = rng.standard_normal((m, n), dtype=numpy.float32).astype(dtype)
    w = (1 + 0.1 * rng.standard_normal(n, dtype=numpy.float32)).astype(dtype)
    b = (0.1 * rng.standard_normal(n, dtype=numpy.float32)).astype(dtype)
    if op == "layer_norm":
        fwd = lambda: cunorm.layer_norm(x, w, b, return_stats=True)
        _, mean, rstd = fwd()
        bwd = lambda: cunorm.layer_norm_backward(dy, x, w, mean, rstd)
    else:
        fwd = lambda: cunorm.rms_norm(x, w, return_stats=True)
        _, rstd = fwd()
        bwd = lambda: cunorm.rms_norm_backward(dy, x, w, rstd)
    s = x.itemsize
    fwd_ms, bwd_ms = time_ms(fwd), time_ms(bwd)
    return {"op": op, "dtype": numpy.dtype(dtype).name, "M": m, "N": n,
            "fwd_ms": round(fwd_ms, 5), "fwd_GBps": round(2 * m * n * s / fwd_ms / 1e6, 1),
            "bwd_ms": round(bwd_ms, 5), "bwd_GBps": round(3 * m * n * s / bwd_ms / 1e6, 1)}


def add_vs_cupy(row: dict, cupy_rows: list[dict]) -> None:
    """fwd_vs_cupy / bwd_vs_cupy: an adapter's bandwidth over the CuPy API's on the same
    op, dtype and N (where the benchmark measured it)."""
    ref = next((r for r in cupy_rows if (r["op"], r["dtype"], r["N"]) == (row["op"], row["dtype"], row["N"])), None)
    if ref:
        row["fwd_vs_cupy"] = round(row["fwd_GBps"] / ref["fwd_GBps"], 3)
        row["bwd_vs_cupy"] = round(row["bwd_GBps"] / ref["bwd_GBps"], 3)


def run(ops=("layer_norm", "rms_norm"), dtypes=None, row_lengths=ROW_LENGTHS, log=print) -> list[dict]:
    from ._checks import BFLOAT16

    dtypes = dtypes or (BFLOAT16, numpy.dtype(numpy.float32))
    rows = []
    for op in ops:
        for dtype in dtypes:
            for n in row_lengths:
                row = bench_row_norm(op, dtype, n)
                log(f"{row['op']:10s} {row['dtype']:8s} M={row['M']:<7d} N={row['N']:<7d} "
                    f"fwd {row['fwd_GBps']:7.1f} GB/s  bwd {row['bwd_GBps']:7.1f} GB/s")
                rows.append(row)
    return rows
