""" :class:`TrainingRun`: the text trainer's (:mod:`mlp_vision.train_text`, through :func:`.driver.drive`) object
around the functions of :mod:`.run_files`, which the image trainer calls directly. It holds what those functions
share across a run (the resumed checkpoint, the open folder, the last saved position); the behaviour is theirs.
"""
import logging
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from mlp_vision.training.run.distributed import DistInfo
from mlp_vision.training.run.loop import UpdateStep  # noqa: F401  (the text trainer imports it from here)
from mlp_vision.training.run.run_files import (  # noqa: F401  (the text trainer imports the last five from here)
    RunFolder, check_not_finished, check_resume_identity, check_resume_payload, checkpoint_files, close_run_folder,
    list_outputs, log_settings_changes, open_run_folder, restore_ema, restore_rng, restore_training_state,
    save_checkpoint, stop_error, stop_signals, weights_digests, write_results,
    add_device_arguments, add_run_arguments, create_lr_scheduler, parse_run_args, setup_amp)

__all__ = ['TrainingRun']

_logger = logging.getLogger(__name__)


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
        self.folder: Optional[RunFolder] = None
        if resume_ckpt is not None:
            check_resume_payload(resume_ckpt, key, f'--resume {args.resume}')
        self.last_saved: Optional[int] = resume_ckpt.get(key) if resume_ckpt is not None else None
        self._exit_stack = ExitStack()
        self.stop_signal = lambda: 0
        self.start_time = time.time()

    output_dir = property(lambda self: self.folder.output_dir if self.folder is not None else None)
    saver = property(lambda self: self.folder.saver if self.folder is not None else None)
    summary = property(lambda self: self.folder.summary if self.folder is not None else None)
    run_id = property(lambda self: self.folder.run_id if self.folder is not None else None)

    def __enter__(self) -> 'TrainingRun':
        self.stop_signal = self._exit_stack.enter_context(stop_signals())
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._exit_stack.close()
        close_run_folder(self.folder, exc, self.key)

    def check_resume(self, **expected) -> None:
        check_resume_identity(self.resume_ckpt, self.args.resume, **expected)

    def restore(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler, schedule: Dict[str, Any],
                loss_scaler=None, weights_only: bool = False) -> Tuple[int, int]:
        return restore_training_state(self.resume_ckpt, self.args.resume, self.key, self.args.model, model,
                                      optimizer, scheduler, schedule, loss_scaler, weights_only)

    def restore_ema(self, model_ema: nn.Module) -> None:
        restore_ema(self.resume_ckpt, self.args.resume, self.args.model, model_ema)

    def check_not_finished(self, done: int, total: int, flag: str) -> None:
        check_not_finished(self.resume_ckpt, self.args.resume, self.key, done, total, flag)

    def restore_rng(self) -> Optional[Dict[str, Any]]:
        ckpt, self.resume_ckpt = self.resume_ckpt, None  # free it
        return restore_rng(ckpt, self.args.resume, self.dist_info)

    def open_outputs(self, default_root: str, default_name: str) -> Optional[Path]:
        if not self.primary:
            return None
        self.folder = open_run_folder(self.args, self.resume_ckpt, kind=self.kind, key=self.key,
                                      default_root=default_root, default_name=default_name,
                                      decreasing=self.decreasing, max_history=self.max_history)
        return self.folder.output_dir

    def log_settings_changes(self) -> None:
        log_settings_changes(self.args)

    def save(self, position: int, metric: Optional[float], **state) -> Optional[Dict[str, bool]]:
        self.last_saved = position  # on every rank: they decide together whether a save is due
        return save_checkpoint(self.folder, self.args, self.dist_info, position, metric, kind=self.kind,
                               key=self.key, **state)

    def stopped(self, error: Exception, advice: str = ''):
        return stop_error(error, self.saver.last_path if self.folder is not None else None, self.last_saved,
                          getattr(self.args, 'resume', ''), self.key, advice)

    def weights_digests(self, *modules: nn.Module) -> List[str]:
        return weights_digests(self.dist_info, *modules)

    def checkpoint_files(self) -> Dict[str, Optional[str]]:
        return checkpoint_files(self.folder)

    def write_results(self, results: Dict[str, Any]) -> None:
        write_results(self.folder, results)

    def begin_final_stage(self) -> None:
        if self.folder is not None:
            self.folder.in_final_stage = True

    def list_outputs(self) -> None:
        list_outputs(self.folder)
