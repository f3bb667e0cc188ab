""" Inference / training-step throughput of timm models (ours and any registered) and sequence layers, alone or paired.

Run as ``mlp-vision-benchmark``, ``python -m mlp_vision.benchmark``, or ``python benchmark.py`` in a checkout. As
timm's ``benchmark.py``: throughput, step time, peak memory and achieved GFLOP/s against this machine's measured
matmul rate, on CPU or CUDA, in fp32 / bf16 / fp16 (cast or autocast), optionally channels_last and compiled. A pair
(``--compare A B``) is built with one set of weights (B's, through A's ``checkpoint_filter_fn``), checked to compute
the same outputs, then timed alternately (A B, B A, ...): the result is the median of the per-pair ratios t_B / t_A
(the speed-up of A over B), which load from other processes changes far less than either throughput.

Contenders: any timm model NAME; ``local-dir:FOLDER`` (a run's pretrained/, its weights checked as validate.py's);
``fused:NAME`` (after ``timm.utils.reparameterize_model``; inference only); ``ref:NAME``, the straightforward sMLPNet
of ``tests/reference/smlpnet.py`` (the checkout's benchmark.py only); the sequence layers ``bigs_layer`` (one
``BidirectionalGatedSSM``, default BiGS-large), ``ref:bigs_layer`` (``tests/reference/bigs.py``) and ``bert_layer``
(the BERT-large layer BiGS replaces), on (batch, ``--seq-len``, d) inputs, in tokens/s. A ``ref:`` or ``fused:``
contender is built from the other one of its pair, with its weights. Example commands: README.
"""
import argparse
import csv
import datetime
import functools
import importlib.util
import io
import json
import math
import multiprocessing
import os
import platform
import resource
import shlex
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
import timm

import mlp_vision
from mlp_vision.arguments import (
    SEED_MAX, THREADS_RANGE, ArgumentParser, ParseKwargs, add_threads_argument, check_flag_ranges, parse_device,
    set_threads)
from mlp_vision.errors import UsageError, run_cli
from mlp_vision.layers import BidirectionalGatedSSM
from mlp_vision.outputs import output_kind, write_output_file
from mlp_vision.image_model import COMPILE_MODES, create_model, is_local_dir, model_create_kwargs

PRECISIONS = {  # --precision: (parameter / input dtype, autocast dtype or None)
    'fp32': (torch.float32, None), 'bf16': (torch.bfloat16, None), 'fp16': (torch.float16, None),
    'amp_bf16': (torch.float32, torch.bfloat16), 'amp_fp16': (torch.float32, torch.float16),
}
LAYERS = ('bigs_layer', 'bert_layer')  # sequence-layer contenders (tokens/s)
TWIN_PREFIXES = ('ref:', 'fused:')  # contenders built from the other one of their pair
NOTE_CHARS = 300  # an error quoted in a note: whole words up to this many characters, then how much was left out
_START = time.monotonic()  # progress lines count seconds from the command's start (this module's import)

# the range of each numeric flag (check_range's bounds)
FLAG_RANGES = {k: dict(low=1) for k in ('seq_len', 'dim', 'hidden_dim', 'num_states', 'heads', 'ffn_dim', 'batch_size',
                                          'img_size', 'samples')}
FLAG_RANGES.update(num_classes=dict(low=0), warmup=dict(low=0), iters=dict(low=0),
                   min_sample_time=dict(low=0, low_open=True), seed=dict(low=0, high=SEED_MAX), threads=THREADS_RANGE)


def base_name(spec: str) -> str:
    """The contender's model / layer name without its ``ref:`` or ``fused:`` prefix."""
    return spec.split(':', 1)[1] if spec.startswith(TWIN_PREFIXES) else spec


def is_layer(spec: str) -> bool:
    return base_name(spec) in LAYERS


def _reference_path(spec: str, reference_dir: str) -> Path:
    return Path(reference_dir) / ('bigs.py' if is_layer(spec) else 'smlpnet.py')


@functools.lru_cache(maxsize=None)
def _load_reference(path: Path):
    """The checkout's reference model file, imported by its path: no other ``tests`` or ``reference`` module on
    ``sys.path`` (an installed package's tests, say) can stand in for it."""
    spec = importlib.util.spec_from_file_location(f'_benchmark_reference_{path.stem}', path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(description=__doc__.split('\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument('--model', nargs='+', metavar='NAME', help='benchmark these contenders one by one')
    what.add_argument('--compare', nargs=2, action='append', metavar=('A', 'B'),
                      help='paired comparison of A against B (repeatable)')
    p.add_argument('--bench', choices=('inference', 'train', 'both'), default='inference')
    p.add_argument('--batch-size', '-b', type=int, default=32)
    p.add_argument('--img-size', type=int, default=None, help='input size (default: the model\'s default cfg)')
    p.add_argument('--num-classes', type=int, default=None, help="classifier outputs (default: the model's)")
    p.add_argument('--model-kwargs', nargs='*', default={}, action=ParseKwargs,
                   help='image-model arguments k=v (python literals), e.g. embed_dim=32 depths="(1,1,2,1)"')
    layer = p.add_argument_group('sequence layers (bigs_layer, ref:bigs_layer, bert_layer)')
    for flag, default, what in (
            ('--seq-len', 128, 'tokens per sequence'), ('--dim', 1024, 'model width d (both layers)'),
            ('--hidden-dim', 3072, 'BiGS intermediate width d_i'), ('--num-states', 64, 'BiGS SSM states N'),
            ('--heads', 16, 'BERT attention heads'), ('--ffn-dim', 4096, 'BERT feed-forward width')):
        layer.add_argument(flag, type=int, default=default, help=what)
    layer.add_argument('--bigs-conv-impl', default='auto', choices=BidirectionalGatedSSM.CONV_IMPLS,
                       help="bigs_layer's SSM convolution route (BidirectionalGatedSSM.conv_impl)")
    p.add_argument('--device', default='cpu')
    add_threads_argument(p)
    p.add_argument('--precision', choices=PRECISIONS, default='fp32',
                   help='fp32; bf16/fp16 = model and input cast; amp_* = torch.autocast')
    p.add_argument('--channels-last', action='store_true')
    p.add_argument('--compile', action='store_true', help='torch.compile each contender')
    p.add_argument('--compile-mode', default=None, choices=COMPILE_MODES)
    p.add_argument('--warmup', type=int, default=2, help='untimed steps per contender before timing')
    p.add_argument('--iters', type=int, default=0,
                   help='steps per timed sample (0: enough for --min-sample-time, from the warm-up)')
    p.add_argument('--min-sample-time', type=float, default=1.0, help='seconds per timed sample when --iters 0')
    p.add_argument('--samples', type=int, default=8, help='timed samples per contender, or timed pairs')
    p.add_argument('--profile', action='store_true',
                   help='top ops by self time of one step of each contender (torch.profiler); PREFIX_profile.txt')
    p.add_argument('--no-flops', action='store_true', help='skip the fvcore MAC count')
    p.add_argument('--no-memory', action='store_true', help='skip the peak-memory probe')
    p.add_argument('--no-ceiling', action='store_true', help='skip the matmul-ceiling measurement')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--out', default=None, help='write PREFIX.csv / .json / .md (directories are created)')
    p.add_argument('--title', default=None, help='heading of the markdown file')
    return p


def parse_args(argv=None, reference_dir: Optional[os.PathLike] = None) -> argparse.Namespace:
    """The flags of ``argv``, each value checked (contenders, ranges, device, ``--out``) before any model is built;
    ``reference_dir``: the checkout's folder of reference models (``args.reference_dir``, '' for none)."""
    p = build_parser()
    args = p.parse_args(argv)
    args.reference_dir = str(reference_dir or '')
    specs = list(args.model or []) + [s for pair in (args.compare or []) for s in pair]
    unknown = [s for s in specs if s == 'ref:bert_layer'  # names only (a local-dir: config read): nothing built
               or not (is_layer(s) or timm.is_model(base_name(s)) or is_local_dir(base_name(s)))]
    if unknown:
        p.error(f'unknown model(s) {unknown}: expected timm model names (ours: {", ".join(mlp_vision.VISION_MODELS)}), '
                f'local-dir:FOLDER, ref:NAME, fused:NAME, bigs_layer, ref:bigs_layer or bert_layer')
    refs = [s for s in specs if s.startswith('ref:')]
    if refs and not args.reference_dir:
        p.error(f"{refs[0]}: ref: contenders are the tests' reference models; run the checkout's benchmark.py")
    missing = sorted({str(f) for f in (_reference_path(s, args.reference_dir) for s in refs) if not f.is_file()})
    if missing:
        p.error(f'ref: contenders need the straightforward reference models; not found: {", ".join(missing)}')
    layers = [is_layer(s) for s in specs]
    if any(layers) and not all(layers):
        p.error('sequence layers (tokens/s) and image models (images/s) cannot be mixed in one run')
    if args.bench != 'inference' and any(s.startswith('fused:') for s in specs):
        p.error('fused: contenders are reparameterized for inference (eval-time fusions); use --bench inference')
    if any(layers) and (args.channels_last or args.model_kwargs):
        p.error(f'{"--channels-last" if args.channels_last else "--model-kwargs"} applies to image models only; '
                f'sequence layers take (batch, seq-len, dim) inputs')
    check_flag_ranges(args, FLAG_RANGES)
    parse_device(args.device)
    for path in [f'{args.out}{ext}' for ext in ('.csv', '.json', '.md', '_profile.txt')] if args.out else []:
        if output_kind(path) in ('regular', 'folder', 'socket'):  # checked before minutes of timing, not after
            raise UsageError(f'--out {args.out}: {path} exists (earlier results are never replaced); give another '
                             f'prefix')
    return args


def progress(line: str) -> None:
    """A progress line on stdout (stderr holds only notes and an error's one line)."""
    print(f'[{time.monotonic() - _START:5.0f} s] {line}', flush=True)


def _create(name: str, args: argparse.Namespace) -> nn.Module:
    """An image model through the commands' create path (size bounds, a ``local-dir:`` folder's weights checked)."""
    kwargs = model_create_kwargs(num_classes=args.num_classes, img_size=args.img_size, model_kwargs=args.model_kwargs)
    pretrained = name.startswith('local-dir:')
    try:
        return create_model(name, pretrained=pretrained, **kwargs)
    except UsageError as e:  # a fully convolutional peer (ConvNeXt) takes no img_size: it runs at any input size
        if not (isinstance(e.__cause__, TypeError) and 'img_size' in str(e.__cause__)):
            raise
    kwargs.pop('img_size')
    return create_model(name, pretrained=pretrained, **kwargs)


def _create_layer(name: str, args: argparse.Namespace) -> nn.Module:
    if name == 'bigs_layer':
        return BidirectionalGatedSSM(args.dim, args.hidden_dim, num_states=args.num_states,
                                     conv_impl=args.bigs_conv_impl)
    from mlp_vision.text.bert import BertLayer  # here: mlp_vision.text needs transformers (the text extra)
    return BertLayer(args.dim, num_heads=args.heads, ffn_dim=args.ffn_dim)


def build(spec: str, args: argparse.Namespace, twin_of: Optional[nn.Module] = None) -> nn.Module:
    """A contender in fp32 on CPU (moved / cast later). ``ref:NAME`` / ``fused:NAME`` take ``twin_of``'s weights."""
    create = functools.partial(_create_layer if is_layer(spec) else _create, base_name(spec), args)
    if spec.startswith('ref:'):
        ours = twin_of if twin_of is not None else create()
        reference = _load_reference(_reference_path(spec, args.reference_dir))
        return reference.reference_bigs_layer_from(ours) if is_layer(spec) else reference.reference_from(ours)
    model = create()
    if spec.startswith('fused:'):
        if twin_of is not None:
            model.load_state_dict(twin_of.state_dict())  # the same model and weights, before the fusions
        model = timm.utils.reparameterize_model(model.eval(), inplace=True)
    return model


def error_summary(e: BaseException, limit: int = NOTE_CHARS) -> str:
    """``'Type: message'`` on one line (PyTorch's ``load_state_dict`` puts the keys on the lines after its first);
    beyond ``limit`` characters it ends at the last whole word that fits and says how much was left out."""
    text = ' '.join(f'{type(e).__name__}: {e}'.split()).removesuffix(':')
    cut = text[:limit].rsplit(' ', 1)[0] if len(text) > limit else text
    return cut if cut == text else f'{cut} ... ({len(text) - len(cut)} more characters)'


def share_weights(a: nn.Module, a_spec: str, b: nn.Module, b_spec: str) -> Tuple[str, bool]:
    """Give A the weights of B (through A's checkpoint filter, which checks them) when they are one architecture;
    returns (how, for the record; whether the two now compute the same function). Two different architectures
    (``--compare smlpnet_t convnext_tiny``, ``bigs_layer bert_layer``) keep their own weights: speed only."""
    if a_spec.startswith(TWIN_PREFIXES) or b_spec.startswith(TWIN_PREFIXES):
        return 'built from the other', True
    filter_fn = getattr(sys.modules[type(a).__module__], 'checkpoint_filter_fn', None)  # A's model file's
    try:
        sd = b.state_dict()
        a.load_state_dict(filter_fn(sd, a) if filter_fn is not None else sd)
    except (RuntimeError, KeyError, ValueError, IndexError, AttributeError, TypeError) as e:
        # the error is quoted only for one architecture, where a converter that breaks would otherwise pass as speed
        archs = [(type(m).__qualname__, (getattr(m, 'pretrained_cfg', None) or {}).get('architecture')) for m in (a, b)]
        why = 'are different architectures' if archs[0] != archs[1] else f'do not share weights ({error_summary(e)})'
        print(f'note: {a_spec} and {b_spec} {why}: weights not shared, speed only (no output comparison)',
              file=sys.stderr)
        return 'none (different architectures: speed only)', False
    return f'{b_spec} -> {a_spec}', True


def input_size(spec: str, model: nn.Module, args: argparse.Namespace) -> Tuple[int, ...]:
    """Per-sample input shape: (C, H, W) (a ``ref:`` model's from its twin's cfg), or (seq-len, dim) for a layer."""
    if is_layer(spec):
        return args.seq_len, args.dim
    if args.img_size is not None:
        return 3, args.img_size, args.img_size
    cfg = getattr(model, 'pretrained_cfg', None) or timm.models.get_pretrained_cfg(base_name(spec)).to_dict()
    return tuple(cfg.get('input_size', (3, 224, 224)))


def sync(device: Union[str, torch.device]) -> None:
    if torch.device(device).type == 'cuda':
        torch.cuda.synchronize(device)


def seconds_per_call(fn: Callable[[], Any], calls: int, device: Union[str, torch.device],
                     clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds per call over ``calls`` consecutive calls of ``fn`` by ``clock``, the device synchronised before and
    after."""
    sync(device)
    t0 = clock()
    for _ in range(calls):
        fn()
    sync(device)
    return (clock() - t0) / calls


def make_step(model: nn.Module, mode: str, args: argparse.Namespace, in_size: Tuple[int, ...]) -> Callable[[], None]:
    """One inference or training step (SGD) of ``model`` on a fixed random batch, with the run's device, precision,
    memory format and ``--compile``."""
    device = torch.device(args.device)
    dtype, amp_dtype = PRECISIONS[args.precision]
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(device=device, dtype=dtype, memory_format=memory_format).train(mode == 'train')
    fn = torch.compile(model, mode=args.compile_mode) if args.compile else model
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn((args.batch_size, *in_size), generator=g).to(device, dtype).contiguous(memory_format=memory_format)
    classes = args.num_classes or getattr(model, 'num_classes', 0) or 1
    target = torch.randint(0, classes, (args.batch_size,), generator=g).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9) if mode == 'train' else None

    def step() -> None:
        with torch.inference_mode(optimizer is None), \
                torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            out = fn(x)
        if optimizer is not None:
            loss = F.cross_entropy(out.float(), target) if out.ndim == 2 else out.float().mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return step


def saved_activation_bytes(model: nn.Module, *inputs: torch.Tensor, autocast_dtype: Optional[torch.dtype] = None,
                           **kwargs) -> int:
    """Bytes of the distinct storages autograd saves for the backward pass of ``model(*inputs, **kwargs)`` (one
    forward, autocast to ``autocast_dtype`` when given), the parameters and their casts left out: the activation
    memory a training step keeps, what grows with the batch and sequence."""
    shapes = {s for p in model.parameters() for s in (tuple(p.shape), tuple(p.shape[::-1]))}
    kept = {}

    def pack(t):
        if tuple(t.shape) not in shapes:  # batch x length never equals a weight's shape at the sizes measured
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    device_type = next(t for t in (*inputs, *kwargs.values()) if isinstance(t, torch.Tensor)).device.type
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        model(*inputs, **kwargs)
    return sum(kept.values())


def profile_call(step: Callable[[], Any], device: torch.device, label: str, rows: int = 15) -> str:
    """Top operators of one call of ``step`` (after one untimed call) by self time, GPU time on CUDA: a markdown
    section headed by ``label``, also printed."""
    step()
    with torch.profiler.profile() as prof:  # CPU, and CUDA where there is one
        step()
        sync(device)
    sort = 'self_cuda_time_total' if device.type == 'cuda' else 'self_cpu_time_total'
    section = f'## {label}\n\n{prof.key_averages().table(sort_by=sort, row_limit=rows, max_name_column_width=36)}\n'
    print(section, flush=True)
    return section


def matmul_ceiling(device: torch.device, precision: str) -> Dict[str, Any]:
    """The measured GEMM rate in the compute dtype (best of 5 rounds), the denominator of "% of mm":
    ``matmul_gflops``, ``torch.mm`` of two n x n matrices (n = 2048 on CPU, 8192 on CUDA)."""
    n = 2048 if device.type == 'cpu' else 8192
    dtype = PRECISIONS[precision][1] or PRECISIONS[precision][0]
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    reps = 3 if device.type == 'cpu' else 20
    torch.mm(a, b)
    seconds = min(seconds_per_call(lambda: torch.mm(a, b), reps, device) for _ in range(5))
    return dict(matmul_n=n, matmul_dtype=str(dtype).replace('torch.', ''), matmul_gflops=2 * n ** 3 / seconds / 1e9)


def peak_memory(spec: str, mode: str, args: argparse.Namespace) -> Dict[str, float]:
    """:func:`probe_memory` in a fresh child process (nothing else resident); ``{}`` with a note when it fails."""
    progress(f'{spec}, {mode}: peak memory (a child process runs two steps)')
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context('spawn')) as child:
        try:  # with the thread count this run chose, not the child's default
            return child.submit(probe_memory, spec, mode, args, torch.get_num_threads()).result()
        except Exception as e:  # the child's own error, or its death (e.g. killed for memory)
            print(f'note: memory probe failed for {spec} ({error_summary(e)})', file=sys.stderr)
    return {}


def probe_memory(spec: str, mode: str, args: argparse.Namespace, threads: int) -> Dict[str, float]:
    """Peak memory of the second of two steps of ``spec``: CUDA's ``max_memory_allocated``; on the CPU (no allocator
    statistics) the peak resident set size beyond what the first step left in use (an upper bound), and the
    process's peak."""
    set_threads(threads)
    model = build(spec, args)
    step, device = make_step(model, mode, args, input_size(spec, model, args)), torch.device(args.device)
    step()  # allocator pools, optimizer state, lazy init
    sync(device)
    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    else:  # the resident set size now (ru_maxrss below, the peak, is in KiB on Linux)
        base = int(Path('/proc/self/statm').read_text().split()[1]) * os.sysconf('SC_PAGE_SIZE')
    step()
    sync(device)
    peak = (torch.cuda.max_memory_allocated(device) if device.type == 'cuda'
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return {'peak_mem_mb': peak / 2 ** 20, 'step_mem_mb': max(peak - base, 0) / 2 ** 20}


def _build_contenders(specs: Sequence[str], args) -> Tuple[List[nn.Module], Tuple[int, ...], Dict[str, Any]]:
    """The contender(s) and their input size; a pair (A, B) also gets one set of weights where it can
    (:func:`share_weights`) and the record of it: how, and max |A - B| beside max |B| of the pre-head features (a
    sequence layer's output) on two samples, eval, fp32, when they are one function."""
    if len(specs) == 1:
        model = build(specs[0], args)
        return [model], input_size(specs[0], model, args), {}
    a_spec, b_spec = specs
    torch.manual_seed(args.seed)
    if a_spec.startswith(TWIN_PREFIXES):  # built from B (same weights)
        b = build(b_spec, args)
        a = build(a_spec, args, twin_of=b)
    else:
        a = build(a_spec, args)
        b = build(b_spec, args, twin_of=a)
    how, same_function = share_weights(a, a_spec, b, b_spec)
    in_size, b_size = input_size(a_spec, a, args), input_size(b_spec, b, args)
    if b_size != in_size:
        raise UsageError(f'{a_spec} takes {in_size} inputs and {b_spec} {b_size}: pass --img-size to compare them '
                         f'at one size')
    diff = scale = None
    if same_function:
        x = torch.randn((2, *in_size), generator=torch.Generator().manual_seed(args.seed + 1))
        with torch.no_grad():  # timm's heads start at zero: the features before them
            ya, yb = (m.eval()(x) if len(in_size) == 2 else m.eval().forward_features(x) for m in (a, b))
        diff, scale = float((ya - yb).abs().max()), float(yb.abs().max())
    return [a, b], in_size, dict(max_abs_diff=diff, max_abs_out=scale, weights=how)


def run_contenders(specs: Sequence[str], args, env, macs_cache, profiles: List[str]) -> List[Dict[str, Any]]:
    """A row per mode: one contender timed alone, or a pair timed alternately (A B, B A, ...: a slow drift does not
    favour whoever runs first) with the median and quartiles of the ratios t_B / t_A. Each contender's columns
    (``base_`` for B): median step time, throughput, MACs per sample, GFLOP/s and % of the ceilings."""
    rows = []
    pair = len(specs) == 2
    sides = list(zip(('', 'base_'), ('A ', 'B ') if pair else ('',), specs))  # (column prefix, label, spec)
    for mode in ['inference', 'train'] if args.bench == 'both' else [args.bench]:
        title = f'{" vs ".join(specs)}, {mode}'
        progress(f'{title}: building both' if pair else f'{title}: building')
        models, in_size, record = _build_contenders(specs, args)
        for k, spec in enumerate(specs if not args.no_flops else []):  # once per contender and input size
            if (spec, in_size) not in macs_cache:  # per sample, the project's rules; BiGS's route as it runs here
                from mlp_vision.complexity import count_module
                progress(f'{spec}: counting MACs (fvcore)')
                x = torch.randn(1, *in_size)
                macs_cache[spec, in_size] = count_module(models[k].eval(), (x,), bigs_conv_impl=None)[0]
        steps = [make_step(m, mode, args, in_size) for m in models]
        device = torch.device(args.device)
        warm: List[List[float]] = [[] for _ in steps]  # untimed steps; with --compile the first compiles the graph
        for k, (_, who, spec) in enumerate(sides):  # indexed: no name outlives ``del steps`` below
            for i in range(max(args.warmup, 1)):
                progress(f'{who}{spec}, {mode}: warm-up step {i + 1}/{max(args.warmup, 1)}'
                         + (' (compiles the model first)' if i == 0 and args.compile else '')
                         + (f', the last took {warm[k][-1]:.2f} s' if warm[k] else ''))
                warm[k].append(seconds_per_call(steps[k], 1, device))
        # size the samples from the slowest contender so each sample has >= --min-sample-time
        iters = args.iters or max(1, math.ceil(args.min_sample_time / max(max(min(t) for t in warm), 1e-9)))
        load_start = os.getloadavg()[0]
        times: List[List[float]] = [[] for _ in steps]
        for i in range(args.samples):
            for k in (range(len(steps)) if i % 2 == 0 else reversed(range(len(steps)))):
                times[k].append(seconds_per_call(steps[k], iters, device))
            ms = ', '.join(f'{who}{t[-1] * 1e3:.1f}' for (_, who, _), t in zip(sides, times))
            progress(f'{title}: {"pair" if pair else "sample"} {i + 1}/{args.samples} ({iters} steps'
                     f'{" each" if pair else ""}): {ms} ms/step')
        for k, spec in enumerate(specs if args.profile else []):
            label = f'{spec}, {mode}, batch {args.batch_size}, {torch.get_num_threads()} threads'
            profiles.append(profile_call(steps[k], device, label))
        is_seq = len(in_size) == 2  # a sequence layer
        shape = (dict(seq_len=in_size[0], dim=in_size[1]) if is_seq else
                 dict(img_size=in_size[-1] if in_size[-1] == in_size[-2] else f'{in_size[-2]}x{in_size[-1]}'))
        row = dict(model=specs[0], **({'baseline': specs[1]} if pair else {}), mode=mode, batch_size=args.batch_size,
                   **shape, precision=args.precision, channels_last=args.channels_last, compile=args.compile,
                   device=args.device, threads=torch.get_num_threads())
        if pair:
            ratios = [t_b / t_a for t_a, t_b in zip(*times)]
            q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
            row.update(speedup=statistics.median(ratios), speedup_q1=q[0], speedup_q3=q[2], speedup_min=min(ratios),
                       speedup_max=max(ratios), pairs=len(ratios))
        else:
            row.update(step_ms_min=1e3 * min(times[0]), samples=len(times[0]))
        row['iters'] = iters
        per_step = args.batch_size * (in_size[0] if is_seq else 1)  # images, or tokens (batch x seq-len)
        unit = 'tok' if is_seq else 'img'
        for (prefix, _, spec), spec_warm, spec_times in zip(sides, warm, times):
            step_s, macs = statistics.median(spec_times), macs_cache.get((spec, in_size))
            row[f'{prefix}step_ms'] = 1e3 * step_s
            row[f'{prefix}{unit}_per_s'] = per_step / step_s
            if macs is not None:  # a training step is forward + backward ~ 3x the forward flops
                gflops = 2 * macs * args.batch_size * (3 if mode == 'train' else 1) / step_s / 1e9
                row.update({f'{prefix}gmacs_per_{"seq" if is_seq else "img"}': macs / 1e9, f'{prefix}gflops': gflops})
                if 'matmul_gflops' in env:
                    row[f'{prefix}pct_of_matmul'] = 100 * gflops / env['matmul_gflops']
            if args.compile:
                row[f'{prefix}compile_s'] = spec_warm[0]  # the compile of this mode's graph, plus a step
        row.update(record, **(dict(load_start=load_start, load_end=os.getloadavg()[0]) if pair else {}))
        del steps, models
        for prefix, _, spec in sides if not args.no_memory else []:  # each in a child, this one's contenders freed
            row.update({prefix + k: v for k, v in peak_memory(spec, mode, args).items()})
        rows.append(row)
        diff = 'n/a' if row.get('max_abs_diff') is None else f"{row['max_abs_diff']:.2e}"
        print(f"{mode:9s} {' vs '.join(specs)}: " + (f'{speed_sentence(row)}, max|diff| {diff}' if pair else
              f"{rate_text(row[unit + '_per_s'])} {unit}/s ({row['step_ms']:.1f} ms/step)"), flush=True)
    return rows


def rate_text(rate: float) -> str:
    """A throughput with at least 3 significant digits (0.352, 41.7, 1234)."""
    return f'{rate:.0f}' if rate >= 100 else f'{rate:.3g}'


def speed_sentence(r: Dict[str, Any]) -> str:
    """A paired row in words, the faster contender first, then the throughputs in that order; when the medians of
    each point the other way than the paired ratio (load changed while timing), the line says so."""
    unit = 'tok' if 'tok_per_s' in r else 'img'
    ratio, names, rates = r['speedup'], (r['model'], r['baseline']), (r[f'{unit}_per_s'], r[f'base_{unit}_per_s'])
    quartiles = r['speedup_q1'], r['speedup_q3']
    if ratio < 1:
        names, rates, ratio, quartiles = names[::-1], rates[::-1], 1 / ratio, (1 / quartiles[1], 1 / quartiles[0])
    text = (f'{names[0]} is {ratio:.3f}x faster than {names[1]} (median of {r["pairs"]} paired ratios, q1-q3 '
            f'{quartiles[0]:.3f}-{quartiles[1]:.3f}); {rate_text(rates[0])} vs {rate_text(rates[1])} {unit}/s '
            f'(median of each)')
    if ratio != 1 and rates[0] < rates[1]:
        text += ('; the medians of each disagree with the paired ratio (the machine\'s load changed while timing: '
                 'the ratio of back-to-back pairs is the steadier; more --samples settle it)')
    return text


def environment(args, command: str) -> Dict[str, Any]:
    """Where and how the run was made: date, machine, device, threads, versions, the command."""
    cpuinfo = Path('/proc/cpuinfo').read_text().splitlines() if os.path.exists('/proc/cpuinfo') else []
    cpu = next((ln.split(':', 1)[1].strip() for ln in cpuinfo if ln.startswith('model name')),
               platform.processor() or platform.machine())  # the processor's name on Linux
    return dict(
        date_utc=datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
        host=platform.node(), cpu=cpu, logical_cpus=os.cpu_count(), device=args.device,
        device_name=torch.cuda.get_device_name(args.device) if args.device.startswith('cuda') else cpu,
        cpu_capability=torch.backends.cpu.get_cpu_capability(),  # AVX2 / AVX512 kernels
        threads=torch.get_num_threads(), interop_threads=torch.get_num_interop_threads(),
        torch=torch.__version__, timm=timm.__version__, mlp_vision=mlp_vision.__version__,
        python=platform.python_version(), load_avg_start=os.getloadavg(), command=command)


# markdown columns (key, heading, format); a pair's contender columns come as A and B side by side
_MD_CONTENDER = [
    ('img_per_s', 'img/s', rate_text), ('tok_per_s', 'tok/s', rate_text), ('step_ms', 'ms/step', '{:.1f}'),
    ('gmacs_per_img', 'GMACs/img', '{:.2f}'), ('gmacs_per_seq', 'GMACs/seq', '{:.2f}'), ('gflops', 'GFLOP/s', '{:.0f}'),
    ('pct_of_matmul', '% of mm', '{:.0f} %'), ('step_mem_mb', 'step mem MB', '{:.0f}'),
    ('peak_mem_mb', 'peak MB', '{:.0f}')]
_MD_PAIR = [('speedup', 'speed-up of A over B (t_B / t_A, median of pairs; < 1: A is slower)', '**{:.2f}×**'),
            ('speedup_q1', 'q1', '{:.2f}'), ('speedup_q3', 'q3', '{:.2f}'), ('pairs', 'pairs', '{}')]


def ceiling_text(env: Dict[str, Any]) -> str:
    """The measured matmul ceiling (:func:`matmul_ceiling`), for the progress line and the markdown."""
    return (f"matmul ceiling: torch.mm {env['matmul_n']}² {env['matmul_dtype']} {rate_text(env['matmul_gflops'])} "
            f"GFLOP/s")


def run_line(env: Dict[str, Any], args) -> str:
    """The run's setting on one line: the markdown's and profile file's header."""
    prec = args.precision + (', channels_last' if args.channels_last else '') + (', compile' if args.compile else '')
    cpu = f" ({env['cpu_capability']})" if env['device'] == 'cpu' else ''
    return (f"{env['date_utc']} · {env['device_name']}{cpu} · {env['threads']} threads · {prec} · torch "
            f"{env['torch']} · timm {env['timm']}" + (f' · {ceiling_text(env)}' if 'matmul_gflops' in env else '')
            + f" · load avg {env['load_avg_start'][0]:.2f} → {env['load_avg_end'][0]:.2f}")


def markdown(rows: List[Dict[str, Any]], env: Dict[str, Any], args) -> str:
    pair = 'baseline' in rows[0]
    contender = [(prefix + key, who + head, fmt) for key, head, fmt in _MD_CONTENDER
                 for prefix, who in ((('', 'A '), ('base_', 'B ')) if pair else (('', ''),))]
    cols = [('mode', 'mode', '{}'), ('model', 'A' if pair else 'model', '`{}`'), ('baseline', 'B', '`{}`'),
            ('batch_size', 'batch', '{}'), ('img_size', 'img', '{}'), ('seq_len', 'tokens', '{}'), ('dim', 'd', '{}'),
            *contender[:4], *_MD_PAIR, *contender[4:], ('max_abs_diff', 'max abs diff (out)', '{:.1e}'),
            ('load_start', 'load', '{:.1f}')]
    cols = [c for c in cols if any(c[0] in r for r in rows)]
    lines = [f"# {args.title or 'Benchmark'}", '', run_line(env, args), '', f"`{env['command']}`", '',
             '| ' + ' | '.join(c[1] for c in cols) + ' |', '|' + '---|' * len(cols)]
    for r in rows:
        cells = ['–' if r.get(key) is None else fmt(r[key]) if callable(fmt) else fmt.format(r[key])
                 for key, _, fmt in cols]
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines) + '\n'


def main(argv=None, prog: str = 'benchmark.py', reference_dir: Optional[os.PathLike] = None) -> None:
    """Benchmark; ``reference_dir``: the checkout's reference models (``ref:`` contenders), from its benchmark.py."""
    run_cli(prog, lambda a: _main(a, prog, reference_dir), argv)


def _main(argv, prog: str, reference_dir: Optional[os.PathLike]) -> None:
    args = parse_args(argv, reference_dir)
    progress(set_threads(args.threads))
    # as typed: python benchmark.py ... in a checkout, mlp-vision-benchmark ... / python -m mlp_vision.benchmark ...
    env = environment(args, ('python ' if prog.endswith('.py') else '') + ' '.join([prog, shlex.join(argv)]))
    if not args.no_ceiling:
        progress('matmul ceiling: timing torch.mm (--no-ceiling skips it)')
        env.update(matmul_ceiling(torch.device(args.device), args.precision))
        print(f"{ceiling_text(env)} ({env['threads']} threads)", flush=True)
    macs_cache: Dict[Any, float] = {}
    profiles: List[str] = []
    rows = [row for specs in args.compare or [[spec] for spec in args.model]
            for row in run_contenders(specs, args, env, macs_cache, profiles)]
    env['load_avg_end'] = os.getloadavg()
    if not args.out:
        print(markdown(rows, env, args))
        return
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    table = io.StringIO()
    w = csv.DictWriter(table, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))  # every row's, in order
    w.writeheader()
    w.writerows(rows)
    write_output_file(args.out + '.csv', table.getvalue())
    write_output_file(args.out + '.json', json.dumps({'environment': env, 'results': rows}, indent=2))
    write_output_file(args.out + '.md', markdown(rows, env, args))
    print(f'wrote {args.out}.csv / .json / .md')
    if profiles:
        header = f"# torch.profiler, top ops by self time · {run_line(env, args)}\n# {env['command']}\n\n"
        write_output_file(args.out + '_profile.txt', header + '\n'.join(profiles))
        print(f'wrote {args.out}_profile.txt')


if __name__ == '__main__':
    main(prog='python -m mlp_vision.benchmark')
