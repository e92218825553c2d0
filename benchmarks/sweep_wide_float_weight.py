"""v104: half-precision rows with a float32 weight (the torch autocast case: bf16
activations, float32 parameters) on the wide backward. On main its RMSNorm blocks take three
rows in the ring and no weight slots there (v101's half slots need a half weight; v81's float
slots do not fit beside three rows); ``two-rows``: two rows and the float slots beside them
(_row_norm.WIDE_DEPTH = 2; LayerNorm's blocks have that already), which
experiments/v104-float-weight-two-rows.patch makes the policy (with it applied, ``main`` is
v104 and ``two-rows`` the same). Kernel time of the CuPy
backward, float32 weight, as a fraction of copy (bytes as the benchmark's: x, dy, dx).
Variants alternate ROUNDS times in one process.

    python benchmarks/sweep_wide_float_weight.py [--variants main,two-rows] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm
from _sweep_cli import alternate, best_table, chosen  # benchmarks/ is the script's directory

# name: every wide ring's rows (None: _config's)
VARIANTS = {"main": None, "two-rows": 2}
ROUNDS = 2
CASES = [("rms_norm", BFLOAT16, n) for n in (16384, 20480, 24576, 32768, 65536, 131072)]


def _use(depth) -> None:
    _row_norm.WIDE_DEPTH = depth
    _row_norm.backward_plan.cache_clear()


def _time(dtype, n) -> tuple[float, int]:
    """(milliseconds of one RMSNorm backward, M) on the benchmark's M x n, float32 weight."""
    import cupy

    from cunorm import _bench

    _, bwd, m, _ = _bench.row_norm_calls("rms_norm", dtype, n, w_dtype=numpy.float32)
    return _bench.queued_time_ms(bwd, cupy.cuda.get_current_stream().ptr), m


def sweep(log=print, names=None) -> list[dict]:
    rows = []
    for round_, name, copy in alternate(chosen(VARIANTS, names), ROUNDS, _use, None, log):
        for op, dtype, n in CASES:
            ms, m = _time(dtype, n)
            row = {"variant": name, "round": round_, "op": op, "dtype": dtype.name, "N": n,
                   "bwd_of_copy": round(3 * m * n * dtype.itemsize / ms / 1e6 / copy, 3)}
            log(f"{name:10s} {op} {dtype.name} float32 weight N={n:<6d} bwd {row['bwd_of_copy']:.3f} of copy")
            rows.append(row)
    log(best_table(rows, VARIANTS, ("bwd_of_copy",)))
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
