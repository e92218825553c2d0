"""After v100 (next-session candidate (i)): rows of 131073-262144 elements in non-portable
clusters of 9-16 of v93's 16384-column wide blocks (half precision: x and dy staged, two rows;
float32: x staged, dy loaded in both passes) against the grid rows that take them now. The
dispatcher's cluster config is widened in this process only (``wide16``); the host's
occupancy query and fallback are v100's. Speed only: the GPU tests have not run these
clusters. Builds alternate ROUNDS times in one process.

    python benchmarks/sweep_wide_cluster_past_131072.py [--variants grid,wide16] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile, _config
from cunorm._checks import BFLOAT16
from _sweep_cli import backward_sweep, chosen, rebuild_row_norms  # benchmarks/ is the script's directory

_CONFIG = _config.wide_cluster_bwd_config


def _up_to_16_wide_blocks(n, vec, itemsize, rms=False, nonportable=False):
    cfg = _CONFIG(n, vec, itemsize, rms, nonportable)
    tiles = _config.wide_cluster_bwd_tiles(itemsize)
    if cfg is not None or not nonportable or not tiles or tiles[-1].vec != vec:
        return cfg
    t = tiles[-1]
    blocks = -(-n // t.tile)
    return _config.ClusterConfig(t.vec, t.packs, t.tpr, blocks) if 9 <= blocks <= 16 else None


# name: the dispatcher's wide cluster config
VARIANTS = {"grid": _CONFIG, "wide16": _up_to_16_wide_blocks}
ROUNDS = 2
CASES = [(op, dtype, n) for dtype in (BFLOAT16, numpy.dtype(numpy.float32)) for op in ("layer_norm", "rms_norm")
         for n in (163840, 262144)]


def _use(config) -> None:
    _config.wide_cluster_bwd_config = config
    rebuild_row_norms(_compile.COMPILE_OPTIONS)


def sweep(log=print, names=None) -> list[dict]:
    from cunorm.ops import _row_norm

    for dtype in (BFLOAT16, numpy.dtype(numpy.float32)):  # which kernel each variant takes
        for config in VARIANTS.values():
            _use(config)
            p = _row_norm.backward_plan((256, 262144), (262144, 1), (262144, 1), dtype, dtype, dtype, 1, False,
                                        0, 0, 0)
            log(f"{dtype.name} 262144: blocks {p.blocks} groups {p.groups} grid rows {p.grid_rows is not None}")
    return backward_sweep(chosen(VARIANTS, names), ROUNDS, _use, _CONFIG, CASES, log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
