""" Causal or BERT-style masked language modelling with the text models of :mod:`mlp_vision.text` (``--task causal``
/ ``mlm`` of ``python -m mlp_vision.train_text``); the run (outputs, resume, AMP, schedule, stops) is
:mod:`mlp_vision.training.run`'s, shared with ``train.py``, the data :mod:`.text_data`::

    # char-level causal LM on Tiny Shakespeare (first 90 % train, last 10 % validation)
    python -m mlp_vision.train_text --task causal --model gpt_mlp_attention \\
        --train-file ../shared/data/tinyshakespeare/input.txt --steps 2000 -b 32 --sample-prompt "ROMEO:"

    # masked LM (15 % masking, 80/10/10) with a separate held-out file, on two processes (gloo / NCCL)
    torchrun --nproc_per_node=2 -m mlp_vision.train_text --task mlm --model gmlp_base --model-kwargs \\
        num_hidden_layers=6 hidden_size=256 --train-file wikitext-2/valid.txt --val-file wikitext-2/test.txt

    # continue a run in its folder with its saved settings (bit-exact on CPU, 1 process); flags given override them
    python -m mlp_vision.train_text --resume output/text/EXP/last.pth [--steps 4000]

Validation: a fixed subset of ``--eval-batches`` batches periodically, all (or ``--final-eval-batches``) at the
end. Training batches come from a generator seeded by ``--seed`` and the rank, so two models trained with one seed
see the same data in the same order. Optimizer and schedule: :mod:`.text_task`.

Outputs (``--output/--experiment``): ``args.yaml``, ``train.log``, ``summary.csv`` (step, lr, train loss, val
loss, val perplexity, [masked accuracy], tokens/s), ``last.pth`` / ``model_best.pth`` (lowest periodic val loss),
``results.json``, ``curves.png``, ``pretrained/`` (``save_pretrained`` with the tokenizer), ``samples.txt``
(causal, with ``--sample-prompt``).
"""
import dataclasses
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
from timm.utils import unwrap_model

from mlp_vision.errors import UsageError
from mlp_vision.text.modeling_utils import masked_lm_loss as lm_loss  # token cross-entropy (causal: labels shifted)
from mlp_vision.text.tokenizer import (
    SUBWORD_KINDS, Tokenizer, describe_tokenizer, tokenizer_from_dict, tokenizer_to_dict)
from mlp_vision.training.run.checkpoint import atomic_write_text, preserve_rng
from mlp_vision.training.run.distributed import DistInfo, all_gather_objects
from mlp_vision.training.run.driver import Optimization
from mlp_vision.training.run.loop import warn_global_batch_beyond_data
from mlp_vision.training.run.training_run import TrainingRun
from mlp_vision.training.tasks.text_args import task_model_entry
from mlp_vision.training.tasks.text_data import (
    Batch, MLMMasker, build_tokenizer, causal_eval_batches, check_unknown_tokens, encode_text, mlm_eval_batches,
    model_for_tokenizer, read_text_file, sample_causal_batch, sample_mlm_batch, subset_batches, tokenizer_from_path,
    unigram_mlm_baseline)
from mlp_vision.training.tasks.text_task import TextTask, fit_block_size

__all__ = ['forward_logits', 'evaluate_lm', 'LMData', 'LMTask']

_logger = logging.getLogger('mlp_vision.train_text')


def forward_logits(model: nn.Module, batch: Batch, device: torch.device, amp_autocast=nullcontext,
                   sparse_prediction: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """(logits (B, L, V), labels (B, L)) of a batch on ``device``. ``sparse_prediction`` (a masked LM's config
    option): the model decodes only the scored positions, giving (logits (N, V), labels (N,)) -- the same loss.
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
    """Mean token cross-entropy (``loss``), ``ppl`` = exp(loss); MLM: accuracy (%) over all scored positions
    (``masked_acc``) and over the ``<mask>`` inputs (``mask_token_acc``); causal: bits per token (``bpc``). Batches
    are split over the ranks and the sums reduced: the numbers equal a one-process run."""
    model.eval()
    rank, world = (dist_info.rank, dist_info.world_size) if dist_info is not None and dist_info.distributed else (0, 1)
    # loss sum, scored tokens, correct, <mask> inputs, correct there: on the device (no host sync per batch)
    sums = torch.zeros(5, dtype=torch.float64, device=device)
    start = time.perf_counter()
    for batch in batches[rank::world]:
        logits, y = forward_logits(model, batch, device, amp_autocast)
        logits = logits.float()
        scored = y != -100
        loss_sum = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100, reduction='sum')
        correct = (logits.argmax(-1) == y) & scored
        at_mask = (scored & (batch[0].to(device, non_blocking=True) == mask_id) if mask_id is not None
                   else torch.zeros_like(scored))
        sums += torch.stack([loss_sum, scored.sum(), correct.sum(), at_mask.sum(), (correct & at_mask).sum()]).double()
    if world > 1:
        dist.all_reduce(sums)
    loss_sum, n, correct, n_mask, correct_mask = sums.tolist()  # the evaluation's one host sync
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


@dataclasses.dataclass
class LMData:
    """A run's training-batch sampler and validation batches (periodic subset, final set)."""
    train_ids: torch.Tensor
    val_ids: torch.Tensor
    next_batch: Callable[[torch.Generator], Batch]
    periodic_batches: List[Batch]
    final_batches: List[Batch]
    mask_id: Optional[int]
    base_ids: torch.Tensor  # the non-special token ids


def _lm_data(args, tokenizer: Tokenizer, train_ids: torch.Tensor, val_ids: torch.Tensor) -> LMData:
    """The training sampler and validation batches of --task causal / mlm (see :mod:`.text_data`)."""
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
        mask_id, base_ids = tokenizer.mask_token_id, masker.base_ids
    else:
        val_batches = causal_eval_batches(val_ids, args.block_size, eval_bs)
        next_batch = partial(sample_causal_batch, train_ids, args.batch_size, args.block_size)
        mask_id, base_ids = None, torch.arange(len(tokenizer))
    return LMData(train_ids, val_ids, next_batch, subset_batches(val_batches, args.eval_batches, args.seed),
                  subset_batches(val_batches, args.final_eval_batches, args.seed), mask_id, base_ids)


def _tokenizer(args, run: TrainingRun, train_text: str, val_text: str) -> Tokenizer:
    """The resumed run's tokenizer, ``--tokenizer-from``'s, or one built on the training text (rank 0's)."""
    resumed = run.resume_ckpt or {}
    if resumed:
        return tokenizer_from_dict(resumed['tokenizer'], args.allow_regex)
    if args.tokenizer_from:
        return tokenizer_from_path(args.tokenizer_from, needs=('pad', 'cls', 'sep', 'mask') if args.task == 'mlm'
                                   else (), allow_regex=args.allow_regex)
    tokenizer = build_tokenizer(args.tokenizer, args.task, train_text, val_text, args.vocab_size)
    if run.dist_info.world_size > 1 and args.tokenizer in SUBWORD_KINDS:
        # WordPiece training is not reproducible run to run (hash-ordered ties): every rank takes rank 0's
        tokenizer = tokenizer_from_dict(all_gather_objects(tokenizer_to_dict(tokenizer), run.dist_info)[0])
    return tokenizer


class LMTask(TextTask):
    """Causal / masked LM for :func:`~mlp_vision.training.run.driver.drive`: random blocks of the training tokens,
    token cross-entropy, perplexity on the validation batches."""
    best_key = 'loss'
    show_percent = True

    def __init__(self, args, run: TrainingRun, command: str):
        super().__init__(args, run, command)
        self.entry = task_model_entry(args.model, args.task)
        self.family, self.registry_task = self.entry.family, self.entry.task

    def resume_identity(self) -> dict:
        return {'arch': self.args.model, 'task': self.args.task}

    def build(self) -> nn.Module:
        args, run = self.args, self.run
        train_text = read_text_file(args.train_file, 'training text file')
        if args.val_file:
            val_text = read_text_file(args.val_file, 'validation text file')
        else:  # the last --val-fraction of the training text
            cut = int(len(train_text) * (1. - args.val_fraction))
            train_text, val_text = train_text[:cut], train_text[cut:]
        self.tokenizer = tokenizer = _tokenizer(args, run, train_text, val_text)
        train_ids = encode_text(tokenizer, train_text, 'training text', stop=run.stop_signal)
        val_ids = encode_text(tokenizer, val_text, 'validation text', stop=run.stop_signal)
        check_unknown_tokens(train_ids, tokenizer, 'training text')
        check_unknown_tokens(val_ids, tokenizer, 'validation text')
        if args.sample_prompt is not None:
            encode_text(tokenizer, args.sample_prompt, '--sample-prompt')  # fail now, not after training
        model, model_kwargs = model_for_tokenizer(args.model, dict(args.model_kwargs), tokenizer,
                                                  self.entry.config_class, args.model_kwargs)
        self.model_cfg = {'name': args.model, 'kwargs': model_kwargs}
        fit_block_size(args, model, resizable=True)
        warn_global_batch_beyond_data(args.batch_size, run.dist_info.world_size, args.grad_accum_steps,
                                      max(len(train_ids) // args.block_size, 1), f'blocks of {args.block_size} tokens')
        self.data = _lm_data(args, tokenizer, train_ids, val_ids)
        return model

    def ready(self, opt: Optimization) -> None:
        super().ready(opt)
        args, run, data = self.args, self.run, self.data
        self.generator = torch.Generator().manual_seed(args.seed + 10_000 * run.dist_info.rank)
        self.tokens_per_step = args.batch_size * args.block_size * args.grad_accum_steps * run.dist_info.world_size
        self.tokens_before = (run.resume_ckpt or {}).get('train_tokens', 0)
        # training decodes only the scored positions when the masked LM's config asks for it (evaluation: all)
        self.sparse_prediction = args.task == 'mlm' and getattr(opt.model.config, 'sparse_prediction', False)
        self.evaluate_on = partial(evaluate_lm, task=args.task, device=run.dist_info.device,
                                   amp_autocast=opt.amp_autocast, dist_info=run.dist_info, mask_id=data.mask_id)

    def output_folder(self) -> Tuple[str, str]:
        return './output/text', f'{datetime.now():%Y%m%d-%H%M%S}-{self.args.model}-{self.args.task}'

    @property
    def train_tokens(self) -> int:  # the run's training tokens over its resumes
        return self.tokens_before + self.tokens_per_step * (self.state.step - self.state.start_step)

    def micro_loss(self) -> torch.Tensor:
        batch = self.data.next_batch(self.generator)
        return lm_loss(*forward_logits(self.opt.train_model, batch, self.run.dist_info.device, self.opt.amp_autocast,
                                       self.sparse_prediction))

    def evaluate(self) -> Dict[str, float]:
        return self.evaluate_on(self.opt.model, self.data.periodic_batches)

    def data_state(self) -> dict:
        return {'data': self.generator.get_state()}

    def load_data_state(self, state: dict) -> None:
        self.generator.set_state(state['data'])

    def checkpoint_fields(self, metrics) -> dict:
        return {**super().checkpoint_fields(metrics), 'train_tokens': self.train_tokens}

    def progress(self) -> str:
        tokens = self.train_tokens - self.tokens_before
        return f'{tokens / max(self.state.train_seconds, 1e-9):,.0f} tok/s'

    def eval_report(self, metrics) -> Tuple[dict, str]:
        row, text = {'val_ppl': metrics['ppl']}, f'val loss {metrics["loss"]:.4f} ppl {metrics["ppl"]:.3f}'
        if self.args.task == 'mlm':
            row.update(val_masked_acc=metrics['masked_acc'], val_mask_token_acc=metrics['mask_token_acc'])
            text += f' masked acc {metrics["masked_acc"]:.2f}%'
        row.update(tokens_per_sec=self.train_tokens / max(self.train_seconds, 1e-9))
        return row, text

    def log_setup(self) -> None:
        args, opt, data, world = self.args, self.opt, self.data, self.run.dist_info.world_size
        self.log_model(args.model, str(self.model_cfg['kwargs']))
        recipe_source = self.recipe_info['source']
        _logger.info(f'Data: {len(data.train_ids):,} training tokens ({args.train_file}), {len(data.val_ids):,} '
                     f'validation tokens ({args.val_file or f"last {args.val_fraction:.0%} of the training file"}); '
                     f'{describe_tokenizer(self.tokenizer)}')
        _logger.info(f'Task {args.task}: {args.steps} updates x {self.tokens_per_step:,} tokens (batch '
                     f'{args.batch_size} x block {args.block_size} x accum {args.grad_accum_steps} x {world} '
                     f'processes); AdamW lr {args.lr:g} betas {tuple(args.opt_betas)} eps {args.opt_eps:g} wd '
                     f'{args.weight_decay:g}, {args.warmup_steps} warmup then {args.sched} ({recipe_source})'
                     + (f'; resuming at step {opt.start} from {args.resume}' if args.resume else ''))

    def final_results(self, digests) -> Optional[dict]:
        """The final evaluation, samples, ``pretrained/`` and the results (rank 0)."""
        args, run, data = self.args, self.run, self.data
        final_metrics = self.evaluate_on(self.opt.model, data.final_batches)
        baseline = None
        if args.task == 'mlm':
            baseline = unigram_mlm_baseline(data.train_ids, data.final_batches, data.base_ids, data.mask_id)
        if not run.dist_info.primary:
            return None
        samples_file = None
        if args.sample_prompt is not None:
            samples_file = run.output_dir / 'samples.txt'
            _write_samples(self.opt.model, self.tokenizer, args, run.dist_info.device, samples_file)
        return {
            'model': args.model, 'task': args.task, 'model_kwargs': self.model_cfg['kwargs'],
            'data': {'train_file': args.train_file, 'val_file': args.val_file or None,
                     'val_fraction': None if args.val_file else args.val_fraction,
                     'train_tokens': len(data.train_ids), 'val_tokens': len(data.val_ids)},
            'block_size': args.block_size, 'steps': args.steps, 'tokens_per_step': self.tokens_per_step,
            'val_periodic': self.state.val_metrics, 'val_final': final_metrics,
            'val_final_batches': len(data.final_batches), 'unigram_baseline': baseline, 'best': run.saver.best,
            'train_tokens': self.train_tokens, 'tokens_per_sec': self.train_tokens / max(self.train_seconds, 1e-9),
            'amp': str(self.opt.amp_dtype) if args.amp else None,
            'samples_file': None if samples_file is None else str(samples_file), **self.export(digests),
        }

    def report(self, results: dict) -> None:
        """The curves and the closing log line."""
        args, final_metrics, baseline = self.args, results['val_final'], results['unigram_baseline']
        msg = f'final val loss {final_metrics["loss"]:.4f} ppl {final_metrics["ppl"]:.3f}'
        if args.task == 'mlm':
            msg += (f' masked acc {final_metrics["masked_acc"]:.2f}% (unigram baseline: loss {baseline["loss"]:.4f} '
                    f'ppl {baseline["ppl"]:.3f} acc {baseline["masked_acc"]:.2f}%)')
        metric = ('val_masked_acc', 'masked-token accuracy (%)') if args.task == 'mlm' else ('val_ppl',
                                                                                            'validation perplexity')
        self.plot_and_close(f'{args.model} ({args.task} LM)', *metric,
                            msg + f' on {final_metrics["tokens"]:,} tokens; {results["tokens_per_sec"]:,.0f} tok/s')


def _write_samples(model: nn.Module, tokenizer: Tokenizer, args, device: torch.device, path: Path) -> None:
    """``--num-samples`` seeded continuations of ``--sample-prompt``, written to ``path``."""
    model = unwrap_model(model)
    prompt = encode_text(tokenizer, args.sample_prompt, '--sample-prompt')
    texts = []
    with preserve_rng():
        torch.manual_seed(args.seed)  # transformers' sampling draws from the global generators, restored after
        sample = args.sample_temperature > 0  # a temperature <= 0 is greedy decoding
        for _ in range(args.num_samples):
            out = model.generate(prompt[None].to(device), max_new_tokens=args.sample_tokens, do_sample=sample,
                                 temperature=args.sample_temperature if sample else None,
                                 top_k=args.sample_top_k or 0)  # 0: no top-k filter (transformers' default is 50)
            texts.append(tokenizer.decode(out[0].tolist(), skip_special_tokens=True))
    header = (f'# {args.model}, {args.steps} steps, seed {args.seed}, temperature {args.sample_temperature}, '
              f'top_k {args.sample_top_k}, {args.sample_tokens} new tokens, prompt {args.sample_prompt!r}\n')
    body = ''.join(f'\n----- sample {i + 1} -----\n{t}\n' for i, t in enumerate(texts))
    atomic_write_text(path, header + body)  # never through a link planted in the run folder
    _logger.info(f'samples written to {path}:\n{texts[0][:300]}')
