""" What the text trainer (``python -m mlp_vision.train_text``) adds to ``transformers.Trainer``, which has neither:
a run stops on a non-finite loss with one line naming the last checkpoint kept, and on SIGINT / SIGTERM (or at
``--stop-after-step``) with a checkpoint saved at the next update boundary, from which ``--resume`` continues.
"""
from typing import Callable, Optional

import torch
import torch.distributed as dist
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from mlp_vision.errors import RunError

__all__ = ['RunStops', 'DatasetEpoch', 'StoppableTrainer']


class RunStops(TrainerCallback):
    """At every update's end, the ranks agree (one all-reduce of two numbers) on whether a loss of this update was
    not finite -- then every rank raises :class:`~mlp_vision.errors.RunError` before anything is saved, naming the
    last checkpoint -- or a signal arrived on any rank (``stop()``: its number, 0 for none), or ``stop_after_step``
    is reached: then Trainer saves a checkpoint and stops (``signum``, ``checkpoint``). :class:`StoppableTrainer`
    sets ``nonfinite``."""

    def __init__(self, stop: Callable[[], int], stop_after_step: Optional[int] = None):
        self.stop, self.stop_after_step = stop, stop_after_step
        self.nonfinite = False
        self.signum = 0
        self.checkpoint = ''

    def on_step_end(self, args, state, control, **kwargs):
        flags = torch.tensor([float(self.stop()), float(self.nonfinite)], device=args.device)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        signum, nonfinite = int(flags[0]), bool(flags[1])
        if nonfinite:
            last = get_last_checkpoint(args.output_dir) if args.output_dir else None
            raise RunError(f'the training loss is not finite (NaN / inf) at step {state.global_step}; '
                           f'{"the last checkpoint kept: " + last if last else "no checkpoint was saved"} '
                           f'(--resume continues from it); lower --lr, keep --clip-grad on, add --warmup-steps')
        if signum or state.global_step == self.stop_after_step:
            self.signum = signum
            self.checkpoint = f'{args.output_dir}/{PREFIX_CHECKPOINT_DIR}-{state.global_step}'
            control.should_save = True
            control.should_training_stop = True
        return control


class DatasetEpoch(TrainerCallback):
    """Sets ``dataset.epoch`` to the epoch Trainer starts (also the one a resume continues in)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.dataset.epoch = int(state.epoch or 0)


class StoppableTrainer(Trainer):
    """``transformers.Trainer`` with :class:`RunStops` (told of a non-finite training loss) and ``callbacks``."""

    def __init__(self, *args, stops: RunStops, callbacks=(), **kwargs):
        super().__init__(*args, callbacks=[stops, *callbacks], **kwargs)
        self.stops = stops

    def training_step(self, *args, **kwargs) -> torch.Tensor:
        loss = super().training_step(*args, **kwargs)
        self.stops.nonfinite |= not bool(torch.isfinite(loss).all())
        return loss
