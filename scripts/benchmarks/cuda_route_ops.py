""" Did a change alter what runs on CUDA? The aten ops (with input shapes, strides and dtypes) that one float32
channels-last training step (forward and backward, batch 2, 224x224) of each model dispatches, with the token-padding
decision a CUDA input gets (``token_multiple_on``; as the ``pad_as_on_cuda`` test fixture does), written one per
line. Run it on two checkouts and compare the sorted lists: the same multiset means the same kernels on CUDA, up to
their order. Traced on the CPU, so a route chosen by device (BiGS's ``conv_impl='auto'``) is not covered.

    PYTHONPATH=OLD_CHECKOUT python scripts/benchmarks/cuda_route_ops.py old.txt
    PYTHONPATH=NEW_CHECKOUT python scripts/benchmarks/cuda_route_ops.py new.txt
    diff <(sort old.txt) <(sort new.txt)
"""
import argparse

import timm
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import mlp_vision  # noqa: F401  (registers the models with timm; the one PYTHONPATH names)
from mlp_vision.layers import gating, linear


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f'T{tuple(value.shape)}s{tuple(value.stride())}{str(value.dtype)[6:]}'
    return repr(value) if isinstance(value, (int, float, bool, str, type(None))) else type(value).__name__


class _OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.lines = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = ' '.join(_describe(a) for a in tree_leaves((args, kwargs)))
        outputs = ' '.join(_describe(o) for o in tree_leaves(out) if isinstance(o, torch.Tensor))
        self.lines.append(f'{func} {inputs} -> {outputs}')
        return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('out', help='the file the op lines go to (must not exist)')
    p.add_argument('--models', nargs='*', default=['gmlp_s', 'gmlp_ti', 'mixer_b16', 'mixer_s16', 'smlpnet_t'])
    args = p.parse_args()
    for module in (linear, gating):  # checkouts that decide by device: take the CUDA decision for CPU inputs
        if hasattr(module, 'token_multiple_on'):
            module.token_multiple_on = lambda device, token_multiple: token_multiple
    torch.manual_seed(0)
    with open(args.out, 'x') as f:
        for name in args.models:
            model = timm.create_model(name).train().to(memory_format=torch.channels_last)
            x = torch.randn(2, 3, 224, 224).to(memory_format=torch.channels_last)
            log = _OpLog()
            with log:
                model(x).sum().backward()
            f.write(f'== {name}: {len(log.lines)} ops\n' + '\n'.join(log.lines) + '\n')
            print(f'{name}: {len(log.lines)} ops')


if __name__ == '__main__':
    main()
