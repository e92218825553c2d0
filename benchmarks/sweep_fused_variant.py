"""Builds of the fused forward (kernels/layer_norm_fused.cu) on the GPU check's fused rows
(``cunorm._bench_fused``: residual forward and backward, FP8 out with amax), alternating
the builds ROUNDS times in one process so drift shows as the spread within each: v76, bf16
weight and bias (and x, residual) widened a 32-bit word at a time (``-DCUNORM_FUSED_FWD_WORDS``
2 / 3), against v75 (0); the default is 2 since. v60 compared half-precision LayerNorm statistics in one pass (the
default) with two (``-DCUNORM_FUSED_ONE_PASS=0``); v59 compared the FP8 weight in shared memory
(experiments/v59-fp8-weight-smem.patch), v58 the scale folded into the row's rstd
(``-DCUNORM_FP8_FOLD_SCALE=0``). v45 measured its launch bounds this way
(results/sweep-fused-v45-h200.txt), v28 the output-loop variants, v56 parameter loads
(commit c573cb0 of this script checks outputs bit for bit as well).

    python benchmarks/sweep_fused_variant.py [--json out.json]
"""
from __future__ import annotations

from cunorm import _bench, _bench_fused, _compile
from _sweep_cli import rebuild_row_norms  # benchmarks/ is the script's directory

VARIANTS = {"v75": ("-DCUNORM_FUSED_FWD_WORDS=0",), "params_words": (), "all_words": ("-DCUNORM_FUSED_FWD_WORDS=3",)}
ROUNDS = 2


def sweep(log=print) -> list[dict]:
    default, rows = _compile.COMPILE_OPTIONS, []
    copy = _bench.copy_gbps()
    try:
        for round_ in range(ROUNDS):
            for name, options in VARIANTS.items():
                rebuild_row_norms(options)
                log(f"-- {name} (round {round_ + 1})")
                rows += [dict(row, variant=name, round=round_ + 1) for row in _bench_fused.run(copy, log)]
    finally:
        rebuild_row_norms(default)
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
