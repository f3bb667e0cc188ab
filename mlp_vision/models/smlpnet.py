""" sMLPNet: a 4-stage pyramid of depthwise-conv + axial sparse-MLP token mixing and channel MLPs.

Paper: `Sparse MLP for Image Recognition: Is Self-Attention Really Necessary?` - https://arxiv.org/abs/2109.05422
Official code and weights: https://github.com/microsoft/SPACH (MIT license)

Differences from the official code, none of which changes the function computed at 224x224:
* any input size with H and W divisible by 32, square or not (the official code runs only at 224x224);
* ``drop_path_rate`` takes effect (linear ramp over all blocks; the official flag is silently ignored);
* scriptable / exportable (no einops), timm model contract, 4-level ``features_only`` pyramid;
* our names say what each tensor mixes (``proj_h`` along H; the official ``proj_h`` mixes along W, ``proh_w``
  along H) and the fuse conv is ``fuse_conv`` (timm's ``reparameterize_model`` takes ``fuse`` for a fusion method);
  ``checkpoint_filter_fn`` maps them and the fuse conv's input blocks;
* ``timm.utils.reparameterize_model(model.eval())`` folds each sMLP's BatchNorm into the depthwise conv before it
  (:meth:`~mlp_vision.layers.SparseMLPTokenMixer.reparameterize`).
"""
import itertools
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type, Union

import torch
import torch.nn as nn
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import ClassifierHead, trunc_normal_
from timm.models import checkpoint_seq, named_apply
from timm.models._features import feature_take_indices
from timm.models import generate_default_cfgs, register_model

from .features import build_model
from ..weights import checked_filter, refuse_damaged_weights
from ..layers import (
    AxialSparseMLP, SparseMLPBlock, check_image_input, check_img_size, check_model_args, record_input_size,
    resample_token_weight)

__all__ = ['SparseMLPNet', 'SparseMLPStage']


class SparseMLPStage(nn.Module):
    """Patch merging (2x2 conv, stride 2, no bias; none for the first stage) followed by ``depth`` blocks."""

    def __init__(self, in_chs: int, out_chs: int, depth: int, feat_size: Tuple[int, int], downsample: bool,
                 drop_path_rates: Sequence[float], mlp_ratio: float = 3., proj_drop: float = 0.,
                 norm_layer: Type[nn.Module] = nn.LayerNorm, act_layer: Type[nn.Module] = nn.GELU,
                 one_gemm_mixes: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        self.grad_checkpointing = False
        # a stage without downsampling keeps its width
        self.downsample = nn.Conv2d(in_chs, out_chs, 2, stride=2, bias=False, **dd) if downsample else nn.Identity()
        self.blocks = nn.Sequential(*[
            SparseMLPBlock(
                out_chs, feat_size, mlp_ratio=mlp_ratio, norm_layer=norm_layer, act_layer=act_layer,
                proj_drop=proj_drop, drop_path=drop_path_rates[i], one_gemm_mixes=one_gemm_mixes, **dd)
            for i in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.downsample(x)
        if self.grad_checkpointing and not torch.jit.is_scripting():
            return checkpoint_seq(self.blocks, x)
        return self.blocks(x)


class SparseMLPNet(nn.Module):
    """sMLPNet.

    Args (timm's names and meanings, and):
        img_size: int or (H, W); both divisible by 32 (four stages of stride 4, 2, 2, 2).
        global_pool: pooling before the classifier ('avg' as the paper; any timm ``ClassifierHead`` type).
        embed_dim: C, the first stage's width; stage i has width C * 2^i.
        mlp_ratio: channel-MLP expansion alpha (3; 2 for the paper's T*).
        proj_drop_rate: dropout in the channel MLPs.
        drop_path_rate: stochastic depth, rate * i / (N - 1) for block i of N (all stages together).
        one_gemm_mixes: every sMLP's axial mixes as one GEMM each (:class:`~mlp_vision.layers.AxialSparseMLP`); the
            same parameters and function.
    """

    def __init__(
            self,
            num_classes: int = 1000,
            in_chans: int = 3,
            img_size: Union[int, Tuple[int, int]] = 224,
            global_pool: str = 'avg',
            embed_dim: int = 80,
            depths: Tuple[int, ...] = (2, 8, 14, 2),
            mlp_ratio: float = 3.,
            norm_layer: Type[nn.Module] = nn.LayerNorm,
            act_layer: Type[nn.Module] = nn.GELU,
            drop_rate: float = 0.,
            proj_drop_rate: float = 0.,
            drop_path_rate: float = 0.,
            one_gemm_mixes: bool = False,
            device=None,
            dtype=None,
    ) -> None:
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        check_model_args(in_chans, num_classes, drop_rate, proj_drop_rate, drop_path_rate, depths=depths,
                         sizes=dict(embed_dim=embed_dim), mlp_ratio=mlp_ratio, global_pool=global_pool)
        self.register_load_state_dict_pre_hook(refuse_damaged_weights)  # NaN / wrong-kind weights, any loader
        num_stages = len(depths)
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.img_size: Tuple[int, int] = _check_img_size(img_size, num_stages)
        self.drop_rate = drop_rate
        dims = [embed_dim * 2 ** i for i in range(num_stages)]
        self.num_features = self.head_hidden_size = dims[-1]

        # stage 0's patch embedding: 4x4 patches -> C, linear (no norm), as the official model
        self.stem = nn.Conv2d(in_chans, dims[0], kernel_size=4, stride=4, bias=False, **dd)
        dpr = [x.tolist() for x in torch.linspace(0, drop_path_rate, sum(depths)).split(list(depths))]
        stages = []
        self.feature_info = []
        for i in range(num_stages):
            stride = 4 * 2 ** i
            stages.append(SparseMLPStage(
                dims[max(i - 1, 0)], dims[i], depths[i], (self.img_size[0] // stride, self.img_size[1] // stride),
                downsample=i > 0, mlp_ratio=mlp_ratio, drop_path_rates=dpr[i], proj_drop=proj_drop_rate,
                norm_layer=norm_layer, act_layer=act_layer, one_gemm_mixes=one_gemm_mixes, **dd))
            self.feature_info.append(dict(num_chs=dims[i], reduction=stride, module=f'stages.{i}'))
        self.stages = nn.Sequential(*stages)
        # the official model normalises the last map with BatchNorm before pooling
        self.norm = nn.BatchNorm2d(self.num_features, **dd)
        self.head = ClassifierHead(
            self.num_features, num_classes, pool_type=global_pool, drop_rate=drop_rate, **dd)

        named_apply(_init_weights, self)

    def set_input_size(self, img_size: Optional[Union[int, Tuple[int, int]]] = None) -> None:
        """timm's ``set_input_size``: every sMLP's axial mixes (arXiv 2109.05422, §3.2) resampled to their stage's
        new map size as ``checkpoint_filter_fn`` resamples a checkpoint, new parameters: build the optimizer
        afterwards. ``img_size``: (H, W) or int, multiples of 32 (else ``ValueError``, nothing changed); None keeps
        the current one.
        """
        if img_size is None:
            return
        img_size = _check_img_size(img_size, len(self.stages))
        for i, stage in enumerate(self.stages):
            stride = self.feature_info[i]['reduction']
            for module in stage.modules():
                if isinstance(module, AxialSparseMLP):
                    module.set_feat_size((img_size[0] // stride, img_size[1] // stride))
        self.img_size = img_size
        record_input_size(self, img_size)

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> Dict[str, Any]:
        return dict(
            stem=r'^stem',
            blocks=r'^stages\.(\d+)' if coarse else [
                (r'^stages\.(\d+)\.downsample', (0,)),
                (r'^stages\.(\d+)\.blocks\.(\d+)', None),
                (r'^norm', (99999,)),
            ],
        )

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        for s in self.stages:
            s.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head.fc

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        self.num_classes = num_classes
        self.head.reset(num_classes, pool_type=global_pool)

    def forward_intermediates(
            self, x: torch.Tensor, indices: Optional[Union[int, List[int]]] = None, norm: bool = False,
            stop_early: bool = False, output_fmt: str = 'NCHW', intermediates_only: bool = False,
    ) -> Union[List[torch.Tensor], Tuple[torch.Tensor, List[torch.Tensor]]]:
        """timm's ``forward_intermediates``: the stage outputs (NCHW only, strides 4/8/16/32) of ``x`` (B, in_chans, H,
        W); ``indices``: last n stages if int, all if None, else those; ``norm``: the final BatchNorm on the last
        stage's output."""
        if output_fmt != 'NCHW':
            raise ValueError(f"sMLPNet intermediates are NCHW maps, got output_fmt={output_fmt!r}")
        x = check_image_input(x, self.in_chans, self.img_size)
        intermediates = []
        take_indices, max_index = feature_take_indices(len(self.stages), indices)
        last_idx = len(self.stages) - 1

        x = self.stem(x)
        if torch.jit.is_scripting() or not stop_early:  # can't slice stages in torchscript
            stages = self.stages
        else:
            stages = self.stages[:max_index + 1]
        feat_idx = 0
        for feat_idx, stage in enumerate(stages):
            x = stage(x)
            if feat_idx in take_indices:
                intermediates.append(self.norm(x) if norm and feat_idx == last_idx else x)

        if intermediates_only:
            return intermediates
        if feat_idx == last_idx:
            x = self.norm(x)
        return x, intermediates

    def prune_intermediate_layers(self, indices: Union[int, List[int]] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        take_indices, max_index = feature_take_indices(len(self.stages), indices)
        prune_end = max_index < len(self.stages) - 1
        self.stages = self.stages[:max_index + 1]
        if prune_norm or prune_end:
            self.norm = nn.Identity()  # sized for (and applied to) the last stage only
        if prune_end:
            self.num_features = self.head_hidden_size = self.feature_info[max_index]['num_chs']
        if prune_head or prune_end:
            self.head.reset(0, pool_type='', in_features=self.num_features)
        return take_indices

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, in_chans, H, W) -> (B, 8C, H/32, W/32), after the final BatchNorm."""
        x = check_image_input(x, self.in_chans, self.img_size)
        x = self.stem(x)
        x = self.stages(x)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return self.head(x, pre_logits=pre_logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.forward_features(x)
        return self.forward_head(x)


def _check_img_size(img_size: Union[int, Tuple[int, int]], num_stages: int) -> Tuple[int, int]:
    """(H, W), both divisible by the total stride of ``num_stages`` stages (4, 2, 2, ...), else ``ValueError``."""
    return check_img_size(img_size, 4 * 2 ** (num_stages - 1), 'sMLPNet', 'its total stride')


def _init_weights(module: nn.Module, name: str = '') -> None:
    # truncated-normal(0.02) weights and zero biases for Linear and conv layers (as the official model's Linear)
    if isinstance(module, (nn.Conv2d, nn.Linear)):
        trunc_normal_(module.weight, std=.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


# official block module (group, path inside the block) -> ours (inside the block); the official proj_h mixes along W
# and proh_w along H, ours are named by what they mix
_OFFICIAL_BLOCK_MODULES = {
    ('token_mix', '0.conv_merge.BN'): 'token_mixer.norm',
    ('token_mix', '0.conv_merge.Conv'): 'token_mixer.conv_dw',
    ('token_mix', '1.BN'): 'token_mixer.smlp.norm',
    ('token_mix', '1.proj_h'): 'token_mixer.smlp.proj_w',
    ('token_mix', '1.proh_w'): 'token_mixer.smlp.proj_h',
    ('token_mix', '1.fuse'): 'token_mixer.smlp.fuse_conv',
    ('channel_mix', '1'): 'norm',
    ('channel_mix', '2.net.0'): 'mlp.fc1',
    ('channel_mix', '2.net.3'): 'mlp.fc2',
}


@checked_filter
def checkpoint_filter_fn(state_dict: Dict[str, torch.Tensor], model: SparseMLPNet) -> Dict[str, torch.Tensor]:
    """Official SPACH sMLPNet checkpoint (or ours) -> this model.

    Official layout (``model`` dict of ``smlp_{t,s,b}.pth``): ``to_patch_embedding.{s}.0`` stems,
    ``token_mix.{i}`` / ``channel_mix.{i}`` numbered over all blocks, ``batch_norm``, ``mlp_head.0``; its axial
    mixes are named swapped and its fuse conv's input blocks are [x, W-mixed, H-mixed] (ours [x, H-mixed, W-mixed]).
    Axial weights are resampled when the model's stage sizes differ from the checkpoint's
    (:mod:`mlp_vision.layers.resample`).
    """
    if 'model' in state_dict and isinstance(state_dict['model'], dict):
        state_dict = state_dict['model']
    if 'to_patch_embedding.0.0.weight' in state_dict:
        state_dict = _convert_official(state_dict, model)
    return _resample_axial(state_dict, model)


def _convert_official(state_dict: Dict[str, torch.Tensor], model: SparseMLPNet) -> Dict[str, torch.Tensor]:
    depths = [len(s.blocks) for s in model.stages]
    blocks = [(s, b) for s, d in enumerate(depths) for b in range(d)]  # official global block index -> ours
    num_official = 1 + max(
        (int(k.split('.')[1]) for k in state_dict if k.startswith('token_mix.')), default=-1)
    if num_official != len(blocks):
        raise ValueError(f'official sMLPNet checkpoint has {num_official} blocks, this model has '
                         f'{len(blocks)} (depths {depths}); load it into the matching variant')
    widths = [state_dict[f'channel_mix.{g}.1.weight'].shape[0] for g in range(num_official)]
    if widths != [model.stages[s].blocks[0].norm.normalized_shape[0] for s, _ in blocks]:
        ck_depths = [len(list(run)) for _, run in itertools.groupby(widths)]  # stage depths, from the widths
        raise ValueError(f'official sMLPNet checkpoint has stage depths {ck_depths}, this model has {depths}')
    out = {}
    for k, v in state_dict.items():
        parts = k.split('.')
        if parts[0] == 'to_patch_embedding':
            s = int(parts[1])
            k = 'stem.weight' if s == 0 else f'stages.{s}.downsample.weight'
        elif parts[0] in ('token_mix', 'channel_mix'):
            s, b = blocks[int(parts[1])]
            path = '.'.join(parts[2:-1])
            module = _OFFICIAL_BLOCK_MODULES.get((parts[0], path))
            if module is None or (path in ('0.conv_merge.Conv', '1.fuse') and parts[-1] != 'weight'):  # bias-free
                raise ValueError(f'unexpected key in official sMLPNet checkpoint: {k}')
            k = f'stages.{s}.blocks.{b}.{module}.{parts[-1]}'
            if module.endswith(('proj_h', 'proj_w')):  # official 1x1 convs (N, N, 1, 1): Linear weights (N, N)
                v = v.flatten(1) if v.ndim == 4 else v
            elif module.endswith('fuse_conv'):
                x_id, x_w, x_h = v.chunk(3, dim=1)  # official input order [x, W-mixed, H-mixed]
                v = torch.cat([x_id, x_h, x_w], dim=1)
        elif parts[0] == 'batch_norm':
            k = f'norm.{parts[-1]}'
        elif parts[0] == 'mlp_head':
            k = f'head.fc.{parts[-1]}'
        else:
            raise ValueError(f'unexpected key in official sMLPNet checkpoint: {k}')
        out[k] = v
    return out


def _resample_axial(state_dict: Dict[str, torch.Tensor], model: SparseMLPNet) -> Dict[str, torch.Tensor]:
    """Axial mixes whose size differs from the model's resampled along their one token axis (the table
    ``set_input_size`` resamples a built model from: ``AxialSparseMLP.token_axes_h`` / ``token_axes_w``)."""
    token_axes = {f'smlp.{k}': v for k, v in {**AxialSparseMLP.token_axes_h, **AxialSparseMLP.token_axes_w}.items()}
    model_sd = model.state_dict()
    out = {}
    for k, v in state_dict.items():
        target = model_sd.get(k)
        axes = next((a for suffix, a in token_axes.items() if k.endswith(suffix)), None)
        if axes is not None and target is not None and v.shape != target.shape:
            v = resample_token_weight(v, (v.shape[0],), (target.shape[0],), *axes)  # (out_dims, in_dims)
        out[k] = v
    return out


def _create_smlpnet(variant: str, pretrained: bool = False, **kwargs) -> SparseMLPNet:
    return build_model(SparseMLPNet, variant, pretrained, checkpoint_filter_fn, default_out_indices=(0, 1, 2, 3),
                       **kwargs)


def _cfg(url: str = '', **kwargs) -> Dict[str, Any]:
    return {
        'url': url,
        'num_classes': 1000, 'input_size': (3, 224, 224), 'pool_size': (7, 7),
        'crop_pct': 0.875, 'interpolation': 'bicubic', 'fixed_input_size': True,
        'mean': IMAGENET_DEFAULT_MEAN, 'std': IMAGENET_DEFAULT_STD,
        'first_conv': 'stem', 'classifier': 'head.fc',
        'license': 'mit',
        'paper_ids': 'arXiv:2109.05422',
        'paper_name': 'Sparse MLP for Image Recognition: Is Self-Attention Really Necessary?',
        'origin_url': 'https://github.com/microsoft/SPACH',
        **kwargs,
    }


default_cfgs = generate_default_cfgs({
    # no sMLPNet-T / T* weights were ever released
    'smlpnet_t.untrained': _cfg(),
    'smlpnet_t_a2.untrained': _cfg(),
    'smlpnet_s.in1k': _cfg(url='https://github.com/microsoft/SPACH/releases/download/v1.0/smlp_s.pth'),
    'smlpnet_b.in1k': _cfg(url='https://github.com/microsoft/SPACH/releases/download/v1.0/smlp_b.pth'),
})


@register_model
def smlpnet_t(pretrained: bool = False, **kwargs) -> SparseMLPNet:
    """sMLPNet-T: C 80, depths (2, 8, 14, 2), alpha 3 (24.1 M params, 5.0 GMACs, 81.9 top-1)."""
    model_args = dict(embed_dim=80, depths=(2, 8, 14, 2), mlp_ratio=3.)
    return _create_smlpnet('smlpnet_t', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def smlpnet_t_a2(pretrained: bool = False, **kwargs) -> SparseMLPNet:
    """sMLPNet-T* (paper ablation base): C 80, depths (2, 8, 14, 2), alpha 2 (19.2 M, 4.0 GMACs, 81.3 top-1)."""
    model_args = dict(embed_dim=80, depths=(2, 8, 14, 2), mlp_ratio=2.)
    return _create_smlpnet('smlpnet_t_a2', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def smlpnet_s(pretrained: bool = False, **kwargs) -> SparseMLPNet:
    """sMLPNet-S: C 96, depths (2, 10, 24, 2), alpha 3 (48.6 M, 10.3 GMACs, 83.1 top-1); paper drop path 0.2."""
    model_args = dict(embed_dim=96, depths=(2, 10, 24, 2), mlp_ratio=3.)
    return _create_smlpnet('smlpnet_s', pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def smlpnet_b(pretrained: bool = False, **kwargs) -> SparseMLPNet:
    """sMLPNet-B: C 112, depths (2, 10, 24, 2), alpha 3 (65.9 M, 14.0 GMACs, 83.4 top-1); paper drop path 0.3."""
    model_args = dict(embed_dim=112, depths=(2, 10, 24, 2), mlp_ratio=3.)
    return _create_smlpnet('smlpnet_b', pretrained=pretrained, **dict(model_args, **kwargs))
