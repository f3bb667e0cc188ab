""" The image datasets and loaders of train.py and validate.py: timm's readers, ``create_dataset``, transforms,
samplers and ``PrefetchLoader``, and what they lack (``docs/what_happens_when.md``): a missing split is never the
training images, a validation folder is labelled by the training classes, symlink loops end, tar links, truncated tars,
16-bit and premultiplied images are read right or stop with one line, an unreadable image is left out and counted
(never the next sample), ``.pkl`` class maps are refused; a hold-out split, augmentation seeded per sample (exact
``--resume``), exact distributed evaluation (no padded samples), and workers that leave SIGINT / SIGTERM to the main
process.
"""
import collections
import contextlib
import copy
import hashlib
import importlib.util
import io
import logging
import os
import posixpath
import random
import shutil
import signal
import tarfile
import tempfile
import warnings
from pathlib import Path
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, Set, Tuple, Union

import numpy as np
import torch
import torch.distributed as dist
import torch.utils.data
from PIL import Image
from timm.data import ImageDataset, create_dataset, create_transform
from timm.data.auto_augment import AugmentOp, posterize as timm_posterize
from timm.data.distributed_sampler import RepeatAugSampler
from timm.data.loader import PrefetchLoader, _worker_init as timm_worker_init, fast_collate
from timm.data.readers.img_extensions import get_img_extensions
from timm.data.readers.reader import Reader
from timm.utils.misc import natural_key

from mlp_vision.arguments import check_range, usable_cpus
from mlp_vision.errors import RunError, UsageError

__all__ = [
    'IMAGE_MODE_CHANNELS', 'INTERPOLATIONS', 'DATASET_PACKAGES', 'check_image_args', 'check_dataset_package',
    'read_class_map', 'SkippedImage', 'convert_image_mode', 'load_image', 'find_split', 'ImageFileReader',
    'ImageFileDataset', 'parse_val_split', 'stratified_holdout', 'DatasetSubset', 'dataset_class_names',
    'sample_targets', 'check_num_classes', 'check_class_names', 'create_image_dataset', 'create_train_val_datasets',
    'dataset_source', 'prepare_digits_folder', 'default_workers', 'seeded_rng', 'SeededSampler', 'SeededDataset',
    'ReadableBatches', 'ImageLoader', 'create_train_sampler', 'train_samples_per_rank', 'fit_batch_to_data',
    'unused_images_message', 'create_train_loader', 'create_eval_loader',
]

_logger = logging.getLogger(__name__)

# PIL modes whose 8-bit channels make an image tensor (convert_image_mode converts every decodable mode to them)
IMAGE_MODE_CHANNELS = {'RGB': 3, 'L': 1, 'RGBA': 4, 'LA': 2, 'CMYK': 4, 'YCbCr': 3, 'HSV': 3, 'LAB': 3}
INTERPOLATIONS = ('', 'nearest', 'bilinear', 'bicubic', 'box', 'hamming', 'lanczos')  # timm's names ('': model's)
# --dataset KIND/NAME: the kinds timm.data reads, each with the module its reader imports and what installs it
DATASET_PACKAGES = {'torch': (None, None), 'hfds': ('datasets', 'datasets'), 'hfids': ('datasets', 'datasets'),
                    'tfds': ('tensorflow_datasets', 'tensorflow tensorflow-datasets'),
                    'wds': ('webdataset', 'webdataset')}
# timm's split synonyms (timm.data.dataset_factory): a split asked for by one name is found under any of them
SPLIT_SYNONYMS = (('train', 'training'), ('validation', 'val', 'valid', 'eval', 'evaluation'))


# ------------------------------------------------------------------------------------------------ flags
def check_image_args(args, model_in_chans: Optional[int] = 3) -> None:
    """The data flags, before any file is read: the image mode's channels are the model's (``model_in_chans`` None:
    not known yet), ``--mean`` / ``--std`` 1 or 1 per channel, std > 0, ``--class-map`` reads, ``--dataset`` KIND."""
    channels = IMAGE_MODE_CHANNELS.get(args.input_img_mode)  # the flag's choices, also in a recipe
    in_chans = (args.in_chans if args.in_chans is not None else
                args.input_size[0] if getattr(args, 'input_size', None) else model_in_chans)
    if channels is not None and in_chans is not None and channels != in_chans:
        raise UsageError(f'--input-img-mode {args.input_img_mode} gives {channels}-channel images, the model takes '
                         f'{in_chans} (--in-chans); pass --in-chans {channels} or a {in_chans}-channel mode')
    for flag, values, bounds in (('--mean', args.mean, {}), ('--std', args.std, dict(low=0, low_open=True))):
        if values is not None and in_chans is not None and len(values) not in (1, in_chans):
            raise UsageError(f'{flag} needs 1 or {in_chans} values (one per channel), got {len(values)}')
        for v in values or ():
            check_range(flag, v, **bounds)
    if args.class_map:
        read_class_map(args.class_map, args.data_dir or getattr(args, 'data', None) or '')
    kind = args.dataset.split('/', 1)[0] if args.dataset else ''
    if kind and (kind not in DATASET_PACKAGES or '/' not in args.dataset):
        raise UsageError(f'--dataset {args.dataset!r} is not a dataset timm reads: give KIND/NAME with KIND one of '
                         f'{", ".join(DATASET_PACKAGES)}, or leave it out for an image folder / tar at --data-dir')


def check_dataset_package(dataset: str) -> None:
    """A :class:`UsageError` when ``--dataset KIND/NAME`` needs a package that is not installed."""
    module, install = DATASET_PACKAGES.get((dataset or '').split('/', 1)[0], (None, None))
    if module is not None and importlib.util.find_spec(module) is None:
        raise UsageError(f'--dataset {dataset} is read by the {module} package, which is not installed: pip install '
                         f'{install} (or give an image folder / tar with --data-dir)')


def read_class_map(class_map: str, root: str = '') -> Dict[str, int]:
    """``{class folder name: label}`` from timm's ``.txt`` format (a class name a line, in label order), found as
    given or under ``root``; a pickle is refused unopened, a blank line or a name twice is one line."""
    path = class_map if os.path.isfile(class_map) or not root else os.path.join(root, class_map)
    if not os.path.isfile(path):
        raise UsageError(f'--class-map {class_map!r} is not a file; expected a text file with one class folder name '
                         f'per line')
    if os.path.splitext(path)[1].lower() in ('.pkl', '.pickle'):
        raise UsageError(f'--class-map {class_map!r} is a pickle: loading one can run code from the file, so it is '
                         f'never loaded here; write one class folder name per line in a .txt file')
    try:  # a final newline or blank lines at the end name no class
        names = [line.strip() for line in Path(path).read_text(encoding='utf-8').rstrip().splitlines()]
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f'cannot read the class map {path}: {e} (expected UTF-8 text, one class name a line)') from e
    if not names or '' in names or len(set(names)) != len(names):
        problem = 'names no class' if not names else 'has a blank line' if '' in names else 'names a class twice'
        raise UsageError(f'the class map {path} {problem}; expected one distinct class folder name per line')
    return {name: i for i, name in enumerate(names)}


# ------------------------------------------------------------------------------------------------ decoding
class SkippedImage(NamedTuple):
    """A sample whose image cannot be used (the loaders leave it out, warn once and count it): file, why, label."""
    name: str
    reason: str
    target: int


def convert_image_mode(img: Image.Image, mode: Optional[str] = 'RGB') -> Image.Image:
    """``img`` in PIL ``mode`` (none: unchanged), right for premultiplied / palette alpha and for 16-bit / 32-bit
    integer / float grayscale, which PIL's ``convert`` clips at 255: integers within 0..65535 map to round(v / 257),
    floats within 0..1 to round(255 v), other ranges raise."""
    if not mode or img.mode == mode:
        return img
    if img.mode in ('I;16', 'I;16L', 'I;16B', 'I;16N', 'I', 'F'):
        values, top = np.asarray(img, dtype=np.float64), 1. if img.mode == 'F' else 65535.
        if values.size and not (np.isfinite(values).all() and values.min() >= 0 and values.max() <= top):
            raise ValueError(f'mode {img.mode} image with values {values.min():g}..{values.max():g}; only 0..{top:g} '
                             f'has a defined 8-bit scale')
        img = Image.fromarray(np.round(values * (255. / top)).astype(np.uint8))
    elif img.mode == 'La':  # PIL converts La only to LA
        img = img.convert('LA')
    elif img.mode == 'P' and 'transparency' in img.info:  # PIL asks for this step (and warns without it)
        img = img.convert('RGBA')
    return img if img.mode == mode else img.convert(mode)


_said_first_frame = False  # said once per process: a folder of scanned documents would warn per file and epoch


def load_image(fp: Union[str, os.PathLike, io.IOBase], mode: Optional[str] = 'RGB',
               name: Optional[str] = None) -> Image.Image:
    """One image decoded (its first frame) and converted, the file closed; raises for anything unusable, also between
    1x and 2x PIL's ``MAX_IMAGE_PIXELS``, where PIL only warns (one huge image could exhaust a worker's memory)."""
    global _said_first_frame
    name = name or str(getattr(fp, 'name', fp))
    with warnings.catch_warnings(), (open(fp, 'rb') if isinstance(fp, (str, os.PathLike)) else fp) as fp:
        warnings.simplefilter('error', Image.DecompressionBombWarning)
        img = Image.open(fp)
        frames = getattr(img, 'n_frames', 1)  # before load: counting a TIFF's pages seeks, dropping decoded data
        if frames > 1 and not _said_first_frame:
            _said_first_frame = True
            _logger.warning(f'{name} holds {frames} frames (pages); only the first is read, as for every multi-frame '
                            f'image of this dataset (said once): save the pages as separate files to use them all')
        img.load()  # decode now, while the file is open: truncated data fails here
    return convert_image_mode(img, mode)


# ------------------------------------------------------------------------------------------------ finding images
def _is_hidden(path: str) -> bool:
    """Whether a name or a ``/``-path lies in a hidden folder or is hidden (macOS' ``._<image>``, ``.git``)."""
    return any(part.startswith('.') for part in path.split('/'))


def _is_image_name(name: str, extensions: Set[str]) -> bool:
    return not _is_hidden(name) and os.path.splitext(name)[1].lower() in extensions


def _warn_left_out(where: str, extensions: Set[str], not_regular: List[str], other_files: List[str]) -> None:
    """A warning each for what a scan did not read (timm drops both silently): entries named like images that are no
    regular file (a FIFO blocks ``open()`` forever), and the ``other_files`` of image formats outside ``extensions``."""
    if not_regular:
        _logger.warning(f'{where}: skipped {len(not_regular)} entries named like images that are not regular files '
                        f'(FIFOs, devices, sockets or broken links; e.g. {not_regular[0]}): only regular files are '
                        f'read as images')
    formats = set(Image.registered_extensions()) | {'.heic', '.heif'}
    counts = collections.Counter(e for e in (os.path.splitext(n)[1].lower() for n in other_files) if e in formats)
    if counts:
        frames = sorted(set(counts) & {'.gif', '.tif', '.tiff', '.webp', '.apng', '.mpo', '.ico'})
        _logger.warning(
            f'{where}: left out {sum(counts.values())} image files of other formats '
            f'({", ".join(f"{n} {ext}" for ext, n in sorted(counts.items()))}): only {" ".join(sorted(extensions))} '
            f'files are read (timm\'s image extensions); convert them, or add their extensions in Python with '
            f'timm.data.set_img_extensions' +
            (f' ({"/".join(frames)} files with several frames are then read by their first frame only)' if frames
             else ''))


def _contains(folder: str, path: str) -> bool:
    """Whether the real path ``path`` is ``folder`` or lies below it."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _scan_folder(root: str, extensions: Set[str]) -> List[Tuple[str, str, bool]]:
    """``(path relative to root, real path, reached through a link)`` of each image under ``root``, hidden ones left
    out. Of each class folder its own tree is read first, then each link's tree in turn, every real folder once per
    class, so the walk ends (timm's ``os.walk`` follows a link loop forever)."""
    root_real, images, not_regular, other_files = os.path.realpath(root), [], [], []
    for name in sorted(os.listdir(root), key=natural_key):
        if _is_hidden(name) or not os.path.isdir(os.path.join(root, name)):
            if _is_image_name(name, extensions):  # outside the class folders: refused by ImageFileReader
                images.append((name, os.path.join(root, name), False))
            continue
        read: Dict[str, str] = {}  # real folder -> the relative path it was read as
        trees = [(name, os.path.join(root, name), root_real)]  # (relative path, path, the real folder holding it)
        for rel, path, parent in trees:  # the class folder, then each link to a folder as it is found
            real = os.path.realpath(path)
            loop = _contains(real, parent) or _contains(real, root_real)
            if loop or real in read:  # each link is met once: one warning
                why = ('it points to the dataset root or a folder above it (a loop)' if loop and rel == name else
                       'it points to a folder that contains it (a loop); that folder is read once' if loop else
                       f'that folder is already read as {read[real]}; its images count once')
                _logger.warning(f'{root}: skipped the symlink {rel} -> {real}: {why}')
                continue
            read[real], linked, stack = rel, os.path.islink(path), [(real, rel)]
            while stack:
                folder, folder_rel = stack.pop()
                with os.scandir(folder) as entries:
                    entries = sorted(entries, key=lambda e: e.name)
                for entry in (e for e in entries if not _is_hidden(e.name)):
                    entry_rel = f'{folder_rel}/{entry.name}'
                    if entry.is_dir() and entry.is_symlink():
                        trees.append((entry_rel, entry.path, folder))
                    elif entry.is_dir() and entry.path in read:  # a tree read before, now inside a linked one
                        _logger.warning(f'{root}: skipped {entry_rel}: that folder is already read as '
                                        f'{read[entry.path]}; its images count once')
                    elif entry.is_dir():
                        read[entry.path] = entry_rel
                        stack.append((entry.path, entry_rel))
                    elif not _is_image_name(entry.name, extensions):
                        other_files.append(entry.name)
                    elif not entry.is_file():  # follows links: a FIFO or device, or a link to one or nothing
                        not_regular.append(entry_rel)
                    else:
                        via = linked or entry.is_symlink()
                        images.append((entry_rel, os.path.realpath(entry.path) if via else entry.path, via))
    _warn_left_out(root, extensions, not_regular, other_files)
    return images


def _tar_member_name(name: str) -> str:
    return '/'.join(part for part in name.split('/') if part not in ('', '.'))


def _scan_tar(path: str, extensions: Set[str]) -> Tuple[List[Tuple[str, str, bool]], Dict[str, Tuple[int, int]]]:
    """(the images as :func:`_scan_folder` gives them, a symlink's identity the member it reaches; ``{member: (data
    offset, size)}``) of an uncompressed tar, inner tars (ImageNet's) as ``<inner tar stem>/<member>``; a truncated or
    corrupt tar (``tarfile`` stops quietly) and a link to no file of the tar are one line."""
    images, data, not_regular, other_files = [], {}, [], []
    file_size = os.path.getsize(path)

    def add(name: str, identity: str, linked: bool) -> None:  # hidden members (macOS' ._<image>) left out
        if _is_image_name(name, extensions):
            images.append((name, identity, linked))
        elif not _is_hidden(name):
            other_files.append(name)

    def scan(tf: tarfile.TarFile, base: int, prefix: str, where: str):
        symlinks = {}
        for ti in tf:
            name = prefix + _tar_member_name(ti.name)
            if ti.issym() and not _is_hidden(name):
                symlinks[name] = ti.linkname
            elif ti.islnk():  # a file of its own with its target's data, as a hard link in a folder
                if prefix + _tar_member_name(ti.linkname) not in data:
                    raise UsageError(f'image tar {path}: member {where}{ti.name} is a hard link to {ti.linkname}, '
                                     f'which is not a file stored before it in the tar; expected a complete tar (or '
                                     f'one made with tar -h)')
                data[name] = data[prefix + _tar_member_name(ti.linkname)]
                add(name, name, False)
            elif ti.isdev() and _is_image_name(name, extensions):
                not_regular.append(where + ti.name)
            elif ti.isreg() and ti.sparse is None:
                if base + ti.offset_data + ti.size > file_size:
                    raise UsageError(f'image tar {path} is truncated: member {where}{ti.name} ends past the end of '
                                     f'the file ({file_size} bytes); copy the complete file again')
                if ti.name.lower().endswith('.tar') and not prefix:
                    with tarfile.open(fileobj=tf.extractfile(ti), mode='r:') as inner:
                        scan(inner, base + ti.offset_data, os.path.splitext(name)[0] + '/', f'{ti.name}:')
                data[name] = (base + ti.offset_data, ti.size)
                add(name, name, False)
        for name, link in symlinks.items():
            target = name
            for _ in range(40):  # a chain of links inside the tar, as the OS would follow them (ELOOP after 40)
                link = symlinks[target]
                target = posixpath.normpath(posixpath.join(posixpath.dirname(target), link))
                if link.startswith('/') or target.startswith('..') or target not in symlinks:
                    break
            if target not in data:
                what = 'a folder in' if any(m.startswith(target + '/') for m in data) else 'nothing inside'
                raise UsageError(
                    f'image tar {path}: member {where}{name[len(prefix):]} is a symlink to {symlinks[name]} ({what} '
                    f'the tar); a tar holds the link, not what it points to: make the tar with tar --dereference '
                    f'(-h), so that it holds the images')
            add(name, target, True)
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
    _warn_left_out(f'image tar {path}', extensions, not_regular, other_files)
    return images, data


def _one_path_per_file(where: str, images: Sequence[Tuple[str, str, bool]]) -> List[str]:
    """The paths of ``images`` (``(path, file identity, reached through a link)``), each file once per class (by its
    path without links where it has one); one file in two classes is refused. Hard links are files of their own."""
    counted = {identity: path for path, identity, linked in images if not linked}
    kept, again = list(counted.values()), []
    for path, identity in [(path, identity) for path, identity, linked in images if linked]:
        first = counted.setdefault(identity, path)
        if first == path:
            kept.append(path)
        elif first.split('/', 1)[0] == path.split('/', 1)[0]:
            again.append((path, first))
        else:
            raise UsageError(
                f'{where}: the image {path} is the same file as {first} (a link): one image in two classes has no '
                f'single label; expected each image in the folder of one class')
    if again:
        _logger.warning(f'{where}: {len(again)} image path(s) reach a file already counted in the same class '
                        f'through a link (e.g. {again[0][0]} is {again[0][1]}); each file is counted once')
    return kept


def _split_names(split: str) -> List[str]:
    base = split[:-len('.tar')] if split.lower().endswith('.tar') else split
    return [split] + [s for group in SPLIT_SYNONYMS if base in group for s in group if s != split]


def find_split(root: str, split: str) -> Optional[str]:
    """``root/<split>`` (folder, or tar for ``*.tar``) else ``root/<split>.tar``, for ``split`` then timm's synonyms,
    or None (timm's ``_search_split`` finds folders only)."""
    for name in _split_names(split):
        path = os.path.join(root, name)
        if os.path.isdir(path) or (os.path.isfile(path) and path.lower().endswith('.tar')):
            return path
        if os.path.isfile(path + '.tar'):
            return path + '.tar'
    return None


# ------------------------------------------------------------------------------------------------ the dataset
class ImageFileReader(Reader):
    """A timm reader (``reader[index]``: ``(open binary file, target)``) of ``root/<class>/<image>``, a folder or a tar
    (maybe below one folder named like the split: imagenette's ``val.tar``); an image is of its top folder (timm: its
    leaf). ``class_to_idx`` (or a ``class_map`` file) labels by name; other folders go to :attr:`other_classes`."""

    def __init__(self, root: str, class_map: Optional[str] = None, class_to_idx: Optional[Dict[str, int]] = None):
        super().__init__()
        self.root = root
        if class_map:
            class_to_idx = read_class_map(class_map, os.path.dirname(root) if os.path.isfile(root) else root)
        extensions = set(get_img_extensions(as_set=True))
        self.is_tar = os.path.isfile(root)
        self._prefix, self._offsets = '', None
        if self.is_tar:
            images, data = _scan_tar(root, extensions)
            first = images[0][0].split('/', 1)[0] if images else ''
            if first in {os.path.splitext(os.path.basename(root))[0]} | {s for g in SPLIT_SYNONYMS for s in g} and all(
                    p.startswith(first + '/') and p.count('/') >= 2 for p, _, _ in images):  # class folders come first
                self._prefix = first + '/'
                images = [(p[len(self._prefix):], identity, linked) for p, identity, linked in images]
            self._offsets = {p: data[identity] for p, identity, _ in images}
        else:
            images = _scan_folder(root, extensions)
        paths = _one_path_per_file(root, images)
        loose = [p for p in paths if '/' not in p]
        if loose:  # timm labels them class ''
            raise UsageError(f'{root} holds images outside class folders ({loose[0]}{" and more" * (len(loose) > 1)}): '
                             f'expected {root}/<class>/<image>, every image inside the folder of its class')
        classes = sorted({p.split('/', 1)[0] for p in paths}, key=natural_key)
        self.class_to_idx = class_to_idx if class_to_idx is not None else {c: i for i, c in enumerate(classes)}
        self.other_classes = [c for c in classes if c not in self.class_to_idx]
        self.samples = sorted(((p, self.class_to_idx[p.split('/', 1)[0]]) for p in paths
                               if p.split('/', 1)[0] in self.class_to_idx), key=lambda s: natural_key(s[0]))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Tuple[io.IOBase, int]:
        path, target = self.samples[index]
        if not self.is_tar:
            return open(os.path.join(self.root, path), 'rb'), target
        offset, size = self._offsets[path]
        with open(self.root, 'rb') as f:  # per image, as a folder's files: no handle shared by forked workers
            f.seek(offset)
            data = f.read(size)
        if len(data) != size:
            raise EOFError(f'{size - len(data)} bytes missing at the end of the file')
        return io.BytesIO(data), target

    def _filename(self, index: int, basename: bool = False, absolute: bool = False) -> str:
        path = self.samples[index][0]
        if basename:
            return path.rsplit('/', 1)[-1]
        root = os.path.abspath(self.root) if absolute else self.root
        return f'{root}:{self._prefix}{path}' if self.is_tar else os.path.join(root, path)


class ImageFileDataset(ImageDataset):
    """timm's ``ImageDataset`` over :class:`ImageFileReader`; an image that cannot be used is a :class:`SkippedImage`,
    never replaced by the next sample (timm's)."""

    def __init__(self, root: str, class_map: Optional[str] = None, class_to_idx: Optional[Dict[str, int]] = None,
                 input_img_mode: Optional[str] = 'RGB'):
        reader = ImageFileReader(root, class_map=class_map, class_to_idx=class_to_idx)
        super().__init__(root, reader=reader, input_img_mode=input_img_mode)
        self.root = root
        self.samples, self.class_to_idx = reader.samples, reader.class_to_idx
        self.other_classes, self.is_tar = reader.other_classes, reader.is_tar

    def __getitem__(self, index: int):
        try:
            fp, target = self.reader[index]
            img = load_image(fp, self.input_img_mode, self.filename(index))
        except Exception as e:  # any decode failure skips this image only (KeyboardInterrupt etc. pass)
            return SkippedImage(self.filename(index), f'{type(e).__name__}: {e}', self.samples[index][1])
        return img if self.transform is None else self.transform(img), target


# ------------------------------------------------------------------------------------------------ hold-out
def parse_val_split(value: Union[str, float, None]) -> Union[str, float]:
    """``--val-split``: a split name, '' for none, or a fraction 0 < f < 1 of the training images to hold out."""
    if value is None:
        return ''
    try:
        fraction = float(value)
    except ValueError:
        return value.strip()
    if not 0. < fraction < 1.:
        raise UsageError(f'--val-split {value}: a fraction of the training images to hold out must be between 0 and '
                         f'1 (e.g. 0.1), or give a split name (e.g. val)')
    return fraction


def stratified_holdout(names: Sequence[str], targets: Sequence[int], fraction: float,
                       seed: int) -> Tuple[List[int], List[int]]:
    """Sorted indices (train, held out): of each class the ``round(fraction * n)`` samples (at most n - 1: no class
    leaves training) of smallest ``sha256(seed, name)``: the same on any machine and file order."""
    by_class: Dict[int, List[int]] = {}
    for i, t in enumerate(targets):
        by_class.setdefault(int(t), []).append(i)
    held = set()
    for indices in by_class.values():
        k = min(int(round(fraction * len(indices))), len(indices) - 1)
        held.update(sorted(indices, key=lambda i: hashlib.sha256(f'{seed}\0{names[i]}'.encode()).digest())[:k])
    return [i for i in range(len(targets)) if i not in held], sorted(held)


class DatasetSubset(torch.utils.data.Subset):
    """``Subset`` that passes ``transform`` through to its dataset (the loaders set it)."""
    transform = property(lambda self: self.dataset.transform,
                         lambda self, value: setattr(self.dataset, 'transform', value))

    def filename(self, index: int) -> str:
        return self.dataset.filename(self.indices[index])


def sample_targets(ds) -> Optional[List[int]]:
    """The label of every sample, in order, where the dataset lists them up front (None otherwise)."""
    if isinstance(ds, torch.utils.data.Subset):
        targets = sample_targets(ds.dataset)
        return None if targets is None else [targets[i] for i in ds.indices]
    targets = [t for _, t in ds.samples] if isinstance(ds, ImageFileDataset) else getattr(ds, 'targets', None)
    return None if targets is None else [int(t) for t in targets]  # torchvision's datasets list targets


# ------------------------------------------------------------------------------------------------ labels
def dataset_class_names(ds) -> Optional[List[str]]:
    """Class names in label order (train.py stores them in checkpoints) from the ``class_to_idx`` or ``classes`` of
    timm's / torchvision's datasets, None if the dataset does not say."""
    if isinstance(ds, torch.utils.data.Subset):
        return dataset_class_names(ds.dataset)
    class_to_idx = getattr(ds, 'class_to_idx', None) or getattr(getattr(ds, 'reader', None), 'class_to_idx', None)
    if class_to_idx:
        return sorted(class_to_idx, key=class_to_idx.get)
    classes = getattr(ds, 'classes', None)
    return list(classes) if classes else None


def check_num_classes(ds, num_classes: int, what: str = 'dataset', hint: str = '') -> None:
    """A :class:`UsageError` if the dataset's classes are not those of a ``num_classes``-way classifier."""
    names = dataset_class_names(ds)
    if names is not None and len(names) != num_classes:
        raise UsageError(f'class-count mismatch: the {what} has {len(names)} classes {_short_names(names, 5)} but the '
                         f'model has {num_classes} outputs{hint}')


def _short_names(names: Sequence[str], n: int = 10) -> str:
    shown = ', '.join(names[:n]) + (f', ... ({len(names)} in all)' if len(names) > n else '')
    return f'[{shown}]'


def check_class_names(ds, class_names: Sequence[str], what: str = 'dataset', hint: str = '') -> None:
    """One line with both lists when ``ds`` labels other classes than the model's ``class_names`` (an image folder /
    tar labelled by them, which may hold a subset, refused other class folders as it was read)."""
    names = dataset_class_names(ds)
    if names is None:
        _logger.warning(f'the {what} does not list its classes: its labels cannot be checked against the '
                        f'{len(class_names)} class names the model was trained on')
    elif list(names) != list(class_names):
        raise UsageError(f'the {what} labels other classes than the model was trained on: dataset classes '
                         f'{_short_names(names)}, model classes {_short_names(class_names)}{hint}')


# ------------------------------------------------------------------------------------------------ datasets
def create_image_dataset(name: str, root: Optional[str], split: str, is_training: bool = False,
                         class_map: Optional[str] = None, download: bool = False, input_img_mode: str = 'RGB',
                         batch_size: int = 1, seed: int = 42, what: str = 'dataset',
                         class_to_idx: Optional[Dict[str, int]] = None) -> torch.utils.data.Dataset:
    """One split, never silently another: ``name`` '' an :class:`ImageFileDataset` of ``root``'s split folder / tar (a
    tar root, or a root without split folders, is the split), others timm's ``create_dataset``. Errors, an empty split
    and (``class_to_idx`` given, no class map) a class folder not among those classes are one line."""
    if name != '':
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
    if not root:
        raise UsageError(f'no {what} given: pass --data-dir DIR (an ImageFolder tree DIR/<split>/<class>/<image>, '
                         f'or a folder holding <split>.tar) or --dataset NAME')
    if not os.path.exists(root):
        raise UsageError(f'{what} folder {root!r} does not exist (expected an ImageFolder tree '
                         f'{root}/{split}/<class>/<image> or an image tar {root}/{split}.tar)')
    if os.path.isfile(root) and not root.lower().endswith('.tar'):
        raise UsageError(f'{what} {root!r} is a file but not an image tar (expected a folder or a .tar)')
    path = root if os.path.isfile(root) else find_split(root, split)
    if path is None:  # a root without split folders is the split (root/<class>/<image>), one with others is not
        others = [os.path.basename(p) + '/' * os.path.isdir(p) for g in SPLIT_SYNONYMS if (p := find_split(root, g[0]))]
        if others:
            raise UsageError(f'no {what} split {split!r} in {root} (it has {", ".join(others)}; looked for '
                             f'{" / ".join(_split_names(split))}, as folders or .tar)')
        path = root
    ds = ImageFileDataset(path, class_map=class_map or None, class_to_idx=class_to_idx, input_img_mode=input_img_mode)
    if ds.other_classes and (len(ds) == 0 or class_to_idx is not None and not class_map):
        raise UsageError(f'{what} {path} has class folders {_short_names(ds.other_classes)} not among its classes '
                         f'{_short_names(dataset_class_names(ds))} (the model\'s, the training set\'s or '
                         f'--class-map\'s); expected class folders named as those classes (a subset is fine)')
    if len(ds) == 0:
        raise UsageError(f'{what} at {path} is empty: no {"/".join(sorted(get_img_extensions()))} image in a class '
                         f'folder ({path}/<class>/<image>)')
    return ds


def create_train_val_datasets(
        name: str, root: Optional[str], train_split: str = 'train', val_split: Union[str, float, None] = 'validation',
        class_map: Optional[str] = None, download: bool = False, input_img_mode: str = 'RGB', batch_size: int = 1,
        seed: int = 42) -> Tuple[torch.utils.data.Dataset, Optional[torch.utils.data.Dataset]]:
    """(training set, validation set or None) of train.py: every training class has an image; a named split must
    exist (labelled by the training set's class names); a fraction holds out a :func:`stratified_holdout` of the
    training images, each part with its own transform. Validation is never silently the training images."""
    val_split = parse_val_split(val_split)
    common = dict(class_map=class_map, download=download, input_img_mode=input_img_mode, batch_size=batch_size,
                  seed=seed)
    train = create_image_dataset(name, root, train_split, True, what='training set', **common)
    targets = sample_targets(train)  # None: not listed up front
    present = set(targets or ())
    empty = [c for label, c in enumerate(dataset_class_names(train) or []) if present and label not in present]
    if empty:  # a class map naming a class with no folder
        raise UsageError(f'the training set has no image of class(es) {_short_names(empty)}: nothing would train '
                         f'their outputs; expected images in every class (or a --class-map without those classes)')
    if isinstance(val_split, float):
        if targets is None:
            raise UsageError(f'--val-split FRACTION needs a dataset whose labels are known up front '
                             f'({type(train).__name__} does not list them): give a validation split by name instead')
        names = ([p for p, _ in train.samples] if isinstance(train, ImageFileDataset) else
                 [str(i) for i in range(len(targets))])
        train_idx, held_idx = stratified_holdout(names, targets, val_split, seed)
        if not held_idx:
            raise UsageError(f'--val-split {val_split} holds out no image: each class has too few images '
                             f'({len(targets)} images in {len(present)} classes); give a larger fraction or a val/ '
                             f'folder')
        if name == '' and os.path.isdir(root) and (found := find_split(root, 'validation')):
            _logger.warning(f'--val-split {val_split}: validating on a hold-out of the training images; '
                            f'the validation split {found} is not used')
        _logger.info(f'validation: {len(held_idx)} of the {len(targets)} training images held out (--val-split '
                     f'{val_split}, stratified over {len(present)} classes, seed {seed}); training on the other '
                     f'{len(train_idx)}')
        return DatasetSubset(train, train_idx), DatasetSubset(copy.copy(train), held_idx)
    if not val_split:
        return train, None
    val_path = find_split(root, val_split) if name == '' and os.path.isdir(root) else None
    if name == '' and (val_path is None or os.path.realpath(val_path) == os.path.realpath(train.root)):
        where = (f'in {root} (looked for {" / ".join(_split_names(val_split))}, as folders or .tar)'
                 if os.path.isdir(root) else f'for {root}')
        raise UsageError(f'no validation split found {where}: pass --val-split FRACTION (e.g. 0.1: a seeded, '
                         f'class-stratified hold-out of the training images), add a val/ folder beside the training '
                         f'images, or --val-split "" to train without validation')
    # labelled by class name, as in the training set: a validation set without some class keeps the others' labels
    return train, create_image_dataset(name, root, val_split, what='validation set', **common,
                                       class_to_idx=train.class_to_idx if name == '' else None)


def dataset_source(ds) -> Optional[str]:
    """``folder PATH``, ``tar PATH`` or ``part of the folder PATH`` (a hold-out) for the log; None for others."""
    if isinstance(ds, DatasetSubset):
        parent = dataset_source(ds.dataset)
        return parent and f'part of the {parent}'
    return f'{"tar" if ds.is_tar else "folder"} {ds.root}' if isinstance(ds, ImageFileDataset) else None


# ------------------------------------------------------------------------------------------------ the demo data
def prepare_digits_folder(root: Optional[os.PathLike] = None, size: int = 32,
                          max_per_class: Optional[int] = None) -> Path:
    """The demo's data, no download: scikit-learn's digits written once as ``root/{train,val}/<digit>/<i>.png``
    (8x8 scans upscaled to ``size``; every 5th of a class in val; ``max_per_class`` first ones), under
    ``$MLP_VISION_CACHE`` or the user's cache by default. Renamed into place: a folder that exists is complete."""
    if root is None:
        cache = os.environ.get('MLP_VISION_CACHE') or os.path.join(
            os.environ.get('XDG_CACHE_HOME') or os.path.join('~', '.cache'), 'mlp_vision')
        root = Path(cache).expanduser() / (
            'digits' if size == 32 and max_per_class is None else f'digits_{size}px_{max_per_class or "all"}')
    root = Path(root)
    marker = root / 'DIGITS_CACHE'
    if marker.is_file():
        return root
    if root.exists():
        raise UsageError(f'{root} exists but is not a complete digits cache (no {marker.name} file); '
                         f'remove it and run again to rebuild it')
    from sklearn.datasets import load_digits  # a dependency, slow to import: only here
    digits = load_digits()
    images = np.round(digits.images * (255. / 16.)).astype(np.uint8)  # 0..16 scans
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f'.{root.name}-', dir=root.parent))
    try:
        for cls in range(10):
            for k, i in enumerate(np.flatnonzero(digits.target == cls)[:max_per_class]):
                folder = tmp / ('val' if k % 5 == 0 else 'train') / str(cls)
                folder.mkdir(parents=True, exist_ok=True)
                Image.fromarray(images[i]).resize((size, size), Image.BICUBIC).save(folder / f'{i:04d}.png')
        (tmp / marker.name).write_text(f'sklearn.datasets.load_digits (UCI handwritten digits, 8x8 scans) at '
                                       f'{size}x{size} bicubic, every 5th of a class in val, {max_per_class=}\n')
        try:
            os.rename(tmp, root)
        except OSError:
            if not marker.is_file():  # not a concurrent builder finishing first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


# ------------------------------------------------------------------------------------------------ loaders
def default_workers() -> int:
    """Loader processes by default: 4, at most the CPUs this process may use (more compete with the model)."""
    return max(1, min(4, usable_cpus()))


def _posterize(img: Image.Image, bits_to_keep: int, **kwargs) -> Image.Image:
    """timm's posterize; 0 bits give a black image, as in TF and older Pillow (recent Pillow raises mid-run)."""
    return timm_posterize(img, bits_to_keep, **kwargs) if bits_to_keep > 0 else Image.new(img.mode, img.size)


def _worker_init(worker_id: int) -> None:
    """timm's worker init, SIGINT and the first SIGTERM ignored: Ctrl-C and ``timeout`` signal the whole process group,
    and the main process stops at a step boundary and ends its workers itself (a worker killed first would end the run
    in a DataLoader traceback). A second SIGTERM (the main process's own ``terminate``) ends it: no wait forever."""
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
    """A ``DataLoader`` of ``(input, target)`` of the readable images: each skipped file warned once, those of a pass
    counted (:attr:`skipped`); a batch left with fewer than ``min_kept`` readable images (BatchNorm cannot normalise
    one) is left out, or ``empty_batch_error`` raised (DDP ranks must run the same steps). ``train_set``: a class
    none of whose images could be read stops the run after the pass."""

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
        counts = torch.tensor([[c[t] for t in range(len(names))] for c in (read, unusable)], device=self.device)
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
