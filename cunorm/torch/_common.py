"""What every part of the PyTorch adapter shares: dtype maps, the argument checks, the
layout of the forward's saved statistics."""
from __future__ import annotations

from typing import Optional

import numpy
import torch

from .. import _checks


_NUMPY_DTYPE = {torch.float16: numpy.dtype(numpy.float16), torch.bfloat16: _checks.BFLOAT16,
                torch.float32: numpy.dtype(numpy.float32), torch.float64: numpy.dtype(numpy.float64)}
_TORCH_DTYPE = {v: k for k, v in _NUMPY_DTYPE.items()}


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _stats_shape(x: torch.Tensor, nd: int, rms: bool) -> tuple:
    """The forward's saved statistics: rstd per row (RMSNorm), [mean; rstd] (LayerNorm)."""
    lead = tuple(x.shape[: x.ndim - nd])
    return lead if rms else (2, *lead)


def _as_dtype(g: Optional[torch.Tensor], dtype) -> Optional[torch.Tensor]:
    return g if g is None or g.dtype == dtype else g.to(dtype)


def _check_tensors(x, nd: int, **params) -> None:
    """Tensors the ops accept: x of a supported dtype with at least ``nd`` axes, parameters
    of x.shape[-nd:] on x's device. Messages start with the argument's name."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"input: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _NUMPY_DTYPE:
        raise TypeError(f"input: dtype {x.dtype} is not supported (float16, bfloat16, float32, float64)")
    if not 1 <= nd <= x.ndim:
        raise ValueError(f"normalized_ndim: must be between 1 and input.ndim={x.ndim}, got {nd}")
    shape = tuple(x.shape[x.ndim - nd:])
    for name, p in params.items():
        if p is None:
            continue
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor or None, got {type(p).__name__}")
        if p.dtype not in _NUMPY_DTYPE:
            raise TypeError(f"{name}: dtype {p.dtype} is not supported")
        if tuple(p.shape) != shape:
            raise ValueError(f"{name}: shape {list(p.shape)} does not match normalized_shape {list(shape)}")
        if p.device != x.device:
            raise ValueError(f"{name}: on {p.device}, input on {x.device}")


def _check_backward(dy, x, stats, nd: int, rms: bool) -> None:
    if not isinstance(dy, torch.Tensor) or dy.shape != x.shape or dy.dtype != x.dtype or dy.device != x.device:
        raise ValueError(f"dy: expected a tensor of input's shape {list(x.shape)}, dtype and device")
    lead = tuple(x.shape[: x.ndim - nd])
    want = lead if rms else (2, *lead)
    if (not isinstance(stats, torch.Tensor) or tuple(stats.shape) != want or stats.dtype != _acc(x.dtype)
            or stats.device != x.device):
        raise ValueError(f"stats: expected the forward's statistics, shape {list(want)}, dtype {_acc(x.dtype)}")


