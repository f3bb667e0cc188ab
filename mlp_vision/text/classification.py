""" Fine-tuning on labelled data: ``python -m mlp_vision.text.train --task classify``.

GLUE-style files (arXiv 1804.07461: SST-2 one ``sentence`` column, MRPC / RTE ``sentence1, sentence2``, QNLI
``question, sentence``), a ``*ForSequenceClassification`` model of the gMLP, BiGS or BERT family, started from a
pretrained checkpoint of ours or an official BiGS folder, dev evaluation every ``--eval-interval`` updates and the
best checkpoint by dev accuracy::

    python -m mlp_vision.text.train --task classify --init-from output/text/MLM-RUN/pretrained \\
        --train-file ../shared/data/rt-polarity/train.tsv --val-file ../shared/data/rt-polarity/dev.tsv \\
        --steps 1000 -b 32 --eval-interval 100 --block-size 64

Data (:func:`read_labelled_file`): a header row; tab-separated for ``.tsv`` (no quoting, as GLUE's files, whose
sentences hold bare quote characters), comma-separated with CSV quoting for ``.csv`` (other names: tab when the
header has one). ``--text-columns`` names one column or a pair (``question,sentence``); by default ``sentence``,
else ``sentence1,sentence2``. ``--label-column`` (default ``label``). Label ids are the sorted distinct training
labels (numerically when all are integers, so GLUE's ``0`` / ``1`` stay 0 / 1); a dev label outside that set, a
missing column, an empty file or a row with the wrong number of fields stops with one line. ``--test-file`` (same
columns) is scored once at the end with the best checkpoint: choose the learning rate and the checkpoint on
``--val-file`` (e.g. a held-out part of the training data) and report the test file, which nothing was chosen on.

Inputs: the model's tokenizer with BERT's template (``<cls> A <sep> [B <sep>]``, token types 0 / 1 for the
families that read them; gMLP has no token-type embedding), longest-first truncation to ``--block-size`` tokens
(default: the model's maximum length), right padding to the longest sequence of each batch with an attention mask
(every family guarantees that padded positions never change a real token's output).

Weights (``--init-from``): a training checkpoint of ours (``last.pth`` / ``model_best.pth`` of an MLM or classify
run), a ``save_pretrained`` folder (a run's ``pretrained/``), or an official BiGS folder (``pytorch_model.bin`` /
``model.safetensors``, read by :meth:`~mlp_vision.text.bigs.BiGSForSequenceClassification.from_official`). The
architecture and tokenizer are the checkpoint's; ``--model-kwargs`` may change non-shape fields (dropout). The log
lists the weights loaded and the new ones (the classifier head; the pooler of BERT / BiGS unless the checkpoint has
one); a checkpoint that lacks encoder weights is refused. Without ``--init-from`` the model is ``--model`` with
random weights and a tokenizer from ``--tokenizer`` (char / byte; plus ``<pad> <cls> <sep> <mask>``).

Metrics (:func:`classification_metrics`, in %): accuracy, F1 of label id 1 (binary tasks; macro-F1 with more
labels) and Matthews correlation -- GLUE's metrics for SST-2 (accuracy), MRPC / QQP (F1, accuracy) and CoLA (MCC),
arXiv 1804.07461 §3. Outputs as the LM tasks: ``summary.csv`` (step, lr, train loss, val loss, val acc / f1 /
mcc), ``last.pth``, ``model_best.pth`` (highest dev accuracy), ``results.json`` (best and final dev metrics, the
loaded / new weights, the label names), ``pretrained/`` (the best model, its tokenizer and ``labels.json``).

Small labelled sets: ``--model-ema`` keeps an exponential moving average of the weights (timm ``ModelEmaV3``,
``--model-ema-decay``); the periodic evaluation scores the average (the raw weights' accuracy goes to
``raw_val_acc``), its accuracy picks ``model_best.pth`` (which also holds ``state_dict_ema``), and ``--test-file``
and ``pretrained/`` use the best checkpoint's averaged weights. ``--freeze-embeddings`` keeps the token embedding
(``model.get_input_embeddings()``) fixed.
"""
import csv
import dataclasses
import inspect
import io
import json
import logging
import math
import time
from contextlib import nullcontext
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from safetensors.torch import load_file
from timm.utils import ModelEmaV3

from ..training.checkpoint import atomic_folder, load_checkpoint_file
from ..training.distributed import wrap_ddp
from ..training.engine import format_duration
from ..training.errors import UsageError
from ..training.run import UpdateStep, create_lr_scheduler, setup_amp
from ..training.summary import plot_curves
from .data import tokenizer_from_path
from .loop import StepState, run_steps
from .modeling_utils import WEIGHTS_NAME, check_tokenizer_fits, is_saved_folder, load_config, weight_file_shapes
from .registry import create_model, is_model, list_models, model_class, model_entry
from .tokenizer import DEFAULT_CONTROL_TOKENS, ByteTokenizer, CharTokenizer, Tokenizer, find_tokenizer, \
    tokenizer_from_dict

__all__ = [
    'LabelledData', 'read_labelled_file', 'label_ids', 'encode_examples', 'collate', 'classification_metrics',
    'init_classifier', 'InitReport', 'FINETUNE_RECIPE', 'train_classifier', 'CLASSIFY_FAMILIES',
]

_logger = logging.getLogger('mlp_vision.text.train')

CLASSIFY_FAMILIES = ('gmlp', 'bigs', 'bert')
# BERT's fine-tuning recipe (arXiv 1810.04805 §4.1 and App. A.3: Adam lr in {5e-5, 3e-5, 2e-5}, batch 32, a few
# epochs; gMLP fine-tunes as BERT, arXiv 2105.08050 §4); warmup 10 % of the updates then linear decay is our default
FINETUNE_RECIPE = dict(
    lr=5e-5, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, sched='linear',
    source='BERT fine-tuning (arXiv 1810.04805 §4.1, App. A.3: AdamW lr 5e-5 (of 5e-5 / 3e-5 / 2e-5), weight decay '
           '0.01); warmup 10 % of the updates then linear decay (our default); the same for every family')


# ------------------------------------------------------------------------------------------------ files
@dataclasses.dataclass
class LabelledData:
    """The examples of one file: first (and second) text segments and the raw label strings."""
    path: str
    text_columns: Tuple[str, ...]
    texts: List[str]
    pairs: Optional[List[str]]
    labels: List[str]

    def __len__(self) -> int:
        return len(self.labels)


def _delimiter(path: Path, header_line: str) -> str:
    suffix = path.suffix.lower()
    if suffix == '.tsv':
        return '\t'
    if suffix == '.csv':
        return ','
    return '\t' if '\t' in header_line else ','


def read_labelled_file(path: str, text_columns: Optional[Sequence[str]] = None, label_column: str = 'label',
                       what: str = '--train-file') -> LabelledData:
    """Read a GLUE-style TSV / CSV file with a header row (see the module docstring); :class:`UsageError` with one
    line for a missing / empty file, missing columns, ragged rows or an empty label."""
    if not path:
        raise UsageError(f'no {what} given: --task classify needs --train-file and --val-file (TSV / CSV with a '
                         f'header row)')
    p = Path(path)
    if not p.is_file():
        raise UsageError(f'{what} {path!r} ' + ('is not a file' if p.exists() else 'does not exist'))
    try:
        content = p.read_text(encoding='utf-8-sig')
    except UnicodeDecodeError as e:
        raise UsageError(f'{what} {path!r} is not UTF-8 text (byte {e.start}); expected a UTF-8 TSV / CSV') from None
    header_line = content.split('\n', 1)[0]
    if not header_line.strip():
        raise UsageError(f'{what} {path!r} is empty; expected a header row (e.g. "sentence<TAB>label") and examples')
    delimiter = _delimiter(p, header_line)
    # the csv module reads the lines itself (newline=''), so a quoted CSV field keeps its line breaks; lines given
    # without their ends lost them ("two\nlines" became "twolines"), and str.splitlines also split at \x0b, \x1c,
    # U+2028, ... inside a field
    stream = io.StringIO(content, newline='')
    if delimiter == '\t':
        reader = csv.reader(stream, delimiter='\t', quoting=csv.QUOTE_NONE)
    else:
        reader = csv.reader(stream, delimiter=',')
    rows = [(reader.line_num, row) for row in reader]
    header = [h.strip() for h in rows[0][1]]
    sep_name = 'tab' if delimiter == '\t' else 'comma'
    if text_columns is None:
        if 'sentence' in header:
            text_columns = ('sentence',)
        elif 'sentence1' in header and 'sentence2' in header:
            text_columns = ('sentence1', 'sentence2')
        else:
            raise UsageError(f'{what} {path!r} has columns {header} ({sep_name}-separated) but no "sentence" or '
                             f'"sentence1"/"sentence2"; name the text column(s) with --text-columns, e.g. '
                             f'--text-columns question,sentence')
    text_columns = tuple(text_columns)
    if not 1 <= len(text_columns) <= 2:
        raise UsageError(f'--text-columns takes one column or a pair, got {list(text_columns)}')
    if label_column in text_columns:
        raise UsageError(f'--label-column {label_column!r} is also a text column ({", ".join(text_columns)}): the '
                         f'model would read the answer; name the text column(s) with --text-columns')
    if len(set(text_columns)) < len(text_columns):
        raise UsageError(f'--text-columns names {text_columns[0]!r} twice; give one column or two different ones')
    missing = [c for c in (*text_columns, label_column) if c not in header]
    if missing:
        raise UsageError(f'{what} {path!r} has no column {", ".join(map(repr, missing))}; its header is {header} '
                         f'({sep_name}-separated); set --text-columns / --label-column')
    index = [header.index(c) for c in text_columns]
    label_index = header.index(label_column)
    texts, pairs, labels = [], [] if len(text_columns) == 2 else None, []
    for line_no, row in rows[1:]:  # line_no: the row's last line in the file
        if not row or (len(row) == 1 and not row[0].strip()):
            continue  # blank line
        if len(row) != len(header):
            raise UsageError(f'{what} {path!r} line {line_no} has {len(row)} fields, the header has {len(header)} '
                             f'({sep_name}-separated); every row needs one value per column')
        label = row[label_index].strip()
        if not label:
            raise UsageError(f'{what} {path!r} line {line_no} has an empty {label_column!r}; every example needs '
                             f'a label')
        texts.append(row[index[0]])
        if pairs is not None:
            pairs.append(row[index[1]])
        labels.append(label)
    if not labels:
        raise UsageError(f'{what} {path!r} has a header but no examples')
    return LabelledData(str(path), text_columns, texts, pairs, labels)


def _label_sort_key(label: str):
    try:
        return 0, float(label), label
    except ValueError:
        return 1, 0., label


def label_ids(train_labels: Sequence[str], dev_labels: Sequence[str], dev_what: str = '--val-file') -> List[str]:
    """The label names in id order: the sorted distinct training labels (numerically when they are numbers);
    a dev label the training file lacks is an error. Fewer than two labels is an error."""
    names = sorted(set(train_labels), key=_label_sort_key)
    if len(names) < 2:
        raise UsageError(f'the training file has only the label {names}; classification needs at least two labels')
    unknown = sorted(set(dev_labels) - set(names), key=_label_sort_key)
    if unknown:
        raise UsageError(f'{dev_what} has labels {unknown[:5]}{"..." if len(unknown) > 5 else ""} that the training '
                         f'file does not have (training labels: {names}); both files must use the same label set')
    return names


# ------------------------------------------------------------------------------------------------ tensors
def encode_examples(tokenizer: Tokenizer, data: LabelledData, max_length: int) -> Tuple[List[List[int]], List[List[int]]]:
    """(input ids, token type ids) per example: BERT's template, longest-first truncation to ``max_length``."""
    try:
        enc = tokenizer(data.texts, data.pairs, max_length=max_length, truncation=True)
    except KeyError as e:
        raise UsageError(f'{data.path} has the character {e.args[0]!r}, which the tokenizer does not know') from None
    except ValueError as e:
        raise UsageError(f'cannot encode {data.path}: {e}') from None
    return enc['input_ids'], enc['token_type_ids']


def collate(ids: Sequence[List[int]], types: Sequence[List[int]], labels: torch.Tensor, pad_id: int,
            with_token_types: bool) -> Dict[str, torch.Tensor]:
    """A right-padded batch: ``input_ids``, ``attention_mask`` (1 = real), [``token_type_ids``], ``labels``."""
    length = max(len(r) for r in ids)
    input_ids = torch.full((len(ids), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), length), dtype=torch.long)
    token_types = torch.zeros((len(ids), length), dtype=torch.long)
    for i, (r, t) in enumerate(zip(ids, types)):
        input_ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        token_types[i, :len(t)] = torch.tensor(t, dtype=torch.long)
        mask[i, :len(r)] = 1
    batch = {'input_ids': input_ids, 'attention_mask': mask, 'labels': labels}
    if with_token_types:
        batch['token_type_ids'] = token_types
    return batch


# ------------------------------------------------------------------------------------------------ metrics
def _metrics_from_confusion(cm: torch.Tensor) -> Dict[str, float]:
    """Accuracy, F1 and Matthews correlation (%) of a (K, K) confusion matrix (rows true, columns predicted)."""
    cm = cm.to(torch.float64)
    n = cm.sum().item()
    correct = cm.diag().sum().item()
    k = cm.shape[0]

    def f1_of(c):
        tp, fp, fn = cm[c, c].item(), cm[:, c].sum().item() - cm[c, c].item(), cm[c, :].sum().item() - cm[c, c].item()
        return 0. if tp == 0 else 2 * tp / (2 * tp + fp + fn)

    f1 = f1_of(1) if k == 2 else sum(f1_of(c) for c in range(k)) / k
    # multi-class MCC (Gorodkin 2004), which is Matthews' phi for two classes (as scikit-learn's matthews_corrcoef)
    t, p = cm.sum(1), cm.sum(0)
    cov_ytyp = correct * n - (t * p).sum().item()
    cov_ypyp = n * n - (p * p).sum().item()
    cov_ytyt = n * n - (t * t).sum().item()
    denom = math.sqrt(cov_ypyp * cov_ytyt)
    mcc = 0. if denom == 0 else cov_ytyp / denom
    return {'acc': 100. * correct / max(n, 1.), 'f1': 100. * f1, 'mcc': 100. * mcc, 'examples': int(n),
            'f1_average': 'binary (label id 1)' if k == 2 else 'macro'}


def classification_metrics(predictions, labels, num_labels: int) -> Dict[str, float]:
    """Accuracy, F1 (binary: of label id 1; more labels: macro) and Matthews correlation, all in %, of class-id
    sequences; equal to scikit-learn's ``accuracy_score`` / ``f1_score`` / ``matthews_corrcoef`` x 100."""
    predictions = torch.as_tensor(predictions, dtype=torch.long).reshape(-1)
    labels = torch.as_tensor(labels, dtype=torch.long).reshape(-1)
    cm = torch.bincount(labels * num_labels + predictions, minlength=num_labels * num_labels)
    return _metrics_from_confusion(cm.reshape(num_labels, num_labels))


# ------------------------------------------------------------------------------------------------ model + weights
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

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def _prefixes(keys: Sequence[str]) -> str:
    """The keys grouped by their first two name parts, e.g. 'bigs.embeddings (5), bigs.layers (40)'."""
    counts: Dict[str, int] = {}
    for k in keys:
        head = '.'.join(k.split('.')[:2])
        counts[head] = counts.get(head, 0) + 1
    return ', '.join(f'{h} ({n})' for h, n in counts.items())


def _load_partial(model: nn.Module, state_dict: Dict[str, torch.Tensor], head_prefixes: Sequence[str],
                  source: str) -> Tuple[List[str], List[str], List[str]]:
    """Load every matching tensor; (loaded, new, unused) keys. Head tensors of another shape (a classifier of
    another label count) stay new; any other missing or mis-shaped tensor is an error."""
    own = model.state_dict()
    sd = {(k[len('module.'):] if k.startswith('module.') else k): v for k, v in state_dict.items()}
    head = tuple(head_prefixes)
    wrong = [k for k in own if k in sd and tuple(sd[k].shape) != tuple(own[k].shape)]
    bad_shape = [k for k in wrong if not k.startswith(head)]
    missing = [k for k in own if k not in sd and not k.startswith(head)]
    if bad_shape or missing:
        detail = (f'missing {missing[:4]}{"..." if len(missing) > 4 else ""}' if missing else
                  f'{bad_shape[0]} is {tuple(sd[bad_shape[0]].shape)} there, {tuple(own[bad_shape[0]].shape)} here')
        raise UsageError(f'--init-from {source} does not fit {type(model).__name__} ({detail}); expected a '
                         f'checkpoint of the same family and sizes')
    usable = {k: v for k, v in sd.items() if k in own and k not in wrong}
    model.load_state_dict(usable, strict=False)
    loaded = [k for k in own if k in usable]
    new = [k for k in own if k not in usable]
    unused = [k for k in sd if k not in own or k in wrong]
    return loaded, new, unused


def _family_of_class(cls) -> str:
    for family in CLASSIFY_FAMILIES:
        if model_class(family, 'sequence_classification').config_class is cls.config_class:
            return family
    raise UsageError(f'{cls.__name__} has no sequence classifier in this package (families with one: '
                     f'{", ".join(CLASSIFY_FAMILIES)})')


def _config_overrides(config_class, model_kwargs: Dict[str, Any], num_labels: int) -> Dict[str, Any]:
    fields = {f.name for f in dataclasses.fields(config_class)}
    kwargs = config_class.rename_legacy(dict(model_kwargs))
    unknown = sorted(set(kwargs) - fields)
    if unknown:
        raise UsageError(f'--model-kwargs {unknown} are not fields of {config_class.__name__}; its fields: '
                         f'{", ".join(sorted(fields))}')
    return {**kwargs, 'num_labels': num_labels}


def _overridden_config(base, model_kwargs: Dict[str, Any], num_labels: int, source: str):
    """The ``--init-from`` checkpoint's config ``base`` with the ``--model-kwargs`` fields that keep the weight shapes;
    a field value the config rejects (e.g. ``classifier_pooling=max``) stops with one line."""
    overrides = _config_overrides(type(base), model_kwargs, num_labels)
    try:
        config = type(base).from_dict({**base.to_dict(), **overrides})
    except (TypeError, ValueError) as e:
        raise UsageError(f'--model-kwargs {model_kwargs} for the --init-from {source} model: {e}') from None
    _check_shapes_kept(base, config, source)
    return config


def _check_shapes_kept(before, after, source: str) -> None:
    shape_fields = ('vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers',
                    'max_position_embeddings', 'type_vocab_size', 'num_ssm_states', 'tiny_attention_size',
                    'num_attention_heads')
    changed = [f for f in shape_fields if hasattr(before, f) and getattr(before, f) != getattr(after, f)]
    if changed:
        raise UsageError(f'--model-kwargs change {", ".join(changed)} of the --init-from {source} model; only '
                         f'fields that keep the weight shapes (e.g. dropout) can change with --init-from')


def init_classifier(init_from: str, model_name: str, model_kwargs: Dict[str, Any], num_labels: int,
                    tokenizer_for_scratch=None, trust: bool = False) -> Tuple[nn.Module, str, Tokenizer, InitReport]:
    """(sequence classifier, family, tokenizer, report) for ``--init-from`` (or a fresh ``model_name``). The
    report's ``model_name`` is the registered name of the checkpoint's model when known.

    ``tokenizer_for_scratch``: a callable giving the tokenizer of a model without ``--init-from``.
    """
    if not init_from:
        if not is_model(model_name):
            raise UsageError(f'unknown text model {model_name!r}; known: {", ".join(list_models())}')
        entry = model_entry(model_name)
        if entry.family not in CLASSIFY_FAMILIES:
            raise UsageError(f'model {model_name!r} ({entry.family}) has no sequence classifier; use a gMLP, BiGS or '
                             f'BERT model: {", ".join(n for n in list_models() if model_entry(n).family in CLASSIFY_FAMILIES)}')
        tokenizer = tokenizer_for_scratch()
        kwargs = _config_overrides(entry.config_class, model_kwargs, num_labels)
        if 'vocab_size' in kwargs and kwargs['vocab_size'] != tokenizer.vocab_size:
            raise UsageError(f'--model-kwargs vocab_size={kwargs["vocab_size"]} differs from the tokenizer\'s '
                             f'{tokenizer.vocab_size}; leave vocab_size out (it is set from the tokenizer)')
        kwargs['vocab_size'] = tokenizer.vocab_size
        if 'pad_token_id' in {f.name for f in dataclasses.fields(entry.config_class)}:
            kwargs.setdefault('pad_token_id', tokenizer.pad_id)
        try:
            model = create_model(model_name, task='sequence_classification', **kwargs)
        except (TypeError, ValueError, KeyError) as e:
            raise UsageError(f'cannot build {model_name} with --model-kwargs {model_kwargs}: {e}') from e
        new = list(model.state_dict())
        return model, entry.family, tokenizer, InitReport('', 'none', [], new, [])

    path = Path(init_from)
    if not path.exists():
        raise UsageError(f'--init-from {init_from!r} does not exist; expected a run\'s last.pth / model_best.pth, '
                         f'its pretrained/ folder, or an official BiGS folder')
    if path.is_file():
        ckpt = load_checkpoint_file(path, trust=trust, what='--init-from')
        if not all(k in ckpt for k in ('state_dict', 'model_config', 'model_cfg', 'tokenizer')):
            raise UsageError(f'--init-from {init_from} is not a checkpoint of the text trainer (no model config / '
                             f'tokenizer in it); expected last.pth / model_best.pth of a mlp_vision.text.train run, '
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
            tokenizer = tokenizer_from_dict(ckpt['tokenizer'])
        except Exception as e:  # TypeError / ValueError of a field, KeyError of a missing one, tokenizers' errors
            raise UsageError(f'--init-from {init_from}: its saved model config or tokenizer is damaged '
                             f'({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ""})') from None
        check_tokenizer_fits(tokenizer, base, f'--init-from {init_from}')
        config = _overridden_config(base, model_kwargs, num_labels, init_from)
        model = cls(config)
        loaded, new, unused = _load_partial(model, ckpt['state_dict'], cls.head_prefixes, init_from)
        return model, family, tokenizer, InitReport(str(init_from), 'run checkpoint', loaded, new, unused)

    if is_saved_folder(str(path)):  # a damaged config.json is an error here, not a reason to try the official layout
        stored, base = load_config(str(path))
        family = _family_of_class(stored)
        cls = model_class(family, 'sequence_classification')
        tokenizer = find_tokenizer(str(path))
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

    if not any((path / n).is_file() for n in ('pytorch_model.bin', 'model.safetensors')):
        raise UsageError(f'--init-from {init_from} is a folder without our config.json nor official BiGS weights '
                         f'(pytorch_model.bin / model.safetensors)')
    from .bigs import BiGSForSequenceClassification, convert_official_bigs_state_dict, load_official_bigs_state_dict
    try:
        official = load_official_bigs_state_dict(str(path))
        available = set(convert_official_bigs_state_dict(official, task='sequence_classification'))
        unused_official = sorted(k for k in official if k.startswith('cls.'))  # the MLM head
        del official
        kwargs = _config_overrides(BiGSForSequenceClassification.config_class, model_kwargs, num_labels)
        model = BiGSForSequenceClassification.from_official(str(path), **kwargs)
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


def _scratch_tokenizer(kind: str, data: LabelledData, dev: LabelledData, tokenizer_from: str = '') -> Tokenizer:
    if tokenizer_from:
        return tokenizer_from_path(tokenizer_from, needs=('cls', 'sep', 'pad'))
    if kind == 'byte':
        return ByteTokenizer(DEFAULT_CONTROL_TOKENS)
    if kind != 'char':
        raise UsageError(f"--tokenizer {kind!r} is not available for --task classify without --init-from; use char "
                         f"or byte (subword vocabularies come with the --init-from checkpoint)")
    chars = set(''.join(data.texts)) | set(''.join(data.pairs or []))
    return CharTokenizer(chars, DEFAULT_CONTROL_TOKENS, unk='<unk>')


# ------------------------------------------------------------------------------------------------ the task
def _forward(model, batch: Dict[str, torch.Tensor], device, amp_autocast):
    inputs = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    with amp_autocast():
        return model(**inputs)


@torch.no_grad()
def evaluate_classifier(model: nn.Module, batches: Sequence[Dict[str, torch.Tensor]], num_labels: int, device,
                        amp_autocast=nullcontext, dist_info=None) -> Dict[str, float]:
    """Dev loss and :func:`classification_metrics` over ``batches`` (split over the ranks, sums reduced)."""
    model.eval()
    rank, world = (dist_info.rank, dist_info.world_size) if dist_info is not None and dist_info.distributed else (0, 1)
    cm = torch.zeros(num_labels * num_labels, dtype=torch.float64)
    loss_sum = torch.zeros(1, dtype=torch.float64)
    start = time.perf_counter()
    for batch in batches[rank::world]:
        out = _forward(model, batch, device, amp_autocast)
        logits = out.logits.float()
        labels = batch['labels'].to(device)
        loss_sum += torch.nn.functional.cross_entropy(logits, labels, reduction='sum').item()
        cm += torch.bincount((labels * num_labels + logits.argmax(-1)).cpu(),
                             minlength=num_labels * num_labels).to(torch.float64)
    if world > 1:
        dist.all_reduce(cm)
        dist.all_reduce(loss_sum)
    metrics = _metrics_from_confusion(cm.reshape(num_labels, num_labels))
    metrics['loss'] = loss_sum.item() / max(metrics['examples'], 1)
    metrics['seconds'] = time.perf_counter() - start
    return metrics


def _epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))


def train_classifier(args, run, argv) -> Optional[dict]:
    """``--task classify`` inside :func:`mlp_vision.text.train._train`'s run (see the module docstring)."""
    from timm.utils import random_seed
    from .train import _apply_recipe, _create_optimizer, _quote, lm_schedule, params_note
    dist_info = run.dist_info
    device, primary, world = dist_info.device, dist_info.primary, dist_info.world_size
    resumed = run.resume_ckpt or {}

    # ---------------------------------------------------------------- data, labels
    text_columns = None
    if args.text_columns:
        text_columns = [c.strip() for c in args.text_columns.split(',')]
        if not all(text_columns):
            raise UsageError(f'--text-columns {args.text_columns!r} has an empty name; expected e.g. "sentence" or '
                             f'"question,sentence"')
    train = read_labelled_file(args.train_file, text_columns, args.label_column, '--train-file')
    if not args.val_file:
        raise UsageError('--task classify needs --val-file (the dev file, same columns as --train-file)')
    dev = read_labelled_file(args.val_file, train.text_columns, args.label_column, '--val-file')
    names = label_ids(train.labels, dev.labels)
    test = None
    if args.test_file:
        test = read_labelled_file(args.test_file, train.text_columns, args.label_column, '--test-file')
        label_ids(train.labels, test.labels, '--test-file')
    if resumed and resumed.get('label_names') not in (None, names):
        raise UsageError(f'--resume {args.resume} was trained with labels {resumed["label_names"]}, the files now '
                         f'have {names}')
    to_id = {n: i for i, n in enumerate(names)}
    num_labels = len(names)

    # ---------------------------------------------------------------- model, weights, tokenizer
    if args.init_from and args.tokenizer_from:
        raise UsageError('--tokenizer-from is for a model trained from scratch; with --init-from the checkpoint\'s '
                         'tokenizer is used (give one of the two)')
    random_seed(args.seed, dist_info.rank)
    run.check_resume(task=args.task)
    if resumed:  # the resumed run's architecture and tokenizer; its weights come with run.restore below
        family = resumed['model_cfg']['family']
        cls = model_class(family, 'sequence_classification')
        model = cls(cls.config_class.from_dict(resumed['model_config']))
        tokenizer = tokenizer_from_dict(resumed['tokenizer'])
        report = InitReport(**resumed['init_report'])
    else:
        model, family, tokenizer, report = init_classifier(
            args.init_from, args.model, args.model_kwargs, num_labels,
            tokenizer_for_scratch=lambda: _scratch_tokenizer(args.tokenizer, train, dev, args.tokenizer_from),
            trust=getattr(args, 'trust_checkpoint', False))
        if args.init_from:  # the checkpoint decides the architecture; --model names it in the outputs
            args.model = f'{type(model).__name__} from {args.init_from}'
    if tokenizer.cls_id is None or tokenizer.pad_id is None:
        raise UsageError(f'the tokenizer {tokenizer!r} has no <cls> / <pad> token; sequence classification needs '
                         f'both (the BERT template)')
    if train.pairs is not None and tokenizer.sep_id is None:
        raise UsageError(f'sentence pairs need a separator token; the tokenizer {tokenizer!r} has none')
    config = model.config
    max_len = config.max_position_embeddings
    args.block_size = max_len if args.block_size is None else args.block_size
    if args.block_size > max_len:
        raise UsageError(f'--block-size {args.block_size} is larger than the model\'s maximum length {max_len}')
    if args.block_size < tokenizer.num_special_tokens(train.pairs is not None) + 1:
        raise UsageError(f'--block-size {args.block_size} leaves no room for text after the special tokens')
    train_ids, train_types = encode_examples(tokenizer, train, args.block_size)
    train_labels = torch.tensor([to_id[x] for x in train.labels], dtype=torch.long)
    dev_labels = torch.tensor([to_id[x] for x in dev.labels], dtype=torch.long)
    with_types = 'token_type_ids' in inspect.signature(model.forward).parameters
    eval_bs = args.eval_batch_size or args.batch_size

    def eval_batches(data: LabelledData):
        ids, types = encode_examples(tokenizer, data, args.block_size)
        labels = torch.tensor([to_id[x] for x in data.labels], dtype=torch.long)
        return [collate(ids[i:i + eval_bs], types[i:i + eval_bs], labels[i:i + eval_bs], tokenizer.pad_id, with_types)
                for i in range(0, len(ids), eval_bs)]
    dev_batches = eval_batches(dev)
    test_batches = eval_batches(test) if test is not None else None
    num_params = sum(p.numel() for p in model.parameters())
    model.to(device)

    # ---------------------------------------------------------------- optimizer, schedule, resume
    recipe_info = _apply_recipe(args, FINETUNE_RECIPE, 'finetune')
    optimizer = _create_optimizer(model, family, args)
    amp_autocast, loss_scaler, amp_dtype = setup_amp(args.amp, args.amp_dtype, device)
    params = [p for p in model.parameters() if p.requires_grad]
    update_step = UpdateStep(optimizer, lambda: params, loss_scaler, args.clip_grad)
    schedule = lm_schedule(args.lr, args.steps, args.warmup_steps, args.sched, args.min_lr_ratio)
    scheduler, _ = create_lr_scheduler(optimizer, schedule)
    seconds_before = resumed.get('train_seconds', 0.)
    start_step, _ = run.restore(model, optimizer, scheduler, schedule, loss_scaler)
    run.check_not_finished(start_step, args.steps, '--steps')
    model_ema = None
    if args.model_ema:  # an average of the trained weights; resumed from the checkpoint's state_dict_ema
        model_ema = ModelEmaV3(model, decay=args.model_ema_decay)
        run.restore_ema(model_ema.module)
    train_model = wrap_ddp(model, dist_info) if dist_info.distributed else model
    score = lambda m: evaluate_classifier(m, dev_batches, num_labels, device, amp_autocast, dist_info)  # noqa

    def evaluate():
        """The dev metrics of the weights the run keeps: the EMA's when there is one (plus the raw weights' acc)."""
        if model_ema is None:
            return score(model)
        return {**score(model_ema.module), 'raw_acc': score(model)['acc']}

    output_dir = run.open_outputs('./output/text', f'{datetime.now():%Y%m%d-%H%M%S}-{family}-classify')
    run.log_settings_changes()
    counts = torch.bincount(train_labels, minlength=num_labels).tolist()
    majority = 100. * torch.bincount(dev_labels, minlength=num_labels).max().item() / len(dev_labels)
    _logger.info(f'Model {type(model).__name__} ({params_note(model)}, {family}) on {device}, '
                 f'AMP {amp_dtype if args.amp else "off"}, {torch.get_num_threads()} threads')
    _logger.info(report.log_line())
    _logger.info(f'Data: {len(train)} training examples ({args.train_file}), {len(dev)} dev ({args.val_file}); '
                 f'text columns {list(train.text_columns)}, labels {dict(zip(names, counts))} (training counts), '
                 f'dev majority class {majority:.2f}%; max length {args.block_size}; {tokenizer!r}')
    _logger.info(f'Task classify: {args.steps} updates x batch {args.batch_size} x accum {args.grad_accum_steps} x '
                 f'{world} processes; AdamW lr {args.lr:g} wd {args.weight_decay:g}, {args.warmup_steps} warmup then '
                 f'{args.sched} ({recipe_info["source"]})'
                 + (f'; weight EMA decay {args.model_ema_decay:g} (it is evaluated, selected and exported)'
                    if model_ema is not None else '')
                 + (f'; resuming at step {start_step} from {args.resume}' if args.resume else ''))
    if primary:
        _logger.info(f'Outputs: {output_dir}')

    # ---------------------------------------------------------------- sampler state: (epoch, position)
    epoch, position = 0, 0
    global_bs = args.batch_size * world
    if len(train) < global_bs:
        raise UsageError(f'the training file has {len(train)} examples, fewer than one batch of {global_bs}; use a '
                         f'smaller --batch-size')
    order = _epoch_order(len(train), args.seed, epoch)

    def restore_rank(rank_state):
        nonlocal epoch, position, order
        epoch, position = rank_state['epoch'], rank_state['position']
        order = _epoch_order(len(train), args.seed, epoch)

    def next_batch():
        nonlocal epoch, position, order
        if position + global_bs > len(train):  # drop the incomplete tail: every batch has the same size
            epoch, position = epoch + 1, 0
            order = _epoch_order(len(train), args.seed, epoch)
        idx = order[position:position + global_bs][dist_info.rank::world].tolist()
        position += global_bs
        return collate([train_ids[i] for i in idx], [train_types[i] for i in idx], train_labels[idx],
                       tokenizer.pad_id, with_types)

    # ---------------------------------------------------------------- train
    state = StepState(step=start_step, start_step=start_step)
    meta = dict(task=args.task, model_cfg={'name': args.model, 'family': family, 'kwargs': dict(args.model_kwargs)},
                model_config=config.to_dict(), tokenizer=tokenizer.to_dict(), block_size=args.block_size,
                label_names=names, text_columns=list(train.text_columns), init_report=report.to_dict())

    def eval_row(metrics):
        return {'val_acc': metrics['acc'], 'val_f1': metrics['f1'], 'val_mcc': metrics['mcc'],
                **({'raw_val_acc': metrics['raw_acc']} if 'raw_acc' in metrics else {}),
                'examples_per_sec': state.step * global_bs * args.grad_accum_steps / max(
                    seconds_before + state.train_seconds, 1e-9) if start_step == 0 else None}

    finished = run_steps(
        args, run, state, model=model, train_model=train_model, optimizer=optimizer, scheduler=scheduler,
        schedule=schedule, loss_scaler=loss_scaler, update_step=update_step,
        micro_loss=lambda: _forward(train_model, next_batch(), device, amp_autocast).loss,
        evaluate=evaluate, best_key='acc', model_ema=model_ema,
        rank_extra=lambda: {'epoch': epoch, 'position': position}, restore_rank=restore_rank,
        save_extra=lambda metrics: dict(train_seconds=seconds_before + state.train_seconds, val_metrics=metrics,
                                        state_dict_ema=None if model_ema is None else model_ema.module.state_dict(),
                                        **meta),
        progress_text=lambda: f'epoch {epoch}', eval_row=eval_row,
        eval_text=lambda m: (f'dev loss {m["loss"]:.4f} acc {m["acc"]:.2f}% F1 {m["f1"]:.2f} '
                             f'MCC {m["mcc"]:.2f}' + (f' (EMA; raw weights {m["raw_acc"]:.2f}%)' if 'raw_acc' in m
                                                      else '')))
    if not finished:
        return state.stop_result
    step, val_metrics, train_seconds = state.step, state.val_metrics, state.train_seconds
    run.begin_final_stage()

    final_metrics = val_metrics if val_metrics is not None else evaluate()
    digests = run.weights_digests(model, model_ema.module if model_ema is not None else None)
    if not primary:
        return None
    best_metrics, best_step = final_metrics, step
    if run.saver.best_path.exists():
        best = load_checkpoint_file(run.saver.best_path, what='model_best.pth')
        best_metrics, best_step = best.get('val_metrics') or final_metrics, best['step']
        # the weights that were scored: the EMA's (a best checkpoint saved before --model-ema was added on a
        # resume has none, and was chosen on its raw weights)
        ema_weights = best.get('state_dict_ema') if model_ema is not None else None
        model.load_state_dict(best['state_dict'] if ema_weights is None else ema_weights)
    elif model_ema is not None:
        model.load_state_dict(model_ema.module.state_dict())
    # the test file is scored once, by the best checkpoint, on the primary rank alone (no reduction across ranks)
    test_metrics = (evaluate_classifier(model, test_batches, num_labels, device, amp_autocast, None)
                    if test_batches is not None else None)
    with atomic_folder(output_dir / 'pretrained') as folder:
        model.save_pretrained(str(folder), tokenizer=tokenizer)
        (folder / 'labels.json').write_text(json.dumps(
            {'label_names': names, 'text_columns': list(train.text_columns), 'label_column': args.label_column,
             'max_length': args.block_size}, indent=2))
    results = {
        'model': type(model).__name__, 'family': family, 'task': 'classify', 'model_config': config.to_dict(),
        'params': num_params, 'init': report.to_dict(),
        'tokenizer': {'type': tokenizer.to_dict()['tokenizer_type'], 'vocab_size': tokenizer.vocab_size},
        'data': {'train_file': args.train_file, 'val_file': args.val_file, 'text_columns': list(train.text_columns),
                 'label_column': args.label_column, 'label_names': names, 'train_examples': len(train),
                 'dev_examples': len(dev), 'train_label_counts': counts, 'dev_majority_acc': majority},
        'max_length': args.block_size, 'steps': args.steps, 'batch_size': args.batch_size,
        'optimizer': {'name': 'adamw', 'lr': args.lr, 'betas': list(args.opt_betas), 'eps': args.opt_eps,
                      'weight_decay': args.weight_decay, 'sched': args.sched, 'warmup_steps': args.warmup_steps,
                      'clip_grad': args.clip_grad, **recipe_info},
        'model_ema': None if model_ema is None else {
            'decay': args.model_ema_decay, 'note': 'val metrics, model_best.pth\'s choice, test and pretrained/ are '
                                                   'the EMA weights\''},
        'best_step': best_step, 'val_best': best_metrics, 'val_final': final_metrics,
        'test_file': args.test_file or None, 'test': test_metrics,
        'train_seconds': seconds_before + train_seconds,
        'wall_seconds_this_process': time.time() - run.start_time, 'device': str(device), 'world_size': world,
        'threads': torch.get_num_threads(), 'seed': args.seed, 'torch': torch.__version__,
        'weights_sha256_per_rank': digests,
        'checkpoints': {'last': str(run.saver.last_path),
                        'best': str(run.saver.best_path) if run.saver.best_path.exists() else None,
                        'pretrained': str(output_dir / 'pretrained') + ' (the best checkpoint\'s weights)'},
        'experiment_dir': str(output_dir),
        'command': 'python -m mlp_vision.text.train ' + ' '.join(_quote(a) for a in argv),
    }
    run.write_results(results)
    plot_curves(output_dir / 'summary.csv', output_dir / 'curves.png', title=f'{type(model).__name__} (classify)',
                x='step', loss_columns=('train_loss', 'val_loss'), metric_columns=('val_acc',),
                metric_label='dev accuracy (%)')
    _logger.info(f'Done: best dev acc {best_metrics["acc"]:.2f}% F1 {best_metrics["f1"]:.2f} MCC '
                 f'{best_metrics["mcc"]:.2f} at step {best_step} (final: acc {final_metrics["acc"]:.2f}%; majority '
                 f'class {majority:.2f}%)'
                 + (f'; test ({args.test_file}, the best checkpoint): acc {test_metrics["acc"]:.2f}% F1 '
                    f'{test_metrics["f1"]:.2f} MCC {test_metrics["mcc"]:.2f}' if test_metrics is not None else '')
                 + f'; {format_duration(time.time() - run.start_time)}')
    run.list_outputs()
    return results
