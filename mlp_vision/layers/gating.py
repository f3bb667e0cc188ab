""" Spatial Gating Unit, tiny attention and the gMLP block.

One implementation, shared by the vision models (dense spatial weights over image patches) and the text
models (Toeplitz weights for masked LM, causal weights for autoregressive LM).

Paper: `Pay Attention to MLPs` - https://arxiv.org/abs/2105.08050 (eq. 1-4, Fig. 1, Fig. 6)
"""
from functools import partial
from typing import Optional, Sequence, Type

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.jit import Final
from timm.layers import DropPath

from .activations import fresh_input_act
from .linear import SplitLinear, aligned_rows, check_token_multiple, token_matmul, token_multiple_on
from .resample import TokenAxes, resample_token_params_

__all__ = ['SPATIAL_MODES', 'SpatialGatingUnit', 'TinyAttention', 'GatedMLPBlock']

SPATIAL_MODES = ('dense', 'toeplitz', 'causal')


class SpatialGatingUnit(nn.Module):
    """Spatial Gating Unit: ``s(Z) = Z1 * (W · norm(Z2) + b [+ res])``: the first channel half ``Z1`` is the
    multiplicative bypass, the second ``Z2`` is normalised and projected along the token axis by ``W`` (n x n), ``b``.

    ``spatial_mode``: ``'dense'`` (a full (n, n) ``W``, vision), ``'toeplitz'`` (``W[i, j] = w[i - j + n - 1]``,
    2n - 1 parameters, masked LM, paper §4) or ``'causal'`` (dense ``W`` masked to ``j <= i``, causal LM). Inputs
    shorter than ``seq_len`` use the leading L x L block of ``W`` and the first L entries of ``b`` (again Toeplitz,
    again causal).

    Token padding (``token_multiple``, read at each call; 1 = none), on CUDA only: ``W · norm(Z2)`` (paper eq. 2)
    contracts the token axis zero-padded up to a multiple (why: :mod:`mlp_vision.layers.linear`): the same outputs.

    Token-major layout (``token_major=True``): the activations come as (L, B, dim), so the token mix is one GEMM
    ``W (L, L) @ norm(Z2) (L, B * dim / 2)`` with the bias in it (``addmm``); on CUDA only ``W`` is held at an
    aligned row stride (:func:`~mlp_vision.layers.linear.aligned_rows`). Same parameters, same values.

    Halves apart (``gate`` given): ``x`` is then ``Z1`` alone and ``gate`` is ``Z2`` (e.g. the two outputs of
    :class:`~mlp_vision.layers.linear.SplitLinear`), so no pass splits the channels.

    Init: ``W`` ~ N(0, init_std = 1e-6) and ``b = 1``, so the block starts as a plain FFN; ``W`` and ``b``
    are raw parameters, untouched by model-level ``Linear`` initialisers (models call :meth:`init_weights` last).

    Shapes: x (B, L, dim) with L <= seq_len -> (B, L, dim // 2) ((L, B, ...) for every tensor when token-major, the
    mask excepted); with ``gate``: x and gate (B, L, dim // 2) each; res: optional (B, L, dim // 2) added after the
    projection (aMLP's tiny attention); mask: optional (B, L) padding mask (True = real token) zeroing the padded
    tokens' normalised gate values before the projection (the paper does not mask, nor does the unit without it).
    """
    token_major: Final[bool]

    init_std = 1e-6

    def __init__(self, dim: int, seq_len: int, spatial_mode: str = 'dense', token_multiple: int = 8,
                 token_major: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        check_token_multiple(token_multiple)
        if spatial_mode not in SPATIAL_MODES:
            raise ValueError(f'spatial_mode must be one of {SPATIAL_MODES}, got {spatial_mode!r}')
        if dim % 2:
            raise ValueError(f'SpatialGatingUnit splits its input channels in two halves; dim must be even, got {dim}')
        self.dim = dim
        self.seq_len = seq_len
        self.spatial_mode = spatial_mode
        self.causal = spatial_mode == 'causal'
        self.token_multiple = token_multiple
        self.token_major = token_major

        self.norm = nn.LayerNorm(dim // 2, **dd)
        if spatial_mode == 'toeplitz':
            self.weight = nn.Parameter(torch.empty(2 * seq_len - 1, **dd))
            # index[i, j] = i - j + n - 1 picks w for W[i, j]; its leading L x L block is the index for length L
            idx = torch.arange(seq_len, device=device)
            self.register_buffer('toeplitz_index', idx[:, None] - idx[None, :] + seq_len - 1, persistent=False)
        else:
            self.weight = nn.Parameter(torch.empty(seq_len, seq_len, **dd))
            self.toeplitz_index = None
        self.bias = nn.Parameter(torch.empty(seq_len, **dd))
        self.init_weights()

    def init_weights(self) -> None:
        # W ~ 0, b = 1: the block starts as an FFN (paper §2, "important to initialize W close to zero")
        nn.init.normal_(self.weight, std=self.init_std)
        nn.init.ones_(self.bias)

    def spatial_weight(self, length: int) -> torch.Tensor:
        """The (length, length) token-mixing matrix actually applied (Toeplitz expanded, causal masked)."""
        if self.toeplitz_index is not None:
            w = self.weight[self.toeplitz_index[:length, :length]]
        else:
            w = self.weight[:length, :length]
        if self.causal:
            w = torch.tril(w)
        return w

    def forward(self, x: torch.Tensor, res: Optional[torch.Tensor] = None, mask: Optional[torch.Tensor] = None,
                gate: Optional[torch.Tensor] = None) -> torch.Tensor:
        if gate is None:
            u, v = x.chunk(2, dim=-1)
        else:
            u, v = x, gate
        length = v.shape[0] if self.token_major else v.shape[-2]
        v = self.norm(v)
        if mask is not None:
            v = v * (mask.t() if self.token_major else mask).unsqueeze(-1).to(v.dtype)
        token_multiple = token_multiple_on(v.device, self.token_multiple)
        bias = self.bias[:length].unsqueeze(-1)
        if self.token_major:  # one GEMM (L, L) @ (L, B * C), the bias in it
            weight = aligned_rows(self.spatial_weight(length), token_multiple)
            v = torch.addmm(bias, weight, v.reshape(length, -1)).view(v.shape)
        else:  # (L, L) @ (B, L, C) on the token axis, without transposing the activations; the add in place
            v = token_matmul(self.spatial_weight(length), v, token_multiple).add_(bias)
        if res is not None:
            v = v + res
        return u * v

    def extra_repr(self) -> str:
        return (f'dim={self.dim}, seq_len={self.seq_len}, spatial_mode={self.spatial_mode}, '
                f'token_multiple={self.token_multiple}, token_major={self.token_major}')


class TinyAttention(nn.Module):
    """Single-head "tiny" attention of aMLP (paper Fig. 6): ``out = softmax(q k^T / sqrt(attn_dim)) v W_o`` with
    ``q, k, v = x W_qkv`` (dim -> 3 * attn_dim, attn_dim -> out_dim), by ``F.scaled_dot_product_attention``.

    Shapes: x (B, L, dim) -> (B, L, out_dim); mask: optional (B, L) bool, True for real tokens (padded keys get no
    weight; an all-padding sequence attends to every position instead of producing NaN).
    """

    def __init__(self, dim: int, attn_dim: int = 64, out_dim: Optional[int] = None, causal: bool = False,
                 device=None, dtype=None) -> None:
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        out_dim = out_dim or dim
        self.attn_dim = attn_dim
        self.causal = causal
        self.qkv = nn.Linear(dim, 3 * attn_dim, **dd)
        self.proj = nn.Linear(attn_dim, out_dim, **dd)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        attn_mask: Optional[torch.Tensor] = None
        is_causal = self.causal
        if mask is not None:
            keep = mask.to(torch.bool)
            keep = keep | ~keep.any(dim=-1, keepdim=True)  # softmax over an empty set is undefined
            attn_mask = keep.unsqueeze(-2)  # (B, 1, L): every query ignores padded keys
            if self.causal:
                length = x.shape[-2]
                attn_mask = attn_mask & torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
                is_causal = False  # SDPA takes either a mask or is_causal, not both
        return self.proj(F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal))


class GatedMLPBlock(nn.Module):
    """gMLP block (aMLP when ``attn_dim > 0``).

    ``y = x + DropPath(fc2(SGU(GELU(fc1(norm(x))), res=TinyAttention(norm(x)))))``

    Args:
        dim: token width d.
        seq_len: number of tokens n (the maximum length for text).
        mlp_ratio: d_ffn / d; fc1 maps d -> d_ffn, the SGU halves it, fc2 maps d_ffn / 2 -> d.
        spatial_mode: SGU weight variant, 'dense' | 'toeplitz' | 'causal'.
        attn_dim: size of the tiny attention head (0 = plain gMLP). Its attention is causal when the SGU is.
        hidden_dim: d_ffn given directly (overrides ``mlp_ratio``; avoids rounding of non-integer ratios).
        sgu_mask: also pass the padding mask to the SGU (off by default, as the paper).
        token_multiple: the SGU's token padding multiple on CUDA (:class:`SpatialGatingUnit`); 1 = no padding.
        split_fc1: fc1 is a :class:`~mlp_vision.layers.linear.SplitLinear` whose two halves go to the SGU as
            separate tensors: no pass splits the channels, nor concatenates their gradients. LoRA cannot wrap it.
        token_major: the block works on the (L, B, dim) transpose of its input (a view) and returns the (B, L, dim)
            view of its (L, B, dim) result, so a stack of such blocks keeps the activations token-major without
            copies and the SGU's token mix is one GEMM (:class:`SpatialGatingUnit`). Not with ``attn_dim > 0``.

    Every option computes the same function with the same parameters and state dict (a checkpoint loads into each).

    Shapes: x (B, L, dim) -> (B, L, dim) (any strides; a token-major block returns a token-major view); mask:
    optional (B, L) bool padding mask (True = real token) for the tiny attention (and the SGU with ``sgu_mask``;
    without it the SGU mixes pads too, as the paper's models do).
    """
    # the SGU's dense W (n, n) and b (n): token axes (output, contracted) resampled for another grid (layers.resample)
    token_axes: TokenAxes = {
        'sgu.weight': ((0,), (1,)),  # W[i, j]: token j -> token i
        'sgu.bias': ((0,), ()),
    }
    split_fc1: Final[bool]
    token_major: Final[bool]

    def __init__(
            self,
            dim: int,
            seq_len: int,
            mlp_ratio: float = 6.,
            spatial_mode: str = 'dense',
            attn_dim: int = 0,
            hidden_dim: Optional[int] = None,
            sgu_mask: bool = False,
            norm_layer: Type[nn.Module] = partial(nn.LayerNorm, eps=1e-6),
            act_layer: Type[nn.Module] = nn.GELU,
            drop: float = 0.,
            drop_path: float = 0.,
            token_multiple: int = 8,
            split_fc1: bool = False,
            token_major: bool = False,
            device=None,
            dtype=None,
    ) -> None:
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        hidden_dim = hidden_dim or int(dim * mlp_ratio)
        if token_major and attn_dim > 0:
            raise ValueError(f'token_major=True is for the plain gMLP block; the tiny attention (attn_dim={attn_dim}) '
                             f'works batch-major: use token_major=False')
        self.sgu_mask = sgu_mask
        self.split_fc1 = split_fc1
        self.token_major = token_major
        self.norm = norm_layer(dim, **dd)
        self.fc1 = (SplitLinear if split_fc1 else nn.Linear)(dim, hidden_dim, **dd)
        self.act = fresh_input_act(act_layer())  # applied to fresh fc1 outputs only
        causal = spatial_mode == 'causal'
        self.attn = TinyAttention(dim, attn_dim, out_dim=hidden_dim // 2, causal=causal, **dd) if attn_dim > 0 else None
        self.sgu = SpatialGatingUnit(hidden_dim, seq_len, spatial_mode=spatial_mode, token_multiple=token_multiple,
                                     token_major=token_major, **dd)
        self.drop = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_dim // 2, dim, **dd)
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()

    def set_token_grid(self, old_grid: Sequence[int], new_grid: Sequence[int]) -> None:
        """Resample the SGU's dense W and b from an (h, w) patch grid to another, as the checkpoint loaders do."""
        if self.sgu.spatial_mode != 'dense':
            raise ValueError(f'only a dense SGU is resampled to another token grid, this one is '
                             f'{self.sgu.spatial_mode!r}')
        resample_token_params_(self, self.token_axes, old_grid, new_grid)
        self.sgu.seq_len = self.sgu.bias.shape[0]

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        shortcut = x
        if self.token_major:
            x = x.transpose(0, 1)  # (L, B, dim)
        x = self.norm(x)
        res: Optional[torch.Tensor] = None
        if self.attn is not None:
            res = self.attn(x, mask)
        sgu_mask = mask if self.sgu_mask else None
        if self.split_fc1:
            u, v = self.fc1(x)
            x = self.sgu(self.act(u), res, sgu_mask, gate=self.act(v))
        else:
            x = self.sgu(self.act(self.fc1(x)), res, sgu_mask)
        x = self.fc2(self.drop(x))
        if self.token_major:
            # the (B, L, dim) view first (DropPath drops samples along dim 0): the sum takes the first operand's
            # layout, so it stays token-major and the next block's transpose is contiguous
            return self.drop_path(x.transpose(0, 1)) + shortcut
        return shortcut + self.drop_path(x)
