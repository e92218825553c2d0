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

``--backward`` does the same for the persistent cluster backward (one dW / dB partial row a
cluster, grid = the counted clusters, `_row_norm.backward_plan`): its clusters of 9, 12 and
16 blocks (rows of 147456 / 196608 / 262144; the benchmark's 262144 backwards read 0.66-0.74
of copy against 0.72-0.92 at 131072 in eight) and the wide clusters of bf16 65536 (0.66),
the benchmark's worst backward below 0.80. A step down at the count says the count's last
cluster waits; time still falling at the count says more clusters would run. Its first run
(NOTES "bwaves outcome") found bf16 65536's wide clusters of four fastest at 21-23 of the 30
counted. ``--more`` then takes the benchmark's persistent rows of 16384-131072 (backward:
the single wide block at 16384 too, one block a unit; forward: the clusters at 65536 and
131072), past 40 units every fourth count.

    python benchmarks/probe_cluster_waves.py [--fit | --backward] [--more] [--json out.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json

import numpy

import cunorm
from cunorm import _bench, _config
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm

F32 = numpy.dtype(numpy.float32)
CASES = [("layer_norm", F32, 147456), ("rms_norm", F32, 147456), ("layer_norm", BFLOAT16, 147456),
         ("layer_norm", F32, 262144)]
BACKWARD_CASES = [("layer_norm", BFLOAT16, 65536), ("rms_norm", BFLOAT16, 65536), ("layer_norm", F32, 147456),
                  ("layer_norm", F32, 196608), ("layer_norm", F32, 262144), ("rms_norm", F32, 262144),
                  ("layer_norm", BFLOAT16, 147456), ("layer_norm", BFLOAT16, 262144)]
# --more (after the first --backward run, NOTES "bwaves"): the benchmark's other persistent
# backwards and forwards under their targets or near them, where a grid of fewer units than
# the count might win as bf16 65536's backward did
MORE_BACKWARD_CASES = [("layer_norm", BFLOAT16, 16384), ("layer_norm", BFLOAT16, 32768), ("rms_norm", BFLOAT16, 32768),
                       ("layer_norm", BFLOAT16, 65536), ("rms_norm", BFLOAT16, 65536), ("layer_norm", F32, 65536),
                       ("layer_norm", F32, 131072), ("layer_norm", BFLOAT16, 131072)]
MORE_CASES = [("layer_norm", BFLOAT16, 65536), ("rms_norm", BFLOAT16, 65536), ("layer_norm", F32, 65536),
              ("layer_norm", BFLOAT16, 131072)]


def _counts(counted: int) -> list[int]:
    """1 .. counted + 1, every one up to 40 and past it every fourth and the last five (the
    single-block backwards count 132 blocks)."""
    if counted <= 40:
        return list(range(1, counted + 2))
    return sorted(set(range(1, counted - 4, 4)) | set(range(counted - 4, counted + 2)))


def _time_units(counted: int, launch, nbytes: int, copy: float, stream: int, row: dict, units_key: str,
                label: str, log) -> list[dict]:
    """``launch(units)`` timed for each of _counts(counted): a row each (``row``'s keys, the
    count, ``units_key``: the units in the grid, ms, fraction of copy), logged as ``label``."""
    rows = []
    for units in _counts(counted):
        ms = _bench.queued_time_ms(lambda: launch(units), stream)
        rows.append({**row, "counted": counted, units_key: units, "ms": round(ms, 5),
                     "of_copy": round(nbytes / ms / 1e6 / copy, 3)})
        log(f"{label}, {units:2d} of {counted} counted: {ms:8.4f} ms, {rows[-1]['of_copy']:.3f} of copy")
    return rows


def _fit_float32_too() -> None:
    """v120's fit for float32 rows as well, for this probe alone (the patch keeps sixteen)."""
    original = _config.nonportable_cluster_fwd_config

    def fitted(n, vec, itemsize, rms):
        tile = original(n, vec, itemsize, rms)
        if tile is None or itemsize != 4:
            return tile
        return dataclasses.replace(tile, cluster=-(-n // tile.block_columns))

    _config.nonportable_cluster_fwd_config = fitted


def probe(log=print, cases=CASES) -> list[dict]:
    import cupy

    copy = _bench.copy_gbps()
    stream = cupy.cuda.get_current_stream().ptr
    rows = []
    for op, dtype, n in cases:
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
        cluster = cfg.cluster

        def launch(clusters):
            _row_norm.run_forward(plan._replace(grid=clusters * cluster), x.data.ptr, y.data.ptr, w.data.ptr,
                                  0 if rms else b.data.ptr, mean.data.ptr, rstd.data.ptr, None, stream)

        rows += _time_units(plan.grid // cluster, launch, 2 * m * n * dtype.itemsize, copy, stream,
                            {"op": op, "dtype": dtype.name, "N": n, "cluster": cluster}, "clusters",
                            f"{op:10s} {dtype.name:8s} N={n} {cluster:2d} blocks a cluster", log)
    return rows


def probe_backward(log=print, cases=BACKWARD_CASES) -> list[dict]:
    """The persistent backward with 1 .. counted + 1 units (a cluster, or one block where the
    plan is the single wide or row block), each its own dW / dB partial rows."""
    import cupy

    copy = _bench.copy_gbps()
    stream = cupy.cuda.get_current_stream().ptr
    device = cupy.cuda.Device().id
    rows = []
    for op, dtype, n in cases:
        rms, m = op == "rms_norm", (64 << 20) // n
        rng = cupy.random.default_rng(3)
        x = rng.standard_normal((m, n), dtype=numpy.float32).astype(dtype)
        dy = rng.standard_normal((m, n), dtype=numpy.float32).astype(dtype)
        dx = cupy.empty_like(x)
        w = (1 + 0.1 * rng.standard_normal(n, dtype=numpy.float32)).astype(dtype)
        b = (0.1 * rng.standard_normal(n, dtype=numpy.float32)).astype(dtype)
        dw, db = cupy.empty_like(w), cupy.empty_like(w)
        # the statistics as the backward gets them: from the forward
        if rms:
            mean = None
            _, rstd = cunorm.rms_norm(x, w, return_stats=True)
        else:
            _, mean, rstd = cunorm.layer_norm(x, w, b, return_stats=True)
        plan = _row_norm.backward_plan((m, n), (n, 1), (n, 1), dtype, dtype, dtype, 1, rms, device, 0, 0)
        cfg = _row_norm._backward_kernels(dtype.name, dtype.name, dtype.name, n, 16 // dtype.itemsize, rms,
                                          device)[0]
        if plan is None or plan.split is not None or plan.grid_rows is not None or plan.column_blocks:
            log(f"{op} {dtype.name} {n}: not a persistent backward here")
            continue
        if isinstance(cfg, _config.ClusterConfig):
            unit, rows_a_unit, shape = cfg.cluster, 1, f"{cfg.cluster:2d} x {cfg.tpb} a cluster"
        else:
            unit, rows_a_unit, shape = 1, cfg.rows_per_block, f"blocks of {cfg.block}"
        # the GPU's own count, not the plan's grid (which v122's cap may hold under it)
        counted = (_row_norm.max_active_clusters(plan.main, plan.block, plan.smem, unit) if unit > 1 else
                   _row_norm.sm_count(device) * _row_norm.blocks_per_sm(plan.main, plan.block, plan.smem)) \
            or plan.blocks // unit
        scratch = [cupy.empty(s, dtype=acc) for s, acc in
                   _row_norm.backward_scratch(plan._replace(groups=(counted + 1) * rows_a_unit), True, not rms)]

        def launch(units):
            held = iter([a.data.ptr for a in scratch])
            _row_norm.run_backward(plan._replace(blocks=units * unit, groups=units * rows_a_unit), dy.data.ptr,
                                   x.data.ptr, w.data.ptr, 0 if rms else mean.data.ptr, rstd.data.ptr, dx.data.ptr,
                                   dw.data.ptr, 0 if rms else db.data.ptr, lambda shape, acc: next(held), stream)

        rows += _time_units(counted, launch, 3 * m * n * dtype.itemsize, copy, stream,
                            {"op": op, "dtype": dtype.name, "N": n, "unit": unit, "block": cfg.block}, "units",
                            f"bwd {op:10s} {dtype.name:8s} N={n} {shape}", log)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fit", action="store_true", help="float32 rows in the fewest blocks too (v120's patch)")
    ap.add_argument("--backward", action="store_true", help="the persistent backward instead")
    ap.add_argument("--more", action="store_true",
                    help="the benchmark's rows of 16384-131072 instead (MORE_CASES / MORE_BACKWARD_CASES)")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    if args.fit:
        _fit_float32_too()
    if args.backward:
        rows = probe_backward(cases=MORE_BACKWARD_CASES if args.more else BACKWARD_CASES)
    else:
        rows = probe(cases=MORE_CASES if args.more else CASES)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
