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

from cunorm._bench_bn import bn_calls
from cunorm._checks import BFLOAT16

DTYPES = {"bf16": BFLOAT16, "fp32": numpy.float32, "fp16": numpy.float16}


def case(spec: str):
    dtype, layout, shape = spec.split(":")
    fwd, bwd = bn_calls(tuple(int(v) for v in shape.split(",")), DTYPES[dtype], layout == "nhwc")[:2]
    for _ in range(2):
        fwd()
        bwd()
    cupy.cuda.runtime.deviceSynchronize()


if __name__ == "__main__":
    for spec in sys.argv[1:]:
        case(spec)
