""" Finding the images of an uncompressed tar (or a tar of per-class tars) without extracting it.

timm's ``ReaderImageTar`` reads through ``tarfile`` in each worker, drops link members silently (a tar made from
a folder with symlinks loses those images), and ``tarfile`` stops quietly at a truncated member, so a cut-off
download trains on part of the data. :func:`scan_tar` lists each image's byte range in the file (one seek reads it
in any process), reads link members as the folder the tar came from would be read, and stops with one line on a
truncated or corrupt tar.
"""
import os
import posixpath
import tarfile
from typing import Dict, Set, Tuple

from mlp_vision.errors import UsageError
from mlp_vision.training.data.reader_folder import LeftOut, is_hidden, is_image_name

__all__ = ['scan_tar']


def _tar_member_name(name: str) -> str:
    return '/'.join(part for part in name.split('/') if part not in ('', '.'))


def _resolve_tar_links(path: str, where: str, regular: Dict[str, Tuple[int, int]], symlinks: Dict[str, str],
                       hardlinks: Dict[str, str]) -> Tuple[Dict[str, Tuple[int, int]], Dict[str, str]]:
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


def scan_tar(path: str, extensions: Set[str]) -> Tuple[Dict[str, Tuple[int, int]], Dict[str, str]]:
    """(``{member path: (byte offset of its data in the file, size)}`` of the images of an uncompressed tar,
    ``{symlink member: the member it reaches}`` of those that are symlinks).

    Images inside tars inside the tar (ImageNet's train tar holds one tar per class) are listed as
    ``<inner tar name without .tar>/<member path>``, with offsets in the outer file. A hard-link member is an image
    of its own with its file's data (as a hard-linked file in a folder); a symlink member reads the member it
    points to (:func:`_resolve_tar_links`). A truncated or corrupt tar raises a :class:`UsageError` naming it.
    """
    images: Dict[str, Tuple[int, int]] = {}
    links: Dict[str, str] = {}
    file_size = os.path.getsize(path)
    left_out = LeftOut(extensions)

    def scan(tf: tarfile.TarFile, base: int, prefix: str, where: str):
        regular, symlinks, hardlinks = {}, {}, {}
        for ti in tf:
            name = _tar_member_name(ti.name)
            if ti.issym() and not any(is_hidden(part) for part in name.split('/')):
                symlinks[name] = ti.linkname
            elif ti.islnk():
                hardlinks[name] = ti.linkname
            elif (ti.isfifo() or ti.ischr() or ti.isblk()) and is_image_name(name.rsplit('/', 1)[-1], extensions):
                left_out.not_regular.append(where + name)
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
            if not is_image_name(parts[-1], extensions) or any(is_hidden(part) for part in parts):
                if not any(is_hidden(part) for part in parts[:-1]):
                    left_out.note_other_file(parts[-1])
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
    left_out.warn(f'image tar {path}')
    return images, links

