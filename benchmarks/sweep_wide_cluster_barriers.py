"""v78: the wide cluster backward (norm_bwd_wide_cluster) without its block sums' closing
barrier (CUNORM_WIDE_CLUSTER_OPEN_SUMS=1), against four barriers a row (0), on the rows the
clusters serve (bf16 and float32 32768 / 65536). Builds alternate ROUNDS times in one
process. Run the GPU tests with racecheck on it before making it the default.

    python benchmarks/sweep_wide_cluster_barriers.py [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile
from cunorm._checks import BFLOAT16
from _sweep_cli import adding_options, backward_sweep  # benchmarks/ is the script's directory

# name: extra NVRTC options
VARIANTS = {"four_barriers": ("-DCUNORM_WIDE_CLUSTER_OPEN_SUMS=0",), "v78_open_sums": ("-DCUNORM_WIDE_CLUSTER_OPEN_SUMS=1",)}
ROUNDS = 2
CASES = [(op, dtype, n) for op in ("layer_norm", "rms_norm") for dtype in (BFLOAT16, numpy.dtype(numpy.float32))
         for n in (32768, 65536)]


def sweep(log=print) -> list[dict]:
    return backward_sweep(VARIANTS, ROUNDS, adding_options(_compile.COMPILE_OPTIONS), (), CASES, log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
