"""Long-row forward: the split path (three kernels, x read twice) against thread-block
clusters (one kernel, x read once; sm_90+), LayerNorm and RMSNorm, bf16 and fp32, at the
benchmark's row lengths past the full-row tile. Fractions of copy, forward only.

    python benchmarks/sweep_cluster_fwd.py [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _bench
from cunorm._checks import BFLOAT16
from cunorm.ops import _row_norm

ROW_LENGTHS = (32768, 65536, 131072, 262144, 524288, 1048576)


def _use(clusters: bool) -> None:
    _row_norm.USE_CLUSTERS = clusters
    _row_norm._forward_kernels.cache_clear()
    _row_norm.forward_plan.cache_clear()


def sweep(log=print) -> list[dict]:
    copy = _bench.copy_gbps()
    rows = []
    try:
        for clusters in (False, True):
            _use(clusters)
            for op in ("layer_norm", "rms_norm"):
                for dtype in (BFLOAT16, numpy.dtype(numpy.float32)):
                    for n in ROW_LENGTHS:
                        r = _bench.bench_row_norm(op, dtype, n)
                        row = {"clusters": clusters, "op": op, "dtype": dtype.name, "N": n,
                               "fwd_of_copy": round(r["fwd_GBps"] / copy, 3)}
                        log(f"{'cluster' if clusters else 'split':7s} {op:10s} {dtype.name:8s} N={n:<7d} "
                            f"fwd {row['fwd_of_copy']:.3f} of copy")
                        rows.append(row)
    finally:
        _use(False)
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
