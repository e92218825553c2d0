"""v100: float32 rows of 65537-131072 elements in non-portable clusters of 9-16 of v99's
narrow blocks (8192 columns, x and dy staged, three rows in the ring), against v93's clusters
of 5-8 blocks of 16384 columns (x staged, dy loaded in both passes, two rows). Builds
alternate ROUNDS times in one process; the best rounds' table comes last.

    python benchmarks/sweep_wide_cluster_nonportable.py [--variants v93,v100] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile, _config
from _sweep_cli import backward_sweep, chosen, rebuild_row_norms  # benchmarks/ is the script's directory

# name: _config.WIDE_CLUSTER_BWD_NONPORTABLE_TO
VARIANTS = {"v93": 0, "v100": 131072}
ROUNDS = 2
CASES = [(op, numpy.dtype(numpy.float32), n) for op in ("layer_norm", "rms_norm") for n in (73728, 98304, 131072)]


def _use(to: int) -> None:
    _config.WIDE_CLUSTER_BWD_NONPORTABLE_TO = to
    rebuild_row_norms(_compile.COMPILE_OPTIONS)


def sweep(log=print, names=None) -> list[dict]:
    return backward_sweep(chosen(VARIANTS, names), ROUNDS, _use, VARIANTS["v100"], CASES, log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
