""" Datasets and loaders for train.py / validate.py (timm's datasets, transforms, samplers and prefetcher).

* :func:`create_train_val_datasets` (train.py) and :func:`create_image_dataset` (validate.py) read image folders
  and image tars with :class:`ImageFileDataset` (other ``--dataset`` names go to ``timm.data.create_dataset``).
  Nothing is silently wrong: a validation set is a real split (``val/``, ``validation.tar``, ...) or a seeded
  class-stratified hold-out of the training images (``--val-split 0.1``), never the training images; images in
  sub-folders of a class folder belong to that class; a truncated tar, an empty split, images outside class
  folders stop with one line saying what is expected. Symlinks are followed at most once: a loop is skipped
  with a warning naming it, each image is counted once in its class, and an image that links would put in two
  classes is refused (:func:`_scan_folder`; tars: :func:`_scan_tar`).
* :func:`load_image` decodes every mode PIL opens correctly to RGB (16-bit grayscale is scaled, not clipped to
  white); an unreadable, corrupt or decompression-bomb image is left out of its batch with a warning naming the
  file, never replaced by another image, and counted (:attr:`ImageLoader.skipped`).
* :func:`prepare_digits_folder` writes scikit-learn's bundled handwritten digits (1,797 real 8x8 scans, no
  download) once into an ImageFolder cache with a train/val split: the dataset of ``python train.py``'s demo.
* :func:`create_train_loader` makes the augmentation of every sample a function of
  ``(seed, epoch, rank, position in the epoch)`` only (:class:`SeededSampler` + :class:`SeededDataset`): the
  augmentations do not depend on the worker count, on persistent workers, or on anything that ran before in
  the process, which is what lets ``--resume`` reproduce an uninterrupted run bit for bit.
"""
import contextlib
import copy
import hashlib
import io
import logging
import os
import posixpath
import random
import shutil
import tarfile
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

import numpy as np
import torch
import torch.utils.data
from PIL import Image
from timm.data import create_dataset, create_transform
from timm.data.distributed_sampler import OrderedDistributedSampler, RepeatAugSampler
from timm.data.loader import PrefetchLoader, fast_collate
from timm.data.readers.img_extensions import get_img_extensions
from timm.utils.misc import natural_key

from .errors import UsageError, check_range

__all__ = [
    'default_cache_dir', 'prepare_digits_folder', 'SkippedImage', 'UnusableImageError', 'convert_image_mode',
    'load_image', 'find_split', 'ImageFileDataset', 'parse_val_split', 'stratified_holdout', 'DatasetSubset',
    'holdout_split', 'read_class_map', 'default_workers', 'check_image_args', 'create_image_dataset', 'create_train_val_datasets', 'dataset_class_to_idx',
    'dataset_class_names', 'check_num_classes', 'check_class_names', 'seeded_rng', 'SeededSampler',
    'SeededDataset', 'StridedSampler', 'collate_readable', 'ReadableBatches', 'ImageLoader', 'create_train_loader',
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


# ---------------------------------------------------------------------------------------------------- image decoding

class SkippedImage:
    """What :class:`ImageFileDataset` returns in place of a sample whose image cannot be used: its ``name``
    (file path, or ``tar:member``) and the ``reason``. The loaders leave it out of the batch, warn once with
    both and count it (:attr:`ImageLoader.skipped`); it is never replaced by another sample."""
    __slots__ = ('name', 'reason')

    def __init__(self, name: str, reason: str):
        self.name, self.reason = name, reason

    def __repr__(self) -> str:
        return f'SkippedImage({self.name!r}, {self.reason!r})'


class UnusableImageError(ValueError):
    """An image that decodes, but in a pixel format with no defined 8-bit scale (e.g. signed 32-bit values)."""


_SIXTEEN_BIT_MODES = frozenset({'I;16', 'I;16L', 'I;16B', 'I;16N'})


def _to_8bit_grayscale(img: Image.Image) -> Image.Image:
    """An 'L' image from a 16-bit ('I;16*'), 32-bit integer ('I') or float ('F') grayscale image.

    PIL's own ``convert('RGB' | 'L')`` clips these modes at 255 instead of scaling them, so a 16-bit PNG would
    become almost all white. 16-bit values v (and 'I' images within 0..65535, which is what 16-bit files
    decode to) map to round(v / 257), i.e. 65535 -> 255; floats in [0, 1] map to round(255 v). Other value
    ranges have no defined scale and raise :class:`UnusableImageError`.
    """
    values = np.asarray(img)
    if img.mode == 'F':
        if not np.isfinite(values).all() or values.min() < 0 or values.max() > 1:
            raise UnusableImageError(
                f'float (mode F) image with values {values.min():g}..{values.max():g}; only 0..1 has a defined '
                f'8-bit scale')
        return Image.fromarray(np.round(values * 255.).astype(np.uint8))
    values = values.astype(np.int64)
    if values.size and (values.min() < 0 or values.max() > 65535):
        raise UnusableImageError(
            f'32-bit integer (mode {img.mode}) image with values {values.min()}..{values.max()}; only 0..65535 '
            f'(16-bit) has a defined 8-bit scale')
    return Image.fromarray(((values + 128) // 257).astype(np.uint8))


def convert_image_mode(img: Image.Image, mode: Optional[str] = 'RGB') -> Image.Image:
    """``img`` in PIL ``mode`` (none: unchanged), correct for every mode PIL decodes.

    16-bit / 32-bit / float grayscale is scaled to 8 bits first (:func:`_to_8bit_grayscale`); premultiplied
    'La' and palette images with a transparency entry go through their straight-alpha form; alpha is then
    dropped as by ``Image.convert`` (the stored colours are kept). CMYK, YCbCr, LAB, HSV, '1' and the rest
    convert with ``Image.convert``.
    """
    if not mode or img.mode == mode:
        return img
    if img.mode in _SIXTEEN_BIT_MODES or img.mode in ('I', 'F'):
        img = _to_8bit_grayscale(img)
    elif img.mode == 'La':  # PIL converts La only to LA
        img = img.convert('LA')
    elif img.mode == 'P' and 'transparency' in img.info:  # PIL asks for this step (and warns without it)
        img = img.convert('RGBA')
    return img if img.mode == mode else img.convert(mode)


def load_image(fp: Union[str, os.PathLike, io.IOBase], mode: Optional[str] = 'RGB') -> Image.Image:
    """Open and fully decode one image (first frame) and convert it with :func:`convert_image_mode`.

    Raises for anything unusable: unreadable / truncated / corrupt files (``OSError``, ``SyntaxError``, ...),
    images larger than PIL's decompression-bomb limit ``PIL.Image.MAX_IMAGE_PIXELS`` (PIL only warns between 1x
    and 2x the limit; here both raise, so one huge image cannot exhaust a worker's memory) and
    :class:`UnusableImageError`.
    """
    with warnings.catch_warnings():
        warnings.simplefilter('error', Image.DecompressionBombWarning)
        if isinstance(fp, (str, os.PathLike)):
            with open(fp, 'rb') as f:
                img = Image.open(f)
                img.load()  # decode now, while the file is open: truncated data fails here
        else:
            img = Image.open(fp)
            img.load()
    return convert_image_mode(img, mode)


# ---------------------------------------------------------------------------------------------------- splits

# timm's split synonyms (timm.data.dataset_factory): a split asked for by one name is found under any of them
_SPLIT_SYNONYMS = (('train', 'training'), ('validation', 'val', 'valid', 'eval', 'evaluation'))


def _split_names(split: str) -> List[str]:
    base = split[:-len('.tar')] if split.lower().endswith('.tar') else split
    names = [split]
    for group in _SPLIT_SYNONYMS:
        if base in group:
            names += [s for s in group if s not in names]
    return names


def find_split(root: str, split: str) -> Optional[str]:
    """The folder or image tar that holds ``split`` in the folder ``root``, or None.

    Tried in order: ``root/<split>`` (a folder, or a tar when ``split`` ends in ``.tar``), ``root/<split>.tar``,
    then the same for timm's synonyms of the split name ('train' / 'training'; 'validation' / 'val' / 'valid' /
    'eval' / 'evaluation').
    """
    for name in _split_names(split):
        path = os.path.join(root, name)
        if os.path.isdir(path) or (os.path.isfile(path) and path.lower().endswith('.tar')):
            return path
        if os.path.isfile(path + '.tar'):
            return path + '.tar'
    return None


def _split_entries(root: str) -> List[str]:
    """Entries of ``root`` named like a split (any synonym, folder or ``.tar``), for messages and fallbacks."""
    names = {s for group in _SPLIT_SYNONYMS for s in group}
    return sorted(e + ('/' if os.path.isdir(os.path.join(root, e)) else '') for e in os.listdir(root)
                  if (e[:-4] if e.lower().endswith('.tar') else e) in names)


# ---------------------------------------------------------------------------------------------------- image files

def _is_hidden(name: str) -> bool:
    return name.startswith('.')


def _samples_by_class(
        paths: Sequence[str],
        class_to_idx: Optional[Dict[str, int]],
        where: str,
) -> Tuple[List[Tuple[str, int]], Dict[str, int], List[str]]:
    """Label relative image paths ``<class>/<any sub-folders>/<image>`` by their first folder.

    Returns (``(path, target)`` list in natural order, class_to_idx, classes left out). With a given
    ``class_to_idx`` (a class map, or the training set's classes for a validation set) images of other classes
    are left out, as in timm; the caller decides whether that is an error.
    """
    loose = [p for p in paths if '/' not in p]
    if loose:
        raise UsageError(
            f'{where} holds images outside class folders ({loose[0]}{" and more" if len(loose) > 1 else ""}): '
            f'expected {where}/<class>/<image>, every image inside the folder of its class')
    labelled = [(p, p.split('/', 1)[0]) for p in paths]
    if class_to_idx is None:
        class_to_idx = {c: i for i, c in enumerate(sorted({c for _, c in labelled}, key=natural_key))}
    samples = sorted(((p, class_to_idx[c]) for p, c in labelled if c in class_to_idx),
                     key=lambda s: natural_key(s[0]))
    other_classes = sorted({c for _, c in labelled if c not in class_to_idx}, key=natural_key)
    return samples, class_to_idx, other_classes


def _is_image_name(name: str, extensions: Set[str]) -> bool:
    return not _is_hidden(name) and os.path.splitext(name)[1].lower() in extensions


def _contains(folder: str, path: str) -> bool:
    """Whether the real path ``path`` is ``folder`` or lies below it."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _visible_relpath(path: str, folder: str) -> Optional[str]:
    """``path`` relative to ``folder`` ('/'-separated) if it lies below it with no hidden part, else None."""
    if not _contains(folder, path) or path == folder:
        return None
    rel = os.path.relpath(path, folder).replace(os.sep, '/')
    return None if any(_is_hidden(part) for part in rel.split('/')) else rel


class _FolderScan:
    """The images of an ImageFolder tree, symlinks followed at most once (see :func:`_scan_folder`)."""

    def __init__(self, root: str, extensions: Set[str]):
        self.root, self.extensions = root, extensions
        self.root_real = os.path.realpath(root)
        self.class_real: Dict[str, str] = {}  # class folder name -> its real path
        self.owner_of_real: Dict[str, str] = {}  # real class folder -> class name
        self.warned: Set[str] = set()

    def _warn_skipped(self, rel: str, target: str, why: str) -> None:
        if rel not in self.warned:
            self.warned.add(rel)
            _logger.warning(f'{self.root}: skipped the symlink {rel} -> {target}: {why}')

    def class_folders(self) -> List[str]:
        """Loose images in the root (the caller refuses them); fills :attr:`class_real` with the class folders,
        leaving out a link to the root or a folder above it (a loop)."""
        loose = []
        with os.scandir(self.root) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if _is_hidden(entry.name):
                    continue
                if not entry.is_dir():
                    if _is_image_name(entry.name, self.extensions):
                        loose.append(entry.name)
                    continue
                real = os.path.realpath(entry.path)
                if _contains(real, self.root_real):
                    self._warn_skipped(entry.name, real, 'it points to the dataset root or a folder above it (a loop)')
                    continue
                self.class_real[entry.name] = real
        owners: Dict[str, str] = {}
        for name, real in self.class_real.items():
            if real in owners:
                raise UsageError(
                    f'{self.root}: class folders {owners[real]} and {name} are the same folder {real}: its images '
                    f'would have two labels; expected each class folder to hold only its own images')
            owners[real] = name
        for name, real in self.class_real.items():
            outer = self._enclosing_class(real, owners)
            if outer is not None:
                raise UsageError(
                    f'{self.root}: class folder {name} is the folder {outer} inside another class folder ({real}): '
                    f'its images would have two labels; expected each class folder to hold only its own images')
        self.owner_of_real = owners
        return loose

    @staticmethod
    def _enclosing_class(real: str, owners: Dict[str, str]) -> Optional[str]:
        """``<class>/<path>`` when the real path ``real`` lies, not hidden, below the real folder of a class."""
        parent = os.path.dirname(real)
        while parent != os.path.dirname(parent):
            if parent in owners:
                rel = _visible_relpath(real, parent)
                return None if rel is None else f'{owners[parent]}/{rel}'
            parent = os.path.dirname(parent)
        return None

    def walk_class(self, name: str) -> Tuple[List[str], List[Tuple[str, str]]]:
        """(images of the class's own folder tree, ``(relative path, real path)`` of those reached through
        symlinks). Folders are read in trees: the class folder's own tree first (links not followed), then the
        tree of each link found, in turn; every real folder is read once, so the walk ends."""
        read: Dict[str, str] = {}  # real folder -> the relative path it was read as
        own, linked = [], []
        trees = [(self.class_real[name], name, True)]
        while trees:
            base_real, base_rel, is_own = trees.pop(0)
            read[base_real] = base_rel
            links = []
            stack = [(base_real, base_rel)]
            while stack:
                folder_real, folder_rel = stack.pop()
                with os.scandir(folder_real) as entries:
                    for entry in sorted(entries, key=lambda e: e.name):
                        if _is_hidden(entry.name):
                            continue
                        rel = f'{folder_rel}/{entry.name}'
                        if entry.is_dir():
                            if entry.is_symlink():
                                links.append((rel, entry.path, folder_real))
                            elif entry.path in read:  # a tree read before, now inside a linked one
                                _logger.warning(f'{self.root}: skipped {rel}: that folder is already read as '
                                                f'{read[entry.path]}; its images count once')
                            else:
                                read[entry.path] = rel
                                stack.append((entry.path, rel))
                        elif _is_image_name(entry.name, self.extensions):
                            if is_own and not entry.is_symlink():
                                own.append(rel)
                            else:
                                linked.append((rel, os.path.realpath(entry.path)))
            for rel, path, folder_real in links:
                target = os.path.realpath(path)
                if _contains(target, folder_real) or _contains(target, self.root_real):
                    self._warn_skipped(rel, target, 'it points to a folder that contains it (a loop); '
                                                    'that folder is read once')
                elif target in read:
                    self._warn_skipped(rel, target, f'that folder is already read as {read[target]}; '
                                                    f'its images count once')
                else:
                    read[target] = rel
                    trees.append((target, rel, False))
        return own, linked

    def own_image(self, real: str) -> Optional[str]:
        """The relative path of the file ``real`` as an image of its own class folder, or None."""
        rel = self._enclosing_class(real, self.owner_of_real)
        if rel is None or not _is_image_name(os.path.basename(real), self.extensions) or not os.path.isfile(real):
            return None
        return rel


def _count_linked_images_once(
        where: str,
        own: List[str],
        linked: Sequence[Tuple[str, str, Optional[str]]],
) -> List[str]:
    """``own`` images plus those of ``linked`` (``(relative path, identity of the file, where that file is an
    image of its own class or None)``) that are not the same file as another image of the class; a file that
    is an image of two classes is refused."""
    first: Dict[str, str] = {}  # identity -> the relative path it was counted as
    kept, duplicates = list(own), []
    for rel, identity, own_rel in linked:
        counted = own_rel or first.get(identity)
        if counted is None:
            first[identity] = rel
            kept.append(rel)
        elif counted.split('/', 1)[0] == rel.split('/', 1)[0]:
            duplicates.append((rel, counted))
        else:
            raise UsageError(
                f'{where}: the image {rel} is the same file as {counted} (a link): one image in two classes has no '
                f'single label; expected each image in the folder of one class')
    if duplicates:
        rel, counted = duplicates[0]
        _logger.warning(f'{where}: {len(duplicates)} image path(s) reach a file already counted in the same class '
                        f'through a link (e.g. {rel} is {counted}); each file is counted once')
    return kept


def _scan_folder(root: str, extensions: Set[str]) -> List[str]:
    """Image paths under ``root`` relative to it ('/'-separated), hidden files and folders left out.

    Symlinks are followed at most once: a class folder may be a link, and a link inside one adds the images it
    reaches to that class, but a link to a folder that contains it (a loop), to the dataset root, or to a
    folder already read for the class is skipped with a warning naming it. A file reached by several paths of
    one class (file links, links into the class's own folders) is counted once; a file that is an image of two
    classes is a :class:`UsageError`, since no label would be right for both. Hard links are files of their
    own, as copies would be.
    """
    scan = _FolderScan(root, extensions)
    paths = scan.class_folders()
    linked = []
    for name in sorted(scan.class_real, key=natural_key):
        own, reached = scan.walk_class(name)
        paths += own
        linked += [(rel, real, scan.own_image(real)) for rel, real in reached]
    return _count_linked_images_once(root, paths, linked)


def _read_exactly(f, offset: int, size: int) -> bytes:
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise EOFError(f'{size - len(data)} bytes missing at the end of the file')
    return data


def _tar_member_name(name: str) -> str:
    return '/'.join(part for part in name.split('/') if part not in ('', '.'))


def _resolve_tar_links(
        path: str,
        where: str,
        regular: Dict[str, Tuple[int, int]],
        symlinks: Dict[str, str],
        hardlinks: Dict[str, str],
) -> Tuple[Dict[str, Tuple[int, int]], Dict[str, str]]:
    """(``{hard link: data of its file}``, ``{symlink: the regular member it reaches}``) of one tar's link
    members. A symlink that does not reach a file in the tar (a folder, a path outside the tar, nothing) is a
    :class:`UsageError`: the tar holds the link, not what it pointed to."""
    hard = {}
    for name, target in hardlinks.items():
        if _tar_member_name(target) not in regular:
            raise UsageError(f'image tar {path}: member {where}{name} is a hard link to {target}, which is not a file '
                             f'stored before it in the tar; expected a complete tar (or one made with tar -h)')
        hard[name] = regular[_tar_member_name(target)]
    folders = {'/'.join(name.split('/')[:i]) for name in regular for i in range(1, name.count('/') + 1)}
    reached = {}
    for name, target in symlinks.items():
        current = name
        for _ in range(40):  # a chain of links inside the tar, as the OS would follow them (ELOOP after 40)
            link = symlinks[current]
            current = posixpath.normpath(posixpath.join(posixpath.dirname(current), link))
            if link.startswith('/') or current.startswith('..') or current not in symlinks:
                break
        if current in regular or current in hard:
            reached[name] = current
            continue
        what = 'a folder in the tar' if current in folders else 'nothing inside the tar'
        raise UsageError(
            f'image tar {path}: member {where}{name} is a symlink to {symlinks[name]} ({what}); a tar holds the link, '
            f'not what it points to: make the tar with tar --dereference (-h), so that it holds the images')
    return hard, reached


def _scan_tar(path: str, extensions: Set[str]) -> Tuple[Dict[str, Tuple[int, int]], Dict[str, str]]:
    """``{member path: (byte offset of its data in the file, size)}`` for the images of an uncompressed tar, and
    ``{symlink member: the member it reaches}`` for those of them that are symlinks.

    Images inside tars inside the tar (ImageNet's train tar holds one tar per class) are listed as
    ``<inner tar name without .tar>/<member path>``, their offsets in the outer file (tar stores members
    uncompressed and contiguous, so an image can be read with one seek, without tarfile, in any process).
    A hard-link member is an image of its own with its file's data (as a hard-linked file in a folder); a
    symlink member reads the member it points to (see :func:`_resolve_tar_links`).
    A truncated or corrupt tar raises a :class:`UsageError` naming it.
    """
    images: Dict[str, Tuple[int, int]] = {}
    links: Dict[str, str] = {}
    file_size = os.path.getsize(path)

    def scan(tf: tarfile.TarFile, base: int, prefix: str, where: str):
        regular, symlinks, hardlinks = {}, {}, {}
        for ti in tf:
            name = _tar_member_name(ti.name)
            if ti.issym() and not any(_is_hidden(part) for part in name.split('/')):
                symlinks[name] = ti.linkname
            elif ti.islnk():
                hardlinks[name] = ti.linkname
            if not ti.isreg() or ti.sparse is not None:
                continue
            stem, ext = os.path.splitext(ti.name)
            if base + ti.offset_data + ti.size > file_size:
                raise UsageError(f'image tar {path} is truncated: member {where}{ti.name} ends past the end of '
                                 f'the file ({file_size} bytes); copy the complete file again')
            if ext.lower() == '.tar' and not prefix:
                with tarfile.open(fileobj=tf.extractfile(ti), mode='r:') as inner:
                    scan(inner, base + ti.offset_data, stem.strip('/') + '/', f'{ti.name}:')
            regular[name] = (base + ti.offset_data, ti.size)
        hard, reached = _resolve_tar_links(path, where, regular, symlinks, hardlinks)
        data = {**regular, **hard}
        for name in [*regular, *hard, *reached]:
            # hidden members (e.g. macOS' ._<image> files) and non-images are left out, as in folders
            parts = (prefix + name).split('/')
            if not _is_image_name(parts[-1], extensions) or any(_is_hidden(part) for part in parts):
                continue
            images[prefix + name] = data[reached.get(name, name)]
            if name in reached:
                links[prefix + name] = prefix + reached[name]
        # tarfile stops quietly at a missing or partial header; a complete tar ends with a zero block there
        with open(path, 'rb') as f:
            f.seek(base + tf.offset)
            end = f.read(tarfile.BLOCKSIZE)
        if end != bytes(tarfile.BLOCKSIZE):
            raise UsageError(f'image tar {path} is truncated: {where or "the file"} ends without the end-of-archive '
                             f'block after {len(images)} images; copy the complete file again')

    try:
        with tarfile.open(path, mode='r:') as tf:
            scan(tf, 0, '', '')
    except tarfile.TarError as e:
        raise UsageError(f'cannot read image tar {path}: {e} (expected an uncompressed .tar, complete; '
                         f'compressed tars are not supported)') from e
    return images, links


def _strip_split_folder(paths: Sequence[str], tar_path: str) -> Tuple[List[str], str]:
    """Drop a leading folder every image of a tar shares when it names the split (``val.tar`` holding
    ``val/<class>/<image>``, as imagenette's tars do), so that class folders come first. Returns the paths
    and the prefix dropped ('' for none)."""
    if not paths:
        return list(paths), ''
    first = paths[0].split('/', 1)[0]
    split_names = {os.path.splitext(os.path.basename(tar_path))[0]} | {s for g in _SPLIT_SYNONYMS for s in g}
    if first in split_names and all(p.startswith(first + '/') and p.count('/') >= 2 for p in paths):
        return [p[len(first) + 1:] for p in paths], first + '/'
    return list(paths), ''


def read_class_map(class_map: Union[str, Dict[str, int]], root: str = '') -> Dict[str, int]:
    """``--class-map``: ``{class folder name: label}`` from a dict, or from a text file of one class name per line
    in label order (timm's ``.txt`` format), found as given or under ``root``. timm also reads ``.pkl`` maps by
    unpickling them, which runs code from the file: they are refused. A :class:`UsageError` says what is wrong."""
    if isinstance(class_map, dict):
        return dict(class_map)
    path = class_map if os.path.isfile(class_map) or not root else os.path.join(root, class_map)
    if not os.path.isfile(path):
        raise UsageError(f'--class-map {class_map!r} is not a file; expected a text file with one class folder name '
                         f'per line')
    if os.path.splitext(path)[1].lower() in ('.pkl', '.pickle'):
        raise UsageError(f'--class-map {class_map!r} is a pickle: loading one can run code from the file, so it is '
                         f'never loaded here; write one class folder name per line in a .txt file')
    try:
        with open(path, encoding='utf-8') as f:
            names = [line.strip() for line in f]
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f'cannot read the class map {path}: {e} (expected a UTF-8 text file, one class name a '
                         f'line, in label order)') from e
    while names and not names[-1]:  # a final newline or blank lines at the end name no class
        names.pop()
    if not names or '' in names or len(set(names)) != len(names):
        problem = 'names no class' if not names else 'has a blank line' if '' in names else 'names a class twice'
        raise UsageError(f'the class map {path} {problem}; expected one distinct class folder name per line')
    return {name: i for i, name in enumerate(names)}


class ImageFileDataset(torch.utils.data.Dataset):
    """Labelled images of an ImageFolder tree or an uncompressed image tar (in place of timm's folder / tar
    readers for ``--dataset ''``).

    Layout: ``root/<class>/<image>``, or the same paths inside ``root`` = ``<name>.tar`` (optionally below one
    folder named like the split, ``val/<class>/<image>``; a tar of per-class tars ``<class>.tar`` works too).
    Images in sub-folders of a class folder belong to that class; hidden files and folders are ignored, and an
    image outside any class folder is an error. Symlinks (folder) and link members (tar) are read as
    :func:`_scan_folder` and :func:`_scan_tar` say: each image once, loops skipped with a warning. Classes
    are sorted in natural order (as timm); extensions are timm's (``timm.data.set_img_extensions``).

    ``__getitem__`` returns ``(transform(image), target)``, or a :class:`SkippedImage` when the image cannot be
    used (see :func:`load_image`): the loaders of this module leave those out and count them.
    """

    def __init__(
            self,
            root: str,
            class_map: Optional[Union[str, Dict[str, int]]] = None,
            class_to_idx: Optional[Dict[str, int]] = None,
            input_img_mode: Optional[str] = 'RGB',
            transform: Optional[Callable] = None,
    ):
        self.root = root
        self.input_img_mode = input_img_mode
        self.transform = transform
        self.target_transform = None
        if class_map:
            class_to_idx = read_class_map(class_map, os.path.dirname(root) if os.path.isfile(root) else root)
        extensions = set(get_img_extensions(as_set=True))
        self.is_tar = os.path.isfile(root)
        if self.is_tar:
            members, links = _scan_tar(root, extensions)
            paths, self._prefix = _strip_split_folder(list(members), root)
            self._offsets = {p: members[self._prefix + p] for p in paths}
            paths = _count_linked_images_once(root, *self._tar_linked_images(paths, links))
        else:
            paths, self._prefix, self._offsets = _scan_folder(root, extensions), '', None
        self.samples, self.class_to_idx, self.other_classes = _samples_by_class(paths, class_to_idx, root)
        self._file, self._file_pid = None, None  # the tar, opened once per process

    def _tar_linked_images(self, paths: List[str], links: Dict[str, str]) -> Tuple[List[str], List[Tuple]]:
        """(images of their own, ``(symlink, member reached, that member as an image or None)``) of a tar."""
        own = [p for p in paths if self._prefix + p not in links]
        linked = []
        for p in paths:
            target = links.get(self._prefix + p)
            if target is not None:
                as_image = target[len(self._prefix):] if target.startswith(self._prefix) else None
                linked.append((p, target, as_image if as_image in self._offsets else None))
        return own, linked

    def __len__(self) -> int:
        return len(self.samples)

    def filename(self, index: int) -> str:
        """Where the image of sample ``index`` is: a file path, or ``<tar path>:<member path>``."""
        path = self.samples[index][0]
        return f'{self.root}:{self._prefix}{path}' if self.is_tar else os.path.join(self.root, path)

    def _open(self, path: str):
        if not self.is_tar:
            return os.path.join(self.root, path)
        if self._file_pid != os.getpid():  # a forked / spawned worker opens its own handle
            self._file, self._file_pid = open(self.root, 'rb'), os.getpid()
        return io.BytesIO(_read_exactly(self._file, *self._offsets[path]))

    def __getitem__(self, index: int):
        path, target = self.samples[index]
        try:
            img = load_image(self._open(path), self.input_img_mode)
        except Exception as e:  # any decode failure skips this image only (KeyboardInterrupt etc. pass)
            return SkippedImage(self.filename(index), f'{type(e).__name__}: {e}')
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target

    def __getstate__(self):
        state = self.__dict__.copy()
        state['_file'] = state['_file_pid'] = None
        return state


# ---------------------------------------------------------------------------------------------------- hold-out

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


def _holdout_key(seed: int, name: str) -> bytes:
    return hashlib.sha256(f'{seed}\0{name}'.encode()).digest()


def stratified_holdout(
        names: Sequence[str],
        targets: Sequence[int],
        fraction: float,
        seed: int,
) -> Tuple[List[int], List[int]]:
    """Split sample indices into (train, held out): from each class, the ``round(fraction * n)`` samples
    (at most n - 1, so no class leaves training) whose ``sha256(seed, name)`` is smallest.

    Deterministic from ``seed`` and the sample names alone: the same on every machine, process, numpy version
    and file order, and adding images to a class moves at most a few others. Both lists are sorted.
    """
    by_class: Dict[int, List[int]] = {}
    for i, t in enumerate(targets):
        by_class.setdefault(int(t), []).append(i)
    held = []
    for t, indices in by_class.items():
        k = min(int(round(fraction * len(indices))), len(indices) - 1)
        held += sorted(indices, key=lambda i: _holdout_key(seed, names[i]))[:k]
    held_set = set(held)
    return [i for i in range(len(targets)) if i not in held_set], sorted(held)


class DatasetSubset(torch.utils.data.Subset):
    """``Subset`` that passes ``transform`` through to its dataset (the loaders set it) and tells the classes."""

    @property
    def transform(self):
        return self.dataset.transform

    @transform.setter
    def transform(self, value):
        self.dataset.transform = value

    @property
    def class_to_idx(self):
        return dataset_class_to_idx(self.dataset)

    def filename(self, index: int) -> str:
        return self.dataset.filename(self.indices[index])


def _sample_names_and_targets(ds) -> Tuple[List[str], List[int]]:
    if isinstance(ds, ImageFileDataset):
        return [p for p, _ in ds.samples], [t for _, t in ds.samples]
    reader = getattr(ds, 'reader', None)
    targets = getattr(ds, 'targets', None)
    if targets is None and reader is not None:
        targets = getattr(reader, 'targets', None)
    if targets is None:
        raise UsageError(f'--val-split FRACTION needs a dataset whose labels are known up front ({type(ds).__name__} '
                         f'does not list them): give a validation split by name instead')
    return [str(i) for i in range(len(targets))], [int(t) for t in targets]


def holdout_split(ds, fraction: float, seed: int) -> Tuple[DatasetSubset, DatasetSubset]:
    """(training part, held-out part) of ``ds``: :func:`stratified_holdout` by class. The parts read a
    (shallow) copy each, so each gets its own transform."""
    names, targets = _sample_names_and_targets(ds)
    train_idx, held_idx = stratified_holdout(names, targets, fraction, seed)
    if not held_idx:
        raise UsageError(f'--val-split {fraction} holds out no image: each class has too few images '
                         f'({len(targets)} images in {len(set(targets))} classes); give a larger fraction or a '
                         f'val/ folder')
    return DatasetSubset(ds, train_idx), DatasetSubset(copy.copy(ds), held_idx)


# ---------------------------------------------------------------------------------------------------- datasets

def _build_dataset(name, root, split, is_training, class_map, download, input_img_mode, batch_size, seed, what,
                   split_path: Optional[str] = None, class_to_idx: Optional[Dict[str, int]] = None):
    """One split; for ``name`` '' at ``split_path`` (a folder or tar, see :func:`find_split`)."""
    if name == '':
        ds = ImageFileDataset(split_path, class_map=class_map or None, class_to_idx=class_to_idx,
                              input_img_mode=input_img_mode)
        if len(ds) == 0 and ds.other_classes:  # every class folder is of another class than those labelled
            labelled = [c for c, _ in sorted(ds.class_to_idx.items(), key=lambda kv: kv[1])]
            raise UsageError(
                f'{what} at {split_path}: none of its class folders {_short_names(ds.other_classes)} is one of the '
                f'classes it is labelled with {_short_names(labelled)} (the model\'s or the class map\'s); '
                f'expected class folders named as those classes')
        if len(ds) == 0:
            kind = 'tar' if ds.is_tar else 'folder'
            raise UsageError(
                f'{what} at {split_path} is empty: no images found (expected class folders with images, '
                f'{split_path}{":" if ds.is_tar else "/"}<class>/<image>{"|".join(sorted(get_img_extensions()))} '
                f'in this {kind})')
        return ds
    try:
        ds = create_dataset(name, root=root, split=split, is_training=is_training, download=download,
                            input_img_mode=input_img_mode, batch_size=batch_size, seed=seed,
                            class_map=read_class_map(class_map, root) if class_map else None)
    except (RuntimeError, FileNotFoundError, AssertionError, ValueError) as e:
        raise UsageError(f'cannot read {what} {name} at {root!r}, split {split!r}: {e or type(e).__name__}') from e
    try:
        n = len(ds)
    except TypeError:  # some iterable datasets have no length
        n = None
    if n == 0:
        raise UsageError(f'{what} {name} split {split!r} is empty')
    return ds


def _check_root(root: Optional[str], split: str, what: str) -> str:
    """For the image folder / tar reader (``name`` ''): ``root`` given and existing."""
    if not root:
        raise UsageError(f'no {what} given: pass --data-dir DIR (an ImageFolder tree DIR/<split>/<class>/<image>, '
                         f'or a folder holding <split>.tar) or --dataset NAME')
    if not os.path.exists(root):
        raise UsageError(f'{what} folder {root!r} does not exist (expected an ImageFolder tree '
                         f'{root}/{split}/<class>/<image> or an image tar {root}/{split}.tar)')
    if os.path.isfile(root) and not root.lower().endswith('.tar'):
        raise UsageError(f'{what} {root!r} is a file but not an image tar (expected a folder '
                         f'{root}/{split}/<class>/<image>, or a .tar)')
    return root


def _find_main_split(root: str, split: str, what: str) -> str:
    """The folder / tar of ``split``; a tar given as ``root``, or a root of class folders with no split folders
    or tars at all, is the split itself."""
    if os.path.isfile(root):
        return root
    found = find_split(root, split)
    if found is not None:
        return found
    others = _split_entries(root)
    if others:
        raise UsageError(f'no {what} split {split!r} in {root} (it has {", ".join(others)}; looked for '
                         f'{" / ".join(_split_names(split))}, as folders or .tar)')
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

    ``name`` '' (default) reads an :class:`ImageFileDataset` at the split found by :func:`find_split`
    (``root/<split>/`` or ``root/<split>.tar``, or a synonym); a ``.tar`` given as ``root``, or a root of class
    folders without any split folder, is read as the split itself. Other names go to timm's
    ``create_dataset`` (``torch/cifar10``, ``hfds/...``, ``wds/...``).

    ``class_to_idx`` (image folder / tar only; a ``class_map`` wins) labels the classes by name, e.g. with the
    classes a model was trained on; folders of other classes are left out and listed in ``other_classes``.
    """
    if name == '':
        root = _check_root(root, split, what)
        return _build_dataset(name, root, split, is_training, class_map, download, input_img_mode, batch_size,
                              seed, what, split_path=_find_main_split(root, split, what), class_to_idx=class_to_idx)
    return _build_dataset(name, root, split, is_training, class_map, download, input_img_mode, batch_size, seed, what)


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
    * a fraction 0 < f < 1: a class-stratified hold-out of the training images (:func:`stratified_holdout`,
      deterministic from ``seed``); the training set is the rest, disjoint from it.
    * '' or None: no validation set (None).
    """
    val_split = parse_val_split(val_split)
    common = dict(class_map=class_map, download=download, input_img_mode=input_img_mode, batch_size=batch_size,
                  seed=seed)
    if name != '':
        train = _build_dataset(name, root, train_split, True, what='training set', **common)
        if isinstance(val_split, float):
            train, val = holdout_split(train, val_split, seed)
            _log_holdout(train, val, val_split, seed)
            return train, val
        val = _build_dataset(name, root, val_split, False, what='validation set', **common) if val_split else None
        return train, val

    root = _check_root(root, train_split, 'training set')
    train_path = _find_main_split(root, train_split, 'training set')
    train = _build_dataset(name, root, train_split, True, what='training set', split_path=train_path, **common)
    if not val_split:
        return train, None
    if isinstance(val_split, float):
        found = find_split(root, 'validation') if os.path.isdir(root) else None
        if found:
            _logger.warning(f'--val-split {val_split}: validating on a hold-out of the training images; '
                            f'the validation split {found} is not used')
        train, val = holdout_split(train, val_split, seed)
        _log_holdout(train, val, val_split, seed)
        return train, val
    val_path = find_split(root, val_split) if os.path.isdir(root) else None
    if val_path is None or os.path.realpath(val_path) == os.path.realpath(train_path):
        looked = ' / '.join(_split_names(val_split))
        where = f'in {root} (looked for {looked}, as folders or .tar)' if os.path.isdir(root) else f'for {root}'
        raise UsageError(
            f'no validation split found {where}: pass --val-split FRACTION (e.g. 0.1: a seeded, class-stratified '
            f'hold-out of the training images, disjoint from training), add a val/ folder beside the training '
            f'images, or --val-split "" to train without validation')
    # labels by class name, as in the training set: a validation set without some class keeps the others' labels
    val = _build_dataset(name, root, val_split, False, what='validation set', split_path=val_path,
                         class_to_idx=train.class_to_idx, **common)
    if val.other_classes and not class_map:
        extra = val.other_classes
        raise UsageError(f'the validation set {val_path} has classes the training set {train_path} does not have '
                         f'({", ".join(extra[:5])}{", ..." if len(extra) > 5 else ""}); expected the same class '
                         f'folders in both')
    return train, val


def _log_holdout(train, val, fraction: float, seed: int) -> None:
    classes = dataset_class_names(train)
    _logger.info(f'validation: {len(val)} of the {len(train) + len(val)} training images held out (--val-split '
                 f'{fraction}, stratified over {len(classes) if classes else "the"} classes, seed {seed}); '
                 f'training on the other {len(train)}')


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
    if class_to_idx is None:
        return None
    return [c for c, _ in sorted(class_to_idx.items(), key=lambda kv: kv[1])]


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


def _short_names(names: Sequence[str], n: int = 10) -> str:
    shown = ', '.join(names[:n]) + (f', ... ({len(names)} in all)' if len(names) > n else '')
    return f'[{shown}]'


def check_class_names(ds, class_names: Sequence[str], what: str = 'dataset', hint: str = '') -> None:
    """Raise a :class:`UsageError`, with both lists, when ``ds`` has classes not in ``class_names`` (a model's
    classes in label order) or labels them otherwise. An image folder / tar built with ``class_to_idx`` from
    these names labels its class folders by name, so a subset of the classes is fine; other datasets must list
    the same classes in the same order."""
    if isinstance(ds, ImageFileDataset):
        if not ds.other_classes:
            return
        folders = sorted({p.split('/', 1)[0] for p, _ in ds.samples} | set(ds.other_classes), key=natural_key)
        raise UsageError(
            f'the {what} {ds.root} has class folders the model was not trained on '
            f'({", ".join(ds.other_classes[:10])}{", ..." if len(ds.other_classes) > 10 else ""}): folders '
            f'{_short_names(folders)}, model classes {_short_names(list(class_names))}{hint}')
    names = dataset_class_names(ds)
    if names is None:
        _logger.warning(f'the {what} does not list its classes: its labels cannot be checked against the '
                        f'{len(class_names)} class names the model was trained on')
    elif list(names) != list(class_names):
        raise UsageError(f'the {what} labels other classes than the model was trained on: dataset classes '
                         f'{_short_names(list(names))}, model classes {_short_names(list(class_names))}{hint}')


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


class StridedSampler(torch.utils.data.Sampler):
    """Indices ``rank, rank + world_size, ...`` of a dataset of ``size`` samples: every sample on exactly one
    rank, no padding (unlike timm's ``OrderedDistributedSampler``), so no sample is evaluated twice."""

    def __init__(self, size: int, rank: int, world_size: int):
        self.size, self.rank, self.world_size = size, rank, world_size

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.size, self.world_size))

    def __len__(self) -> int:
        return len(range(self.rank, self.size, self.world_size))


def collate_readable(batch: List[Any]) -> Tuple[torch.Tensor, torch.Tensor, List[SkippedImage]]:
    """timm's ``fast_collate`` of the samples that decoded, and the :class:`SkippedImage` of those that did not
    (left out: the batch is that much smaller, possibly empty)."""
    skipped = [s for s in batch if isinstance(s, SkippedImage)]
    kept = [s for s in batch if not isinstance(s, SkippedImage)]
    if not kept:
        return torch.zeros(0, dtype=torch.uint8), torch.zeros(0, dtype=torch.long), skipped
    return (*fast_collate(kept), skipped)


class ReadableBatches:
    """Iterate a ``DataLoader`` that collates with :func:`collate_readable`: yield ``(input, target)`` of the
    readable images, warn once per skipped file, count the skipped images of each pass (:attr:`skipped`) and
    leave out batches with no image left.

    ``empty_batch_error``: raise instead of leaving out an empty batch (DDP training: every rank must run
    the same number of steps, or the others wait for it forever).
    """

    def __init__(self, loader: torch.utils.data.DataLoader, empty_batch_error: Optional[str] = None):
        self.loader = loader
        self.empty_batch_error = empty_batch_error
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

    @property
    def sampler(self):
        return self.loader.sampler

    @property
    def batch_sampler(self):
        return self.loader.batch_sampler

    @property
    def dataset(self):
        return self.loader.dataset

    @property
    def collate_fn(self):
        return self.loader.collate_fn


class ImageLoader(PrefetchLoader):
    """timm's ``PrefetchLoader`` over :class:`ReadableBatches`: batches of the images that could be read.

    :attr:`skipped` is the number of images this rank left out in the current / last pass (an epoch, an
    evaluation); :attr:`skipped_files` maps every file skipped so far to the reason. Evaluation metrics over
    this loader count each readable image exactly once and no skipped one.
    """

    @property
    def skipped(self) -> int:
        return self.loader.skipped

    @property
    def skipped_files(self) -> Dict[str, str]:
        return self.loader.skipped_files


def _worker_init(worker_id: int) -> None:
    # augmentation randomness comes from SeededDataset; keep numpy distinct per worker for anything else
    info = torch.utils.data.get_worker_info()
    np.random.seed(info.seed % (2 ** 32))


def _image_loader(dataset, sampler, data_config, batch_size, device, num_workers, pin_memory, drop_last,
                  generator, img_dtype, re_prob=0., re_mode='const', re_count=1,
                  empty_batch_error: Optional[str] = None) -> ImageLoader:
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=collate_readable,
        pin_memory=pin_memory,
        drop_last=drop_last,
        generator=generator,
        worker_init_fn=_worker_init,
        persistent_workers=num_workers > 0,
    )
    return ImageLoader(
        ReadableBatches(loader, empty_batch_error),
        mean=data_config['mean'],
        std=data_config['std'],
        channels=data_config['input_size'][0],
        device=device,
        img_dtype=img_dtype,
        re_prob=re_prob,
        re_mode=re_mode,
        re_count=re_count,
    )


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
    """Training loader: timm's train transforms, a (distributed / repeated-augmentation) sampler, timm's fast
    collate and ``PrefetchLoader`` (normalisation and random erasing on the device). Full batches only, less
    the unreadable images (:class:`ImageLoader`; with one process a batch of only unreadable images is left
    out, with several it stops the run, since all ranks must take the same number of steps).

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
    if isinstance(dataset, torch.utils.data.IterableDataset):
        _logger.warning('iterable dataset: sample order and augmentation are up to the dataset; '
                        '--resume will not reproduce an uninterrupted run exactly')
        sampler, samples = None, dataset
    else:
        if aug_repeats:
            # timm's RepeatAugSampler; num_replicas / rank given, so it runs outside distributed mode too
            base_sampler = RepeatAugSampler(dataset, num_replicas=world_size, rank=rank, num_repeats=aug_repeats)
        else:
            base_sampler = torch.utils.data.DistributedSampler(
                dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        sampler, samples = SeededSampler(base_sampler, seed=seed, rank=rank), SeededDataset(dataset)
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
    """Evaluation loader: timm's eval transforms (resize / center crop per ``data_config``) and prefetcher.

    Every readable image is yielded exactly once over all ranks (in distributed mode rank r gets images
    r, r + world_size, ...: no padding, so ranks may run one batch more or less) and unreadable ones are left
    out and counted (:class:`ImageLoader`), so metrics summed over the batches and ranks are exact.
    """
    dataset.transform = create_transform(
        data_config['input_size'],
        is_training=False,
        interpolation=data_config['interpolation'],
        mean=data_config['mean'],
        std=data_config['std'],
        crop_pct=data_config['crop_pct'],
        crop_mode=data_config.get('crop_mode'),
        use_prefetcher=True,
    )
    sampler = None
    if distributed and not isinstance(dataset, torch.utils.data.IterableDataset):
        sampler = StridedSampler(len(dataset), torch.distributed.get_rank(), torch.distributed.get_world_size())
    return _image_loader(dataset, sampler, data_config, batch_size, device, num_workers, pin_memory,
                         drop_last=False, generator=None, img_dtype=img_dtype)


def num_valid_samples(loader) -> Optional[int]:
    """Real (not padding) samples this rank's eval loader yields, or None if every sample is real (always the
    case for :func:`create_eval_loader`; kept for loaders built with timm's ``OrderedDistributedSampler``)."""
    sampler = getattr(loader, 'sampler', None)
    if isinstance(sampler, OrderedDistributedSampler):
        return sampler.num_valid_samples
    return None


# ------------------------------------------------------------------------------------------------ flag values
# PIL modes whose 8-bit channels make an image tensor (convert_image_mode converts every decodable mode to them)
IMAGE_MODE_CHANNELS = {'RGB': 3, 'L': 1, 'RGBA': 4, 'LA': 2, 'CMYK': 4, 'YCbCr': 3, 'HSV': 3, 'LAB': 3}
INTERPOLATIONS = ('', 'nearest', 'bilinear', 'bicubic', 'box', 'hamming', 'lanczos')  # timm's names ('': model's)
DATASET_KINDS = ('torch', 'hfds', 'hfids', 'tfds', 'wds')  # --dataset KIND/NAME prefixes timm.data reads


def default_workers(most: int = 4) -> int:
    """The loader processes a script starts by default: ``most``, but no more than the CPUs this process may use
    (more only compete with the model for the same cores, and PyTorch warns about them)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(most, cpus))


def check_image_args(args, model_in_chans: Optional[int] = 3) -> None:
    """The data flags train.py and validate.py share, checked before anything is built: the image mode gives as
    many channels as the model takes, ``--mean`` / ``--std`` have one value or one per channel (std > 0),
    ``--crop-pct`` > 0, ``--class-map`` is a readable class map (never a pickle), ``--dataset`` is a kind timm
    reads. ``model_in_chans`` None: the model's channel count is not known yet (validate.py before it reads the
    checkpoint; it checks again with the model's), so only what does not depend on it is checked."""
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
