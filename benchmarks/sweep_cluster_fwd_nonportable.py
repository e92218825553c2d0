"""v119 / v120: forward rows of 131073-262144 in non-portable clusters of 512-thread blocks
with their parameters in slots, against the tiles before them.

- ``fit``: the defaults (v119's float32 LayerNorm, v120's half-precision LayerNorm and
  RMSNorm, float32 RMSNorm with its next row staged; half precision in the fewest blocks that
  hold the row, 9-16, float32 in sixteen);
- ``sixteen``: always sixteen blocks (_config.CLUSTER_FWD_NONPORTABLE_FIT False), v119's;
- ``half_no_slots``: v120's half-precision tile loading w (+ b) every row
  (_config.CLUSTER_FWD_HALF_NONPORTABLE_SLOTS False, built
  -DCUNORM_CLUSTER_FWD_HALF_NONPORTABLE_SLOTS=0): what the shape alone does;
- ``rms32_unstaged``: float32 RMSNorm's blocks without a staged row (its weight's slots alone;
  _config.CLUSTER_FWD_F32_RMS_NONPORTABLE_STAGE False, -DCUNORM_CLUSTER_FWD_F32_RMS_NONPORTABLE_STAGE=0);
- ``v119_only``: main before v120 (half precision and float32 RMSNorm on the portable 1024 x 8
  tile, float32 LayerNorm in sixteen blocks).

Forward of copy, M x N = 64 Mi as the benchmark's; float32 LayerNorm at 262144 (v119's
sixteen blocks in every variant) is the run's control. Each variant's y is compared with the
first variant's by its largest difference, and the plan's tile is logged.

    python benchmarks/sweep_cluster_fwd_nonportable.py [--json out.json] [--variants a,b]
"""
from __future__ import annotations

import numpy

from cunorm import _bench, _compile
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm
from _sweep_cli import alternate, best_table, chosen, config_builds  # benchmarks/ is the script's directory

# (NVRTC options added to the defaults, then _config's CLUSTER_FWD_NONPORTABLE_HALF,
# CLUSTER_FWD_HALF_NONPORTABLE_SLOTS, CLUSTER_FWD_NONPORTABLE_F32_RMS,
# CLUSTER_FWD_F32_RMS_NONPORTABLE_STAGE, CLUSTER_FWD_NONPORTABLE_FIT)
VARIANTS = {"fit": ((), True, True, True, True, True),
            "sixteen": ((), True, True, True, True, False),
            "half_no_slots": (("-DCUNORM_CLUSTER_FWD_HALF_NONPORTABLE_SLOTS=0",), True, False, True, True, True),
            "rms32_unstaged": (("-DCUNORM_CLUSTER_FWD_F32_RMS_NONPORTABLE_STAGE=0",), True, True, True, False, True),
            "v119_only": (("-DCUNORM_CLUSTER_FWD_F32_RMS_NONPORTABLE_STAGE=0",), False, True, False, False, False)}
ROUNDS = 2
F32, F16 = numpy.dtype(numpy.float32), numpy.dtype(numpy.float16)
# (op, x dtype, parameter dtype, N)
CASES = [(op, BFLOAT16, BFLOAT16, n) for op in ("layer_norm", "rms_norm") for n in (147456, 196608, 262144)] + \
        [("layer_norm", BFLOAT16, F32, n) for n in (147456, 262144)] + [("layer_norm", F16, F16, 262144)] + \
        [(op, F32, F32, n) for op in ("rms_norm", "layer_norm") for n in (147456, 196608, 262144)]
_use = config_builds(_compile.COMPILE_OPTIONS, "CLUSTER_FWD_NONPORTABLE_HALF", "CLUSTER_FWD_HALF_NONPORTABLE_SLOTS",
                     "CLUSTER_FWD_NONPORTABLE_F32_RMS", "CLUSTER_FWD_F32_RMS_NONPORTABLE_STAGE",
                     "CLUSTER_FWD_NONPORTABLE_FIT")


def _tile(n: int, dtype, w_dtype, rms: bool) -> str:
    plan = _row_norm.forward_plan((64, n), (n, 1), dtype, w_dtype, 1, rms, 1e-5, 0, 0, 0)
    return f"{plan.grid} blocks x {plan.block}, smem {plan.smem // 1024} KiB"


def _y(op: str, dtype, w_dtype, n: int, m: int = 8):
    import cupy

    import cunorm

    rng = cupy.random.default_rng(5)
    x = (rng.standard_normal((m, n), dtype=numpy.float32) + 1).astype(dtype)
    w, b = ((1 + 0.1 * rng.standard_normal(n, dtype=numpy.float32)).astype(w_dtype) for _ in range(2))
    y = cunorm.layer_norm(x, w, b) if op == "layer_norm" else cunorm.rms_norm(x, w)
    return y.astype(numpy.float32).get()


def _forward_ms(op: str, dtype, w_dtype, n: int) -> tuple[float, int, int]:
    import cupy

    fwd, _, m, itemsize = _bench.row_norm_calls(op, dtype, n, None, w_dtype)
    return _bench.queued_time_ms(fwd, cupy.cuda.get_current_stream().ptr), m, itemsize


def sweep(log=print, names=None) -> list[dict]:
    variants = chosen(VARIANTS, names)
    rows, reference = [], {}
    for round_, name, copy in alternate(variants, ROUNDS, _use, VARIANTS["fit"], log):
        for op, dtype, w_dtype, n in CASES:
            rms = op == "rms_norm"
            label = dtype.name + ("" if w_dtype == dtype else f"+{w_dtype.name}w")
            y = _y(op, dtype, w_dtype, n)
            diff = float(numpy.abs(y - reference.setdefault((op, label, n), y)).max())
            ms, m, itemsize = _forward_ms(op, dtype, w_dtype, n)
            tile = _tile(n, dtype, w_dtype, rms)
            row = {"variant": name, "round": round_, "op": op, "dtype": label, "N": n, "path": tile,
                   "fwd_of_copy": round(2 * m * n * itemsize / ms / 1e6 / copy, 3), "fwd_ms": round(ms, 5),
                   "max_y_diff_vs_first": diff}
            log(f"{name:14s} {op:10s} {label:17s} N={n:<7d} {tile:34s} fwd {row['fwd_of_copy']:.3f} of copy, "
                f"|y - first's| <= {diff:.3g}")
            rows.append(row)
    log(best_table(rows, variants, keys=("fwd_of_copy",), label="path"))
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
