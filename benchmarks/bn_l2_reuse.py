"""Whether a BatchNorm apply pass gets x (and dy) from L2, without a profiler's replay: each
training forward and backward at issue 5's shapes is timed as it runs, and again with a
read of a 128 MiB buffer launched between the first pass and the apply pass (evicting
whatever the first pass left in the 60 MB L2), less that read's own time. If the apply
pass reuses what the first pass left in L2, the flushed call is slower; if not (what ncu
showed with --cache-control none, NOTES "Where the BatchNorm passes' second read comes
from"), the two times agree.

    python benchmarks/bn_l2_reuse.py
"""
from __future__ import annotations

import cupy
import numpy

import cunorm
from cunorm._checks import BFLOAT16
from cunorm.ops import _batch_norm
from _l2_flush import start, timed  # benchmarks/ is the script's directory
from sweep_bn_config import SHAPES

FLUSH_BYTES = 128 << 20  # twice the H200's L2


def main() -> None:
    stream, flush, flush_us = start(__doc__, FLUSH_BYTES)
    for shape in SHAPES:
        for dtype in (BFLOAT16, numpy.dtype(numpy.float32)):
            for cl in (False, True):
                phys = (shape[0], *shape[2:], shape[1]) if cl else shape
                axis = -1 if cl else 1
                x = cupy.asarray(numpy.random.default_rng(0).standard_normal(phys).astype(numpy.float32)).astype(dtype)
                dy = x.copy()
                w, b = cupy.ones(shape[1], numpy.float32), cupy.zeros(shape[1], numpy.float32)
                _, mean, rstd = cunorm.batch_norm(x, w, b, channel_axis=axis, return_stats=True)
                fwd = lambda: cunorm.batch_norm(x, w, b, channel_axis=axis)
                bwd = lambda: cunorm.batch_norm_backward(dy, x, w, b, mean, rstd, channel_axis=axis)
                f0, f1 = timed(_batch_norm, fwd, stream), timed(_batch_norm, fwd, stream, flush) - flush_us
                b0, b1 = timed(_batch_norm, bwd, stream), timed(_batch_norm, bwd, stream, flush) - flush_us
                print(f"{dtype.name:8s} {'nhwc' if cl else 'nchw'} {str(shape):20s} forward {f0:6.1f} us, L2 flushed "
                      f"before the apply {f1:6.1f} us ({f1 / f0:.2f}); backward {b0:6.1f} us, flushed {b1:6.1f} us "
                      f"({b1 / b0:.2f})")


if __name__ == "__main__":
    main()
