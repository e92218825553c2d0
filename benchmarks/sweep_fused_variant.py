"""The fused forward's output loop (kernels/layer_norm_fused.cu) in its v28 form — a variant
for each of weight offset / amax present or not, the FP8 scale only for FP8, FP8 written two
values a conversion — against the one loop for every call before it
(``-DCUNORM_FUSED_LEAN_Y=0``), on the GPU check's fused rows (``cunorm._bench_fused``:
residual forward and backward, FP8 out with amax), alternating the two builds ROUNDS times
in one process so drift shows as the spread within each.

    python benchmarks/sweep_fused_variant.py [--json out.json]
"""
from __future__ import annotations

from cunorm import _bench, _bench_fused, _compile
from cunorm.ops import _fused, _row_norm

VARIANTS = {"one_loop": ("-DCUNORM_FUSED_LEAN_Y=0",), "lean_y": ()}
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
