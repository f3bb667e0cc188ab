""" Whole text models on long sequences (issue 26 items 1 and 3): BiGS vs BERT with SDPA (flash attention on CUDA).

Modes:
    pair     tokens/s of a masked-LM training step (forward, loss, backward, optimizer step) of a BiGS encoder vs a
             BERT encoder of the same depth and width at each ``--seq-lens``, the two alternating in one process
             (A B, B A, ...), with the median of the per-pair time ratios and each side's peak memory per token.
    longest  the longest sequence each model trains on at batch 1 in the device's memory: doubling from
             ``--start-len`` until a step runs out of memory, then bisection to ``--granularity`` tokens.
    routes   the BiGS layer's SSM convolution routes (``conv_impl`` direct / fft / chunked / triton) and the BERT
             layer of the same width (SDPA: flash attention on CUDA) at each ``--seq-lens``, alternating in one
             process (medians of the samples): inference and training-step time, tokens/s of the training step and
             memory per token (CUDA: the step's peak memory
             above what was allocated before; CPU: the activations autograd keeps for the backward pass), to place
             ``conv_impl='auto'``'s crossovers; ``auto_route`` is the route ``'auto'`` takes there today. The direct
             route is left out beyond ``--max-direct-len`` (its (L, L) matrices), BERT beyond ``--max-bert-len``.

BiGS: ``bigs_large_512``'s family with ``--layers`` layers of width ``--hidden`` and intermediate 3 x hidden (the
BiGS-large ratio, arXiv 2212.10544 Table 6); BERT: ``bert_base``'s family, same depth and width, FFN 4 x hidden,
hidden / 64 heads. Random weights, random tokens, 15 % of positions scored (BERT's masking rate); dropout off.

Writes PREFIX.json and PREFIX.md with ``--out PREFIX``. On the CPU it runs too (small ``--layers`` / ``--hidden``),
which is how its logic is tested; the numbers that matter come from a GPU (``scripts/gpu/run_gpu.sh bigs_models``).
"""
import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

import torch

import mlp_vision.text as mt
from mlp_vision.benchmark import profile_call, saved_activation_bytes, seconds_per_call, sync
from mlp_vision.layers import BidirectionalGatedSSM
from mlp_vision.layers.longconv_triton import has_triton
from mlp_vision.layers.ssm import auto_conv_impl, ssm_conv_impl
from mlp_vision.text.bert import BertLayer


def build(family: str, args, seq_len: int) -> torch.nn.Module:
    h = args.hidden
    common = dict(num_hidden_layers=args.layers, hidden_size=h, max_position_embeddings=seq_len,
                  hidden_dropout_prob=0.)
    if family == 'bigs':
        model = mt.create_model('bigs_large_512', intermediate_size=3 * h, **common)
        for m in model.modules():
            if isinstance(m, BidirectionalGatedSSM):
                m.conv_impl = args.conv_impl
    else:
        model = mt.create_model('bert_base', intermediate_size=4 * h, num_attention_heads=max(h // 64, 1),
                                attention_probs_dropout_prob=0., **common)
    return model.to(args.device)


def _autocast(args):
    dtype = {'amp_bf16': torch.bfloat16, 'amp_fp16': torch.float16}.get(args.precision)
    return torch.autocast(torch.device(args.device).type, dtype=dtype, enabled=dtype is not None)


def training_step(model, args, batch: int, seq_len: int) -> Callable[[], None]:
    """A closure running one masked-LM training step on fixed random tokens."""
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    ids = torch.randint(5, vocab, (batch, seq_len), generator=g)
    labels = torch.where(torch.rand(batch, seq_len, generator=g) < 0.15, ids, torch.full_like(ids, -100))
    ids, labels = ids.to(args.device), labels.to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    fn = torch.compile(model) if args.compile else model
    model.train()

    def step():
        with _autocast(args):
            loss = fn(input_ids=ids, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    step.kept_bytes = lambda: saved_activation_bytes(  # the activations the step keeps (memory off CUDA)
        model, input_ids=ids, labels=labels, autocast_dtype=_autocast(args).fast_dtype if args.precision != 'fp32'
        else None)
    return step


def peak_memory_mb(step, device) -> float:
    if torch.device(device).type != 'cuda':
        return float('nan')
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    sync(device)
    return (torch.cuda.max_memory_allocated() - base) / 2 ** 20


PROFILES: List[str] = []  # pair --profile: the top-kernel tables, written to PREFIX_profile.txt


def pair(args) -> List[Dict]:
    rows = []
    for seq_len in args.seq_lens:
        batch = max(args.batch_tokens // seq_len, 1)
        steps = {f: training_step(build(f, args, seq_len), args, batch, seq_len) for f in ('bigs', 'bert')}
        for f, step in steps.items():
            for _ in range(args.warmup):
                step()
        if torch.device(args.device).type == 'cuda':
            memory = {f'{f}_step_mem_mb_per_1k_tokens': peak_memory_mb(step, args.device) / (batch * seq_len) * 1000
                      for f, step in steps.items()}
        else:  # the activations a training step keeps for its backward pass
            memory = {f'{f}_kept_kib_per_token': step.kept_bytes() / 1024 / (batch * seq_len)
                      for f, step in steps.items()}
        times = {'bigs': [], 'bert': []}
        for i in range(args.samples):
            order = ('bigs', 'bert') if i % 2 == 0 else ('bert', 'bigs')
            for f in order:
                times[f].append(seconds_per_call(steps[f], args.iters, args.device))
        ratio = statistics.median(b / a for a, b in zip(times['bigs'], times['bert']))
        tokens = batch * seq_len
        row = dict(seq_len=seq_len, batch=batch, speedup_bigs_over_bert=ratio,
                   **{f'{f}_tokens_per_s': tokens / statistics.median(t) for f, t in times.items()}, **memory)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.profile and seq_len == args.seq_lens[0]:  # the top kernels, at the first length
            PROFILES.extend(profile_call(step, torch.device(args.device), f'{f}, {args.layers} layers, batch {batch} '
                                         f'x {seq_len} tokens, training step') for f, step in steps.items())
        del steps
        if torch.device(args.device).type == 'cuda':
            torch.cuda.empty_cache()
    return rows


def _fits(family: str, args, seq_len: int) -> bool:
    try:
        step = training_step(build(family, args, seq_len), args, 1, seq_len)
        step()
        step()
        sync(args.device)
        return True
    except torch.OutOfMemoryError:
        return False
    finally:
        if torch.device(args.device).type == 'cuda':
            torch.cuda.empty_cache()


def longest_fitting(fits: Callable[[int], bool], start: int, max_len: int, granularity: int) -> Dict:
    """The longest length that ``fits``, for a ``fits`` that holds up to some length and fails beyond: doubling
    from ``start`` to the first failure, then bisection to ``granularity`` (``start`` a multiple of it)."""
    ok, bad = 0, start
    while bad <= max_len and fits(bad):
        ok, bad = bad, bad * 2
    if bad > max_len:
        return dict(longest_fitting=ok, capped_at=max_len)
    while bad - ok > granularity:
        mid = (ok + bad) // 2 // granularity * granularity
        ok, bad = (mid, bad) if fits(mid) else (ok, mid)
    return dict(longest_fitting=ok, first_failing=bad)


def longest(args) -> List[Dict]:
    rows = []
    for family in ('bigs', 'bert'):
        rows.append(dict(model=family, **longest_fitting(lambda n: _fits(family, args, n), args.start_len,
                                                         args.max_len, args.granularity)))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _layer_memory_per_token_kib(layer, x, train, args) -> float:
    """KiB per token a training step of ``layer`` takes: on CUDA the step's peak memory, elsewhere the activations
    autograd keeps for the backward pass (:func:`mlp_vision.benchmark.saved_activation_bytes`)."""
    if torch.device(args.device).type == 'cuda':
        return peak_memory_mb(train, args.device) * 1024 / x.shape[:2].numel()
    dtype = {'amp_bf16': torch.bfloat16, 'amp_fp16': torch.float16}.get(args.precision)
    return saved_activation_bytes(layer, x, autocast_dtype=dtype) / 1024 / x.shape[:2].numel()


def _layer_calls(layer, x, impl, args) -> Dict[str, Callable[[], None]]:
    """An inference call and a training step (forward, backward) of ``layer`` on ``x``, on the convolution route
    ``impl`` for a BiGS layer (None: as it is)."""
    def route():
        return ssm_conv_impl(layer, impl) if impl else contextlib.nullcontext()

    def infer():
        with route(), torch.no_grad(), _autocast(args):
            layer(x)

    def train():
        with route(), _autocast(args):
            out = layer(x)
        out.float().sum().backward()
    return {'inference': infer, 'train': train}


def routes(args) -> List[Dict]:
    rows = []
    impls = [i for i in ('direct', 'fft', 'chunked', 'triton')
             if i != 'triton' or torch.device(args.device).type == 'cuda' or args.interpret_triton]
    for seq_len in args.seq_lens:
        batch = max(args.batch_tokens // seq_len, 1)
        bigs = BidirectionalGatedSSM(args.hidden, 3 * args.hidden).to(args.device)
        x = torch.randn(batch, seq_len, args.hidden, device=args.device, requires_grad=True)
        dtype = {'amp_bf16': torch.bfloat16, 'amp_fp16': torch.float16}.get(args.precision, x.dtype)  # a_f's dtype
        row = dict(seq_len=seq_len, batch=batch,
                   auto_route=auto_conv_impl(x.device.type, dtype, seq_len, has_triton(x.device)))
        contenders = {impl: _layer_calls(bigs, x, impl, args) for impl in impls
                      if impl != 'direct' or seq_len <= args.max_direct_len}
        if seq_len <= args.max_bert_len:
            bert = BertLayer(args.hidden, num_heads=max(args.hidden // 64, 1), ffn_dim=4 * args.hidden)
            contenders['bert'] = _layer_calls(bert.to(args.device), x, None, args)
        times = {(name, mode): [] for name in contenders for mode in ('inference', 'train')}
        for name, calls in contenders.items():
            for mode, fn in calls.items():
                for _ in range(args.warmup):
                    fn()
        for i in range(args.samples):  # the contenders alternate, each sample in another order
            names = list(contenders)
            for name in names[i % len(names):] + names[:i % len(names)]:
                for mode, fn in contenders[name].items():
                    times[name, mode].append(seconds_per_call(fn, args.iters, args.device))
        for name, calls in contenders.items():
            for mode in calls:
                row[f'{name}_{mode}_ms'] = 1000 * statistics.median(times[name, mode])
            row[f'{name}_train_tokens_per_s'] = batch * seq_len / row[f'{name}_train_ms'] * 1000
            layer = bert if name == 'bert' else bigs
            with ssm_conv_impl(layer, name) if name != 'bert' else contextlib.nullcontext():
                row[f'{name}_train_kib_per_token'] = _layer_memory_per_token_kib(layer, x, calls['train'], args)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def write(rows: List[Dict], args, prefix: str) -> None:
    on_cuda = torch.device(args.device).type == 'cuda'
    env = dict(date=time.strftime('%Y-%m-%d'), torch=torch.__version__, python=platform.python_version(),
               device=torch.cuda.get_device_name(0) if on_cuda else platform.processor() or 'CPU',
               threads=torch.get_num_threads(), load_avg_at_end=os.getloadavg(), command=' '.join(sys.argv),
               args=vars(args))
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    Path(prefix + '.json').write_text(json.dumps(dict(env=env, rows=rows), indent=2))
    keys = list(rows[0]) if rows else []
    md = [f'# {args.mode}: {env["device"]}, {env["date"]}, torch {env["torch"]}', '', f'`{env["command"]}`', '',
          '| ' + ' | '.join(keys) + ' |',
          '|' + ' --- |' * len(keys)]
    md += ['| ' + ' | '.join(f'{r.get(k):.4g}' if isinstance(r.get(k), float) else str(r.get(k)) for k in keys)
           + ' |' for r in rows]
    Path(prefix + '.md').write_text('\n'.join(md) + '\n')
    if PROFILES:
        Path(prefix + '_profile.txt').write_text(f'# torch.profiler, top ops by self time: {env["device"]}, '
                                                 f'{env["date"]}\n# {env["command"]}\n\n' + '\n'.join(PROFILES))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('mode', choices=('pair', 'longest', 'routes'))
    p.add_argument('--device', default='cuda')
    p.add_argument('--precision', default='amp_bf16', choices=('fp32', 'amp_bf16', 'amp_fp16'))
    p.add_argument('--layers', type=int, default=12)
    p.add_argument('--hidden', type=int, default=768)
    p.add_argument('--conv-impl', default='auto', choices=BidirectionalGatedSSM.CONV_IMPLS,
                   help='BiGS route (pair, longest)')
    p.add_argument('--compile', action='store_true', help='torch.compile both models (pair, longest)')
    p.add_argument('--profile', action='store_true',
                   help="pair: profile one training step of each model at the first length (torch.profiler's top "
                        'ops by self time; PREFIX_profile.txt with --out)')
    p.add_argument('--seq-lens', type=int, nargs='+', default=[1024, 4096, 16384])
    p.add_argument('--batch-tokens', type=int, default=32768, help='tokens per step (batch = this / seq-len)')
    p.add_argument('--samples', type=int, default=6)
    p.add_argument('--iters', type=int, default=3, help='steps per timed sample')
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--start-len', type=int, default=1024)
    p.add_argument('--max-len', type=int, default=1 << 20)
    p.add_argument('--granularity', type=int, default=512)
    p.add_argument('--interpret-triton', action='store_true', help='routes: include triton off CUDA (interpreter)')
    p.add_argument('--max-direct-len', type=int, default=8192, help='routes: the longest length of the direct route')
    p.add_argument('--max-bert-len', type=int, default=1 << 20, help='routes: the longest length of the BERT layer')
    p.add_argument('--out', default=None, help='write PREFIX.json and PREFIX.md')
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    PROFILES.clear()  # this run's tables only, when main is called again in one process
    rows = {'pair': pair, 'longest': longest, 'routes': routes}[args.mode](args)
    if args.out:
        write(rows, args, args.out)
    return 0


if __name__ == '__main__':
    sys.exit(main())
