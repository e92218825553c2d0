"""Backward register-tile limits against bandwidth: the benchmark's large shapes
(M·N = 64 Mi) with ``_config.bwd_limits`` replaced by each candidate.

    python benchmarks/sweep_bwd_config.py [--json out.json]

Fewer values a thread (more threads a row) lowers registers and raises occupancy; more
threads a row makes the row reductions wider. The numbers say which wins where.
"""
from __future__ import annotations

from cunorm import _bench, _config
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm
from _sweep_cli import row_norm_cases  # benchmarks/ is the script's directory

CANDIDATES = {
    "512x16": _config.PathLimits(max_tpr=512, max_values=16, min_block_tpr=128),
    "1024x8": _config.PathLimits(max_tpr=1024, max_values=8, min_block_tpr=128),
}
ROW_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768)


def _use(bwd_limits) -> None:
    """Make ``bwd_limits(itemsize, rms)`` the dispatcher's, and forget plans made without it."""
    _config.bwd_limits = bwd_limits
    _row_norm.backward_plan.cache_clear()


def sweep(log=print) -> list[dict]:
    default, rows = _config.bwd_limits, []
    copy = _bench.copy_gbps()
    _bench.bench_row_norm("layer_norm", BFLOAT16, 4096)  # clocks up: the first timing ran slow (v7)
    try:
        for op, dtype, n in row_norm_cases(ROW_LENGTHS):
            row = {"op": op, "dtype": dtype.name, "N": n}
            for name, limits in CANDIDATES.items():
                _use(lambda itemsize, rms, limits=limits: limits)
                row[name] = round(_bench.bench_row_norm(op, dtype, n)["bwd_GBps"] / copy, 3)
            log(f"{op:10s} {dtype.name:8s} N={n:<6d} bwd of copy " + "  ".join(f"{k} {row[k]:.3f}" for k in CANDIDATES))
            rows.append(row)
    finally:
        _use(default)
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
