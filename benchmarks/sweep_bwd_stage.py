"""The staged backwards (norm_bwd and norm_bwd_fused, half-precision rows of one register
tile) in variants (v44): each row's mean and rstd staged through shared memory with its tiles
(``CUNORM_BWD_STAGE_STATS=1``) or loaded after the tiles arrive (``=0``, before v44), and one
to three rows in flight behind the current one (``CUNORM_BWD_STAGE_DEPTH`` 2-4, with the host's
``_row_norm.STAGE_DEPTH``), each forced for every tile, against the per-tile policy the
kernels and ``_config.bwd_stage_depth`` pick. Builds alternate ROUNDS times in one process so drift
shows as the spread within each. Every variant's dx, dweight and dbias must equal the first
variant's bit for bit (the arithmetic is the same); a mismatch is printed and recorded.

    python benchmarks/sweep_bwd_stage.py [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _bench, _bench_fused, _compile
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm
from _sweep_cli import alternate, best_table, rebuild_row_norms  # benchmarks/ is the script's directory

# name: (compile options, rows in the buffers)
# (the first run, results/sweep-bwd-stage-h200.txt, had no v44_policy: the policy was read off it)
VARIANTS = {"v43_stats_loaded": (("-DCUNORM_BWD_STAGE_STATS=0", "-DCUNORM_BWD_STAGE_DEPTH=2"), 2),
            "v44_policy": ((), None),
            "stats_staged": (("-DCUNORM_BWD_STAGE_STATS=1", "-DCUNORM_BWD_STAGE_DEPTH=2"), 2),
            "stats_staged_depth3": (("-DCUNORM_BWD_STAGE_STATS=1", "-DCUNORM_BWD_STAGE_DEPTH=3"), 3),
            "stats_loaded_depth3": (("-DCUNORM_BWD_STAGE_STATS=0", "-DCUNORM_BWD_STAGE_DEPTH=3"), 3),
            "stats_staged_depth4": (("-DCUNORM_BWD_STAGE_STATS=1", "-DCUNORM_BWD_STAGE_DEPTH=4"), 4),
            "stats_loaded_depth4": (("-DCUNORM_BWD_STAGE_STATS=0", "-DCUNORM_BWD_STAGE_DEPTH=4"), 4)}
ROUNDS = 2
ROW_LENGTHS = (512, 1024, 2048, 4096, 8192)
DTYPES = (BFLOAT16, numpy.dtype(numpy.float16))
FUSED_ROW_LENGTHS = (2048, 4096, 8192)


def _use(options, depth: int | None) -> None:
    _row_norm.STAGE_DEPTH = depth
    rebuild_row_norms(options)


def _grads(op: str, dtype, n: int, m: int = 300):
    """dx, dweight, dbias of one backward on fixed inputs (several rows a row group)."""
    import cupy

    import cunorm

    rng = cupy.random.default_rng(1)
    x = (rng.standard_normal((m, n), dtype=numpy.float32) + 3).astype(dtype)
    dy = rng.standard_normal((m, n), dtype=numpy.float32).astype(dtype)
    w = (1 + 0.1 * rng.standard_normal(n, dtype=numpy.float32)).astype(dtype)
    if op == "layer_norm":
        _, mean, rstd = cunorm.layer_norm(x, w, cupy.zeros(n, dtype), return_stats=True)
        out = cunorm.layer_norm_backward(dy, x, w, mean, rstd)
    else:
        _, rstd = cunorm.rms_norm(x, w, return_stats=True)
        out = cunorm.rms_norm_backward(dy, x, w, rstd)
    return [a.get() for a in out if a is not None]


def _fused_grads(op: str, n: int, m: int = 300):
    """The fused residual backward's outputs on fixed inputs (several rows a row group)."""
    import cupy

    import cunorm

    rng = cupy.random.default_rng(2)
    x, r, dy, dh = (rng.standard_normal((m, n), dtype=numpy.float32).astype(BFLOAT16) for _ in range(4))
    w = (1 + 0.1 * rng.standard_normal(n, dtype=numpy.float32)).astype(BFLOAT16)
    params = (w,) if op == "rms_norm" else (w, cupy.zeros(n, BFLOAT16))
    out = getattr(cunorm, op)(x, *params, residual=r, return_stats=True)
    grad = cunorm.rms_norm_backward if op == "rms_norm" else cunorm.layer_norm_backward
    return [a.get() for a in grad(dy, out[1], w, *out[2:], dh=dh, residual_dtype=r.dtype) if a is not None]


def _forward(op: str, dtype, n: int, m: int = 300):
    """y and the statistics of one forward on fixed inputs."""
    import cupy

    import cunorm

    rng = cupy.random.default_rng(3)
    x = (rng.standard_normal((m, n), dtype=numpy.float32) + 3).astype(dtype)
    w = (1 + 0.1 * rng.standard_normal(n, dtype=numpy.float32)).astype(dtype)
    out = cunorm.layer_norm(x, w, cupy.zeros(n, dtype), return_stats=True) if op == "layer_norm" else \
        cunorm.rms_norm(x, w, return_stats=True)
    return [a.get() for a in out]


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(numpy.array_equal(p.view(numpy.uint8), q.view(numpy.uint8)) for p, q in zip(a, b))


def bwd_bits_row(name: str, round_: int, op: str, dtype, n: int, copy: float, reference: dict, log) -> dict:
    """One backward case of a sweep whose variants must agree bit for bit: its gradients
    against the first variant's (kept in ``reference``) and its fraction of copy, logged."""
    got = _grads(op, dtype, n)
    same = _same(got, reference.setdefault((op, numpy.dtype(dtype).name, n), got))
    r = _bench.bench_row_norm(op, dtype, n)
    row = {"variant": name, "round": round_, "op": op, "dtype": numpy.dtype(dtype).name, "N": n,
           "bwd_of_copy": round(r["bwd_GBps"] / copy, 3), "same_bits": same}
    log(f"{name:20s} {op:10s} {row['dtype']:8s} N={n:<6d} bwd {row['bwd_of_copy']:.3f} of copy"
        + ("" if same else "  RESULTS DIFFER from the first variant"))
    return row


def fwd_bwd_bits_row(name: str, round_: int, op: str, dtype, n: int, copy: float, reference: dict, log) -> dict:
    """One case of a sweep whose builds must agree bit for bit in both directions: forward
    outputs and gradients against the first build's (kept in ``reference``), and both
    directions' fractions of copy, logged."""
    got = _forward(op, dtype, n) + _grads(op, dtype, n)
    same = _same(got, reference.setdefault((op, numpy.dtype(dtype).name, n), got))
    r = _bench.bench_row_norm(op, dtype, n)
    row = {"variant": name, "round": round_, "op": op, "dtype": numpy.dtype(dtype).name, "N": n,
           "fwd_of_copy": round(r["fwd_GBps"] / copy, 3), "bwd_of_copy": round(r["bwd_GBps"] / copy, 3),
           "same_bits": same}
    log(f"{name:18s} {op:10s} {row['dtype']:8s} N={n:<6d} fwd {row['fwd_of_copy']:.3f} "
        f"bwd {row['bwd_of_copy']:.3f} of copy" + ("" if same else "  RESULTS DIFFER from the first variant"))
    return row


def _fused_bwd_of_copy(op: str, n: int, copy: float) -> float:
    import cunorm

    m, (x, r, dy, dh), w, b = _bench_fused._inputs(n)
    params = (w,) if op == "rms_norm" else (w, b)
    out = getattr(cunorm, op)(x, *params, residual=r, return_stats=True)
    h, stats = out[1], out[2:]
    grad = cunorm.rms_norm_backward if op == "rms_norm" else cunorm.layer_norm_backward
    ms = _bench.time_ms(lambda: grad(dy, h, w, *stats, dh=dh, residual_dtype=r.dtype))
    return round(5 * m * n * x.itemsize / ms / 1e6 / copy, 3)


def fused_bwd_row(variant: str, round_: int, op: str, n: int, copy: float, reference: dict, log) -> dict:
    """One build's fused residual backward at n: its gradients checked bit for bit against
    the first build's (kept in ``reference``) and its bandwidth, logged and returned."""
    got = _fused_grads(op, n)
    same = _same(got, reference.setdefault((op, "fused", n), got))
    row = {"variant": variant, "round": round_, "op": op, "dtype": "bfloat16", "N": n,
           "fused_residual_bwd_of_copy": _fused_bwd_of_copy(op, n, copy), "same_bits": same}
    log(f"{variant:20s} {op:10s} fused residual bf16 N={n:<5d} bwd {row['fused_residual_bwd_of_copy']:.3f} of copy"
        + ("" if same else "  RESULTS DIFFER from the first variant"))
    return row


def bits_sweep(variants: dict, rounds: int, use, default, cases, fused_lengths, keys, log=print,
               extra=None) -> list[dict]:
    """``alternate`` over variants whose outputs must agree bit for bit: each (op, dtype, N)
    of ``cases`` through fwd_bwd_bits_row, then both ops' fused residual backward at each of
    ``fused_lengths`` through fused_bwd_row, then (optional) ``extra(name, round, copy, log)``'s
    rows, not bit-checked; the best rounds' table of ``keys`` logged last."""
    rows, reference = [], {}
    for round_, name, copy in alternate(variants, rounds, use, default, log):
        for op, dtype, n in cases:
            rows.append(fwd_bwd_bits_row(name, round_, op, dtype, n, copy, reference, log))
        for op in ("layer_norm", "rms_norm"):
            for n in fused_lengths:
                rows.append(fused_bwd_row(name, round_, op, n, copy, reference, log))
        if extra is not None:
            rows += extra(name, round_, copy, log)
    log(best_table(rows, variants, keys))
    return rows


def sweep(log=print) -> list[dict]:
    default = (_compile.COMPILE_OPTIONS, _row_norm.STAGE_DEPTH)
    rows, reference = [], {}
    copy = _bench.copy_gbps()
    _bench.bench_row_norm("layer_norm", BFLOAT16, 4096)  # clocks up first
    try:
        for round_ in range(ROUNDS):
            for name, (options, depth) in VARIANTS.items():
                _use(options, depth)
                log(f"-- {name} (round {round_ + 1})")
                for op in ("layer_norm", "rms_norm"):
                    for dtype in DTYPES:
                        for n in ROW_LENGTHS:
                            rows.append(bwd_bits_row(name, round_ + 1, op, dtype, n, copy, reference, log))
                    for n in FUSED_ROW_LENGTHS:
                        rows.append(fused_bwd_row(name, round_ + 1, op, n, copy, reference, log))
    finally:
        _use(*default)
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
