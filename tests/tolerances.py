"""Per-dtype tolerances against the float64 reference (computed from the same rounded inputs).

Outputs are rounded once to their dtype; the fp32 arithmetic adds far less. Reductions over
rows (dweight, dbias) grow like sqrt(rows), so their absolute tolerance scales with it.
"""
from __future__ import annotations

import math

import numpy

from cunorm._checks import BFLOAT16

# (rtol, atol) for values of order 1
_TOL = {
    numpy.dtype(numpy.float64): (1e-9, 1e-9),
    numpy.dtype(numpy.float32): (2e-5, 2e-5),
    numpy.dtype(numpy.float16): (2e-3, 2e-3),
    BFLOAT16: (1.6e-2, 1.6e-2),
}
# Statistics are fp32 (fp64) whatever x is: the sum over N values may round log2(N) times.
_STATS_TOL = {numpy.dtype(numpy.float64): 1e-10}


def tol(dtype) -> tuple[float, float]:
    return _TOL[numpy.dtype(dtype)]


def stats_tol(x_dtype) -> float:
    return _STATS_TOL.get(numpy.dtype(x_dtype), 2e-5)


def reduction_tol(dtype, rows: int) -> tuple[float, float]:
    rtol, atol = tol(dtype)
    return rtol, atol * math.sqrt(max(rows, 1))


def to_numpy(a):
    """float64 NumPy copy of a NumPy or CuPy array."""
    if a is None:
        return None
    if type(a).__module__.startswith("torch"):  # bf16 tensors have no NumPy view
        return a.detach().cpu().double().numpy()
    if type(a).__module__.startswith("cupy"):
        a = a.get()
    return numpy.asarray(a, dtype=numpy.float64)


def assert_close(name, actual, expected, rtol, atol):
    actual, expected = to_numpy(actual), to_numpy(expected)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    assert not numpy.isnan(actual).any() or numpy.isnan(expected).any(), f"{name}: NaN (unwritten?) in output"
    bad = ~numpy.isclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
    if bad.any():
        i = numpy.argwhere(bad)[0]
        raise AssertionError(f"{name}: {bad.sum()} of {bad.size} elements off; first at {tuple(i)}: "
                             f"{actual[tuple(i)]} vs {expected[tuple(i)]} (rtol={rtol}, atol={atol})")


def fp8_step(v, dtype):
    """The spacing of an FP8 format's grid at |v| (its subnormal spacing below the normal
    range): FP8 outputs may sit one step off where float32 arithmetic put a value across a
    rounding boundary."""
    import ml_dtypes

    info = ml_dtypes.finfo(dtype)
    e = numpy.floor(numpy.log2(numpy.maximum(numpy.abs(v), float(info.smallest_normal))))
    return numpy.exp2(e - info.nmant)
