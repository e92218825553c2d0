"""Each BatchNorm launch's own kernel time, training forward and backward at issue 5's
shapes, channel-major (nchw) and channels last (nhwc), with the defaults and, channel-major,
with one setting of _batch_norm changed at a time (SETTINGS: bn_stats_flat and
bn_bwd_sums_flat off, which channels last never takes): the call queued back to back
(_bench.queued_time_ms) with every launch but one skipped, for each launch in turn (the
skipped passes' outputs are stale, which does not change what the kept one moves).

    python benchmarks/bn_pass_times.py [nchw] [nhwc]     (both without any)
"""
from __future__ import annotations

import sys

import numpy

import cunorm
from cunorm import _bench
from cunorm._checks import BFLOAT16
from cunorm.ops import _batch_norm
from _l2_flush import count_launches  # benchmarks/ is the script's directory
from sweep_bn_config import SHAPES

SETTINGS = {"default": {}, "flat sums off": {"USE_FLAT_STATS": False, "USE_FLAT_SUMS": False}}


def _use(settings: dict) -> None:
    for k, v in settings.items():
        setattr(_batch_norm, k, v)
    _batch_norm.plan.cache_clear()
    _batch_norm._passes.cache_clear()


def launches(fn) -> int:
    """The launches one call of fn makes (through _batch_norm.launch)."""
    return count_launches(_batch_norm, fn)


def _pass_times(fn, stream_ptr: int) -> list[float]:
    """µs of each launch fn makes, in launch order, then of the whole call."""
    real = _batch_norm.launch
    n, times = launches(fn), []
    for keep in range(n):
        seen = [0]

        def only(*args, _keep=keep, **kw):
            if seen[0] % n == _keep:
                real(*args, **kw)
            seen[0] += 1

        _batch_norm.launch = only
        try:
            times.append(_bench.queued_time_ms(fn, stream_ptr) * 1e3)
        finally:
            _batch_norm.launch = real
    return times + [_bench.queued_time_ms(fn, stream_ptr) * 1e3]


def main(layouts=("nchw", "nhwc")) -> None:
    import cupy

    stream = cupy.cuda.get_current_stream().ptr
    for layout in layouts:
        for shape in SHAPES:
            for dtype in (BFLOAT16, numpy.dtype(numpy.float32)):
                _case(layout, shape, dtype, stream)


def _case(layout: str, shape: tuple, dtype, stream: int) -> None:
    import cupy

    axis = 1 if layout == "nchw" else -1
    phys = shape if layout == "nchw" else (shape[0], *shape[2:], shape[1])
    x = cupy.asarray(numpy.random.default_rng(0).standard_normal(phys).astype(numpy.float32)).astype(dtype)
    w, b = cupy.ones(shape[1], numpy.float32), cupy.zeros(shape[1], numpy.float32)
    rm, rv = cupy.zeros(shape[1], numpy.float32), cupy.ones(shape[1], numpy.float32)
    dy = x.copy()
    for name, settings in SETTINGS.items() if layout == "nchw" else (("default", {}),):
        defaults = {k: getattr(_batch_norm, k) for k in settings}
        _use(settings)
        try:
            f, g = call_times(x, w, b, rm, rv, dy, axis, stream)
        finally:
            _use(defaults)
        print(f"{dtype.name:8s} {layout} {str(shape):20s} {name:13s} {times_line(f, g)}", flush=True)


def call_times(x, w, b, rm, rv, dy, axis: int, stream: int) -> tuple[list[float], list[float]]:
    """_pass_times of a training forward and of its backward (statistics made once)."""
    _, mean, rstd = cunorm.batch_norm(x, w, b, rm, rv, channel_axis=axis, return_stats=True)
    return (_pass_times(lambda: cunorm.batch_norm(x, w, b, rm, rv, channel_axis=axis), stream),
            _pass_times(lambda: cunorm.batch_norm_backward(dy, x, w, b, mean, rstd, channel_axis=axis), stream))


def times_line(f: list[float], g: list[float]) -> str:
    """Each launch's µs and the whole call's, forward then backward."""
    return (f"forward {' + '.join(f'{t:.1f}' for t in f[:-1])} (whole {f[-1]:.1f}) us; backward "
            f"{' + '.join(f'{t:.1f}' for t in g[:-1])} (whole {g[-1]:.1f}) us")


if __name__ == "__main__":
    main(tuple(sys.argv[1:]) or ("nchw", "nhwc"))
