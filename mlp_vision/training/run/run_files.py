""" A training run's files and their safety, as the functions a trainer calls in order (:mod:`mlp_vision.train`):

* :func:`parse_run_args` -- the flags, over a ``--resume`` checkpoint's saved settings (loaded safely, checked);
* :func:`check_resume_identity`, :func:`restore_training_state`, :func:`restore_ema`, :func:`check_not_finished`
  -- the resumed weights, optimizer, AMP scaler and schedule (a changed schedule continues from the checkpoint's
  position), before any folder is opened;
* :func:`open_run_folder` -- the run folder: created (``NAME-1`` if NAME exists) with its identity ``run.json``,
  or continued in place only when it is the checkpoint's run and holds nothing newer (:func:`newer_than`); locked
  against a second process (:class:`FolderLock`), refused when it holds links or FIFOs; ``train.log``,
  ``args.yaml`` / ``derived.yaml``, ``summary.csv`` and the checkpoint history (:class:`RunFolder`, closed by
  :func:`close_run_folder`);
* :func:`restore_rng` -- last, so nothing built before shifts the random streams (an exact resume);
* :func:`save_checkpoint` -- ``last.pth`` (atomic), ``model_best.pth`` and the top-N ``checkpoint-N.pth``;
* :func:`stop_signals` / :func:`stop_error` -- SIGINT / SIGTERM as a flag read between updates, and the one line
  that ends a stopped or diverged run naming the intact checkpoint;
* :func:`write_results` (``results.json``; an earlier one kept as ``results-N.json``), :func:`weights_digests`.

Checkpoint payload (tensors and plain Python values only, so it loads with ``weights_only=True``)::

    version, kind ('image' | 'text'), run_id (the folder's run.json), threads (a resume keeps them), arch,
    <position key> ('epoch': last completed epoch | 'step': completed updates), num_updates, model_cfg,
    state_dict, optimizer, scheduler, schedule (create_scheduler_v2 kwargs), amp_scaler, rng_states (one per
    rank), metric, args (as given), derived (:class:`~.config.RunArgs`), checkpoint_history, + the trainer's fields

``model_best.pth`` / ``checkpoint-N.pth`` leave out ``optimizer`` and ``amp_scaler`` unless
``--keep-optimizer-state``; ``--resume`` of such a file needs ``--no-resume-opt``. timm's ``CheckpointSaver`` is
not used: it replaces files with ``os.rename`` and keeps no earlier version, writes through links, and saves no RNG
state for an exact resume.
"""
import argparse
import contextlib
import csv
import itertools
import json
import logging
import os
import re
import signal
import stat
import threading
import uuid
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from timm.scheduler import create_scheduler_v2
from timm.utils import NativeScaler, unwrap_model

from mlp_vision.arguments import read_json_file
from mlp_vision.bounds import add_bound_arguments
from mlp_vision.errors import Interrupted, RunError, UsageError, short_repr
from mlp_vision.threads import add_threads_argument
from mlp_vision.training.run.checkpoint import (
    CHECKPOINT_VERSION, TRUST_FLAG, CheckpointManager, atomic_write_text, check_optimizer_state, check_rng_state,
    check_settings_state, clean_stale_temp_files, get_rng_state, is_count, keep_previous, open_own_file, set_rng_state)
from mlp_vision.weights import load_checkpoint_file, load_model_weights
from mlp_vision.training.run.config import (
    BaseConfigs, RunArgs, args_to_yaml, merge_settings, parse_given, plain_value, read_yaml_file)
from mlp_vision.training.run.distributed import DistInfo, all_gather_objects, state_dict_digest
from mlp_vision.training.run.log import add_log_file, remove_log_file
from mlp_vision.training.run.summary import SummaryWriter, write_json

__all__ = ['RUN_CONTROL_ARGS', 'add_run_arguments', 'add_common_arguments', 'add_device_arguments', 'parse_run_args',
           'setup_amp', 'create_lr_scheduler', 'check_resume_payload', 'check_resume_identity',
           'restore_training_state', 'restore_ema', 'check_not_finished', 'restore_rng', 'RUN_FILE', 'new_run_folder',
           'write_run_id', 'read_run_id', 'is_run_id', 'FolderLock', 'check_own_files', 'newer_than', 'RunFolder',
           'open_run_folder', 'close_run_folder', 'log_settings_changes', 'save_checkpoint', 'stop_signals',
           'stop_error', 'weights_digests', 'checkpoint_files', 'write_results', 'list_outputs']

_logger = logging.getLogger(__name__)

# flags about this invocation, not the run's settings: never taken over from a resumed run
RUN_CONTROL_ARGS = frozenset({
    'config', 'resume', 'trust_checkpoint', 'debug', 'output', 'experiment', 'no_resume_opt',
    'initial_checkpoint', 'pretrained', 'pretrained_path', 'allow_missing_weights',
    'max_params', 'max_activation_gib', 'allow_regex',  # opt-ins past a bound: given again each time, as the trust
})
_SCHEDULERS = ('cosine', 'tanh', 'step', 'multistep', 'poly', 'wsd', 'rsqrt', 'constant', 'plateau')
RUN_FILE = 'run.json'  # a run folder's identity
_RUN_ID = re.compile(r'[0-9a-f]{32}')


# ------------------------------------------------------------------------------------------------ flags
def add_run_arguments(group: argparse._ActionsContainer, resume_help: str) -> None:
    """``--resume`` and :func:`add_common_arguments`: the same in every training script."""
    group.add_argument('--resume', default='', type=str, metavar='PATH', help=resume_help)
    group.add_argument('--keep-optimizer-state', action='store_true', default=False,
                       help='model_best.pth and checkpoint-N.pth hold the optimizer state too, so a run can resume '
                            'from them (default: weights only, about a third of the size; last.pth always has it)')
    add_common_arguments(group)


def add_common_arguments(group: argparse._ActionsContainer, activations: bool = True) -> None:
    """``--trust-checkpoint``, ``--debug`` and the size bounds' ``--max-params`` / ``--max-activation-gib``
    (:func:`~mlp_vision.bounds.add_bound_arguments`; ``activations=False``: a command that runs no forward pass):
    the same in every script that reads checkpoint files."""
    group.add_argument(TRUST_FLAG, action='store_true', default=False,
                       help='UNSAFE: allow checkpoint files that need a full unpickle; that runs arbitrary code from '
                            'the file. Only for files you made or whose maker you trust')
    group.add_argument('--debug', action='store_true', default=False,
                       help='show the full traceback of an error instead of its one-line message')
    add_bound_arguments(group, activations)


def add_device_arguments(group: argparse._ActionsContainer, distributed: bool = True) -> None:
    """``--device``, ``--threads``, ``--amp`` / ``--amp-dtype`` (:func:`setup_amp`) and, for a trainer
    (``distributed``), ``--dist-backend`` / ``--dist-url``: the same in every command that runs a model."""
    group.add_argument('--device', default=None, type=str, help="'cuda', 'cuda:1', 'cpu' (default: cuda if available)")
    if distributed:
        group.add_argument('--dist-backend', default=None, type=str, help='a backend or device:backend pairs '
                           '(default: cpu:gloo,cuda:nccl for CUDA, gloo for CPU)')
        group.add_argument('--dist-url', default=None, type=str, help="default: 'env://' (torchrun)")
    add_threads_argument(group)
    group.add_argument('--amp', action='store_true', default=False,
                       help='mixed precision: bfloat16 autocast on CPU, float16 on CUDA (training: + a loss scaler)')
    group.add_argument('--amp-dtype', default=None, type=str, choices=('float16', 'bfloat16'),
                       help='autocast dtype (default: bfloat16 on CPU, float16 on CUDA)')


def parse_run_args(parser: argparse.ArgumentParser, argv: Sequence[str], kind: str, base_configs: BaseConfigs = (),
                   recipes: bool = False) -> Tuple[RunArgs, Optional[Dict[str, Any]]]:
    """(args, the ``--resume`` checkpoint or None): ``argv`` parsed once (:func:`~.config.parse_given`); a resumed
    checkpoint is loaded safely, checked to be a ``kind`` training checkpoint, and its saved arguments become the
    defaults under ``-c`` and the command line (:func:`~.config.merge_settings`, with ``base_configs`` and
    ``recipes``), kept with its ``derived`` in ``args.resumed_settings`` / ``args.resumed_derived``."""
    given = parse_given(parser, argv)
    resume = given.get('resume', '')
    ckpt, saved = None, {}
    if resume:
        ckpt = load_checkpoint_file(resume, trust=given.get('trust_checkpoint', False), what='--resume')
        found = (ckpt.get('kind', 'image') if 'state_dict' in ckpt and (
            'optimizer' in ckpt or 'checkpoint_history' in ckpt) else None)  # the latter: a weights-only best / top-N
        if found != kind:
            what = f'a checkpoint of the {found} trainer' if found else 'not a training checkpoint'
            raise UsageError(f'--resume {resume} is {what}; expected the last.pth (or checkpoint-N.pth) of '
                             f'a {kind} training run of {parser.prog}')
        for field in ('args', 'derived'):  # mappings keyed by names, as save_checkpoint writes them
            value = ckpt.get(field)
            if value is not None and not (isinstance(value, dict) and all(isinstance(k, str) for k in value)):
                raise UsageError(f'--resume {resume}: the checkpoint\'s {field} is not a mapping of setting names to '
                                 f'values; the file is damaged or was crafted, and is not used')
        saved = {k: v for k, v in (ckpt.get('args') or {}).items() if k not in RUN_CONTROL_ARGS}
    args, _ = merge_settings(parser, given, base_configs=base_configs, run_settings=saved, recipes=recipes)
    args.resumed_settings = saved
    args.resumed_derived = dict(ckpt.get('derived') or {}) if ckpt is not None else {}
    if ckpt is not None and 'optimizer' not in ckpt and not args.no_resume_opt:
        raise UsageError(f'--resume {resume} holds the weights only (written without --keep-optimizer-state): '
                         f'continue from last.pth, resume from its weights with a fresh optimizer (--no-resume-opt) '
                         f'or start a new run from its weights with --initial-checkpoint')
    return args, ckpt


def setup_amp(enabled: bool, dtype_name: Optional[str], device: torch.device):
    """(autocast context factory, loss scaler or None, dtype or None). float16 (CUDA) gets timm's NativeScaler;
    bfloat16 needs none."""
    if not enabled:
        return suppress, None, None
    dtype = getattr(torch, dtype_name or ('float16' if device.type == 'cuda' else 'bfloat16'))
    if dtype == torch.float16 and device.type != 'cuda':
        raise UsageError('--amp-dtype float16 needs CUDA; on the CPU use bfloat16 (the default)')
    scaler = NativeScaler(device=device.type) if dtype == torch.float16 else None
    return partial(torch.autocast, device_type=device.type, dtype=dtype), scaler, dtype


def create_lr_scheduler(optimizer: torch.optim.Optimizer, schedule: Dict[str, Any], updates_per_epoch: int = 1):
    """timm's ``create_scheduler_v2(optimizer, **schedule)``; returns (scheduler, total epochs incl. cooldown).
    ``schedule`` holds its keyword arguments and ``lr`` (the optimizer's base LR); every checkpoint stores it
    (:func:`restore_training_state` continues a changed one from the checkpoint's position)."""
    if schedule['sched'] not in _SCHEDULERS:
        raise UsageError(f'--sched {schedule["sched"]!r} is not a learning-rate schedule; use one of '
                         f'{", ".join(_SCHEDULERS)}')
    kwargs = {k: v for k, v in schedule.items() if k != 'lr'}
    try:
        return create_scheduler_v2(optimizer, **kwargs, updates_per_epoch=updates_per_epoch)
    except (ValueError, AssertionError) as e:
        raise UsageError(f'the --sched {schedule["sched"]} schedule cannot be built: {e}') from e


def _schedule_position(scheduler, next_epoch: int, num_updates: int) -> None:
    if scheduler.t_in_epochs:
        scheduler.step(next_epoch)
    else:
        scheduler.step_update(num_updates)


def _differences(old: Dict[str, Any], new: Dict[str, Any], name: Callable[[str], str] = str,
                 show: Callable[[Any], str] = repr) -> List[str]:
    """``'<name(key)> <new value> (was <old value>)'`` for each key whose plain values (:func:`~.config.plain_value`)
    differ between ``old`` and ``new``."""
    plain = {k: (plain_value(old.get(k)), plain_value(new.get(k))) for k in sorted(set(old) | set(new))}
    return [f'{name(k)} {show(b)} (was {show(a)})' for k, (a, b) in plain.items() if a != b]


# ------------------------------------------------------------------------------------------------ resume
def check_resume_payload(ckpt: Dict[str, Any], key: str, source: str) -> None:
    """The fields of a training checkpoint have the types :func:`save_checkpoint` writes; else one line."""
    problems = [name for name, ok in (
        (key, is_count(ckpt.get(key))),
        ('num_updates', is_count(ckpt.get('num_updates', ckpt.get(key)))),
        ('state_dict', isinstance(ckpt.get('state_dict'), dict) and all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in ckpt['state_dict'].items())),
        ('state_dict_ema', ckpt.get('state_dict_ema') is None or isinstance(ckpt['state_dict_ema'], dict)),
        ('scheduler', isinstance(ckpt.get('scheduler'), dict)),
        ('schedule', ckpt.get('schedule') is None or isinstance(ckpt['schedule'], dict)),
        ('rng_states', ckpt.get('rng_states') is None or isinstance(ckpt['rng_states'], list)),
        ('run_id', ckpt.get('run_id') is None or is_run_id(ckpt['run_id'])),
        ('threads', ckpt.get('threads') is None or is_count(ckpt['threads'])),
    ) if not ok]
    if problems:
        raise UsageError(f'{source}: the checkpoint\'s {", ".join(problems)} {"is" if len(problems) == 1 else "are"} '
                         f'not what this trainer writes; the file is damaged or was crafted, and is not used')


def check_resume_identity(ckpt: Optional[Dict[str, Any]], resume: str, **expected) -> None:
    """The resumed checkpoint (None: not resuming) was made for these settings (e.g. ``arch='smlpnet_t'``)."""
    if ckpt is None:
        return
    found = {k: ckpt.get(k) for k in expected}
    if found != expected:
        was, wanted = (', '.join(f'{"model" if k == "arch" else k} {short_repr(v)}' for k, v in d.items())
                       for d in (found, expected))
        raise UsageError(f'--resume {resume} is a checkpoint of {was}, not of {wanted}; leave these '
                         f'flags out to continue the run as it was')


def restore_training_state(ckpt: Optional[Dict[str, Any]], resume: str, key: str, model_name: str, model: nn.Module,
                           optimizer: torch.optim.Optimizer, scheduler, schedule: Dict[str, Any], loss_scaler=None,
                           weights_only: bool = False) -> Tuple[int, int]:
    """Load the resumed checkpoint ``ckpt`` (None: not resuming) of a ``model_name`` model into the run's objects
    (``key``: its position, 'epoch' or 'step'); returns its (position,
    num_updates), (0, 0) when not resuming. The schedule continues exactly when ``schedule`` equals the
    checkpoint's; otherwise (a larger ``--epochs``) the new one is positioned at the checkpoint's epoch / update,
    and the change logged. ``weights_only`` (``--no-resume-opt``): weights and position only."""
    if ckpt is None:
        return 0, 0
    source = f'--resume {resume}'
    try:  # every rank's state, before anything is loaded or a folder opened (restore_rng sets it last)
        for state in ckpt.get('rng_states') or []:
            check_rng_state(state)
    except ValueError as e:
        raise UsageError(f'{source}: its saved random-number state is damaged or crafted ({e}); the file is not '
                         f'used') from None
    load_model_weights(unwrap_model(model), ckpt['state_dict'], source, model_name)
    position, num_updates = ckpt[key], ckpt.get('num_updates', ckpt[key])
    next_epoch = position + 1 if key == 'epoch' else position
    if weights_only:
        _schedule_position(scheduler, next_epoch, num_updates)
        return position, num_updates
    base_lrs = [g['initial_lr'] for g in optimizer.param_groups]
    changed = (_differences(ckpt['schedule'], schedule) if ckpt.get('schedule') is not None
               else ['the checkpoint records no schedule'])
    scaler_state = ckpt.get('amp_scaler') if loss_scaler is not None else None
    try:  # checked before anything is loaded: a checkpoint's states are data, never new attributes
        check_optimizer_state(ckpt['optimizer'], optimizer)
        if scaler_state:
            check_settings_state(scaler_state, loss_scaler.state_dict(), 'the AMP loss-scaler state')
        if not changed:
            check_settings_state(ckpt['scheduler'], scheduler.state_dict(), 'the scheduler state')
    except ValueError as e:
        raise UsageError(f'{source}: {e}; the file is damaged, was crafted, or belongs to another optimizer or '
                         f'schedule (--no-resume-opt loads only its weights)') from None
    optimizer.load_state_dict(ckpt['optimizer'])
    if scaler_state:
        loss_scaler.load_state_dict(scaler_state)
    if not changed:
        # the scheduler state after the constructor (which reset the LR): the optimizer state holds the exact LR of
        # the next update, the scheduler state the rest
        scheduler.load_state_dict(ckpt['scheduler'])
        return position, num_updates
    for group, lr in zip(optimizer.param_groups, base_lrs):
        group['initial_lr'] = lr
    _schedule_position(scheduler, next_epoch, num_updates)
    _logger.warning(
        f'{source}: the learning-rate schedule differs from the checkpoint\'s ({"; ".join(changed)}): the new '
        f'{schedule["sched"]} schedule continues from {key} {next_epoch if key == "epoch" else position}'
        f' at LR {optimizer.param_groups[0]["lr"]:.4g}')
    return position, num_updates


def restore_ema(ckpt: Optional[Dict[str, Any]], resume: str, model_name: str, model_ema: nn.Module) -> None:
    """The resumed EMA weights, when the checkpoint has them (else the EMA starts from the resumed model)."""
    if ckpt is not None and ckpt.get('state_dict_ema') is not None:
        load_model_weights(model_ema, ckpt['state_dict_ema'], f'--resume {resume} (EMA)', model_name)


def resumed_from_a_run(ckpt: Dict[str, Any], resume: str) -> bool:
    """The resumed checkpoint lies in the folder of the run it belongs to."""
    run_id = ckpt.get('run_id')
    return is_run_id(run_id) and read_run_id(Path(resume).resolve().parent) == run_id


def check_not_finished(ckpt: Optional[Dict[str, Any]], resume: str, key: str, done: int, total: int,
                       flag: str) -> None:
    """Refuse to resume a run that has nothing left to train (its results stay as they are); the message says
    what its folder holds: its results, the error its final stage stopped on, or that it has none."""
    if ckpt is None or done < total:
        return
    folder = Path(resume).resolve().parent
    results, recorded = folder / 'results.json', None
    with suppress(OSError, UsageError):
        recorded = read_json_file(str(results))
    if not resumed_from_a_run(ckpt, resume):
        outcome = f'the checkpoint lies outside its run\'s folder, so {folder} says nothing about its results'
    elif not isinstance(recorded, dict):
        outcome = (f'its final outputs were never written (no readable {results}: the process was stopped '
                   f'during its final stage); its weights are in {folder / "last.pth"}')
    elif recorded.get('error'):
        outcome = (f'its final stage failed ({recorded["error"]}, recorded in {results}); its weights are in '
                   f'{folder / "last.pth"}')
    else:
        outcome = f'results in {results}'
    raise UsageError(f'--resume {resume}: this run already finished its {total} {key}s ({outcome}); to train on, '
                     f'pass a larger {flag}')


def restore_rng(ckpt: Optional[Dict[str, Any]], resume: str, dist_info: DistInfo) -> None:
    """Restore this rank's RNG states from the resumed checkpoint ``ckpt`` (None: not resuming); call it last:
    nothing built before shifts them."""
    if ckpt is None:
        return
    states, world = ckpt.get('rng_states') or [], dist_info.world_size
    if len(states) != world:
        _logger.warning(f'the checkpoint has RNG states for {len(states)} processes, this run has {world}: '
                        f'continuing with fresh seeds (not bit-exact)')
        return
    try:
        set_rng_state(states[dist_info.rank])
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, RuntimeError) as e:
        raise UsageError(f'--resume {resume}: its saved random-number state is damaged or crafted '
                         f'({type(e).__name__}: {" ".join(str(e).split())[:120]}); the file is not used') from None


# ------------------------------------------------------------------------------------------------ folder identity
# Every folder a trainer creates holds ``run.json`` (``{"run_id": <32 hex digits>, "kind": "image" | "text"}``), and
# every checkpoint it writes carries the same ``run_id``. ``--resume`` continues *in place* only when, under the
# folder's lock (re-read after taking it), the folder is the checkpoint's run and holds nothing newer
# (:func:`newer_than`); otherwise in a new folder, so nothing of another run, or of a folder that is no run, is
# replaced. The lock is a POSIX record lock on ``.lock`` (not ``flock``: forked data-loader workers do not inherit
# it, so a killed run's orphaned workers cannot keep its folder locked).
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


# ------------------------------------------------------------------------------------------------ the run folder
@dataclass
class RunFolder:
    """What rank 0 holds of the open run folder (:func:`open_run_folder`; released by :func:`close_run_folder`)."""
    output_dir: Path
    run_id: str  # this run's identity (RUN_FILE), stored in every checkpoint
    saver: CheckpointManager
    summary: SummaryWriter
    lock: Optional[FolderLock]
    log_handler: logging.Handler
    last_saved: Optional[int] = None  # the position of the newest checkpoint (a resumed run: the checkpoint's)
    in_final_stage: bool = False  # from here a failure leaves a results.json holding the error
    results_written: bool = False


def open_run_folder(args, ckpt: Optional[Dict[str, Any]], *, kind: str, key: str, default_root: str,
                    default_name: str, decreasing: bool, max_history: int) -> RunFolder:
    """Rank 0: the experiment folder (locked for this process), ``train.log``, ``args.yaml``, the checkpoint
    manager and ``summary.csv``. A new run gets a new folder (``NAME-1`` if NAME exists) and run id; a resumed
    one continues in place only as :func:`_resume_folder` decides, else in a new folder. A folder in use by another
    process, or holding links or FIFOs, is refused. ``decreasing``: the best-checkpoint metric is better when lower;
    ``max_history``: the N best ``checkpoint-<position>.pth`` kept."""
    root = Path(args.output or default_root)
    if os.path.lexists(root) and not root.is_dir():  # a file, FIFO, device or link to none
        raise UsageError(f'--output {root} is not a folder; expected a folder (created if missing)')
    if args.experiment and (Path(args.experiment).name != args.experiment or args.experiment in ('.', '..')):
        raise UsageError(f'--experiment {args.experiment!r} is not a folder name; give a plain name (no '
                         f'"/" or ".."), and the parent folder with --output')
    note, history, lock, last_saved = '', None, None, ckpt.get(key) if ckpt is not None else None
    if args.resume:  # the saved history is checked before any folder is made or touched
        history = CheckpointManager(root, key=key).check_state(
            ckpt.get('checkpoint_history') if ckpt is not None else None, source=f'--resume {args.resume}')
        output_dir, note, lock = _resume_folder(args, ckpt, root, key, last_saved)
    else:
        output_dir = new_run_folder(root, args.experiment or default_name)
    output_dir = output_dir.resolve()
    in_place = lock is not None  # _resume_folder locks (and checks) the folder it continues in place
    log_handler = None
    try:
        if not in_place:
            lock = FolderLock(output_dir)
            check_own_files(output_dir)
        run_id = ckpt['run_id'] if in_place else write_run_id(output_dir, kind)
        log_handler = add_log_file(output_dir / 'train.log')
        if note:
            _logger.warning(note)
        _write_settings(args, output_dir)
        saver = CheckpointManager(output_dir, decreasing=decreasing, max_history=max_history, key=key,
                                  resume_only=() if args.keep_optimizer_state else ('optimizer', 'amp_scaler'))
        summary = SummaryWriter(output_dir / 'summary.csv', key=key)
        if in_place:
            saver.load_state_dict(history)
            summary.truncate(before_epoch=last_saved + 1)
        elif args.resume and resumed_from_a_run(ckpt, args.resume):
            # a new folder for a checkpoint of a run: best / top-N tracking starts afresh, the curve keeps the way
            # here (the summary.csv of another run's folder, or of a folder that is no run, is not this run's past)
            source = Path(args.resume).resolve().parent / 'summary.csv'
            summary.copy_rows(SummaryWriter(source, key=key), before_epoch=last_saved + 1)
    except BaseException:  # a folder that could not be set up is not held
        if log_handler is not None:
            remove_log_file(log_handler)
        if lock is not None:
            lock.release()
        raise
    return RunFolder(output_dir, run_id, saver, summary, lock, log_handler, last_saved)


def _resume_folder(args, ckpt: Dict[str, Any], root: Path, key: str,
                   position: int) -> Tuple[Path, str, Optional[FolderLock]]:
    """(the folder a resumed run writes to, a note to log, the folder's lock: taken when it is the checkpoint's own
    folder, continued in place). In place is decided under the folder's lock, from the folder as it is then: a
    second resume of the same run that loaded its checkpoint before the first took the lock sees the first's
    epochs."""
    resumed = Path(args.resume).resolve()
    source, run_id = resumed.parent, ckpt.get('run_id')
    wanted = root.resolve() / (args.experiment or source.name) if args.output or args.experiment else source
    if wanted != source:
        why = f'--output / --experiment name the folder {wanted}'
    elif (why := newer_than(source, key, position, run_id)) is None:
        # the folder looks like this run's newest state: lock it, then look again
        lock = FolderLock(source)
        check_own_files(source)
        if (why := newer_than(source, key, position, run_id)) is None:
            return source, '', lock
        lock.release()
    folder = new_run_folder(wanted.parent, wanted.name)
    return folder, (f'--resume {args.resume}: {why}; a new run in {folder} starts from {resumed} ({key} '
                    f'{position}), and {source} is left as it is'), None


def _write_settings(args, output_dir: Path) -> None:
    """Remove a killed run's temporary files, then write ``args.yaml`` (the arguments as given; an earlier,
    different one is kept) and ``derived.yaml`` (:class:`~.config.RunArgs`)."""
    removed = clean_stale_temp_files(output_dir)
    if removed:
        _logger.info(f'removed {len(removed)} temporary files left by a killed run: '
                     f'{", ".join(p.name for p in removed)}')
    settings, args_file = args.given(), output_dir / 'args.yaml'
    if args_file.exists():
        try:  # through the one strict yaml reader (bounded size, no aliases or duplicate keys)
            previous = read_yaml_file(str(args_file), 'args.yaml') or {}
        except UsageError:
            previous = None  # unreadable: kept, as a changed one is
        if not isinstance(previous, dict) or _differences(
                *({k: v for k, v in d.items() if k not in RUN_CONTROL_ARGS} for d in (previous, settings))):
            _logger.info(f'the settings changed: the previous args.yaml is kept as {keep_previous(args_file).name}')
    atomic_write_text(args_file, args_to_yaml(settings))
    atomic_write_text(output_dir / 'derived.yaml', args_to_yaml(args.derived))


def close_run_folder(folder: Optional[RunFolder], error: Optional[BaseException], key: str) -> None:
    """However the run ended: a failure of the final stage recorded in ``results.json`` (so a ``--resume`` can say
    what happened), a :class:`RunError` line in ``train.log``, the log file closed and the lock released."""
    if folder is None:
        return
    if isinstance(error, Exception) and folder.in_final_stage and not folder.results_written:
        _record_final_stage_error(folder, error, key)
    if isinstance(error, RunError):
        with open(open_own_file(folder.output_dir / 'train.log', os.O_WRONLY | os.O_APPEND | os.O_CREAT), 'a') as f:
            f.write(f'{datetime.now():%Y-%m-%d %H:%M:%S} ERROR {error}\n')
    remove_log_file(folder.log_handler)
    if folder.lock is not None:
        folder.lock.release()
        folder.lock = None


def _record_final_stage_error(folder: RunFolder, error: BaseException, key: str) -> None:
    message = ' '.join(f'{type(error).__name__}: {error}'.split())[:500]
    try:
        write_results(folder, {'error': message, key: folder.last_saved,
                               'checkpoints': {'last': str(folder.output_dir / 'last.pth')},
                               'note': 'training finished, but its final stage (evaluation / export / results) '
                                       'failed; the weights are in the checkpoints'})
    except OSError as e:  # e.g. the full disk that stopped the stage: the original error is the one to report
        _logger.error(f'could not record the error in results.json either: {e}')
        return
    _logger.error(f'the final stage failed; the error is recorded in {folder.output_dir / "results.json"}')


def log_settings_changes(args) -> None:
    """Log each setting where this resumed run differs from the run it continues: the arguments as given, then the
    values derived from them (a scaled LR after a new ``--batch-size``)."""
    saved = args.resumed_settings
    if not saved:
        return
    given = args.given()
    changed = _differences(saved, {k: given.get(k) for k in saved}, name=lambda k: f'--{k.replace("_", "-")}')
    # the saved derived values are a file's, never used: each shown bounded
    rederived = _differences(args.resumed_derived, args.derived, show=short_repr)
    _logger.info(f'Resuming with the settings of {args.resume}'
                 + (f'; changed: {", ".join(changed)}' if changed else ' (unchanged)')
                 + (f'; derived again: {", ".join(rederived)}' if rederived and args.resumed_derived else ''))


# ------------------------------------------------------------------------------------------------ checkpoints
def save_checkpoint(folder: Optional[RunFolder], args, dist_info: DistInfo, position: int, metric: Optional[float],
                    *, kind: str, key: str, model: nn.Module, optimizer, scheduler, schedule: Dict[str, Any],
                    num_updates: int, loss_scaler=None, **extra) -> Optional[Dict[str, bool]]:
    """Every rank: gather the RNG states; rank 0 (``folder``): write the checkpoint of
    ``position`` (the payload of the module docstring). Returns what was written (rank 0) or None."""
    rng_states = all_gather_objects(get_rng_state(), dist_info)
    if folder is None:
        return None
    folder.last_saved = position
    # threads: a resume computes with the same count (float rounding)
    state = {'version': CHECKPOINT_VERSION, 'kind': kind, 'run_id': folder.run_id, 'threads': torch.get_num_threads(),
             'arch': args.model, key: position, 'num_updates': num_updates,
             'state_dict': unwrap_model(model).state_dict(), 'optimizer': optimizer.state_dict(),
             'scheduler': scheduler.state_dict(), 'schedule': dict(schedule),
             'amp_scaler': loss_scaler.state_dict() if loss_scaler is not None else None,
             'rng_states': rng_states, 'metric': metric, **extra, 'args': args.given(), 'derived': args.derived}
    return folder.saver.save(state, position, metric)


# ------------------------------------------------------------------------------------------------ stops
@contextmanager
def stop_signals() -> Iterator[Callable[[], int]]:
    """Within: SIGINT / SIGTERM only set a flag, read by the returned callable (0: none; no collective,
    :class:`~.loop.StepLoop` agrees on it across ranks), so the loop stops at its next safe point. A second signal
    acts at once (the previous handlers are back after the first)."""
    received, previous = [0], {}

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        previous.clear()

    def on_signal(signum, frame) -> None:
        received[0] = signum
        restore()

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, on_signal)
    try:
        yield lambda: received[0]
    finally:
        restore()


def stop_error(error: Exception, last_path: Optional[Path], last_saved: Optional[int], resume: str, key: str,
               advice: str = '') -> RunError:
    """The :class:`RunError` that ends a run stopped by a NaN / inf loss or a signal: where it happened, which
    checkpoint is intact (only one that exists: this run's ``last_path``, else the ``resume`` one it started from;
    ``last_saved``: the position of the newest save, None before any) and how to go on (``advice``: the flags worth
    changing)."""
    resumed = resume if resume and os.path.isfile(resume) else None
    intact = None
    if last_saved is not None and last_path is not None and last_path.is_file():
        intact, where = last_path, f'{last_path} ({key} {last_saved})'
    elif last_saved is not None and resumed is not None:
        intact, where = resumed, f'{resumed} ({key} {last_saved}, the checkpoint this run resumed from)'
    if isinstance(error, Interrupted):
        tail = (f'the resumable checkpoint is {where}: continue with --resume {intact}' if intact is not None
                else 'no checkpoint had been written yet')
        return Interrupted(error.signum, error.where, f'{error}; {tail}')
    origin = '; it arose in training (weights and optimizer state loaded from files are checked finite)'
    if intact is None:
        return RunError(f'{error}{origin}. No checkpoint had been written yet. {advice}.')
    return RunError(f'{error}{origin}. The last good checkpoint, {where}, is intact. {advice}, or check the '
                    f'data; then restart, or continue with --resume {intact}')


# ------------------------------------------------------------------------------------------------ final outputs
def weights_digests(dist_info: DistInfo, *modules: Optional[nn.Module]) -> List[str]:
    """Every rank's SHA-256 of the weights (equal digests = equal weights); logs an error if they differ."""
    digest = ' '.join(state_dict_digest(unwrap_model(m)) for m in modules if m is not None)
    digests = all_gather_objects(digest, dist_info)
    if len(set(digests)) != 1:
        _logger.error(f'weights differ across ranks: {digests}')
    return digests


def checkpoint_files(folder: RunFolder) -> Dict[str, Optional[str]]:
    """``last.pth`` and ``model_best.pth`` (None when nothing was evaluated), as ``results.json`` names them."""
    return {'last': str(folder.saver.last_path),
            'best': str(folder.saver.best_path) if folder.saver.best_path.exists() else None}


def write_results(folder: RunFolder, results: Dict[str, Any]) -> None:
    """``results.json``; the results of an earlier finish of this run are kept as ``results-N.json``."""
    kept = keep_previous(path := folder.output_dir / 'results.json')
    if kept is not None:
        _logger.info(f'the earlier results.json of this run is kept as {kept.name}')
    write_json(path, results)
    folder.results_written = True


def list_outputs(folder: RunFolder) -> None:
    names = sorted(p.name for p in folder.output_dir.iterdir() if not p.name.startswith('.'))
    _logger.info(f'Outputs in {folder.output_dir}: {", ".join(names)}')
