""" Helpers shared by the test files (imported as ``from _helpers import ...``; pytest puts ``tests/`` on the path). """
import torch
import torch.nn as nn


def randomize_(module: nn.Module, seed: int = 1234, std: float = 0.3) -> nn.Module:
    """Give every float parameter and buffer non-trivial values (norm affine, biases, BN statistics, head), in place.

    Initial values (zero biases, unit norms, W ~ 0 in the SGU) would hide mistakes in how they are used.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if not t.is_floating_point():
                continue
            if name.endswith('running_var'):
                t.copy_(0.5 + torch.rand(t.shape, generator=g))
            elif name.endswith('running_mean'):
                t.copy_(0.3 * torch.randn(t.shape, generator=g))
            elif t.ndim == 1 and name.endswith('weight'):  # norm scales
                t.copy_(1. + 0.3 * torch.randn(t.shape, generator=g))
            else:
                t.copy_(std * torch.randn(t.shape, generator=g))
    return module


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
