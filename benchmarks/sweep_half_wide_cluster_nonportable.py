"""v115: the half-precision backward of rows of 131073-262144 in non-portable clusters of 9-16
wide blocks (16384 columns each) against the grid rows they replace (``grid_rows``:
_config.WIDE_CLUSTER_BWD_HALF_NONPORTABLE_TO = 0). Backward of copy (the forward is
untouched and logged for the record); M x N = 64 Mi as the benchmark's. Each variant's dx is
compared with the first variant's by its largest difference, and the plan's path is logged.

    python benchmarks/sweep_half_wide_cluster_nonportable.py [--json out.json] [--variants a,b]
"""
from __future__ import annotations

import numpy

from cunorm import _bench, _config
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm
from _sweep_cli import alternate, best_table, chosen  # benchmarks/ is the script's directory

VARIANTS = {"clusters16": _config.WIDE_CLUSTER_BWD_HALF_NONPORTABLE_TO, "grid_rows": 0}
ROUNDS = 2
FP16 = numpy.dtype(numpy.float16)
CASES = [(op, BFLOAT16, n, BFLOAT16) for op in ("layer_norm", "rms_norm") for n in (147456, 196608, 262144)] + \
        [("rms_norm", FP16, 262144, FP16), ("layer_norm", BFLOAT16, 262144, numpy.dtype(numpy.float32))]


def _use(to: int) -> None:
    _config.WIDE_CLUSTER_BWD_HALF_NONPORTABLE_TO = to
    for cache in (_row_norm.backward_plan, _row_norm.forward_plan):
        cache.cache_clear()


def _path(dtype, wdtype, n: int, rms: bool) -> str:
    plan = _row_norm.backward_plan((64, n), (n, 1), (n, 1), dtype, wdtype, wdtype, 1, rms, 0, 0, 0)
    if plan.grid_rows is not None:
        return "grid rows"
    if plan.split is not None:
        return "split"
    return f"{plan.blocks // max(plan.groups, 1)} blocks x {plan.block}"


def _dx(op: str, dtype, wdtype, n: int, m: int = 8):
    import cupy

    import cunorm

    rng = cupy.random.default_rng(5)
    x, dy = ((rng.standard_normal((m, n), dtype=numpy.float32) + 1).astype(dtype) for _ in range(2))
    w = (1 + 0.1 * rng.standard_normal(n, dtype=numpy.float32)).astype(wdtype)
    if op == "layer_norm":
        _, mean, rstd = cunorm.layer_norm(x, w, w, return_stats=True)
        dx = cunorm.layer_norm_backward(dy, x, w, mean, rstd)[0]
    else:
        _, rstd = cunorm.rms_norm(x, w, return_stats=True)
        dx = cunorm.rms_norm_backward(dy, x, w, rstd)[0]
    return dx.astype(numpy.float32).get()


def sweep(log=print, names=None) -> list[dict]:
    variants = chosen(VARIANTS, names)
    rows, reference = [], {}
    for round_, name, copy in alternate(variants, ROUNDS, _use, _config.WIDE_CLUSTER_BWD_HALF_NONPORTABLE_TO, log):
        for op, dtype, n, wdtype in CASES:
            dx = _dx(op, dtype, wdtype, n)
            key = (op, dtype.name, wdtype.name, n)
            diff = float(numpy.abs(dx - reference.setdefault(key, dx)).max())
            r = _bench.bench_row_norm(op, dtype, n, w_dtype=wdtype)
            path = _path(dtype, wdtype, n, op == "rms_norm")
            dname = dtype.name if wdtype == dtype else f"{dtype.name}/{wdtype.name}"
            row = {"variant": name, "round": round_, "op": op, "dtype": dname, "N": n, "path": path,
                   "bwd_of_copy": round(r["bwd_GBps"] / copy, 3), "fwd_of_copy": round(r["fwd_GBps"] / copy, 3),
                   "bwd_ms": r["bwd_ms"], "max_dx_diff_vs_first": diff}
            log(f"{name:10s} {op:10s} {dname:16s} N={n:<7d} {path:20s} bwd {row['bwd_of_copy']:.3f} "
                f"(fwd {row['fwd_of_copy']:.3f}) of copy, |dx - first's| <= {diff:.3g}")
            rows.append(row)
    log(best_table(rows, variants, keys=("bwd_of_copy",), label="path"))
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
