""" Checkpoints: atomic writes, last / best / top-N bookkeeping that survives a resume, RNG state capture,
and loading a checkpoint (ours, timm's train.py's, or a foreign state dict) into a model for evaluation.

Our training checkpoint is a dict::

    version, epoch, num_updates, arch, model_cfg {name, kwargs}, data_cfg, state_dict, state_dict_ema,
    optimizer, scheduler, amp_scaler, rng_states (one per rank), checkpoint_history, metric, eval_metrics, args

Everything in it is tensors and plain Python values, so it loads with ``torch.load(weights_only=True)``.
"""
import contextlib
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import torch
import torch.nn as nn

from .errors import UsageError

__all__ = [
    'CHECKPOINT_VERSION', 'atomic_save', 'atomic_link', 'CheckpointManager', 'load_checkpoint_file',
    'is_training_checkpoint', 'get_rng_state', 'set_rng_state', 'preserve_rng', 'clean_state_dict', 'load_model_weights',
]

_logger = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1


def _fsync_dir(path: Path) -> None:
    # make the rename itself durable (POSIX); not possible / needed on every platform
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_save(obj: Any, path: os.PathLike) -> None:
    """``torch.save`` to a temporary file in the same folder, flush + fsync, then ``os.replace``.

    A reader (or a run killed at any point) sees either the previous file or the complete new one.
    """
    path = Path(path)
    tmp = path.with_name(f'.{path.name}.tmp-{os.getpid()}')
    try:
        with open(tmp, 'wb') as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(path.parent)


def atomic_link(src: os.PathLike, dst: os.PathLike) -> None:
    """Make ``dst`` a hard link to ``src`` (a durable copy where links are not supported), atomically."""
    src, dst = Path(src), Path(dst)
    tmp = dst.with_name(f'.{dst.name}.tmp-{os.getpid()}')
    if tmp.exists():
        tmp.unlink()
    try:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
            with open(tmp, 'rb+') as f:
                os.fsync(f.fileno())
        os.replace(tmp, dst)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(dst.parent)


class CheckpointManager:
    """``last.pth`` every epoch, ``model_best.pth`` and the ``max_history`` best ``checkpoint-<epoch>.pth``.

    The best / top-N history is stored inside every checkpoint and restored by :meth:`load_state_dict` on
    resume. Order of writes for an epoch: ``last.pth`` (atomic, already holding the new history), then hard
    links for best / top-N, then removal of the checkpoint that fell out of the top N. A crash between the
    steps leaves at worst a stale or missing top-N file, never a broken one; history entries whose file is
    missing are dropped on load.
    """

    def __init__(self, output_dir: os.PathLike, decreasing: bool = False, max_history: int = 3):
        self.output_dir = Path(output_dir)
        self.decreasing = decreasing
        self.max_history = max_history
        self.history: List[Dict[str, Any]] = []  # [{'epoch', 'metric', 'file'}], best first
        self.best: Optional[Dict[str, Any]] = None  # {'epoch', 'metric'}

    @property
    def last_path(self) -> Path:
        return self.output_dir / 'last.pth'

    @property
    def best_path(self) -> Path:
        return self.output_dir / 'model_best.pth'

    def _better(self, a: float, b: float) -> bool:
        return a < b if self.decreasing else a > b

    def state_dict(self) -> Dict[str, Any]:
        return {'history': [dict(h) for h in self.history], 'best': dict(self.best) if self.best else None}

    def load_state_dict(self, state: Optional[Dict[str, Any]]) -> None:
        if not state:
            return
        self.history = [h for h in state.get('history', []) if (self.output_dir / h['file']).exists()]
        self.best = state.get('best')
        if self.best is not None and not self.best_path.exists():
            _logger.warning(f'{self.best_path} is missing; best-checkpoint tracking restarts')
            self.best = None

    def save(self, state: Dict[str, Any], epoch: int, metric: Optional[float]) -> Dict[str, bool]:
        """Write the epoch's checkpoint; ``state`` gets ``checkpoint_history`` added. Returns what was written."""
        is_best = metric is not None and (self.best is None or self._better(metric, self.best['metric']))
        history = list(self.history)
        evicted = []
        in_top = False
        if metric is not None and self.max_history > 0:
            history = [h for h in history if h['epoch'] != epoch]  # an epoch re-run after a crash
            history.append({'epoch': epoch, 'metric': metric, 'file': f'checkpoint-{epoch}.pth'})
            history.sort(key=lambda h: h['metric'], reverse=not self.decreasing)
            evicted = history[self.max_history:]
            history = history[:self.max_history]
            in_top = any(h['epoch'] == epoch for h in history)
        best = {'epoch': epoch, 'metric': metric} if is_best else self.best

        state['checkpoint_history'] = {'history': history, 'best': best}
        self.output_dir.mkdir(parents=True, exist_ok=True)
        atomic_save(state, self.last_path)
        if is_best:
            atomic_link(self.last_path, self.best_path)
        if in_top:
            atomic_link(self.last_path, self.output_dir / f'checkpoint-{epoch}.pth')
        for h in evicted:
            if h['epoch'] != epoch:
                (self.output_dir / h['file']).unlink(missing_ok=True)
        self.history, self.best = history, best
        return {'last': True, 'best': is_best, 'top': in_top}


def get_rng_state() -> Dict[str, Any]:
    """Python, numpy and torch (CPU, and CUDA if initialised) RNG states as tensors / plain Python values."""
    np_state = np.random.get_state()
    state = {
        'python': random.getstate(),
        'numpy': {
            'name': np_state[0], 'keys': torch.from_numpy(np_state[1].astype(np.int64)),
            'pos': int(np_state[2]), 'has_gauss': int(np_state[3]), 'cached_gaussian': float(np_state[4]),
        },
        'torch': torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    random.setstate(state['python'])
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


@contextlib.contextmanager
def preserve_rng():
    """Restore the python / numpy / torch RNG states on exit: code in the block cannot shift training's randomness."""
    state = get_rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


def _python_rng_state_to_tuple(state):
    # torch.load(weights_only=True) gives lists back where torch.save got tuples
    version, internal, gauss = state
    return version, tuple(internal), gauss


def load_checkpoint_file(path: os.PathLike) -> Dict[str, Any]:
    """Load a checkpoint file on the CPU, with a clear error if it is missing or unreadable."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f'checkpoint {str(path)!r} does not exist')
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as e:  # weights_only refuses pickled objects: fall back only for non-ours files below
        try:
            ckpt = torch.load(path, map_location='cpu', weights_only=False)
            _logger.warning(f'{path} needed a full unpickle to load (trusted files only)')
        except Exception:
            raise UsageError(f'cannot read checkpoint {str(path)!r}: {e}') from e
    if not isinstance(ckpt, dict):
        raise UsageError(f'checkpoint {str(path)!r} holds a {type(ckpt).__name__}, expected a dict / state dict')
    if 'rng_states' in ckpt:
        for s in ckpt['rng_states']:
            s['python'] = _python_rng_state_to_tuple(s['python'])
    return ckpt


def is_training_checkpoint(ckpt: Dict[str, Any]) -> bool:
    """A checkpoint written by a train.py (ours or timm's): a dict with ``state_dict`` and ``arch``."""
    return isinstance(ckpt.get('state_dict'), dict) and 'arch' in ckpt


def clean_state_dict(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Strip DDP's ``module.`` and torch.compile's ``_orig_mod.`` prefixes."""
    out = {}
    for k, v in state_dict.items():
        for prefix in ('module.', '_orig_mod.'):
            while k.startswith(prefix):
                k = k[len(prefix):]
        out[k] = v
    return out


def load_model_weights(
        model: nn.Module,
        state_dict: Dict[str, torch.Tensor],
        source: str,
        model_name: str,
) -> None:
    """``model.load_state_dict(strict=True)`` with a readable error when the weights belong to another model."""
    result_error = None
    try:
        model.load_state_dict(clean_state_dict(state_dict), strict=True)
        return
    except RuntimeError as e:
        result_error = e
    model_keys = set(model.state_dict().keys())
    ckpt = clean_state_dict(state_dict)
    missing = sorted(model_keys - set(ckpt))
    unexpected = sorted(set(ckpt) - model_keys)
    shape = [k for k in sorted(model_keys & set(ckpt)) if tuple(ckpt[k].shape) != tuple(model.state_dict()[k].shape)]
    parts = []
    if missing:
        parts.append(f'{len(missing)} weights missing (e.g. {", ".join(missing[:3])})')
    if unexpected:
        parts.append(f'{len(unexpected)} unexpected (e.g. {", ".join(unexpected[:3])})')
    if shape:
        k = shape[0]
        parts.append(f'{len(shape)} with other shapes (e.g. {k}: checkpoint {tuple(ckpt[k].shape)}, '
                     f'model {tuple(model.state_dict()[k].shape)})')
    detail = '; '.join(parts) or str(result_error)
    raise UsageError(
        f'{source} does not fit model {model_name}: {detail}. Expected a checkpoint of the same architecture '
        f'and settings (--model, --model-kwargs, --img-size, --num-classes)') from result_error
