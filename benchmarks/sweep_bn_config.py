"""BatchNorm launch settings against each other at issue 5's shapes: bytes a thread keeps in
flight a stream (kInflightBytes, compiled in), blocks a pass aims for (BLOCKS_PER_SM, both
layouts alike here) and a block's least work (MIN_TRIPS), one changed at a time from
(32, 8, 4), the defaults when it ran first. Kernel time
(_bench.queued_time_ms), training forward and backward, as fractions of copy.

    python benchmarks/sweep_bn_config.py [--json out.json]
"""
from __future__ import annotations

import numpy

from cunorm import _bench, _compile
from cunorm._checks import BFLOAT16
from cunorm.ops import _batch_norm
from _sweep_cli import rebuild_batch_norm  # benchmarks/ is the script's directory

SHAPES = ((32, 256, 56, 56), (128, 64, 112, 112), (64, 1024, 14, 14), (256, 2048, 7, 7))
# (inflight bytes, blocks per SM, least loop trips a block)
SETTINGS = ((32, 8, 4), (16, 8, 4), (64, 8, 4), (32, 4, 4), (32, 16, 4), (32, 32, 4), (32, 8, 1), (32, 8, 16))


def _use(inflight: int, blocks_per_sm: int, min_trips: int) -> None:
    _batch_norm.BLOCKS_PER_SM = _batch_norm.BLOCKS_PER_SM_CL = blocks_per_sm
    _batch_norm.MIN_TRIPS = min_trips
    rebuild_batch_norm((f"-DCUNORM_BN_INFLIGHT_BYTES={inflight}",))


def _gbps(shape, dtype, fwd_ms: float, bwd_ms: float) -> tuple:
    """(forward, backward) GB/s of the bytes model (forward 2 numel s, backward 3 numel s)."""
    size = int(numpy.prod(shape)) * numpy.dtype(dtype).itemsize
    return 2 * size / fwd_ms / 1e6, 3 * size / bwd_ms / 1e6


def _case(shape, dtype, channels_last):
    """(forward, backward) GB/s of the bench's own BatchNorm case (cunorm._bench_bn)."""
    from cunorm._bench_bn import _cupy_case

    return _gbps(shape, dtype, *_cupy_case(shape, dtype, channels_last)[:2])


def sweep(log=print) -> list[dict]:
    defaults = (_compile.COMPILE_OPTIONS, _batch_norm.BLOCKS_PER_SM, _batch_norm.BLOCKS_PER_SM_CL,
                _batch_norm.MIN_TRIPS)
    copy = _bench.copy_gbps()
    rows = []
    try:
        for setting in SETTINGS:
            _use(*setting)
            for shape in SHAPES:
                for dtype in (BFLOAT16, numpy.dtype(numpy.float32)):
                    for cl in (False, True):
                        f, b = _case(shape, dtype, cl)
                        row = {"inflight": setting[0], "blocks_per_sm": setting[1], "min_trips": setting[2],
                               "shape": list(shape), "dtype": dtype.name, "layout": "nhwc" if cl else "nchw",
                               "fwd_of_copy": round(f / copy, 3), "bwd_of_copy": round(b / copy, 3)}
                        log(f"{setting} {dtype.name:8s} {row['layout']} {shape}: fwd {row['fwd_of_copy']:.3f} "
                            f"bwd {row['bwd_of_copy']:.3f}")
                        rows.append(row)
    finally:
        _batch_norm.BLOCKS_PER_SM, _batch_norm.BLOCKS_PER_SM_CL, _batch_norm.MIN_TRIPS = defaults[1:]
        rebuild_batch_norm(defaults[0])
    return rows


if __name__ == "__main__":
    from _sweep_cli import main

    main(sweep, __doc__)
