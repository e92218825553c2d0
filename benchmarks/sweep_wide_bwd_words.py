"""v69: the wide backward's bf16 packs widened a 32-bit word at a time (CUNORM_WIDE_BF16_WORDS)
against v68 as merged, on the wide block (bf16 8193-16384, RMSNorm to 32768) and its clusters
(bf16 to 65536). Variants are builds (NVRTC options), alternating ROUNDS times in one process.

    python benchmarks/sweep_wide_bwd_words.py [--json out.json]
"""
from __future__ import annotations

from cunorm import _compile
from cunorm._checks import BFLOAT16
from _sweep_cli import adding_options, backward_sweep  # benchmarks/ is the script's directory

# name: extra NVRTC options
VARIANTS = {"v68": (), "v69_words": ("-DCUNORM_WIDE_BF16_WORDS=1",)}
ROUNDS = 2
CASES = [("layer_norm", BFLOAT16, n) for n in (16384, 32768)] + \
        [("rms_norm", BFLOAT16, n) for n in (32768, 65536)]


def sweep(log=print) -> list[dict]:
    return backward_sweep(VARIANTS, ROUNDS, adding_options(_compile.COMPILE_OPTIONS), (), CASES, log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
