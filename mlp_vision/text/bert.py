""" BERT (dot-product attention) baselines of the BiGS comparison: FLOP counts and speed.

BiGS replaces each BERT layer -- self-attention plus feed-forward -- by one gated SSM layer (SPEC §1.4), and the
BiGS paper (Table 6) compares its FLOPs with BERT-large's. :class:`BertLayer` is that BERT layer, written the
way a user would write it today: ``nn.Linear`` projections and ``F.scaled_dot_product_attention`` (PyTorch's
fused flash / memory-efficient kernels), post-LayerNorm as BERT. ``benchmark.py`` times it against the BiGS
layer (``bert_layer`` vs ``bigs_layer``), and :mod:`mlp_vision.complexity` counts :class:`BertForMaskedLMBaseline`
(BERT-large: 24 layers, d 1024, 16 heads, FFN 4096) -- fvcore sees the fused attention through the project's
``aten::scaled_dot_product_attention`` handle (Q K^T and A V, full L x L scores).

Not part of the model registry: there are no BERT weights here and BERT is not what this package provides.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ['BertSelfAttention', 'BertLayer', 'BertEncoder', 'BertForMaskedLMBaseline']


class BertSelfAttention(nn.Module):
    """Multi-head self-attention, no dropout and no padding mask (a speed / FLOP baseline on full-length inputs).
    Shapes: x (B, L, d) -> (B, L, d)."""

    def __init__(self, dim: int, num_heads: int, device=None, dtype=None) -> None:
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        if dim % num_heads:
            raise ValueError(f'dim {dim} is not divisible by num_heads {num_heads}')
        self.num_heads = num_heads
        self.query = nn.Linear(dim, dim, **dd)
        self.key = nn.Linear(dim, dim, **dd)
        self.value = nn.Linear(dim, dim, **dd)
        self.out = nn.Linear(dim, dim, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = (p(x).view(b, n, self.num_heads, d // self.num_heads).transpose(1, 2)
                   for p in (self.query, self.key, self.value))  # (B, heads, L, head_dim)
        ctx = F.scaled_dot_product_attention(q, k, v)
        return self.out(ctx.transpose(1, 2).reshape(b, n, d))


class BertLayer(nn.Module):
    """Post-LN BERT layer: ``x = LN(x + Attn(x))``, ``x = LN(x + W_2 GELU(W_1 x))``. Shapes: (B, L, d) -> (B, L, d)."""

    def __init__(self, dim: int = 1024, num_heads: int = 16, ffn_dim: int = 4096, norm_eps: float = 1e-12,
                 device=None, dtype=None) -> None:
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        self.attn = BertSelfAttention(dim, num_heads, **dd)
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps, **dd)
        self.fc1 = nn.Linear(dim, ffn_dim, **dd)
        self.fc2 = nn.Linear(ffn_dim, dim, **dd)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.fc2(F.gelu(self.fc1(x))))


class BertEncoder(nn.Module):
    """Embeddings (word + absolute position + token type, LayerNorm) and ``depth`` :class:`BertLayer`.
    input_ids (B, L) -> (B, L, d)."""

    def __init__(self, vocab_size: int, max_len: int, type_vocab: int, dim: int, depth: int, num_heads: int,
                 ffn_dim: int, norm_eps: float, device=None, dtype=None) -> None:
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        self.word = nn.Embedding(vocab_size, dim, **dd)
        self.position = nn.Embedding(max_len, dim, **dd)
        self.token_type = nn.Embedding(type_vocab, dim, **dd)
        self.norm = nn.LayerNorm(dim, eps=norm_eps, **dd)
        self.layers = nn.ModuleList([BertLayer(dim, num_heads, ffn_dim, norm_eps, **dd) for _ in range(depth)])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        n = input_ids.shape[1]
        pos = torch.arange(n, device=input_ids.device)
        x = self.norm(self.word(input_ids) + self.position(pos) + self.token_type(torch.zeros_like(input_ids)))
        for layer in self.layers:
            x = layer(x)
        return x


class BertForMaskedLMBaseline(nn.Module):
    """BERT masked LM (defaults: BERT-large, 24 layers, d 1024, 16 heads, FFN 4096, vocab 30522, type vocab 2,
    ``max_len`` absolute positions) with the MLM head (dense + GELU + LN, decoder tied to the word embedding).
    ``.bert`` is the encoder. input_ids (B, L) -> logits (B, L, V)."""

    def __init__(self, max_len: int = 512, vocab_size: int = 30522, dim: int = 1024, depth: int = 24,
                 num_heads: int = 16, ffn_dim: int = 4096, norm_eps: float = 1e-12, device=None, dtype=None):
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        self.bert = BertEncoder(vocab_size, max_len, 2, dim, depth, num_heads, ffn_dim, norm_eps, **dd)
        self.transform = nn.Linear(dim, dim, **dd)
        self.transform_norm = nn.LayerNorm(dim, eps=norm_eps, **dd)
        self.output_bias = nn.Parameter(torch.zeros(vocab_size, **dd))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.transform_norm(F.gelu(self.transform(self.bert(input_ids))))
        return F.linear(h, self.bert.word.weight, self.output_bias)
