"""BatchNorm v50 / v52 (bn_fwd_two_phase_nc): each case's grid (chunks, packs a chunk, blocks
an SM, the plan's chunks, grid_y, packs a run) and whole-call forward and backward times with
the two-phase forward on, off and in fewer chunks (the forty-ninth session found v50 at 2.3x
the passes' time this way; ncu then found its y stores split, NOTES "BatchNorm v52").
``--once`` runs one bf16 NCHW 112 x 112 forward and backward twice through it, ``--once2``
once with it and once through the passes (for ncu).

    python benchmarks/probe_two_phase.py [--once | --once2]
"""
from __future__ import annotations

import numpy

import cunorm
from cunorm import _bench, _launch
from cunorm._checks import BFLOAT16
from cunorm.ops import _batch_norm as B
from bn_pass_times import _use

CASES = (("nchw", (128, 64, 112, 112), BFLOAT16), ("nchw", (128, 64, 112, 112), numpy.dtype(numpy.float32)),
         ("nchw", (32, 256, 56, 56), numpy.dtype(numpy.float32)))


def main() -> None:
    import cupy

    stream = cupy.cuda.get_current_stream().ptr
    seen = []
    real_grid = B._two_phase_grid

    def grid(p, fn, device, *a):
        r = real_grid(p, fn, device, *a)
        seen.append((r, _launch.blocks_per_sm(fn, B.BLOCK), p.chunks, p.grid_y, p.ip))
        return r

    B._two_phase_grid = grid
    for layout, shape, dt in CASES:
        axis = 1 if layout == "nchw" else -1
        phys = shape if layout == "nchw" else (shape[0], *shape[2:], shape[1])
        x = cupy.asarray(numpy.random.default_rng(0).standard_normal(phys, dtype=numpy.float32)).astype(dt)
        c = shape[1]
        w, b = cupy.ones(c, numpy.float32), cupy.zeros(c, numpy.float32)
        rm, rv = cupy.zeros(c, numpy.float32), cupy.ones(c, numpy.float32)
        for name, st in (("on", {}), ("off", {"USE_TWO_PHASE": False}), ("trips16", {"MIN_TRIPS": 16}),
                         ("trips64", {"MIN_TRIPS": 64})):
            old = {k: getattr(B, k) for k in st}
            _use(st)
            real_grid.cache_clear()
            seen.clear()
            try:
                _, mean, rstd = cunorm.batch_norm(x, w, b, rm, rv, channel_axis=axis, return_stats=True)
                f = _bench.queued_time_ms(lambda: cunorm.batch_norm(x, w, b, rm, rv, channel_axis=axis), stream)
                g = _bench.queued_time_ms(lambda: cunorm.batch_norm_backward(x, x, w, b, mean, rstd,
                                                                           channel_axis=axis), stream)
            finally:
                _use(old)
            mb = x.nbytes / 1e6  # GB/s: MB / ms
            print(f"{dt.name:8s} {layout} {shape} {name:8s} fwd {f * 1e3:8.1f} us ({2 * mb / f:6.0f} GB/s) "
                  f"bwd {g * 1e3:8.1f} us ({3 * mb / g:6.0f} GB/s) grids {seen[:2]}", flush=True)


def once(both: bool = False) -> None:
    """One bf16 NCHW 112 x 112 forward and backward through the two-phase kernels (for ncu)."""
    import cupy

    x = cupy.asarray(numpy.random.default_rng(0).standard_normal((128, 64, 112, 112), dtype=numpy.float32))
    x = x.astype(BFLOAT16)
    w, b = cupy.ones(64, numpy.float32), cupy.zeros(64, numpy.float32)
    for on in (True, False) if both else (True, True):
        _use({"USE_TWO_PHASE": on})
        _, mean, rstd = cunorm.batch_norm(x, w, b, return_stats=True)
        cunorm.batch_norm_backward(x, x, w, b, mean, rstd)
    cupy.cuda.runtime.deviceSynchronize()


if __name__ == "__main__":
    import sys

    if sys.argv[1:] in (["--once"], ["--once2"]):
        once(sys.argv[1] == "--once2")
    else:
        main()
