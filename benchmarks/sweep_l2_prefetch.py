"""L2 prefetch of rows read later (v55, kernels/common.cuh ``prefetch_l2``): the fused forward
asks for the row its place in the grid reads ``_config.FUSED_FWD_PREFETCH_WAVES`` waves of
resident blocks later; the persistent backwards (norm_bwd on the full-row and split paths,
norm_bwd_fused) for the row they read ``_config.BWD_PREFETCH_STEPS`` steps later. Both are
kernel arguments, so variants need no rebuild: the plans are recomputed. Variants alternate
ROUNDS times in one process so drift shows as the spread within each; every variant's
gradients and FP8 outputs must equal the first variant's bit for bit (a prefetch moves no
value).

Lost everywhere but the bf16 RMSNorm backward (NOTES v55 outcome,
results/sweep-l2-prefetch-h200.txt), so main does not have it: apply
benchmarks/experiments/v55-l2-prefetch.patch (``patch -p1``) first.

    python benchmarks/sweep_l2_prefetch.py [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _bench, _bench_fused, _config
from cunorm._checks import BFLOAT16
from cunorm.ops import _fused, _row_norm
from _sweep_cli import row_norm_cases  # benchmarks/ is the script's directory
from sweep_bwd_stage import _fused_grads, _grads, _same

# name: (forward waves ahead, backward steps ahead)
VARIANTS = {"off": (0, 0), "fwd1_bwd3": (1, 3), "fwd2_bwd5": (2, 5), "fwd3_bwd8": (3, 8)}
ROUNDS = 2
ROW_LENGTHS = (1024, 2048, 4096, 8192, 65536, 262144)


def _use(waves: int, steps: int) -> None:
    _config.FUSED_FWD_PREFETCH_WAVES, _config.BWD_PREFETCH_STEPS = waves, steps
    for cache in (_row_norm.backward_plan, _fused.fused_forward_plan, _fused.fused_backward_plan):
        cache.cache_clear()


def _fp8_out(op: str, n: int, m: int = 3000):
    """An FP8 forward's y and amax on fixed inputs (several waves of blocks)."""
    import cupy
    import ml_dtypes

    import cunorm

    rng = cupy.random.default_rng(4)
    x, r = (rng.standard_normal((m, n), dtype=numpy.float32).astype(BFLOAT16) for _ in range(2))
    w = (1 + 0.1 * rng.standard_normal(n, dtype=numpy.float32)).astype(BFLOAT16)
    params = (w,) if op == "rms_norm" else (w, cupy.zeros(n, BFLOAT16))
    out = getattr(cunorm, op)(x, *params, residual=r, out_dtype=ml_dtypes.float8_e4m3fn, out_scale=4.0,
                              return_amax=True)
    return [a.get().reshape(-1) for a in out if a is not None]


def sweep(log=print) -> list[dict]:
    default = (_config.FUSED_FWD_PREFETCH_WAVES, _config.BWD_PREFETCH_STEPS)
    rows, reference = [], {}
    copy = _bench.copy_gbps()
    _bench.bench_row_norm("layer_norm", BFLOAT16, 4096)  # clocks up first
    try:
        for round_ in range(ROUNDS):
            for name, setting in VARIANTS.items():
                _use(*setting)
                log(f"-- {name} (round {round_ + 1})")
                for op, dtype, n in row_norm_cases(ROW_LENGTHS):
                    got = _grads(op, dtype, n, m=2000 if n <= 8192 else 40)
                    same = _same(got, reference.setdefault((op, dtype.name, n), got))
                    r = _bench.bench_row_norm(op, dtype, n)
                    row = {"variant": name, "round": round_ + 1, "op": op, "dtype": dtype.name, "N": n,
                           "fwd_of_copy": round(r["fwd_GBps"] / copy, 3),
                           "bwd_of_copy": round(r["bwd_GBps"] / copy, 3), "same_bits": same}
                    log(f"{name:10s} {op:10s} {dtype.name:8s} N={n:<7d} fwd {row['fwd_of_copy']:.3f} "
                        f"bwd {row['bwd_of_copy']:.3f} of copy" + ("" if same else "  RESULTS DIFFER"))
                    rows.append(row)
                for op in ("rms_norm", "layer_norm"):
                    for n in _bench_fused.ROW_LENGTHS:
                        got = _fused_grads(op, n, m=3000) + _fp8_out(op, n)
                        same = _same(got, reference.setdefault((op, "fused", n), got))
                        if not same:
                            log(f"{name} {op} fused N={n}: RESULTS DIFFER")
                        rows.append({"variant": name, "round": round_ + 1, "op": op, "dtype": "bfloat16", "N": n,
                                     "same_bits": same, "path": "fused"})
                for r in _bench_fused.run(copy, log=lambda s: log(f"{name:10s} {s}")):
                    rows.append(dict(r, variant=name, round=round_ + 1, path="fused"))
    finally:
        _use(*default)
    return rows


def table(rows: list[dict]) -> str:
    """Best of the rounds per case and variant."""
    keys = ("fwd_of_copy", "bwd_of_copy", "residual_fwd_of_copy", "residual_bwd_of_copy", "fp8_fwd_of_copy")
    best: dict = {}
    for r in rows:
        for k in keys:
            if k in r:
                case = (r["op"], r["dtype"], r["N"], k.replace("_of_copy", ""))
                cell = best.setdefault(case, {})
                cell[r["variant"]] = max(cell.get(r["variant"], 0.0), r[k])
    lines = ["op dtype N pass | " + " | ".join(VARIANTS)]
    for case, cell in best.items():
        lines.append(" ".join(map(str, case)) + " | " + " | ".join(f"{cell.get(v, float('nan')):.3f}" for v in VARIANTS))
    bad = [r for r in rows if r.get("same_bits") is False]
    lines.append(f"outputs differing from the first variant: {len(bad)}")
    return "\n".join(lines)


if __name__ == "__main__":
    import json
    import sys

    out = sweep()
    print(table(out))
    if len(sys.argv) > 2 and sys.argv[1] == "--json":
        with open(sys.argv[2], "w") as f:
            json.dump(out, f, indent=1)
