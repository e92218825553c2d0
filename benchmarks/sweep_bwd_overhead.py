"""v70-v73: per-row instructions off the staged half-precision backward (norm_bwd, the rows of
N <= 8192 that issue 4's backward target misses most):
  v70 words   the staged x and dy tiles widened a 32-bit word at a time (CUNORM_BWD_STAGED_WORDS);
  v71 wsmem   the weight widened once into shared memory, read back each row step
              (CUNORM_BWD_WEIGHT_SMEM);
  v72 narrow  the block sums' second level as a butterfly of (warps a row) lanes
              (CUNORM_NARROW_SECOND_SUM; the forward's reductions share it, so the forward is
              timed as well);
  v73 fused_wsmem  v71 in the fused residual backward (CUNORM_FUSED_BWD_WEIGHT_SMEM);
  stats       every staged tile copies its rows' mean and rstd with its tiles
              (CUNORM_BWD_STAGE_STATS=1; StagePolicy does so for 1024-thread rows only).
Each build's gradients (and forward outputs) must equal the first build's bit for bit: none
of the three changes a value or the order of a sum. Builds alternate ROUNDS times in one
process; the table of best rounds is printed last.

    python benchmarks/sweep_bwd_overhead.py [--variants base,words,...] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _bench, _compile
from cunorm._checks import BFLOAT16
from _sweep_cli import alternate, best_table, rebuild_row_norms  # benchmarks/ is the script's directory
from sweep_bwd_stage import _fused_bwd_of_copy, _fused_grads, _grads, _same

SWITCHES = ("CUNORM_BWD_STAGED_WORDS", "CUNORM_BWD_WEIGHT_SMEM", "CUNORM_NARROW_SECOND_SUM",
            "CUNORM_FUSED_BWD_WEIGHT_SMEM", "CUNORM_BWD_STAGE_STATS")


def _build(*on: str, stats: int = -1) -> tuple:
    """NVRTC options with the named switches on and the others off (the stats policy, -1:
    row_norm.cuh's StagePolicy; 1: every tile stages its rows' statistics)."""
    return tuple(f"-D{s}={int(s in on)}" for s in SWITCHES[:-1]) + (f"-DCUNORM_BWD_STAGE_STATS={stats}",)


# v70-v72 against v69 (main before them); then v73 (the fused backward's weight slots) and the
# statistics staged for every tile on top of v70-v72
VARIANTS = {
    "base": _build(),
    "words": _build("CUNORM_BWD_STAGED_WORDS"),
    "wsmem": _build("CUNORM_BWD_WEIGHT_SMEM"),
    "narrow": _build("CUNORM_NARROW_SECOND_SUM"),
    "all": _build(*SWITCHES[:3]),
    "fused_wsmem": _build(*SWITCHES[:4]),
    "stats": _build(*SWITCHES[:3], stats=1),
}
ROUNDS = 2
CASES = [(op, BFLOAT16, n) for op in ("layer_norm", "rms_norm") for n in (512, 1024, 2048, 4096, 8192)] + \
        [("layer_norm", numpy.dtype(numpy.float32), n) for n in (1024, 4096)]
FUSED_ROW_LENGTHS = (2048, 4096, 8192)


def _forward(op: str, dtype, n: int, m: int = 300):
    import cupy

    import cunorm

    x = (cupy.random.default_rng(3).standard_normal((m, n), dtype=numpy.float32) + 3).astype(dtype)
    w = cupy.ones(n, dtype)
    out = cunorm.layer_norm(x, w, cupy.zeros(n, dtype), return_stats=True) if op == "layer_norm" else \
        cunorm.rms_norm(x, w, return_stats=True)
    return [a.get() for a in out]


def sweep(log=print, names=None) -> list[dict]:
    variants = {k: v for k, v in VARIANTS.items() if names is None or k in names}
    base = _compile.COMPILE_OPTIONS
    rows, reference = [], {}
    for round_, name, copy in alternate(variants, ROUNDS, lambda extra: rebuild_row_norms((*base, *extra)), (), log):
        for op, dtype, n in CASES:
            got = _grads(op, dtype, n) + _forward(op, dtype, n)
            same = _same(got, reference.setdefault((op, dtype.name, n), got))
            r = _bench.bench_row_norm(op, dtype, n)
            row = {"variant": name, "round": round_, "op": op, "dtype": dtype.name, "N": n,
                   "fwd_of_copy": round(r["fwd_GBps"] / copy, 3), "bwd_of_copy": round(r["bwd_GBps"] / copy, 3),
                   "same_bits": same}
            log(f"{name:8s} {op:10s} {dtype.name:8s} N={n:<5d} fwd {row['fwd_of_copy']:.3f} bwd "
                f"{row['bwd_of_copy']:.3f} of copy" + ("" if same else "  RESULTS DIFFER from the first variant"))
            rows.append(row)
        for op in ("layer_norm", "rms_norm"):
            for n in FUSED_ROW_LENGTHS:
                got = _fused_grads(op, n)
                same = _same(got, reference.setdefault((op, "fused", n), got))
                row = {"variant": name, "round": round_, "op": op, "dtype": "fused-bf16", "N": n,
                       "bwd_of_copy": _fused_bwd_of_copy(op, n, copy), "same_bits": same}
                log(f"{name:8s} {op:10s} fused    N={n:<5d} bwd {row['bwd_of_copy']:.3f} of copy"
                    + ("" if same else "  RESULTS DIFFER from the first variant"))
                rows.append(row)
    log(best_table(rows, variants, ("fwd_of_copy", "bwd_of_copy")))
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
