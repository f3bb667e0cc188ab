""" Input validation for fixed-size models, with errors that say what was expected. """
import math
import operator
import warnings
from typing import Any, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from timm.layers import register_notrace_function, to_2tuple

from mlp_vision.bounds import check_block_count

try:  # timm's record of a built model's current input size, apart from its pretrained_cfg (newer timm only)
    from timm.models._input import update_model_input_size
except ImportError:
    update_model_input_size = None

__all__ = ['check_image_input', 'check_img_size', 'check_model_args', 'record_input_size', 'TIMM_POOL_TYPES']

# the pool types of timm's ClassifierHead / SelectAdaptivePool2d
TIMM_POOL_TYPES = ('', 'avg', 'max', 'avgmax', 'catavgmax', 'fast', 'fastavg', 'fastmax', 'fastavgmax',
                   'fastcatavgmax')


@register_notrace_function  # a leaf for timm's FX feature extraction (its control flow is on shapes)
def check_image_input(x: torch.Tensor, in_chans: int, img_size: Tuple[int, int]) -> torch.Tensor:
    """Return ``x`` unchanged; raise ``ValueError`` unless it is (B, in_chans, img_size[0], img_size[1]): the
    token-mixing weights of gMLP, MLP-Mixer and sMLPNet are tied to one spatial size. Callers write ``x =
    check_image_input(x, ...)``, so FX feature extraction (which drops nodes whose outputs are unused) keeps it.
    """
    if torch.jit.is_tracing():
        _check_image_shape_quietly(x, in_chans, img_size)
    else:
        _check_image_shape(x, in_chans, img_size)
    return x


@torch.jit.unused  # TorchScript cannot compile catch_warnings; scripted code never traces, so never calls it
def _check_image_shape_quietly(x: torch.Tensor, in_chans: int, img_size: Tuple[int, int]) -> None:
    """The same check without the TracerWarning torch.jit.trace gives for every Python comparison of sizes (the check
    runs on the example input and is rightly absent from the trace: nothing a user can act on)."""
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', torch.jit.TracerWarning)
        _check_image_shape(x, in_chans, img_size)


def _check_image_shape(x: torch.Tensor, in_chans: int, img_size: Tuple[int, int]) -> None:
    if not x.is_floating_point():
        raise TypeError(f'expected a floating-point image batch, got dtype {x.dtype}; convert and normalise it first '
                        f'(e.g. x.float() / 255 and the model\'s mean / std, as timm\'s transforms do)')
    if x.dim() != 4:
        raise ValueError(f'expected a 4-D image batch (B, {in_chans}, {img_size[0]}, {img_size[1]}), '
                         f'got a tensor of shape {list(x.shape)}')
    if x.shape[0] == 0:
        raise ValueError(f'expected a non-empty batch, got a batch of 0 images (input shape {list(x.shape)})')
    if x.shape[1] != in_chans:
        raise ValueError(f'expected {in_chans} input channels, got {x.shape[1]} (input shape {list(x.shape)}); '
                         f'build the model with in_chans={x.shape[1]} to accept it')
    if x.shape[2] != img_size[0] or x.shape[3] != img_size[1]:
        raise ValueError(f'expected input spatial size {img_size[0]}x{img_size[1]} (H x W), got '
                         f'{x.shape[2]}x{x.shape[3]}; this model has fixed-size token mixing, build it with '
                         f'img_size=({x.shape[2]}, {x.shape[3]}) (pretrained spatial weights are resampled)')


def check_img_size(img_size: Union[int, Sequence[int]], stride: int, what: str, why: str) -> Tuple[int, int]:
    """``img_size`` as (H, W); raise ``ValueError`` unless H and W are positive integer multiples of ``stride``
    (``what`` names the model, ``why`` the stride, e.g. ``'sMLPNet'``, ``'its total stride'``)."""
    size = tuple(to_2tuple(img_size))
    if len(size) != 2 or not all(_is_int(s) and s > 0 and s % stride == 0 for s in size):
        raise ValueError(f'{what} needs H and W divisible by {stride} ({why}), got img_size={size}')
    return operator.index(size[0]), operator.index(size[1])


def record_input_size(model: nn.Module, img_size: Tuple[int, int]) -> None:
    """After ``set_input_size``: the new input size recorded where timm's data helpers look (timm's own record and
    ``pretrained_cfg`` / ``default_cfg`` ``input_size`` / ``test_input_size``, which timm leaves at the checkpoint's
    size); the cfg is replaced by a copy, so no other model's cfg moves."""
    if update_model_input_size is not None:
        update_model_input_size(model, img_size)
    cfg = getattr(model, 'pretrained_cfg', None)
    if isinstance(cfg, dict) and cfg.get('input_size') is not None:
        input_size = (cfg['input_size'][0], *img_size)
        cfg = dict(cfg, input_size=input_size)
        if cfg.get('test_input_size') is not None:
            cfg['test_input_size'] = input_size
        model.pretrained_cfg = model.default_cfg = cfg


def _is_int(value: Any) -> bool:
    try:  # integers of any kind (numpy's too), not floats or bools
        operator.index(value)
    except TypeError:
        return False
    return not isinstance(value, bool)


def check_model_args(in_chans: int, num_classes: int, drop_rate: float = 0., proj_drop_rate: float = 0.,
                     drop_path_rate: float = 0., *, sizes: Optional[Mapping[str, Any]] = None,
                     depths: Optional[Sequence[int]] = None, mlp_ratio: Union[None, float, Sequence[float]] = None,
                     global_pool: Optional[str] = None, pools: Sequence[str] = TIMM_POOL_TYPES) -> None:
    """Raise ``ValueError`` with what is expected for constructor arguments no model can be built with (instead of
    a failure deep in a layer, a silently different model, or one at the first training step).

    ``sizes``: name -> integer that must be >= 1 (``embed_dim``, ``patch_size``, ``num_blocks``, ...); ``depths``: a
    non-empty sequence of integers >= 1; ``num_blocks`` or the sum of ``depths`` is bounded by
    :func:`mlp_vision.bounds.check_block_count` before the model builds any block; ``mlp_ratio``: a ratio or a tuple
    of them, each finite and giving ``embed_dim`` a hidden width >= 1 (timm's ``Mlp`` takes a width of 0 for "the input width"); ``global_pool``: one of ``pools``.
    """
    if not _is_int(in_chans) or in_chans < 1:
        raise ValueError(f'in_chans must be an integer >= 1 (input image channels), got {in_chans!r}')
    if not _is_int(num_classes) or num_classes < 0:
        raise ValueError(f'num_classes must be an integer >= 0 (0 for no classifier), got {num_classes!r}')
    for name, rate in (('drop_rate', drop_rate), ('proj_drop_rate', proj_drop_rate),
                       ('drop_path_rate', drop_path_rate)):
        if not isinstance(rate, (int, float)) or not 0. <= rate < 1.:
            raise ValueError(f'{name} must be in [0, 1) (a probability of dropping), got {rate!r}')
    for name, value in (sizes or {}).items():
        if not _is_int(value) or value < 1:
            raise ValueError(f'{name} must be an integer >= 1, got {value!r}')
    if depths is not None and (isinstance(depths, (str, bytes)) or not isinstance(depths, Sequence) or not depths
                               or not all(_is_int(d) and d >= 1 for d in depths)):
        raise ValueError(f'depths must be a non-empty sequence of integers >= 1 (blocks per stage), got {depths!r}')
    if depths is not None:
        check_block_count(sum(depths), f'depths={tuple(depths)!r}')
    if (sizes or {}).get('num_blocks') is not None:
        check_block_count(sizes['num_blocks'], f'num_blocks={sizes["num_blocks"]!r}')
    dim = (sizes or {}).get('embed_dim')
    ratios = mlp_ratio if isinstance(mlp_ratio, (tuple, list)) else () if mlp_ratio is None else (mlp_ratio,)
    for r in ratios:
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or r <= 0:
            raise ValueError(f'mlp_ratio must be a finite number > 0 (hidden width / embed_dim), got {mlp_ratio!r}')
        if dim is not None and int(r * dim) < 1:
            raise ValueError(f'mlp_ratio {r!r} gives a hidden width of int({r!r} * {dim}) = 0; expected a ratio '
                             f'of at least {1 / dim:g} for embed_dim {dim}')
    if global_pool is not None and global_pool not in pools:
        raise ValueError(f'global_pool must be one of {", ".join(map(repr, pools))}, got {global_pool!r}')
