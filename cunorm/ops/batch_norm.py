"""BatchNorm with a fused residual and activation: public functions for CuPy arrays (GPU
kernels) and NumPy arrays (the float64 reference on the CPU)."""
from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy

from .. import _checks, activations, reference


def _channel_axis(x, channel_axis) -> int:
    if isinstance(channel_axis, bool) or not isinstance(channel_axis, numbers.Integral):
        raise TypeError(f"channel_axis: expected an int, got {type(channel_axis).__name__}")
    if channel_axis not in (1, -1):
        raise ValueError(f"channel_axis: must be 1 or -1, got {channel_axis}")
    return channel_axis % x.ndim


def _check_x(name, x):
    _checks.float_dtype(name, x)
    if not 2 <= x.ndim <= 5:
        raise ValueError(f"{name}: expected 2 to 5 dimensions (N, C, ...), got shape {tuple(x.shape)}")


def _per_channel(name, a, channels):
    if a is None:
        return
    _checks.float_dtype(name, a)
    if tuple(a.shape) != (channels,):
        raise ValueError(f"{name}: expected shape ({channels},), got {tuple(a.shape)}")


def _count(x, axis) -> int:
    return x.size // x.shape[axis] if x.shape[axis] else 0


def batch_norm(x, weight=None, bias=None, running_mean=None, running_var=None, *, training=True, momentum=0.1,
               eps=1e-5, residual=None, activation=None, activation_param=None, channel_axis=1,
               num_batches_tracked=None, return_stats=False):
    """Batch normalization of ``x`` (N, C, ...spatial) per channel, then ``+ residual`` and
    ``activation``, in one pass over the output.

    Training normalizes with the batch's mean and biased variance and, where given, updates
    ``running_mean``/``running_var`` in place with the unbiased variance (factor ``momentum``,
    or ``1 / num_batches_tracked`` when ``momentum`` is None, as PyTorch's cumulative average).
    Eval (``training=False``) normalizes with the running statistics. ``channel_axis`` is 1
    (NCHW) or -1 (channels last); a channels-last array is read in place, never transposed,
    and ``y`` keeps ``x``'s memory layout. ``activation`` is one of
    ``cunorm.activations.ACTIVATIONS`` (``activation_param``: leaky_relu's slope, elu's alpha,
    softplus's beta). Returns ``y``, or ``(y, mean, rstd)`` with ``return_stats``: the
    per-channel statistics used, float32 (float64 for float64 ``x``).
    """
    kind = _checks.backend(x=x, weight=weight, bias=bias, running_mean=running_mean, running_var=running_var,
                           residual=residual)
    axis, act, param, eps, factor = checked_forward(x, weight, bias, running_mean, running_var, training, momentum,
                                                    eps, residual, activation, activation_param, channel_axis,
                                                    num_batches_tracked)
    if training and (running_mean is not None or running_var is not None):
        _checks.updated_in_place(dict(running_mean=running_mean, running_var=running_var),
                                 dict(x=x, weight=weight, bias=bias, residual=residual))
    if kind == "numpy":
        y, mean, rstd = reference.batch_norm(
            x, weight, bias, running_mean, running_var, training=training, momentum=factor if training else momentum,
            eps=eps, residual=residual, activation=activation, activation_param=param, channel_axis=axis,
            return_stats=True)
        acc = _checks.acc_dtype(x.dtype)
        y, mean, rstd = y.astype(x.dtype), mean.astype(acc), rstd.astype(acc)
    else:
        from . import _batch_norm_cupy

        y, mean, rstd = _batch_norm_cupy.forward(x, weight, bias, running_mean, running_var, training, factor, eps,
                                                 residual, act, param, axis)
    return (y, mean, rstd) if return_stats else y


class Checked(NamedTuple):
    axis: int  # the channel axis, in [0, ndim)
    act: int  # the kernels' activation id
    param: float  # the activation's parameter
    eps: float
    factor: float  # the running statistics' update factor (0 without them in training, and in eval)


def checked_forward(x, weight, bias, running_mean, running_var, training, momentum, eps, residual, activation,
                    activation_param, channel_axis, num_batches_tracked) -> Checked:
    """batch_norm's arguments checked (each error names its argument), for every frontend
    (CuPy / NumPy here, JAX): anything with shape and dtype."""
    _check_x("x", x)
    axis = _channel_axis(x, channel_axis)
    channels = x.shape[axis]
    for name, a in (("weight", weight), ("bias", bias), ("running_mean", running_mean), ("running_var", running_var)):
        _per_channel(name, a, channels)
    if residual is not None:
        _checks.same_shape("residual", residual, x)
        _checks.float_dtype("residual", residual)
    act, param = activations.check(activation, activation_param)
    eps = _checks.eps(eps, x.dtype)
    if not isinstance(training, (bool, numpy.bool_)):
        raise TypeError(f"training: expected a bool, got {type(training).__name__}")
    if momentum is not None:  # checked where no running statistics use it too, as torch's signature
        _checks.momentum(momentum)
    factor = 0.0
    if training:
        if _count(x, axis) < 2 and x.size:
            raise ValueError(f"x: expected more than 1 value per channel when training, got shape {tuple(x.shape)}")
        if running_mean is not None or running_var is not None:
            factor = _factor(momentum, num_batches_tracked)
    elif running_mean is None or running_var is None:
        raise ValueError("running_mean: eval (training=False) normalizes with the running statistics; "
                         "running_mean and running_var are required")
    return Checked(axis, act, param, eps, factor)


def _factor(momentum, num_batches_tracked) -> float:
    if momentum is None:
        if (isinstance(num_batches_tracked, bool) or not isinstance(num_batches_tracked, numbers.Integral)
                or num_batches_tracked < 1):
            raise ValueError("num_batches_tracked: momentum=None (cumulative average) needs the number of batches "
                             f"seen, this one included (an int >= 1), got {num_batches_tracked!r}")
        return 1.0 / int(num_batches_tracked)
    return _checks.momentum(momentum)


def batch_norm_backward(dy, x, weight, bias, mean, rstd, *, residual=None, activation=None, activation_param=None,
                        training=True, channel_axis=1, has_bias=None, residual_grad=None):
    """Gradients of :func:`batch_norm`: ``(dx, dweight, dbias, dresidual)``.

    ``mean``/``rstd`` are the statistics the forward used (``return_stats=True``). The
    pre-activation is recomputed from ``x``, the statistics, ``weight``, ``bias`` and
    ``residual`` (not stored by the forward: that would move more bytes). ``dweight`` is None
    without weight; ``dbias`` computed when ``has_bias`` (default: bias given); ``dresidual``
    when ``residual_grad`` (default: residual given) — it equals the gradient before the
    affine transform. ``training=False``: the statistics were running ones (constants).
    """
    kind = _checks.backend(dy=dy, x=x, weight=weight, bias=bias, mean=mean, rstd=rstd, residual=residual)
    _check_x("x", x)
    _checks.same_shape("dy", dy, x)
    axis = _channel_axis(x, channel_axis)
    channels = x.shape[axis]
    for name, a in (("weight", weight), ("bias", bias), ("mean", mean), ("rstd", rstd)):
        _per_channel(name, a, channels)
    if mean is None or rstd is None:
        raise ValueError("mean: the forward's statistics (mean and rstd) are required")
    if residual is not None:
        _checks.same_shape("residual", residual, x)
    act, param = activations.check(activation, activation_param)
    has_bias = bias is not None if has_bias is None else bool(has_bias)
    residual_grad = residual is not None if residual_grad is None else bool(residual_grad)
    grad_dtype = x.dtype if weight is None else weight.dtype
    if kind == "numpy":
        # without a residual, its gradient is still dz: a zero residual gives the reference's
        r = numpy.zeros(x.shape) if residual is None and residual_grad else residual
        dx, dw, db, dr = reference.batch_norm_backward(
            dy, x, weight, bias, mean, rstd, residual=r, activation=activation, activation_param=param,
            training=training, channel_axis=axis, has_bias=has_bias)
        return (dx.astype(x.dtype), None if dw is None else dw.astype(grad_dtype),
                None if db is None else db.astype(grad_dtype), None if not residual_grad else dr.astype(x.dtype))
    from . import _batch_norm_cupy

    return _batch_norm_cupy.backward(dy, x, weight, bias, mean, rstd, residual, act, param, bool(training), axis,
                                     has_bias, residual_grad, grad_dtype)
