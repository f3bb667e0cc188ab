"""The step-based run of the text tasks: language modelling (:mod:`.lm`) and sequence classification
(:mod:`.classification`) each give :func:`run_steps` a :class:`StepTask` (its loss, evaluation and data state).

Each update is :meth:`mlp_vision.training.loop.StepLoop.update` (``--grad-accum-steps`` micro-batches with
``no_sync``, one all-rank agreement on a finite loss and the stop signal, the optimizer step, EMA, the per-update
schedule), shared with the image trainer; then the log line. A stop signal inside a long update abandons it and puts
its data position and RNG states back (``rewind_point``), so the checkpoint saved at the stop resumes exactly. Every
``--eval-interval`` steps and at the end: evaluation under :func:`preserve_rng` (it must not shift the training's
random streams), the all-reduced interval train loss, a summary row and a checkpoint (``last.pth``, and
``model_best.pth`` when the task's metric improves).
``--stop-after-step`` saves and stops between evaluations. Each rank's checkpoint state holds its RNG, the task's
data position and the running interval loss, so a resume continues bit-identically.
"""
import dataclasses
import logging
import time
from typing import Any, Dict, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from timm.utils import ModelEmaV3

from ..checkpoint import get_rng_state, preserve_rng, set_rng_state
from ..distributed import wrap_ddp
from ..model import compile_model
from mlp_vision.errors import Interrupted
from ..loop import StepLoop, format_duration, progress_line
from ..run import NonFiniteLossError, TrainingRun, UpdateStep, create_lr_scheduler, setup_amp
from .recipes import create_optimizer, lm_schedule

__all__ = ['StepState', 'StepTask', 'Optimization', 'setup_optimization', 'run_steps']

_logger = logging.getLogger('mlp_vision.train_text')  # the text CLI's logger: the log lines are its


@dataclasses.dataclass
class StepState:
    """What the loop advances; the task reads it (e.g. for its checkpoint fields or log text)."""
    step: int  # updates done
    start_step: int  # updates done when this process started (resume)
    train_seconds: float = 0.  # this process's training time (evaluation excluded)
    interval_loss: float = 0.  # this rank's summed micro-batch loss since the last evaluation
    interval_batches: int = 0
    val_metrics: Optional[Dict[str, Any]] = None  # the latest periodic evaluation
    stop_result: Optional[Dict[str, Any]] = None  # what a --stop-after-step run returns (rank 0)


class StepTask:
    """What a text task gives the loop. ``best_key``: the metric of :meth:`evaluate` that picks ``model_best.pth``
    (the run's saver knows whether lower or higher is better)."""
    best_key = 'loss'

    def micro_loss(self) -> torch.Tensor:
        """The next training micro-batch's loss (forward included)."""
        raise NotImplementedError

    def evaluate(self) -> Dict[str, Any]:
        """The periodic metrics: a dict with ``'loss'`` and ``best_key``."""
        raise NotImplementedError

    def data_state(self) -> Dict[str, Any]:
        """This rank's data position, saved in every checkpoint."""
        raise NotImplementedError

    def load_data_state(self, state: Dict[str, Any]) -> None:
        raise NotImplementedError

    def checkpoint_fields(self, metrics: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        """The checkpoint's fields besides the training state (model config, tokenizer, ...)."""
        raise NotImplementedError

    def progress(self) -> str:
        """The task's part of the progress line (e.g. tokens/s)."""
        return ''

    def eval_report(self, metrics: Dict[str, Any]) -> Tuple[Dict[str, Any], str]:
        """(the summary row's task columns, the evaluation log line's task part) of ``metrics``."""
        raise NotImplementedError


@dataclasses.dataclass
class Optimization:
    """The model and everything that updates it, restored from ``--resume`` when given."""
    model: nn.Module
    train_model: nn.Module  # DDP-wrapped in a distributed run
    optimizer: torch.optim.Optimizer
    scheduler: Any
    schedule: Dict[str, Any]
    loss_scaler: Any
    update_step: UpdateStep
    amp_autocast: Any
    amp_dtype: Any
    start_step: int
    model_ema: Optional[ModelEmaV3] = None


def setup_optimization(args, run: TrainingRun, model: nn.Module, family: str, ema: bool = False) -> Optimization:
    """AdamW of the recipe (:mod:`.recipes`, already applied to ``args``), AMP, the per-update schedule, the resumed
    state, the weight EMA (``ema``: timm ``ModelEmaV3``, restored from the checkpoint's ``state_dict_ema``) and DDP.
    ``model`` is on its device."""
    optimizer = create_optimizer(model, family, args)
    amp_autocast, loss_scaler, amp_dtype = setup_amp(args.amp, args.amp_dtype, run.dist_info.device)
    params = [p for p in model.parameters() if p.requires_grad]
    update_step = UpdateStep(optimizer, lambda: params, loss_scaler, args.clip_grad)
    schedule = lm_schedule(args.lr, args.steps, args.warmup_steps, args.sched, args.min_lr_ratio)
    scheduler, _ = create_lr_scheduler(optimizer, schedule)
    start_step, _ = run.restore(model, optimizer, scheduler, schedule, loss_scaler)
    run.check_not_finished(start_step, args.steps, '--steps')
    model_ema = None
    if ema:
        model_ema = ModelEmaV3(model, decay=args.model_ema_decay)
        run.restore_ema(model_ema.module)
    train_model = wrap_ddp(model, run.dist_info) if run.dist_info.distributed else model
    train_model = compile_model(train_model, args)  # the EMA, evaluation and checkpoints use `model` itself
    return Optimization(model, train_model, optimizer, scheduler, schedule, loss_scaler, update_step, amp_autocast,
                        amp_dtype, start_step, model_ema)


def run_steps(args, run: TrainingRun, state: StepState, task: StepTask, opt: Optimization,
              show_percent: bool = False) -> bool:
    """Train from ``state.step`` to ``args.steps`` (or ``--stop-after-step``); True when all steps are done. On a
    stop signal (after saving) or a NaN / inf loss it raises :meth:`run.stopped`'s error."""
    primary = run.dist_info.primary
    rank_state = run.restore_rng()
    if rank_state is not None:
        task.load_data_state(rank_state)
        state.interval_loss, state.interval_batches = rank_state['interval_loss'], rank_state['interval_batches']

    def save(metric=None, metrics=None):
        # per rank: RNG, data order and the running train-loss interval (a stop between evaluations keeps it)
        return run.save(
            state.step, metric, model=opt.model, optimizer=opt.optimizer, scheduler=opt.scheduler,
            schedule=opt.schedule, num_updates=state.step, loss_scaler=opt.loss_scaler,
            rank_extra={**task.data_state(), 'interval_loss': state.interval_loss,
                        'interval_batches': state.interval_batches},
            **task.checkpoint_fields(dict(metrics) if metrics is not None else None))

    def rewind_point():  # what an update's micro-batches consume, put back when a stop abandons the update
        data, rng = task.data_state(), get_rng_state()
        return lambda: (task.load_data_state(data), set_rng_state(rng))

    loop = StepLoop(opt.model, opt.train_model, opt.update_step, opt.scheduler, opt.model_ema, run.stop_signal,
                    run.dist_info.distributed, num_updates=state.step, rewind_point=rewind_point,
                    device=run.dist_info.device)
    loop_start = time.perf_counter()
    opt.train_model.train()
    try:
        while state.step < args.steps:
            t0 = time.perf_counter()
            lr = opt.optimizer.param_groups[0]['lr']  # this update's
            losses = loop.update(task.micro_loss, args.grad_accum_steps, stopped_at=f'step {state.step}',
                                 loss_at=lambda micro: f'step {state.step + 1} (micro-batch {micro})')
            state.interval_loss += losses.loss_sum
            state.interval_batches += losses.micro_batches
            state.step = step = loop.num_updates
            state.train_seconds += time.perf_counter() - t0
            if primary and (step % args.log_interval == 0 or step == args.steps):
                eta = (time.perf_counter() - loop_start) / (step - state.start_step) * (args.steps - step)
                percent = f' ({100. * step / args.steps:3.0f}%)' if show_percent else ''
                _logger.info(progress_line(f'step {step:>{len(str(args.steps))}d}/{args.steps}{percent}',
                                           f'{state.interval_loss / state.interval_batches:.4f}', lr,
                                           task.progress(), format_duration(eta)))
            is_eval = step % args.eval_interval == 0 or step == args.steps
            stopping = step == args.stop_after_step
            if is_eval:
                _evaluate_and_save(run, state, task, opt, save, lr)
            elif stopping:
                save()
                _logger.info(f'step {step}: stopping (--stop-after-step) | saved last.pth')
            if stopping:
                break
    except Interrupted as e:
        if state.step != run.last_saved:
            save()
        raise run.stopped(e, 'Lower --lr, keep --clip-grad on, add --warmup-steps') from None
    except NonFiniteLossError as e:
        raise run.stopped(e, 'Lower --lr, keep --clip-grad on, add --warmup-steps') from None

    if state.step < args.steps:
        last = run.saver.last_path if primary else 'EXP/last.pth'
        _logger.info(f'Stopped at step {state.step} (--stop-after-step); continue with --resume {last}')
        state.stop_result = {'stopped_at_step': state.step, 'last': str(last)} if primary else None
        return False
    return True


def _evaluate_and_save(run: TrainingRun, state: StepState, task: StepTask, opt: Optimization, save, lr: float):
    """The periodic evaluation: metrics, the interval's train loss (all ranks), a summary row and a checkpoint."""
    with preserve_rng():  # evaluation must not shift the training's random streams
        state.val_metrics = metrics = task.evaluate()
    opt.train_model.train()
    interval = torch.tensor([state.interval_loss, float(state.interval_batches)], dtype=torch.float64,
                            device=run.dist_info.device)  # NCCL reduces tensors on the training device only
    if run.dist_info.distributed:
        dist.all_reduce(interval)
    loss_sum, batches = interval.tolist()
    train_loss = loss_sum / batches
    state.interval_loss, state.interval_batches = 0., 0
    columns, text = task.eval_report(metrics)
    if run.dist_info.primary:
        run.summary.append({'step': state.step, 'lr': lr, 'train_loss': train_loss, 'val_loss': metrics['loss'],
                            **columns, 'elapsed_s': time.time() - run.start_time})
    written = save(metrics[task.best_key], metrics)
    if run.dist_info.primary:
        _logger.info(f'step {state.step}: train loss {train_loss:.4f} | {text} | saved last.pth'
                     + (' + model_best.pth' if written['best'] else ''))
