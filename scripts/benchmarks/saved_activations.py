""" Activation memory a training step keeps per token: the bytes of the distinct tensors autograd saves for the
backward pass of one BiGS layer (each SSM convolution route) and of the BERT layer it replaces, under bf16 autocast
on the CPU. Parameters (and their bf16 casts) are left out, so the number is what grows with the sequence.
Each layer is measured at 3 and 6 sequences: the KiB per token at 3, and the growth per token as the batch grows
(per-sequence-length tables, such as the SSM kernels, weigh less at the larger batches a GPU trains with). With
``--compiled`` each layer is also measured under ``torch.compile`` (both sides the same mode): there AOTAutograd's
partitioner, not the module code, decides what the training step keeps.

This is the part of the GPU's step memory that the model code decides (the allocator, workspaces and the Triton
kernel's tiles come on top); ``triton`` runs in Triton's interpreter here (CPU tensors take it without
TRITON_INTERPRET), at fewer tokens. The layer code measured is this checkout's, wherever the script is run from.

    python scripts/benchmarks/saved_activations.py [--compiled]
"""
import argparse
import sys
from pathlib import Path
from typing import Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout, not an installed copy

from mlp_vision.benchmark import saved_activation_bytes as _saved_bytes  # noqa: E402
from mlp_vision.layers import BidirectionalGatedSSM  # noqa: E402
from mlp_vision.text.bert import BertLayer  # noqa: E402


def saved_activation_bytes(layer: torch.nn.Module, x: torch.Tensor) -> int:
    return _saved_bytes(layer, x, autocast_dtype=torch.bfloat16)


def kib_per_token(layer: torch.nn.Module, batches: Tuple[int, int], length: int, dim: int) -> Tuple[float, float]:
    """KiB kept per token at ``batches[0]`` sequences, and the growth per token as the batch grows (what is kept
    is linear in the batch: per-token activations plus per-sequence-length tables such as the SSM kernels')."""
    kept = [saved_activation_bytes(layer, torch.randn(batch, length, dim, requires_grad=True)) for batch in batches]
    return kept[0] / (batches[0] * length) / 1024, (kept[1] - kept[0]) / ((batches[1] - batches[0]) * length) / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--dim', type=int, default=1024)
    p.add_argument('--hidden-dim', type=int, default=3072)
    p.add_argument('--ffn-dim', type=int, default=4096)
    p.add_argument('--heads', type=int, default=16)
    p.add_argument('--compiled', action='store_true',
                   help='also measure each layer under torch.compile (fullgraph)')
    args = p.parse_args()
    torch.manual_seed(0)
    batches = (3, 6)
    rows = []
    for name, layer, length in [
            *[(f'BiGS layer, conv_impl={impl}', BidirectionalGatedSSM(args.dim, args.hidden_dim, conv_impl=impl),
               128 if impl == 'triton' else 640) for impl in ('direct', 'fft', 'triton', 'chunked')],
            ('BERT layer (SDPA)', BertLayer(args.dim, num_heads=args.heads, ffn_dim=args.ffn_dim), 640)]:
        runs = [layer, torch.compile(layer, fullgraph=True)] if args.compiled else [layer]
        for run in runs[1:]:  # compile once per batch before counting
            for batch in batches:
                saved_activation_bytes(run, torch.randn(batch, length, args.dim, requires_grad=True))
        rows.append((f'{name}, {length} tokens', [kib for run in runs
                                                   for kib in kib_per_token(run, batches, length, args.dim)]))
    modes = ['eager'] + (['compiled'] if args.compiled else [])
    print('| layer | ' + ' | '.join(f'{m}: batch {batches[0]} | {m}: per token as the batch grows' for m in modes)
          + ' |\n|' + ' --- |' * (1 + 2 * len(modes)))
    for name, kibs in rows:
        print(f'| {name} | ' + ' | '.join(f'{kib:.1f}' for kib in kibs) + ' |')


if __name__ == '__main__':
    main()
