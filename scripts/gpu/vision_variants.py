""" The layout variants of gMLP-S and sMLPNet-T against their peers, compiled training steps in one process (issue 45
items 3 and 5): which variant becomes the default is decided by these numbers (measured GPU defaults).

Groups (``--groups``), each timed in one process with its contenders alternating (A B C, B C A, ...):
    gmlp    gMLP-S: today's, split_fc1, token_major, both; timm's gmlp_s16_224; ViT-S (timm vit_small_patch16_224)
    smlp    sMLPNet-T: today's, one_gemm_mixes; ConvNeXt-T (timm convnext_tiny)
    mixer   Mixer-B/16 (ours) vs timm's mixer_b16_224

Each contender: a compiled training step (forward, cross-entropy, backward; no optimizer) under bf16 autocast
(``--precision``) on channels-last images; images/s (median of ``--samples`` rounds of ``--iters``
steps), the median per-round ratio to the group's first contender, the step's FLOPs (``FlopCounterMode``, forward
and backward, counted once eagerly at batch 2) as % of the measured bf16 matmul rate
(:func:`mlp_vision.benchmark.matmul_ceiling`)
and, with ``--profile``, the top CUDA kernels of one step (torch.profiler). Writes PREFIX.json and PREFIX.md.

    python scripts/gpu/vision_variants.py --groups gmlp smlp mixer --out output/gpu/bench/vision_variants

``--compile regional`` (the default) compiles each block of the repeated-block sequences (``blocks`` of every
model here, stage by stage for the pyramids; stem and head eager), each distinct block once: the whole-model
compile (``--compile full``, what ``benchmark.py --compile`` times) of sMLPNet-T's training graph alone took 3.5 min
on the H100 machine, and this part has 8 minutes for 11 models. The variants differ inside the blocks, and the
activations pass between compiled blocks in the layout a variant chooses, so the comparison holds; the absolute
numbers are regional compilation's (no fusion across blocks).

It runs on the CPU too at toy sizes (``--device cpu --img-size 32 --tiny``), which is how its logic is tested.
"""
import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence, Tuple

import timm
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout, not an installed copy

import mlp_vision  # noqa: E402,F401  (registers the models with timm)
from mlp_vision.benchmark import matmul_ceiling, profile_call, seconds_per_call, sync  # noqa: E402

# group -> [(label, timm name, create_model kwargs)]; the first contender of a group is its baseline
GROUPS: Dict[str, List[Tuple[str, str, Dict[str, Any]]]] = {
    'gmlp': [
        ('gmlp_s', 'gmlp_s', {}),
        ('gmlp_s split_fc1', 'gmlp_s', dict(block_kwargs=dict(split_fc1=True))),
        ('gmlp_s token_major', 'gmlp_s', dict(block_kwargs=dict(token_major=True))),
        ('gmlp_s token_major+split_fc1', 'gmlp_s', dict(block_kwargs=dict(token_major=True, split_fc1=True))),
        ('timm gmlp_s16_224', 'gmlp_s16_224', {}),
        ('vit_small_patch16_224', 'vit_small_patch16_224', {}),
    ],
    'smlp': [
        ('smlpnet_t', 'smlpnet_t', {}),
        ('smlpnet_t one_gemm_mixes', 'smlpnet_t', dict(one_gemm_mixes=True)),
        ('convnext_tiny', 'convnext_tiny', {}),
    ],
    'mixer': [
        ('mixer_b16', 'mixer_b16', {}),
        ('timm mixer_b16_224', 'mixer_b16_224', {}),
    ],
}
# toy sizes of the same families for the CPU smoke run (--tiny): name -> (name, kwargs); timm's gMLP and Mixer entries
# fix their depth, so their smallest entries stand in
TINY = {'gmlp_s': ('gmlp_s', dict(num_blocks=2)), 'gmlp_s16_224': ('gmlp_ti16_224', {}),
        'mixer_b16': ('mixer_b16', dict(num_blocks=2)), 'mixer_b16_224': ('mixer_s16_224', {}),
        'vit_small_patch16_224': ('vit_small_patch16_224', dict(depth=2)),
        'smlpnet_t': ('smlpnet_t', dict(depths=(1, 1, 1, 1))),
        'convnext_tiny': ('convnext_tiny', dict(depths=(1, 1, 1, 1)))}
NUM_CLASSES = 1000
ANY_SIZE = ('convnext_tiny',)  # fully convolutional: takes any input size and has no img_size argument


def _autocast(args):
    dtype = {'bf16': torch.bfloat16, 'fp32': None}[args.precision]
    return torch.autocast(torch.device(args.device).type, dtype=dtype, enabled=dtype is not None)


def compile_blocks(model: torch.nn.Module) -> None:
    """Regional compilation: every block of each ``blocks`` sequence compiled in place (``nn.Module.compile``);
    static shapes, so the blocks of a pyramid's stages get one graph per map size."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Sequential) and name.split('.')[-1] == 'blocks':
            for block in module:
                block.compile(dynamic=False)


def build_step(name: str, kwargs: Dict[str, Any], args) -> Tuple[Callable[[], None], float]:
    """A compiled (``--compile``) training step of a fresh model on fixed channels-last images, and the step's FLOPs
    per image (forward and backward, counted eagerly at batch 2)."""
    if args.tiny:
        name, tiny_kwargs = TINY[name]
        kwargs = dict(kwargs, **tiny_kwargs)
    if args.img_size != 224 and name not in ANY_SIZE:
        kwargs['img_size'] = args.img_size
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=NUM_CLASSES, **kwargs).to(args.device).train()
    model = model.to(memory_format=torch.channels_last)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, 3, args.img_size, args.img_size, generator=g).to(args.device)
    x = x.contiguous(memory_format=torch.channels_last)
    target = torch.randint(0, NUM_CLASSES, (args.batch,), generator=g).to(args.device)
    n = min(args.batch, 2)  # 2: a train-mode BatchNorm needs more than one value per channel
    with FlopCounterMode(display=False) as counter, _autocast(args):
        F.cross_entropy(model(x[:n]), target[:n]).backward()
    model.zero_grad(set_to_none=True)
    fn = model
    if args.compile == 'full':
        fn = torch.compile(model)
    elif args.compile == 'regional':
        compile_blocks(model)

    def step():
        with _autocast(args):
            loss = F.cross_entropy(fn(x), target)
        loss.backward()
    return step, counter.get_total_flops() / n


def time_group(group: str, args, ceiling_flops: float) -> Tuple[List[Dict], List[str]]:
    """Build and warm every contender of ``group`` (compiles), then time them alternating; rows and profiles."""
    steps: Dict[str, Callable[[], None]] = {}
    flops: Dict[str, float] = {}
    compile_s: Dict[str, float] = {}
    for label, name, kwargs in GROUPS[group]:
        t0 = time.perf_counter()
        steps[label], flops[label] = build_step(name, kwargs, args)
        for _ in range(args.warmup):
            steps[label]()
        sync(args.device)
        compile_s[label] = time.perf_counter() - t0
        print(f'{group}: {label} built and warmed in {compile_s[label]:.0f} s', flush=True)
    labels = list(steps)
    times: Dict[str, List[float]] = {k: [] for k in labels}
    for i in range(args.samples):
        order = labels[i % len(labels):] + labels[:i % len(labels)]  # rotate who goes first
        for label in order:
            times[label].append(seconds_per_call(steps[label], args.iters, args.device))
    base = labels[0]
    rows = []
    for label in labels:
        img_per_s = args.batch / statistics.median(times[label])
        rows.append(dict(
            group=group, contender=label, baseline=base, batch=args.batch, img_size=args.img_size,
            img_per_s=img_per_s, ratio_to_baseline=statistics.median(b / t for b, t in zip(times[base], times[label])),
            gflop_per_img=flops[label] / 1e9, pct_of_matmul=100 * flops[label] * img_per_s / ceiling_flops,
            build_and_warmup_s=compile_s[label]))
        print(json.dumps(rows[-1]), flush=True)
    profiles = []
    if args.profile:
        for label in labels:
            profiles.append(profile_call(steps[label], torch.device(args.device),
                                         f'{label}, batch {args.batch}, training step', rows=args.profile_rows))
    return rows, profiles


def check_new(prefix: str) -> None:
    """Refuse an ``--out`` whose files exist, before any work: results are never overwritten."""
    for suffix in ('.json', '.md'):
        if Path(prefix).with_suffix(suffix).exists():
            raise SystemExit(f'error: {Path(prefix).with_suffix(suffix)} exists; give a new --out')


def write(rows: List[Dict], profiles: List[str], env: Dict[str, Any], prefix: str) -> None:
    check_new(prefix)
    out = Path(prefix)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix('.json').write_text(json.dumps(dict(environment=env, rows=rows), indent=1))
    lines = [f"# vision layout variants: {env['device_name']}, {env['precision']}, channels_last, "
             f"training step, compile: {env['compile']}",
             '', f"torch {env['torch']}, timm {env['timm']}, matmul rate {env['matmul_gflops']:,.0f} GFLOP/s", '',
             '| group | contender | batch | img/s | / group baseline | GFLOP/img (fwd+bwd) | % of mm '
             '| build+warmup s |',
             '| --- | --- | --- | --- | --- | --- | --- | --- |']
    lines += [f"| {r['group']} | {r['contender']} | {r['batch']} | {r['img_per_s']:,.0f} | "
              f"{r['ratio_to_baseline']:.2f}x | {r['gflop_per_img']:.2f} | {r['pct_of_matmul']:.0f} | "
              f"{r['build_and_warmup_s']:.0f} |" for r in rows]
    out.with_suffix('.md').write_text('\n'.join(lines) + '\n\n' + '\n'.join(profiles))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--groups', nargs='+', default=list(GROUPS), choices=tuple(GROUPS))
    p.add_argument('--device', default='cuda')
    p.add_argument('--precision', default='bf16', choices=('bf16', 'fp32'), help='bf16: autocast')
    p.add_argument('--compile', default='regional', choices=('regional', 'full', 'none'),
                   help='regional: each block compiled (module docstring); full: the whole model; none: eager')
    p.add_argument('--batch', type=int, default=128)
    p.add_argument('--img-size', type=int, default=224)
    p.add_argument('--tiny', action='store_true', help='2-block / 1-block-per-stage models (CPU smoke run)')
    p.add_argument('--samples', type=int, default=5)
    p.add_argument('--iters', type=int, default=5, help='steps per timed sample')
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--profile', action='store_true', help='top kernels of one step of each contender')
    p.add_argument('--profile-rows', type=int, default=12)
    p.add_argument('--out', required=True, help='write PREFIX.json and PREFIX.md (must not exist)')
    return p


def main(argv: Sequence[str] = None) -> int:
    args = build_parser().parse_args(argv)
    check_new(args.out)
    device = torch.device(args.device)
    precision = {'bf16': 'amp_bf16', 'fp32': 'fp32'}[args.precision]
    env = dict(date_utc=time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()), torch=torch.__version__,
               timm=timm.__version__, python=platform.python_version(), precision=args.precision,
               compile=args.compile,
               device_name=(torch.cuda.get_device_name(device) if device.type == 'cuda'
                            else platform.processor() or 'cpu'),
               **matmul_ceiling(device, precision))
    rows, profiles = [], []
    for group in args.groups:
        group_rows, group_profiles = time_group(group, args, env['matmul_gflops'] * 1e9)
        rows += group_rows
        profiles += group_profiles
    write(rows, profiles, env, args.out)
    return 0


if __name__ == '__main__':
    sys.exit(main())
