"""Two changes of the twenty-eighth session, each against the build before it, alternating
ROUNDS times in one process:

- v96: half-precision LayerNorm's single wide block (rows of 8193-16384) adds a row's dW /
  dB between the block sums' warp partials and their barrier, with one barrier a row
  (``-DCUNORM_WIDE_WINDOW=0``: v68's loop). Parked: apply
  ``experiments/v96-wide-block-window.patch`` first (without it both builds run v68's loop).
  Same sums in the same order: backward outputs must equal the first build's bit for bit
  (checked); RMSNorm 16384 is a control.
- v95 (``no_pivot``): the FP8 LayerNorm forward's one pass sums x itself instead of x minus
  the row's first element (``-DCUNORM_FUSED_ONE_PASS_PIVOT=1``: v60's pivot). Not bit-equal
  (the statistics round differently); the FP8 rows of the GPU check's fused benchmark.

    python benchmarks/sweep_window_pivot.py [--variants before,after] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile
from cunorm._checks import BFLOAT16
from _sweep_cli import adding_options, chosen, fused_rows  # benchmarks/ is the script's directory
from sweep_bwd_stage import bits_sweep

VARIANTS = {"before": ("-DCUNORM_WIDE_WINDOW=0", "-DCUNORM_FUSED_ONE_PASS_PIVOT=1"), "after": ()}
ROUNDS = 2
CASES = [("layer_norm", BFLOAT16, n) for n in (9216, 12288, 16384)] + \
        [("layer_norm", numpy.dtype(numpy.float16), 16384), ("rms_norm", BFLOAT16, 16384)]


def sweep(log=print, names=None) -> list[dict]:
    return bits_sweep(chosen(VARIANTS, names), ROUNDS, adding_options(_compile.COMPILE_OPTIONS), VARIANTS["after"], CASES,
                      (), ("bwd_of_copy", "fp8_of_copy"), log, extra=fused_rows)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
