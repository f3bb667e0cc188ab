""" Checkpoints: atomic writes, last / best / top-N bookkeeping that survives a resume, RNG state capture.

Our training checkpoints (:mod:`.run_files` writes them) are dicts of tensors and plain Python values, so they
load with ``torch.load(weights_only=True)``; :mod:`mlp_vision.weights` reads them (and every other weights file).
"""
import contextlib
import logging
import math
import os
import random
import shutil
import stat
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import numpy as np
import torch

from mlp_vision.errors import UsageError, find_os_error, short_repr
from mlp_vision.weights import TRUST_FLAG

__all__ = [
    'CHECKPOINT_VERSION', 'TRUST_FLAG', 'open_own_file', 'temp_path', 'clean_stale_temp_files', 'atomic_write',
    'atomic_save', 'atomic_write_text', 'atomic_folder', 'atomic_link', 'keep_previous', 'output_kind',
    'write_output_file', 'CheckpointManager', 'check_settings_state', 'check_optimizer_state', 'get_rng_state',
    'set_rng_state', 'check_rng_state', 'preserve_rng', 'is_count',
]

_logger = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1
_TMP_TAG = '.tmp-'


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # makes the rename itself durable (POSIX); not possible on every platform
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def open_own_file(path: os.PathLike, flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags)`` for a file a run writes: never through a symbolic link (``O_NOFOLLOW``) and never
    into a FIFO, device or socket (opened non-blocking, then checked), so a link planted in a run folder cannot make
    the run write to a file elsewhere. Returns the descriptor; otherwise a :class:`UsageError` naming the file."""
    path = Path(path)
    try:
        fd = os.open(path, flags | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_NONBLOCK', 0), mode)
    except OSError as e:
        if path.is_symlink():  # O_NOFOLLOW's ELOOP
            raise UsageError(f'{path} is a symbolic link; a run writes only files of its own, never through a link: '
                             f'remove it, or continue in a new folder with --output / --experiment') from None
        if e.filename is None:
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(f'{path} is not a regular file (a FIFO, device or socket); a run writes only regular files '
                         f'of its own: remove it, or continue in a new folder with --output / --experiment')
    if hasattr(os, 'O_NONBLOCK'):
        os.set_blocking(fd, True)
    return fd


def temp_path(path: os.PathLike) -> Path:
    """The temporary name of an atomic write of ``path``: ``.<name>.tmp-<pid>`` beside it."""
    path = Path(path)
    return path.with_name(f'.{path.name}{_TMP_TAG}{os.getpid()}')


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's process, or no valid pid: left alone
        pass
    return True


def clean_stale_temp_files(folder: os.PathLike) -> List[Path]:
    """Remove the temporary files (:func:`temp_path`) that killed processes left in ``folder``; returns them. A
    file whose process still runs (another writer, or this process) is left alone."""
    removed = []
    for p in sorted(Path(folder).glob(f'.*{_TMP_TAG}*')):
        pid = p.name.rsplit(_TMP_TAG, 1)[-1]
        if pid.isdigit() and not _pid_alive(int(pid)):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)  # an export (:func:`atomic_folder`) a killed run left half-done
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def atomic_write(path: os.PathLike, write: Callable[[Any], None], mode: str = 'wb') -> None:
    """``write(f)`` into a file of our own named :func:`temp_path`, flush + fsync, then ``os.replace`` onto
    ``path``: a reader (or a run killed at any point) sees the previous file or the complete new one, and a failed
    write (a full disk: an ``OSError`` naming ``path``) leaves the previous file and no temporary file behind."""
    path, tmp = Path(path), temp_path(path)
    try:
        tmp.unlink(missing_ok=True)  # this process's own name: a leftover (or a planted link) goes first
        fd = open_own_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with open(fd, mode, **({} if 'b' in mode else {'newline': '', 'encoding': 'utf-8'})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as e:
        os_error = find_os_error(e)  # torch's serializer may wrap the file's error; name the file being written
        if os_error is not None and (os_error is not e or not e.filename):
            raise OSError(os_error.errno, os_error.strerror, str(path)) from e
        raise
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def atomic_save(obj: Any, path: os.PathLike) -> None:
    """``torch.save(obj)`` to ``path`` by :func:`atomic_write`."""
    atomic_write(path, lambda f: torch.save(obj, f))


def atomic_write_text(path: os.PathLike, text: str) -> None:
    """``text`` (UTF-8) to ``path`` by :func:`atomic_write`."""
    atomic_write(path, lambda f: f.write(text), mode='w')


def keep_previous(path: os.PathLike) -> Optional[Path]:
    """Rename an existing regular file ``path`` (``results.json``) to the first free ``<stem>-<n><suffix>``, so a
    later write of ``path`` loses nothing; returns the new name (None when there was nothing to keep). Anything else
    there (a link, FIFO, device, folder) is never renamed: a :class:`UsageError`."""
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
    """Open ``path`` for writing (never created, truncated or renamed) and write ``data``, as a shell's ``>`` does
    to a device or FIFO (a FIFO blocks until a reader opens it). False, nothing written, when it turned out to be a
    regular file (or vanished) since it was looked at, and ``append`` is not set."""
    try:
        fd = os.open(path, os.O_WRONLY | getattr(os, 'O_NOCTTY', 0) | (os.O_APPEND if append else 0))
    except FileNotFoundError:
        return False
    with open(fd, 'wb', buffering=0) as f:
        if stat.S_ISREG(os.fstat(fd).st_mode) and not append:
            return False
        try:
            view = memoryview(data)
            while view:
                view = view[f.write(view):]
        except OSError as e:  # a full device (/dev/full), a reader gone (a closed pipe): name the path
            raise OSError(e.errno, e.strerror, path) from e
    return True


def write_output_file(path: os.PathLike, data: Union[str, bytes], keep: bool = False) -> Optional[Path]:
    """Write ``data`` (a str as UTF-8) to an output path the user gave, as any Unix tool would. A FIFO or device is
    opened and written as it is; a regular file (``keep``: the earlier one first kept by :func:`keep_previous`) or a
    new name by :func:`atomic_write`. A symbolic link stays a link: these rules apply to its target, and through
    ``/dev/stdout`` (``/proc/self/fd``) the bytes are appended. A folder or socket: a :class:`UsageError`. Returns the
    name the earlier file was kept under, else None."""
    path = os.fspath(path)
    data = data.encode('utf-8') if isinstance(data, str) else bytes(data)
    kind, is_link = output_kind(path), os.path.islink(path)
    if kind == 'stream' and _write_in_place(path, data):
        return None
    if kind == 'regular' and is_link and _through_proc(path):
        _write_in_place(path, data, append=True)
        return None
    if kind in ('folder', 'socket'):
        raise UsageError(f'{path} is a {kind}; expected a file path (a new or regular file, a FIFO or a device)')
    target = Path(os.path.realpath(path) if is_link else path)  # the link itself is never replaced
    kept = keep_previous(target) if keep else None
    atomic_write(target, lambda f: f.write(data))
    return kept


@contextlib.contextmanager
def atomic_folder(path: os.PathLike):
    """Write a folder (a ``save_pretrained`` export) atomically: the block fills a temporary folder beside ``path``
    (yielded), which then replaces ``path``; a failure or a kill inside the block leaves ``path`` as it was."""
    path, tmp = Path(path), temp_path(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
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


class CheckpointManager:
    """``last.pth`` every epoch (or step, ``key``), ``model_best.pth`` and the ``max_history`` best
    ``checkpoint-<position>.pth``. ``resume_only``: the fields only a resume needs (``optimizer``, ``amp_scaler``),
    which best / top-N files then leave out (for AdamW a third of the size; else they are hard links of ``last.pth``).

    The best / top-N history is stored in every checkpoint and restored (checked) on resume. Writes, in order:
    ``last.pth`` (atomic, with the new history), best / top-N, then removal of the file that fell out of the top N
    (named from its position, never from a path read from a checkpoint): a crash between them leaves at worst a
    stale or missing top-N file, never a broken one.

    Not ``timm.utils.CheckpointSaver`` (timm 1.0.31), whose ranking this follows: it refuses ``max_history=0``,
    tracks the best only inside a top-N slot, writes non-atomically through a fixed ``tmp`` name, and deletes the
    paths a restored state names (a crafted ``../file`` included).
    """

    def __init__(self, output_dir: os.PathLike, decreasing: bool = False, max_history: int = 3, key: str = 'epoch',
                 resume_only: Sequence[str] = ()):
        self.output_dir, self.resume_only = Path(output_dir), tuple(resume_only)
        self.last_path, self.best_path = self.output_dir / 'last.pth', self.output_dir / 'model_best.pth'
        self.decreasing, self.max_history, self.key = decreasing, max_history, key
        self.history: List[Dict[str, Any]] = []  # [{key, 'metric', 'file'}], best first
        self.best: Optional[Dict[str, Any]] = None  # {key, 'metric'}

    @staticmethod
    def file_name(position: int) -> str:
        """The top-N file of ``position``: the only kind of file this class ever deletes."""
        return f'checkpoint-{position}.pth'

    def _checked_entry(self, entry: Any, with_file: bool) -> Dict[str, Any]:
        """``entry`` as this class writes it, or a ``ValueError`` saying what is wrong with it."""
        keys = {self.key, 'metric'} | ({'file'} if with_file else set())
        if not isinstance(entry, dict) or set(entry) != keys:
            raise ValueError(f'{short_repr(entry)} is not a {{{", ".join(sorted(keys))}}} entry')
        position, metric = entry[self.key], entry['metric']
        if not is_count(position):
            raise ValueError(f'{self.key} {short_repr(position)} is not a non-negative integer')
        if not _is_number(metric) or _plain_problem(metric):
            raise ValueError(f'metric {short_repr(metric)} is not a finite number')
        if with_file and entry['file'] != self.file_name(position):
            raise ValueError(f'file {short_repr(entry["file"])} is not {self.file_name(position)!r}, the name this '
                             f'trainer gives the checkpoint of {self.key} {position}')
        return dict(entry)

    def check_state(self, state: Optional[Dict[str, Any]], source: str = 'the checkpoint') -> Optional[Dict[str, Any]]:
        """``state`` (a checkpoint's ``checkpoint_history``) if every entry is exactly what :meth:`save` writes (a
        position, a finite metric, the file name of that position); else a :class:`UsageError` naming ``source``."""
        if not state:
            return None
        try:
            if not isinstance(state, dict) or not set(state) <= {'history', 'best'}:
                raise ValueError(f'{short_repr(state)} is not a {{history, best}} dict')
            history = state.get('history') or []
            if not isinstance(history, list):
                raise ValueError(f'the history is a {type(history).__name__}, not a list')
            history = [self._checked_entry(h, with_file=True) for h in history]
            best = None if state.get('best') is None else self._checked_entry(state['best'], with_file=False)
        except ValueError as e:
            raise UsageError(f'{source}: its checkpoint_history is not one this trainer writes ({e}); the file is '
                             f'damaged or was crafted, and is not used') from None
        return {'history': history, 'best': best}

    def load_state_dict(self, state: Optional[Dict[str, Any]], source: str = 'the checkpoint') -> None:
        """Restore a history (checked by :meth:`check_state`); entries whose file is gone are dropped."""
        state = self.check_state(state, source)
        if not state:
            return
        self.history, self.best = [h for h in state['history'] if (self.output_dir / h['file']).is_file()], state['best']
        if self.best is not None and not self.best_path.exists():
            _logger.warning(f'{self.best_path} is missing; best-checkpoint tracking restarts')
            self.best = None

    def save(self, state: Dict[str, Any], epoch: int, metric: Optional[float]) -> Dict[str, bool]:
        """Write the checkpoint of position ``epoch`` (an epoch or a step); ``state`` gets ``checkpoint_history``
        added. Returns what was written."""
        is_best = metric is not None and (self.best is None or (
            metric < self.best['metric'] if self.decreasing else metric > self.best['metric']))
        history, evicted, in_top = list(self.history), [], False
        if metric is not None and self.max_history > 0:
            history = [h for h in history if h[self.key] != epoch]  # an epoch re-run after a crash
            history.append({self.key: epoch, 'metric': metric, 'file': self.file_name(epoch)})
            history.sort(key=lambda h: h['metric'], reverse=not self.decreasing)
            evicted = history[self.max_history:]
            history = history[:self.max_history]
            in_top = any(h[self.key] == epoch for h in history)
        best = {self.key: epoch, 'metric': metric} if is_best else self.best

        state['checkpoint_history'] = {'history': history, 'best': best}
        self.output_dir.mkdir(parents=True, exist_ok=True)
        atomic_save(state, self.last_path)
        kept = [p for p, due in ((self.best_path, is_best), (self.output_dir / self.file_name(epoch), in_top)) if due]
        if kept and self.resume_only:  # one smaller file, the other kept file a link of it
            atomic_save({k: v for k, v in state.items() if k not in self.resume_only}, kept[0])
        for path in kept[1:] if self.resume_only else kept:
            atomic_link(kept[0] if self.resume_only else self.last_path, path)
        for h in evicted:
            if h[self.key] != epoch:
                (self.output_dir / self.file_name(h[self.key])).unlink(missing_ok=True)
        self.history, self.best = history, best
        return {'last': True, 'best': is_best, 'top': in_top}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_count(value: Any) -> bool:
    """A non-negative ``int`` (not a bool): a position, an update count, a thread count."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _plain_problem(value: Any, live: Any = None) -> Optional[str]:
    """What keeps a saved setting from being a plain value (None, a bool, number or string, or a list / tuple /
    str-keyed dict of such) without NaN or infinity, or None. An infinity is kept where the ``live`` value in its
    place is infinite too (a plateau scheduler's starting ``best`` is -inf)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if not math.isnan(value) and isinstance(live, float) and math.isinf(live) else 'NaN or infinite'
    if value is None or isinstance(value, (bool, int, float, str)):
        return None
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        value = value.values()
    elif not isinstance(value, (list, tuple)):
        return 'not a value of its kind'
    return next(filter(None, map(_plain_problem, value)), None)


def _check_settings(saved: Dict[str, Any], live: Dict[str, Any], name: Callable[[str], str],
                    none_for_number: bool = True) -> None:
    """Each entry of ``saved`` is one ``live`` has, a plain finite value (:func:`_plain_problem`), and a number where
    the live one is (or None, if ``none_for_number``); else a ``ValueError`` naming the entry as ``name(key)``."""
    for k, v in saved.items():
        if k not in live:
            raise ValueError(f'{name(k)} is no entry of the live state')
        problem = _plain_problem(v, live[k])
        if not problem and _is_number(live[k]) and not (_is_number(v) or none_for_number and v is None):
            problem = 'not a value of its kind'
        if problem:  # e.g. a saved NaN base LR would train on NaN
            raise ValueError(f'{name(k)} is {short_repr(v)}: {problem}')


def check_settings_state(saved: Any, live: Dict[str, Any], what: str) -> None:
    """A saved scheduler / scaler state (loaded by assigning its entries to attributes, so checked before loading)
    fits the live object's ``state_dict()`` ``live`` (:func:`_check_settings`); else a ``ValueError`` naming
    ``what``."""
    if not isinstance(saved, dict):
        raise ValueError(f'{what} is a {type(saved).__name__}, not a state dict')
    _check_settings(saved, live, lambda k: f'{what} entry {k!r}')


def check_optimizer_state(saved: Any, optimizer: torch.optim.Optimizer) -> None:
    """A saved optimizer state fits ``optimizer``: groups of the same keys and parameter counts, settings plain and
    finite (numbers where the live ones are), per-parameter state numbers or tensors no larger in rank than their
    parameter (the same shape when of the same rank), all finite; else a ``ValueError``."""
    if not isinstance(saved, dict) or set(saved) != {'state', 'param_groups'}:
        raise ValueError('the optimizer state is not a {state, param_groups} dict')
    groups, live_groups = saved['param_groups'], optimizer.param_groups
    if not isinstance(groups, list) or len(groups) != len(live_groups):
        raise ValueError(f'the optimizer state has {len(groups) if isinstance(groups, list) else "no"} parameter '
                         f'groups, this optimizer {len(live_groups)}')
    params = {}
    for i, (group, live) in enumerate(zip(groups, live_groups)):
        if not isinstance(group, dict) or set(group) != set(live):
            raise ValueError(f'optimizer parameter group {i} has other settings than this optimizer\'s')
        ids = group['params']
        if not isinstance(ids, list) or len(ids) != len(live['params']) or not all(_is_number(j) for j in ids):
            raise ValueError(f'optimizer parameter group {i} does not list {len(live["params"])} parameters')
        params.update(zip(ids, live['params']))
        _check_settings({k: v for k, v in group.items() if k != 'params'}, live,
                        lambda k: f'optimizer setting {k!r} of group {i}', none_for_number=False)
    state = saved['state']
    if not isinstance(state, dict) or not set(state) <= set(params):
        raise ValueError('the optimizer state names parameters the groups do not list')
    for j, entry in state.items():
        if not isinstance(entry, dict):
            raise ValueError(f'the optimizer state of parameter {j} is not a dict')
        p = params[j]
        for k, v in entry.items():
            fits = (_is_number(v) or isinstance(v, torch.Tensor) and (
                v.dim() < p.dim() or tuple(v.shape) == tuple(p.shape)) and (v.is_floating_point() or v.dim() == 0))
            if not fits:
                raise ValueError(f'the optimizer state {k!r} of parameter {j} does not fit a parameter of shape '
                                 f'{tuple(p.shape)}')
            finite = not _plain_problem(v) if _is_number(v) else not v.is_floating_point() or torch.isfinite(v).all()
            if not finite:  # e.g. a NaN exp_avg: the first step would write NaN into the weights
                raise ValueError(f'the optimizer state {k!r} of parameter {j} holds NaN or infinite values')


def get_rng_state() -> Dict[str, Any]:
    """Python, numpy and torch (CPU, and CUDA if initialised) RNG states as tensors / plain Python values."""
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    state = {'python': random.getstate(), 'torch': torch.get_rng_state(),
             'numpy': {'name': name, 'keys': torch.from_numpy(keys.astype(np.int64)), 'pos': int(pos),
                       'has_gauss': int(has_gauss), 'cached_gaussian': float(cached_gaussian)}}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    version, words, gauss = state['python']  # torch.load(weights_only=True) gives lists back where tuples were saved
    random.setstate((version, tuple(words), gauss))
    n = state['numpy']
    np.random.set_state((n['name'], n['keys'].numpy().astype(np.uint32), n['pos'], n['has_gauss'],
                         n['cached_gaussian']))
    torch.set_rng_state(state['torch'])
    if 'cuda' in state and torch.cuda.is_available():
        cuda_states = state['cuda']
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
        else:
            _logger.warning('checkpoint has CUDA RNG states for another GPU count; CUDA RNG not restored')


def _is_generator_state(value: Any) -> bool:
    """A ``torch.Generator`` state: a uint8 tensor of the CPU generator's state size."""
    return (isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 1
            and value.numel() == torch.get_rng_state().numel())


def check_rng_state(state: Any) -> None:
    """One rank's saved state (``rng_states[rank]``) as :func:`get_rng_state` and the trainers write it (Python's
    version, 625 words and gauss; numpy's MT19937; torch's and CUDA's generator states; the trainer's generator
    states and finite non-negative counters), else a ``ValueError`` saying which part: ``random.setstate`` and
    numpy accept some damaged states and fail later."""
    if not isinstance(state, dict) or not {'python', 'numpy', 'torch'} <= set(state):
        raise ValueError('a saved random-number state is not a {python, numpy, torch} dict')
    py = state['python']
    if not (isinstance(py, (list, tuple)) and len(py) == 3 and isinstance(py[0], int) and isinstance(py[1], (
            list, tuple)) and len(py[1]) == 625 and all(is_count(w) and w < 2 ** 32 for w in py[1])
            and py[1][-1] <= 624 and (py[2] is None or isinstance(py[2], float))):
        raise ValueError('the Python random state is not (version, 625 words, gauss)')
    n = state['numpy']
    if not (isinstance(n, dict) and n.get('name') == 'MT19937' and isinstance(n.get('keys'), torch.Tensor)
            and n['keys'].dtype == torch.int64 and tuple(n['keys'].shape) == (624,)
            and bool(((n['keys'] >= 0) & (n['keys'] < 2 ** 32)).all()) and is_count(n.get('pos')) and n['pos'] <= 624
            and is_count(n.get('has_gauss')) and n['has_gauss'] <= 1 and _is_number(n.get('cached_gaussian'))):
        raise ValueError('the numpy random state is not MT19937 (624 words, position, gauss)')
    if not _is_generator_state(state['torch']):
        raise ValueError('the torch random state is not a generator state')
    cuda = state.get('cuda')
    if cuda is not None and not (isinstance(cuda, (list, tuple)) and all(
            isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.dim() == 1 for t in cuda)):
        raise ValueError('the CUDA random states are not generator states')
    for key, value in state.items():
        ok = (key in ('python', 'numpy', 'torch', 'cuda') or _is_generator_state(value) or (
            _is_number(value) and not _plain_problem(value) and value >= 0))
        if not ok:
            raise ValueError(f'the saved data state {key!r} is {short_repr(value)}, not a generator state or a '
                             f'count')


@contextlib.contextmanager
def preserve_rng():
    """Restore the python / numpy / torch RNG states on exit: code in the block cannot shift training's randomness."""
    state = get_rng_state()
    try:
        yield
    finally:
        set_rng_state(state)
