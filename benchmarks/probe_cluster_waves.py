"""Does the persistent cluster forward run all the clusters the driver's occupancy count
promised at once? v120's second sweep (NOTES "v120 outcome") read float32 LayerNorm and
RMSNorm rows of 147456 at 0.93-0.94 of copy in sixteen 512-thread blocks (nine of them
holding the row; 7 clusters, 112 blocks) and at 0.76-0.77 in clusters of nine (9 clusters,
81 blocks, every block busy), while bf16 gained from the same change. A second wave would
read so: if fewer than the nine counted clusters fit at once, the last ones start only
when the first have walked all their rows.

This launches the planned forward kernel with 1, 2, ... up to the counted clusters (and one
more) in its persistent grid and times each (kernel time, M x N = 64 Mi as the benchmark's):
where time falls as clusters are added up to the count, they run at once; a step up at the
count says the last ones wait. Main's tiles by default; ``--fit`` sets v120's fewest-blocks
rule for float32 too (needs v120's patch: _config.CLUSTER_FWD_NONPORTABLE_FIT and
CLUSTER_FWD_NONPORTABLE_SIZES; float32 keeps sixteen there unless this flag widens it).

    python benchmarks/probe_cluster_waves.py [--fit] [--json out.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json

import numpy

from cunorm import _bench, _config
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm

F32 = numpy.dtype(numpy.float32)
CASES = [("layer_norm", F32, 147456), ("rms_norm", F32, 147456), ("layer_norm", BFLOAT16, 147456),
         ("layer_norm", F32, 262144)]


def _fit_float32_too() -> None:
    """v120's fit for float32 rows as well, for this probe alone (the patch keeps sixteen)."""
    original = _config.nonportable_cluster_fwd_config

    def fitted(n, vec, itemsize, rms):
        tile = original(n, vec, itemsize, rms)
        if tile is None or itemsize != 4:
            return tile
        return dataclasses.replace(tile, cluster=-(-n // tile.block_columns))

    _config.nonportable_cluster_fwd_config = fitted


def probe(log=print) -> list[dict]:
    import cupy

    copy = _bench.copy_gbps()
    stream = cupy.cuda.get_current_stream().ptr
    rows = []
    for op, dtype, n in CASES:
        rms, m = op == "rms_norm", (64 << 20) // n
        rng = cupy.random.default_rng(3)  # not constant rows: those take LayerNorm's second pass
        x = rng.standard_normal((m, n), dtype=numpy.float32).astype(dtype)
        y = cupy.empty_like(x)
        w = (1 + 0.1 * rng.standard_normal(n, dtype=numpy.float32)).astype(dtype)
        b = (0.1 * rng.standard_normal(n, dtype=numpy.float32)).astype(dtype)
        mean, rstd = (cupy.empty(m, dtype=numpy.float32) for _ in range(2))
        plan = _row_norm.forward_plan((m, n), (n, 1), dtype, dtype, 1, rms, 1e-5, 0, 0, 0)
        if plan.tiles != 1 or plan.grid_rows is not None or plan.smem == 0:
            log(f"{op} {dtype.name} {n}: not a persistent cluster forward here (grid {plan.grid})")
            continue
        cfg = _row_norm._forward_kernels(dtype.name, dtype.name, n, 16 // dtype.itemsize, rms, 0)[0]
        cluster, counted = cfg.cluster, plan.grid // cfg.cluster
        nbytes = 2 * m * n * dtype.itemsize
        for clusters in range(1, counted + 2):
            p = plan._replace(grid=clusters * cluster)

            def call(p=p):
                _row_norm.run_forward(p, x.data.ptr, y.data.ptr, w.data.ptr, 0 if rms else b.data.ptr,
                                      mean.data.ptr, rstd.data.ptr, None, stream)

            ms = _bench.queued_time_ms(call, stream)
            row = {"op": op, "dtype": dtype.name, "N": n, "cluster": cluster, "counted": counted,
                   "clusters": clusters, "ms": round(ms, 5), "of_copy": round(nbytes / ms / 1e6 / copy, 3)}
            log(f"{op:10s} {dtype.name:8s} N={n} {cluster:2d} blocks a cluster, {clusters:2d} of {counted} counted: "
                f"{ms:8.4f} ms, {row['of_copy']:.3f} of copy")
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fit", action="store_true", help="float32 rows in the fewest blocks too (v120's patch)")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    if args.fit:
        _fit_float32_too()
    rows = probe()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
