""" Checks of the data flags train.py and validate.py share, and their choices.

They run before any file is read or model built, so a bad value is one line (``errors.UsageError``) instead of a
failure deep in timm's transforms or readers.
"""
from typing import Optional

from mlp_vision.arguments import check_range
from mlp_vision.errors import UsageError
from mlp_vision.threads import usable_cpus
from mlp_vision.training.data.class_map import read_class_map

__all__ = ['IMAGE_MODE_CHANNELS', 'INTERPOLATIONS', 'DATASET_KINDS', 'default_workers', 'check_image_args']

# PIL modes whose 8-bit channels make an image tensor (convert_image_mode converts every decodable mode to them)
IMAGE_MODE_CHANNELS = {'RGB': 3, 'L': 1, 'RGBA': 4, 'LA': 2, 'CMYK': 4, 'YCbCr': 3, 'HSV': 3, 'LAB': 3}
INTERPOLATIONS = ('', 'nearest', 'bilinear', 'bicubic', 'box', 'hamming', 'lanczos')  # timm's names ('': model's)
DATASET_KINDS = ('torch', 'hfds', 'hfids', 'tfds', 'wds')  # --dataset KIND/NAME prefixes timm.data reads


def default_workers(most: int = 4) -> int:
    """The loader processes a script starts by default: ``most``, but no more than the CPUs this process may use
    (more only compete with the model for the same cores, and PyTorch warns about them)."""
    return max(1, min(most, usable_cpus()))


def check_image_args(args, model_in_chans: Optional[int] = 3) -> None:
    """The image mode gives as many channels as the model takes, ``--mean`` / ``--std`` have one value or one per
    channel (std > 0), ``--crop-pct`` > 0, ``--class-map`` is a readable class map, ``--dataset`` is a kind timm
    reads. ``model_in_chans`` None: not known yet (validate.py before it reads the checkpoint; it checks again
    with the model's), so only what does not depend on it is checked."""
    channels = IMAGE_MODE_CHANNELS.get(args.input_img_mode)
    if args.input_img_mode and channels is None:
        raise UsageError(f'--input-img-mode must be one of {", ".join(IMAGE_MODE_CHANNELS)}, got '
                         f'{args.input_img_mode!r}')
    in_chans = (args.in_chans if args.in_chans is not None else
                args.input_size[0] if getattr(args, 'input_size', None) else model_in_chans)
    if in_chans is not None and in_chans < 1:
        raise UsageError(f'--in-chans must be >= 1, got {in_chans}')
    if channels is not None and in_chans is not None and channels != in_chans:
        raise UsageError(f'--input-img-mode {args.input_img_mode} gives {channels}-channel images, the model takes '
                         f'{in_chans} (--in-chans); pass --in-chans {channels} or a {in_chans}-channel mode')
    for flag, values, bounds in (('--mean', args.mean, {}), ('--std', args.std, dict(low=0, low_open=True))):
        if values is None:
            continue
        if in_chans is not None and len(values) not in (1, in_chans):
            raise UsageError(f'{flag} needs 1 or {in_chans} values (one per channel), got {len(values)}')
        for v in values:
            check_range(flag, v, **bounds)
    if args.crop_pct is not None:
        check_range('--crop-pct', args.crop_pct, low=0, low_open=True, why="the crop's fraction of the resized image")
    if args.class_map:
        read_class_map(args.class_map, args.data_dir or getattr(args, 'data', None) or '')
    kind = args.dataset.split('/', 1)[0] if args.dataset else ''
    if kind and (kind not in DATASET_KINDS or '/' not in args.dataset):
        raise UsageError(f'--dataset {args.dataset!r} is not a dataset timm reads: give KIND/NAME with KIND one of '
                         f'{", ".join(DATASET_KINDS)}, or leave it out for an image folder / tar at --data-dir')
