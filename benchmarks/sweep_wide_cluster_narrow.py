"""v99: the wide cluster backward's blocks of 8192 columns (x and dy both staged, 16 dW / dB
accumulators a thread) for rows up to 65536 elements, against v68 / v93's blocks of 16384
(float32: x staged, dy loaded in both passes, 32 accumulators). Twice the blocks a row; the
narrow ring holds two or three rows (three take v91's pipelined loop). ``half-`` variants
give half precision the narrow blocks too (its LayerNorm rows to 65536, RMSNorm's past the
single wide block's 32768); ``from8193`` clusters rows of 8193-16384 too (two narrow blocks
instead of one wide block); ``wide-d3`` gives the float32 blocks of 16384 columns (rows past
65536) three rows without weight slots. Sums fold in another grouping, so bits differ:
values are the GPU tests' business. Builds alternate ROUNDS times in one process.

    python benchmarks/sweep_wide_cluster_narrow.py [--variants v93,narrow-d2,...] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _compile, _config
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm
from _sweep_cli import backward_sweep, chosen, rebuild_row_norms  # benchmarks/ is the script's directory

F32 = numpy.dtype(numpy.float32)
FP32_NARROW, HALF_NARROW = _config.TileConfig(4, 2, 1024), _config.TileConfig(8, 1, 1024)
V93_FROM = {(2, False): 16385, (2, True): 32769, (4, False): 16385, (4, True): 16385}
FROM_8193 = {**V93_FROM, (2, False): 8193, (4, False): 8193, (4, True): 8193}
FP32_FROM_8193 = {**V93_FROM, (4, False): 8193, (4, True): 8193}
# name: ({element size: narrow tile}, the narrow ring's rows, {element size: the shortest
# clustered row}, every wide ring's rows (_row_norm.WIDE_DEPTH; None: _config's))
VARIANTS = {"v93": ({}, 2, V93_FROM, None), "narrow-d2": ({4: FP32_NARROW}, 2, V93_FROM, None),
            "narrow-d3": ({4: FP32_NARROW}, 3, V93_FROM, None),
            "half-d2": ({2: HALF_NARROW, 4: FP32_NARROW}, 2, V93_FROM, None),
            "half-d3": ({2: HALF_NARROW, 4: FP32_NARROW}, 3, V93_FROM, None),
            "from8193-d2": ({2: HALF_NARROW, 4: FP32_NARROW}, 2, FROM_8193, None),
            "from8193-d3": ({4: FP32_NARROW}, 3, FP32_FROM_8193, None),
            "wide-d3": ({4: FP32_NARROW}, 3, V93_FROM, 3)}
ROUNDS = 2
# the first round's cases (v99, the first sweep: variants v93 to from8193-d2), then the
# second's (from8193-d3 and wide-d3 against narrow-d3)
FIRST = [(op, F32, n) for op in ("layer_norm", "rms_norm") for n in (16384, 24576, 32768, 65536)] + \
        [("layer_norm", BFLOAT16, n) for n in (16384, 32768, 65536)] + [("rms_norm", BFLOAT16, 65536)]
SECOND = [(op, F32, n) for op in ("layer_norm", "rms_norm") for n in (9216, 12288, 16384, 98304, 131072)]
DEFAULT = "narrow-d3"


def _use(variant) -> None:
    narrow, depth, from_, wide_depth = variant
    _config.WIDE_CLUSTER_BWD_NONPORTABLE_TO = 0  # as the sweeps ran, before v100
    _config.WIDE_CLUSTER_BWD_NARROW, _config.WIDE_CLUSTER_BWD_NARROW_DEPTH = narrow, depth
    _config.WIDE_CLUSTER_BWD_FROM, _row_norm.WIDE_DEPTH = from_, wide_depth
    rebuild_row_norms(_compile.COMPILE_OPTIONS)


def _first_runs(name, op, dtype, n) -> bool:
    if n <= 16384:  # the single wide block's unless a variant clusters it
        return name in ("v93", "from8193-d2")
    return dtype == F32 or name.startswith("half") or name == "v93"


def _second_runs(name, op, dtype, n) -> bool:
    return name == DEFAULT or (name == "wide-d3") == (n > 65536)


def sweep(log=print, names=None) -> list[dict]:
    variants = chosen(VARIANTS, names)
    second = set(variants) <= {"narrow-d3", "from8193-d3", "wide-d3"}
    cases, runs = (SECOND, _second_runs) if second else (FIRST, _first_runs)
    return backward_sweep(variants, ROUNDS, _use, VARIANTS[DEFAULT], cases, log, runs)


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
