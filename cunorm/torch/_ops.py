"""The custom ops (torch.compile and export trace these) and the device dispatch both the
ops and the eager autograd.Functions call."""
from __future__ import annotations

from typing import Optional

import torch

from ._common import _acc, _as_dtype, _stats_shape
from ._cpu import _cpu_backward, _cpu_forward
from ._cuda import _cuda_backward, _cuda_forward


def _forward_impl(x, nd, weight, bias, eps, rms, stats=True):
    """(y, stats or None) on x's device."""
    if x.is_cuda:
        return _cuda_forward(x, nd, weight, bias, eps, rms, stats)[:2]
    return _cpu_forward(x, nd, weight, bias, eps, rms, stats)


def _backward_impl(dy, x, weight, stats, nd, rms, has_bias, need_dw=True):
    """(dx, dweight or None, dbias or None) on x's device."""
    if x.is_cuda:
        return _cuda_backward(dy, x, weight, stats, nd, rms, has_bias, need_dw)
    return _cpu_backward(dy, x, weight, stats, nd, rms, has_bias, need_dw)


# ---- the custom ops ------------------------------------------------------------------------
# Absent gradients come back as empty (0,) tensors: custom ops cannot return None. The
# statistics travel as one tensor (see _stats_shape): outputs of a custom op may not alias.

def _or_empty(g: Optional[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((0,)) if g is None else g


@torch.library.custom_op("cunorm::layer_norm_fwd", mutates_args=())
def _layer_norm_fwd(x: torch.Tensor, normalized_ndim: int, weight: Optional[torch.Tensor],
                    bias: Optional[torch.Tensor], eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward_impl(x, normalized_ndim, weight, bias, eps, rms=False)


@torch.library.custom_op("cunorm::layer_norm_bwd", mutates_args=())
def _layer_norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor], stats: torch.Tensor,
                    normalized_ndim: int, has_bias: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dx, dw, db = _backward_impl(dy, x, weight, stats, normalized_ndim, False, has_bias)
    return dx, _or_empty(dw, x), _or_empty(db, x)


@torch.library.custom_op("cunorm::rms_norm_fwd", mutates_args=())
def _rms_norm_fwd(x: torch.Tensor, normalized_ndim: int, weight: Optional[torch.Tensor],
                  eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward_impl(x, normalized_ndim, weight, None, eps, rms=True)


@torch.library.custom_op("cunorm::rms_norm_bwd", mutates_args=())
def _rms_norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor], stats: torch.Tensor,
                  normalized_ndim: int) -> tuple[torch.Tensor, torch.Tensor]:
    dx, dw, _ = _backward_impl(dy, x, weight, stats, normalized_ndim, True, False)
    return dx, _or_empty(dw, x)


def _fake_forward(x, nd, rms):
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            x.new_empty(_stats_shape(x, nd, rms), dtype=_acc(x.dtype)))


def _fake_grads(x, weight, nd, has_bias):
    norm_shape = x.shape[x.ndim - nd:]
    grad_dtype = x.dtype if weight is None else weight.dtype
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            x.new_empty(norm_shape if weight is not None else (0,), dtype=grad_dtype),
            x.new_empty(norm_shape if has_bias else (0,), dtype=grad_dtype))


@_layer_norm_fwd.register_fake
def _(x, normalized_ndim, weight, bias, eps):
    return _fake_forward(x, normalized_ndim, False)


@_layer_norm_bwd.register_fake
def _(dy, x, weight, stats, normalized_ndim, has_bias):
    return _fake_grads(x, weight, normalized_ndim, has_bias)


@_rms_norm_fwd.register_fake
def _(x, normalized_ndim, weight, eps):
    return _fake_forward(x, normalized_ndim, True)


@_rms_norm_bwd.register_fake
def _(dy, x, weight, stats, normalized_ndim):
    dx, dw, _ = _fake_grads(x, weight, normalized_ndim, False)
    return dx, dw


def _layer_norm_setup(ctx, inputs, output):
    x, nd, weight, bias, _ = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.nd = nd
    ctx.bias_dtype = None if bias is None else bias.dtype
    ctx.mark_non_differentiable(output[1])


def _reducing_weight(weight, bias_dtype):
    """The weight the backward reduces with: float32 when the bias has another dtype, so each
    parameter's gradient is rounded once, to its own dtype (torch rejects such pairs)."""
    if weight is None or bias_dtype is None or bias_dtype == weight.dtype:
        return weight
    return weight.float()


def _layer_norm_grad(ctx, dy, _dstats):
    x, weight, stats = ctx.saved_tensors
    has_bias = ctx.bias_dtype is not None
    w = _reducing_weight(weight, ctx.bias_dtype)
    dx, dw, db = torch.ops.cunorm.layer_norm_bwd(dy, x, w, stats, ctx.nd, has_bias)
    return (dx, None, None if weight is None else _as_dtype(dw, weight.dtype),
            _as_dtype(db, ctx.bias_dtype) if has_bias else None, None)


def _rms_norm_setup(ctx, inputs, output):
    x, nd, weight, _ = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.nd = nd
    ctx.mark_non_differentiable(output[1])


def _rms_norm_grad(ctx, dy, _dstats):
    x, weight, stats = ctx.saved_tensors
    dx, dw = torch.ops.cunorm.rms_norm_bwd(dy, x, weight, stats, ctx.nd)
    return dx, None, dw if weight is not None else None, None


_layer_norm_fwd.register_autograd(_layer_norm_grad, setup_context=_layer_norm_setup)
_rms_norm_fwd.register_autograd(_rms_norm_grad, setup_context=_rms_norm_setup)


