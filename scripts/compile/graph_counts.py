""" What the compiled TRAINING graph of sMLPNet-T and ConvNeXt-T holds per block, on the CPU (issue 34, item 2).

Two measurements, forward and backward together, batch 2:

1. the ATen graph (``torch.compile`` with AOTAutograd and inductor's decompositions, but a backend that only counts
   nodes; seconds per model): per block, the layout nodes (``permute`` views; ``clone`` / ``copy`` / ``_to_copy``,
   which copy), the GEMMs (``mm`` / ``addmm`` / ``bmm`` with the batch count of each ``bmm``) and the convolutions.
   Nodes are given to the block whose forward made them (``nn_module_stack``, and ``fwd_nn_module_stack`` for the
   backward); nodes of a stage outside its blocks (downsampling, layout changes between blocks) are counted per stage.
2. inductor's generated code for one stage of each model (stage 3 of 4: sMLPNet-T 160 -> 320 channels, ConvNeXt-T
   192 -> 384, both at 14 x 14) built with 1 and with 2 blocks: the generated kernels and the extern calls (GEMMs,
   convolutions); the difference is what one more block costs.

Run it on each checkout (the package is imported from ``PYTHONPATH``)::

    PYTHONPATH=/path/to/checkout OMP_NUM_THREADS=2 TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 \\
        python scripts/compile/graph_counts.py --label after --out results/compile/graph_counts_after.json

Only the counts are measured, no times. ``tests/test_smlpnet_layout.py`` uses :func:`aten_block_counts` to bound the
layout nodes of an sMLPNet block.
"""
import argparse
import collections
import json
import platform
import re
import time
from functools import partial
from typing import Callable, Dict, List, Optional

import timm
import torch
import torch.nn as nn

import mlp_vision  # noqa: F401  (registers the sMLPNet models)

LAYOUT_VIEWS = ('permute', 'transpose', 't')  # views: free unless a consumer needs another layout
LAYOUT_COPIES = ('clone', 'copy', 'copy_', '_to_copy', 'contiguous')  # each one writes the activations again
GEMMS = ('mm', 'addmm', 'bmm', 'baddbmm')
CONVS = ('convolution', 'convolution_backward')

_BLOCK = re.compile(r'stages\.(\d+)\.blocks\.(\d+)$')
_STAGE = re.compile(r'stages\.(\d+)$')


def _op_name(node) -> str:
    """'aten.permute.default' -> 'permute'."""
    parts = str(node.target).split('.')
    return parts[1] if len(parts) == 3 and parts[0] == 'aten' else str(node.target)


def _owner(node, key: str) -> str:
    """'stages.S.blocks.B' for a node a block made, 'stages.S' for one its stage made outside blocks, else 'other'."""
    paths = [path for path, _ in (node.meta.get(key) or {}).values()]
    for pattern in (_BLOCK, _STAGE):
        for path in reversed(paths):
            found = pattern.search(path.replace("L['self'].", ''))
            if found:
                return found.group(0)
    return 'other'


def capture_training_graphs(model: nn.Module, x: torch.Tensor) -> List:
    """The forward and backward ATen graphs (``torch.fx.GraphModule``) of one training step of ``model`` on ``x``,
    decomposed as inductor decomposes them, nothing compiled (fullgraph: a graph break would fail here)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._inductor.decomposition import select_decomp_table
    graphs = []

    def keep(tag):
        def compiler(gm, example_inputs):
            graphs.append((tag, gm))
            return make_boxed_func(gm.forward)
        return compiler
    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=keep('fw'), bw_compiler=keep('bw'), decompositions=select_decomp_table())
    torch.compile(model, backend=backend, fullgraph=True)(x).sum().backward()
    return graphs


def aten_block_counts(model: nn.Module, x: torch.Tensor) -> Dict[str, Dict[str, object]]:
    """Per owner ('stages.S.blocks.B', 'stages.S' outside its blocks, 'other'): counts of layout views, layout
    copies, GEMMs, convolutions over the forward and backward ATen graphs, split 'fw' / 'bw', with the batch
    count of every ``bmm`` (its number of independent GEMMs)."""
    out: Dict[str, Dict[str, object]] = collections.defaultdict(
        lambda: {'views': collections.Counter(), 'copies': collections.Counter(), 'gemms': collections.Counter(),
                 'convs': collections.Counter(), 'bmm_batches': []})
    for tag, gm in capture_training_graphs(model, x):
        key = 'nn_module_stack' if tag == 'fw' else 'fwd_nn_module_stack'
        for node in gm.graph.nodes:
            if node.op != 'call_function':
                continue
            op, entry = _op_name(node), out[_owner(node, key)]
            for kind, names in (('views', LAYOUT_VIEWS), ('copies', LAYOUT_COPIES), ('gemms', GEMMS),
                                ('convs', CONVS)):
                if op in names:
                    entry[kind][tag] += 1
            if op in ('bmm', 'baddbmm'):
                entry['bmm_batches'].append(int(node.meta['val'].shape[0]))
    return dict(out)


def _mean_per_block(counts: Dict[str, Dict[str, object]]) -> Dict[str, object]:
    blocks = [v for k, v in counts.items() if _BLOCK.fullmatch(k)]
    stages = [v for k, v in counts.items() if _STAGE.fullmatch(k)]

    def mean(entries, kind, tag):
        return round(sum(e[kind][tag] for e in entries) / max(len(entries), 1), 2)
    row = {'blocks': len(blocks)}
    for kind in ('views', 'copies', 'gemms', 'convs'):
        for tag in ('fw', 'bw'):
            row[f'{kind}_{tag}_per_block'] = mean(blocks, kind, tag)
            row[f'{kind}_{tag}_per_stage_outside_blocks'] = mean(stages, kind, tag)
    row['copies_total'] = sum(sum(v['copies'].values()) for v in counts.values())
    row['bmm_batches_per_block_by_stage'] = {
        k.split('.blocks')[0]: v['bmm_batches'] for k, v in counts.items() if k.endswith('.blocks.0')}
    return row


def inductor_stage_counts(make_stage: Callable[[int], nn.Module], x: torch.Tensor) -> Dict[str, int]:
    """Generated kernels and extern calls of one training step of ``make_stage(depth)`` compiled by inductor, for
    depth 1 and 2 and their difference (one block)."""
    from torch._inductor import metrics
    from torch._inductor.utils import run_and_get_code
    rows = {}
    for depth in (1, 2):
        torch._dynamo.reset()
        metrics.reset()
        torch.manual_seed(0)
        stage = make_stage(depth).train()
        compiled = torch.compile(stage)
        xi = x.clone().requires_grad_()
        _, codes = run_and_get_code(lambda: compiled(xi).sum().backward())
        code = '\n'.join(codes)
        rows[depth] = {
            'kernels': metrics.generated_kernel_count,
            'extern_calls': len(re.findall(r'extern_kernels\.\w+\(|torch\.ops\.aten\.\w+\.default\(', code)),
        }
    return {'depth1': rows[1], 'depth2': rows[2],
            'per_block': {k: rows[2][k] - rows[1][k] for k in rows[1]}}


def _stage_of(name: str, depth: int) -> nn.Module:
    """Stage 3 of 4 (index 2) of the registered model ``name``, its blocks cut to ``depth``."""
    stage = timm.create_model(name, num_classes=0).stages[2]
    stage.blocks = stage.blocks[:depth]
    return stage


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--label', required=True, help="what is measured, e.g. 'before' (main) or 'after'")
    p.add_argument('--batch', type=int, default=2)
    p.add_argument('--img-size', type=int, default=224)
    p.add_argument('--no-inductor', action='store_true', help='skip the inductor kernel counts (minutes on a CPU)')
    p.add_argument('--out', default='')
    args = p.parse_args(argv)
    report = {'label': args.label, 'date': time.strftime('%Y-%m-%d'), 'torch': torch.__version__,
              'timm': timm.__version__, 'mlp_vision': mlp_vision.__file__, 'machine': platform.processor() or
              platform.machine(), 'threads': torch.get_num_threads(), 'batch': args.batch, 'img_size': args.img_size,
              'models': {}}
    for name in ('smlpnet_t', 'convnext_tiny'):
        torch.manual_seed(0)
        model = timm.create_model(name, num_classes=10).train().to(memory_format=torch.channels_last)
        x = torch.randn(args.batch, 3, args.img_size, args.img_size).contiguous(memory_format=torch.channels_last)
        row = _mean_per_block(aten_block_counts(model, x))
        print(name, json.dumps(row), flush=True)
        report['models'][name] = {'aten': row}
    if not args.no_inductor:
        for name, chans in (('smlpnet_t', 160), ('convnext_tiny', 192)):
            x = torch.randn(args.batch, chans, 28, 28).contiguous(memory_format=torch.channels_last)
            row = inductor_stage_counts(partial(_stage_of, name), x)
            print(name, 'inductor', json.dumps(row), flush=True)
            report['models'][name]['inductor_stage3'] = row
    if args.out:
        with open(args.out, 'x') as f:  # never overwrites a measurement
            json.dump(report, f, indent=2)


if __name__ == '__main__':
    main()
