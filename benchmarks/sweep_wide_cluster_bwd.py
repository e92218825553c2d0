"""v68: rows past one wide block on a cluster of wide blocks (norm_bwd_wide_cluster) against
what took them before (half precision: the staged cluster of 8192-column blocks, v46;
float32 and half-precision RMSNorm past 65536: the split path), and, for half-precision
RMSNorm, blocks of 16384 columns against 32768. Host switches only (no rebuild): variants
alternate ROUNDS times in one process.

    python benchmarks/sweep_wide_cluster_bwd.py [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _config
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm
from _sweep_cli import backward_sweep  # benchmarks/ is the script's directory

# name: (USE_WIDE_CLUSTER_BACKWARD, WIDE_CLUSTER_TILE)
VARIANTS = {"before": (False, None), "v68": (True, None), "v68_rms_32768": (True, _config.WIDE_BWD_TILE_RMS_LONG)}
ROUNDS = 2
F32 = numpy.dtype(numpy.float32)
CASES = [("layer_norm", BFLOAT16, n) for n in (32768, 65536)] + \
        [("rms_norm", BFLOAT16, n) for n in (65536, 131072)] + \
        [(op, F32, n) for op in ("layer_norm", "rms_norm") for n in (32768, 65536)]


def _use(choice) -> None:
    _row_norm.USE_WIDE_CLUSTER_BACKWARD, _row_norm.WIDE_CLUSTER_TILE = choice
    _row_norm.backward_plan.cache_clear()


def _runs(name, op, dtype, n) -> bool:
    # the forced tile changes only half-precision RMSNorm: elsewhere it is v68's kernel again
    return name != "v68_rms_32768" or (op == "rms_norm" and dtype == BFLOAT16)


def sweep(log=print) -> list[dict]:
    return backward_sweep(VARIANTS, ROUNDS, _use, (True, None), CASES, log, _runs)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
