"""The fused options (issue 7) in torch: residual add, weight offset, output dtype and FP8 with
scale and amax, forward and backward, as two custom ops with autograd.

CUDA tensors go through kernels/layer_norm_fused.cu (``ops/_fused`` plans, torch-allocated
outputs, torch's current stream) where it serves the call, else the plain cunorm ops composed
with torch element-wise work; CPU tensors through the float64 references (the wiring is
tested without a GPU). Outputs of a custom op are tensors: an absent h or amax comes back as
an empty (0,) tensor, and the statistics as _common._stats_shape says.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import ml_dtypes
import numpy
import torch

from .. import _checks
from .._launch import make_current
from ..ops import _fused, _fused_api
from . import _forward_ad
from ._common import _NUMPY_DTYPE, _TORCH_DTYPE, _acc, _check_tensors, _stats_shape
from ._cpu import _from_numpy, _numpy_view
from ._cuda import _Scratch, _addressable, _params, _stream
from ._ops import _backward_impl, _forward_impl

FP8_TORCH = {torch.float8_e4m3fn: numpy.dtype(ml_dtypes.float8_e4m3fn),
             torch.float8_e5m2: numpy.dtype(ml_dtypes.float8_e5m2)}
_ANY_NUMPY = {**_NUMPY_DTYPE, **FP8_TORCH}
_ANY_TORCH = {v: k for k, v in _ANY_NUMPY.items()}


class _Meta(NamedTuple):  # what _fused_api's checks read of an array
    shape: tuple
    dtype: numpy.dtype
    ndim: int


def _meta(t):
    return None if t is None else _Meta(tuple(t.shape), _NUMPY_DTYPE[t.dtype], t.ndim)


def _numpy_dtype(name: str, dtype) -> Optional[numpy.dtype]:
    if dtype is None:
        return None
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{name}: expected a torch.dtype, got {dtype!r}")
    if dtype not in _ANY_NUMPY:
        raise TypeError(f"{name}: {dtype} is not supported (float16, bfloat16, float32, float64, or for "
                        "out_dtype torch.float8_e4m3fn / torch.float8_e5m2)")
    return _ANY_NUMPY[dtype]


def options_set(residual, residual_dtype, weight_offset, out_dtype, out_scale, return_amax) -> bool:
    """Whether a fused option differs from its default (the plain call checks none of them)."""
    return not (residual is None and residual_dtype is None and not weight_offset and out_dtype is None
                and out_scale is None and not return_amax)


def options(input, weight, residual, residual_dtype, weight_offset, out_dtype, out_scale, return_amax):
    """The checked options (``_fused_api.FusedOptions`` with NumPy dtypes), or None when none
    is set. Errors name the argument."""
    if not options_set(residual, residual_dtype, weight_offset, out_dtype, out_scale, return_amax):
        return None
    if input.dtype not in _NUMPY_DTYPE:
        raise TypeError(f"input: dtype {input.dtype} is not supported (float16, bfloat16, float32, float64)")
    if residual is not None:
        if not isinstance(residual, torch.Tensor):
            raise TypeError(f"residual: expected a torch.Tensor, got {type(residual).__name__}")
        if residual.dtype not in _NUMPY_DTYPE:
            raise TypeError(f"residual: dtype {residual.dtype} is not supported (float16, bfloat16, float32, "
                            "float64)")
        if residual.device != input.device:
            raise ValueError(f"residual: on {residual.device}, input on {input.device}")
    opts = _fused_api.options(_meta(input), weight, _meta(residual), _numpy_dtype("residual_dtype", residual_dtype),
                              weight_offset, _numpy_dtype("out_dtype", out_dtype), out_scale, return_amax)
    if opts is None:
        return None
    # the torch-side options carry torch dtypes, taken from the arguments: a NumPy dtype as a
    # dict key breaks torch.compile's tracing (dynamo cannot hash it)
    return opts._replace(residual=residual, out_dtype=input.dtype if out_dtype is None else out_dtype,
                         residual_dtype=None if residual is None else residual_dtype or residual.dtype)


def fp8(dtype: numpy.dtype) -> bool:
    return dtype in _fused_api.FP8_DTYPES


# ---- forward --------------------------------------------------------------------------------

def forward(x, nd, weight, bias, eps, rms, residual, residual_dtype, weight_offset, out_dtype, out_scale, amax,
            save_stats=True):
    """(y, h or empty, stats or empty, amax or empty) on x's device; the dtypes are torch's.
    Without save_stats (inference: nothing will call the backward) the statistics are not
    written."""
    opts = _fused_api.FusedOptions(residual, None if residual_dtype is None else _ANY_NUMPY[residual_dtype],
                                   weight_offset, _ANY_NUMPY[out_dtype], out_scale, amax)
    if not x.is_cuda:
        out = _cpu_forward(x, nd, weight, bias, eps, rms, opts)
    else:
        with torch.cuda.device(x.get_device()):
            out = _cuda_fused_forward(x, nd, weight, bias, eps, rms, opts, save_stats)
            if out is None:
                out = _composed_forward(x, nd, weight, bias, eps, rms, opts, save_stats)
    return out if save_stats else (out[0], out[1], _empty(x), out[3])


def _empty(x):
    return x.new_empty((0,))


def _cpu_forward(x, nd, weight, bias, eps, rms, opts):
    np_opts = opts._replace(residual=_numpy_view(opts.residual))
    y, h, stats, amax = _fused_api.numpy_forward(_numpy_view(x), _numpy_view(weight), _numpy_view(bias), eps, nd,
                                                 rms, np_opts)
    st = _from_numpy(stats[-1] if rms else numpy.stack(stats), _acc(x.dtype))
    return (_tensor(y, opts.out_dtype), _empty(x) if h is None else _tensor(h, opts.residual_dtype), st,
            _from_numpy(amax, torch.float32).reshape(()) if opts.return_amax else _empty(x))


def _tensor(a, dtype: numpy.dtype) -> torch.Tensor:
    """A NumPy array as a torch tensor of the matching dtype (FP8 through its bytes)."""
    if fp8(dtype):
        return torch.from_numpy(numpy.ascontiguousarray(a).view(numpy.uint8)).view(_ANY_TORCH[dtype])
    return _from_numpy(a, _TORCH_DTYPE[dtype])


def _cuda_fused_forward(x, nd, weight, bias, eps, rms, opts, save_stats):
    """One launch of the fused kernel, or None where it does not serve the call."""
    if x.numel() == 0:
        return None
    r = opts.residual
    x = _addressable(x, nd)
    r = None if r is None else _addressable(r, nd)
    weight, bias = _params(x, weight, bias)
    y = torch.empty(x.shape, dtype=_ANY_TORCH[opts.out_dtype], device=x.device)
    h = None if r is None else torch.empty(x.shape, dtype=_TORCH_DTYPE[opts.residual_dtype], device=x.device)
    st = torch.empty(_stats_shape(x, nd, rms), dtype=_acc(x.dtype), device=x.device) if save_stats else None
    bits = torch.zeros((), dtype=torch.int32, device=x.device) if opts.return_amax else None
    arrays = [a for a in (x, r, h, y, weight, bias) if a is not None]
    plan = _fused.fused_forward_plan(
        tuple(x.shape), tuple(x.stride()), None if r is None else tuple(r.stride()), _NUMPY_DTYPE[x.dtype],
        _NUMPY_DTYPE[(r if r is not None else x).dtype], _NUMPY_DTYPE[(h if h is not None else x).dtype],
        opts.out_dtype, _NUMPY_DTYPE[(weight if weight is not None else x).dtype], nd, rms, x.get_device(),
        tuple((a.data_ptr() % 16, a.element_size()) for a in arrays))
    if plan is None:
        return None
    ptr = lambda t: 0 if t is None else t.data_ptr()  # noqa: E731
    sp = 0 if st is None else st.data_ptr()  # null: the kernel skips the statistics
    mean, rstd = (0, sp) if rms or not sp else (sp, sp + plan.m * 4)
    make_current(x.get_device())
    _fused.run_fused_forward(plan, x.data_ptr(), ptr(r), ptr(h), y.data_ptr(), ptr(weight), ptr(bias), mean, rstd,
                             ptr(bits), eps, opts.weight_offset, opts.out_scale, _stream(x.get_device()))
    return (y, _empty(x) if h is None else h, _empty(x) if st is None else st,
            _empty(x) if bits is None else bits.view(torch.float32))


def _composed_forward(x, nd, weight, bias, eps, rms, opts, save_stats):
    """The plain ops on h = x + residual summed in the accumulation dtype, weight + offset in
    it too, then the output cast (FP8: scaled, clamped to the format's range, rounded)."""
    acc = _acc(x.dtype)
    hs = x.to(acc) if opts.residual is None else x.to(acc) + opts.residual.to(acc)
    w = weight
    if weight is not None and opts.weight_offset:
        w = weight.to(acc) + opts.weight_offset
    if bias is not None and w is not None and bias.dtype != w.dtype:
        bias = bias.to(w.dtype)
    y_acc, st = _forward_impl(hs, nd, w, bias, eps, rms, stats=save_stats)
    amax = y_acc.abs().amax().float() if y_acc.numel() else y_acc.new_zeros((), dtype=torch.float32)
    out = _ANY_TORCH[opts.out_dtype]
    if fp8(opts.out_dtype):
        top = float(_checks.ml_finfo(opts.out_dtype).max)
        y = (y_acc.float() * opts.out_scale).clamp(-top, top).to(out)
    else:
        y = y_acc.to(out)
    h = _empty(x) if opts.residual is None else hs.to(_TORCH_DTYPE[opts.residual_dtype])
    return y, h, _empty(x) if st is None else st.to(acc), amax if opts.return_amax else _empty(x)


# ---- backward -------------------------------------------------------------------------------

def backward(dy, dh, h, weight, stats, nd, rms, has_bias, weight_offset, dx_dtype, dres_dtype):
    """(dx in dx_dtype, the residual's gradient in dres_dtype or empty, dweight or None,
    dbias or None); h is the normalized tensor (x + residual, or x)."""
    if not h.is_cuda:
        return _cpu_backward(dy, dh, h, weight, stats, nd, rms, has_bias, weight_offset, dx_dtype, dres_dtype)
    with torch.cuda.device(h.get_device()):
        out = _cuda_fused_backward(dy, dh, h, weight, stats, nd, rms, has_bias, weight_offset, dx_dtype, dres_dtype)
        if out is not None:
            return out
        return _composed_backward(dy, dh, h, weight, stats, nd, rms, has_bias, weight_offset, dx_dtype, dres_dtype)


def _cpu_backward(dy, dh, h, weight, stats, nd, rms, has_bias, weight_offset, dx_dtype, dres_dtype):
    from .. import reference

    s = _numpy_view(stats)
    dx, dw, db = reference.layer_norm_backward(
        _numpy_view(dy), _numpy_view(h), _numpy_view(weight), None if rms else s[0], s if rms else s[1],
        normalized_ndim=nd, has_bias=has_bias, dh=_numpy_view(dh), weight_offset=weight_offset, _rms=rms)
    grad = h.dtype if weight is None else weight.dtype
    # a custom op's outputs may not alias each other: the residual's gradient is its own copy
    return (_from_numpy(dx, dx_dtype), _empty(h) if dres_dtype is None else _from_numpy(dx.copy(), dres_dtype),
            None if dw is None else _from_numpy(dw, grad), None if db is None else _from_numpy(db, grad))


def _cuda_fused_backward(dy, dh, h, weight, stats, nd, rms, has_bias, weight_offset, dx_dtype, dres_dtype):
    if h.numel() == 0 or (dh is not None and dh.dtype != h.dtype) or (dres_dtype not in (None, h.dtype)):
        return None
    h, dy = _addressable(h, nd), _addressable(dy, nd)
    dh = None if dh is None else dh.contiguous()
    w, _ = _params(dy, weight, None)  # the kernel pairs the weight with dy's dtype
    grad = h.dtype if weight is None else weight.dtype
    arrays = [a for a in (dy, h, dh, w) if a is not None]
    plan = _fused.fused_backward_plan(
        tuple(h.shape), tuple(h.stride()), tuple(dy.stride()), _NUMPY_DTYPE[dy.dtype], _NUMPY_DTYPE[h.dtype],
        _NUMPY_DTYPE[dx_dtype], _NUMPY_DTYPE[(w if w is not None else dy).dtype], _NUMPY_DTYPE[grad], nd, rms,
        h.get_device(), tuple((a.data_ptr() % 16, a.element_size()) for a in arrays))
    if plan is None:
        return None
    dx = torch.empty(h.shape, dtype=dx_dtype, device=h.device)
    dres = None if dres_dtype is None else torch.empty(h.shape, dtype=dres_dtype, device=h.device)
    norm_shape = h.shape[h.ndim - nd:]
    dw = torch.empty(norm_shape, dtype=grad, device=h.device) if weight is not None else None
    db = torch.empty(norm_shape, dtype=grad, device=h.device) if has_bias else None
    st = stats.contiguous().float()
    sp = st.data_ptr()
    mean, rstd = (0, sp) if rms else (sp, sp + plan.m * 4)
    ptr = lambda t: 0 if t is None else t.data_ptr()  # noqa: E731
    make_current(h.get_device())
    _fused.run_fused_backward(plan, dy.data_ptr(), h.data_ptr(), ptr(dh), ptr(w), mean, rstd, dx.data_ptr(),
                              ptr(dres), ptr(dw), ptr(db), weight_offset, _Scratch(h.get_device()),
                              _stream(h.get_device()))
    return dx, _empty(h) if dres is None else dres, dw, db


def _composed_backward(dy, dh, h, weight, stats, nd, rms, has_bias, weight_offset, dx_dtype, dres_dtype):
    """The plain backward op at the wider of dy's and h's dtypes (neither is rounded to the
    other), weight + offset in the accumulation dtype, dh added in it."""
    wide = dy.dtype if dy.element_size() > h.element_size() else h.dtype
    acc = _acc(wide)
    w = weight
    if weight is not None and weight_offset:
        w = weight.to(acc) + weight_offset
    st = stats.to(_acc(wide))
    dx, dw, db = _backward_impl(dy.to(wide), h.to(wide), w, st, nd, rms, has_bias, weight is not None)
    dx = dx.to(acc)
    if dh is not None:
        dx = dx + dh.to(acc)
    grad = h.dtype if weight is None else weight.dtype
    dw = None if dw is None else dw.to(grad)
    db = None if db is None else db.to(grad)
    # a custom op's outputs may not alias each other (.to returns dx itself at its own dtype)
    return dx.to(dx_dtype), _empty(h) if dres_dtype is None else dx.to(dres_dtype, copy=True), dw, db


# ---- the custom ops -------------------------------------------------------------------------

@torch.library.custom_op("cunorm::fused_norm_fwd", mutates_args=())
def _fused_norm_fwd(x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor],
                    bias: Optional[torch.Tensor], normalized_ndim: int, rms: bool, eps: float,
                    residual_dtype: Optional[torch.dtype], weight_offset: float, out_dtype: torch.dtype,
                    out_scale: float, return_amax: bool, save_stats: bool
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return forward(x, normalized_ndim, weight, bias, eps, rms, residual, residual_dtype, weight_offset, out_dtype,
                   out_scale, return_amax, save_stats)


@_fused_norm_fwd.register_fake
def _(x, residual, weight, bias, normalized_ndim, rms, eps, residual_dtype, weight_offset, out_dtype, out_scale,
      return_amax, save_stats):
    h = x.new_empty((0,)) if residual is None else torch.empty(x.shape, dtype=residual_dtype, device=x.device)
    return (torch.empty(x.shape, dtype=out_dtype, device=x.device), h,
            x.new_empty(_stats_shape(x, normalized_ndim, rms) if save_stats else (0,), dtype=_acc(x.dtype)),
            x.new_empty((), dtype=torch.float32) if return_amax else x.new_empty((0,)))


@torch.library.custom_op("cunorm::fused_norm_bwd", mutates_args=())
def _fused_norm_bwd(dy: torch.Tensor, dh: Optional[torch.Tensor], h: torch.Tensor, weight: Optional[torch.Tensor],
                    stats: torch.Tensor, normalized_ndim: int, rms: bool, has_bias: bool, weight_offset: float,
                    dx_dtype: torch.dtype, dres_dtype: Optional[torch.dtype]
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dx, dres, dw, db = backward(dy, dh, h, weight, stats, normalized_ndim, rms, has_bias, weight_offset, dx_dtype,
                                dres_dtype)
    return dx, dres, h.new_empty((0,)) if dw is None else dw, h.new_empty((0,)) if db is None else db


@_fused_norm_bwd.register_fake
def _(dy, dh, h, weight, stats, normalized_ndim, rms, has_bias, weight_offset, dx_dtype, dres_dtype):
    norm_shape = h.shape[h.ndim - normalized_ndim:]
    grad = h.dtype if weight is None else weight.dtype
    return (torch.empty(h.shape, dtype=dx_dtype, device=h.device),
            h.new_empty((0,)) if dres_dtype is None else torch.empty(h.shape, dtype=dres_dtype, device=h.device),
            h.new_empty(norm_shape if weight is not None else (0,), dtype=grad),
            h.new_empty(norm_shape if has_bias else (0,), dtype=grad))


def _setup(ctx, inputs, output):
    x, residual, weight, bias, nd, rms, _, _, weight_offset, out_dtype, _, _, _ = inputs
    y, h, stats, amax = output
    ctx.save_for_backward(h if residual is not None else x, weight, stats)
    ctx.nd, ctx.rms, ctx.weight_offset = nd, rms, weight_offset
    ctx.x_dtype = x.dtype
    ctx.residual_dtype = None if residual is None else residual.dtype
    ctx.bias_dtype = None if bias is None else bias.dtype
    # one call: each replaces the last one's set; quantized outputs carry no gradient
    ctx.mark_non_differentiable(stats, amax, *((y,) if out_dtype in FP8_TORCH else ()))


def _grad(ctx, dy, dh, _dstats, _damax):
    h, weight, stats = ctx.saved_tensors
    has_bias = ctx.bias_dtype is not None
    if dy is None:
        dy = torch.zeros_like(h, dtype=ctx.x_dtype)
    w = weight if weight is None or not has_bias or ctx.bias_dtype == weight.dtype else weight.float()
    dx, dres, dw, db = torch.ops.cunorm.fused_norm_bwd(
        dy, dh if ctx.residual_dtype is not None else None, h, w, stats, ctx.nd, ctx.rms, has_bias,
        ctx.weight_offset, ctx.x_dtype, ctx.residual_dtype)
    dw = None if weight is None else dw.to(weight.dtype)
    db = db.to(ctx.bias_dtype) if has_bias else None
    return (dx, dres if ctx.residual_dtype is not None else None, dw, db,
            None, None, None, None, None, None, None, None, None)


_fused_norm_fwd.register_autograd(_grad, setup_context=_setup)


def call(input, nd, weight, bias, eps, rms, opts):
    """The fused functional call: y, then h with a residual, then amax with return_amax."""
    _check_tensors(input, nd, weight=weight, bias=bias)
    _forward_ad.refuse(f"cunorm.torch.{'rms_norm' if rms else 'layer_norm'} with fused options", input, weight,
                       bias, opts.residual)
    # the statistics serve only the backward: without one coming (inference) they are not written
    save_stats = torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                                 for t in (input, weight, bias, opts.residual))
    y, h, _, amax = torch.ops.cunorm.fused_norm_fwd(
        input, opts.residual, weight, bias, nd, rms, eps, opts.residual_dtype, opts.weight_offset,
        opts.out_dtype, opts.out_scale, opts.return_amax, save_stats)
    out = (y,) + ((h,) if opts.residual is not None else ()) + ((amax,) if opts.return_amax else ())
    return out if len(out) > 1 else y

