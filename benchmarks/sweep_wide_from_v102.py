"""v102 (two host-side knobs of the wide backward, after v101): ``rms-clusters`` gives
half-precision RMSNorm rows of 16385-32768 to the wide clusters (two blocks of 16384 columns,
x and dy staged, a ring of three rows and v101's half-precision weight slots) instead of
v66's single block of 32768 columns (x staged, dy loaded in both passes), as LayerNorm's
rows there have taken since v68; ``ln-d3`` gives half-precision LayerNorm's single wide
block three rows in its ring (v63 measured two better, before v69-v83 changed that kernel).
Variants alternate ROUNDS times in one process.

    python benchmarks/sweep_wide_from_v102.py [--variants main,rms-clusters,ln-d3] [--json out.json]
"""
from __future__ import annotations

from cunorm import _compile, _config
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm
from _sweep_cli import backward_sweep, chosen, rebuild_row_norms  # benchmarks/ is the script's directory

MAIN_FROM = dict(_config.WIDE_CLUSTER_BWD_FROM)
# name: ({(element size, RMSNorm): the shortest clustered row}, every wide ring's rows (None: _config's))
VARIANTS = {"main": (MAIN_FROM, None), "rms-clusters": ({**MAIN_FROM, (2, True): 16385}, None),
            "ln-d3": (MAIN_FROM, 3)}
ROUNDS = 2
CASES = [("rms_norm", BFLOAT16, n) for n in (20480, 24576, 32768)] + \
        [("layer_norm", BFLOAT16, n) for n in (9216, 12288, 16384)]


def _use(variant) -> None:
    _config.WIDE_CLUSTER_BWD_FROM, _row_norm.WIDE_DEPTH = variant
    rebuild_row_norms(_compile.COMPILE_OPTIONS)


def _runs(name, op, dtype, n) -> bool:
    """Each variant on the rows it changes; main on all."""
    return name == "main" or (name == "rms-clusters") == (op == "rms_norm")


def sweep(log=print, names=None) -> list[dict]:
    return backward_sweep(chosen(VARIANTS, names), ROUNDS, _use, VARIANTS["main"], CASES, log, _runs)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
