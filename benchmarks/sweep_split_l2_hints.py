"""v118: the split forward's apply pass (rows past the clusters: N = 524288 and 1M in the
benchmark's 64 Mi elements) loading x and storing y with .cs, so that the tiles the
statistics pass read last (which the apply, walking last to first since v33, reads first)
stay in L2 until it reaches them; against loads alone and against plain loads and stores
(CUNORM_SPLIT_L2_HINTS 2 / 1 / 0), forward, bf16 and float32, both ops. Builds alternate
ROUNDS times in one process. With the BatchNorm v58 patch (same file).

    python benchmarks/sweep_split_l2_hints.py [--variants hints,loads_only,...] [--json out.json]
"""
from __future__ import annotations

from cunorm import _compile
from _sweep_cli import adding_options, pass_sweep, row_norm_cases  # benchmarks/ is the script's directory

VARIANTS = {"hints": (), "loads_only": ("-DCUNORM_SPLIT_L2_HINTS=1",), "hints_off": ("-DCUNORM_SPLIT_L2_HINTS=0",)}
ROUNDS = 2
CASES = list(row_norm_cases((524288, 1 << 20)))


def sweep(log=print, names=None) -> list[dict]:
    variants = {k: v for k, v in VARIANTS.items() if names is None or k in names}
    return pass_sweep(variants, ROUNDS, adding_options(_compile.COMPILE_OPTIONS), (), CASES, ("fwd",), log)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
