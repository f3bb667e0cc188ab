""" CPU proxy of the GPU cost of the gMLP / sMLPNet layout variants (issue 45 item 2): bytes the training step moves
and the GEMMs it runs, counted at PyTorch's dispatcher; nothing is timed.

For each model (every variant of gMLP-S and sMLPNet-T, and ViT-S / ConvNeXt-T for scale): one eager forward +
backward of a batch of 2 channels-last 224x224 images, float32. Counted: bytes written (new or in-place outputs,
views excluded: :mod:`written_bytes`), bytes read (every tensor argument of every op, views included once per
op that reads them), and the GEMM calls (mm / addmm / bmm / baddbmm with their shapes). Eager, so each op is one
kernel: what ``torch.compile`` would fuse counts as separate passes (an upper bound on the compiled step; the
ranking of the variants is the point). A variant that moves fewer bytes is the one to measure first on the GPU.

``--inductor``: instead, the bytes the kernels of the ``torch.compile`` (inductor, CPU code generation) training
graphs (forward and backward) read and write, as inductor's scheduler counts them (``graph.count_bytes``, logged at
INFO by its ``inductor_metrics`` logger); each model at two reduced depths (one more block in the second; the
stage of 14 x 14 maps for the pyramids), so that the difference is the bytes of one block. timm's gMLP is left out
there (its depth is fixed).

    python scripts/benchmarks/layout_variants.py [--batch 2] [--models 'gMLP-S' ...] [--inductor] [--out FILE.md]
"""
import argparse
import contextlib
import logging
import platform
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import timm
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout, not an installed copy

import mlp_vision  # noqa: E402,F401  (registers the models with timm)

MiB = 2 ** 20
GEMM_OPS = ('aten.mm.default', 'aten.addmm.default', 'aten.bmm.default', 'aten.baddbmm.default')

# (label, timm name, create_model kwargs): every layout variant of gMLP-S and sMLPNet-T, and the references
CONTENDERS: List[Tuple[str, str, Dict[str, Any]]] = [
    ('gMLP-S', 'gmlp_s', {}),
    ('gMLP-S split_fc1', 'gmlp_s', dict(block_kwargs=dict(split_fc1=True))),
    ('gMLP-S token_major', 'gmlp_s', dict(block_kwargs=dict(token_major=True))),
    ('gMLP-S token_major+split_fc1', 'gmlp_s', dict(block_kwargs=dict(token_major=True, split_fc1=True))),
    ('timm gmlp_s16_224', 'gmlp_s16_224', {}),
    ('ViT-S', 'vit_small_patch16_224', {}),
    ('sMLPNet-T', 'smlpnet_t', {}),
    ('sMLPNet-T one_gemm_mixes', 'smlpnet_t', dict(one_gemm_mixes=True)),
    ('ConvNeXt-T', 'convnext_tiny', {}),
]

# --inductor: the two reduced depths of each family (the second has one block more)
REDUCED_DEPTHS = {'gmlp_s': [dict(num_blocks=1), dict(num_blocks=2)],
                  'vit_small_patch16_224': [dict(depth=1), dict(depth=2)],
                  'smlpnet_t': [dict(depths=(1, 1, 1, 1)), dict(depths=(1, 1, 2, 1))],
                  'convnext_tiny': [dict(depths=(1, 1, 1, 1)), dict(depths=(1, 1, 2, 1))]}


class _Traffic(TorchDispatchMode):
    """Per aten op: bytes written (new or mutated outputs), bytes read (tensor arguments); GEMM shapes."""

    def __init__(self):
        super().__init__()
        self.written: Counter = Counter()
        self.read: Counter = Counter()
        self.gemms: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        inputs = {t.untyped_storage().data_ptr() for t in tensors}
        out = func(*args, **(kwargs or {}))
        name = str(func)
        if name.startswith('aten.') and not func.is_view:
            self.read[name] += sum(t.numel() * t.element_size() for t in tensors)
        for t in tree_leaves(out):
            fresh = isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs
            if isinstance(t, torch.Tensor) and (func._schema.is_mutable or fresh):
                self.written[name] += t.numel() * t.element_size()
        if name in GEMM_OPS:
            self.gemms[(name.split('.')[1], ' x '.join(str(tuple(t.shape)) for t in tensors))] += 1
        return out


def training_step_traffic(model: nn.Module, x: torch.Tensor) -> _Traffic:
    """The traffic of one eager forward + backward (the loss: the logits' sum), parameters' grads included."""
    with _Traffic() as traffic:
        model(x).sum().backward()
    return traffic


@contextlib.contextmanager
def _inductor_byte_counts() -> Iterator[None]:
    """Inductor counts its graphs' bytes (``torch._inductor.metrics.num_bytes_accessed``) only while its metrics
    logger is at INFO: enabled here, its records dropped, the logger restored on exit; caches off, so that every
    graph is compiled (and counted)."""
    log = logging.getLogger('torch._inductor.compile_fx.__inductor_metrics')
    saved = log.level, log.propagate
    handler = logging.NullHandler()
    log.setLevel(logging.INFO)
    log.propagate = False
    log.addHandler(handler)
    try:
        with torch._inductor.config.patch(force_disable_caches=True):
            yield
    finally:
        log.removeHandler(handler)
        log.setLevel(saved[0])
        log.propagate = saved[1]


def compiled_step_bytes(name: str, kwargs: Dict[str, Any], batch: int) -> float:
    """Bytes inductor's kernels of the compiled training step (forward and backward graphs) access."""
    from torch._inductor import metrics
    torch._dynamo.reset()
    metrics.reset()
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=1000, **kwargs).train().to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, 224, 224).contiguous(memory_format=torch.channels_last)
    with _inductor_byte_counts():
        torch.compile(model)(x).sum().backward()
    return metrics.num_bytes_accessed


def inductor_rows(args) -> List[str]:
    rows = []
    for label, name, kwargs in CONTENDERS:
        if (args.models and label not in args.models) or name not in REDUCED_DEPTHS:
            continue
        small, large = (compiled_step_bytes(name, dict(kwargs, **depth), args.batch) for depth in REDUCED_DEPTHS[name])
        rows.append(f'| {label} | {REDUCED_DEPTHS[name][0]} | {small / MiB:,.0f} | {large / MiB:,.0f} | '
                    f'{(large - small) / MiB:,.1f} |')
        print(rows[-1], flush=True)
    return [f'| model (batch {args.batch}, fp32, channels_last, inductor CPU, fwd + bwd graphs) | reduced depth | '
            f'MiB accessed | MiB with one block more | MiB per block |', '| --- | --- | --- | --- | --- |'] + rows


def _top(counter: Counter, n: int) -> str:
    return ', '.join(f'{op.replace("aten.", "").replace(".default", "")} {b / MiB:,.0f}'
                     for op, b in counter.most_common(n))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--batch', type=int, default=2)
    p.add_argument('--models', nargs='*', default=None, help='labels to count (default: all)')
    p.add_argument('--inductor', action='store_true', help="count the compiled graphs' kernel bytes instead")
    p.add_argument('--out', type=Path, default=None, help='also write the markdown tables here (must not exist)')
    args = p.parse_args()
    if args.out is not None and args.out.exists():
        sys.exit(f'error: {args.out} exists; give a new file name (results are never overwritten)')
    torch.set_num_threads(1)
    if args.inductor:
        text = '\n'.join(inductor_rows(args)) + '\n'
    else:
        text = eager_tables(args)
    print(text)
    if args.out is not None:
        cpu = subprocess.run(['lscpu'], capture_output=True, text=True).stdout
        model_name = next((ln.split(':', 1)[1].strip() for ln in cpu.splitlines() if ln.startswith('Model name')),
                          platform.processor())
        header = (f'Device: {model_name}; torch {torch.__version__}, timm {timm.__version__}, python '
                  f'{platform.python_version()}.\nCommand: `python {" ".join(sys.argv)}`\n\n')
        args.out.write_text(header + text)


def eager_tables(args) -> str:
    """The eager traffic table and each model's GEMM calls (markdown)."""
    rows, gemm_sections = [], []
    for label, name, kwargs in CONTENDERS:
        if args.models and label not in args.models:
            continue
        torch.manual_seed(0)
        model = timm.create_model(name, num_classes=1000, **kwargs).train().to(memory_format=torch.channels_last)
        x = torch.randn(args.batch, 3, 224, 224).contiguous(memory_format=torch.channels_last)
        t = training_step_traffic(model, x)
        written, read = sum(t.written.values()), sum(t.read.values())
        rows.append(f'| {label} | {written / MiB:,.0f} | {read / MiB:,.0f} | {sum(t.gemms.values())} | '
                    f'{_top(t.written, 4)} |')
        print(rows[-1], flush=True)
        gemm_sections.append(f'### {label}\n\n| op | shapes (args) | calls |\n| --- | --- | --- |\n' + '\n'.join(
            f'| {op} | {shapes} | {n} |' for (op, shapes), n in sorted(t.gemms.items(), key=lambda kv: -kv[1])))
    table = (f'| model (batch {args.batch}, fp32, channels_last, eager fwd + bwd) | MiB written | MiB read '
             f'| GEMM calls | top writers (MiB) |\n| --- | --- | --- | --- | --- |\n' + '\n'.join(rows))
    return table + '\n\n## GEMM calls (forward and backward)\n\n' + '\n\n'.join(gemm_sections) + '\n'


if __name__ == '__main__':
    main()
