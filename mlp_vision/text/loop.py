"""The step-based training loop of the text tasks: LM pre-training (:mod:`mlp_vision.text.train`) and sequence
classification (:mod:`mlp_vision.text.classification`) run this one loop and pass in what differs.

Per update: the stop-signal check (save, then :class:`Interrupted`), ``--grad-accum-steps`` micro-batches (``no_sync``
on all but the last), the all-rank finite-loss check, the optimizer update, the per-update schedule, timing and the
log line. Every ``--eval-interval`` steps and at the end: evaluation under :func:`preserve_rng` (it must not shift the
training's random streams), the all-reduced interval train loss, a summary row and a checkpoint (``last.pth``, and
``model_best.pth`` when the task's metric improves). ``--stop-after-step`` saves and stops between evaluations.
Each rank's checkpoint state holds its RNG, the task's data position and the running interval loss, so a resume
continues bit-identically.
"""
import dataclasses
import logging
import time
from contextlib import nullcontext
from typing import Any, Callable, Dict, Optional

import torch
import torch.distributed as dist

from ..training.checkpoint import preserve_rng
from ..training.engine import format_duration
from ..training.errors import Interrupted
from ..training.run import NonFiniteLossError, all_ranks_finite

__all__ = ['StepState', 'run_steps']

_logger = logging.getLogger('mlp_vision.text.train')  # the text CLI's logger: the log lines are its


@dataclasses.dataclass
class StepState:
    """What the loop advances; the task's callbacks read it (e.g. for their checkpoint fields or log text)."""
    step: int  # updates done
    start_step: int  # updates done when this process started (resume)
    train_seconds: float = 0.  # this process's training time (evaluation excluded)
    interval_loss: float = 0.  # this rank's summed micro-batch loss since the last evaluation
    interval_batches: int = 0
    val_metrics: Optional[Dict[str, Any]] = None  # the latest periodic evaluation
    stop_result: Optional[Dict[str, Any]] = None  # what a --stop-after-step run returns (rank 0)


def run_steps(args, run, state: StepState, *, model, train_model, optimizer, scheduler, schedule, loss_scaler,
              update_step, micro_loss: Callable[[], torch.Tensor], evaluate: Callable[[], Dict[str, Any]],
              best_key: str, rank_extra: Callable[[], Dict[str, Any]],
              restore_rank: Callable[[Dict[str, Any]], None],
              save_extra: Callable[[Optional[Dict[str, Any]]], Dict[str, Any]],
              progress_text: Callable[[], str], eval_row: Callable[[Dict[str, Any]], Dict[str, Any]],
              eval_text: Callable[[Dict[str, Any]], str], show_percent: bool = False, model_ema=None) -> bool:
    """Train from ``state.step`` to ``args.steps`` (or ``--stop-after-step``); True when all steps are done.

    The task passes in: ``micro_loss()`` (the next micro-batch's loss, forward included), ``evaluate()`` (the
    periodic metrics, a dict with ``'loss'``), ``best_key`` (the metric that picks ``model_best.pth``; the run's
    saver knows whether lower or higher is better), ``rank_extra()`` / ``restore_rank(rank_state)`` (this rank's
    data position, saved in and restored from every checkpoint), ``save_extra(val_metrics)`` (the checkpoint's other
    fields), ``progress_text()`` (the log line's task-specific part), ``eval_row(metrics)`` (the summary row's
    task-specific columns) and ``eval_text(metrics)`` (the evaluation log line's); ``model_ema`` (a timm
    ``ModelEmaV3``, or None) is updated after every optimizer update. On a stop-signal or a NaN / inf loss it raises
    :meth:`run.stopped`'s error."""
    dist_info = run.dist_info
    primary = dist_info.primary
    rank_state = run.restore_rng()
    if rank_state is not None:
        restore_rank(rank_state)
        state.interval_loss, state.interval_batches = rank_state['interval_loss'], rank_state['interval_batches']

    def save(metric=None, metrics=None):
        # per rank: RNG, data order and the running train-loss interval (a stop between evaluations keeps it)
        return run.save(
            state.step, metric, model=model, optimizer=optimizer, scheduler=scheduler, schedule=schedule,
            num_updates=state.step, loss_scaler=loss_scaler,
            rank_extra={**rank_extra(), 'interval_loss': state.interval_loss,
                        'interval_batches': state.interval_batches},
            **save_extra(dict(metrics) if metrics is not None else None))

    loop_start = time.perf_counter()
    train_model.train()
    try:
        while state.step < args.steps:
            signum = run.stop_signal()
            if signum:
                if state.step != run.last_saved:
                    save()
                raise Interrupted(signum, f'step {state.step}')
            t0 = time.perf_counter()
            for micro in range(args.grad_accum_steps):
                last_micro = micro == args.grad_accum_steps - 1
                sync = train_model.no_sync if dist_info.distributed and not last_micro else nullcontext
                with sync():
                    loss = micro_loss()
                    if not all_ranks_finite(loss, dist_info.distributed):
                        raise NonFiniteLossError(loss.item(), f'step {state.step + 1} (micro-batch {micro})')
                    update_step(loss, args.grad_accum_steps, need_update=last_micro)
                state.interval_loss += loss.item()
                state.interval_batches += 1
            lr = optimizer.param_groups[0]['lr']  # this update's
            state.step += 1
            step = state.step
            scheduler.step_update(step)
            if model_ema is not None:
                model_ema.update(model, step=step)
            state.train_seconds += time.perf_counter() - t0

            if primary and (step % args.log_interval == 0 or step == args.steps):
                eta = (time.perf_counter() - loop_start) / (step - state.start_step) * (args.steps - step)
                percent = f' ({100. * step / args.steps:3.0f}%)' if show_percent else ''
                _logger.info(f'step {step:>{len(str(args.steps))}d}/{args.steps}{percent}  '
                             f'loss {state.interval_loss / state.interval_batches:.4f}  lr {lr:.3e}  '
                             f'{progress_text()}  ETA {format_duration(eta)}')

            is_eval = step % args.eval_interval == 0 or step == args.steps
            stopping = step == args.stop_after_step
            if not (is_eval or stopping):
                continue
            if not is_eval:
                save()
                _logger.info(f'step {step}: stopping (--stop-after-step) | saved last.pth')
                break
            with preserve_rng():  # evaluation must not shift the training's random streams
                state.val_metrics = val_metrics = evaluate()
            train_model.train()
            interval = torch.tensor([state.interval_loss, float(state.interval_batches)], dtype=torch.float64)
            if dist_info.distributed:
                dist.all_reduce(interval)
            train_loss = (interval[0] / interval[1]).item()
            state.interval_loss, state.interval_batches = 0., 0
            if primary:
                run.summary.append({'step': step, 'lr': lr, 'train_loss': train_loss, 'val_loss': val_metrics['loss'],
                                    **eval_row(val_metrics), 'elapsed_s': time.time() - run.start_time})
            written = save(val_metrics[best_key], val_metrics)
            if primary:
                _logger.info(f'step {step}: train loss {train_loss:.4f} | {eval_text(val_metrics)} | saved last.pth'
                             + (' + model_best.pth' if written['best'] else ''))
            if stopping:
                break
    except (NonFiniteLossError, Interrupted) as e:
        raise run.stopped(e, 'Lower --lr, keep --clip-grad on, add --warmup-steps') from None

    if state.step < args.steps:
        last = run.saver.last_path if primary else 'EXP/last.pth'
        _logger.info(f'Stopped at step {state.step} (--stop-after-step); continue with --resume {last}')
        state.stop_result = {'stopped_at_step': state.step, 'last': str(last)} if primary else None
        return False
    return True
