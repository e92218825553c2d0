"""The activations BatchNorm can apply in its kernel, in float64 NumPy: each one's value and
derivative, with PyTorch's definitions and default parameters (the kernels implement the
same formulas in kernels/activations.cuh; the ids below are theirs)."""
from __future__ import annotations

import math

import numpy

# name -> (kernel id, default parameter or None when the activation takes none)
ACTIVATIONS = {
    None: (0, None),
    "relu": (1, None),
    "leaky_relu": (2, 0.01),  # negative_slope
    "gelu": (3, None),  # exact, with erf
    "gelu_tanh": (4, None),  # approximate="tanh"
    "silu": (5, None),
    "sigmoid": (6, None),
    "tanh": (7, None),
    "mish": (8, None),
    "elu": (9, 1.0),  # alpha
    "hardswish": (10, None),
    "softplus": (11, 1.0),  # beta; threshold 20 as torch's default
}
SOFTPLUS_THRESHOLD = 20.0
_GELU_TANH_C = math.sqrt(2.0 / math.pi)


def check(activation, activation_param):
    """(kernel id, parameter as float) of a valid activation; ValueError naming the argument."""
    if activation not in ACTIVATIONS:
        names = ", ".join(repr(a) for a in ACTIVATIONS)
        raise ValueError(f"activation: {activation!r} is not one of {names}")
    kid, default = ACTIVATIONS[activation]
    if activation_param is not None and default is None:
        raise ValueError(f"activation_param: {activation!r} takes no parameter (got {activation_param!r})")
    param = default if activation_param is None else activation_param
    try:
        param = 0.0 if param is None else float(param)
    except (TypeError, ValueError):
        raise TypeError(f"activation_param: expected a number, got {type(activation_param).__name__}") from None
    if not math.isfinite(param):
        raise ValueError(f"activation_param: must be finite, got {param}")
    return kid, param


def _sigmoid(z):
    return 0.5 * (1.0 + numpy.tanh(0.5 * z))  # overflow-free


def _erf(z):
    from math import erf

    return numpy.vectorize(erf, otypes=[numpy.float64])(z)


def _softplus(z, beta):
    bz = beta * z
    return numpy.where(bz > SOFTPLUS_THRESHOLD, z, numpy.logaddexp(0.0, bz) / beta)


def forward(z, activation, param):
    """act(z), float64."""
    z = numpy.asarray(z, numpy.float64)
    if activation is None:
        return z
    if activation == "relu":
        return numpy.maximum(z, 0.0)
    if activation == "leaky_relu":
        return numpy.where(z > 0, z, param * z)
    if activation == "gelu":
        return 0.5 * z * (1.0 + _erf(z / math.sqrt(2.0)))
    if activation == "gelu_tanh":
        return 0.5 * z * (1.0 + numpy.tanh(_GELU_TANH_C * (z + 0.044715 * z ** 3)))
    if activation == "silu":
        return z * _sigmoid(z)
    if activation == "sigmoid":
        return _sigmoid(z)
    if activation == "tanh":
        return numpy.tanh(z)
    if activation == "mish":
        return z * numpy.tanh(_softplus(z, 1.0))
    if activation == "elu":
        return numpy.where(z > 0, z, param * numpy.expm1(numpy.minimum(z, 0.0)))
    if activation == "hardswish":
        return z * numpy.clip(z + 3.0, 0.0, 6.0) / 6.0
    if activation == "softplus":
        return _softplus(z, param)
    raise ValueError(f"activation: {activation!r}")


def derivative(z, activation, param):
    """d act / dz at z, float64, with PyTorch's choices at the kinks (relu: 0 at 0)."""
    z = numpy.asarray(z, numpy.float64)
    if activation is None:
        return numpy.ones_like(z)
    if activation == "relu":
        return (z > 0).astype(numpy.float64)
    if activation == "leaky_relu":
        return numpy.where(z > 0, 1.0, param)
    if activation == "gelu":
        return 0.5 * (1.0 + _erf(z / math.sqrt(2.0))) + z * numpy.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    if activation == "gelu_tanh":
        t = numpy.tanh(_GELU_TANH_C * (z + 0.044715 * z ** 3))
        return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * _GELU_TANH_C * (1.0 + 3 * 0.044715 * z * z)
    if activation == "silu":
        s = _sigmoid(z)
        return s * (1.0 + z * (1.0 - s))
    if activation == "sigmoid":
        s = _sigmoid(z)
        return s * (1.0 - s)
    if activation == "tanh":
        return 1.0 - numpy.tanh(z) ** 2
    if activation == "mish":
        tsp = numpy.tanh(_softplus(z, 1.0))
        return tsp + z * _sigmoid(z) * (1.0 - tsp * tsp)
    if activation == "elu":
        return numpy.where(z > 0, 1.0, param * numpy.exp(numpy.minimum(z, 0.0)))
    if activation == "hardswish":
        return numpy.where(z < -3.0, 0.0, numpy.where(z <= 3.0, z / 3.0 + 0.5, 1.0))
    if activation == "softplus":
        return numpy.where(param * z > SOFTPLUS_THRESHOLD, 1.0, _sigmoid(param * z))
    raise ValueError(f"activation: {activation!r}")
