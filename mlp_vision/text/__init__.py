""" Text models built on the shared blocks of :mod:`mlp_vision.layers`, as ``transformers`` models (needs
``transformers`` >= 5.4, < 6: ``pip install mlp_vision[text]``):

* gMLP / aMLP masked-LM encoders (Toeplitz SGU) with masked-LM and sequence-classification heads, and a causal gMLP
  LM, from :class:`mlp_vision.layers.GatedMLPBlock`;
* BiGS (:class:`mlp_vision.layers.BidirectionalGatedSSM`) encoders, with a loader for the official checkpoints
  (``from_official``), and BERT, the attention baseline, from the same parts;
* a char-level GPT with MLP-Attention and its dot-product-attention (SDPA) baseline;
* tokenizers (bytes, characters, WordPiece / BPE), each a ``transformers.PreTrainedTokenizerFast``.

Every config is a ``PreTrainedConfig`` and every model a ``PreTrainedModel``, registered with the Auto classes on
import (:mod:`~mlp_vision.text.registry`); what we add is listed in :mod:`mlp_vision.text.modeling_utils`::

    model = mt.create_model('amlp_base')            # GMLPForMaskedLM
    out = model(input_ids, attention_mask=mask, labels=labels)   # MaskedLMOutput: out.loss, out.logits
    model.save_pretrained('ckpt/', tokenizer=tok); model = mt.from_pretrained('ckpt/')  # model.tokenizer
    model = transformers.AutoModelForMaskedLM.from_pretrained('ckpt/')  # the same class, the same weights
    model = mt.BiGSForMaskedLM.from_official('BiGS_512/')          # official weights + their vocab.txt
    transformers.pipeline('fill-mask', model='ckpt/')('the movie was [MASK] .')   # top tokens and probabilities

A model's maximum length is ``max_position_embeddings`` in its config and ``seq_len`` in its layers; a training
sample's is the trainer's ``--block-size``, a tokenizer call's ``max_length``.
"""
try:
    import transformers as _transformers
except ImportError:
    _transformers = None
if _transformers is None or not (5, 4) <= tuple(int(x) for x in _transformers.__version__.split('.')[:2]) < (6,):
    raise ImportError('mlp_vision.text needs transformers >= 5.4, < 6 (the text models are transformers models): '
                      'pip install "mlp_vision[text]"')
del _transformers

from .bert import BertConfig, BertForMaskedLM, BertForSequenceClassification, BertModel
from .bigs import BiGSConfig, BiGSForMaskedLM, BiGSForSequenceClassification, BiGSModel, convert_official_bigs_state_dict
from .gmlp import GMLPConfig, GMLPForCausalLM, GMLPForMaskedLM, GMLPForSequenceClassification, GMLPModel
from .gpt import GPTBlock, GPTConfig, GPTLanguageModel, MLPAttention
from .modeling_utils import TextConfig, TextGenerationMixin, TextPreTrainedModel
from .registry import (
    architecture_class, create_model, from_pretrained, is_model, list_architectures, list_models, model_class,
    model_config, register_model)
from .tokenizer import (
    Tokenizer, byte_tokenizer, char_tokenizer, find_tokenizer, load_tokenizer, tokenizer_kind, train_tokenizer,
    wordpiece_tokenizer)
