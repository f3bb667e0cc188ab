""" What the commands write, and how: a run's own files (never through a link or into a FIFO / device) through a
temporary name, so a kill leaves the previous file or the complete new one (:func:`atomic_write` and its kin); an
output path the user gave as any Unix tool writes it (:func:`write_output_file`); the log.
"""
import contextlib
import json
import logging
import os
import shutil
import stat
import sys
from pathlib import Path
from typing import Any, Callable, List, Optional, Union

import torch

from mlp_vision.errors import UsageError, find_os_error

__all__ = ['open_own_file', 'temp_path', 'clean_stale_temp_files', 'atomic_write', 'atomic_save', 'atomic_write_text',
           'atomic_folder', 'atomic_link', 'keep_previous', 'output_kind', 'write_output_file', 'json_text',
           'setup_logging', 'add_log_file', 'remove_log_file']

_TMP_TAG = '.tmp-'
_OWN_FILES = 'a run writes only files of its own: remove it, or continue in a new folder with --output / --experiment'


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # makes the rename itself durable (POSIX); not possible on every platform
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def open_own_file(path: os.PathLike, flags: int) -> int:
    """``os.open(path, flags)`` for a file a run writes, never through a link planted in its folder (``O_NOFOLLOW``)
    nor into a FIFO, device or socket (opened non-blocking, then checked): else a :class:`UsageError` naming it."""
    try:
        fd = os.open(path, flags | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_NONBLOCK', 0), 0o644)
    except OSError:
        if os.path.islink(path):  # O_NOFOLLOW's ELOOP
            raise UsageError(f'{path} is a symbolic link; {_OWN_FILES}') from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(f'{path} is not a regular file (a FIFO, device or socket); {_OWN_FILES}')
    if hasattr(os, 'O_NONBLOCK'):
        os.set_blocking(fd, True)
    return fd


def temp_path(path: os.PathLike) -> Path:
    """The temporary name of an atomic write of ``path``: ``.<name>.tmp-<pid>`` beside it."""
    return Path(path).with_name(f'.{Path(path).name}{_TMP_TAG}{os.getpid()}')


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's process, or no valid pid: left alone
        pass
    return True


def clean_stale_temp_files(folder: os.PathLike) -> List[Path]:
    """Remove (and return) the temporary files (:func:`temp_path`) of dead processes in ``folder``; a folder a killed
    :func:`atomic_folder` had moved aside, its place still empty, is moved back instead (it holds a user's files)."""
    removed = []
    for p in sorted(Path(folder).glob(f'.*{_TMP_TAG}*')):
        name, pid = p.name[1:].rsplit(_TMP_TAG, 1)
        if pid.isdigit() and not _pid_alive(int(pid)):
            home = p.with_name(name[:-len('.old')])
            if name.endswith('.old') and p.is_dir() and not p.is_symlink() and not os.path.lexists(home):
                os.replace(p, home)  # killed between atomic_folder's two renames
                logging.getLogger(__name__).warning(f'{home} restored from {p.name}, moved aside by a process killed '
                                                    f'while replacing it')
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)  # an export (:func:`atomic_folder`) a killed run left half-done
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def atomic_write(path: os.PathLike, write: Callable[[Any], None]) -> None:
    """``write(f)`` into a binary file of our own (:func:`temp_path`), fsync, ``os.replace`` onto ``path``: a reader
    (or a kill) sees the previous file or the complete new one; a failed write (an ``OSError`` naming ``path``)
    leaves the previous file and no temporary file."""
    path, tmp = Path(path), temp_path(path)
    try:
        tmp.unlink(missing_ok=True)  # this process's own name: a leftover (or a planted link) goes first
        with open(open_own_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL), 'wb') as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as e:
        # name the file being written, not our temporary one (torch's serializer may also wrap the file's error)
        os_error = find_os_error(e)
        if os_error is not None and (os_error is not e or not e.filename or e.filename == str(tmp)):
            raise OSError(os_error.errno, os_error.strerror, str(path)) from e
        raise
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def atomic_save(obj: Any, path: os.PathLike) -> None:
    atomic_write(path, lambda f: torch.save(obj, f))


def atomic_write_text(path: os.PathLike, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode('utf-8')))


def keep_previous(path: os.PathLike) -> Optional[Path]:
    """Rename a regular file ``path`` to the first free ``<stem>-<n><suffix>`` and return that (None: no file), so a
    later write of ``path`` loses nothing; anything else there (a link, FIFO, folder) is a :class:`UsageError`."""
    path = Path(path)
    if not os.path.lexists(path):
        return None
    if not stat.S_ISREG(os.lstat(path).st_mode):
        raise UsageError(f'{path} is not a regular file; only a regular file is kept under a new name')
    n = 1
    while os.path.lexists(kept := path.with_name(f'{path.stem}-{n}{path.suffix}')):
        n += 1
    os.replace(path, kept)
    return kept


def output_kind(path: os.PathLike) -> str:
    """What an output path names, through its links: ``'new'`` (nothing, or a link to nothing), ``'regular'``,
    ``'stream'`` (a FIFO or device), ``'folder'`` or ``'socket'``."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return 'new'
    if stat.S_ISREG(mode):
        return 'regular'
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return 'stream'
    return 'folder' if stat.S_ISDIR(mode) else 'socket'


def _through_proc(path: str) -> bool:
    """Whether the link ``path`` leads through ``/proc/<pid>/fd`` (``/dev/stdout``, ``/dev/fd/N``): an open
    descriptor of this process, not a file name to replace."""
    for _ in range(40):  # the kernel's own limit of links in a row
        if os.path.realpath(os.path.dirname(path) or '.').startswith('/proc/'):
            return True
        if not os.path.islink(path):
            return False
        path = os.path.join(os.path.dirname(path), os.readlink(path))
    return False


def _write_in_place(path: str, data: bytes, append: bool = False) -> bool:
    """Write ``data`` into ``path`` opened as it is (never created, truncated or renamed), as a shell's ``>`` does
    to a device or FIFO; False, nothing written, when it is (now) a regular file or gone and not ``append``."""
    try:
        fd = os.open(path, os.O_WRONLY | getattr(os, 'O_NOCTTY', 0) | (os.O_APPEND if append else 0))
    except FileNotFoundError:
        return False
    try:
        with open(fd, 'wb') as f:
            if stat.S_ISREG(os.fstat(fd).st_mode) and not append:
                return False
            f.write(data)
    except OSError as e:  # a full device (/dev/full), a reader gone (a closed pipe): name the path
        raise OSError(e.errno, e.strerror, path) from e
    return True


def write_output_file(path: os.PathLike, data: Union[str, bytes], keep: bool = False) -> Optional[Path]:
    """Write ``data`` (a str as UTF-8) to an output path the user gave, as any Unix tool would: a FIFO or device as
    it is; a regular file (``keep``: the earlier one kept by :func:`keep_previous`, whose name is returned) or a new
    name by :func:`atomic_write`; a link's target by these rules (through ``/dev/stdout``: appended); a folder or
    socket: a :class:`UsageError`."""
    path = os.fspath(path)
    data = data.encode('utf-8') if isinstance(data, str) else bytes(data)
    kind, is_link = output_kind(path), os.path.islink(path)
    if kind in ('folder', 'socket'):
        raise UsageError(f'{path} is a {kind}; expected a file path (a new or regular file, a FIFO or a device)')
    append = kind == 'regular' and is_link and _through_proc(path)
    if (kind == 'stream' or append) and _write_in_place(path, data, append):
        return None
    target = Path(os.path.realpath(path) if is_link else path)  # the link itself is never replaced
    kept = keep_previous(target) if keep else None
    atomic_write(target, lambda f: f.write(data))
    return kept


@contextlib.contextmanager
def atomic_folder(path: os.PathLike):
    """Write a folder (a ``save_pretrained`` export) atomically: the block fills the temporary folder it is given,
    which then replaces ``path`` (a failure inside leaves ``path`` as it was); the earlier folder's other files (a
    user's model card) are copied into it first: only the export's own files are replaced."""
    path, tmp = Path(path), temp_path(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if path.is_dir() and not path.is_symlink():  # the earlier folder's other entries (links as links)
            shutil.copytree(path, tmp, symlinks=True, dirs_exist_ok=True, ignore=lambda folder, names: [
                n for n in names if folder == str(path) and os.path.lexists(tmp / n)])
        old = temp_path(path.with_name(path.name + '.old'))
        if path.exists():
            os.replace(path, old)  # a folder cannot be renamed over a non-empty one: move the old export away first
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _fsync_dir(path.parent)


def atomic_link(src: os.PathLike, dst: os.PathLike) -> None:
    """Make ``dst`` a hard link to ``src`` atomically (a copy by :func:`atomic_write` where links fail)."""
    src, dst, tmp = Path(src), Path(dst), temp_path(dst)
    tmp.unlink(missing_ok=True)  # a leftover, or a planted (even dangling) link, goes first
    try:
        os.link(src, tmp)
    except OSError:
        with open(src, 'rb') as source:
            atomic_write(dst, lambda f: shutil.copyfileobj(source, f))
        return
    try:
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(dst.parent)


def json_text(obj: Any) -> str:
    """The text of every results JSON file: indented, keys in their order, other values as ``str``."""
    return json.dumps(obj, indent=2, sort_keys=False, default=str) + '\n'


# ------------------------------------------------------------------------------------------------ the log
# Not timm's setup_default_logging: it adds a stderr handler at every call (a second in-process run prints each line
# twice), and its RotatingFileHandler opens train.log by name (through a planted link) and renames it away at 2 MB,
# where a resumed run continues the one train.log.
class _StdoutHandler(logging.StreamHandler):
    stream = property(lambda self: sys.stdout, lambda self, value: None)  # stdout at the time (pytest swaps it)


def setup_logging(primary: bool = True) -> None:
    """One plain-message stdout handler on the root logger (idempotent across in-process runs)."""
    root = logging.getLogger()
    if not any(isinstance(h, _StdoutHandler) for h in root.handlers):
        root.addHandler(_StdoutHandler())  # logging's default format: the message
    root.setLevel(logging.INFO if primary else logging.WARNING)


def add_log_file(path: Path) -> logging.StreamHandler:
    """Also log to ``path``, a file of its own (:func:`open_own_file`), appending: a resumed run continues it."""
    handler = logging.StreamHandler(open(open_own_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), 'a',
                                         encoding='utf-8'))
    handler.setFormatter(logging.Formatter('%(asctime)s %(message)s', datefmt='%Y-%m-%d %H:%M:%S'))
    logging.getLogger().addHandler(handler)
    return handler


def remove_log_file(handler: logging.StreamHandler) -> None:
    logging.getLogger().removeHandler(handler)
    handler.close()
    handler.stream.close()
