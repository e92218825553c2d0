"""RMSNorm: public functions for CuPy arrays (GPU kernels) and NumPy arrays (reference)."""
from __future__ import annotations

from .. import _checks, reference
from . import _fused_api, _row_norm_cupy


def rms_norm(x, weight=None, eps=None, *, normalized_ndim=1, return_stats=False, residual=None, residual_dtype=None,
             weight_offset=0.0, out_dtype=None, out_scale=None, return_amax=False):
    """RMS normalization over the last ``normalized_ndim`` axes: ``x * rstd * weight`` with
    ``rstd = 1 / sqrt(mean(x**2) + eps)``; ``eps=None`` means the computation dtype's
    machine epsilon (float32's for half and float32 ``x``, float64's for float64), as
    ``torch.nn.functional.rms_norm`` computes it. Returns ``y`` or ``(y, rstd)`` with ``return_stats``
    (one float32 value per row, float64 for float64 ``x``). Layout rules and the fused
    options (``residual``, ``residual_dtype``, ``weight_offset``, ``out_dtype``,
    ``out_scale``, ``return_amax``; outputs y, h, rstd, amax) as :func:`cunorm.layer_norm`.
    """
    kind = _checks.backend(x=x, weight=weight, residual=residual)
    _checks.float_dtype("x", x)
    nd = _checks.normalized_ndim(x, normalized_ndim)
    _checks.param("weight", weight, x, nd)
    eps = _checks.eps(eps, x.dtype, default_to_finfo=True)
    opts = _fused_api.options(x, weight, residual, residual_dtype, weight_offset, out_dtype, out_scale, return_amax)
    if opts is not None:
        return _fused_api.run(kind, x, weight, None, eps, nd, True, return_stats, opts)
    if kind == "numpy":
        y, rstd = reference.rms_norm(x, weight, eps, normalized_ndim=nd, return_stats=True)
        y, rstd = y.astype(x.dtype), rstd.astype(_checks.acc_dtype(x.dtype))
    else:
        y, _, rstd = _row_norm_cupy.forward(x, weight, None, eps, nd, rms=True, stats=return_stats)
    return (y, rstd) if return_stats else y


def rms_norm_backward(dy, x, weight, rstd, *, normalized_ndim=1, dh=None, weight_offset=0.0, dx_dtype=None,
                      residual_dtype=None):
    """Gradients of :func:`rms_norm`: ``(dx, dweight)``, ``dweight`` None without weight.
    ``dweight`` has the weight's dtype. Bit-identical from run to run. The residual options
    (``dh``, ``weight_offset``, ``dx_dtype``, ``residual_dtype`` appending dresidual) as
    :func:`cunorm.layer_norm_backward`."""
    kind = _checks.backend(dy=dy, x=x, weight=weight, rstd=rstd, dh=dh)
    _checks.float_dtype("x", x)
    opts = _fused_api.grad_options(dy, x, weight, dh, weight_offset, dx_dtype, residual_dtype)
    if opts is None:
        _checks.same_shape("dy", dy, x)
    nd = _checks.normalized_ndim(x, normalized_ndim)
    _checks.param("weight", weight, x, nd)
    _checks.stats("rstd", rstd, x, nd)
    if opts is not None:
        return _fused_api.run_backward(kind, dy, x, weight, None, rstd, nd, True, False, opts)
    if kind == "numpy":
        dx, dw = reference.rms_norm_backward(dy, x, weight, rstd, normalized_ndim=nd)
        return dx.astype(x.dtype), None if dw is None else dw.astype(weight.dtype)
    dx, dw, _ = _row_norm_cupy.backward(dy, x, weight, None, rstd, nd, True, weight is not None, False,
                                        x.dtype if weight is None else weight.dtype)
    return dx, dw
