"""v79: the grid-row kernels (kernels/layer_norm_grid.cu: the whole grid on a few rows a step,
x and dy read once) against the split path they replace, forward and backward, bf16 and
float32, LayerNorm and RMSNorm at N = 131072 / 262144 / 1M (the benchmark's M: 64 Mi
elements). v79b's row groups, four rows a group a step forward and two backward in a ring of
three steps, the barrier's wait one step after the arrival (its first sweep's best, against
half the rows a step in a ring of six, lag 2 or 3: results/sweep-grid-rows-v79b-h200.txt),
against the same ring with no lag (two steps in flight instead of one), and steps of six /
three rows in a ring of two. The variants alternate ROUNDS times in one process (Python
switches; each variant compiles its own kernels).

    python benchmarks/sweep_grid_rows.py [--json out.json]
"""
from __future__ import annotations

from cunorm import _config
from cunorm.ops import _grid_rows, _row_norm
from _sweep_cli import pass_sweep, row_norm_cases  # benchmarks/ is the script's directory

# name: (grid rows on, rows a row group takes a step forward / backward, ring depth, lag)
VARIANTS = {"split": (False, 4, 2, 3, 1), "v79b_rg4_d3_lag1": (True, 4, 2, 3, 1),
            "v79c_rg4_d3_lag0": (True, 4, 2, 3, 0), "v79c_rg6_d2_lag0": (True, 6, 3, 2, 0)}
DEFAULT = (True, 4, 2, 3, 1)
ROUNDS = 2
CASES = list(row_norm_cases((131072, 262144, 1 << 20)))


def _use(variant) -> None:
    _grid_rows.USE_GRID_ROWS, fwd_rows, bwd_rows, _config.GRID_DEPTH, _config.GRID_LAG = variant
    _config.GRID_STEP_ROWS = {False: fwd_rows, True: bwd_rows}
    _config.GRID_SERVES = {False: (2, 4), True: (2, 4)}  # every pass, so each variant is measured on all
    for cache in (_grid_rows.grid_plan, _row_norm._forward_kernels, _row_norm.forward_plan,
                  _row_norm.backward_plan):
        cache.cache_clear()


def sweep(log=print) -> list[dict]:
    return pass_sweep(VARIANTS, ROUNDS, _use, DEFAULT, CASES, ("fwd", "bwd"), log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
