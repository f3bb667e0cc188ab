""" Token padding of the SGU / Mixer token GEMMs (issue 34 item 1): which multiple measures fastest.

gMLP's Spatial Gating Unit (arXiv 2105.08050 §2) and Mixer's token MLP (arXiv 2105.01601 §2) contract a token axis of
196 patches at 224². In bf16 a 196-token row is 392 bytes, not a multiple of 16, and an H100 ran these GEMMs on
older kernels (the gMLP-S SGU GEMM 273.6 us at 196 tokens, 176.0 us padded to 200). The modules pad the contracted
token axis of CUDA inputs with zeros to a multiple of ``token_multiple`` (default 8; CPU inputs are never padded:
``mlp_vision.layers.linear.token_multiple_on``); this script times the choices.

Parts (each alternates its variants in one process: A B C, A B C, ...; medians and the median of per-round ratios
against the unpadded variant):
    gemm    the SGU's token GEMM alone, W (n, n) @ v (B, n, C), forward + backward (dW, dv): unpadded, contracted
            axis padded (what the module does: W (n, n_pad), v (B, n_pad, C)) and both axes padded (W (n_pad,
            n_pad), the padded output rows dropped), for each ``--multiples``.
    layers  a gMLP-S ``SpatialGatingUnit`` (gate width 768) and a Mixer-B ``MixerBlock``'s token MLP (as the block
            calls it), forward + backward with each ``token_multiple``, and the largest output difference from the
            first multiple's.
    models  a training step (forward, loss, backward; no optimizer) of each ``--models`` with every module's
            ``token_multiple`` set to each multiple, same weights.

``--precision bf16`` runs ``gemm`` on bf16 tensors and ``layers`` / ``models`` under bf16 autocast; ``--compile``
compiles the layers and models (one graph per multiple: the multiple is an attribute the graph is guarded on).
Writes PREFIX.json and PREFIX.md with ``--out PREFIX``. On the CPU it runs at toy sizes, which is how its logic is
tested (``tests/test_gpu_scripts.py``; there ``layers`` and ``models`` run every multiple unpadded, as the modules do
on the CPU); the numbers that choose the default come from ``run_gpu.sh token_pad``.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import timm
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, when run from anywhere
sys.path.insert(1, str(Path(__file__).resolve().parent))
from text_models import write  # noqa: E402  (the table writing of the other GPU script)
from mlp_vision.benchmark import seconds_per_call  # noqa: E402

import mlp_vision  # noqa: E402,F401  (registers the models with timm)
from mlp_vision.layers import MixerBlock, SpatialGatingUnit  # noqa: E402
from mlp_vision.layers.linear import token_padding, tokens_padded_to  # noqa: E402


class TokenMixing(torch.nn.Module):
    """A ``MixerBlock``'s token MLP alone, as the block calls it: (B, n, C) -> (B, n, C)."""

    def __init__(self, block: MixerBlock):
        super().__init__()
        self.mlp_tokens = block.mlp_tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp_tokens(x.transpose(1, 2)).transpose(1, 2)


CLOCKS = {'wall': time.perf_counter, 'cpu': time.process_time}


def _dtype(args) -> torch.dtype:
    return torch.bfloat16 if args.precision == 'bf16' else torch.float32


def _autocast(args):
    return torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16, enabled=args.precision == 'bf16')


def alternate(variants: Dict[str, Callable[[], None]], args, baseline: str) -> List[Dict]:
    """Time each variant ``--samples`` times in rounds (every variant once per round) after ``--warmup`` calls."""
    for step in variants.values():
        for _ in range(args.warmup):
            step()
    times: Dict[str, List[float]] = {k: [] for k in variants}
    for _ in range(args.samples):
        for name, step in variants.items():
            times[name].append(seconds_per_call(step, args.iters, args.device, CLOCKS[args.timer]))
    rows = []
    for name, ts in times.items():
        ratios = [b / t for b, t in zip(times[baseline], ts)]
        rows.append(dict(variant=name, ms=1000 * statistics.median(ts), min_ms=1000 * min(ts),
                         speedup_vs_unpadded=statistics.median(ratios)))
        print(rows[-1], flush=True)
    return rows


def _backward_step(fn: Callable[[], torch.Tensor], grad_out: torch.Tensor) -> Callable[[], None]:
    def step():
        fn().backward(grad_out)
    return step


def gemm(args) -> List[Dict]:
    n, b, c = args.tokens, args.batch, args.channels
    dev, dt = args.device, _dtype(args)
    w = torch.randn(n, n, device=dev, dtype=dt, requires_grad=True)
    v = torch.randn(b, n, c, device=dev, dtype=dt, requires_grad=True)
    g = torch.randn(b, n, c, device=dev, dtype=dt)

    def product(pad: int, both: bool) -> torch.Tensor:
        wp = F.pad(w, (0, pad, 0, pad if both else 0))
        y = torch.bmm(wp.expand(b, -1, -1), F.pad(v, (0, 0, 0, pad)))
        return y[:, :n] if both else y

    variants = {'unpadded': _backward_step(lambda: torch.bmm(w.expand(b, -1, -1), v), g)}
    for k in args.multiples:
        pad = token_padding(n, k)
        if pad:
            variants[f'contracted_{n + pad}'] = _backward_step(lambda p=pad: product(p, False), g)
            variants[f'both_{n + pad}'] = _backward_step(lambda p=pad: product(p, True), g)
    rows = alternate(variants, args, 'unpadded')
    for r in rows:
        r.update(part='gemm', tokens=n, batch=b, channels=c)
    return rows


def _module_variants(module: torch.nn.Module, x: torch.Tensor, args) -> Dict[str, Callable[[], None]]:
    fn = torch.compile(module) if args.compile else module
    with _autocast(args):
        grad_out = torch.randn_like(module(x))  # the output's dtype under autocast
    out = {}
    for k in args.multiples:
        def step(k=k):
            with tokens_padded_to(module, k), _autocast(args):
                y = fn(x)
            y.backward(grad_out)
        out[f'multiple_{k}'] = step
    return out


def _max_diff(module: torch.nn.Module, x: torch.Tensor, args) -> Dict[str, float]:
    outs = {}
    with torch.no_grad(), _autocast(args):
        for k in args.multiples:
            with tokens_padded_to(module, k):
                outs[k] = module(x).float()
    return {f'multiple_{k}': float((y - outs[args.multiples[0]]).abs().max()) for k, y in outs.items()}


def layers(args) -> List[Dict]:
    n, b, c = args.tokens, args.batch, args.channels
    dev = args.device
    cases = {
        'sgu': (SpatialGatingUnit(2 * c, n).to(dev), torch.randn(b, n, 2 * c, device=dev, requires_grad=True)),
        'mixer_token_mlp': (TokenMixing(MixerBlock(c, n)).to(dev), torch.randn(b, n, c, device=dev, requires_grad=True)),
    }
    rows = []
    for layer, (module, x) in cases.items():
        diffs = _max_diff(module, x, args)
        for r in alternate(_module_variants(module, x, args), args, f'multiple_{args.multiples[0]}'):
            r.update(part='layers', layer=layer, tokens=n, batch=b, channels=c, max_abs_diff=diffs[r['variant']])
            rows.append(r)
    return rows


def models(args) -> List[Dict]:
    rows = []
    for name in args.models:
        model = timm.create_model(name, img_size=args.img_size, num_classes=10).to(args.device).train()
        x = torch.randn(args.batch, 3, args.img_size, args.img_size, device=args.device)
        target = torch.randint(0, 10, (args.batch,), device=args.device)
        fn = torch.compile(model) if args.compile else model
        token_multiple_modules = sum(isinstance(getattr(m, 'token_multiple', None), int) for m in model.modules())
        variants = {}
        for k in args.multiples:
            def step(k=k):
                with tokens_padded_to(model, k), _autocast(args):
                    loss = F.cross_entropy(fn(x), target)
                loss.backward()
            variants[f'multiple_{k}'] = step
        for r in alternate(variants, args, f'multiple_{args.multiples[0]}'):
            r.update(part='models', model=name, batch=args.batch, img_size=args.img_size,
                     token_multiple_modules=token_multiple_modules)
            rows.append(r)
    return rows


def main(argv: Sequence[str] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('mode', choices=('gemm', 'layers', 'models'))
    p.add_argument('--device', default='cuda')
    p.add_argument('--precision', default='bf16', choices=('fp32', 'bf16'))
    p.add_argument('--compile', action='store_true', help='layers, models: torch.compile')
    p.add_argument('--multiples', type=int, nargs='+', default=[1, 8, 16], help='the first is the baseline')
    p.add_argument('--tokens', type=int, default=196, help='gemm, layers: n (gMLP / Mixer at 224²: 196)')
    p.add_argument('--channels', type=int, default=768, help='gemm, layers: C (gMLP-S gate width, Mixer-B width)')
    p.add_argument('--batch', type=int, default=256)
    p.add_argument('--models', nargs='+', default=['gmlp_s', 'mixer_b16'])
    p.add_argument('--img-size', type=int, default=224)
    p.add_argument('--threads', type=int, default=None, help='torch.set_num_threads (CPU runs)')
    p.add_argument('--timer', default='wall', choices=tuple(CLOCKS),
                   help='cpu: process CPU time, steadier for a 1-thread run on a busy machine')
    p.add_argument('--samples', type=int, default=7)
    p.add_argument('--iters', type=int, default=10, help='calls per timed sample')
    p.add_argument('--warmup', type=int, default=3)
    p.add_argument('--out', default=None, help='write PREFIX.json and PREFIX.md')
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = {'gemm': gemm, 'layers': layers, 'models': models}[args.mode](args)
    if args.out:
        write(rows, args, args.out)
    return 0


if __name__ == '__main__':
    sys.exit(main())
