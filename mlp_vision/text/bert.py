""" BERT: the attention baseline of the attention-free text models, built from the same pieces as BiGS.

Paper: Devlin et al., `BERT: Pre-training of Deep Bidirectional Transformers for Language Understanding` -
https://arxiv.org/abs/1810.04805 (§3: input representation, [CLS] classification, masked LM; §A.2 sizes). BiGS
(arXiv 2212.10544, §4 and Fig. 2) replaces each BERT layer -- self-attention plus feed-forward -- by one gated SSM
layer and keeps everything around it, so :class:`BertEmbeddings`, :class:`MaskedLMHeadTransform` and
:class:`PoolerTransform` here are the BiGS model's too (:mod:`mlp_vision.text.bigs`).

Model layout (``BertModel``)::

    input_ids (B, L), token_type_ids (B, L) -> word (V x d) + absolute position (P x d) + token type (T x d)
        -> LayerNorm -> dropout -> num_hidden_layers x BertLayer -> hidden states (B, L, d)
    BertLayer (post-LN):  x = LN(x + Dropout(Attn(x)));  x = LN(x + Dropout(W_2 GELU(W_1 x)))

Attention is ``F.scaled_dot_product_attention``; with an ``attention_mask`` no query attends to a padded key.
``benchmark.py`` times :class:`BertLayer` against the BiGS layer, and :mod:`mlp_vision.complexity` counts
BERT-large (the registered ``bert_large``) for the BiGS paper's Table 6 comparison.
"""
from typing import ClassVar, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.loss.loss_utils import ForMaskedLMLoss
from transformers.modeling_outputs import BaseModelOutput, MaskedLMOutput, SequenceClassifierOutput
from transformers.utils import can_return_tuple

from .modeling_utils import ClassifierPooling, TextConfig, TextPreTrainedModel, check_text_inputs, pool_sequence

__all__ = [
    'BertConfig', 'BertEmbeddings', 'BertSelfAttention', 'BertLayer', 'EncoderModel', 'BertModel',
    'MaskedLMHeadTransform',
    'PoolerTransform', 'EncoderForMaskedLM', 'EncoderForSequenceClassification', 'BertForMaskedLM',
    'BertForSequenceClassification', 'BertPreTrainedModel',
]


class BertConfig(TextConfig):
    """Configuration of BERT (defaults: BERT-large, §A.2 of arXiv 1810.04805; vocabulary of the uncased model).
    Fields as ``transformers``' ``BertConfig`` (P absolute positions, T token types; ``hidden_dropout_prob`` after
    the embeddings, the attention output and the FFN); the shared ones: :class:`TextConfig`.
    """
    vocab_size: int = 30522
    hidden_size: int = 1024
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    intermediate_size: int = 4096
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    classifier_dropout: float = 0.1
    classifier_pooling: ClassifierPooling = 'cls'
    sparse_prediction: bool = False

    model_type = 'mlp_vision_bert'  # config.json's key for transformers' AutoConfig
    tie_word_embeddings: ClassVar[bool] = True  # the MLM decoder is the word embedding (transformers reads this)


class BertEmbeddings(nn.Module):
    """BERT embeddings (§3): word + absolute position + token type, LayerNorm, dropout.

    Any config with ``vocab_size, hidden_size, max_position_embeddings, type_vocab_size, pad_token_id,
    layer_norm_eps, hidden_dropout_prob`` builds it (BERT's and BiGS').

    Shapes: input_ids, token_type_ids (B, L) int64 -> (B, L, d).
    """

    def __init__(self, config, device=None, dtype=None):
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        c = config
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id, **dd)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size, **dd)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size, **dd)
        self.norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps, **dd)
        self.drop = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(positions)
        return self.drop(self.norm(x))


class BertSelfAttention(nn.Module):
    """Multi-head self-attention (SDPA) with an optional key-padding mask.

    Shapes: x (B, L, d); mask optional (B, L) bool, True = real token (padded keys get no weight) -> (B, L, d).
    """

    def __init__(self, dim: int, num_heads: int, attn_drop: float = 0., device=None, dtype=None) -> None:
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        if dim % num_heads:
            raise ValueError(f'dim {dim} is not divisible by num_heads {num_heads}')
        self.num_heads = num_heads
        self.attn_drop = attn_drop
        self.query = nn.Linear(dim, dim, **dd)
        self.key = nn.Linear(dim, dim, **dd)
        self.value = nn.Linear(dim, dim, **dd)
        self.out = nn.Linear(dim, dim, **dd)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = (p(x).view(b, n, self.num_heads, d // self.num_heads).transpose(1, 2)
                   for p in (self.query, self.key, self.value))  # (B, heads, L, head_dim)
        attn_mask = None if mask is None else mask[:, None, None, :]  # (B, 1, 1, L): every query, real keys only
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                             dropout_p=self.attn_drop if self.training else 0.)
        return self.out(ctx.transpose(1, 2).reshape(b, n, d))


class BertLayer(nn.Module):
    """Post-LN BERT layer: ``x = LN(x + Drop(Attn(x)))``, ``x = LN(x + Drop(W_2 GELU(W_1 x)))``.

    Shapes: x (B, L, d), mask optional (B, L) bool -> (B, L, d).
    """

    def __init__(self, dim: int = 1024, num_heads: int = 16, ffn_dim: int = 4096, norm_eps: float = 1e-12,
                 drop: float = 0., attn_drop: float = 0., device=None, dtype=None) -> None:
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        self.attn = BertSelfAttention(dim, num_heads, attn_drop, **dd)
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps, **dd)
        self.fc1 = nn.Linear(dim, ffn_dim, **dd)
        self.fc2 = nn.Linear(ffn_dim, dim, **dd)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps, **dd)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = self.norm1(x + self.drop(self.attn(x, mask)))
        return self.norm2(x + self.drop(self.fc2(F.gelu(self.fc1(x)))))


class BertPreTrainedModel(TextPreTrainedModel):
    """Base of the BERT models: their config, and the encoder's attribute (``bert``)."""
    config_class = BertConfig
    base_model_prefix = 'bert'


class EncoderModel(TextPreTrainedModel):
    """What :class:`BertModel` and :class:`mlp_vision.text.bigs.BiGSModel` share: :class:`BertEmbeddings`, then
    ``self.layers`` (each ``layer(x, mask)``), given the mask unless ``config.mask_padding`` is False (BiGS).

    Shapes:
        input_ids: (B, L) int64, 1 <= L <= max_position_embeddings; attention_mask: optional (B, L), 1 = real
        token, right padding; token_type_ids: optional (B, L) in [0, type_vocab_size) (zeros when omitted).
        Returns ``BaseModelOutput(last_hidden_state (B, L, hidden_size))``.
    """

    @can_return_tuple
    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, **kwargs) -> BaseModelOutput:
        self.check_forward_kwargs(kwargs)
        mask = check_text_inputs(input_ids, attention_mask, self.config.max_position_embeddings, token_type_ids)
        mask = mask if getattr(self.config, 'mask_padding', True) else None  # BERT has no such field: it masks
        x = self.embeddings(input_ids, token_type_ids)
        for layer in self.layers:
            x = layer(x, mask)
        return BaseModelOutput(last_hidden_state=x)


class BertModel(BertPreTrainedModel, EncoderModel):
    """BERT encoder: :class:`BertEmbeddings` -> ``num_hidden_layers`` x :class:`BertLayer` (shapes:
    :class:`EncoderModel`)."""

    def __init__(self, config: BertConfig, device=None, dtype=None):
        super().__init__(config)
        dd = {'device': device, 'dtype': dtype}
        c = config
        self.embeddings = BertEmbeddings(c, **dd)
        self.layers = nn.ModuleList([
            BertLayer(c.hidden_size, c.num_attention_heads, c.intermediate_size, c.layer_norm_eps,
                      drop=c.hidden_dropout_prob, attn_drop=c.attention_probs_dropout_prob, **dd)
            for _ in range(c.num_hidden_layers)
        ])
        self.post_init()  # transformers' _init_weights: BERT's init (the padding row of the word embedding zero)


class MaskedLMHeadTransform(nn.Module):
    """BERT's MLM transform before the decoder: dense d -> d, GELU, LayerNorm. Shapes: (B, L, d) -> (B, L, d)."""

    def __init__(self, hidden_size: int, norm_eps: float, device=None, dtype=None):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size, device=device, dtype=dtype)
        self.norm = nn.LayerNorm(hidden_size, eps=norm_eps, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(F.gelu(self.dense(x)))


class PoolerTransform(nn.Module):
    """BERT's pooler (§3) on the pooled vector (:func:`~mlp_vision.text.modeling_utils.pool_sequence`): dense
    d -> d, tanh. Shapes: (B, d) -> (B, d)."""

    def __init__(self, hidden_size: int, device=None, dtype=None):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(x))


class EncoderForMaskedLM(TextPreTrainedModel):
    """An encoder + the BERT MLM head: :class:`MaskedLMHeadTransform` (unless ``use_transform = False``, gMLP's),
    decoder tied to the word embedding, per-token output bias. Subclasses (also of their family's
    ``PreTrainedModel``, which names ``base_model_prefix``) set ``encoder_class`` and, when the encoder's word
    embedding is elsewhere, its weight's key in ``embedding_key``.

    Shapes: input_ids, attention_mask, token_type_ids (B, L) as the encoder; labels optional (B, L) int64, -100 at
    positions not scored. Returns ``MaskedLMOutput(loss, logits (B, L, V))``; logits (N, V) of the N scored
    positions when ``config.sparse_prediction`` and labels are given.
    """
    head_prefixes = ('mlm_head', 'decoder', 'output_bias')
    encoder_class: type
    use_transform = True
    embedding_key = 'embeddings.word_embeddings.weight'

    def __init__(self, config, device=None, dtype=None):
        super().__init__(config)
        encoder = self.encoder_class(config, device=device, dtype=dtype)
        setattr(self, self.base_model_prefix, encoder)
        if self.use_transform:
            self.mlm_head = MaskedLMHeadTransform(config.hidden_size, config.layer_norm_eps, device=device, dtype=dtype)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False, device=device, dtype=dtype)
        self.output_bias = nn.Parameter(torch.zeros(config.vocab_size, device=device, dtype=dtype))
        self.post_init()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._tied_weights_keys = {'decoder.weight': f'{cls.base_model_prefix}.{cls.embedding_key}'}

    @can_return_tuple
    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, labels: Optional[torch.Tensor] = None, **kwargs):
        self.check_forward_kwargs(kwargs)
        hidden = self.base_model(input_ids, attention_mask, token_type_ids).last_hidden_state
        if labels is not None and self.config.sparse_prediction:  # the scored positions only: (N, d), (N,)
            scored = labels != -100
            hidden, labels = hidden[scored], labels[scored]
        logits = self.decoder(self.mlm_head(hidden) if self.use_transform else hidden) + self.output_bias
        loss = None if labels is None else ForMaskedLMLoss(logits, labels, self.config.vocab_size)
        return MaskedLMOutput(loss=loss, logits=logits)


class BertForMaskedLM(BertPreTrainedModel, EncoderForMaskedLM):
    """BERT masked LM (§3.1): :class:`EncoderForMaskedLM` on :class:`BertModel`."""
    encoder_class = BertModel


class EncoderForSequenceClassification(TextPreTrainedModel):
    """An encoder, :func:`~mlp_vision.text.modeling_utils.pool_sequence` (``config.classifier_pooling``),
    :class:`PoolerTransform` (unless ``use_pooler = False``, gMLP's), dropout and a linear classifier; subclasses set
    ``encoder_class``. ``from_pretrained(mlm_dir, num_labels=k)`` loads the encoder of a masked LM, with a new
    pooler and classifier (MLM-only pretraining, as RoBERTa's and BiGS', trains no pooler).

    Shapes: as :class:`EncoderForMaskedLM`; labels optional (B,) int64 class ids, or (B,) float targets when
    ``num_labels == 1`` (regression, MSE). Returns ``SequenceClassifierOutput(loss, logits (B, num_labels))``.
    """
    head_prefixes = ('pooler', 'classifier')
    encoder_class: type
    use_pooler = True

    def __init__(self, config, device=None, dtype=None):
        super().__init__(config)
        setattr(self, self.base_model_prefix, self.encoder_class(config, device=device, dtype=dtype))
        if self.use_pooler:
            self.pooler = PoolerTransform(config.hidden_size, device=device, dtype=dtype)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels, device=device, dtype=dtype)
        self.post_init()

    @can_return_tuple
    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, labels: Optional[torch.Tensor] = None, **kwargs):
        self.check_forward_kwargs(kwargs)
        h = self.base_model(input_ids, attention_mask, token_type_ids).last_hidden_state
        mask = None if attention_mask is None else attention_mask.to(torch.bool)  # 'mean' pooling skips padding
        h = pool_sequence(h, mask, self.config.classifier_pooling, getattr(self.config, 'cls_index', 0))
        logits = self.classifier(self.dropout(self.pooler(h) if self.use_pooler else h))
        loss = None
        if labels is not None:  # one label: regression
            loss = (F.mse_loss(logits.squeeze(-1).float(), labels.float()) if logits.shape[-1] == 1 else
                    F.cross_entropy(logits.float(), labels))
        return SequenceClassifierOutput(loss=loss, logits=logits)


class BertForSequenceClassification(BertPreTrainedModel, EncoderForSequenceClassification):
    """BERT classifier (§3): :class:`EncoderForSequenceClassification` on :class:`BertModel` (pooler on the [CLS]
    state by default)."""
    encoder_class = BertModel

