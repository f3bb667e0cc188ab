""" ``--val-split FRACTION``: a seeded, class-stratified hold-out of the training images.

timm has no hold-out split (its ``create_dataset`` reads named splits only); a random split drawn with the
process's RNG would differ between runs, machines and file orders. :func:`stratified_holdout` depends on the seed
and the sample names alone.
"""
import copy
import hashlib
from typing import Dict, List, Sequence, Tuple, Union

import torch.utils.data

from mlp_vision.errors import UsageError
from mlp_vision.training.data.reader import ImageFileDataset

__all__ = ['parse_val_split', 'stratified_holdout', 'DatasetSubset', 'holdout_split']


def parse_val_split(value: Union[str, float, None]) -> Union[str, float]:
    """``--val-split``: a split name ('val', 'validation', 'val.tar', ...), '' for no validation, or a fraction
    0 < f < 1 of the training images to hold out (:func:`stratified_holdout`)."""
    if value is None:
        return ''
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return value.strip()
    if isinstance(value, bool) or not 0. < float(value) < 1.:
        raise UsageError(f'--val-split {value}: a fraction of the training images to hold out must be between 0 and '
                         f'1 (e.g. 0.1), or give a split name (e.g. val)')
    return float(value)


def stratified_holdout(names: Sequence[str], targets: Sequence[int], fraction: float,
                       seed: int) -> Tuple[List[int], List[int]]:
    """Sorted sample indices (train, held out): from each class, the ``round(fraction * n)`` samples (at most
    n - 1, so no class leaves training) whose ``sha256(seed, name)`` is smallest. The same on every machine,
    process, numpy version and file order; adding images to a class moves at most a few others."""
    by_class: Dict[int, List[int]] = {}
    for i, t in enumerate(targets):
        by_class.setdefault(int(t), []).append(i)
    held = []
    for t, indices in by_class.items():
        k = min(int(round(fraction * len(indices))), len(indices) - 1)
        held += sorted(indices, key=lambda i: hashlib.sha256(f'{seed}\0{names[i]}'.encode()).digest())[:k]
    held_set = set(held)
    return [i for i in range(len(targets)) if i not in held_set], sorted(held)


class DatasetSubset(torch.utils.data.Subset):
    """``Subset`` that passes ``transform`` through to its dataset (the loaders set it)."""

    @property
    def transform(self):
        return self.dataset.transform

    @transform.setter
    def transform(self, value):
        self.dataset.transform = value

    def filename(self, index: int) -> str:
        return self.dataset.filename(self.indices[index])


def _sample_names_and_targets(ds) -> Tuple[List[str], List[int]]:
    if isinstance(ds, ImageFileDataset):
        return [p for p, _ in ds.samples], [t for _, t in ds.samples]
    targets = getattr(ds, 'targets', None)
    if targets is None:
        targets = getattr(getattr(ds, 'reader', None), 'targets', None)
    if targets is None:
        raise UsageError(f'--val-split FRACTION needs a dataset whose labels are known up front ({type(ds).__name__} '
                         f'does not list them): give a validation split by name instead')
    return [str(i) for i in range(len(targets))], [int(t) for t in targets]


def holdout_split(ds, fraction: float, seed: int) -> Tuple[DatasetSubset, DatasetSubset]:
    """(training part, held-out part) of ``ds`` (:func:`stratified_holdout`), each over its own shallow copy, so
    each gets its own transform."""
    names, targets = _sample_names_and_targets(ds)
    train_idx, held_idx = stratified_holdout(names, targets, fraction, seed)
    if not held_idx:
        raise UsageError(f'--val-split {fraction} holds out no image: each class has too few images '
                         f'({len(targets)} images in {len(set(targets))} classes); give a larger fraction or a '
                         f'val/ folder')
    return DatasetSubset(ds, train_idx), DatasetSubset(copy.copy(ds), held_idx)

