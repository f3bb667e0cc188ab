""" Bytes a computation writes, counted at PyTorch's dispatcher: a CPU proxy of what a memory-bound GPU step moves.

Every op's outputs that are new tensors (or that it writes in place) are counted; views are not. Eager, so each op
is one kernel: what ``torch.compile`` fuses is counted as separate passes (an upper bound on the compiled step).

    python scripts/benchmarks/written_bytes.py [--dim 1024] [--seq-len 16384]

prints, for the BiGS layer's SSM convolution on each route (both directions, bf16 inputs, no graph), the bytes
written per byte of input and the ops that write the most (BiGS-large's width by default: the kernels' per-length
tables weigh more at a small width).
"""
import argparse
import sys
from pathlib import Path
from typing import Callable, Dict, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout, not an installed copy

from mlp_vision.layers import BidirectionalGatedSSM  # noqa: E402


class _WrittenBytes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.by_op: Dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and (func._schema.is_mutable or t.untyped_storage().data_ptr() not in inputs):
                self.by_op[str(func)] = self.by_op.get(str(func), 0) + t.numel() * t.element_size()
        return out


def written_bytes(fn: Callable[[], object]) -> Tuple[int, Dict[str, int]]:
    """``(total, by_op)``: the bytes ``fn()`` writes, in all and per aten op."""
    with _WrittenBytes() as counter:
        fn()
    return sum(counter.by_op.values()), counter.by_op


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--dim', type=int, default=1024)
    p.add_argument('--seq-len', type=int, default=16384)
    args = p.parse_args()
    torch.manual_seed(0)
    layer = BidirectionalGatedSSM(args.dim, 3 * args.dim)
    a_f, a_b = torch.randn(2, 1, args.seq_len, args.dim, dtype=torch.bfloat16)
    input_bytes = 2 * a_f.numel() * a_f.element_size()
    routes = {'fft': lambda: layer._bidirectional_ssm(torch.stack([a_f, a_b], 2), 'fft'),
              'chunked': lambda: layer._chunked_ssm(a_f, a_b)}
    print(f'| route ({args.seq_len} tokens, d {args.dim}, bf16) | bytes written / input bytes | top ops |\n'
          '| --- | --- | --- |')
    for name, fn in routes.items():
        with torch.no_grad():
            total, by_op = written_bytes(fn)
        top = sorted(by_op.items(), key=lambda kv: -kv[1])[:5]
        print(f'| {name} | {total / input_bytes:.1f} | '
              + ', '.join(f'{op.replace("aten.", "").replace(".default", "")} {b / input_bytes:.1f}' for op, b in top)
              + ' |')


if __name__ == '__main__':
    main()
