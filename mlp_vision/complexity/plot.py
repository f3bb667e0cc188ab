""" The MACs-scaling plot: vision models over image sizes, BiGS-large vs BERT-large over sequence lengths. """
import io
import math
from typing import Callable, Optional, Sequence

from mlp_vision.outputs import write_output_file

from .counts import BIGS_LENGTHS, count_bert_large, count_text, count_vision
from .paper import PAPER_ROWS


PLOT_IMG_SIZES = (224, 320, 448, 640, 832, 1024)
PLOT_VISION = ('smlpnet_t', 'mixer_s16', 'gmlp_s')
PLOT_SEQ_LENS = (128, 256, 512, 1024, 2048, 4096)


def _table6(model_prefix: str) -> list:
    """BiGS Table 6 forward FLOPs at :data:`BIGS_LENGTHS` (from the paper rows)."""
    return [row.value for row in PAPER_ROWS if row.source == 'BiGS T6' and row.model.startswith(model_prefix)]


def scaling_data(progress: Optional[Callable[[str], None]] = None) -> dict:
    """MACs of :data:`PLOT_VISION` at :data:`PLOT_IMG_SIZES`, encoder MACs of BERT-large and BiGS-large (its
    position table sized to each length) at :data:`PLOT_SEQ_LENS`. ``progress`` gets a line per model counted."""
    progress = progress or (lambda line: None)
    vision = {}
    for n in PLOT_VISION:
        progress(f'counting {n} at {", ".join(map(str, PLOT_IMG_SIZES))} px')
        vision[n] = [count_vision(n, s).macs for s in PLOT_IMG_SIZES]
    progress(f'counting BERT-large and BiGS-large at {", ".join(map(str, PLOT_SEQ_LENS))} tokens')
    bert = [count_bert_large(n).encoder_macs for n in PLOT_SEQ_LENS]
    bigs = [count_text('bigs_large_512', n, label=f'bigs_large@{n}', max_position_embeddings=n).encoder_macs
            for n in PLOT_SEQ_LENS]
    return dict(img_sizes=list(PLOT_IMG_SIZES), vision=vision, seq_lens=list(PLOT_SEQ_LENS), bert=bert, bigs=bigs)


def _slope(x: Sequence[float], y: Sequence[float]) -> float:
    """log-log slope between the last two points."""
    return math.log(y[-1] / y[-2]) / math.log(x[-1] / x[-2])


def _finish_axes(ax, ticks, tick_labels, xlabel: str, ylabel: str, title: str, tick_size=None) -> None:
    """Ticks at the data points (no log-scale minor ticks), labels, title, grid and legend of one panel."""
    ax.set_xticks(ticks, tick_labels, fontsize=tick_size)
    ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which='major', alpha=0.3)
    ax.legend(fontsize=8)


def plot_scaling(path: str, data: Optional[dict] = None, progress: Optional[Callable[[str], None]] = None) -> dict:
    """Two log-log panels: vision MACs vs tokens (image side 224 ... 1024) with slope-1 / 1.5 / 2 references, and
    BiGS-large vs BERT-large forward FLOPs vs sequence length with L log L and L^2 references. Returns the data.
    The figure's title names the command that writes ``path``."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    data = data or scaling_data(progress)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12.5, 5.2))
    sizes = data['img_sizes']
    tokens = [(s / 16) ** 2 for s in sizes]  # /16 patches; sMLPNet's stage tokens are proportional
    labels = {'smlpnet_t': 'sMLPNet-T', 'mixer_s16': 'Mixer-S/16', 'gmlp_s': 'gMLP-S'}
    for name, macs in data['vision'].items():
        g = [m / 1e9 for m in macs]
        ax1.loglog(tokens, g, 'o-', label=f'{labels.get(name, name)} (end slope {_slope(tokens, g):.2f})')
    ref0 = data['vision']['smlpnet_t'][0] / 1e9
    for slope, style, text in ((1.0, ':', 'slope 1 (N)'), (1.5, '--', 'slope 1.5 (N√N)'),
                               (2.0, '-.', 'slope 2 (N²)')):
        ax1.loglog(tokens, [ref0 * (t / tokens[0]) ** slope for t in tokens], 'k' + style, lw=0.8, label=text)
    _finish_axes(ax1, tokens, [f'{int(t)}\n{s}px' for t, s in zip(tokens, sizes)], 'tokens N = (image side / 16)²',
                 'MACs (G, fvcore)', 'Vision: MACs vs input size (fixed widths)', tick_size=7)
    L = data['seq_lens']
    bert = [2 * m for m in data['bert']]
    bigs = [2 * m for m in data['bigs']]
    ax2.loglog(L, bert, 'o-', label=f'BERT-large, attention counted as QKᵀ + AV (end slope {_slope(L, bert):.2f})')
    ax2.loglog(L, bigs, 's-', label=f'BiGS-large (end slope {_slope(L, bigs):.2f})')
    for name, prefix, marker in (('BiGS', 'bigs_large_', 'x'), ('BERT', 'bert_large_', '+')):
        ax2.loglog(BIGS_LENGTHS, _table6(prefix), marker, color='k', ms=8, label=f'{name}, BiGS paper Table 6')
    r0 = bert[0]
    ax2.loglog(L, [r0 * (n / L[0]) * math.log2(2 * n) / math.log2(2 * L[0]) for n in L], 'k:', lw=0.8,
               label='∝ L log L')
    ax2.loglog(L, [r0 * (n / L[0]) ** 2 for n in L], 'k-.', lw=0.8, label='∝ L²')
    _finish_axes(ax2, L, [str(n) for n in L], 'sequence length L', 'forward FLOPs per sequence (2 × encoder MACs)',
                 'Text: BiGS-large vs BERT-large (encoders, batch 1)')
    fig.suptitle(f'fvcore counts; `python -m mlp_vision.complexity --plot {path}`', fontsize=9)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, dpi=110, format='png')
    plt.close(fig)
    write_output_file(path, png.getvalue())
    return data
