"""Builds of the fused forward (kernels/layer_norm_fused.cu) on the GPU check's fused rows
(``cunorm._bench_fused``: residual forward and backward, FP8 out with amax), alternating
the builds ROUNDS times in one process so drift shows as the spread within each. Every
build's FP8 y, amax and residual-forward y must equal the first build's bit for bit.

v56: x (and the residual) loaded past L1 (``CUNORM_FUSED_X_NO_L1``), the weight and bias lines
asked of L1 before the reductions (``CUNORM_FUSED_PARAMS_EARLY=2``), both, and their packs
held raw in registers from then (``=1``, at 768 threads an SM: 80 registers, RMSNorm without
spills). Earlier: v45 the launch bounds of 1024 threads an SM against the block size alone
(results/sweep-fused-v45-h200.txt), v28 the output-loop variants against one loop
(``-DCUNORM_FUSED_LEAN_Y=0``).

    python benchmarks/sweep_fused_variant.py [--json out.json]
"""
from __future__ import annotations

from cunorm import _bench, _bench_fused, _compile
from _sweep_cli import rebuild_row_norms  # benchmarks/ is the script's directory

VARIANTS = {"base": (), "x_no_l1": ("-DCUNORM_FUSED_X_NO_L1=1",),
            "params_l1_prefetch": ("-DCUNORM_FUSED_PARAMS_EARLY=2",),
            "both": ("-DCUNORM_FUSED_X_NO_L1=1", "-DCUNORM_FUSED_PARAMS_EARLY=2"),
            "params_raw_768": ("-DCUNORM_FUSED_PARAMS_EARLY=1", "-DCUNORM_FUSED_FWD_THREADS=768")}
ROUNDS = 2


OUTPUT_CASES = [(op, n, fp8) for op in ("rms_norm", "layer_norm") for n in (2048, 8192) for fp8 in (False, True)]


def _outputs(op: str, n: int, fp8: bool, m: int = 3000) -> list:
    """y (FP8 bits and amax, or bf16) and h of a fused forward on fixed inputs."""
    import cupy
    import ml_dtypes
    import numpy

    import cunorm
    from cunorm._checks import BFLOAT16

    rng = cupy.random.default_rng(5)
    x, r = (rng.standard_normal((m, n), dtype=numpy.float32).astype(BFLOAT16) for _ in range(2))
    w = (1 + 0.1 * rng.standard_normal(n, dtype=numpy.float32)).astype(BFLOAT16)
    params = (w,) if op == "rms_norm" else (w, (0.1 * rng.standard_normal(n, dtype=numpy.float32)).astype(BFLOAT16))
    kw = dict(out_dtype=ml_dtypes.float8_e4m3fn, out_scale=4.0, return_amax=True) if fp8 else {}
    out = getattr(cunorm, op)(x, *params, residual=r, **kw)
    return [a.get().reshape(-1) for a in out if a is not None]


def _same(a: list, b: list) -> bool:
    import numpy

    return len(a) == len(b) and all(numpy.array_equal(p.view(numpy.uint8), q.view(numpy.uint8)) for p, q in zip(a, b))


def sweep(log=print) -> list[dict]:
    default, rows, reference = _compile.COMPILE_OPTIONS, [], {}
    copy = _bench.copy_gbps()
    try:
        for round_ in range(ROUNDS):
            for name, options in VARIANTS.items():
                rebuild_row_norms(options)
                log(f"-- {name} (round {round_ + 1})")
                same = all(_same(got, reference.setdefault(case, got))
                           for case, got in ((c, _outputs(*c)) for c in OUTPUT_CASES))
                if not same:
                    log(f"{name}: OUTPUTS DIFFER from the first build")
                rows += [dict(row, variant=name, round=round_ + 1, same_bits=same)
                         for row in _bench_fused.run(copy, lambda t: log(f"{name:18s} {t}"))]
    finally:
        rebuild_row_norms(default)
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
