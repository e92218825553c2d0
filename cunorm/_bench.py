"""Bandwidth benchmark: median time of the public ops on the GPU, as GB/s of the bytes that
must move (forward 2*M*N*s: read x, write y; backward 3*M*N*s: read x and dy, write dx),
next to a device-to-device copy measured in the same run.

Inputs are 64 Mi elements (128 MiB in bf16), several times the H200's 60 MB L2, so repeated
calls do not run from cache. The ops are timed by queued_time_ms: each sample's batch of
calls waits behind a spin kernel, so the kernels run back to back and the number is kernel
time. (Timed plainly, time_ms, each batch also holds its first call's host time, while the
GPU waits for it: 3-8% of a row norm's 70-150 us kernels on the H200 host, NOTES v54.)"""
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


# Holds a stream for a given number of nanoseconds (the GPU's global timer), so the calls
# queued behind it run back to back once it ends, whatever the host took to queue them.
_SPIN_SOURCE = r"""
extern "C" __global__ void cunorm_bench_spin(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""
_spin_kernels: dict = {}


def _spin(ns: int, stream_ptr: int) -> None:
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    kernel = _spin_kernels.get(dev)
    if kernel is None:
        kernel = _spin_kernels[dev] = cupy.RawKernel(_SPIN_SOURCE, "cunorm_bench_spin")
    with cupy.cuda.ExternalStream(stream_ptr):
        kernel((1,), (1,), (numpy.uint64(ns),))


def _reached(event) -> bool:
    return event.done if hasattr(event, "done") else event.query()


def queued_time_ms(fn, stream_ptr: int, events=cupy_events) -> float:
    """Median GPU milliseconds per call of ``fn`` with the host's share taken out: each batch
    of BATCH calls is queued behind a spin kernel on ``stream_ptr`` (the stream ``fn``
    launches on) that outlasts the queuing, so the calls' kernels run back to back between
    the two events. A batch whose start event had already passed when the host finished
    queuing (the spin was too short) is discarded and the spin doubled. For calls whose host
    time exceeds their kernel time (small tensors), time_ms measures the host instead."""
    import time

    fn()
    start, end, elapsed = events()
    end.record()
    end.synchronize()
    t0 = time.perf_counter()
    for _ in range(BATCH):
        fn()
    spin_ns = int((time.perf_counter() - t0) * 2e9) + 200_000
    samples = []
    while len(samples) < SAMPLES:
        _spin(spin_ns, stream_ptr)
        start.record()
        for _ in range(BATCH):
            fn()
        end.record()
        queued_in_time = not _reached(start)
        end.synchronize()
        if queued_in_time:
            samples.append(elapsed(start, end) / BATCH)
        elif spin_ns > 10**9:
            raise RuntimeError("queued_time_ms: the host never finished queuing within a 1 s spin")
        else:
            spin_ns *= 2
    return statistics.median(samples)


def host_us(fn, calls: int = 20) -> float:
    """Wall microseconds per call on the host (the GPU queue may lag behind)."""
    import time

    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


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


def row_norm_calls(op: str, dtype, n: int, m: int | None = None, w_dtype=None, params: bool = True):
    """(forward call, backward call, M, itemsize): the CuPy API on the benchmark's inputs,
    the weight and bias in ``w_dtype`` (default: x's); neither without ``params``."""
    import cupy

    import cunorm

    m = m or TOTAL_ELEMENTS // n
    w_dtype = dtype if w_dtype is None else w_dtype
    rng = cupy.random.default_rng(0)
    x = rng.standard_normal((m, n), dtype=numpy.float32).astype(dtype)
    dy = rng.standard_normal((m, n), dtype=numpy.float32).astype(dtype)
    w = (1 + 0.1 * rng.standard_normal(n, dtype=numpy.float32)).astype(w_dtype) if params else None
    b = (0.1 * rng.standard_normal(n, dtype=numpy.float32)).astype(w_dtype) if params else None
    if op == "layer_norm":
        fwd = lambda: cunorm.layer_norm(x, w, b, return_stats=True)
        _, mean, rstd = fwd()
        bwd = lambda: cunorm.layer_norm_backward(dy, x, w, mean, rstd)
    else:
        fwd = lambda: cunorm.rms_norm(x, w, return_stats=True)
        _, rstd = fwd()
        bwd = lambda: cunorm.rms_norm_backward(dy, x, w, rstd)
    return fwd, bwd, m, x.itemsize


def bench_row_norm(op: str, dtype, n: int, m: int | None = None, w_dtype=None, params: bool = True) -> dict:
    import cupy

    fwd, bwd, m, s = row_norm_calls(op, dtype, n, m, w_dtype, params)
    stream = cupy.cuda.get_current_stream().ptr
    fwd_ms, bwd_ms = queued_time_ms(fwd, stream), queued_time_ms(bwd, stream)
    return {"op": op, "dtype": numpy.dtype(dtype).name, "M": m, "N": n,
            "fwd_ms": round(fwd_ms, 5), "fwd_GBps": round(2 * m * n * s / fwd_ms / 1e6, 1),
            "bwd_ms": round(bwd_ms, 5), "bwd_GBps": round(3 * m * n * s / bwd_ms / 1e6, 1)}


def add_vs_cupy(row: dict, cupy_rows: list[dict], name: str = "cupy") -> None:
    """fwd_vs_<name> / bwd_vs_<name>: an adapter's (or another setting's) bandwidth over the
    CuPy API's on the same op, dtype and N (where the benchmark measured it)."""
    ref = next((r for r in cupy_rows if (r["op"], r["dtype"], r["N"]) == (row["op"], row["dtype"], row["N"])), None)
    if ref:
        row[f"fwd_vs_{name}"] = round(row["fwd_GBps"] / ref["fwd_GBps"], 3)
        row[f"bwd_vs_{name}"] = round(row["bwd_GBps"] / ref["bwd_GBps"], 3)


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


def run_float32_weight(copy_gbps: float, same_dtype_rows: list[dict], row_lengths=ROW_LENGTHS,
                       log=print) -> list[dict]:
    """bf16 rows with a float32 weight and bias, as torch.autocast hands them over (the
    parameters stay float32): a row an op and N with fractions of copy and the ratio to the
    same case with bf16 parameters (``same_dtype_rows``, run's rows). Bytes as run's: the
    parameters' N elements are left out, as there."""
    from ._checks import BFLOAT16

    rows = []
    for op in ("layer_norm", "rms_norm"):
        for n in row_lengths:
            row = dict(bench_row_norm(op, BFLOAT16, n, w_dtype=numpy.float32), w_dtype="float32")
            row.update(fwd_of_copy=round(row["fwd_GBps"] / copy_gbps, 3), bwd_of_copy=round(row["bwd_GBps"] / copy_gbps, 3))
            add_vs_cupy(row, same_dtype_rows, "same_dtype")
            log(f"{op:10s} bfloat16, float32 weight N={n:<7d} fwd {row['fwd_of_copy']} / bwd {row['bwd_of_copy']} "
                f"of copy (x{row.get('fwd_vs_same_dtype')} / x{row.get('bwd_vs_same_dtype')} bf16 weights')")
            rows.append(row)
    return rows
