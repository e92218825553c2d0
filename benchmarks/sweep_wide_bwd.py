"""The backward of rows of 8193-16384 elements: the wide backward (v63, norm_bwd_wide: one
1024-thread block a row, the row staged in shared memory; float32 since v65) at each ring
depth, against the path that took these rows before (half precision: the staged cluster
backward, v46; float32: the split path). The choice is
the host's (``_row_norm.USE_WIDE_BACKWARD`` / ``WIDE_DEPTH``), so no rebuild: variants
alternate ROUNDS times in one process, and drift shows as the spread within each.

    python benchmarks/sweep_wide_bwd.py [--json out.json]
    WIDE_SWEEP=rms_long python benchmarks/sweep_wide_bwd.py   # v66's rows
    WIDE_SWEEP=v81 python benchmarks/sweep_wide_bwd.py --variants v63_wide_depth2,v63_wide_depth3

v66 (WIDE_SWEEP=rms_long): half-precision RMSNorm rows of 16385-32768 elements on the wide
backward's four-pack tile against the staged cluster that took them before.
"""
from __future__ import annotations

import os

import numpy

from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm
from _sweep_cli import backward_sweep, chosen  # benchmarks/ is the script's directory

# name: (USE_WIDE_BACKWARD, WIDE_DEPTH)
VARIANTS = {"before": (False, None), "v63_wide_depth2": (True, 2), "v63_wide_depth3": (True, 3)}
ROUNDS = 2
# (ops, dtypes, row lengths) a sweep covers, by WIDE_SWEEP
CASES = {
    "v63": (("layer_norm", "rms_norm"), (BFLOAT16, numpy.dtype(numpy.float16), numpy.dtype(numpy.float32)),
            (9216, 12288, 16384)),
    "rms_long": (("rms_norm",), (BFLOAT16, numpy.dtype(numpy.float16)), (20480, 24576, 32768)),
    "v81": (("layer_norm", "rms_norm"), (BFLOAT16, numpy.dtype(numpy.float16)), (12288, 16384)),
}


def _use(choice) -> None:
    _row_norm.USE_WIDE_BACKWARD, _row_norm.WIDE_DEPTH = choice
    _row_norm.backward_plan.cache_clear()


def sweep(log=print, names=None) -> list[dict]:
    ops, dtypes, lengths = CASES[os.environ.get("WIDE_SWEEP", "v63")]
    cases = [(op, dtype, n) for op in ops for dtype in dtypes for n in lengths]
    variants = chosen(VARIANTS, names)
    return backward_sweep(variants, ROUNDS, _use, (True, None), cases, log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
