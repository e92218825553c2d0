"""v109: the half-precision wide cluster backward in blocks of 512 threads and 8192 columns,
two an SM, against v93's 1024-thread blocks of 16384 columns, one an SM.

Why: ncu on main (thirty-third session, bf16 LayerNorm 65536, norm_bwd_wide_cluster
<bf16, bf16, LN, 3, 16384, 4>): 38 thread instructions an element, issue active ~60% of
cycles; stalls not_selected 33%, barrier 19% (the block-sum barrier alone 10%), short
scoreboard 10%; v108's two fewer instructions an element measured level, so the idle SM at
each barrier and exchange, more than issue, was the suspect. A second resident block works
while one waits.

Variants (``_config`` switches, no NVRTC option): ``main`` (no such blocks), ``v109`` (the
rule as parked: rows with float32 parameters only, WIDE_CLUSTER_BWD_HALF_FLOAT_PARAMS), and
the first sweep's, every half-precision row in these blocks: ``all-d3`` (three rows in the
ring, the weight loaded each pass: three rows and half slots overshoot half an SM by the
host's 2 KiB static reserve), ``all-d2`` (two rows and the weight's slots), ``all-d3-16k``
(all-d3, and rows of 8193-16384 as clusters of two such blocks instead of the single wide
block). CASES: rows with float32 parameters (where all-d2 gained), and two rows with
parameters in x's dtype that v109 leaves alone; ``--first``: the first sweep's cases
(parameters in x's dtype but one). Each variant's first round checks dx / dW / dB of four
shapes against the float64 reference, with the block size each took
(_sweep_cli.backward_checks). Results: results/sweep-wide-cluster-half-
blocks-v109-h200.txt (the first two sweeps ran all-d3 / all-d2 / all-d3-16k as v109-d3 /
v109-d2 / v109-d3-16k, and all-d2 with float32 parameters as the rule v109 keeps).

    python benchmarks/sweep_wide_cluster_half_blocks_v109.py [--first] [--variants ...] [--json out.json]
"""
from __future__ import annotations

import sys

import numpy

from cunorm import _compile, _config
from cunorm._checks import BFLOAT16
from _sweep_cli import backward_checks, chosen, config_builds  # benchmarks/ is the script's directory

F16, F32 = numpy.dtype(numpy.float16), numpy.dtype(numpy.float32)
FP32_NARROW, HALF_NARROW = _config.TileConfig(4, 2, 1024), _config.TileConfig(8, 2, 512)
MAIN_FROM = dict(_config.WIDE_CLUSTER_BWD_FROM)
FROM_8193 = {**MAIN_FROM, (2, False): 8193, (2, True): 8193}
NAMES = ("WIDE_CLUSTER_BWD_NARROW", "WIDE_CLUSTER_BWD_NARROW_DEPTH", "WIDE_CLUSTER_BWD_FROM",
         "WIDE_CLUSTER_BWD_HALF_FLOAT_PARAMS")
VARIANTS = {"main": ((), {4: FP32_NARROW}, 3, MAIN_FROM, None),
            "v109": ((), {4: FP32_NARROW}, 3, MAIN_FROM, HALF_NARROW),
            "all-d3": ((), {4: FP32_NARROW, 2: HALF_NARROW}, 3, MAIN_FROM, None),
            "all-d2": ((), {4: FP32_NARROW, 2: HALF_NARROW}, 2, MAIN_FROM, None),
            "all-d3-16k": ((), {4: FP32_NARROW, 2: HALF_NARROW}, 3, FROM_8193, None)}
ROUNDS = 2
FIRST_CASES = [("layer_norm", BFLOAT16, n) for n in (16384, 32768, 65536, 131072)] + \
    [("rms_norm", BFLOAT16, n) for n in (32768, 65536, 131072)] + \
    [("layer_norm", F16, 65536), ("rms_norm", BFLOAT16, 65536, F32)]
CASES = [("rms_norm", BFLOAT16, n, F32) for n in (24576, 32768, 65536, 131072)] + \
    [("layer_norm", BFLOAT16, n, F32) for n in (32768, 65536, 131072)] + [("rms_norm", F16, 65536, F32)] + \
    [("layer_norm", BFLOAT16, 32768), ("rms_norm", BFLOAT16, 65536)]
# (op, dtype, rows, N, weight dtype) checked against the reference in each variant's first round
CHECKS = [("layer_norm", BFLOAT16, 37, 32768, BFLOAT16), ("layer_norm", BFLOAT16, 40, 131072, BFLOAT16),
          ("rms_norm", F16, 41, 65536, F32), ("layer_norm", BFLOAT16, 9, 16384, BFLOAT16)]


def sweep(log=print, names=None) -> list[dict]:
    from _sweep_cli import pass_sweep

    cases = FIRST_CASES if FIRST else CASES
    return pass_sweep(chosen(VARIANTS, names), ROUNDS, config_builds(_compile.COMPILE_OPTIONS, *NAMES),
                      VARIANTS["main"], cases, ("bwd",), log, extra=backward_checks(CHECKS, log))


FIRST = False

if __name__ == "__main__":
    from _sweep_cli import main

    if "--first" in sys.argv:
        sys.argv.remove("--first")
        FIRST = True

    main(sweep, __doc__, VARIANTS)
