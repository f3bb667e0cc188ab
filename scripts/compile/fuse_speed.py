""" Eager CPU training step of sMLPNet as it is and as it was before issue 34 item 2's layout changes, alternated in
one process on the same weights: ``split`` (the model as it is: the sMLP's ``fuse_conv([x, x_h, x_w])``, three
accumulated GEMMs, :class:`~mlp_vision.layers.ChannelConcatConv2d`; each stage's output through the view that makes
its gradient channels-last) and ``concat`` (``fuse_conv(torch.cat([x, x_h, x_w], 1))``, one 1x1 conv over the written
concatenation, and the stages returning their blocks' output as it is: main before the change).

    OMP_NUM_THREADS=1 python scripts/compile/fuse_speed.py --demo --rounds 5
    OMP_NUM_THREADS=1 python scripts/compile/fuse_speed.py --img-size 224 --batch 4 --channels-last --rounds 3

``--demo`` is ``python train.py``'s model and batch (configs/demo_digits.yaml: width 32, depths (1, 1, 2, 1), 32x32,
batch 64, AdamW). A step is forward, backward and the optimizer step; each round times ``--steps`` steps of each way,
the order of the two swapped every round; printed: img/s per round and the median of each. No file is written.
"""
import argparse
import statistics
import time
import types
from typing import List, Optional

import timm
import torch

import mlp_vision  # noqa: F401  (registers the sMLPNet models)
from mlp_vision.layers import AxialSparseMLP
from mlp_vision.models.smlpnet import SparseMLPStage


def _concat_forward(self: AxialSparseMLP, x: torch.Tensor) -> torch.Tensor:
    """AxialSparseMLP.forward as before the change: the fuse conv over the written concatenation."""
    x = self.act(self.norm(x.contiguous(memory_format=torch.channels_last)))
    x_h = self.proj_h(x.transpose(2, 3)).transpose(2, 3)
    x_w = self.proj_w(x)
    return self.fuse_conv(torch.cat([x, x_h, x_w], dim=1))


def _plain_stage_forward(self: SparseMLPStage, x: torch.Tensor) -> torch.Tensor:
    """SparseMLPStage.forward as before the change (no grad checkpointing here): the blocks' output as it is."""
    return self.blocks(self.downsample(x))


def _set_fuse(model: torch.nn.Module, way: str) -> None:
    for module in model.modules():
        before = {AxialSparseMLP: _concat_forward, SparseMLPStage: _plain_stage_forward}.get(type(module))
        if before is not None:
            if way == 'concat':
                module.forward = types.MethodType(before, module)
            else:
                module.__dict__.pop('forward', None)  # back to the class's forward


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--demo', action='store_true')
    p.add_argument('--img-size', type=int, default=224)
    p.add_argument('--batch', type=int, default=4)
    p.add_argument('--channels-last', action='store_true')
    p.add_argument('--rounds', type=int, default=5)
    p.add_argument('--steps', type=int, default=10)
    args = p.parse_args(argv)
    kwargs = dict(num_classes=10)
    if args.demo:
        kwargs.update(embed_dim=32, depths=(1, 1, 2, 1), img_size=32)
        args.img_size, args.batch = 32, 64
    torch.manual_seed(0)
    model = timm.create_model('smlpnet_t', **kwargs).train()
    x = torch.randn(args.batch, 3, args.img_size, args.img_size)
    target = torch.randint(0, 10, (args.batch,))
    if args.channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def steps(way: str, n: int) -> float:
        _set_fuse(model, way)
        start = time.perf_counter()
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), target).backward()
            opt.step()
        return n * args.batch / (time.perf_counter() - start)
    with torch.no_grad():  # the two ways compute the same function (eval mode: running statistics untouched)
        outs = [(_set_fuse(model.eval(), way), model(x))[1] for way in ('split', 'concat')]
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)
    model.train()
    for way in ('split', 'concat'):
        steps(way, 2)  # warm-up
    rates = {'split': [], 'concat': []}
    for r in range(args.rounds):
        for way in (('split', 'concat') if r % 2 == 0 else ('concat', 'split')):
            rates[way].append(steps(way, args.steps))
        print(f'round {r + 1}: split {rates["split"][-1]:.4g} img/s, concat {rates["concat"][-1]:.4g} img/s',
              flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f'median img/s, batch {args.batch}, {args.img_size}^2, threads {torch.get_num_threads()}, channels_last '
          f'{args.channels_last}: split {med["split"]:.4g}, concat {med["concat"]:.4g}, ratio split/concat '
          f'{med["split"] / med["concat"]:.3f}')


if __name__ == '__main__':
    main()
