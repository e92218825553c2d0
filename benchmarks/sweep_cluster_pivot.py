"""v97: the half-precision LayerNorm cluster forward's one pass sums x itself and takes the
mean off inside y's multiply-add (``no_pivot``: kernels built as by default) against v50's
pivot, the row's first element (``pivot``: ``-DCUNORM_CLUSTER_FWD_PIVOT=1``). Not bit-equal
(the statistics and y round differently; the tests hold both to the float64 reference).
RMSNorm and float32 LayerNorm are the same code in both builds (controls). Builds alternate
ROUNDS times in one process; the best rounds' table comes last.

    python benchmarks/sweep_cluster_pivot.py [--variants pivot,no_pivot] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile
from cunorm._checks import BFLOAT16
from _sweep_cli import adding_options, chosen, pass_sweep  # benchmarks/ is the script's directory

VARIANTS = {"pivot": ("-DCUNORM_CLUSTER_FWD_PIVOT=1",), "no_pivot": ()}
ROUNDS = 2
CASES = [("layer_norm", BFLOAT16, n) for n in (32768, 65536, 131072, 262144)] + \
        [("layer_norm", numpy.dtype(numpy.float16), 65536), ("rms_norm", BFLOAT16, 65536),
         ("layer_norm", numpy.dtype(numpy.float32), 65536)]


def sweep(log=print, names=None) -> list[dict]:
    variants = chosen(VARIANTS, names)
    return pass_sweep(variants, ROUNDS, adding_options(_compile.COMPILE_OPTIONS), VARIANTS["no_pivot"], CASES,
                      ("fwd",), log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
