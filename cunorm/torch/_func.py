"""LayerNorm and RMSNorm under torch.func transforms (grad, vjp, jacrev, jacfwd, hessian,
vmap): an autograd Function in the setup_context form, which functorch requires (the eager
Functions keep ctx in forward for their prepared backward; torch's Function behind a custom
op's register_autograd lacks the form, and its backward op cannot take functorch's wrapped
tensors). The forward runs the kernels (functorch hands it plain tensors; vmap's rule moves
the batch axis in front of x's leading axes, one call for the whole batch). The backward
and the forward-mode jvp are written in torch ops on statistics recomputed from x, so every
transform, and derivatives of any order, compose through them: the kernels' saved
statistics are constants to autograd, and a formula on them would give wrong second
derivatives."""
from __future__ import annotations

import torch

from ._common import _acc
from ._ops import _forward_impl


def _normalized(x, nd: int, weight, eps: float, rms: bool):
    """(xhat, rstd, the normalized axes, the leading axes, w) in the accumulation dtype, as
    differentiable torch ops; w is None without a weight."""
    acc = _acc(x.dtype)
    xa = x.to(acc)
    axes = tuple(range(x.ndim - nd, x.ndim))
    centred = xa if rms else xa - xa.mean(axes, keepdim=True)
    rstd = torch.rsqrt(centred.square().mean(axes, keepdim=True) + eps)
    w = None if weight is None else weight.to(acc)
    return centred * rstd, rstd, axes, tuple(range(x.ndim - nd)), w


def grads(dy, x, weight, nd: int, eps: float, rms: bool, bias_dtype):
    """(dx, None, dweight, dbias, None) of y = norm(x) in torch ops on statistics recomputed
    from x: differentiable again (torch.func's backward; the eager backward under
    create_graph). dweight None without a weight, dbias None where bias_dtype is None."""
    xhat, rstd, axes, lead, w = _normalized(x, nd, weight, eps, rms)
    dya = dy.to(xhat.dtype)
    dx = (rstd * _project(dya if w is None else dya * w, xhat, axes, rms)).to(x.dtype)
    dw = None if weight is None else _over(dya * xhat, lead).to(weight.dtype)
    db = None if bias_dtype is None else _over(dya, lead).to(bias_dtype)
    return dx, None, dw, db, None


def _project(v, xhat, axes: tuple, rms: bool):
    """v less its parts along xhat and (LayerNorm) the constant row: the derivative of xhat,
    a symmetric map, so the backward (on w dy) and the jvp (on the tangent) share it."""
    v = v - (v * xhat).mean(axes, keepdim=True) * xhat
    return v if rms else v - v.mean(axes, keepdim=True)


def _over(t, lead: tuple):
    """t summed over the leading axes: none for a single row (sum over () reduces them all)."""
    return t.sum(lead) if lead else t


class _NormFunc(torch.autograd.Function):
    """(y, stats) = norm(x); inputs (x, nd, weight, bias, eps, rms); bias is None for RMSNorm."""

    @staticmethod
    def forward(x, nd, weight, bias, eps, rms):
        return _forward_impl(x, nd, weight, bias, eps, rms)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, nd, weight, bias, eps, rms = inputs
        ctx.save_for_backward(x, weight)
        ctx.save_for_forward(x, weight)
        ctx.nd, ctx.eps, ctx.rms = nd, eps, rms
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx, dy, _dstats):
        x, weight = ctx.saved_tensors
        return (*grads(dy, x, weight, ctx.nd, ctx.eps, ctx.rms, ctx.bias_dtype), None)

    @staticmethod
    def jvp(ctx, tx, _tnd, tw, tb, _teps, _trms):
        x, weight = ctx.saved_tensors
        xhat, rstd, axes, _, w = _normalized(x, ctx.nd, weight, ctx.eps, ctx.rms)
        ty = torch.zeros_like(xhat) if tx is None else rstd * _project(tx.to(xhat.dtype), xhat, axes, ctx.rms)
        if w is not None:
            ty = ty * w
        if tw is not None:
            ty = ty + xhat * tw.to(xhat.dtype)
        if tb is not None:
            ty = ty + tb.to(xhat.dtype)
        return ty.to(x.dtype), None

    @staticmethod
    def vmap(info, in_dims, x, nd, weight, bias, eps, rms):
        x_dim, _, w_dim, b_dim, _, _ = in_dims
        if x_dim is None and w_dim is None and b_dim is None:  # jacfwd: only the tangents batched
            return _NormFunc.apply(x, nd, weight, bias, eps, rms), (None, None)
        if w_dim is not None or b_dim is not None:  # per-sample parameters: one call a sample
            def pick(t, d, i):
                return t if t is None or d is None else t.select(d, i)
            outs = [_NormFunc.apply(pick(x, x_dim, i), nd, pick(weight, w_dim, i), pick(bias, b_dim, i), eps, rms)
                    for i in range(info.batch_size)]
            return (torch.stack([o[0] for o in outs]), torch.stack([o[1] for o in outs])), (0, 0)
        y, stats = _NormFunc.apply(x.movedim(x_dim, 0), nd, weight, bias, eps, rms)
        # LayerNorm's stats are (2, *lead): the batch axis, first of lead, is their second
        return (y, stats), (0, 0 if rms else 1)


def norm(x, nd, weight, bias, eps, rms) -> torch.Tensor:
    """y of LayerNorm (rms False) or RMSNorm under torch.func transforms."""
    return _NormFunc.apply(x, nd, weight, bias, eps, rms)[0]
