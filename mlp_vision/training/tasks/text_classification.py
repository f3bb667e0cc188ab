""" Fine-tuning on labelled data: ``python -m mlp_vision.train_text --task classify``; the workflow (``--init-from``,
``--test-file``, ``--model-ema``, outputs) is README's Workflow 3, the initial weights :mod:`.classifier_init`.

Data (:func:`read_labelled_file`): GLUE-style files (arXiv 1804.07461) with a header row; tab-separated for ``.tsv``
(no quoting, as GLUE's files, whose sentences hold bare quote characters), comma-separated with CSV quoting for
``.csv`` (other names: tab when the header has one). ``--text-columns`` names one column or a pair (default
``sentence``, else ``sentence1,sentence2``). Label ids are the sorted distinct training labels (numerically when
all are integers, so GLUE's ``0`` / ``1`` stay 0 / 1).

Inputs: the model's tokenizer with BERT's template (``<cls> A <sep> [B <sep>]``, token types 0 / 1 where the family
reads them), longest-first truncation to ``--block-size`` tokens (default: the model's maximum length), right
padding to each batch's longest sequence with an attention mask (padding never changes a real token's output).

Metrics (:func:`classification_metrics`, in %): accuracy, F1 of label id 1 (binary; macro-F1 with more labels) and
Matthews correlation, GLUE's metrics (arXiv 1804.07461 §3); ``model_best.pth`` by dev accuracy.
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
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.utils.rnn import pad_sequence
from timm.utils import ModelEmaV3

from mlp_vision.errors import Interrupted, UsageError, short_repr
from mlp_vision.text.modeling_utils import check_text_model_size
from mlp_vision.text.registry import model_class
from mlp_vision.text.tokenizer import (
    Tokenizer, describe_tokenizer, encode_with_template, tokenizer_from_dict, unknown_character)
from mlp_vision.training.run.checkpoint import load_checkpoint_file
from mlp_vision.training.run.driver import Optimization
from mlp_vision.training.run.loop import warn_global_batch_beyond_data
from mlp_vision.training.tasks.classifier_init import CLASSIFY_FAMILIES, InitReport, init_classifier, scratch_tokenizer
from mlp_vision.training.tasks.text_data import check_unknown_tokens, read_utf8_file
from mlp_vision.training.tasks.text_task import TextTask, fit_block_size

__all__ = [
    'LabelledData', 'read_labelled_file', 'label_ids', 'encode_examples', 'collate', 'classification_metrics',
    'init_classifier', 'InitReport', 'CLASSIFY_FAMILIES', 'ClassificationTask',
]

_logger = logging.getLogger('mlp_vision.train_text')


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


def read_labelled_file(path: str, text_columns: Optional[Sequence[str]] = None, label_column: str = 'label',
                       what: str = '--train-file') -> LabelledData:
    """Read a GLUE-style TSV / CSV file with a header row (see the module docstring); one-line :class:`UsageError`
    for a missing / empty file, missing columns, ragged rows or an empty label."""
    content = read_utf8_file(path, what, ': --task classify needs --train-file and --val-file (TSV / CSV with a '
                             'header row)', encoding='utf-8-sig', expected='; expected a UTF-8 TSV / CSV')
    header_line = content.split('\n', 1)[0]
    if not header_line.strip():
        raise UsageError(f'{what} {path!r} is empty; expected a header row (e.g. "sentence<TAB>label") and examples')
    delimiter = {'.tsv': '\t', '.csv': ','}.get(Path(path).suffix.lower(), '\t' if '\t' in header_line else ',')
    # the csv module reads the lines itself (newline=''): a quoted field keeps its line breaks, and no split at
    # \x0b, \x1c, U+2028, ... (as str.splitlines does) cuts one
    stream = io.StringIO(content, newline='')
    reader = csv.reader(stream, delimiter='\t', quoting=csv.QUOTE_NONE) if delimiter == '\t' else csv.reader(stream)
    try:
        rows = [(reader.line_num, row) for row in reader]
    except csv.Error as e:  # a field over csv.field_size_limit() (131,072 characters), a NUL byte, ...
        raise UsageError(f'{what} {path!r} line {reader.line_num}: {e}; one field runs on (an unclosed quote?) or '
                         f'holds a whole document: one example per row, each field under {csv.field_size_limit():,} '
                         f'characters') from None
    header = [h.strip() for h in rows[0][1]]
    sep_name = 'tab' if delimiter == '\t' else 'comma'
    twice = sorted({h for h in header if header.count(h) > 1})
    if twice:  # which of the two to read would be a guess
        raise UsageError(f'{what} {path!r} names the column {twice[0]!r} {header.count(twice[0])} times in its header '
                         f'({sep_name}-separated: {short_repr(header)}); expected each column named once')
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
        if [h.strip() for h in row] == header:
            raise UsageError(f'{what} {path!r} line {line_no} repeats the header row (files joined with their '
                             f'headers?); expected one header row, then examples')
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
    fewer than two, or a dev label the training file lacks, is an error."""
    names = sorted(set(train_labels), key=_label_sort_key)
    if len(names) < 2:
        raise UsageError(f'the training file has only the label {names}; classification needs at least two labels')
    unknown = sorted(set(dev_labels) - set(names), key=_label_sort_key)
    if unknown:
        raise UsageError(f'{dev_what} has labels {unknown[:5]}{"..." if len(unknown) > 5 else ""} that the training '
                         f'file does not have (training labels: {names}); both files must use the same label set')
    return names


# examples tokenized at a time, the run's stop flag read between (each example is encoded on its own)
ENCODE_EXAMPLES_PER_PIECE = 10_000


def encode_examples(tokenizer: Tokenizer, data: LabelledData, max_length: int,
                    stop: Optional[Callable[[], int]] = None) -> Tuple[List[List[int]], List[List[int]]]:
    """(input ids, token type ids) per example: BERT's template, longest-first truncation to ``max_length``.
    ``stop``: the run's stop flag, read every :data:`ENCODE_EXAMPLES_PER_PIECE` examples (:class:`Interrupted`)."""
    ids: List[List[int]] = []
    types: List[List[int]] = []
    for start in range(0, len(data.texts), ENCODE_EXAMPLES_PER_PIECE):
        signum = stop() if stop is not None else 0
        if signum:
            raise Interrupted(signum, f'tokenizing {data.path} ({start} of {len(data.texts)} examples so far)')
        texts = data.texts[start:start + ENCODE_EXAMPLES_PER_PIECE]
        pairs = None if data.pairs is None else data.pairs[start:start + ENCODE_EXAMPLES_PER_PIECE]
        try:
            piece_ids, piece_types = encode_with_template(tokenizer, texts, pairs, max_length)
        except ValueError as e:
            raise UsageError(f'cannot encode {data.path}: {e}') from None
        except Exception as e:  # tokenizers' plain Exception: a character outside a char alphabet without <unk>
            bad = unknown_character(tokenizer, list(texts) + list(pairs or []), e)
            raise UsageError(f'{data.path} has the character {bad!r}, which the tokenizer does not know') from None
        ids += piece_ids
        types += piece_types
    check_unknown_tokens([i for row in ids for i in row], tokenizer, f'text of {data.path}')
    return ids, types


def collate(ids: Sequence[List[int]], types: Sequence[List[int]], labels: torch.Tensor, pad_id: int,
            with_token_types: bool) -> Dict[str, torch.Tensor]:
    """A right-padded batch: ``input_ids``, ``attention_mask`` (1 = real), [``token_type_ids``], ``labels``."""
    def padded(rows, value=0):
        return pad_sequence([torch.tensor(r, dtype=torch.long) for r in rows], batch_first=True, padding_value=value)
    batch = {'input_ids': padded(ids, pad_id), 'attention_mask': padded([[1] * len(r) for r in ids]), 'labels': labels}
    if with_token_types:
        batch['token_type_ids'] = padded(types)
    return batch


def _metrics_from_confusion(cm: torch.Tensor) -> Dict[str, float]:
    """Accuracy, F1 and Matthews correlation (%) of a (K, K) confusion matrix (rows true, columns predicted)."""
    cm = cm.to(torch.float64)
    n = cm.sum().item()
    correct = cm.diag().sum().item()
    k = cm.shape[0]
    f1_per_class = 2 * cm.diag() / (cm.sum(0) + cm.sum(1)).clamp(min=1)  # 2 tp / (2 tp + fp + fn); 0 without tp
    f1 = (f1_per_class[1] if k == 2 else f1_per_class.mean()).item()
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
    # the confusion matrix and the loss sum, on the device (no host sync per batch)
    sums = torch.zeros(num_labels * num_labels + 1, dtype=torch.float64, device=device)
    start = time.perf_counter()
    for batch in batches[rank::world]:
        out = _forward(model, batch, device, amp_autocast)
        logits = out.logits.float()
        labels = batch['labels'].to(device, non_blocking=True)
        sums[-1] += torch.nn.functional.cross_entropy(logits, labels, reduction='sum')
        sums[:-1] += torch.bincount(labels * num_labels + logits.argmax(-1), minlength=num_labels * num_labels)
    if world > 1:
        dist.all_reduce(sums)
    sums = sums.cpu()  # the evaluation's one host sync
    metrics = _metrics_from_confusion(sums[:-1].reshape(num_labels, num_labels))
    metrics['loss'] = sums[-1].item() / max(metrics['examples'], 1)
    metrics['seconds'] = time.perf_counter() - start
    return metrics


@dataclasses.dataclass
class ClassifyData:
    """The labelled files of a run, their label names and the encoded training examples."""
    train: LabelledData
    dev: LabelledData
    test: Optional[LabelledData]
    names: List[str]  # label names in id order

    def labels(self, data: LabelledData) -> torch.Tensor:
        to_id = {n: i for i, n in enumerate(self.names)}
        return torch.tensor([to_id[x] for x in data.labels], dtype=torch.long)


def _read_data(args, resumed: dict) -> ClassifyData:
    """--train-file / --val-file / --test-file with their columns and the label set (checked against a resume)."""
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
    return ClassifyData(train, dev, test, names)


class ClassificationTask(TextTask):
    """Sequence classification for :func:`~mlp_vision.training.run.driver.drive`: epochs of the training examples in a
    seeded order (the incomplete tail dropped: one batch size), cross-entropy, dev accuracy / F1 / MCC."""
    best_key = 'acc'
    registry_task = 'sequence_classification'

    def build(self) -> nn.Module:
        """The data; the resumed run's architecture and tokenizer (the driver restores its weights), else
        :func:`init_classifier`'s; ``--block-size``."""
        args, resumed = self.args, self.run.resume_ckpt or {}
        self.data = data = _read_data(args, resumed)
        train = data.train
        if resumed:
            family = resumed['model_cfg']['family']
            cls = model_class(family, 'sequence_classification')
            config = cls.config_class.from_dict(resumed['model_config'])
            check_text_model_size(cls, config, f'--resume {args.resume}')
            model = cls(config)
            tokenizer = tokenizer_from_dict(resumed['tokenizer'], args.allow_regex)
            self.init_report = InitReport(**resumed['init_report'])
        else:
            model, family, tokenizer, self.init_report = init_classifier(
                args.init_from, args.model, args.model_kwargs, len(data.names),
                tokenizer_for_scratch=lambda: scratch_tokenizer(args.tokenizer, train.texts + (train.pairs or []),
                                                                args.tokenizer_from, args.allow_regex),
                trust=getattr(args, 'trust_checkpoint', False), allow_regex=args.allow_regex)
            if args.init_from:  # the checkpoint decides the architecture; --model names it in the outputs
                args.derive(model=f'{type(model).__name__} from {args.init_from}')
        if tokenizer.cls_token_id is None or tokenizer.pad_token_id is None:
            raise UsageError(f'the tokenizer {describe_tokenizer(tokenizer)} has no <cls> / <pad> token; sequence '
                             f'classification needs both (the BERT template)')
        if train.pairs is not None and tokenizer.sep_token_id is None:
            raise UsageError(f'sentence pairs need a separator token; the tokenizer '
                             f'{describe_tokenizer(tokenizer)} has none')
        fit_block_size(args, model, resizable=False)
        if args.block_size < tokenizer.num_special_tokens_to_add(pair=train.pairs is not None) + 1:
            raise UsageError(f'--block-size {args.block_size} leaves no room for text after the special tokens')
        self.family, self.tokenizer = family, tokenizer
        self.model_cfg = {'name': args.model, 'family': family, 'kwargs': dict(args.model_kwargs)}
        return model

    def create_ema(self, model: nn.Module) -> Optional[ModelEmaV3]:
        return ModelEmaV3(model, decay=self.args.model_ema_decay) if self.args.model_ema else None

    def ready(self, opt: Optimization) -> None:
        super().ready(opt)
        args, run, data, model = self.args, self.run, self.data, opt.model
        self.num_labels = len(data.names)
        self.with_types = 'token_type_ids' in inspect.signature(model.forward).parameters
        self.train_ids, self.train_types = encode_examples(self.tokenizer, data.train, args.block_size, run.stop_signal)
        self.train_labels = data.labels(data.train)
        warn_global_batch_beyond_data(args.batch_size, run.dist_info.world_size, args.grad_accum_steps,
                                      len(self.train_labels), f'examples in {data.train.path}')
        self.dev_batches = self.eval_batches(data.dev)
        self.test_batches = self.eval_batches(data.test) if data.test is not None else None
        self.global_bs = args.batch_size * run.dist_info.world_size
        if len(data.train) < self.global_bs:
            raise UsageError(f'the training file has {len(data.train)} examples, fewer than one batch of '
                             f'{self.global_bs}; use a smaller --batch-size')
        self.load_data_state({'epoch': 0, 'position': 0})

    def output_folder(self) -> Tuple[str, str]:
        return './output/text', f'{datetime.now():%Y%m%d-%H%M%S}-{self.family}-classify'

    def eval_batches(self, data: LabelledData) -> List[Dict[str, torch.Tensor]]:
        bs = self.args.eval_batch_size or self.args.batch_size
        ids, types = encode_examples(self.tokenizer, data, self.args.block_size, self.run.stop_signal)
        labels = self.data.labels(data)
        return [collate(ids[i:i + bs], types[i:i + bs], labels[i:i + bs], self.tokenizer.pad_token_id, self.with_types)
                for i in range(0, len(ids), bs)]

    def score(self, model: nn.Module, batches=None, dist_info='run') -> Dict[str, float]:
        dist_info = self.run.dist_info if dist_info == 'run' else dist_info
        return evaluate_classifier(model, self.dev_batches if batches is None else batches, self.num_labels,
                                   self.run.dist_info.device, self.opt.amp_autocast, dist_info)

    def micro_loss(self) -> torch.Tensor:
        if self.position + self.global_bs > len(self.data.train):  # drop the incomplete tail
            self.load_data_state({'epoch': self.epoch + 1, 'position': 0})
        rank, world = self.run.dist_info.rank, self.run.dist_info.world_size
        idx = self.order[self.position:self.position + self.global_bs][rank::world].tolist()
        self.position += self.global_bs
        batch = collate([self.train_ids[i] for i in idx], [self.train_types[i] for i in idx], self.train_labels[idx],
                        self.tokenizer.pad_token_id, self.with_types)
        return _forward(self.opt.train_model, batch, self.run.dist_info.device, self.opt.amp_autocast).loss

    def evaluate(self) -> Dict[str, float]:
        """The dev metrics of the weights the run keeps: the EMA's when there is one (plus the raw weights' acc)."""
        if self.opt.model_ema is None:
            return self.score(self.opt.model)
        return {**self.score(self.opt.model_ema.module), 'raw_acc': self.score(self.opt.model)['acc']}

    def data_state(self) -> dict:
        return {'epoch': self.epoch, 'position': self.position}

    def load_data_state(self, state: dict) -> None:
        self.epoch, self.position = state['epoch'], state['position']
        seed = self.args.seed * 100_003 + self.epoch
        self.order = torch.randperm(len(self.data.train), generator=torch.Generator().manual_seed(seed))

    def checkpoint_fields(self, metrics) -> dict:
        ema, data = self.opt.model_ema, self.data
        return {**super().checkpoint_fields(metrics), 'label_names': data.names,
                'text_columns': list(data.train.text_columns), 'init_report': dataclasses.asdict(self.init_report),
                'state_dict_ema': None if ema is None else ema.module.state_dict()}

    def progress(self) -> str:
        return f'epoch {self.epoch}'

    def eval_report(self, m) -> Tuple[dict, str]:
        state = self.state
        row = {'val_acc': m['acc'], 'val_f1': m['f1'], 'val_mcc': m['mcc'],
               **({'raw_val_acc': m['raw_acc']} if 'raw_acc' in m else {}),
               'examples_per_sec': state.step * self.global_bs * self.args.grad_accum_steps / max(
                   self.train_seconds, 1e-9) if state.start_step == 0 else None}
        text = (f'dev loss {m["loss"]:.4f} acc {m["acc"]:.2f}% F1 {m["f1"]:.2f} MCC {m["mcc"]:.2f}'
                + (f' (EMA; raw weights {m["raw_acc"]:.2f}%)' if 'raw_acc' in m else ''))
        return row, text

    def log_setup(self) -> None:
        """The setup lines of the log; keeps the training label counts and the dev majority-class accuracy (%)."""
        args, run, opt, data, n = self.args, self.run, self.opt, self.data, self.num_labels
        counts = torch.bincount(self.train_labels, minlength=n).tolist()
        dev_labels = data.labels(data.dev)
        majority = 100. * torch.bincount(dev_labels, minlength=n).max().item() / len(dev_labels)
        self.log_model(type(opt.model).__name__, self.family)
        _logger.info(self.init_report.log_line())
        _logger.info(f'Data: {len(data.train)} training examples ({args.train_file}), {len(data.dev)} dev '
                     f'({args.val_file}); text columns {list(data.train.text_columns)}, labels '
                     f'{dict(zip(data.names, counts))} (training counts), dev majority class {majority:.2f}%; max '
                     f'length {args.block_size}; {describe_tokenizer(self.tokenizer)}')
        _logger.info(f'Task classify: {args.steps} updates x batch {args.batch_size} x accum {args.grad_accum_steps} x '
                     f'{run.dist_info.world_size} processes; AdamW lr {args.lr:g} wd {args.weight_decay:g}, '
                     f'{args.warmup_steps} warmup then {args.sched} ({self.recipe_info["source"]})'
                     + (f'; weight EMA decay {args.model_ema_decay:g} (it is evaluated, selected and exported)'
                        if opt.model_ema is not None else '')
                     + (f'; resuming at step {opt.start} from {args.resume}' if args.resume else ''))
        self.counts, self.majority = counts, majority

    def final_results(self, digests) -> Optional[dict]:
        """The best checkpoint's test score, ``pretrained/`` (with ``labels.json``) and the results (rank 0)."""
        args, run, opt, data, model = self.args, self.run, self.opt, self.data, self.opt.model
        final_metrics = self.state.val_metrics if self.state.val_metrics is not None else self.evaluate()
        if not run.dist_info.primary:
            return None
        best_metrics, best_step = self._best_weights(final_metrics)
        # the test file is scored once, by the best checkpoint, on the primary rank alone (no reduction across ranks)
        test_metrics = self.score(model, self.test_batches, dist_info=None) if data.test is not None else None
        labels = json.dumps({'label_names': data.names, 'text_columns': list(data.train.text_columns),
                             'label_column': args.label_column, 'max_length': args.block_size}, indent=2)
        return {
            'model': type(model).__name__, 'family': self.family, 'task': 'classify',
            'model_config': model.config.text_fields(), 'init': dataclasses.asdict(self.init_report),
            'data': {'train_file': args.train_file, 'val_file': args.val_file,
                     'text_columns': list(data.train.text_columns), 'label_column': args.label_column,
                     'label_names': data.names, 'train_examples': len(data.train), 'dev_examples': len(data.dev),
                     'train_label_counts': self.counts, 'dev_majority_acc': self.majority},
            'max_length': args.block_size, 'steps': args.steps, 'batch_size': args.batch_size,
            'model_ema': None if opt.model_ema is None else {
                'decay': args.model_ema_decay,
                'note': 'val metrics, model_best.pth\'s choice, test and pretrained/ are the EMA weights\''},
            'best_step': best_step, 'val_best': best_metrics, 'val_final': final_metrics,
            'test_file': args.test_file or None, 'test': test_metrics,
            **self.export(digests, {'labels.json': labels},
                          pretrained=f'{run.output_dir / "pretrained"} (the best checkpoint\'s weights)'),
        }

    def report(self, results: dict) -> None:
        """The curves and the closing log line."""
        best_metrics, final_metrics, test_metrics = results['val_best'], results['val_final'], results['test']
        self.plot_and_close(
            f'{results["model"]} (classify)', 'val_acc', 'dev accuracy (%)',
            f'best dev acc {best_metrics["acc"]:.2f}% F1 {best_metrics["f1"]:.2f} MCC {best_metrics["mcc"]:.2f} at '
            f'step {results["best_step"]} (final: acc {final_metrics["acc"]:.2f}%; majority class '
            f'{results["data"]["dev_majority_acc"]:.2f}%)'
            + (f'; test ({self.args.test_file}, the best checkpoint): acc {test_metrics["acc"]:.2f}% F1 '
               f'{test_metrics["f1"]:.2f} MCC {test_metrics["mcc"]:.2f}' if test_metrics is not None else ''))

    def _best_weights(self, final_metrics: dict) -> Tuple[dict, int]:
        """Load the selected weights into the model: model_best.pth's (its EMA's with ``--model-ema``, where it has
        them), else the final EMA; returns (their dev metrics, their step)."""
        model, ema, best_path = self.opt.model, self.opt.model_ema, self.run.saver.best_path
        if best_path.exists():
            best = load_checkpoint_file(best_path, what='model_best.pth')
            ema_weights = best.get('state_dict_ema') if ema is not None else None
            model.load_state_dict(best['state_dict'] if ema_weights is None else ema_weights)
            return best.get('val_metrics') or final_metrics, best['step']
        if ema is not None:
            model.load_state_dict(ema.module.state_dict())
        return final_metrics, self.state.step
