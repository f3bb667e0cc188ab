""" Shared plumbing of the text models: every config a :class:`TextConfig` (a ``transformers.PreTrainedConfig``),
every model a :class:`TextPreTrainedModel` (a ``PreTrainedModel``), one class per family and task as ``transformers``'
``modeling_bert.py``. What we add:

* ``forward`` takes ``input_ids``, ``attention_mask``, ``token_type_ids`` (B, L) and ``labels``; causal LMs shift
  ``labels = input_ids`` inside; padding is right padding (:func:`check_text_inputs`);
* config values are checked when the config is made (:meth:`TextConfig.check_fields`);
* ``from_pretrained`` reads local folders only and first checks them: a model within
  :data:`~mlp_vision.bounds.MAX_PARAMS`, weights of the config's shapes, finite and of the right kind, a tokenizer
  that fits the vocabulary (``model.tokenizer``); a folder of another task of the family loads the backbone and a
  new head.
"""
import contextlib
import dataclasses
import os
from typing import Any, ClassVar, Dict, List, Literal, Optional, Tuple, get_args, get_origin

import torch
import torch.nn as nn
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from transformers import GenerationMixin, PreTrainedConfig, PreTrainedModel, initialization as init
from transformers.generation.configuration_utils import GenerationConfig
from transformers.utils import CONFIG_NAME, SAFE_WEIGHTS_NAME as WEIGHTS_NAME, logging as transformers_logging

from mlp_vision.arguments import check_range, read_json_file
from mlp_vision.bounds import check_activation_size, check_block_count, check_model_size
from mlp_vision.errors import UsageError, short_repr
from ..weights import check_weights

__all__ = [
    'TextConfig', 'TextPreTrainedModel', 'TextGenerationMixin', 'check_text_inputs', 'read_config',
    'is_saved_folder', 'check_text_model_size', 'check_text_activations', 'check_tokenizer_fits', 'pool_sequence',
    'ClassifierPooling', 'CONFIG_NAME', 'WEIGHTS_NAME',
]


# ------------------------------------------------------------------------------------------------------ configs
# the size fields of the families (one naming scheme): a model needs at least one of each
_POSITIVE_SIZE_FIELDS = frozenset({
    'vocab_size', 'max_position_embeddings', 'hidden_size', 'num_hidden_layers', 'intermediate_size',
    'num_attention_heads', 'mlp_attention_hidden_size', 'num_ssm_states', 'type_vocab_size', 'num_labels'})
# what transformers itself passes to a config besides its fields (PreTrainedConfig.__post_init__ takes them), and the
# generation parameters (its Trainer writes use_cache into config.json; PreTrainedConfig drops them); any other
# unknown keyword is a misspelt field and stops
_TRANSFORMERS_CONFIG_KWARGS = frozenset({
    'num_labels', 'torch_dtype', 'name_or_path', 'output_attentions', 'attn_implementation', 'experts_implementation',
    'per_layer_config', 'model_type', 'use_return_dict'} | set(GenerationConfig().to_dict()))
_BASE_FIELDS = frozenset(f.name for f in dataclasses.fields(PreTrainedConfig))
_TYPE_CHECKS = {bool: lambda v: isinstance(v, bool),
                int: lambda v: isinstance(v, int) and not isinstance(v, bool),
                float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
                str: lambda v: isinstance(v, str)}
# what a sequence classifier reads: the state at cls_index ([CLS], arXiv 1810.04805 §3) or the mean over the real
# tokens (the official BiGS pooler); ModernBERT's field name in transformers
ClassifierPooling = Literal['cls', 'mean']


class TextConfig(PreTrainedConfig):
    """Base of the text configs: a ``transformers`` ``PreTrainedConfig`` whose own fields are checked when made.

    Subclasses declare their fields (dataclass style, as ``transformers``' ``BertConfig``; a ``Literal`` type lists
    the values allowed), set ``model_type`` (the key ``AutoConfig`` dispatches on, ``mlp_vision_<family>``).

    Fields several families share: ``vocab_size`` V; ``max_position_embeddings``, the longest input;
    ``initializer_range``, the std of the normal init of Linear / Embedding weights; ``pad_token_id``, whose
    embedding row starts at zero and gets no gradient; ``num_labels`` (``transformers``', the length of
    ``id2label``), the classifier's outputs, one meaning regression (``problem_type='regression'``: our head is
    trained with MSE, so pipelines apply no sigmoid); ``classifier_dropout``, before the classifier;
    ``classifier_pooling`` (:data:`ClassifierPooling`); ``sparse_prediction``: a masked LM given labels decodes only
    the N scored positions, logits (N, V) in row-major order -- the same loss and gradients for a fraction of the
    decoder's cost (V d per token), as ModernBERT's.
    """

    def __post_init__(self, **kwargs):
        unknown = sorted(k for k in kwargs if k not in _TRANSFORMERS_CONFIG_KWARGS and not k.startswith('_'))
        if unknown:
            raise TypeError(f'{type(self).__name__} has no field {", ".join(map(repr, unknown))}; its fields are '
                            f'{", ".join(sorted(self.text_field_names()))}')
        super().__post_init__(**kwargs)
        if self.num_labels == 1 and self.problem_type is None:
            self.problem_type = 'regression'
        self.check_fields()

    @classmethod
    def text_field_names(cls) -> List[str]:
        """The fields this family declares (not ``transformers``' common ones), and ``num_labels``."""
        return [f.name for f in dataclasses.fields(cls) if f.name not in _BASE_FIELDS] + ['num_labels']

    def text_fields(self) -> Dict[str, Any]:
        """Our fields and their values: what ``create_model`` takes and what two equal models share."""
        return {name: getattr(self, name) for name in self.text_field_names()}

    def check_fields(self) -> None:
        """Types and ``Literal`` values, then the ranges of the field names every family shares (a
        :class:`~mlp_vision.errors.UsageError`, which is a ``ValueError``): sizes >= 1, other integers >= 0, epsilons
        > 0, dropout rates in [0, 1), every float finite; ``num_hidden_layers`` within
        :func:`mlp_vision.bounds.check_block_count`'s bound; ``pad_token_id`` < ``vocab_size``, ``hidden_size``
        divisible by ``num_attention_heads``. A config comes from the command line or from a file someone may have
        edited: a NaN ``layer_norm_eps`` builds a model whose every score is NaN, an unparsed ``'false'`` is a true
        string."""
        names = self.text_field_names()
        for name in names:
            value, where = getattr(self, name), f'{type(self).__name__}.{name}'
            field = self.__dataclass_fields__.get(name)
            kind = field.type if field is not None else int  # num_labels: transformers' property
            if get_origin(kind) is Literal and value not in get_args(kind):
                raise ValueError(f'{name} must be one of {get_args(kind)}, got {value!r}')
            if kind in _TYPE_CHECKS and not _TYPE_CHECKS[kind](value):
                hint = ' (write True or False)' if kind is bool else ''
                raise TypeError(f'{where} must be a {kind.__name__}{hint}, got {value!r} ({type(value).__name__})')
            if value is None or isinstance(value, (bool, str)):
                continue
            if name in _POSITIVE_SIZE_FIELDS:
                check_range(where, value, low=1)
                if name == 'num_hidden_layers':  # before any layer is built (a meta build of 100,000 takes minutes)
                    check_block_count(value, f'{where}={value!r}')
            elif name.endswith('_eps'):
                check_range(where, value, low=0, low_open=True)
            elif 'dropout' in name or name.endswith(('_prob', 'drop_path_rate')):
                check_range(where, value, low=0, high=1, high_open=True)
            elif isinstance(value, int):
                check_range(where, value, low=0)
            else:
                check_range(where, value)
        if 'pad_token_id' in names and self.pad_token_id >= self.vocab_size:
            raise ValueError(f'pad_token_id {self.pad_token_id} outside [0, {self.vocab_size})')
        if 'num_attention_heads' in names and self.hidden_size % self.num_attention_heads:
            raise ValueError(f'hidden_size {self.hidden_size} not divisible by num_attention_heads '
                             f'{self.num_attention_heads}')

    @classmethod
    def from_dict(cls, config_dict: Dict[str, Any], **kwargs):
        """``transformers``' ``from_dict`` (what ``from_pretrained`` and ``AutoConfig`` call): a ``config.json`` of
        another family stops (:class:`WrongFamilyError`), keyword arguments that are our fields are checked as the
        others."""
        config_dict = dict(config_dict)
        folder = kwargs.get('name_or_path')
        stored_type = config_dict.get('model_type', cls.model_type)
        if stored_type != cls.model_type:
            raise WrongFamilyError(f'{os.path.join(folder or "", CONFIG_NAME)} holds a {stored_type} model; '
                                   f'{cls.__name__} reads {cls.model_type}')
        names = set(cls.text_field_names())
        config_dict.update({k: kwargs.pop(k) for k in list(kwargs) if k in names})
        return super().from_dict(config_dict, **kwargs)


class WrongFamilyError(TypeError):
    """A folder of another family (``model_type``) than the config class that reads it."""


# ------------------------------------------------------------------------------------------------------- models
# forward arguments that transformers' generate, pipelines and Trainer pass besides the inputs
_FORWARD_KWARGS = frozenset({
    'use_cache', 'past_key_values', 'cache_position', 'output_hidden_states', 'output_attentions',
    'position_ids', 'logits_to_keep'})


@contextlib.contextmanager
def _no_progress_bars():
    """``transformers``' progress bars off (a one-file save or load of a small folder needs none, and the commands'
    stderr is their one-line errors), back as they were after."""
    enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            transformers_logging.enable_progress_bar()


class TextPreTrainedModel(PreTrainedModel):
    """Base of the text models: ``transformers``' ``PreTrainedModel`` with the checks of the module docstring.

    Subclasses set ``config_class``, ``base_model_prefix`` (the backbone's attribute) and ``head_prefixes`` (the
    state-dict prefixes of their task head: what may be new when a folder of another task of the family is loaded).
    ``tokenizer`` is the tokenizer saved beside the weights (or attached by the user); not a module.
    """
    config_class = TextConfig
    main_input_name = 'input_ids'
    # transformers' get_input_embeddings: this attribute, else embeddings.<it>, else the base model's
    _input_embed_layer = 'word_embeddings'
    head_prefixes: ClassVar[Tuple[str, ...]] = ()
    # our losses are means over the batch's scored tokens / examples and forward takes no num_items_in_batch, so
    # transformers.Trainer averages over gradient-accumulation steps itself (it asks this attribute)
    accepts_loss_kwargs = False
    tokenizer = None

    def post_init(self):
        super().post_init()
        if self.can_generate():
            self.generation_config.use_cache = False  # our causal LMs keep no cache (TextGenerationMixin)

    def check_forward_kwargs(self, kwargs: Dict[str, Any]) -> None:
        """The ``kwargs`` a ``forward`` got besides its inputs may be what ``generate``, pipelines and ``Trainer``
        pass; any other keyword is an error (a misspelt ``attention_mask`` must not pass unseen), and so are the
        per-layer outputs our models do not collect."""
        unknown = sorted(k for k, v in kwargs.items() if k not in _FORWARD_KWARGS and v is not None)
        if unknown:
            raise TypeError(f'{type(self).__name__}.forward got arguments it does not take: {unknown}')
        if kwargs.get('output_hidden_states') or kwargs.get('output_attentions'):
            raise NotImplementedError(f'{type(self).__name__} returns logits (or the last hidden states) only; our '
                                      f'models do not collect per-layer hidden states or attention weights')

    def _init_weights(self, module: nn.Module) -> None:
        """``transformers``' init and the zero output bias of our LM heads; ``from_pretrained`` runs it for what the
        folder does not hold (a new head, the non-persistent buffers). Each family adds what its own layers compute
        when built, as ``transformers``' ``modeling_bert.py`` does."""
        super()._init_weights(module)
        if isinstance(module, TextPreTrainedModel) and getattr(module, 'output_bias', None) is not None:
            init.zeros_(module.output_bias)

    def save_pretrained(self, save_directory, *args, tokenizer=None, **kwargs) -> None:
        """``transformers``' ``save_pretrained``, plus the tokenizer's files (``tokenizer``, else
        ``self.tokenizer``, if any; a ``transformers.PreTrainedTokenizerFast``'s ``save_pretrained``)."""
        if args and not isinstance(args[0], bool):  # transformers' second argument is is_main_process
            raise TypeError(f'{type(self).__name__}.save_pretrained: pass the tokenizer as tokenizer=..., not '
                            f'positionally (the second argument is transformers\' is_main_process)')
        if kwargs.get('push_to_hub'):
            raise NotImplementedError(f'{type(self).__name__}.save_pretrained writes local folders only: no '
                                      f'push_to_hub')
        with _no_progress_bars():
            super().save_pretrained(save_directory, *args, **kwargs)
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        if tokenizer is not None and kwargs.get('is_main_process', True):
            tokenizer.save_pretrained(os.fspath(save_directory))

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, config: Optional[TextConfig] = None,
                        strict: Optional[bool] = None, allow_regex: bool = False, **kwargs):
        """``transformers``' ``from_pretrained`` on a local folder, after the checks of the module docstring;
        ``model.tokenizer`` is the folder's tokenizer (None without one). Keyword arguments that are config fields
        change the config (``num_labels=3`` for a new head, ``hidden_dropout_prob=0.1``; fields that change weight
        shapes stop). ``strict``: every weight must match (default: when the folder holds this very class;
        otherwise only this class's head, ``head_prefixes``, may be new). ``allow_regex``: the folder's
        ``tokenizer.json`` may hold a regular expression (:func:`~mlp_vision.text.tokenizer.check_no_regex`)."""
        from .tokenizer import find_tokenizer
        folder = os.fspath(pretrained_model_name_or_path)
        if not os.path.isdir(folder):
            raise UsageError(f'{folder} is not a folder: {cls.__name__} loads folders written by save_pretrained '
                             f'(nothing is downloaded)')
        config_path, weights_path = os.path.join(folder, CONFIG_NAME), os.path.join(folder, WEIGHTS_NAME)
        if config is None:
            names = set(cls.config_class.text_field_names())
            overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
            config = load_text_config(cls.config_class, folder, **overrides)
        tokenizer = find_tokenizer(folder, allow_regex)
        check_tokenizer_fits(tokenizer, config, folder)
        check_text_model_size(cls, config, config_path)
        _check_weights_file(cls, config, weights_path, config_path)
        want_info = kwargs.pop('output_loading_info', False)
        with _no_progress_bars():
            model, info = super().from_pretrained(folder, *model_args, config=config, output_loading_info=True,
                                                  **kwargs)
        stored = (config.architectures or [cls.__name__])[0]
        strict = stored == cls.__name__ if strict is None else strict
        missing, unexpected = sorted(info['missing_keys']), sorted(info['unexpected_keys'])
        if strict and (missing or unexpected):
            detail = f'missing {missing[:8]}' if missing else f'unexpected {unexpected[:8]}'
            raise UsageError(f'{weights_path} does not fit {stored}: {detail}')
        outside_head = [k for k in missing if not k.startswith(cls.head_prefixes or ('\0',))]
        if outside_head:
            raise RuntimeError(f'{stored} checkpoint in {folder} lacks weights {cls.__name__} needs outside its '
                               f'head: {outside_head[:8]}{"..." if len(outside_head) > 8 else ""}')
        model.tokenizer = tokenizer
        return (model, info) if want_info else model


class TextGenerationMixin(GenerationMixin):
    """``transformers``' ``generate`` for our causal LMs, which keep no cache: each step reads the whole prefix,
    cropped to its last ``max_position_embeddings`` tokens (nanoGPT's habit; ``transformers`` would pass only the
    new token, expecting a cache to hold the rest). ``generate`` runs in eval mode (dropout off) and puts the model
    back in its previous mode."""

    def prepare_inputs_for_generation(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                                      **unused: Any) -> Dict[str, torch.Tensor]:
        context = self.config.max_position_embeddings
        inputs = {'input_ids': input_ids[:, -context:]}
        if attention_mask is not None:
            inputs['attention_mask'] = attention_mask[:, -context:]
        return inputs

    def generate(self, *args, **kwargs):
        """``transformers``' ``generate``; the sampling values given are checked first (one line each: a NaN
        temperature would sample from NaN probabilities). ``top_k=0``: no top-k filter."""
        for name, low in (('max_new_tokens', 0), ('top_k', 0), ('temperature', None)):
            if kwargs.get(name) is not None:
                check_range(name, kwargs[name], low=low)
        was_training = self.training
        self.eval()
        try:
            return super().generate(*args, **kwargs)
        finally:
            self.train(was_training)


# ----------------------------------------------------------------------------------------------- input checks

def check_text_inputs(input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor], max_length: int,
                      token_type_ids: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
    """``input_ids`` (B, L) with 1 <= L <= ``max_length``, ``attention_mask`` / ``token_type_ids`` (B, L) when
    given; returns the mask as bool (or None). The mask must be right padding (the families read absolute positions:
    padded positions change no real one's output only then); that value check is skipped while tracing or compiling
    (it would break the graph), the shapes never are."""
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


# ------------------------------------------------------------------------------------------------------ pooling

def pool_sequence(hidden: torch.Tensor, attention_mask: Optional[torch.Tensor], pooling: str,
                  cls_index: int = 0) -> torch.Tensor:
    """One vector per sequence for a classifier: the state at ``cls_index`` (``'cls'``: BERT's [CLS], arXiv
    1810.04805 §3) or the mean over the real tokens (``'mean'``: the official BiGS pooler; with MLM-only pretraining
    no objective trains the [CLS] state, while every token state is trained).

    Shapes: hidden (B, L, d); attention_mask optional (B, L), 1 / True = real token (None: every position) -> (B, d).
    """
    if pooling == 'cls':
        return hidden[:, cls_index]
    if pooling != 'mean':  # the configs check the value when made; one set on the config later stops here
        raise ValueError(f'classifier_pooling must be one of {get_args(ClassifierPooling)}, got {pooling!r}')
    if attention_mask is None:
        return hidden.mean(dim=1)
    w = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, L, 1)
    return (hidden * w).sum(dim=1) / w.sum(dim=1).clamp(min=1)


# -------------------------------------------------------------------------------------------------- save / load

def read_config(directory: str) -> str:
    """The architecture (class name) in a ``save_pretrained`` folder's ``config.json``; a missing ``config.json`` is
    a ``FileNotFoundError``, one of another layout (an official BiGS folder's) a ``ValueError``, a damaged one a
    :class:`~mlp_vision.errors.UsageError` naming the file."""
    path = os.path.join(directory, CONFIG_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f'{directory} has no {CONFIG_NAME}: not a folder written by save_pretrained')
    payload = read_json_file(path)
    if not (isinstance(payload, dict) and str(payload.get('model_type', '')).startswith('mlp_vision_')):
        raise ValueError(f'{path} is not a config written by save_pretrained (no mlp_vision model_type); for an '
                         f'official BiGS folder use BiGSForMaskedLM.from_official')
    architectures = payload.get('architectures')
    architecture = architectures[0] if isinstance(architectures, list) and architectures else None
    if not isinstance(architecture, str):
        raise UsageError(f'{path}: the architecture must be a class name, got {short_repr(architecture)}')
    return architecture


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


def load_text_config(config_class, directory: str, **overrides) -> TextConfig:
    """``config_class.from_pretrained(directory)`` with ``overrides``; a config that does not build is a
    :class:`~mlp_vision.errors.UsageError` naming ``config.json``."""
    path = os.path.join(directory, CONFIG_NAME)
    try:
        return config_class.from_pretrained(directory, name_or_path=directory, **overrides)  # from_dict names it
    except WrongFamilyError:
        raise
    except (TypeError, ValueError, KeyError) as e:
        raise UsageError(str(e) if path in str(e) else f'{path}: {e}') from None


def _check_weights_file(model_cls: type, config: TextConfig, weights_path: str, config_path: str) -> None:
    """A :class:`~mlp_vision.errors.UsageError` naming ``weights_path`` unless it is a readable safetensors file
    whose tensors have the model's shapes and kinds, all finite (:func:`mlp_vision.weights.check_weights`)."""
    if not os.path.isfile(weights_path):
        raise UsageError(f'{weights_path} does not exist: the folder has {CONFIG_NAME} but not the weights it '
                         f'describes')
    try:
        with safe_open(weights_path, framework='pt') as f:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except SafetensorError as e:
        raise UsageError(f'{weights_path} is not a readable safetensors file ({e}); it is empty, truncated or '
                         f'damaged') from None
    own = model_cls(config, device='meta').state_dict()
    for key, shape in shapes.items():
        if key in own and tuple(own[key].shape) != shape:
            raise UsageError(f'{weights_path} does not fit {config_path}: {key} is {shape} in the weights but '
                             f'{tuple(own[key].shape)} by the config; the config was edited or belongs to other weights')
    check_weights(own, load_file(weights_path), weights_path)


def check_text_model_size(model_cls: type, config: TextConfig, source: str) -> None:
    """A :class:`UsageError` naming ``source`` and the size fields for a ``model_cls(config)`` beyond
    :data:`~mlp_vision.bounds.MAX_PARAMS` parameters, counted on the ``meta`` device before anything is allocated."""
    check_model_size(lambda: model_cls(config, device='meta'), _model_description(model_cls, config, source))


def check_text_activations(model_cls: type, config: TextConfig, batch_size: int, seq_len: int, training: bool,
                           source: str) -> None:
    """A :class:`UsageError` naming ``source``, the size fields and the batch for a ``model_cls(config)`` whose
    forward on ``batch_size`` sequences of ``seq_len`` tokens (``training``: with autograd) would hold more
    activations than :func:`~mlp_vision.bounds.check_activation_size` allows, estimated on the ``meta`` device."""
    token_ids = torch.zeros(batch_size, seq_len, dtype=torch.long, device='meta')
    check_activation_size(lambda: model_cls(config, device='meta'), [token_ids], training,
                          f'{_model_description(model_cls, config, source)}, batch {batch_size} x {seq_len} tokens')


def _model_description(model_cls: type, config: TextConfig, source: str) -> str:
    sizes = {k: v for k, v in config.text_fields().items() if k in _POSITIVE_SIZE_FIELDS}
    return f'{source}: {model_cls.__name__} with {short_repr(sizes)}'


def check_tokenizer_fits(tokenizer, config: TextConfig, source: str) -> None:
    """A :class:`~mlp_vision.errors.UsageError` when the model's vocabulary size is not its tokenizer's."""
    if tokenizer is not None and len(tokenizer) != config.vocab_size:
        raise UsageError(f'{source}: the model has vocab_size {config.vocab_size} but its tokenizer has '
                         f'{len(tokenizer)} tokens; they do not belong together (the config was edited, or the '
                         f'tokenizer files come from another model)')
