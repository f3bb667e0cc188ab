""" A training run's files and their safety, as :mod:`mlp_vision.train` calls them: :func:`parse_run_args`, the
resumed state (checked, then loaded before any folder is opened), :func:`open_run_folder`, :func:`restore_rng` last,
:func:`save_checkpoint`, :func:`stop_error`, :func:`write_results`, :func:`close_run_folder`.

Checkpoint payload (tensors and plain Python values only, so it loads with ``weights_only=True``)::

    version, kind ('image'), run_id (the folder's run.json), threads (a resume keeps them), arch, epoch (the last
    completed), num_updates, model_cfg, state_dict, optimizer, scheduler, schedule (create_scheduler_v2 kwargs),
    amp_scaler, rng_states (one per rank), metric, args (as given), derived (:class:`~mlp_vision.arguments.RunArgs`),
    checkpoint_history, + the trainer's fields
"""
import argparse
import csv
import itertools
import json
import logging
import math
import os
import random
import signal
import threading
import uuid
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from timm.utils import unwrap_model

from mlp_vision.arguments import (
    BaseConfigs, RunArgs, args_to_yaml, merge_settings, parse_given, plain_value, read_json_file, read_yaml_file)
from mlp_vision.errors import Interrupted, RunError, UsageError, short_repr
from mlp_vision.outputs import (
    add_log_file, atomic_link, atomic_save, atomic_write_text, clean_stale_temp_files, keep_previous, json_text,
    open_own_file, remove_log_file)
from mlp_vision.weights import load_checkpoint_file, load_model_weights

try:
    import fcntl
except ImportError:  # Windows: no advisory locks
    fcntl = None

_logger = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1
# flags about this invocation, not the run's settings: never taken over from a resumed run
RUN_CONTROL_ARGS = frozenset({
    'config', 'resume', 'trust_checkpoint', 'debug', 'output', 'experiment', 'no_resume_opt',
    'initial_checkpoint', 'pretrained', 'pretrained_path', 'allow_missing_weights',
    'max_params', 'max_activation_gib', 'allow_regex',  # opt-ins past a bound: given again each time, as the trust
})
RUN_FILE = 'run.json'  # a run folder's identity
_DAMAGED = 'the file is damaged or was crafted, and is not used'


def parse_run_args(parser: argparse.ArgumentParser, argv: Sequence[str], base_configs: BaseConfigs = (),
                   recipes: bool = False) -> Tuple[RunArgs, Optional[Dict[str, Any]]]:
    """(args, the ``--resume`` checkpoint of ``args.model`` or None); its saved arguments are the defaults under
    ``-c`` and the flags (``args.resumed_settings``; its ``derived``: ``args.resumed_derived``)."""
    given = parse_given(parser, argv)
    resume = given.get('resume', '')
    ckpt, saved = None, {}
    if resume:
        ckpt = load_checkpoint_file(resume, trust=given.get('trust_checkpoint', False), what='--resume')
        if ckpt.get('kind', 'image') != 'image' or 'state_dict' not in ckpt or not (
                'optimizer' in ckpt or 'checkpoint_history' in ckpt):  # the latter: a weights-only best / top-N
            raise UsageError(f'--resume {resume} is not a training checkpoint of {parser.prog}; expected the last.pth '
                             f'(or checkpoint-N.pth) of an image training run')
        check_resume_payload(ckpt, f'--resume {resume}')
        saved = {k: v for k, v in (ckpt.get('args') or {}).items() if k not in RUN_CONTROL_ARGS}
    args, _ = merge_settings(parser, given, base_configs=base_configs, run_settings=saved, recipes=recipes)
    args.resumed_settings = saved
    args.resumed_derived = dict(ckpt.get('derived') or {}) if ckpt is not None else {}
    if ckpt is not None and ckpt.get('arch') != args.model:
        raise UsageError(f'--resume {resume} is a checkpoint of model {short_repr(ckpt.get("arch"))}, not of '
                         f'{args.model!r}; leave --model out to continue the run as it was')
    if ckpt is not None and 'optimizer' not in ckpt and not args.no_resume_opt:
        raise UsageError(f'--resume {resume} holds the weights only (written without --keep-optimizer-state): '
                         f'continue from last.pth, resume from its weights with a fresh optimizer (--no-resume-opt) '
                         f'or start a new run from its weights with --initial-checkpoint')
    return args, ckpt


def _differences(old: Dict[str, Any], new: Dict[str, Any], name: Callable[[str], str] = str,
                 show: Callable[[Any], str] = repr) -> List[str]:
    """``'<name(key)> <new value> (was <old value>)'`` for each key whose plain values differ."""
    plain = {k: (plain_value(old.get(k)), plain_value(new.get(k))) for k in sorted(set(old) | set(new))}
    return [f'{name(k)} {show(b)} (was {show(a)})' for k, (a, b) in plain.items() if a != b]


# ------------------------------------------------------------------------------------------------ saved values
# A checkpoint's states are data, checked before they are loaded: schedulers and scalers assign saved entries to
# attributes, and a saved NaN would train on NaN.
def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_plain(value: Any, live: Any = None) -> bool:
    """None, a bool, number or string, or a list / tuple / str-keyed dict of such, without NaN or infinity (an
    infinity is kept where the ``live`` value in its place is infinite too: a plateau scheduler's starting best)."""
    if isinstance(value, float) and not math.isfinite(value):
        return not math.isnan(value) and isinstance(live, float) and math.isinf(live)
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return isinstance(value, (list, tuple)) and all(map(_is_plain, value))


def check_settings(saved: Any, live: Dict[str, Any], name: Callable[[str], str], none_for_number: bool = True) -> None:
    """A saved state (a scheduler's, a scaler's, an optimizer group's settings) is a dict of entries ``live`` has, of
    plain values, a number where the live one is (or None, if ``none_for_number``); else a ``ValueError``."""
    if not isinstance(saved, dict):
        raise ValueError(f'{name("")} is a {type(saved).__name__}, not a state dict')
    for k, v in saved.items():
        if k not in live:
            raise ValueError(f'{name(k)} is no entry of the live state')
        if not _is_plain(v, live[k]) or _is_number(live[k]) and not (
                _is_number(v) or none_for_number and v is None):
            raise ValueError(f'{name(k)} is {short_repr(v)}: not a finite value of its kind')


def check_optimizer_state(saved: Any, optimizer: torch.optim.Optimizer) -> None:
    """A saved optimizer state fits ``optimizer``: groups of the same keys and parameter counts and settings as
    :func:`check_settings`, per-parameter states finite numbers or tensors no larger in rank than their parameter (of
    its shape when of its rank); else a ``ValueError``."""
    live_groups = optimizer.param_groups
    groups = saved['param_groups'] if isinstance(saved, dict) and set(saved) == {'state', 'param_groups'} else None
    if not isinstance(groups, list) or len(groups) != len(live_groups):
        raise ValueError(f'the optimizer state is not a {{state, param_groups}} dict of this optimizer\'s '
                         f'{len(live_groups)} parameter groups')
    params = {}
    for i, (group, live) in enumerate(zip(groups, live_groups)):
        ids = group.get('params') if isinstance(group, dict) and set(group) == set(live) else None
        if not isinstance(ids, list) or len(ids) != len(live['params']) or not all(_is_number(j) for j in ids):
            raise ValueError(f'optimizer parameter group {i} is not one of this optimizer\'s')
        params.update(zip(ids, live['params']))
        check_settings({k: v for k, v in group.items() if k != 'params'}, live,
                       lambda k: f'optimizer setting {k!r} of group {i}', none_for_number=False)
    state = saved['state']
    if not (isinstance(state, dict) and set(state) <= set(params) and all(isinstance(e, dict) for e in state.values())):
        raise ValueError('the optimizer state is not a dict of per-parameter dicts for the parameters the groups list')
    for j, entry in state.items():
        p = params[j]
        for k, v in entry.items():
            fits = _is_plain(v) and _is_number(v) or isinstance(v, torch.Tensor) and (
                v.dim() < p.dim() or v.shape == p.shape) and (v.is_floating_point() or v.dim() == 0) and bool(
                torch.isfinite(v).all())  # a NaN exp_avg: the first step would write NaN into the weights
            if not fits:
                raise ValueError(f'the optimizer state {k!r} of parameter {j} does not fit a parameter of shape '
                                 f'{tuple(p.shape)} (finite numbers or tensors)')


def check_resume_payload(ckpt: Dict[str, Any], source: str) -> None:
    """The fields of a training checkpoint have the types :func:`save_checkpoint` writes; else one line."""
    def mapping(value):  # keyed by names, as save_checkpoint writes args and derived
        return isinstance(value, dict) and all(isinstance(k, str) for k in value)
    required = {'epoch': is_count(ckpt.get('epoch')),
                'num_updates': is_count(ckpt.get('num_updates', ckpt.get('epoch'))),
                'state_dict': mapping(ckpt.get('state_dict')) and all(
                    isinstance(v, torch.Tensor) for v in ckpt['state_dict'].values()),
                'scheduler': mapping(ckpt.get('scheduler'))}
    optional = {'state_dict_ema': mapping, 'schedule': mapping, 'rng_states': lambda v: isinstance(v, list),
                'run_id': is_run_id, 'threads': is_count, 'args': mapping, 'derived': mapping}  # or None
    problems = [k for k, ok in required.items() if not ok] + [
        k for k, ok in optional.items() if ckpt.get(k) is not None and not ok(ckpt[k])]
    if problems:
        raise UsageError(f'{source}: the checkpoint\'s {", ".join(problems)} {"is" if len(problems) == 1 else "are"} '
                         f'not what this trainer writes; {_DAMAGED}')


# ------------------------------------------------------------------------------------------------ resume
def restore_training_state(ckpt: Optional[Dict[str, Any]], resume: str, model_name: str, model: nn.Module,
                           optimizer: torch.optim.Optimizer, scheduler, schedule: Dict[str, Any], loss_scaler=None,
                           weights_only: bool = False) -> Tuple[int, int]:
    """Load ``ckpt`` (None: not resuming) into the run's objects; returns its (epoch, num_updates), else (0, 0). A
    ``schedule`` other than the checkpoint's (a larger ``--epochs``) continues from its epoch / update, logged."""
    if ckpt is None:
        return 0, 0
    source = f'--resume {resume}'
    try:  # every rank's state, before anything is loaded or a folder opened (restore_rng sets it last)
        for state in ckpt.get('rng_states') or []:
            set_rng_state(state, check=True)
    except ValueError as e:
        raise UsageError(f'{source}: {e}; {_DAMAGED}') from None
    load_model_weights(unwrap_model(model), ckpt['state_dict'], source, model_name)
    epoch, num_updates = ckpt['epoch'], ckpt.get('num_updates', ckpt['epoch'])
    if weights_only:  # each of the two acts only in its scheduler's unit (t_in_epochs)
        scheduler.step(epoch + 1)
        scheduler.step_update(num_updates)
        return epoch, num_updates
    base_lrs = [g['initial_lr'] for g in optimizer.param_groups]
    changed = (_differences(ckpt['schedule'], schedule) if ckpt.get('schedule') is not None
               else ['the checkpoint records no schedule'])
    scaler_state = ckpt.get('amp_scaler') if loss_scaler is not None else None
    try:  # checked before anything is loaded
        check_optimizer_state(ckpt['optimizer'], optimizer)
        for what, saved, live in (('the AMP loss-scaler state', scaler_state, loss_scaler),
                                  ('the scheduler state', None if changed else ckpt['scheduler'], scheduler)):
            if saved:
                check_settings(saved, live.state_dict(), lambda k, what=what: f'{what} entry {k!r}' if k else what)
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
        return epoch, num_updates
    for group, lr in zip(optimizer.param_groups, base_lrs):
        group['initial_lr'] = lr
    scheduler.step(epoch + 1)
    scheduler.step_update(num_updates)
    _logger.warning(
        f'{source}: the learning-rate schedule differs from the checkpoint\'s ({"; ".join(changed)}): the new '
        f'{schedule["sched"]} schedule continues from epoch {epoch + 1} at LR {optimizer.param_groups[0]["lr"]:.4g}')
    return epoch, num_updates


def restore_ema(ckpt: Optional[Dict[str, Any]], resume: str, model_name: str, model_ema: nn.Module) -> None:
    """The resumed EMA weights, when the checkpoint has them (else the EMA starts from the resumed model)."""
    if ckpt is not None and ckpt.get('state_dict_ema') is not None:
        load_model_weights(model_ema, ckpt['state_dict_ema'], f'--resume {resume} (EMA)', model_name)


def resumed_from_a_run(ckpt: Dict[str, Any], resume: str) -> bool:
    """The resumed checkpoint lies in the folder of the run it belongs to."""
    run_id = ckpt.get('run_id')
    return is_run_id(run_id) and read_run_id(Path(resume).resolve().parent) == run_id


def check_not_finished(ckpt: Optional[Dict[str, Any]], resume: str, done: int, total: int) -> None:
    """Refuse to resume a run with nothing left to train, saying what its folder holds (results, an error, none)."""
    if ckpt is None or done < total:
        return
    folder = Path(resume).resolve().parent
    results, recorded, weights = folder / 'results.json', None, f'its weights are in {folder / "last.pth"}'
    with suppress(OSError, UsageError):
        recorded = read_json_file(str(results))
    if not resumed_from_a_run(ckpt, resume):
        outcome = f'the checkpoint lies outside its run\'s folder, so {folder} says nothing about its results'
    elif not isinstance(recorded, dict):
        outcome = (f'its final outputs were never written (no readable {results}: the process was stopped '
                   f'during its final stage); {weights}')
    elif recorded.get('error'):
        outcome = f'its final stage failed ({recorded["error"]}, recorded in {results}); {weights}'
    else:
        outcome = f'results in {results}'
    raise UsageError(f'--resume {resume}: this run already finished its {total} epochs ({outcome}); to train on, '
                     f'pass a larger --epochs')


# ------------------------------------------------------------------------------------------------ random states
def get_rng_state() -> Dict[str, Any]:
    """Python, numpy and torch (CPU, and CUDA if initialised) RNG states as tensors / plain Python values."""
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    state = {'python': random.getstate(), 'torch': torch.get_rng_state(),
             'numpy': {'name': name, 'keys': torch.from_numpy(keys.astype(np.int64)), 'pos': int(pos),
                       'has_gauss': int(has_gauss), 'cached_gaussian': float(cached_gaussian)}}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any], check: bool = False) -> None:
    """Set the states :func:`get_rng_state` gave (``check``: on new generators instead); a part that is not such a
    state is a ``ValueError`` naming it, also where the setters take it (Python hands out a saved gauss as drawn;
    numpy reads past its 624 words from a larger position)."""
    py_rng, np_rng, torch_rng = (random.Random(), np.random.RandomState(), torch.Generator()) if check else (
        random, np.random, torch.default_generator)
    part = 'saved'
    try:
        part, (version, words, gauss) = 'Python', state['python']  # a weights-only load gives lists for tuples
        if not (gauss is None or isinstance(gauss, float)):
            raise TypeError
        py_rng.setstate((version, tuple(words), gauss))
        part, n = 'numpy', state['numpy']
        if not (is_count(n['pos']) and n['pos'] <= 624):
            raise ValueError
        np_rng.set_state((n['name'], n['keys'].numpy().astype(np.uint32), n['pos'], n['has_gauss'],
                          n['cached_gaussian']))
        part = 'torch'
        torch_rng.set_state(state['torch'])
        part, cuda = 'CUDA', state.get('cuda')
        if cuda is not None and not all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in cuda):
            raise TypeError
        if cuda is not None and not check and torch.cuda.is_available():
            if len(cuda) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(cuda)
            else:
                _logger.warning('checkpoint has CUDA RNG states for another GPU count; CUDA RNG not restored')
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, RuntimeError, OverflowError) as e:
        raise ValueError(f'its {part} random-number state is not one this trainer writes ({type(e).__name__})'
                         ) from None


@contextmanager
def preserve_rng():
    """Code in the block cannot shift training's random streams."""
    state = get_rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


def restore_rng(ckpt: Optional[Dict[str, Any]], resume: str, dist_info) -> None:
    """This rank's RNG states from ``ckpt`` (None: not resuming); called last, so nothing built before shifts them."""
    if ckpt is None:
        return
    states, world = ckpt.get('rng_states') or [], dist_info.world_size
    if len(states) != world:
        _logger.warning(f'the checkpoint has RNG states for {len(states)} processes, this run has {world}: '
                        f'continuing with fresh seeds (not bit-exact)')
        return
    try:
        set_rng_state(states[dist_info.rank])
    except ValueError as e:  # a CUDA state of another size: only setting it tells
        raise UsageError(f'--resume {resume}: {e}; {_DAMAGED}') from None


# ------------------------------------------------------------------------------------------------ folder identity
# Every folder a trainer creates holds ``run.json`` (``{"run_id": <32 hex digits>, "kind": "image"}``), and every
# checkpoint it writes the same ``run_id``: ``--resume`` continues in place only in the checkpoint's own run folder
# (:func:`newer_than`), so nothing of another run, or of a folder that is no run, is replaced.
def new_run_folder(root: os.PathLike, name: str) -> Path:
    """``root/name``, or the first free ``root/name-N``, created (atomically: two runs never share one)."""
    Path(root).mkdir(parents=True, exist_ok=True)
    for n in itertools.count():
        folder = Path(root) / (name if n == 0 else f'{name}-{n}')
        with suppress(FileExistsError):
            folder.mkdir()
            return folder


def is_run_id(value) -> bool:  # as uuid4().hex
    return isinstance(value, str) and len(value) == 32 and set(value) <= set('0123456789abcdef')


def read_run_id(folder: Path) -> Optional[str]:
    """The id in ``folder/run.json``; None when it is not a small regular file of our format."""
    try:  # a link, FIFO or device there: open_own_file's UsageError (a ValueError)
        with open(open_own_file(folder / RUN_FILE, os.O_RDONLY), encoding='utf-8') as f:
            run_id = json.loads(f.read(4097)).get('run_id')
    except (OSError, ValueError, AttributeError):
        return None
    return run_id if is_run_id(run_id) else None


def lock_folder(folder: Path) -> Optional[int]:
    """Take ``folder`` for this process: the descriptor of its locked ``.lock`` (None on Windows). Refused: a folder
    another process holds, or holding a link, FIFO, device or socket (the run would write through it or block). A
    POSIX record lock, not ``flock``: a killed run's orphaned loader workers do not inherit it."""
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_symlink() or not (entry.is_file(follow_symlinks=False) or entry.is_dir(follow_symlinks=False)):
                what = 'a symbolic link' if entry.is_symlink() else 'not a regular file (a FIFO, device or socket)'
                raise UsageError(f'{folder} holds {entry.name}, {what}; a run writes only files of its own: remove '
                                 f'it, or continue in a new folder with --output / --experiment')
    if fcntl is None:
        return None
    fd = open_own_file(folder / '.lock', os.O_RDWR | os.O_CREAT)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 32).decode(errors='replace').strip()
        os.close(fd)
        raise UsageError(f'{folder} is in use by another training process (pid {holder or "unknown"}); wait for it '
                         f'to end, or pass --output / --experiment to continue in a new folder') from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def _unlock(fd: Optional[int]) -> None:
    if fd is not None:
        os.close(fd)


def peek_checkpoint(path: Path) -> Dict[str, Any]:
    """Checkpoint ``path`` memory-mapped (its tensors are not read), for its plain fields; {} if unreadable."""
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True, mmap=True)
    except Exception:  # any unreadable file
        return {}
    return ckpt if isinstance(ckpt, dict) else {}


def newer_than(folder: Path, epoch: int, run_id: Optional[str]) -> Optional[str]:
    """Why ``folder`` may not continue in place from the checkpoint of run ``run_id`` at ``epoch``, or None when it
    may: the folder is that run and its newest epoch -- ``last.pth``'s, else that of its ``checkpoint-N.pth`` files
    and ``summary.csv`` rows -- is ``epoch`` (rows past ``last.pth`` are dropped on resume)."""
    folder_id = read_run_id(folder)
    if not is_run_id(run_id):
        return 'the checkpoint carries no run id (it was written before runs had one, or elsewhere)'
    if folder_id is None:
        return f'{folder} is not a run folder (no readable {RUN_FILE})'
    if folder_id != run_id:
        return f'{folder} is another run (run id {folder_id[:8]}, the checkpoint\'s {run_id[:8]})'
    last = folder / 'last.pth'
    if os.path.lexists(last):
        saved = peek_checkpoint(last)
        later = saved.get('epoch')
        if not is_count(later):
            return f'{folder} has a last.pth that cannot be read'
        if saved.get('run_id') != run_id:
            return f'{folder}\'s last.pth belongs to another run'
        return f'{folder} has reached epoch {later}' if later > epoch else None
    files = [int(p.stem[11:]) for p in folder.glob('checkpoint-*.pth') if p.stem[11:].isdigit()]  # as file_name gives
    try:
        rows = [int(r['epoch']) for r in SummaryWriter(folder / 'summary.csv').read()]
    except (OSError, csv.Error, UnicodeDecodeError):
        return f'{folder} has no last.pth and a summary.csv that cannot be read'
    later = max(files + rows, default=epoch)
    return (f'{folder} has no last.pth but has reached epoch {later} (its checkpoint-N.pth files and summary rows)'
            if later > epoch else None)


# ------------------------------------------------------------------------------------------------ the run folder
@dataclass
class RunFolder:
    """What rank 0 holds of the open run folder (:func:`open_run_folder`; released by :func:`close_run_folder`)."""
    output_dir: Path
    run_id: str  # this run's identity (RUN_FILE), stored in every checkpoint
    saver: 'CheckpointManager'
    summary: 'SummaryWriter'
    lock: Optional[int]  # lock_folder's descriptor
    log_handler: logging.Handler
    last_saved: Optional[int] = None  # the epoch of the newest checkpoint (a resumed run: the checkpoint's)
    in_final_stage: bool = False  # from here a failure leaves a results.json holding the error
    results_written: bool = False


def open_run_folder(args, ckpt: Optional[Dict[str, Any]], *, default_root: str, default_name: str,
                    decreasing: bool, max_history: int) -> RunFolder:
    """Rank 0: the locked experiment folder, ``train.log``, ``args.yaml``, ``derived.yaml``, the checkpoint manager
    and ``summary.csv``; a new run gets a new folder (``NAME-1`` if NAME exists) and run id, a resumed one continues
    in place only as :func:`_resume_folder` decides. ``decreasing``, ``max_history``: :class:`CheckpointManager`'s."""
    root = Path(args.output or default_root)
    if os.path.lexists(root) and not root.is_dir():  # a file, FIFO, device or link to none
        raise UsageError(f'--output {root} is not a folder; expected a folder (created if missing)')
    if args.experiment and (Path(args.experiment).name != args.experiment or args.experiment in ('.', '..')):
        raise UsageError(f'--experiment {args.experiment!r} is not a folder name; give a plain name (no '
                         f'"/" or ".."), and the parent folder with --output')
    note, history, lock, last_saved = '', None, None, ckpt.get('epoch') if ckpt is not None else None
    if args.resume:  # the saved history is checked before any folder is made or touched
        history = CheckpointManager(root).check_state(ckpt.get('checkpoint_history'), source=f'--resume {args.resume}')
        output_dir, note, lock = _resume_folder(args, ckpt, root, last_saved)
    else:
        output_dir = new_run_folder(root, args.experiment or default_name)
    output_dir = output_dir.resolve()
    in_place = note is None  # _resume_folder has locked (and checked) the folder it continues in place
    log_handler = None
    try:
        run_id = ckpt['run_id'] if in_place else uuid.uuid4().hex
        if not in_place:  # a new run: its identity
            lock = lock_folder(output_dir)
            atomic_write_text(output_dir / RUN_FILE, json.dumps({'run_id': run_id, 'kind': 'image'}) + '\n')
        log_handler = add_log_file(output_dir / 'train.log')
        if note:
            _logger.warning(note)
        if removed := clean_stale_temp_files(output_dir):
            _logger.info(f'removed the temporary files a killed run left: {", ".join(p.name for p in removed)}')
        settings, args_file = args.given(), output_dir / 'args.yaml'
        if args_file.exists():  # an earlier one of other settings (or unreadable) is kept
            try:  # through the one strict yaml reader (bounded size, no aliases or duplicate keys)
                previous = read_yaml_file(str(args_file), 'args.yaml') or {}
            except UsageError:
                previous = None
            if not isinstance(previous, dict) or _differences(
                    *({k: v for k, v in d.items() if k not in RUN_CONTROL_ARGS} for d in (previous, settings))):
                _logger.info(f'the settings changed: the previous args.yaml is kept as {keep_previous(args_file).name}')
        atomic_write_text(args_file, args_to_yaml(settings))
        atomic_write_text(output_dir / 'derived.yaml', args_to_yaml(args.derived))
        saver = CheckpointManager(output_dir, decreasing=decreasing, max_history=max_history,
                                  resume_only=() if args.keep_optimizer_state else ('optimizer', 'amp_scaler'))
        summary = SummaryWriter(output_dir / 'summary.csv')
        if in_place:  # (in a new folder, best / top-N tracking starts afresh)
            saver.load_state_dict(history, source=f'--resume {args.resume}')
        if args.resume and resumed_from_a_run(ckpt, args.resume):  # the curve up to the checkpoint; the summary.csv
            # of another run's folder, or of a folder that is no run, is not this run's past
            rows = SummaryWriter(Path(args.resume).resolve().parent / 'summary.csv').read(last_saved + 1)
            if rows or summary.path.exists():
                summary.write(rows)
    except BaseException:  # a folder that could not be set up is not held
        if log_handler is not None:
            remove_log_file(log_handler)
        _unlock(lock)
        raise
    return RunFolder(output_dir, run_id, saver, summary, lock, log_handler, last_saved)


def _resume_folder(args, ckpt: Dict[str, Any], root: Path, epoch: int) -> Tuple[Path, Optional[str], Optional[int]]:
    """(the folder a resumed run writes to, why it is a new one: None in place, the lock taken in place); decided
    again under the lock: a second resume of the run sees the epochs the first wrote meanwhile."""
    resumed = Path(args.resume).resolve()
    source, run_id = resumed.parent, ckpt.get('run_id')
    wanted = root.resolve() / (args.experiment or source.name) if args.output or args.experiment else source
    if wanted != source:
        why = f'--output / --experiment name the folder {wanted}'
    elif (why := newer_than(source, epoch, run_id)) is None:
        # the folder looks like this run's newest state: lock it, then look again
        lock = lock_folder(source)
        if (why := newer_than(source, epoch, run_id)) is None:
            return source, None, lock
        _unlock(lock)
    folder = new_run_folder(wanted.parent, wanted.name)
    return folder, (f'--resume {args.resume}: {why}; a new run in {folder} starts from {resumed} (epoch '
                    f'{epoch}), and {source} is left as it is'), None


def close_run_folder(folder: Optional[RunFolder], error: Optional[BaseException]) -> None:
    """However the run ended: a failure of the final stage recorded in ``results.json``, a :class:`RunError` line in
    ``train.log``, the log file closed and the lock released."""
    if folder is None:
        return
    if isinstance(error, Exception) and folder.in_final_stage and not folder.results_written:
        try:
            write_results(folder, {'error': ' '.join(f'{type(error).__name__}: {error}'.split())[:500],
                                   'epoch': folder.last_saved,
                                   'checkpoints': {'last': str(folder.output_dir / 'last.pth')},
                                   'note': 'training finished, but its final stage (evaluation / export / results) '
                                           'failed; the weights are in the checkpoints'})
            _logger.error(f'the final stage failed; the error is recorded in {folder.output_dir / "results.json"}')
        except OSError as e:  # e.g. the full disk that stopped the stage: the original error is the one to report
            _logger.error(f'could not record the error in results.json either: {e}')
    if isinstance(error, RunError):  # train.log only: run_cli prints it
        folder.log_handler.handle(logging.LogRecord(__name__, logging.ERROR, '', 0, f'ERROR {error}', None, None))
    remove_log_file(folder.log_handler)
    _unlock(folder.lock)
    folder.lock = None


def log_settings_changes(args) -> None:
    """Log the settings where this resumed run differs from the one it continues: as given, then as derived."""
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
def save_checkpoint(folder: Optional[RunFolder], args, dist_info, epoch: int, metric: Optional[float], *,
                    model: nn.Module, optimizer, scheduler, schedule: Dict[str, Any], num_updates: int,
                    loss_scaler=None, **extra) -> Optional[Dict[str, bool]]:
    """Every rank: gather the RNG states; rank 0 (``folder``): write the checkpoint of ``epoch``, return what was."""
    rng_states = all_gather_objects(get_rng_state(), dist_info)
    if folder is None:
        return None
    folder.last_saved = epoch
    state = {'version': CHECKPOINT_VERSION, 'kind': 'image', 'run_id': folder.run_id,
             'threads': torch.get_num_threads(),  # a resume computes with the same count (float rounding)
             'arch': args.model, 'epoch': epoch, 'num_updates': num_updates,
             'state_dict': unwrap_model(model).state_dict(), 'optimizer': optimizer.state_dict(),
             'scheduler': scheduler.state_dict(), 'schedule': dict(schedule),
             'amp_scaler': loss_scaler.state_dict() if loss_scaler is not None else None,
             'rng_states': rng_states, 'metric': metric, **extra, 'args': args.given(), 'derived': args.derived}
    return folder.saver.save(state, epoch, metric)


class CheckpointManager:
    """``last.pth`` every epoch, ``model_best.pth`` and the ``max_history`` best ``checkpoint-<epoch>.pth`` (without
    the ``resume_only`` fields; else hard links of one file). Written in order: best / top-N, ``last.pth`` with the
    new history, the removal of the file that fell out of the top N (named from its epoch, never a saved path).
    Not timm's ``CheckpointSaver`` (whose ranking this follows): it renames over files, writes through links, tracks
    the best only inside a top-N slot and deletes the paths a restored state names."""

    def __init__(self, output_dir: os.PathLike, decreasing: bool = False, max_history: int = 3,
                 resume_only: Sequence[str] = ()):
        self.output_dir, self.resume_only = Path(output_dir), tuple(resume_only)
        self.last_path, self.best_path = self.output_dir / 'last.pth', self.output_dir / 'model_best.pth'
        self.decreasing, self.max_history = decreasing, max_history
        self.history: List[Dict[str, Any]] = []  # [{'epoch', 'metric', 'file'}], best first
        self.best: Optional[Dict[str, Any]] = None  # {'epoch', 'metric'}: what model_best.pth holds

    @staticmethod
    def file_name(epoch: int) -> str:
        """The top-N file of ``epoch``: the only kind of file this class ever deletes."""
        return f'checkpoint-{epoch}.pth'

    def _checked_entry(self, entry: Any, with_file: bool) -> Dict[str, Any]:
        """``entry`` as :meth:`save` writes it, or a ``ValueError``."""
        keys = {'epoch', 'metric'} | ({'file'} if with_file else set())
        if not (isinstance(entry, dict) and set(entry) == keys and is_count(entry['epoch'])
                and _is_number(entry['metric']) and _is_plain(entry['metric'])
                and (not with_file or entry['file'] == self.file_name(entry['epoch']))):
            raise ValueError(f'entry {short_repr(entry)} is not {{epoch: N >= 0, metric: a finite number'
                             + (", file: 'checkpoint-N.pth'}" if with_file else '}'))
        return dict(entry)

    def check_state(self, state: Optional[Dict[str, Any]], source: str = 'the checkpoint') -> Optional[Dict[str, Any]]:
        """``state`` (a checkpoint's ``checkpoint_history``) if it is what :meth:`save` writes, else a UsageError."""
        if not state:
            return None
        try:
            if not (isinstance(state, dict) and set(state) <= {'history', 'best'} and isinstance(
                    state.get('history') or [], list)):
                raise ValueError(f'{short_repr(state)} is not a {{history: list, best}} dict')
            history = [self._checked_entry(h, with_file=True) for h in state.get('history') or []]
            best = None if state.get('best') is None else self._checked_entry(state['best'], with_file=False)
        except ValueError as e:
            raise UsageError(f'{source}: its checkpoint_history is not one this trainer writes ({e}); '
                             f'{_DAMAGED}') from None
        return {'history': history, 'best': best}

    def load_state_dict(self, state: Optional[Dict[str, Any]], source: str = 'the checkpoint') -> None:
        """Restore a history; entries whose file is gone are dropped, and the best is what ``model_best.pth`` holds
        where that differs (a run killed between writing it and ``last.pth``)."""
        state = self.check_state(state, source) or {'history': [], 'best': None}
        self.history = [h for h in state['history'] if (self.output_dir / h['file']).is_file()]
        self.best, held = state['best'], None
        if self.best_path.is_file() and not self.best_path.is_symlink():
            ckpt = peek_checkpoint(self.best_path)
            with suppress(ValueError):  # not a checkpoint of ours: the history's record stands
                held = self._checked_entry({'epoch': ckpt.get('epoch'), 'metric': ckpt.get('metric')}, False)
        if held is not None and held != self.best:
            recorded = f'epoch {self.best["epoch"]}' if self.best else 'none'
            _logger.warning(f'{self.best_path} holds epoch {held["epoch"]} (metric {held["metric"]:.6g}), not the '
                            f'best {source} records ({recorded}): the run was stopped between writing the two; '
                            f'best-checkpoint tracking continues from the file')
            self.best = held
        elif self.best is not None and not self.best_path.exists():
            _logger.warning(f'{self.best_path} is missing; best-checkpoint tracking restarts')
            self.best = None

    def save(self, state: Dict[str, Any], epoch: int, metric: Optional[float]) -> Dict[str, bool]:
        """Write the checkpoint of ``epoch`` (``state`` gets ``checkpoint_history``); returns what was written."""
        is_best = metric is not None and (self.best is None or (
            metric < self.best['metric'] if self.decreasing else metric > self.best['metric']))
        history, evicted, in_top = list(self.history), [], False
        if metric is not None and self.max_history > 0:
            history = [h for h in history if h['epoch'] != epoch]  # an epoch re-run after a crash
            history.append({'epoch': epoch, 'metric': metric, 'file': self.file_name(epoch)})
            history.sort(key=lambda h: h['metric'], reverse=not self.decreasing)
            history, evicted = history[:self.max_history], history[self.max_history:]
            in_top = any(h['epoch'] == epoch for h in history)
        best = {'epoch': epoch, 'metric': metric} if is_best else self.best

        state['checkpoint_history'] = {'history': history, 'best': best}
        self.output_dir.mkdir(parents=True, exist_ok=True)
        kept = [p for p, due in ((self.best_path, is_best), (self.output_dir / self.file_name(epoch), in_top)) if due]
        if kept:  # before last.pth, whose history names them
            atomic_save({k: v for k, v in state.items() if k not in self.resume_only}, kept[0])
            for path in kept[1:]:
                atomic_link(kept[0], path)
        if kept and not self.resume_only:
            atomic_link(kept[0], self.last_path)
        else:
            atomic_save(state, self.last_path)
        for h in evicted:
            if h['epoch'] != epoch:
                (self.output_dir / self.file_name(h['epoch'])).unlink(missing_ok=True)
        self.history, self.best = history, best
        return {'last': True, 'best': is_best, 'top': in_top}


def write_results(folder: RunFolder, results: Dict[str, Any]) -> None:
    """``results.json``; the results of an earlier finish of this run are kept as ``results-N.json``."""
    kept = keep_previous(path := folder.output_dir / 'results.json')
    if kept is not None:
        _logger.info(f'the earlier results.json of this run is kept as {kept.name}')
    atomic_write_text(path, json_text(results))
    folder.results_written = True


class SummaryWriter:
    """``summary.csv`` (timm's columns), a row per epoch, written whole and atomically at every row under one header,
    the union of the rows' columns. Not timm's ``update_summary``: it appends through the file's name (a planted link)
    and puts new columns under the old header."""

    def __init__(self, path: os.PathLike):
        self.path = Path(path)

    def read(self, before_epoch: float = math.inf) -> List[Dict[str, str]]:
        """The rows of the epochs before ``before_epoch`` (none with no parsable epoch)."""
        if not self.path.exists():
            return []
        with open(self.path, newline='') as f:
            return [r for r in csv.DictReader(f) if str(r.get('epoch')).isdigit() and int(r['epoch']) < before_epoch]

    def write(self, rows: List[Dict[str, Any]]) -> None:
        buf = StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for row in rows for k in row)), restval='')
        writer.writeheader()
        writer.writerows(rows)
        atomic_write_text(self.path, buf.getvalue())

    def append(self, row: Dict[str, Any]) -> None:
        self.write(self.read() + [{k: (f'{v:.6g}' if isinstance(v, float) else v) for k, v in row.items()}])


# ------------------------------------------------------------------------------------------------ stops
@contextmanager
def stop_signals() -> Iterator[Callable[[], int]]:
    """Within: SIGINT / SIGTERM only set a flag, read by the returned callable (0: none), so training stops at its
    next safe point; a second signal acts at once (the previous handlers are back after the first)."""
    received, previous = [0], {}

    def restore(signum: int = 0, frame=None) -> None:  # the first signal's handler, and the block's exit
        received[0] = received[0] or signum
        for s, handler in previous.items():
            signal.signal(s, handler)

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, restore)
    try:
        yield lambda: received[0]
    finally:
        restore()


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite at ``where``; raised before that loss reaches the weights."""

    def __init__(self, value: float, where: str):
        what = f'{value}' if not math.isfinite(value) else 'not finite on another rank'
        super().__init__(f'training loss is {what} at {where}; stopped before applying it')


def stop_error(error: Exception, last_path: Optional[Path], last_saved: Optional[int], resume: str,
               advice: str) -> RunError:
    """The :class:`RunError` that ends a run stopped by a NaN / inf loss or a signal: where, the intact checkpoint
    (``last_path``, else ``resume``; ``last_saved``: its epoch, None before any) and ``advice``, the flags to change."""
    intact = None
    if last_saved is not None and last_path is not None and last_path.is_file():
        intact, where = last_path, f'{last_path} (epoch {last_saved})'
    elif last_saved is not None and resume and os.path.isfile(resume):
        intact, where = resume, f'{resume} (epoch {last_saved}, the checkpoint this run resumed from)'
    if isinstance(error, Interrupted):
        tail = (f'the resumable checkpoint is {where}: continue with --resume {intact}' if intact is not None
                else 'no checkpoint had been written yet')
        return Interrupted(error.signum, error.where, f'{error}; {tail}')
    origin = '; it arose in training (weights and optimizer state loaded from files are checked finite)'
    if intact is None:
        return RunError(f'{error}{origin}. No checkpoint had been written yet. {advice}.')
    return RunError(f'{error}{origin}. The last good checkpoint, {where}, is intact. {advice}, or check the '
                    f'data; then restart, or continue with --resume {intact}')


def all_gather_objects(obj: Any, info) -> List[Any]:
    """Every rank's ``obj`` (rank order); ``[obj]`` outside distributed mode."""
    if not info.distributed:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out
