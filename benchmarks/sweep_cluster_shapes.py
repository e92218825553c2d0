"""The cluster forward's shapes (threads a block × blocks a cluster) in variants: the
committed CLUSTER_SHAPES against clusters of 512- and of 1024-thread blocks, which cover the
same rows with fewer blocks a cluster (fewer partial sums to exchange, fewer blocks an SM).
1024-thread blocks in clusters of 8 take rows of 131073-262144 (v92); ``upto512x8`` gives
them back to the split path. ``blocks512_slots`` (the fifty-seventh session): 512-thread
blocks from 16385 on (1024 x 8 kept past 131072) with every tile's parameters in slots
(``-DCUNORM_CLUSTER_FWD_PARAM_SLOTS_ALL=1``, ``_config.CLUSTER_FWD_PARAM_SLOTS_SERVE_ALL``):
v119 / v120's form (512-thread blocks, one an SM, the parameters on chip; bf16 LayerNorm
0.90 of copy at 262144) for shorter rows, e.g. 65536 in four such blocks, where the
committed 256 x 8 tile loads w + b from the L2 every row. Forward only (the backward's
clusters have their own shapes); builds alternate ROUNDS times in one process. A different
partition sums a row in another order, so each variant's y is compared with the committed
shapes' y by its largest difference instead of bit for bit.

    python benchmarks/sweep_cluster_shapes.py [--variants committed,blocks512_slots] [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _bench, _compile, _config
from cunorm.ops import _row_norm
from _sweep_cli import alternate, best_table, chosen, config_builds, row_norm_cases  # benchmarks/ is the script's directory

_ALL = ("-DCUNORM_CLUSTER_FWD_PARAM_SLOTS_ALL=1",)
# name: (NVRTC options added to the defaults, CLUSTER_SHAPES, CLUSTER_FWD_PARAM_SLOTS_SERVE_ALL)
VARIANTS = {"committed": ((), _config.CLUSTER_SHAPES, False),
            "blocks512": ((), ((512, 2), (512, 4), (512, 8)), False),
            "blocks512_slots": (_ALL, ((256, 2), (512, 2), (512, 4), (512, 8), (1024, 8)), True),
            "blocks1024": ((), ((1024, 2), (1024, 4), (1024, 8)), False),
            # v92 (committed since): the shapes before it, without 1024 x 8 (rows of
            # 131073-262144 elements then took the split path)
            "upto512x8": ((), tuple(s for s in _config.CLUSTER_SHAPES if s != (1024, 8)), False)}
ROUNDS = 2
ROW_LENGTHS = (32768, 65536, 131072, 262144)
_use = config_builds(_compile.COMPILE_OPTIONS, "CLUSTER_SHAPES", "CLUSTER_FWD_PARAM_SLOTS_SERVE_ALL")


def _path(dtype, n: int, rms: bool) -> str:
    """The forward path of a row of n (16-byte packs), in _row_norm._forward_kernels' order."""
    itemsize = numpy.dtype(dtype).itemsize
    vec = _config.max_vec(itemsize)
    if _row_norm.smem_row_config(n, vec, itemsize) is not None:
        return "smem row"
    if _config.row_config(n, vec, _config.FWD) is not None:
        return "register row"
    cfg, _, smem = _row_norm._forward_kernels(numpy.dtype(dtype).name, numpy.dtype(dtype).name, n, vec, rms, 0)
    if not isinstance(cfg, _config.ClusterConfig):
        return "grid rows or split"
    return f"cluster {cfg.tpb}x{cfg.cluster}, {smem // 1024} KiB"


def _y(op: str, dtype, n: int, m: int = 40):
    import cupy

    import cunorm

    rng = cupy.random.default_rng(4)
    x = (rng.standard_normal((m, n), dtype=numpy.float32) + 2).astype(dtype)
    w = (1 + 0.1 * rng.standard_normal(n, dtype=numpy.float32)).astype(dtype)
    y = cunorm.layer_norm(x, w, cupy.zeros(n, dtype)) if op == "layer_norm" else cunorm.rms_norm(x, w)
    return y.astype(numpy.float32).get()


def sweep(log=print, names=None) -> list[dict]:
    variants = chosen(VARIANTS, names)
    rows, reference = [], {}
    for round_, name, copy in alternate(variants, ROUNDS, _use, VARIANTS["committed"], log):
        for op, dtype, n in row_norm_cases(ROW_LENGTHS):
            y = _y(op, dtype, n)
            diff = float(numpy.abs(y - reference.setdefault((op, dtype.name, n), y)).max())
            r = _bench.bench_row_norm(op, dtype, n)
            row = {"variant": name, "round": round_, "op": op, "dtype": dtype.name, "N": n,
                   "cluster": _path(dtype, n, op == "rms_norm"), "fwd_of_copy": round(r["fwd_GBps"] / copy, 3),
                   "max_diff_vs_committed": diff}
            log(f"{name:15s} {op:10s} {dtype.name:8s} N={n:<6d} {row['cluster']:26s} fwd "
                f"{row['fwd_of_copy']:.3f} of copy, |y - committed's| <= {diff:.3g}")
            rows.append(row)
    log(best_table(rows, variants, label="cluster"))
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__, VARIANTS)
