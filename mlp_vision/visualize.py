""" ``mlp-vision-visualize`` / ``python -m mlp_vision.visualize``: draw what the token-mixing layers learned, as
the papers show it (usage in the README), into a new or empty ``--out``.

* gMLP (arXiv 2105.08050, §3.1, Fig. 3): each layer's spatial projection ``W`` (n x n, row i = the weights with
  which output token i reads every input token), for a grid of tokens, as the row on the patch grid: a layer x token
  table of 2-D filters. Text gMLP (Fig. 4 view): the centre token's row over the relative position, per layer.
* sMLPNet (arXiv 2109.05422, §3.2, Alg. 1): the H-mixing (H x H) and W-mixing (W x W) weights of every block.
* BiGS (arXiv 2212.10544, §4): each layer's forward (causal) and backward SSM impulse response, the S4D kernel
  ``K`` with ``D`` at lag 0 (one kernel per layer and direction, shared by all channels).
"""
import argparse
import importlib.util
import math
import os
import re
import textwrap
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import timm
import torch
import torch.nn as nn
from timm.models.mlp_mixer import SpatialGatingUnit as TimmSpatialGatingUnit

from .arguments import (
    ArgumentParser, DefaultsHelpFormatter, ParseKwargs, add_threads_argument, check_range, set_threads)
from .bounds import within_bounds
from .errors import UsageError, run_cli
from .layers.gating import SpatialGatingUnit
from .layers.sparse_mlp import AxialSparseMLP
from .layers.ssm import BidirectionalGatedSSM
from .image_model import add_common_arguments, create_model, create_model_for_eval, model_create_kwargs

__all__ = ['spatial_projections', 'axial_weights', 'ssm_responses', 'token_grid', 'load_model', 'visualize', 'main']

Named = List[Tuple[str, torch.Tensor]]
LAYERS_PER_FIGURE = 10  # rows of one gMLP filter table


# ------------------------------------------------------------------------------------------------ what is drawn
def spatial_projections(model: nn.Module) -> Named:
    """``(module name, W)`` for every Spatial Gating Unit (ours, or timm's): ``W`` (n, n) is the token mixing applied
    (Toeplitz expanded, causal masked), ``W[i, j]`` the weight of input token j in output token i (gMLP eq. 2)."""
    return [(name, (m.spatial_weight(m.seq_len) if isinstance(m, SpatialGatingUnit) else m.proj.weight)
             .detach().float().cpu())
            for name, m in model.named_modules() if isinstance(m, (SpatialGatingUnit, TimmSpatialGatingUnit))]


def axial_weights(model: nn.Module) -> List[Tuple[str, torch.Tensor, torch.Tensor]]:
    """``(module name, W_H (H, H), W_W (W, W))`` for every sMLP: ``W_H[i, j]`` weighs row j in output row i, shared
    by every column and channel (W_W likewise for columns; sMLPNet Alg. 1)."""
    return [(name, m.proj_h.weight.detach().float().cpu(), m.proj_w.weight.detach().float().cpu())
            for name, m in model.named_modules() if isinstance(m, AxialSparseMLP)]


@torch.no_grad()
def ssm_responses(model: nn.Module, length: int) -> Named:
    """``(module name, R (2, length))`` for every BiGS layer: ``R[0, l]`` is the weight of token ``t - l`` in the
    forward SSM's output at t, ``R[1, l]`` that of token ``t + l`` in the backward SSM's: the S4D kernel ``K`` with
    the skip term ``D`` added at lag 0, the whole convolution the layer applies (BiGS §4)."""
    def response(ssm):
        k = ssm.kernel(length).float().clone()
        k[0] += ssm.D.float()[0]
        return k
    return [(name, torch.stack([response(m.ssm_forward), response(m.ssm_backward)]).cpu())
            for name, m in model.named_modules() if isinstance(m, BidirectionalGatedSSM)]


def token_grid(model: nn.Module, num_tokens: int) -> Optional[Tuple[int, int]]:
    """The (rows, cols) patch grid of a vision model's ``num_tokens`` tokens; None for a sequence model."""
    grid = getattr(getattr(model, 'stem', None), 'grid_size', None)
    return (int(grid[0]), int(grid[1])) if grid is not None and grid[0] * grid[1] == num_tokens else None


# ------------------------------------------------------------------------------------------------ figures
def _subplots(rows: int, cols: int, figsize: Tuple[float, float]):
    """(figure, axes[rows, cols]) without pyplot, which would set matplotlib globals (the backend)."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(rows, cols, squeeze=False)


def _finish(fig, path: str, *title_lines: str, fontsize: int = 8) -> str:
    chars = int(fig.get_figwidth() * 110 / fontsize)
    fig.suptitle('\n'.join(textwrap.fill(line, chars) for line in title_lines), fontsize=fontsize)
    fig.tight_layout()
    if os.path.exists(path):  # --out was empty; two figures of one run never share a name
        raise UsageError(f'{path} exists; nothing is overwritten')
    fig.savefig(path, dpi=100)
    return path


def _heatmap(ax, values: torch.Tensor) -> None:
    vmax = values.abs().max().item() or 1.
    ax.imshow(values.numpy(), cmap='RdBu_r', vmin=-vmax, vmax=vmax, interpolation='nearest')


def _index(name: str, after: str = '') -> Optional[str]:
    """The last index in a module name (``'blocks.3.sgu'`` -> ``'3'``), or the one after ``after`` (``'stages'``)."""
    found = re.findall(rf'{after}\.(\d+)(?:\.|$)' if after else r'\.(\d+)(?:\.|$)', name)
    return found[-1] if found else None


def draw_spatial_filters(projections: Named, grid: Tuple[int, int], out: str, title: str,
                         per_side: int = 3) -> List[str]:
    """gMLP Fig. 3 view: a table of layers (rows) x tokens (columns); each cell is ``W[token, :]`` on the patch grid,
    the token marked by a cross. One PNG per :data:`LAYERS_PER_FIGURE` layers."""
    def spread(n):  # per_side indices spread evenly over n, away from the border
        return sorted({int(round((i + 0.5) * n / min(per_side, n) - 0.5)) for i in range(min(per_side, n))})
    tokens = [(r, c) for r in spread(grid[0]) for c in spread(grid[1])]
    paths = []
    for start in range(0, len(projections), LAYERS_PER_FIGURE):
        chunk = projections[start:start + LAYERS_PER_FIGURE]
        fig, axes = _subplots(len(chunk), len(tokens), (0.9 * len(tokens) + 0.8, 0.9 * len(chunk) + 1.0))
        for row, (name, w) in enumerate(chunk):
            for col, (r, c) in enumerate(tokens):
                ax = axes[row, col]
                _heatmap(ax, w[r * grid[1] + c].reshape(grid))
                ax.plot(c, r, marker='+', color='k', ms=5, mew=0.8)
                ax.set(xticks=[], yticks=[])
                if row == 0:
                    ax.set_title(f'token ({r}, {c})', fontsize=7)
            axes[row, 0].set_ylabel(f'layer {_index(name) or start + row}', fontsize=7)
        end = start + len(chunk) - 1
        paths.append(_finish(fig, os.path.join(out, f'gmlp_spatial_filters_layers{start:02d}-{end:02d}.png'),
                             f'gMLP spatial projection W: the row of each token (black +) on the {grid[0]}x{grid[1]} '
                             f'patch grid; red +, blue -, each filter scaled to its own max |w|', title, fontsize=7))
    return paths


def _curve_panels(named: Named, plot: Callable[[Any, torch.Tensor], None], xlabel: str, path: str,
                  *title_lines: str) -> List[str]:
    """One line-plot panel per layer, 4 per row: ``plot(ax, values)`` draws its curves."""
    cols = min(4, len(named))
    rows = math.ceil(len(named) / cols)
    fig, axes = _subplots(rows, cols, (3.0 * cols, 2.1 * rows + 0.6))
    for ax in list(axes.flat)[len(named):]:
        ax.set_visible(False)
    for index, (ax, (name, values)) in enumerate(zip(axes.flat, named)):
        plot(ax, values)
        ax.axhline(0, color='k', lw=0.4)
        ax.set_title(f'layer {_index(name) or index}', fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_xlabel(xlabel, fontsize=7)
    return [_finish(fig, path, *title_lines)]


def draw_sequence_filters(projections: Named, out: str, title: str, max_offset: int = 64) -> List[str]:
    """Text gMLP (paper Fig. 4 view): per layer, the centre token's row of ``W`` over the offset j - i."""
    def plot(ax, w):
        offsets = torch.arange(w.shape[1]) - w.shape[0] // 2
        keep = offsets.abs() <= max_offset
        ax.plot(offsets[keep].numpy(), w[w.shape[0] // 2][keep].numpy(), lw=0.9)
    return _curve_panels(projections, plot, 'input token j - output token i',
                         os.path.join(out, 'gmlp_text_spatial_filters.png'),
                         f'gMLP spatial projection W: the row of the centre token (i = '
                         f'{projections[-1][1].shape[0] // 2}) over the relative position', title)


def draw_axial_weights(weights: List[Tuple[str, torch.Tensor, torch.Tensor]], out: str, title: str) -> List[str]:
    """sMLPNet: per stage, the H-mixing (top) and W-mixing (bottom) weights of each block as heatmaps."""
    stages: Dict[str, list] = {}
    for name, w_h, w_w in weights:
        stages.setdefault(_index(name, 'stages') or '0', []).append((name, w_h, w_w))
    paths = []
    for stage, blocks in stages.items():
        fig, axes = _subplots(2, len(blocks), (max(1.9 * len(blocks) + 0.9, 5.5), 4.6))
        for col, (name, w_h, w_w) in enumerate(blocks):
            block = f'block {_index(name, "blocks")}' if _index(name, 'blocks') else name
            for row, (w, axis) in enumerate(((w_h, 'H'), (w_w, 'W'))):
                _heatmap(axes[row, col], w)
                axes[row, col].set_title(f'{block}, {axis}: max |w| {w.abs().max():.2g}', fontsize=7)
                axes[row, col].tick_params(labelsize=6)
                axes[row, col].locator_params(integer=True, nbins=4)  # ticks at token positions
            axes[1, col].set_xlabel('input position j', fontsize=7)
        axes[0, 0].set_ylabel('H-mixing\noutput row i', fontsize=7)
        axes[1, 0].set_ylabel('W-mixing\noutput column i', fontsize=7)
        h, w = blocks[0][1].shape[0], blocks[0][2].shape[0]
        paths.append(_finish(fig, os.path.join(out, f'smlp_axial_weights_stage{stage}.png'),
                             f'sMLPNet stage {stage}: axial mixing weights W[i, j] ({h}x{h} / {w}x{w}; red +, blue -)',
                             title))
    return paths


def draw_ssm_responses(responses: Named, out: str, title: str, max_lag: int = 64) -> List[str]:
    """BiGS: per layer, the forward SSM's weights of earlier tokens (offset <= 0) and the backward SSM's of later
    tokens (offset >= 0) as curves over the offset; lag 0 includes ``D``."""
    def plot(ax, r):
        lags = torch.arange(min(r.shape[1], max_lag + 1))
        ax.plot(-lags.numpy(), r[0, :len(lags)].numpy(), lw=0.9, label=f'forward (D + K[0] = {r[0, 0]:.2f})')
        ax.plot(lags.numpy(), r[1, :len(lags)].numpy(), lw=0.9, label=f'backward (D + K[0] = {r[1, 0]:.2f})')
        ax.legend(fontsize=6)
    return _curve_panels(responses, plot, 'input token j - output token t', os.path.join(out, 'bigs_ssm_kernels.png'),
                         'BiGS SSM convolution kernels (S4D K, D added at lag 0): one per layer and direction, '
                         'shared by all channels', title)


# ------------------------------------------------------------------------------------------------ the command
def load_model(source: str, model_name: Optional[str] = None, pretrained: bool = False,
               model_kwargs: Optional[Dict[str, Any]] = None, trust_checkpoint: bool = False) -> Tuple[nn.Module, str]:
    """(the model in eval mode, what it is) from a checkpoint file, a ``local-dir:`` folder, a text
    ``save_pretrained`` folder, or a model name (with ``pretrained``: its registered weights)."""
    kwargs = dict(model_kwargs or {})
    create_kwargs = model_create_kwargs(model_kwargs=kwargs)
    local_dir = source.startswith('local-dir:')
    if pretrained and not (timm.is_model(source) or local_dir):  # a path holds its weights; text models have none
        what = 'a path' if os.path.exists(source) else 'none (text models have none: give a save_pretrained folder)'
        raise UsageError(f'--pretrained loads the registered weights of a timm model name; {source!r} is {what}')
    if model_name and not os.path.isfile(source):
        raise UsageError(f'--model names the model of a weights file; {source!r} is a '
                         f'{"folder" if os.path.isdir(source) or local_dir else "model name"}, which says its model')
    if os.path.isfile(source):
        model, info = create_model_for_eval(model_name, checkpoint=source, trust_checkpoint=trust_checkpoint,
                                            create_kwargs=create_kwargs)
        return model, f'{info["model_name"]} from {info["source"]}'
    if pretrained or local_dir or timm.is_model(source):
        model = create_model(source, pretrained=pretrained or local_dir, head_must_fit=True, **create_kwargs)
        return model.eval(), f'{source} ({"pretrained weights" if pretrained or local_dir else "random init"})'
    from .text import registry as text_registry  # imported here: vision models do not need the text package
    from .text.modeling_utils import is_saved_folder
    folder = os.path.isdir(source)
    if folder and not is_saved_folder(source):
        raise UsageError(f'{source} is a folder without a save_pretrained config.json; expected a text-model folder '
                         f'(a text run\'s pretrained/), local-dir:{source} for an image run\'s, or a checkpoint file')
    if not (folder or text_registry.is_model(source)):
        raise UsageError(f'{source!r} is no file, folder or model name: expected a training checkpoint, a text-model '
                         f'folder (save_pretrained), local-dir:FOLDER (an image run\'s pretrained/) or a timm / text '
                         f'model name (e.g. gmlp_s, smlpnet_t, bigs_small)')
    try:
        model = (text_registry.from_pretrained if folder else text_registry.create_model)(source, **kwargs)
    except UsageError:
        raise
    except (TypeError, ValueError) as e:  # a config field it does not have, or a value of another type
        raise UsageError(f'--model-kwargs {kwargs} do not apply to {"the model in" if folder else "text model"} '
                         f'{source}: {" ".join(str(e).split())}') from None
    return model.eval(), f'{type(model).__name__} from {source}' if folder else f'{source} (random init)'


def visualize(args: argparse.Namespace, progress: Callable[[str], None] = print) -> List[str]:
    """Draw every layer kind the model has into ``args.out``; returns the PNG paths."""
    check_range('--grid-tokens', args.grid_tokens, low=1)
    check_range('--max-lag', args.max_lag, low=1)
    if importlib.util.find_spec('matplotlib') is None:  # an optional dependency: say so before any work
        raise UsageError('drawing needs matplotlib, which is not installed: pip install "mlp_vision[viz]"')
    if os.path.lexists(args.out) and not os.path.isdir(args.out):  # a file, FIFO, device or link to none
        raise UsageError(f'--out {args.out} is not a folder; expected a new or empty folder')
    if os.path.isdir(args.out) and os.listdir(args.out):
        raise UsageError(f'--out {args.out} is not empty; give a new or empty folder (nothing there is overwritten)')
    start = time.monotonic()
    progress(set_threads(args.threads))
    model, what = load_model(args.source, args.model, args.pretrained, args.model_kwargs, args.trust_checkpoint)
    projections = spatial_projections(model)
    axial = axial_weights(model)
    responses = ssm_responses(model, getattr(getattr(model, 'config', None), 'max_position_embeddings', None) or 512)
    if not (projections or axial or responses):
        raise UsageError(f'{what} has none of the layers this command draws (gMLP spatial gating units, sMLPNet '
                         f'axial sMLPs, BiGS SSMs)')
    os.makedirs(args.out, exist_ok=True)
    progress(f'[{time.monotonic() - start:.0f} s] loaded {what}')
    grid = token_grid(model, projections[0][1].shape[0]) if projections else None  # None: a text gMLP
    drawings = [  # (whether the model has those layers, the drawing): each draws in turn, reported as it goes
        (projections and grid, lambda: draw_spatial_filters(projections, grid, args.out, what, args.grid_tokens)),
        (projections and not grid, lambda: draw_sequence_filters(projections, args.out, what, args.max_lag)),
        (axial, lambda: draw_axial_weights(axial, args.out, what)),
        (responses, lambda: draw_ssm_responses(responses, args.out, what, args.max_lag))]
    paths = []
    for found, draw in drawings:
        for path in draw() if found else []:
            paths.append(path)
            progress(f'[{time.monotonic() - start:.0f} s] wrote {path}')
    progress(f'{len(paths)} figure(s) of {what} in {args.out}')
    return paths


def build_parser(prog: Optional[str] = None) -> argparse.ArgumentParser:
    parser = ArgumentParser(prog=prog, formatter_class=DefaultsHelpFormatter, description='Draw the learned token '
                            'mixing of gMLP (spatial projections), sMLPNet (axial weights), BiGS (SSM kernels)')
    parser.add_argument('source', metavar='CHECKPOINT_OR_MODEL',
                        help='a training checkpoint (or state dict with --model), local-dir:FOLDER (an image run\'s '
                             'pretrained/), a text-model folder written by save_pretrained, or a model name')
    parser.add_argument('--out', required=True, metavar='DIR', help='new or empty folder for the PNGs')
    parser.add_argument('--model', '-m', metavar='NAME', help='the model of a plain state dict')
    parser.add_argument('--pretrained', action='store_true', help="a model name's registered pretrained weights")
    parser.add_argument('--model-kwargs', nargs='*', default={}, action=ParseKwargs,
                        help='model arguments k=v (timm kwargs, or text config fields)')
    parser.add_argument('--grid-tokens', type=int, default=3, metavar='K',
                        help='gMLP vision: draw the filters of K x K tokens spread over the patch grid')
    parser.add_argument('--max-lag', type=int, default=64, metavar='N', help='BiGS / text gMLP: plot offsets up to N')
    add_threads_argument(parser)
    add_common_arguments(parser, activations=False)  # no forward pass here: --max-params only
    return parser


def main(argv=None, prog: str = 'python -m mlp_vision.visualize') -> List[str]:
    """Draw; returns the PNG paths. Errors: one line starting with ``prog`` (``run_cli``)."""
    return run_cli(prog, lambda a: within_bounds(visualize, build_parser(prog).parse_args(a)), argv)


if __name__ == '__main__':
    main()
