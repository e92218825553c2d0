"""v108: the half-precision wide clusters' dx pass where v94's window adds dW apart (RMSNorm
with a float32 weight, v104) computes dx = rstd * w * dy + x * a, a = -rstd^2 m2 the row's
constant, instead of through xhat (kernels/row_norm.cuh write_dx). As parked, the form also
served LayerNorm's window (x * a + b, b = -mean a - rstd m1; setting 2 also its passes that
add dW / dB): results/sweep-wide-dx-affine-v108-h200.txt measured LayerNorm -0.001 (-0.004 with
setting 2) at 16384-131072 and RMSNorm +0.009 / +0.014 at 24576 / 65536, so it landed for
RMSNorm alone. This sweep compares the landed form with dx through xhat
(``-DCUNORM_WIDE_DX_AFFINE=0``); LayerNorm bf16 32768 and RMSNorm bf16 65536 with a bf16
weight (v91's pipelined ring) are controls the switch does not reach; each variant's first
round checks v108's path against the float64 reference (_sweep_cli.backward_checks). Builds
alternate ROUNDS times in one process; backward of copy.

    python benchmarks/sweep_wide_dx_affine_v108.py [--variants main,v108] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile
from cunorm._checks import BFLOAT16
from _sweep_cli import adding_options, backward_checks, chosen, pass_sweep  # benchmarks/ is the script's directory

F16, F32 = numpy.dtype(numpy.float16), numpy.dtype(numpy.float32)
VARIANTS = {"main": ("-DCUNORM_WIDE_DX_AFFINE=0",), "v108": ()}
ROUNDS = 2
CASES = [("rms_norm", BFLOAT16, n, F32) for n in (24576, 65536, 131072)] + [("rms_norm", F16, 65536, F32)] + \
        [("layer_norm", BFLOAT16, 32768), ("rms_norm", BFLOAT16, 65536)]
# v108's path (half-precision RMSNorm with a float32 weight in the clusters) against the
# float64 reference in each variant's first round
CHECKS = [("rms_norm", BFLOAT16, 37, 65536, F32), ("rms_norm", F16, 23, 24576, F32)]


def sweep(log=print, names=None) -> list[dict]:
    return pass_sweep(chosen(VARIANTS, names), ROUNDS, adding_options(_compile.COMPILE_OPTIONS), (), CASES,
                      ("bwd",), log, extra=backward_checks(CHECKS, log))


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
