"""The CUDA path: cunorm's kernels on torch's memory, allocator and current stream.

Small batches spend more time on the host than on the GPU (benchmarks/NOTES.md, v5), so the
per-call path is one dictionary lookup on the call's signature: tensor metadata, options and
pointer alignment classes. A miss validates the arguments and makes the launch plan (or
marks the signature for the general path: copies, casts, empty tensors); a hit allocates
the outputs with torch, fills in pointers and launches.
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import numpy
import torch

from .. import _config
from .._compile import KernelPlans
from .._launch import View, contiguous_strides, launch, make_current, remember, rows_of
from ..ops import _row_norm
from ._common import _NUMPY_DTYPE, _TORCH_DTYPE, _acc, _as_dtype, _check_backward, _check_tensors, _stats_shape


def _view(t: Optional[torch.Tensor]):
    if t is None:
        return None
    return View(t.data_ptr(), tuple(t.shape), tuple(t.stride()), _NUMPY_DTYPE[t.dtype])


class _Scratch:
    """Scratch buffers for one call from torch's caching allocator (stream-ordered reuse makes
    releasing them after the launches are queued safe)."""

    def __init__(self, device: int):
        self.device, self.keep = device, []

    def __call__(self, shape, dtype) -> int:
        t = torch.empty(tuple(shape), dtype=_TORCH_DTYPE[numpy.dtype(dtype)], device=self.device)
        self.keep.append(t)
        return t.data_ptr()


def _stream(device: int) -> int:
    """torch's current stream on ``device``, as a handle. torch.cuda.current_stream() builds a
    Stream object (~5 us); the raw query is what Triton's launcher uses too."""
    get_raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if get_raw is not None:
        return get_raw(device)
    return torch.cuda.current_stream(device).cuda_stream


def _addressable(t: torch.Tensor, nd: int) -> torch.Tensor:
    return t if rows_of(_view(t), nd) is not None else t.contiguous()


@functools.lru_cache(maxsize=None)
def _param_torch_dtype(x_dtype, weight_dtype, bias_dtype) -> torch.dtype:
    return _TORCH_DTYPE[_row_norm.param_dtype(_NUMPY_DTYPE[x_dtype], _NUMPY_DTYPE.get(weight_dtype),
                                              _NUMPY_DTYPE.get(bias_dtype))]


def _param(p: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    if p is None or (p.dtype == dtype and p.is_contiguous()):
        return p
    return p.to(dtype=dtype).contiguous()


def _params(x, weight, bias):
    dtype = _param_torch_dtype(x.dtype, None if weight is None else weight.dtype, None if bias is None else bias.dtype)
    return _param(weight, dtype), _param(bias, dtype)


def _meta(t: Optional[torch.Tensor]):
    """What a parameter's signature needs: dtype, shape, layout, device."""
    return None if t is None else (t.dtype, t.shape, t.stride(), t.get_device())


def _like(x: torch.Tensor) -> torch.Tensor:
    """An uninitialised C-contiguous tensor of x's shape and dtype on x's device."""
    return torch.empty_like(x) if x.is_contiguous() else torch.empty(x.shape, dtype=x.dtype, device=x.device)


_GENERAL = False  # a signature the fast path hands to the general one
_MAX_PLANS = 4096
_forward_plans = KernelPlans()
_backward_plans = KernelPlans()




def _cuda_forward(x, nd, weight, bias, eps, rms, stats=True, grads=None):
    """(y, stats or None, PreparedBackward or None); stats as _stats_shape says, in float32
    (float64 for float64 x). ``grads``, (need_dw, has_bias) of a forward whose backward the
    eager Functions run, has the fast path prepare that backward (stats are then made)."""
    dev = x.get_device()
    if torch._C._cuda_getDevice() != dev:  # torch.cuda.current_device() without its lazy-init check
        with torch.cuda.device(dev):
            return _cuda_forward(x, nd, weight, bias, eps, rms, stats, grads)
    y = _like(x)
    xp, yp = x.data_ptr(), y.data_ptr()
    wp = 0 if weight is None else weight.data_ptr()
    bp = 0 if bias is None else bias.data_ptr()
    key = (x.shape, x.stride(), x.dtype, dev, nd, rms, eps, _meta(weight), _meta(bias), (xp | yp) & 15,
           (wp | bp) & 15)
    entry = _forward_plans.get(key)
    if entry is None:
        entry = _forward_entry(key, x, nd, weight, bias, eps, rms)
    if entry is _GENERAL:
        return _cuda_forward_general(x, nd, weight, bias, eps, rms, stats)
    plan, stats_shape, acc, fast = entry
    sp = mean = rstd = 0
    st = None
    if stats:
        st = x.new_empty(stats_shape, dtype=acc)
        sp = st.data_ptr()
        mean, rstd = (0, sp) if rms else (sp, sp + plan.m * plan.acc.itemsize)
    make_current(dev)
    scratch = _Scratch(dev) if plan.tiles > 1 or plan.grid_rows is not None else None
    _row_norm.run_forward(plan, xp, yp, wp, bp, mean, rstd, scratch, _stream(dev))
    if grads is None:
        return y, st, None
    return y, st, fast.prepare(x, y, weight, xp, wp, sp, mean, rstd, *grads)


def _forward_entry(key, x, nd, weight, bias, eps, rms):
    _check_tensors(x, nd, weight=weight, bias=bias)
    pdt = _param_torch_dtype(x.dtype, None if weight is None else weight.dtype, None if bias is None else bias.dtype)
    entry = _GENERAL
    if all(p is None or (p.dtype == pdt and p.is_contiguous()) for p in (weight, bias)):
        plan = _row_norm.forward_plan(tuple(x.shape), tuple(x.stride()), _NUMPY_DTYPE[x.dtype], _NUMPY_DTYPE[pdt],
                                      nd, rms, eps, key[3], key[-2], key[-1])
        if plan is not None:
            fast = FastBackward(key[3], nd, rms, tuple(x.stride()), key[-2], key[-1],
                                x.numel() * x.element_size() <= _config.PREPARED_DX_BYTES)
            entry = (plan, _stats_shape(x, nd, rms), _TORCH_DTYPE[plan.acc], fast)
    remember(_forward_plans, key, entry, _MAX_PLANS)
    return entry


def _cuda_forward_general(x, nd, weight, bias, eps, rms, stats):
    """Empty tensors; otherwise copy x where the kernels cannot address its rows, cast the
    parameters to a compiled dtype, and take the fast path with those. (y, stats, None)."""
    if x.numel() == 0:
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        st = torch.empty(_stats_shape(x, nd, rms), dtype=_acc(x.dtype), device=x.device) if stats else None
        if st is not None:  # statistics of an empty row are undefined
            st.fill_(math.nan)
        return y, st, None
    x = _addressable(x, nd)
    weight, bias = _params(x, weight, bias)
    # no prepared backward: it would address the copies, not the tensors the Functions save
    return _cuda_forward(x, nd, weight, bias, eps, rms, stats)


def _cuda_backward(dy, x, weight, stats, nd, rms, has_bias, need_dw=True):
    """(dx, dweight or None, dbias or None): dx like x, the parameter gradients in weight's
    dtype (x's without a weight)."""
    dev = x.get_device()
    if torch.cuda.current_device() != dev:
        with torch.cuda.device(dev):
            return _cuda_backward(dy, x, weight, stats, nd, rms, has_bias, need_dw)
    need_dw = need_dw and weight is not None
    dx = _like(x)
    xp, dyp, dxp = x.data_ptr(), dy.data_ptr(), dx.data_ptr()
    wp = 0 if weight is None else weight.data_ptr()
    key = (x.shape, x.stride(), x.dtype, dev, dy.shape, dy.stride(), dy.dtype, dy.get_device(), _meta(weight),
           stats.shape, stats.dtype, stats.is_contiguous(), stats.get_device(), nd, rms, has_bias, need_dw,
           (xp | dyp | dxp) & 15, wp & 15)
    entry = _backward_plans.get(key)
    if entry is None:
        entry = _backward_entry(key, dy, x, weight, stats, nd, rms)
    if entry is _GENERAL:
        return _cuda_backward_general(dy, x, weight, stats, nd, rms, has_bias, need_dw)
    plan, norm_shape, grad_dtype = entry
    if weight is not None:
        dw = torch.empty_like(weight) if need_dw else None
        db = torch.empty_like(weight) if has_bias else None
    else:
        dw = None
        db = torch.empty(norm_shape, dtype=grad_dtype, device=x.device) if has_bias else None
    sp = stats.data_ptr()
    mean, rstd = (0, sp) if rms else (sp, sp + plan.m * plan.acc.itemsize)
    make_current(dev)
    _row_norm.run_backward(plan, dyp, xp, wp, mean, rstd, dxp, 0 if dw is None else dw.data_ptr(),
                           0 if db is None else db.data_ptr(), _Scratch(dev), _stream(dev))
    return dx, dw, db


class FastBackward:
    """The eager backward of one fast-path forward signature: its plan, made by the first
    forward that needs a gradient (dy C-contiguous), and for each such forward a
    PreparedBackward."""

    __slots__ = ("plan", "dev", "nd", "rms", "x_strides", "x_align", "p_align", "prepare_dx")

    def __init__(self, dev, nd, rms, x_strides, x_align, p_align, prepare_dx: bool):
        self.plan, self.dev, self.nd, self.rms = None, dev, nd, rms
        self.x_strides, self.x_align, self.p_align = x_strides, x_align, p_align
        self.prepare_dx = prepare_dx  # x is small (_config.PREPARED_DX_BYTES): the forward makes dx

    def prepare(self, x, y, weight, xp: int, wp: int, sp: int, mean: int, rstd: int, need_dw: bool,
                has_bias: bool) -> Optional["PreparedBackward"]:
        """The backward of the forward call that wrote y and the statistics at ``sp`` (mean
        and rstd pointers as the kernels take them); None where the signature has no backward
        plan (the general backward then serves)."""
        plan = self.plan
        if plan is None:
            shape = tuple(x.shape)
            wdt = _NUMPY_DTYPE[x.dtype if weight is None else weight.dtype]
            plan = self.plan = _row_norm.backward_plan(shape, self.x_strides, contiguous_strides(shape),
                                                       _NUMPY_DTYPE[x.dtype], wdt, wdt, self.nd, self.rms, self.dev,
                                                       self.x_align, self.p_align)
            if plan is None:
                return None
        return PreparedBackward(self, plan, y, weight, xp, wp, sp, mean, rstd, need_dw, has_bias)


class PreparedBackward:
    """One forward call's backward, made by the forward on the caller's thread so that
    torch's autograd device thread, where the same host work takes 1.5 to 3 times as long
    (benchmarks/NOTES.md, v5, v14, v53), only checks dy and the saved tensors and launches.
    The forward allocates the parameter gradients, and dx while x is small; a one-launch
    (column) plan with dx allocated gets its argument list too, dy's slot left to fill.
    Serves one backward: the Functions drop it after the first (a retained graph's next
    backward takes the general path)."""

    __slots__ = ("fast", "plan", "xp", "wp", "sp", "mean", "rstd", "dx", "dw", "db", "grid", "args")

    def __init__(self, fast: FastBackward, plan, y, weight, xp: int, wp: int, sp: int, mean: int, rstd: int,
                 need_dw: bool, has_bias: bool):
        self.fast, self.plan, self.xp, self.wp, self.sp, self.mean, self.rstd = fast, plan, xp, wp, sp, mean, rstd
        if weight is not None:
            self.dw = torch.empty_like(weight) if need_dw else None
            self.db = torch.empty_like(weight) if has_bias else None
        else:
            self.dw, self.db = None, y.new_empty(y.shape[y.ndim - fast.nd:]) if has_bias else None
        dx = torch.empty_like(y) if fast.prepare_dx else None  # y: C-contiguous, x's shape and dtype
        if dx is not None and (dx.data_ptr() & 15) | fast.x_align != fast.x_align:
            dx = None  # as aligned as the forward's pointers (the plan's vector width assumes it)
        self.dx, self.grid, self.args = dx, 0, None
        if dx is not None and plan.column_blocks:
            dw, db = self.dw, self.db
            self.grid, self.args = _row_norm.column_launch(plan, 0, xp, wp, mean, rstd, dx.data_ptr(),
                                                           0 if dw is None else dw.data_ptr(),
                                                           0 if db is None else db.data_ptr())

    def __call__(self, dy, x, weight, stats):
        """(dx, dweight or None, dbias or None), or None where dy, the saved tensors (which
        saved-tensor hooks may have moved) or the current device do not fit the plan (the
        caller then takes the general backward)."""
        fast = self.fast
        if not dy.is_contiguous() or torch._C._cuda_getDevice() != fast.dev:
            return None
        dyp = dy.data_ptr()
        if (x.data_ptr() != self.xp or stats.data_ptr() != self.sp or x.stride() != fast.x_strides
                or (weight is not None and weight.data_ptr() != self.wp) or (dyp & 15) | fast.x_align != fast.x_align):
            return None
        make_current(fast.dev)
        args = self.args
        if args is not None:
            args[0] = dyp
            launch(self.plan.main, self.grid, self.plan.block, args, _stream(fast.dev))
            return self.dx, self.dw, self.db
        dx = self.dx
        if dx is None:
            dx = torch.empty_like(dy)
            if (dx.data_ptr() & 15) | fast.x_align != fast.x_align:
                return None
        dw, db = self.dw, self.db
        _row_norm.run_backward(self.plan, dyp, self.xp, self.wp, self.mean, self.rstd, dx.data_ptr(),
                               0 if dw is None else dw.data_ptr(), 0 if db is None else db.data_ptr(),
                               _Scratch(fast.dev), _stream(fast.dev))
        return dx, dw, db


def _backward_entry(key, dy, x, weight, stats, nd, rms):
    _check_tensors(x, nd, weight=weight)
    _check_backward(dy, x, stats, nd, rms)
    entry = _GENERAL
    if weight is None or (weight.dtype == _param_torch_dtype(x.dtype, weight.dtype, None) and weight.is_contiguous()):
        wdt = x.dtype if weight is None else weight.dtype
        if stats.is_contiguous():
            plan = _row_norm.backward_plan(tuple(x.shape), tuple(x.stride()), tuple(dy.stride()),
                                           _NUMPY_DTYPE[x.dtype], _NUMPY_DTYPE[wdt], _NUMPY_DTYPE[wdt], nd, rms,
                                           key[3], key[-2], key[-1])
            if plan is not None:
                entry = (plan, tuple(x.shape[x.ndim - nd:]), wdt)
    remember(_backward_plans, key, entry, _MAX_PLANS)
    return entry


def _cuda_backward_general(dy, x, weight, stats, nd, rms, has_bias, need_dw):
    """Empty tensors; otherwise copies and casts as in the forward, then the fast path, the
    parameter gradients cast back to the weight's own dtype."""
    norm_shape = x.shape[x.ndim - nd:]
    grad_dtype = x.dtype if weight is None else weight.dtype
    if x.numel() == 0:
        dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        zeros = lambda: torch.zeros(norm_shape, dtype=grad_dtype, device=x.device)  # noqa: E731 (no rows: zero)
        return dx, zeros() if need_dw else None, zeros() if has_bias else None
    x, dy, stats = _addressable(x, nd), _addressable(dy, nd), stats.contiguous()
    w, _ = _params(x, weight, None)
    dx, dw, db = _cuda_backward(dy, x, w, stats, nd, rms, has_bias, need_dw)
    return dx, _as_dtype(dw, grad_dtype), _as_dtype(db, grad_dtype)


