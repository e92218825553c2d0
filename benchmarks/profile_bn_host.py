"""Host time of one BatchNorm call through the CuPy API, taken apart.

    python benchmarks/profile_bn_host.py

On a tiny tensor (kernel time negligible, the launches queue asynchronously) the wall time
per call is the host's. Prints it for the forward, the backward and a LayerNorm call for
scale, then cProfile's top functions by own time for each BatchNorm call.
"""
from __future__ import annotations

import cProfile
import io
import pstats
import time

import cupy
import numpy

import cunorm
from cunorm._checks import BFLOAT16


def wall_us(fn, calls=2000) -> float:
    for _ in range(50):
        fn()
    cupy.cuda.runtime.deviceSynchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    cupy.cuda.runtime.deviceSynchronize()
    return (t1 - t0) / calls * 1e6


def profile(fn, calls=2000, top=22) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main():
    for dtype in (BFLOAT16, numpy.dtype(numpy.float32)):
        rng = cupy.random.default_rng(0)
        x = rng.standard_normal((2, 8, 4, 4), dtype=numpy.float32).astype(dtype)
        dy = cupy.ones_like(x)
        w, b = cupy.ones(8, dtype), cupy.zeros(8, dtype)
        rm, rv = cupy.zeros(8, dtype), cupy.ones(8, dtype)
        _, mean, rstd = cunorm.batch_norm(x, w, b, rm, rv, return_stats=True)
        fwd = lambda: cunorm.batch_norm(x, w, b, rm, rv)  # noqa: E731
        bwd = lambda: cunorm.batch_norm_backward(dy, x, w, b, mean, rstd)  # noqa: E731
        row = x.reshape(64, 4)
        ln = lambda: cunorm.layer_norm(row, w[:4], b[:4])  # noqa: E731
        print(f"{dtype.name}: batch_norm {wall_us(fwd):.1f} us, batch_norm_backward {wall_us(bwd):.1f} us, "
              f"layer_norm {wall_us(ln):.1f} us per call (host)")
    print(profile(fwd))
    print(profile(bwd))


if __name__ == "__main__":
    main()
