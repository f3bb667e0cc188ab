""" Linear routes: ``TokenLinear`` (a Linear along a token axis without the transposed copies) and
``channel_linear`` / ``ChannelMlp`` (channel GEMMs through oneDNN while nothing observes the Linear).

TokenLinear
-----------

Token-mixing layers apply a Linear along the token axis of activations whose contiguous axis is the channel axis:
MLP-Mixer's token MLP maps the n patches of a (B, n, C) tensor (Mixer, arXiv 2105.01601, eq. 1: ``X^T W``), the
sMLP of sMLPNet maps the H (or W) positions of a channels-last (B, H, W, C) map (sMLPNet, arXiv 2109.05422, §3.2,
Alg. 1). Written as in the papers, ``linear(x.transpose(...))``, the Linear sees an input whose last axis has
stride C. ``F.linear`` copies such an input into a contiguous one and returns the result in the transposed order,
which the caller transposes back: two copies of the activations around one GEMM.

:class:`TokenLinear` is an ``nn.Linear`` (same parameters, initialisation, state dict and function
``y = x W^T + b`` over the last axis) that contracts that axis where it lies in memory instead: with ``x``'s
axes put in memory order (outermost first), the contracted axis sits between ``P`` outer and ``Q`` inner
elements, so ``x`` is a ``(P, n, Q)`` view and the result is one batched GEMM ``W (out, n) @ x (P, n, Q)`` with the
bias as the broadcast addend, returned as a view in ``x``'s axis order. No copy in either direction. The caller
writes the plain formulation, ``self.fc(x.transpose(1, 2)).transpose(1, 2)``, and hooks, LoRA wrappers, pruning
and FLOP counters see an ordinary Linear call.

The plain ``F.linear`` is used whenever it is as good or the other route would hide the op from a tool: when the
last axis is contiguous, for inputs of fewer than three dimensions, while TorchScript compiles the module and while
``torch.jit.trace`` records it (so fvcore and the TorchScript-based exporters see ``aten::linear``).

channel_linear / ChannelMlp
---------------------------
In float32 on CPU, ``nn.Linear`` runs MKL's sgemm, which on AMD processors does not use AVX-512; oneDNN's kernels do,
and a 1x1 convolution on a channels-last view of the same memory runs the same GEMM through oneDNN (measured on
this project's CPU, 2 threads: 1.0-1.26x per GEMM, 1.05-1.09x per model; results/benchmarks/README.md). :func:`channel_linear` takes that route for a parent's
channel Linear only when nothing could tell the difference, and otherwise calls the module:

* the child is exactly ``nn.Linear`` with the class's own ``forward`` (a LoRA wrapper, a quantised or pruned
  replacement, a parametrized or subclassed Linear, ``nn.Identity``, an instance-patched ``forward``: the module);
* no hook of any kind is registered on it or globally (hooks, Grad-CAM, FLOP counters such as ``FlopCounterMode``
  and thop, FSDP / DeepSpeed / accelerate: the module, so every hook fires);
* no tracing, scripting, compiling or exporting (fvcore, ``torch.jit.trace``, ``torch.compile``, ``torch.export``,
  ONNX: the module) and no TorchFunction / TorchDispatch mode is active (fake tensors, FLOP counters);
* CPU, float32, autocast off, at least 1,024 rows and 16 per sample (below that oneDNN's per-call weight reorder
  costs more than it saves), and the route is on (:func:`set_onednn_channel_linear`).

The parameters are the module's own (read at call time, so ``torch.func.functional_call`` and optimizers see the
same tensors), gradients reach them through the convolution, and the result equals ``module(x)`` up to float32
summation order.
"""
import functools
from typing import List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.modules.module as _module_state
from timm.layers import Mlp, register_notrace_module

__all__ = ['TokenLinear', 'channel_linear', 'set_onednn_channel_linear', 'ChannelMlp']


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
    w = weight.expand(n_outer, -1, -1)
    if bias is None:
        y = torch.bmm(w, x3)
    else:
        y = torch.baddbmm(bias.unsqueeze(-1), w, x3)
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
        if torch.jit.is_scripting() or torch.jit.is_tracing() or x.dim() < 3 or x.stride(-1) == 1:
            return F.linear(x, self.weight, self.bias)
        return _linear_in_memory_order(x, self.weight, self.bias)


_PLAIN_LINEAR_FORWARD = nn.Linear.forward
_GLOBAL_HOOKS = ('_global_forward_hooks', '_global_forward_pre_hooks', '_global_backward_hooks',
                 '_global_backward_pre_hooks', '_global_forward_hooks_always_called')
_onednn_enabled = True


def set_onednn_channel_linear(enabled: bool) -> bool:
    """Switch :func:`channel_linear`'s oneDNN route on or off (process-wide); returns the previous setting."""
    global _onednn_enabled
    previous, _onednn_enabled = _onednn_enabled, bool(enabled)
    return previous


def _unobserved_plain_linear(linear: nn.Module) -> bool:
    """``linear`` is exactly an ``nn.Linear`` that no hook, patch or mode is watching (tracers and compilers are
    checked first, by :func:`channel_linear`)."""
    if type(linear) is not nn.Linear or nn.Linear.forward is not _PLAIN_LINEAR_FORWARD or 'forward' in vars(linear):
        return False
    if linear._forward_hooks or linear._forward_pre_hooks or linear._backward_hooks or linear._backward_pre_hooks:
        return False
    if any(getattr(_module_state, name, None) for name in _GLOBAL_HOOKS):
        return False
    return not (torch._C._is_torch_function_mode_enabled() or torch._C._len_torch_dispatch_stack() > 0)


@functools.lru_cache(maxsize=256)
def _images_of_16_or_more(rows: int) -> int:
    """The smallest divisor of ``rows`` (>= 16) that is at least 16."""
    return next(n for n in range(16, rows + 1) if rows % n == 0)


def channel_linear(linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``linear(x)`` over the contiguous last axis of ``x`` (*, C), through oneDNN where that is unobservable (see
    the module docstring); any other case calls ``linear(x)``. Python only (a scripted parent calls the module).

    Shapes: x (B, ..., in_features), contiguous -> (B, ..., out_features), contiguous.
    Scripted parents call the module instead: ``if torch.jit.is_scripting(): y = linear(x) else: y =
    channel_linear(linear, x)`` (TorchScript compiles only the first branch).
    """
    if (not _onednn_enabled or isinstance(x, torch.fx.Proxy) or torch.jit.is_tracing()
            or torch.compiler.is_compiling()):
        return linear(x)  # before any shape test: tracers (FX too) and exporters must see the module / no guards
    rows = x.numel() // max(x.shape[-1], 1)
    if not (x.device.type == 'cpu' and x.dtype == torch.float32 and x.dim() >= 3
            and x.is_contiguous() and rows >= max(16 * x.shape[0], 1024) and not torch.is_autocast_enabled('cpu')
            and _unobserved_plain_linear(linear)):
        return linear(x)
    # the rows as a channels-last (n, C, rows / n, 1) image (a view of the same memory). Single-threaded PyTorch
    # takes 1x1 convolutions of fewer than 16 images off oneDNN (to a slower path than MKL's GEMM), so there the
    # rows are regrouped into n >= 16 images
    n = x.shape[0] if x.shape[0] >= 16 or torch.get_num_threads() > 1 else _images_of_16_or_more(rows)
    weight = linear.weight
    y = F.conv2d(x.view(n, -1, 1, x.shape[-1]).permute(0, 3, 1, 2), weight.view(weight.shape + (1, 1)), linear.bias)
    return y.permute(0, 2, 3, 1).reshape(x.shape[:-1] + (weight.shape[0],))


class ChannelMlp(Mlp):
    """timm's ``Mlp`` (fc1 -> act -> drop1 -> norm -> fc2 -> drop2; same children, names and init) whose two Linears
    run through :func:`channel_linear`. A model built with it has exactly timm's modules and state dict.

    Shapes: x (*, in_features) -> (*, out_features).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():  # TorchScript compiles this branch only
            x = self.drop1(self.act(self.fc1(x)))
            x = self.fc2(self.norm(x))
        else:
            x = self.drop1(self.act(channel_linear(self.fc1, x)))
            x = channel_linear(self.fc2, self.norm(x))
        return self.drop2(x)
