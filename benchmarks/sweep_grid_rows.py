"""v79: the grid-row kernels (kernels/layer_norm_grid.cu: the whole grid on a few rows a step,
x and dy read once) against the split path they replace, forward and backward, bf16 and
float32, LayerNorm and RMSNorm at N = 131072 / 262144 / 1M (the benchmark's M: 64 Mi
elements). v79b's row groups, four rows a group a step forward and two backward in a ring of
three steps, the barrier's wait one step after the arrival (its sweep's best, against half
the rows a step in a ring of six, lag 2 or 3: results/sweep-grid-rows-v79b-h200.txt);
against it v79d, the rows' saved statistics (backward) and pivots (forward) staged beside
the packs (CUNORM_GRID_STAGE_SIDE=1), in the same ring and in steps of six / three rows in a
ring of two without lag. Prediction: v79d +0.05-0.10 backward (two L2 round trips of a
~5 us step chain), LayerNorm forward +0.1 (three of them), RMSNorm forward unchanged. The
variants alternate ROUNDS times in one process (each variant compiles its own kernels).
Outcome (results/sweep-grid-rows-v79d-h200.txt): v79d's side words win every backward
(+0.01-0.07) and the LayerNorm forward at 262144 (+0.09), and are the default since.

    python benchmarks/sweep_grid_rows.py [--json out.json]
"""
from __future__ import annotations

from cunorm import _compile, _config
from cunorm.ops import _grid_rows
from _sweep_cli import pass_sweep, rebuild_row_norms, row_norm_cases  # benchmarks/ is the script's directory

# name: (grid rows on, rows a row group takes a step forward / backward, ring depth, lag,
# CUNORM_GRID_STAGE_SIDE)
VARIANTS = {"split": (False, 4, 2, 3, 1, 0), "v79b_rg4_d3_lag1": (True, 4, 2, 3, 1, 0),
            "v79d_side": (True, 4, 2, 3, 1, 1), "v79d_side_rg6_d2_lag0": (True, 6, 3, 2, 0, 1)}
DEFAULT = (True, 4, 2, 3, 1, 1)  # v79d took the side words on
ROUNDS = 2
CASES = list(row_norm_cases((131072, 262144, 1 << 20)))


def _use(variant) -> None:
    _grid_rows.USE_GRID_ROWS, fwd_rows, bwd_rows, _config.GRID_DEPTH, _config.GRID_LAG, side = variant
    _config.GRID_STEP_ROWS = {False: fwd_rows, True: bwd_rows}
    _config.GRID_SERVES = {False: (2, 4), True: (2, 4)}  # every pass, so each variant is measured on all
    rebuild_row_norms((*_BASE_OPTIONS, f"-DCUNORM_GRID_STAGE_SIDE={side}"))  # the plans with it


_BASE_OPTIONS = _compile.COMPILE_OPTIONS


def sweep(log=print) -> list[dict]:
    return pass_sweep(VARIANTS, ROUNDS, _use, DEFAULT, CASES, ("fwd", "bwd"), log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
