""" Char-level GPT with MLP-Attention (paper 003) and the same GPT with dot-product attention (its baseline).

Paper: Morsali et al., `MLP-Attention: Improving Transformer Architecture with MLP Attention Weights`
(ICLR 2023 Tiny Papers), §2 "Methodology" and Appendix A.1. Reference code: github.com/AlirezaMorsali/MLP-Attention
(nanoGPT-style).

MLP-Attention, per head h: ``logits_h = ReLU(X W1_h + b1_h) W2_h`` with W2_h: d_hidden x T_max (no bias), so
row t holds logits over key positions 0..T_max-1; only the first T columns are computed for a length-T input,
then causal mask, softmax, dropout, times ``V_h = X Wv_h``; heads are concatenated and projected d -> d.
The reference code applies the (T_max, T_max) mask to (T, T_max) logits and so crashes for T < T_max; here
every length 1..T_max works and ``generate`` runs from a 1-token prompt.

GPT (both variants): token + learned position embedding -> n_layer pre-LN blocks
``x + Attn(LN(x))``, ``x + FFN(LN(x))`` (FFN d -> 4d -> d, ReLU) -> final LN -> LM head (untied, with bias).
The dot-product baseline uses :class:`timm.layers.Attention` (fused SDPA, ``is_causal=True``; q/k/v without
bias, projection with bias, as the reference) and both variants use :class:`timm.layers.Mlp` for the FFN.

Parameter counts at the paper's settings: 5,468,993 (dot-product, paper "5.5 million") and 6,061,121
(MLP-Attention, "6 million"), the counts the reference code records; derivation in docs/models.md §5.
"""
from typing import Literal, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import Attention, Mlp
from transformers import initialization as init
from transformers.loss.loss_utils import ForCausalLMLoss
from transformers.modeling_outputs import CausalLMOutput
from transformers.utils import can_return_tuple

from .modeling_utils import TextConfig, TextGenerationMixin, TextPreTrainedModel, check_text_inputs

__all__ = ['GPTConfig', 'MLPAttention', 'GPTBlock', 'GPTLanguageModel']


class GPTConfig(TextConfig):
    """Configuration of the char-level GPT (defaults: the MLP-Attention paper's Tiny Shakespeare setup, §3: 65
    characters, dropout 0.2); the shared fields: :class:`~mlp_vision.text.modeling_utils.TextConfig`.

    Attributes:
        max_position_embeddings: T_max (position embeddings and MLP-attention logits are this long).
        intermediate_size: FFN hidden width (None: 4 d, as the reference).
        attention: 'mlp' (MLP-Attention) | 'sdpa' (scaled dot-product attention baseline).
        mlp_attention_hidden_size: hidden width of each head's logit MLP (MLP-Attention only).
        hidden_dropout_prob: residual and FFN dropout.
    """
    vocab_size: int = 65
    max_position_embeddings: int = 256
    num_hidden_layers: int = 3
    num_attention_heads: int = 3
    hidden_size: int = 384
    intermediate_size: Optional[int] = None
    attention: Literal['mlp', 'sdpa'] = 'mlp'
    mlp_attention_hidden_size: int = 256
    hidden_dropout_prob: float = 0.2
    attention_probs_dropout_prob: float = 0.2
    initializer_range: float = 0.02

    model_type = 'mlp_vision_gpt'  # config.json's key for transformers' AutoConfig

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size


class MLPAttention(nn.Module):
    """Causal multi-head MLP-Attention: each of the ``num_heads`` H heads computes its attention logits with an MLP
    (hidden width ``hidden_dim``) of the input, one logit per key position 0..``seq_len`` - 1 (T_max, the config's
    ``max_position_embeddings``).

    Parameters: ``fc1`` (d -> H * hidden, with bias: the H first layers side by side), ``fc2_weight``
    (H, hidden, T_max: the H second layers, no bias), ``value`` (d -> d, no bias: the H value maps side by side),
    ``proj`` (d -> d). Same count as H separate per-head modules of the reference.

    Shapes: x (B, T, d) with 1 <= T <= T_max -> (B, T, d). Row t attends to keys 0..t only.
    """

    def __init__(self, dim: int, num_heads: int, seq_len: int, hidden_dim: int = 256, attn_drop: float = 0.,
                 proj_drop: float = 0., device=None, dtype=None) -> None:
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        if dim % num_heads:
            raise ValueError(f'dim {dim} not divisible by num_heads {num_heads}')
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.hidden_dim = hidden_dim
        self.seq_len = seq_len
        self.fc1 = nn.Linear(dim, num_heads * hidden_dim, **dd)
        self.fc2_weight = nn.Parameter(torch.empty(num_heads, hidden_dim, seq_len, **dd))
        self.value = nn.Linear(dim, dim, bias=False, **dd)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        self.register_buffer(
            'causal_mask', torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril(), persistent=False)
        self.init_weights()

    def init_weights(self, std: float = 0.02) -> None:
        """fc2 as the reference's bias-free Linear under nanoGPT init: N(0, std)."""
        nn.init.normal_(self.fc2_weight, std=std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        if not 1 <= T <= self.seq_len:
            raise ValueError(f'sequence length {T} outside [1, {self.seq_len}] (max_position_embeddings)')
        h = F.relu(self.fc1(x)).view(B, T, self.num_heads, self.hidden_dim).transpose(1, 2)  # (B, H, T, hidden)
        logits = h @ self.fc2_weight[:, :, :T]  # (B, H, T, hidden) @ (H, hidden, T) -> (B, H, T, T)
        attn = self.attn_drop(logits.masked_fill(~self.causal_mask[:T, :T], float('-inf')).softmax(dim=-1))
        v = self.value(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, hs)
        out = (attn @ v).transpose(1, 2).reshape(B, T, C)
        return self.proj_drop(self.proj(out))

    def extra_repr(self) -> str:
        return f'num_heads={self.num_heads}, hidden_dim={self.hidden_dim}, seq_len={self.seq_len}'


class _CausalSDPA(Attention):
    """:class:`timm.layers.Attention` called with ``is_causal=True`` (so the block can call ``attn(x)``)."""

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = True):
        return super().forward(x, attn_mask=attn_mask, is_causal=is_causal)


class GPTBlock(nn.Module):
    """Pre-LN GPT block: ``x = x + attn(ln1(x)); x = x + ffn(ln2(x))``, ``attn`` :class:`MLPAttention` or causal
    :class:`timm.layers.Attention` (``config.attention``), ``ffn`` :class:`timm.layers.Mlp` (ReLU, dropout after
    fc2). Shapes: x (B, T, d) -> (B, T, d)."""

    def __init__(self, config: GPTConfig, device=None, dtype=None) -> None:
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        c = config
        self.ln1 = nn.LayerNorm(c.hidden_size, **dd)
        if c.attention == 'mlp':
            self.attn = MLPAttention(
                c.hidden_size, c.num_attention_heads, c.max_position_embeddings, c.mlp_attention_hidden_size,
                attn_drop=c.attention_probs_dropout_prob, proj_drop=c.hidden_dropout_prob, **dd)
        else:
            self.attn = _CausalSDPA(
                c.hidden_size, num_heads=c.num_attention_heads, qkv_bias=False, proj_bias=True,
                attn_drop=c.attention_probs_dropout_prob, proj_drop=c.hidden_dropout_prob, **dd)
        self.ln2 = nn.LayerNorm(c.hidden_size, **dd)
        self.ffn = Mlp(c.hidden_size, c.intermediate_size, act_layer=nn.ReLU, drop=(0., c.hidden_dropout_prob), **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class GPTLanguageModel(TextGenerationMixin, TextPreTrainedModel):
    """Char-level GPT LM with MLP-Attention or dot-product attention; ``generate``
    (:class:`~mlp_vision.text.modeling_utils.TextGenerationMixin`) crops the context to the last
    ``max_position_embeddings`` tokens.

    Shapes: input_ids (B, T) int64, 1 <= T <= max_position_embeddings; attention_mask optional (B, T), right padding
    (causal attention never lets a real token see a later pad); labels optional (B, T) int64, ``labels = input_ids``
    (shifted inside, -100 = not scored) -> ``CausalLMOutput(loss, logits (B, T, vocab_size))``.
    """
    config_class = GPTConfig
    base_model_prefix = 'gpt'  # no separate backbone module: every weight is this class's
    _input_embed_layer = 'tok_emb'

    def __init__(self, config: GPTConfig, device=None, dtype=None) -> None:
        super().__init__(config)
        dd = {'device': device, 'dtype': dtype}
        self.tok_emb = nn.Embedding(config.vocab_size, config.hidden_size, **dd)
        self.pos_emb = nn.Embedding(config.max_position_embeddings, config.hidden_size, **dd)
        self.blocks = nn.ModuleList([GPTBlock(config, **dd) for _ in range(config.num_hidden_layers)])
        self.ln_f = nn.LayerNorm(config.hidden_size, **dd)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, **dd)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        """``transformers``' init (Linear / Embedding ~ N(0, ``initializer_range``), biases 0: nanoGPT's) and the
        MLP-Attention heads' second layers with the same std (:meth:`MLPAttention.init_weights`) and causal mask
        (not saved)."""
        super()._init_weights(module)
        if isinstance(module, MLPAttention):
            init.normal_(module.fc2_weight, std=self.config.initializer_range)
            init.copy_(module.causal_mask, torch.ones_like(module.causal_mask).tril())

    @can_return_tuple
    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, labels: Optional[torch.Tensor] = None, **kwargs):
        self.check_forward_kwargs(kwargs)
        check_text_inputs(input_ids, attention_mask, self.config.max_position_embeddings)  # right padding only
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.tok_emb(input_ids) + self.pos_emb(pos)  # no embedding dropout, as the reference
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None if labels is None else ForCausalLMLoss(logits, labels, self.config.vocab_size)
        return CausalLMOutput(loss=loss, logits=logits)
