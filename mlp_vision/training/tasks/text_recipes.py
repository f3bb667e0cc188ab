""" The optimizer and schedule of the text trainers: the recipes of ``configs/text/`` (yaml files keyed by the
trainer's flag names), AdamW and timm's per-update schedule: linear warmup, then cosine, linear or constant.

A recipe fills only the flags left unset (None); ``warmup_steps`` is capped at a tenth of ``--steps`` unless
``--warmup-steps`` is given. The fills are derived values (:class:`~mlp_vision.training.run.config.RunArgs`):
``args.yaml`` keeps the flags as given, and a resume fills them again.
"""
from typing import Dict, Tuple

import torch
import torch.nn as nn
from timm.optim import create_optimizer_v2

from mlp_vision.text.bigs import bigs_param_groups
from mlp_vision.training.run.config import find_recipe, load_yaml_config
from mlp_vision.training.tasks.text_args import build_parser

__all__ = ['RECIPES', 'FINETUNE_RECIPE', 'TIMM_SCHED', 'load_recipe', 'apply_recipe', 'apply_family_recipe',
           'create_optimizer', 'lm_schedule', 'optimizer_record', 'params_note']

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


def apply_family_recipe(args, family: str, registry_task: str) -> dict:
    """:func:`apply_recipe` with the recipe of the model family (its task's default when it has none)."""
    key = (family, registry_task) if (family, registry_task) in RECIPES else (
        DEFAULT_FAMILY[registry_task], registry_task)
    return apply_recipe(args, load_recipe(RECIPES[key]), '/'.join(key))


def apply_recipe(args, recipe: dict, name: str) -> dict:
    """Fill the optimizer flags left unset from ``recipe`` (by destination); returns the run's record: ``name``, the
    source and the flags the command line overrode."""
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


def create_optimizer(model: nn.Module, family: str, args) -> torch.optim.Optimizer:
    """AdamW. BiGS: the official decay mask (:func:`~mlp_vision.text.bigs.bigs_param_groups`: SSM parameters and
    embeddings decayed, biases / LayerNorms not); other families: timm's groups (no decay on 1-D parameters).
    ``--freeze-embeddings``: the token embedding gets no gradient and is left out of both."""
    if args.freeze_embeddings:
        model.get_input_embeddings().weight.requires_grad_(False)
    if family == 'bigs':
        return torch.optim.AdamW(bigs_param_groups(model, args.weight_decay), lr=args.lr,
                                 betas=tuple(args.opt_betas), eps=args.opt_eps)
    return create_optimizer_v2(model, 'adamw', lr=args.lr, weight_decay=args.weight_decay,
                               betas=tuple(args.opt_betas), eps=args.opt_eps)


def lm_schedule(lr: float, steps: int, warmup_steps: int, sched: str, min_lr_ratio: float = 0.) -> dict:
    """The ``create_scheduler_v2`` arguments (+ ``lr``) of a run: per-update steps, linear warmup from
    ``lr / warmup_steps``, then ``sched`` towards ``min_lr_ratio * lr``."""
    return dict(sched=TIMM_SCHED[sched], num_epochs=steps, warmup_epochs=warmup_steps,
                warmup_lr=lr / max(warmup_steps, 1), min_lr=min_lr_ratio * lr, decay_rate=1.,
                step_on_epochs=False, lr=lr)


def optimizer_record(args, recipe_info: dict) -> dict:
    """The optimizer as ``results.json`` records it: AdamW's values, the schedule, the recipe."""
    return {'name': 'adamw', 'lr': args.lr, 'betas': list(args.opt_betas), 'eps': args.opt_eps,
            'weight_decay': args.weight_decay, 'sched': args.sched, 'warmup_steps': args.warmup_steps,
            'min_lr_ratio': args.min_lr_ratio, 'clip_grad': args.clip_grad, **recipe_info}


def params_note(model: nn.Module) -> str:
    """'1.724 M params' for the log, with the fixed ones (``--freeze-embeddings``) counted apart."""
    total = sum(p.numel() for p in model.parameters())
    fixed = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    fixed_note = f', {fixed / 1e6:.3f} M of them fixed (--freeze-embeddings)' if fixed else ''
    return f'{total / 1e6:.3f} M params{fixed_note}'
