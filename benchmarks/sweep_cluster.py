"""Long rows: the split path (x, and dy, read twice; three and four kernels) against
thread-block clusters (one kernel, read once; sm_90+), LayerNorm and RMSNorm, bf16 and fp32,
at row lengths past the full-row tiles. Fractions of copy, forward and backward. Variants:
split; split with the forward's half-precision tiles at two packs a thread (before v26);
split with the backward's grid rounded up past the resident blocks (before v27); clusters
(the backward's as well). RUN_ORDER picks the variants a run measures. Measured and since
removed: the cluster backward loading the next row during the exchange (NOTES v17), the
split backward's main pass staging its tiles through shared memory (v27), the cluster
forward holding its slice in shared memory (v32).

    python benchmarks/sweep_cluster.py [--json out.json]
"""
from __future__ import annotations

from cunorm import _bench, _config
from cunorm.ops import _row_norm
from _sweep_cli import row_norm_cases  # benchmarks/ is the script's directory

ROW_LENGTHS = (16384, 32768, 65536, 131072, 262144, 1048576)
# name: (clusters on, values a thread of the split forward's tile, split backward grid held
# to one wave)
FWD32 = _config.SPLIT_FWD_MAX_VALUES
VARIANTS = {"split": (False, FWD32, True), "split_fwd16": (False, 16, True),
            "split_bwd_two_waves": (False, FWD32, False), "cluster": (True, FWD32, True)}
RUN_ORDER = ("split_bwd_two_waves", "split")


def _use(clusters: bool, split_values: int, one_wave: bool) -> None:
    _row_norm.USE_CLUSTERS = _row_norm.USE_CLUSTER_BACKWARD = clusters
    _config.SPLIT_FWD_MAX_VALUES = split_values
    _row_norm.SPLIT_BACKWARD_ONE_WAVE = one_wave
    for cache in (_row_norm._forward_kernels, _row_norm.forward_plan, _row_norm.backward_plan):
        cache.cache_clear()


def sweep(log=print) -> list[dict]:
    copy = _bench.copy_gbps()
    rows = []
    default = (_row_norm.USE_CLUSTERS, _row_norm.USE_CLUSTER_BACKWARD, _config.SPLIT_FWD_MAX_VALUES,
               _row_norm.SPLIT_BACKWARD_ONE_WAVE)
    try:
        for name in RUN_ORDER:
            _use(*VARIANTS[name])
            for op, dtype, n in row_norm_cases(ROW_LENGTHS):
                r = _bench.bench_row_norm(op, dtype, n)
                row = {"variant": name, "op": op, "dtype": dtype.name, "N": n,
                       "fwd_of_copy": round(r["fwd_GBps"] / copy, 3), "bwd_of_copy": round(r["bwd_GBps"] / copy, 3)}
                log(f"{name:16s} {op:10s} {dtype.name:8s} N={n:<7d} "
                    f"fwd {row['fwd_of_copy']:.3f} bwd {row['bwd_of_copy']:.3f} of copy")
                rows.append(row)
    finally:
        _use(default[0], default[2], default[3])
        _row_norm.USE_CLUSTER_BACKWARD = default[1]
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
