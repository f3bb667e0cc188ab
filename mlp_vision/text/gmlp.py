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

Parameter accounting, ours against the papers' Tables 4-5: docs/models.md §1.

Padding (``attention_mask``, (B, L), 1 = real token, right padding): with ``config.mask_padding`` (default) the
tiny attention ignores padded keys and the SGU zeroes the padded tokens' gate values before its spatial projection,
so a padded sequence gets exactly the outputs it gets alone; without it the SGU mixes pads too, as the paper (§4:
"unnecessary to mask out <pad> tokens"). Causal models never see trailing pads.
"""
from functools import partial
from typing import Literal, Optional

import torch
import torch.nn as nn
from transformers import initialization as init
from transformers.loss.loss_utils import ForCausalLMLoss
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput
from transformers.utils import can_return_tuple

from ..layers import GatedMLPBlock, SPATIAL_MODES, SpatialGatingUnit
from .bert import EncoderForMaskedLM, EncoderForSequenceClassification
from .modeling_utils import ClassifierPooling, TextConfig, TextGenerationMixin, TextPreTrainedModel, check_text_inputs

__all__ = [
    'GMLPConfig', 'GMLPPreTrainedModel', 'GMLPModel', 'GMLPForMaskedLM', 'GMLPForSequenceClassification',
    'GMLPForCausalLM']


class GMLPConfig(TextConfig):
    """Configuration of the gMLP / aMLP text models (the shared fields:
    :class:`~mlp_vision.text.modeling_utils.TextConfig`).

    Attributes:
        max_position_embeddings: n, the SGU's spatial size; shorter inputs use the leading block of W and b.
        intermediate_size: d_ffn (fc1 output; the SGU halves it). Must be even.
        tiny_attention_size: size a of aMLP's single-head tiny attention (0 = gMLP; 64 base, 128 large, §4.3).
        spatial_mode: 'toeplitz' (masked LM) | 'causal' (autoregressive LM) | 'dense'.
        mask_padding: padded positions never reach real ones (module docstring); False = the paper's unmasked SGU.
        tie_word_embeddings: decoder weight = token embedding (masked LM: True, paper §4).
        hidden_dropout_prob: dropout on the embeddings and inside each block (after the SGU).
        drop_path_rate: stochastic depth, ramped linearly from 0 at the first block to this at the last.
        cls_index: position whose last-layer state the sequence classifier reads (0: ``<cls>`` first, BERT).
    """
    vocab_size: int = 32000
    max_position_embeddings: int = 512
    hidden_size: int = 512
    num_hidden_layers: int = 48
    intermediate_size: int = 3072
    tiny_attention_size: int = 0
    spatial_mode: Literal[SPATIAL_MODES] = 'toeplitz'
    mask_padding: bool = True
    tie_word_embeddings: bool = True
    hidden_dropout_prob: float = 0.0
    drop_path_rate: float = 0.0
    layer_norm_eps: float = 1e-6
    initializer_range: float = 0.02
    cls_index: int = 0
    classifier_dropout: float = 0.1
    classifier_pooling: ClassifierPooling = 'cls'
    sparse_prediction: bool = False

    model_type = 'mlp_vision_gmlp'  # config.json's key for transformers' AutoConfig

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if self.intermediate_size % 2:
            raise ValueError(f'intermediate_size must be even (the SGU splits it in two), got {self.intermediate_size}')
        if not 0 <= self.cls_index < self.max_position_embeddings:
            raise ValueError(f'cls_index {self.cls_index} outside [0, {self.max_position_embeddings})')


class GMLPPreTrainedModel(TextPreTrainedModel):
    """Base of the gMLP / aMLP models: their config, and the backbone's attribute (``gmlp``)."""
    config_class = GMLPConfig
    base_model_prefix = 'gmlp'
    _input_embed_layer = 'embed'

    def _init_weights(self, module: nn.Module) -> None:
        """Also the SGUs' raw parameters, as :meth:`~mlp_vision.layers.SpatialGatingUnit.init_weights` draws them
        (W ~ N(0, its ``init_std``), b = 1: each block starts as an FFN, paper §2), and their Toeplitz index
        (``index[i, j] = i - j + n - 1``, not saved)."""
        super()._init_weights(module)
        if isinstance(module, SpatialGatingUnit):
            init.normal_(module.weight, std=module.init_std)
            init.ones_(module.bias)
            if module.toeplitz_index is not None:
                idx = torch.arange(module.seq_len, device=module.toeplitz_index.device)
                init.copy_(module.toeplitz_index, idx[:, None] - idx[None, :] + module.seq_len - 1)


class GMLPModel(GMLPPreTrainedModel):
    """gMLP / aMLP backbone: token embedding -> GatedMLPBlocks -> final LayerNorm.

    Shapes: input_ids (B, L) int64, 1 <= L <= max_position_embeddings; attention_mask optional (B, L), 1 = real
    token, right padding (module docstring); token_type_ids ignored (tokenizers and pipelines give them) ->
    ``BaseModelOutput(last_hidden_state (B, L, hidden_size))``.
    """

    def __init__(self, config: GMLPConfig, device=None, dtype=None):
        super().__init__(config)
        dd = {'device': device, 'dtype': dtype}
        c = config
        self.embed = nn.Embedding(c.vocab_size, c.hidden_size, **dd)
        self.drop = nn.Dropout(c.hidden_dropout_prob)
        dpr = [c.drop_path_rate * i / max(c.num_hidden_layers - 1, 1) for i in range(c.num_hidden_layers)]
        self.blocks = nn.ModuleList([
            GatedMLPBlock(
                c.hidden_size, c.max_position_embeddings, hidden_dim=c.intermediate_size, spatial_mode=c.spatial_mode,
                attn_dim=c.tiny_attention_size, sgu_mask=c.mask_padding, drop=c.hidden_dropout_prob,
                norm_layer=partial(nn.LayerNorm, eps=c.layer_norm_eps), drop_path=dpr[i], **dd)
            for i in range(c.num_hidden_layers)
        ])
        self.norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps, **dd)
        self.post_init()

    @can_return_tuple
    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, **kwargs) -> BaseModelOutput:
        self.check_forward_kwargs(kwargs)
        mask = check_text_inputs(input_ids, attention_mask, self.config.max_position_embeddings)
        x = self.drop(self.embed(input_ids))
        for block in self.blocks:
            x = block(x, mask)
        return BaseModelOutput(last_hidden_state=self.norm(x))


class GMLPForMaskedLM(GMLPPreTrainedModel, EncoderForMaskedLM):
    """gMLP / aMLP masked LM: :class:`~mlp_vision.text.bert.EncoderForMaskedLM` on :class:`GMLPModel` without the
    BERT MLM transform (the papers' counts exclude one: docs/models.md §1): decoder Linear (weight tied to the token
    embedding by default) and output bias on the last hidden states. Shapes: as ``EncoderForMaskedLM``."""
    encoder_class = GMLPModel
    use_transform = False
    embedding_key = 'embed.weight'


class GMLPForSequenceClassification(GMLPPreTrainedModel, EncoderForSequenceClassification):
    """Sequence classifier with the BERT ``<cls>`` protocol of the paper (§2, §4): on ``<cls> segment_a <sep>
    [segment_b <sep>] <pad>...``, a linear map of the last-layer state at ``config.cls_index`` (0), or of the mean of
    the real tokens' states (``classifier_pooling='mean'``). No BERT pooler (tanh dense layer): next-sentence
    prediction trains it, and the paper's C4 MLM pretraining has none. Shapes: as
    :class:`~mlp_vision.text.bert.EncoderForSequenceClassification`."""
    encoder_class = GMLPModel
    use_pooler = False


class GMLPForCausalLM(TextGenerationMixin, GMLPPreTrainedModel):
    """Autoregressive gMLP LM, as the annotated implementation (labml.ai): token embedding -> gMLP blocks with a
    causal SGU (W masked to j <= i) -> final LayerNorm -> linear generator without bias (``tie_word_embeddings``
    chooses; untied there) plus an output bias. No sinusoidal position encoding: the causal W is position-indexed
    already (paper §2). Any length 1..max_position_embeddings; ``generate`` crops longer contexts.

    Shapes: input_ids (B, T) int64; attention_mask optional (B, T) (right padding never reaches real tokens); labels
    optional (B, T) int64, ``labels = input_ids`` (shifted inside, -100 = not scored) -> ``CausalLMOutput(loss,
    logits (B, T, V))``.
    """
    head_prefixes = ('lm_head', 'output_bias')
    _tied_weights_keys = {'lm_head.weight': 'gmlp.embed.weight'}

    def __init__(self, config: GMLPConfig, device=None, dtype=None):
        if config.spatial_mode != 'causal':
            raise ValueError(f"GMLPForCausalLM needs spatial_mode='causal', got {config.spatial_mode!r}")
        super().__init__(config)
        self.gmlp = GMLPModel(config, device=device, dtype=dtype)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, device=device, dtype=dtype)
        self.output_bias = nn.Parameter(torch.zeros(config.vocab_size, device=device, dtype=dtype))
        self.post_init()

    @can_return_tuple
    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, labels: Optional[torch.Tensor] = None, **kwargs):
        self.check_forward_kwargs(kwargs)
        logits = self.lm_head(self.gmlp(input_ids, attention_mask).last_hidden_state) + self.output_bias
        loss = None if labels is None else ForCausalLMLoss(logits, labels, self.config.vocab_size)
        return CausalLMOutput(loss=loss, logits=logits)
