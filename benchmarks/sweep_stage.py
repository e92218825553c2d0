"""Rows staged through shared memory (cp.async, the next row in flight during this one's
reductions) against rows loaded straight into registers, bf16 LayerNorm and RMSNorm at the
benchmark's shapes: neither pass staged, the backward staged (v19), both (v21). Fractions of
copy, forward and backward.

    python benchmarks/sweep_stage.py [--json out.json]
"""
from __future__ import annotations

import itertools

from cunorm import _bench, _compile
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm

ROW_LENGTHS = (512, 1024, 2048, 4096, 8192)
# name: (forward staged, backward staged)
VARIANTS = {"unstaged": (False, False), "staged_bwd": (False, True), "staged": (True, True)}


def _use(fwd: bool, bwd: bool) -> None:
    _row_norm.STAGE_FORWARD, _row_norm.STAGE_BACKWARD = fwd, bwd
    _compile.COMPILE_OPTIONS = (f"-DCUNORM_FWD_STAGE={int(fwd)}", f"-DCUNORM_BWD_STAGE={int(bwd)}")
    _compile._modules.clear()
    for cache in (_row_norm._forward_kernels, _row_norm.forward_plan, _row_norm._backward_kernels,
                  _row_norm.backward_plan):
        cache.cache_clear()


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
    finally:
        _row_norm.STAGE_FORWARD, _row_norm.STAGE_BACKWARD, options = default
        _use(_row_norm.STAGE_FORWARD, _row_norm.STAGE_BACKWARD)
        _compile.COMPILE_OPTIONS = options
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
