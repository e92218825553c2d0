"""Forward variants at the benchmark's shapes, each compiled with its own flags: the row held
in shared memory (v22, the default for half-precision 16-byte packs) against the register
tile (``_row_norm.HOLD_ROWS_IN_SMEM`` off), with the fused forward (residual; FP8 out) as a control, run after the GPU check
so the default is measured on both sides of the register tile; and, on request (RUN_ORDER),
one-pass statistics on the shared-memory rows (v22) or the register tile (v11). Plus the
accuracy of each on fp32 rows with a large common offset.

    python benchmarks/sweep_fwd_variant.py [--json out.json]
"""
from __future__ import annotations

import itertools

import numpy

from cunorm import _bench, _compile, reference
from cunorm._checks import BFLOAT16
from cunorm.ops import _fused, _row_norm
from _sweep_cli import row_norm_cases  # benchmarks/ is the script's directory

# name: (compile options, rows in shared memory)
VARIANTS = {"register_row": ((), False), "smem_row": ((), True),
            "smem_one_pass": (("-DCUNORM_FWD_ONE_PASS=1",), True),
            "one_pass": (("-DCUNORM_FWD_ONE_PASS=1",), False)}
RUN_ORDER = ("register_row", "smem_row", "smem_one_pass")  # after the GPU check: the default on both sides
ROW_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)


def _use(options, smem: bool) -> None:
    _compile.COMPILE_OPTIONS = tuple(options)
    _row_norm.HOLD_ROWS_IN_SMEM = smem
    _compile._modules.clear()
    for cache in (_row_norm._forward_kernels, _row_norm.forward_plan, _fused.fused_forward_plan):
        cache.cache_clear()


def _fused_rows(name: str, copy: float, log) -> list[dict]:
    """The fused forward, bf16, M·N = 64 Mi: residual (read x, r; write y, h: 8 bytes an
    element) and FP8 out with amax (read x, write y: 3 bytes)."""
    import cupy
    import ml_dtypes

    import cunorm

    rows = []
    for op, n in itertools.product(("layer_norm", "rms_norm"), (2048, 4096, 8192)):
        m = _bench.TOTAL_ELEMENTS // n
        rng = cupy.random.default_rng(0)
        x, r = (rng.standard_normal((m, n), dtype="float32").astype(BFLOAT16) for _ in range(2))
        w = cupy.ones(n, BFLOAT16)
        f = getattr(cunorm, op)
        cases = {"residual": (lambda: f(x, w, residual=r), 8),
                 "fp8": (lambda: f(x, w, out_dtype=ml_dtypes.float8_e4m3fn, out_scale=4.0, return_amax=True), 3)}
        for case, (fn, bytes_per) in cases.items():
            frac = round(bytes_per * m * n / _bench.time_ms(fn) / 1e6 / copy, 3)
            log(f"{name:12s} fused {case:8s} {op:10s} N={n:<6d} fwd {frac:.3f} of copy")
            rows.append({"variant": name, "op": f"fused_{case}_{op}", "dtype": "bfloat16", "N": n, "fwd_of_copy": frac})
    return rows


def _max_error(offset: float, n: int = 4096) -> float:
    import cupy

    import cunorm

    x = numpy.random.default_rng(0).standard_normal((64, n)).astype(numpy.float32) + numpy.float32(offset)
    y = cunorm.layer_norm(cupy.asarray(x)).get()
    return float(numpy.abs(y - reference.layer_norm(x)).max())


def sweep(log=print) -> list[dict]:
    default, rows = (_compile.COMPILE_OPTIONS, _row_norm.HOLD_ROWS_IN_SMEM), []
    copy = _bench.copy_gbps()
    _bench.bench_row_norm("layer_norm", BFLOAT16, 4096)  # clocks up first
    for name in RUN_ORDER:
        _use(*VARIANTS[name])
        errors = {f"max_err_offset_{o:g}": _max_error(o) for o in (0.0, 1e4)}
        log(f"{name}: fp32 LayerNorm max |error| vs float64, N = 4096: {errors}")
        for op, dtype, n in row_norm_cases(ROW_LENGTHS):
            r = _bench.bench_row_norm(op, dtype, n)
            row = {"variant": name, "op": op, "dtype": dtype.name, "N": n,
                   "fwd_of_copy": round(r["fwd_GBps"] / copy, 3), **errors}
            log(f"{name:12s} {op:10s} {dtype.name:8s} N={n:<6d} fwd {row['fwd_of_copy']:.3f} of copy")
            rows.append(row)
        rows += _fused_rows(name, copy, log)
    _use(*default)
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
