"""One BatchNorm training forward and backward per case, for a kernel profiler to time each
launch alone (host overhead and the gaps between launches excluded).

    ncu --metrics gpu__time_duration.sum,dram__bytes.sum,launch__registers_per_thread \\
        python benchmarks/profile_bn.py bf16:nchw:32,256,56,56 fp32:nhwc:128,64,112,112

Each case runs once to warm the kernel cache, then once more under an NVTX-free marker the
profiler's output can be read by: the kernel names (bn_stats_*, bn_apply_*, bn_bwd_*).
"""
from __future__ import annotations

import sys

import cupy
import numpy

import cunorm
from cunorm._checks import BFLOAT16

DTYPES = {"bf16": BFLOAT16, "fp32": numpy.float32, "fp16": numpy.float16}


def case(spec: str):
    dtype, layout, shape = spec.split(":")
    n, c, h, w = (int(v) for v in shape.split(","))
    cl = layout == "nhwc"
    phys = (n, h, w, c) if cl else (n, c, h, w)
    rng = cupy.random.default_rng(0)
    x = rng.standard_normal(phys, dtype=numpy.float32).astype(DTYPES[dtype])
    dy = rng.standard_normal(phys, dtype=numpy.float32).astype(DTYPES[dtype])
    wt, b = cupy.ones(c, x.dtype), cupy.zeros(c, x.dtype)
    rm, rv = cupy.zeros(c, x.dtype), cupy.ones(c, x.dtype)
    axis = -1 if cl else 1
    for _ in range(2):
        _, mean, rstd = cunorm.batch_norm(x, wt, b, rm, rv, channel_axis=axis, return_stats=True)
        cunorm.batch_norm_backward(dy, x, wt, b, mean, rstd, channel_axis=axis)
    cupy.cuda.runtime.deviceSynchronize()


if __name__ == "__main__":
    for spec in sys.argv[1:]:
        case(spec)
