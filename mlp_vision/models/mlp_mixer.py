""" MLP-Mixer (and the isotropic patch-token network that gMLP shares with it).

Paper: `MLP-Mixer: An all-MLP Architecture for Vision` - https://arxiv.org/abs/2105.01601

``MlpMixer`` is the isotropic model: patch-embedding stem, token-mixing blocks over a fixed grid of patches, final
LayerNorm, average-pool head; the block is :class:`MixerBlock` here, :class:`~mlp_vision.layers.GatedMLPBlock` for
gMLP (``gmlp.py``). Names are ``mixer_s16``, ``mixer_b16``, ``mixer_l16`` (timm's ``mixer_*_224`` are left alone);
the layout is timm's, so its checkpoints load, resampled by ``checkpoint_filter_fn`` for another ``img_size``.
"""
import math
from functools import partial
from typing import Any, Dict, List, Optional, Tuple, Type, Union

import torch
import torch.nn as nn
from timm.data import IMAGENET_INCEPTION_MEAN, IMAGENET_INCEPTION_STD
from timm.layers import PatchEmbed, to_2tuple
from timm.models import checkpoint, checkpoint_seq, named_apply
from timm.models._features import feature_take_indices
from timm.models.mlp_mixer import _init_weights as _timm_mixer_init
from timm.models import generate_default_cfgs, register_model

from .features import build_model
from ..weights import checked_filter, refuse_damaged_weights
from ..layers import (
    MixerBlock, TokenAxes, check_image_input, check_img_size, check_model_args, record_input_size,
    resample_token_weight)

__all__ = ['MlpMixer']


class MlpMixer(nn.Module):
    """Isotropic patch-token MLP network (MLP-Mixer, gMLP).

    Args (timm's names and meanings, and):
        img_size: int or (H, W), both divisible by ``patch_size`` (the stride of every feature map).
        mlp_ratio: passed to the block (Mixer: (token, channel) ratios; gMLP: d_ffn / d).
        block_layer: block class, called as ``block_layer(dim, seq_len, mlp_ratio, norm_layer=..., act_layer=...,
            drop=proj_drop_rate, drop_path=..., **block_kwargs)``.
        drop_path_rate: stochastic depth, ramped linearly from 0 (first block) to this rate (last block).
        global_pool: '' or 'avg'.
    """

    def __init__(
            self,
            num_classes: int = 1000,
            img_size: Union[int, Tuple[int, int]] = 224,
            in_chans: int = 3,
            patch_size: int = 16,
            num_blocks: int = 8,
            embed_dim: int = 512,
            mlp_ratio: Union[float, Tuple[float, float]] = (0.5, 4.0),
            block_layer: Type[nn.Module] = MixerBlock,
            block_kwargs: Optional[Dict[str, Any]] = None,
            norm_layer: Type[nn.Module] = partial(nn.LayerNorm, eps=1e-6),
            act_layer: Type[nn.Module] = nn.GELU,
            drop_rate: float = 0.,
            proj_drop_rate: float = 0.,
            drop_path_rate: float = 0.,
            global_pool: str = 'avg',
            device=None,
            dtype=None,
    ) -> None:
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        check_model_args(in_chans, num_classes, drop_rate, proj_drop_rate, drop_path_rate, mlp_ratio=mlp_ratio,
                         sizes=dict(embed_dim=embed_dim, patch_size=patch_size, num_blocks=num_blocks),
                         global_pool=global_pool, pools=('', 'avg'))
        img_size = check_img_size(img_size, patch_size, 'this model', 'its patch size')
        self.register_load_state_dict_pre_hook(refuse_damaged_weights)  # NaN / wrong-kind weights, any loader
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.img_size: Tuple[int, int] = img_size
        self.patch_size = patch_size
        self.global_pool = global_pool
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.grad_checkpointing = False

        # the input size is validated (with a ValueError) by check_image_input, so the stem itself is not strict
        self.stem = PatchEmbed(
            img_size=self.img_size, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim,
            strict_img_size=False, **dd)
        self.grid_size: Tuple[int, int] = (self.img_size[0] // patch_size, self.img_size[1] // patch_size)
        num_patches = self.grid_size[0] * self.grid_size[1]
        dpr = [x.item() for x in torch.linspace(0, drop_path_rate, num_blocks)]
        self.blocks = nn.Sequential(*[
            block_layer(embed_dim, num_patches, mlp_ratio, norm_layer=norm_layer, act_layer=act_layer,
                        drop=proj_drop_rate, drop_path=dpr[i], **(block_kwargs or {}), **dd)
            for i in range(num_blocks)])
        self.feature_info = [
            dict(module=f'blocks.{i}', num_chs=embed_dim, reduction=patch_size) for i in range(num_blocks)]
        self.norm = norm_layer(embed_dim, **dd)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes, **dd) if num_classes > 0 else nn.Identity()

        self.init_weights()

    @torch.jit.ignore
    def init_weights(self) -> None:
        # depth-first, so modules with their own init_weights (the SGU: W ~ 0, b = 1) run theirs last
        named_apply(_init_weights, module=self)

    def set_input_size(self, img_size: Optional[Union[int, Tuple[int, int]]] = None,
                       patch_size: Optional[Union[int, Tuple[int, int]]] = None) -> None:
        """timm's ``set_input_size``: every block's token-mixing weights resampled to the new patch grid (its
        ``set_token_grid``, as ``checkpoint_filter_fn`` resamples a checkpoint), new parameters: build the optimizer
        afterwards. ``img_size``: (H, W) or int, multiples of ``patch_size`` (else ``ValueError``, nothing changed);
        ``patch_size``: only the current one (a new one would need the stem resampled); None keeps the current.
        """
        if patch_size is not None and tuple(to_2tuple(patch_size)) != tuple(self.stem.patch_size):
            raise ValueError(f'set_input_size cannot change patch_size ({self.patch_size} -> {patch_size}); build the '
                             f'model with patch_size={patch_size} instead')
        if img_size is None:
            return
        img_size = check_img_size(img_size, self.patch_size, 'this model', 'its patch size')
        missing = [type(b).__name__ for b in self.blocks if not hasattr(b, 'set_token_grid')]
        if missing:
            raise ValueError(f'set_input_size needs blocks with set_token_grid (resampling), {missing[0]} has none')
        grid_size = (img_size[0] // self.patch_size, img_size[1] // self.patch_size)
        for blk in self.blocks:
            blk.set_token_grid(self.grid_size, grid_size)
        self.stem.set_input_size(img_size=img_size)
        self.img_size, self.grid_size = img_size, grid_size
        record_input_size(self, img_size)

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> Dict[str, Any]:
        return dict(stem=r'^stem', blocks=[(r'^blocks\.(\d+)', None), (r'^norm', (99999,))])

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        self.num_classes = num_classes
        if global_pool is not None:
            if global_pool not in ('', 'avg'):
                raise ValueError(f"global_pool must be '' or 'avg', got {global_pool!r}")
            self.global_pool = global_pool
        dd = dict(device=self.stem.proj.weight.device, dtype=self.stem.proj.weight.dtype)
        self.head = nn.Linear(self.embed_dim, num_classes, **dd) if num_classes > 0 else nn.Identity()
        self.head.train(self.training)

    def forward_intermediates(
            self, x: torch.Tensor, indices: Optional[Union[int, List[int]]] = None, norm: bool = False,
            stop_early: bool = False, output_fmt: str = 'NCHW', intermediates_only: bool = False,
    ) -> Union[List[torch.Tensor], Tuple[torch.Tensor, List[torch.Tensor]]]:
        """timm's ``forward_intermediates``: block outputs of ``x`` (B, in_chans, H, W) as 'NCHW' (B, C, H/p, W/p) or
        'NLC' (B, H/p * W/p, C); ``indices``: last n blocks if int, all if None, else those; ``norm``: the final norm
        on every intermediate."""
        if output_fmt not in ('NCHW', 'NLC'):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        x = check_image_input(x, self.in_chans, self.img_size)
        intermediates = []
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)

        B = x.shape[0]
        x = self.stem(x)
        if torch.jit.is_scripting() or not stop_early:  # can't slice blocks in torchscript
            blocks = self.blocks
        else:
            blocks = self.blocks[:max_index + 1]
        for i, blk in enumerate(blocks):
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint(blk, x)
            else:
                x = blk(x)
            if i in take_indices:
                intermediates.append(self.norm(x) if norm else x)

        if output_fmt == 'NCHW':
            H, W = self.grid_size
            intermediates = [y.reshape(B, H, W, -1).permute(0, 3, 1, 2).contiguous() for y in intermediates]

        if intermediates_only:
            return intermediates
        x = self.norm(x)
        return x, intermediates

    def prune_intermediate_layers(self, indices: Union[int, List[int]] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[:max_index + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, '')
        return take_indices

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, in_chans, H, W) -> (B, H/p * W/p, embed_dim), after the final norm."""
        x = check_image_input(x, self.in_chans, self.img_size)
        x = self.stem(x)
        if self.grad_checkpointing and not torch.jit.is_scripting():
            x = checkpoint_seq(self.blocks, x)
        else:
            x = self.blocks(x)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if self.global_pool == 'avg':
            x = x.mean(dim=1)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.forward_features(x)
        return self.forward_head(x)


def _init_weights(module: nn.Module, name: str) -> None:
    """timm's Mixer init: xavier-uniform Linear, tiny MLP biases, zero head, lecun-normal stem, a module's own
    ``init_weights``. gMLP's ``blocks.i.fc1`` / ``fc2`` get the MLP biases, as timm's gMLP ``mlp_channels.fc1``."""
    _timm_mixer_init(module, f'mlp.{name}' if '.fc' in name else name)


def resample_isotropic_state_dict(state_dict: Dict[str, torch.Tensor], model: MlpMixer,
                                  token_axes: TokenAxes) -> Dict[str, torch.Tensor]:
    """Resample token-mixing tensors whose token axes do not match ``model.grid_size``; ``token_axes`` is a block's
    table (e.g. ``MixerBlock.token_axes``: key suffix -> (output, contracted) token axes). A checkpoint's token grid
    is taken to be square."""
    num_tokens = model.grid_size[0] * model.grid_size[1]
    out = {}
    for k, v in state_dict.items():
        for suffix, (out_dims, in_dims) in token_axes.items():
            if k.endswith(suffix):
                old_n = v.shape[(out_dims + in_dims)[0]]
                if old_n != num_tokens:
                    side = math.isqrt(old_n)
                    if side * side != old_n:
                        raise ValueError(f'{k}: cannot resample a token axis of length {old_n}, not a square grid; '
                                         f'build the model at the checkpoint\'s own img_size')
                    v = resample_token_weight(v, (side, side), model.grid_size, out_dims, in_dims)
                break
        out[k] = v
    return out


@checked_filter
def checkpoint_filter_fn(state_dict: Dict[str, torch.Tensor], model: MlpMixer) -> Dict[str, torch.Tensor]:
    """timm / mlp_vision Mixer checkpoint -> this model (same layout), resampling the token MLP if needed."""
    return resample_isotropic_state_dict(state_dict, model, MixerBlock.token_axes)


def _create_mixer(variant: str, pretrained: bool = False, **kwargs) -> MlpMixer:
    return build_model(MlpMixer, variant, pretrained, checkpoint_filter_fn, default_out_indices=3, **kwargs)


def isotropic_cfg(url: str = '', **kwargs) -> Dict[str, Any]:
    """A Mixer pretrained cfg; gMLP's with its paper given (``gmlp.py``)."""
    return {
        'url': url,
        'num_classes': 1000, 'input_size': (3, 224, 224), 'pool_size': None,
        'crop_pct': 0.875, 'interpolation': 'bicubic', 'fixed_input_size': True,
        'mean': IMAGENET_INCEPTION_MEAN, 'std': IMAGENET_INCEPTION_STD,
        'first_conv': 'stem.proj', 'classifier': 'head',
        'license': 'apache-2.0',
        'paper_ids': 'arXiv:2105.01601',
        'paper_name': 'MLP-Mixer: An all-MLP Architecture for Vision',
        'origin_url': 'https://github.com/google-research/vision_transformer',
        **kwargs,
    }


# Weights: the same files and preprocessing as timm's mixer_*16_224 entries (timm's checkpoints load as-is).
_MIIL = dict(
    mean=(0., 0., 0.), std=(1., 1., 1.), crop_pct=0.875, interpolation='bilinear',
    paper_ids='arXiv:2104.10972', paper_name='ImageNet-21K Pretraining for the Masses',
    origin_url='https://github.com/Alibaba-MIIL/ImageNet21K',
)
default_cfgs = generate_default_cfgs({
    'mixer_s16.untrained': isotropic_cfg(),
    'mixer_b16.goog_in21k_ft_in1k': isotropic_cfg(
        hf_hub_id='timm/mixer_b16_224.goog_in21k_ft_in1k',
        url='https://github.com/rwightman/pytorch-image-models/releases/download/v0.1-vitjx/jx_mixer_b16_224-76587d61.pth',
    ),
    'mixer_b16.goog_in21k': isotropic_cfg(
        hf_hub_id='timm/mixer_b16_224.goog_in21k',
        url='https://github.com/rwightman/pytorch-image-models/releases/download/v0.1-vitjx/jx_mixer_b16_224_in21k-617b3de2.pth',
        num_classes=21843,
    ),
    'mixer_b16.miil_in21k_ft_in1k': isotropic_cfg(
        hf_hub_id='timm/mixer_b16_224.miil_in21k_ft_in1k',
        url='https://github.com/rwightman/pytorch-image-models/releases/download/v0.1-tresnet/mixer_b16_224_miil-9229a591.pth',
        **_MIIL,
    ),
    'mixer_b16.miil_in21k': isotropic_cfg(
        hf_hub_id='timm/mixer_b16_224.miil_in21k',
        url='https://github.com/rwightman/pytorch-image-models/releases/download/v0.1-tresnet/mixer_b16_224_miil_in21k-2a558a71.pth',
        num_classes=11221,
        **_MIIL,
    ),
    'mixer_l16.goog_in21k_ft_in1k': isotropic_cfg(
        hf_hub_id='timm/mixer_l16_224.goog_in21k_ft_in1k',
        url='https://github.com/rwightman/pytorch-image-models/releases/download/v0.1-vitjx/jx_mixer_l16_224-92f9adc4.pth',
    ),
    'mixer_l16.goog_in21k': isotropic_cfg(
        hf_hub_id='timm/mixer_l16_224.goog_in21k',
        url='https://github.com/rwightman/pytorch-image-models/releases/download/v0.1-vitjx/jx_mixer_l16_224_in21k-846aa33c.pth',
        num_classes=21843,
    ),
})


@register_model
def mixer_s16(pretrained: bool = False, **kwargs) -> MlpMixer:
    """Mixer-S/16: 8 blocks, d 512, token MLP 256, channel MLP 2048."""
    model_args = dict(patch_size=16, num_blocks=8, embed_dim=512, mlp_ratio=(0.5, 4.0))
    return _create_mixer('mixer_s16', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def mixer_b16(pretrained: bool = False, **kwargs) -> MlpMixer:
    """Mixer-B/16: 12 blocks, d 768, token MLP 384, channel MLP 3072."""
    model_args = dict(patch_size=16, num_blocks=12, embed_dim=768, mlp_ratio=(0.5, 4.0))
    return _create_mixer('mixer_b16', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def mixer_l16(pretrained: bool = False, **kwargs) -> MlpMixer:
    """Mixer-L/16: 24 blocks, d 1024, token MLP 512, channel MLP 4096."""
    model_args = dict(patch_size=16, num_blocks=24, embed_dim=1024, mlp_ratio=(0.5, 4.0))
    return _create_mixer('mixer_l16', pretrained=pretrained, **dict(model_args, **kwargs))
