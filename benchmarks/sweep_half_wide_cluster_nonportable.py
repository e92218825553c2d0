"""The backward in non-portable clusters of 9-16 wide blocks. v115: half-precision rows of
131073-262144 (16384 columns a block) against the grid rows they replace (``grid_rows``:
_config.WIDE_CLUSTER_BWD_HALF_NONPORTABLE_TO = 0). v116: the push exchange's collect loop
unrolled four ranks at a time in clusters past eight (``full_unroll``: every rank at once, as
before, built with -DCUNORM_PUSH_COLLECT_UNROLL=16), which spilled bf16 LayerNorm's tile
with three rows in its ring; float32's v100 clusters of narrow blocks change code too.
v117: float32 rows of 131073-262144 in clusters of 9-16 of v93's 16384-column blocks against
the grid rows (``f32_grid_rows``: _config.WIDE_CLUSTER_BWD_F32_NONPORTABLE_TO all 0).
All three landed (v115 in the fifty-third session, v116 and v117 in the fifty-fourth: NOTES
"Fifty-fourth session's device calls"); the variants give the baselines back.
Backward of copy (the forward is untouched and logged for the record); M x N = 64 Mi as the
benchmark's. Each variant's dx is compared with the first variant's by its largest
difference, and the plan's path is logged.

    python benchmarks/sweep_half_wide_cluster_nonportable.py [--json out.json] [--variants a,b]
"""
from __future__ import annotations

import numpy

from cunorm import _bench, _compile, _config
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm
from _sweep_cli import alternate, best_table, chosen, rebuild_row_norms  # benchmarks/ is the script's directory

# (WIDE_CLUSTER_BWD_HALF_NONPORTABLE_TO, WIDE_CLUSTER_BWD_F32_NONPORTABLE_TO, NVRTC options
# added to the defaults)
_HALF, _F32 = _config.WIDE_CLUSTER_BWD_HALF_NONPORTABLE_TO, dict(_config.WIDE_CLUSTER_BWD_F32_NONPORTABLE_TO)
VARIANTS = {"clusters16": (_HALF, _F32, ()), "grid_rows": (0, _F32, ()),
            "full_unroll": (_HALF, _F32, ("-DCUNORM_PUSH_COLLECT_UNROLL=16",)),
            "f32_grid_rows": (_HALF, {False: 0, True: 0}, ())}
ROUNDS = 2
FP16, F32 = numpy.dtype(numpy.float16), numpy.dtype(numpy.float32)
# (op, dtype, N, parameters' dtype, the variants the case is there for): a run takes the
# cases of the variants it names besides clusters16
_HALF_CASES = [(op, BFLOAT16, n, BFLOAT16) for op in ("layer_norm", "rms_norm") for n in (147456, 196608, 262144)] + \
              [("rms_norm", FP16, 262144, FP16), ("layer_norm", BFLOAT16, 262144, F32)]
CASES = [(*c, {"grid_rows", "full_unroll"}) for c in _HALF_CASES] + \
        [(op, F32, n, F32, {"full_unroll"}) for op in ("layer_norm", "rms_norm") for n in (100000, 131072)] + \
        [(op, F32, n, F32, {"f32_grid_rows"}) for op in ("layer_norm", "rms_norm") for n in (196608, 262144)]
_BASE = _compile.COMPILE_OPTIONS


def _use(variant) -> None:
    half_to, f32_to, options = variant
    _config.WIDE_CLUSTER_BWD_HALF_NONPORTABLE_TO = half_to
    _config.WIDE_CLUSTER_BWD_F32_NONPORTABLE_TO = dict(f32_to)
    rebuild_row_norms((*_BASE, *options))  # drops every plan and kernel cache with the modules


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
    default = (_HALF, _F32, ())
    for round_, name, copy in alternate(variants, ROUNDS, _use, default, log):
        for op, dtype, n, wdtype, _ in [c for c in CASES if c[-1] & set(variants)]:
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
