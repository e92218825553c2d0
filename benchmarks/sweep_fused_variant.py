"""Builds of the fused forward (kernels/layer_norm_fused.cu) on the GPU check's fused rows
(``cunorm._bench_fused``: residual forward and backward, FP8 out with amax), alternating
the builds ROUNDS times in one process so drift shows as the spread within each. Now (v45):
full half-precision LayerNorm rows in a lean step (no bounds tests, bf16 widened by words, a
given weight and bias without null tests) against the general step, each with and without
launch bounds of 1024 threads an SM. (v28 measured its output-loop variants against one loop,
``-DCUNORM_FUSED_LEAN_Y=0``, the same way.)

    python benchmarks/sweep_fused_variant.py [--json out.json]
"""
from __future__ import annotations

from cunorm import _bench, _bench_fused, _compile
from cunorm.ops import _fused, _row_norm

# v45: the lean step for full half-precision LayerNorm rows (CUNORM_FUSED_FULL_TILES), each
# with and without launch bounds of 1024 threads an SM (CUNORM_FUSED_FWD_THREADS); NVRTC
# sm_90 gave the general step 56 registers and 16-28 bytes of spills, 64 and none with the
# bounds; the lean step 95-104 registers, or 64 with 32-40 bytes of spills under the bounds.
VARIANTS = {"v44_general": ("-DCUNORM_FUSED_FULL_TILES=0",),
            "v44_general_1024": ("-DCUNORM_FUSED_FULL_TILES=0", "-DCUNORM_FUSED_FWD_THREADS=1024"),
            "v45_lean": (),
            "v45_lean_1024": ("-DCUNORM_FUSED_FWD_THREADS=1024",)}
ROUNDS = 2


def _use(options) -> None:
    _compile.COMPILE_OPTIONS = tuple(options)
    _compile._modules.clear()  # every cached plan holds kernel pointers of the modules dropped here
    for cache in (_fused.fused_forward_plan, _fused.fused_backward_plan, _row_norm._forward_kernels,
                  _row_norm.forward_plan, _row_norm.backward_plan):
        cache.cache_clear()


def sweep(log=print) -> list[dict]:
    default, rows = _compile.COMPILE_OPTIONS, []
    copy = _bench.copy_gbps()
    try:
        for round_ in range(ROUNDS):
            for name, options in VARIANTS.items():
                _use(options)
                log(f"-- {name} (round {round_ + 1})")
                rows += [dict(row, variant=name, round=round_ + 1) for row in _bench_fused.run(copy, log)]
    finally:
        _use(default)
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
