""" Train the text models of :mod:`mlp_vision.text`: char/byte-level causal LM or BERT-style masked LM.

One step-based training loop for every registered text model; the bookkeeping pieces are the vision trainer's
(:mod:`mlp_vision.training`: atomic checkpoints and best tracking, RNG capture, torchrun/DDP setup, yaml
configs, ``summary.csv`` / curves / ``results.json``)::

    # char-level causal LM on Tiny Shakespeare (first 90 % train, last 10 % validation)
    python -m mlp_vision.text.train --task causal --model gpt_mlp_attention \\
        --train-file ../shared/data/tinyshakespeare/input.txt --steps 2000 -b 32 --sample-prompt "ROMEO:"

    # masked LM (15 % masking, 80/10/10) with a separate held-out file
    python -m mlp_vision.text.train --task mlm --model gmlp_base --model-kwargs depth=6 dim=256 ffn_dim=1536 \\
        --train-file wikitext-2/valid.txt --val-file wikitext-2/test.txt --block-size 128 --steps 3000

    # two processes (gloo on CPU, NCCL on GPUs)
    torchrun --nproc_per_node=2 -m mlp_vision.text.train --task causal --model gpt_sdpa --train-file input.txt

    # continue a run in its folder: model, optimizer, scheduler, scaler, step, RNG (bit-exact on CPU, 1 process)
    python -m mlp_vision.text.train <same flags> --resume output/text/EXP/last.pth

Data:
    * causal: every training sample is a contiguous block of ``--block-size`` tokens at a random offset of the
      training tokens; the target is the block shifted by one.
    * mlm: every training sample is ``<cls>`` + a contiguous window of ``block_size - 2`` tokens at a random
      offset + ``<sep>`` (padded with ``<pad>`` only where the text is shorter than a window). 15 % of the
      non-special positions of each segment (exactly ``round(0.15 n)``, at least one) are selected; of those 80 %
      become ``<mask>``, 10 % a random non-special token and 10 % stay; the loss is on the selected positions only.
    * validation: the held-out tokens cut into consecutive non-overlapping blocks / segments (MLM masks drawn
      once from ``--seed``, so every evaluation and every model sees the same masked positions). The periodic
      evaluation uses a fixed subset of ``--eval-batches`` batches; the final one uses all of them.
    * the training batches come from a generator of their own (seeded by ``--seed`` and the rank), so two models
      trained with the same seed see the same data in the same order; dropout uses the global RNG.

Tokenizer (``--tokenizer``): ``char`` -- the training text's distinct characters (plus ``<unk>`` when the
held-out text has characters outside them), so Tiny Shakespeare gives the 65-character vocabulary of the papers;
``byte`` -- UTF-8 bytes (256). MLM adds ``<pad> <cls> <sep> <mask>``. The tokenizer is stored in every
checkpoint and in ``pretrained/tokenizer.json``; the model's ``vocab_size`` is set from it. A subword tokenizer
is not provided: every model here is trained from scratch on ~1 MB corpora on a CPU, where a learned subword
vocabulary would mostly add embedding parameters and a training step for the tokenizer.

Optimizer: AdamW (timm's ``create_optimizer_v2``: no weight decay on biases / norms / 1-D parameters; BiGS: the
official decay mask of :func:`~mlp_vision.text.bigs.bigs_param_groups`) with the
betas / eps / weight decay / LR / schedule of the model family (:data:`RECIPES`; SPEC §3 for the masked LMs, the
MLP-Attention reference for the GPTs); every value can be overridden. Schedule: linear warmup over
``--warmup-steps`` updates, then ``--sched`` ``cosine`` | ``linear`` (to ``--min-lr-ratio`` x LR) | ``constant``.

Outputs (``--output/--experiment``): ``args.yaml``, ``train.log``, ``summary.csv`` (step, lr, train loss, val
loss, val perplexity, [masked accuracy], tokens/s), ``last.pth`` / ``model_best.pth`` (lowest periodic val loss),
``results.json``, ``curves.png``, ``pretrained/`` (``save_pretrained`` + tokenizer), ``samples.txt`` (causal,
with ``--sample-prompt``). Checkpoints are written atomically at every evaluation; a NaN / inf training loss
stops the run before it reaches the weights, with the last good checkpoint intact.
"""
import argparse
import dataclasses
import json
import logging
import math
import sys
import time
from contextlib import nullcontext
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
import torch.nn as nn
from timm.optim import create_optimizer_v2
from timm.utils import ParseKwargs, get_outdir, random_seed, unwrap_model

from ..training import UsageError
from ..training.checkpoint import (
    CHECKPOINT_VERSION, CheckpointManager, get_rng_state, load_checkpoint_file, load_model_weights, preserve_rng,
    set_rng_state)
from ..training.config import args_to_yaml, parse_args_with_config
from ..training.distributed import DistInfo, all_gather_objects, init_device, state_dict_digest, wrap_ddp
from ..training.engine import NonFiniteLossError, all_ranks_finite, format_duration, non_finite_exit
from ..training.log import add_log_file, remove_log_file, setup_logging
from ..training.summary import SummaryWriter, plot_curves, write_json
from .modeling_utils import masked_lm_loss as lm_loss  # labels here are already the next tokens
from .registry import create_model, is_model, list_models, model_config
from .registry import model_class as registry_model_class
from .tokenizer import DEFAULT_SPECIAL_TOKENS, ByteTokenizer, CharTokenizer

__all__ = [
    'TASKS', 'RECIPES', 'build_tokenizer', 'tokenizer_to_dict', 'tokenizer_from_dict', 'read_text_file',
    'sample_causal_batch', 'causal_eval_batches', 'MLMMasker', 'mlm_segments', 'sample_mlm_batch',
    'mlm_eval_batches', 'lr_multiplier', 'evaluate_lm', 'unigram_mlm_baseline', 'main',
]

_logger = logging.getLogger('mlp_vision.text.train')

Tokenizer = Union[CharTokenizer, ByteTokenizer]
Batch = Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]  # input ids, attention mask or None, labels

# --task -> the registry's task name a model must have
TASKS = {'causal': 'causal_lm', 'mlm': 'masked_lm'}

# optimizer / schedule defaults per (model family, registry task); flags override every field. warmup_steps is
# the recipe's; a run uses min(recipe warmup, 10 % of --steps) unless --warmup-steps is given.
RECIPES: Dict[Tuple[str, str], dict] = {
    ('gmlp', 'masked_lm'): dict(
        lr=7e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, sched='linear', warmup_steps=10000,
        source='SPEC §3 gMLP/aMLP MLM (ablation scale: lr 7e-4, 10k warmup, linear decay)'),
    ('bigs', 'masked_lm'): dict(
        lr=6e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.05, sched='cosine', warmup_steps=2000,
        source='SPEC §3 BiGS MLM (lr 6e-4, 2000 warmup, cosine)'),
    ('gpt', 'causal_lm'): dict(
        lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, sched='constant', warmup_steps=0,
        source='MLP-Attention paper / reference code: AdamW lr 3e-4 (torch defaults otherwise), constant LR'),
    ('gmlp', 'causal_lm'): dict(
        lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, sched='cosine', warmup_steps=1000,
        source='no recipe in the papers: our default (AdamW 3e-4, warmup, cosine)'),
}
_DEFAULT_RECIPE = {
    'masked_lm': ('gmlp', 'masked_lm'),
    'causal_lm': ('gpt', 'causal_lm'),
}
# config fields that hold the longest input a model accepts, by family naming
_LENGTH_FIELDS = ('block_size', 'max_seq_len', 'max_position_embeddings', 'max_len')
MLM_SPECIALS = tuple(DEFAULT_SPECIAL_TOKENS)  # <pad> <cls> <sep> <mask>
UNK = '<unk>'


# ------------------------------------------------------------------------------------------------ tokenizers
def build_tokenizer(kind: str, task: str, train_text: str, val_text: str = '') -> Tokenizer:
    """The tokenizer of a run: ``char`` (alphabet of ``train_text``; ``<unk>`` added only when ``val_text`` has
    other characters) or ``byte``; MLM gets ``<pad> <cls> <sep> <mask>`` after the base vocabulary."""
    specials = MLM_SPECIALS if task == 'mlm' else ()
    if kind == 'byte':
        return ByteTokenizer(specials)
    if kind != 'char':
        raise UsageError(f"--tokenizer must be 'char' or 'byte', got {kind!r}")
    alphabet = set(train_text)
    unseen = set(val_text) - alphabet
    if unseen:
        count = sum(c in unseen for c in val_text)
        _logger.info(f'char tokenizer: {len(unseen)} characters of the validation text ({count} occurrences) '
                     f'are not in the training text; they map to {UNK}')
    return CharTokenizer(alphabet, specials, unk=UNK if unseen else None)


def tokenizer_to_dict(tok: Tokenizer) -> dict:
    """Plain-value description of a tokenizer (stored in checkpoints and ``tokenizer.json``)."""
    if isinstance(tok, ByteTokenizer):
        return {'type': 'byte', 'special_tokens': list(tok.special_tokens)}
    return {'type': 'char', 'chars': ''.join(tok.chars), 'special_tokens': list(tok.special_tokens), 'unk': tok.unk}


def tokenizer_from_dict(d: dict) -> Tokenizer:
    if d['type'] == 'byte':
        return ByteTokenizer(d['special_tokens'])
    if d['type'] == 'char':
        return CharTokenizer(d['chars'], d['special_tokens'], d.get('unk'))
    raise UsageError(f'unknown tokenizer type {d["type"]!r} in the checkpoint')


def _encode(tok: Tokenizer, text: str, what: str) -> torch.Tensor:
    try:
        ids = tok.encode(text)
    except KeyError as e:
        raise UsageError(f'the {what} has character {e.args[0]!r}, which the tokenizer (from the checkpoint or the '
                         f'training text) does not know') from None
    return torch.tensor(ids, dtype=torch.long)


# ------------------------------------------------------------------------------------------------ data
def read_text_file(path: str, what: str) -> str:
    """The UTF-8 text of ``path``, with a clear error when it is missing, not a file, empty or not UTF-8."""
    if not path:
        raise UsageError(f'no {what} given (--train-file PATH)')
    p = Path(path)
    if not p.exists():
        raise UsageError(f'{what} {path!r} does not exist')
    if not p.is_file():
        raise UsageError(f'{what} {path!r} is not a file')
    try:
        text = p.read_text(encoding='utf-8')
    except UnicodeDecodeError as e:
        raise UsageError(f'{what} {path!r} is not UTF-8 text: {e}') from None
    if not text.strip():
        raise UsageError(f'{what} {path!r} is empty')
    return text


def sample_causal_batch(ids: torch.Tensor, batch_size: int, block_size: int,
                        generator: torch.Generator) -> Batch:
    """``batch_size`` random contiguous blocks: inputs ``ids[i:i+T]``, targets ``ids[i+1:i+T+1]``."""
    starts = torch.randint(len(ids) - block_size, (batch_size,), generator=generator)
    offsets = torch.arange(block_size)
    x = ids[starts[:, None] + offsets]
    y = ids[starts[:, None] + offsets + 1]
    return x, None, y


def causal_eval_batches(ids: torch.Tensor, block_size: int, batch_size: int) -> List[Batch]:
    """All full non-overlapping blocks of the held-out tokens, in order, as batches."""
    n_blocks = (len(ids) - 1) // block_size
    starts = torch.arange(n_blocks) * block_size
    offsets = torch.arange(block_size)
    batches = []
    for chunk in starts.split(batch_size):
        batches.append((ids[chunk[:, None] + offsets], None, ids[chunk[:, None] + offsets + 1]))
    return batches


class MLMMasker:
    """BERT masking: of the non-special positions of each row, exactly ``max(1, round(rate * n))`` are selected;
    a selected position becomes ``<mask>`` with probability 0.8, a random non-special token with 0.1, and stays
    with 0.1. Labels are the original ids at the selected positions and ``ignore_index`` elsewhere.

    Args:
        tokenizer: gives ``mask_id``, the special ids and the base (non-special) vocabulary size.
        rate: fraction of the non-special positions selected (0.15).
        mask_prob, random_prob: replacement fractions of the selected positions (0.8, 0.1; the rest stay).
    """

    def __init__(self, tokenizer: Tokenizer, rate: float = 0.15, mask_prob: float = 0.8, random_prob: float = 0.1,
                 ignore_index: int = -100):
        if tokenizer.mask_id is None:
            raise ValueError('masked LM needs a tokenizer with a <mask> token')
        self.mask_id = tokenizer.mask_id
        self.special_ids = torch.tensor(tokenizer.special_ids, dtype=torch.long)
        self.num_base = tokenizer.vocab_size - len(tokenizer.special_ids)  # ids 0..num_base-1 are text
        self.rate, self.mask_prob, self.random_prob = rate, mask_prob, random_prob
        self.ignore_index = ignore_index

    def __call__(self, input_ids: torch.Tensor, generator: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor]:
        """(B, L) ids -> (masked input ids, labels)."""
        candidate = ~torch.isin(input_ids, self.special_ids)
        n_candidates = candidate.sum(dim=1)
        n_select = torch.clamp((n_candidates.double() * self.rate).round().long(), min=1)
        n_select = torch.minimum(n_select, n_candidates)
        scores = torch.rand(input_ids.shape, generator=generator)
        scores = scores.masked_fill(~candidate, 2.)  # specials sort last: never selected
        rank = scores.argsort(dim=1).argsort(dim=1)
        selected = rank < n_select[:, None]
        labels = input_ids.masked_fill(~selected, self.ignore_index)
        action = torch.rand(input_ids.shape, generator=generator)
        random_tokens = torch.randint(self.num_base, input_ids.shape, generator=generator)
        out = input_ids.clone()
        to_mask = selected & (action < self.mask_prob)
        to_random = selected & (action >= self.mask_prob) & (action < self.mask_prob + self.random_prob)
        out[to_mask] = self.mask_id
        out[to_random] = random_tokens[to_random]
        return out, labels


def mlm_segments(ids: torch.Tensor, starts: torch.Tensor, block_size: int,
                 tokenizer: Tokenizer) -> Tuple[torch.Tensor, torch.Tensor]:
    """``<cls>`` + ``ids[s : s + block_size - 2]`` + ``<sep>`` per start, right-padded with ``<pad>`` where the
    text ends early. Returns (input ids (B, block_size), attention mask (B, block_size) bool)."""
    body = block_size - 2
    out = torch.full((len(starts), block_size), tokenizer.pad_id, dtype=torch.long)
    mask = torch.zeros((len(starts), block_size), dtype=torch.bool)
    for row, s in enumerate(starts.tolist()):
        piece = ids[s:s + body]
        n = len(piece)
        out[row, 0] = tokenizer.cls_id
        out[row, 1:1 + n] = piece
        out[row, 1 + n] = tokenizer.sep_id
        mask[row, :n + 2] = True
    return out, mask


def sample_mlm_batch(ids: torch.Tensor, batch_size: int, block_size: int, tokenizer: Tokenizer,
                     masker: MLMMasker, generator: torch.Generator) -> Batch:
    """``batch_size`` segments at random offsets, masked. The attention mask is None when no row is padded."""
    body = block_size - 2
    starts = torch.randint(max(len(ids) - body, 0) + 1, (batch_size,), generator=generator)
    segments, attention = mlm_segments(ids, starts, block_size, tokenizer)
    inputs, labels = masker(segments, generator)
    return inputs, (None if bool(attention.all()) else attention), labels


def mlm_eval_batches(ids: torch.Tensor, block_size: int, batch_size: int, tokenizer: Tokenizer,
                     masker: MLMMasker, seed: int) -> List[Batch]:
    """The held-out tokens as consecutive segments (the last one padded), masked once with ``seed``."""
    body = block_size - 2
    starts = torch.arange(0, len(ids), body)
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for chunk in starts.split(batch_size):
        segments, attention = mlm_segments(ids, chunk, block_size, tokenizer)
        inputs, labels = masker(segments, generator)
        batches.append((inputs, None if bool(attention.all()) else attention, labels))
    return batches


def _subset(batches: List[Batch], n: int, seed: int) -> List[Batch]:
    """A fixed, evenly drawn subset of ``n`` batches (all when n <= 0 or n >= len)."""
    if n <= 0 or n >= len(batches):
        return batches
    order = torch.randperm(len(batches), generator=torch.Generator().manual_seed(seed))[:n].sort().values
    return [batches[i] for i in order.tolist()]


# ------------------------------------------------------------------------------------------------ schedule
def lr_multiplier(step: int, total_steps: int, warmup_steps: int, sched: str, min_ratio: float = 0.) -> float:
    """LR factor of optimizer update ``step`` (0-based): ``(step + 1) / warmup`` during warmup, then ``sched``
    from 1 towards ``min_ratio``, reached just after the last update (``constant`` stays at 1)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if sched == 'constant':
        return 1.
    progress = min(1., (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if sched == 'linear':
        return min_ratio + (1. - min_ratio) * (1. - progress)
    if sched == 'cosine':
        return min_ratio + (1. - min_ratio) * 0.5 * (1. + math.cos(math.pi * progress))
    raise UsageError(f"--sched must be 'cosine', 'linear' or 'constant', got {sched!r}")


# ------------------------------------------------------------------------------------------------ evaluation
def _forward(model: nn.Module, batch: Batch, device: torch.device, amp_autocast) -> Tuple[torch.Tensor, torch.Tensor]:
    """(logits, labels) of a batch on ``device``."""
    x, attention, y = batch
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    with amp_autocast():
        if attention is None:
            out = model(x)
        else:
            out = model(x, attention_mask=attention.to(device, non_blocking=True))
    logits = out.logits
    return logits, y


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
        logits, y = _forward(model, batch, device, amp_autocast)
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


def unigram_mlm_baseline(train_ids: torch.Tensor, batches: Sequence[Batch], num_base: int,
                         mask_id: Optional[int] = None) -> Dict[str, float]:
    """Masked-token accuracy (%) and perplexity of a model that ignores the input and predicts every masked
    token from the training text's token frequencies (add-one smoothed over the ``num_base`` text tokens);
    accuracy = always answering the most frequent training token. Same scored positions as :func:`evaluate_lm`."""
    counts = torch.bincount(train_ids, minlength=num_base)[:num_base].double() + 1.
    log_p = (counts / counts.sum()).log()
    top = int(counts.argmax())
    nll, n, correct, n_mask, correct_mask = 0., 0, 0, 0, 0
    for x, _, y in batches:
        scored = y != -100
        labels = y[scored]
        in_base = labels < num_base  # special / <unk> labels get the smallest text-token probability
        lp = torch.where(in_base, log_p[labels.clamp(max=num_base - 1)], log_p.min())
        nll -= lp.sum().item()
        n += len(labels)
        correct += (labels == top).sum().item()
        if mask_id is not None:
            at_mask = x[scored] == mask_id
            n_mask += int(at_mask.sum())
            correct_mask += int((labels[at_mask] == top).sum())
    loss = nll / n
    return {'loss': loss, 'ppl': math.exp(loss), 'masked_acc': 100. * correct / n,
            'mask_token_acc': 100. * correct_mask / max(n_mask, 1), 'tokens': n, 'predicted_token_id': top}


# ------------------------------------------------------------------------------------------------ arguments
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='python -m mlp_vision.text.train',
        description='Train a mlp_vision.text model: char/byte-level causal LM or BERT-style masked LM.',
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument('-c', '--config', default='', type=str, metavar='FILE',
                        help='yaml file of flag values (keys = flag names); explicit flags override it')
    g = parser.add_argument_group('Task and data')
    g.add_argument('--task', default='causal', choices=sorted(TASKS), help='causal LM or masked LM')
    g.add_argument('--train-file', default='', type=str, metavar='PATH', help='UTF-8 training text')
    g.add_argument('--val-file', default='', type=str, metavar='PATH',
                   help='held-out UTF-8 text (default: the last --val-fraction of --train-file)')
    g.add_argument('--val-fraction', default=0.1, type=float,
                   help='without --val-file: this final fraction of the training text is held out')
    g.add_argument('--tokenizer', default='char', choices=('char', 'byte'), help='char or UTF-8 byte tokens')
    g.add_argument('--block-size', '--seq-len', default=None, type=int, metavar='N',
                   help="tokens per sample (MLM: including <cls> and <sep>); default: the model's max length")
    g.add_argument('--mask-rate', default=0.15, type=float, help='MLM: fraction of tokens selected')

    g = parser.add_argument_group('Model')
    g.add_argument('--model', default='gpt_mlp_attention', type=str, help='name in mlp_vision.text.list_models()')
    g.add_argument('--model-kwargs', nargs='*', default={}, action=ParseKwargs,
                   help='config overrides k=v, e.g. depth=4 dim=256 (vocab_size comes from the tokenizer)')

    g = parser.add_argument_group('Optimization (defaults: the model family recipe, see RECIPES)')
    g.add_argument('--steps', default=1000, type=int, help='optimizer updates')
    g.add_argument('-b', '--batch-size', default=32, type=int, help='samples per micro-batch per process')
    g.add_argument('--grad-accum-steps', default=1, type=int, help='micro-batches per optimizer update')
    g.add_argument('--lr', default=None, type=float, help='peak learning rate')
    g.add_argument('--opt-betas', default=None, type=float, nargs=2, metavar='BETA', help='AdamW betas')
    g.add_argument('--opt-eps', default=None, type=float, help='AdamW epsilon')
    g.add_argument('--weight-decay', default=None, type=float, help='AdamW weight decay (not on 1-D params)')
    g.add_argument('--sched', default=None, choices=('cosine', 'linear', 'constant'), help='decay after warmup')
    g.add_argument('--warmup-steps', default=None, type=int,
                   help="linear warmup updates (default: min(the recipe's, 10%% of --steps))")
    g.add_argument('--min-lr-ratio', default=0.0, type=float, help='cosine / linear decay ends at this x LR')
    g.add_argument('--clip-grad', default=1.0, type=float, help='max gradient norm (<= 0: off)')

    g = parser.add_argument_group('Evaluation, checkpoints, outputs')
    g.add_argument('--eval-interval', default=100, type=int, help='evaluate + checkpoint every N updates')
    g.add_argument('--eval-batches', default=8, type=int,
                   help='validation batches of the periodic evaluation (a fixed subset; <= 0: all)')
    g.add_argument('--final-eval-batches', default=0, type=int, help='validation batches at the end (<= 0: all)')
    g.add_argument('--eval-batch-size', default=None, type=int, help='default: --batch-size')
    g.add_argument('--log-interval', default=10, type=int, help='progress line every N updates')
    g.add_argument('--output', default='', type=str, help='output root (default ./output/text)')
    g.add_argument('--experiment', default='', type=str, help='experiment folder name (default: date-model-task)')
    g.add_argument('--resume', default='', type=str, metavar='PATH', help='continue from this last.pth')
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


def _check_args(args) -> None:
    positive = {'--steps': args.steps, '--batch-size': args.batch_size, '--grad-accum-steps': args.grad_accum_steps,
                '--eval-interval': args.eval_interval, '--log-interval': args.log_interval}
    for flag, value in positive.items():
        if value < 1:
            raise UsageError(f'{flag} must be >= 1, got {value}')
    if not args.val_file and not 0. < args.val_fraction < 1.:
        raise UsageError(f'--val-fraction must be in (0, 1), got {args.val_fraction}')
    if not 0. < args.mask_rate < 1.:
        raise UsageError(f'--mask-rate must be in (0, 1), got {args.mask_rate}')
    if args.warmup_steps is not None and args.warmup_steps < 0:
        raise UsageError(f'--warmup-steps must be >= 0, got {args.warmup_steps}')
    if args.sample_prompt is not None and args.task != 'causal':
        raise UsageError('--sample-prompt needs --task causal (masked LMs do not generate)')
    if args.stop_after_step is not None and not 1 <= args.stop_after_step <= args.steps:
        raise UsageError(f'--stop-after-step must be in [1, --steps {args.steps}], got {args.stop_after_step}')
    if args.sample_prompt == '':
        raise UsageError('--sample-prompt is empty: give at least one character')


def _registry_entry(name: str) -> dict:
    try:
        return model_config(name)
    except KeyError:  # registered without defaults
        return {}


def _model_task_and_family(name: str) -> Tuple[Optional[str], Optional[str]]:
    """(registry task, family) of a text model name; the family falls back to the name's prefix."""
    if not is_model(name):
        raise UsageError(f'unknown text model {name!r}; known: {", ".join(list_models())}')
    cfg = _registry_entry(name)
    family = cfg.get('family') or ('bigs' if name.startswith('bigs') else None)
    return cfg.get('task'), family


def _resolve_recipe(args, family: Optional[str], registry_task: str) -> dict:
    """Fill --lr / --opt-betas / --opt-eps / --weight-decay / --sched / --warmup-steps from the family recipe."""
    key = (family, registry_task) if (family, registry_task) in RECIPES else _DEFAULT_RECIPE[registry_task]
    recipe = RECIPES[key]
    given = {'lr': args.lr, 'betas': None if args.opt_betas is None else tuple(args.opt_betas), 'eps': args.opt_eps,
             'weight_decay': args.weight_decay, 'sched': args.sched}
    overridden = [k for k, v in given.items() if v is not None and v != recipe[k]]  # recipe betas are tuples
    args.lr = recipe['lr'] if args.lr is None else args.lr
    args.opt_betas = list(recipe['betas']) if args.opt_betas is None else list(args.opt_betas)
    args.opt_eps = recipe['eps'] if args.opt_eps is None else args.opt_eps
    args.weight_decay = recipe['weight_decay'] if args.weight_decay is None else args.weight_decay
    args.sched = recipe['sched'] if args.sched is None else args.sched
    if args.warmup_steps is None:
        args.warmup_steps = min(recipe['warmup_steps'], args.steps // 10)
    source = recipe['source'] + (f'; overridden on the command line: {", ".join(overridden)}' if overridden else '')
    return {'recipe': f'{key[0]}/{key[1]}', 'source': source, 'overridden': overridden}


def _config_fields(family: Optional[str], registry_task: str) -> set:
    """Field names of the config class the registry builds for (family, task); empty when unknown."""
    model_class = registry_model_class(family, registry_task) if family is not None else None
    config_class = getattr(model_class, 'config_class', None)
    return {f.name for f in dataclasses.fields(config_class)} if dataclasses.is_dataclass(config_class) else set()


def _create_optimizer(model: nn.Module, family: Optional[str], args) -> torch.optim.Optimizer:
    """AdamW. BiGS: the official decay mask (:func:`~mlp_vision.text.bigs.bigs_param_groups`: SSM parameters and
    embeddings decayed, biases / LayerNorms not); other families: timm's groups (no decay on 1-D parameters)."""
    if family == 'bigs':
        from .bigs import bigs_param_groups
        return torch.optim.AdamW(bigs_param_groups(model, args.weight_decay), lr=args.lr,
                                 betas=tuple(args.opt_betas), eps=args.opt_eps)
    return create_optimizer_v2(model, 'adamw', lr=args.lr, weight_decay=args.weight_decay,
                               betas=tuple(args.opt_betas), eps=args.opt_eps)


def _length_field(config) -> str:
    for name in _LENGTH_FIELDS:
        if hasattr(config, name):
            return name
    raise UsageError(f'cannot tell the maximum input length of {type(config).__name__} '
                     f'(none of {_LENGTH_FIELDS}); pass --block-size')


# ------------------------------------------------------------------------------------------------ main
def main(argv: Optional[Sequence[str]] = None):
    """Train; returns the results dict on rank 0 (None on other ranks). Bad input -> SystemExit with a message."""
    log_files = []
    threads = torch.get_num_threads()  # --threads is for this run only: an in-process caller keeps its setting
    try:
        return _main(argv, log_files)
    except UsageError as e:
        raise SystemExit(f'mlp_vision.text.train: error: {e}')
    finally:
        torch.set_num_threads(threads)
        for handler in log_files:
            remove_log_file(handler)


def _main(argv, log_files):
    argv = list(sys.argv[1:] if argv is None else argv)
    run_start = time.time()
    args, _ = parse_args_with_config(build_parser(), argv)
    _check_args(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    dist_info = init_device(args.device, args.dist_backend, args.dist_url)
    device, primary, world = dist_info.device, dist_info.primary, dist_info.world_size
    setup_logging(primary)
    registry_task, family = _model_task_and_family(args.model)
    if registry_task is not None and registry_task != TASKS[args.task]:
        fitting = [n for n in list_models() if _registry_entry(n).get('task') == TASKS[args.task]]
        raise UsageError(f'model {args.model!r} is a {registry_task} model; --task {args.task} needs a '
                         f'{TASKS[args.task]} model: {", ".join(fitting)}')
    registry_task = TASKS[args.task]

    resume_ckpt = None
    if args.resume:  # checked before anything is built
        resume_ckpt = load_checkpoint_file(args.resume)
        if resume_ckpt.get('kind') != 'text' or 'optimizer' not in resume_ckpt:
            raise UsageError(f'--resume {args.resume} is not a checkpoint of mlp_vision.text.train (expected the '
                             f'last.pth of an experiment folder)')
        if resume_ckpt['arch'] != args.model or resume_ckpt['task'] != args.task:
            raise UsageError(f'--resume {args.resume} is a checkpoint of model {resume_ckpt["arch"]!r} '
                             f'(--task {resume_ckpt["task"]}), not --model {args.model!r} (--task {args.task})')

    # ---------------------------------------------------------------- text and tokenizer
    train_text = read_text_file(args.train_file, 'training text file')
    if args.val_file:
        val_text = read_text_file(args.val_file, 'validation text file')
    else:
        cut = int(len(train_text) * (1. - args.val_fraction))
        train_text, val_text = train_text[:cut], train_text[cut:]
    if resume_ckpt is not None:
        tokenizer = tokenizer_from_dict(resume_ckpt['tokenizer'])
    else:
        tokenizer = build_tokenizer(args.tokenizer, args.task, train_text, val_text)
    train_ids = _encode(tokenizer, train_text, 'training text')
    val_ids = _encode(tokenizer, val_text, 'validation text')
    if args.sample_prompt is not None:
        _encode(tokenizer, args.sample_prompt, '--sample-prompt')  # fail now, not after training

    # ---------------------------------------------------------------- model
    recipe_info = _resolve_recipe(args, family, registry_task)
    model_kwargs = dict(args.model_kwargs)
    if 'vocab_size' in model_kwargs and model_kwargs['vocab_size'] != tokenizer.vocab_size:
        raise UsageError(f'--model-kwargs vocab_size={model_kwargs["vocab_size"]} differs from the tokenizer\'s '
                         f'{tokenizer.vocab_size}; leave vocab_size out (it is set from the tokenizer)')
    model_kwargs['vocab_size'] = tokenizer.vocab_size
    if 'pad_token_id' in _config_fields(family, registry_task) and tokenizer.pad_id is not None:
        model_kwargs.setdefault('pad_token_id', tokenizer.pad_id)  # BiGS: the zero embedding row is the <pad>
    try:
        random_seed(args.seed, dist_info.rank)
        model = create_model(args.model, **model_kwargs)
    except (TypeError, ValueError) as e:
        raise UsageError(f'cannot build {args.model} with --model-kwargs {args.model_kwargs}: {e}') from e
    config = getattr(model, 'config', None)
    length_field = _length_field(config)
    max_len = getattr(config, length_field)
    if args.block_size is None:
        args.block_size = max_len
    if args.block_size > max_len:
        raise UsageError(f'--block-size {args.block_size} is larger than the model\'s maximum length {max_len} '
                         f'({length_field}); use --block-size <= {max_len} or --model-kwargs '
                         f'{length_field}={args.block_size}')
    min_block = 3 if args.task == 'mlm' else 1
    if args.block_size < min_block:
        raise UsageError(f'--block-size must be >= {min_block} for --task {args.task}, got {args.block_size}')
    need = args.block_size + 1 if args.task == 'causal' else 1
    for ids, what in ((train_ids, 'training'), (val_ids, 'validation')):
        if len(ids) < need:
            raise UsageError(f'the {what} text has {len(ids)} tokens, fewer than one block of '
                             f'{args.block_size} + 1; use a longer text or a smaller --block-size')
    num_params = sum(p.numel() for p in model.parameters())
    model.to(device)

    # ---------------------------------------------------------------- optimizer, schedule, AMP
    optimizer = _create_optimizer(model, family, args)
    lr_lambda = partial(lr_multiplier, total_steps=args.steps, warmup_steps=args.warmup_steps, sched=args.sched,
                        min_ratio=args.min_lr_ratio)
    lr_multiplier(0, args.steps, args.warmup_steps, args.sched)  # validates --sched
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    amp_autocast, scaler, amp_dtype = nullcontext, None, None
    if args.amp:
        amp_dtype = getattr(torch, args.amp_dtype or ('float16' if device.type == 'cuda' else 'bfloat16'))
        amp_autocast = partial(torch.autocast, device_type=device.type, dtype=amp_dtype)
        if amp_dtype == torch.float16:
            if device.type != 'cuda':
                raise UsageError('--amp-dtype float16 needs CUDA; on the CPU use bfloat16 (the default)')
            scaler = torch.amp.GradScaler('cuda')

    start_step, train_tokens_before, train_seconds_before = 0, 0, 0.
    if resume_ckpt is not None:
        load_model_weights(model, resume_ckpt['state_dict'], f'--resume {args.resume}', args.model)
        optimizer.load_state_dict(resume_ckpt['optimizer'])
        scheduler.load_state_dict(resume_ckpt['scheduler'])
        if scaler is not None and resume_ckpt.get('amp_scaler'):
            scaler.load_state_dict(resume_ckpt['amp_scaler'])
        start_step = resume_ckpt['step']
        train_tokens_before = resume_ckpt.get('train_tokens', 0)
        train_seconds_before = resume_ckpt.get('train_seconds', 0.)

    train_model = wrap_ddp(model, dist_info) if dist_info.distributed else model

    # ---------------------------------------------------------------- data
    eval_bs = args.eval_batch_size or args.batch_size
    masker = None
    if args.task == 'mlm':
        masker = MLMMasker(tokenizer, rate=args.mask_rate)
        val_batches = mlm_eval_batches(val_ids, args.block_size, eval_bs, tokenizer, masker, seed=args.seed)

        def next_batch(gen):
            return sample_mlm_batch(train_ids, args.batch_size, args.block_size, tokenizer, masker, gen)
    else:
        val_batches = causal_eval_batches(val_ids, args.block_size, eval_bs)

        def next_batch(gen):
            return sample_causal_batch(train_ids, args.batch_size, args.block_size, gen)
    periodic_batches = _subset(val_batches, args.eval_batches, args.seed)
    final_batches = _subset(val_batches, args.final_eval_batches, args.seed)
    data_gen = torch.Generator().manual_seed(args.seed + 10_000 * dist_info.rank)
    mask_id = tokenizer.mask_id if args.task == 'mlm' else None
    evaluate = partial(evaluate_lm, task=args.task, device=device, amp_autocast=amp_autocast, dist_info=dist_info,
                       mask_id=mask_id)

    # ---------------------------------------------------------------- outputs
    output_dir, saver, summary = None, None, None
    if primary:
        if args.resume and not args.output and not args.experiment:
            output_dir = Path(args.resume).resolve().parent
        else:
            name = args.experiment or f'{datetime.now():%Y%m%d-%H%M%S}-{args.model}-{args.task}'
            output_dir = Path(get_outdir(args.output or './output/text', name, inc=True)).resolve()
        log_files.append(add_log_file(output_dir / 'train.log'))
        with open(output_dir / 'args.yaml', 'w') as f:
            f.write(args_to_yaml(args))
        saver = CheckpointManager(output_dir, decreasing=True, max_history=0)
        summary = SummaryWriter(output_dir / 'summary.csv', key='step')
        if resume_ckpt is not None:
            saver.load_state_dict(resume_ckpt.get('checkpoint_history'))
            summary.truncate(before_epoch=start_step + 1)

    tokens_per_step = args.batch_size * args.block_size * args.grad_accum_steps * world
    _logger.info(f'Model {args.model} ({num_params / 1e6:.3f} M params, {model_kwargs}) on {device}'
                 f'{f" x {world} processes ({dist.get_backend()})" if dist_info.distributed else ""}, '
                 f'AMP {amp_dtype if args.amp else "off"}, {torch.get_num_threads()} threads')
    _logger.info(f'Data: {len(train_ids):,} training tokens ({args.train_file}), {len(val_ids):,} validation tokens '
                 f'({args.val_file or f"last {args.val_fraction:.0%} of the training file"}); {tokenizer!r}')
    _logger.info(f'Task {args.task}: {args.steps} updates x {tokens_per_step:,} tokens (batch {args.batch_size} x '
                 f'block {args.block_size} x accum {args.grad_accum_steps} x {world} processes); AdamW lr '
                 f'{args.lr:g} betas {tuple(args.opt_betas)} eps {args.opt_eps:g} wd {args.weight_decay:g}, '
                 f'{args.warmup_steps} warmup then {args.sched} ({recipe_info["source"]})'
                 + (f'; resuming at step {start_step} from {args.resume}' if resume_ckpt is not None else ''))
    if primary:
        _logger.info(f'Outputs: {output_dir}')

    # restore every rank's RNG last, so nothing above (model init, masking of the eval set) shifts it
    interval_loss, interval_batches = 0., 0  # running train loss since the last evaluation
    if resume_ckpt is not None:
        rng_states = resume_ckpt.get('rng_states') or []
        if len(rng_states) == world:
            set_rng_state(rng_states[dist_info.rank])
            data_gen.set_state(rng_states[dist_info.rank]['data'])
            interval_loss = rng_states[dist_info.rank].get('interval_loss', 0.)
            interval_batches = rng_states[dist_info.rank].get('interval_batches', 0)
        else:
            _logger.warning(f'checkpoint has RNG states for {len(rng_states)} processes, this run has {world}: '
                            f'continuing with fresh data / dropout seeds (not bit-exact)')
    resume_ckpt = None

    # ---------------------------------------------------------------- train
    params = [p for p in model.parameters() if p.requires_grad]
    val_metrics = None
    train_seconds, train_tokens = 0., 0
    last_saved_step = start_step if start_step > 0 else None
    loop_start = time.perf_counter()
    step = start_step
    train_model.train()
    try:
        while step < args.steps:
            t0 = time.perf_counter()
            for micro in range(args.grad_accum_steps):
                batch = next_batch(data_gen)
                last_micro = micro == args.grad_accum_steps - 1
                sync = train_model.no_sync if dist_info.distributed and not last_micro else nullcontext
                with sync():
                    logits, y = _forward(train_model, batch, device, amp_autocast)
                    loss = lm_loss(logits, y)
                    if not all_ranks_finite(loss, dist_info.distributed):
                        raise NonFiniteLossError(None, micro, step, loss.item(),
                                                 where=f'step {step + 1} (micro-batch {micro})')
                    scaled = loss / args.grad_accum_steps
                    (scaler.scale(scaled) if scaler is not None else scaled).backward()
                interval_loss += loss.item()
                interval_batches += 1
            if scaler is not None:
                scaler.unscale_(optimizer)
            if args.clip_grad and args.clip_grad > 0:
                torch.nn.utils.clip_grad_norm_(params, args.clip_grad)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            lr = optimizer.param_groups[0]['lr']
            scheduler.step()
            step += 1
            train_seconds += time.perf_counter() - t0
            train_tokens += tokens_per_step

            if primary and (step % args.log_interval == 0 or step == args.steps):
                elapsed = time.perf_counter() - loop_start
                eta = elapsed / (step - start_step) * (args.steps - step)
                _logger.info(f'step {step:>{len(str(args.steps))}d}/{args.steps} ({100. * step / args.steps:3.0f}%)  '
                             f'loss {interval_loss / interval_batches:.4f}  lr {lr:.3e}  '
                             f'{train_tokens / max(train_seconds, 1e-9):,.0f} tok/s  ETA {format_duration(eta)}')

            is_eval = step % args.eval_interval == 0 or step == args.steps
            stopping = step == args.stop_after_step
            if not (is_eval or stopping):
                continue
            train_loss = None
            if is_eval:
                with preserve_rng():  # evaluation must not shift the training's random streams
                    val_metrics = evaluate(model, periodic_batches)
                train_model.train()
                interval = torch.tensor([interval_loss, float(interval_batches)], dtype=torch.float64)
                if dist_info.distributed:
                    dist.all_reduce(interval)
                train_loss = (interval[0] / interval[1]).item()
                interval_loss, interval_batches = 0., 0
            # per rank: RNG, data order and the running train-loss interval (a stop between evaluations keeps it)
            rank_state = get_rng_state()
            rank_state.update(data=data_gen.get_state(), interval_loss=interval_loss, interval_batches=interval_batches)
            rng_states = all_gather_objects(rank_state, dist_info)
            if primary:
                tokens_total, seconds_total = train_tokens_before + train_tokens, train_seconds_before + train_seconds
                if is_eval:
                    row = {'step': step, 'lr': lr, 'train_loss': train_loss, 'val_loss': val_metrics['loss'],
                           'val_ppl': val_metrics['ppl']}
                    if args.task == 'mlm':
                        row['val_masked_acc'] = val_metrics['masked_acc']
                        row['val_mask_token_acc'] = val_metrics['mask_token_acc']
                    row.update(tokens_per_sec=tokens_total / max(seconds_total, 1e-9),
                               elapsed_s=time.time() - run_start)
                    summary.append(row)
                metric = val_metrics['loss'] if is_eval else None
                state = {
                    'version': CHECKPOINT_VERSION,
                    'kind': 'text',
                    'task': args.task,
                    'step': step,
                    'epoch': step,  # CheckpointManager's position key
                    'arch': args.model,
                    'model_cfg': {'name': args.model, 'kwargs': model_kwargs},
                    'model_config': dataclasses.asdict(config) if dataclasses.is_dataclass(config) else None,
                    'tokenizer': tokenizer_to_dict(tokenizer),
                    'block_size': args.block_size,
                    'state_dict': model.state_dict(),
                    'optimizer': optimizer.state_dict(),
                    'scheduler': scheduler.state_dict(),
                    'amp_scaler': scaler.state_dict() if scaler is not None else None,
                    'rng_states': rng_states,
                    'train_tokens': tokens_total,
                    'train_seconds': seconds_total,
                    'metric': metric,
                    'val_metrics': dict(val_metrics) if is_eval else None,
                    'args': vars(args),
                }
                written = saver.save(state, step, metric)
                last_saved_step = step
                if is_eval:
                    msg = (f'step {step}: train loss {train_loss:.4f} | val loss {val_metrics["loss"]:.4f} '
                           f'ppl {val_metrics["ppl"]:.3f}')
                    if args.task == 'mlm':
                        msg += f' masked acc {val_metrics["masked_acc"]:.2f}%'
                else:
                    msg = f'step {step}: stopping (--stop-after-step)'
                msg += ' | saved last.pth' + (' + model_best.pth' if written['best'] else '')
                _logger.info(msg)
            if stopping:
                break
    except NonFiniteLossError as e:
        raise non_finite_exit(
            e, 'mlp_vision.text.train', saver.last_path if saver is not None else None,
            f'step {last_saved_step}' if last_saved_step is not None else None,
            'Lower --lr, keep --clip-grad on, add --warmup-steps', output_dir, primary)

    if step < args.steps:
        _logger.info(f'Stopped at step {step} (--stop-after-step); continue with --resume '
                     f'{saver.last_path if saver is not None else "EXP/last.pth"}')
        return {'stopped_at_step': step, 'last': str(saver.last_path)} if primary else None

    # ---------------------------------------------------------------- final evaluation and outputs
    final_metrics = evaluate(model, final_batches)
    digests = all_gather_objects(state_dict_digest(model), dist_info)
    if dist_info.distributed and len(set(digests)) != 1:
        _logger.error(f'weights differ across ranks: {digests}')
    baseline = None
    if args.task == 'mlm':
        baseline = unigram_mlm_baseline(train_ids, final_batches, masker.num_base, mask_id)
    samples = None
    if primary and args.sample_prompt is not None:
        samples = _write_samples(model, tokenizer, args, device, output_dir / 'samples.txt')
    if not primary:
        return None

    _save_pretrained(model, tokenizer, output_dir / 'pretrained')
    total_tokens = train_tokens_before + train_tokens
    total_seconds = train_seconds_before + train_seconds
    results = {
        'model': args.model,
        'task': args.task,
        'model_kwargs': model_kwargs,
        'params': num_params,
        'tokenizer': {'type': tokenizer_to_dict(tokenizer)['type'], 'vocab_size': tokenizer.vocab_size},
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
        'val_final_batches': len(final_batches),
        'unigram_baseline': baseline,
        'best': saver.best,
        'train_tokens': total_tokens,
        'train_seconds': total_seconds,
        'tokens_per_sec': total_tokens / max(total_seconds, 1e-9),
        'wall_seconds_this_process': time.time() - run_start,
        'device': str(device),
        'world_size': world,
        'threads': torch.get_num_threads(),
        'amp': str(amp_dtype) if args.amp else None,
        'seed': args.seed,
        'torch': torch.__version__,
        'samples_file': str(output_dir / 'samples.txt') if samples is not None else None,
        'weights_sha256_per_rank': digests,
        'checkpoints': {'last': str(saver.last_path),
                        'best': str(saver.best_path) if saver.best_path.exists() else None},
        'experiment_dir': str(output_dir),
        'command': 'python -m mlp_vision.text.train ' + ' '.join(_quote(a) for a in argv),
    }
    write_json(output_dir / 'results.json', results)
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
            f'{format_duration(time.time() - run_start)}')
    _logger.info(msg)
    return results


def _quote(arg: str) -> str:
    return arg if arg and all(c.isalnum() or c in '-_=./:,+' for c in arg) else json.dumps(arg)


def _write_samples(model: nn.Module, tokenizer: Tokenizer, args, device: torch.device, path: Path) -> List[str]:
    """Sample ``--num-samples`` continuations of ``--sample-prompt`` (seeded) and write them to ``path``."""
    model = unwrap_model(model)
    prompt = _encode(tokenizer, args.sample_prompt, '--sample-prompt')
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


def _save_pretrained(model: nn.Module, tokenizer: Tokenizer, directory: Path) -> None:
    """``save_pretrained`` (config.json + model.safetensors) and ``tokenizer.json`` into ``directory``."""
    if not hasattr(model, 'save_pretrained'):
        return
    model.save_pretrained(str(directory))
    with open(directory / 'tokenizer.json', 'w', encoding='utf-8') as f:
        json.dump(tokenizer_to_dict(tokenizer), f, ensure_ascii=False)


if __name__ == '__main__':
    main()
