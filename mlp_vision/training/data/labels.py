""" The class names of a dataset, and the checks that its labels are the model's.

timm's datasets keep their classes in different places (``class_to_idx``, ``class_name_to_idx``, torchvision's
``classes``); train.py stores them in checkpoints and validate.py labels class folders by them, so a model is
never scored against labels of other classes without a one-line error.
"""
import logging
from typing import Dict, List, Optional, Sequence

import torch.utils.data
from timm.utils.misc import natural_key

from mlp_vision.errors import UsageError
from mlp_vision.training.data.reader import ImageFileDataset

__all__ = ['dataset_class_to_idx', 'dataset_class_names', 'check_num_classes', 'check_class_names', 'short_names']

_logger = logging.getLogger(__name__)


def dataset_class_to_idx(ds) -> Optional[Dict[str, int]]:
    """``{class name: label}`` of a dataset (image folder / tar, timm readers, torchvision), None if unknown."""
    if isinstance(ds, torch.utils.data.Subset):
        return dataset_class_to_idx(ds.dataset)
    reader = getattr(ds, 'reader', None)
    class_to_idx = (getattr(ds, 'class_to_idx', None) or getattr(reader, 'class_to_idx', None)
                    or getattr(reader, 'class_name_to_idx', None))  # folder / tar / timm readers
    if class_to_idx:
        return dict(class_to_idx)
    classes = getattr(ds, 'classes', None)
    if classes:
        return {c: i for i, c in enumerate(classes)}
    return None


def dataset_class_names(ds) -> Optional[List[str]]:
    """Class names in label order (folder / tar / torchvision datasets), None if the dataset does not say."""
    class_to_idx = dataset_class_to_idx(ds)
    return None if class_to_idx is None else sorted(class_to_idx, key=class_to_idx.get)


def check_num_classes(ds, num_classes: int, what: str = 'dataset', hint: str = '') -> None:
    """Raise a :class:`UsageError` if the dataset's labels do not match a ``num_classes``-way classifier."""
    names = dataset_class_names(ds)
    if names is None:
        return
    if len(names) != num_classes:
        shown = ', '.join(names[:5]) + (', ...' if len(names) > 5 else '')
        raise UsageError(
            f'class-count mismatch: the {what} has {len(names)} classes ({shown}) but the model has '
            f'{num_classes} outputs{hint}')


def short_names(names: Sequence[str], n: int = 10) -> str:
    shown = ', '.join(names[:n]) + (f', ... ({len(names)} in all)' if len(names) > n else '')
    return f'[{shown}]'


def check_class_names(ds, class_names: Sequence[str], what: str = 'dataset', hint: str = '') -> None:
    """Raise a :class:`UsageError`, with both lists, when ``ds`` has classes not in ``class_names`` (a model's, in
    label order) or labels them otherwise. An image folder / tar labelled by these names may hold a subset of the
    classes; other datasets must list the same classes in the same order."""
    if isinstance(ds, ImageFileDataset):
        if not ds.other_classes:
            return
        folders = sorted({p.split('/', 1)[0] for p, _ in ds.samples} | set(ds.other_classes), key=natural_key)
        raise UsageError(
            f'the {what} {ds.root} has class folders the model was not trained on '
            f'({", ".join(ds.other_classes[:10])}{", ..." if len(ds.other_classes) > 10 else ""}): folders '
            f'{short_names(folders)}, model classes {short_names(list(class_names))}{hint}')
    names = dataset_class_names(ds)
    if names is None:
        _logger.warning(f'the {what} does not list its classes: its labels cannot be checked against the '
                        f'{len(class_names)} class names the model was trained on')
    elif list(names) != list(class_names):
        raise UsageError(f'the {what} labels other classes than the model was trained on: dataset classes '
                         f'{short_names(list(names))}, model classes {short_names(list(class_names))}{hint}')

