""" Train the text models of :mod:`mlp_vision.text`: char/byte-level causal LM or BERT-style masked LM.

One step-based loop for every registered text model; the run itself (outputs, resume, checkpoints, AMP and the
optimizer step, timm's LR schedule, NaN and signal stops, results) is the training core of
:mod:`mlp_vision.training.run`, shared with ``train.py``; the data is :mod:`mlp_vision.text.data`::

    # char-level causal LM on Tiny Shakespeare (first 90 % train, last 10 % validation)
    python -m mlp_vision.text.train --task causal --model gpt_mlp_attention \\
        --train-file ../shared/data/tinyshakespeare/input.txt --steps 2000 -b 32 --sample-prompt "ROMEO:"

    # masked LM (15 % masking, 80/10/10) with a separate held-out file
    python -m mlp_vision.text.train --task mlm --model gmlp_base --model-kwargs num_hidden_layers=6 \\
        hidden_size=256 intermediate_size=1536 --train-file wikitext-2/valid.txt --val-file wikitext-2/test.txt

    # two processes (gloo on CPU, NCCL on GPUs)
    torchrun --nproc_per_node=2 -m mlp_vision.text.train --task causal --model gpt_sdpa --train-file input.txt

    # continue a run in its folder with its saved settings (bit-exact on CPU, 1 process); flags given override them
    python -m mlp_vision.text.train --resume output/text/EXP/last.pth [--steps 4000]

Validation uses a fixed subset of ``--eval-batches`` batches periodically and all of them (or
``--final-eval-batches``) at the end. Training batches come from a generator of their own (seeded by ``--seed``
and the rank), so two models trained with the same seed see the same data in the same order; dropout uses the
global RNG. The tokenizer is stored in every checkpoint and saved with the model in ``pretrained/``.

Optimizer: AdamW (timm's ``create_optimizer_v2``: no weight decay on biases / norms / 1-D parameters; BiGS: the
official decay mask of :func:`~mlp_vision.text.bigs.bigs_param_groups`) with the recipe of the model family
(:data:`RECIPES`); every value can be overridden. Schedule (timm's, per update): linear warmup over
``--warmup-steps`` from LR / warmup_steps, then ``--sched`` ``cosine`` | ``linear`` (to ``--min-lr-ratio`` x LR)
| ``constant``.

Outputs (``--output/--experiment``): ``args.yaml``, ``train.log``, ``summary.csv`` (step, lr, train loss, val
loss, val perplexity, [masked accuracy], tokens/s), ``last.pth`` / ``model_best.pth`` (lowest periodic val loss),
``results.json``, ``curves.png``, ``pretrained/`` (``save_pretrained`` with the tokenizer), ``samples.txt``
(causal, with ``--sample-prompt``).
"""
import argparse
import dataclasses
import json
import logging
import math
import time
from contextlib import nullcontext
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from timm.optim import create_optimizer_v2
from timm.utils import ParseKwargs, random_seed, unwrap_model

from ..training.checkpoint import atomic_folder, preserve_rng
from ..training.config import SEED_MAX, THREADS_RANGE
from ..training.distributed import DistInfo, all_gather_objects, init_device, wrap_ddp
from ..training.engine import format_duration
from ..training.errors import UsageError, check_range, run_cli
from ..training.log import setup_logging
from ..training.run import (
    TrainingRun, UpdateStep, add_run_arguments, create_lr_scheduler, parse_run_args, setup_amp)
from ..training.summary import plot_curves
from .data import (
    Batch, MLMMasker, build_tokenizer, causal_eval_batches, encode_text, mlm_eval_batches, read_text_file,
    sample_causal_batch, sample_mlm_batch, subset_batches, tokenizer_from_path, unigram_mlm_baseline)
from .loop import StepState, run_steps
from .modeling_utils import masked_lm_loss as lm_loss  # token cross-entropy; causal labels are already shifted
from .registry import create_model, is_model, list_models, model_entry
from .tokenizer import SUBWORD_KINDS, Tokenizer, check_vocab_size, tokenizer_from_dict

__all__ = ['TASKS', 'RECIPES', 'forward_logits', 'evaluate_lm', 'lm_schedule', 'main']

_logger = logging.getLogger('mlp_vision.text.train')

# --task -> the registry task a model must have
TASKS = {'causal': 'causal_lm', 'mlm': 'masked_lm', 'classify': 'sequence_classification'}  # classify: classification.py

# optimizer / schedule defaults per (model family, registry task); flags override every field. warmup_steps is
# the recipe's; a run uses min(recipe warmup, 10 % of --steps) unless --warmup-steps is given.
RECIPES: Dict[Tuple[str, str], dict] = {
    ('gmlp', 'masked_lm'): dict(
        lr=7e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, sched='linear', warmup_steps=10000,
        source='BERT pretraining (arXiv 1810.04805 App. A.2: AdamW, weight decay 0.01, 10k warmup, linear decay), '
               'which gMLP\'s MLM experiments follow (arXiv 2105.08050 §4); lr 7e-4 for small models'),
    ('bigs', 'masked_lm'): dict(
        lr=6e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.05, sched='cosine', warmup_steps=2000,
        source='BiGS pretraining (arXiv 2212.10544 App. A.1, Table 7: AdamW (0.9, 0.98), eps 1e-6, lr 6e-4, '
               'weight decay 0.05, cosine decay)'),
    ('gpt', 'causal_lm'): dict(
        lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, sched='constant', warmup_steps=0,
        source='MLP-Attention (ICLR 2023 Tiny Papers, App. B: Adam lr 3e-4; torch defaults otherwise), constant LR'),
    ('gmlp', 'causal_lm'): dict(
        lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, sched='cosine', warmup_steps=1000,
        source='no recipe in the papers: our default (AdamW 3e-4, warmup, cosine)'),
}
_DEFAULT_RECIPE = {'masked_lm': ('gmlp', 'masked_lm'), 'causal_lm': ('gpt', 'causal_lm')}
_TIMM_SCHED = {'cosine': 'cosine', 'linear': 'poly', 'constant': 'constant'}  # poly with power 1 is linear


# ------------------------------------------------------------------------------------------------ model calls
def forward_logits(model: nn.Module, batch: Batch, device: torch.device, amp_autocast=nullcontext,
                   sparse_prediction: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """(logits (B, L, V), labels (B, L)) of a batch on ``device``: the one place that calls a text model.

    ``sparse_prediction`` (a masked LM whose config has it): the labels go into the model, which decodes only the
    scored positions, and the result is (logits (N, V), labels (N,)) -- the same loss for a fraction of the head.
    """
    x, attention, y = batch
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    if attention is not None:
        attention = attention.to(device, non_blocking=True)
    with amp_autocast():
        out = model(input_ids=x, attention_mask=attention, **({'labels': y} if sparse_prediction else {}))
    if sparse_prediction:
        y = y[y != -100]
    return out.logits, y


@torch.no_grad()
def evaluate_lm(model: nn.Module, batches: Sequence[Batch], *, task: str, device: torch.device,
                amp_autocast=nullcontext, dist_info: Optional[DistInfo] = None,
                mask_id: Optional[int] = None) -> Dict[str, float]:
    """Mean token cross-entropy (``loss``), ``ppl`` = exp(loss) and, for MLM, masked-token accuracy (%) over all
    scored positions (``masked_acc``) and over the ``<mask>`` inputs only (``mask_token_acc``); causal LM also
    gets bits per token (``bpc``). Batches are split over the ranks and the sums reduced: the numbers equal a
    one-process run."""
    model.eval()
    rank, world = (dist_info.rank, dist_info.world_size) if dist_info is not None and dist_info.distributed else (0, 1)
    sums = torch.zeros(5, dtype=torch.float64)  # loss sum, scored tokens, correct, <mask> inputs, correct there
    start = time.perf_counter()
    for batch in batches[rank::world]:
        logits, y = forward_logits(model, batch, device, amp_autocast)
        logits = logits.float()
        scored = y != -100
        loss_sum = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100, reduction='sum')
        correct = (logits.argmax(-1) == y) & scored
        at_mask = scored & (batch[0].to(device) == mask_id) if mask_id is not None else torch.zeros_like(scored)
        sums += torch.tensor([loss_sum.item(), scored.sum().item(), correct.sum().item(), at_mask.sum().item(),
                              (correct & at_mask).sum().item()], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(sums)
    loss_sum, n, correct, n_mask, correct_mask = sums.tolist()
    if n == 0:
        raise RuntimeError('evaluation scored no tokens')
    loss = loss_sum / n
    metrics = {'loss': loss, 'ppl': math.exp(min(loss, 700.)), 'tokens': int(n)}
    if task == 'mlm':
        metrics['masked_acc'] = 100. * correct / n
        metrics['mask_token_acc'] = 100. * correct_mask / max(n_mask, 1.)
    else:
        metrics['bpc'] = loss / math.log(2)
    metrics['seconds'] = time.perf_counter() - start
    return metrics


def lm_schedule(lr: float, steps: int, warmup_steps: int, sched: str, min_lr_ratio: float = 0.) -> dict:
    """The ``create_scheduler_v2`` arguments (+ ``lr``) of a run: per-update steps, linear warmup from
    ``lr / warmup_steps``, then ``sched`` towards ``min_lr_ratio * lr``."""
    return dict(sched=_TIMM_SCHED[sched], num_epochs=steps, warmup_epochs=warmup_steps,
                warmup_lr=lr / max(warmup_steps, 1), min_lr=min_lr_ratio * lr, decay_rate=1.,
                step_on_epochs=False, lr=lr)


# ------------------------------------------------------------------------------------------------ arguments
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='python -m mlp_vision.text.train',
        description='Train a mlp_vision.text model: char/byte-level causal LM or BERT-style masked LM.',
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument('-c', '--config', default='', type=str, metavar='FILE',
                        help='yaml file of flag values (keys = flag names); explicit flags override it')
    g = parser.add_argument_group('Task and data')
    g.add_argument('--task', default='causal', choices=sorted(TASKS),
                   help='causal LM, masked LM, or classify (fine-tune on a labelled TSV / CSV, see '
                        'mlp_vision.text.classification)')
    g.add_argument('--text-columns', default='', type=str, metavar='COL[,COL]',
                   help='classify: the text column or sentence pair (default: sentence, else sentence1,sentence2)')
    g.add_argument('--label-column', default='label', type=str, metavar='COL', help='classify: the label column')
    g.add_argument('--test-file', default='', type=str, metavar='PATH',
                   help='classify: a labelled file scored once, with the best checkpoint (chosen on --val-file), at '
                        'the end; keep the file you report apart from the one you select on')
    g.add_argument('--init-from', default='', type=str, metavar='PATH',
                   help='classify: start from this last.pth / model_best.pth, pretrained/ folder or official BiGS '
                        'folder (its architecture and tokenizer); the log lists the loaded and the new weights')
    g.add_argument('--tokenizer-from', default='', type=str, metavar='PATH',
                   help='the tokenizer of this folder (a pretrained/ folder, tokenizer.json or BERT vocab.txt) '
                        'instead of --tokenizer: several pretraining runs with one vocabulary, or a classifier '
                        'trained from scratch with a pretrained run\'s vocabulary (not with --init-from)')
    g.add_argument('--train-file', default='', type=str, metavar='PATH', help='UTF-8 training text')
    g.add_argument('--val-file', default='', type=str, metavar='PATH',
                   help='held-out UTF-8 text (default: the last --val-fraction of --train-file)')
    g.add_argument('--val-fraction', default=0.1, type=float,
                   help='without --val-file: this final fraction of the training text is held out')
    g.add_argument('--tokenizer', default='char', choices=('char', 'byte', 'wordpiece', 'bpe'),
                   help='char or UTF-8 byte tokens, or a WordPiece / byte-level BPE vocabulary trained on the training '
                        'text (saved with the checkpoint and in pretrained/)')
    g.add_argument('--vocab-size', default=8000, type=int, help='wordpiece / bpe: vocabulary size to train')
    g.add_argument('--block-size', '--seq-len', default=None, type=int, metavar='N',
                   help="tokens per sample (MLM: including <cls> and <sep>); default: the model's max length")
    g.add_argument('--mask-rate', default=0.15, type=float, help='MLM: fraction of tokens selected')

    g = parser.add_argument_group('Model')
    g.add_argument('--model', default='gpt_mlp_attention', type=str, help='name in mlp_vision.text.list_models()')
    g.add_argument('--model-kwargs', nargs='*', default={}, action=ParseKwargs,
                   help='config overrides k=v, e.g. num_hidden_layers=4 hidden_size=256 (vocab_size comes from '
                        'the tokenizer)')

    g = parser.add_argument_group('Optimization (defaults: the model family recipe, see RECIPES)')
    g.add_argument('--steps', default=1000, type=int, help='optimizer updates')
    g.add_argument('-b', '--batch-size', default=32, type=int, help='samples per micro-batch per process')
    g.add_argument('--grad-accum-steps', default=1, type=int, help='micro-batches per optimizer update')
    g.add_argument('--lr', default=None, type=float, help='peak learning rate')
    g.add_argument('--opt-betas', default=None, type=float, nargs=2, metavar='BETA', help='AdamW betas')
    g.add_argument('--opt-eps', default=None, type=float, help='AdamW epsilon')
    g.add_argument('--weight-decay', default=None, type=float, help='AdamW weight decay (not on 1-D params)')
    g.add_argument('--sched', default=None, choices=sorted(_TIMM_SCHED), help='decay after warmup')
    g.add_argument('--warmup-steps', default=None, type=int,
                   help="linear warmup updates (default: min(the recipe's, 10%% of --steps))")
    g.add_argument('--min-lr-ratio', default=0.0, type=float, help='cosine / linear decay ends at this x LR')
    g.add_argument('--clip-grad', default=1.0, type=float, help='max gradient norm (<= 0: off)')
    g.add_argument('--model-ema', action='store_true', default=False,
                   help='classify: keep an exponential moving average of the weights (timm ModelEmaV3); the '
                        'periodic evaluation scores it (and the raw weights, column raw_val_acc), its accuracy picks '
                        'model_best.pth, and --test-file and pretrained/ use its weights')
    g.add_argument('--model-ema-decay', default=0.999, type=float,
                   help='EMA decay per update (1 / (1 - decay) updates is its horizon)')
    g.add_argument('--freeze-embeddings', action=argparse.BooleanOptionalAction, default=False,
                   help='keep the token embedding (model.get_input_embeddings()) fixed: no gradient, not in the '
                        'optimizer. A small labelled set updates only the rows of the words it contains; frozen, '
                        'the pretrained vectors of the words it lacks stay where the encoder learnt to read them '
                        '(with a tied MLM decoder the decoder is fixed too)')

    g = parser.add_argument_group('Evaluation, checkpoints, outputs')
    g.add_argument('--eval-interval', default=100, type=int, help='evaluate + checkpoint every N updates')
    g.add_argument('--eval-batches', default=8, type=int,
                   help='validation batches of the periodic evaluation (a fixed subset; <= 0: all)')
    g.add_argument('--final-eval-batches', default=0, type=int, help='validation batches at the end (<= 0: all)')
    g.add_argument('--eval-batch-size', default=None, type=int, help='default: --batch-size')
    g.add_argument('--log-interval', default=10, type=int, help='progress line every N updates')
    g.add_argument('--output', default='', type=str, help='output root (default ./output/text)')
    g.add_argument('--experiment', default='', type=str, help='experiment folder name (default: date-model-task)')
    add_run_arguments(g, 'continue the run of this last.pth in its folder, with its saved settings; flags given '
                         'here override them (e.g. a larger --steps)')
    g.add_argument('--stop-after-step', default=None, type=int, metavar='N',
                   help='checkpoint at update N and exit (continue later with --resume); the schedule still '
                        'spans --steps')
    g.add_argument('--sample-prompt', default=None, type=str,
                   help='causal LM: after training, sample from this prompt into samples.txt')
    g.add_argument('--sample-tokens', default=500, type=int, help='tokens per sample')
    g.add_argument('--num-samples', default=1, type=int, help='samples per prompt')
    g.add_argument('--sample-temperature', default=1.0, type=float, help='sampling temperature (<= 0: greedy)')
    g.add_argument('--sample-top-k', default=None, type=int, help='sample from the k most likely tokens')

    g = parser.add_argument_group('Device')
    g.add_argument('--device', default=None, type=str, help="'cuda', 'cpu', ... (default: cuda if available)")
    g.add_argument('--dist-backend', default=None, type=str, help='default: nccl for CUDA, gloo for CPU')
    g.add_argument('--dist-url', default=None, type=str, help="default: 'env://' (torchrun)")
    g.add_argument('--amp', action='store_true', default=False,
                   help='mixed precision: bfloat16 autocast on CPU, float16 + grad scaler on CUDA')
    g.add_argument('--amp-dtype', default=None, choices=('float16', 'bfloat16'), help='autocast dtype')
    g.add_argument('--threads', default=None, type=int, help='torch intra-op threads (default: torch\'s)')
    g.add_argument('--seed', default=42, type=int, help='seed of the model init, dropout and data order')
    return parser


_UNIT_OPEN = dict(low=0, high=1, low_open=True, high_open=True)


def _check_args(args) -> None:
    """Every flag value that cannot work, as one line, before a file is read or a model built. Flags left at None
    take their value later (from the recipe or the model) and are checked only when given."""
    min_block = 3 if args.task == 'mlm' else 1  # MLM: <cls>, one token, <sep>
    ranges = [
        ('--steps', args.steps, dict(low=1)), ('--batch-size', args.batch_size, dict(low=1)),
        ('--grad-accum-steps', args.grad_accum_steps, dict(low=1)),
        ('--eval-interval', args.eval_interval, dict(low=1)), ('--log-interval', args.log_interval, dict(low=1)),
        ('--eval-batch-size', args.eval_batch_size, dict(low=1)), ('--threads', args.threads, THREADS_RANGE),
        ('--sample-tokens', args.sample_tokens, dict(low=1)), ('--num-samples', args.num_samples, dict(low=1)),
        ('--sample-top-k', args.sample_top_k, dict(low=1)),
        ('--sample-temperature', args.sample_temperature, dict(why='<= 0: greedy')),
        ('--seed', args.seed, dict(low=0, high=SEED_MAX)),
        ('--block-size', args.block_size, dict(low=min_block, why=f'--task {args.task}')),
        ('--vocab-size', args.vocab_size, dict(low=1)),
        ('--val-fraction', None if args.val_file else args.val_fraction, _UNIT_OPEN),
        ('--mask-rate', args.mask_rate, _UNIT_OPEN),
        ('--lr', args.lr, dict(low=0, low_open=True)),
        ('--opt-eps', args.opt_eps, dict(low=0, low_open=True)),  # 0: a parameter without gradient gets 0 / 0
        ('--weight-decay', args.weight_decay, dict(low=0)),
        ('--clip-grad', args.clip_grad, dict(why='<= 0: no clipping')),
        ('--min-lr-ratio', args.min_lr_ratio, dict(low=0, high=1)),
        ('--warmup-steps', args.warmup_steps, dict(low=0)),
        ('--model-ema-decay', args.model_ema_decay, dict(low=0, high=1, high_open=True)),
        ('--stop-after-step', args.stop_after_step, dict(low=1, high=args.steps, why='--steps')),
    ] + [('--opt-betas', beta, dict(low=0, high=1, high_open=True)) for beta in args.opt_betas or ()]
    for flag, value, bounds in ranges:
        if value is not None:
            check_range(flag, value, **bounds)
    if args.tokenizer in SUBWORD_KINDS and not args.tokenizer_from:
        check_vocab_size('--vocab-size', args.tokenizer, args.vocab_size)
    if args.task != 'classify':  # these only mean something to classify: ignoring them would hide a mistake
        given = [flag for flag, value in (('--init-from', args.init_from), ('--test-file', args.test_file),
                                          ('--text-columns', args.text_columns)) if value]
        if given:
            raise UsageError(f'{", ".join(given)} {"is" if len(given) == 1 else "are"} for --task classify, not '
                             f'--task {args.task}')
    if args.sample_prompt is not None and args.task != 'causal':
        raise UsageError('--sample-prompt needs --task causal (masked LMs do not generate)')
    if args.sample_prompt == '':
        raise UsageError('--sample-prompt is empty: give at least one character')
    if args.model_ema and args.task != 'classify':
        raise UsageError(f'--model-ema is implemented for --task classify, not --task {args.task}')
    saved = getattr(args, 'resumed_settings', None) or {}
    if saved and bool(saved.get('freeze_embeddings', False)) != args.freeze_embeddings:
        # the optimizer state holds exactly the trained parameters, so the set cannot change mid-run
        raise UsageError(f'--resume {args.resume} was trained with{"" if saved.get("freeze_embeddings") else "out"} '
                         f'--freeze-embeddings; resume it the same way (start a new run to change it)')


def _model_entry(name: str, task: str):
    """The registry entry of ``name``; it must be registered for ``task`` (its default task)."""
    if not is_model(name):
        raise UsageError(f'unknown text model {name!r}; known: {", ".join(list_models())}')
    entry = model_entry(name)
    if entry.task != TASKS[task]:
        raise UsageError(f'model {name!r} is a {entry.task} model; --task {task} needs a {TASKS[task]} model: '
                         f'{", ".join(list_models(task=TASKS[task]))}')
    return entry


def _resolve_recipe(args, family: str, registry_task: str) -> dict:
    """Fill --lr / --opt-betas / --opt-eps / --weight-decay / --sched / --warmup-steps from the family recipe."""
    key = (family, registry_task) if (family, registry_task) in RECIPES else _DEFAULT_RECIPE[registry_task]
    return _apply_recipe(args, RECIPES[key], f'{key[0]}/{key[1]}')


def _apply_recipe(args, recipe: dict, name: str) -> dict:
    """Fill the optimizer flags left unset (None) from ``recipe``: --lr / --opt-betas / --opt-eps / --weight-decay /
    --sched, and --warmup-steps (the recipe's ``warmup_steps``, at most a tenth of --steps; a tenth of --steps when
    the recipe has none). Returns the run's record: ``name``, the source and the flags the command line overrode."""
    given = {'lr': args.lr, 'betas': None if args.opt_betas is None else tuple(args.opt_betas), 'eps': args.opt_eps,
             'weight_decay': args.weight_decay, 'sched': args.sched}
    overridden = [k for k, v in given.items() if v is not None and v != recipe[k]]  # recipe betas are tuples
    args.lr = recipe['lr'] if args.lr is None else args.lr
    args.opt_betas = list(recipe['betas']) if args.opt_betas is None else list(args.opt_betas)
    args.opt_eps = recipe['eps'] if args.opt_eps is None else args.opt_eps
    args.weight_decay = recipe['weight_decay'] if args.weight_decay is None else args.weight_decay
    args.sched = recipe['sched'] if args.sched is None else args.sched
    if args.warmup_steps is None:
        args.warmup_steps = min(recipe.get('warmup_steps', args.steps // 10), args.steps // 10)
    source = recipe['source'] + (f'; overridden on the command line: {", ".join(overridden)}' if overridden else '')
    return {'recipe': name, 'source': source, 'overridden': overridden}


def _create_optimizer(model: nn.Module, family: str, args) -> torch.optim.Optimizer:
    """AdamW. BiGS: the official decay mask (:func:`~mlp_vision.text.bigs.bigs_param_groups`: SSM parameters and
    embeddings decayed, biases / LayerNorms not); other families: timm's groups (no decay on 1-D parameters).
    ``--freeze-embeddings``: the token embedding gets no gradient and is left out of both."""
    if args.freeze_embeddings:
        model.get_input_embeddings().weight.requires_grad_(False)
    if family == 'bigs':
        from .bigs import bigs_param_groups
        return torch.optim.AdamW(bigs_param_groups(model, args.weight_decay), lr=args.lr,
                                 betas=tuple(args.opt_betas), eps=args.opt_eps)
    return create_optimizer_v2(model, 'adamw', lr=args.lr, weight_decay=args.weight_decay,
                               betas=tuple(args.opt_betas), eps=args.opt_eps)


def params_note(model: nn.Module) -> str:
    """'1.724 M params' for the log, with the fixed ones (``--freeze-embeddings``) counted apart."""
    total = sum(p.numel() for p in model.parameters())
    fixed = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    fixed_note = f', {fixed / 1e6:.3f} M of them fixed (--freeze-embeddings)' if fixed else ''
    return f'{total / 1e6:.3f} M params{fixed_note}'


# ------------------------------------------------------------------------------------------------ data
@dataclasses.dataclass
class LMData:
    """What the loop needs of a task's data: the tokenizer, a sampler of training batches, the validation
    batches (periodic subset and final set) and the evaluation of a model on them."""
    tokenizer: Tokenizer
    train_ids: torch.Tensor
    val_ids: torch.Tensor
    next_batch: Callable[[torch.Generator], Batch]
    periodic_batches: List[Batch]
    final_batches: List[Batch]
    mask_id: Optional[int]
    base_ids: torch.Tensor  # the non-special token ids


def _read_texts(args) -> Tuple[str, str]:
    train_text = read_text_file(args.train_file, 'training text file')
    if args.val_file:
        return train_text, read_text_file(args.val_file, 'validation text file')
    cut = int(len(train_text) * (1. - args.val_fraction))
    return train_text[:cut], train_text[cut:]


def _lm_data(args, tokenizer: Tokenizer, train_ids: torch.Tensor, val_ids: torch.Tensor) -> LMData:
    """The training sampler and validation batches of --task causal / mlm (see :mod:`mlp_vision.text.data`)."""
    need = args.block_size + 1 if args.task == 'causal' else 1
    for ids, what in ((train_ids, 'training'), (val_ids, 'validation')):
        if len(ids) < need:
            raise UsageError(f'the {what} text has {len(ids)} tokens, fewer than one block of '
                             f'{args.block_size} + 1; use a longer text or a smaller --block-size')
    eval_bs = args.eval_batch_size or args.batch_size
    if args.task == 'mlm':
        masker = MLMMasker(tokenizer, rate=args.mask_rate)
        val_batches = mlm_eval_batches(val_ids, args.block_size, eval_bs, tokenizer, masker, seed=args.seed)
        next_batch = partial(sample_mlm_batch, train_ids, args.batch_size, args.block_size, tokenizer, masker)
        mask_id, base_ids = tokenizer.mask_id, masker.base_ids
    else:
        val_batches = causal_eval_batches(val_ids, args.block_size, eval_bs)
        next_batch = partial(sample_causal_batch, train_ids, args.batch_size, args.block_size)
        mask_id, base_ids = None, torch.arange(tokenizer.vocab_size)
    return LMData(tokenizer, train_ids, val_ids, next_batch, subset_batches(val_batches, args.eval_batches, args.seed),
                  subset_batches(val_batches, args.final_eval_batches, args.seed), mask_id, base_ids)


# ------------------------------------------------------------------------------------------------ main
def main(argv: Optional[Sequence[str]] = None):
    """Train; returns the results dict on rank 0 (None on other ranks). Errors: one line, see ``run_cli``."""
    threads = torch.get_num_threads()  # --threads is for this run only: an in-process caller keeps its setting
    try:
        return run_cli('mlp_vision.text.train', _main, argv)
    finally:
        torch.set_num_threads(threads)


def _main(argv):
    args, resume_ckpt = parse_run_args(build_parser(), argv, kind='text')
    _check_args(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    dist_info = init_device(args.device, args.dist_backend, args.dist_url)
    setup_logging(dist_info.primary)
    run = TrainingRun(args, dist_info, resume_ckpt, kind='text', key='step', prog='mlp_vision.text.train',
                      decreasing=args.task != 'classify', max_history=0)  # classify: best = highest dev accuracy
    with run:
        return _train(args, run, argv)


def _train(args, run: TrainingRun, argv):
    dist_info = run.dist_info
    device, primary, world = dist_info.device, dist_info.primary, dist_info.world_size
    if args.task == 'classify':
        from .classification import train_classifier
        return train_classifier(args, run, argv)
    entry = _model_entry(args.model, args.task)
    run.check_resume(arch=args.model, task=args.task)
    resumed = run.resume_ckpt or {}

    # ---------------------------------------------------------------- text, tokenizer, model
    train_text, val_text = _read_texts(args)
    if resumed:
        tokenizer = tokenizer_from_dict(resumed['tokenizer'])
    elif args.tokenizer_from:
        tokenizer = tokenizer_from_path(args.tokenizer_from, needs=('pad', 'cls', 'sep', 'mask') if args.task == 'mlm'
                                        else ())
    else:
        tokenizer = build_tokenizer(args.tokenizer, args.task, train_text, val_text, args.vocab_size)
    if world > 1 and not resumed and not args.tokenizer_from and args.tokenizer in SUBWORD_KINDS:
        # WordPiece training is not reproducible run to run (hash-ordered ties): every rank takes rank 0's
        tokenizer = tokenizer_from_dict(all_gather_objects(tokenizer.to_dict(), dist_info)[0])
    train_ids = encode_text(tokenizer, train_text, 'training text')
    val_ids = encode_text(tokenizer, val_text, 'validation text')
    if args.sample_prompt is not None:
        encode_text(tokenizer, args.sample_prompt, '--sample-prompt')  # fail now, not after training

    recipe_info = _resolve_recipe(args, entry.family, entry.task)
    model_kwargs = dict(args.model_kwargs)
    if 'vocab_size' in model_kwargs and model_kwargs['vocab_size'] != tokenizer.vocab_size:
        raise UsageError(f'--model-kwargs vocab_size={model_kwargs["vocab_size"]} differs from the tokenizer\'s '
                         f'{tokenizer.vocab_size}; leave vocab_size out (it is set from the tokenizer)')
    model_kwargs['vocab_size'] = tokenizer.vocab_size
    config_fields = {f.name for f in dataclasses.fields(entry.config_class)}
    if 'pad_token_id' in config_fields and tokenizer.pad_id is not None:
        model_kwargs.setdefault('pad_token_id', tokenizer.pad_id)  # BiGS: the zero embedding row is the <pad>
    random_seed(args.seed, dist_info.rank)
    try:
        model = create_model(args.model, **model_kwargs)
    except (TypeError, ValueError, KeyError) as e:
        raise UsageError(f'cannot build {args.model} with --model-kwargs {args.model_kwargs}: {e}') from e
    config = model.config
    max_len = config.max_position_embeddings
    args.block_size = max_len if args.block_size is None else args.block_size
    if args.block_size > max_len:
        raise UsageError(f'--block-size {args.block_size} is larger than the model\'s maximum length {max_len}; use '
                         f'--block-size <= {max_len} or --model-kwargs max_position_embeddings={args.block_size}')
    data = _lm_data(args, tokenizer, train_ids, val_ids)
    num_params = sum(p.numel() for p in model.parameters())
    model.to(device)

    # ---------------------------------------------------------------- optimizer, schedule, AMP, resume
    optimizer = _create_optimizer(model, entry.family, args)
    amp_autocast, loss_scaler, amp_dtype = setup_amp(args.amp, args.amp_dtype, device)
    params = [p for p in model.parameters() if p.requires_grad]
    update_step = UpdateStep(optimizer, lambda: params, loss_scaler, args.clip_grad)
    schedule = lm_schedule(args.lr, args.steps, args.warmup_steps, args.sched, args.min_lr_ratio)
    scheduler, _ = create_lr_scheduler(optimizer, schedule)
    train_tokens_before, train_seconds_before = resumed.get('train_tokens', 0), resumed.get('train_seconds', 0.)
    start_step, _ = run.restore(model, optimizer, scheduler, schedule, loss_scaler)
    run.check_not_finished(start_step, args.steps, '--steps')
    train_model = wrap_ddp(model, dist_info) if dist_info.distributed else model
    data_gen = torch.Generator().manual_seed(args.seed + 10_000 * dist_info.rank)
    evaluate = partial(evaluate_lm, task=args.task, device=device, amp_autocast=amp_autocast, dist_info=dist_info,
                       mask_id=data.mask_id)

    # ---------------------------------------------------------------- outputs
    output_dir = run.open_outputs('./output/text', f'{datetime.now():%Y%m%d-%H%M%S}-{args.model}-{args.task}')
    tokens_per_step = args.batch_size * args.block_size * args.grad_accum_steps * world
    run.log_settings_changes()
    _logger.info(f'Model {args.model} ({params_note(model)}, {model_kwargs}) on {device}'
                 f'{f" x {world} processes ({dist.get_backend()})" if dist_info.distributed else ""}, '
                 f'AMP {amp_dtype if args.amp else "off"}, {torch.get_num_threads()} threads')
    _logger.info(f'Data: {len(train_ids):,} training tokens ({args.train_file}), {len(val_ids):,} validation tokens '
                 f'({args.val_file or f"last {args.val_fraction:.0%} of the training file"}); {tokenizer!r}')
    _logger.info(f'Task {args.task}: {args.steps} updates x {tokens_per_step:,} tokens (batch {args.batch_size} x '
                 f'block {args.block_size} x accum {args.grad_accum_steps} x {world} processes); AdamW lr '
                 f'{args.lr:g} betas {tuple(args.opt_betas)} eps {args.opt_eps:g} wd {args.weight_decay:g}, '
                 f'{args.warmup_steps} warmup then {args.sched} ({recipe_info["source"]})'
                 + (f'; resuming at step {start_step} from {args.resume}' if args.resume else ''))
    if primary:
        _logger.info(f'Outputs: {output_dir}')

    # ---------------------------------------------------------------- train
    state = StepState(step=start_step, start_step=start_step)

    def tokens_done():
        return tokens_per_step * (state.step - start_step)

    def restore_rank(rank_state):
        data_gen.set_state(rank_state['data'])

    def save_extra(metrics):
        return dict(task=args.task, model_cfg={'name': args.model, 'kwargs': model_kwargs},
                    model_config=config.to_dict(), tokenizer=tokenizer.to_dict(), block_size=args.block_size,
                    train_tokens=train_tokens_before + tokens_done(),
                    train_seconds=train_seconds_before + state.train_seconds, val_metrics=metrics)

    def eval_row(metrics):
        row = {'val_ppl': metrics['ppl']}
        if args.task == 'mlm':
            row.update(val_masked_acc=metrics['masked_acc'], val_mask_token_acc=metrics['mask_token_acc'])
        row.update(tokens_per_sec=(train_tokens_before + tokens_done()) /
                   max(train_seconds_before + state.train_seconds, 1e-9))
        return row

    def eval_text(metrics):
        msg = f'val loss {metrics["loss"]:.4f} ppl {metrics["ppl"]:.3f}'
        if args.task == 'mlm':
            msg += f' masked acc {metrics["masked_acc"]:.2f}%'
        return msg

    # training decodes only the scored positions when the masked LM's config asks for it (evaluation decodes all)
    sparse_prediction = args.task == 'mlm' and getattr(model.config, 'sparse_prediction', False)
    finished = run_steps(
        args, run, state, model=model, train_model=train_model, optimizer=optimizer, scheduler=scheduler,
        schedule=schedule, loss_scaler=loss_scaler, update_step=update_step,
        micro_loss=lambda: lm_loss(*forward_logits(train_model, data.next_batch(data_gen), device, amp_autocast,
                                                   sparse_prediction)),
        evaluate=lambda: evaluate(model, data.periodic_batches), best_key='loss',
        rank_extra=lambda: {'data': data_gen.get_state()}, restore_rank=restore_rank, save_extra=save_extra,
        progress_text=lambda: f'{tokens_done() / max(state.train_seconds, 1e-9):,.0f} tok/s',
        eval_row=eval_row, eval_text=eval_text, show_percent=True)
    if not finished:
        return state.stop_result
    val_metrics, train_seconds, train_tokens = state.val_metrics, state.train_seconds, tokens_done()
    run.begin_final_stage()

    # ---------------------------------------------------------------- final evaluation and outputs
    final_metrics = evaluate(model, data.final_batches)
    digests = run.weights_digests(model)
    baseline = None
    if args.task == 'mlm':
        baseline = unigram_mlm_baseline(train_ids, data.final_batches, data.base_ids, data.mask_id)
    samples = None
    if primary and args.sample_prompt is not None:
        samples = _write_samples(model, tokenizer, args, device, output_dir / 'samples.txt')
    if not primary:
        return None

    with atomic_folder(output_dir / 'pretrained') as folder:
        model.save_pretrained(str(folder), tokenizer=tokenizer)
    total_tokens = train_tokens_before + train_tokens
    total_seconds = train_seconds_before + train_seconds
    results = {
        'model': args.model,
        'task': args.task,
        'model_kwargs': model_kwargs,
        'params': num_params,
        'tokenizer': {'type': tokenizer.to_dict()['tokenizer_type'], 'vocab_size': tokenizer.vocab_size},
        'data': {'train_file': args.train_file, 'val_file': args.val_file or None,
                 'val_fraction': None if args.val_file else args.val_fraction,
                 'train_tokens': len(train_ids), 'val_tokens': len(val_ids)},
        'block_size': args.block_size,
        'steps': args.steps,
        'tokens_per_step': tokens_per_step,
        'optimizer': {'name': 'adamw', 'lr': args.lr, 'betas': list(args.opt_betas), 'eps': args.opt_eps,
                      'weight_decay': args.weight_decay, 'sched': args.sched, 'warmup_steps': args.warmup_steps,
                      'min_lr_ratio': args.min_lr_ratio, 'clip_grad': args.clip_grad, **recipe_info},
        'val_periodic': val_metrics,
        'val_final': final_metrics,
        'val_final_batches': len(data.final_batches),
        'unigram_baseline': baseline,
        'best': run.saver.best,
        'train_tokens': total_tokens,
        'train_seconds': total_seconds,
        'tokens_per_sec': total_tokens / max(total_seconds, 1e-9),
        'wall_seconds_this_process': time.time() - run.start_time,
        'device': str(device),
        'world_size': world,
        'threads': torch.get_num_threads(),
        'amp': str(amp_dtype) if args.amp else None,
        'seed': args.seed,
        'torch': torch.__version__,
        'samples_file': str(output_dir / 'samples.txt') if samples is not None else None,
        'weights_sha256_per_rank': digests,
        'checkpoints': {'last': str(run.saver.last_path),
                        'best': str(run.saver.best_path) if run.saver.best_path.exists() else None},
        'experiment_dir': str(output_dir),
        'command': 'python -m mlp_vision.text.train ' + ' '.join(_quote(a) for a in argv),
    }
    run.write_results(results)
    metric_col, metric_label = (('val_masked_acc', 'masked-token accuracy (%)') if args.task == 'mlm'
                                else ('val_ppl', 'validation perplexity'))
    plot_curves(output_dir / 'summary.csv', output_dir / 'curves.png', title=f'{args.model} ({args.task} LM)',
                x='step', loss_columns=('train_loss', 'val_loss'), metric_columns=(metric_col,),
                metric_label=metric_label)
    msg = f'Done: final val loss {final_metrics["loss"]:.4f} ppl {final_metrics["ppl"]:.3f}'
    if args.task == 'mlm':
        msg += (f' masked acc {final_metrics["masked_acc"]:.2f}% (unigram baseline: loss {baseline["loss"]:.4f} '
                f'ppl {baseline["ppl"]:.3f} acc {baseline["masked_acc"]:.2f}%)')
    msg += (f' on {final_metrics["tokens"]:,} tokens; {results["tokens_per_sec"]:,.0f} tok/s; '
            f'{format_duration(time.time() - run.start_time)}')
    _logger.info(msg)
    run.list_outputs()
    return results


def _quote(arg: str) -> str:
    return arg if arg and all(c.isalnum() or c in '-_=./:,+' for c in arg) else json.dumps(arg)


def _write_samples(model: nn.Module, tokenizer: Tokenizer, args, device: torch.device, path: Path) -> List[str]:
    """Sample ``--num-samples`` continuations of ``--sample-prompt`` (seeded) and write them to ``path``."""
    model = unwrap_model(model)
    prompt = encode_text(tokenizer, args.sample_prompt, '--sample-prompt')
    generator = torch.Generator(device=device).manual_seed(args.seed)
    texts = []
    with preserve_rng():
        for _ in range(args.num_samples):
            out = model.generate(prompt[None].to(device), args.sample_tokens, temperature=args.sample_temperature,
                                 top_k=args.sample_top_k, generator=generator)
            texts.append(tokenizer.decode(out[0].tolist()))
    header = (f'# {args.model}, {args.steps} steps, seed {args.seed}, temperature {args.sample_temperature}, '
              f'top_k {args.sample_top_k}, {args.sample_tokens} new tokens, prompt {args.sample_prompt!r}\n')
    body = ''.join(f'\n----- sample {i + 1} -----\n{t}\n' for i, t in enumerate(texts))
    path.write_text(header + body, encoding='utf-8')
    _logger.info(f'samples written to {path}:\n{texts[0][:300]}')
    return texts


if __name__ == '__main__':
    main()
