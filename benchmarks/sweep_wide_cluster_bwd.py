"""v68: rows past one wide block on a cluster of wide blocks (norm_bwd_wide_cluster) against
what took them before (half precision: the staged cluster of 8192-column blocks, v46;
float32 and half-precision RMSNorm past 65536: the split path). Host switches only (no
rebuild): variants alternate ROUNDS times in one process. (v68's run also had blocks of
32768 columns for half-precision RMSNorm, results/sweep-wide-cluster-bwd-v68-h200.txt; they
lost and were taken out.)

    python benchmarks/sweep_wide_cluster_bwd.py [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm
from _sweep_cli import backward_sweep  # benchmarks/ is the script's directory

# name: USE_WIDE_CLUSTER_BACKWARD
VARIANTS = {"before": False, "v68": True}
ROUNDS = 2
F32 = numpy.dtype(numpy.float32)
CASES = [("layer_norm", BFLOAT16, n) for n in (32768, 65536)] + \
        [("rms_norm", BFLOAT16, n) for n in (65536, 131072)] + \
        [(op, F32, n) for op in ("layer_norm", "rms_norm") for n in (32768, 65536)]


def _use(choice) -> None:
    _row_norm.USE_WIDE_CLUSTER_BACKWARD = choice
    _row_norm.backward_plan.cache_clear()


def sweep(log=print) -> list[dict]:
    return backward_sweep(VARIANTS, ROUNDS, _use, True, CASES, log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
