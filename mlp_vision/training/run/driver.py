""" The text trainer's driver: :func:`drive` makes the calls of a :class:`~.training_run.TrainingRun` in their
fixed order around a :class:`StepTask` (:mod:`mlp_vision.training.tasks`' text tasks). The image trainer,
:mod:`mlp_vision.train`, makes them itself.

The step loop (:meth:`StepTask.train`): each update is :meth:`~.loop.StepLoop.update`, then the log line. Every
``--eval-interval`` steps and at the end: evaluation under :func:`preserve_rng`, the all-reduced interval train
loss, a summary row and a checkpoint; ``--stop-after-step`` saves and stops between evaluations. Each rank's
checkpoint holds its RNG, the task's data position and the running interval loss, so a resume is bit-identical.
"""
import dataclasses
import logging
import time
from typing import Any, Dict, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from timm.utils import ModelEmaV3

from mlp_vision.errors import Interrupted
from mlp_vision.training.run.checkpoint import get_rng_state, preserve_rng, set_rng_state
from mlp_vision.training.run.distributed import wrap_ddp
from mlp_vision.training.run.loop import NonFiniteLossError, StepLoop, UpdateStep, format_duration, progress_line
from mlp_vision.training.run.compile import compile_model
from mlp_vision.training.run.training_run import TrainingRun

__all__ = ['Optimization', 'TrainingTask', 'drive', 'StepState', 'StepTask']


@dataclasses.dataclass
class Optimization:
    """The model and everything that updates it. The task's :meth:`TrainingTask.setup` fills the first fields;
    :func:`drive` restores them from ``--resume`` and sets the rest."""
    model: nn.Module  # on its device; the EMA, evaluation and checkpoints use it
    optimizer: torch.optim.Optimizer
    scheduler: Any
    schedule: Dict[str, Any]
    loss_scaler: Any
    update_step: UpdateStep
    amp_autocast: Any
    amp_dtype: Any
    total: int  # the run's epochs / steps
    total_flag: str  # the flag that sets them ('--epochs', '--steps')
    weights_only: bool = False  # --no-resume-opt: resume the weights and position only
    train_model: Optional[nn.Module] = None  # `model`, DDP-wrapped in a distributed run and compiled
    model_ema: Optional[ModelEmaV3] = None
    start: int = 0  # the first epoch to train / the updates done
    num_updates: int = 0


class TrainingTask:
    """What a trainer gives :func:`drive`, its methods in the order they are called. ``stop_advice``: the flags
    worth changing after a NaN / inf loss; ``command``: the command line, as ``results.json`` records it."""
    logger = logging.getLogger('mlp_vision.train')
    stop_advice = ''

    def __init__(self, args, run: TrainingRun, command: str = ''):
        self.args, self.run, self.command = args, run, command
        self.opt: Optional[Optimization] = None

    def resume_identity(self) -> Dict[str, Any]:  # what a resumed checkpoint must be of, e.g. arch='smlpnet_t'
        return {}

    def setup(self) -> Optimization:
        """Data, the model on its device, optimizer, AMP and schedule (the resumed state is loaded after)."""
        raise NotImplementedError

    def create_ema(self, model: nn.Module) -> Optional[ModelEmaV3]:  # the weight EMA of the resumed model, or None
        return None

    def ready(self, opt: Optimization) -> None:
        """Everything that needs the restored, wrapped model (before the run folder is opened)."""
        self.opt = opt

    def output_folder(self) -> Tuple[str, str]:  # (the default --output root, the default experiment name)
        raise NotImplementedError

    def log_setup(self) -> None:  # the setup lines of the log
        pass

    def load_rank_state(self, state: Dict[str, Any]) -> None:  # this rank's resumed state: run.save's rank_extra
        pass

    def train(self) -> bool:
        """Train to the end (True) or to a requested stop (False); saves its checkpoints."""
        raise NotImplementedError

    def save_at_stop(self) -> None:  # on a stop signal: save where training stopped, if a resume can start there
        pass

    def stop_result(self) -> Optional[Dict[str, Any]]:  # what a run stopped on request (train() False) returns
        return None

    def final_results(self, digests) -> Optional[Dict[str, Any]]:
        """The final stage (every rank: final evaluation, exports): the results dict on rank 0, None elsewhere.
        ``digests``: every rank's weights digest."""
        raise NotImplementedError

    def report(self, results: Dict[str, Any]) -> None:  # after results.json (rank 0): curves, closing log lines
        pass

    def close(self) -> None:
        """Release what would outlive the run (e.g. data-loader worker processes), however the run ended."""


def drive(run: TrainingRun, task: TrainingTask) -> Optional[Dict[str, Any]]:
    """Run ``task`` inside ``run``: the resumed checkpoint's identity, the task's setup, the resumed state, DDP and
    compile, the run folder, the RNG states (last: nothing built before shifts them), training (a stop signal or NaN
    loss ends it with :meth:`TrainingRun.stopped`'s one line), the final stage. Returns the results dict on rank 0
    (None elsewhere; :meth:`~TrainingTask.stop_result` after a requested stop); the task is closed however it ends."""
    try:
        run.check_resume(**task.resume_identity())
        opt = task.setup()
        position, opt.num_updates = run.restore(opt.model, opt.optimizer, opt.scheduler, opt.schedule,
                                                opt.loss_scaler, weights_only=opt.weights_only)
        opt.start = position  # the updates done
        run.check_not_finished(opt.start, opt.total, opt.total_flag)
        # EMA: a copy of the (resumed) model, before DDP / compile (as timm); then the resumed EMA weights
        opt.model_ema = task.create_ema(opt.model)
        if opt.model_ema is not None:
            run.restore_ema(opt.model_ema.module)
        train_model = wrap_ddp(opt.model, run.dist_info) if run.dist_info.distributed else opt.model
        opt.train_model = compile_model(train_model, run.args)
        task.ready(opt)

        output_dir = run.open_outputs(*task.output_folder())
        run.log_settings_changes()
        task.log_setup()
        if run.primary:
            task.logger.info(f'Outputs: {output_dir}')
        rank_state = run.restore_rng()
        if rank_state is not None:
            task.load_rank_state(rank_state)
        try:
            finished = task.train()
        except Interrupted as e:
            task.save_at_stop()
            raise run.stopped(e, task.stop_advice) from None
        except NonFiniteLossError as e:
            raise run.stopped(e, task.stop_advice) from None
        if not finished:
            return task.stop_result()

        run.begin_final_stage()
        digests = run.weights_digests(opt.model, opt.model_ema.module if opt.model_ema is not None else None)
        results = task.final_results(digests)
        if results is None:  # the other ranks
            return None
        run.write_results(results)
        task.report(results)
        run.list_outputs()
        return results
    finally:
        task.close()


# ------------------------------------------------------------------------------------------------ the step loop
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


class StepTask(TrainingTask):
    """A task trained in optimizer steps (``--steps``, ``--eval-interval``, ``--stop-after-step``): it gives the loop
    a micro-batch's loss, its evaluation and its data position. ``best_key``: the metric of :meth:`evaluate` that
    picks ``model_best.pth``; ``show_percent``: the progress line shows the share of steps done."""
    best_key = 'loss'
    show_percent = False
    state: StepState

    def micro_loss(self) -> torch.Tensor:  # the next training micro-batch's loss (forward included)
        raise NotImplementedError

    def evaluate(self) -> Dict[str, Any]:  # the periodic metrics: 'loss' and best_key
        raise NotImplementedError

    def data_state(self) -> Dict[str, Any]:  # this rank's data position, saved in every checkpoint
        raise NotImplementedError

    def load_data_state(self, state: Dict[str, Any]) -> None:
        raise NotImplementedError

    def checkpoint_fields(self, metrics: Optional[Dict[str, Any]]) -> Dict[str, Any]:  # model config, tokenizer, ...
        raise NotImplementedError

    def progress(self) -> str:  # the task's part of the progress line (e.g. tokens/s)
        return ''

    def eval_report(self, metrics: Dict[str, Any]) -> Tuple[Dict[str, Any], str]:
        """(the summary row's task columns, the evaluation log line's task part) of ``metrics``."""
        raise NotImplementedError

    # ---------------------------------------------------------------- the loop
    def ready(self, opt: Optimization) -> None:
        super().ready(opt)
        self.state = StepState(step=opt.start, start_step=opt.start)

    def load_rank_state(self, state: Dict[str, Any]) -> None:
        self.load_data_state(state)
        self.state.interval_loss, self.state.interval_batches = state['interval_loss'], state['interval_batches']

    def save(self, metric: Optional[float] = None, metrics: Optional[Dict[str, Any]] = None):
        """Save the checkpoint of this step; per rank: RNG, data order and the running train-loss interval (a stop
        between evaluations keeps it)."""
        opt, state = self.opt, self.state
        return self.run.save(
            state.step, metric, model=opt.model, optimizer=opt.optimizer, scheduler=opt.scheduler,
            schedule=opt.schedule, num_updates=state.step, loss_scaler=opt.loss_scaler,
            rank_extra={**self.data_state(), 'interval_loss': state.interval_loss,
                        'interval_batches': state.interval_batches},
            **self.checkpoint_fields(dict(metrics) if metrics is not None else None))

    def save_at_stop(self) -> None:
        if self.state.step != self.run.last_saved:
            self.save()

    def stop_result(self) -> Optional[Dict[str, Any]]:
        return self.state.stop_result

    def closing_results(self, digests, **checkpoints) -> Dict[str, Any]:
        """The last fields of a step task's ``results.json`` (``checkpoints``: files beside last / best)."""
        run = self.run
        return {'wall_seconds_this_process': time.time() - run.start_time, 'device': str(run.dist_info.device),
                'world_size': run.dist_info.world_size, 'threads': torch.get_num_threads(), 'seed': self.args.seed,
                'torch': torch.__version__, 'weights_sha256_per_rank': digests,
                'checkpoints': {**run.checkpoint_files(), **checkpoints}, 'experiment_dir': str(run.output_dir),
                'command': self.command}

    def _rewind_point(self):  # what an update's micro-batches consume, put back when a stop abandons the update
        data, rng = self.data_state(), get_rng_state()
        return lambda: (self.load_data_state(data), set_rng_state(rng))

    def train(self) -> bool:
        """Train from ``state.step`` to ``--steps`` (or ``--stop-after-step``); True when all steps are done."""
        args, run, opt, state = self.args, self.run, self.opt, self.state
        loop = StepLoop(opt.model, opt.train_model, opt.update_step, opt.scheduler, opt.model_ema, run.stop_signal,
                        run.dist_info.distributed, num_updates=state.step, rewind_point=self._rewind_point,
                        device=run.dist_info.device)
        loop_start = time.perf_counter()
        opt.train_model.train()
        while state.step < args.steps:
            t0 = time.perf_counter()
            lr = opt.optimizer.param_groups[0]['lr']  # this update's
            losses = loop.update(self.micro_loss, args.grad_accum_steps, stopped_at=f'step {state.step}',
                                 loss_at=lambda micro: f'step {state.step + 1} (micro-batch {micro})')
            state.interval_loss += losses.loss_sum
            state.interval_batches += losses.micro_batches
            state.step = step = loop.num_updates
            state.train_seconds += time.perf_counter() - t0
            if run.primary and (step % args.log_interval == 0 or step == args.steps):
                eta = (time.perf_counter() - loop_start) / (step - state.start_step) * (args.steps - step)
                percent = f' ({100. * step / args.steps:3.0f}%)' if self.show_percent else ''
                self.logger.info(progress_line(f'step {step:>{len(str(args.steps))}d}/{args.steps}{percent}',
                                               f'{state.interval_loss / state.interval_batches:.4f}', lr,
                                               self.progress(), format_duration(eta)))
            stopping = step == args.stop_after_step
            if step % args.eval_interval == 0 or step == args.steps:
                self._evaluate_and_save(lr)
            elif stopping:
                self.save()
                self.logger.info(f'step {step}: stopping (--stop-after-step) | saved last.pth')
            if stopping:
                break
        if state.step < args.steps:
            last = run.saver.last_path if run.primary else 'EXP/last.pth'
            self.logger.info(f'Stopped at step {state.step} (--stop-after-step); continue with --resume {last}')
            state.stop_result = {'stopped_at_step': state.step, 'last': str(last)} if run.primary else None
            return False
        return True

    def _evaluate_and_save(self, lr: float) -> None:
        """The periodic evaluation: metrics, the interval's train loss (all ranks), a summary row and a checkpoint."""
        run, state = self.run, self.state
        with preserve_rng():  # evaluation must not shift the training's random streams
            state.val_metrics = metrics = self.evaluate()
        self.opt.train_model.train()
        interval = torch.tensor([state.interval_loss, float(state.interval_batches)], dtype=torch.float64,
                                device=run.dist_info.device)  # NCCL reduces tensors on the training device only
        if run.dist_info.distributed:
            dist.all_reduce(interval)
        loss_sum, batches = interval.tolist()
        train_loss = loss_sum / batches
        state.interval_loss, state.interval_batches = 0., 0
        columns, text = self.eval_report(metrics)
        if run.primary:
            run.summary.append({'step': state.step, 'lr': lr, 'train_loss': train_loss, 'val_loss': metrics['loss'],
                                **columns, 'elapsed_s': time.time() - run.start_time})
        written = self.save(metrics[self.best_key], metrics)
        if run.primary:
            self.logger.info(f'step {state.step}: train loss {train_loss:.4f} | {text} | saved last.pth'
                             + (' + model_best.pth' if written['best'] else ''))
