"""A few calls of one op at one shape, for a kernel profiler to wrap:

    ncu -k regex:norm_fwd --launch-skip 2 --launch-count 1 --section SpeedOfLight \\
        python benchmarks/kernel_target.py layer_norm bfloat16 16384 4096 [fwd|bwd]
"""
from __future__ import annotations

import sys

import cupy

import cunorm
from cunorm._checks import BFLOAT16


def main(op="layer_norm", dtype="bfloat16", m="16384", n="4096", direction="fwd") -> None:
    dt = BFLOAT16 if dtype == "bfloat16" else dtype
    m, n = int(m), int(n)
    rng = cupy.random.default_rng(0)
    x = rng.standard_normal((m, n), dtype="float32").astype(dt)
    dy = rng.standard_normal((m, n), dtype="float32").astype(dt)
    w = cupy.ones(n, dt)
    if op == "layer_norm":
        b = cupy.zeros(n, dt)
        _, mean, rstd = cunorm.layer_norm(x, w, b, return_stats=True)
        call = (lambda: cunorm.layer_norm(x, w, b)) if direction == "fwd" else \
            (lambda: cunorm.layer_norm_backward(dy, x, w, mean, rstd))
    else:
        _, rstd = cunorm.rms_norm(x, w, return_stats=True)
        call = (lambda: cunorm.rms_norm(x, w)) if direction == "fwd" else \
            (lambda: cunorm.rms_norm_backward(dy, x, w, rstd))
    for _ in range(4):
        call()
    cupy.cuda.runtime.deviceSynchronize()


if __name__ == "__main__":
    main(*sys.argv[1:])
