""" The weights of a text classifier (``--task classify --init-from``): a run checkpoint of ours, a
``save_pretrained`` folder or an official BiGS folder, loaded with :func:`mlp_vision.weights.load_backbone` and a
new head. Without ``--init-from``: a fresh model and the ``--tokenizer`` of the training text.
"""
import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import torch
import torch.nn as nn
from safetensors.torch import load_file

from mlp_vision.text.bigs import (
    BiGSForSequenceClassification, convert_official_bigs_state_dict, load_official_bigs_state_dict)
from mlp_vision.text.modeling_utils import (
    WEIGHTS_NAME, check_text_model_size, check_tokenizer_fits, is_saved_folder, weight_file_shapes)
from mlp_vision.text.registry import is_model, list_models, load_config, model_class, model_entry
from mlp_vision.text.tokenizer import (
    DEFAULT_CONTROL_TOKENS, Tokenizer, byte_tokenizer, char_tokenizer, find_tokenizer, tokenizer_from_dict)
from mlp_vision.weights import load_backbone
from mlp_vision.training.run.checkpoint import load_checkpoint_file
from mlp_vision.errors import UsageError
from mlp_vision.training.tasks.text_args import task_model_entry
from mlp_vision.training.tasks.text_data import model_for_tokenizer, tokenizer_from_path

__all__ = ['CLASSIFY_FAMILIES', 'InitReport', 'init_classifier', 'scratch_tokenizer']

CLASSIFY_FAMILIES = ('gmlp', 'bigs', 'bert')
_SHAPE_FIELDS = ('vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers', 'max_position_embeddings',
                 'type_vocab_size', 'num_ssm_states', 'tiny_attention_size', 'num_attention_heads')


@dataclasses.dataclass
class InitReport:
    """What ``--init-from`` gave the classifier: the weights loaded, the new ones, the checkpoint's unused ones."""
    source: str
    kind: str  # 'run checkpoint' | 'pretrained folder' | 'official BiGS' | 'none'
    loaded: List[str]
    new: List[str]
    unused: List[str]

    def log_line(self) -> str:
        if self.kind == 'none':
            return f'Weights: all {len(self.new)} tensors new (random init; no --init-from)'
        return (f'Weights from {self.kind} {self.source}: loaded {len(self.loaded)} tensors '
                f'({_prefixes(self.loaded)}); new {len(self.new)}: {", ".join(self.new) or "none"}; '
                f'unused from the checkpoint {len(self.unused)}: {_prefixes(self.unused) or "none"}')


def _prefixes(keys: Sequence[str]) -> str:
    """The keys grouped by their first two name parts, e.g. 'bigs.embeddings (5), bigs.layers (40)'."""
    counts = Counter('.'.join(k.split('.')[:2]) for k in keys)
    return ', '.join(f'{h} ({n})' for h, n in counts.items())


def _load_partial(model: nn.Module, state_dict: Dict[str, torch.Tensor], head_prefixes: Sequence[str],
                  source: str) -> Tuple[List[str], List[str], List[str]]:
    """:func:`~mlp_vision.weights.load_backbone`; (loaded, new, unused) keys. Head tensors of another shape stay new;
    any other missing or mis-shaped tensor is an error."""
    report = load_backbone(model, state_dict, head_prefixes, f'--init-from {source}')
    bad_shape = report.mismatched_outside(head_prefixes)
    if bad_shape or report.missing:
        missing, own = report.missing, model.state_dict()
        sd = {(k[len('module.'):] if k.startswith('module.') else k): v for k, v in state_dict.items()}
        detail = (f'missing {missing[:4]}{"..." if len(missing) > 4 else ""}' if missing else
                  f'{bad_shape[0]} is {tuple(sd[bad_shape[0]].shape)} there, {tuple(own[bad_shape[0]].shape)} here')
        raise UsageError(f'--init-from {source} does not fit {type(model).__name__} ({detail}); expected a '
                         f'checkpoint of the same family and sizes')
    return report.loaded, report.new, report.unused


def _family_of_class(cls) -> str:
    for family in CLASSIFY_FAMILIES:
        if model_class(family, 'sequence_classification').config_class is cls.config_class:
            return family
    raise UsageError(f'{cls.__name__} has no sequence classifier in this package (families with one: '
                     f'{", ".join(CLASSIFY_FAMILIES)})')


def _config_overrides(config_class, model_kwargs: Dict[str, Any], num_labels: int) -> Dict[str, Any]:
    fields = set(config_class.text_field_names())
    kwargs = config_class.rename_legacy(dict(model_kwargs))
    unknown = sorted(set(kwargs) - fields)
    if unknown:
        raise UsageError(f'--model-kwargs {unknown} are not fields of {config_class.__name__}; its fields: '
                         f'{", ".join(sorted(fields))}')
    return {**kwargs, 'num_labels': num_labels}


def _overridden_config(base, model_kwargs: Dict[str, Any], num_labels: int, source: str):
    """The ``--init-from`` checkpoint's config ``base`` with the ``--model-kwargs`` fields, which must keep the weight
    shapes (:data:`_SHAPE_FIELDS`); a value the config rejects (e.g. ``classifier_pooling=max``) stops with one line."""
    overrides = _config_overrides(type(base), model_kwargs, num_labels)
    try:
        config = type(base)(**{**base.text_fields(), **overrides})
    except (TypeError, ValueError) as e:
        raise UsageError(f'--model-kwargs {model_kwargs} for the --init-from {source} model: {e}') from None
    changed = [f for f in _SHAPE_FIELDS if hasattr(base, f) and getattr(base, f) != getattr(config, f)]
    if changed:
        raise UsageError(f'--model-kwargs change {", ".join(changed)} of the --init-from {source} model; only '
                         f'fields that keep the weight shapes (e.g. dropout) can change with --init-from')
    return config


def init_classifier(init_from: str, model_name: str, model_kwargs: Dict[str, Any], num_labels: int,
                    tokenizer_for_scratch=None, trust: bool = False,
                    allow_regex: bool = False) -> Tuple[nn.Module, str, Tokenizer, InitReport]:
    """(sequence classifier, family, tokenizer, report) for ``--init-from``, or without it a fresh ``model_name``
    with the tokenizer ``tokenizer_for_scratch()`` gives. ``allow_regex``: ``--allow-regex`` for the file's tokenizer.
    """
    if not init_from:
        return _fresh_classifier(model_name, model_kwargs, num_labels, tokenizer_for_scratch)
    path = Path(init_from)
    if not path.exists():
        raise UsageError(f'--init-from {init_from!r} does not exist; expected a run\'s last.pth / model_best.pth, '
                         f'its pretrained/ folder, or an official BiGS folder')
    if path.is_file():
        return _classifier_from_run_checkpoint(init_from, model_kwargs, num_labels, trust, allow_regex)
    if is_saved_folder(str(path)):  # a damaged config.json is an error here, not a reason to try the official layout
        return _classifier_from_pretrained_folder(init_from, model_kwargs, num_labels, allow_regex)
    return _classifier_from_official_bigs(init_from, model_kwargs, num_labels, allow_regex)


def _fresh_classifier(model_name: str, model_kwargs: Dict[str, Any], num_labels: int, tokenizer_for_scratch):
    entry = task_model_entry(model_name)
    if entry.family not in CLASSIFY_FAMILIES:
        known = ', '.join(n for n in list_models() if model_entry(n).family in CLASSIFY_FAMILIES)
        raise UsageError(f'model {model_name!r} ({entry.family}) has no sequence classifier; use a gMLP, BiGS or '
                         f'BERT model: {known}')
    tokenizer = tokenizer_for_scratch()
    model, _ = model_for_tokenizer(model_name, _config_overrides(entry.config_class, model_kwargs, num_labels),
                                   tokenizer, entry.config_class, model_kwargs, task='sequence_classification')
    return model, entry.family, tokenizer, InitReport('', 'none', [], list(model.state_dict()), [])


def _classifier_from_run_checkpoint(init_from: str, model_kwargs: Dict[str, Any], num_labels: int, trust: bool,
                                    allow_regex: bool = False):
    path = Path(init_from)
    ckpt = load_checkpoint_file(path, trust=trust, what='--init-from')
    if not all(k in ckpt for k in ('state_dict', 'model_config', 'model_cfg', 'tokenizer')):
        raise UsageError(f'--init-from {init_from} is not a checkpoint of the text trainer (no model config / '
                         f'tokenizer in it); expected last.pth / model_best.pth of a mlp_vision.train_text run, '
                         f'or a pretrained/ folder')
    name = ckpt['model_cfg']['name']
    if not is_model(name):
        raise UsageError(f'--init-from {init_from} is a checkpoint of {name!r}, not a registered text model')
    family = model_entry(name).family
    if family not in CLASSIFY_FAMILIES:
        raise UsageError(f'--init-from {init_from} is a {family} model ({name}), which has no sequence '
                         f'classifier; use a gMLP, BiGS or BERT checkpoint')
    cls = model_class(family, 'sequence_classification')
    try:  # the checkpoint's saved values are data, checked as a config.json is
        base = cls.config_class.from_dict(ckpt['model_config'])
        tokenizer = tokenizer_from_dict(ckpt['tokenizer'], allow_regex)
    except Exception as e:  # TypeError / ValueError of a field, KeyError of a missing one, tokenizers' errors
        raise UsageError(f'--init-from {init_from}: its saved model config or tokenizer is damaged '
                         f'({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ""})') from None
    check_tokenizer_fits(tokenizer, base, f'--init-from {init_from}')
    config = _overridden_config(base, model_kwargs, num_labels, init_from)
    check_text_model_size(cls, config, f'--init-from {init_from}')
    model = cls(config)
    loaded, new, unused = _load_partial(model, ckpt['state_dict'], cls.head_prefixes, init_from)
    return model, family, tokenizer, InitReport(str(init_from), 'run checkpoint', loaded, new, unused)


def _classifier_from_pretrained_folder(init_from: str, model_kwargs: Dict[str, Any], num_labels: int,
                                       allow_regex: bool = False):
    path = Path(init_from)
    stored, base = load_config(str(path))
    family = _family_of_class(stored)
    cls = model_class(family, 'sequence_classification')
    tokenizer = find_tokenizer(str(path), allow_regex)
    if tokenizer is None:
        raise UsageError(f'--init-from {init_from} holds no tokenizer (tokenizer_config.json, tokenizer.json or '
                         f'vocab.txt); the model cannot be fed without the tokenizer it was trained with')
    check_tokenizer_fits(tokenizer, base, f'--init-from {init_from}')
    config = _overridden_config(base, model_kwargs, num_labels, init_from)
    model = cls(config)
    weights = path / WEIGHTS_NAME
    weight_file_shapes(str(weights))  # a missing, empty or damaged file: one line naming it
    sd = load_file(str(weights), device='cpu')
    loaded, new, unused = _load_partial(model, sd, cls.head_prefixes, str(weights))
    return model, family, tokenizer, InitReport(str(init_from), 'pretrained folder', loaded, new, unused)


def _classifier_from_official_bigs(init_from: str, model_kwargs: Dict[str, Any], num_labels: int,
                                   allow_regex: bool = False):
    path = Path(init_from)
    if not any((path / n).is_file() for n in ('pytorch_model.bin', 'model.safetensors')):
        raise UsageError(f'--init-from {init_from} is a folder without our config.json nor official BiGS weights '
                         f'(pytorch_model.bin / model.safetensors)')
    try:
        official = load_official_bigs_state_dict(str(path))
        available = set(convert_official_bigs_state_dict(official, task='sequence_classification'))
        unused_official = sorted(k for k in official if k.startswith('cls.'))  # the MLM head
        del official
        kwargs = _config_overrides(BiGSForSequenceClassification.config_class, model_kwargs, num_labels)
        model = BiGSForSequenceClassification.from_official(str(path), allow_regex=allow_regex, **kwargs)
    except (ValueError, RuntimeError, OSError, KeyError) as e:
        raise UsageError(f'--init-from {init_from}: cannot read it as an official BiGS folder: '
                         f'{str(e).splitlines()[0] if str(e) else type(e).__name__}') from None
    if model.tokenizer is None:
        raise UsageError(f'--init-from {init_from} holds no tokenizer (vocab.txt / tokenizer.json); the official '
                         f'BiGS models use BERT\'s uncased vocab.txt: put it in the folder')
    own = list(model.state_dict())
    loaded = [k for k in own if k in available]
    new = [k for k in own if k not in available]
    return model, 'bigs', model.tokenizer, InitReport(str(init_from), 'official BiGS', loaded, new, unused_official)


def scratch_tokenizer(kind: str, texts: Sequence[str], tokenizer_from: str = '',
                      allow_regex: bool = False) -> Tokenizer:
    """The tokenizer of a classifier trained from scratch: ``--tokenizer-from``'s, or a byte / char one (the char
    alphabet of ``texts``, with ``<unk>``) with the control tokens."""
    if tokenizer_from:
        return tokenizer_from_path(tokenizer_from, needs=('cls', 'sep', 'pad'), allow_regex=allow_regex)
    if kind == 'byte':
        return byte_tokenizer(DEFAULT_CONTROL_TOKENS)
    if kind != 'char':
        raise UsageError(f"--tokenizer {kind!r} is not available for --task classify without --init-from; use char "
                         f"or byte (subword vocabularies come with the --init-from checkpoint)")
    return char_tokenizer(set(''.join(texts)), DEFAULT_CONTROL_TOKENS, unk='<unk>')
