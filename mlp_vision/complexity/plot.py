""" The MACs-scaling plot: vision models over image sizes, BiGS-large vs BERT-large over sequence lengths. """
import io
import math
from typing import Callable, Optional

from mlp_vision.outputs import write_output_file

from .counts import BIGS_LENGTHS, count_bert_large, count_text, count_vision
from .paper import PAPER_ROWS


PLOT_IMG_SIZES = (224, 320, 448, 640, 832, 1024)
PLOT_VISION = {'smlpnet_t': 'sMLPNet-T', 'mixer_s16': 'Mixer-S/16', 'gmlp_s': 'gMLP-S'}
PLOT_SEQ_LENS = (128, 256, 512, 1024, 2048, 4096)


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


def _loglog(ax, x, curves, references, ticks, xlabel: str, ylabel: str, title: str, tick_size=None) -> None:
    """One log-log panel: ``curves`` (label, y, style) with their log-log slope between the last two points,
    ``references`` (label, y, style) in black, ticks at the data points (no minor ticks)."""
    for label, y, style in curves:
        slope = math.log(y[-1] / y[-2]) / math.log(x[-1] / x[-2])
        ax.loglog(x, y, style, label=f'{label} (end slope {slope:.2f})')
    for label, y, style in references:
        ax.loglog(x, y, 'k' + style, lw=0.8, label=label)
    ax.set_xticks(x, ticks, fontsize=tick_size)
    ax.minorticks_off()
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(True, which='major', alpha=0.3)


def plot_scaling(path: str, data: Optional[dict] = None, progress: Optional[Callable[[str], None]] = None) -> dict:
    """Two log-log panels: vision MACs vs tokens (image side 224 ... 1024) with slope-1 / 1.5 / 2 references, and
    BiGS-large vs BERT-large forward FLOPs vs sequence length with L log L and L^2 references, beside BiGS Table 6.
    Returns the data. The figure's title names the command that writes ``path``."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    data = data or scaling_data(progress)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12.5, 5.2))
    sizes = data['img_sizes']
    tokens = [(s / 16) ** 2 for s in sizes]  # /16 patches; sMLPNet's stage tokens are proportional
    ref0 = data['vision']['smlpnet_t'][0] / 1e9
    _loglog(ax1, tokens, [(PLOT_VISION.get(n, n), [m / 1e9 for m in macs], 'o-') for n, macs in data['vision'].items()],
            [(text, [ref0 * (t / tokens[0]) ** slope for t in tokens], style) for slope, style, text in (
                (1.0, ':', 'slope 1 (N)'), (1.5, '--', 'slope 1.5 (N√N)'), (2.0, '-.', 'slope 2 (N²)'))],
            [f'{int(t)}\n{s}px' for t, s in zip(tokens, sizes)], 'tokens N = (image side / 16)²', 'MACs (G, fvcore)',
            'Vision: MACs vs input size (fixed widths)', tick_size=7)
    L = data['seq_lens']
    for name, prefix, marker in (('BiGS', 'bigs_large_', 'x'), ('BERT', 'bert_large_', '+')):
        table6 = [row.value for row in PAPER_ROWS if row.source == 'BiGS T6' and row.model.startswith(prefix)]
        ax2.loglog(BIGS_LENGTHS, table6, marker, color='k', ms=8, label=f'{name}, BiGS paper Table 6')
    bert = [2 * m for m in data['bert']]
    _loglog(ax2, L, [('BERT-large, attention counted as QKᵀ + AV', bert, 'o-'),
                     ('BiGS-large', [2 * m for m in data['bigs']], 's-')],
            [('∝ L log L', [bert[0] * (n / L[0]) * math.log2(2 * n) / math.log2(2 * L[0]) for n in L], ':'),
             ('∝ L²', [bert[0] * (n / L[0]) ** 2 for n in L], '-.')],
            [str(n) for n in L], 'sequence length L', 'forward FLOPs per sequence (2 × encoder MACs)',
            'Text: BiGS-large vs BERT-large (encoders, batch 1)')
    for ax in (ax1, ax2):
        ax.legend(fontsize=8)
    fig.suptitle(f'fvcore counts; `python -m mlp_vision.complexity --plot {path}`', fontsize=9)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, dpi=110, format='png')
    plt.close(fig)
    write_output_file(path, png.getvalue())
    return data
