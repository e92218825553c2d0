"""Issue 4's precision question from v112b's outcome (NOTES "v112b outcome"): LayerNorm
forward rows whose first element is an outlier (the two passes sum x - x[0]), at row lengths
that reach each forward path (full-row tiles, shared-memory rows, clusters, the split path),
float32 / bf16 / float16: the worst y, mean and rstd error against the float64 reference,
over the tolerance the tests hold (tests/tolerances.py), one line a case (forty-ninth
session; a probe, not a test, while main fails it).

    python benchmarks/probe_outlier_pivot.py
"""
from __future__ import annotations

import os
import sys

import numpy

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import cunorm  # noqa: E402
from cunorm._checks import BFLOAT16  # noqa: E402
from cunorm import reference  # noqa: E402
from tolerances import stats_tol, tol  # noqa: E402

SIZES = (7, 499, 1533, 2049, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 1048576)
# (name, first element, offset of the rest): an outlier pivot above and below, the rest near
# zero; the rest far off with the pivot near zero; an ordinary row
ROWS = (("x0=600", 600.0, 0.0), ("x0=-1e4", -1e4, 0.0), ("x0=0,rest+1e3", 0.0, 1e3), ("plain", None, 0.0))


def worst(actual, expected, rtol, atol) -> float:
    """max |a - e| / (atol + rtol |e|): over 1 fails the tests' assert_close."""
    a, e = numpy.asarray(actual, numpy.float64), numpy.asarray(expected, numpy.float64)
    return float(numpy.max(numpy.abs(a - e) / (atol + rtol * numpy.abs(e))))


def main() -> None:
    import cupy

    rng = numpy.random.default_rng(0)
    for dtype in (numpy.dtype(numpy.float32), BFLOAT16, numpy.dtype(numpy.float16)):
        for n in SIZES:
            hx = rng.standard_normal((len(ROWS), n)).astype(numpy.float32)
            for i, (_, first, offset) in enumerate(ROWS):
                hx[i] += offset
                if first is not None:
                    hx[i, 0] = first
            if dtype == numpy.float16:
                hx = numpy.clip(hx, -6e4, 6e4)
            hx = hx.astype(dtype)
            hw = (1 + 0.1 * rng.standard_normal(n)).astype(dtype)
            hb = (0.1 * rng.standard_normal(n)).astype(dtype)
            y, mean, rstd = cunorm.layer_norm(cupy.asarray(hx), cupy.asarray(hw), cupy.asarray(hb), return_stats=True)
            ry, rmean, rrstd = reference.layer_norm(hx, hw, hb, return_stats=True)
            y, mean, rstd = (cupy.asnumpy(v).astype(numpy.float64) for v in (y, mean, rstd))
            rt, at = tol(dtype)
            st = stats_tol(dtype)
            cells = []
            for i, (name, _, _) in enumerate(ROWS):
                wy = worst(y[i], ry[i], rt, at)
                wm = worst(mean[i], rmean[i], st, st * 50)
                wr = worst(rstd[i], rrstd[i], st, st)
                flag = "FAIL" if max(wy, wm, wr) > 1 else "ok"
                cells.append(f"{name} {flag} y {wy:.2f} mean {wm:.2f} rstd {wr:.2f}")
            print(f"{dtype.name:8s} N={n:<8d} " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
