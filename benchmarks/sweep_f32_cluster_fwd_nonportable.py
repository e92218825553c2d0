"""v119: float32 LayerNorm forward rows of 131073-262144 in non-portable clusters of sixteen
512-thread blocks with w + b in slots (``sixteen``, the patch's default), against the same
tile loading w + b every row (``sixteen_no_slots``: _config.CLUSTER_FWD_F32_NONPORTABLE_SLOTS
False, built -DCUNORM_CLUSTER_FWD_F32_NONPORTABLE_SLOTS=0) and the portable 1024 x 8 tile
before it (``portable``: _config.CLUSTER_FWD_NONPORTABLE False). Forward of copy, M x N = 64 Mi
as the benchmark's; RMSNorm at 262144 (untouched: its weight has slots on the portable tile)
as the run's control. Each variant's y is compared with the first variant's by its largest
difference, and the plan's tile is logged.

    python benchmarks/sweep_f32_cluster_fwd_nonportable.py [--json out.json] [--variants a,b]
"""
from __future__ import annotations

import numpy

from cunorm import _bench, _compile, _config
from cunorm.ops import _row_norm
from _sweep_cli import alternate, best_table, chosen, rebuild_row_norms  # benchmarks/ is the script's directory

# (CLUSTER_FWD_NONPORTABLE, CLUSTER_FWD_F32_NONPORTABLE_SLOTS, NVRTC options added to the defaults)
VARIANTS = {"sixteen": (True, True, ()),
            "sixteen_no_slots": (True, False, ("-DCUNORM_CLUSTER_FWD_F32_NONPORTABLE_SLOTS=0",)),
            "portable": (False, True, ())}
ROUNDS = 2
F32 = numpy.dtype(numpy.float32)
CASES = [("layer_norm", n) for n in (147456, 196608, 262144)] + [("rms_norm", 262144)]
_BASE = _compile.COMPILE_OPTIONS


def _use(variant) -> None:
    on, slots, options = variant
    _config.CLUSTER_FWD_NONPORTABLE = on
    _config.CLUSTER_FWD_F32_NONPORTABLE_SLOTS = slots
    rebuild_row_norms((*_BASE, *options))  # drops every plan and kernel cache with the modules


def _tile(n: int, rms: bool) -> str:
    plan = _row_norm.forward_plan((64, n), (n, 1), F32, F32, 1, rms, 1e-5, 0, 0, 0)
    return f"{plan.grid} blocks x {plan.block}, smem {plan.smem // 1024} KiB"


def _y(op: str, n: int, m: int = 8):
    import cupy

    import cunorm

    rng = cupy.random.default_rng(5)
    x = rng.standard_normal((m, n), dtype=numpy.float32) + 1
    w, b = (1 + 0.1 * rng.standard_normal(n, dtype=numpy.float32) for _ in range(2))
    y = cunorm.layer_norm(x, w, b) if op == "layer_norm" else cunorm.rms_norm(x, w)
    return y.get()


def sweep(log=print, names=None) -> list[dict]:
    variants = chosen(VARIANTS, names)
    rows, reference = [], {}
    for round_, name, copy in alternate(variants, ROUNDS, _use, VARIANTS["sixteen"], log):
        for op, n in CASES:
            y = _y(op, n)
            diff = float(numpy.abs(y - reference.setdefault((op, n), y)).max())
            r = _bench.bench_row_norm(op, F32, n)
            tile = _tile(n, op == "rms_norm")
            row = {"variant": name, "round": round_, "op": op, "dtype": "float32", "N": n, "path": tile,
                   "fwd_of_copy": round(r["fwd_GBps"] / copy, 3), "fwd_ms": r["fwd_ms"],
                   "max_y_diff_vs_first": diff}
            log(f"{name:16s} {op:10s} N={n:<7d} {tile:34s} fwd {row['fwd_of_copy']:.3f} of copy, "
                f"|y - first's| <= {diff:.3g}")
            rows.append(row)
    log(best_table(rows, variants, keys=("fwd_of_copy",), label="path"))
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
