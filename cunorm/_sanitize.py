"""One call through each kernel family and dispatch path, small enough to run under
``compute-sanitizer`` (memcheck, racecheck): the GPU check's ``--sanitizer`` option runs

    compute-sanitizer --tool TOOL python -m cunorm._sanitize

and records the error summary. Results are not compared here (the test suite does that);
the point is that every launch path is exercised once with shapes that end mid-pack, mid-
tile and mid-group: row lengths for the warp, block, staged, column, split and cluster paths,
odd N (pack width one), strided rows, the fused options and BatchNorm in both layouts.
"""
from __future__ import annotations

import contextlib

import ml_dtypes
import numpy

# (rows, N): warp tile, block tile, staged partial-row backward (past the column kernel's
# rows), odd N, split path, cluster tiles (sm_90), the wide backward (v63, v65: 140 rows walk
# some blocks through two ring steps; N past the tile's last full pack; N = 24000: bf16
# RMSNorm in v102's clusters of two 16384-column blocks (the tile of 32768, v66, before);
# v78: 70 rows of 32768 walk the wide clusters (bf16: 2 blocks of 16384 columns; float32,
# v99: 4 of 8192, three rows in the ring) through a second row, where the block sums'
# partials are written again; v80: 40 rows of 150000 take the grid rows' backward through 5
# steps in bf16 and 10 in float32, so every ring buffer and partial slot is used again; v93:
# 40 rows of 100000 take the wide cluster backward in clusters of 7 blocks in bf16, 2-3 rows
# a cluster, and v94's dW / dB pass between publish and collect; float32 (v100):
# non-portable clusters of 13 narrow blocks where the driver runs them; v115 / v117: rows of
# 150000 in non-portable clusters of 10 wide blocks, so 12 rows of 300000 keep both dtypes on
# the grid rows' backward). WALK rows: see CLUSTER_WALK_ROWS.
WALK = None
ROW_CASES = [(7, 96), (5, 4096), (1100, 1024), (9, 1533), (3, 150000), (3, 65536), (140, 12000), (134, 24000),
             (70, 32768), (WALK, 150000), (WALK, 100000), (12, 300000)]
# Rows whose weight is in x's dtype (ROW_CASES pass a float32 one): in bf16, v101's
# half-precision weight slots beside the wide clusters' ring of three (2 blocks at 32768, 7
# at 100000), and v105's RMSNorm weight slots in the cluster forward (65536: 256-thread
# blocks; float32 rows take them in ROW_CASES' 32768, 65536 and 100000)
SAME_DTYPE_WEIGHT_CASES = [(70, 32768), (WALK, 100000), (3, 65536)]
# The WALK cases' rows: 40, so that each of the ~13-18 clusters an H100 runs at once takes
# 2-3 rows (and the grid rows' ring, where no cluster serves, turns over). Racecheck spent 312
# of its 403 s on these rows in the fifty-fifth session's H100 check (79-100 s a float32 case),
# past the 380 s it has beside the tests, so under it (``run(cluster_cap=2)``, gpucheck's
# racecheck) the planners run at most two clusters and the rows are two clusters' walk past
# every ring slot: ROWS_A_CAPPED_CLUSTER each (one past the deepest ring, three rows:
# _config.WIDE_BWD_DEPTHS, WIDE_CLUSTER_BWD_NARROW_DEPTH) and one more, for a fifth of the rows
# the shared memory hazards racecheck looks for are all within a cluster
CLUSTER_WALK_ROWS = 40
ROWS_A_CAPPED_CLUSTER = 4
DTYPES = ("float32", "bfloat16")


def _dtype(name):
    return numpy.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else numpy.dtype(name)


def _say(message: str) -> None:
    # flushed, so a log cut off by a timeout still says which case the tool was in
    # ("case ..." lines: cunorm.gpucheck names the last in a timeout's reason)
    print(message, flush=True)


def run(log=_say, cluster_cap: int | None = None) -> int:
    """Every case once; ``cluster_cap``: the WALK row cases in at most that many clusters
    (racecheck's shorter run). Returns the calls made."""
    import time

    import cupy

    import cunorm

    rng = cupy.random.default_rng(0)
    calls, start = 0, time.monotonic()

    def case(what: str) -> None:  # the seconds so far say how long the tool took a case
        cupy.cuda.runtime.deviceSynchronize()
        log(f"case {what} (at {time.monotonic() - start:.0f} s)")
    for name in DTYPES:
        dt = _dtype(name)
        for (m, n), w_dt in [(c, numpy.float32) for c in ROW_CASES] + \
                [(c, dt) for c in SAME_DTYPE_WEIGHT_CASES if dt.itemsize == 2]:
            walk = m is WALK
            if walk:
                m = CLUSTER_WALK_ROWS if cluster_cap is None else cluster_cap * ROWS_A_CAPPED_CLUSTER + 1
            case(f"rows {name} {m} x {n}, weight {numpy.dtype(w_dt).name}"
                 + (f", at most {cluster_cap} clusters" if walk and cluster_cap is not None else ""))
            x = rng.standard_normal((m, n), dtype=numpy.float32).astype(dt)
            w = rng.standard_normal(n, dtype=numpy.float32).astype(w_dt)
            dy = rng.standard_normal((m, n), dtype=numpy.float32).astype(dt)
            with clusters_at_most(cluster_cap if walk else None):
                y, mean, rstd = cunorm.layer_norm(x, w, w, return_stats=True)
                cunorm.layer_norm_backward(dy, x, w, mean, rstd)
                y, rstd = cunorm.rms_norm(x, w, return_stats=True)
                cunorm.rms_norm_backward(dy, x, w, rstd)
            calls += 4
        # strided rows (a slice of a wider array) and a misaligned start
        wide = rng.standard_normal((64, 2050), dtype=numpy.float32).astype(dt)
        cunorm.layer_norm(wide[:, :2048])
        cunorm.rms_norm(wide[:, 1:2049])
        calls += 2
    # the fused options: residual (h in float32), weight offset, FP8 out; fused and composed
    case("fused options")
    for m, n in ((1100, 2048), (5, 1533)):
        x, r, dy, dh = (rng.standard_normal((m, n), dtype=numpy.float32).astype(ml_dtypes.bfloat16) for _ in range(4))
        w = rng.standard_normal(n, dtype=numpy.float32)
        y, h, mean, rstd = cunorm.layer_norm(x, w, w, residual=r, residual_dtype=numpy.float32, weight_offset=1.0,
                                             return_stats=True)
        cunorm.layer_norm_backward(dy, h, w, mean, rstd, dh=dh.astype(numpy.float32), weight_offset=1.0,
                                   dx_dtype=x.dtype, residual_dtype=numpy.float32)
        cunorm.rms_norm(x, w, out_dtype=ml_dtypes.float8_e4m3fn, out_scale=4.0, return_amax=True)
        calls += 3
    # BatchNorm, NCHW and channels last through the passes (22 float32 channels: images and
    # positions off 16 bytes), then the staged kernels (float32 one channel a stage; bf16 two,
    # the last stage one; float32 forward stages over clusters of 2 blocks, 6 + 5 images, on
    # sm_90), and the channels-last staged kernels (float32 24 channels in one block; bf16 64
    # over 2 blocks forward and 4 backward, 40 over 4 and 8 with a stage past C on sm_90: their
    # blocks meeting in global memory, then again as clusters), training forward and backward;
    # then bn_fwd_staged_span / bn_bwd_staged_span (v25: bf16 7 x 7 over clusters of 2 and 4
    # on sm_90; one image of 13 channels, the last stage's span ending inside a word, with a
    # residual; 56 x 56 planes walked in pieces, v30)
    from .ops import _batch_norm

    staged_cl = (((3, 17, 23, 64), -1, ml_dtypes.bfloat16), ((5, 25, 21, 40), -1, ml_dtypes.bfloat16))
    cases = [(c, True) for c in (((4, 22, 9, 11), 1, numpy.float32), ((4, 9, 11, 22), -1, numpy.float32),
                                 ((8, 20, 14, 14), 1, numpy.float32), ((4, 5, 14, 14), 1, ml_dtypes.bfloat16),
                                 ((11, 2, 64, 64), 1, numpy.float32), ((4, 9, 11, 24), -1, numpy.float32),
                                 *staged_cl)] + [(c, False) for c in staged_cl]
    grid_default = _batch_norm.USE_STAGED_CL_GRID
    case("batch_norm")
    for (shape, axis, dt), grid in cases:
        # (the forward of bf16's 8-byte words in bn_fwd_staged, not the span kernel v33 sends it to)
        with batch_norm_settings(USE_STAGED_CL_GRID=grid and grid_default, STAGED_FWD_MIN_WORD=None):
            calls += _batch_norm_round_trip(rng, shape, axis, dt)
    # v39: grid-only channels-last stages (16-48 blocks a stage, their fold spread over the
    # block), made of small tensors by allowing clusters of 2 and 128-byte spans alone
    with batch_norm_settings(STAGED_CL_CLUSTERS=(2,), STAGED_CL_SPANS=(128,)):
        for shape, dt in (((5, 27, 29, 72), ml_dtypes.bfloat16), ((5, 27, 29, 72), numpy.float32),
                          ((24, 28, 28, 8), ml_dtypes.bfloat16)):
            calls += _batch_norm_round_trip(rng, shape, -1, dt)
    case("batch_norm staged span")
    calls += staged_span_calls(rng)
    case("batch_norm two-phase")
    calls += two_phase_calls(rng)
    cupy.cuda.runtime.deviceSynchronize()
    log(f"cunorm._sanitize: {calls} calls done")
    return calls


def _batch_norm_round_trip(rng, shape, axis, dt) -> int:
    """One training forward and its backward of a random x (unit weight, zero bias) with its
    channels on ``axis``; returns the calls made."""
    import cupy

    import cunorm

    x = cupy.asarray(rng.standard_normal(shape, dtype=numpy.float32).astype(dt))
    c = shape[axis]
    w, b = cupy.ones(c, numpy.float32), cupy.zeros(c, numpy.float32)
    y, mean, rstd = cunorm.batch_norm(x, w, b, channel_axis=axis, return_stats=True)
    cunorm.batch_norm_backward(cupy.ones_like(x), x, w, b, mean, rstd, channel_axis=axis)
    return 2


def staged_span_calls(rng) -> int:
    """bn_fwd_staged_span's and bn_bwd_staged_span's cases (BatchNorm v25), training forward
    and backward with a residual and ReLU; returns the calls made (benchmarks/device_parked.sh
    runs them alone)."""
    import cupy

    import cunorm

    # then the backward's one-channel planes walked in pieces (v30): float32 56 x 56 in the
    # fewest, two (STAGED_SPAN_SPLIT_FILL off), bf16's in 49 of 8 words (the default), both
    # over clusters of 2 on sm_90; bf16's 16-image forward in those pieces too (v33 / v34), and
    # its 14 x 14 forward of two channels a span (8-byte words, v33)
    cases = (((161, 16, 7, 7), ml_dtypes.bfloat16, {}), ((1, 13, 5, 5), ml_dtypes.bfloat16, {}),
             ((4, 5, 14, 14), ml_dtypes.bfloat16, {}),
             ((8, 3, 56, 56), numpy.float32, {"STAGED_SPAN_WIDE_BWD_ITEMSIZES": (2, 4), "STAGED_SPAN_SPLIT_FILL": False}),
             ((16, 3, 56, 56), ml_dtypes.bfloat16, {"STAGED_SPAN_SPLIT_FILL": True}))
    for shape, dt, settings in cases:
        with batch_norm_settings(**settings):
            x, r = (cupy.asarray(rng.standard_normal(shape, dtype=numpy.float32).astype(dt)) for _ in range(2))
            w, b = cupy.ones(shape[1], numpy.float32), cupy.zeros(shape[1], numpy.float32)
            y, mean, rstd = cunorm.batch_norm(x, w, b, residual=r, activation="relu", return_stats=True)
            cunorm.batch_norm_backward(cupy.ones_like(x), x, w, b, mean, rstd, residual=r, activation="relu")
    return 2 * len(cases)


def two_phase_calls(rng) -> int:
    """bn_fwd_two_phase_nc's cases (BatchNorm v50: the channel-major passes in one cooperative
    launch, the staged kernel off so these small tensors take it), in chunks of at least 16
    loop trips (MIN_TRIPS) so that threads walk past the ring (its held packs, then its
    copies): bf16 with a residual and ReLU, float32 plain over two chunks a channel with odd
    runs (masked packs), bf16 plain over many chunks a channel (its barrier); returns the
    calls made."""
    import cupy

    import cunorm

    cases = (((16, 5, 37, 41), ml_dtypes.bfloat16, True), ((9, 3, 1499, 3), numpy.float32, False),
             ((64, 3, 1533, 3), ml_dtypes.bfloat16, False))
    with batch_norm_settings(USE_STAGED=False, USE_TWO_PHASE=True, MIN_TRIPS=16):
        for shape, dt, with_residual in cases:
            x = cupy.asarray(rng.standard_normal(shape, dtype=numpy.float32).astype(dt))
            r = cupy.asarray(rng.standard_normal(shape, dtype=numpy.float32).astype(dt)) if with_residual else None
            w, b = cupy.ones(shape[1], numpy.float32), cupy.zeros(shape[1], numpy.float32)
            cunorm.batch_norm(x, w, b, residual=r, activation="relu" if with_residual else None)
    return len(cases)


@contextlib.contextmanager
def batch_norm_settings(**settings):
    """The BatchNorm planner's module settings (cunorm.ops._batch_norm) set for the block and
    restored after it, its plans cleared on both sides."""
    from .ops import _batch_norm

    saved = {k: getattr(_batch_norm, k) for k in settings}
    try:
        for k, v in settings.items():
            setattr(_batch_norm, k, v)
        _batch_norm.plan.cache_clear()
        yield
    finally:
        for k, v in saved.items():
            setattr(_batch_norm, k, v)
        _batch_norm.plan.cache_clear()


@contextlib.contextmanager
def clusters_at_most(cap: int | None):
    """The row planners' count of clusters that run at once (``_launch.max_active_clusters``)
    held to ``cap`` inside the block, their plans cleared on both sides; None: as they are."""
    if cap is None:
        yield
        return
    from .ops import _row_norm

    real = _row_norm.max_active_clusters

    def capped(*args, **kwargs):
        active = real(*args, **kwargs)
        return min(active, cap) if active else active

    try:
        _row_norm.max_active_clusters = capped
        _row_norm.forward_plan.cache_clear()
        _row_norm.backward_plan.cache_clear()
        yield
    finally:
        _row_norm.max_active_clusters = real
        _row_norm.forward_plan.cache_clear()
        _row_norm.backward_plan.cache_clear()


def main(argv=None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description="every kernel family and dispatch path once, for compute-sanitizer")
    ap.add_argument("--clusters", type=int, default=None,
                    help="the cluster-walk row cases in at most this many clusters (racecheck)")
    args = ap.parse_args(argv)
    if args.clusters is not None and args.clusters < 1:
        ap.error("--clusters must be at least 1")
    run(cluster_cap=args.clusters)


if __name__ == "__main__":
    main()
