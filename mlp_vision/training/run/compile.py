""" ``--torchcompile`` / ``--torchcompile-mode``: the same flags and the same ``torch.compile`` call in every
command that runs a model (the trainers, validate.py, benchmark.py). """
from typing import Optional

import torch
import torch.nn as nn

from mlp_vision.errors import UsageError

__all__ = ['COMPILE_MODES', 'add_compile_arguments', 'compile_model', 'check_compile_backend']

COMPILE_MODES = ('default', 'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs')  # torch.compile's modes


def add_compile_arguments(group) -> None:
    """``--torchcompile [BACKEND]`` and ``--torchcompile-mode``, the same flags in every command."""
    group.add_argument('--torchcompile', nargs='?', type=str, default=None, const='inductor',
                       help='torch.compile the model (optional backend, default inductor)')
    group.add_argument('--torchcompile-mode', type=str, default=None, choices=COMPILE_MODES, help='torch.compile mode')


def compile_model(model: nn.Module, args) -> nn.Module:
    """``torch.compile(model)`` as ``--torchcompile`` / ``--torchcompile-mode`` ask; ``model`` unchanged without."""
    if not args.torchcompile:
        return model
    return torch.compile(model, backend=args.torchcompile, mode=args.torchcompile_mode)


def check_compile_backend(backend: Optional[str]) -> None:
    """``--torchcompile BACKEND`` names a ``torch.compile`` backend (checked before anything is built)."""
    if backend and backend not in torch.compiler.list_backends(exclude_tags=()):
        raise UsageError(f'--torchcompile {backend!r} is not a torch.compile backend (e.g. inductor; all: '
                         f'torch.compiler.list_backends())')
