""" Shared plumbing of the text models: configs, outputs, input checks, losses, save/load, sampling.

The conventions are Hugging Face ``transformers``' so that its ``Trainer`` and the habits of its users carry over:

* every model's ``forward`` takes ``input_ids`` (B, L), ``attention_mask`` (B, L), ``token_type_ids`` (B, L; the
  families with segment embeddings only) and ``labels``, and returns a :class:`TextModelOutput` whose fields are
  ``loss`` (only when labels are given) and ``logits``: ``out.logits``, ``out['logits']``, ``out[0]`` (the loss when
  labels were given, else the logits) and ``out.to_tuple()`` all work as on a ``transformers`` ``ModelOutput``;
* causal LMs take ``labels`` aligned with ``input_ids`` (``labels = input_ids`` is right) and shift them inside:
  position t is scored on token t + 1;
* every config is a dataclass with one naming scheme (``vocab_size``, ``hidden_size``, ``num_hidden_layers``,
  ``intermediate_size``, ``max_position_embeddings``, ``layer_norm_eps``, ``initializer_range``,
  ``hidden_dropout_prob``, ...); :meth:`TextConfig.from_dict` still reads the names of older checkpoints;
* padding is right padding: ``attention_mask`` rows are ones then zeros. Every family guarantees that padded
  positions never change a real position's output, so a padded batch gives each sequence the outputs it gets alone
  (checked by ``tests/test_text_models.py`` for every family). Any other mask stops with a one-line error.

Saving::

    model.save_pretrained('ckpt/', tokenizer=tok)   # config.json + model.safetensors (+ the tokenizer's files)
    model = type(model).from_pretrained('ckpt/')    # model.tokenizer is the saved tokenizer (None without one)
    model = mlp_vision.text.from_pretrained('ckpt/')  # dispatches on the architecture stored in config.json

``config.json`` holds ``{"architecture": <class name>, "config": <dataclass fields>, "format_version": 2,
"model_type": <family>}``; ``model_type`` (e.g. ``"mlp_vision_gmlp"``) is for ``transformers``' ``AutoConfig``
(:mod:`mlp_vision.text.hf_auto`), our loader does not need it, so folders written before it existed still load.
Weights are safetensors (no code runs when loading); a tied parameter is stored once, under its first name.
"""
import dataclasses
import json
import os
from collections import OrderedDict
from typing import Any, ClassVar, Dict, Mapping, Optional, Tuple, Type

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils._pytree as pytree
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from mlp_vision.errors import UsageError, check_model_size, check_range, read_json_file, short_repr
from ..weights import load_backbone, tied_aliases

__all__ = [
    'TextConfig', 'ModelOutput', 'TextModelOutput', 'PretrainedMixin', 'GenerationMixin', 'check_text_inputs',
    'masked_lm_loss', 'causal_lm_loss', 'scored_positions', 'sequence_classification_loss', 'init_linear_embedding', 'tied_decoder',
    'read_config', 'parse_config_payload', 'is_saved_folder', 'weight_file_shapes', 'check_text_model_size',
    'check_tokenizer_fits', 'pool_sequence',
    'check_classifier_pooling', 'CLASSIFIER_POOLINGS',
    'CONFIG_NAME', 'WEIGHTS_NAME', 'FORMAT_VERSION',
]

CONFIG_NAME = 'config.json'
WEIGHTS_NAME = 'model.safetensors'
# 1: configs with the families' own field names (max_seq_len, dim, depth, block_size, n_embd, ...);
# 2: one naming scheme for every family, gMLP padding masked by default
FORMAT_VERSION = 2


# ------------------------------------------------------------------------------------------------------ configs
# the size fields of the families (one naming scheme): a model needs at least one of each
_POSITIVE_SIZE_FIELDS = frozenset({
    'vocab_size', 'max_position_embeddings', 'hidden_size', 'num_hidden_layers', 'intermediate_size',
    'num_attention_heads', 'mlp_attention_hidden_size', 'num_ssm_states', 'type_vocab_size', 'num_labels'})

class TextConfig:
    """Base of the text configs (dataclasses): one field-naming scheme, older names still readable.

    Subclasses list ``legacy_names`` (old field name -> current name) and ``legacy_defaults`` (values a field
    takes in a checkpoint written before the field existed, ``format_version`` 1), and set ``model_type``: the
    family's name in ``config.json``, which ``transformers``' ``AutoConfig`` dispatches on
    (:mod:`mlp_vision.text.hf_auto` registers one ``transformers`` config per ``model_type``).
    """
    legacy_names: ClassVar[Dict[str, str]] = {}
    legacy_defaults: ClassVar[Dict[str, Any]] = {}
    model_type: ClassVar[str] = ''

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any], format_version: int = FORMAT_VERSION):
        """Build the config from ``fields``, renaming legacy names; unknown names stop with a ``TypeError``."""
        d = cls.rename_legacy(dict(fields))
        if format_version < 2:
            for name, value in cls.legacy_defaults.items():
                d.setdefault(name, value)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise TypeError(f'{cls.__name__} has no field {", ".join(map(repr, unknown))}; its fields are '
                            f'{", ".join(sorted(known))}')
        return cls(**d)

    @classmethod
    def rename_legacy(cls, d: dict) -> dict:
        """``d`` (modified in place) with the legacy field names replaced by the current ones."""
        for old, new in cls.legacy_names.items():
            if old in d:
                if new in d:
                    raise TypeError(f'{cls.__name__}: both {old!r} (the old name) and {new!r} given; use {new!r}')
                d[new] = d.pop(old)
        return d

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def check_fields(self) -> None:
        """:meth:`check_field_types` then :meth:`check_field_values`; every config's ``__post_init__`` calls it."""
        self.check_field_types()
        self.check_field_values()

    def check_field_values(self) -> None:
        """The ranges of the field names every family shares (a :class:`~mlp_vision.errors.UsageError`,
        which is a ``ValueError``): sizes >= 1, other integers >= 0, epsilons > 0, dropout rates in [0, 1), every
        float finite. A config comes from the command line or from a file someone may have edited: a NaN
        ``layer_norm_eps`` builds a model whose every score is NaN, a zero size one that fails later."""
        for f in dataclasses.fields(self):
            value, name = getattr(self, f.name), f'{type(self).__name__}.{f.name}'
            if value is None or isinstance(value, (bool, str)):
                continue
            if f.name in _POSITIVE_SIZE_FIELDS:
                check_range(name, value, low=1)
            elif f.name.endswith('_eps'):
                check_range(name, value, low=0, low_open=True)
            elif 'dropout' in f.name or f.name.endswith(('_prob', 'drop_path_rate')):
                check_range(name, value, low=0, high=1, high_open=True)
            elif isinstance(value, int):
                check_range(name, value, low=0)
            else:
                check_range(name, value)

    def check_field_types(self) -> None:
        """Every ``bool`` / ``int`` / ``float`` / ``str`` field holds that type (an int is a float too); a
        ``TypeError`` otherwise. Command-line kwargs arrive as Python literals, and an unparsed ``'false'`` would be
        a true string: it must stop the run, not switch the option on. Subclasses call it in ``__post_init__``."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            ok = {bool: lambda v: isinstance(v, bool),
                  int: lambda v: isinstance(v, int) and not isinstance(v, bool),
                  float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
                  str: lambda v: isinstance(v, str)}.get(f.type)
            if ok is not None and not ok(value):
                hint = ' (write True or False)' if f.type is bool else ''
                raise TypeError(f'{type(self).__name__}.{f.name} must be a {f.type.__name__}{hint}, got {value!r} '
                                f'({type(value).__name__})')


# ------------------------------------------------------------------------------------------------------ outputs

class ModelOutput(OrderedDict):
    """A dataclass that is also an ordered dict of its non-None fields, as ``transformers.utils.ModelOutput``.

    ``out.logits``, ``out['logits']``, ``out[0]`` (first non-None field), ``out.to_tuple()`` and ``dict(out)``;
    ``'loss' in out`` is False when no loss was computed. Registered as a pytree node so ``torch.compile``,
    ``torch.export`` and DDP see the tensors inside.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        pytree.register_pytree_node(
            cls,
            lambda out: (list(out.values()), list(out.keys())),
            lambda values, keys: cls(**dict(zip(keys, values))),
            serialized_type_name=f'{cls.__module__}.{cls.__qualname__}',
        )

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None:
                super().__setitem__(field.name, value)

    def __getitem__(self, key):
        if isinstance(key, str):
            return super().__getitem__(key)
        return self.to_tuple()[key]

    def __setattr__(self, name, value):
        if value is not None and name in {f.name for f in dataclasses.fields(self)}:
            super().__setitem__(name, value)
        super().__setattr__(name, value)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def __reduce__(self):  # pickle / deepcopy as the dataclass, not as an OrderedDict
        return type(self), tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    def to_tuple(self) -> Tuple[Any, ...]:
        return tuple(self.values())


@dataclasses.dataclass(eq=False)
class TextModelOutput(ModelOutput):
    """What every text model's ``forward`` returns.

    loss: scalar mean loss, present only when ``labels`` were given.
    logits: (B, L, vocab_size) for language models, (B, num_labels) for sequence classification.
    """
    loss: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = None


# ----------------------------------------------------------------------------------------------- input checks

def check_text_inputs(
        input_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor],
        max_length: int,
        token_type_ids: Optional[torch.Tensor] = None,
) -> Optional[torch.Tensor]:
    """Check the shapes (and the padding layout) of a text model's inputs; returns the mask as bool (or None).

    ``input_ids`` must be (B, L) with 1 <= L <= ``max_length``; ``attention_mask`` and ``token_type_ids``, when
    given, (B, L). The mask must be right padding (each row ones then zeros): the families' exactness guarantee
    (padded positions never change a real position's output) holds for right padding only, since every family
    reads absolute positions. The value and layout check needs the mask's values, so it is skipped while tracing
    or compiling (where it would break the graph); shapes are always checked.
    """
    if input_ids.dim() != 2:
        raise ValueError(f'input_ids must be (batch, length), got shape {tuple(input_ids.shape)}')
    length = input_ids.shape[1]
    if not 1 <= length <= max_length:
        raise ValueError(f'sequence length {length} outside [1, {max_length}] (max_position_embeddings)')
    if token_type_ids is not None and token_type_ids.shape != input_ids.shape:
        raise ValueError(f'token_type_ids shape {tuple(token_type_ids.shape)} != input_ids shape '
                         f'{tuple(input_ids.shape)}')
    if attention_mask is None:
        return None
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f'attention_mask shape {tuple(attention_mask.shape)} != input_ids shape '
                         f'{tuple(input_ids.shape)}')
    mask = attention_mask if attention_mask.dtype == torch.bool else attention_mask != 0
    if not (torch.jit.is_tracing() or torch.compiler.is_compiling()):
        if attention_mask.dtype != torch.bool and bool(((attention_mask != 0) & (attention_mask != 1)).any()):
            raise ValueError('attention_mask must hold 1 (real token) or 0 (padding); got other values '
                             '(labels or token ids passed positionally? use keywords)')
        if length > 1 and bool((mask[:, 1:] & ~mask[:, :-1]).any()):
            raise ValueError('attention_mask must be right padding (each row ones, then zeros); got a real token '
                             'after a padded one')
    return mask


# ------------------------------------------------------------------------------------------------------- losses

def masked_lm_loss(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Mean token cross-entropy in float32. logits: (B, L, V); labels: (B, L) int64, ``ignore_index`` not scored."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                           ignore_index=ignore_index)


def scored_positions(hidden: torch.Tensor, labels: Optional[torch.Tensor], sparse_prediction: bool
                     ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """What a masked-LM head decodes: ``(hidden (B, L, d), labels (B, L))`` unchanged, or with ``sparse_prediction``
    and labels given only the scored positions, ``(hidden (N, d), labels (N,))`` with N = ``(labels != -100).sum()``.

    Sparse prediction runs the head (transform, V-way decoder) on the ~15 % of positions the loss scores instead of
    all of them -- the same loss and gradients, a fraction of the head's cost, which at a small width dominates the
    step (V d per token against ~12 d^2 per layer). ``transformers``' ModernBERT has the same switch
    (``sparse_prediction``); the logits are then (N, V), one row per scored position in row-major order.
    """
    if not sparse_prediction or labels is None:
        return hidden, labels
    scored = labels != -100
    return hidden[scored], labels[scored]


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Next-token loss with ``labels`` aligned to the inputs (``labels = input_ids``): position t predicts label
    t + 1, as ``transformers``' causal LMs. logits: (B, L, V); labels: (B, L)."""
    return masked_lm_loss(logits[:, :-1], labels[:, 1:], ignore_index)


def sequence_classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over (B, num_labels) logits with (B,) class ids; MSE when num_labels == 1 (regression)."""
    if logits.shape[-1] == 1:
        return F.mse_loss(logits.squeeze(-1).float(), labels.float())
    return F.cross_entropy(logits.float(), labels)


# what a sequence classifier reads (``config.classifier_pooling``, ModernBERT's field name in ``transformers``)
CLASSIFIER_POOLINGS = ('cls', 'mean')


def check_classifier_pooling(pooling: str) -> None:
    """A ``ValueError`` unless ``pooling`` is one of :data:`CLASSIFIER_POOLINGS`."""
    if pooling not in CLASSIFIER_POOLINGS:
        raise ValueError(f'classifier_pooling must be one of {CLASSIFIER_POOLINGS}, got {pooling!r}')


def pool_sequence(hidden: torch.Tensor, attention_mask: Optional[torch.Tensor], pooling: str,
                  cls_index: int = 0) -> torch.Tensor:
    """One vector per sequence for a classifier: the state at ``cls_index`` (``'cls'``: BERT's [CLS], arXiv
    1810.04805 §3) or the mean over the real tokens (``'mean'``: the official BiGS pooler; with MLM-only pretraining
    no objective trains the [CLS] state, while every token state is trained).

    Shapes: hidden (B, L, d); attention_mask optional (B, L), 1 / True = real token (None: every position) -> (B, d).
    """
    if pooling == 'cls':  # the configs check the value once, at init; an unknown one still cannot pass below
        return hidden[:, cls_index]
    if pooling != 'mean':
        check_classifier_pooling(pooling)
    if attention_mask is None:
        return hidden.mean(dim=1)
    w = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, L, 1)
    return (hidden * w).sum(dim=1) / w.sum(dim=1).clamp(min=1)


def init_linear_embedding(module: nn.Module, std: float) -> None:
    """BERT/GPT-style init: Linear and Embedding weights ~ N(0, std), Linear biases 0.

    Only ``nn.Linear`` / ``nn.Embedding`` are touched, so the SGU's raw ``weight`` / ``bias`` parameters (W ~ 0,
    b = 1: "important to initialize W close to zero", gMLP arXiv 2105.08050 §2), the SSM parameters and the
    LayerNorms keep their own init. Use with ``model.apply``.
    """
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=std)


def tied_decoder(embedding: nn.Embedding, device=None, dtype=None) -> nn.Linear:
    """The d -> V output Linear (no bias) of a language model whose weight IS ``embedding``'s: one parameter,
    counted once by ``parameters()`` and saved once by safetensors (BERT's weight tying, arXiv 1810.04805)."""
    decoder = nn.Linear(embedding.embedding_dim, embedding.num_embeddings, bias=False, device=device, dtype=dtype)
    decoder.weight = embedding.weight
    return decoder


# -------------------------------------------------------------------------------------------------- save / load

def read_config(directory: str) -> Tuple[str, dict, int]:
    """(architecture name, config fields, format version) of a folder written by ``save_pretrained``.

    A missing ``config.json`` is a ``FileNotFoundError`` and one of another layout (an official BiGS folder's) a
    ``ValueError``; a damaged one (not JSON, wrong value types) a :class:`~mlp_vision.errors.UsageError`
    naming the file.
    """
    path = os.path.join(directory, CONFIG_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f'{directory} has no {CONFIG_NAME}: not a folder written by save_pretrained')
    return parse_config_payload(read_json_file(path), path)


def parse_config_payload(payload: Any, path: str) -> Tuple[str, dict, int]:
    """:func:`read_config` of the parsed JSON ``payload`` of the file ``path`` (named by the errors)."""
    if not isinstance(payload, dict) or 'architecture' not in payload or 'config' not in payload:
        raise ValueError(f'{path} is not a config written by save_pretrained (no "architecture" / "config"); for an '
                         f'official BiGS folder use BiGSForMaskedLM.from_official')
    if not isinstance(payload['architecture'], str) or not isinstance(payload['config'], dict):
        raise UsageError(f'{path}: "architecture" must be a class name and "config" a mapping of fields')
    try:
        version = int(payload.get('format_version', 1))
    except (TypeError, ValueError):
        raise UsageError(f'{path}: format_version must be an integer, got {payload["format_version"]!r}') from None
    return payload['architecture'], payload['config'], version


def is_saved_folder(directory: str) -> bool:
    """Whether ``directory`` holds a ``config.json`` of ``save_pretrained``'s layout (False: none, or another layout,
    e.g. an official BiGS folder's); a damaged one is a :class:`~mlp_vision.errors.UsageError`."""
    try:
        read_config(directory)
    except UsageError:
        raise
    except (FileNotFoundError, ValueError):
        return False
    return True


def weight_file_shapes(path: str) -> Dict[str, Tuple[int, ...]]:
    """The tensor shapes a safetensors file holds (its header only); a missing, empty or damaged file is a
    :class:`~mlp_vision.errors.UsageError` naming it."""
    if not os.path.isfile(path):
        raise UsageError(f'{path} does not exist: the folder has {CONFIG_NAME} but not the weights it describes')
    try:
        with safe_open(path, framework='pt') as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except SafetensorError as e:
        raise UsageError(f'{path} is not a readable safetensors file ({e}); it is empty, truncated or '
                         f'damaged') from None


def _check_weight_shapes(model: nn.Module, weights_path: str, config_path: str) -> None:
    """Every tensor of ``weights_path`` that ``model`` (built from ``config_path``) has must have its shape."""
    own = {k: tuple(v.shape) for k, v in _unique_state_dict(model).items()}
    for key, shape in weight_file_shapes(weights_path).items():
        if key in own and own[key] != shape:
            raise UsageError(f'{weights_path} does not fit {config_path}: {key} is {shape} in the weights but '
                             f'{own[key]} by the config; the config was edited or belongs to other weights')


def check_text_model_size(model_cls: type, config: 'TextConfig', source: str) -> None:
    """Refuse (:func:`~mlp_vision.errors.check_model_size`, a :class:`UsageError` naming ``source`` and the size
    fields) a ``model_cls(config)`` beyond :data:`~mlp_vision.errors.MAX_PARAMS` parameters, counted on the
    ``meta`` device before anything is allocated: a ``config.json`` or a checkpoint's saved config may say
    ``hidden_size`` 4096 and 100,000 layers."""
    sizes = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name in _POSITIVE_SIZE_FIELDS}
    check_model_size(lambda: model_cls(config, device='meta'), f'{source}: {model_cls.__name__} with {short_repr(sizes)}')


def check_tokenizer_fits(tokenizer, config: 'TextConfig', source: str) -> None:
    """A model's vocabulary is its tokenizer's: a :class:`~mlp_vision.errors.UsageError` when the sizes
    differ (ids past the embedding fail, embedding rows without a token predict what cannot be written)."""
    if tokenizer is not None and tokenizer.vocab_size != config.vocab_size:
        raise UsageError(f'{source}: the model has vocab_size {config.vocab_size} but its tokenizer has '
                         f'{tokenizer.vocab_size} tokens; they do not belong together (the config was edited, or the '
                         f'tokenizer files come from another model)')


def _unique_state_dict(module: nn.Module) -> Dict[str, torch.Tensor]:
    """The state dict with each tied parameter under its first name only (registration order: the backbone's
    embedding, not the LM decoder that shares it), so that a backbone-only model finds it in the file."""
    aliases = set(tied_aliases(module))
    return {k: v.contiguous() for k, v in module.state_dict().items() if k not in aliases}


class PretrainedMixin:
    """``save_pretrained`` / ``from_pretrained`` for an ``nn.Module`` with a :class:`TextConfig` ``self.config``.

    Subclasses set ``config_class`` and may set ``head_prefixes``: the state-dict prefixes of their task-specific
    head. Loading a checkpoint of a *different* architecture with the same config class (e.g. a masked-LM
    checkpoint into a sequence classifier) is allowed when the only missing keys are the new head's.
    ``tokenizer`` is the tokenizer saved beside the weights (or attached by the user); it is not a module and
    holds no parameters.
    """
    config_class: Type[TextConfig] = None
    head_prefixes: Tuple[str, ...] = ()
    tokenizer = None
    input_embeddings_path: str = ''  # dotted name of the token embedding, for get_input_embeddings

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding (``vocab_size`` rows) that ``input_ids`` index, as ``transformers``'
        ``PreTrainedModel.get_input_embeddings`` (what PEFT and embedding-freezing code ask for)."""
        return self.get_submodule(self.input_embeddings_path)

    def save_pretrained(self, save_directory: str, tokenizer=None) -> None:
        """Write ``config.json``, ``model.safetensors`` and the tokenizer (``tokenizer``, else ``self.tokenizer``,
        if any; see :meth:`mlp_vision.text.tokenizer.Tokenizer.save_pretrained`) to ``save_directory``.

        Each file is written to a temporary name and renamed, so an interrupted save never leaves a torn file.
        """
        os.makedirs(save_directory, exist_ok=True)
        payload = {'architecture': type(self).__name__, 'config': self.config.to_dict(),
                   'format_version': FORMAT_VERSION}
        if self.config.model_type:  # what transformers' AutoConfig reads (mlp_vision.text.hf_auto); we do not
            payload['model_type'] = self.config.model_type
        cfg_path = os.path.join(save_directory, CONFIG_NAME)
        with open(cfg_path + '.tmp', 'w', encoding='utf-8') as f:
            json.dump(payload, f, indent=2, sort_keys=True)
        os.replace(cfg_path + '.tmp', cfg_path)
        w_path = os.path.join(save_directory, WEIGHTS_NAME)
        save_file(_unique_state_dict(self), w_path + '.tmp', metadata={'format': 'pt', 'architecture': type(self).__name__})
        os.replace(w_path + '.tmp', w_path)
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        if tokenizer is not None:
            tokenizer.save_pretrained(save_directory)

    @classmethod
    def from_pretrained(
            cls,
            directory: str,
            device: str = 'cpu',
            strict: Optional[bool] = None,
            **overrides: Any,
    ):
        """Build the model from ``directory/config.json`` (fields updated by ``overrides``) and load its weights;
        ``model.tokenizer`` is the folder's tokenizer, or None when it has none.

        Args:
            directory: a folder written by :meth:`save_pretrained`.
            device: where the weights are loaded to.
            strict: require every key to match. Default: True when the checkpoint's architecture is this class;
                False when it is another architecture of the same config class, in which case only the keys of
                this class's head (``head_prefixes``) may be missing.
            **overrides: config fields to change (e.g. ``num_labels=3``, ``hidden_dropout_prob=0.1``). Fields that
                change parameter shapes make the load fail.
        """
        from .tokenizer import find_tokenizer
        arch, fields, version = read_config(directory)
        config_path = os.path.join(directory, CONFIG_NAME)
        siblings = _architectures(cls.config_class)
        if arch not in siblings:
            raise TypeError(f'{directory} holds a {arch}; {cls.__name__} needs a {cls.config_class.__name__} model '
                            f'({", ".join(sorted(siblings))})')
        try:
            config = cls.config_class.from_dict(fields, format_version=version)
        except (TypeError, ValueError) as e:
            raise UsageError(f'{config_path}: {e}') from None
        config = dataclasses.replace(config, **cls.config_class.rename_legacy(dict(overrides)))
        tokenizer = find_tokenizer(directory)
        check_tokenizer_fits(tokenizer, config, directory)
        check_text_model_size(cls, config, config_path)
        model = cls(config)
        same_arch = arch == cls.__name__
        strict = same_arch if strict is None else strict
        weights_path = os.path.join(directory, WEIGHTS_NAME)
        _check_weight_shapes(model, weights_path, config_path)
        report = load_backbone(model, load_file(weights_path),
                               () if strict or same_arch else cls.head_prefixes, weights_path)
        if strict and (report.missing or report.unused):
            detail = (f'missing {report.missing[:8]}' if report.missing else f'unexpected {report.unused[:8]}')
            raise UsageError(f'{weights_path} does not fit {arch}: {detail}')
        if not strict and not same_arch and report.missing:
            bad = report.missing
            raise RuntimeError(f'{arch} checkpoint in {directory} lacks weights {cls.__name__} needs outside '
                               f'its head: {bad[:8]}{"..." if len(bad) > 8 else ""}')
        model.to(device)
        model.tokenizer = tokenizer
        return model


def _architectures(config_class) -> Dict[str, type]:
    """Name -> model class of the classes built on ``config_class``: the subclasses of :class:`PretrainedMixin` that
    name it. The models import this module and never the registry, so ``from_pretrained`` finds a folder's
    architecture here instead of in :mod:`mlp_vision.text.registry` (which imports the models)."""
    found, todo = {}, list(PretrainedMixin.__subclasses__())
    while todo:
        c = todo.pop()
        todo.extend(c.__subclasses__())
        if c.config_class is config_class:
            found.setdefault(c.__name__, c)
    return found


class GenerationMixin:
    """Autoregressive sampling for causal LMs whose ``forward(input_ids)`` returns :class:`TextModelOutput`.

    Contexts longer than ``config.max_position_embeddings`` are cropped to their last tokens, as in nanoGPT.
    """

    @torch.no_grad()
    def generate(
            self,
            input_ids: torch.Tensor,
            max_new_tokens: int,
            temperature: float = 1.0,
            top_k: Optional[int] = None,
            generator: Optional[torch.Generator] = None,
    ) -> torch.Tensor:
        """Append ``max_new_tokens`` sampled tokens to ``input_ids``.

        Args:
            input_ids: (B, T) int64 prompt, T >= 1 (a single token works).
            max_new_tokens: number of tokens to sample.
            temperature: logits are divided by it; ``<= 0`` means greedy (argmax) decoding.
            top_k: keep only the k most likely tokens before sampling (None = all).
            generator: optional ``torch.Generator`` for reproducible sampling.

        Returns: (B, T + max_new_tokens) int64. The model runs in eval mode (dropout off) during sampling and is put
        back into its previous mode afterwards.
        """
        if input_ids.dim() != 2 or input_ids.shape[1] < 1:
            raise ValueError(f'input_ids must be (B, T) with T >= 1, got shape {tuple(input_ids.shape)}')
        check_range('max_new_tokens', max_new_tokens, low=0)
        check_range('temperature', temperature, why='<= 0: greedy')  # NaN would sample from NaN probabilities
        if top_k is not None:
            check_range('top_k', top_k, low=1)
        context = self.config.max_position_embeddings
        was_training = self.training
        self.eval()
        try:
            for _ in range(max_new_tokens):
                logits = self(input_ids[:, -context:]).logits[:, -1, :]  # (B, vocab)
                if temperature <= 0:
                    next_id = logits.argmax(dim=-1, keepdim=True)
                else:
                    logits = logits / temperature
                    if top_k is not None:
                        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
                        logits = logits.masked_fill(logits < kth, float('-inf'))
                    next_id = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
                input_ids = torch.cat((input_ids, next_id), dim=1)
        finally:
            self.train(was_training)
        return input_ids
