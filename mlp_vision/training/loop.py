""" The optimizer update of the image trainer (:func:`mlp_vision.train.train_one_epoch`): :meth:`StepLoop.update`.
One update: ``n`` micro-batches (DDP's ``no_sync`` on
all but the last), the optimizer step of :class:`UpdateStep` (loss scaling, clipping), then the EMA update and the
per-update LR schedule. A micro-batch's
data, forward and loss are the trainer's: the ``micro_loss`` callable.

The loop waits for the device and the other ranks once per update, at the **agreement** just before the last
micro-batch's backward pass: the losses, summed on the device as they come, are read with one device-to-host copy,
together with one all-reduce (MAX, on the training device, so valid under NCCL) of ``[first non-finite
micro-batch, stop signal, seconds per micro-batch]``. Every rank decides the same: a NaN / inf loss anywhere raises
:class:`NonFiniteLossError` before the optimizer step; a SIGINT / SIGTERM anywhere stops the next update before its
first micro-batch (:class:`Interrupted`).

Long updates (``--grad-accum-steps`` in the thousands) also agree about every ``agree_every_s`` seconds *inside*
the update, at positions counted from the slowest rank's time per micro-batch, so every rank calls the same
collectives in order; a rank never acts on its own signal alone (its forward may hold collectives of its own: DDP's
buffer broadcast, SyncBatchNorm). A stop inside an update abandons it: gradients dropped, parameters and
``num_updates`` as before (the run resumes from its last checkpoint, at an epoch's end).
"""
import dataclasses
import logging
import math
import time
from contextlib import nullcontext
from datetime import timedelta
from typing import Callable, Iterable, Optional, Tuple, Union

import torch
import torch.distributed as dist
import torch.nn as nn
from timm.utils import NativeScaler, dispatch_clip_grad

from mlp_vision.errors import Interrupted

__all__ = ['UpdateStep', 'NonFiniteLossError', 'StepLoop', 'UpdateLosses', 'format_duration', 'progress_line',
           'warn_global_batch_beyond_data']

_logger = logging.getLogger(__name__)


def format_duration(seconds: float) -> str:
    return str(timedelta(seconds=int(round(max(0., seconds)))))


def progress_line(position: str, loss: str, lr: float, rate: str, eta: str) -> str:
    """The progress line of both trainers: ``<position>  loss <loss>  lr <lr>  <rate>  ETA <eta>``."""
    return f'{position}  loss {loss}  lr {lr:.3e}  {rate}  ETA {eta}'


class UpdateStep:
    """Backward of one micro-batch's mean loss, divided by ``accum_steps`` (the update's micro-batches, so its
    gradient is their mean), and on the last micro-batch clipping + optimizer step. Under float16 AMP timm's
    ``NativeScaler`` scales the loss and unscales before clipping. ``clip_grad`` <= 0 or None: no clipping.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, parameters: Callable[[], Iterable[torch.Tensor]],
                 loss_scaler: Optional[NativeScaler] = None, clip_grad: Optional[float] = None,
                 clip_mode: str = 'norm'):
        self.optimizer, self.parameters, self.loss_scaler = optimizer, parameters, loss_scaler
        self.clip_grad = clip_grad if clip_grad and clip_grad > 0 else None
        self.clip_mode = clip_mode

    def __call__(self, loss: torch.Tensor, accum_steps: int = 1, need_update: bool = True) -> None:
        if accum_steps > 1:
            loss = loss / accum_steps
        if self.loss_scaler is not None:
            self.loss_scaler(loss, self.optimizer, clip_grad=self.clip_grad, clip_mode=self.clip_mode,
                             parameters=self.parameters() if self.clip_grad else None, need_update=need_update)
        else:
            loss.backward()
            if need_update:
                if self.clip_grad is not None:
                    dispatch_clip_grad(self.parameters(), value=self.clip_grad, mode=self.clip_mode)
                self.optimizer.step()
        if need_update:
            self.optimizer.zero_grad(set_to_none=True)


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite at ``where``; raised before that loss reaches the weights."""

    def __init__(self, value: float, where: str):
        self.value, self.where = value, where
        what = f'{value}' if not math.isfinite(value) else 'not finite on another rank'
        super().__init__(f'training loss is {what} at {where}; stopped before applying it')


@dataclasses.dataclass
class UpdateLosses:
    """This rank's losses of one update: ``loss_sum`` of the micro-batch losses times their weights, ``weight_sum``
    (1 per micro-batch unless ``micro_loss`` returns ``(loss, weight)``, e.g. the batch size), their count."""
    loss_sum: float
    weight_sum: float
    micro_batches: int

    @property
    def mean(self) -> float:
        return self.loss_sum / self.weight_sum


_NO_BAD_MICRO = float(2 ** 52)  # above any micro-batch index, exact in float64


class _DeviceLosses:
    """One update's micro-batch losses, summed on the device (no host sync): the weighted sum, and the first
    non-finite micro-batch (-1: none) with its value, for the message."""

    def __init__(self, device: torch.device):
        self.sum = torch.zeros((), dtype=torch.float64, device=device)
        self.bad_micro = torch.full((), -1., dtype=torch.float64, device=device)
        self.bad_value = torch.zeros((), dtype=torch.float64, device=device)
        self.weight_sum, self.count = 0., 0

    def add(self, loss: torch.Tensor, weight: float) -> None:
        value = loss.detach().reshape(()).to(torch.float64)
        self.sum += value * weight
        first_bad = ~torch.isfinite(value) & (self.bad_micro < 0)
        self.bad_micro = torch.where(first_bad, float(self.count), self.bad_micro)
        self.bad_value = torch.where(first_bad, value, self.bad_value)
        self.weight_sum += weight
        self.count += 1


@dataclasses.dataclass
class StepLoop:
    """The optimizer updates of one run; ``num_updates`` counts them (the schedule's and the EMA's step).

    ``stop_signal()``: this process's SIGINT / SIGTERM number (0: none), no collective. ``device``: the training
    device (default: the model's), where the loop's collectives run."""
    model: nn.Module  # what the EMA averages (unwrapped)
    train_model: nn.Module  # what runs the forward (DDP-wrapped in a distributed run)
    update_step: UpdateStep
    lr_scheduler: Optional[object] = None  # timm scheduler: step_update(num_updates, metric) after every update
    model_ema: Optional[nn.Module] = None  # timm ModelEmaV3: update(model, step) after every update
    stop_signal: Optional[Callable[[], int]] = None
    distributed: bool = False
    num_updates: int = 0
    device: Optional[torch.device] = None
    agree_every_s: float = 2.  # a long update agrees on the stop signal about this often
    stop_pending: int = dataclasses.field(default=0, init=False)  # a stop agreed at the end of the last update
    _check_every: int = dataclasses.field(default=1, init=False)  # micro-batches between agreements in an update
    _micro_seconds: float = dataclasses.field(default=float('inf'), init=False)  # measured at the last agreement

    def __post_init__(self):
        if self.device is None:
            self.device = next((p.device for p in self.model.parameters()), torch.device('cpu'))

    def update(self, micro_loss: Callable[[], Union[torch.Tensor, Tuple[torch.Tensor, float]]], micro_batches: int,
               *, stopped_at: str, loss_at: Callable[[int], str],
               metric: Optional[Callable[[UpdateLosses], float]] = None) -> UpdateLosses:
        """One optimizer update over ``micro_batches`` calls of ``micro_loss()`` (each loss divided by their count;
        it returns the loss, or ``(loss, weight)`` to weight it in the returned sums). The messages name where the
        run is: ``stopped_at`` (a stop before this update is applied, e.g. ``'step 12'``: the last update done) and
        ``loss_at(micro)`` (a non-finite loss of micro-batch ``micro``). ``metric(losses)`` is the value the
        scheduler's ``step_update`` receives (e.g. the running training loss)."""
        if micro_batches < 1:
            raise ValueError(f'an update needs at least one micro-batch, got {micro_batches}')
        signum = self.stop_pending or (0 if self.distributed else self._local_signal())
        if signum:
            raise Interrupted(signum, stopped_at)
        losses = _DeviceLosses(self.device)
        since, since_micro, next_check = time.perf_counter(), 0, self._check_every
        for micro in range(micro_batches):
            last = micro == micro_batches - 1
            if micro and not self.distributed and self._local_signal():
                self._abandon(self._local_signal(), stopped_at)
            no_sync = getattr(self.train_model, 'no_sync', None)
            with no_sync() if no_sync is not None and not last else nullcontext():
                out = micro_loss()
                loss, weight = out if isinstance(out, tuple) else (out, 1.)
                losses.add(loss, weight)
                if last:  # before the backward pass that reduces the gradients, and the optimizer step
                    loss_sum, self.stop_pending = self._agree(losses, micro + 1 - since_micro, since, loss_at)
                self.update_step(loss, micro_batches, need_update=last)
            if not last and micro + 1 == next_check:
                _, signum = self._agree(losses, micro + 1 - since_micro, since, loss_at)
                if signum:
                    self._abandon(signum, stopped_at)
                since, since_micro, next_check = time.perf_counter(), micro + 1, micro + 1 + self._check_every
        result = UpdateLosses(loss_sum, losses.weight_sum, losses.count)
        self.num_updates += 1
        if self.model_ema is not None:
            self.model_ema.update(self.model, step=self.num_updates)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step_update(num_updates=self.num_updates,
                                          metric=metric(result) if metric is not None else None)
        return result

    def _local_signal(self) -> int:
        return self.stop_signal() if self.stop_signal is not None else 0

    def _agree(self, losses: _DeviceLosses, micro_batches_since: int, since: float,
               loss_at: Callable[[int], str]) -> Tuple[float, int]:
        """The agreement of the module docstring (a non-finite loss on any rank is raised here, gradients dropped);
        returns (this rank's weighted loss sum, the agreed stop signal)."""
        packed = torch.zeros(6, dtype=torch.float64, device=self.device)
        # MAX of (first bad micro-batch counted down from 2**52): the earliest bad micro-batch of any rank, 0 if none
        packed[0] = (losses.bad_micro >= 0) * (_NO_BAD_MICRO - losses.bad_micro)
        packed[1] = self._local_signal()
        packed[2] = self._micro_seconds
        packed[3], packed[4], packed[5] = losses.sum, losses.bad_micro, losses.bad_value
        if self.distributed:
            dist.all_reduce(packed[:3], op=dist.ReduceOp.MAX)
        first_bad, signum, seconds, loss_sum, bad_micro, bad_value = packed.tolist()
        # the spacing from the last agreement's time (the same on every rank); this one's, measured after the
        # device caught up with the host here (before, the host may have run ahead), goes into the next agreement
        self._check_every = max(1, int(self.agree_every_s / max(seconds, 1e-9)))
        self._micro_seconds = (time.perf_counter() - since) / max(micro_batches_since, 1)
        if first_bad:
            self.update_step.optimizer.zero_grad(set_to_none=True)
            if bad_micro >= 0:  # this rank's loss
                raise NonFiniteLossError(bad_value, loss_at(int(bad_micro)))
            raise NonFiniteLossError(0., loss_at(int(_NO_BAD_MICRO - first_bad)))  # 'not finite on another rank'
        return loss_sum, int(signum)

    def _abandon(self, signum: int, stopped_at: str) -> None:
        """A stop inside the update: its gradients are dropped; the weights are as before."""
        self.update_step.optimizer.zero_grad(set_to_none=True)
        raise Interrupted(signum, stopped_at)


def warn_global_batch_beyond_data(batch_size: int, world_size: int, grad_accum_steps: int, samples: int,
                                  what: str) -> None:
    """Warn (with the numbers) when one update's global batch, ``batch_size`` x ``world_size`` x
    ``grad_accum_steps``, is larger than the ``samples`` of the training data (``what`` names them): an unintended
    setting (``-b 1e9``) that trains without another sign of it."""
    global_batch = batch_size * world_size * grad_accum_steps
    if global_batch > samples:
        _logger.warning(f'the global batch ({batch_size} x {world_size} processes x {grad_accum_steps} accumulation '
                        f'steps = {global_batch:,}) is larger than the training data ({samples:,} {what}): each '
                        f'update would need {global_batch / max(samples, 1):.3g} times the data; lower -b / '
                        f'--grad-accum-steps')
