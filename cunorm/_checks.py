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
    first = next(iter(kinds), None)
    for name, kind in kinds.items():  # the message names the first argument that differs
        if kind != kinds[first]:
            raise TypeError(f"{name}: a {_KIND[kind]} array where {first} is a {_KIND[kinds[first]]} array "
                            "(all NumPy or all CuPy)")
    if any(_is_cupy(a) for a in arrays.values() if a is not None):
        devices = {name: a.device.id for name, a in arrays.items() if a is not None}
        for name, dev in devices.items():
            if dev != devices[first]:
                raise ValueError(f"{name}: on cuda:{dev} where {first} is on cuda:{devices[first]} "
                                 "(arrays must be on one device)")
    return kinds[first] if first is not None else "numpy"


_KIND = {"numpy": "NumPy", "cupy": "CuPy"}


def _data_ptr(a) -> int:
    return a.__array_interface__["data"][0] if isinstance(a, numpy.ndarray) else a.data.ptr


def _byte_bounds(a) -> tuple[int, int]:
    """[first, last + 1) byte addresses an array's elements occupy (NumPy or CuPy)."""
    ptr = _data_ptr(a)  # the address of element (0, ..., 0)
    low = sum(s * (n - 1) for n, s in zip(a.shape, a.strides) if s < 0)
    high = sum(s * (n - 1) for n, s in zip(a.shape, a.strides) if s > 0)
    return ptr + low, ptr + high + a.itemsize


def _addresses(a) -> numpy.ndarray:
    """Every element's first byte address, sorted (for the small arrays updated in place)."""
    offsets = numpy.zeros((), numpy.int64)
    for n, s in zip(a.shape, a.strides):
        offsets = offsets[..., None] + numpy.arange(n, dtype=numpy.int64) * s
    return numpy.sort(_data_ptr(a) + offsets.ravel())


def updated_in_place(updated: dict, inputs: dict, exact_below: int = 1 << 16) -> None:
    """Arrays a call updates in place (name=array or None) must be writable and share no
    memory with each other or with the call's inputs: a kernel would read what another
    block had already written. Overlap is judged by byte bounds, exactly (element by
    element) when both arrays are small, so interleaved statistics are allowed."""
    given = {n: a for n, a in updated.items() if a is not None and a.size}
    for name, a in given.items():
        if isinstance(a, numpy.ndarray) and not a.flags.writeable:
            raise ValueError(f"{name}: read-only array (it is updated in place)")
    others = list(given.items()) + [(n, a) for n, a in inputs.items() if a is not None and a.size]
    for i, (name, a) in enumerate(given.items()):
        for other, b in others[i + 1:]:
            if b is a or _overlap(a, b, exact_below):
                raise ValueError(f"{name}: shares memory with {other} (it is updated in place)")


def _overlap(a, b, exact_below: int) -> bool:
    (alo, ahi), (blo, bhi) = _byte_bounds(a), _byte_bounds(b)
    if ahi <= blo or bhi <= alo:
        return False
    if a.size > exact_below or b.size > exact_below:
        return True  # bounds overlap: judged conservatively for large arrays
    # exactly: some element of a starts within an element of b, or the other way round
    pa, pb = _addresses(a), _addresses(b)
    for p, q, width in ((pa, pb, b.itemsize), (pb, pa, a.itemsize)):
        k = numpy.searchsorted(q, p, "right") - 1  # the last element of q starting at or before p
        if ((k >= 0) & (p - q[numpy.maximum(k, 0)] < width)).any():
            return True
    return False


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


def default_rms_eps(dtype) -> float:
    """RMSNorm's eps when none is given, as torch computes it: the machine epsilon of the
    computation dtype (float32 for float16, bfloat16 and float32 inputs, float64 for float64),
    not of the input's own dtype, whatever torch.nn.functional.rms_norm's docstring says
    (aten's rms_norm takes numeric_limits<opmath_type>::epsilon(); its decomposition
    finfo(float32).eps): for bfloat16 that is 1.19e-7, not 7.8e-3."""
    return float(numpy.finfo(acc_dtype(numpy.dtype(dtype))).eps)


def eps(value, dtype, *, default_to_finfo: bool = False) -> float:
    """A valid eps; ``None`` with ``default_to_finfo`` is RMSNorm's default (default_rms_eps)."""
    if type(value) is float and 0.0 < value < math.inf:  # the common case, without ABC checks
        return value
    if value is None and default_to_finfo:
        return default_rms_eps(dtype)
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
