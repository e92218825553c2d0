"""v67: the wide backward's dy loads through the L2 only (CUNORM_WIDE_DY_PAST_L1), at each
ring depth, against v66 as merged (plain loads, the depth policy), on the tiles that load dy
in each pass: half-precision RMSNorm rows of 16385-32768 and float32 rows of 8193-16384.
Variants are builds (NVRTC options) and the host's WIDE_DEPTH, alternating ROUNDS times in
one process.

    python benchmarks/sweep_wide_bwd_dy.py [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm
from _sweep_cli import backward_sweep, rebuild_row_norms  # benchmarks/ is the script's directory

PAST_L1 = ("-DCUNORM_WIDE_DY_PAST_L1=1",)
# name: (extra NVRTC options, WIDE_DEPTH)
VARIANTS = {"v66": ((), None), "v67_depth2": (PAST_L1, 2), "v67_depth3": (PAST_L1, 3)}
ROUNDS = 2
CASES = (("rms_norm", BFLOAT16, 32768), ("rms_norm", numpy.dtype(numpy.float32), 16384),
         ("layer_norm", numpy.dtype(numpy.float32), 16384))


def sweep(log=print) -> list[dict]:
    base = _compile.COMPILE_OPTIONS

    def use(choice):
        options, depth = choice
        rebuild_row_norms((*base, *options))
        _row_norm.WIDE_DEPTH = depth

    return backward_sweep(VARIANTS, ROUNDS, use, ((), None), CASES, log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
