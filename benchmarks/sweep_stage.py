"""Rows staged through shared memory (cp.async, the next row in flight during this one's
reductions) against rows loaded straight into registers, bf16 LayerNorm and RMSNorm at the
benchmark's shapes: neither pass staged, the backward staged (v19), both (v21). Fractions of
copy, forward and backward; and the fused forward (residual add; FP8 out) by issue 7's bytes.

    python benchmarks/sweep_stage.py [--json out.json]
"""
from __future__ import annotations

import itertools

from cunorm import _bench, _compile
from cunorm._checks import BFLOAT16
from cunorm.ops import _fused, _row_norm

ROW_LENGTHS = (512, 1024, 2048, 4096, 8192)
# name: (forward staged, backward staged)
VARIANTS = {"unstaged": (False, False), "staged_bwd": (False, True), "staged": (True, True)}


def _use(fwd: bool, bwd: bool) -> None:
    _row_norm.STAGE_FORWARD, _row_norm.STAGE_BACKWARD = fwd, bwd
    _compile.COMPILE_OPTIONS = (f"-DCUNORM_FWD_STAGE={int(fwd)}", f"-DCUNORM_BWD_STAGE={int(bwd)}")
    _compile._modules.clear()
    for cache in (_row_norm._forward_kernels, _row_norm.forward_plan, _row_norm._backward_kernels,
                  _row_norm.backward_plan, _fused.fused_forward_plan, _fused.fused_backward_plan):
        cache.cache_clear()


def _fused_rows(name, copy, log) -> list[dict]:
    """The fused forward at N = 4096, bf16, M·N = 64 Mi: residual (read x, r; write y, h) and
    FP8 out (read x; write y, 1 byte)."""
    import cupy
    import ml_dtypes

    import cunorm

    n = 4096
    m = _bench.TOTAL_ELEMENTS // n
    rng = cupy.random.default_rng(0)
    x, r = (rng.standard_normal((m, n), dtype="float32").astype(BFLOAT16) for _ in range(2))
    w = cupy.ones(n, BFLOAT16)
    cases = {"residual": (lambda: cunorm.rms_norm(x, w, residual=r), 8),
             "fp8": (lambda: cunorm.rms_norm(x, w, out_dtype=ml_dtypes.float8_e4m3fn, out_scale=4.0,
                                             return_amax=True), 3)}
    rows = []
    for case, (fn, bytes_per) in cases.items():
        frac = round(bytes_per * m * n / _bench.time_ms(fn) / 1e6 / copy, 3)
        log(f"{name:10s} fused {case:8s} N={n} fwd {frac:.3f} of copy")
        rows.append({"variant": name, "op": f"fused_{case}", "dtype": "bfloat16", "N": n, "fwd_of_copy": frac})
    return rows


def sweep(log=print) -> list[dict]:
    default = (_row_norm.STAGE_FORWARD, _row_norm.STAGE_BACKWARD, _compile.COMPILE_OPTIONS)
    copy, rows = _bench.copy_gbps(), []
    _bench.bench_row_norm("layer_norm", BFLOAT16, 4096)  # clocks up first
    try:
        for name, (fwd, bwd) in VARIANTS.items():
            _use(fwd, bwd)
            for op, n in itertools.product(("layer_norm", "rms_norm"), ROW_LENGTHS):
                r = _bench.bench_row_norm(op, BFLOAT16, n)
                row = {"variant": name, "op": op, "dtype": "bfloat16", "N": n,
                       "fwd_of_copy": round(r["fwd_GBps"] / copy, 3), "bwd_of_copy": round(r["bwd_GBps"] / copy, 3)}
                log(f"{name:10s} {op:10s} N={n:<5d} fwd {row['fwd_of_copy']:.3f} bwd {row['bwd_of_copy']:.3f} of copy")
                rows.append(row)
            rows += _fused_rows(name, copy, log)
    finally:
        _row_norm.STAGE_FORWARD, _row_norm.STAGE_BACKWARD, options = default
        _use(_row_norm.STAGE_FORWARD, _row_norm.STAGE_BACKWARD)
        _compile.COMPILE_OPTIONS = options
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
