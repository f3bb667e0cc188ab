""" ``TokenLinear``: a Linear along a token axis, without the transposed copies; and the zero token padding of the
token GEMMs (``token_matmul``) that it shares with the Spatial Gating Unit.

Token-mixing layers apply a Linear along the token axis of channels-last activations (Mixer's token MLP, arXiv
2105.01601 eq. 1 ``X^T W``; sMLPNet's sMLP, arXiv 2109.05422 Alg. 1). Written as in the papers,
``linear(x.transpose(...))``, ``F.linear`` copies the strided input and the caller transposes the result back.
:class:`TokenLinear` is an ``nn.Linear`` (same parameters, init, state dict and function) that contracts the axis
where it lies in memory instead: ``x`` as a ``(P, n, Q)`` view, one batched GEMM ``W (out, n) @ x (P, n, Q)``,
returned as a view in ``x``'s axis order. Callers write the plain formulation, so hooks, LoRA, pruning and FLOP
counters see an ordinary Linear call. The route depends on strides only (``F.linear`` for a contiguous last axis or
fewer than three dimensions, the one branch TorchScript compiles).

Token padding (``token_multiple``, 1 = none), on CUDA only: the contracted token axis of a CUDA tensor is computed
zero-padded up to a multiple (zero weight columns, zero tokens); elsewhere it is contracted as is
(:func:`token_multiple_on` decides, from the input's device). Every padded term is an exact ``0 * 0``: the same
function, parameters and gradients. Why: the fast GPU GEMM kernels want 16-byte aligned row strides, and a 196-token
row (14 x 14 patches at 224²) is 392 bytes in bf16, 400 padded to 200; on the CPU the padding only adds work
(``scripts/gpu/token_padding.py``, ``results/benchmarks/``).
"""
import contextlib
from typing import Any, Iterable, Iterator, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import register_notrace_function, register_notrace_module

__all__ = ['SplitLinear', 'TokenLinear', 'aligned_rows', 'check_token_multiple', 'token_multiple_on', 'token_padding',
           'token_matmul', 'tokens_padded_to']


def check_token_multiple(token_multiple: int) -> None:
    """A token padding multiple must be a positive int (1 = no padding)."""
    if isinstance(token_multiple, bool) or not isinstance(token_multiple, int) or token_multiple < 1:
        raise ValueError(f'token_multiple must be an int >= 1 (1 = no padding), got {token_multiple!r}')


@register_notrace_function  # a leaf for timm's FX feature extraction (a device is no FX proxy value to branch on)
def token_multiple_on(device: torch.device, token_multiple: int) -> int:
    """The multiple a token axis on ``device`` is padded to: ``token_multiple`` on CUDA, 1 (no padding) elsewhere
    (module docstring); the one place that decides, from the input alone."""
    return token_multiple if device.type == 'cuda' else 1


def token_padding(length: int, token_multiple: int) -> int:
    """How many zero tokens pad ``length`` up to a multiple of ``token_multiple`` (0 when it already is one)."""
    return (token_multiple - length % token_multiple) % token_multiple


@contextlib.contextmanager
def attribute_set_to(modules: Iterable[nn.Module], name: str, value: Any) -> Iterator[None]:
    """``module.<name> = value`` on every module of ``modules`` for the ``with`` block, each one's own value restored
    on exit: what a tool sets explicitly (FLOP counters count the papers' formulation), never a model's own route."""
    modules = list(modules)
    saved = [getattr(m, name) for m in modules]
    try:
        for m in modules:
            setattr(m, name, value)
        yield
    finally:
        for m, old in zip(modules, saved):
            setattr(m, name, old)


@contextlib.contextmanager
def tokens_padded_to(model: nn.Module, token_multiple: int) -> Iterator[nn.Module]:
    """Temporarily set ``token_multiple`` on every module of ``model`` that pads a token axis (those with that int
    attribute: ``SpatialGatingUnit``, ``TokenLinear``); restored on exit. FLOP counters use 1: the papers' MACs."""
    check_token_multiple(token_multiple)
    layers = [m for m in model.modules() if isinstance(getattr(m, 'token_multiple', None), int)]
    with attribute_set_to(layers, 'token_multiple', token_multiple):
        yield model


@register_notrace_function  # a leaf for timm's FX feature extraction (whether it pads depends on the token count)
def token_matmul(weight: torch.Tensor, x: torch.Tensor, token_multiple: int = 1) -> torch.Tensor:
    """``torch.bmm(weight.expand(P, -1, -1), x)``: (m, n) @ (P, n, Q) -> (P, m, Q), contracting the n tokens padded
    with zeros up to a multiple of ``token_multiple`` whatever the device (callers pass :func:`token_multiple_on`'s).
    bmm: an op every FLOP counter knows (stock fvcore has no baddbmm handle)."""
    pad = token_padding(x.shape[1], token_multiple)
    if pad:
        weight = F.pad(weight, (0, pad))
        x = F.pad(x, (0, 0, 0, pad))
    return torch.bmm(weight.expand(x.shape[0], -1, -1), x)


@register_notrace_function  # a leaf for timm's FX feature extraction (whether it pads depends on the token count)
def aligned_rows(weight: torch.Tensor, token_multiple: int = 1) -> torch.Tensor:
    """``weight`` (m, n) as the leading (m, n) view of a zero-padded (m, n + pad) copy: the same values at a row
    stride that is a multiple of ``token_multiple`` (``weight`` itself when it already is, or for 1). For a GEMM
    ``weight @ x`` whose right operand is already aligned (the SGU's token-major route): only the small weight is
    copied, no activation is padded; the GEMM contracts exactly n terms."""
    pad = token_padding(weight.shape[-1], token_multiple)
    if pad:
        return F.pad(weight, (0, pad))[:, :weight.shape[-1]]
    return weight


@torch.jit.unused
def _linear_in_memory_order(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                            token_multiple: int = 1) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for an ``x`` whose last axis is not the contiguous one (module docstring), the
    contracted axis zero-padded to a multiple of ``token_multiple`` (:func:`token_matmul`; the caller decides it)."""
    last = x.dim() - 1
    # axes outermost-first in memory; the contracted axis is placed last among equal strides (size-1 axes)
    order: List[int] = sorted(range(x.dim()), key=lambda d: (-x.stride(d), d == last))
    pos = order.index(last)
    xm = x.permute(order)  # contiguous whenever x is a permutation of a contiguous tensor
    outer, inner = xm.shape[:pos], xm.shape[pos + 1:]
    n_outer, n_inner = 1, 1  # *= on purpose: traced sizes are values, and results/complexity.md lists these ops
    for s in outer:
        n_outer *= s
    for s in inner:
        n_inner *= s
    x3 = xm.reshape(n_outer, x.shape[-1], n_inner)  # (P, n, Q): a view when xm is contiguous (sizes given: P may be 0)
    # the GEMM, then the bias in place: the same in eager mode and under torch.jit.trace
    y = token_matmul(weight, x3, token_multiple)
    if bias is not None:
        y = y.add_(bias.unsqueeze(-1))
    y = y.view(list(outer) + [weight.shape[0]] + list(inner))
    return y.permute([order.index(d) for d in range(x.dim())])


@register_notrace_module  # a leaf for timm's FX feature extraction (its route depends on strides)
class TokenLinear(nn.Linear):
    """``nn.Linear`` whose input's last axis may be a strided token axis; see the module docstring.

    Args (beyond ``nn.Linear``'s): token_multiple: on CUDA, the contracted axis (in_features) is computed
    zero-padded up to this multiple (module docstring); 1 = no padding. A plain attribute, read at each call.

    Shapes: x (*, in_features) with any strides -> (*, out_features), laid out in memory like ``x`` (for a token
    axis of a channels-last tensor the output is channels-last too).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 token_multiple: int = 1) -> None:
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        check_token_multiple(token_multiple)
        self.token_multiple = token_multiple

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        token_multiple = token_multiple_on(x.device, self.token_multiple)
        if torch.jit.is_scripting() or x.dim() < 3 or x.stride(-1) == 1:
            pad = token_padding(x.shape[-1], token_multiple)
            if pad:  # zero columns of the weight, as many zero tokens
                return F.linear(F.pad(x, (0, pad)), F.pad(self.weight, (0, pad)), self.bias)
            return F.linear(x, self.weight, self.bias)
        return _linear_in_memory_order(x, self.weight, self.bias, token_multiple)

    def extra_repr(self) -> str:
        return f'{super().extra_repr()}, token_multiple={self.token_multiple}'


class SplitLinear(nn.Linear):
    """``nn.Linear`` (same parameters, init and state dict) that returns ``linear(x).chunk(2, -1)`` as two separate,
    contiguous tensors, by two GEMMs on the halves of ``weight`` and ``bias``: no later pass splits (forward) or
    concatenates (backward) the whole output. gMLP's fc1 with ``GatedMLPBlock(split_fc1=True)``. A wrapper that adds
    a tensor to a Linear's output (LoRA) fails on the pair it returns (TypeError, not a wrong value).

    Shapes: x (*, in_features) -> ((*, out_features // 2), (*, out_features // 2)).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None) -> None:
        if out_features % 2:
            raise ValueError(f'SplitLinear returns two halves; out_features must be even, got {out_features}')
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        half = self.out_features // 2
        w1, w2 = self.weight[:half], self.weight[half:]
        if self.bias is None:
            return F.linear(x, w1), F.linear(x, w2)
        return F.linear(x, w1, self.bias[:half]), F.linear(x, w2, self.bias[half:])
