"""Does the benchmark's timing measure kernel time? The same calls timed three ways, as
fractions of copy (forward bytes 2*M*N*s, backward 3*M*N*s, M*N = 64 Mi):

  plain   _bench.time_ms: batches of back-to-back calls between two events. The GPU is idle
          when a batch's start event is recorded, so the batch also holds the first call's
          host time.
  queued  _bench.queued_time_ms: the same batches queued behind a spin kernel, so the
          kernels run back to back between the events (what the GPU check now records).
  graph   the calls captured in a CUDA graph and replayed (torch adapter only): no host at
          all between the kernels.

    python benchmarks/timing_methods.py

Prints one row per (path, op, dtype, N); host_us is one call's host time on this machine.
"""
from __future__ import annotations

import sys

import cupy
import numpy
import torch

import cunorm.torch as ct
from cunorm import _bench
from cunorm._bench_torch import GRAPH_CALLS, _graph_us
from cunorm._checks import BFLOAT16

ROW_LENGTHS = (512, 4096, 16384)


def _fractions(ms: dict, fwd_bytes: int, copy: float) -> str:
    return "  ".join(f"{k} {fwd_bytes / v / 1e6 / copy:.3f}" for k, v in ms.items())


def cupy_rows(copy: float) -> None:
    for op in ("layer_norm", "rms_norm"):
        for dtype in (BFLOAT16, numpy.dtype(numpy.float32)):
            for n in ROW_LENGTHS:
                fwd, _, m, itemsize = _bench.row_norm_calls(op, dtype, n)
                stream = cupy.cuda.get_current_stream().ptr
                ms = {"plain": _bench.time_ms(fwd), "queued": _bench.queued_time_ms(fwd, stream)}
                print(f"cupy  {op:10s} {numpy.dtype(dtype).name:8s} N={n:<6d} fwd  "
                      f"{_fractions(ms, 2 * m * n * itemsize, copy)}  host_us {_bench.host_us(fwd):.1f}", flush=True)


def torch_rows(copy: float) -> None:
    for dtype in (torch.bfloat16, torch.float32):
        for n in ROW_LENGTHS:
            m = _bench.TOTAL_ELEMENTS // n
            x = torch.randn(m, n, device="cuda").to(dtype)
            w = torch.ones(n, device="cuda", dtype=dtype)
            b = torch.zeros(n, device="cuda", dtype=dtype)
            fwd = lambda: ct.layer_norm(x, (n,), w, b)  # noqa: E731
            stream = torch.cuda.current_stream().cuda_stream
            ms = {"plain": _bench.time_ms(fwd, _bench.torch_events),
                  "queued": _bench.queued_time_ms(fwd, stream, _bench.torch_events),
                  "graph": _graph_us(fwd) / 1e3}
            print(f"torch layer_norm {str(dtype)[6:]:8s} N={n:<6d} fwd  "
                  f"{_fractions(ms, 2 * m * n * x.element_size(), copy)}  host_us {_bench.host_us(fwd):.1f}", flush=True)
            del x


def main() -> None:
    copy = _bench.copy_gbps()
    print(f"copy {copy:.0f} GB/s; graph rows replay {GRAPH_CALLS} captured calls")
    cupy_rows(copy)
    torch_rows(copy)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
