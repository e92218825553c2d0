"""NumPy float64 references: the definition every kernel is tested against.

Same signatures as the public functions; inputs of any float dtype are upcast to float64 and
every result is float64. The public functions run these (then cast) on NumPy inputs.
"""
from __future__ import annotations

import math

import numpy


def _axes(x, nd: int) -> tuple:
    return tuple(range(x.ndim - nd, x.ndim))


def _f64(a):
    return None if a is None else numpy.asarray(a, dtype=numpy.float64)


def _row_mean(a, axes):
    """Mean over ``axes`` (kept), NaN for empty rows without NumPy's warning."""
    n = math.prod(a.shape[i] for i in axes)
    if n == 0:
        return numpy.full([1 if i in axes else s for i, s in enumerate(a.shape)], numpy.nan)
    return a.sum(axis=axes, keepdims=True) / n


def layer_norm(x, weight=None, bias=None, eps=1e-5, *, normalized_ndim=1, return_stats=False, residual=None,
               weight_offset=0.0, _rms=False):
    """y = (h - mean) * rstd * (weight + weight_offset) + bias over the last
    ``normalized_ndim`` axes, with biased variance; h = x, or x + ``residual`` (the pre-norm
    residual add). Returns y; (y, h) with a residual; the statistics appended with
    ``return_stats``: (y[, h], mean, rstd)."""
    x = _f64(x)
    h = x if residual is None else x + _f64(residual)
    axes = _axes(h, normalized_ndim)
    lead = h.shape[: h.ndim - normalized_ndim]
    mean = numpy.zeros_like(_row_mean(h, axes)) if _rms else _row_mean(h, axes)
    var = _row_mean((h - mean) ** 2, axes)
    rstd = 1.0 / numpy.sqrt(var + eps)
    y = (h - mean) * rstd
    if weight is not None:
        y = y * (_f64(weight) + weight_offset)
    elif weight_offset:
        raise ValueError("weight_offset: needs a weight")
    if bias is not None:
        y = y + _f64(bias)
    out = (y,) if residual is None else (y, h)
    if return_stats:
        out += (mean.reshape(lead), rstd.reshape(lead))
    return out if len(out) > 1 else y


def rms_norm(x, weight=None, eps=None, *, normalized_ndim=1, return_stats=False, residual=None, weight_offset=0.0):
    """y = h * rstd * (weight + weight_offset), rstd = 1 / sqrt(mean(h^2) + eps), h as in
    layer_norm; y, (y, h) with a residual, rstd appended with ``return_stats``. ``eps=None``
    means the computation dtype's machine epsilon (float32's for half and float32 x, float64's
    for float64), as torch.nn.functional.rms_norm computes it."""
    if eps is None:
        from ._checks import default_rms_eps

        eps = default_rms_eps(numpy.asarray(x).dtype)
    out = layer_norm(x, weight, None, eps, normalized_ndim=normalized_ndim, return_stats=True, residual=residual,
                     weight_offset=weight_offset, _rms=True)
    out = out[:-2] + out[-1:] if return_stats else out[:-2]
    return out if len(out) > 1 else out[0]


def layer_norm_backward(dy, x, weight, mean, rstd, *, normalized_ndim=1, has_bias=None, dh=None, weight_offset=0.0,
                        _rms=False):
    """(dx, dweight, dbias) of layer_norm given the saved mean and rstd; dweight is None
    without weight, dbias None unless ``has_bias`` (default: whether weight is given).
    With a residual, ``x`` is the forward's h and ``dh`` the gradient of its h output: the
    returned dx (= dh + the norm's gradient) is then the gradient of both x and the residual."""
    if has_bias is None:
        has_bias = weight is not None
    dy, x = _f64(dy), _f64(x)
    axes = _axes(x, normalized_ndim)
    lead_axes = tuple(range(x.ndim - normalized_ndim))
    shape = [1 if i in axes else s for i, s in enumerate(x.shape)]
    mean = numpy.zeros(shape) if _rms else _f64(mean).reshape(shape)
    rstd = _f64(rstd).reshape(shape)
    xhat = (x - mean) * rstd
    wdy = dy if weight is None else dy * (_f64(weight) + weight_offset)
    proj = _row_mean(wdy * xhat, axes)
    centre = 0.0 if _rms else _row_mean(wdy, axes)
    dx = rstd * (wdy - centre - xhat * proj)
    if dh is not None:
        dx = dx + _f64(dh)
    dweight = (dy * xhat).sum(axis=lead_axes) if weight is not None else None
    dbias = dy.sum(axis=lead_axes) if has_bias else None
    return dx, dweight, dbias


def rms_norm_backward(dy, x, weight, rstd, *, normalized_ndim=1, dh=None, weight_offset=0.0):
    """(dx, dweight) of rms_norm given the saved rstd; dweight is None without weight; ``x``
    and ``dh`` as in layer_norm_backward."""
    dx, dweight, _ = layer_norm_backward(dy, x, weight, None, rstd, normalized_ndim=normalized_ndim,
                                         has_bias=False, dh=dh, weight_offset=weight_offset, _rms=True)
    return dx, dweight


def quantize(y, dtype, scale=1.0):
    """The float64 values a saturating cast of ``y * scale`` to ``dtype`` gives (an FP8 type:
    float8_e4m3fn saturates at ±448, float8_e5m2 at ±57344; round to nearest even), and
    amax = max |y| before scaling. FP8 outputs compare with these after dequantization."""
    from ._checks import ml_finfo

    y = _f64(y)
    top = float(ml_finfo(dtype).max)
    q = numpy.clip(y * scale, -top, top).astype(dtype).astype(numpy.float64)
    amax = float(numpy.abs(y).max()) if y.size else 0.0
    return q, amax


# ---- BatchNorm --------------------------------------------------------------------------

def _channel_shape(x, channel_axis: int) -> tuple:
    """(reduction axes, the shape per-channel vectors broadcast as)."""
    ax = channel_axis % x.ndim
    shape = [1] * x.ndim
    shape[ax] = x.shape[ax]
    return tuple(i for i in range(x.ndim) if i != ax), tuple(shape)


def batch_norm(x, weight=None, bias=None, running_mean=None, running_var=None, *, training=True, momentum=0.1,
               eps=1e-5, residual=None, activation=None, activation_param=None, channel_axis=1,
               num_batches_tracked=None, return_stats=False):
    """y = act((x - mean) * rstd * weight + bias + residual), statistics per channel over all
    other axes: the batch's (biased variance) when ``training``, else the running ones.
    Training updates ``running_mean``/``running_var`` in place with the unbiased variance:
    new = (1 - f) * old + f * batch, f = ``momentum``, or 1 / ``num_batches_tracked`` when
    ``momentum`` is None (PyTorch's cumulative average). (y, mean, rstd) with ``return_stats``:
    the statistics the normalization used, per channel."""
    from . import activations

    x64 = _f64(x)
    axes, shape = _channel_shape(x64, channel_axis)
    if training:
        count = x64.size // max(1, x64.shape[channel_axis % x64.ndim])
        mean = x64.mean(axis=axes) if count else numpy.full(shape[channel_axis % x64.ndim], numpy.nan)
        var = ((x64 - mean.reshape(shape)) ** 2).mean(axis=axes) if count else numpy.full_like(mean, numpy.nan)
        if running_mean is not None or running_var is not None:
            f = (1.0 / num_batches_tracked) if momentum is None else momentum
            unbiased = var * count / (count - 1) if count > 1 else numpy.full_like(var, numpy.nan)
            if running_mean is not None:
                running_mean[...] = (1 - f) * _f64(running_mean) + f * mean
            if running_var is not None:
                running_var[...] = (1 - f) * _f64(running_var) + f * unbiased
    else:
        mean, var = _f64(running_mean), _f64(running_var)
    rstd = 1.0 / numpy.sqrt(var + eps)
    z = (x64 - mean.reshape(shape)) * rstd.reshape(shape)
    if weight is not None:
        z = z * _f64(weight).reshape(shape)
    if bias is not None:
        z = z + _f64(bias).reshape(shape)
    if residual is not None:
        z = z + _f64(residual)
    y = activations.forward(z, activation, activation_param)
    return (y, mean, rstd) if return_stats else y


def batch_norm_pre_activation(x, weight, bias, mean, rstd, *, residual=None, channel_axis=1):
    """(xhat, z) in float64: x normalized by the given per-channel statistics, and the
    activation's input z = xhat * weight + bias + residual (each where given)."""
    x64 = _f64(x)
    _, shape = _channel_shape(x64, channel_axis)
    xhat = (x64 - _f64(mean).reshape(shape)) * _f64(rstd).reshape(shape)
    z = xhat if weight is None else xhat * _f64(weight).reshape(shape)
    if bias is not None:
        z = z + _f64(bias).reshape(shape)
    if residual is not None:
        z = z + _f64(residual)
    return xhat, z


def batch_norm_backward(dy, x, weight, bias, mean, rstd, *, residual=None, activation=None,
                        activation_param=None, training=True, channel_axis=1, has_bias=None):
    """(dx, dweight, dbias, dresidual) of batch_norm given the statistics it used. The
    pre-activation is recomputed from x, the statistics, the parameters and the residual.
    dweight is None without weight, dbias None unless ``has_bias`` (default: bias given),
    dresidual None without residual. With ``training`` the statistics depend on x (batch
    statistics); without, they are constants (running statistics)."""
    from . import activations

    if has_bias is None:
        has_bias = bias is not None
    dy, x64 = _f64(dy), _f64(x)
    axes, _ = _channel_shape(x64, channel_axis)
    xhat, z = batch_norm_pre_activation(x64, weight, bias, mean, rstd, residual=residual, channel_axis=channel_axis)
    dz = dy * activations.derivative(z, activation, activation_param)
    dbias = dz.sum(axis=axes) if has_bias else None
    dweight = (dz * xhat).sum(axis=axes) if weight is not None else None
    dx = batch_norm_dx(dz, xhat, weight, rstd, training=training, channel_axis=channel_axis)
    return dx, dweight, dbias, (dz if residual is not None else None)


def batch_norm_dx(dz, xhat, weight, rstd, *, training=True, channel_axis=1):
    """dx of batch_norm given dz, the activation's input's gradient (linear in dz): w * rstd
    * dz and, with ``training`` (batch statistics), less the channel's means of dz and of dz
    * xhat times xhat."""
    dz, xhat = _f64(dz), _f64(xhat)
    axes, shape = _channel_shape(dz, channel_axis)
    scale = _f64(rstd).reshape(shape)
    if weight is not None:
        scale = scale * _f64(weight).reshape(shape)
    if not training:
        return scale * dz
    count = dz.size // dz.shape[channel_axis % dz.ndim]
    return scale * (dz - dz.sum(axis=axes, keepdims=True) / count
                    - xhat * (dz * xhat).sum(axis=axes, keepdims=True) / count)
