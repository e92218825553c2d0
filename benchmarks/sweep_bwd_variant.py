"""Builds of the row-norm backward (kernels/row_norm.cuh, layer_norm.cu, layer_norm_cluster.cu)
at the benchmark's row lengths, alternating ROUNDS times in one process so drift shows as the
spread within each: v61, half-precision rows' first pass adding into the dW / dB accumulators
and leaving w * dy for a dx pass of two multiply-adds (the default), against dx_tile, which
loads and widens the weight again and accumulates there (``-DCUNORM_BWD_WDY_IN_PLACE=0``).
float32 rows compile the same code in both builds (a control). The fused residual backward
(norm_bwd_fused) rides along at FUSED_ROW_LENGTHS. dweight and dbias must equal the first
build's bit for bit (same sums in the same order); dx may differ in its last bits (the
multiply-adds round differently), so its largest difference is printed instead.

    python benchmarks/sweep_bwd_variant.py [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _bench
from cunorm._checks import BFLOAT16
from _sweep_cli import alternate_builds, best_table, row_norm_cases  # benchmarks/ is the script's directory
from sweep_bwd_stage import _fused_bwd_of_copy, _fused_grads, _grads, _same

VARIANTS = {"dx_tile": ("-DCUNORM_BWD_WDY_IN_PLACE=0",), "wdy_in_place": ()}
ROUNDS = 2
ROW_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384, 65536)
FUSED_ROW_LENGTHS = (2048, 4096, 8192)


def _dx_gap(a: numpy.ndarray, b: numpy.ndarray) -> float:
    return float(numpy.abs(a.astype(numpy.float64) - b.astype(numpy.float64)).max())


def sweep(log=print) -> list[dict]:
    rows, reference = [], {}
    for round_, name, copy in alternate_builds(VARIANTS, ROUNDS, log):
        for op, dtype, n in row_norm_cases(ROW_LENGTHS):
            got = _grads(op, dtype, n)
            first = reference.setdefault((op, dtype.name, n), got)
            params_same = _same(got[1:], first[1:])
            r = _bench.bench_row_norm(op, dtype, n)
            row = {"variant": name, "round": round_, "op": op, "dtype": dtype.name, "N": n,
                   "bwd_of_copy": round(r["bwd_GBps"] / copy, 3), "params_same_bits": params_same,
                   "dx_max_gap": _dx_gap(got[0], first[0])}
            log(f"{name:14s} {op:10s} {dtype.name:8s} N={n:<6d} bwd {row['bwd_of_copy']:.3f} of copy, "
                f"dx gap {row['dx_max_gap']:.3g}" + ("" if params_same else "  dW / dB DIFFER"))
            rows.append(row)
        for op in ("layer_norm", "rms_norm"):
            for n in FUSED_ROW_LENGTHS:
                got = _fused_grads(op, n)
                first = reference.setdefault((op, "fused", n), got)
                gaps = [_dx_gap(a, b) for a, b in zip(got, first)]
                row = {"variant": name, "round": round_, "op": op, "dtype": "bfloat16", "N": n,
                       "fused_residual_bwd_of_copy": _fused_bwd_of_copy(op, n, copy), "output_gaps": gaps}
                log(f"{name:14s} {op:10s} fused bf16 N={n:<6d} bwd {row['fused_residual_bwd_of_copy']:.3f} "
                    f"of copy, output gaps {[f'{g:.3g}' for g in gaps]}")
                rows.append(row)
    log(best_table(rows, VARIANTS, ("bwd_of_copy", "fused_residual_bwd_of_copy")))
    return rows

if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
