""" Training and evaluation loaders: timm's transforms, samplers, ``fast_collate`` and ``PrefetchLoader``, plus
what ``timm.data.create_loader`` lacks.

* Reproducible augmentation: timm's augmentations draw from each worker's global RNGs, so they change with the
  worker count and with what ran before; here every sample's augmentation is a function of
  ``(seed, epoch, rank, position in the epoch)`` only (:class:`SeededSampler` + :class:`SeededDataset`), which
  is what lets ``--resume`` reproduce an uninterrupted run bit for bit.
* Unreadable images: ``fast_collate`` cannot batch a :class:`.decode.SkippedImage`; :func:`collate_readable`
  leaves them out and :class:`ReadableBatches` warns once per file and counts them (:attr:`ImageLoader.skipped`).
* Exact distributed evaluation: timm's ``OrderedDistributedSampler`` pads ranks with repeated samples, which
  then count twice in the metrics; :class:`StridedSampler` gives every sample to exactly one rank.
* Posterize with 0 bits (timm's RandAugment / AutoAugment / AugMix) raises in recent Pillow: our training
  transform's posterize ops get a function that gives a black image (:func:`with_safe_posterize`); timm's
  ``NAME_TO_OP`` is left as it is.
"""
import contextlib
import logging
import random
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.utils.data
from PIL import Image
from timm.data import auto_augment, create_transform
from timm.data.distributed_sampler import RepeatAugSampler
from timm.data.loader import PrefetchLoader, _worker_init, fast_collate

from mlp_vision.errors import UsageError
from mlp_vision.training.data.decode import SkippedImage

__all__ = [
    'seeded_rng', 'SeededSampler', 'SeededDataset', 'StridedSampler', 'collate_readable', 'ReadableBatches',
    'ImageLoader', 'create_train_loader', 'create_eval_loader', 'train_samples_per_rank',
    'create_train_sampler', 'fit_batch_to_data', 'unused_images_message', 'with_safe_posterize',
]

_logger = logging.getLogger(__name__)


_POSTERIZE_OPS = ('Posterize', 'PosterizeIncreasing', 'PosterizeOriginal')


def _posterize(img: Image.Image, bits_to_keep: int, **kwargs) -> Image.Image:
    """timm's posterize, except that 0 bits (``rand-m9-mstd0.5-inc1`` at magnitude 10) give a black image, as in
    TF and older Pillow: recent Pillow raises ``ValueError``, which would kill a training run at a random step."""
    if bits_to_keep <= 0:
        return Image.new(img.mode, img.size)
    return auto_augment.posterize(img, bits_to_keep, **kwargs)


def with_safe_posterize(transform):
    """``transform`` (timm's, from ``create_transform``) with the posterize ops of its AutoAugment / RandAugment /
    AugMix stage running :func:`_posterize`: each ``AugmentOp`` of ours gets the function, timm's table of ops
    is not touched."""
    stages = list(getattr(transform, 'transforms', [transform]))
    for stage in stages:
        if hasattr(stage, 'transforms'):  # a nested Compose
            stages.extend(stage.transforms)
        ops = list(getattr(stage, 'ops', [])) + [op for sub in getattr(stage, 'policy', []) for op in sub]
        for op in ops:
            if isinstance(op, auto_augment.AugmentOp) and op.name in _POSTERIZE_OPS:
                op.aug_fn = _posterize
    return transform


@contextlib.contextmanager
def seeded_rng(seed: int):
    """Seed python / numpy / torch (CPU) RNGs with ``seed`` inside the block; restore their states after it.
    Never touches CUDA's generator, so on a GPU this cannot disturb the model's RNG."""
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
    """Yield ``(sample_seed, index)``: the wrapped sampler's indices, each with its own augmentation seed
    ``base(seed, epoch, rank) + position in the epoch``, so repeated samples and ranks get different augmentations
    and everything is reproducible."""

    def __init__(self, sampler: torch.utils.data.Sampler, seed: int, rank: int = 0):
        self.sampler, self.seed, self.rank, self.epoch = sampler, seed, rank, 0

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


class StridedSampler(torch.utils.data.Sampler):
    """Indices ``rank, rank + world_size, ...`` of a dataset of ``size`` samples: every sample on exactly one
    rank, no padding (unlike timm's ``OrderedDistributedSampler``), so no sample is evaluated twice."""

    def __init__(self, size: int, rank: int, world_size: int):
        self.indices = range(rank, size, world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def collate_readable(batch: List[Any]) -> Tuple[torch.Tensor, torch.Tensor, List[SkippedImage]]:
    """timm's ``fast_collate`` of the samples that decoded, and the :class:`.decode.SkippedImage` of those that did not
    (left out: the batch is that much smaller, possibly empty)."""
    skipped = [s for s in batch if isinstance(s, SkippedImage)]
    kept = [s for s in batch if not isinstance(s, SkippedImage)]
    if not kept:
        return torch.zeros(0, dtype=torch.uint8), torch.zeros(0, dtype=torch.long), skipped
    return (*fast_collate(kept), skipped)


class ReadableBatches:
    """Iterate a ``DataLoader`` that collates with :func:`collate_readable`: yield ``(input, target)`` of the
    readable images, warn once per skipped file, count the skipped images of each pass (:attr:`skipped`) and
    leave out batches with no image left; with ``empty_batch_error``, raise instead (DDP training: every rank must
    run the same number of steps, or the others wait for it forever)."""

    def __init__(self, loader: torch.utils.data.DataLoader, empty_batch_error: Optional[str] = None):
        self.loader, self.empty_batch_error = loader, empty_batch_error
        self.skipped = 0
        self.skipped_files: Dict[str, str] = {}

    def __iter__(self):
        self.skipped = 0
        for batch_idx, (input, target, skipped) in enumerate(self.loader):
            for s in skipped:
                if s.name not in self.skipped_files:
                    _logger.warning(f'skipped unreadable image {s.name} ({s.reason}); it is left out, '
                                    f'not replaced by another image')
                    self.skipped_files[s.name] = s.reason
            self.skipped += len(skipped)
            if len(target) == 0:
                if self.empty_batch_error:
                    raise UsageError(f'every image of batch {batch_idx} was unreadable (see the warnings above): '
                                     f'{self.empty_batch_error}')
                continue
            yield input, target

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str):  # the DataLoader's sampler, batch_sampler, dataset, ... (PrefetchLoader's)
        if name == 'loader':  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)


class ImageLoader(PrefetchLoader):
    """timm's ``PrefetchLoader`` over :class:`ReadableBatches`: batches of the images that could be read.
    :attr:`skipped`: the images this rank left out in the current / last pass; :attr:`skipped_files`: every file
    skipped so far, with the reason."""

    @property
    def skipped(self) -> int:
        return self.loader.skipped

    @property
    def skipped_files(self) -> Dict[str, str]:
        return self.loader.skipped_files


def _image_loader(dataset, sampler, data_config, batch_size, device, num_workers, pin_memory, drop_last,
                  generator, img_dtype, re_prob=0., re_mode='const', re_count=1,
                  empty_batch_error: Optional[str] = None) -> ImageLoader:
    # timm's worker init: augmentation randomness comes from SeededDataset, numpy is kept distinct per worker
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers, collate_fn=collate_readable,
        pin_memory=pin_memory, drop_last=drop_last, generator=generator, worker_init_fn=_worker_init,
        persistent_workers=num_workers > 0)
    return ImageLoader(
        ReadableBatches(loader, empty_batch_error), mean=data_config['mean'], std=data_config['std'],
        channels=data_config['input_size'][0], device=device, img_dtype=img_dtype, re_prob=re_prob, re_mode=re_mode,
        re_count=re_count)


def create_train_sampler(dataset, world_size: int, rank: int, seed: int,
                         aug_repeats: float = 0) -> torch.utils.data.Sampler:
    """The training sampler of one rank: timm's ``RepeatAugSampler`` with ``aug_repeats`` (num_replicas / rank
    given, so it runs outside distributed mode too), else a shuffling ``DistributedSampler`` (one process: one
    replica)."""
    if aug_repeats:
        return RepeatAugSampler(dataset, num_replicas=world_size, rank=rank, num_repeats=aug_repeats)
    return torch.utils.data.DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)


def train_samples_per_rank(dataset, world_size: int = 1, aug_repeats: float = 0) -> int:
    """How many samples one rank's training sampler draws per epoch (the sampler :func:`create_train_loader`
    builds): ``ceil(len / world_size)``, or with ``aug_repeats`` what timm's ``RepeatAugSampler`` selects
    (whole multiples of 256 images over the ranks once there are 256 or more)."""
    return len(create_train_sampler(dataset, world_size, 0, 0, aug_repeats))


def fit_batch_to_data(batch_size: int, samples_per_rank: int, even: bool = False) -> int:
    """The training batch per process for a rank that draws ``samples_per_rank`` samples an epoch: ``batch_size``,
    or, when that is more (full batches only: no update would run), all of them, with a warning (``even``: rounded
    down to an even size, for mixup / cutmix). A rank with no sample at all is a :class:`UsageError`."""
    if samples_per_rank < (2 if even else 1):
        raise UsageError(f'the training sampler draws {samples_per_rank} image(s) per process and epoch: too few to '
                         f'train on (with --aug-repeats, timm\'s RepeatAugSampler draws whole multiples of 256 '
                         f'images once there are 256; use --aug-repeats 0 for a small training set)')
    if batch_size <= samples_per_rank:
        return batch_size
    fitted = samples_per_rank - (samples_per_rank % 2 if even else 0)
    _logger.warning(f'--batch-size {batch_size} is more than the {samples_per_rank} training images each process '
                    f'draws per epoch (full batches only: no update would run): training with batch {fitted}, '
                    f'one update per epoch')
    return fitted


def _batch_size_without_remainder(samples: int, batch_size: int) -> int:
    """The batch size from ``batch_size / 2`` to ``2 x batch_size`` (at most ``samples``) that leaves the fewest of
    ``samples`` out of full batches; of those, the closest to ``batch_size`` (the larger of two as close)."""
    candidates = range(max(1, batch_size // 2), min(2 * batch_size, samples) + 1)
    return min(candidates, key=lambda b: (samples % b, abs(b - batch_size), -b), default=batch_size)


def unused_images_message(num_images: int, samples_per_rank: int, batch_size: int, world_size: int = 1,
                          aug_repeats: float = 0) -> Optional[str]:
    """The warning when an epoch of the training loader leaves part of the ``num_images`` training images unused,
    or None. Each of ``world_size`` ranks draws ``samples_per_rank`` samples and keeps full batches only
    (``drop_last``: a partial batch would give BatchNorm a batch of one and compiled models a new shape); with
    ``aug_repeats`` each image is drawn that many times, so an epoch covers about ``1 / aug_repeats`` of them."""
    kept_per_rank = samples_per_rank // batch_size * batch_size
    repeats = max(aug_repeats, 1)
    distinct = int(kept_per_rank * world_size / repeats)
    unused = num_images - distinct
    if unused <= 0:
        return None
    share = f'{unused:,} of the {num_images:,} training images ({100 * unused / num_images:.2g} %)'
    if aug_repeats:
        return (f'{share} are unused in every epoch: --aug-repeats {aug_repeats:g} (timm\'s RepeatAugSampler) '
                f'trains {kept_per_rank * world_size:,} samples an epoch, about {distinct:,} distinct images '
                f'{aug_repeats:g} times each; a different part each epoch')
    dropped = samples_per_rank - kept_per_rank
    processes = f' per process (x {world_size} processes)' if world_size > 1 else ''
    better = _batch_size_without_remainder(samples_per_rank, batch_size)
    hint = (f'; --batch-size {better} leaves {samples_per_rank % better or "none"} out'
            if samples_per_rank % better < dropped else '')
    return (f'{share} are unused in every epoch: the training loader keeps full batches only ({samples_per_rank:,} '
            f'images{processes} = {samples_per_rank // batch_size:,} x batch {batch_size} + {dropped:,} dropped, a '
            f'different {dropped:,} each epoch as the order is shuffled){hint}')


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
) -> Tuple[ImageLoader, Optional[torch.utils.data.Sampler]]:
    """(training loader, the sampler whose ``set_epoch`` must be called before each epoch): timm's train
    transforms, a (distributed / repeated-augmentation) sampler, timm's fast collate and ``PrefetchLoader``
    (normalisation and random erasing on the device). Full batches only, less the unreadable images
    (:class:`ImageLoader`); a warning says how many training images an epoch leaves unused
    (:func:`unused_images_message`).

    ``timm.data.create_loader`` takes no sampler or generator, so it cannot seed every sample's augmentation
    (:class:`SeededSampler`) nor run repeated augmentation in one process (a one-replica ``RepeatAugSampler``).
    """
    dataset.transform = with_safe_posterize(create_transform(
        data_config['input_size'], is_training=True, no_aug=no_aug, scale=tuple(scale) if scale else None,
        ratio=tuple(ratio) if ratio else None, hflip=hflip, vflip=vflip, color_jitter=color_jitter,
        auto_augment=auto_augment, interpolation=train_interpolation or data_config['interpolation'],
        mean=data_config['mean'], std=data_config['std'],
        use_prefetcher=True))  # uint8 tensors out; normalise + random-erase in the PrefetchLoader
    generator = torch.Generator().manual_seed(seed + rank)  # worker base seeds; never the global torch RNG
    if isinstance(dataset, torch.utils.data.IterableDataset):
        _logger.warning('iterable dataset: sample order and augmentation are up to the dataset; '
                        '--resume will not reproduce an uninterrupted run exactly')
        sampler, samples, unused = None, dataset, None
    else:
        base_sampler = create_train_sampler(dataset, world_size, rank, seed, aug_repeats)
        sampler, samples = SeededSampler(base_sampler, seed=seed, rank=rank), SeededDataset(dataset)
        unused = unused_images_message(len(dataset), len(base_sampler), batch_size, world_size, aug_repeats)
    loader = _image_loader(
        samples, sampler, data_config, batch_size, device, num_workers, pin_memory, drop_last=True,
        generator=generator, img_dtype=img_dtype, re_prob=0. if no_aug else re_prob, re_mode=re_mode,
        re_count=re_count,
        empty_batch_error='with several processes a batch cannot be left out; fix or remove those files'
        if world_size > 1 else None)
    if len(loader) == 0:
        raise UsageError(
            f'the training set ({len(dataset)} images over {world_size} process(es)) does not fill one batch of '
            f'{batch_size}: lower --batch-size')
    if unused:
        _logger.warning(unused)
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
) -> ImageLoader:
    """Evaluation loader: timm's eval transforms (resize / center crop per ``data_config``) and prefetcher. Every
    readable image is yielded exactly once over all ranks (:class:`StridedSampler`) and unreadable ones are left
    out and counted (:class:`ImageLoader`), so metrics summed over the batches and ranks are exact."""
    dataset.transform = create_transform(
        data_config['input_size'], is_training=False, interpolation=data_config['interpolation'],
        mean=data_config['mean'], std=data_config['std'], crop_pct=data_config['crop_pct'],
        crop_mode=data_config.get('crop_mode'), use_prefetcher=True)
    sampler = None
    if distributed and not isinstance(dataset, torch.utils.data.IterableDataset):
        sampler = StridedSampler(len(dataset), torch.distributed.get_rank(), torch.distributed.get_world_size())
    return _image_loader(dataset, sampler, data_config, batch_size, device, num_workers, pin_memory,
                         drop_last=False, generator=None, img_dtype=img_dtype)
