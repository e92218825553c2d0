"""BatchNorm's question from "Rows whose first element is an outlier" (NOTES): the training
forward sums each channel about its first element (x[0, c, 0, 0]) and folds var = q / n -
shift^2; a channel whose first element is an outlier (600 among N(0, 1) values; -1e4; and
1e3 + N(0, 1) with a first element 0) against the float64 reference, at shapes that reach the
staged, span, passes and two-phase paths, both layouts, float32 and bf16: the worst y, mean and
rstd error over the tests' tolerance, one line a case (over 1 fails assert_close).

    python benchmarks/probe_bn_outlier_pivot.py
"""
from __future__ import annotations

import os
import sys

import numpy

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import cunorm  # noqa: E402
from cunorm import reference  # noqa: E402
from cunorm._checks import BFLOAT16  # noqa: E402
from tolerances import tol  # noqa: E402
from probe_outlier_pivot import worst  # noqa: E402  (benchmarks/ is the script's directory)

SHAPES = ((8, 16, 7, 7), (16, 32, 28, 28), (8, 64, 56, 56), (4, 8, 112, 112), (2, 4, 224, 224))


def main() -> None:
    import cupy

    rng = numpy.random.default_rng(0)
    for dtype in (numpy.dtype(numpy.float32), BFLOAT16):
        for shape in SHAPES:
            for axis in (1, -1):
                n, c = shape[0], shape[1]
                phys = shape if axis == 1 else (n, *shape[2:], c)
                hx = rng.standard_normal(phys).astype(numpy.float32)
                idx = lambda ch: (0, ch, 0, 0) if axis == 1 else (0, 0, 0, ch)  # noqa: E731
                hx[idx(0)] = 600.0
                hx[idx(1)] = -1e4
                sl = (slice(None), 2) if axis == 1 else (Ellipsis, 2)
                hx[sl] += 1e3
                hx[idx(2)] = 0.0
                hx = hx.astype(dtype)
                hw = numpy.ones(c, numpy.float32)
                hb = numpy.zeros(c, numpy.float32)
                y, mean, rstd = cunorm.batch_norm(cupy.asarray(hx), cupy.asarray(hw), cupy.asarray(hb),
                                                  channel_axis=axis, return_stats=True)
                ry, rmean, rrstd = reference.batch_norm(hx, hw, hb, channel_axis=axis, return_stats=True)
                y, mean, rstd = (cupy.asnumpy(v).astype(numpy.float64) for v in (y, mean, rstd))
                rt, at = tol(dtype)
                cells = []
                for ch, name in ((0, "x0=600"), (1, "x0=-1e4"), (2, "x0=0,rest+1e3"), (3, "plain")):
                    take = (slice(None), ch) if axis == 1 else (Ellipsis, ch)
                    wy = worst(y[take], ry[take], rt, at)
                    wm = worst(mean[ch], rmean[ch], 1e-5, 1e-5)
                    wr = worst(rstd[ch], rrstd[ch], 1e-4, 1e-4)
                    flag = "FAIL" if max(wy, wm, wr) > 1 else "ok"
                    cells.append(f"{name} {flag} y {wy:.2g} mean {wm:.2g} rstd {wr:.2g}")
                lay = "nchw" if axis == 1 else "nhwc"
                print(f"{dtype.name:8s} {lay} {str(shape):18s} " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
