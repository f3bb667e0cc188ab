""" gMLP for images: the isotropic patch network with gMLP blocks (Spatial Gating Unit, dense W).

Paper: `Pay Attention to MLPs` - https://arxiv.org/abs/2105.08050 (Tables 1-2)

Names are ``gmlp_ti``, ``gmlp_s``, ``gmlp_b`` (timm's own ``gmlp_*16_224`` entries are left alone). The block
is :class:`mlp_vision.layers.GatedMLPBlock`, the same class the text models use. ``checkpoint_filter_fn``
maps timm's ``gmlp_*16_224`` layout to ours and resamples the SGU's W and b for another ``img_size``.

Layout variants, the same parameters, state dict and function, opt-in (:class:`~mlp_vision.layers.GatedMLPBlock`):
``timm.create_model('gmlp_s', block_kwargs=dict(token_major=True, split_fc1=True))``.
"""
import re
from functools import partial
from typing import Any, Dict

import torch
from timm.models import generate_default_cfgs, register_model

from ..weights import checked_filter
from ..layers import GatedMLPBlock
from .features import build_model
from .mlp_mixer import MlpMixer, isotropic_cfg, resample_isotropic_state_dict

__all__ = []

# timm gMLP (MlpMixer + SpatialGatingBlock + GatedMlp) -> GatedMLPBlock
_TIMM_RENAMES = (
    (r'\.mlp_channels\.gate\.proj\.', '.sgu.'),
    (r'\.mlp_channels\.gate\.norm\.', '.sgu.norm.'),
    (r'\.mlp_channels\.fc1\.', '.fc1.'),
    (r'\.mlp_channels\.fc2\.', '.fc2.'),
)


@checked_filter
def checkpoint_filter_fn(state_dict: Dict[str, torch.Tensor], model: MlpMixer) -> Dict[str, torch.Tensor]:
    """timm ``gmlp_*16_224`` or mlp_vision gMLP checkpoint -> this model.

    SGU weights (N x N, N tokens) and biases (N) are resampled when the model's patch grid differs from the
    checkpoint's (see :mod:`mlp_vision.layers.resample`).
    """
    out = {}
    for k, v in state_dict.items():
        for pattern, repl in _TIMM_RENAMES:
            k = re.sub(pattern, repl, k)
        out[k] = v
    return resample_isotropic_state_dict(out, model, GatedMLPBlock.token_axes)


def _create_gmlp(variant: str, pretrained: bool = False, **kwargs) -> MlpMixer:
    kwargs.setdefault('block_layer', GatedMLPBlock)
    return build_model(MlpMixer, variant, pretrained, checkpoint_filter_fn, default_out_indices=3, **kwargs)


_cfg = partial(isotropic_cfg, paper_ids='arXiv:2105.08050', paper_name='Pay Attention to MLPs', origin_url=None)


default_cfgs = generate_default_cfgs({
    # no official gMLP weights were released; gMLP-S has timm's (RandAugment 'ra3' recipe, 79.6 top-1 in timm)
    'gmlp_ti.untrained': _cfg(),
    'gmlp_s.ra3_in1k': _cfg(
        hf_hub_id='timm/gmlp_s16_224.ra3_in1k',
        url='https://github.com/rwightman/pytorch-image-models/releases/download/v0.1-weights/gmlp_s16_224_raa-10536d42.pth',
        origin_url='https://github.com/huggingface/pytorch-image-models',
    ),
    'gmlp_b.untrained': _cfg(),
})


def _gmlp_args(embed_dim: int) -> Dict[str, Any]:
    # 30 blocks, patch 16, d_ffn = 6 d (paper Table 1); SGU gate norm is a default-eps LayerNorm as in timm
    return dict(patch_size=16, num_blocks=30, embed_dim=embed_dim, mlp_ratio=6)


@register_model
def gmlp_ti(pretrained: bool = False, **kwargs) -> MlpMixer:
    """gMLP-Ti: 30 blocks, d 128, d_ffn 768 (5.9 M params)."""
    return _create_gmlp('gmlp_ti', pretrained=pretrained, **dict(_gmlp_args(128), **kwargs))


@register_model
def gmlp_s(pretrained: bool = False, **kwargs) -> MlpMixer:
    """gMLP-S: 30 blocks, d 256, d_ffn 1536 (19.4 M params); paper survival prob 0.95."""
    return _create_gmlp('gmlp_s', pretrained=pretrained, **dict(_gmlp_args(256), **kwargs))


@register_model
def gmlp_b(pretrained: bool = False, **kwargs) -> MlpMixer:
    """gMLP-B: 30 blocks, d 512, d_ffn 3072 (73.1 M params); paper survival prob 0.80."""
    return _create_gmlp('gmlp_b', pretrained=pretrained, **dict(_gmlp_args(512), **kwargs))
