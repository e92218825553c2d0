"""PyTorch adapter: drop-in LayerNorm / RMSNorm functions and modules on cunorm's kernels.

    from cunorm.torch import LayerNorm, RMSNorm, layer_norm, rms_norm, replace_norms

Autograd goes through ``torch.library.custom_op`` (forward and backward ops with fake
implementations), so ``torch.compile(fullgraph=True)``, CUDA graphs and ``opcheck`` see
ordinary operators. CUDA tensors are read in place and results are written into tensors
torch allocated (``torch.empty``), on ``torch.cuda.current_stream()``: memory stays in torch's
caching allocator and nothing goes through CuPy's pool. CPU tensors run the float64 NumPy
reference through the same ops, so the wiring works (and is tested) without a GPU.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch.autograd import forward_ad as _fwad

from .. import _checks
from ._common import _NUMPY_DTYPE, _as_dtype
from ._cuda import _cuda_forward
from ._batch_norm import batch_norm
from . import _forward_ad, _func, _fused
from ._bn_modules import BatchNorm1d, BatchNorm2d, BatchNorm3d, _FusedBatchNorm
from ._ops import _backward_impl, _forward_impl, _reducing_weight

__all__ = ["layer_norm", "rms_norm", "batch_norm", "LayerNorm", "RMSNorm", "BatchNorm1d", "BatchNorm2d",
           "BatchNorm3d", "replace_norms"]


# ---- functional API -----------------------------------------------------------------------

def _normalized_ndim(input, normalized_shape) -> int:
    """How many trailing axes normalized_shape names; the rest of the checks run per call
    signature (_check_tensors)."""
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input: expected a torch.Tensor, got {type(input).__name__}")
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    nd = len(shape)
    if nd == 1 and input.ndim and input.shape[-1] == shape[0]:  # the common case, without slicing a Size
        return 1
    if nd < 1 or nd > input.ndim or input.shape[input.ndim - nd:] != shape:
        raise ValueError(f"normalized_shape: {list(shape)} does not match the last axes of input "
                         f"of shape {list(input.shape)}")
    return nd


# float64 inputs compute in float64, the others in float32 (_checks.default_rms_eps)
_DEFAULT_EPS = {d: torch.finfo(torch.float64 if d == torch.float64 else torch.float32).eps for d in _NUMPY_DTYPE}


def _default_eps(dtype: torch.dtype) -> float:
    """torch.nn.functional.rms_norm's default eps: the computation dtype's machine epsilon
    (float32's for half inputs: 1.19e-7, where the input's own would be 7.8e-3 for bfloat16)."""
    try:
        return _DEFAULT_EPS[dtype]
    except KeyError:
        raise TypeError(f"input: dtype {dtype} is not supported (float16, bfloat16, float32, float64)") from None


def _autocast_fp32(input, op_upcasts: bool, autocast_to_fp32: bool) -> torch.Tensor:
    """torch's autocast policy: on CUDA, layer_norm runs in float32 (rms_norm keeps the
    input dtype); ``autocast_to_fp32=False`` keeps half-precision activations instead."""
    if (op_upcasts and autocast_to_fp32 and input.is_cuda and input.dtype in (torch.float16, torch.bfloat16)
            and torch.is_autocast_enabled("cuda")):
        return input.float()
    return input


class _LayerNormFunction(torch.autograd.Function):
    """The eager path: the same implementation as the custom ops without their dispatch,
    which costs ~40 us a call on the H200 host (benchmarks/NOTES.md) — more than the kernels
    of a small batch. torch.compile and export trace the custom ops instead."""

    @staticmethod
    def forward(ctx, x, nd, weight, bias, eps):
        if x.is_cuda:  # the fast path called directly: this runs on every eager call
            need = ctx.needs_input_grad
            y, stats, ctx.prepared = _cuda_forward(x, nd, weight, bias, eps, False, True,
                                                   (need[2] and weight is not None, bias is not None and need[3]))
        else:
            (y, stats), ctx.prepared = _forward_impl(x, nd, weight, bias, eps, False), None
        ctx.save_for_backward(x, weight, stats)
        ctx.nd, ctx.eps, ctx.bias_dtype = nd, eps, None if bias is None else bias.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, stats = ctx.saved_tensors
        # create_graph (the gradient differentiated again) or a batched dy (is_grads_batched,
        # jacobian(vectorize=True): legacy vmap's wrapper): torch ops, not kernels
        if torch.is_grad_enabled() or _batched(dy):
            return _func.grads(dy, x, weight, ctx.nd, ctx.eps, False, ctx.bias_dtype)
        prepared, ctx.prepared = ctx.prepared, None  # it serves one backward (retain_graph: more)
        if prepared is not None:
            grads = prepared(dy, x, weight, stats)
            if grads is not None:
                return grads[0], None, grads[1], grads[2], None
        need = ctx.needs_input_grad
        has_bias = ctx.bias_dtype is not None and need[3]
        w = _reducing_weight(weight, ctx.bias_dtype if has_bias else None)
        dx, dw, db = _backward_impl(dy, x, w, stats, ctx.nd, False, has_bias, need[2])
        if w is not weight:
            dw = _as_dtype(dw, weight.dtype)
        return dx, None, dw, _as_dtype(db, ctx.bias_dtype), None


class _RMSNormFunction(torch.autograd.Function):
    """RMSNorm's eager path (see _LayerNormFunction)."""

    @staticmethod
    def forward(ctx, x, nd, weight, eps):
        if x.is_cuda:
            y, stats, ctx.prepared = _cuda_forward(x, nd, weight, None, eps, True, True,
                                                   (ctx.needs_input_grad[2] and weight is not None, False))
        else:
            (y, stats), ctx.prepared = _forward_impl(x, nd, weight, None, eps, True), None
        ctx.save_for_backward(x, weight, stats)
        ctx.nd, ctx.eps = nd, eps
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, stats = ctx.saved_tensors
        if torch.is_grad_enabled() or _batched(dy):  # see _LayerNormFunction
            return _func.grads(dy, x, weight, ctx.nd, ctx.eps, True, None)[:4]
        prepared, ctx.prepared = ctx.prepared, None
        if prepared is not None:
            grads = prepared(dy, x, weight, stats)
            if grads is not None:
                return grads[0], None, grads[1], None
        dx, dw, _ = _backward_impl(dy, x, weight, stats, ctx.nd, True, False, ctx.needs_input_grad[2])
        return dx, None, dw, None


# The Functions' apply without torch.autograd.Function.apply's Python layer: its default-
# argument binding and pytree walk cost ~4 us of an eager call (a third of an empty Function's
# forward, NOTES "Issue 3: the Function's own apply"). Outside functorch transforms that layer
# only unwraps dead functorch wrappers, which the wrappers below do for the tensor arguments;
# inside them, cunorm.torch._func's Function (the setup_context form functorch needs).
_LAYER_NORM_APPLY = super(torch.autograd.Function, _LayerNormFunction).apply
_RMS_NORM_APPLY = super(torch.autograd.Function, _RMSNormFunction).apply
_functorch_active = torch._C._are_functorch_transforms_active
# legacy vmap's batched tensors (the backward's dy under is_grads_batched)
_batched = getattr(torch._C._functorch, "is_legacy_batchedtensor", lambda t: False)
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead
try:
    from torch.utils._python_dispatch import is_in_torch_dispatch_mode as _in_dispatch_mode
except ImportError:  # torch before 2.3 (a guess at the version: only the newer name is tested)
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    def _in_dispatch_mode() -> bool:
        return _get_current_dispatch_mode() is not None


def _traced(input: torch.Tensor) -> bool:
    """Whether the call must go through the custom ops, as under torch.compile: a meta tensor,
    a tensor subclass (FakeTensor, FunctionalTensor; a Parameter too, which only costs the
    op's overhead) or a Python dispatch mode (make_fx, FakeTensorMode, FlopCounterMode). The
    eager shortcut launches on data pointers or runs NumPy on views: it fails on meta and
    fake tensors, and under make_fx's real tracing its y entered the graph as a constant
    (~0.1 us a call on this machine's CPU for the three tests)."""
    return type(input) is not torch.Tensor or input.is_meta or _in_dispatch_mode()


_FUSED_DOC = """
    Keyword options fuse the work around the norm (all default off): ``residual=r`` normalizes
    h = input + r and returns ``(y, h)``, h in ``residual_dtype`` (default r's); the gradient
    of h from later layers flows into both input and r. ``weight_offset=c`` uses weight + c
    (added in float32). ``out_dtype`` writes y in another float dtype, including
    ``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` scaled by ``out_scale`` with saturation
    (FP8 y carries no gradient); ``return_amax=True`` appends max |y| before the scale (a 0-d
    float32 tensor)."""


def layer_norm(input: torch.Tensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor] = None,
               bias: Optional[torch.Tensor] = None, eps: float = 1e-5, *, autocast_to_fp32: bool = True,
               residual: Optional[torch.Tensor] = None, residual_dtype: Optional[torch.dtype] = None,
               weight_offset: float = 0.0, out_dtype: Optional[torch.dtype] = None,
               out_scale: Optional[float] = None, return_amax: bool = False):
    nd = _normalized_ndim(input, normalized_shape)
    eps = _checks.eps(eps, None)
    input = _autocast_fp32(input, True, autocast_to_fp32)
    if _fused.options_set(residual, residual_dtype, weight_offset, out_dtype, out_scale, return_amax):
        opts = _fused.options(input, weight, residual, residual_dtype, weight_offset, out_dtype, out_scale,
                              return_amax)
        if opts is not None:
            return _fused.call(input, nd, weight, bias, eps, False, opts)
    if torch.compiler.is_compiling() or _traced(input):
        return torch.ops.cunorm.layer_norm_fwd(input, nd, weight, bias, eps)[0]
    # torch.func's transforms (functorch's own wrapped tensors) and forward_ad's dual tensors
    # (_forward_ad.active() inlined: this path is host-bound)
    if _functorch_active() or (_fwad._current_level >= 0 and _forward_ad.has_tangent(input, weight, bias)):
        return _func.norm(input, nd, weight, bias, eps, False)
    # the eager call with a gradient, its helpers written out (each Python call costs ~0.3 us
    # on the H200 host, and this path is host-bound: NOTES v53)
    if torch.is_grad_enabled() and (input.requires_grad or (weight is not None and weight.requires_grad)
                                    or (bias is not None and bias.requires_grad)):
        return _LAYER_NORM_APPLY(_unwrap_if_dead(input), nd, None if weight is None else _unwrap_if_dead(weight),
                                 None if bias is None else _unwrap_if_dead(bias), eps)
    return _forward_impl(input, nd, weight, bias, eps, rms=False, stats=False)[0]


def rms_norm(input: torch.Tensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor] = None,
             eps: Optional[float] = None, *, residual: Optional[torch.Tensor] = None,
             residual_dtype: Optional[torch.dtype] = None, weight_offset: float = 0.0,
             out_dtype: Optional[torch.dtype] = None, out_scale: Optional[float] = None, return_amax: bool = False):
    nd = _normalized_ndim(input, normalized_shape)
    eps = _default_eps(input.dtype) if eps is None else _checks.eps(eps, None)
    if _fused.options_set(residual, residual_dtype, weight_offset, out_dtype, out_scale, return_amax):
        opts = _fused.options(input, weight, residual, residual_dtype, weight_offset, out_dtype, out_scale,
                              return_amax)
        if opts is not None:
            return _fused.call(input, nd, weight, None, eps, True, opts)
    if torch.compiler.is_compiling() or _traced(input):
        return torch.ops.cunorm.rms_norm_fwd(input, nd, weight, eps)[0]
    if _functorch_active() or (_fwad._current_level >= 0 and _forward_ad.has_tangent(input, weight)):
        return _func.norm(input, nd, weight, None, eps, True)
    if torch.is_grad_enabled() and (input.requires_grad or (weight is not None and weight.requires_grad)):
        return _RMS_NORM_APPLY(_unwrap_if_dead(input), nd, None if weight is None else _unwrap_if_dead(weight), eps)
    return _forward_impl(input, nd, weight, None, eps, rms=True, stats=False)[0]


layer_norm.__doc__ = "``torch.nn.functional.layer_norm`` on cunorm's kernels (same signature)." + _FUSED_DOC
rms_norm.__doc__ = ("``torch.nn.functional.rms_norm`` on cunorm's kernels (same signature; ``eps=None`` is "
                    "torch's own default, the machine epsilon of the computation dtype: float32's for half "
                    "and float32 inputs, float64's for float64)." + _FUSED_DOC)


# ---- modules ------------------------------------------------------------------------------

class LayerNorm(torch.nn.LayerNorm):
    """``torch.nn.LayerNorm`` running cunorm's kernels: same constructor, parameters and
    ``state_dict``. Set ``autocast_to_fp32 = False`` to keep half activations under autocast."""

    autocast_to_fp32 = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps,
                          autocast_to_fp32=self.autocast_to_fp32)


class RMSNorm(torch.nn.RMSNorm):
    """``torch.nn.RMSNorm`` running cunorm's kernels: same constructor, parameters and
    ``state_dict``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return rms_norm(input, self.normalized_shape, self.weight, self.eps)


_SWAPS = {torch.nn.LayerNorm: LayerNorm, torch.nn.RMSNorm: RMSNorm, torch.nn.BatchNorm1d: BatchNorm1d,
          torch.nn.BatchNorm2d: BatchNorm2d, torch.nn.BatchNorm3d: BatchNorm3d}


def replace_norms(module: torch.nn.Module) -> torch.nn.Module:
    """Swap every ``torch.nn.LayerNorm``/``RMSNorm``/``BatchNorm{1,2,3}d`` in ``module``
    (itself included) for cunorm's, in place. Parameters, buffers, hooks, device and dtype
    stay exactly as they were (a swapped BatchNorm applies no activation). Returns ``module``."""
    for sub in module.modules():
        swap = _SWAPS.get(type(sub))
        if swap is not None:
            sub.__class__ = swap
            if issubclass(swap, _FusedBatchNorm):
                sub.activation, sub.activation_param = None, None
    return module
