""" MLP-Mixer block: token-mixing MLP across the token axis, then channel MLP.

Paper: `MLP-Mixer: An all-MLP Architecture for Vision` - https://arxiv.org/abs/2105.01601
timm's ``MixerBlock`` with token padding and copy-free token Linears, so timm's checkpoints load as-is.
"""
from functools import partial
from typing import Sequence, Tuple, Type, Union

import torch.nn as nn
from timm.layers import Mlp
from timm.models.mlp_mixer import MixerBlock as TimmMixerBlock

from .activations import fresh_input_act
from .linear import TokenLinear
from .resample import TokenAxes, resample_token_params_

__all__ = ['MixerBlock']


class MixerBlock(TimmMixerBlock):
    """timm's Mixer block (arXiv 2105.01601, §2, eq. 1: ``x = x + DropPath(TokenMLP(norm1(x)^T)^T)``, then
    ``x = x + DropPath(ChannelMLP(norm2(x)))``; same modules and forward) whose token MLP, when ``mlp_layer`` is
    timm's ``Mlp``, has :class:`~mlp_vision.layers.TokenLinear` Linears (same parameters): they mix the n axis of the
    transposed view in place, as one batched GEMM, and carry the token padding (a custom ``mlp_layer`` keeps its
    plain, unpadded Linears).

    Args (beyond timm's): token_multiple: on CUDA, the token MLP's Linears contract their token axes zero-padded to
    this multiple (default 8: Mixer-B/16's 196 patches become 200; exact, why in :mod:`mlp_vision.layers.linear`);
    other devices never pad; 1 = no padding.

    Shapes: x (B, n, dim) -> (B, n, dim).
    """
    # the token MLP's tensors: token axes (output, contracted) resampled for another grid (layers.resample)
    token_axes: TokenAxes = {
        'mlp_tokens.fc1.weight': ((), (1,)),  # (tokens_dim, n): n is summed over
        'mlp_tokens.fc2.weight': ((0,), ()),  # (n, tokens_dim): n are outputs
        'mlp_tokens.fc2.bias': ((0,), ()),
    }

    def __init__(self, dim: int, seq_len: int, mlp_ratio: Union[float, Tuple[float, float]] = (0.5, 4.0),
                 mlp_layer: Type[nn.Module] = Mlp, norm_layer: Type[nn.Module] = partial(nn.LayerNorm, eps=1e-6),
                 act_layer: Type[nn.Module] = nn.GELU, drop: float = 0., drop_path: float = 0., token_multiple: int = 8,
                 device=None, dtype=None) -> None:
        dd = {'device': device, 'dtype': dtype}
        super().__init__(dim, seq_len, mlp_ratio=mlp_ratio, mlp_layer=mlp_layer, norm_layer=norm_layer,
                         act_layer=act_layer, drop=drop, drop_path=drop_path, **dd)
        if mlp_layer is Mlp:
            # timm's Mlp: fc1 -> act -> drop1 -> norm -> fc2 -> drop2; its act only ever sees fresh fc1 outputs
            tokens_dim = self.mlp_tokens.fc1.out_features
            self.mlp_tokens.fc1 = TokenLinear(seq_len, tokens_dim, token_multiple=token_multiple, **dd)
            self.mlp_tokens.fc2 = TokenLinear(tokens_dim, seq_len, token_multiple=token_multiple, **dd)
            self.mlp_tokens.act = fresh_input_act(self.mlp_tokens.act)
            self.mlp_channels.act = fresh_input_act(self.mlp_channels.act)

    def set_token_grid(self, old_grid: Sequence[int], new_grid: Sequence[int]) -> None:
        """Resample the token MLP from an (h, w) patch grid to another, as the checkpoint loaders do."""
        resample_token_params_(self, self.token_axes, old_grid, new_grid)
