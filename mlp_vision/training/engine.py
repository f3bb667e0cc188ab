""" The image training epoch and the evaluation loop (one implementation, used by train.py and validate.py). """
import logging
import time
from collections import OrderedDict
from contextlib import nullcontext, suppress
from datetime import timedelta
from typing import Callable, Dict, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from .data import num_valid_samples
from .errors import Interrupted
from .run import NonFiniteLossError, UpdateStep, all_ranks_finite

__all__ = ['train_one_epoch', 'evaluate', 'format_duration']

_logger = logging.getLogger(__name__)


def format_duration(seconds: float) -> str:
    return str(timedelta(seconds=int(round(max(0., seconds)))))


def train_one_epoch(
        epoch: int,
        model: nn.Module,
        loader,
        update_step: UpdateStep,
        loss_fn: Callable,
        *,
        num_updates: int,
        total_epochs: int,
        lr_scheduler=None,
        amp_autocast=suppress,
        model_ema=None,
        mixup_fn=None,
        grad_accum_steps: int = 1,
        channels_last: bool = False,
        distributed: bool = False,
        world_size: int = 1,
        log_interval: int = 50,
        primary: bool = True,
        stop_signal: Optional[Callable[[], int]] = None,
) -> (Dict[str, float], int):
    """One epoch of training. Returns ({'loss', 'lr', 'img_per_sec', 'seconds'}, num_updates after it).

    Gradient accumulation over ``grad_accum_steps`` batches (DDP syncs only on the last one); the loss of every
    batch is checked before its backward pass and a NaN / inf raises :class:`NonFiniteLossError` on every rank.
    ``stop_signal()`` (SIGINT / SIGTERM, agreed by all ranks) is checked before every batch: :class:`Interrupted`.
    """
    optimizer = update_step.optimizer
    model.train()
    num_batches = len(loader)
    updates_per_epoch = (num_batches + grad_accum_steps - 1) // grad_accum_steps
    last_accum_steps = num_batches % grad_accum_steps
    last_batch_idx_to_accum = num_batches - last_accum_steps
    has_no_sync = hasattr(model, 'no_sync')

    loss_sum = 0.
    sample_count = 0
    window_loss, window_samples = 0., 0
    update_time_sum, timed_updates = 0., 0
    epoch_start = update_start = time.perf_counter()
    optimizer.zero_grad()
    for batch_idx, (input, target) in enumerate(loader):
        signum = stop_signal() if stop_signal is not None else 0
        if signum:
            raise Interrupted(signum, f'epoch {epoch}, batch {batch_idx}')
        last_batch = batch_idx == num_batches - 1
        need_update = last_batch or (batch_idx + 1) % grad_accum_steps == 0
        update_idx = batch_idx // grad_accum_steps
        accum_steps = last_accum_steps if batch_idx >= last_batch_idx_to_accum and last_accum_steps else grad_accum_steps

        if mixup_fn is not None:
            input, target = mixup_fn(input, target)
        if channels_last:
            input = input.contiguous(memory_format=torch.channels_last)

        sync_context = model.no_sync if (has_no_sync and not need_update) else nullcontext
        with sync_context():
            with amp_autocast():
                output = model(input)
                loss = loss_fn(output, target)
            if not all_ranks_finite(loss, distributed):
                raise NonFiniteLossError(
                    loss.item(), f'epoch {epoch}, batch {batch_idx} (optimizer update {num_updates})')
            batch_loss = loss.item()
            update_step(loss, accum_steps, need_update)

        n = input.shape[0]
        loss_sum += batch_loss * n
        sample_count += n
        window_loss += batch_loss * n
        window_samples += n
        if not need_update:
            continue

        num_updates += 1
        if model_ema is not None:
            model_ema.update(model, step=num_updates)
        if lr_scheduler is not None:
            lr_scheduler.step_update(num_updates=num_updates, metric=loss_sum / sample_count)

        now = time.perf_counter()
        if update_idx > 0:  # the first update includes loader start-up; keep it out of the rate
            update_time_sum += now - update_start
            timed_updates += 1
        update_start = now

        if primary and (last_batch or (update_idx + 1) % log_interval == 0):
            sec_per_update = update_time_sum / timed_updates if timed_updates else now - epoch_start
            img_per_sec = n * accum_steps * world_size / sec_per_update if sec_per_update > 0 else 0.
            left_epoch = (updates_per_epoch - update_idx - 1) * sec_per_update
            left_run = left_epoch + (total_epochs - epoch - 1) * updates_per_epoch * sec_per_update
            lr = optimizer.param_groups[0]['lr']
            _logger.info(
                f'Train: {epoch}/{total_epochs - 1} [{update_idx + 1:>{len(str(updates_per_epoch))}d}/'
                f'{updates_per_epoch} ({100. * (update_idx + 1) / updates_per_epoch:3.0f}%)]  '
                f'loss {window_loss / max(window_samples, 1):.4f} ({loss_sum / sample_count:.4f})  '
                f'lr {lr:.3e}  {img_per_sec:,.0f} img/s  '
                f'ETA epoch {format_duration(left_epoch)}, training {format_duration(left_run)}')
            window_loss, window_samples = 0., 0

    seconds = time.perf_counter() - epoch_start
    totals = torch.tensor([loss_sum, float(sample_count)], dtype=torch.float64)
    if distributed:
        dist.all_reduce(totals)
    metrics = OrderedDict(
        loss=(totals[0] / totals[1]).item(),
        lr=sum(g['lr'] for g in optimizer.param_groups) / len(optimizer.param_groups),
        img_per_sec=totals[1].item() / seconds,
        seconds=seconds,
    )
    return metrics, num_updates


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

    Exact in distributed mode: the padding samples that even out the ranks are not counted, and the sums
    are reduced over the ranks, so the numbers equal a one-process run. Top-5 is top-k with k = min(5, classes).
    """
    model.eval()
    valid = num_valid_samples(loader)
    num_batches = len(loader)
    sums = None
    seen = 0
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
        keep = len(target) if valid is None else max(0, min(len(target), valid - seen))
        seen += len(target)
        processed += len(target)
        output, target = output[:keep], target[:keep]
        loss = F.cross_entropy(output, target, reduction='sum')
        k = min(5, output.shape[1])
        correct = output.topk(k, dim=1).indices.eq(target[:, None])
        batch = torch.stack([
            loss.double(), correct[:, :1].sum().double(), correct.sum().double(),
            torch.tensor(float(keep), dtype=torch.float64, device=output.device)])
        sums = batch if sums is None else sums + batch
        if primary and log_interval and ((batch_idx + 1) % log_interval == 0 or batch_idx == num_batches - 1):
            elapsed = time.perf_counter() - start
            _logger.info(f'{log_prefix}: [{batch_idx + 1:>{len(str(num_batches))}d}/{num_batches}]  '
                         f'{processed / max(elapsed, 1e-9):,.0f} img/s')
    if sums is None:
        raise RuntimeError('evaluation loader yielded no batches')
    if distributed:
        dist.all_reduce(sums)
    seconds = time.perf_counter() - start
    loss_sum, c1, c5, n = sums.tolist()
    world = dist.get_world_size() if distributed else 1
    return OrderedDict(
        loss=loss_sum / n,
        top1=100. * c1 / n,
        top5=100. * c5 / n,
        samples=int(n),
        img_per_sec=processed * world / seconds,
        seconds=seconds,
    )
