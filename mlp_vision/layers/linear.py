""" ``TokenLinear``: a Linear along a token axis, without the transposed copies.

Token-mixing layers apply a Linear along the token axis of activations whose contiguous axis is the channel axis:
MLP-Mixer's token MLP maps the n patches of a (B, n, C) tensor (Mixer, arXiv 2105.01601, eq. 1: ``X^T W``), the
sMLP of sMLPNet maps the H (or W) positions of a channels-last (B, H, W, C) map (sMLPNet, arXiv 2109.05422, §3.2,
Alg. 1). Written as in the papers, ``linear(x.transpose(...))``, the Linear sees an input whose last axis has
stride C. ``F.linear`` copies such an input into a contiguous one and returns the result in the transposed order,
which the caller transposes back: two copies of the activations around one GEMM.

:class:`TokenLinear` is an ``nn.Linear`` (same parameters, initialisation, state dict and function
``y = x W^T + b`` over the last axis) that contracts that axis where it lies in memory instead: with ``x``'s
axes put in memory order (outermost first), the contracted axis sits between ``P`` outer and ``Q`` inner
elements, so ``x`` is a ``(P, n, Q)`` view and the result is one batched GEMM ``W (out, n) @ x (P, n, Q)`` plus the
bias, returned as a view in ``x``'s axis order. No copy in either direction. The caller writes the plain
formulation, ``self.fc(x.transpose(1, 2)).transpose(1, 2)``, and hooks, LoRA wrappers, pruning and FLOP counters
see an ordinary Linear call.

The layout is chosen from the input's strides only: ``F.linear`` when the last axis is contiguous or the input has
fewer than three dimensions, the batched GEMM otherwise, whether or not anything traces or hooks the module.
TorchScript compiles the ``F.linear`` branch only (the stride-sorting code is not scriptable).
"""
from typing import List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import register_notrace_module

__all__ = ['TokenLinear']


@torch.jit.unused
def _linear_in_memory_order(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for an ``x`` whose last axis is not the contiguous one (see module docstring)."""
    last = x.dim() - 1
    # axes outermost-first in memory; the contracted axis is placed last among equal strides (size-1 axes)
    order: List[int] = sorted(range(x.dim()), key=lambda d: (-x.stride(d), d == last))
    pos = order.index(last)
    xm = x.permute(order)  # contiguous whenever x is a permutation of a contiguous tensor
    outer = xm.shape[:pos]
    inner = xm.shape[pos + 1:]
    n_outer, n_inner = 1, 1
    for s in outer:
        n_outer *= s
    for s in inner:
        n_inner *= s
    x3 = xm.reshape(n_outer, x.shape[-1], n_inner)  # (P, n, Q): a view when xm is contiguous (sizes given: P may be 0)
    # bmm, then the bias in place: ops that every FLOP counter knows (stock fvcore has no baddbmm handle), the same
    # in eager mode and under torch.jit.trace
    y = torch.bmm(weight.expand(n_outer, -1, -1), x3)
    if bias is not None:
        y = y.add_(bias.unsqueeze(-1))
    y = y.view(list(outer) + [weight.shape[0]] + list(inner))
    inverse = [0] * len(order)
    for i, d in enumerate(order):
        inverse[d] = i
    return y.permute(inverse)


@register_notrace_module  # a leaf for timm's FX feature extraction (its route depends on strides)
class TokenLinear(nn.Linear):
    """``nn.Linear`` whose input's last axis may be a strided token axis; see the module docstring.

    Shapes: x (*, in_features) with any strides -> (*, out_features), laid out in memory like ``x`` (for a token
    axis of a channels-last tensor the output is channels-last too).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting() or x.dim() < 3 or x.stride(-1) == 1:
            return F.linear(x, self.weight, self.bias)
        return _linear_in_memory_order(x, self.weight, self.bias)
