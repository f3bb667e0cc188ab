#!/usr/bin/env python3
""" GPU checks of the Triton bidirectional long convolution (mlp_vision.layers.longconv_triton), issue 15 item 2.

    python scripts/gpu/longconv_check.py check             # CUDA results vs the float64 reference; exit 1 on a miss
                                                           # (plain, gated, and the layer's fused GELU + mask route)
    python scripts/gpu/longconv_check.py sweep             # tile sizes at L = 4,096, d = 1,024 (forward, bf16)
    python scripts/gpu/longconv_check.py bench --seq-len 4096 --batch 8 [--block-l 128 --block-c 128]

``bench`` times, on the same (B, L, 2, d) bf16 input: the Triton route (forward; forward + backward), the BiGS
layer's FFT route (``BidirectionalGatedSSM._bidirectional_ssm`` with ``conv_impl='fft'``, float32 FFTs, its
hand-written backward) and, for scale, the attention core of the BERT-large layer it competes with
(``F.scaled_dot_product_attention``, 16 heads x 64, flash backend, on (B, 16, L, 64)). Rates count the useful
multiply-adds of the convolution (L (L + 1) / 2 per channel and direction, both directions) or of attention
(2 L^2 d per sequence, no causal mask: BERT attends both ways). Peak memory is ``max_memory_allocated`` during
one training step minus what was allocated before it. ``--out PREFIX`` writes PREFIX.json and PREFIX.md.
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, when run from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'tests'))  # its reference.longconv
from mlp_vision.layers import BidirectionalGatedSSM  # noqa: E402
from mlp_vision.layers.longconv_triton import bidirectional_gelu_long_conv, bidirectional_long_conv  # noqa: E402
from reference.longconv import bidirectional_long_conv_reference  # noqa: E402

DEVICE = 'cuda'
CHECK_CASES = [(2, 37, 20), (2, 300, 96), (1, 1000, 130), (1, 4096, 64)]  # (B, L, C): ragged tiles, one long
TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 3e-3}  # as tests/test_longconv_triton.py


def rel_err(x, ref):
    return ((x.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def inputs(batch, length, channels, dtype, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    u = torch.randn(batch, length, 2, channels, device=DEVICE, generator=g).to(dtype)
    kernels = torch.randn(2, length, device=DEVICE, generator=g) * torch.exp(
        -torch.arange(length, device=DEVICE) / (0.1 * length + 1))
    kernels[:, 0] += 1.0
    bias = torch.randn(2, channels, device=DEVICE, generator=g)
    return u, kernels, bias


def check(args) -> int:
    """Forward and gradients vs the float64 reference (dense Toeplitz on the GPU), default tiles."""
    failures = 0
    for batch, length, channels in CHECK_CASES:
        for dtype, tol in TOLERANCES.items():
            for gated in (False, True):
                u, kernels, bias = inputs(batch, length, channels, dtype)
                upstream = torch.randn((batch, length) + ((channels,) if gated else (2, channels)), device=DEVICE)
                results = []
                for fn, cast in ((bidirectional_long_conv, lambda t: t),
                                 (bidirectional_long_conv_reference, torch.Tensor.double)):
                    xs = [cast(t.detach()).requires_grad_() for t in (u, kernels, bias)]
                    out = fn(*xs, gated=gated)
                    (out.double() * upstream.double()).sum().backward()
                    results.append([out] + [t.grad for t in xs])
                errs = [rel_err(a, b) for a, b in zip(*results)]
                ok = max(errs) < tol
                failures += not ok
                print(f'{"ok  " if ok else "FAIL"} B={batch} L={length} C={channels} {str(dtype):14s} '
                      f'gated={gated!s:5s} rel err out/u/k/bias: ' + ' '.join(f'{e:.1e}' for e in errs)
                      + f' (tol {tol:.0e})', flush=True)
    failures += check_fused_gelu()
    print(f'{failures} failure(s)')
    return int(failures > 0)


def _unfused_gelu_conv(a_f, a_b, kernels, approximate, mask):
    u = torch.stack([F.gelu(a_f, approximate=approximate), F.gelu(a_b, approximate=approximate)], 2)
    return bidirectional_long_conv_reference(u * mask[:, :, None, None].to(u.dtype), kernels).unbind(2)


def check_fused_gelu() -> int:
    """The layer's Triton route (input GELUs and padding mask fused into the kernel) vs GELU -> mask -> dense
    convolution in float64: outputs and (a_f, a_b, kernels) gradients; returns the number of misses."""
    failures = 0
    for batch, length, channels in CHECK_CASES:
        for dtype, tol in TOLERANCES.items():
            for approximate in ('none', 'tanh'):
                u, kernels, _ = inputs(batch, length, channels, dtype)
                mask = torch.rand(batch, length, device=DEVICE) > 0.2
                upstream = torch.randn(2, batch, length, channels, device=DEVICE)
                results = []
                for fn, cast in ((bidirectional_gelu_long_conv, lambda t: t),
                                 (_unfused_gelu_conv, torch.Tensor.double)):
                    xs = [cast(t.detach()).requires_grad_() for t in (2 * u[:, :, 0], 2 * u[:, :, 1], kernels)]
                    outs = fn(*xs, approximate=approximate, mask=mask)
                    sum((o.double() * g.double()).sum() for o, g in zip(outs, upstream)).backward()
                    results.append(list(outs) + [t.grad for t in xs])
                errs = [rel_err(a, b) for a, b in zip(*results)]
                ok = max(errs) < tol
                failures += not ok
                print(f'{"ok  " if ok else "FAIL"} B={batch} L={length} C={channels} {str(dtype):14s} '
                      f'fused GELU {approximate:4s} + mask, rel err y_f/y_b/a_f/a_b/k: '
                      + ' '.join(f'{e:.1e}' for e in errs) + f' (tol {tol:.0e})', flush=True)
    return failures


def cuda_time_ms(fn, warmup=3, reps=10) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def step_memory_mb(fn) -> float:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2 ** 20


def bench(args) -> dict:
    batch, length, d = args.batch, args.seq_len, args.dim
    tokens = batch * length
    layer = BidirectionalGatedSSM(d, 3 * d, conv_impl='fft').to(DEVICE)
    with torch.no_grad():
        kernels = torch.stack([s.kernel(length) + F.pad(s.D, (0, length - 1))
                               for s in (layer.ssm_forward, layer.ssm_backward)])
    u = torch.randn(batch, length, 2, d, device=DEVICE, dtype=torch.bfloat16)
    u_grad = u.clone().requires_grad_()
    k_grad = kernels.clone().requires_grad_()
    upstream = torch.randn_like(u)
    conv_flop = 2 * tokens * d * (length + 1)  # both directions: L (L + 1) / 2 MACs each per channel

    def triton_fwd():
        with torch.no_grad():
            bidirectional_long_conv(u, kernels, block_l=args.block_l, block_c=args.block_c)

    def triton_train():
        y = bidirectional_long_conv(u_grad, k_grad, block_l=args.block_l, block_c=args.block_c)
        torch.autograd.backward(y, upstream)

    def fft_fwd():
        with torch.no_grad():
            layer._bidirectional_ssm(u, 'fft')

    def fft_train():
        y = layer._bidirectional_ssm(u_grad, 'fft')  # the layer's kernels come from its parameters (graph recorded)
        torch.autograd.backward(y, upstream)

    heads = 16
    q = torch.randn(batch, heads, length, d // heads, device=DEVICE, dtype=torch.bfloat16)
    qkv_grad = [q.clone().requires_grad_() for _ in range(3)]
    attn_flop = 4 * batch * length * length * d

    def attn_fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, q, q)

    def attn_train():
        y = F.scaled_dot_product_attention(*qkv_grad)
        torch.autograd.backward(y, torch.ones_like(y))

    rows = []
    for name, fwd, train, flop in (('triton toeplitz (bf16)', triton_fwd, triton_train, conv_flop),
                                   ('fft route (fp32 FFTs)', fft_fwd, fft_train, None),
                                   ('sdpa attention core (bf16)', attn_fwd, attn_train, attn_flop)):
        row = {'route': name}
        try:
            row['fwd_ms'] = cuda_time_ms(fwd)
            row['train_ms'] = cuda_time_ms(train)
            row['train_mem_mb'] = step_memory_mb(train)
            row['train_mem_kb_per_token'] = row['train_mem_mb'] * 1024 / tokens
            if flop:
                row['fwd_tflops'] = flop / row['fwd_ms'] / 1e9
                row['train_tflops'] = 3 * flop / row['train_ms'] / 1e9
        except torch.cuda.OutOfMemoryError as e:
            row['error'] = f'out of memory: {str(e).splitlines()[0]}'
            torch.cuda.empty_cache()
        print(json.dumps(row), flush=True)
        rows.append(row)
    return {'device': torch.cuda.get_device_name(), 'torch': torch.__version__, 'batch': batch,
            'seq_len': length, 'dim': d, 'block_l': args.block_l, 'block_c': args.block_c, 'rows': rows}


def sweep(args) -> dict:
    batch, length, d = args.batch, args.seq_len, args.dim
    u = torch.randn(batch, length, 2, d, device=DEVICE, dtype=torch.bfloat16)
    u_grad = u.clone().requires_grad_()
    kernels = inputs(1, length, 1, torch.float32)[1]
    k_grad = kernels.clone().requires_grad_()
    conv_flop = 2 * batch * length * d * (length + 1)
    rows = []
    for block_l, block_c in ((64, 64), (64, 128), (128, 64), (128, 128), (128, 256), (256, 128)):
        row = {'block_l': block_l, 'block_c': block_c}
        try:
            with torch.no_grad():
                row['fwd_ms'] = cuda_time_ms(lambda: bidirectional_long_conv(u, kernels, block_l=block_l,
                                                                            block_c=block_c))
            row['fwd_tflops'] = conv_flop / row['fwd_ms'] / 1e9

            def train():
                y = bidirectional_long_conv(u_grad, k_grad, block_l=block_l, block_c=block_c)
                torch.autograd.backward(y, y.detach())
            row['train_ms'] = cuda_time_ms(train)
            row['train_tflops'] = 3 * conv_flop / row['train_ms'] / 1e9
        except Exception as e:  # a tile that does not fit (shared memory, registers) is a result, not a stop
            row['error'] = f'{type(e).__name__}: {str(e).splitlines()[0][:200]}'
        print(json.dumps(row), flush=True)
        rows.append(row)
    return {'device': torch.cuda.get_device_name(), 'torch': torch.__version__, 'batch': batch,
            'seq_len': length, 'dim': d, 'rows': rows}


def write(result: dict, prefix: str, title: str) -> None:
    path = Path(prefix)
    path.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ('.json', '.md'):
        if path.with_suffix(suffix).exists():
            raise SystemExit(f'{path.with_suffix(suffix)} exists; choose another --out (results are never overwritten)')
    path.with_suffix('.json').write_text(json.dumps(result, indent=2) + '\n')
    rows = result['rows']
    keys = list(dict.fromkeys(k for r in rows for k in r))  # every column any row has, in first-seen order
    lines = [f'# {title}', '', f"{result['device']}, torch {result['torch']}, B={result['batch']}, "
             f"L={result['seq_len']}, d={result['dim']}", '', '| ' + ' | '.join(keys) + ' |',
             '|' + ' --- |' * len(keys)]
    for r in rows:
        lines.append('| ' + ' | '.join(f'{r[k]:.3g}' if isinstance(r.get(k), float) else str(r.get(k, ''))
                                       for k in keys) + ' |')
    path.with_suffix('.md').write_text('\n'.join(lines) + '\n')


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('mode', choices=('check', 'sweep', 'bench'))
    p.add_argument('--seq-len', type=int, default=4096)
    p.add_argument('--batch', type=int, default=8)
    p.add_argument('--dim', type=int, default=1024)
    p.add_argument('--block-l', type=int, default=128)
    p.add_argument('--block-c', type=int, default=128)
    p.add_argument('--out', default=None, help='write PREFIX.json and PREFIX.md')
    args = p.parse_args()
    if not torch.cuda.is_available():
        print('longconv_check.py needs a CUDA device')
        return 2
    if args.mode == 'check':
        return check(args)
    result = sweep(args) if args.mode == 'sweep' else bench(args)
    if args.out:
        write(result, args.out, f'Triton long convolution, {args.mode}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
