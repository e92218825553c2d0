"""v70-v73: per-row instructions off the staged half-precision backward (norm_bwd, the rows of
N <= 8192 that issue 4's backward target misses most):
  v70 words   the staged x and dy tiles widened a 32-bit word at a time (CUNORM_BWD_STAGED_WORDS);
  v71 wsmem   the weight widened once into shared memory, read back each row step
              (CUNORM_BWD_WEIGHT_SMEM);
  v72 narrow  the block sums' second level as a butterfly of (warps a row) lanes
              (CUNORM_NARROW_SECOND_SUM; the forward's reductions share it, so the forward is
              timed as well);
  v73 fused_wsmem  v71 in the fused residual backward (CUNORM_FUSED_BWD_WEIGHT_SMEM);
  stats       every staged tile copies its rows' mean and rstd with its tiles
              (CUNORM_BWD_STAGE_STATS=1; StagePolicy did so for 1024-thread rows only, and
              since v74 does for rows of 128 threads or more).
Each build's gradients (and forward outputs) must equal the first build's bit for bit: none
of these changes a value or the order of a sum. Builds alternate ROUNDS times in one
process; the table of best rounds is printed last.

    python benchmarks/sweep_bwd_overhead.py [--variants base,words,...] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile
from cunorm._checks import BFLOAT16
from _sweep_cli import adding_options, chosen  # benchmarks/ is the script's directory
from sweep_bwd_stage import bits_sweep

SWITCHES = ("CUNORM_BWD_STAGED_WORDS", "CUNORM_BWD_WEIGHT_SMEM", "CUNORM_NARROW_SECOND_SUM",
            "CUNORM_FUSED_BWD_WEIGHT_SMEM")


def _build(*on: str, stats: int = -1) -> tuple:
    """NVRTC options with the named switches on and the others off; ``stats`` -1:
    StagePolicy's choice of the tiles that stage their rows' statistics, 1: every tile."""
    return tuple(f"-D{s}={int(s in on)}" for s in SWITCHES) + (f"-DCUNORM_BWD_STAGE_STATS={stats}",)


# v70-v72 against v69 (main before them), in the first sweep; then v73 (the fused backward's
# weight slots) and the statistics staged for every tile on top of v70-v72, in the second.
# Both ran when StagePolicy staged statistics for 1024-thread rows only; since v74 it does
# from 128 threads, so on these sources "base" ... "fused_wsmem" stage them there too, and
# "base" is v69 with v74.
VARIANTS = {
    "base": _build(),
    "words": _build("CUNORM_BWD_STAGED_WORDS"),
    "wsmem": _build("CUNORM_BWD_WEIGHT_SMEM"),
    "narrow": _build("CUNORM_NARROW_SECOND_SUM"),
    "all": _build(*SWITCHES[:3]),
    "fused_wsmem": _build(*SWITCHES),
    "stats": _build(*SWITCHES[:3], stats=1),
}
ROUNDS = 2
CASES = [(op, BFLOAT16, n) for op in ("layer_norm", "rms_norm") for n in (512, 1024, 2048, 4096, 8192)] + \
        [("layer_norm", numpy.dtype(numpy.float32), n) for n in (1024, 4096)]
FUSED_ROW_LENGTHS = (2048, 4096, 8192)


def sweep(log=print, names=None) -> list[dict]:
    variants = chosen(VARIANTS, names)
    return bits_sweep(variants, ROUNDS, adding_options(_compile.COMPILE_OPTIONS), (), CASES,
                      FUSED_ROW_LENGTHS, ("fwd_of_copy", "bwd_of_copy", "fused_residual_bwd_of_copy"), log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
