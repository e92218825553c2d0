"""Channels-last BatchNorm: each pass's kernel time (bn_pass_times' method) against the grid's
target blocks an SM (_batch_norm.BLOCKS_PER_SM_CL, one setting for every cl pass), training
forward and backward at issue 5's shapes. NVRTC 13.0 sm_90 holds bn_stats_cl at 60 registers
and bn_apply_cl at 63 (v18: four 256-thread blocks an SM), bn_bwd_sums_cl at 80 (three) and
bn_bwd_apply_cl at 95 (two): at the default target of four, the backward's sums pass runs
528 blocks in 1.33 waves of 396 on the H200. This asks which target each pass wants.

    python benchmarks/sweep_bn_cl_grid.py [target ...]        (default: 2 3 4 6 8)
"""
from __future__ import annotations

import sys

import numpy

from cunorm._checks import BFLOAT16
from cunorm.ops import _batch_norm
from bn_pass_times import call_times, times_line
from sweep_bn_config import SHAPES


def main(targets=(2, 3, 4, 6, 8)) -> None:
    import cupy

    stream = cupy.cuda.get_current_stream().ptr
    default = _batch_norm.BLOCKS_PER_SM_CL
    try:
        for shape in SHAPES:
            for dtype in (BFLOAT16, numpy.dtype(numpy.float32)):
                n, c, h, w = shape
                x = cupy.asarray(numpy.random.default_rng(0).standard_normal((n, h, w, c)).astype(numpy.float32))
                x = x.astype(dtype)
                dy = x.copy()
                wt, b = cupy.ones(c, dtype), cupy.zeros(c, dtype)
                rm, rv = cupy.zeros(c, dtype), cupy.ones(c, dtype)
                for target in targets:
                    _batch_norm.BLOCKS_PER_SM_CL = target
                    _batch_norm.plan.cache_clear()
                    _batch_norm._passes.cache_clear()
                    f, g = call_times(x, wt, b, rm, rv, dy, -1, stream)
                    print(f"{dtype.name:8s} {str(shape):20s} target {target}: {times_line(f, g)}", flush=True)
    finally:
        _batch_norm.BLOCKS_PER_SM_CL = default
        _batch_norm.plan.cache_clear()
        _batch_norm._passes.cache_clear()


if __name__ == "__main__":
    main(tuple(int(a) for a in sys.argv[1:]) or (2, 3, 4, 6, 8))
