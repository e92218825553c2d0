"""BatchNorm for PyTorch: custom ops (forward mutating the running statistics, backward),
their CUDA path on torch's allocator and stream, their CPU path through the float64 NumPy
reference, and autograd. The statistics the forward used travel as one (2, C) tensor
[mean; rstd] in float32 (float64 for float64 input)."""
from __future__ import annotations

from typing import Optional

import numpy
import torch

from .. import _checks, activations, reference
from ..ops import _batch_norm
from . import _forward_ad
from ._common import _NUMPY_DTYPE, _TORCH_DTYPE, _acc
from ._cpu import _from_numpy, _numpy_view
from ._cuda import _Scratch, _stream

NO_ACTIVATION = "none"  # custom ops take a str: None travels as this


def _act_name(name: str):
    return None if name == NO_ACTIVATION else name


# ---- CUDA ---------------------------------------------------------------------------------

def _addressed(x: torch.Tensor):
    """(x, layout): x dense and addressable in place (channels_last stays channels_last),
    copied where it is not."""
    lay = _batch_norm.dense_layout(tuple(x.shape), x.stride(), 1)
    if lay is None:  # gaps or overlap: a dense copy, same axis order
        x = x.clone(memory_format=torch.preserve_format)
        lay = _batch_norm.layout(tuple(x.shape), tuple(x.stride()), 1)
    if lay is None:
        x = x.contiguous()
        lay = _batch_norm.layout(tuple(x.shape), tuple(x.stride()), 1)
    return x, lay


def _like(a: Optional[torch.Tensor], x: torch.Tensor):
    if a is None or a.stride() == x.stride():
        return a
    out = torch.empty_like(x)
    out.copy_(a)
    return out


def _ptr(t: Optional[torch.Tensor]) -> int:
    return 0 if t is None else t.data_ptr()


def _cast(ps, dtype):
    return [p if p is None or (p.dtype == dtype and p.is_contiguous()) else p.to(dtype).contiguous() for p in ps]


def _cuda_forward(x, w, b, rm, rv, residual, training, factor, eps, act, param):
    dev = x.get_device()
    with torch.cuda.device(dev):
        x, lay = _addressed(x)
        residual = _like(residual, x)
        y = torch.empty_like(x)
        stats = torch.empty((2, lay.C), dtype=_acc(x.dtype), device=x.device)
        if x.numel() == 0:
            stats.fill_(float("nan"))
            return y, stats
        pdt = _TORCH_DTYPE[_batch_norm.param_dtype(_NUMPY_DTYPE[x.dtype], *(_NUMPY_DTYPE[p.dtype] for p in (w, b)
                                                                           if p is not None))]
        rdt = _TORCH_DTYPE[_batch_norm.param_dtype(_NUMPY_DTYPE[x.dtype], *(_NUMPY_DTYPE[p.dtype] for p in (rm, rv)
                                                                           if p is not None))]
        w2, b2 = _cast((w, b), pdt)
        rm2, rv2 = _cast((rm, rv), rdt)
        phase = _batch_norm.pointer_phase(_ptr(x), _ptr(y), _ptr(residual))
        plan = _batch_norm.plan(lay, _NUMPY_DTYPE[x.dtype], _NUMPY_DTYPE[pdt], phase, dev)
        acc_size = stats.element_size()
        kid, _ = activations.check(act, None if activations.ACTIVATIONS[act][1] is None else param)
        _batch_norm.forward(plan, _ptr(x), _ptr(residual), _ptr(y), _ptr(w2), _ptr(b2), _ptr(rm2), _ptr(rv2),
                            _NUMPY_DTYPE[rdt], stats.data_ptr(), stats.data_ptr() + lay.C * acc_size, training,
                            factor, eps, kid, param, _Scratch(dev), _stream(dev), dev)
        for given, used in ((rm, rm2), (rv, rv2)):
            if training and given is not None and used is not given:
                given.copy_(used)
        return y, stats


def _cuda_backward(dy, x, w, b, stats, residual, training, act, param, has_bias, residual_grad):
    dev = x.get_device()
    with torch.cuda.device(dev):
        x, lay = _addressed(x)
        dy, residual = _like(dy, x), _like(residual, x)
        dx = torch.empty_like(x)
        dres = torch.empty_like(x) if residual_grad else None
        pdt = _TORCH_DTYPE[_batch_norm.param_dtype(_NUMPY_DTYPE[x.dtype], *(_NUMPY_DTYPE[p.dtype] for p in (w, b)
                                                                           if p is not None))]
        w2, b2 = _cast((w, b), pdt)
        dw = torch.empty(lay.C, dtype=pdt, device=x.device) if w is not None else None
        db = torch.empty(lay.C, dtype=pdt, device=x.device) if has_bias else None
        if x.numel() == 0:
            for g in (dw, db):
                if g is not None:
                    g.zero_()
        else:
            stats = stats.contiguous()
            phase = _batch_norm.pointer_phase(_ptr(x), _ptr(dy), _ptr(residual), _ptr(dx), _ptr(dres))
            plan = _batch_norm.plan(lay, _NUMPY_DTYPE[x.dtype], _NUMPY_DTYPE[pdt], phase, dev)
            kid, _ = activations.check(act, None if activations.ACTIVATIONS[act][1] is None else param)
            _batch_norm.backward(plan, _ptr(dy), _ptr(x), _ptr(residual), _ptr(dx), _ptr(dres), _ptr(w2), _ptr(b2),
                                 stats.data_ptr(), stats.data_ptr() + lay.C * stats.element_size(), _ptr(dw),
                                 _ptr(db), training, kid, param, _Scratch(dev), _stream(dev), dev)
        return dx, dw, db, dres


# ---- CPU (the float64 reference) --------------------------------------------------------------

def _cpu_forward(x, w, b, rm, rv, residual, training, factor, eps, act, param):
    rm64 = None if rm is None else rm.detach().double().numpy().copy()
    rv64 = None if rv is None else rv.detach().double().numpy().copy()
    y, mean, rstd = reference.batch_norm(_numpy_view(x), _numpy_view(w), _numpy_view(b), rm64, rv64,
                                         training=training, momentum=factor, eps=eps, residual=_numpy_view(residual),
                                         activation=act, activation_param=param, channel_axis=1, return_stats=True)
    if training:
        for given, new in ((rm, rm64), (rv, rv64)):
            if given is not None:
                given.copy_(torch.from_numpy(new))
    out = _from_numpy(y, x.dtype)
    if x.is_contiguous(memory_format=torch.channels_last) and x.ndim == 4 and not x.is_contiguous():
        out = out.contiguous(memory_format=torch.channels_last)
    return out, _from_numpy(numpy.stack([mean, rstd]), _acc(x.dtype))


def _cpu_backward(dy, x, w, b, stats, residual, training, act, param, has_bias, residual_grad):
    s = stats.detach().double().numpy()
    r = _numpy_view(residual)
    if r is None and residual_grad:
        r = numpy.zeros(tuple(x.shape))
    dx, dw, db, dr = reference.batch_norm_backward(_numpy_view(dy), _numpy_view(x), _numpy_view(w), _numpy_view(b),
                                                   s[0], s[1], residual=r, activation=act, activation_param=param,
                                                   training=training, channel_axis=1, has_bias=has_bias)
    gdt = x.dtype if w is None else w.dtype
    return (_from_numpy(dx, x.dtype), None if dw is None else _from_numpy(dw, gdt),
            None if db is None else _from_numpy(db, gdt), _from_numpy(dr, x.dtype) if residual_grad else None)


# ---- custom ops and autograd ---------------------------------------------------------------

# The forward is functional (autograd cannot be registered on an op that mutates its inputs):
# it returns the updated running statistics, which the caller copies into the buffers.
@torch.library.custom_op("cunorm::batch_norm_fwd", mutates_args=())
def _batch_norm_fwd(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                    running_mean: Optional[torch.Tensor], running_var: Optional[torch.Tensor],
                    residual: Optional[torch.Tensor], training: bool, factor: float, eps: float, activation: str,
                    activation_param: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    impl = _cuda_forward if x.is_cuda else _cpu_forward
    updating = training and factor != 0.0
    rm = running_mean.clone() if updating and running_mean is not None else running_mean
    rv = running_var.clone() if updating and running_var is not None else running_var
    y, stats = impl(x, weight, bias, rm, rv, residual, training, factor, eps, _act_name(activation), activation_param)
    return (y, stats, rm if updating and rm is not None else x.new_empty((0,)),
            rv if updating and rv is not None else x.new_empty((0,)))


@_batch_norm_fwd.register_fake
def _(x, weight, bias, running_mean, running_var, residual, training, factor, eps, activation, activation_param):
    updating = training and factor != 0.0
    new = lambda r: torch.empty_like(r) if updating and r is not None else x.new_empty((0,))  # noqa: E731
    return torch.empty_like(x), x.new_empty((2, x.shape[1]), dtype=_acc(x.dtype)), new(running_mean), new(running_var)


@torch.library.custom_op("cunorm::batch_norm_bwd", mutates_args=())
def _batch_norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                    stats: torch.Tensor, residual: Optional[torch.Tensor], training: bool, activation: str,
                    activation_param: float, has_bias: bool,
                    residual_grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    impl = _cuda_backward if x.is_cuda else _cpu_backward
    dx, dw, db, dr = impl(dy, x, weight, bias, stats, residual, training, _act_name(activation), activation_param,
                          has_bias, residual_grad)
    return (dx, x.new_empty((0,)) if dw is None else dw, x.new_empty((0,)) if db is None else db,
            x.new_empty((0,)) if dr is None else dr)


@_batch_norm_bwd.register_fake
def _(dy, x, weight, bias, stats, residual, training, activation, activation_param, has_bias, residual_grad):
    gdt = x.dtype if weight is None else weight.dtype
    c = x.shape[1]
    return (torch.empty_like(x), x.new_empty((c,) if weight is not None else (0,), dtype=gdt),
            x.new_empty((c,) if has_bias else (0,), dtype=gdt), torch.empty_like(x) if residual_grad else
            x.new_empty((0,)))


def _setup(ctx, inputs, output):
    x, weight, bias, _, _, residual, training, _, _, activation, param = inputs
    ctx.save_for_backward(x, weight, bias, output[1], residual)
    ctx.training, ctx.activation, ctx.param = training, activation, param
    ctx.mark_non_differentiable(*output[1:])


def _grad(ctx, dy, _dstats, _drm, _drv):
    x, weight, bias, stats, residual = ctx.saved_tensors
    need = ctx.needs_input_grad
    has_bias = bias is not None and need[2]
    residual_grad = residual is not None and need[5]
    dx, dw, db, dr = torch.ops.cunorm.batch_norm_bwd(dy, x, weight, bias, stats, residual, ctx.training,
                                                     ctx.activation, ctx.param, has_bias, residual_grad)
    return (dx, dw if weight is not None else None, db if has_bias else None, None, None,
            dr if residual_grad else None, None, None, None, None, None)


_batch_norm_fwd.register_autograd(_grad, setup_context=_setup)


def batch_norm(input: torch.Tensor, running_mean: Optional[torch.Tensor], running_var: Optional[torch.Tensor],
               weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5, *, residual: Optional[torch.Tensor] = None,
               activation: Optional[str] = None, activation_param: Optional[float] = None) -> torch.Tensor:
    """``torch.nn.functional.batch_norm`` on cunorm's kernels (same signature and semantics:
    ``momentum`` is the running-statistics factor), plus ``residual`` added before
    ``activation`` (see ``cunorm.batch_norm``). Channels on axis 1; channels_last tensors are
    read in place and the output keeps their memory format."""
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input: expected a torch.Tensor, got {type(input).__name__}")
    if input.dtype not in _NUMPY_DTYPE:
        raise TypeError(f"input: dtype {input.dtype} is not supported (float16, bfloat16, float32, float64)")
    if not 2 <= input.ndim <= 5:
        raise ValueError(f"input: expected 2 to 5 dimensions (N, C, ...), got shape {list(input.shape)}")
    c = input.shape[1]
    for name, p in (("weight", weight), ("bias", bias), ("running_mean", running_mean), ("running_var", running_var)):
        if p is not None and (not isinstance(p, torch.Tensor) or tuple(p.shape) != (c,)):
            raise ValueError(f"{name}: expected a tensor of shape ({c},)")
    if residual is not None and (not isinstance(residual, torch.Tensor) or residual.shape != input.shape):
        raise ValueError(f"residual: expected a tensor of input's shape {list(input.shape)}")
    _, param = activations.check(activation, activation_param)
    if training and input.numel() // max(c, 1) < 2:
        raise ValueError(f"input: expected more than 1 value per channel when training, got shape {list(input.shape)}")
    if not training and (running_mean is None or running_var is None):
        raise ValueError("running_mean: eval (training=False) needs running_mean and running_var")
    factor = 0.0 if momentum is None else _checks.momentum(momentum)
    eps = _checks.eps(eps, None)
    _forward_ad.refuse("cunorm.torch.batch_norm", input, weight, bias, residual)
    y, _, rm, rv = torch.ops.cunorm.batch_norm_fwd(input, weight, bias, running_mean, running_var, residual,
                                                   bool(training), factor, eps,
                                                   NO_ACTIVATION if activation is None else activation, param)
    with torch.no_grad():
        for buf, new in ((running_mean, rm), (running_var, rv)):
            if buf is not None and new.numel():
                buf.copy_(new)
    return y
