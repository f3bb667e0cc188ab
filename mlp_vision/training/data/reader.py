""" The image folder / tar dataset: where the images of a split are and which class each belongs to, as a timm
``Reader`` over :mod:`.reader_folder` / :mod:`.reader_tar`, and timm's ``ImageDataset`` over that reader.

:class:`ImageFileReader` differs from timm's folder / tar readers in what it labels: an image belongs to the class
folder it lies in, at any depth below it (timm: its leaf folder); an image outside any class folder is an error
(timm: class ''); a ``val.tar`` holding ``val/<class>/`` is read like ``val/`` itself. :func:`find_split` finds a
split as a folder or a tar under timm's synonyms of its name (timm's ``_search_split`` finds folders only).

timm's ``ImageDataset.__getitem__`` converts with ``Image.convert`` (wrong for 16-bit, float and premultiplied
images) and, when an image fails to load, returns the next sample in its place, so a corrupt file silently doubles
another image in training and in the metrics. :class:`ImageFileDataset` decodes with :func:`.decode.load_image`
and returns an image that cannot be used as a :class:`.decode.SkippedImage`, never replaced.
"""
import io
import os
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from timm.data import ImageDataset
from timm.data.readers.img_extensions import get_img_extensions
from timm.data.readers.reader import Reader
from timm.utils.misc import natural_key

from mlp_vision.errors import UsageError
from mlp_vision.training.data.class_map import read_class_map
from mlp_vision.training.data.decode import SkippedImage, load_image
from mlp_vision.training.data.reader_folder import count_linked_images_once, scan_folder
from mlp_vision.training.data.reader_tar import scan_tar

__all__ = ['SPLIT_SYNONYMS', 'find_split', 'split_names', 'split_entries', 'ImageFileReader', 'ImageFileDataset']

# timm's split synonyms (timm.data.dataset_factory): a split asked for by one name is found under any of them
SPLIT_SYNONYMS = (('train', 'training'), ('validation', 'val', 'valid', 'eval', 'evaluation'))


def split_names(split: str) -> List[str]:
    base = split[:-len('.tar')] if split.lower().endswith('.tar') else split
    names = [split]
    for group in SPLIT_SYNONYMS:
        if base in group:
            names += [s for s in group if s not in names]
    return names


def find_split(root: str, split: str) -> Optional[str]:
    """The folder or image tar that holds ``split`` in the folder ``root``, or None: ``root/<split>`` (a folder, or
    a tar when ``split`` ends in ``.tar``), else ``root/<split>.tar``, tried for ``split`` then timm's synonyms."""
    for name in split_names(split):
        path = os.path.join(root, name)
        if os.path.isdir(path) or (os.path.isfile(path) and path.lower().endswith('.tar')):
            return path
        if os.path.isfile(path + '.tar'):
            return path + '.tar'
    return None


def split_entries(root: str) -> List[str]:
    """Entries of ``root`` named like a split (any synonym, folder or ``.tar``), for messages and fallbacks."""
    names = {s for group in SPLIT_SYNONYMS for s in group}
    return sorted(e + ('/' if os.path.isdir(os.path.join(root, e)) else '') for e in os.listdir(root)
                  if (e[:-4] if e.lower().endswith('.tar') else e) in names)


def _samples_by_class(paths: Sequence[str], class_to_idx: Optional[Dict[str, int]],
                      where: str) -> Tuple[List[Tuple[str, int]], Dict[str, int], List[str]]:
    """(``(path, target)`` in natural order, class_to_idx, classes left out) of relative image paths
    ``<class>/<any sub-folders>/<image>``, labelled by their first folder. With a given ``class_to_idx`` images of
    other classes are left out, as in timm; the caller decides whether that is an error."""
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


def _strip_split_folder(paths: Sequence[str], tar_path: str) -> Tuple[List[str], str]:
    """(paths, prefix dropped or '') without a leading folder every image of a tar shares when it names the split
    (``val.tar`` holding ``val/<class>/<image>``, as imagenette's tars do), so that class folders come first."""
    if not paths:
        return list(paths), ''
    first = paths[0].split('/', 1)[0]
    split_names = {os.path.splitext(os.path.basename(tar_path))[0]} | {s for g in SPLIT_SYNONYMS for s in g}
    if first in split_names and all(p.startswith(first + '/') and p.count('/') >= 2 for p in paths):
        return [p[len(first) + 1:] for p in paths], first + '/'
    return list(paths), ''


class ImageFileReader(Reader):
    """The labelled images of an ImageFolder tree or an uncompressed image tar, as a timm reader:
    ``reader[index]`` is ``(open binary file, target)``.

    Layout: ``root/<class>/<image>``, or the same paths inside ``root`` = ``<name>.tar`` (optionally below one
    folder named like the split, ``val/<class>/<image>``; a tar of per-class tars ``<class>.tar`` works too).
    Images in sub-folders of a class folder belong to that class; hidden files and folders are ignored. Symlinks
    (folder) and link members (tar): see :func:`.reader_folder.scan_folder` and :func:`.reader_tar.scan_tar`.
    Classes are sorted in natural order (as timm); extensions are timm's (``timm.data.set_img_extensions``).
    ``class_to_idx`` (or a ``class_map``, which wins) labels classes by name; folders of other classes are left
    out and listed in :attr:`other_classes`.
    """

    def __init__(
            self,
            root: str,
            class_map: Optional[Union[str, Dict[str, int]]] = None,
            class_to_idx: Optional[Dict[str, int]] = None,
    ):
        super().__init__()
        self.root = root
        if class_map:
            class_to_idx = read_class_map(class_map, os.path.dirname(root) if os.path.isfile(root) else root)
        extensions = set(get_img_extensions(as_set=True))
        self.is_tar = os.path.isfile(root)
        if self.is_tar:
            members, links = scan_tar(root, extensions)
            paths, self._prefix = _strip_split_folder(list(members), root)
            self._offsets = {p: members[self._prefix + p] for p in paths}
            paths = count_linked_images_once(root, *self._tar_linked_images(paths, links))
        else:
            paths, self._prefix, self._offsets = scan_folder(root, extensions), '', None
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

    def __getitem__(self, index: int) -> Tuple[io.IOBase, int]:
        path, target = self.samples[index]
        if not self.is_tar:
            return open(os.path.join(self.root, path), 'rb'), target
        if self._file_pid != os.getpid():  # a forked / spawned worker opens its own handle
            self._file, self._file_pid = open(self.root, 'rb'), os.getpid()
        offset, size = self._offsets[path]
        self._file.seek(offset)
        data = self._file.read(size)
        if len(data) != size:
            raise EOFError(f'{size - len(data)} bytes missing at the end of the file')
        return io.BytesIO(data), target

    def _filename(self, index: int, basename: bool = False, absolute: bool = False) -> str:
        """A file path, or ``<tar path>:<member path>`` (``absolute``: the root made absolute; ``basename``: the
        file / member name only)."""
        path = self.samples[index][0]
        if basename:
            return path.rsplit('/', 1)[-1]
        root = os.path.abspath(self.root) if absolute else self.root
        return f'{root}:{self._prefix}{path}' if self.is_tar else os.path.join(root, path)

    def __getstate__(self):
        state = self.__dict__.copy()
        state['_file'] = state['_file_pid'] = None
        return state


class ImageFileDataset(ImageDataset):
    """Labelled images of an ImageFolder tree or an uncompressed image tar (``--dataset ''``), read by
    :class:`ImageFileReader` (its ``samples``, ``class_to_idx``, ``other_classes``, ``is_tar`` are this dataset's).

    ``__getitem__`` returns ``(transform(image), target)``, or a :class:`.decode.SkippedImage` when the image
    cannot be used (see :func:`.decode.load_image`): the loaders of this package leave those out and count them.
    """

    def __init__(
            self,
            root: str,
            class_map: Optional[Union[str, Dict[str, int]]] = None,
            class_to_idx: Optional[Dict[str, int]] = None,
            input_img_mode: Optional[str] = 'RGB',
            transform: Optional[Callable] = None,
    ):
        reader = ImageFileReader(root, class_map=class_map, class_to_idx=class_to_idx)
        super().__init__(root, reader=reader, input_img_mode=input_img_mode, transform=transform)
        self.root = root
        self.samples, self.class_to_idx = reader.samples, reader.class_to_idx
        self.other_classes, self.is_tar = reader.other_classes, reader.is_tar

    def __getitem__(self, index: int):
        try:
            fp, target = self.reader[index]
            with fp:
                img = load_image(fp, self.input_img_mode, self.filename(index))
        except Exception as e:  # any decode failure skips this image only (KeyboardInterrupt etc. pass)
            return SkippedImage(self.filename(index), f'{type(e).__name__}: {e}')
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target
