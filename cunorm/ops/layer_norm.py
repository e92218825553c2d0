"""LayerNorm: public functions for CuPy arrays (GPU kernels) and NumPy arrays (reference)."""
from __future__ import annotations

from .. import _checks, reference
from . import _fused_api, _row_norm_cupy


def layer_norm(x, weight=None, bias=None, eps=1e-5, *, normalized_ndim=1, return_stats=False, residual=None,
               residual_dtype=None, weight_offset=0.0, out_dtype=None, out_scale=None, return_amax=False):
    """Layer normalization over the last ``normalized_ndim`` axes of ``x``.

    ``weight`` and ``bias`` have shape ``x.shape[-normalized_ndim:]`` (PyTorch's
    ``normalized_shape``) and may have another float dtype than ``x``. Returns ``y`` (dtype
    and shape of ``x``, C-contiguous), or ``(y, mean, rstd)`` with ``return_stats``: one value
    per row, shape ``x.shape[:-normalized_ndim]``, float32 (float64 for float64 ``x``).

    Fused options (one pass over the data where the fused kernel serves the call):
    ``residual`` (x's shape) is added first and h = x + residual is normalized and returned
    after y, in ``residual_dtype`` (default: the residual's); ``weight_offset`` is added to
    the weight in float32 (y = x̂ · (weight + offset) + bias); ``out_dtype`` is y's dtype —
    float8_e4m3fn / float8_e5m2 (ml_dtypes) scale y by ``out_scale`` and saturate, and
    ``return_amax`` appends max |y| before the scale (0-d float32). Outputs in order: y, h,
    mean, rstd, amax, each present when asked for.

    Leading axes may have any strides (no copy); if the normalized axes are not contiguous,
    ``x`` is copied once. CuPy arrays run on the GPU on the current stream; NumPy arrays run
    the float64 reference on the CPU.
    """
    kind = _checks.backend(x=x, weight=weight, bias=bias, residual=residual)
    _checks.float_dtype("x", x)
    nd = _checks.normalized_ndim(x, normalized_ndim)
    _checks.param("weight", weight, x, nd)
    _checks.param("bias", bias, x, nd)
    eps = _checks.eps(eps, x.dtype)
    opts = _fused_api.options(x, weight, residual, residual_dtype, weight_offset, out_dtype, out_scale, return_amax)
    if opts is not None:
        return _fused_api.run(kind, x, weight, bias, eps, nd, False, return_stats, opts)
    if kind == "numpy":
        y, mean, rstd = reference.layer_norm(x, weight, bias, eps, normalized_ndim=nd, return_stats=True)
        acc = _checks.acc_dtype(x.dtype)
        y, mean, rstd = y.astype(x.dtype), mean.astype(acc), rstd.astype(acc)
    else:
        y, mean, rstd = _row_norm_cupy.forward(x, weight, bias, eps, nd, rms=False, stats=return_stats)
    return (y, mean, rstd) if return_stats else y


def layer_norm_backward(dy, x, weight, mean, rstd, *, normalized_ndim=1, has_bias=None, dh=None, weight_offset=0.0,
                        dx_dtype=None, residual_dtype=None):
    """Gradients of :func:`layer_norm`: ``(dx, dweight, dbias)``.

    ``mean``/``rstd`` are the statistics ``layer_norm(..., return_stats=True)`` returned.
    ``dweight`` is None without ``weight``; ``dbias`` is computed when ``has_bias`` (default:
    when ``weight`` is given). ``dx`` has ``x``'s dtype; ``dweight``/``dbias`` have the
    weight's dtype (``x``'s without weight). Bit-identical from run to run.

    After a forward with a residual, pass its h as ``x`` and the gradient of the h output as
    ``dh``: dx (= dh + the norm's gradient, in ``dx_dtype``, default h's) is the gradient of
    both x and the residual; ``residual_dtype`` appends it again in that dtype. Pass the
    forward's ``weight_offset`` too.
    """
    kind = _checks.backend(dy=dy, x=x, weight=weight, mean=mean, rstd=rstd, dh=dh)
    _checks.float_dtype("x", x)
    opts = _fused_api.grad_options(dy, x, weight, dh, weight_offset, dx_dtype, residual_dtype)
    if opts is None:
        _checks.same_shape("dy", dy, x)
    nd = _checks.normalized_ndim(x, normalized_ndim)
    _checks.param("weight", weight, x, nd)
    _checks.stats("mean", mean, x, nd)
    _checks.stats("rstd", rstd, x, nd)
    if has_bias is None:
        has_bias = weight is not None
    if opts is not None:
        return _fused_api.run_backward(kind, dy, x, weight, mean, rstd, nd, False, bool(has_bias), opts)
    grad_dtype = x.dtype if weight is None else weight.dtype
    if kind == "numpy":
        dx, dw, db = reference.layer_norm_backward(dy, x, weight, mean, rstd, normalized_ndim=nd,
                                                   has_bias=has_bias)
        return (dx.astype(x.dtype), None if dw is None else dw.astype(grad_dtype),
                None if db is None else db.astype(grad_dtype))
    return _row_norm_cupy.backward(dy, x, weight, mean, rstd, nd, False, weight is not None, bool(has_bias),
                                   grad_dtype)
