"""Backward register-tile limits against bandwidth: the benchmark's large shapes
(M·N = 64 Mi) with ``_config.bwd_limits`` replaced by each candidate.

    python benchmarks/sweep_bwd_config.py [--json out.json]

Fewer values a thread (more threads a row) lowers registers and raises occupancy; more
threads a row makes the row reductions wider. The numbers say which wins where.
"""
from __future__ import annotations

import numpy

from cunorm import _bench, _compile, _config
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm

LIMITS = {
    "512x16": _config.PathLimits(max_tpr=512, max_values=16, min_block_tpr=128),
    "1024x8": _config.PathLimits(max_tpr=1024, max_values=8, min_block_tpr=128),
}
# Extra NVRTC options per candidate (a -D switch compares kernel variants the same way; v7's
# next-row prefetch was measured so and dropped).
CANDIDATES = {name: (limits, ()) for name, limits in LIMITS.items()}
ROW_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768)


def _use(limits, options) -> None:
    _config.bwd_limits = lambda itemsize, rms: limits
    _compile.COMPILE_OPTIONS = tuple(options)
    _compile._modules.clear()
    _row_norm._backward_kernels.cache_clear()
    _row_norm.backward_plan.cache_clear()


def sweep(log=print) -> list[dict]:
    default, options, rows = _config.bwd_limits, _compile.COMPILE_OPTIONS, []
    copy = _bench.copy_gbps()
    _bench.bench_row_norm("layer_norm", BFLOAT16, 4096)  # clocks up: the first timing ran slow (v7)
    for op in ("layer_norm", "rms_norm"):
        for dtype in (BFLOAT16, numpy.dtype(numpy.float32)):
            for n in ROW_LENGTHS:
                row = {"op": op, "dtype": dtype.name, "N": n}
                for name, (limits, options) in CANDIDATES.items():
                    _use(limits, options)
                    row[name] = round(_bench.bench_row_norm(op, dtype, n)["bwd_GBps"] / copy, 3)
                log(f"{op:10s} {dtype.name:8s} N={n:<6d} bwd of copy " +
                    "  ".join(f"{k} {row[k]:.3f}" for k in CANDIDATES))
                rows.append(row)
    _config.bwd_limits = default
    _compile.COMPILE_OPTIONS = options
    _compile._modules.clear()
    _row_norm._backward_kernels.cache_clear()
    _row_norm.backward_plan.cache_clear()
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
