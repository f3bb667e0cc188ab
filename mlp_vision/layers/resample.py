""" Resampling of token-mixing weights to a new input size.

Token-mixing weights (gMLP's SGU W and b, MLP-Mixer's token MLP, sMLP's H x H / W x W mixes) are tied to the token
grid they were trained on. For another ``img_size``, each token axis of such a weight is treated as a sampled
function of token position and interpolated over its grid (1-D for the axial sMLP mixes, 2-D (h, w) for the
flattened token axis of gMLP / Mixer), bilinear with ``align_corners=False``, antialiased when the grid shrinks. A
*contracted* (input) token axis is also scaled by ``old_tokens / new_tokens``, so the sum over input tokens keeps
its magnitude; output token axes and biases are not scaled. Equal grids return the tensor unchanged.

Both routes to another size use this: the models' ``checkpoint_filter_fn`` (tensors of a state dict) and their
``set_input_size`` (a built model's parameters in place, :func:`resample_token_params_`), from the table of token
axes each block declares (``token_axes``).
"""
import math
from typing import Dict, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ['TokenAxes', 'resample_token_axis', 'resample_token_weight', 'resample_token_params_']

# parameter name (relative to the module that declares it) -> (output token axes, contracted token axes)
TokenAxes = Dict[str, Tuple[Tuple[int, ...], Tuple[int, ...]]]


def resample_token_axis(t: torch.Tensor, dim: int, old_grid: Sequence[int], new_grid: Sequence[int],
                        contracted: bool = False) -> torch.Tensor:
    """Resample the flattened token axis ``dim`` of ``t`` (length prod(old_grid)) to length prod(new_grid).

    ``old_grid``, ``new_grid``: (n,) for a 1-D axis or (h, w) for a row-major flattened 2-D token grid;
    ``contracted``: the axis is summed over by the layer (an input axis), so it is scaled by old / new count.
    """
    old_grid, new_grid = tuple(old_grid), tuple(new_grid)
    if len(old_grid) != len(new_grid) or len(old_grid) not in (1, 2):
        raise ValueError(f'grids must both be (n,) or (h, w), got {old_grid} and {new_grid}')
    old_n = math.prod(old_grid)
    if t.shape[dim] != old_n:
        raise ValueError(f'axis {dim} of a tensor of shape {tuple(t.shape)} has length {t.shape[dim]}, '
                         f'expected {old_n} for grid {old_grid}')
    if old_grid == new_grid:
        return t
    orig_dtype = t.dtype
    x = t.movedim(dim, -1)
    lead = x.shape[:-1]
    x = x.reshape(-1, 1, *old_grid).float()
    if len(old_grid) == 1:
        # a 1-D axis as a (1, n) image so bilinear antialiasing applies (an (n, 1) image one pixel wide
        # comes out of antialiased bilinear downsampling as a repeated first row)
        x = x.unsqueeze(-2)
        size: Tuple[int, int] = (1, new_grid[0])
    else:
        size = (new_grid[0], new_grid[1])
    antialias = any(n < o for n, o in zip(new_grid, old_grid))
    x = F.interpolate(x, size=size, mode='bilinear', align_corners=False, antialias=antialias)
    new_n = size[0] * size[1]
    x = x.reshape(*lead, new_n)
    if contracted:
        x = x * (old_n / new_n)
    return x.movedim(-1, dim).to(orig_dtype)


def resample_token_weight(weight: torch.Tensor, old_grid: Sequence[int], new_grid: Sequence[int],
                          out_dims: Sequence[int] = (), in_dims: Sequence[int] = ()) -> torch.Tensor:
    """Resample the token axes of a weight: ``out_dims`` are output token axes, ``in_dims`` contracted ones."""
    for d in out_dims:
        weight = resample_token_axis(weight, d, old_grid, new_grid, contracted=False)
    for d in in_dims:
        weight = resample_token_axis(weight, d, old_grid, new_grid, contracted=True)
    return weight


def resample_token_params_(module: nn.Module, token_axes: TokenAxes, old_grid: Sequence[int],
                           new_grid: Sequence[int]) -> None:
    """In place: each parameter named in ``token_axes`` (relative to ``module``) replaced by its
    :func:`resample_token_weight` from ``old_grid`` to ``new_grid``, keeping ``requires_grad``.

    The parameters are new ``nn.Parameter`` objects (their shapes change): an optimizer built before holds the old
    ones. An ``nn.Linear`` whose weight is resampled has its ``in_features`` / ``out_features`` updated.
    """
    if tuple(old_grid) == tuple(new_grid):
        return
    with torch.no_grad():
        for name, (out_dims, in_dims) in token_axes.items():
            owner_name, _, attr = name.rpartition('.')
            owner = module.get_submodule(owner_name)
            old = getattr(owner, attr)
            new = resample_token_weight(old.detach(), old_grid, new_grid, out_dims, in_dims)
            setattr(owner, attr, nn.Parameter(new, requires_grad=old.requires_grad))
            if isinstance(owner, nn.Linear) and attr == 'weight':
                owner.out_features, owner.in_features = new.shape
