"""The backward of rows of 8193-16384 elements: the wide backward (v63, norm_bwd_wide: one
1024-thread block a row, the row staged in shared memory; float32 since v65) at each ring
depth, against the path that took these rows before (half precision: the staged cluster
backward, v46; float32: the split path). The choice is
the host's (``_row_norm.USE_WIDE_BACKWARD`` / ``WIDE_DEPTH``), so no rebuild: variants
alternate ROUNDS times in one process, and drift shows as the spread within each.

    python benchmarks/sweep_wide_bwd.py [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _bench
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm
from _sweep_cli import alternate, best_table  # benchmarks/ is the script's directory

# name: (USE_WIDE_BACKWARD, WIDE_DEPTH)
VARIANTS = {"before": (False, None), "v63_wide_depth2": (True, 2), "v63_wide_depth3": (True, 3)}
ROUNDS = 2
ROW_LENGTHS = (9216, 12288, 16384)
DTYPES = (BFLOAT16, numpy.dtype(numpy.float16), numpy.dtype(numpy.float32))


def _use(choice) -> None:
    _row_norm.USE_WIDE_BACKWARD, _row_norm.WIDE_DEPTH = choice
    _row_norm.backward_plan.cache_clear()


def sweep(log=print) -> list[dict]:
    rows = []
    for round_, name, copy in alternate(VARIANTS, ROUNDS, _use, (True, None), log):
        for op in ("layer_norm", "rms_norm"):
            for dtype in DTYPES:
                for n in ROW_LENGTHS:
                    r = _bench.bench_row_norm(op, dtype, n)
                    row = {"variant": name, "round": round_, "op": op, "dtype": dtype.name, "N": n,
                           "bwd_of_copy": round(r["bwd_GBps"] / copy, 3)}
                    log(f"{name:16s} {op:10s} {dtype.name:8s} N={n:<6d} bwd {row['bwd_of_copy']:.3f} of copy")
                    rows.append(row)
    log(best_table(rows, VARIANTS, ("bwd_of_copy",)))
    return rows

if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
