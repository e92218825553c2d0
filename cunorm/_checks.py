"""Argument checks shared by every public function, whichever array library runs it.

Every failure raises TypeError (wrong kind or dtype) or ValueError (wrong value or shape)
whose message starts with the argument's name.
"""
from __future__ import annotations

import math
import numbers

import numpy

try:  # bfloat16 NumPy/CuPy arrays use ml_dtypes' scalar type
    import ml_dtypes

    BFLOAT16 = numpy.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a declared dependency
    BFLOAT16 = None

FLOAT_DTYPES = tuple(d for d in (numpy.dtype(numpy.float16), BFLOAT16, numpy.dtype(numpy.float32),
                                 numpy.dtype(numpy.float64)) if d is not None)


def _is_cupy(a) -> bool:
    return type(a).__module__.startswith("cupy")


def backend(**arrays) -> str:
    """'numpy' or 'cupy' for the given (name=array or None) arguments; all must agree (and
    CuPy arrays be on one device)."""
    # the common cases in one cheap pass (a device id from the memory pointer, not a Device
    # object a call); anything else goes the long way, which also words the errors
    kind = device = None
    for a in arrays.values():
        if a is None:
            continue
        t = type(a)
        if t is numpy.ndarray:
            this, dev = "numpy", None
        elif t.__module__.startswith("cupy") and hasattr(a, "data"):
            this, dev = "cupy", a.data.device_id
        else:
            break
        if kind is None:
            kind, device = this, dev
        elif this != kind or dev != device:
            break
    else:
        return kind or "numpy"
    return _backend_checked(arrays)


def _backend_checked(arrays: dict) -> str:
    kinds = {}
    for name, a in arrays.items():
        if a is None:
            continue
        if isinstance(a, numpy.ndarray):
            kinds[name] = "numpy"
        elif _is_cupy(a) and hasattr(a, "data"):
            kinds[name] = "cupy"
        else:
            raise TypeError(f"{name}: expected a NumPy or CuPy array, got {type(a).__name__}")
    if len(set(kinds.values())) > 1:
        detail = ", ".join(f"{n} is {k}" for n, k in kinds.items())
        raise TypeError(f"arrays must all be NumPy or all CuPy ({detail})")
    if any(_is_cupy(a) for a in arrays.values() if a is not None):
        devices = {name: a.device.id for name, a in arrays.items() if a is not None}
        if len(set(devices.values())) > 1:
            detail = ", ".join(f"{n} on cuda:{d}" for n, d in devices.items())
            raise ValueError(f"arrays must be on one device ({detail})")
    return next(iter(kinds.values()), "numpy")


def float_dtype(name: str, a) -> None:
    if a.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: dtype {a.dtype} is not supported "
                        "(float16, bfloat16, float32 or float64)")


def normalized_ndim(x, nd) -> int:
    if isinstance(nd, bool) or not isinstance(nd, numbers.Integral):
        raise TypeError(f"normalized_ndim: expected an int, got {type(nd).__name__}")
    if x.ndim < 1:
        raise ValueError("x: expected an array of rank >= 1, got a 0-d array")
    if not 1 <= nd <= x.ndim:
        raise ValueError(f"normalized_ndim: must be between 1 and x.ndim={x.ndim}, got {nd}")
    return int(nd)


def param(name: str, p, x, nd: int) -> None:
    """weight/bias: a float array of shape x.shape[-nd:]."""
    if p is None:
        return
    float_dtype(name, p)
    if tuple(p.shape) != tuple(x.shape[x.ndim - nd:]):
        raise ValueError(f"{name}: shape {tuple(p.shape)} does not match the normalized shape "
                         f"{tuple(x.shape[x.ndim - nd:])} of x")


def same_shape(name: str, a, x) -> None:
    if tuple(a.shape) != tuple(x.shape):
        raise ValueError(f"{name}: shape {tuple(a.shape)} does not match x's {tuple(x.shape)}")
    if a.dtype != x.dtype:
        raise TypeError(f"{name}: dtype {a.dtype} does not match x's {x.dtype}")


def stats(name: str, s, x, nd: int) -> None:
    """mean/rstd: one value per row, in the accumulation dtype (fp32, fp64 for fp64 x)."""
    lead = tuple(x.shape[: x.ndim - nd])
    rows = math.prod(lead)
    if tuple(s.shape) != lead and not (s.ndim == 1 and s.shape[0] == rows):
        raise ValueError(f"{name}: shape {tuple(s.shape)} does not match x's leading shape {lead}")
    want = acc_dtype(x.dtype)
    if s.dtype != want:
        raise TypeError(f"{name}: dtype {s.dtype} must be {want} for x of dtype {x.dtype}")


def eps(value, dtype, *, default_to_finfo: bool = False) -> float:
    if type(value) is float and 0.0 < value < math.inf:  # the common case, without ABC checks
        return value
    if value is None and default_to_finfo:
        return float(ml_finfo(dtype).eps)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"eps: expected a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"eps: must be finite and > 0, got {value}")
    return value


def momentum(value) -> float:
    """A running-statistics factor: a real number in [0, 1] (NaN fails the comparison)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value <= 1.0:
        raise ValueError(f"momentum: expected a number in [0, 1] or None, got {value!r}")
    return float(value)


_F32, _F64 = numpy.dtype(numpy.float32), numpy.dtype(numpy.float64)


def acc_dtype(dtype) -> numpy.dtype:
    return _F64 if dtype == _F64 else _F32


def ml_finfo(dtype):
    """finfo of a NumPy float dtype or an ml_dtypes one (bfloat16, the FP8 types)."""
    dtype = numpy.dtype(dtype)
    if dtype.type in (numpy.float16, numpy.float32, numpy.float64, numpy.longdouble):
        return numpy.finfo(dtype)
    return ml_dtypes.finfo(dtype)  # (ml_dtypes' own kinds are not reliable: float8_e5m2 reports "f")
