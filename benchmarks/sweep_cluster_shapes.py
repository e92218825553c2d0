"""The cluster forward's shapes (threads a block × blocks a cluster) in variants: the
committed CLUSTER_SHAPES against clusters of 512- and of 1024-thread blocks, which cover the
same rows with fewer blocks a cluster (fewer partial sums to exchange, fewer blocks an SM).
1024-thread blocks in clusters of 8 take rows of 131073-262144 (v92); ``upto512x8`` gives
them back to the split path. Forward only (the backward's clusters have their own shapes); builds
alternate ROUNDS times in one process. A different partition sums a row in another order,
so each variant's y is compared with the committed shapes' y by its largest difference
instead of bit for bit.

    python benchmarks/sweep_cluster_shapes.py [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _bench, _config
from cunorm.ops import _row_norm
from _sweep_cli import alternate, best_table, row_norm_cases  # benchmarks/ is the script's directory

VARIANTS = {"committed": _config.CLUSTER_SHAPES,
            "blocks512": ((512, 2), (512, 4), (512, 8)),
            "blocks1024": ((1024, 2), (1024, 4), (1024, 8)),
            # v92 (committed since): the shapes before it, without 1024 x 8 (rows of
            # 131073-262144 elements then took the split path)
            "upto512x8": tuple(s for s in _config.CLUSTER_SHAPES if s != (1024, 8))}
ROUNDS = 2
ROW_LENGTHS = (32768, 65536, 131072, 262144)


def _use(shapes) -> None:
    _config.CLUSTER_SHAPES = shapes
    for cache in (_row_norm._forward_kernels, _row_norm.forward_plan):
        cache.cache_clear()


def _path(dtype, n: int) -> str:
    """The forward path of a row of n (16-byte packs), in _row_norm._forward_kernels' order."""
    itemsize = numpy.dtype(dtype).itemsize
    vec = _config.max_vec(itemsize)
    if _row_norm.smem_row_config(n, vec, itemsize) is not None:
        return "smem row"
    if _config.row_config(n, vec, _config.FWD) is not None:
        return "register row"
    cfg = _config.cluster_config(n, vec)
    return f"cluster {cfg.tpb}x{cfg.cluster}" if cfg is not None else "split"


def _y(op: str, dtype, n: int, m: int = 40):
    import cupy

    import cunorm

    rng = cupy.random.default_rng(4)
    x = (rng.standard_normal((m, n), dtype=numpy.float32) + 2).astype(dtype)
    w = (1 + 0.1 * rng.standard_normal(n, dtype=numpy.float32)).astype(dtype)
    y = cunorm.layer_norm(x, w, cupy.zeros(n, dtype)) if op == "layer_norm" else cunorm.rms_norm(x, w)
    return y.astype(numpy.float32).get()


def sweep(log=print) -> list[dict]:
    rows, reference = [], {}
    for round_, name, copy in alternate(VARIANTS, ROUNDS, _use, _config.CLUSTER_SHAPES, log):
        for op, dtype, n in row_norm_cases(ROW_LENGTHS):
            y = _y(op, dtype, n)
            diff = float(numpy.abs(y - reference.setdefault((op, dtype.name, n), y)).max())
            r = _bench.bench_row_norm(op, dtype, n)
            row = {"variant": name, "round": round_, "op": op, "dtype": dtype.name, "N": n,
                   "cluster": _path(dtype, n), "fwd_of_copy": round(r["fwd_GBps"] / copy, 3),
                   "max_diff_vs_committed": diff}
            log(f"{name:10s} {op:10s} {dtype.name:8s} N={n:<6d} {row['cluster']:18s} fwd "
                f"{row['fwd_of_copy']:.3f} of copy, |y - committed's| <= {diff:.3g}")
            rows.append(row)
    log(best_table(rows, VARIANTS, label="cluster"))
    return rows

if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
