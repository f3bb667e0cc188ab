""" Inference / training-step throughput of timm models (ours and any registered one), alone or in pairs.

Run as ``mlp-vision-benchmark`` / ``python -m mlp_vision.benchmark``, or ``python benchmark.py`` in a checkout.
As timm's ``benchmark.py``: throughput, step time, peak memory and achieved GFLOP/s against this machine's measured
matrix-multiply rate, on CPU or CUDA, in fp32 / bf16 / fp16 (cast or autocast), optionally channels_last and
``torch.compile``.

Paired comparisons (``--compare A B``) build both contenders in one process, give them the same weights, check
that they compute the same outputs, then time them alternately (A B, B A, ...) and report the median of the
per-pair ratios t_B / t_A (the speed-up of A over B): load from other processes changes both members of a pair
about equally, so the ratio is much steadier than either throughput on a shared machine.

Contenders:
    NAME             any timm-registered model (``import mlp_vision`` registers ours), or ``local-dir:FOLDER``
                     (a training run's pretrained/ folder).
    ref:NAME         the straightforward sMLPNet (the checkout's reference ``tests/reference/smlpnet.py``) built as
                     the twin of our ``NAME`` (same config, our weights); only from the checkout's ``benchmark.py``,
                     which hands this command the folder of reference models.
    bigs_layer       one BiGS layer (``BidirectionalGatedSSM``: d ``--dim``, d_i ``--hidden-dim``, N
                     ``--num-states``; default BiGS-large 1024 / 3072 / 64) on (batch, ``--seq-len``, d) inputs;
                     ``ref:bigs_layer`` is the checkout's reference ``bigs.py`` with the same weights.
    fused:NAME       ``NAME`` with the same weights after ``timm.utils.reparameterize_model`` (eval-time fusions
                     such as sMLPNet's BatchNorm folded into its depthwise conv; a model without any is unchanged);
                     inference only.
    bert_layer       the BERT layer BiGS replaces, with SDPA attention (``mlp_vision.text.bert.BertLayer``: d
                     ``--dim``, ``--heads``, FFN ``--ffn-dim``; default BERT-large 1024 / 16 / 4096).
Layer contenders report tokens/s (batch x seq-len per step) instead of images/s. In a pair, B's weights are loaded
into A through A's ``checkpoint_filter_fn`` (``--compare gmlp_s gmlp_s16_224`` runs ours with timm's weights); a
``ref:`` or ``fused:`` contender is built from the other one.

Results: ``--out PREFIX`` (PREFIX.csv / .json / .md), else a markdown table on stdout. Example commands: README.
"""
import argparse
import csv
import datetime
import functools
import importlib.util
import io
import json
import math
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
import timm

import mlp_vision
from mlp_vision.layers import BidirectionalGatedSSM
from mlp_vision.outputs import output_kind, write_output_file
from mlp_vision.arguments import SEED_MAX, check_flag_ranges
from mlp_vision.threads import THREADS_RANGE, add_threads_argument, set_threads
from mlp_vision.arguments import ArgumentParser, parse_device
from mlp_vision.errors import UsageError, run_cli
from mlp_vision.training.image_model import COMPILE_MODES, is_local_dir

PRECISIONS = {  # --precision: (parameter / input dtype, autocast dtype or None)
    'fp32': (torch.float32, None), 'bf16': (torch.bfloat16, None), 'fp16': (torch.float16, None),
    'amp_bf16': (torch.float32, torch.bfloat16), 'amp_fp16': (torch.float32, torch.float16),
}
LAYERS = ('bigs_layer', 'bert_layer')  # sequence-layer contenders (tokens/s)
FUSED_PREFIX = 'fused:'

# The folder of the checkout's reference models (the ``ref:`` contenders), given by the checkout's benchmark.py
# (``main(reference_dir=...)``): the package never looks for the tests' files itself.
REFERENCE_DIR: Optional[Path] = None


def base_name(spec: str) -> str:
    """The contender's model / layer name without the ``ref:`` (straightforward twin) or ``fused:`` prefix."""
    return spec.split(':', 1)[1] if spec.startswith(('ref:', FUSED_PREFIX)) else spec


def is_layer(spec: str) -> bool:
    return base_name(spec) in LAYERS


def _reference_path(spec: str) -> Path:
    """The file holding the straightforward twin of a ``ref:`` contender."""
    return REFERENCE_DIR / ('bigs.py' if is_layer(spec) else 'smlpnet.py')


@functools.lru_cache(maxsize=None)
def _load_reference(path: Path) -> ModuleType:
    """Import the reference model file ``path`` of the checkout by its path, so that no other module named ``tests``
    or ``reference`` on ``sys.path`` (an installed package's test folder, say) can stand in for it."""
    spec = importlib.util.spec_from_file_location(f'_benchmark_reference_{path.stem}', path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# the range of each numeric flag (check_range's bounds)
FLAG_RANGES = {k: dict(low=1) for k in ('seq_len', 'dim', 'hidden_dim', 'num_states', 'heads', 'ffn_dim', 'batch_size',
                                          'img_size', 'samples')}
FLAG_RANGES.update(num_classes=dict(low=0), warmup=dict(low=0), iters=dict(low=0),
                   min_sample_time=dict(low=0, low_open=True), seed=dict(low=0, high=SEED_MAX), threads=THREADS_RANGE)


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(description=__doc__.split('\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument('--model', nargs='+', metavar='NAME', help='benchmark these contenders one by one')
    what.add_argument('--compare', nargs=2, action='append', metavar=('A', 'B'),
                      help='paired comparison of A against B (repeatable)')
    p.add_argument('--bench', choices=('inference', 'train', 'both'), default='inference')
    p.add_argument('--batch-size', '-b', type=int, default=32)
    p.add_argument('--img-size', type=int, default=None, help='input size (default: the model\'s default cfg)')
    p.add_argument('--num-classes', type=int, default=1000)
    layer = p.add_argument_group('sequence layers (bigs_layer, ref:bigs_layer, bert_layer)')
    layer.add_argument('--seq-len', type=int, default=128, help='tokens per sequence')
    layer.add_argument('--dim', type=int, default=1024, help='model width d (both layers)')
    layer.add_argument('--hidden-dim', type=int, default=3072, help='BiGS intermediate width d_i')
    layer.add_argument('--num-states', type=int, default=64, help='BiGS SSM states N')
    layer.add_argument('--bigs-conv-impl', default='auto', choices=BidirectionalGatedSSM.CONV_IMPLS,
                       help="bigs_layer's SSM convolution route (BidirectionalGatedSSM.conv_impl; 'triton' is the "
                            "blocked-Toeplitz Triton kernel, meant for CUDA)")
    layer.add_argument('--heads', type=int, default=16, help='BERT attention heads')
    layer.add_argument('--ffn-dim', type=int, default=4096, help='BERT feed-forward width')
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
    p.add_argument('--timer', choices=('wall', 'cpu'), default='wall',
                   help='wall: elapsed time (the throughput a user sees). cpu: this process\'s CPU time, which '
                        'excludes time spent waiting for a core, so it is steady on a loaded machine; meaningful '
                        'with --threads 1 only (with more threads it counts OpenMP spin-waiting)')
    p.add_argument('--samples', type=int, default=8,
                   help='timed samples per contender (single runs) or timed pairs (--compare)')
    p.add_argument('--profile', action='store_true',
                   help='also profile one step of each contender (torch.profiler, top ops by self time); the '
                        'tables go to PREFIX_profile.txt with --out, else to stdout')
    p.add_argument('--no-flops', action='store_true', help='skip the fvcore MAC count')
    p.add_argument('--no-memory', action='store_true', help='skip the peak-memory probe')
    p.add_argument('--no-ceiling', action='store_true', help='skip the matmul-ceiling measurement')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--out', default=None, help='write PREFIX.csv / .json / .md (directories are created)')
    p.add_argument('--title', default=None, help='heading of the markdown file')
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """The flags of ``argv``, each value checked (contenders, ranges, device, ``--out``) before any timing."""
    p = build_parser()
    args = p.parse_args(argv)
    specs = list(args.model or []) + [s for pair in (args.compare or []) for s in pair]
    unknown = [s for s in specs if not (is_layer(s) or timm.is_model(base_name(s)) or is_local_dir(s))
               or s == 'ref:bert_layer']
    if unknown:
        p.error(f'unknown model(s) {unknown}: give timm model names (this package registers '
                f'{", ".join(mlp_vision.VISION_MODELS)}), local-dir:FOLDER for a folder with a timm config.json '
                f'(a training run\'s pretrained/), ref:NAME for the straightforward sMLPNet of NAME, '
                f'or a sequence layer: bigs_layer, ref:bigs_layer, bert_layer')
    refs = [s for s in specs if s.startswith('ref:')]
    if refs and REFERENCE_DIR is None:
        p.error(f'{refs[0]}: ref: contenders are the straightforward reference models kept with the tests of a '
                f'repository checkout; run the checkout\'s benchmark.py (python benchmark.py ...)')
    missing = sorted({str(_reference_path(s)) for s in refs if not _reference_path(s).is_file()})
    if missing:
        p.error(f'ref: contenders need the straightforward reference models of a repository checkout, kept with '
                f'the tests; not found: {", ".join(missing)}')
    if any(is_layer(s) for s in specs) and any(not is_layer(s) for s in specs):
        p.error('sequence layers (tokens/s) and image models (images/s) cannot be mixed in one run')
    if args.bench != 'inference' and any(s.startswith(FUSED_PREFIX) for s in specs):
        p.error('fused: contenders are reparameterized for inference (eval-time fusions); use --bench inference')
    if args.channels_last and any(is_layer(s) for s in specs):
        p.error('--channels-last applies to image models only; sequence layers take (batch, seq-len, dim) inputs')
    check_flag_ranges(args, FLAG_RANGES)
    parse_device(args.device)
    for path in [f'{args.out}{ext}' for ext in ('.csv', '.json', '.md', '_profile.txt')] if args.out else []:
        kind = output_kind(path)  # checked before minutes of timing, not after: earlier results are never replaced
        if kind == 'regular':
            raise UsageError(f'--out {args.out}: {path} exists (an earlier run\'s results); give another prefix')
        if kind in ('folder', 'socket'):
            raise UsageError(f'--out {args.out}: {path} is a {kind}; give another prefix')
    return args


_run_start = time.monotonic()  # progress lines count seconds from here (reset when a run begins)


def progress(line: str) -> None:
    """A progress line on stdout (stderr stays the one line of an error, and the notes), seconds since the run
    began first: every step that can take more than a few seconds says so, so a slow run is never silent."""
    print(f'[{time.monotonic() - _run_start:5.0f} s] {line}', flush=True)


def _create(name: str, args: argparse.Namespace) -> nn.Module:
    kwargs: Dict[str, Any] = dict(num_classes=args.num_classes)
    if args.img_size is not None:
        kwargs['img_size'] = args.img_size
    try:
        return timm.create_model(name, **kwargs)
    except TypeError as e:
        if 'img_size' not in kwargs or 'img_size' not in str(e):
            raise
    except ValueError as e:  # e.g. --img-size 1: the model says which sizes it takes (divisible by its stride)
        raise UsageError(f'{name} cannot be built with {kwargs}: {" ".join(str(e).split())}') from None
    # a fully convolutional peer (ConvNeXt) takes no img_size: it runs at any input size as built
    return timm.create_model(name, num_classes=args.num_classes)


def _create_layer(name: str, args: argparse.Namespace) -> nn.Module:
    if name == 'bigs_layer':
        return BidirectionalGatedSSM(args.dim, args.hidden_dim, num_states=args.num_states,
                                     conv_impl=args.bigs_conv_impl)
    from mlp_vision.text.bert import BertLayer  # here: mlp_vision.text needs transformers (the text extra)
    return BertLayer(args.dim, num_heads=args.heads, ffn_dim=args.ffn_dim)


def build(spec: str, args: argparse.Namespace, twin_of: Optional[nn.Module] = None) -> nn.Module:
    """A contender in fp32 on CPU (moved / cast later). ``ref:NAME`` is built from ``twin_of`` when given."""
    create = _create_layer if is_layer(spec) else _create
    if spec.startswith('ref:'):
        ours = twin_of if twin_of is not None else create(base_name(spec), args)
        reference = _load_reference(_reference_path(spec))
        return reference.reference_bigs_layer_from(ours) if is_layer(spec) else reference.reference_from(ours)
    model = create(base_name(spec), args)
    if spec.startswith(FUSED_PREFIX):
        if twin_of is not None:
            model.load_state_dict(twin_of.state_dict())  # the same model and weights, before the fusions
        model = timm.utils.reparameterize_model(model.eval(), inplace=True)
    return model


def _architecture(model: nn.Module) -> Tuple[str, Optional[str]]:
    """The model's class and timm architecture name (a ``local-dir:`` folder's is in its config.json)."""
    return type(model).__qualname__, (getattr(model, 'pretrained_cfg', None) or {}).get('architecture')


def share_weights(a: nn.Module, a_spec: str, b: nn.Module, b_spec: str) -> Tuple[str, bool]:
    """Give A the weights of B (through A's checkpoint filter) when they are one architecture; returns (how, for
    the record; whether the two now compute the same function). Two different architectures (``--compare
    smlpnet_t convnext_tiny``) keep their own random weights: only their speed is compared."""
    if b_spec.startswith('ref:') or a_spec.startswith('ref:'):
        return 'ref built from the other', True
    if b_spec.startswith(FUSED_PREFIX) or a_spec.startswith(FUSED_PREFIX):
        return 'same model built from the other', True
    if is_layer(a_spec) or is_layer(b_spec):
        return ('same layer' if base_name(a_spec) == base_name(b_spec) else 'none (different layers)',
                base_name(a_spec) == base_name(b_spec))
    module = sys.modules[type(a).__module__]  # the model's own file (a local-dir: folder has no entrypoint name)
    filter_fn = getattr(module, 'checkpoint_filter_fn', None)
    try:
        sd = b.state_dict()
        if filter_fn is not None:
            sd = filter_fn(sd, a)
        a.load_state_dict(sd)
    except (RuntimeError, KeyError, ValueError, IndexError, AttributeError, TypeError) as e:
        # the state dict does not map onto A's (the filters fail in their own ways). Said on stderr; the error is
        # quoted only for one architecture, where a converter that breaks would otherwise pass as speed only
        if _architecture(a) != _architecture(b):
            print(f'note: {a_spec} and {b_spec} are different architectures: weights not shared, speed only (no '
                  f'output comparison)', file=sys.stderr)
        else:
            print(f'note: {b_spec} weights do not load into {a_spec} ({error_summary(e)}): speed only, no output '
                  f'comparison', file=sys.stderr)
        return 'none (different architectures: speed only)', False
    return f'{b_spec} -> {a_spec}', True


NOTE_CHARS = 300  # an error quoted in a note: whole words up to this many characters, then how much was left out


def _bounded(text: str, limit: int = NOTE_CHARS) -> str:
    """``text`` on one line (whitespace runs and newlines as single spaces); beyond ``limit`` characters it ends
    at the last whole word that fits and says how much was left out, so a note is never cut mid-word and never
    reads as complete when it is not."""
    text = ' '.join(text.split())
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(' ', 1)[0]
    return f'{cut} ... ({len(text) - len(cut)} more characters)'


def error_summary(e: BaseException) -> str:
    """``'Type: message'`` of an exception on one bounded line (:func:`_bounded`); a multi-line message (PyTorch's
    ``load_state_dict`` puts the missing / unexpected keys on the lines after its first) keeps its later lines."""
    return _bounded(f'{type(e).__name__}: {e}' if str(e) else type(e).__name__)


def input_size(spec: str, model: nn.Module, args: argparse.Namespace) -> Tuple[int, ...]:
    """Per-sample input shape: (C, H, W) for image models, (seq-len, dim) for sequence layers; by the contender's
    name, as a ``ref:`` model has no pretrained cfg of its own (its size is that of the model it was built from)."""
    if is_layer(spec):
        return args.seq_len, args.dim
    if args.img_size is not None:
        return 3, args.img_size, args.img_size
    cfg = getattr(model, 'pretrained_cfg', None) or timm.models.get_pretrained_cfg(base_name(spec)).to_dict()
    return tuple(cfg.get('input_size', (3, 224, 224)))


def sync(device: Union[str, torch.device]) -> None:
    """Wait for the device's queued work (CUDA); a no-op elsewhere."""
    device = torch.device(device)
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def seconds_per_call(fn: Callable[[], Any], calls: int, device: Union[str, torch.device],
                     clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds per call over ``calls`` consecutive calls of ``fn`` (the device synchronised before and after;
    ``clock``: the wall clock, or ``time.process_time`` for the CPU time of a 1-thread run on a busy machine)."""
    sync(device)
    t0 = clock()
    for _ in range(calls):
        fn()
    sync(device)
    return (clock() - t0) / calls


class Runner:
    """Prepares one contender for one mode and runs steps of it."""

    def __init__(self, model: nn.Module, mode: str, args: argparse.Namespace, in_size: Tuple[int, int, int],
                 label: str = ''):
        self.label = label  # the contender and mode in progress lines; '' (the memory probe's child): none
        self.compiled = args.compile
        self.device = torch.device(args.device)
        self.clock = time.process_time if args.timer == 'cpu' else time.perf_counter
        self.mode = mode
        dtype, self.amp_dtype = PRECISIONS[args.precision]
        memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
        model = model.to(device=self.device, dtype=dtype, memory_format=memory_format)
        model.train(mode == 'train')
        self.fn = torch.compile(model, mode=args.compile_mode) if args.compile else model
        g = torch.Generator().manual_seed(args.seed)
        self.x = torch.randn((args.batch_size,) + tuple(in_size), generator=g).to(
            device=self.device, dtype=dtype).contiguous(memory_format=memory_format)
        self.target = torch.randint(0, max(args.num_classes, 1), (args.batch_size,), generator=g).to(self.device)
        self.optimizer = torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9) if mode == 'train' else None

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None)

    def step(self) -> None:
        if self.mode == 'inference':
            with torch.inference_mode(), self._autocast():
                self.fn(self.x)
        else:
            with self._autocast():
                out = self.fn(self.x)
                loss = F.cross_entropy(out.float(), self.target) if out.ndim == 2 else out.float().mean()
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()

    def timed(self, iters: int) -> float:
        """Seconds per step over ``iters`` consecutive steps."""
        return seconds_per_call(self.step, iters, self.device, self.clock)

    def warmup(self, n: int) -> float:
        """Untimed steps; returns the fastest. The first step's time is kept as ``first_step_s``: with
        ``--compile`` it is the compile time of this mode's graph (plus one step)."""
        times = []
        for i in range(max(n, 1)):
            if self.label:
                progress(f'{self.label}: warm-up step {i + 1}/{max(n, 1)}'
                         + (' (compiles the model first)' if i == 0 and self.compiled else '')
                         + (f', the last took {times[-1]:.2f} s' if times else ''))
            times.append(self.timed(1))
        self.first_step_s = times[0]
        return min(times)


PROFILES: List[str] = []


def saved_activation_bytes(model: nn.Module, *inputs: torch.Tensor, autocast_dtype: Optional[torch.dtype] = None,
                           **kwargs) -> int:
    """Bytes of the distinct storages autograd saves for the backward pass of ``model(*inputs, **kwargs)`` (one
    forward, bf16 / fp16 autocast on the inputs' device when ``autocast_dtype`` is given), the parameters and
    their casts left out: the activation memory a training step keeps, what grows with the batch and sequence."""
    shapes = {tuple(p.shape) for p in model.parameters()} | {tuple(p.shape[::-1]) for p in model.parameters()}
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
    """Top operators of one call of ``step`` (after one untimed call) by self time (torch.profiler): GPU time on
    CUDA (the kernels), CPU time elsewhere; a markdown section headed by ``label``, also printed."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == 'cuda' else [])
    step()
    with profile(activities=activities) as prof:
        step()
        sync(device)
    sort = 'self_cuda_time_total' if device.type == 'cuda' else 'self_cpu_time_total'
    table = prof.key_averages().table(sort_by=sort, row_limit=rows, max_name_column_width=36)
    section = f'## {label}\n\n{table}\n'
    print(section, flush=True)
    return section


def profile_step(runner: 'Runner', spec: str, rows: int = 15) -> None:
    """:func:`profile_call` of one step of ``spec``, kept for the _profile.txt output."""
    label = f'{spec}, {runner.mode}, batch {runner.x.shape[0]}, {torch.get_num_threads()} threads'
    PROFILES.append(profile_call(runner.step, runner.device, label, rows))


def matmul_ceiling(device: torch.device, precision: str, clock: Callable[[], float] = time.perf_counter
                   ) -> Dict[str, Any]:
    """Measured GEMM rates in the compute dtype (best of 5 rounds), the denominators of "% of ceiling".

    ``matmul_gflops``: ``torch.mm`` of two n x n matrices (n = 2048 on CPU, 8192 on CUDA). CPU only:
    ``onednn_gflops``, the same GEMM through oneDNN as a 1x1 convolution on a channels-last (16, 2048, 16, 8) map,
    the route of 1x1 convolutions (sMLPNet's fuse); the higher of the two where MKL's float32 sgemm skips AVX-512
    (AMD). Batch 16: single-threaded PyTorch sends 1x1 convs of smaller batches to its own im2col + MKL path."""
    n = 2048 if device.type == 'cpu' else 8192
    dtype = PRECISIONS[precision][1] or PRECISIONS[precision][0]
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    reps = 3 if device.type == 'cpu' else 20

    def gflops(gemm: Callable[[], Any]) -> float:
        gemm()
        return 2 * n ** 3 / min(seconds_per_call(gemm, reps, device, clock) for _ in range(5)) / 1e9
    out: Dict[str, Any] = {'matmul_n': n, 'matmul_dtype': str(dtype).replace('torch.', '')}
    out['matmul_gflops'] = gflops(lambda: torch.mm(a, b))
    if device.type == 'cpu':
        x = torch.randn(16, n, 16, 8, dtype=dtype).contiguous(memory_format=torch.channels_last)
        w = torch.randn(n, n, 1, 1, dtype=dtype)
        out['onednn_gflops'] = gflops(lambda: F.conv2d(x, w))
    return out


def _cached_macs(spec: str, model: nn.Module, in_size: Tuple[int, ...], cache: Dict[Any, float]) -> float:
    """fvcore MACs per image or sequence (batch 1, eval) with the project's counting rules
    (:func:`mlp_vision.complexity.count_module`), once per contender and input size of a run; a BiGS layer's
    convolution as the route it runs on this device and length (not the paper's FFT count)."""
    if (spec, in_size) not in cache:
        from mlp_vision.complexity import count_module
        progress(f'{spec}: counting MACs (fvcore)')
        was_training = model.training
        param = next(model.parameters(), None)
        x = torch.randn((1,) + tuple(in_size), device=param.device if param is not None else None)
        try:
            cache[spec, in_size] = float(count_module(model.eval(), (x,), bigs_conv_impl=None)[0])
        finally:
            model.train(was_training)
    return cache[spec, in_size]


# the child imports this very ``mlp_vision`` (a checkout's is found through the script's folder, which a child does
# not search) and runs through ``run_cli`` (an error is one line, the last on its stderr)
_MEMPROBE_CHILD = ('import sys; sys.path.insert(0, sys.argv[1]); from mlp_vision.errors import run_cli; '
                   'from mlp_vision.benchmark import probe_memory; run_cli("memory probe", probe_memory, sys.argv[2:])')


def peak_memory(spec: str, mode: str, args: argparse.Namespace) -> Dict[str, float]:
    """Peak memory of one step, measured in a child process (nothing else resident) that builds the contender and
    runs a warm-up step, then a second. CUDA: ``max_memory_allocated`` over the second. CPU (PyTorch keeps no CPU
    allocator statistics): the growth of the peak resident set size (ru_maxrss) beyond what the first step left
    in use, an upper bound (first-touch effects), plus the peak RSS of the whole process."""
    progress(f'{spec}, {mode}: peak memory (a child process runs two steps)')
    # every setting of this run (the thread count it chose, not the child's own default), the checkout's folder of
    # reference models (a ref: contender's)
    settings = dict(vars(args), spec=spec, mode=mode, threads=torch.get_num_threads(),
                    reference_dir=str(REFERENCE_DIR or ''))
    package_root = str(Path(mlp_vision.__file__).resolve().parents[1])
    cmd = [sys.executable, '-c', _MEMPROBE_CHILD, package_root, json.dumps(settings)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=True).stdout
        return json.loads(out.strip().splitlines()[-1])
    except subprocess.CalledProcessError as e:  # the child's own last line says why
        why = (e.stderr or '').strip().splitlines()[-1:] or [f'exit status {e.returncode}']
        print(f'note: memory probe failed for {spec} ({_bounded(why[0])})', file=sys.stderr)
    except (subprocess.SubprocessError, ValueError, IndexError) as e:
        print(f'note: memory probe failed for {spec} ({error_summary(e)})', file=sys.stderr)
    return {}


def probe_memory(argv: Sequence[str]) -> None:
    """The child of :func:`peak_memory`: ``argv`` holds the run's settings as JSON; prints the result as JSON."""
    global REFERENCE_DIR
    args = argparse.Namespace(**json.loads(argv[0]))
    REFERENCE_DIR = Path(args.reference_dir) if args.reference_dir else None
    set_threads(args.threads)
    model = build(args.spec, args)
    runner = Runner(model, args.mode, args, input_size(args.spec, model, args))
    device = runner.device
    runner.step()  # allocator pools, optimizer state, lazy init
    sync(device)
    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    else:  # the resident set size now (ru_maxrss below, the peak, is in KiB on Linux)
        base = int(Path('/proc/self/statm').read_text().split()[1]) * os.sysconf('SC_PAGE_SIZE')
    runner.step()
    sync(device)
    peak = (torch.cuda.max_memory_allocated(device) if device.type == 'cuda'
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    print(json.dumps({'peak_mem_mb': peak / 2 ** 20, 'step_mem_mb': max(peak - base, 0) / 2 ** 20}))


def _contender_fields(prefix: str, macs: Optional[float], runner: Runner, step_s: float, in_size,
                      args, env: Dict[str, Any]) -> Dict[str, Any]:
    """One contender's columns of a row (``prefix`` 'base_' for B of a pair): median step time, throughput
    (images/s, or tokens/s = batch x seq-len per step for a sequence layer), MACs per sample (``gmacs_per_img`` /
    ``gmacs_per_seq``) and achieved GFLOP/s, also as % of the measured ceilings; the compile time."""
    batch, is_seq = args.batch_size, len(in_size) == 2
    out = {f'{prefix}step_ms': 1e3 * step_s}
    if is_seq:
        out[f'{prefix}tok_per_s'] = batch * in_size[0] / step_s
    else:
        out[f'{prefix}img_per_s'] = batch / step_s
    if macs is not None:
        # a training step is forward + backward ~ 3x the forward flops (backward = 2 GEMMs per forward GEMM)
        gflops = 2 * macs * batch * (3 if runner.mode == 'train' else 1) / step_s / 1e9
        out[f'{prefix}gmacs_per_{"seq" if is_seq else "img"}'] = macs / 1e9
        out[f'{prefix}gflops'] = gflops
        for ceiling in ('matmul', 'onednn'):
            if env.get(f'{ceiling}_gflops'):
                out[f'{prefix}pct_of_{ceiling}'] = 100 * gflops / env[f'{ceiling}_gflops']
    if args.compile:
        out[f'{prefix}compile_s'] = runner.first_step_s
    return out


def _max_diff(a: nn.Module, b: nn.Module, in_size, args) -> Tuple[float, float]:
    """max |A - B| and max |B| of the pre-head features (timm's heads start at zero; a sequence layer's output) on
    two samples, eval, fp32."""
    x = torch.randn((2,) + tuple(in_size), generator=torch.Generator().manual_seed(args.seed + 1))
    a.eval()
    b.eval()
    with torch.no_grad():
        if len(in_size) == 2:
            ya, yb = a(x), b(x)
        else:
            ya, yb = a.forward_features(x), b.forward_features(x)
    return float((ya - yb).abs().max()), float(yb.abs().max())


def _build_contenders(specs: Sequence[str], args) -> Tuple[List[nn.Module], Tuple[int, ...], Dict[str, Any]]:
    """The contender(s) and their input size; a pair (A, B) also gets one set of weights where it can
    (:func:`share_weights`) and the record of it: how, and max |A - B| beside max |B| when they are one function."""
    if len(specs) == 1:
        model = build(specs[0], args)
        return [model], input_size(specs[0], model, args), {}
    a_spec, b_spec = specs
    torch.manual_seed(args.seed)
    if a_spec.startswith(('ref:', FUSED_PREFIX)):  # built from B (same weights)
        b = build(b_spec, args)
        a = build(a_spec, args, twin_of=b)
    else:
        a = build(a_spec, args)
        b = build(b_spec, args, twin_of=a)
    how, same_function = share_weights(a, a_spec, b, b_spec)
    in_size = input_size(a_spec, a, args)
    if input_size(b_spec, b, args) != in_size:
        raise UsageError(f'{a_spec} takes {in_size} inputs and {b_spec} {input_size(b_spec, b, args)}: pass '
                         f'--img-size to compare them at one size')
    diff, scale = _max_diff(a, b, in_size, args) if same_function else (None, None)
    return [a, b], in_size, dict(max_abs_diff=diff, max_abs_out=scale, weights=how)


def _timed_samples(runners: List[Runner], iters: int, args, title: str) -> List[List[float]]:
    """``--samples`` times per step of each runner (over ``iters`` steps each); a pair alternates its order (A B,
    B A, ...) so that a slow drift (thermal, other jobs) does not favour whoever runs first."""
    times: List[List[float]] = [[] for _ in runners]
    for i in range(args.samples):
        for k in (range(len(runners)) if i % 2 == 0 else reversed(range(len(runners)))):
            times[k].append(runners[k].timed(iters))
        ms = [t[-1] * 1e3 for t in times]
        progress(f'{title}: sample {i + 1}/{args.samples} ({iters} steps): {ms[0]:.1f} ms/step' if len(ms) == 1 else
                 f'{title}: pair {i + 1}/{args.samples} ({iters} steps each): A {ms[0]:.1f}, B {ms[1]:.1f} ms/step')
    return times


def run_contenders(specs: Sequence[str], args, env, macs_cache) -> List[Dict[str, Any]]:
    """A row per mode: one contender (``--model``) timed alone, or a pair (``--compare A B``) timed alternately,
    with the median and quartiles of the per-pair ratios t_B / t_A (the speed-up of A over B)."""
    rows = []
    pair = len(specs) == 2
    for mode in ['inference', 'train'] if args.bench == 'both' else [args.bench]:
        title = f'{" vs ".join(specs)}, {mode}'
        progress(f'{title}: building both' if pair else f'{title}: building')
        models, in_size, record = _build_contenders(specs, args)
        macs = {} if args.no_flops else {s: _cached_macs(s, m, in_size, macs_cache) for s, m in zip(specs, models)}
        labels = [f'A {specs[0]}, {mode}', f'B {specs[1]}, {mode}'] if pair else [title]
        runners = [Runner(m, mode, args, in_size, label=label) for m, label in zip(models, labels)]
        # size the samples from the slowest contender so each sample has >= --min-sample-time
        slowest = max([r.warmup(args.warmup) for r in runners])
        iters = args.iters or max(1, math.ceil(args.min_sample_time / max(slowest, 1e-9)))
        load_start = os.getloadavg()[0]
        times = _timed_samples(runners, iters, args, title)
        if args.profile:
            for spec, runner in zip(specs, runners):
                profile_step(runner, spec)
        shape = (dict(seq_len=in_size[0], dim=in_size[1]) if len(in_size) == 2 else  # a sequence layer
                 dict(img_size=in_size[-1] if in_size[-1] == in_size[-2] else f'{in_size[-2]}x{in_size[-1]}'))
        row = dict(model=specs[0], **({'baseline': specs[1]} if pair else {}), mode=mode, batch_size=args.batch_size,
                   **shape, precision=args.precision, channels_last=args.channels_last, compile=args.compile,
                   device=args.device, threads=torch.get_num_threads(), timer=args.timer)
        if pair:
            ratios = [t_b / t_a for t_a, t_b in zip(*times)]
            q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
            row.update(speedup=statistics.median(ratios), speedup_q1=q[0], speedup_q3=q[2], speedup_min=min(ratios),
                       speedup_max=max(ratios), pairs=len(ratios))
        else:
            row.update(step_ms_min=1e3 * min(times[0]), samples=len(times[0]))
        row['iters'] = iters
        for prefix, spec, runner, spec_times in zip(('', 'base_'), specs, runners, times):
            row.update(_contender_fields(prefix, macs.get(spec), runner, statistics.median(spec_times), in_size,
                                         args, env))
        row.update(record, **(dict(load_start=load_start, load_end=os.getloadavg()[0]) if pair else {}))
        del runners, models
        if not args.no_memory:  # each in a child process, with this one's contenders freed
            for prefix, spec in zip(('', 'base_'), specs):
                row.update({prefix + k: v for k, v in peak_memory(spec, mode, args).items()})
        rows.append(row)
        print(_fmt_row(row), flush=True)
    return rows


def rate_text(rate: float) -> str:
    """A throughput with at least 3 significant digits (0.352, 41.7, 1234), so two slow contenders never print
    as the same or swapped rounded numbers."""
    return f'{rate:.0f}' if rate >= 100 else f'{rate:.3g}'


def speed_sentence(r: Dict[str, Any]) -> str:
    """A paired row in words, naming the faster contender first: ``'A is 1.117x faster than B (median of 8 paired
    ratios, q1-q3 1.09-1.14); 0.412 vs 0.369 img/s (median of each)'``. The throughputs follow the sentence's
    order; when the medians of each point the other way than the paired ratio (load changed while timing), the
    line says so instead of leaving two numbers that seem to contradict each other."""
    unit = 'tok' if 'tok_per_s' in r else 'img'
    a, b, ratio = r['model'], r['baseline'], r['speedup']
    rate_a, rate_b = r[unit + '_per_s'], r['base_' + unit + '_per_s']
    q1, q3 = r['speedup_q1'], r['speedup_q3']
    if ratio >= 1:
        faster, slower, factor, rates, quartiles = a, b, ratio, (rate_a, rate_b), (q1, q3)
    else:
        faster, slower, factor, rates, quartiles = b, a, 1 / ratio, (rate_b, rate_a), (1 / q3, 1 / q1)
    text = (f'{faster} is {factor:.3f}x faster than {slower} (median of {r["pairs"]} paired ratios, q1-q3 '
            f'{quartiles[0]:.3f}-{quartiles[1]:.3f}); {rate_text(rates[0])} vs {rate_text(rates[1])} {unit}/s '
            f'(median of each)')
    if ratio != 1 and rates[0] < rates[1]:
        text += ('; the medians of each disagree with the paired ratio (the machine\'s load changed while timing: '
                 'the ratio of back-to-back pairs is the steadier; more --samples settle it)')
    return text


def _fmt_row(r: Dict[str, Any]) -> str:
    unit = 'tok' if 'tok_per_s' in r else 'img'
    if 'baseline' in r:
        diff = 'n/a (different layers)' if r['max_abs_diff'] is None else f"{r['max_abs_diff']:.2e}"
        return f"{r['mode']:9s} {r['model']} vs {r['baseline']}: {speed_sentence(r)}, max|diff| {diff}"
    return f"{r['mode']:9s} {r['model']}: {rate_text(r[unit + '_per_s'])} {unit}/s ({r['step_ms']:.1f} ms/step)"


def environment(args, command: str) -> Dict[str, Any]:
    try:  # the processor's name on Linux
        with open('/proc/cpuinfo') as f:
            cpu = next(ln.split(':', 1)[1].strip() for ln in f if ln.startswith('model name'))
    except (OSError, StopIteration):
        cpu = platform.processor() or platform.machine()
    return dict(
        date_utc=datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
        host=platform.node(), cpu=cpu, logical_cpus=os.cpu_count(), device=args.device,
        device_name=torch.cuda.get_device_name(args.device) if args.device.startswith('cuda') else cpu,
        cpu_capability=torch.backends.cpu.get_cpu_capability(),  # AVX2 / AVX512 kernels
        threads=torch.get_num_threads(), interop_threads=torch.get_num_interop_threads(),
        torch=torch.__version__, timm=timm.__version__, mlp_vision=mlp_vision.__version__,
        python=platform.python_version(), load_avg_start=os.getloadavg(),
        command=command,
    )


_MD_COLS_PAIR = [
    ('mode', 'mode', '{}'), ('model', 'A', '`{}`'), ('baseline', 'B', '`{}`'), ('batch_size', 'batch', '{}'),
    ('img_size', 'img', '{}'), ('seq_len', 'tokens', '{}'), ('dim', 'd', '{}'),
    ('img_per_s', 'A img/s', rate_text), ('base_img_per_s', 'B img/s', rate_text),
    ('tok_per_s', 'A tok/s', rate_text), ('base_tok_per_s', 'B tok/s', rate_text),
    ('speedup', 'speed-up of A over B (t_B / t_A, median of pairs; < 1: A is slower)', '**{:.2f}×**'),
    ('speedup_q1', 'q1', '{:.2f}'), ('speedup_q3', 'q3', '{:.2f}'), ('pairs', 'pairs', '{}'),
    ('gflops', 'A GFLOP/s', '{:.0f}'), ('pct_of_matmul', 'A % of mm', '{:.0f} %'),
    ('pct_of_onednn', 'A % of oneDNN', '{:.0f} %'),
    ('base_gflops', 'B GFLOP/s', '{:.0f}'), ('base_pct_of_matmul', 'B % of mm', '{:.0f} %'),
    ('base_pct_of_onednn', 'B % of oneDNN', '{:.0f} %'),
    ('step_mem_mb', 'A step mem MB', '{:.0f}'), ('base_step_mem_mb', 'B step mem MB', '{:.0f}'),
    ('max_abs_diff', 'max abs diff (out)', '{:.1e}'), ('load_start', 'load', '{:.1f}'),
]
_MD_COLS_SINGLE = [
    ('mode', 'mode', '{}'), ('model', 'model', '`{}`'), ('batch_size', 'batch', '{}'), ('img_size', 'img', '{}'),
    ('seq_len', 'tokens', '{}'), ('dim', 'd', '{}'), ('img_per_s', 'img/s', rate_text),
    ('tok_per_s', 'tok/s', rate_text), ('step_ms', 'ms/step', '{:.1f}'), ('gmacs_per_img', 'GMACs/img', '{:.2f}'),
    ('gmacs_per_seq', 'GMACs/seq', '{:.2f}'), ('gflops', 'GFLOP/s', '{:.0f}'), ('pct_of_matmul', '% of mm', '{:.0f} %'),
    ('pct_of_onednn', '% of oneDNN', '{:.0f} %'), ('step_mem_mb', 'step mem MB', '{:.0f}'),
    ('peak_mem_mb', 'peak MB', '{:.0f}'),
]


def ceiling_text(env: Dict[str, Any]) -> str:
    """The measured matmul ceilings (:func:`matmul_ceiling`), 3 significant digits or more, for the progress line
    and the markdown."""
    return (f"matmul ceiling: torch.mm {env['matmul_n']}² {env['matmul_dtype']} {rate_text(env['matmul_gflops'])} "
            f"GFLOP/s" + (f", oneDNN {rate_text(env['onednn_gflops'])} GFLOP/s" if 'onednn_gflops' in env else ''))


def run_line(env: Dict[str, Any], args) -> str:
    """The run's setting on one line: date, device, threads, precision, versions, ceilings, machine load (the
    header of the markdown and of the profile file)."""
    prec = args.precision + (', channels_last' if args.channels_last else '') + (', compile' if args.compile else '')
    prec += ', CPU-time timer' if args.timer == 'cpu' else ''
    cpu = f" ({env['cpu_capability']})" if env['device'] == 'cpu' else ''
    return (f"{env['date_utc']} · {env['device_name']}{cpu} · {env['threads']} threads · {prec} · torch "
            f"{env['torch']} · timm {env['timm']}" + (f' · {ceiling_text(env)}' if 'matmul_gflops' in env else '')
            + f" · load avg {env['load_avg_start'][0]:.2f} → {env['load_avg_end'][0]:.2f}")


def markdown(rows: List[Dict[str, Any]], env: Dict[str, Any], args) -> str:
    cols = _MD_COLS_PAIR if rows and 'baseline' in rows[0] else _MD_COLS_SINGLE
    cols = [c for c in cols if any(c[0] in r for r in rows)]
    lines = [f"# {args.title or 'Benchmark'}", '', run_line(env, args)]
    lines += ['', '`' + env['command'] + '`', '']
    lines.append('| ' + ' | '.join(c[1] for c in cols) + ' |')
    lines.append('|' + '---|' * len(cols))
    for r in rows:
        cells = ['–' if r.get(key) is None else fmt(r[key]) if callable(fmt) else fmt.format(r[key])
                 for key, _, fmt in cols]
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines) + '\n'


def write_results(rows, env, args) -> None:
    prefix = args.out
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    table = io.StringIO()
    w = csv.DictWriter(table, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))  # every row's, in order
    w.writeheader()
    w.writerows(rows)
    write_output_file(prefix + '.csv', table.getvalue())
    write_output_file(prefix + '.json', json.dumps({'environment': env, 'results': rows}, indent=2))
    write_output_file(prefix + '.md', markdown(rows, env, args))
    print(f'wrote {prefix}.csv / .json / .md')
    if PROFILES:
        write_output_file(prefix + '_profile.txt',
                          f"# torch.profiler, top ops by self time · {run_line(env, args)}\n# {env['command']}\n\n"
                          + '\n'.join(PROFILES))
        print(f'wrote {prefix}_profile.txt')


def main(argv=None, prog: str = 'benchmark.py', reference_dir: Optional[Path] = None) -> None:
    """Benchmark; bad arguments stop with one line starting with ``prog`` and exit status 2 (``run_cli``).
    ``reference_dir``: the checkout's folder of reference models (the ``ref:`` contenders), from its benchmark.py."""
    global REFERENCE_DIR
    if reference_dir is not None:
        REFERENCE_DIR = Path(reference_dir)
    run_cli(prog, lambda a: _main(a, prog), argv)


def _main(argv, prog: str) -> None:
    global _run_start
    args = parse_args(argv)
    threads = set_threads(args.threads)
    _run_start = time.monotonic()
    PROFILES.clear()  # this run's tables only, when main is called again in one process
    progress(threads)
    # as typed: python benchmark.py ... in a checkout, mlp-vision-benchmark ... / python -m mlp_vision.benchmark ...
    env = environment(args, ('python ' if prog.endswith('.py') else '') + ' '.join([prog, shlex.join(argv)]))
    if not args.no_ceiling:
        progress('matmul ceiling: timing torch.mm (--no-ceiling skips it)')
        env.update(matmul_ceiling(torch.device(args.device), args.precision,
                                  time.process_time if args.timer == 'cpu' else time.perf_counter))
        print(f"{ceiling_text(env)} ({env['threads']} threads)", flush=True)
    macs_cache: Dict[Any, float] = {}
    rows: List[Dict[str, Any]] = []
    for specs in args.compare or [[spec] for spec in args.model]:
        rows += run_contenders(specs, args, env, macs_cache)
    env['load_avg_end'] = os.getloadavg()
    if args.out:
        write_results(rows, env, args)
    else:
        print(markdown(rows, env, args))


if __name__ == '__main__':
    main(prog='python -m mlp_vision.benchmark')
