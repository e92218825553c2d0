"""v103: the wide backward's first pass with the row's rstd multiplied into each thread's sum
once instead of into every element's xhat (``-DCUNORM_WIDE_FOLD_RSTD``; ``v102``: 0, the loop
before it; ``v103``: 1, the default), in the single wide block and the wide clusters, every
dtype. The sweep (results/sweep-wide-fold-v103-h200.txt) ran a build that folded RMSNorm's
too; RMSNorm lost with it and the patch (experiments/v103-wide-fold-rstd.patch) folds
LayerNorm's alone. Sums round in another order, so bits differ: values are the GPU tests'
business. Builds alternate ROUNDS times in one process.

    python benchmarks/sweep_wide_fold_v103.py [--variants v102,v103] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile
from cunorm._checks import BFLOAT16
from _sweep_cli import adding_options, backward_sweep, chosen  # benchmarks/ is the script's directory

# name: NVRTC options added to the defaults
VARIANTS = {"v102": ("-DCUNORM_WIDE_FOLD_RSTD=0",), "v103": ("-DCUNORM_WIDE_FOLD_RSTD=1",)}
ROUNDS = 2
F32 = numpy.dtype(numpy.float32)
CASES = [(op, BFLOAT16, n) for op in ("layer_norm", "rms_norm") for n in (12288, 16384, 32768, 65536, 131072)] + \
        [(op, F32, n) for op in ("layer_norm", "rms_norm") for n in (9216, 16384, 65536)]


def sweep(log=print, names=None) -> list[dict]:
    return backward_sweep(chosen(VARIANTS, names), ROUNDS, adding_options(_compile.COMPILE_OPTIONS), (), CASES, log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
