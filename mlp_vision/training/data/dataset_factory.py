""" The datasets of train.py and validate.py: image folders / tars here, other ``--dataset`` names through timm.

timm's ``create_dataset`` falls back to the root when no folder of the split exists (``_search_split``), so a
root without ``val/`` validates on the training images, and a validation folder without some class labels the
others by its own folder order. Here image folders and tars are read with :class:`.reader.ImageFileDataset`, a
validation set is labelled by the training set's class names, and a missing, empty or mismatched split stops with
one line; other ``--dataset`` names (``torch/cifar10``, ``hfds/...``, ``wds/...``) go to timm's ``create_dataset``.
"""
import contextlib
import logging
import os
from typing import Dict, Optional, Tuple, Union

import torch.utils.data
from timm.data import create_dataset
from timm.data.readers.img_extensions import get_img_extensions

from mlp_vision.errors import UsageError
from mlp_vision.training.data.class_map import read_class_map
from mlp_vision.training.data.holdout import DatasetSubset, holdout_split, parse_val_split
from mlp_vision.training.data.labels import dataset_class_names, short_names
from mlp_vision.training.data.reader import ImageFileDataset, find_split, split_entries, split_names

__all__ = ['create_image_dataset', 'create_train_val_datasets', 'dataset_source']

_logger = logging.getLogger(__name__)


def _image_dataset(split_path: str, class_map, input_img_mode, what: str,
                   class_to_idx: Optional[Dict[str, int]] = None) -> ImageFileDataset:
    """The image folder / tar at ``split_path``; one line when none of its images is labelled."""
    ds = ImageFileDataset(split_path, class_map=class_map or None, class_to_idx=class_to_idx,
                          input_img_mode=input_img_mode)
    if len(ds) == 0 and ds.other_classes:  # every class folder is of another class than those labelled
        raise UsageError(
            f'{what} at {split_path}: none of its class folders {short_names(ds.other_classes)} is one of the '
            f'classes it is labelled with {short_names(dataset_class_names(ds))} (the model\'s or the class map\'s); '
            f'expected class folders named as those classes')
    if len(ds) == 0:
        kind = 'tar' if ds.is_tar else 'folder'
        raise UsageError(
            f'{what} at {split_path} is empty: no images found (expected class folders with images, '
            f'{split_path}{":" if ds.is_tar else "/"}<class>/<image>{"|".join(sorted(get_img_extensions()))} '
            f'in this {kind})')
    return ds


def _timm_dataset(name, root, split, is_training, class_map, download, input_img_mode, batch_size, seed,
                  what: str) -> torch.utils.data.Dataset:
    """A ``--dataset`` split through timm's ``create_dataset``; its errors and an empty split in one line."""
    try:
        ds = create_dataset(name, root=root, split=split, is_training=is_training, download=download,
                            input_img_mode=input_img_mode, batch_size=batch_size, seed=seed,
                            class_map=read_class_map(class_map, root) if class_map else None)
    except (RuntimeError, FileNotFoundError, AssertionError, ValueError) as e:
        raise UsageError(f'cannot read {what} {name} at {root!r}, split {split!r}: {e or type(e).__name__}') from e
    with contextlib.suppress(TypeError):  # raised by len() of an iterable dataset with no length
        if len(ds) == 0:
            raise UsageError(f'{what} {name} split {split!r} is empty')
    return ds


def _find_image_split(root: Optional[str], split: str, what: str) -> str:
    """The folder / tar of ``split`` under ``root`` (which must exist); a tar given as ``root``, or a root of class
    folders with no split folders or tars at all, is the split itself."""
    if not root:
        raise UsageError(f'no {what} given: pass --data-dir DIR (an ImageFolder tree DIR/<split>/<class>/<image>, '
                         f'or a folder holding <split>.tar) or --dataset NAME')
    if not os.path.exists(root):
        raise UsageError(f'{what} folder {root!r} does not exist (expected an ImageFolder tree '
                         f'{root}/{split}/<class>/<image> or an image tar {root}/{split}.tar)')
    if os.path.isfile(root):
        if not root.lower().endswith('.tar'):
            raise UsageError(f'{what} {root!r} is a file but not an image tar (expected a folder '
                             f'{root}/{split}/<class>/<image>, or a .tar)')
        return root
    found = find_split(root, split)
    if found is not None:
        return found
    others = split_entries(root)
    if others:
        raise UsageError(f'no {what} split {split!r} in {root} (it has {", ".join(others)}; looked for '
                         f'{" / ".join(split_names(split))}, as folders or .tar)')
    return root  # a flat root: root/<class>/<image>


def create_image_dataset(
        name: str,
        root: Optional[str],
        split: str,
        is_training: bool = False,
        class_map: Optional[str] = None,
        download: bool = False,
        input_img_mode: str = 'RGB',
        batch_size: int = 1,
        seed: int = 42,
        what: str = 'dataset',
        class_to_idx: Optional[Dict[str, int]] = None,
) -> torch.utils.data.Dataset:
    """One split of a dataset, with clear errors for a missing, empty or malformed one (validate.py).

    ``name`` '' (default) reads an :class:`ImageFileDataset` at the split found by :func:`.reader.find_split`
    (``root/<split>/`` or ``root/<split>.tar``, or a synonym); a ``.tar`` given as ``root``, or a root of class
    folders without any split folder, is read as the split itself. Other names go to timm's ``create_dataset``.

    ``class_to_idx`` (image folder / tar only; a ``class_map`` wins) labels the classes by name, e.g. with the
    classes a model was trained on; folders of other classes are left out and listed in ``other_classes``.
    """
    if name == '':
        return _image_dataset(_find_image_split(root, split, what), class_map, input_img_mode, what, class_to_idx)
    return _timm_dataset(name, root, split, is_training, class_map, download, input_img_mode, batch_size, seed, what)


def create_train_val_datasets(
        name: str,
        root: Optional[str],
        train_split: str = 'train',
        val_split: Union[str, float, None] = 'validation',
        class_map: Optional[str] = None,
        download: bool = False,
        input_img_mode: str = 'RGB',
        batch_size: int = 1,
        seed: int = 42,
) -> Tuple[torch.utils.data.Dataset, Optional[torch.utils.data.Dataset]]:
    """(training set, validation set) of train.py; validation is never silently the training images.

    ``val_split`` (see :func:`parse_val_split`):

    * a split name: that split, which must exist as a folder or tar (``root/val/``, ``root/validation.tar``,
      ...); when there is none (a root of class folders, a root with only ``train/``, a ``.tar`` given as
      ``root``) a :class:`UsageError` asks for ``--val-split FRACTION`` or a ``val/`` folder. Its classes are
      matched to the training set's by name.
    * a fraction 0 < f < 1: a class-stratified hold-out of the training images (:func:`.holdout.stratified_holdout`,
      deterministic from ``seed``); the training set is the rest, disjoint from it.
    * '' or None: no validation set (None).
    """
    val_split = parse_val_split(val_split)
    timm_args = dict(class_map=class_map, download=download, input_img_mode=input_img_mode, batch_size=batch_size,
                     seed=seed)
    if name == '':
        train_path = _find_image_split(root, train_split, 'training set')
        train = _image_dataset(train_path, class_map, input_img_mode, 'training set')
    else:
        train = _timm_dataset(name, root, train_split, True, what='training set', **timm_args)
    if isinstance(val_split, float):
        found = find_split(root, 'validation') if name == '' and os.path.isdir(root) else None
        if found:
            _logger.warning(f'--val-split {val_split}: validating on a hold-out of the training images; '
                            f'the validation split {found} is not used')
        train, val = holdout_split(train, val_split, seed)
        classes = dataset_class_names(train)
        _logger.info(f'validation: {len(val)} of the {len(train) + len(val)} training images held out (--val-split '
                     f'{val_split}, stratified over {len(classes) if classes else "the"} classes, seed {seed}); '
                     f'training on the other {len(train)}')
        return train, val
    if not val_split:
        return train, None
    if name != '':
        return train, _timm_dataset(name, root, val_split, False, what='validation set', **timm_args)
    val_path = find_split(root, val_split) if os.path.isdir(root) else None
    if val_path is None or os.path.realpath(val_path) == os.path.realpath(train_path):
        looked = ' / '.join(split_names(val_split))
        where = f'in {root} (looked for {looked}, as folders or .tar)' if os.path.isdir(root) else f'for {root}'
        raise UsageError(
            f'no validation split found {where}: pass --val-split FRACTION (e.g. 0.1: a seeded, class-stratified '
            f'hold-out of the training images, disjoint from training), add a val/ folder beside the training '
            f'images, or --val-split "" to train without validation')
    # labels by class name, as in the training set: a validation set without some class keeps the others' labels
    val = _image_dataset(val_path, class_map, input_img_mode, 'validation set', class_to_idx=train.class_to_idx)
    if val.other_classes and not class_map:
        extra = val.other_classes
        raise UsageError(f'the validation set {val_path} has classes the training set {train_path} does not have '
                         f'({", ".join(extra[:5])}{", ..." if len(extra) > 5 else ""}); expected the same class '
                         f'folders in both')
    return train, val


def dataset_source(ds) -> Optional[str]:
    """What a dataset was read from, for the log: ``folder PATH`` or ``tar PATH`` (image folder / tar), ``part of
    the folder PATH`` for a hold-out's side (``--val-split FRACTION``); None for other datasets (``--dataset``)."""
    if isinstance(ds, DatasetSubset):
        parent = dataset_source(ds.dataset)
        return f'part of the {parent}' if parent else None
    if isinstance(ds, ImageFileDataset):
        return f'{"tar" if ds.is_tar else "folder"} {ds.root}'
    return None
