""" Finding the images of an ImageFolder tree, each once, with the class folder it lies in.

timm's ``find_images_and_targets`` (``ReaderImageFolder``) walks with ``os.walk(followlinks=True)``: a symlink
loop in a class folder walks forever, or files copies of every image under the looping class; hidden files
(macOS' ``._<image>``) count as images. :func:`scan_folder` follows each link at most once, skips loops with a
warning naming them, counts an image reached by several paths once, refuses an image that links would put in two
classes, and leaves hidden files out; the labelling is :mod:`.reader`'s.

Nothing is left out unsaid (:class:`LeftOut`): an entry named like an image that is no regular file (a FIFO would
block ``open()`` forever, a device read endlessly; a broken link) is skipped with a warning, and files of image
formats outside timm's image extensions (which timm's readers drop silently) are counted in one warning.
"""
import collections
import functools
import logging
import os
from typing import Dict, List, Optional, Sequence, Set, Tuple

from PIL import Image

from timm.utils.misc import natural_key

from mlp_vision.errors import UsageError

__all__ = ['scan_folder', 'count_linked_images_once', 'is_hidden', 'is_image_name', 'LeftOut']

_logger = logging.getLogger(__name__)


def is_hidden(name: str) -> bool:
    return name.startswith('.')


def is_image_name(name: str, extensions: Set[str]) -> bool:
    return not is_hidden(name) and os.path.splitext(name)[1].lower() in extensions


@functools.lru_cache(maxsize=1)
def _image_format_extensions() -> frozenset:
    """Extensions of the image formats PIL knows (``.bmp``, ``.gif``, ``.tif``, ``.webp``, ...), and HEIF's."""
    return frozenset(Image.registered_extensions()) | {'.heic', '.heif'}


# formats whose files may hold several images, of which load_image reads the first
_MULTI_FRAME = ('.gif', '.tif', '.tiff', '.webp', '.apng', '.mpo', '.ico')


class LeftOut:
    """What a scan did not read, for one warning each at its end: entries named like images that are no regular
    file (their relative paths), and files of image formats outside the extensions read (counted by extension)."""

    def __init__(self, extensions: Set[str]):
        self.extensions = extensions
        self.not_regular: List[str] = []
        self.other_formats: collections.Counter = collections.Counter()

    def note_other_file(self, name: str) -> None:
        ext = os.path.splitext(name)[1].lower()
        if not is_hidden(name) and ext in _image_format_extensions() and ext not in self.extensions:
            self.other_formats[ext] += 1

    def warn(self, where: str) -> None:
        if self.not_regular:
            _logger.warning(f'{where}: skipped {len(self.not_regular)} entries named like images that are not regular '
                            f'files (FIFOs, devices, sockets or broken links; e.g. {self.not_regular[0]}): only '
                            f'regular files are read as images')
        if self.other_formats:
            counts = ', '.join(f'{n} {ext}' for ext, n in sorted(self.other_formats.items()))
            frames = [e for e in self.other_formats if e in _MULTI_FRAME]
            _logger.warning(
                f'{where}: left out {sum(self.other_formats.values())} image files of other formats ({counts}): only '
                f'{" ".join(sorted(self.extensions))} files are read (timm\'s image extensions); convert them, or add '
                f'their extensions in Python with timm.data.set_img_extensions' +
                (f' ({"/".join(sorted(frames))} files with several frames are then read by their first frame only)'
                 if frames else ''))


def _contains(folder: str, path: str) -> bool:
    """Whether the real path ``path`` is ``folder`` or lies below it."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


class _FolderScan:
    """The images of an ImageFolder tree, symlinks followed at most once (see :func:`scan_folder`)."""

    def __init__(self, root: str, extensions: Set[str]):
        self.root, self.extensions = root, extensions
        self.root_real = os.path.realpath(root)
        self.class_real: Dict[str, str] = {}  # class folder name -> its real path
        self.left_out = LeftOut(extensions)

    def _warn_skipped(self, rel: str, target: str, why: str) -> None:  # each link is met once: one warning
        _logger.warning(f'{self.root}: skipped the symlink {rel} -> {target}: {why}')

    def class_folders(self) -> List[str]:
        """Loose images in the root (the caller refuses them); fills :attr:`class_real` with the class folders
        (a link to the root or a folder above it left out: a loop)."""
        loose = []
        with os.scandir(self.root) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if is_hidden(entry.name):
                    continue
                if not entry.is_dir():
                    if is_image_name(entry.name, self.extensions):
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
        return loose

    @staticmethod
    def _enclosing_class(real: str, owners: Dict[str, str]) -> Optional[str]:
        """``<class>/<path>`` when the real path ``real`` lies, not hidden, below the real folder of a class."""
        parent = os.path.dirname(real)
        while parent != os.path.dirname(parent):
            if parent in owners:
                rel = os.path.relpath(real, parent).replace(os.sep, '/')
                return None if any(is_hidden(part) for part in rel.split('/')) else f'{owners[parent]}/{rel}'
            parent = os.path.dirname(parent)
        return None

    def walk_class(self, name: str) -> Tuple[List[str], List[Tuple[str, str]]]:
        """(images of the class's own folder tree, ``(relative path, real path)`` of those reached through
        symlinks): the class folder's own tree first (links not followed), then the tree of each link found, in
        turn; every real folder is read once, so the walk ends."""
        read = {self.class_real[name]: name}  # real folder -> the relative path it was read as
        own, linked = [], []
        trees = [(self.class_real[name], name, True)]
        for base_real, base_rel, is_own in trees:  # a link's tree is appended to the list as it is found
            links = []
            stack = [(base_real, base_rel)]
            while stack:
                folder_real, folder_rel = stack.pop()
                with os.scandir(folder_real) as entries:
                    for entry in sorted(entries, key=lambda e: e.name):
                        if is_hidden(entry.name):
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
                        elif not is_image_name(entry.name, self.extensions):
                            self.left_out.note_other_file(entry.name)
                        elif not entry.is_file():  # follows links: a FIFO or device, or a link to one or nothing
                            self.left_out.not_regular.append(rel)
                        elif is_own and not entry.is_symlink():
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


def count_linked_images_once(where: str, own: List[str], linked: Sequence[Tuple[str, str, Optional[str]]]) -> List[str]:
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


def scan_folder(root: str, extensions: Set[str]) -> List[str]:
    """Image paths under ``root`` relative to it ('/'-separated), hidden files and folders left out.

    A class folder may be a link, and a link inside one adds the images it reaches to that class, but a link to a
    folder that contains it (a loop), to the dataset root, or to a folder already read for the class is skipped
    with a warning naming it. A file reached by several paths of one class is counted once; a file that is an
    image of two classes is a :class:`UsageError` (no label is right for both). Hard links are files of their own,
    as copies would be.
    """
    scan = _FolderScan(root, extensions)
    paths = scan.class_folders()
    own_real, reached = {}, []  # {real path of an image of its own class folder: its relative path}, links
    for name in sorted(scan.class_real, key=natural_key):
        own, linked = scan.walk_class(name)
        paths += own
        own_real.update((os.path.join(scan.class_real[name], *rel.split('/')[1:]), rel) for rel in own)
        reached += linked
    scan.left_out.warn(root)
    return count_linked_images_once(root, paths, [(rel, real, own_real.get(real)) for rel, real in reached])

