"""The CPU path: the float64 NumPy reference through zero-copy NumPy views, so the wiring
(custom ops, autograd, compile) runs and is tested without a GPU."""
from __future__ import annotations

from typing import Optional

import numpy
import torch

from .. import _checks, reference
from ._common import _NUMPY_DTYPE, _acc, _check_backward, _check_tensors


def _numpy_view(t: Optional[torch.Tensor]):
    if t is None:
        return None
    t = t.detach()
    if t.dtype == torch.bfloat16:  # NumPy knows bfloat16 only through ml_dtypes
        return t.view(torch.int16).numpy().view(_checks.BFLOAT16)
    return t.numpy()


def _from_numpy(a, dtype: torch.dtype) -> torch.Tensor:
    a = numpy.ascontiguousarray(numpy.asarray(a, dtype=_NUMPY_DTYPE[dtype]))
    if dtype == torch.bfloat16:
        return torch.from_numpy(a.view(numpy.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _cpu_forward(x, nd, weight, bias, eps, rms, stats=True):
    _check_tensors(x, nd, weight=weight, bias=bias)
    y, mean, rstd = reference.layer_norm(_numpy_view(x), _numpy_view(weight), _numpy_view(bias), eps,
                                         normalized_ndim=nd, return_stats=True, _rms=rms)
    st = None
    if stats:
        st = _from_numpy(rstd if rms else numpy.stack([mean, rstd]), _acc(x.dtype))
    return _from_numpy(y, x.dtype), st


def _cpu_backward(dy, x, weight, stats, nd, rms, has_bias, need_dw=True):
    _check_tensors(x, nd, weight=weight)
    _check_backward(dy, x, stats, nd, rms)
    s = _numpy_view(stats)
    dx, dw, db = reference.layer_norm_backward(_numpy_view(dy), _numpy_view(x), _numpy_view(weight),
                                               None if rms else s[0], s if rms else s[1],
                                               normalized_ndim=nd, has_bias=has_bias, _rms=rms)
    grad_dtype = x.dtype if weight is None else weight.dtype
    return (_from_numpy(dx, x.dtype), None if dw is None or not need_dw else _from_numpy(dw, grad_dtype),
            None if db is None else _from_numpy(db, grad_dtype))


