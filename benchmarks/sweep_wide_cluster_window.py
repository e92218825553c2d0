"""v94: the wide cluster backward of half-precision LayerNorm (rings of two rows) adding a
row's dW / dB in a pass of their own between its publish and its collect (``window``: kernels
built as by default) against v68's loop, dW / dB in the dx pass (``v68``:
``-DCUNORM_WIDE_CLUSTER_WINDOW=0``). RMSNorm's rings of three take v91's loop in both (a
control). (A level 2 that gave float32 clusters the window too, dy loaded a third time,
lost 0.06-0.10 and was taken out: results/sweep-wide-cluster-window2-v94-h200.txt.) Same
sums in the same order: outputs and gradients must equal the first build's bit
for bit (checked). Builds alternate ROUNDS times in one process; the best rounds' table comes
last.

    python benchmarks/sweep_wide_cluster_window.py [--variants v68,window] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile
from cunorm._checks import BFLOAT16
from _sweep_cli import adding_options, chosen  # benchmarks/ is the script's directory
from sweep_bwd_stage import bits_sweep

VARIANTS = {"v68": ("-DCUNORM_WIDE_CLUSTER_WINDOW=0",), "window": ()}
ROUNDS = 2
CASES = [("layer_norm", BFLOAT16, n) for n in (32768, 65536, 131072)] + \
        [("layer_norm", numpy.dtype(numpy.float16), 100000), ("rms_norm", BFLOAT16, 65536)]


def sweep(log=print, names=None) -> list[dict]:
    variants = chosen(VARIANTS, names)
    return bits_sweep(variants, ROUNDS, adding_options(_compile.COMPILE_OPTIONS), VARIANTS["window"], CASES, (),
                      ("bwd_of_copy",), log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
