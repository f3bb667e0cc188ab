""" sMLPNet's pieces: the axial sparse MLP (sMLP), the token-mixing module and the sMLPNet block.

Paper: `Sparse MLP for Image Recognition: Is Self-Attention Really Necessary?` - https://arxiv.org/abs/2109.05422
(§3.1 Fig. 2 block structure, §3.2 Fig. 3 and Alg. 1 the sMLP).

The sMLP (Alg. 1) on a (B, C, H, W) map ``x``::

    x_h = x mixed along H by one Linear(H, H), shared by every column and channel
    x_w = x mixed along W by one Linear(W, W), shared by every row and channel
    out = Conv1x1_{3C -> C}(concat[x, x_h, x_w])          (no bias)

Activations are channels-last (NCHW shape, NHWC memory) throughout: the 1x1 convs, the LayerNorm and the channel
MLP then read contiguous channel vectors, and the axial Linears (:class:`~mlp_vision.layers.TokenLinear`) mix the
H and W axes of that memory as batched GEMMs, ``(H, H) @ (B, H, W*C)`` and ``(W, W) @ (B*H, W, C)``, with no
permuted copies.

Two rearrangements of the same function are taken while nothing observes the modules involved
(:func:`~mlp_vision.layers.linear.unobserved`: exact classes, no hooks, no tracer / compiler / mode); otherwise every
module is called:

* the fuse commuted with the axial mixes. With ``fuse = [W0 | W1 | W2]`` (C x 3C) and the mixes acting on the
  spatial axes only, ``fuse(concat[x, P_H x + b_H, P_W x + b_W]) = W0 x + P_H (W1 x) + P_W (W2 x) + b_H (W1 1) +
  b_W (W2 1)``: one C -> 3C channel GEMM, the two mixes accumulated in place into its first third, and an (H, W, C)
  bias map, instead of a 3C-channel concat copy and a 3C -> C GEMM (the same MACs, one large copy less);
* in eval mode the sMLP's BatchNorm, which directly follows the depthwise conv, folded into the conv (scale on its
  weight, shift as its bias, from the current running statistics at every call).
"""
from typing import Tuple, Type

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import DropPath

from .activations import FreshGELU, fresh_input_act
from .linear import ChannelMlp, TokenLinear, _channel_gemm, autocast_on, record_forward, unobserved

# norms that always return a new tensor, so the activation after them may work in place (layers.activations)
_FRESH_OUTPUT_NORMS = (nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm)

__all__ = ['AxialSparseMLP', 'SparseMLPTokenMixer', 'SparseMLPBlock']


@record_forward
class AxialSparseMLP(nn.Module):
    """sMLP: ``fuse(concat[x, mix_H(x), mix_W(x)])`` on ``x = GELU(BN(x))`` (arXiv 2109.05422, Alg. 1).

    ``proj_h`` is one Linear(H, H) applied along the H axis, ``proj_w`` one Linear(W, W) along the W axis; ``fuse``
    is a 1x1 conv 3C -> C without bias whose input channels are ordered [identity, H-mixed, W-mixed].

    Shapes: x (B, C, H, W) -> (B, C, H, W) (channels-last memory); H, W must equal ``feat_size``.
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
        self.act = fresh_input_act(act_layer()) if isinstance(self.norm, _FRESH_OUTPUT_NORMS) else act_layer()
        self.proj_h = TokenLinear(height, height, **dd)  # mixes along H
        self.proj_w = TokenLinear(width, width, **dd)  # mixes along W
        self.fuse = nn.Conv2d(3 * dim, dim, kernel_size=1, bias=False, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mix(self.act(self.norm(x.contiguous(memory_format=torch.channels_last))))

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        """Everything after ``GELU(BN(.))``: ``fuse(concat[x, mix_H(x), mix_W(x)])``; x (B, C, H, W)."""
        # TorchScript drops a branch only under a bare `if torch.jit.is_scripting():` (not inside `and` / `or`)
        if torch.jit.is_scripting():
            pass
        elif self._may_commute(x):
            return self._fuse_commuted(x)
        x_h = self.proj_h(x.transpose(2, 3)).transpose(2, 3)  # the Linear sees (B, C, W, H): mixes along H
        x_w = self.proj_w(x)  # (B, C, H, W): mixes along W
        # a wrong-sized input fails in the axial Linears (RuntimeError); the models check sizes before
        return self.fuse(torch.cat([x, x_h, x_w], dim=1))

    def _may_commute(self, x: torch.Tensor) -> bool:
        fuse = self.fuse
        return (unobserved(x, self.proj_h, self.proj_w, fuse, built_as=(TokenLinear, TokenLinear, nn.Conv2d))
                and fuse.bias is None and fuse.kernel_size == (1, 1) and fuse.groups == 1 and x.dim() == 4
                and tuple(x.shape[2:]) == self.feat_size and not autocast_on(x)
                and x.dtype == fuse.weight.dtype == self.proj_h.weight.dtype == self.proj_w.weight.dtype)

    def _fuse_commuted(self, x: torch.Tensor) -> torch.Tensor:
        """``fuse(concat[x, mix_H(x), mix_W(x)])`` as ``W0 x + P_H (W1 x) + P_W (W2 x) + bias map`` (module
        docstring), with the modules' own parameters; x (B, C, H, W) -> (B, C, H, W), channels-last."""
        x = x.permute(0, 2, 3, 1).contiguous()  # (B, H, W, C); a view when x is channels-last
        batch, height, width, dim = x.shape
        w = self.fuse.weight.flatten(1)  # (C, 3C): [identity | H-mixed | W-mixed] input blocks
        w0, w1, w2 = w[:, :dim], w[:, dim:2 * dim], w[:, 2 * dim:]
        # three contiguous (B, H, W, C) GEMM outputs (oneDNN while unobserved, as channel_linear), so that the
        # (B, H, W*C) and (B*H, W, C) views below exist
        out = _channel_gemm(x, w0.contiguous(), None)
        y_h = _channel_gemm(x, w1.contiguous(), None)
        y_w = _channel_gemm(x, w2.contiguous(), None)
        # out[b, i, w, :] += sum_j P_H[i, j] y_h[b, j, w, :]   (H-mix of W1 x)
        out.view(batch, height, width * dim).baddbmm_(
            self.proj_h.weight.expand(batch, height, height), y_h.view(batch, height, width * dim))
        # out[b, h, i, :] += sum_j P_W[i, j] y_w[b, h, j, :]   (W-mix of W2 x)
        out.view(batch * height, width, dim).baddbmm_(
            self.proj_w.weight.expand(batch * height, width, width), y_w.view(batch * height, width, dim))
        # the axial biases after the fuse: b_H[i] (W1 1)[c] + b_W[j] (W2 1)[c], an (H, W, C) map
        out = out.view_as(x)
        if self.proj_h.bias is not None:
            out = out.add_(self.proj_h.bias.view(-1, 1, 1) * w1.sum(1))
        if self.proj_w.bias is not None:
            out = out.add_(self.proj_w.bias.view(1, -1, 1) * w2.sum(1))
        return out.permute(0, 3, 1, 2)


class SparseMLPTokenMixer(nn.Module):
    """sMLPNet token mixing: depthwise-conv branch (BN -> GELU -> DWConv 3x3) followed by :class:`AxialSparseMLP`
    (arXiv 2109.05422, Fig. 2: the DWConv and the sMLP share one residual connection).

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
        self.conv_dw = nn.Conv2d(
            dim, dim, kernel_size, padding=kernel_size // 2, groups=dim, bias=False, **dd)
        self.smlp = AxialSparseMLP(dim, feat_size, norm_layer=norm_layer, act_layer=act_layer, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.norm(x.contiguous(memory_format=torch.channels_last)))
        smlp = self.smlp
        if torch.jit.is_scripting():  # TorchScript compiles this branch only
            return smlp(self.conv_dw(x))
        elif not self._may_fold_bn(x):
            return smlp(self.conv_dw(x))
        # eval: the sMLP's BatchNorm folded into the depthwise conv it follows (module docstring)
        bn, conv = smlp.norm, self.conv_dw
        scale = bn.weight * torch.rsqrt(bn.running_var + bn.eps)  # (C,)
        x = F.conv2d(x, conv.weight * scale.view(-1, 1, 1, 1), bn.bias - bn.running_mean * scale,
                     conv.stride, conv.padding, conv.dilation, conv.groups)
        return smlp.mix(smlp.act(x))

    def _may_fold_bn(self, x: torch.Tensor) -> bool:
        smlp, bn, conv = self.smlp, self.smlp.norm, self.conv_dw
        return (not bn.training and unobserved(x, conv, smlp, bn, smlp.act, built_as=(
                    nn.Conv2d, AxialSparseMLP, nn.BatchNorm2d, type(smlp.act)))
                and type(smlp.act) in (nn.GELU, FreshGELU) and bn.affine and bn.running_mean is not None
                and conv.bias is None and conv.padding_mode == 'zeros' and isinstance(conv.padding, tuple)
                and not autocast_on(x))


class SparseMLPBlock(nn.Module):
    """sMLPNet block: ``x = x + DropPath(TokenMixer(x))``; ``x = x + DropPath(MLP(LayerNorm_C(x)))``
    (arXiv 2109.05422, §3.1, Fig. 2).

    The channel MLP is timm's ``Mlp`` as :class:`~mlp_vision.layers.linear.ChannelMlp` (``mlp.fc1`` / ``mlp.fc2``
    are ``nn.Linear``; GEMMs through oneDNN while unobserved) on the (B, H, W, C) view of the channels-last
    activations, which is contiguous: no copies around the LayerNorm and the GEMMs.

    Shapes: x (B, C, H, W) -> (B, C, H, W) (channels-last memory) with (H, W) == feat_size.
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
        self.mlp = ChannelMlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=proj_drop, **dd)
        self.mlp.act = fresh_input_act(self.mlp.act)  # applied to the fresh fc1 output only
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous(memory_format=torch.channels_last)
        x = x + self.drop_path(self.token_mixer(x))
        y = self.mlp(self.norm(x.permute(0, 2, 3, 1)))  # (B, H, W, C), contiguous
        return x + self.drop_path(y.permute(0, 3, 1, 2))
