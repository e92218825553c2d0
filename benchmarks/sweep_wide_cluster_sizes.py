"""v93: the wide cluster backward (norm_bwd_wide_cluster, 1024-thread blocks of 16384 columns)
in clusters of up to eight blocks (rows up to 131072 elements) against v68's two to four
(rows past 65536 then take the split path, or the grid rows from 256 KiB). The kernels are
built with each variant's cluster sizes (_config.WIDE_CLUSTER_BWD_SIZES picks the
instantiations and the dispatch); variants alternate ROUNDS times in one process.

    python benchmarks/sweep_wide_cluster_sizes.py [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile, _config
from cunorm._checks import BFLOAT16
from _sweep_cli import backward_sweep, rebuild_row_norms  # benchmarks/ is the script's directory

# name: the wide cluster sizes
VARIANTS = {"v68": (2, 3, 4), "upto8": (2, 3, 4, 5, 6, 7, 8)}
ROUNDS = 2
F32, F16 = numpy.dtype(numpy.float32), numpy.dtype(numpy.float16)
CASES = [(op, dtype, n) for dtype in (BFLOAT16, F32) for op in ("layer_norm", "rms_norm")
         for n in (81920, 131072)] + [("rms_norm", F16, 100000)]
_OPTIONS = _compile.COMPILE_OPTIONS


def _use(sizes) -> None:
    _config.WIDE_CLUSTER_BWD_SIZES = sizes
    rebuild_row_norms(_OPTIONS)


def sweep(log=print) -> list[dict]:
    return backward_sweep(VARIANTS, ROUNDS, _use, VARIANTS["v68"], CASES, log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
