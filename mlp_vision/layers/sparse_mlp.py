""" Axial sparse MLP (sMLP) and the sMLPNet token-mixing module.

Paper: `Sparse MLP for Image Recognition: Is Self-Attention Really Necessary?` - https://arxiv.org/abs/2109.05422
(Fig. 2-3, Alg. 1). Equations restated in SPEC §1.3.
"""
from typing import Tuple, Type

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ['AxialSparseMLP', 'SparseMLPTokenMixer']


class AxialSparseMLP(nn.Module):
    """sMLP: ``fuse(concat[x, mix_H(x), mix_W(x)])`` on ``x = GELU(BN(x))``.

    ``mix_H`` is one Linear(H, H) applied along the H axis, shared by every column and channel; ``mix_W`` is
    one Linear(W, W) along the W axis, shared by every row and channel. ``fuse`` is a 1x1 conv 3C -> C
    without bias, whose input channels are ordered [identity, H-mixed, W-mixed].

    The axial mixes are matmuls on the NCHW tensor itself (``W_h @ x`` and ``x @ W_w^T``), so no permuted
    copies are made.

    Shapes: x (B, C, H, W) -> (B, C, H, W); H, W must equal ``feat_size``.
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
        self.act = act_layer()
        self.proj_h = nn.Linear(height, height, **dd)  # mixes along H
        self.proj_w = nn.Linear(width, width, **dd)  # mixes along W
        self.fuse = nn.Conv2d(3 * dim, dim, kernel_size=1, bias=False, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.norm(x))
        # (H, H) @ (B, C, H, W): out[..., i, w] = sum_j Wh[i, j] x[..., j, w] + bh[i]
        x_h = torch.matmul(self.proj_h.weight, x) + self.proj_h.bias.unsqueeze(-1)
        # Linear over the last (W) axis
        x_w = F.linear(x, self.proj_w.weight, self.proj_w.bias)
        return self.fuse(torch.cat([x, x_h, x_w], dim=1))


class SparseMLPTokenMixer(nn.Module):
    """sMLPNet token mixing: depthwise-conv branch (BN -> GELU -> DWConv 3x3) followed by :class:`AxialSparseMLP`.

    The caller adds the single residual around the whole module: ``x = x + DropPath(token_mixer(x))``.

    Shapes: x (B, C, H, W) -> (B, C, H, W).
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
        self.act = act_layer()
        self.conv_dw = nn.Conv2d(
            dim, dim, kernel_size, padding=kernel_size // 2, groups=dim, bias=False, **dd)
        self.smlp = AxialSparseMLP(dim, feat_size, norm_layer=norm_layer, act_layer=act_layer, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_dw(self.act(self.norm(x)))
        return self.smlp(x)
