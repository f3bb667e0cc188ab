""" Where an sMLPNet training step spends its CPU time, by ATen op (issue 34, item 2): torch.profiler over a few
eager forward + backward steps, the ops sorted by their own (self) CPU time.

Written to compare two checkouts of the package (imported from ``PYTHONPATH``), e.g. main and an attempt::

    PYTHONPATH=/path/to/checkout OMP_NUM_THREADS=1 python scripts/compile/profile_cpu.py --demo
    PYTHONPATH=/path/to/checkout OMP_NUM_THREADS=1 python scripts/compile/profile_cpu.py --img-size 224 --batch 4

``--demo`` is the model, input size and batch of ``python train.py`` with no dataset (configs/demo_digits.yaml:
``smlpnet_t`` at width 32, depths (1, 1, 2, 1), 32x32, batch 64, contiguous input as the demo feeds it).
Prints the whole step's wall time per iteration and the top ops; no file is written.
"""
import argparse
import time
from typing import List, Optional

import timm
import torch

import mlp_vision  # noqa: F401  (registers the sMLPNet models)


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--demo', action='store_true', help="train.py's demo model, 32x32, batch 64")
    p.add_argument('--img-size', type=int, default=224)
    p.add_argument('--batch', type=int, default=4)
    p.add_argument('--channels-last', action='store_true')
    p.add_argument('--iters', type=int, default=3)
    p.add_argument('--top', type=int, default=15)
    args = p.parse_args(argv)
    kwargs = dict(num_classes=10)
    if args.demo:
        kwargs.update(embed_dim=32, depths=(1, 1, 2, 1), img_size=32)
        args.img_size, args.batch = 32, 64
    torch.manual_seed(0)
    model = timm.create_model('smlpnet_t', **kwargs).train()
    x = torch.randn(args.batch, 3, args.img_size, args.img_size)
    if args.channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)

    def step():
        model.zero_grad(set_to_none=True)
        model(x).logsumexp(-1).sum().backward()
    step()  # warm-up (allocator, oneDNN primitive caches)
    start = time.perf_counter()
    for _ in range(args.iters):
        step()
    per_iter = (time.perf_counter() - start) / args.iters
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(args.iters):
            step()
    print(f'{mlp_vision.__file__}: batch {args.batch}, {args.img_size}^2, threads {torch.get_num_threads()}, '
          f'{per_iter * 1e3:.1f} ms per step ({args.batch / per_iter:.0f} img/s) unprofiled')
    print(prof.key_averages().table(sort_by='self_cpu_time_total', row_limit=args.top, max_name_column_width=40))


if __name__ == '__main__':
    main()
