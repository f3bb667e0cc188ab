""" The labelled files of ``python -m mlp_vision.train_text --task classify`` and their metrics.

Files (:func:`read_labelled_file`): GLUE-style (arXiv 1804.07461) with a header row; tab-separated for ``.tsv`` (no
quoting: GLUE's sentences hold bare quote characters), CSV quoting for ``.csv`` (other names: tab when the header
has one). Label ids are the sorted distinct training labels (numerically when all are numbers, so ``0`` / ``1`` stay
0 / 1). Examples (:func:`classification_examples`): BERT's template, longest-first truncation to ``--block-size``.
Metrics (:func:`classification_metrics`, in %): accuracy, F1 and Matthews correlation, GLUE's (§3).
"""
import csv
import dataclasses
import io
import math
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from mlp_vision.errors import Interrupted, UsageError, short_repr
from mlp_vision.text.tokenizer import Tokenizer, unknown_character
from mlp_vision.text.training_data import check_unknown_tokens, read_text_file

__all__ = ['LabelledData', 'read_labelled_file', 'label_ids', 'classification_examples', 'classification_metrics']


@dataclasses.dataclass
class LabelledData:
    """The examples of one file: first (and second) text segments and the raw label strings."""
    path: str
    text_columns: Tuple[str, ...]
    texts: List[str]
    pairs: Optional[List[str]]
    labels: List[str]


def read_labelled_file(path: str, text_columns: Optional[Sequence[str]] = None, label_column: str = 'label',
                       what: str = '--train-file') -> LabelledData:
    """Read a GLUE-style TSV / CSV file with a header row (see the module docstring); one-line :class:`UsageError`
    for a missing / empty file, missing columns, ragged rows or an empty label."""
    content = read_text_file(path, what, encoding='utf-8-sig')
    header_line = content.split('\n', 1)[0]
    if not header_line.strip():
        raise UsageError(f'{what} {path!r} starts with an empty line; expected a header row ("sentence<TAB>label")')
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
    if not 1 <= len(text_columns) <= 2 or not all(text_columns):
        raise UsageError(f'--text-columns takes one column name or a pair, got {list(text_columns)}')
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


def classification_examples(tokenizer: Tokenizer, data: LabelledData, names: Sequence[str], max_length: int,
                            with_token_types: bool, stop: Optional[Callable[[], int]] = None) -> List[Dict]:
    """The examples Trainer iterates: ``input_ids``, [``token_type_ids``,] ``labels`` (the index in ``names``).
    BERT's template (the tokenizer's post-processor), truncated to ``max_length`` tokens longest first
    (``tokenizers``' rule: tokens leave the end of the longer segment). ``stop``: the run's stop flag, read every
    :data:`ENCODE_EXAMPLES_PER_PIECE` examples (:class:`Interrupted`)."""
    to_id = {name: i for i, name in enumerate(names)}
    examples: List[Dict] = []
    for start in range(0, len(data.texts), ENCODE_EXAMPLES_PER_PIECE):
        signum = stop() if stop is not None else 0
        if signum:
            raise Interrupted(signum, f'tokenizing {data.path} ({start} of {len(data.texts)} examples so far)')
        texts = data.texts[start:start + ENCODE_EXAMPLES_PER_PIECE]
        pairs = None if data.pairs is None else data.pairs[start:start + ENCODE_EXAMPLES_PER_PIECE]
        try:
            encoded = tokenizer(texts, pairs, truncation='longest_first', max_length=max_length,
                                return_token_type_ids=with_token_types, return_attention_mask=False)
        except Exception as e:  # tokenizers' plain Exception: a character outside a char alphabet without <unk>
            bad = unknown_character(tokenizer, list(texts) + list(pairs or []), e)
            raise UsageError(f'{data.path} has the character {bad!r}, which the tokenizer does not know') from None
        for j, label in enumerate(data.labels[start:start + ENCODE_EXAMPLES_PER_PIECE]):
            examples.append({**{key: values[j] for key, values in encoded.items()}, 'labels': to_id[label]})
    check_unknown_tokens([i for e in examples for i in e['input_ids']], tokenizer, f'text of {data.path}')
    return examples


def classification_metrics(predictions, labels, num_labels: int) -> Dict[str, float]:
    """Accuracy, F1 (binary: of label id 1; more labels: macro) and Matthews correlation, all in %, of class-id
    sequences; equal to scikit-learn's ``accuracy_score`` / ``f1_score`` / ``matthews_corrcoef`` x 100."""
    predictions = torch.as_tensor(predictions, dtype=torch.long).reshape(-1)
    labels = torch.as_tensor(labels, dtype=torch.long).reshape(-1)
    cm = torch.bincount(labels * num_labels + predictions, minlength=num_labels * num_labels)
    cm = cm.reshape(num_labels, num_labels).to(torch.float64)  # rows true, columns predicted
    n = cm.sum().item()
    correct = cm.diag().sum().item()
    f1_per_class = 2 * cm.diag() / (cm.sum(0) + cm.sum(1)).clamp(min=1)  # 2 tp / (2 tp + fp + fn); 0 without tp
    f1 = (f1_per_class[1] if num_labels == 2 else f1_per_class.mean()).item()
    # multi-class MCC (Gorodkin 2004), which is Matthews' phi for two classes (as scikit-learn's matthews_corrcoef)
    t, p = cm.sum(1), cm.sum(0)
    cov_ytyp = correct * n - (t * p).sum().item()
    cov_ypyp = n * n - (p * p).sum().item()
    cov_ytyt = n * n - (t * t).sum().item()
    denom = math.sqrt(cov_ypyp * cov_ytyt)
    mcc = 0. if denom == 0 else cov_ytyp / denom
    return {'acc': 100. * correct / max(n, 1.), 'f1': 100. * f1, 'mcc': 100. * mcc}
