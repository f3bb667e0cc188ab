""" Training and evaluation loaders: timm's transforms, samplers, ``fast_collate`` and ``PrefetchLoader``, and what
``timm.data.create_loader`` lacks: augmentation seeded per sample (timm's follows each worker's global RNGs, so
``--resume`` could not reproduce a run), unusable images left out and counted (:class:`ReadableBatches`), exact
distributed evaluation (timm's sampler pads ranks with repeated samples), a 0-bit posterize that does not raise in
recent Pillow, and workers that leave SIGINT / SIGTERM to the main process.
"""
import collections
import contextlib
import logging
import random
import signal
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist
import torch.utils.data
from PIL import Image
from timm.data import create_transform
from timm.data.auto_augment import AugmentOp, posterize as timm_posterize
from timm.data.distributed_sampler import RepeatAugSampler
from timm.data.loader import PrefetchLoader, _worker_init as timm_worker_init, fast_collate

from mlp_vision.errors import RunError, UsageError
from mlp_vision.arguments import usable_cpus
from mlp_vision.training.image_data import SkippedImage, dataset_class_names, sample_targets

__all__ = [
    'default_workers', 'seeded_rng', 'SeededSampler', 'SeededDataset', 'ReadableBatches',
    'ImageLoader', 'create_train_sampler', 'train_samples_per_rank', 'fit_batch_to_data', 'unused_images_message',
    'create_train_loader', 'create_eval_loader',
]

_logger = logging.getLogger(__name__)


def default_workers() -> int:
    """Loader processes by default: 4, at most the CPUs this process may use (more compete with the model)."""
    return max(1, min(4, usable_cpus()))


def _posterize(img: Image.Image, bits_to_keep: int, **kwargs) -> Image.Image:
    """timm's posterize; 0 bits give a black image, as in TF and older Pillow (recent Pillow raises mid-run)."""
    return timm_posterize(img, bits_to_keep, **kwargs) if bits_to_keep > 0 else Image.new(img.mode, img.size)


def _worker_init(worker_id: int) -> None:
    """timm's worker init, SIGINT ignored and the first SIGTERM too: Ctrl-C and ``timeout`` signal the whole process
    group, and a worker killed first would end the run in a DataLoader traceback; the main process stops at a step
    boundary and ends its workers itself. A second SIGTERM ends the worker: the main process's own ``terminate``
    (torch's fallback when a worker does not join, and multiprocessing's at exit) must not wait forever."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _end_on_the_next_sigterm)
    timm_worker_init(worker_id)


def _end_on_the_next_sigterm(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def seeded_rng(seed: int):
    """Python / numpy / torch CPU RNGs seeded inside the block, restored after it (CUDA's is never touched)."""
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
    """``(base(seed, epoch, rank) + position in the epoch, index)`` for each index of ``sampler``."""

    def __init__(self, sampler: torch.utils.data.Sampler, seed: int, rank: int = 0):
        self.sampler, self.seed, self.rank, self.epoch = sampler, seed, rank, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.sampler.set_epoch(epoch)  # timm's RepeatAugSampler or torch's DistributedSampler

    def __iter__(self) -> Iterator[Tuple[int, int]]:
        base = int(np.random.SeedSequence([self.seed, self.epoch, self.rank]).generate_state(1, np.uint64)[0])
        for position, index in enumerate(self.sampler):
            yield (base + position) % (2 ** 63), index

    def __len__(self) -> int:
        return len(self.sampler)


class SeededDataset(torch.utils.data.Dataset):
    """The wrapped dataset's ``__getitem__`` (decode + transforms) under :func:`seeded_rng` of the sample's seed."""

    def __init__(self, dataset: torch.utils.data.Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: Tuple[int, int]):
        seed, index = item
        with seeded_rng(seed):
            return self.dataset[index]


def _collate_readable(batch: List[Any]) -> Tuple[torch.Tensor, torch.Tensor, List[SkippedImage]]:
    """timm's ``fast_collate`` of the samples that decoded (possibly none), and the skipped ones."""
    skipped = [s for s in batch if isinstance(s, SkippedImage)]
    kept = [s for s in batch if not isinstance(s, SkippedImage)]
    if not kept:
        return torch.zeros(0, dtype=torch.uint8), torch.zeros(0, dtype=torch.long), skipped
    return (*fast_collate(kept), skipped)


class ReadableBatches(torch.utils.data.DataLoader):
    """A ``DataLoader`` of ``(input, target)`` of the readable images: each skipped file warned once, the skipped
    images of a pass counted (:attr:`skipped`), empty batches left out (``empty_batch_error``: raised, as DDP ranks
    must run the same steps). ``min_kept``: a batch that unreadable images left with fewer readable ones counts as
    empty (training: BatchNorm cannot normalise a batch of one). ``train_set``: a class none of whose images could be
    read stops the run after the pass."""

    def __init__(self, dataset, empty_batch_error: Optional[str] = None, train_set=None,
                 device: Optional[torch.device] = None, min_kept: int = 1, num_workers: int = 0, **loader_kwargs):
        super().__init__(dataset, num_workers=num_workers, collate_fn=_collate_readable, worker_init_fn=_worker_init,
                         persistent_workers=num_workers > 0, **loader_kwargs)
        self.empty_batch_error, self.train_set, self.device = empty_batch_error, train_set, device
        self.min_kept, self.skipped, self.skipped_files = min_kept, 0, {}  # skipped_files: {file: why}, all passes

    def __iter__(self):
        self.skipped = 0
        read, unusable = collections.Counter(), collections.Counter()  # images of each class, this pass
        for batch_idx, (input, target, skipped) in enumerate(super().__iter__()):
            for s in skipped:
                if s.name not in self.skipped_files:
                    _logger.warning(f'skipped unreadable image {s.name} ({s.reason}); it is left out, '
                                    f'not replaced by another image')
                    self.skipped_files[s.name] = s.reason
                unusable[s.target] += 1
            self.skipped += len(skipped)
            if self.train_set is not None:
                read.update(target.tolist())
            if len(target) == 0 or skipped and len(target) < self.min_kept:
                if self.empty_batch_error:
                    raise UsageError(f'{len(skipped)} of the {len(skipped) + len(target)} images of batch {batch_idx} '
                                     f'were unreadable (see the warnings above): {self.empty_batch_error}')
                if len(target):
                    _logger.warning(f'batch {batch_idx} kept {len(target)} readable image(s) of '
                                    f'{len(skipped) + len(target)}: left out, too few to train on')
                continue
            yield input, target
        if self.train_set is not None:
            self._stop_if_a_class_has_no_image(read, unusable)

    def _stop_if_a_class_has_no_image(self, read: collections.Counter, unusable: collections.Counter) -> None:
        names = dataset_class_names(self.train_set)
        if names is None:
            return
        counts = torch.tensor([[read[t] for t in range(len(names))], [unusable[t] for t in range(len(names))]],
                              device=self.device)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(counts)  # each rank read a part of every class
        read_n, unusable_n = counts.tolist()
        suspects = [t for t in range(len(names)) if read_n[t] == 0 and unusable_n[t] > 0]
        targets = sample_targets(self.train_set) if suspects else None  # known: only our datasets skip images
        if not targets:
            return
        with seeded_rng(0):  # a suspect class's images this pass did not draw (full batches only), read to tell
            readable = {t for t in suspects for i, target in enumerate(targets)
                        if target == t and self.train_set.filename(i) not in self.skipped_files
                        and not isinstance(self.train_set[i], SkippedImage)}
        empty = [t for t in suspects if t not in readable]
        if empty:
            listed = ', '.join(f'{names[t]} (all {targets.count(t)} images unusable)' for t in empty)
            raise RunError(f'no training image of class(es) {listed} could be read (see the warnings above): the '
                           f'model would learn nothing for them; stopped at the end of this epoch\'s reading, before '
                           f'its checkpoint was written: fix or remove those files and start again')


class ImageLoader(PrefetchLoader):
    """timm's ``PrefetchLoader`` (to ``device``, normalised, random erasing) over the :class:`ReadableBatches` of
    ``dataset`` (``loader_kwargs``), with its :attr:`skipped` and :attr:`skipped_files`."""
    skipped = property(lambda self: self.loader.skipped)
    skipped_files = property(lambda self: self.loader.skipped_files)

    def __init__(self, dataset, data_config: Dict[str, Any], device: torch.device, re_prob: float = 0.,
                 re_mode: str = 'const', re_count: int = 1, **loader_kwargs):
        super().__init__(ReadableBatches(dataset, device=device, **loader_kwargs), mean=data_config['mean'],
                         std=data_config['std'], channels=data_config['input_size'][0], device=device,
                         re_prob=re_prob, re_mode=re_mode, re_count=re_count)


def create_train_sampler(dataset, world_size: int, rank: int, seed: int,
                         aug_repeats: float = 0) -> torch.utils.data.Sampler:
    """timm's ``RepeatAugSampler`` with ``aug_repeats`` (one process too), else a shuffling ``DistributedSampler``."""
    if aug_repeats:
        return RepeatAugSampler(dataset, num_replicas=world_size, rank=rank, num_repeats=aug_repeats)
    return torch.utils.data.DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)


def train_samples_per_rank(dataset, world_size: int = 1, aug_repeats: float = 0) -> int:
    """How many samples one rank's training sampler draws per epoch."""
    return len(create_train_sampler(dataset, world_size, 0, 0, aug_repeats))


def fit_batch_to_data(batch_size: int, samples_per_rank: int, even: bool = False) -> int:
    """``batch_size``, or all ``samples_per_rank`` when fewer (full batches only: no update would run) with a warning
    (``even``: rounded down to even, for mixup); a rank with no sample is one line."""
    if samples_per_rank < (2 if even else 1):
        raise UsageError(f'the training sampler draws {samples_per_rank} image(s) per process and epoch: too few to '
                         f'train on (--aug-repeats draws multiples of 256 images: use --aug-repeats 0 on few images)')
    if batch_size <= samples_per_rank:
        return batch_size
    fitted = samples_per_rank - (samples_per_rank % 2 if even else 0)
    _logger.warning(f'--batch-size {batch_size} is more than the {samples_per_rank} training images each process '
                    f'draws per epoch: training with batch {fitted}, one update per epoch')
    return fitted


def unused_images_message(num_images: int, samples_per_rank: int, batch_size: int, world_size: int = 1,
                          aug_repeats: float = 0) -> Optional[str]:
    """The warning when an epoch leaves training images unused (full batches only: a partial batch gives BatchNorm
    a batch of one, compiled models a new shape), naming a batch size that leaves fewer out; or None."""
    kept_per_rank = samples_per_rank // batch_size * batch_size
    distinct = int(kept_per_rank * world_size / max(aug_repeats, 1))
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
    candidates = range(max(1, batch_size // 2), min(2 * batch_size, samples_per_rank) + 1)
    better = min(candidates, key=lambda b: (samples_per_rank % b, abs(b - batch_size), -b), default=batch_size)
    hint = (f'; --batch-size {better} leaves {samples_per_rank % better or "none"} out'
            if samples_per_rank % better < dropped else '')
    return (f'{share} are unused in every epoch: the training loader keeps full batches only ({samples_per_rank:,} '
            f'images{processes} = {samples_per_rank // batch_size:,} x batch {batch_size} + {dropped:,} dropped, a '
            f'different {dropped:,} each epoch as the order is shuffled){hint}')


def create_train_loader(
        dataset: torch.utils.data.Dataset, data_config: Dict[str, Any], batch_size: int, device: torch.device,
        seed: int = 42, rank: int = 0, world_size: int = 1, num_workers: int = 2, pin_memory: bool = False,
        aug_repeats: float = 0, no_aug: bool = False, scale: Optional[Sequence[float]] = None,
        ratio: Optional[Sequence[float]] = None, hflip: float = 0.5, vflip: float = 0., color_jitter: float = 0.4,
        auto_augment: Optional[str] = None, train_interpolation: Optional[str] = None, re_prob: float = 0.,
        re_mode: str = 'pixel', re_count: int = 1) -> Tuple[ImageLoader, Optional[torch.utils.data.Sampler]]:
    """(training loader, the sampler to ``set_epoch``): timm's train transforms, sampler, fast collate and
    ``PrefetchLoader`` (``create_loader`` takes no sampler or generator: it could not seed each sample)."""
    dataset.transform = create_transform(  # uint8 tensors out: normalised in the PrefetchLoader
        data_config['input_size'], is_training=True, no_aug=no_aug, scale=scale, ratio=ratio, hflip=hflip, vflip=vflip,
        color_jitter=color_jitter, auto_augment=auto_augment, mean=data_config['mean'], std=data_config['std'],
        interpolation=train_interpolation or data_config['interpolation'], use_prefetcher=True)
    for stage in dataset.transform.transforms:  # RandAugment / AugMix hold ops, AutoAugment a policy of sub-policies
        for op in list(getattr(stage, 'ops', [])) + [op for sub in getattr(stage, 'policy', []) for op in sub]:
            if isinstance(op, AugmentOp) and op.name.startswith('Posterize'):
                op.aug_fn = _posterize  # this transform's ops only: timm's NAME_TO_OP is untouched
    generator = torch.Generator().manual_seed(seed + rank)  # worker base seeds; never the global torch RNG
    if isinstance(dataset, torch.utils.data.IterableDataset):
        _logger.warning('iterable dataset: sample order and augmentation are up to the dataset; '
                        '--resume will not reproduce an uninterrupted run exactly')
        sampler, samples, unused = None, dataset, None
    else:
        base_sampler = create_train_sampler(dataset, world_size, rank, seed, aug_repeats)
        sampler, samples = SeededSampler(base_sampler, seed=seed, rank=rank), SeededDataset(dataset)
        unused = unused_images_message(len(dataset), len(base_sampler), batch_size, world_size, aug_repeats)
    loader = ImageLoader(
        samples, data_config, device, re_prob=0. if no_aug else re_prob, re_mode=re_mode, re_count=re_count,
        batch_size=batch_size, sampler=sampler, num_workers=num_workers, pin_memory=pin_memory, drop_last=True,
        generator=generator, train_set=dataset, min_kept=min(2, batch_size), empty_batch_error=(
            'with several processes a batch cannot be left out; fix or remove those files' if world_size > 1 else None))
    if len(loader) == 0:
        raise UsageError(
            f'the training set ({len(dataset)} images over {world_size} process(es)) does not fill one batch of '
            f'{batch_size}: lower --batch-size')
    if unused:
        _logger.warning(unused)
    return loader, sampler


def create_eval_loader(dataset: torch.utils.data.Dataset, data_config: Dict[str, Any], batch_size: int,
                       device: torch.device, num_workers: int = 2, distributed: bool = False,
                       pin_memory: bool = False) -> ImageLoader:
    """timm's eval transforms and prefetcher; every readable image once over all ranks, so summed metrics are exact."""
    dataset.transform = create_transform(
        data_config['input_size'], is_training=False, interpolation=data_config['interpolation'],
        mean=data_config['mean'], std=data_config['std'], crop_pct=data_config['crop_pct'],
        crop_mode=data_config.get('crop_mode'), use_prefetcher=True)
    sampler = None
    if distributed and not isinstance(dataset, torch.utils.data.IterableDataset):  # each sample on one rank, no padding
        sampler = range(dist.get_rank(), len(dataset), dist.get_world_size())
    return ImageLoader(dataset, data_config, device, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                       pin_memory=pin_memory)
