"""Forward-mode AD (``torch.autograd.forward_ad`` dual tensors; ``torch.func.jvp`` /
``jacfwd``, which run on them) reaching cunorm's ops.

A custom op whose autograd is registered with ``register_autograd`` has a backward only:
torch gives its outputs no tangent, silently, so ``torch.func.jvp`` returned zero tangents
and ``forward_ad.unpack_dual`` None through BatchNorm and the fused options, and dual
tensors got None through every eager op (their shortcut launches the kernels outside
autograd). LayerNorm and RMSNorm take ``cunorm.torch._func``'s Function there, which has a
jvp; BatchNorm and the fused options raise (``refuse``), an error instead of a wrong
number.
"""
from __future__ import annotations

import torch
from torch.autograd import forward_ad


def active() -> bool:
    """Whether a forward-AD level is open (``forward_ad.dual_level``; ``torch.func.jvp``
    opens one): a module global, so the common path pays one attribute read."""
    return forward_ad._current_level >= 0


def has_tangent(*tensors) -> bool:
    """Whether any of ``tensors`` (None allowed) carries a tangent at the current level.
    Only outside functorch transforms, where ``unpack_dual`` works (vmap has no batching
    rule for it)."""
    return any(t is not None and forward_ad.unpack_dual(t).tangent is not None for t in tensors)


def refuse(name: str, *tensors) -> None:
    """Raise where forward-mode tangents may reach ``name``, an op without a forward-mode
    rule. Under functorch transforms inside a forward-AD level (jvp, jacfwd, or vmap / grad
    nested with them) tangents cannot be inspected, so any such call is refused."""
    if active() and (torch._C._are_functorch_transforms_active() or has_tangent(*tensors)):
        raise RuntimeError(
            f"{name}: forward-mode AD (torch.func.jvp / jacfwd, torch.autograd.forward_ad) is not "
            "supported here; its tangents would be silently dropped. Use reverse mode (backward, "
            "torch.func.grad / jacrev), or torch.nn.functional for this call")
