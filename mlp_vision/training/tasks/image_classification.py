""" The image training epoch and the evaluation loop (one implementation, used by train.py and validate.py). """
import logging
import time
from collections import OrderedDict
from contextlib import suppress
from typing import Callable, Dict

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from mlp_vision.training.run.loop import StepLoop, format_duration, progress_line

__all__ = ['train_one_epoch', 'evaluate', 'reports_top5', 'format_duration']

_logger = logging.getLogger(__name__)


def train_one_epoch(
        epoch: int,
        loop: StepLoop,
        loader,
        loss_fn: Callable,
        *,
        total_epochs: int,
        amp_autocast=suppress,
        mixup_fn=None,
        grad_accum_steps: int = 1,
        channels_last: bool = False,
        world_size: int = 1,
        log_interval: int = 50,
        primary: bool = True,
) -> Dict[str, float]:
    """One epoch of training with the run's ``loop``. Returns {'loss', 'lr', 'img_per_sec', 'seconds'} (the loss
    and the rate over every rank); ``loop.num_updates`` counts on.

    Each optimizer update is :meth:`~mlp_vision.training.run.loop.StepLoop.update` over ``grad_accum_steps`` batches
    (the epoch's last update over the batches left): DDP syncs only on the last one, a NaN / inf loss raises
    :class:`~mlp_vision.training.run.training_run.NonFiniteLossError` on every rank before the optimizer step, and a SIGINT /
    SIGTERM (agreed by all ranks) stops the run at the next update. One host sync per update (the loop's), none per
    batch; the epoch's loss is all-reduced once, at its end.
    """
    model, optimizer = loop.train_model, loop.update_step.optimizer
    model.train()
    num_batches = len(loader)
    updates_per_epoch = (num_batches + grad_accum_steps - 1) // grad_accum_steps
    batches = enumerate(loader)

    def micro_loss():
        batch_idx, (input, target) = next(batches)
        if mixup_fn is not None:
            input, target = mixup_fn(input, target)
        if channels_last:
            input = input.contiguous(memory_format=torch.channels_last)
        with amp_autocast():
            return loss_fn(model(input), target), input.shape[0]  # weighted by its samples

    loss_sum = 0.
    sample_count = 0
    window_loss, window_samples = 0., 0
    update_time_sum, timed_updates = 0., 0
    epoch_start = update_start = time.perf_counter()
    optimizer.zero_grad()
    for update_idx in range(updates_per_epoch):
        first = update_idx * grad_accum_steps  # the update's first batch; the last update may have fewer
        losses = loop.update(
            micro_loss, min(grad_accum_steps, num_batches - first), stopped_at=f'epoch {epoch}, batch {first}',
            loss_at=lambda m: f'epoch {epoch}, batch {first + m} (optimizer update {loop.num_updates})',
            metric=lambda u: (loss_sum + u.loss_sum) / (sample_count + u.weight_sum))
        loss_sum, sample_count = loss_sum + losses.loss_sum, sample_count + losses.weight_sum
        window_loss, window_samples = window_loss + losses.loss_sum, window_samples + losses.weight_sum

        now = time.perf_counter()
        if update_idx > 0:  # the first update includes loader start-up; keep it out of the rate
            update_time_sum += now - update_start
            timed_updates += 1
        update_start = now

        last = update_idx == updates_per_epoch - 1
        if primary and (last or (update_idx + 1) % log_interval == 0):
            sec_per_update = update_time_sum / timed_updates if timed_updates else now - epoch_start
            img_per_sec = losses.weight_sum * world_size / sec_per_update if sec_per_update > 0 else 0.
            left_epoch = (updates_per_epoch - update_idx - 1) * sec_per_update
            left_run = left_epoch + (total_epochs - epoch - 1) * updates_per_epoch * sec_per_update
            _logger.info(progress_line(
                f'Train: {epoch}/{total_epochs - 1} [{update_idx + 1:>{len(str(updates_per_epoch))}d}/'
                f'{updates_per_epoch} ({100. * (update_idx + 1) / updates_per_epoch:3.0f}%)]',
                f'{window_loss / max(window_samples, 1):.4f} ({loss_sum / sample_count:.4f})',
                optimizer.param_groups[0]['lr'], f'{img_per_sec:,.0f} img/s',
                f'epoch {format_duration(left_epoch)}, training {format_duration(left_run)}'))
            window_loss, window_samples = 0., 0

    seconds = time.perf_counter() - epoch_start
    totals = torch.tensor([loss_sum, float(sample_count)], dtype=torch.float64, device=loop.device)
    if loop.distributed:
        dist.all_reduce(totals)
    total_loss, total_samples = totals.tolist()
    return OrderedDict(
        loss=total_loss / total_samples,
        lr=sum(g['lr'] for g in optimizer.param_groups) / len(optimizer.param_groups),
        img_per_sec=total_samples / seconds,
        seconds=seconds,
    )


def reports_top5(num_classes: int) -> bool:
    """Whether top-5 accuracy means anything: with 5 classes or fewer every label is among the top 5, so it would be
    100 % whatever the model does; train.py and validate.py leave it out then (an empty ``eval_top5`` cell, a null
    ``top5``), and ``--eval-metric top5`` is refused."""
    return num_classes > 5


@torch.no_grad()
def evaluate(
        model: nn.Module,
        loader,
        *,
        amp_autocast=suppress,
        channels_last: bool = False,
        distributed: bool = False,
        log_interval: int = 50,
        log_prefix: str = 'Test',
        primary: bool = True,
) -> Dict[str, float]:
    """Top-1 / top-5 accuracy (%) and mean cross-entropy over the whole loader, and images/s.

    Exact in distributed mode: each rank evaluates its own samples, none twice (the eval loader's ``StridedSampler``
    pads nothing), and the sums are reduced over the ranks, so the numbers equal a one-process run. ``top5`` is None for a model of at most
    5 classes (see :func:`reports_top5`).
    The sums stay on the device until the end: one all-reduce and one host sync per evaluation, none per batch.
    """
    model.eval()
    num_batches = len(loader)
    sums = None
    processed = 0
    start = time.perf_counter()
    for batch_idx, (input, target) in enumerate(loader):
        if channels_last:
            input = input.contiguous(memory_format=torch.channels_last)
        with amp_autocast():
            output = model(input)
        if isinstance(output, (tuple, list)):
            output = output[0]
        output = output.float()
        processed += len(target)
        loss = F.cross_entropy(output, target, reduction='sum')
        num_classes = output.shape[1]
        correct = output.topk(min(5, num_classes), dim=1).indices.eq(target[:, None])
        batch = torch.stack([loss.double(), correct[:, :1].sum().double(), correct.sum().double()])
        sums = batch if sums is None else sums + batch  # on the device: no host sync per batch
        if primary and log_interval and ((batch_idx + 1) % log_interval == 0 or batch_idx == num_batches - 1):
            elapsed = time.perf_counter() - start
            _logger.info(f'{log_prefix}: [{batch_idx + 1:>{len(str(num_batches))}d}/{num_batches}]  '
                         f'{processed / max(elapsed, 1e-9):,.0f} img/s')
    if sums is None:
        raise RuntimeError('evaluation loader yielded no batches')
    sums = torch.cat([sums, sums.new_tensor([processed])])
    if distributed:
        dist.all_reduce(sums)
    seconds = time.perf_counter() - start
    loss_sum, c1, c5, n = sums.tolist()  # the evaluation's one host sync
    world = dist.get_world_size() if distributed else 1
    return OrderedDict(
        loss=loss_sum / n,
        top1=100. * c1 / n,
        top5=100. * c5 / n if reports_top5(num_classes) else None,
        samples=int(n),
        img_per_sec=processed * world / seconds,
        seconds=seconds,
    )
