"""cunorm.torch.BatchNorm1d/2d/3d: the torch.nn classes with cunorm's kernels, a fused
residual and activation."""
from __future__ import annotations

from typing import Optional

import torch

from .. import activations
from ._batch_norm import batch_norm


class _FusedBatchNorm:
    """What the three classes add to torch.nn's: ``activation=``/``activation_param=`` in the
    constructor, ``residual=`` in forward; running statistics and ``num_batches_tracked``
    follow torch's _BatchNorm.forward exactly."""

    def __init__(self, *args, activation: Optional[str] = None, activation_param: Optional[float] = None,
                 **kwargs):
        super().__init__(*args, **kwargs)
        activations.check(activation, activation_param)
        self.activation, self.activation_param = activation, activation_param

    def extra_repr(self) -> str:
        extra = "" if self.activation is None else f", activation={self.activation!r}"
        if self.activation_param is not None:
            extra += f", activation_param={self.activation_param}"
        return super().extra_repr() + extra

    def forward(self, input: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        keep = not self.training or self.track_running_stats
        return batch_norm(input, self.running_mean if keep else None, self.running_var if keep else None,
                          self.weight, self.bias, bn_training, factor, self.eps, residual=residual,
                          activation=self.activation, activation_param=self.activation_param)


class BatchNorm1d(_FusedBatchNorm, torch.nn.BatchNorm1d):
    """``torch.nn.BatchNorm1d`` on cunorm's kernels (+ ``activation``, ``residual``)."""


class BatchNorm2d(_FusedBatchNorm, torch.nn.BatchNorm2d):
    """``torch.nn.BatchNorm2d`` on cunorm's kernels (+ ``activation``, ``residual``); a
    channels_last input stays channels_last, read in place."""


class BatchNorm3d(_FusedBatchNorm, torch.nn.BatchNorm3d):
    """``torch.nn.BatchNorm3d`` on cunorm's kernels (+ ``activation``, ``residual``)."""
