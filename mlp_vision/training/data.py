""" Datasets and loaders for train.py / validate.py (timm's datasets, transforms, samplers and prefetcher).

* :func:`create_image_dataset` wraps ``timm.data.create_dataset`` (ImageFolder dirs, ``.tar`` files, ``torch/...``,
  ``hfds/...``, ...) and turns a missing or empty dataset into a :class:`UsageError` that says what layout is expected.
* :func:`prepare_digits_folder` writes scikit-learn's bundled handwritten digits (1,797 real 8x8 scans, no
  download) once into an ImageFolder cache with a train/val split: the dataset of ``python train.py``'s demo.
* :func:`create_train_loader` makes the augmentation of every sample a function of
  ``(seed, epoch, rank, position in the epoch)`` only (:class:`SeededSampler` + :class:`SeededDataset`): the
  augmentations do not depend on the worker count, on persistent workers, or on anything that ran before in
  the process, which is what lets ``--resume`` reproduce an uninterrupted run bit for bit.
"""
import contextlib
import logging
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.utils.data
from timm.data import create_dataset, create_loader, create_transform
from timm.data.distributed_sampler import OrderedDistributedSampler, RepeatAugSampler
from timm.data.loader import PrefetchLoader, fast_collate

from .errors import UsageError

__all__ = [
    'default_cache_dir', 'prepare_digits_folder', 'create_image_dataset', 'dataset_class_names',
    'check_num_classes', 'seeded_rng', 'SeededSampler', 'SeededDataset', 'create_train_loader',
    'create_eval_loader', 'num_valid_samples',
]

_logger = logging.getLogger(__name__)

DIGITS_CACHE_VERSION = 1


def _patch_posterize_for_new_pillow() -> None:
    """timm's RandAugment / AutoAugment posterize can ask for 0 bits (e.g. ``rand-m9-mstd0.5-inc1`` at magnitude
    10, or AutoAugment v0's ('Posterize', 0.8, 2)): a black image, as in TF's implementation and older Pillow.
    Recent Pillow raises ``ValueError: bits must be between or equal to 1 and 8`` instead, which would kill a
    training run at a random step; keep the old behaviour where Pillow refuses it."""
    from PIL import Image, ImageOps
    from timm.data import auto_augment
    try:
        ImageOps.posterize(Image.new('RGB', (1, 1)), 0)
        return  # this Pillow still accepts 0 bits
    except ValueError:
        pass

    def posterize(img, bits_to_keep, **__):
        if bits_to_keep >= 8:
            return img
        if bits_to_keep <= 0:
            return Image.new(img.mode, img.size)  # all bits dropped: zeros
        return ImageOps.posterize(img, bits_to_keep)

    for name in ('Posterize', 'PosterizeIncreasing', 'PosterizeOriginal'):
        if name in auto_augment.NAME_TO_OP:
            auto_augment.NAME_TO_OP[name] = posterize


_patch_posterize_for_new_pillow()


def default_cache_dir() -> Path:
    """``$MLP_VISION_CACHE``, else ``$XDG_CACHE_HOME/mlp_vision``, else ``~/.cache/mlp_vision``."""
    if os.environ.get('MLP_VISION_CACHE'):
        return Path(os.environ['MLP_VISION_CACHE']).expanduser()
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return Path(base) / 'mlp_vision'


def prepare_digits_folder(
        root: Optional[os.PathLike] = None,
        size: int = 32,
        val_every: int = 5,
        max_per_class: Optional[int] = None,
) -> Path:
    """Write scikit-learn's handwritten digits as an ImageFolder tree, once; return its root.

    ``root/train/<digit>/<index>.png`` and ``root/val/<digit>/<index>.png``: grayscale PNGs upscaled from the
    8x8 scans (pixel values 0..16) to ``size`` x ``size`` (bicubic). Within each class (samples in dataset order)
    every ``val_every``-th sample goes to val (a stratified 80/20 split for 5: 1,437 train / 360 val images).
    ``max_per_class`` keeps only the first samples of each class (small test sets).

    The tree is built in a temporary folder beside ``root`` and renamed into place, so a folder that exists is
    complete, and concurrent callers (DDP ranks, parallel tests) do not see each other's partial files.
    """
    if root is None:
        name = 'digits' if size == 32 and max_per_class is None else f'digits_{size}px_{max_per_class or "all"}'
        root = default_cache_dir() / name
    root = Path(root)
    marker = root / 'DIGITS_CACHE'
    if marker.is_file():
        return root
    if root.exists():
        raise UsageError(
            f'{root} exists but is not a complete digits cache (no {marker.name} file); '
            f'remove it and run again to rebuild it')
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise UsageError(
            'the demo dataset comes from scikit-learn (sklearn.datasets.load_digits, bundled with the '
            'package, no download): pip install scikit-learn') from e
    from PIL import Image

    digits = load_digits()
    images = np.clip(np.round(digits.images * (255. / 16.)), 0, 255).astype(np.uint8)
    targets = digits.target
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f'.{root.name}-', dir=root.parent))
    counts = {'train': 0, 'val': 0}
    try:
        for cls in range(10):
            indices = np.flatnonzero(targets == cls)
            if max_per_class is not None:
                indices = indices[:max_per_class]
            for k, i in enumerate(indices):
                split = 'val' if k % val_every == 0 else 'train'
                folder = tmp / split / str(cls)
                folder.mkdir(parents=True, exist_ok=True)
                img = Image.fromarray(images[i], mode='L').resize((size, size), Image.BICUBIC)
                img.save(folder / f'{i:04d}.png')
                counts[split] += 1
        (tmp / 'DIGITS_CACHE').write_text(
            f'version {DIGITS_CACHE_VERSION}\n'
            f'source sklearn.datasets.load_digits (UCI optical recognition of handwritten digits, 8x8 scans)\n'
            f'size {size}x{size} bicubic, val = every {val_every}th sample of each class, '
            f'max_per_class {max_per_class}\n'
            f'train {counts["train"]} images, val {counts["val"]} images, 10 classes\n')
        try:
            os.rename(tmp, root)
        except OSError:
            if not marker.is_file():  # not a concurrent builder finishing first
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def _resolve_split_root(root: str, split: str) -> str:
    # the folder / tar timm's default (folder) reader will read, for the error messages
    from timm.data.dataset_factory import _search_split
    return _search_split(root, split) if os.path.isdir(root) else root


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
) -> torch.utils.data.Dataset:
    """``timm.data.create_dataset`` with clear errors for a missing or empty dataset.

    ``name`` '' (default) reads an ImageFolder tree or an image ``.tar``: ``root/<split>/<class>/<image>``
    (``split`` may name a folder or a tar file inside ``root``; timm also tries the usual synonyms, e.g.
    'val' for 'validation'). Other names are passed to timm (``torch/cifar10``, ``hfds/...``, ``wds/...``).
    """
    prefix = name.partition('/')[0].lower() if '/' in name else ''
    if prefix == '':
        if not root:
            raise UsageError(f'no {what} given: pass --data-dir DIR (an ImageFolder tree DIR/<split>/<class>/<image>, '
                             f'or a folder holding <split>.tar) or --dataset NAME')
        if not os.path.exists(root):
            raise UsageError(f'{what} folder {root!r} does not exist (expected an ImageFolder tree '
                             f'{root}/{split}/<class>/<image> or an image tar {root}/{split}.tar)')
    kwargs = dict(class_map=class_map or None)
    try:
        ds = create_dataset(
            name, root=root, split=split, is_training=is_training, download=download,
            input_img_mode=input_img_mode, batch_size=batch_size, seed=seed, **kwargs)
    except RuntimeError as e:
        if 'Found 0 images' in str(e):  # timm's folder reader on a folder without images
            where = _resolve_split_root(root, split)
            raise UsageError(
                f'{what} at {where} is empty: no images found (expected class folders with images, '
                f'{where}/<class>/<image>.jpg|png|...)') from e
        raise UsageError(f'cannot read {what} {name or "(image folder)"} at {root!r}, split {split!r}: {e}') from e
    except (FileNotFoundError, AssertionError, ValueError) as e:
        raise UsageError(f'cannot read {what} {name or "(image folder)"} at {root!r}, split {split!r}: '
                         f'{e or type(e).__name__}') from e
    try:
        n = len(ds)
    except TypeError:  # some iterable datasets have no length
        n = None
    if n == 0:
        where = _resolve_split_root(root, split) if prefix == '' else f'{name} split {split!r}'
        raise UsageError(
            f'{what} at {where} is empty: no images found (expected class folders with images, '
            f'<split>/<class>/<image>.jpg|png|..., or an image .tar)')
    return ds


def dataset_class_names(ds) -> Optional[List[str]]:
    """Class names in label order (folder / tar / torchvision datasets), None if the dataset does not say."""
    reader = getattr(ds, 'reader', None)
    class_to_idx = (getattr(reader, 'class_to_idx', None) or getattr(reader, 'class_name_to_idx', None)  # folder / tar
                    or getattr(ds, 'class_to_idx', None))
    if class_to_idx:
        return [c for c, _ in sorted(class_to_idx.items(), key=lambda kv: kv[1])]
    classes = getattr(ds, 'classes', None)
    if classes:
        return list(classes)
    return None


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


@contextlib.contextmanager
def seeded_rng(seed: int):
    """Seed python / numpy / torch (CPU) RNGs with ``seed`` inside the block; restore their states after it.

    Only the CPU generator of torch is touched (never CUDA's), so on a GPU this cannot disturb the model's RNG.
    """
    py_state, np_state, torch_state = random.getstate(), np.random.get_state(), torch.get_rng_state()
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.random.default_generator.manual_seed(seed)
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_rng_state(torch_state)


class SeededSampler(torch.utils.data.Sampler):
    """Yield ``(sample_seed, index)``: the wrapped sampler's indices, each with its own augmentation seed.

    The seed of the sample at ``position`` of an epoch is ``base(seed, epoch, rank) + position``, so repeated
    samples (repeated augmentation) and ranks get different augmentations and everything is reproducible.
    """

    def __init__(self, sampler: torch.utils.data.Sampler, seed: int, rank: int = 0):
        self.sampler = sampler
        self.seed = seed
        self.rank = rank
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.sampler, 'set_epoch'):
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Tuple[int, int]]:
        base = int(np.random.SeedSequence([self.seed, self.epoch, self.rank]).generate_state(1, np.uint64)[0])
        for position, index in enumerate(self.sampler):
            yield (base + position) % (2 ** 63), index

    def __len__(self) -> int:
        return len(self.sampler)


class SeededDataset(torch.utils.data.Dataset):
    """Run the wrapped dataset's ``__getitem__`` (image decode + transforms) under :func:`seeded_rng`."""

    def __init__(self, dataset: torch.utils.data.Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: Tuple[int, int]):
        seed, index = item
        with seeded_rng(seed):
            return self.dataset[index]


def _worker_init(worker_id: int) -> None:
    # augmentation randomness comes from SeededDataset; keep numpy distinct per worker for anything else
    info = torch.utils.data.get_worker_info()
    np.random.seed(info.seed % (2 ** 32))


def create_train_loader(
        dataset: torch.utils.data.Dataset,
        data_config: Dict[str, Any],
        batch_size: int,
        device: torch.device,
        seed: int = 42,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int = 2,
        pin_memory: bool = False,
        aug_repeats: float = 0,
        no_aug: bool = False,
        scale: Optional[Sequence[float]] = None,
        ratio: Optional[Sequence[float]] = None,
        hflip: float = 0.5,
        vflip: float = 0.,
        color_jitter: float = 0.4,
        auto_augment: Optional[str] = None,
        train_interpolation: Optional[str] = None,
        re_prob: float = 0.,
        re_mode: str = 'pixel',
        re_count: int = 1,
        img_dtype: torch.dtype = torch.float32,
) -> Tuple[PrefetchLoader, torch.utils.data.Sampler]:
    """Training loader: timm's train transforms, a (distributed / repeated-augmentation) sampler, timm's fast
    collate and ``PrefetchLoader`` (normalisation and random erasing on the device). Full batches only.

    Unlike ``timm.data.create_loader`` this also runs repeated augmentation in one process (a
    ``RepeatAugSampler`` with one replica) and seeds every sample's augmentation (see :class:`SeededSampler`).
    Returns the loader and the sampler whose ``set_epoch`` must be called before each epoch.
    """
    dataset.transform = create_transform(
        data_config['input_size'],
        is_training=True,
        no_aug=no_aug,
        scale=tuple(scale) if scale else None,
        ratio=tuple(ratio) if ratio else None,
        hflip=hflip,
        vflip=vflip,
        color_jitter=color_jitter,
        auto_augment=auto_augment,
        interpolation=train_interpolation or data_config['interpolation'],
        mean=data_config['mean'],
        std=data_config['std'],
        use_prefetcher=True,  # uint8 tensors out; normalise + random-erase in the PrefetchLoader
    )
    generator = torch.Generator()
    generator.manual_seed(seed + rank)  # worker base seeds; never draws from the global torch RNG
    loader_kwargs = dict(
        batch_size=batch_size,
        num_workers=num_workers,
        collate_fn=fast_collate,
        pin_memory=pin_memory,
        drop_last=True,
        generator=generator,
        worker_init_fn=_worker_init,
        persistent_workers=num_workers > 0,
    )
    if isinstance(dataset, torch.utils.data.IterableDataset):
        _logger.warning('iterable dataset: sample order and augmentation are up to the dataset; '
                        '--resume will not reproduce an uninterrupted run exactly')
        sampler = None
        loader = torch.utils.data.DataLoader(dataset, **loader_kwargs)
    else:
        if aug_repeats:
            # timm's RepeatAugSampler; num_replicas / rank given, so it runs outside distributed mode too
            base_sampler = RepeatAugSampler(dataset, num_replicas=world_size, rank=rank, num_repeats=aug_repeats)
        else:
            base_sampler = torch.utils.data.DistributedSampler(
                dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        sampler = SeededSampler(base_sampler, seed=seed, rank=rank)
        loader = torch.utils.data.DataLoader(SeededDataset(dataset), sampler=sampler, **loader_kwargs)
    if len(loader) == 0:
        raise UsageError(
            f'the training set ({len(dataset)} images over {world_size} process(es)) does not fill one batch of '
            f'{batch_size}: lower --batch-size')
    loader = PrefetchLoader(
        loader,
        mean=data_config['mean'],
        std=data_config['std'],
        channels=data_config['input_size'][0],
        device=device,
        img_dtype=img_dtype,
        re_prob=0. if no_aug else re_prob,
        re_mode=re_mode,
        re_count=re_count,
    )
    return loader, sampler


def create_eval_loader(
        dataset: torch.utils.data.Dataset,
        data_config: Dict[str, Any],
        batch_size: int,
        device: torch.device,
        num_workers: int = 2,
        distributed: bool = False,
        pin_memory: bool = False,
        img_dtype: torch.dtype = torch.float32,
) -> PrefetchLoader:
    """timm's eval loader (resize / center crop per ``data_config``, prefetcher). In distributed mode each rank
    gets a strided slice padded to equal length; :func:`num_valid_samples` tells how many of them are real."""
    return create_loader(
        dataset,
        input_size=data_config['input_size'],
        batch_size=batch_size,
        is_training=False,
        interpolation=data_config['interpolation'],
        mean=data_config['mean'],
        std=data_config['std'],
        num_workers=num_workers,
        distributed=distributed,
        crop_pct=data_config['crop_pct'],
        crop_mode=data_config.get('crop_mode'),
        pin_memory=pin_memory,
        device=device,
        img_dtype=img_dtype,
        use_prefetcher=True,
    )


def num_valid_samples(loader) -> Optional[int]:
    """Real (not padding) samples this rank's eval loader yields, or None if every sample is real."""
    sampler = getattr(loader, 'sampler', None)
    if isinstance(sampler, OrderedDistributedSampler):
        return sampler.num_valid_samples
    return None
