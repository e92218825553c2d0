"""The cluster forward's rows staged ahead through shared memory (v49), builds alternated
ROUNDS times in one process; every build's y, mean and rstd must equal the first build's bit
for bit (only where the row's values wait differs):

- v48_loaded: a cluster a row, its slice loaded into registers after the previous row is
  written (``CUNORM_CLUSTER_FWD_STAGE=0``, host ``CLUSTER_FWD_STAGE_ROWS = 0``);
- v48_persistent: the same kernel on v49's persistent grid (as many clusters as run at
  once), to tell the grid's share from the staging's;
- v49_stage1: persistent clusters, the next row's slice copied into shared memory (cp.async)
  while the current one is reduced and written (forced on every tile);
- v49_stage2: the same with two rows in flight (twice the shared memory);
- v49_policy: the default build, a count a tile (one for half precision and float32
  LayerNorm in 512-thread blocks, none for the other float32 tiles);
- v50_one_pass: the default build, v49_policy with half-precision LayerNorm statistics in
  one pass (``CUNORM_CLUSTER_FWD_ONE_PASS``; the others set it to 0): other bits, so its
  largest difference from the first build is recorded instead.

(v51, the row sums in one exchange of every warp's sums, lost and was removed from the
kernel: NOTES "v51 outcome"; results/sweep-cluster-fwd-stage-4-h200.txt holds its rows.)

bf16 LayerNorm with float32 parameters rides along at the longest rows (its v50 kernel
spills 24 bytes, the bf16-parameter one none).

Row lengths the cluster forward does not serve (bf16 N = 20000 and 32768 take the full-row
kernels) ride along as a measure of the run's drift.

    python benchmarks/sweep_cluster_fwd_stage.py [--variants v48_loaded,v50_one_pass] [--json out.json]
"""
from __future__ import annotations

import numpy

import functools

from cunorm import _bench, _compile, _config, _launch
from cunorm.ops import _row_norm
from cunorm._checks import BFLOAT16
from _sweep_cli import best_table, chosen, rebuild_row_norms, row_norm_cases  # benchmarks/ is the script's directory
from sweep_bwd_stage import _same
from sweep_bwd_stage import _forward

# name: (rows staged ahead (None: the policy), persistent grid without staging, more options)
# (the first run, results/sweep-cluster-fwd-stage-h200.txt, forced one and two rows on every
# tile; v49_policy was read off it, v50_one_pass added in the second)
TWO_PASS = ("-DCUNORM_CLUSTER_FWD_ONE_PASS=0",)
VARIANTS = {"v48_loaded": (0, False, TWO_PASS), "v48_persistent": (0, True, TWO_PASS),
            "v49_stage1": (1, False, TWO_PASS), "v49_stage2": (2, False, TWO_PASS),
            "v49_policy": (None, False, TWO_PASS), "v50_one_pass": (None, False, ())}
EXACT = ("v48_loaded", "v48_persistent", "v49_stage1", "v49_stage2", "v49_policy")  # must keep v48's bits
ROUNDS = 2
ROW_LENGTHS = (20000, 32768, 65536, 131072)


_planned = _row_norm.forward_plan


def _persistent(plan):
    """A cluster forward plan of v48 (a cluster a row) on as many clusters as run at once."""
    cluster = None if plan is None or plan.tiles != 1 or plan.smem else _cluster_forward_size(plan.kernels[0])
    if cluster is None:
        return plan
    active = _launch.max_active_clusters(plan.kernels[0], plan.block, 0, cluster)
    return plan._replace(grid=min(plan.grid // cluster, active) * cluster)


def _cluster_forward_size(ptr: int) -> int | None:
    """Blocks a cluster of the loaded kernel at ``ptr`` if it is norm_fwd_cluster (its sixth
    template argument, _row_norm._cluster_name), else None."""
    name = next((key[1] for key, fn in _compile._modules.items() if fn[1] == ptr), "")
    return int(name.split(",")[5]) if name.startswith("norm_fwd_cluster<") else None


def _use(staged: int | None, persistent: bool, options: tuple) -> None:
    _config.CLUSTER_FWD_STAGE_ROWS = staged
    rebuild_row_norms((*options, *(() if staged is None else (f"-DCUNORM_CLUSTER_FWD_STAGE={staged}",))))
    _planned.cache_clear()  # rebuild_row_norms cleared the wrapper, if one was in place
    _row_norm.forward_plan = functools.lru_cache(maxsize=4096)(
        (lambda *a: _persistent(_planned(*a))) if persistent else _planned)


def _forward_of_copy(op: str, dtype, n: int, copy: float, pdtype=None) -> float:
    import cupy

    import cunorm

    m = _bench.TOTAL_ELEMENTS // n
    rng = cupy.random.default_rng(0)
    x = rng.standard_normal((m, n), dtype=numpy.float32).astype(dtype)
    w = (1 + 0.1 * rng.standard_normal(n, dtype=numpy.float32)).astype(pdtype or dtype)
    b = (0.1 * rng.standard_normal(n, dtype=numpy.float32)).astype(pdtype or dtype)
    call = (lambda: cunorm.layer_norm(x, w, b, return_stats=True)) if op == "layer_norm" else \
        (lambda: cunorm.rms_norm(x, w, return_stats=True))
    return round(2 * m * n * x.itemsize / _bench.time_ms(call) / 1e6 / copy, 3)


def _max_diff(a: list, b: list) -> float:
    """The largest |difference| over y, mean and rstd (as float64)."""
    return max(float(numpy.max(numpy.abs(p.astype(numpy.float64) - q.astype(numpy.float64)))) for p, q in zip(a, b))


def sweep(log=print, names=None) -> list[dict]:
    """The variants in ``names`` (default all), the first of them the bits' reference."""
    variants = chosen(VARIANTS, names)
    default_options, default_rows = _compile.COMPILE_OPTIONS, _config.CLUSTER_FWD_STAGE_ROWS
    rows, reference = [], {}
    copy = _bench.copy_gbps()
    _forward_of_copy("layer_norm", BFLOAT16, 65536, copy)  # clocks up first
    try:
        for round_ in range(ROUNDS):
            for name, (staged, persistent, options) in variants.items():
                _use(staged, persistent, options)
                log(f"-- {name} (round {round_ + 1})")
                for op, dtype, n in row_norm_cases(ROW_LENGTHS):
                    got = _forward(op, dtype, n)
                    ref = reference.setdefault((op, dtype.name, n), got)
                    same, diff = _same(got, ref), _max_diff(got, ref)
                    frac = _forward_of_copy(op, dtype, n, copy)
                    rows.append({"variant": name, "round": round_ + 1, "op": op, "dtype": dtype.name, "N": n,
                                 "fwd_of_copy": frac, "same_bits": same, "max_diff": diff})
                    log(f"{name:14s} {op:10s} {dtype.name:8s} N={n:<6d} fwd {frac:.3f} of copy"
                        + ("" if same else f"  max diff {diff:.3g}" + ("  RESULTS DIFFER" if name in EXACT else "")))
                for n in (65536, 131072):
                    frac = _forward_of_copy("layer_norm", BFLOAT16, n, copy, numpy.float32)
                    rows.append({"variant": name, "round": round_ + 1, "op": "layer_norm", "dtype": "bfloat16/fp32w",
                                 "N": n, "fwd_of_copy": frac})
                    log(f"{name:14s} layer_norm bf16, fp32 parameters N={n:<6d} fwd {frac:.3f} of copy")
    finally:
        _config.CLUSTER_FWD_STAGE_ROWS = default_rows
        _row_norm.forward_plan = _planned
        rebuild_row_norms(default_options)
    log(best_table(rows, variants))
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
