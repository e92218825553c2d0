"""Forward statistics in one pass (one reduction of sum t and sum t^2, t = x - pivot) against
the two-pass default (mean, then squared deviations: two reductions), at the benchmark's
shapes, plus the accuracy of each on rows with a large common offset.

    python benchmarks/sweep_fwd_variant.py [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _bench, _compile, reference
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm
from _sweep_cli import row_norm_cases  # benchmarks/ is the script's directory

VARIANTS = {"two_pass": (), "one_pass": ("-DCUNORM_FWD_ONE_PASS=1",)}
ROW_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384, 32768)


def _use(options) -> None:
    _compile.COMPILE_OPTIONS = tuple(options)
    _compile._modules.clear()
    _row_norm._forward_kernels.cache_clear()
    _row_norm.forward_plan.cache_clear()
    _row_norm._backward_kernels.cache_clear()
    _row_norm.backward_plan.cache_clear()


def _max_error(offset: float, n: int = 4096) -> float:
    import cupy

    import cunorm

    x = numpy.random.default_rng(0).standard_normal((64, n)).astype(numpy.float32) + numpy.float32(offset)
    y = cunorm.layer_norm(cupy.asarray(x)).get()
    return float(numpy.abs(y - reference.layer_norm(x)).max())


def sweep(log=print) -> list[dict]:
    default, rows = _compile.COMPILE_OPTIONS, []
    copy = _bench.copy_gbps()
    _bench.bench_row_norm("layer_norm", BFLOAT16, 4096)  # clocks up first
    for name, options in VARIANTS.items():
        _use(options)
        errors = {f"max_err_offset_{o:g}": _max_error(o) for o in (0.0, 1e4)}
        log(f"{name}: fp32 LayerNorm max |error| vs float64, N = 4096: {errors}")
        for op, dtype, n in row_norm_cases(ROW_LENGTHS):
            r = _bench.bench_row_norm(op, dtype, n)
            row = {"variant": name, "op": op, "dtype": dtype.name, "N": n,
                   "fwd_of_copy": round(r["fwd_GBps"] / copy, 3), **errors}
            log(f"{name:8s} {op:10s} {dtype.name:8s} N={n:<6d} fwd {row['fwd_of_copy']:.3f} of copy")
            rows.append(row)
    _use(default)
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
