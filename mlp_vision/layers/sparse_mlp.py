""" sMLPNet's pieces: the axial sparse MLP (sMLP), the token-mixing module and the sMLPNet block.

Paper: `Sparse MLP for Image Recognition: Is Self-Attention Really Necessary?` - https://arxiv.org/abs/2109.05422
(§3.1 Fig. 2 block structure, §3.2 Fig. 3 and Alg. 1 the sMLP).

The sMLP (Alg. 1) on a (B, C, H, W) map ``x``::

    x_h = x mixed along H by one Linear(H, H), shared by every column and channel
    x_w = x mixed along W by one Linear(W, W), shared by every row and channel
    out = Conv1x1_{3C -> C}(concat[x, x_h, x_w])          (no bias; the paper's "fuse", our ``fuse_conv``)

Memory layout. Every module here takes and returns (B, C, H, W) tensors whose channel axis is the contiguous one,
in either of two memory orders, and computes in the order it is given, without copies:

* channels-last, (B, H, W, C) memory: what a plain call gets (any other input is made channels-last first);
* token-major, (H, W, B, C) memory (:func:`to_token_major`): what sMLPNet's stages run their blocks in. The axial
  Linears (:class:`~mlp_vision.layers.TokenLinear`) then mix H as one GEMM ``(H, H) @ (H, W*B*C)`` and W as H GEMMs
  ``(W, W) @ (W, B*C)``, where channels-last memory needs ``B`` and ``B*H`` small ones (``(H, H) @ (H, W*C)``,
  ``(W, W) @ (W, C)``).

Either way the per-pixel modules (BatchNorm, GELU, the 1x1 fuse conv) run on a channels-last 4D view of the same
memory (:func:`_pixel_view`: for token-major memory the (H, C, W, B) view, whose "batch" and "spatial" axes are
H, W and B; a per-pixel op does not care which is which), the LayerNorm and the channel MLP on the
channels-innermost (*, C) rows, and the depthwise conv (:class:`FoldedDepthwiseConv2d`) on the batch folded into
the channels, ``(1, B*C, H, W)`` channels-last.

Inference fusion: :meth:`SparseMLPTokenMixer.reparameterize` (called by ``timm.utils.reparameterize_model``) folds
the sMLP's BatchNorm into the depthwise conv it directly follows, once, replacing both modules by one conv.
"""
from typing import Dict, List, Sequence, Tuple, Type

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import DropPath, Mlp, register_notrace_module

from .activations import fresh_input_act
from .linear import TokenLinear
from .resample import TokenAxes, resample_token_params_

# norms that always return a new tensor, so the activation after them may work in place (layers.activations)
_FRESH_OUTPUT_NORMS = (nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm)

__all__ = [
    'AxialSparseMLP', 'SparseMLPTokenMixer', 'SparseMLPBlock', 'FoldedDepthwiseConv2d', 'rename_legacy_smlp_keys',
    'to_token_major', 'from_token_major']

# AxialSparseMLP's state-dict names that changed, old -> new (relative to the module). The 1x1 projection was the
# child ``fuse`` until issue 25: timm's reparameterize_model replaces every child that has a ``fuse`` attribute by
# ``child.fuse()``, which called the conv without input
_LEGACY_SMLP_KEYS = {'fuse.weight': 'fuse_conv.weight', 'fuse.bias': 'fuse_conv.bias'}


def rename_legacy_smlp_keys(state_dict: Dict[str, torch.Tensor], prefix: str = '') -> Dict[str, torch.Tensor]:
    """In place: the old key names of the :class:`AxialSparseMLP` at ``prefix`` (``'stages.0.blocks.0.token_mixer.
    smlp.'``; ``''`` for the module itself) renamed to the current ones; returns ``state_dict``. Every
    ``load_state_dict`` of the module applies it (train.py ``--resume``, validate.py ``--checkpoint``, timm's loaders),
    and sMLPNet's ``checkpoint_filter_fn`` over the whole model."""
    for old, new in _LEGACY_SMLP_KEYS.items():
        if prefix + old in state_dict:
            value = state_dict.pop(prefix + old)
            state_dict.setdefault(prefix + new, value)  # a file with both names keeps the current one
    return state_dict


def to_token_major(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> the same values in token-major memory, (H, W, B, C) (one copy unless already so), shape kept."""
    return x.permute(2, 3, 0, 1).contiguous().permute(2, 3, 0, 1)


def from_token_major(x: torch.Tensor) -> torch.Tensor:
    """Token-major (B, C, H, W) -> a channels-last copy, whose gradient comes back token-major.

    The copy's own backward passes the channels-last gradient through unchanged: the blocks before it would then
    read it in the wrong order, and copy it, in every block (the fc2 and fuse-conv gradients need contiguous (*, C)
    rows in token-major order). Going through the flat (H*W*B*C) view makes autograd reshape the gradient back into
    (H, W, B, C) order, one copy here instead. The forward views are free: x is token-major."""
    rows = x.permute(2, 3, 0, 1)  # (H, W, B, C), contiguous
    return rows.reshape(-1).view(rows.shape).permute(2, 3, 0, 1).contiguous(memory_format=torch.channels_last)


def _is_token_major(x: torch.Tensor) -> bool:
    """True for a (B, C, H, W) tensor with (H, W, B, C) memory that is not also channels-last (as when B == 1)."""
    return not x.is_contiguous(memory_format=torch.channels_last) and x.permute(2, 3, 0, 1).is_contiguous()


def _channels_inner(x: torch.Tensor) -> torch.Tensor:
    """``x`` if it is token-major or channels-last (the two layouts computed without copies), else a channels-last
    copy."""
    return x if _is_token_major(x) else x.contiguous(memory_format=torch.channels_last)


def _pixel_view(x: torch.Tensor, token_major: bool) -> torch.Tensor:
    """A channels-last 4D view of ``x``'s memory for per-pixel modules: ``x`` itself, or (H, C, W, B) when token-major
    (channels-last strides, so BatchNorm and 1x1 convs run their channels-last kernels, no copy)."""
    return x.permute(2, 1, 3, 0) if token_major else x


def _from_pixel_view(x: torch.Tensor, token_major: bool) -> torch.Tensor:
    """Inverse of :func:`_pixel_view`: back to the (B, C, H, W) axis order."""
    return x.permute(3, 1, 0, 2) if token_major else x


def _rows_order(token_major: bool) -> List[int]:
    """The permutation of a (B, C, H, W) tensor's axes into memory order, channels last: the contiguous (*, C) view
    the LayerNorm and the channel MLP read. It is its own inverse for token-major memory, not for channels-last."""
    return [2, 3, 0, 1] if token_major else [0, 2, 3, 1]


@register_notrace_module  # a leaf for FX (timm's feature extraction): its route depends on strides
class FoldedDepthwiseConv2d(nn.Conv2d):
    """A depthwise ``nn.Conv2d`` (``groups == in_channels``; same parameters, state dict and function) that also
    takes token-major input without a copy: the (H, W, B, C) memory is the channels-last map ``(1, B*C, H, W)``, the
    batch folded into the channels, convolved with the filters repeated B times (``groups * B``). Any other layout
    goes to ``nn.Conv2d.forward``.

    Shapes: x (B, C, H, W) -> (B, C_out, H_out, W_out), token-major out for token-major in.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, *args, **kwargs) -> None:
        super().__init__(in_channels, out_channels, kernel_size, *args, **kwargs)
        if self.groups != self.in_channels or self.padding_mode != 'zeros':
            raise ValueError(f'FoldedDepthwiseConv2d needs groups == in_channels and zero padding, got groups '
                             f'{self.groups} for {self.in_channels} channels, padding_mode {self.padding_mode!r}')

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _is_token_major(x):
            return self._conv_forward(x, self.weight, self.bias)
        batch, chans, height, width = x.shape
        folded = x.permute(2, 3, 0, 1).reshape(1, height, width, batch * chans).permute(0, 3, 1, 2)
        bias = self.bias
        if bias is not None:
            bias = bias.repeat(batch)
        y = F.conv2d(folded, self.weight.repeat(batch, 1, 1, 1), bias, self.stride, self.padding, self.dilation,
                     self.groups * batch)
        out_h, out_w = y.shape[-2], y.shape[-1]
        return y.permute(0, 2, 3, 1).reshape(out_h, out_w, batch, -1).permute(2, 3, 0, 1)


def _fold_batchnorm_into_conv(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """A new conv (of ``conv``'s class) computing ``bn(conv(x))`` with the BatchNorm's running statistics (its eval-mode
    function):
    ``W' = W * s``, ``b' = (b - mean) * s + beta`` with ``s = gamma / sqrt(var + eps)`` per output channel."""
    with torch.no_grad():
        scale = torch.rsqrt(bn.running_var + bn.eps)
        shift = -bn.running_mean * scale
        if bn.affine:
            scale = scale * bn.weight
            shift = shift * bn.weight + bn.bias
        fused = type(conv)(
            conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride, padding=conv.padding,
            dilation=conv.dilation, groups=conv.groups, bias=True, padding_mode=conv.padding_mode,
            device=conv.weight.device, dtype=conv.weight.dtype)
        fused.weight.copy_(conv.weight * scale.view(-1, 1, 1, 1))
        fused.bias.copy_(shift if conv.bias is None else conv.bias * scale + shift)
    return fused


@register_notrace_module  # a leaf for FX (timm's feature extraction): its route depends on strides
class AxialSparseMLP(nn.Module):
    """sMLP: ``fuse_conv(concat[x, mix_H(x), mix_W(x)])`` on ``x = GELU(BN(x))`` (arXiv 2109.05422, Alg. 1).

    ``proj_h`` is one Linear(H, H) applied along the H axis, ``proj_w`` one Linear(W, W) along the W axis;
    ``fuse_conv`` (the paper's "fuse") is a 1x1 conv 3C -> C without bias whose input channels are ordered
    [identity, H-mixed, W-mixed]. State dicts with its old name ``fuse`` load (:func:`rename_legacy_smlp_keys`).

    Shapes: x (B, C, H, W) -> (B, C, H, W) in x's memory order (token-major or channels-last; see the module
    docstring); H, W must equal ``feat_size``.
    """
    # the axial mixes and their token axes (output, contracted), each over the one axis it mixes (H for proj_h, W
    # for proj_w): what sMLPNet's checkpoint loader and set_feat_size resample for another map size
    token_axes_h: TokenAxes = {'proj_h.weight': ((0,), (1,)), 'proj_h.bias': ((0,), ())}
    token_axes_w: TokenAxes = {'proj_w.weight': ((0,), (1,)), 'proj_w.bias': ((0,), ())}

    def __init__(
            self,
            dim: int,
            feat_size: Tuple[int, int],
            norm_layer: Type[nn.Module] = nn.BatchNorm2d,
            act_layer: Type[nn.Module] = nn.GELU,
            device=None,
            dtype=None,
    ) -> None:
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        self.feat_size = tuple(feat_size)
        height, width = self.feat_size
        self.norm = norm_layer(dim, **dd)
        self.act = fresh_input_act(act_layer()) if isinstance(self.norm, _FRESH_OUTPUT_NORMS) else act_layer()
        self.proj_h = TokenLinear(height, height, **dd)  # mixes along H
        self.proj_w = TokenLinear(width, width, **dd)  # mixes along W
        self.fuse_conv = nn.Conv2d(3 * dim, dim, kernel_size=1, bias=False, **dd)

    def set_feat_size(self, feat_size: Sequence[int]) -> None:
        """Resample ``proj_h`` along H and ``proj_w`` along W to an (H, W) map size, as the checkpoint loader does."""
        (old_h, old_w), (new_h, new_w) = self.feat_size, tuple(feat_size)
        resample_token_params_(self, self.token_axes_h, (old_h,), (new_h,))
        resample_token_params_(self, self.token_axes_w, (old_w,), (new_w,))
        self.feat_size = (new_h, new_w)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        rename_legacy_smlp_keys(state_dict, prefix)  # checkpoints saved before issue 25
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _channels_inner(x)
        token_major = _is_token_major(x)
        x_px = self.act(self.norm(_pixel_view(x, token_major)))
        x = _from_pixel_view(x_px, token_major)
        x_h = self.proj_h(x.transpose(2, 3)).transpose(2, 3)  # the Linear sees (B, C, W, H): mixes along H
        x_w = self.proj_w(x)  # (B, C, H, W): mixes along W
        # a wrong-sized input fails in the axial Linears (RuntimeError); the models check sizes before.
        # TokenLinear returns x's memory order, so the three blocks concatenate as channels-last pixel views
        x_cat = torch.cat([x_px, _pixel_view(x_h, token_major), _pixel_view(x_w, token_major)], dim=1)
        return _from_pixel_view(self.fuse_conv(x_cat), token_major)


@register_notrace_module  # a leaf for FX (timm's feature extraction): its route depends on strides
class SparseMLPTokenMixer(nn.Module):
    """sMLPNet token mixing: depthwise-conv branch (BN -> GELU -> DWConv 3x3) followed by :class:`AxialSparseMLP`
    (arXiv 2109.05422, Fig. 2: the DWConv and the sMLP share one residual connection).

    Shapes: x (B, C, H, W) -> (B, C, H, W) in x's memory order (token-major or channels-last).
    """

    def __init__(
            self,
            dim: int,
            feat_size: Tuple[int, int],
            kernel_size: int = 3,
            norm_layer: Type[nn.Module] = nn.BatchNorm2d,
            act_layer: Type[nn.Module] = nn.GELU,
            device=None,
            dtype=None,
    ) -> None:
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        self.norm = norm_layer(dim, **dd)
        self.act = fresh_input_act(act_layer()) if isinstance(self.norm, _FRESH_OUTPUT_NORMS) else act_layer()
        self.conv_dw = FoldedDepthwiseConv2d(
            dim, dim, kernel_size, padding=kernel_size // 2, groups=dim, bias=False, **dd)
        self.smlp = AxialSparseMLP(dim, feat_size, norm_layer=norm_layer, act_layer=act_layer, **dd)

    def set_feat_size(self, feat_size: Sequence[int]) -> None:
        self.smlp.set_feat_size(feat_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _channels_inner(x)
        token_major = _is_token_major(x)
        x = _from_pixel_view(self.act(self.norm(_pixel_view(x, token_major))), token_major)
        return self.smlp(self.conv_dw(x))

    def reparameterize(self) -> None:
        """Inference fusion, once (``timm.utils.reparameterize_model`` calls it): the sMLP's BatchNorm, which
        directly follows the depthwise conv, folded into that conv with its running statistics. ``conv_dw`` becomes
        a conv with bias, ``smlp.norm`` an ``nn.Identity``: the eval-mode function up to float rounding, one pass
        over the (B, C, H, W) map less per block. The first BatchNorm is followed by GELU and stays. For eval only:
        afterwards nothing normalises with batch statistics. A no-op when the modules are not (or no longer) a
        plain conv followed by a BatchNorm with running statistics."""
        conv, bn = self.conv_dw, self.smlp.norm
        if type(conv) not in (nn.Conv2d, FoldedDepthwiseConv2d) or type(bn) is not nn.BatchNorm2d or bn.running_var is None:
            return
        self.conv_dw = _fold_batchnorm_into_conv(conv, bn)
        self.smlp.norm = nn.Identity()  # smlp.act may stay in place: its input is now the fresh conv output


@register_notrace_module  # a leaf for FX (timm's feature extraction): its route depends on strides
class SparseMLPBlock(nn.Module):
    """sMLPNet block: ``x = x + DropPath(TokenMixer(x))``; ``x = x + DropPath(MLP(LayerNorm_C(x)))``
    (arXiv 2109.05422, §3.1, Fig. 2).

    The channel MLP is timm's ``Mlp`` (``mlp.fc1`` / ``mlp.fc2`` are ``nn.Linear``) on the contiguous (*, C) rows of
    the activations in memory order ((B, H, W, C) for channels-last, (H, W, B, C) for token-major memory): no copies
    around the LayerNorm and the GEMMs.

    Shapes: x (B, C, H, W) -> (B, C, H, W) in x's memory order (token-major or channels-last) with
    (H, W) == feat_size.
    """

    def __init__(
            self,
            dim: int,
            feat_size: Tuple[int, int],
            mlp_ratio: float = 3.,
            norm_layer: Type[nn.Module] = nn.LayerNorm,
            act_layer: Type[nn.Module] = nn.GELU,
            proj_drop: float = 0.,
            drop_path: float = 0.,
            device=None,
            dtype=None,
    ) -> None:
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        self.token_mixer = SparseMLPTokenMixer(dim, feat_size, act_layer=act_layer, **dd)
        self.norm = norm_layer(dim, **dd)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=proj_drop, **dd)
        self.mlp.act = fresh_input_act(self.mlp.act)  # applied to the fresh fc1 output only
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()

    def set_feat_size(self, feat_size: Sequence[int]) -> None:
        self.token_mixer.set_feat_size(feat_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _channels_inner(x)
        token_major = _is_token_major(x)
        x = x + self.drop_path(self.token_mixer(x))
        rows = _rows_order(token_major)
        y = self.mlp(self.norm(x.permute(rows)))  # contiguous (*, C) rows
        return x + self.drop_path(y.permute(rows if token_major else [0, 3, 1, 2]))
