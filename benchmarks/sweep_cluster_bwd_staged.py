"""Half-precision backward rows past the full-row tile (N > 8192): the split path against
norm_bwd_cluster_staged (v46: clusters of 2-8 staged 1024-thread tiles, the row sums exchanged
once; ``_row_norm.USE_STAGED_CLUSTER_BACKWARD``), LayerNorm and RMSNorm, bf16 and fp16,
alternating ROUNDS times in one process. Each variant's max |dx error| against the float64
reference on a few rows rides along.

    python benchmarks/sweep_cluster_bwd_staged.py [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _bench, reference
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm
from _sweep_cli import alternate  # benchmarks/ is the script's directory

VARIANTS = {"split": False, "cluster_staged": True}
ROUNDS = 2
ROW_LENGTHS = (16384, 32768, 65536)
DTYPES = (BFLOAT16, numpy.dtype(numpy.float16))


def _use(staged_clusters: bool) -> None:
    _row_norm.USE_STAGED_CLUSTER_BACKWARD = staged_clusters
    _row_norm.backward_plan.cache_clear()


def _dx_error(op: str, dtype, n: int, m: int = 40) -> float:
    import cupy

    import cunorm

    rng = numpy.random.default_rng(3)
    x = (rng.standard_normal((m, n)) + 2).astype(dtype)
    dy = rng.standard_normal((m, n)).astype(dtype)
    w = (1 + 0.1 * rng.standard_normal(n)).astype(dtype)
    x64, dy64, w64 = (a.astype(numpy.float64) for a in (x, dy, w))
    if op == "layer_norm":
        _, mean, rstd = reference.layer_norm(x64, w64, None, 1e-5, return_stats=True)
        dx = cunorm.layer_norm_backward(cupy.asarray(dy), cupy.asarray(x), cupy.asarray(w),
                                        cupy.asarray(mean.astype(numpy.float32)), cupy.asarray(rstd.astype(numpy.float32)),
                                        has_bias=False)[0]
        want = reference.layer_norm_backward(dy64, x64, w64, mean, rstd, has_bias=False)[0]
    else:
        _, rstd = reference.rms_norm(x64, w64, 1e-5, return_stats=True)
        dx = cunorm.rms_norm_backward(cupy.asarray(dy), cupy.asarray(x), cupy.asarray(w),
                                      cupy.asarray(rstd.astype(numpy.float32)))[0]
        want = reference.rms_norm_backward(dy64, x64, w64, rstd)[0]
    return float(numpy.abs(dx.get().astype(numpy.float64) - want).max())


def sweep(log=print) -> list[dict]:
    rows = []
    for round_, name, copy in alternate(VARIANTS, ROUNDS, _use, _row_norm.USE_STAGED_CLUSTER_BACKWARD, log):
        for op in ("layer_norm", "rms_norm"):
            for dtype in DTYPES:
                for n in ROW_LENGTHS:
                    r = _bench.bench_row_norm(op, dtype, n)
                    m = _bench.TOTAL_ELEMENTS // n
                    plan = _row_norm.backward_plan((m, n), (n, 1), (n, 1), dtype, dtype, dtype, 1,
                                                   op == "rms_norm", 0, 0, 0)
                    row = {"variant": name, "round": round_, "op": op, "dtype": dtype.name, "N": n,
                           "bwd_of_copy": round(r["bwd_GBps"] / copy, 3),
                           "max_dx_error": _dx_error(op, dtype, n), "blocks": plan.blocks,
                           "groups": plan.groups}
                    log(f"{name:15s} {op:10s} {dtype.name:8s} N={n:<6d} bwd {row['bwd_of_copy']:.3f} of copy, "
                        f"max |dx error| {row['max_dx_error']:.3g}, {plan.blocks} blocks, "
                        f"{plan.groups} row groups")
                    rows.append(row)
    return rows

if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
