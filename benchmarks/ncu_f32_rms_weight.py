"""The kernel ncu profiles in probe (p4) of NOTES: float32 RMSNorm 262144's cluster forward
(1024-thread blocks, clusters of 8, rows in registers) with a weight or without (argv[1]:
weight | none); five calls, ncu takes the fourth (--launch-skip 3 --launch-count 1).

    ncu --clock-control none -k regex:norm_fwd_cluster --launch-skip 3 --launch-count 1 \\
        python benchmarks/ncu_f32_rms_weight.py none
"""
import sys

import cupy
import numpy

import cunorm
from cunorm._bench import TOTAL_ELEMENTS

n = 262144
x = cupy.random.default_rng(0).standard_normal((TOTAL_ELEMENTS // n, n), dtype=numpy.float32)
w = cupy.ones(n, numpy.float32) if sys.argv[1] == "weight" else None
for _ in range(5):
    cunorm.rms_norm(x, w, return_stats=True)
cupy.cuda.get_current_stream().synchronize()
