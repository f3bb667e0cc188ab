""" GELU that works in place on a freshly computed activation when no gradient is recorded.

Why: on CPU a new activation of tens of MB is a fresh ``mmap`` whose pages fault in on first touch, which costs
several times an element-wise op. In ``no_grad`` / ``inference_mode`` nothing needs the pre-activation, so the GELU
may overwrite it; with autograd it is the ordinary out-of-place op. Only for inputs the caller has just computed
and owns (a GEMM / conv / norm output): the blocks here swap their ``nn.GELU`` for :class:`FreshGELU`
(:func:`fresh_input_act`) exactly there. Same values, same state dict, scriptable and exportable; while
``torch.jit.trace`` records it is the out-of-place GELU, so a traced graph does not depend on whether gradients
were on.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ['FreshGELU', 'fresh_gelu', 'fresh_input_act', 'gelu_product']


def fresh_gelu(x: torch.Tensor, approximate: str = 'none') -> torch.Tensor:
    """``F.gelu(x)``; in place (overwriting ``x``) when gradients are off. ``x`` must be the caller's own fresh
    tensor."""
    if torch.is_grad_enabled() or torch.jit.is_tracing():
        return F.gelu(x, approximate=approximate)
    return torch.ops.aten.gelu_(x, approximate=approximate)


class FreshGELU(nn.GELU):
    """``nn.GELU`` for fresh inputs: in place when gradients are off (see the module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fresh_gelu(x, self.approximate)


def fresh_input_act(act: nn.Module) -> nn.Module:
    """``act`` as a :class:`FreshGELU` if it is a plain ``nn.GELU``; any other activation unchanged. Use only for
    an activation that is always applied to a freshly computed tensor."""
    return FreshGELU(approximate=act.approximate) if type(act) is nn.GELU else act


class _GELUProduct(torch.autograd.Function):
    """``GELU(a) * GELU(b)`` keeping only ``a`` and ``b`` for the backward pass (autograd's graph keeps both outputs
    too), the GELUs recomputed there. The gradients are autograd's (the product's backward, then ``gelu_backward``),
    bit for bit."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor, approximate: str) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        ctx.approximate = approximate
        return F.gelu(a, approximate=approximate) * F.gelu(b, approximate=approximate)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        a, b = ctx.saved_tensors
        act = ctx.approximate
        grad_a, grad_b = (torch.ops.aten.gelu_backward(grad * F.gelu(other, approximate=act), x, approximate=act)
                          if needed else None
                          for x, other, needed in ((a, b, ctx.needs_input_grad[0]), (b, a, ctx.needs_input_grad[1])))
        return grad_a, grad_b, None


def gelu_product(a: torch.Tensor, b: torch.Tensor, approximate: str = 'none') -> torch.Tensor:
    """``F.gelu(a) * F.gelu(b)`` of two fresh tensors of one shape (e.g. gMLP-style gates, BiGS's output gate).

    With autograd it keeps half the activations autograd would (:class:`_GELUProduct`); without, it works in place
    on ``a`` and ``b`` (:func:`fresh_gelu`); while ``torch.jit.trace`` records, the ordinary ops (a traced graph holds
    no Python autograd function). The values are the same in every case."""
    if torch.jit.is_tracing():
        return F.gelu(a, approximate=approximate) * F.gelu(b, approximate=approximate)
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return _GELUProduct.apply(a, b, approximate)
    return fresh_gelu(a, approximate).mul_(fresh_gelu(b, approximate))
