"""v113: LayerNorm forward rows whose pivot lies far from their mean taken again about pivot +
mu (common.cuh pivot_far; ``repivot``, kernels built as by default) against builds without
the check (``repivot_off``: ``-DCUNORM_REPIVOT=0``). The benchmark's rows are N(0, 1): a row
re-pivots about once in 16000, so the sweep measures what the check and the loop around the
statistics cost the hot path (the register tiles gained 4-8 registers, NVRTC 13.0 sm_90); the
split path's tiles about their own pivots and the finalize in double are in both builds.
RMSNorm is the control (no pivot). Builds alternate ROUNDS times (SWEEP_ROUNDS, default 2);
the best rounds' table last.

    python benchmarks/sweep_repivot.py [--variants repivot_off,repivot] [--json out.json]
"""
from __future__ import annotations

import os

import numpy

from cunorm import _compile
from cunorm._checks import BFLOAT16
from _sweep_cli import adding_options, chosen, pass_sweep  # benchmarks/ is the script's directory

VARIANTS = {"repivot_off": ("-DCUNORM_REPIVOT=0",), "repivot": ()}
ROUNDS = int(os.environ.get("SWEEP_ROUNDS", "2"))
F32 = numpy.dtype(numpy.float32)
CASES = [("layer_norm", F32, n) for n in (512, 2048, 8192, 16384, 32768, 131072, 1048576)] + \
        [("layer_norm", BFLOAT16, n) for n in (1024, 4096, 65536)] + [("rms_norm", F32, 4096)]


def sweep(log=print, names=None) -> list[dict]:
    variants = chosen(VARIANTS, names)
    return pass_sweep(variants, ROUNDS, adding_options(_compile.COMPILE_OPTIONS), VARIANTS["repivot"], CASES,
                      ("fwd",), log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
