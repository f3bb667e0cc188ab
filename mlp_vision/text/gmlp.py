""" gMLP / aMLP text models: BERT-style masked-LM encoders (Toeplitz SGU) and a causal LM (causal SGU).

Paper: `Pay Attention to MLPs` - https://arxiv.org/abs/2105.08050 (§4, Tables 3-6, Fig. 6);
causal use of the block as in the annotated implementation (labml.ai, paper 001 of this project).

Every block is :class:`mlp_vision.layers.GatedMLPBlock` -- the class the vision gMLP uses -- so its Spatial
Gating Unit (:class:`~mlp_vision.layers.SpatialGatingUnit`) and tiny attention
(:class:`~mlp_vision.layers.TinyAttention`) are the shared ones too. Text only picks the spatial mode:
``'toeplitz'`` (W[i, j] = w[i - j + n - 1], 2n - 1 parameters; paper §4) for masked LM and ``'causal'`` (W
masked to j <= i) for autoregressive LM.

Model layout (``GMLPModel``)::

    input_ids (B, L) -> token embedding (V x d; no position embedding, paper §4: W carries position)
                     -> dropout -> L_blocks x GatedMLPBlock(d, n, d_ffn / d, spatial_mode, attn_dim)
                     -> final LayerNorm (the blocks are pre-norm) -> hidden states (B, L, d)

Heads: ``GMLPForMaskedLM`` (decoder tied to the token embedding + output bias), ``GMLPForSequenceClassification``
(linear classifier on the last-layer state of the ``<cls>`` token, paper §2 "Our model uses exactly the same
input and output protocols as BERT"), ``GMLPForCausalLM`` (causal SGU + LM head + ``generate``).

Parameter accounting (SPEC §2; the paper's counts are per-layer params x layers + 32,000 x d, rounded):
    per block = 2d (norm) + (d + 1) d_ffn (fc1) + d_ffn (SGU norm on d_ffn / 2 channels)
              + (2n - 1) + n (Toeplitz w, b) + (d_ffn / 2 + 1) d (fc2)
              [+ (d + 1) 3a + (a + 1) d_ffn / 2 for aMLP's tiny attention of size a]
    model     = blocks + V d (tied embedding = decoder) + 2d (final norm) + V (MLM output bias)
The final norm and output bias (33-34 K) are below the papers' rounding. A BERT-style MLM transform
(d x d dense + LayerNorm, 0.26-1.05 M) is *not* part of the model: with it gMLP-144L would count 357.6 M
(paper 357) and gMLP_xlarge 941.6 M (paper 941), so the papers' numbers exclude it.

    name              L    d    d_ffn  n    a    ours (M)   paper (M)
    gmlp_base         48   512  3072   512  -    130.106    130
    amlp_base         36   512  3072   512  64   108.824    109
    gmlp_large        96   768  3072   512  -    365.306    365
    amlp_large        72   768  3072   512  128  315.660    316
    gmlp_xlarge       144  1024 4096   512  -    940.615    941
    gmlp_18l_seq128   18   512  3072   128  -     59.029     59
    gmlp_36l_seq128   36   512  3072   128  -    101.642    102
    gmlp_72l_seq128   72   512  3072   128  -    186.867    187
    gmlp_144l_seq128  144  512  3072   128  -    357.317    357

Padding (``attention_mask``, (B, L), 1/True = real token):
    * Tiny attention (aMLP) honours it: no query attends to a padded key, so nothing reaches a real position
      through the attention from padded positions.
    * The SGU does **not** mask: its Toeplitz W mixes every position it is given, pads included, as in the
      paper ("we find it unnecessary to mask out <pad> tokens in gMLP blocks during finetuning as the model can
      quickly learn to ignore them", §4). Hence real-position outputs of gMLP/aMLP depend on how many pads
      follow and on what flows through the padded positions; with the BERT protocol (fixed pad id, pad to a
      fixed length) the function is deterministic and the model learns to ignore pads. Causal models are
      unaffected by trailing pads (a causal W never looks right).
"""
from dataclasses import dataclass
from functools import partial
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layers import GatedMLPBlock, SPATIAL_MODES
from .modeling_utils import GenerationMixin, PretrainedMixin, TextOutput, init_linear_embedding, lm_loss

__all__ = ['GMLPConfig', 'GMLPModel', 'GMLPForMaskedLM', 'GMLPForSequenceClassification', 'GMLPForCausalLM']


@dataclass
class GMLPConfig:
    """Configuration of the gMLP / aMLP text models.

    Attributes:
        vocab_size: V, token vocabulary (32,000 in the paper's BERT setup).
        max_seq_len: n, the SGU's spatial size; inputs may be shorter (W and b are sliced).
        dim: d_model.
        depth: number of gMLP blocks.
        ffn_dim: d_ffn (fc1 output; the SGU halves it). Must be a multiple of 2.
        attn_dim: tiny-attention head size a (0 = gMLP, > 0 = aMLP; 64 base, 128 large).
        spatial_mode: 'toeplitz' (masked LM) | 'causal' (autoregressive LM) | 'dense'.
        tie_word_embeddings: decoder weight = token embedding (masked LM: True, paper §4).
        dropout: dropout on the embeddings and inside each block (after the SGU).
        drop_path_rate: stochastic depth, ramped linearly from 0 at the first block to this at the last.
        norm_eps: epsilon of the block input LayerNorms and the final LayerNorm.
        init_std: std of the normal init of Linear / Embedding weights (SGU keeps W ~ 0, b = 1).
        cls_index: position whose last-layer state the sequence classifier reads (0: ``<cls>`` first, BERT).
            Token ids (``<pad>``, ``<cls>``, ...) belong to the tokenizer; the model masks by ``attention_mask``.
        num_labels: outputs of the sequence-classification head (1 = regression with MSE).
        classifier_dropout: dropout before the classifier.
    """
    vocab_size: int = 32000
    max_seq_len: int = 512
    dim: int = 512
    depth: int = 48
    ffn_dim: int = 3072
    attn_dim: int = 0
    spatial_mode: str = 'toeplitz'
    tie_word_embeddings: bool = True
    dropout: float = 0.0
    drop_path_rate: float = 0.0
    norm_eps: float = 1e-6
    init_std: float = 0.02
    cls_index: int = 0
    num_labels: int = 2
    classifier_dropout: float = 0.1

    def __post_init__(self):
        if self.spatial_mode not in SPATIAL_MODES:
            raise ValueError(f'spatial_mode must be one of {SPATIAL_MODES}, got {self.spatial_mode!r}')
        if self.ffn_dim % 2:
            raise ValueError(f'ffn_dim must be even (the SGU splits it in two), got {self.ffn_dim}')
        if not 0 <= self.cls_index < self.max_seq_len:
            raise ValueError(f'cls_index {self.cls_index} outside [0, {self.max_seq_len})')


class GMLPModel(PretrainedMixin, nn.Module):
    """gMLP / aMLP backbone: token embedding -> GatedMLPBlocks -> final LayerNorm.

    Shapes:
        input_ids: (B, L) int64 with 1 <= L <= max_seq_len.
        attention_mask: optional (B, L) bool/int, True/1 = real token; given to the tiny attention of aMLP
            blocks (see the module docstring for what the SGU does with pads).
        output: (B, L, dim) last-layer hidden states.
    """
    config_class = GMLPConfig

    def __init__(self, config: GMLPConfig, device=None, dtype=None):
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        self.config = config
        c = config
        self.embed = nn.Embedding(c.vocab_size, c.dim, **dd)
        self.drop = nn.Dropout(c.dropout)
        dpr = [c.drop_path_rate * i / max(c.depth - 1, 1) for i in range(c.depth)]
        self.blocks = nn.ModuleList([
            GatedMLPBlock(
                c.dim, c.max_seq_len,
                hidden_dim=c.ffn_dim,
                spatial_mode=c.spatial_mode,
                attn_dim=c.attn_dim,
                norm_layer=partial(nn.LayerNorm, eps=c.norm_eps),
                drop=c.dropout,
                drop_path=dpr[i],
                **dd,
            )
            for i in range(c.depth)
        ])
        self.norm = nn.LayerNorm(c.dim, eps=c.norm_eps, **dd)
        # Linear / Embedding only: the SGUs' raw W (~0) and b (=1) parameters are left as GatedMLPBlock made them
        self.apply(partial(init_linear_embedding, std=c.init_std))

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if input_ids.dim() != 2:
            raise ValueError(f'input_ids must be (B, L), got shape {tuple(input_ids.shape)}')
        length = input_ids.shape[1]
        if not 1 <= length <= self.config.max_seq_len:
            raise ValueError(f'sequence length {length} outside [1, {self.config.max_seq_len}] (max_seq_len)')
        mask = None
        if attention_mask is not None:
            if attention_mask.shape != input_ids.shape:
                raise ValueError(f'attention_mask shape {tuple(attention_mask.shape)} != input_ids shape '
                                 f'{tuple(input_ids.shape)}')
            mask = attention_mask.to(torch.bool)
        x = self.drop(self.embed(input_ids))
        for block in self.blocks:
            x = block(x, mask)
        return self.norm(x)


class GMLPForMaskedLM(PretrainedMixin, nn.Module):
    """gMLP / aMLP masked-LM: backbone + decoder tied to the token embedding + per-token output bias.

    Shapes:
        input_ids: (B, L); attention_mask: optional (B, L); labels: optional (B, L) int64 with -100 at
        positions that are not scored. Returns ``TextOutput(logits (B, L, V), loss)``.
    """
    config_class = GMLPConfig
    head_prefixes = ('decoder', 'output_bias')

    def __init__(self, config: GMLPConfig, device=None, dtype=None):
        super().__init__()
        self.config = config
        self.gmlp = GMLPModel(config, device=device, dtype=dtype)
        self.decoder = None if config.tie_word_embeddings else nn.Linear(
            config.dim, config.vocab_size, bias=False, device=device, dtype=dtype)
        if self.decoder is not None:
            init_linear_embedding(self.decoder, config.init_std)
        self.output_bias = nn.Parameter(torch.zeros(config.vocab_size, device=device, dtype=dtype))

    def output_weight(self) -> torch.Tensor:
        """(V, d) decoder weight: the token embedding when tied."""
        return self.gmlp.embed.weight if self.decoder is None else self.decoder.weight

    def forward(
            self,
            input_ids: torch.Tensor,
            attention_mask: Optional[torch.Tensor] = None,
            labels: Optional[torch.Tensor] = None,
    ) -> TextOutput:
        h = self.gmlp(input_ids, attention_mask)
        logits = F.linear(h, self.output_weight(), self.output_bias)
        return TextOutput(logits, lm_loss(logits, labels) if labels is not None else None)


class GMLPForSequenceClassification(PretrainedMixin, nn.Module):
    """Sequence classifier with the BERT ``<cls>`` protocol of the paper (§2, §4).

    The input is ``<cls> segment_a [<sep> segment_b <sep>] <pad>...``; the prediction is a linear map of the
    last-layer (final-LayerNorm) state at ``config.cls_index`` (0). There is no BERT "pooler" (tanh dense
    layer): that layer is trained by next-sentence prediction, which the paper's C4 MLM pretraining does not
    have. Load a masked-LM checkpoint with ``GMLPForSequenceClassification.from_pretrained(dir, num_labels=k)``:
    the backbone is loaded and the classifier is freshly initialised.

    Shapes:
        input_ids: (B, L); attention_mask: optional (B, L); labels: optional (B,) int64 class ids, or (B,)
        float targets when ``num_labels == 1`` (regression, MSE). Returns ``TextOutput(logits (B, num_labels),
        loss)``.
    """
    config_class = GMLPConfig
    head_prefixes = ('classifier',)

    def __init__(self, config: GMLPConfig, device=None, dtype=None):
        super().__init__()
        self.config = config
        self.gmlp = GMLPModel(config, device=device, dtype=dtype)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.dim, config.num_labels, device=device, dtype=dtype)
        init_linear_embedding(self.classifier, config.init_std)

    def forward(
            self,
            input_ids: torch.Tensor,
            attention_mask: Optional[torch.Tensor] = None,
            labels: Optional[torch.Tensor] = None,
    ) -> TextOutput:
        h = self.gmlp(input_ids, attention_mask)[:, self.config.cls_index]  # (B, d): the <cls> state
        logits = self.classifier(self.dropout(h))
        loss = None
        if labels is not None:
            if self.config.num_labels == 1:
                loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            else:
                loss = F.cross_entropy(logits.float(), labels)
        return TextOutput(logits, loss)


class GMLPForCausalLM(GenerationMixin, PretrainedMixin, nn.Module):
    """Autoregressive gMLP LM: causal SGU (W masked to j <= i), no position embeddings, LM head.

    As in the annotated implementation (labml.ai): token embedding -> gMLP blocks with a causal spatial mask ->
    final LayerNorm -> linear generator (untied by default there; ``tie_word_embeddings`` chooses). Unlike that
    implementation we add no sinusoidal position encoding: the causal W is position-indexed already (paper §2).
    Works for any length 1..max_seq_len, and ``generate`` crops longer contexts to the last ``max_seq_len``.

    Shapes:
        idx: (B, T) int64, 1 <= T <= max_seq_len; targets: optional (B, T) int64 next tokens (-100 = skip).
        Returns ``TextOutput(logits (B, T, V), loss)``.
    """
    config_class = GMLPConfig
    head_prefixes = ('lm_head', 'output_bias')

    def __init__(self, config: GMLPConfig, device=None, dtype=None):
        super().__init__()
        if config.spatial_mode != 'causal':
            raise ValueError(f"GMLPForCausalLM needs spatial_mode='causal', got {config.spatial_mode!r}")
        self.config = config
        self.max_seq_len = config.max_seq_len
        self.gmlp = GMLPModel(config, device=device, dtype=dtype)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(
            config.dim, config.vocab_size, bias=False, device=device, dtype=dtype)
        if self.lm_head is not None:
            init_linear_embedding(self.lm_head, config.init_std)
        self.output_bias = nn.Parameter(torch.zeros(config.vocab_size, device=device, dtype=dtype))

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None) -> TextOutput:
        h = self.gmlp(idx)
        weight = self.gmlp.embed.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(h, weight, self.output_bias)
        return TextOutput(logits, lm_loss(logits, targets) if targets is not None else None)
