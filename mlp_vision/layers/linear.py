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
  costs more than it saves), and the route is on (:func:`set_onednn_channel_linear`; by default only where
  PyTorch's CPU capability is AVX-512: on an AVX2 host the same 1x1 convolutions ran 2.4x slower than MKL).

The parameters are the module's own (read at call time, so ``torch.func.functional_call`` and optimizers see the
same tensors), gradients reach them through the convolution, and the result equals ``module(x)`` up to float32
summation order.
"""
import functools
from typing import List, Optional, Sequence, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.modules.module as _module_state
from timm.layers import Mlp, register_notrace_module

__all__ = ['TokenLinear', 'channel_linear', 'set_onednn_channel_linear', 'merged_channel_linear', 'unobserved',
           'set_merged_routes', 'record_forward', 'autocast_on', 'cpu_has_avx512', 'ChannelMlp']


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


_GLOBAL_HOOKS = ('_global_forward_hooks', '_global_forward_pre_hooks', '_global_backward_hooks',
                 '_global_backward_pre_hooks', '_global_forward_hooks_always_called')
# each class's own forward, recorded at import: a forward patched on the class later is a change we must respect
_BUILT_FORWARD = {cls: cls.forward for cls in (nn.Linear, nn.Conv2d, nn.BatchNorm2d, nn.GELU, TokenLinear)}


def record_forward(cls: type) -> type:
    """Class decorator: remember ``cls.forward`` as built, so :func:`unobserved` can tell a later class-level patch.
    Every class a parent may bypass (see :func:`unobserved`) is recorded."""
    _BUILT_FORWARD[cls] = cls.forward
    return cls
def cpu_has_avx512() -> bool:
    """PyTorch's CPU kernels run with AVX-512 here (the only case where oneDNN's GEMM beats MKL's sgemm on AMD)."""
    return torch.backends.cpu.get_cpu_capability().startswith('AVX512')


# on by default only where it pays: without AVX-512 (AVX2 hosts) oneDNN's 1x1 convolution measured 2.4x slower than
# MKL's GEMM for Mixer-B's channel MLP (results/benchmarks/README.md, 2026-11-24)
_onednn_enabled = cpu_has_avx512()
_merged_enabled = True


def set_onednn_channel_linear(enabled: bool) -> bool:
    """Switch :func:`channel_linear`'s oneDNN route on or off (process-wide; on by default where the CPU has
    AVX-512, off elsewhere); returns the previous setting."""
    global _onednn_enabled
    previous, _onednn_enabled = _onednn_enabled, bool(enabled)
    return previous


def set_merged_routes(enabled: bool) -> bool:
    """Switch the routes that compute several unobserved children at once from their parameters
    (:func:`merged_channel_linear` and the blocks that use :func:`unobserved`) on or off (process-wide); returns the
    previous setting. Off, every child is called as a module (the function is the same)."""
    global _merged_enabled
    previous, _merged_enabled = _merged_enabled, bool(enabled)
    return previous


def _observing_context(x) -> bool:
    """A tracer, compiler, exporter or mode is recording (it must see the modules; no shape guards either)."""
    return (isinstance(x, torch.fx.Proxy) or torch.jit.is_tracing() or torch.compiler.is_compiling()
            or any(getattr(_module_state, name, None) for name in _GLOBAL_HOOKS)
            or torch._C._is_torch_function_mode_enabled() or torch._C._len_torch_dispatch_stack() > 0)


def _unobserved_module(module: nn.Module, built_as: type) -> bool:
    """``module`` is exactly ``built_as`` with the class's own forward, unpatched, and no hook on it."""
    if (type(module) is not built_as or built_as.forward is not _BUILT_FORWARD.get(built_as)
            or 'forward' in vars(module)):
        return False
    return not (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks)


def unobserved(x, *children: nn.Module, built_as: Union[type, Sequence[type]] = nn.Linear) -> bool:
    """True when a parent may compute these children's outputs from their parameters, because nothing could tell:
    the merged routes are on, no tracer / compiler / exporter / TorchFunction or TorchDispatch mode is active, no
    global module hook is registered, and every child is exactly ``built_as`` (the class it was built with: a
    LoRA wrapper, a quantised, pruned, parametrized or subclassed replacement, ``nn.Identity`` or an
    instance-patched ``forward`` is not) with no hook of its own. Python only: scripted parents call the modules.

    ``x`` is the children's input (an FX proxy while timm's feature extraction traces); ``built_as`` is one class
    for every child or one per child (each recorded with :func:`record_forward`)."""
    if not _merged_enabled or _observing_context(x):
        return False
    classes = [built_as] * len(children) if isinstance(built_as, type) else list(built_as)
    if len(classes) != len(children):
        raise ValueError(f'unobserved: {len(children)} children but {len(classes)} classes in built_as')
    return all(_unobserved_module(child, cls) for child, cls in zip(children, classes))


def autocast_on(x: torch.Tensor) -> bool:
    """Autocast is enabled for ``x``'s device type (False where autocast does not exist, e.g. 'meta')."""
    kind = x.device.type
    return torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind)


@functools.lru_cache(maxsize=256)
def _images_of_16_or_more(rows: int) -> int:
    """The smallest divisor of ``rows`` (>= 16) that is at least 16."""
    return next(n for n in range(16, rows + 1) if rows % n == 0)


def _onednn_applies(x: torch.Tensor) -> bool:
    rows = x.numel() // max(x.shape[-1], 1)
    return (_onednn_enabled and x.device.type == 'cpu' and x.dtype == torch.float32 and x.dim() >= 3
            and x.is_contiguous() and rows >= max(16 * x.shape[0], 1024) and not torch.is_autocast_enabled('cpu'))


def _channel_gemm(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; as a 1x1 convolution through oneDNN where :func:`_onednn_applies`."""
    if not _onednn_applies(x):
        return F.linear(x, weight, bias)
    # the rows as a channels-last (n, C, rows / n, 1) image (a view of the same memory). Single-threaded PyTorch
    # takes 1x1 convolutions of fewer than 16 images off oneDNN (to a slower path than MKL's GEMM), so there the
    # rows are regrouped into n >= 16 images
    rows = x.numel() // x.shape[-1]
    n = x.shape[0] if x.shape[0] >= 16 or torch.get_num_threads() > 1 else _images_of_16_or_more(rows)
    y = F.conv2d(x.view(n, -1, 1, x.shape[-1]).permute(0, 3, 1, 2), weight.view(weight.shape + (1, 1)), bias)
    return y.permute(0, 2, 3, 1).reshape(x.shape[:-1] + (weight.shape[0],))


def channel_linear(linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``linear(x)`` over the contiguous last axis of ``x`` (*, C), through oneDNN where that is unobservable (see
    the module docstring); any other case calls ``linear(x)``. Python only (a scripted parent calls the module).

    Shapes: x (B, ..., in_features), contiguous -> (B, ..., out_features), contiguous.
    Scripted parents call the module instead: ``if torch.jit.is_scripting(): y = linear(x) else: y =
    channel_linear(linear, x)`` (TorchScript compiles only the first branch).
    """
    # the context first, before any shape test: tracers (FX too) and exporters must see the module and no guards
    if not _onednn_enabled or _observing_context(x) or not _onednn_applies(x):
        return linear(x)
    if not _unobserved_module(linear, nn.Linear):
        return linear(x)
    return _channel_gemm(x, linear.weight, linear.bias)


def merged_channel_linear(linears: Sequence[nn.Module], x: torch.Tensor) -> Optional[torch.Tensor]:
    """``torch.cat([linear(x) for linear in linears], -1)`` as one GEMM with the concatenated parameters (one
    output tensor, one pass of the activation after it; through oneDNN as :func:`channel_linear`), or ``None``
    when that would be observable (:func:`unobserved`) or the Linears differ in having a bias: then the caller
    calls each module. The concatenated weight is rebuilt on every call from the modules' own parameters, so
    optimizers, ``functional_call`` and gradients see those.

    Shapes: x (B, ..., in_features) -> (B, ..., sum of out_features), or None.
    """
    if not unobserved(x, *linears):
        return None
    biases = [linear.bias for linear in linears]
    if any(b is None for b in biases) and not all(b is None for b in biases):
        return None
    weight = torch.cat([linear.weight for linear in linears])
    bias = None if biases[0] is None else torch.cat(biases)
    return _channel_gemm(x, weight, bias)


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
