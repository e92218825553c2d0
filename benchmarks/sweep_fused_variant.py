"""Builds of the fused forward (kernels/layer_norm_fused.cu) on the GPU check's fused rows
(``cunorm._bench_fused``: residual forward and backward, FP8 out with amax), alternating
the builds ROUNDS times in one process so drift shows as the spread within each: launch
bounds of 1024 threads an SM (v45, the default) against the block size alone
(``-DCUNORM_FUSED_FWD_THREADS=0``, before v45). v45 also measured a lean step for full
half-precision LayerNorm rows this way (results/sweep-fused-v45-h200.txt), since removed;
v28 its output-loop variants against one loop (``-DCUNORM_FUSED_LEAN_Y=0``).

    python benchmarks/sweep_fused_variant.py [--json out.json]
"""
from __future__ import annotations

from cunorm import _bench, _bench_fused, _compile
from _sweep_cli import rebuild_row_norms  # benchmarks/ is the script's directory

# NVRTC sm_90: 56 registers and 16-28 bytes of spills with the block size alone, 64 and none
# with the bounds
VARIANTS = {"block_bounds": ("-DCUNORM_FUSED_FWD_THREADS=0",), "bounds_1024": ()}
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
