"""The staged cluster backward (norm_bwd_cluster_staged, half-precision rows of 8193-65536
elements) with its exchange's barrier split around the previous row's dx pass and the next
row's first pass (v62, the default build) against one whole barrier a row
(``-DCUNORM_CLUSTER_BWD_OVERLAP=0``). Builds alternate ROUNDS times in one process so drift
shows as the spread within each. The arithmetic is the same, so dx, dweight and dbias must
equal the first build's bit for bit; a mismatch is printed and recorded.

v62 lost 0.02-0.04 everywhere (NOTES v62, results/sweep-cluster-bwd-overlap-v62-h200.txt) and
is not in the sources: apply experiments/v62-cluster-bwd-overlap.patch first.

    python benchmarks/sweep_cluster_bwd_overlap.py [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm._checks import BFLOAT16
from _sweep_cli import alternate_builds, best_table  # benchmarks/ is the script's directory
from sweep_bwd_stage import bwd_bits_row

VARIANTS = {"v46_whole_barrier": ("-DCUNORM_CLUSTER_BWD_OVERLAP=0",), "v62_overlap": ()}
ROUNDS = 2
ROW_LENGTHS = (16384, 32768, 65536)
DTYPES = (BFLOAT16, numpy.dtype(numpy.float16))


def sweep(log=print) -> list[dict]:
    rows, reference = [], {}
    for round_, name, copy in alternate_builds(VARIANTS, ROUNDS, log):
        for op in ("layer_norm", "rms_norm"):
            for dtype in DTYPES:
                for n in ROW_LENGTHS:
                    rows.append(bwd_bits_row(name, round_, op, dtype, n, copy, reference, log))
    log(best_table(rows, VARIANTS, ("bwd_of_copy",)))
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
