""" Text models built on the shared blocks of :mod:`mlp_vision.layers`.

* gMLP / aMLP masked-LM encoders (Toeplitz SGU) with masked-LM and ``<cls>`` sequence-classification heads,
  and a causal gMLP LM (causal SGU) -- all from :class:`mlp_vision.layers.GatedMLPBlock`.
* BiGS (bidirectional gated SSM, :class:`mlp_vision.layers.BidirectionalGatedSSM`) masked-LM and
  sequence-classification encoders, with a converter for the official checkpoints.
* A char-level GPT with MLP-Attention and its dot-product-attention (SDPA) baseline.
* Download-free byte / character tokenizers.

Usage::

    import mlp_vision.text as mt
    mt.list_models()
    model = mt.create_model('amlp_base')            # GMLPForMaskedLM
    model.save_pretrained('ckpt/'); model = mt.from_pretrained('ckpt/')
"""
from .bigs import BiGSConfig, BiGSForMaskedLM, BiGSForSequenceClassification, BiGSModel, convert_official_bigs_state_dict
from .gmlp import GMLPConfig, GMLPForCausalLM, GMLPForMaskedLM, GMLPForSequenceClassification, GMLPModel
from .gpt import GPTBlock, GPTConfig, GPTLanguageModel, MLPAttention
from .modeling_utils import GenerationMixin, PretrainedMixin, TextOutput, from_pretrained, list_architectures
from .registry import create_model, is_model, list_models, model_config, register_model
from .tokenizer import ByteTokenizer, CharTokenizer
