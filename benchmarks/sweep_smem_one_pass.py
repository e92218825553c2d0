"""v98: half-precision LayerNorm's shared-memory forward (rows of 512-32768) taking its
statistics in one pass over x (``v98``: kernels built as by default), against v26's two
passes (``v97``: ``-DCUNORM_FWD_SMEM_ONE_PASS=0 -DCUNORM_UNIFORM_ANY=0``, main before v98).
v98 needs group_sum2_any's answer through a warp vote (``CUNORM_UNIFORM_ANY``: without it the
one pass's branch spilled at 32 registers); ``vote_only`` has the vote and the two passes, so
the fused FP8 forward's share of the vote shows (its rows come from the GPU check's fused
benchmark). Not bit-equal (the statistics round differently); the tests hold both to the
float64 reference. RMSNorm 4096 is the same code in every build (a control). Builds alternate
ROUNDS times in one process; the best rounds' table comes last.

    python benchmarks/sweep_smem_one_pass.py [--variants v97,vote_only,v98] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile
from cunorm._checks import BFLOAT16
from _sweep_cli import adding_options, chosen, fused_rows, pass_sweep  # benchmarks/ is the script's directory

VARIANTS = {
    "v97": ("-DCUNORM_FWD_SMEM_ONE_PASS=0", "-DCUNORM_UNIFORM_ANY=0"),
    "vote_only": ("-DCUNORM_FWD_SMEM_ONE_PASS=0",),
    "v98": (),
}
ROUNDS = 2
CASES = [("layer_norm", BFLOAT16, n) for n in (512, 1024, 2048, 4096, 8192, 16384, 32768)] + \
        [("layer_norm", numpy.dtype(numpy.float16), 4096), ("rms_norm", BFLOAT16, 4096)]


def sweep(log=print, names=None) -> list[dict]:
    return pass_sweep(chosen(VARIANTS, names), ROUNDS, adding_options(_compile.COMPILE_OPTIONS), VARIANTS["v98"], CASES,
                      ("fwd",), log, extra=fused_rows, extra_keys=("fp8_of_copy",))


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
