""" The table of the text models (a separate one from timm's): name -> (family, default task, config defaults),
family -> task -> model class. The same table registers every family with ``transformers``' Auto classes
(``AutoConfig`` by ``model_type``, ``AutoModel*`` by task), so ``AutoModelForMaskedLM.from_pretrained('ckpt/')`` and
``pipeline('fill-mask', model='ckpt/')`` work on our folders once ``mlp_vision.text`` is imported::

    create_model('amlp_base')                                         # GMLPForMaskedLM, 108.8 M params
    create_model('gmlp_base', task='sequence_classification', num_labels=3)
    create_model('gmlp_base', num_hidden_layers=12, max_position_embeddings=128)   # any GMLPConfig field
    create_model('gmlp_xlarge', device='meta')                        # shapes only, no memory
    model_config('bigs_large_512')['max_position_embeddings']         # every config has this field: 512

Overrides are config fields, plus ``task``, ``device`` and ``dtype``. Every config's ``max_position_embeddings`` is
the longest input the model accepts; nothing else knows it.
"""
import dataclasses
import fnmatch
from typing import Any, Dict, List, Optional, Tuple, Type

import torch
from transformers import (
    AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSequenceClassification)

from mlp_vision.errors import UsageError
from .bert import BertForMaskedLM, BertForSequenceClassification, BertModel
from .bigs import BiGSForMaskedLM, BiGSForSequenceClassification, BiGSModel
from .gmlp import GMLPForCausalLM, GMLPForMaskedLM, GMLPForSequenceClassification, GMLPModel
from .gpt import GPTLanguageModel
from .modeling_utils import (
    CONFIG_NAME, TextConfig, TextPreTrainedModel, check_text_model_size, load_text_config, read_config)

__all__ = [
    'create_model', 'list_models', 'is_model', 'model_config', 'model_entry', 'register_model', 'model_class',
    'architecture_class', 'list_architectures', 'from_pretrained', 'ModelEntry', 'TASKS', 'load_config',
]

# task -> the transformers Auto class its models are registered with
AUTO_CLASSES = {
    'base': AutoModel, 'masked_lm': AutoModelForMaskedLM, 'sequence_classification': AutoModelForSequenceClassification,
    'causal_lm': AutoModelForCausalLM}
TASKS = tuple(AUTO_CLASSES)

# family -> task -> model class (each class names its config: ``config_class``)
_FAMILIES: Dict[str, Dict[str, Type[TextPreTrainedModel]]] = {
    'gmlp': {'base': GMLPModel, 'masked_lm': GMLPForMaskedLM, 'sequence_classification': GMLPForSequenceClassification,
             'causal_lm': GMLPForCausalLM},
    'gpt': {'causal_lm': GPTLanguageModel},
    'bigs': {'base': BiGSModel, 'masked_lm': BiGSForMaskedLM, 'sequence_classification': BiGSForSequenceClassification},
    'bert': {'base': BertModel, 'masked_lm': BertForMaskedLM, 'sequence_classification': BertForSequenceClassification},
}
_ARCHITECTURES = {cls.__name__: cls for models in _FAMILIES.values() for cls in models.values()}


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """A registered name: its family, default task and config defaults (current field names)."""
    name: str
    family: str
    task: str
    defaults: Dict[str, Any]

    @property
    def config_class(self) -> Type[TextConfig]:
        return _FAMILIES[self.family][self.task].config_class

    @property
    def tasks(self) -> Tuple[str, ...]:
        return tuple(_FAMILIES[self.family])

    def build_config(self, **overrides) -> TextConfig:
        """The defaults updated by ``overrides``."""
        return self.config_class(**{**self.defaults, **overrides})


_ENTRIES: Dict[str, ModelEntry] = {}


def register_model(name: str, family: str, default_task: str, **defaults) -> None:
    """Register ``name``: a ``family`` config with ``defaults``, built as ``default_task`` unless ``create_model``
    asks for another of the family's tasks."""
    if name in _ENTRIES:
        raise ValueError(f'text model {name!r} already registered')
    model_class(family, default_task)  # a known family and one of its tasks
    entry = ModelEntry(name, family, default_task, dict(defaults))
    entry.build_config()  # validate the defaults now
    _ENTRIES[name] = entry


def model_entry(name: str) -> ModelEntry:
    if name not in _ENTRIES:
        raise KeyError(f'unknown text model {name!r}; known: {", ".join(list_models())}')
    return _ENTRIES[name]


def create_model(name: str, task: Optional[str] = None, device=None, dtype=None, **overrides) -> TextPreTrainedModel:
    """Build the registered text model ``name`` (see the module docstring for the overrides); one of more than
    :data:`mlp_vision.bounds.MAX_PARAMS` parameters (counted on the ``meta`` device first) is a ``UsageError``."""
    entry = model_entry(name)
    task = entry.task if task is None else task
    cls, config = model_class(entry.family, task), entry.build_config(**overrides)
    if torch.device(device or 'cpu').type != 'meta':  # sizes from flags or a resumed run's file: bounded first
        check_text_model_size(cls, config, f'text model {name}')
    return cls(config, device=device, dtype=dtype)


def list_models(pattern: str = '*', task: Optional[str] = None) -> List[str]:
    """Sorted registered names matching the shell-style ``pattern`` (and, if given, default ``task``)."""
    return sorted(n for n, e in _ENTRIES.items() if fnmatch.fnmatch(n, pattern) and task in (None, e.task))


def is_model(name: str) -> bool:
    return name in _ENTRIES


def model_config(name: str, **overrides) -> dict:
    """Family, default task and every config field of ``name`` (class defaults included), e.g.
    ``model_config(name)['max_position_embeddings']``."""
    entry = model_entry(name)
    return {'family': entry.family, 'task': entry.task, **entry.build_config(**overrides).text_fields()}


def model_class(family: str, task: str) -> Type[TextPreTrainedModel]:
    """The class a ``family`` uses for ``task``; a clear error when the family has no such task."""
    if family not in _FAMILIES:
        raise ValueError(f'unknown family {family!r}; known: {sorted(_FAMILIES)}')
    if task not in _FAMILIES[family]:
        raise ValueError(f'family {family!r} has no task {task!r}; its tasks: {sorted(_FAMILIES[family])}')
    return _FAMILIES[family][task]


def architecture_class(class_name: str) -> Type[TextPreTrainedModel]:
    """The model class called ``class_name`` (what ``config.json`` stores as its architecture)."""
    if class_name not in _ARCHITECTURES:
        raise KeyError(f'unknown architecture {class_name!r}; known: {list_architectures()}')
    return _ARCHITECTURES[class_name]


def list_architectures() -> List[str]:
    """Class names that :func:`from_pretrained` can build."""
    return sorted(_ARCHITECTURES)


def load_config(directory: str) -> Tuple[Type[TextPreTrainedModel], TextConfig]:
    """(the stored architecture's class, its config) of a ``save_pretrained`` folder
    (:func:`~mlp_vision.text.modeling_utils.read_config`); a config that does not build (an unknown architecture or
    field, a value out of range such as a NaN ``layer_norm_eps``) is a :class:`~mlp_vision.errors.UsageError`
    naming ``config.json``."""
    try:
        stored = architecture_class(read_config(directory))
    except KeyError as e:
        raise UsageError(f'{directory}/{CONFIG_NAME}: {e.args[0]}') from None
    return stored, load_text_config(stored.config_class, directory)


def from_pretrained(directory: str, device: str = 'cpu', **overrides: Any) -> TextPreTrainedModel:
    """Load any text model saved with ``save_pretrained`` (the stored architecture's class, its
    ``transformers`` ``from_pretrained``), on ``device``; ``model.tokenizer`` is the folder's tokenizer (None
    without one)."""
    stored, _ = load_config(directory)
    return stored.from_pretrained(directory, **overrides).to(device)


for _models in _FAMILIES.values():  # every config with AutoConfig, every class with its task's Auto class
    for _task, _cls in _models.items():
        AutoConfig.register(_cls.config_class.model_type, _cls.config_class, exist_ok=True)
        AUTO_CLASSES[_task].register(_cls.config_class, _cls, exist_ok=True)


# --- gMLP / aMLP masked LM, BERT setup (arXiv 2105.08050 §4, Table 5): vocab 32,000, seq 512, Toeplitz W ----------
_BERT_SETUP = dict(vocab_size=32000, max_position_embeddings=512, spatial_mode='toeplitz')


def _gmlp(layers: int, width: int, ffn: int, tiny_attention: int = 0, **extra) -> dict:
    return dict(num_hidden_layers=layers, hidden_size=width, intermediate_size=ffn,
                tiny_attention_size=tiny_attention, **{**_BERT_SETUP, **extra})


register_model('gmlp_base', 'gmlp', 'masked_lm', **_gmlp(48, 512, 3072))
register_model('gmlp_large', 'gmlp', 'masked_lm', **_gmlp(96, 768, 3072))
register_model('gmlp_xlarge', 'gmlp', 'masked_lm', **_gmlp(144, 1024, 4096))
register_model('amlp_base', 'gmlp', 'masked_lm', **_gmlp(36, 512, 3072, 64))
register_model('amlp_large', 'gmlp', 'masked_lm', **_gmlp(72, 768, 3072, 128))

# --- Table 4 scaling study (seq 128, d 512, d_ffn 3072; 0.5x / 1x / 2x / 4x depth) ----------------------------------
for _depth in (18, 36, 72, 144):
    register_model(f'gmlp_{_depth}l_seq128', 'gmlp', 'masked_lm', **_gmlp(_depth, 512, 3072,
                                                                           max_position_embeddings=128))

# --- causal gMLP LM (annotated implementation, the project's paper 001: d 512, d_ffn 2048, context 256, 6 layers as
#     labml's TransformerConfigs default; char-level Tiny Shakespeare vocab 65, untied generator) ----------------------
register_model('gmlp_causal_char', 'gmlp', 'causal_lm', num_hidden_layers=6, hidden_size=512, intermediate_size=2048,
               vocab_size=65, max_position_embeddings=256, spatial_mode='causal', tie_word_embeddings=False)

# --- MLP-Attention paper (ICLR 2023 Tiny Papers, §3): vocab 65, 3 layers, 3 heads, d 384, T_max 256, d_hidden 256,
#     dropout 0.2 ----------------------------------------------------------------------------------------------------
_PAPER_GPT = dict(vocab_size=65, max_position_embeddings=256, num_hidden_layers=3, num_attention_heads=3,
                  hidden_size=384, mlp_attention_hidden_size=256, hidden_dropout_prob=0.2,
                  attention_probs_dropout_prob=0.2)
register_model('gpt_mlp_attention', 'gpt', 'causal_lm', attention='mlp', **_PAPER_GPT)
register_model('gpt_sdpa', 'gpt', 'causal_lm', attention='sdpa', **_PAPER_GPT)

# --- BiGS (arXiv 2212.10544 §5): BiGS-large = 23 layers, d 1024, d_i 3072, N 64, BERT uncased vocab 30522; the
#     official models differ only in their absolute positions (128 / 512 / 1024 / 4096). bigs_large_512: 346.7 M.
_BIGS_LARGE = dict(vocab_size=30522, hidden_size=1024, intermediate_size=3072, num_hidden_layers=23, num_ssm_states=64)
for _positions in (128, 512, 1024, 4096):
    register_model(f'bigs_large_{_positions}', 'bigs', 'masked_lm', max_position_embeddings=_positions, **_BIGS_LARGE)

# --- BERT (arXiv 1810.04805 §3, uncased vocabulary): the attention baseline of the BiGS and gMLP comparisons -------
register_model('bert_base', 'bert', 'masked_lm', num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
               intermediate_size=3072)
register_model('bert_large', 'bert', 'masked_lm', num_hidden_layers=24, hidden_size=1024, num_attention_heads=16,
               intermediate_size=4096)

# --- small encoders for CPU experiments; vocab / pad id fit byte_tokenizer() (256 bytes + <pad> <cls> <sep> <mask>):
#     override vocab_size and pad_token_id for another tokenizer
_SMALL = dict(vocab_size=260, pad_token_id=256, hidden_size=256, num_hidden_layers=4, max_position_embeddings=512)
register_model('bigs_small', 'bigs', 'masked_lm', intermediate_size=768, num_ssm_states=64, **_SMALL)
register_model('bert_small', 'bert', 'masked_lm', intermediate_size=1024, num_attention_heads=4, **_SMALL)
