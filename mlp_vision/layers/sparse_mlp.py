""" Axial sparse MLP (sMLP) and the sMLPNet token-mixing module.

Paper: `Sparse MLP for Image Recognition: Is Self-Attention Really Necessary?` - https://arxiv.org/abs/2109.05422
(Fig. 2-3, Alg. 1). Equations restated in SPEC §1.3.
"""
from typing import List, Optional, Tuple, Type

import torch
import torch.nn as nn
import torch.nn.functional as F

from timm.layers import register_notrace_function

from .activations import fresh_input_act
from .gating import channel_linear

# norms that always return a new tensor, so the activation after them may work in place (layers.activations)
_FRESH_OUTPUT_NORMS = (nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm)

__all__ = ['AxialSparseMLP', 'SparseMLPTokenMixer']


@register_notrace_function  # FX leaf: a symbolic trace would otherwise bake BN statistics into constants
def conv_bn_eval(
        x: torch.Tensor,
        conv_weight: torch.Tensor,
        bn_weight: torch.Tensor,
        bn_bias: torch.Tensor,
        running_mean: torch.Tensor,
        running_var: torch.Tensor,
        eps: float,
        padding: List[int],
        groups: int,
) -> torch.Tensor:
    """``BN_eval(conv2d(x, conv_weight))`` (bias-free, stride-1 conv) as one conv: the BatchNorm's per-channel
    scale is folded into the conv weight and its shift becomes the conv bias.

    The fold is recomputed from the current parameters and statistics at every call (O(weight) work), so no
    cached fold can go stale after ``load_state_dict``, an optimizer step or a change of mode.
    """
    scale = torch.rsqrt(running_var + eps) * bn_weight
    return F.conv2d(x, conv_weight * scale.view(-1, 1, 1, 1), bn_bias - running_mean * scale,
                    padding=padding, groups=groups)


class AxialSparseMLP(nn.Module):
    """sMLP: ``fuse(concat[x, mix_H(x), mix_W(x)])`` on ``x = GELU(BN(x))``.

    ``mix_H`` is one Linear(H, H) applied along the H axis, shared by every column and channel; ``mix_W`` is
    one Linear(W, W) along the W axis, shared by every row and channel. ``fuse`` is a 1x1 conv 3C -> C
    without bias, whose input channels are ordered [identity, H-mixed, W-mixed].

    How it is computed (same function, same parameters; see SPEC §5 for where the time goes): activations are
    channels-last, and the fuse is split over its three input blocks and commuted with the axial mixes, which it
    may be because both are linear:
    ``W_f [x, M_h x + b_h, M_w x + b_w] = W_0 x + M_h (W_1 x) + M_w (W_2 x) + (W_1 1) b_h + (W_2 1) b_w``,
    where ``W_i`` is the i-th (C, C) block of the fuse weight and the last two terms are the rank-1 maps the
    axial biases become after the fuse. So no 3C-channel concat is materialised, the three C -> C channel GEMMs
    run on channels-last data through oneDNN (:func:`~mlp_vision.layers.gating.channel_linear`), and the axial
    mixes accumulate into the first GEMM's output in place as batched matmuls on views (no permuted copies):
    ``(H, H) @ (B, H, W*C)`` along H, ``(W, W) @ (B*H, W, C)`` along W.

    Shapes: x (B, C, H, W) -> (B, C, H, W) (channels-last memory); H, W must equal ``feat_size``. ``shortcut``
    (optional, same shape) is added to the output (the caller's residual, saving it a pass).
    """

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
        # act follows the norm (forward) or the folded depthwise conv (SparseMLPTokenMixer): a fresh tensor
        self.act = fresh_input_act(act_layer()) if isinstance(self.norm, _FRESH_OUTPUT_NORMS) else act_layer()
        self.proj_h = nn.Linear(height, height, **dd)  # mixes along H
        self.proj_w = nn.Linear(width, width, **dd)  # mixes along W
        self.fuse = nn.Conv2d(3 * dim, dim, kernel_size=1, bias=False, **dd)

    def forward(self, x: torch.Tensor, shortcut: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = self.act(self.norm(x.contiguous(memory_format=torch.channels_last)))
        return self.mix(x, shortcut)

    def mix(self, x: torch.Tensor, shortcut: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Everything after ``GELU(BN(.))``: ``fuse(concat[x, mix_H(x), mix_W(x)]) [+ shortcut]``."""
        x = x.permute(0, 2, 3, 1).contiguous()  # (B, H, W, C); a view when x is channels-last
        height, width, dim = x.shape[1], x.shape[2], x.shape[3]
        w = self.fuse.weight.flatten(1)  # (C, 3C): [identity | H-mixed | W-mixed] input blocks
        w0, w1, w2 = w[:, :dim], w[:, dim:2 * dim], w[:, 2 * dim:]
        # contiguous outputs, so that the (B, H, W*C) and (B*H, W, C) views below exist
        out = channel_linear(x, w0).contiguous()
        y_h = channel_linear(x, w1).contiguous()
        y_w = channel_linear(x, w2).contiguous()
        batch = x.shape[0]
        # in-place baddbmm_ is not autocast: under AMP the GEMM outputs are bf16/fp16, so cast the weights to match
        wh, ww = self.proj_h.weight.to(out.dtype), self.proj_w.weight.to(out.dtype)
        # In-place accumulation into `out` (no extra buffers); each result is used, so FX's dead-code
        # elimination keeps the in-place nodes. A wrong-sized input fails in these matmuls (RuntimeError).
        # out[b, i, w, :] += sum_j Wh[i, j] y_h[b, j, w, :]
        out = out.view(-1, height, width * dim).baddbmm_(
            wh.expand(batch, height, height), y_h.view(-1, height, width * dim))
        # out[b, h, i, :] += sum_j Ww[i, j] y_w[b, h, j, :]
        out = out.view(-1, width, dim).baddbmm_(
            ww.expand(batch * height, width, width), y_w.view(-1, width, dim))
        # the axial biases after the fuse: b_h[i] * (W_1 1)[c] + b_w[j] * (W_2 1)[c], an (H, W, C) map
        bias = (self.proj_h.bias.view(-1, 1, 1) * w1.sum(1)) + (self.proj_w.bias.view(1, -1, 1) * w2.sum(1))
        out = out.view_as(x).add_(bias)
        if shortcut is not None:
            out = out.add_(shortcut.permute(0, 2, 3, 1))
        return out.permute(0, 3, 1, 2)


class SparseMLPTokenMixer(nn.Module):
    """sMLPNet token mixing: depthwise-conv branch (BN -> GELU -> DWConv 3x3) followed by :class:`AxialSparseMLP`.

    The caller adds the single residual around the whole module: ``x = x + DropPath(token_mixer(x))``, or passes
    ``shortcut=x`` to have it added here (no drop path) without a separate pass.

    In eval mode the sMLP's BatchNorm, which directly follows the depthwise conv, is folded into it (per-channel
    scale on the conv weight, shift as its bias), computed from the current statistics at every call.

    Shapes: x (B, C, H, W) -> (B, C, H, W) (channels-last memory).
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
        self.kernel_size = kernel_size
        self.conv_dw = nn.Conv2d(
            dim, dim, kernel_size, padding=kernel_size // 2, groups=dim, bias=False, **dd)
        self.smlp = AxialSparseMLP(dim, feat_size, norm_layer=norm_layer, act_layer=act_layer, **dd)
        # the sMLP's norm follows the depthwise conv directly: foldable into it in eval mode if it is an affine
        # BatchNorm2d with running statistics
        norm = self.smlp.norm
        self.fold_bn = bool(isinstance(norm, nn.BatchNorm2d) and norm.track_running_stats and norm.affine
                            and self.conv_dw.bias is None and self.conv_dw.stride == (1, 1))

    def forward(self, x: torch.Tensor, shortcut: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = self.act(self.norm(x.contiguous(memory_format=torch.channels_last)))
        bn = self.smlp.norm
        if not self.fold_bn or bn.training:
            return self.smlp(self.conv_dw(x), shortcut)
        mean, var = bn.running_mean, bn.running_var
        assert mean is not None and var is not None  # fold_bn checked track_running_stats
        x = conv_bn_eval(x, self.conv_dw.weight, bn.weight, bn.bias, mean, var, bn.eps,
                         [self.kernel_size // 2, self.kernel_size // 2], self.conv_dw.groups)
        return self.smlp.mix(self.smlp.act(x), shortcut)
