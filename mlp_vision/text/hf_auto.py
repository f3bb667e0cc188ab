""" The text models behind ``transformers``' Auto classes and pipelines (needs ``transformers`` >= 5, optional).

:mod:`mlp_vision.text` imports this module when ``transformers`` is importable; it registers, per family (gMLP,
BiGS, BERT, GPT), a ``transformers`` config with ``AutoConfig`` and a model class per task with ``AutoModel``,
``AutoModelForMaskedLM``, ``AutoModelForSequenceClassification`` and ``AutoModelForCausalLM``::

    import mlp_vision.text                          # registers (nothing to call)
    from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline
    model = AutoModelForMaskedLM.from_pretrained('ckpt/')       # a folder written by our save_pretrained
    fill = pipeline('fill-mask', model=model, tokenizer=AutoTokenizer.from_pretrained('ckpt/'))
    fill('the movie was [MASK] .')                  # the tokens and scores of mlp_vision.text.fill_mask

Design. Our models stay plain ``nn.Module`` s with dataclass configs; ``transformers`` sees thin classes made here
from them, one per family (config) and per (family, task) (model), named ``Transformers`` + our class name:

* ``TransformersGMLPConfig`` (a ``PreTrainedConfig`` whose ``model_type`` is :attr:`GMLPConfig.model_type`) has our
  config's fields, with their defaults, as its own; :meth:`~_TransformersTextConfig.to_text_config` gives our
  config back (validated by it). ``num_labels`` is ``transformers``' own (the length of ``id2label``).
* ``TransformersGMLPForMaskedLM`` (a ``PreTrainedModel``) holds our ``GMLPForMaskedLM`` as ``text_model`` and
  calls it: one implementation. It returns ``transformers``' output types (``MaskedLMOutput``,
  ``SequenceClassifierOutput``, ``CausalLMOutput``, ``BaseModelOutput``).
* ``from_pretrained`` and ``save_pretrained`` are our loader and writer (same ``config.json`` / ``model.safetensors``
  / tokenizer files, the same key names), so a folder loads bit-identically either way, and one saved through
  ``transformers`` is still ours. ``transformers``' own loader would need its key names (``text_model.`` first)
  and would re-initialise modules by its rules; ``_init_weights`` does nothing here: our modules initialise
  themselves.

The alternative, our classes subclassing ``PreTrainedModel`` when ``transformers`` is present, would make two
versions of each class (with and without it), give them two ``config`` types, and mix two ``save_pretrained`` /
``from_pretrained`` under one name; wrapping keeps ours unchanged and ``transformers`` optional.

What the thin classes take and give:

* ``forward(input_ids, attention_mask=None, token_type_ids=None, labels=None, return_dict=None)``; the gMLP and GPT
  families have no token-type embedding and ignore ``token_type_ids`` (tokenizers give them), as our classifier
  does. ``output_hidden_states`` / ``output_attentions`` are refused (our models do not collect them), and so is
  any keyword other than ``generate``'s cache arguments.
* ``transformers.Trainer``: checkpoints are our folders (``save_pretrained``), read back through
  ``load_state_dict`` with our key names; ``accepts_loss_kwargs = False`` makes it average our mean losses over
  gradient-accumulation steps itself.
* Labels: a folder's ``labels.json`` (the text trainer's ``classify`` writes it) gives ``config.id2label``;
  ``save_pretrained`` writes one when ``id2label`` is not ``transformers``' default. ``num_labels == 1`` is
  regression (MSE) in our models, so the config says ``problem_type='regression'`` (the pipeline then applies no
  sigmoid).
* Causal LMs are also ``transformers.GenerationMixin`` s: ``generate`` runs without a cache (our models have none:
  every step reads the whole prefix, which must stay within ``max_position_embeddings``).
* Folders only: a Hub name is not downloaded. A folder written before ``config.json`` held ``model_type`` loads
  with our loader and with the classes here called directly (``TransformersGMLPForMaskedLM.from_pretrained``);
  ``AutoConfig`` / ``AutoModel*`` need the key: re-save it (``mlp_vision.text.from_pretrained(d).save_pretrained(d)``).
* Tokenizers: :meth:`mlp_vision.text.SubwordTokenizer.to_transformers`, or ``AutoTokenizer.from_pretrained`` on the
  folder. The byte and char tokenizers have no ``transformers`` equivalent.
* Not supported: ``resize_token_embeddings``, ``device_map`` other than one device, quantisation, sharded saves,
  ``push_to_hub``.
"""
import dataclasses
import inspect
import json
import os
from typing import Any, ClassVar, Dict, List, Optional, Type

import torch
import torch.nn as nn
import transformers
from transformers import (
    AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSequenceClassification,
    PreTrainedConfig, PreTrainedModel)
from transformers.modeling_outputs import (
    BaseModelOutput, CausalLMOutput, MaskedLMOutput, SequenceClassifierOutput)

from mlp_vision.errors import UsageError
from . import registry
from .modeling_utils import CONFIG_NAME, PretrainedMixin, TextConfig, parse_config_payload
from .registry import build_config, load_config

__all__ = ['to_transformers', 'transformers_class', 'transformers_config_class', 'LABELS_NAME']

LABELS_NAME = 'labels.json'  # written beside a classifier by the text trainer (mlp_vision.training.text.classification)

# task (registry) -> (transformers' Auto class, output type)
_TASKS = {
    'base': (AutoModel, BaseModelOutput),
    'masked_lm': (AutoModelForMaskedLM, MaskedLMOutput),
    'sequence_classification': (AutoModelForSequenceClassification, SequenceClassifierOutput),
    'causal_lm': (AutoModelForCausalLM, CausalLMOutput),
}
# forward arguments about a key/value cache that transformers' generate and pipelines pass (our models keep none)
_CACHE_KWARGS = frozenset({'use_cache', 'past_key_values', 'cache_position', 'cache'})
# from_pretrained arguments of transformers that mean nothing for a local folder of ours (the Hub, remote code)
_IGNORED_LOAD_KWARGS = frozenset({
    'cache_dir', 'force_download', 'local_files_only', 'proxies', 'revision', 'subfolder', 'token',
    'trust_remote_code', 'code_revision', 'adapter_kwargs', 'use_safetensors', 'low_cpu_mem_usage'})


# ------------------------------------------------------------------------------------------------------ configs

class _TransformersTextConfig(PreTrainedConfig):
    """Base of the ``transformers`` configs made from our config dataclasses (see the module docstring)."""
    text_config_class: ClassVar[Type[TextConfig]]

    @classmethod
    def text_field_names(cls) -> List[str]:
        return [f.name for f in dataclasses.fields(cls.text_config_class)]

    def to_text_config(self) -> TextConfig:
        """Our config with this one's values (checked by our config, as any config of ours)."""
        fields = {name: getattr(self, name) for name in self.text_field_names()}
        return self.text_config_class.from_dict(fields)

    @classmethod
    def from_text_config(cls, text_config: TextConfig, architecture: Optional[str] = None,
                         label_names: Optional[List[str]] = None, **kwargs) -> '_TransformersTextConfig':
        """The ``transformers`` config of ``text_config`` (``label_names``: ``id2label``, one per output)."""
        return cls(**_flat_config(text_config, architecture, label_names), **kwargs)

    @classmethod
    def from_dict(cls, config_dict: Dict[str, Any], **kwargs):
        """``transformers``' ``from_dict`` (what ``AutoConfig.from_pretrained`` calls), reading our ``config.json``
        layout too: the fields through our config (legacy names and format versions as our loader), the labels from
        the folder's ``labels.json`` (``kwargs['name_or_path']``)."""
        if 'config' in config_dict and 'architecture' in config_dict:
            folder = kwargs.get('name_or_path')
            text_config, architecture = _text_config_from_payload(
                cls, config_dict, os.path.join(folder, CONFIG_NAME) if folder else CONFIG_NAME)
            num_labels = getattr(text_config, 'num_labels', None)  # a classifier's family (not GPT)
            label_names = read_label_names(folder, num_labels) if folder and num_labels else None
            config_dict = _flat_config(text_config, architecture, label_names)
        return super().from_dict(config_dict, **kwargs)


def _text_config_from_payload(cls: Type[_TransformersTextConfig], payload: Dict[str, Any], path: str):
    """(our config, architecture name) of the parsed ``config.json`` (``path``) of ours, as our loader builds it."""
    architecture, fields, version = parse_config_payload(payload, path)
    stored, text_config = build_config(architecture, fields, version, path)
    if stored.config_class is not cls.text_config_class:
        raise UsageError(f'{path} holds a {architecture} ({stored.config_class.__name__}); {cls.__name__} reads '
                         f'{cls.text_config_class.__name__}')
    return text_config, architecture


def _flat_config(text_config: TextConfig, architecture: Optional[str], label_names: Optional[List[str]]) -> dict:
    """The keyword arguments of a ``transformers`` config for ``text_config``: its fields, the architecture, the
    labels (``num_labels`` by itself gives ``transformers``' ``LABEL_i``), regression when there is one output."""
    fields = text_config.to_dict()
    num_labels = fields.pop('num_labels', None)
    flat: Dict[str, Any] = dict(fields)
    if architecture is not None:
        flat['architectures'] = [architecture]
    if label_names is not None:
        flat['id2label'] = dict(enumerate(label_names))
        flat['label2id'] = {name: i for i, name in enumerate(label_names)}
    elif num_labels is not None:
        flat['num_labels'] = num_labels
    if num_labels == 1:
        flat['problem_type'] = 'regression'  # our single-output head is trained with MSE
    return flat


def read_label_names(folder: str, num_labels: int) -> Optional[List[str]]:
    """The label names in ``folder/labels.json`` (None without the file); they must be ``num_labels``."""
    path = os.path.join(folder, LABELS_NAME)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding='utf-8') as f:
            names = json.load(f)['label_names']
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise TypeError('label_names must be a list of strings')
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(f'{path} is not a labels file of ours ({type(e).__name__}: {e})') from None
    if len(names) != num_labels:
        raise UsageError(f'{path} names {len(names)} labels but the model has num_labels {num_labels}')
    return names


# ------------------------------------------------------------------------------------------------------- models

class _TransformersTextModel(PreTrainedModel):
    """Base of the ``transformers`` models made from ours: holds our model as ``text_model`` and calls it."""
    text_model_class: ClassVar[Type[nn.Module]]
    output_class: ClassVar[type]
    base_model_prefix = 'text_model'
    main_input_name = 'input_ids'
    # our losses are means over the batch's scored tokens / examples, and forward takes no num_items_in_batch: so
    # transformers.Trainer must average over gradient-accumulation steps itself (it asks this attribute)
    accepts_loss_kwargs = False

    def __init__(self, config: _TransformersTextConfig, text_model: Optional[nn.Module] = None):
        super().__init__(config)
        if text_model is None:
            text_model = self.text_model_class(config.to_text_config())
        elif not isinstance(text_model, self.text_model_class):
            raise TypeError(f'{type(self).__name__} holds a {self.text_model_class.__name__}, got '
                            f'{type(text_model).__name__}')
        self.text_model = text_model
        self.post_init()
        if self.can_generate():
            self.generation_config.use_cache = False  # no cache to make (_NoCacheGenerationMixin)

    def _init_weights(self, module: nn.Module) -> None:
        """Nothing: our modules initialise themselves when built, and loaded weights must stay as loaded."""

    def get_input_embeddings(self) -> nn.Embedding:
        return self.text_model.get_input_embeddings()

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, labels: Optional[torch.Tensor] = None,
                return_dict: Optional[bool] = None, output_hidden_states: Optional[bool] = None,
                output_attentions: Optional[bool] = None, **cache_kwargs: Any):
        """Our model's forward; ``transformers``' output type (a tuple with ``return_dict=False``).
        ``cache_kwargs``: what ``generate`` and pipelines may pass about a cache (``use_cache``, ...), ignored as our
        models have none; any other keyword is an error (a misspelt ``attention_mask`` must not pass unseen)."""
        if output_hidden_states or output_attentions:
            raise NotImplementedError(f'{type(self).__name__} returns logits (or the last hidden states) only; our '
                                      f'models do not collect per-layer hidden states or attention weights')
        unknown = sorted(k for k, v in cache_kwargs.items() if k not in _CACHE_KWARGS and v is not None)
        if unknown:
            raise TypeError(f'{type(self).__name__}.forward got arguments it does not take: {unknown}')
        inputs = {'input_ids': input_ids, 'attention_mask': attention_mask}
        if self._reads_token_types:
            inputs['token_type_ids'] = token_type_ids
        if labels is not None:
            if self.output_class is BaseModelOutput:
                raise TypeError(f'{type(self).__name__} is an encoder without a head; it takes no labels')
            inputs['labels'] = labels
        out = self.text_model(**inputs)
        if self.output_class is BaseModelOutput:
            result = BaseModelOutput(last_hidden_state=out)
        else:
            result = self.output_class(loss=out.get('loss'), logits=out.logits)
        use_dict = self.config.return_dict if return_dict is None else return_dict
        return result if use_dict else result.to_tuple()

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Our key names (``model.safetensors`` of ``save_pretrained``, which ``transformers.Trainer`` reads back from
        its checkpoints) go to ``text_model``; ``transformers``' (``text_model.`` first) to this module."""
        if any(key.startswith(f'{self.base_model_prefix}.') for key in state_dict):
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        return self.text_model.load_state_dict(state_dict, strict=strict, assign=assign)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args,
                        config: Optional[_TransformersTextConfig] = None, **kwargs: Any):
        """Load a folder written by ``save_pretrained`` with OUR loader (:meth:`PretrainedMixin.from_pretrained`:
        the same weights, bit for bit), in eval mode as ``transformers`` does. ``config`` (what ``AutoModel*``
        passes) may change fields that keep the shapes (dropout, ``num_labels`` for a new head); other keyword
        arguments are config fields, ``dtype`` / ``torch_dtype``, ``device_map`` (one device), or ignored
        Hub arguments."""
        folder = os.fspath(pretrained_model_name_or_path)
        if model_args:
            raise TypeError(f'{cls.__name__}.from_pretrained takes no positional arguments after the folder')
        if not os.path.isdir(folder):
            raise UsageError(f'{folder} is not a folder: {cls.__name__} loads folders written by save_pretrained '
                             f'(nothing is downloaded)')
        device, dtype = _load_device_and_dtype(kwargs)
        kwargs = {k: v for k, v in kwargs.items() if k not in _IGNORED_LOAD_KWARGS and not k.startswith('_')}
        if config is None:
            config, kwargs = cls.config_class.from_pretrained(folder, return_unused_kwargs=True, **kwargs)
        if kwargs:
            raise TypeError(f'{cls.__name__}.from_pretrained got arguments it does not know: {sorted(kwargs)}')
        text_model = _load_text_model(cls.text_model_class, folder, device, config.to_text_config(),
                                      encoder_only=cls.output_class is BaseModelOutput)
        if dtype is not None:
            text_model.to(dtype)
        model = cls(config, text_model=text_model)
        model.name_or_path = folder
        return model.eval()

    def save_pretrained(self, save_directory, is_main_process: bool = True, safe_serialization: bool = True,
                        tokenizer=None, **unused: Any) -> None:
        """Our :meth:`PretrainedMixin.save_pretrained` (our layout, readable by our loader and by ``from_pretrained``
        here), plus ``labels.json`` when ``config.id2label`` is not ``transformers``' default. Weights are always
        this model's own, in one safetensors file (``safe_serialization`` and ``max_shard_size`` change nothing);
        a ``state_dict`` to save instead, ``push_to_hub`` and the other Hub options are refused."""
        refused = sorted(k for k, v in unused.items() if v not in (None, False) and k != 'max_shard_size')
        if refused:
            raise NotImplementedError(f'{type(self).__name__}.save_pretrained does not support {refused}: it writes '
                                      f'this model\'s own weights to one local safetensors file')
        if not is_main_process:
            return
        self.text_model.save_pretrained(os.fspath(save_directory), tokenizer=tokenizer)
        label_names = [self.config.id2label[i] for i in range(self.config.num_labels)]
        if label_names != [f'LABEL_{i}' for i in range(len(label_names))]:
            with open(os.path.join(save_directory, LABELS_NAME), 'w', encoding='utf-8') as f:
                json.dump({'label_names': label_names}, f, indent=2)


class _NoCacheGenerationMixin(transformers.GenerationMixin):
    """``transformers``' ``generate`` for our causal LMs, which keep no cache: each step reads the whole prefix,
    cropped to the last ``max_position_embeddings`` tokens as our ``generate`` does (``transformers`` would pass
    only the new token, expecting a cache to hold the rest)."""

    def prepare_inputs_for_generation(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                                      **unused: Any) -> Dict[str, torch.Tensor]:
        context = self.config.max_position_embeddings
        inputs = {'input_ids': input_ids[:, -context:]}
        if attention_mask is not None:
            inputs['attention_mask'] = attention_mask[:, -context:]
        return inputs


def _load_text_model(text_model_class: Type[nn.Module], folder: str, device: str, text_config: TextConfig,
                     encoder_only: bool):
    """Our ``text_model_class`` from ``folder`` by our loader, with ``text_config``'s fields. An encoder without a
    head (``encoder_only``, ``AutoModel``) from a folder of a model with one is that model's encoder (as
    ``transformers`` strips ``base_model_prefix``): our loader builds the stored model, the encoder is inside it."""
    stored_class, _ = load_config(folder)
    overrides = text_config.to_dict()
    if stored_class is text_model_class or not encoder_only:
        return text_model_class.from_pretrained(folder, device=device, **overrides)
    stored = stored_class.from_pretrained(folder, device=device, **overrides)
    encoder = next((m for m in stored.children() if isinstance(m, text_model_class)), None)
    if encoder is None:
        raise UsageError(f'{folder} holds a {stored_class.__name__}, which has no {text_model_class.__name__} inside')
    encoder.tokenizer = stored.tokenizer
    return encoder


def _load_device_and_dtype(kwargs: Dict[str, Any]):
    """(device, dtype) from ``transformers``' ``device_map`` (one device only) and ``dtype`` / ``torch_dtype``
    (a ``torch.dtype``, its name, or 'auto': the stored dtype); removes them from ``kwargs``."""
    device_map = kwargs.pop('device_map', None)
    if device_map is not None and not isinstance(device_map, (str, torch.device, int)):
        raise NotImplementedError('device_map must name one device (e.g. "cpu", "cuda:0"); our models are not split')
    device = 'cpu' if device_map is None else str(torch.device(device_map))
    dtype = kwargs.pop('dtype', None)
    torch_dtype = kwargs.pop('torch_dtype', None)
    dtype = torch_dtype if dtype is None else dtype
    if dtype is None or dtype == 'auto':
        return device, None
    return device, getattr(torch, dtype) if isinstance(dtype, str) else dtype


# ------------------------------------------------------------------------------------------------ registration

_CONFIG_CLASSES: Dict[Type[TextConfig], Type[_TransformersTextConfig]] = {}
_MODEL_CLASSES: Dict[Type[nn.Module], Type[_TransformersTextModel]] = {}


def _make_config_class(text_config_class: Type[TextConfig]) -> Type[_TransformersTextConfig]:
    """``Transformers<our config>``: our fields and defaults as dataclass fields of a ``PreTrainedConfig``
    (``num_labels`` stays ``transformers``' property over ``id2label``)."""
    name = f'Transformers{text_config_class.__name__}'
    fields = [f for f in dataclasses.fields(text_config_class) if f.name != 'num_labels']
    namespace = {f.name: f.default for f in fields}
    namespace.update(__annotations__={f.name: f.type for f in fields}, __module__=__name__, __qualname__=name,
                     model_type=text_config_class.model_type, text_config_class=text_config_class,
                     __doc__=f'``transformers`` config of :class:`{text_config_class.__name__}` (module docstring).')
    return type(name, (_TransformersTextConfig,), namespace)


def _make_model_class(text_model_class: Type[nn.Module], task: str,
                      config_class: Type[_TransformersTextConfig]) -> Type[_TransformersTextModel]:
    """``Transformers<our model>``: holds and calls ``text_model_class``; causal LMs generate through
    ``transformers.GenerationMixin`` without a cache."""
    name = f'Transformers{text_model_class.__name__}'
    bases = (_TransformersTextModel, _NoCacheGenerationMixin) if task == 'causal_lm' else (_TransformersTextModel,)
    reads_token_types = 'token_type_ids' in inspect.signature(text_model_class.forward).parameters
    namespace = dict(
        __module__=__name__, __qualname__=name, config_class=config_class, text_model_class=text_model_class,
        output_class=_TASKS[task][1], _reads_token_types=reads_token_types,
        __doc__=f'``transformers`` model holding our :class:`{text_model_class.__name__}` (module docstring).')
    return type(name, bases, namespace)


def _register_all() -> None:
    """One config class per family, one model class per (family, task); each registered with its Auto class and
    importable from this module by name."""
    for family in registry.list_families():
        text_config_class = registry.config_class(family)
        config_class = _make_config_class(text_config_class)
        _CONFIG_CLASSES[text_config_class] = config_class
        globals()[config_class.__name__] = config_class
        AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
        for task in registry.list_tasks(family):
            text_model_class = registry.model_class(family, task)
            model_class = _make_model_class(text_model_class, task, config_class)
            _MODEL_CLASSES[text_model_class] = model_class
            globals()[model_class.__name__] = model_class
            _TASKS[task][0].register(config_class, model_class, exist_ok=True)


def transformers_config_class(text_config_class: Type[TextConfig]) -> Type[_TransformersTextConfig]:
    """The ``transformers`` config class made from our ``text_config_class`` (e.g. ``GMLPConfig``)."""
    return _CONFIG_CLASSES[text_config_class]


def transformers_class(text_model_class: Type[nn.Module]) -> Type[_TransformersTextModel]:
    """The ``transformers`` model class made from our ``text_model_class`` (e.g. ``GMLPForMaskedLM``)."""
    if text_model_class not in _MODEL_CLASSES:
        raise KeyError(f'{text_model_class.__name__} is not a registered text model; known: '
                       f'{", ".join(c.__name__ for c in _MODEL_CLASSES)}')
    return _MODEL_CLASSES[text_model_class]


def to_transformers(model: PretrainedMixin, label_names: Optional[List[str]] = None) -> _TransformersTextModel:
    """Our ``model`` inside its ``transformers`` class: the same module (shared weights, no copy), for
    ``transformers.pipeline`` or ``Trainer``. ``label_names``: ``id2label`` of a classifier."""
    wrapper_class = transformers_class(type(model))
    config = wrapper_class.config_class.from_text_config(model.config, type(model).__name__, label_names)
    return wrapper_class(config, text_model=model)


_register_all()
