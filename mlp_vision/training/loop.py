""" The optimizer update of every trainer: the image epoch (:func:`mlp_vision.training.engine.train_one_epoch`) and
the text steps (:func:`mlp_vision.training.text.steps.run_steps`) both advance through :meth:`StepLoop.update`.

One update: the stop-signal check (SIGINT / SIGTERM agreed by all ranks: :class:`Interrupted`), ``n`` micro-batches
(DDP's ``no_sync`` on all but the last, so gradients are reduced once), the all-rank finite-loss check before each
backward pass (:class:`NonFiniteLossError` on every rank), the optimizer step of :class:`UpdateStep` (loss scaling,
clipping), then the EMA update and the per-update LR schedule. What a micro-batch is (its data, forward and loss)
is the trainer's: the ``micro_loss`` callable.
"""
import dataclasses
import logging
from contextlib import nullcontext
from datetime import timedelta
from typing import Callable, List, Optional

import torch
import torch.nn as nn

from mlp_vision.errors import Interrupted
from .run import NonFiniteLossError, UpdateStep, all_ranks_finite

__all__ = ['StepLoop', 'format_duration', 'progress_line', 'warn_global_batch_beyond_data']

_logger = logging.getLogger(__name__)


def format_duration(seconds: float) -> str:
    return str(timedelta(seconds=int(round(max(0., seconds)))))


def progress_line(position: str, loss: str, lr: float, rate: str, eta: str) -> str:
    """The progress line of both trainers: ``<position>  loss <loss>  lr <lr>  <rate>  ETA <eta>``."""
    return f'{position}  loss {loss}  lr {lr:.3e}  {rate}  ETA {eta}'


@dataclasses.dataclass
class StepLoop:
    """The optimizer updates of one run. ``num_updates`` counts them (the schedule's and the EMA's step)."""
    model: nn.Module  # what the EMA averages (unwrapped)
    train_model: nn.Module  # what runs the forward (DDP-wrapped in a distributed run)
    update_step: UpdateStep
    lr_scheduler: Optional[object] = None  # timm scheduler: step_update(num_updates, metric) after every update
    model_ema: Optional[nn.Module] = None  # timm ModelEmaV3: update(model, step) after every update
    stop_signal: Optional[Callable[[], int]] = None
    distributed: bool = False
    num_updates: int = 0

    def update(self, micro_loss: Callable[[], torch.Tensor], micro_batches: int, *, stopped_at: str,
               loss_at: Callable[[int], str],
               metric: Optional[Callable[[List[float]], float]] = None) -> List[float]:
        """One optimizer update over ``micro_batches`` calls of ``micro_loss()`` (each loss divided by their count);
        returns the micro-batch losses. The messages name where the run is: ``stopped_at`` (a stop signal before the
        update, e.g. ``'step 12'``: the last update done) and ``loss_at(micro)`` (a non-finite loss of micro-batch
        ``micro``). ``metric(losses)``, given this update's micro-batch losses, is the value the scheduler's
        ``step_update`` receives (e.g. the running training loss)."""
        signum = self.stop_signal() if self.stop_signal is not None else 0
        if signum:
            raise Interrupted(signum, stopped_at)
        losses = []
        for micro in range(micro_batches):
            last = micro == micro_batches - 1
            no_sync = getattr(self.train_model, 'no_sync', None)
            with no_sync() if no_sync is not None and not last else nullcontext():
                loss = micro_loss()
                if not all_ranks_finite(loss, self.distributed):
                    raise NonFiniteLossError(loss.item(), loss_at(micro))
                losses.append(loss.item())
                self.update_step(loss, micro_batches, need_update=last)
        self.num_updates += 1
        if self.model_ema is not None:
            self.model_ema.update(self.model, step=self.num_updates)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step_update(num_updates=self.num_updates,
                                          metric=metric(losses) if metric is not None else None)
        return losses


def warn_global_batch_beyond_data(batch_size: int, world_size: int, grad_accum_steps: int, samples: int,
                                  what: str) -> None:
    """Warn (with the numbers) when one update's global batch, ``batch_size`` x ``world_size`` processes x
    ``grad_accum_steps``, is larger than the ``samples`` of the training data (``what`` names them): such an update
    averages over more than the whole data set, an unintended setting (``-b 1e9``, ``--grad-accum-steps 1e9``) that
    trains without another sign of it."""
    global_batch = batch_size * world_size * grad_accum_steps
    if global_batch > samples:
        _logger.warning(f'the global batch ({batch_size} x {world_size} processes x {grad_accum_steps} accumulation '
                        f'steps = {global_batch:,}) is larger than the training data ({samples:,} {what}): each '
                        f'update would need {global_batch / max(samples, 1):.3g} times the data; lower -b / '
                        f'--grad-accum-steps')
