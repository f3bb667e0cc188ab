""" What is the same in every training run, whatever the task (image epochs, text steps): the arguments with
their resumed settings (:func:`parse_run_args`), AMP, the LR schedule, and :class:`TrainingRun`
(the output folder, resume, checkpoints, stops, ``results.json``).

Checkpoint payload (tensors and plain Python values only, so it loads with ``weights_only=True``)::

    version, kind ('image' | 'text'), run_id (the folder's run.json), threads (a resume keeps them), arch,
    <position key> ('epoch': last completed epoch | 'step': completed updates), num_updates, model_cfg,
    state_dict, optimizer, scheduler, schedule (create_scheduler_v2 kwargs), amp_scaler, rng_states (one per
    rank), metric, args (as given), derived (:class:`~.config.RunArgs`), checkpoint_history, + the task's fields

``model_best.pth`` / ``checkpoint-N.pth`` leave out ``optimizer`` and ``amp_scaler`` unless
``--keep-optimizer-state``; ``--resume`` of such a file needs ``--no-resume-opt``.
"""
import argparse
import logging
import os
import signal
import threading
import time
from contextlib import suppress
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from timm.scheduler import create_scheduler_v2
from timm.utils import NativeScaler, unwrap_model

from mlp_vision.training.run.checkpoint import (
    CHECKPOINT_VERSION, TRUST_FLAG, CheckpointManager, atomic_write_text, check_optimizer_state, check_rng_state,
    check_settings_state, clean_stale_temp_files, get_rng_state, is_count, keep_previous, load_checkpoint_file,
    load_model_weights, open_own_file, set_rng_state)
from mlp_vision.training.run.config import (
    BaseConfigs, RunArgs, args_to_yaml, merge_settings, parse_given, plain_value, read_yaml_file)
from mlp_vision.training.run.distributed import DistInfo, all_gather_objects, state_dict_digest
from mlp_vision.arguments import read_json_file
from mlp_vision.bounds import add_bound_arguments
from mlp_vision.errors import Interrupted, RunError, UsageError, short_repr
from mlp_vision.training.run.log import add_log_file, remove_log_file
from mlp_vision.training.run.loop import UpdateStep  # noqa: F401  (the text trainer imports it from here)
from mlp_vision.training.run.folder import (
    FolderLock, check_own_files, is_run_id, new_run_folder, newer_than, read_run_id, write_run_id)
from mlp_vision.training.run.summary import SummaryWriter, write_json
from mlp_vision.threads import add_threads_argument

__all__ = ['RUN_CONTROL_ARGS', 'add_run_arguments', 'add_common_arguments', 'add_device_arguments', 'parse_run_args',
           'setup_amp', 'create_lr_scheduler', 'TrainingRun']

_logger = logging.getLogger(__name__)

# flags about this invocation, not the run's settings: never taken over from a resumed run
RUN_CONTROL_ARGS = frozenset({
    'config', 'resume', 'trust_checkpoint', 'debug', 'output', 'experiment', 'stop_after_step', 'no_resume_opt',
    'initial_checkpoint', 'pretrained', 'pretrained_path', 'allow_missing_weights',
    'max_params', 'max_activation_gib', 'allow_regex',  # opt-ins past a bound: given again each time, as the trust
})
_SCHEDULERS = ('cosine', 'tanh', 'step', 'multistep', 'poly', 'wsd', 'rsqrt', 'constant', 'plateau')


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


# ------------------------------------------------------------------------------------------------ arguments
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
        for field in ('args', 'derived'):  # mappings keyed by names, as TrainingRun.save writes them
            value = ckpt.get(field)
            if value is not None and not (isinstance(value, dict) and all(isinstance(k, str) for k in value)):
                raise UsageError(f'--resume {resume}: the checkpoint\'s {field} is not a mapping of setting names to '
                                 f'values; the file is damaged or was crafted, and is not used')
        saved = {k: v for k, v in (ckpt.get('args') or {}).items() if k not in RUN_CONTROL_ARGS}
    args, _ = merge_settings(parser, given, base_configs=base_configs, run_settings=saved, recipes=recipes)
    args.resumed_settings = saved
    args.resumed_derived = dict(ckpt.get('derived') or {}) if ckpt is not None else {}
    if ckpt is not None and 'optimizer' not in ckpt and not getattr(args, 'no_resume_opt', False):
        _refuse_weights_only(resume, args)
    return args, ckpt


def _refuse_weights_only(path: str, args: argparse.Namespace) -> None:
    """A best / top-N checkpoint without optimizer state cannot be resumed: say what this trainer offers instead."""
    ways = ['continue from last.pth']
    if hasattr(args, 'no_resume_opt'):
        ways.append('resume from its weights with a fresh optimizer (--no-resume-opt)')
    if hasattr(args, 'initial_checkpoint'):
        ways.append('start a new run from its weights with --initial-checkpoint')
    elif hasattr(args, 'init_from'):
        ways.append('start a classify run from its weights with --init-from')
    raise UsageError(f'--resume {path} holds the weights only (written without --keep-optimizer-state): '
                     f'{", ".join(ways[:-1])} or {ways[-1]}')


# ------------------------------------------------------------------------------------------------ AMP
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


# ------------------------------------------------------------------------------------------------ schedule
def create_lr_scheduler(optimizer: torch.optim.Optimizer, schedule: Dict[str, Any], updates_per_epoch: int = 1):
    """timm's ``create_scheduler_v2(optimizer, **schedule)``; returns (scheduler, total epochs incl. cooldown).
    ``schedule`` holds its keyword arguments and ``lr`` (the optimizer's base LR); every checkpoint stores it
    (:meth:`TrainingRun.restore` continues a changed one from the checkpoint's position)."""
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


def _check_resume_payload(ckpt: Dict[str, Any], key: str, source: str) -> None:
    """The fields of a training checkpoint have the types :meth:`TrainingRun.save` writes; else one line."""
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


# ------------------------------------------------------------------------------------------------ the run
class TrainingRun:
    """The bookkeeping of one training run, used as a context manager around it. ``args`` and ``resume_ckpt``
    (None: not resuming): :func:`parse_run_args`'s; rank 0 of ``dist_info`` writes every file. ``kind``: 'image' or
    'text' (``--resume`` checks it); ``key``: a checkpoint's position, 'epoch' or 'step'; ``decreasing``: the
    best-checkpoint metric is better when lower; ``max_history``: the N best ``checkpoint-<position>.pth`` kept.
    """

    def __init__(self, args, dist_info: DistInfo, resume_ckpt: Optional[Dict[str, Any]], *, kind: str, key: str,
                 prog: str, decreasing: bool, max_history: int = 0):
        self.args, self.dist_info, self.resume_ckpt = args, dist_info, resume_ckpt
        self.kind, self.key, self.prog = kind, key, prog
        self.decreasing, self.max_history = decreasing, max_history
        self.primary = dist_info.primary
        self.output_dir: Optional[Path] = None
        self.saver: Optional[CheckpointManager] = None
        self.summary: Optional[SummaryWriter] = None
        self.run_id: Optional[str] = None  # this run's identity (folder.RUN_FILE), stored in every checkpoint
        if resume_ckpt is not None:
            _check_resume_payload(resume_ckpt, key, f'--resume {args.resume}')
        self.last_saved: Optional[int] = resume_ckpt.get(key) if resume_ckpt is not None else None
        self._log_handlers: List[logging.Handler] = []
        self._signal, self._previous_handlers = 0, {}
        self._lock: Optional[FolderLock] = None
        self._results_written = self._in_final_stage = False
        self.start_time = time.time()

    # ------------------------------------------------------------------ context: signals, log files, errors
    def __enter__(self) -> 'TrainingRun':
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous_handlers[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._restore_signal_handlers()
        if isinstance(exc, Exception):
            self._record_final_stage_error(exc)
        if isinstance(exc, RunError) and self.primary and self.output_dir is not None:
            with open(open_own_file(self.output_dir / 'train.log', os.O_WRONLY | os.O_APPEND | os.O_CREAT), 'a') as f:
                f.write(f'{datetime.now():%Y-%m-%d %H:%M:%S} ERROR {exc}\n')
        for handler in self._log_handlers:
            remove_log_file(handler)
        self._log_handlers.clear()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _on_signal(self, signum, frame) -> None:
        # only a flag: the loop stops at its next safe point. A second signal acts at once (default handlers).
        self._signal = signum
        self._restore_signal_handlers()

    def _restore_signal_handlers(self) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers.clear()

    def stop_signal(self) -> int:
        """This process's SIGINT / SIGTERM number (0: none); no collective (:class:`~.loop.StepLoop` agrees on it
        across the ranks)."""
        return self._signal

    # ------------------------------------------------------------------ resume
    def check_resume(self, **expected) -> None:
        """The resumed checkpoint was made for these settings (e.g. ``arch='smlpnet_t'``, ``task='mlm'``)."""
        ckpt = self.resume_ckpt
        if ckpt is None:
            return
        found = {k: ckpt.get(k) for k in expected}
        if found != expected:
            was, wanted = (', '.join(f'{"model" if k == "arch" else k} {short_repr(v)}' for k, v in d.items())
                           for d in (found, expected))
            raise UsageError(f'--resume {self.args.resume} is a checkpoint of {was}, not of {wanted}; leave these '
                             f'flags out to continue the run as it was')

    def restore(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler, schedule: Dict[str, Any],
                loss_scaler=None, weights_only: bool = False) -> Tuple[int, int]:
        """Load the resumed state into the run's objects; returns the checkpoint's (position, num_updates), (0, 0)
        when not resuming. The schedule continues exactly when ``schedule`` equals the checkpoint's; otherwise (a
        larger ``--epochs``) the new one is positioned at the checkpoint's epoch / update, and the change logged.
        ``weights_only`` (``--no-resume-opt``): weights and position only; the optimizer starts fresh."""
        ckpt = self.resume_ckpt
        if ckpt is None:
            return 0, 0
        source = f'--resume {self.args.resume}'
        try:  # every rank's state, before anything is loaded or a folder opened (restore_rng sets it last)
            for state in ckpt.get('rng_states') or []:
                check_rng_state(state)
        except ValueError as e:
            raise UsageError(f'{source}: its saved random-number state is damaged or crafted ({e}); the file is not '
                             f'used') from None
        load_model_weights(unwrap_model(model), ckpt['state_dict'], source, self.args.model)
        position, num_updates = ckpt[self.key], ckpt.get('num_updates', ckpt[self.key])
        next_epoch = position + 1 if self.key == 'epoch' else position
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
            # the scheduler state after the constructor (which reset the LR): the optimizer state holds the exact
            # LR of the next update, the scheduler state the rest
            scheduler.load_state_dict(ckpt['scheduler'])
            return position, num_updates
        for group, lr in zip(optimizer.param_groups, base_lrs):
            group['initial_lr'] = lr
        _schedule_position(scheduler, next_epoch, num_updates)
        _logger.warning(
            f'{source}: the learning-rate schedule differs from the checkpoint\'s ({"; ".join(changed)}): the new '
            f'{schedule["sched"]} schedule continues from {self.key} {next_epoch if self.key == "epoch" else position}'
            f' at LR {optimizer.param_groups[0]["lr"]:.4g}')
        return position, num_updates

    def restore_ema(self, model_ema: nn.Module) -> None:
        """The resumed EMA weights, when the checkpoint has them (else the EMA starts from the resumed model)."""
        if self.resume_ckpt is not None and self.resume_ckpt.get('state_dict_ema') is not None:
            load_model_weights(model_ema, self.resume_ckpt['state_dict_ema'], f'--resume {self.args.resume} (EMA)',
                               self.args.model)

    def check_not_finished(self, done: int, total: int, flag: str) -> None:
        """Refuse to resume a run that has nothing left to train (its results stay as they are); the message says
        what its folder holds: its results, the error its final stage stopped on, or that it has none."""
        if self.resume_ckpt is None or done < total:
            return
        folder = Path(self.args.resume).resolve().parent
        results, recorded = folder / 'results.json', None
        with suppress(OSError, UsageError):
            recorded = read_json_file(str(results))
        if not self._resumed_from_a_run():
            outcome = f'the checkpoint lies outside its run\'s folder, so {folder} says nothing about its results'
        elif not isinstance(recorded, dict):
            outcome = (f'its final outputs were never written (no readable {results}: the process was stopped '
                       f'during its final stage); its weights are in {folder / "last.pth"}')
        elif recorded.get('error'):
            outcome = (f'its final stage failed ({recorded["error"]}, recorded in {results}); its weights are in '
                       f'{folder / "last.pth"}')
        else:
            outcome = f'results in {results}'
        raise UsageError(f'--resume {self.args.resume}: this run already finished its {total} {self.key}s '
                         f'({outcome}); to train on, pass a larger {flag}')

    def restore_rng(self) -> Optional[Dict[str, Any]]:
        """Restore this rank's RNG states last (nothing built before shifts them); returns the rank's saved state
        (with the trainer's extra fields) or None."""
        ckpt, world = self.resume_ckpt, self.dist_info.world_size
        self.resume_ckpt = None  # free it
        if ckpt is None:
            return None
        states = ckpt.get('rng_states') or []
        if len(states) != world:
            _logger.warning(f'the checkpoint has RNG states for {len(states)} processes, this run has {world}: '
                            f'continuing with fresh seeds (not bit-exact)')
            return None
        try:
            set_rng_state(states[self.dist_info.rank])
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, RuntimeError) as e:
            raise UsageError(f'--resume {self.args.resume}: its saved random-number state is damaged or crafted '
                             f'({type(e).__name__}: {" ".join(str(e).split())[:120]}); the file is not used') from None
        return states[self.dist_info.rank]

    # ------------------------------------------------------------------ outputs
    def open_outputs(self, default_root: str, default_name: str) -> Optional[Path]:
        """Rank 0: the experiment folder (locked for this process), ``train.log``, ``args.yaml``, the checkpoint
        manager and ``summary.csv``. A new run gets a new folder (``NAME-1`` if NAME exists) and run id; a resumed
        one continues in place only as :meth:`_resume_folder` decides, else in a new folder. A folder in use by
        another process, or holding links or FIFOs, is refused."""
        if not self.primary:
            return None
        args = self.args
        root = Path(args.output or default_root)
        if os.path.lexists(root) and not root.is_dir():  # a file, FIFO, device or link to none
            raise UsageError(f'--output {root} is not a folder; expected a folder (created if missing)')
        if args.experiment and (Path(args.experiment).name != args.experiment or args.experiment in ('.', '..')):
            raise UsageError(f'--experiment {args.experiment!r} is not a folder name; give a plain name (no '
                             f'"/" or ".."), and the parent folder with --output')
        note, history = '', None
        if args.resume:
            # the saved history is checked before any folder is made or touched
            history = CheckpointManager(root, key=self.key).check_state(
                self.resume_ckpt.get('checkpoint_history') if self.resume_ckpt is not None else None,
                source=f'--resume {args.resume}')
            output_dir, note = self._resume_folder(root)
        else:
            output_dir = new_run_folder(root, args.experiment or default_name)
        self.output_dir = output_dir = output_dir.resolve()
        in_place = self._lock is not None  # _resume_folder locks (and checks) the folder it continues in place
        if not in_place:
            self._lock = FolderLock(output_dir)
            check_own_files(output_dir)
        self.run_id = self.resume_ckpt['run_id'] if in_place else write_run_id(output_dir, self.kind)
        self._log_handlers.append(add_log_file(output_dir / 'train.log'))
        if note:
            _logger.warning(note)
        self._write_settings(output_dir)
        self.saver = CheckpointManager(output_dir, decreasing=self.decreasing, max_history=self.max_history,
                                       key=self.key, resume_only=() if args.keep_optimizer_state else
                                       ('optimizer', 'amp_scaler'))
        self.summary = SummaryWriter(output_dir / 'summary.csv', key=self.key)
        if in_place:
            self.saver.load_state_dict(history)
            self.summary.truncate(before_epoch=self.last_saved + 1)
        elif args.resume and self._resumed_from_a_run():
            # a new folder for a checkpoint of a run: best / top-N tracking starts afresh, the curve keeps the way
            # here (the summary.csv of another run's folder, or of a folder that is no run, is not this run's past)
            source = Path(args.resume).resolve().parent / 'summary.csv'
            self.summary.copy_rows(SummaryWriter(source, key=self.key), before_epoch=self.last_saved + 1)
        return output_dir

    def _resumed_from_a_run(self) -> bool:
        """The resumed checkpoint lies in the folder of the run it belongs to."""
        run_id = self.resume_ckpt.get('run_id')
        return is_run_id(run_id) and read_run_id(Path(self.args.resume).resolve().parent) == run_id

    def _write_settings(self, output_dir: Path) -> None:
        """Remove a killed run's temporary files, then write ``args.yaml`` (the arguments as given; an earlier,
        different one is kept) and ``derived.yaml`` (:class:`~.config.RunArgs`)."""
        removed = clean_stale_temp_files(output_dir)
        if removed:
            _logger.info(f'removed {len(removed)} temporary files left by a killed run: '
                         f'{", ".join(p.name for p in removed)}')
        settings, args_file = self.args.given(), output_dir / 'args.yaml'
        if args_file.exists():
            try:  # through the one strict yaml reader (bounded size, no aliases or duplicate keys)
                previous = read_yaml_file(str(args_file), 'args.yaml') or {}
            except UsageError:
                previous = None  # unreadable: kept, as a changed one is
            if not isinstance(previous, dict) or _differences(
                    *({k: v for k, v in d.items() if k not in RUN_CONTROL_ARGS} for d in (previous, settings))):
                _logger.info(f'the settings changed: the previous args.yaml is kept as {keep_previous(args_file).name}')
        atomic_write_text(args_file, args_to_yaml(settings))
        atomic_write_text(output_dir / 'derived.yaml', args_to_yaml(self.args.derived))

    def _resume_folder(self, root: Path) -> Tuple[Path, str]:
        """(the folder a resumed run writes to, a note to log: '' when it is the checkpoint's own folder, then locked
        here). In place is decided under the folder's lock, from the folder as it is then: a second resume of the
        same run that loaded its checkpoint before the first took the lock sees the first's epochs."""
        args, resumed = self.args, Path(self.args.resume).resolve()
        source, run_id = resumed.parent, self.resume_ckpt.get('run_id')
        wanted = root.resolve() / (args.experiment or source.name) if args.output or args.experiment else source
        if wanted != source:
            why = f'--output / --experiment name the folder {wanted}'
        elif (why := newer_than(source, self.key, self.last_saved, run_id)) is None:
            # the folder looks like this run's newest state: lock it, then look again
            self._lock = FolderLock(source)
            check_own_files(source)
            if (why := newer_than(source, self.key, self.last_saved, run_id)) is None:
                return source, ''
            self._lock.release()
            self._lock = None
        folder = new_run_folder(wanted.parent, wanted.name)
        return folder, (f'--resume {args.resume}: {why}; a new run in {folder} starts from {resumed} ({self.key} '
                        f'{self.last_saved}), and {source} is left as it is')

    def log_settings_changes(self) -> None:
        """Log each setting where this resumed run differs from the run it continues: the arguments as given, then
        the values derived from them (a scaled LR after a new ``--batch-size``)."""
        args, saved = self.args, self.args.resumed_settings
        if not saved:
            return
        given = args.given()
        changed = _differences(saved, {k: given.get(k) for k in saved}, name=lambda k: f'--{k.replace("_", "-")}')
        # the saved derived values are a file's, never used: each shown bounded
        rederived = _differences(args.resumed_derived, args.derived, show=short_repr)
        _logger.info(f'Resuming with the settings of {args.resume}'
                     + (f'; changed: {", ".join(changed)}' if changed else ' (unchanged)')
                     + (f'; derived again: {", ".join(rederived)}' if rederived and args.resumed_derived else ''))

    # ------------------------------------------------------------------ checkpoints
    def save(self, position: int, metric: Optional[float], *, model: nn.Module, optimizer, scheduler,
             schedule: Dict[str, Any], num_updates: int, loss_scaler=None, rank_extra: Optional[Dict] = None,
             **extra) -> Optional[Dict[str, bool]]:
        """Every rank: gather the RNG states (with ``rank_extra``); rank 0: write the checkpoint of ``position``.
        Returns what was written (rank 0) or None."""
        rng_states = all_gather_objects({**get_rng_state(), **(rank_extra or {})}, self.dist_info)
        self.last_saved = position  # on every rank: they decide together whether a save is due
        if not self.primary:
            return None
        # the payload of the module docstring; threads: a resume computes with the same count (float rounding)
        state = {'version': CHECKPOINT_VERSION, 'kind': self.kind, 'run_id': self.run_id,
                 'threads': torch.get_num_threads(), 'arch': self.args.model, self.key: position,
                 'num_updates': num_updates, 'state_dict': unwrap_model(model).state_dict(),
                 'optimizer': optimizer.state_dict(), 'scheduler': scheduler.state_dict(), 'schedule': dict(schedule),
                 'amp_scaler': loss_scaler.state_dict() if loss_scaler is not None else None,
                 'rng_states': rng_states, 'metric': metric, **extra,
                 'args': self.args.given(), 'derived': self.args.derived}
        return self.saver.save(state, position, metric)

    # ------------------------------------------------------------------ stops
    def stopped(self, error: Exception, advice: str = '') -> RunError:
        """The :class:`RunError` that ends a run stopped by a NaN / inf loss or a signal: where it happened, which
        checkpoint is intact (only one that exists: this run's ``last.pth``, else the one it resumed from) and how to
        go on (``advice``: the flags worth changing)."""
        last = self.saver.last_path if self.saver is not None else None
        resumed = self.args.resume if getattr(self.args, 'resume', '') and os.path.isfile(self.args.resume) else None
        intact = None
        if self.last_saved is not None and last is not None and last.is_file():
            intact, where = last, f'{last} ({self.key} {self.last_saved})'
        elif self.last_saved is not None and resumed is not None:
            intact, where = resumed, f'{resumed} ({self.key} {self.last_saved}, the checkpoint this run resumed from)'
        if isinstance(error, Interrupted):
            tail = (f'the resumable checkpoint is {where}: continue with --resume {intact}' if intact is not None
                    else 'no checkpoint had been written yet')
            return Interrupted(error.signum, error.where, f'{error}; {tail}')
        origin = '; it arose in training (weights and optimizer state loaded from files are checked finite)'
        if intact is None:
            return RunError(f'{error}{origin}. No checkpoint had been written yet. {advice}.')
        return RunError(f'{error}{origin}. The last good checkpoint, {where}, is intact. {advice}, or check the '
                        f'data; then restart, or continue with --resume {intact}')

    # ------------------------------------------------------------------ final outputs
    def weights_digests(self, *modules: nn.Module) -> List[str]:
        """Every rank's SHA-256 of the weights (equal digests = equal weights); logs an error if they differ."""
        digest = ' '.join(state_dict_digest(unwrap_model(m)) for m in modules if m is not None)
        digests = all_gather_objects(digest, self.dist_info)
        if len(set(digests)) != 1:
            _logger.error(f'weights differ across ranks: {digests}')
        return digests

    def checkpoint_files(self) -> Dict[str, Optional[str]]:
        """``last.pth`` and ``model_best.pth`` (None when nothing was evaluated), as ``results.json`` names them."""
        return {'last': str(self.saver.last_path),
                'best': str(self.saver.best_path) if self.saver.best_path.exists() else None}

    def write_results(self, results: Dict[str, Any]) -> None:
        """``results.json`` (rank 0); the results of an earlier finish of this run are kept as ``results-N.json``."""
        kept = keep_previous(path := self.output_dir / 'results.json')
        if kept is not None:
            _logger.info(f'the earlier results.json of this run is kept as {kept.name}')
        write_json(path, results)
        self._results_written = True

    def begin_final_stage(self) -> None:
        """From here on (final evaluation, exports) a failure still leaves a ``results.json`` holding the error
        (:meth:`__exit__`), so a ``--resume`` can say what happened."""
        self._in_final_stage = True

    def _record_final_stage_error(self, error: BaseException) -> None:
        if not (self.primary and self.output_dir is not None and self._in_final_stage) or self._results_written:
            return
        message = ' '.join(f'{type(error).__name__}: {error}'.split())[:500]
        try:
            self.write_results({'error': message, self.key: self.last_saved,
                                'checkpoints': {'last': str(self.output_dir / 'last.pth')},
                                'note': 'training finished, but its final stage (evaluation / export / results) '
                                        'failed; the weights are in the checkpoints'})
        except OSError as e:  # e.g. the full disk that stopped the stage: the original error is the one to report
            _logger.error(f'could not record the error in results.json either: {e}')
            return
        _logger.error(f'the final stage failed; the error is recorded in {self.output_dir / "results.json"}')

    def list_outputs(self) -> None:
        names = sorted(p.name for p in self.output_dir.iterdir() if not p.name.startswith('.'))
        _logger.info(f'Outputs in {self.output_dir}: {", ".join(names)}')
