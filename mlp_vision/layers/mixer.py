""" MLP-Mixer block: token-mixing MLP across the token axis, then channel MLP.

Paper: `MLP-Mixer: An all-MLP Architecture for Vision` - https://arxiv.org/abs/2105.01601
Parameter names follow timm's ``MixerBlock`` (norm1, mlp_tokens, norm2, mlp_channels) so its checkpoints load as-is.
"""
from functools import partial
from typing import Tuple, Type, Union

import torch
import torch.nn as nn
from timm.layers import DropPath, Mlp, to_2tuple

from .activations import fresh_input_act
from .gating import channel_linear

__all__ = ['MixerBlock']


class MixerBlock(nn.Module):
    """Residual token-mixing + channel-mixing block.

    ``x = x + DropPath(TokenMLP(norm1(x)^T)^T)``; ``x = x + DropPath(ChannelMLP(norm2(x)))``.
    The token MLP maps seq_len -> tokens_dim -> seq_len (GELU), the channel MLP dim -> channels_dim -> dim.

    Args:
        dim: token width d.
        seq_len: number of tokens n.
        mlp_ratio: (tokens_dim / d, channels_dim / d); Mixer uses (0.5, 4.0).

    How it is computed (same function and parameters as timm's block): the token MLP runs as batched matmuls
    ``(tokens_dim, n) @ (B, n, dim)`` with the biases as baddbmm's broadcast input, instead of Linear layers on
    transposed copies; the channel MLP's GEMMs run through oneDNN (:func:`~mlp_vision.layers.gating.channel_linear`).
    A ``mlp_layer`` other than timm's plain ``Mlp`` runs the straightforward way.

    Shapes: x (B, n, dim) -> (B, n, dim).
    """

    def __init__(
            self,
            dim: int,
            seq_len: int,
            mlp_ratio: Union[float, Tuple[float, float]] = (0.5, 4.0),
            mlp_layer: Type[nn.Module] = Mlp,
            norm_layer: Type[nn.Module] = partial(nn.LayerNorm, eps=1e-6),
            act_layer: Type[nn.Module] = nn.GELU,
            drop: float = 0.,
            drop_path: float = 0.,
            device=None,
            dtype=None,
    ) -> None:
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        tokens_dim, channels_dim = [int(r * dim) for r in to_2tuple(mlp_ratio)]
        self.norm1 = norm_layer(dim, **dd)
        self.mlp_tokens = mlp_layer(seq_len, tokens_dim, act_layer=act_layer, drop=drop, **dd)
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = norm_layer(dim, **dd)
        self.mlp_channels = mlp_layer(dim, channels_dim, act_layer=act_layer, drop=drop, **dd)
        # the fast path knows timm's Mlp (fc1 -> act -> drop1 -> norm -> fc2 -> drop2) without a hidden norm
        self.fast = bool(mlp_layer is Mlp and isinstance(self.mlp_tokens.norm, nn.Identity)
                         and isinstance(self.mlp_channels.norm, nn.Identity))
        if mlp_layer is Mlp:  # timm's Mlp applies act to its fc1 output only, as does the fast path
            self.mlp_tokens.act = fresh_input_act(self.mlp_tokens.act)
            self.mlp_channels.act = fresh_input_act(self.mlp_channels.act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fast:
            x = x + self.drop_path(self.mlp_tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2))
            x = x + self.drop_path(self.mlp_channels(self.norm2(x)))
            return x
        # token MLP, mixing along n: (tokens_dim, n) @ (B, n, dim) -> (B, tokens_dim, dim), then back to n
        mlp = self.mlp_tokens
        y = self.norm1(x)
        batch = y.shape[0]
        y = torch.baddbmm(mlp.fc1.bias.unsqueeze(-1), mlp.fc1.weight.expand(batch, -1, -1), y)
        y = mlp.drop1(mlp.act(y))
        y = torch.baddbmm(mlp.fc2.bias.unsqueeze(-1), mlp.fc2.weight.expand(batch, -1, -1), y)
        x = x + self.drop_path(mlp.drop2(y))
        # channel MLP
        mlp = self.mlp_channels
        y = mlp.drop1(mlp.act(channel_linear(self.norm2(x), mlp.fc1.weight, mlp.fc1.bias)))
        y = mlp.drop2(channel_linear(y, mlp.fc2.weight, mlp.fc2.bias))
        return x + self.drop_path(y)
