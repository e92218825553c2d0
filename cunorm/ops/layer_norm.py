"""LayerNorm: public functions for CuPy arrays (GPU kernels) and NumPy arrays (reference)."""
from __future__ import annotations

from .. import _checks, reference
from . import _row_norm_cupy


def layer_norm(x, weight=None, bias=None, eps=1e-5, *, normalized_ndim=1, return_stats=False):
    """Layer normalization over the last ``normalized_ndim`` axes of ``x``.

    ``weight`` and ``bias`` have shape ``x.shape[-normalized_ndim:]`` (PyTorch's
    ``normalized_shape``) and may have another float dtype than ``x``. Returns ``y`` (dtype
    and shape of ``x``, C-contiguous), or ``(y, mean, rstd)`` with ``return_stats``: one value
    per row, shape ``x.shape[:-normalized_ndim]``, float32 (float64 for float64 ``x``).

    Leading axes may have any strides (no copy); if the normalized axes are not contiguous,
    ``x`` is copied once. CuPy arrays run on the GPU on the current stream; NumPy arrays run
    the float64 reference on the CPU.
    """
    kind = _checks.backend(x=x, weight=weight, bias=bias)
    _checks.float_dtype("x", x)
    nd = _checks.normalized_ndim(x, normalized_ndim)
    _checks.param("weight", weight, x, nd)
    _checks.param("bias", bias, x, nd)
    eps = _checks.eps(eps, x.dtype)
    if kind == "numpy":
        y, mean, rstd = reference.layer_norm(x, weight, bias, eps, normalized_ndim=nd, return_stats=True)
        acc = _checks.acc_dtype(x.dtype)
        y, mean, rstd = y.astype(x.dtype), mean.astype(acc), rstd.astype(acc)
    else:
        y, mean, rstd = _row_norm_cupy.forward(x, weight, bias, eps, nd, rms=False, stats=return_stats)
    return (y, mean, rstd) if return_stats else y


def layer_norm_backward(dy, x, weight, mean, rstd, *, normalized_ndim=1, has_bias=None):
    """Gradients of :func:`layer_norm`: ``(dx, dweight, dbias)``.

    ``mean``/``rstd`` are the statistics ``layer_norm(..., return_stats=True)`` returned.
    ``dweight`` is None without ``weight``; ``dbias`` is computed when ``has_bias`` (default:
    when ``weight`` is given). ``dx`` has ``x``'s dtype; ``dweight``/``dbias`` have the
    weight's dtype (``x``'s without weight). Bit-identical from run to run.
    """
    kind = _checks.backend(dy=dy, x=x, weight=weight, mean=mean, rstd=rstd)
    _checks.float_dtype("x", x)
    _checks.same_shape("dy", dy, x)
    nd = _checks.normalized_ndim(x, normalized_ndim)
    _checks.param("weight", weight, x, nd)
    _checks.stats("mean", mean, x, nd)
    _checks.stats("rstd", rstd, x, nd)
    if has_bias is None:
        has_bias = weight is not None
    grad_dtype = x.dtype if weight is None else weight.dtype
    if kind == "numpy":
        dx, dw, db = reference.layer_norm_backward(dy, x, weight, mean, rstd, normalized_ndim=nd,
                                                   has_bias=has_bias)
        return (dx.astype(x.dtype), None if dw is None else dw.astype(grad_dtype),
                None if db is None else db.astype(grad_dtype))
    return _row_norm_cupy.backward(dy, x, weight, mean, rstd, nd, False, weight is not None, bool(has_bias),
                                   grad_dtype)
