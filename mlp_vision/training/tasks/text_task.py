""" What the two tasks of ``python -m mlp_vision.train_text`` share (:class:`~.language_model.LMTask`,
:class:`~.text_classification.ClassificationTask`): the step-task base :class:`TextTask` (model on its device with
AdamW, AMP and the per-update schedule; the checkpoint fields; ``pretrained/``, the results' common fields, the
curves and the closing line), the ``--block-size`` check and the command line that ``results.json`` records.

Optimizer and schedule: the recipes of ``configs/text/`` (yaml files keyed by the trainer's flag names), AdamW and
timm's per-update schedule: linear warmup, then cosine, linear or constant. A recipe fills only the flags left unset
(None); ``warmup_steps`` is capped at a tenth of ``--steps`` unless ``--warmup-steps`` is given. The fills are
derived values (:class:`~mlp_vision.training.run.config.RunArgs`): ``args.yaml`` keeps the flags as given, and a
resume fills them again.
"""
import logging
import shlex
import time
from typing import Any, Dict, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from timm.optim import create_optimizer_v2
from timm.utils import random_seed

from mlp_vision.errors import UsageError
from mlp_vision.text.bigs import bigs_param_groups
from mlp_vision.text.modeling_utils import check_text_activations
from mlp_vision.text.tokenizer import Tokenizer, tokenizer_kind, tokenizer_to_dict
from mlp_vision.training.run.checkpoint import atomic_folder
from mlp_vision.training.run.config import find_recipe, load_yaml_config
from mlp_vision.training.run.driver import Optimization, StepTask
from mlp_vision.training.run.loop import format_duration
from mlp_vision.training.run.summary import plot_curves
from mlp_vision.training.run.training_run import UpdateStep, create_lr_scheduler, setup_amp
from mlp_vision.training.tasks.text_args import build_parser

__all__ = ['TextTask', 'fit_block_size', 'command_line', 'RECIPES', 'FINETUNE_RECIPE', 'TIMM_SCHED', 'load_recipe',
           'apply_recipe', 'lm_schedule']

_logger = logging.getLogger('mlp_vision.train_text')

# (model family, registry task) -> its recipe in configs/text/; a family without one takes its task's default
RECIPES: Dict[Tuple[str, str], str] = {
    ('gmlp', 'masked_lm'): 'gmlp_masked_lm',
    ('bigs', 'masked_lm'): 'bigs_masked_lm',
    ('gpt', 'causal_lm'): 'gpt_causal_lm',
    ('gmlp', 'causal_lm'): 'gmlp_causal_lm',
}
DEFAULT_FAMILY = {'masked_lm': 'gmlp', 'causal_lm': 'gpt'}
FINETUNE_RECIPE = 'finetune'  # --task classify, every family
TIMM_SCHED = {'cosine': 'cosine', 'linear': 'poly', 'constant': 'constant'}  # poly with power 1 is linear


def load_recipe(name: str) -> dict:
    """The flag values (by destination) and ``source`` of ``configs/text/<name>.yaml``."""
    return load_yaml_config(str(find_recipe(name, kind='text')), build_parser(), notes=('source',))


def apply_recipe(args, family: str, registry_task: str) -> dict:
    """Fill the optimizer flags left unset from the recipe of the model family and registry task (the task's
    default when the family has none; :data:`FINETUNE_RECIPE` for sequence classification); returns the run's record:
    the recipe, its source and the flags the command line overrode."""
    if registry_task == 'sequence_classification':
        file_name = name = FINETUNE_RECIPE
    else:
        key = (family, registry_task) if (family, registry_task) in RECIPES else (
            DEFAULT_FAMILY[registry_task], registry_task)
        file_name, name = RECIPES[key], '/'.join(key)
    recipe = load_recipe(file_name)
    given = {'lr': args.lr, 'opt_betas': args.opt_betas, 'opt_eps': args.opt_eps,
             'weight_decay': args.weight_decay, 'sched': args.sched}
    overridden = [k for k, v in given.items() if v is not None and v != recipe[k]]
    fills = {dest: recipe[dest] for dest, value in given.items() if value is None}
    if args.warmup_steps is None:
        fills['warmup_steps'] = min(recipe.get('warmup_steps', args.steps // 10), args.steps // 10)
    args.derive(**fills)
    record_names = {'opt_betas': 'betas', 'opt_eps': 'eps'}  # the names results.json has always used
    overridden = [record_names.get(k, k) for k in overridden]
    source = recipe['source'] + (f'; overridden on the command line: {", ".join(overridden)}' if overridden else '')
    return {'recipe': name, 'source': source, 'overridden': overridden}


def lm_schedule(lr: float, steps: int, warmup_steps: int, sched: str, min_lr_ratio: float = 0.) -> dict:
    """The ``create_scheduler_v2`` arguments (+ ``lr``) of a run: per-update steps, linear warmup from
    ``lr / warmup_steps``, then ``sched`` towards ``min_lr_ratio * lr``."""
    return dict(sched=TIMM_SCHED[sched], num_epochs=steps, warmup_epochs=warmup_steps,
                warmup_lr=lr / max(warmup_steps, 1), min_lr=min_lr_ratio * lr, decay_rate=1.,
                step_on_epochs=False, lr=lr)


def command_line(prog: str, argv: Sequence[str]) -> str:
    """The command of a run as results.json records it: ``prog`` and the arguments, shell-quoted where needed."""
    return ' '.join([prog, *map(shlex.quote, argv)])


def fit_block_size(args, model: nn.Module, resizable: bool) -> None:
    """``--block-size``, by default the model's maximum length, which it may not exceed (``resizable``: the message
    names ``--model-kwargs max_position_embeddings``); then the activations of a batch are checked to fit."""
    seq_len = model.config.max_position_embeddings
    if args.block_size is None:
        args.derive(block_size=seq_len)
    if args.block_size > seq_len:
        raise UsageError(f'--block-size {args.block_size} is larger than the model\'s maximum length {seq_len}' + (
            f'; use --block-size <= {seq_len} or --model-kwargs max_position_embeddings={args.block_size}'
            if resizable else ''))
    check_text_activations(type(model), model.config, args.batch_size, args.block_size, True, f'--model {args.model}')


class TextTask(StepTask):
    """A text task for :func:`~mlp_vision.training.run.driver.drive`. :meth:`build` (seeded) reads the data and sets
    ``tokenizer``, ``family`` and ``model_cfg`` (the checkpoint's); ``registry_task`` picks the recipe. The rest of
    the setup and the shared parts of the checkpoints, results and report are here."""
    logger = _logger
    stop_advice = 'Lower --lr, keep --clip-grad on, add --warmup-steps'  # after a NaN / inf loss
    tokenizer: Tokenizer
    registry_task: str  # the registry task of the model (its recipe's key)

    def resume_identity(self) -> Dict[str, Any]:
        return {'task': self.args.task}

    def build(self) -> nn.Module:  # the model (its block size fitted), the data and the tokenizer
        raise NotImplementedError

    def setup(self) -> Optimization:
        """:meth:`build`, the recipe, then AdamW, AMP and the per-update schedule of the model on its device (the
        driver restores them from ``--resume``). AdamW's groups: BiGS has the official decay mask
        (:func:`~mlp_vision.text.bigs.bigs_param_groups`: SSM parameters and embeddings decayed, biases / LayerNorms
        not), other families timm's (no decay on 1-D parameters); ``--freeze-embeddings`` leaves the token embedding
        out of both."""
        args, run = self.args, self.run
        random_seed(args.seed, run.dist_info.rank)
        model = self.build().to(run.dist_info.device)
        self.recipe_info = apply_recipe(args, self.family, self.registry_task)
        if args.freeze_embeddings:
            model.get_input_embeddings().weight.requires_grad_(False)
        adamw = dict(lr=args.lr, betas=tuple(args.opt_betas), eps=args.opt_eps)
        if self.family == 'bigs':
            optimizer = torch.optim.AdamW(bigs_param_groups(model, args.weight_decay), **adamw)
        else:
            optimizer = create_optimizer_v2(model, 'adamw', weight_decay=args.weight_decay, **adamw)
        amp_autocast, loss_scaler, amp_dtype = setup_amp(args.amp, args.amp_dtype, run.dist_info.device)
        params = [p for p in model.parameters() if p.requires_grad]
        update_step = UpdateStep(optimizer, lambda: params, loss_scaler, args.clip_grad)
        schedule = lm_schedule(args.lr, args.steps, args.warmup_steps, args.sched, args.min_lr_ratio)
        scheduler, _ = create_lr_scheduler(optimizer, schedule)
        return Optimization(model, optimizer, scheduler, schedule, loss_scaler, update_step, amp_autocast, amp_dtype,
                            total=args.steps, total_flag='--steps')

    def ready(self, opt: Optimization) -> None:
        super().ready(opt)
        self.seconds_before = (self.run.resume_ckpt or {}).get('train_seconds', 0.)

    @property
    def train_seconds(self) -> float:  # the run's training time over its resumes
        return self.seconds_before + self.state.train_seconds

    def checkpoint_fields(self, metrics) -> Dict[str, Any]:
        args = self.args
        return dict(task=args.task, model_cfg=self.model_cfg, model_config=self.opt.model.config.text_fields(),
                    tokenizer=tokenizer_to_dict(self.tokenizer), block_size=args.block_size,
                    train_seconds=self.train_seconds, val_metrics=metrics)

    def log_model(self, name: str, detail: str) -> None:
        """The setup log's first line: the model, its parameters, device, processes, AMP and threads."""
        dist_info, opt = self.run.dist_info, self.opt
        total = sum(p.numel() for p in opt.model.parameters())
        fixed = sum(p.numel() for p in opt.model.parameters() if not p.requires_grad)  # --freeze-embeddings
        params = f'{total / 1e6:.3f} M params' + (f', {fixed / 1e6:.3f} M of them fixed (--freeze-embeddings)'
                                                   if fixed else '')
        processes = f' x {dist_info.world_size} processes ({dist.get_backend()})' if dist_info.distributed else ''
        self.logger.info(f'Model {name} ({params}, {detail}) on {dist_info.device}{processes}, '
                         f'AMP {opt.amp_dtype if self.args.amp else "off"}, {torch.get_num_threads()} threads')

    def export(self, digests, extra_files: Optional[Dict[str, str]] = None, **checkpoints) -> Dict[str, Any]:
        """``pretrained/`` (``save_pretrained`` of the model with its tokenizer, and ``extra_files``: name -> text),
        then the results' common fields (rank 0)."""
        args, model, tokenizer = self.args, self.opt.model, self.tokenizer
        with atomic_folder(self.run.output_dir / 'pretrained') as folder:
            model.save_pretrained(str(folder), tokenizer=tokenizer)
            for name, text in (extra_files or {}).items():
                (folder / name).write_text(text)
        return {'params': sum(p.numel() for p in model.parameters()),
                'tokenizer': {'type': tokenizer_kind(tokenizer), 'vocab_size': len(tokenizer)},
                'optimizer': {'name': 'adamw', 'lr': args.lr, 'betas': list(args.opt_betas), 'eps': args.opt_eps,
                              'weight_decay': args.weight_decay, 'sched': args.sched,
                              'warmup_steps': args.warmup_steps, 'min_lr_ratio': args.min_lr_ratio,
                              'clip_grad': args.clip_grad, **self.recipe_info},
                'train_seconds': self.train_seconds, **self.closing_results(digests, **checkpoints)}

    def plot_and_close(self, title: str, metric_column: str, metric_label: str, done: str) -> None:
        """``curves.png`` (train / val loss and ``metric_column``) and the closing log line ``Done: <done>; <time>``."""
        out = self.run.output_dir
        plot_curves(out / 'summary.csv', out / 'curves.png', title=title, x='step',
                    loss_columns=('train_loss', 'val_loss'), metric_columns=(metric_column,), metric_label=metric_label)
        self.logger.info(f'Done: {done}; {format_duration(time.time() - self.run.start_time)}')
