""" Activation memory a training step keeps per token: the bytes of the distinct tensors autograd saves for the
backward pass of one BiGS layer (each SSM convolution route) and of the BERT layer it replaces, under bf16 autocast
on the CPU. Parameters (and their bf16 casts) are left out, so the number is what grows with the sequence.
With ``--compiled`` each layer is also measured under ``torch.compile`` (both sides the same mode): there
AOTAutograd's partitioner, not the module code, decides what the training step keeps.

This is the part of the GPU's step memory that the model code decides (the allocator, workspaces and the Triton
kernel's tiles come on top); ``triton`` runs in Triton's interpreter here (CPU tensors take it without
TRITON_INTERPRET), at fewer tokens. The layer code measured is this checkout's, wherever the script is run from.

    python scripts/benchmarks/saved_activations.py [--compiled]
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout, not an installed copy

from mlp_vision.layers import BidirectionalGatedSSM  # noqa: E402
from mlp_vision.text.bert import BertLayer  # noqa: E402


def saved_activation_bytes(layer: torch.nn.Module, x: torch.Tensor) -> int:
    shapes = {tuple(p.shape) for p in layer.parameters()} | {tuple(p.shape[::-1]) for p in layer.parameters()}
    kept = {}

    def pack(t):
        if tuple(t.shape) not in shapes:  # batch x length never equals a weight's shape at the sizes used here
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast('cpu', dtype=torch.bfloat16):
        layer(x)
    return sum(kept.values())


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
    rows = []
    for name, layer, shape in [
            *[(f'BiGS layer, conv_impl={impl}', BidirectionalGatedSSM(args.dim, args.hidden_dim, conv_impl=impl),
               (3, 128 if impl == 'triton' else 640, args.dim)) for impl in ('direct', 'fft', 'triton')],
            ('BERT layer (SDPA)', BertLayer(args.dim, num_heads=args.heads, ffn_dim=args.ffn_dim), (3, 640, args.dim))]:
        x = torch.randn(shape, requires_grad=True)
        per_token = [saved_activation_bytes(layer, x) / (shape[0] * shape[1]) / 1024]
        if args.compiled:
            compiled = torch.compile(layer, fullgraph=True)
            saved_activation_bytes(compiled, x)  # compiles
            per_token.append(saved_activation_bytes(compiled, x) / (shape[0] * shape[1]) / 1024)
        rows.append((name, per_token))
    print('| layer | KiB kept per token, eager |' + (' compiled |' if args.compiled else '') + '\n| --- | --- |'
          + (' --- |' if args.compiled else ''))
    for name, per_token in rows:
        print(f'| {name} | ' + ' | '.join(f'{kib:.1f}' for kib in per_token) + ' |')


if __name__ == '__main__':
    main()
