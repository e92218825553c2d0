"""Do the channels-last staged BatchNorm kernels run in one wave? (issue 5, NOTES "Thirty-eighth
session").

v21 predicted bf16 (64, 1024, 14, 14) NHWC at 0.50-0.60 of copy forward and measured 0.38.
Its plan there is 32 stages of 32 channels, each over a cluster of 8 blocks of 100 KB (two an
SM): 32 clusters, where the H200 ran only 15 clusters of 8 one-SM blocks for the row norms
(_config's v46 note), so maybe 30 of these at once: a second wave of 2 clusters. This probe
prints, for channel counts around issue 5's, each staged kernel's plan, the clusters the
driver says run at once (cuOccupancyMaxActiveClusters with the launch's cluster attribute:
the kernels take their cluster size at launch), the waves that makes, and the kernel time of
the forward and backward. If the time steps up where the stages pass the active clusters
(C = 960 -> 992 -> 1024 at bf16 14 x 14), the waves are the loss and the planner should count
them; if it grows smoothly with C, they are not. Where the tree has BatchNorm v24 (the
stage's blocks meeting in global memory, `experiments/bn-v24-cl-grid-exchange.patch`), each
case runs both ways: `grid` (v24 where the grid fits at once) and `cluster` (main).

    python benchmarks/probe_bn_staged_cl_waves.py [--json out.json]
"""
from __future__ import annotations

import json
import math
import sys

import numpy

# (N, H, W, dtype, channel counts): 14 x 14 and 7 x 7 positions (12544 a channel), issue 5's C
# and counts a stage or two either side of where the waves would change
CASES = (
    (64, 14, 14, "bfloat16", (896, 960, 992, 1024, 1152)),
    (64, 14, 14, "float32", (480, 512)),
    (256, 7, 7, "bfloat16", (2048,)),
    (256, 7, 7, "float32", (2048,)),
)


def describe(p, backward: bool, dtype: str, device: int) -> dict:
    """The staged launch's plan, its occupancy and waves (None fields: the passes serve it)."""
    from cunorm import _launch
    from cunorm.ops import _batch_norm

    st = p.staged_cl_bwd if backward else p.staged_cl
    if st is None:
        return {"kernel": "passes"}
    fn = _batch_norm._staged_cl_kernel(p, 0, "" if backward else dtype, device, backward)
    per_sm = _launch.blocks_per_sm(fn, st.threads, st.smem)
    sms = _launch.sm_count(device)
    clusters = st.blocks // st.cluster
    grid = getattr(st, "grid", False)
    active = None if grid else _launch.max_active_clusters(fn, st.threads, st.smem, st.cluster, at_launch=True)
    at_once = per_sm * sms // st.cluster if grid or not active else active
    return {"kernel": "staged_cl", "channels": st.channels, "cluster": st.cluster, "positions": st.positions,
            "smem": st.smem, "blocks": st.blocks, "clusters": clusters, "blocks_per_sm": per_sm, "grid": grid,
            "active_clusters": active, "waves": math.ceil(clusters / max(1, at_once))}


def probe(log=print) -> list[dict]:
    import cupy

    from cunorm import _bench
    from cunorm.ops import _batch_norm

    device = cupy.cuda.Device().id
    copy = _bench.copy_gbps()
    stream = cupy.cuda.get_current_stream().ptr
    default = getattr(_batch_norm, "USE_STAGED_CL_GRID", None)
    rule = getattr(_batch_norm, "STAGED_CL_GRID_RULE", None)
    if rule is not None:  # the grid rows time the grid wherever it is planned, not only where it pays
        _batch_norm.STAGED_CL_GRID_RULE = False
    modes = (True, False) if default is not None else (None,)
    cases = [(n, h, w, d, c, mode) for n, h, w, d, channels in CASES for c in channels for mode in modes]
    rows = []
    try:
        for n, h, w, dtype_name, c, mode in cases:
            if mode is not None:
                _batch_norm.USE_STAGED_CL_GRID = mode
                _batch_norm.plan.cache_clear()
            rows.append(_case((n, c, h, w), dtype_name, mode, device, copy, stream))
            log(_line(rows[-1]))
    finally:
        if default is not None:
            _batch_norm.USE_STAGED_CL_GRID = default
            _batch_norm.plan.cache_clear()
        if rule is not None:
            _batch_norm.STAGED_CL_GRID_RULE = rule
    log(_table(rows))
    return rows


def _case(shape, dtype_name, mode, device, copy, stream) -> dict:
    """One logical (N, C, H, W) shape stored channels last: its plans and kernel times
    (``mode``: v24's grid exchange on or off; None without v24)."""
    from cunorm import _bench
    from cunorm._bench_bn import bn_calls
    from cunorm._checks import BFLOAT16
    from cunorm.ops import _batch_norm

    dtype = BFLOAT16 if dtype_name == "bfloat16" else numpy.dtype(dtype_name)
    n, c, h, w = shape
    strides = (h * w * c, w * c, c, 1)  # elements, C-contiguous (N, H, W, C)
    p = _batch_norm.plan(_batch_norm.layout((n, h, w, c), strides, 3), dtype, dtype, 0, device)
    fwd, bwd = bn_calls(shape, dtype, True)[:2]
    size = n * c * h * w * dtype.itemsize
    tf, tb = (_bench.queued_time_ms(f, stream) for f in (fwd, bwd))
    return {"shape": list(shape), "dtype": dtype_name, "mode": {True: "grid", False: "cluster"}.get(mode, ""),
            "fwd_us": round(tf * 1e3, 2), "bwd_us": round(tb * 1e3, 2),
            "fwd_of_copy": round(2 * size / tf / 1e6 / copy, 3), "bwd_of_copy": round(3 * size / tb / 1e6 / copy, 3),
            "fwd_plan": describe(p, False, dtype_name, device), "bwd_plan": describe(p, True, dtype_name, device)}


def _plan_text(d: dict) -> str:
    if d["kernel"] == "passes":
        return "passes"
    at_once = "grid" if d["grid"] else d["active_clusters"]
    return (f"G{d['channels']} K{d['cluster']} {d['smem'] // 1024}KB {d['blocks_per_sm']}/SM "
            f"{d['clusters']}st/{at_once} {d['waves']}w")


def _cells(r: dict) -> list[str]:
    """A row's case, then its forward and backward: us / fraction of copy [plan]."""
    return [f"{r['dtype'][:4]} {'x'.join(map(str, r['shape']))} {r['mode']}"] + [
        f"{r[d + '_us']:.1f} / {r[d + '_of_copy']:.3f} [{_plan_text(r[d + '_plan'])}]" for d in ("fwd", "bwd")]


def _line(r: dict) -> str:
    case, fwd, bwd = _cells(r)
    return f"{case}: fwd {fwd}  bwd {bwd}"


def _table(rows: list[dict]) -> str:
    return "\n".join(["case | fwd us / of copy [plan] | bwd us / of copy [plan]"] +
                     [" | ".join(_cells(r)) for r in rows])


if __name__ == "__main__":
    out = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
    result = probe()
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
