""" sMLPNet's pieces: the axial sparse MLP (sMLP), the token-mixing module and the sMLPNet block.

Paper: `Sparse MLP for Image Recognition: Is Self-Attention Really Necessary?` - https://arxiv.org/abs/2109.05422
(§3.1 Fig. 2 block structure, §3.2 Fig. 3 and Alg. 1 the sMLP).

The sMLP (Alg. 1) on a (B, C, H, W) map ``x``::

    x_h = x mixed along H by one Linear(H, H), shared by every column and channel
    x_w = x mixed along W by one Linear(W, W), shared by every row and channel
    out = Conv1x1_{3C -> C}(concat[x, x_h, x_w])          (no bias; the paper's "fuse", our ``fuse_conv``)

Activations are channels-last (NCHW shape, NHWC memory) throughout, so the 1x1 convs, the LayerNorm and the
channel MLP read contiguous channel vectors and the axial :class:`~mlp_vision.layers.TokenLinear` mix H and W in
place as batched GEMMs, without permuted copies.

Inference fusion: :meth:`SparseMLPTokenMixer.reparameterize` (``timm.utils.reparameterize_model``).
"""
from typing import Sequence, Tuple, Type

import torch
import torch.nn as nn
from timm.layers import DropPath, Mlp
from torch.jit import Final
from torch.nn.utils import fuse_conv_bn_eval

from .activations import fresh_input_act
from .linear import TokenLinear
from .resample import TokenAxes, resample_token_params_

__all__ = ['AxialSparseMLP', 'SparseMLPTokenMixer', 'SparseMLPBlock']


class AxialSparseMLP(nn.Module):
    """sMLP: ``fuse_conv(concat[x, mix_H(x), mix_W(x)])`` on ``x = GELU(BN(x))`` (arXiv 2109.05422, Alg. 1).

    ``proj_h``: one Linear(H, H) along H, ``proj_w``: one Linear(W, W) along W; ``fuse_conv`` (the paper's "fuse"):
    a 1x1 conv 3C -> C without bias, input channels [identity, H-mixed, W-mixed].

    ``one_gemm_mixes``: the mixes read an (H, B, C, W) copy of ``x``, so each is one GEMM over the whole batch
    (``W_h (H, H) @ x (H, B*C*W)``, ``x (H*B*C, W) @ W_w^T``) instead of B (along H) or B*H (along W) small ones; the
    price is that copy. Same parameters and values; off by default until measured faster on the GPU.

    Shapes: x (B, C, H, W) -> (B, C, H, W) (channels-last memory); H, W must equal ``feat_size``.
    """
    # the axial mixes: token axes (output, contracted) over the one axis each mixes, resampled for another map size
    token_axes_h: TokenAxes = {'proj_h.weight': ((0,), (1,)), 'proj_h.bias': ((0,), ())}
    token_axes_w: TokenAxes = {'proj_w.weight': ((0,), (1,)), 'proj_w.bias': ((0,), ())}
    one_gemm_mixes: Final[bool]

    def __init__(self, dim: int, feat_size: Tuple[int, int], act_layer: Type[nn.Module] = nn.GELU,
                 one_gemm_mixes: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        self.feat_size = tuple(feat_size)
        self.one_gemm_mixes = one_gemm_mixes
        height, width = self.feat_size
        self.norm = nn.BatchNorm2d(dim, **dd)
        self.act = fresh_input_act(act_layer())  # applied to the fresh BatchNorm (or fused conv) output
        self.proj_h = TokenLinear(height, height, **dd)  # mixes along H
        self.proj_w = TokenLinear(width, width, **dd)  # mixes along W
        self.fuse_conv = nn.Conv2d(3 * dim, dim, kernel_size=1, bias=False, **dd)

    def set_feat_size(self, feat_size: Sequence[int]) -> None:
        """Resample ``proj_h`` along H and ``proj_w`` along W to an (H, W) map size, as the checkpoint loader does."""
        (old_h, old_w), (new_h, new_w) = self.feat_size, tuple(feat_size)
        resample_token_params_(self, self.token_axes_h, (old_h,), (new_h,))
        resample_token_params_(self, self.token_axes_w, (old_w,), (new_w,))
        self.feat_size = (new_h, new_w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.norm(x.contiguous(memory_format=torch.channels_last)))
        if self.one_gemm_mixes:
            return self.fuse_conv(self._one_gemm_mixes(x))
        x_h = self.proj_h(x.transpose(2, 3)).transpose(2, 3)  # the Linear sees (B, C, W, H): mixes along H
        x_w = self.proj_w(x)  # (B, C, H, W): mixes along W
        # a wrong-sized input fails in the axial Linears (RuntimeError); the models check sizes before
        return self.fuse_conv(torch.cat([x, x_h, x_w], dim=1))

    def _one_gemm_mixes(self, x: torch.Tensor) -> torch.Tensor:
        """concat[x, mix_H(x), mix_W(x)] (B, 3C, H, W), channels-last, each mix one GEMM (class docstring)."""
        xt = x.permute(2, 0, 1, 3).contiguous()  # (H, B, C, W)
        x_h = self.proj_h(xt.permute(1, 2, 3, 0))  # (B, C, W, H) view, H outermost in memory: W_h @ (H, B*C*W)
        x_w = self.proj_w(xt)  # (H, B, C, W), W innermost: (H*B*C, W) @ W_w^T
        # concatenated in the (B, H, W, C) view: the result is contiguous there, i.e. channels-last for the 1x1 conv
        parts = [x.permute(0, 2, 3, 1), x_h.permute(0, 3, 2, 1), x_w.permute(1, 0, 3, 2)]
        return torch.cat(parts, dim=3).permute(0, 3, 1, 2)


class SparseMLPTokenMixer(nn.Module):
    """sMLPNet token mixing: depthwise-conv branch (BN -> GELU -> DWConv 3x3) followed by :class:`AxialSparseMLP`
    (arXiv 2109.05422, Fig. 2: the DWConv and the sMLP share one residual connection).

    Shapes: x (B, C, H, W) -> (B, C, H, W) (channels-last memory).
    """

    def __init__(self, dim: int, feat_size: Tuple[int, int], act_layer: Type[nn.Module] = nn.GELU,
                 one_gemm_mixes: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        self.norm = nn.BatchNorm2d(dim, **dd)
        self.act = fresh_input_act(act_layer())
        self.conv_dw = nn.Conv2d(dim, dim, 3, padding=1, groups=dim, bias=False, **dd)
        self.smlp = AxialSparseMLP(dim, feat_size, act_layer=act_layer, one_gemm_mixes=one_gemm_mixes, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.norm(x.contiguous(memory_format=torch.channels_last)))
        return self.smlp(self.conv_dw(x))

    def reparameterize(self) -> None:
        """Inference fusion, once (``timm.utils.reparameterize_model`` calls it): the sMLP's BatchNorm, which
        directly follows the depthwise conv, folded into that conv with its running statistics (``conv_dw`` gets a
        bias, ``smlp.norm`` becomes ``nn.Identity``): the eval-mode function up to float rounding, one pass over the
        map less per block. For eval only (nothing normalises with batch statistics afterwards). A no-op unless the
        modules are a plain conv followed by a BatchNorm with running statistics."""
        conv, bn = self.conv_dw, self.smlp.norm
        if type(conv) is not nn.Conv2d or type(bn) is not nn.BatchNorm2d or bn.running_var is None:
            return
        # eval() on modules about to be replaced: fuse_conv_bn_eval folds the running statistics, in either mode
        self.conv_dw = fuse_conv_bn_eval(conv.eval(), bn.eval()).train(self.training)
        self.smlp.norm = nn.Identity()  # smlp.act may stay in place: its input is now the fresh conv output


class SparseMLPBlock(nn.Module):
    """sMLPNet block: ``x = x + DropPath(TokenMixer(x))``; ``x = x + DropPath(MLP(LayerNorm_C(x)))``
    (arXiv 2109.05422, §3.1, Fig. 2); the channel MLP is timm's ``Mlp`` on the contiguous (B, H, W, C) view.

    Shapes: x (B, C, H, W) -> (B, C, H, W) (channels-last memory) with (H, W) == feat_size.
    """

    def __init__(self, dim: int, feat_size: Tuple[int, int], mlp_ratio: float = 3.,
                 norm_layer: Type[nn.Module] = nn.LayerNorm, act_layer: Type[nn.Module] = nn.GELU,
                 proj_drop: float = 0., drop_path: float = 0., one_gemm_mixes: bool = False, device=None,
                 dtype=None) -> None:
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        self.token_mixer = SparseMLPTokenMixer(dim, feat_size, act_layer=act_layer, one_gemm_mixes=one_gemm_mixes, **dd)
        self.norm = norm_layer(dim, **dd)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=proj_drop, **dd)
        self.mlp.act = fresh_input_act(self.mlp.act)  # applied to the fresh fc1 output only
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous(memory_format=torch.channels_last)
        x = x + self.drop_path(self.token_mixer(x))
        y = self.mlp(self.norm(x.permute(0, 2, 3, 1)))  # (B, H, W, C), contiguous
        return x + self.drop_path(y.permute(0, 3, 1, 2))
