"""v81 (NOTES lever (e)): the wide backward's weight in float slots of shared memory after
its ring (CUNORM_WIDE_WEIGHT_SMEM=1, the default with the patch) against the weight loaded
in each pass (=0), on the wide block (8193-16384 columns, both element sizes) and its
clusters (to 65536). The host sizes the slots whatever the build, so the =0 build only
leaves them unused: it is not main before v81, whose smaller carve-out gave half-precision
LayerNorm's single block 0.04 more (NOTES "v81 against the sources before it";
ab_revisions.py compares whole revisions). Variants are builds, alternating ROUNDS times in one process.
NVRTC 13.0 sm_90 spills, loaded -> slots: float32 LayerNorm 120 -> 72 bytes, float32 RMSNorm
16 -> 60, bf16 LayerNorm 12 -> 24, bf16 RMSNorm none either way.

    python benchmarks/sweep_wide_weight_smem.py [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile
from cunorm._checks import BFLOAT16
from _sweep_cli import adding_options, backward_sweep  # benchmarks/ is the script's directory

# name: extra NVRTC options
VARIANTS = {"weight_loaded": ("-DCUNORM_WIDE_WEIGHT_SMEM=0",), "v81_weight_slots": ()}
ROUNDS = 2
CASES = [(op, dt, n) for op in ("layer_norm", "rms_norm") for dt in (BFLOAT16, numpy.dtype(numpy.float32))
         for n in (12288, 16384, 32768, 65536)]


def sweep(log=print) -> list[dict]:
    return backward_sweep(VARIANTS, ROUNDS, adding_options(_compile.COMPILE_OPTIONS), (), CASES, log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
