""" A run folder and what makes it one run's: its identity, its lock, its own files, and the newest position it holds.

Every folder a trainer creates holds ``run.json`` (``{"run_id": <32 hex digits>, "kind": "image" | "text"}``), and
every checkpoint it writes carries the same ``run_id``. ``--resume`` continues *in place* only when, under the
folder's lock (re-read after taking it), the folder is the checkpoint's run and holds nothing newer
(:func:`newer_than`); otherwise in a new folder, so nothing of another run, or of a folder that is no run, is
replaced. The lock is a POSIX record lock on ``.lock`` (not ``flock``: forked data-loader workers do not inherit
it, so a killed run's orphaned workers cannot keep its folder locked).
"""
import contextlib
import csv
import itertools
import json
import os
import re
import stat
import uuid
from pathlib import Path
from typing import Optional

import torch

from mlp_vision.errors import UsageError
from mlp_vision.training.run.checkpoint import atomic_write_text, open_own_file
from mlp_vision.training.run.summary import SummaryWriter

__all__ = ['RUN_FILE', 'new_run_folder', 'write_run_id', 'read_run_id', 'is_run_id', 'FolderLock', 'check_own_files',
           'saved_position', 'newer_than']

RUN_FILE = 'run.json'
_RUN_ID = re.compile(r'[0-9a-f]{32}')


def new_run_folder(root: os.PathLike, name: str) -> Path:
    """``root/name``, or the first free ``root/name-N``, created here (``mkdir`` is atomic: two runs started at once
    never share one)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for n in itertools.count():
        folder = root / (name if n == 0 else f'{name}-{n}')
        with contextlib.suppress(FileExistsError):
            folder.mkdir()
            return folder


def is_run_id(value) -> bool:
    return isinstance(value, str) and _RUN_ID.fullmatch(value) is not None


def write_run_id(folder: Path, kind: str) -> str:
    """Give the new run in ``folder`` its identity (``run.json``); returns the id."""
    run_id = uuid.uuid4().hex
    atomic_write_text(folder / RUN_FILE, json.dumps({'run_id': run_id, 'kind': kind}) + '\n')
    return run_id


def read_run_id(folder: Path) -> Optional[str]:
    """The id in ``folder/run.json``, or None when the folder is not a run: no such file, a link, not a regular file,
    larger than any we write, or not our format."""
    path = folder / RUN_FILE
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > 4096:
            return None
        run_id = json.loads(path.read_text()).get('run_id')
    except (OSError, ValueError, AttributeError):
        return None
    return run_id if is_run_id(run_id) else None


class FolderLock:
    """An exclusive lock on ``folder/.lock`` held until :meth:`release`; a folder another process holds is refused
    (two processes writing one run would interleave its checkpoints and logs)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._fd: Optional[int] = None
        try:
            import fcntl
        except ImportError:  # Windows: no advisory locks here
            return
        fd = open_own_file(folder / '.lock', os.O_RDWR | os.O_CREAT)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 32).decode(errors='replace').strip()
            os.close(fd)
            raise UsageError(f'{folder} is in use by another training process (pid {holder or "unknown"}); wait for '
                             f'it to end, or pass --output / --experiment to continue in a new folder') from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = None


def check_own_files(folder: Path) -> None:
    """Refuse (one line) a run folder holding a symbolic link, FIFO, device or socket: the run would write through
    it (a linked ``train.log`` appends to a file elsewhere) or block on it."""
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_symlink():
                what = 'a symbolic link'
            elif not (entry.is_file(follow_symlinks=False) or entry.is_dir(follow_symlinks=False)):
                what = 'not a regular file (a FIFO, device or socket)'
            else:
                continue
            raise UsageError(f'{folder} holds {entry.name}, {what}; a run writes only files of its own: remove it, '
                             f'or continue in a new folder with --output / --experiment')


def saved_position(path: Path, key: str):
    """(the ``key`` position stored in checkpoint ``path``, its ``run_id``), memory-mapped (tensors are not read);
    (None, None) if the file cannot be read as one of ours."""
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True, mmap=True)
    except Exception:  # any unreadable file: the caller then keeps the folder as it is
        return None, None
    if not isinstance(ckpt, dict):
        return None, None
    position = ckpt.get(key)
    return (position if isinstance(position, int) and not isinstance(position, bool) else None), ckpt.get('run_id')


def newer_than(folder: Path, key: str, position: int, run_id: Optional[str]) -> Optional[str]:
    """Why ``folder`` may not continue in place from the checkpoint of run ``run_id`` at ``position``, or None when
    it may: the folder is that run and its newest position -- ``last.pth``'s, else that of its ``checkpoint-N.pth``
    files and ``summary.csv`` rows -- is ``position`` (rows past ``last.pth`` are dropped on resume)."""
    folder_id = read_run_id(folder)
    if not is_run_id(run_id):
        return 'the checkpoint carries no run id (it was written before runs had one, or elsewhere)'
    if folder_id is None:
        return f'{folder} is not a run folder (no readable {RUN_FILE})'
    if folder_id != run_id:
        return f'{folder} is another run (run id {folder_id[:8]}, the checkpoint\'s {run_id[:8]})'
    last = folder / 'last.pth'
    if last.exists() or last.is_symlink():
        later, last_id = saved_position(last, key)
        if later is None:
            return f'{folder} has a last.pth that cannot be read'
        if last_id != run_id:
            return f'{folder}\'s last.pth belongs to another run'
        return f'{folder} has reached {key} {later}' if later > position else None
    files = [int(m.group(1)) for p in folder.glob('checkpoint-*.pth')
             if (m := re.fullmatch(r'checkpoint-(\d+)\.pth', p.name))]  # the names CheckpointManager.file_name gives
    try:
        rows = [int(r[key]) for r in SummaryWriter(folder / 'summary.csv', key=key).read()
                if str(r.get(key, '')).isdigit()]
    except (OSError, csv.Error, UnicodeDecodeError):
        return f'{folder} has no last.pth and a summary.csv that cannot be read'
    later = max(files + rows, default=position)
    return (f'{folder} has no last.pth but has reached {key} {later} (its checkpoint-N.pth files and summary rows)'
            if later > position else None)

