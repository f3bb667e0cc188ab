""" Experiment-folder outputs: ``summary.csv`` (a row per epoch or evaluation step, one header, resume-safe), the
curves PNG, an overlay PNG of several runs, and JSON results (written atomically).

``summary.csv`` has the columns of timm's ``update_summary`` but is not written by it: that names the first column
``epoch`` (the text trainer's is ``step``), opens the file by name (through a link planted in the run folder) and
appends new columns under the old header; a resume also drops rows past its position.
"""
import csv
import json
import logging
import os
from io import StringIO
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mlp_vision.training.run.checkpoint import atomic_write, atomic_write_text, open_own_file

__all__ = ['SummaryWriter', 'json_text', 'write_json', 'plot_curves', 'plot_comparison']

_logger = logging.getLogger(__name__)
_STYLES = ('-', '--', ':', '-.')  # one line style per column of a run


def json_text(obj: Any) -> str:
    """The text of every results JSON file: indented, keys in their order, other values as ``str``."""
    return json.dumps(obj, indent=2, sort_keys=False, default=str) + '\n'


def write_json(path: os.PathLike, obj: Any) -> None:
    atomic_write_text(Path(path), json_text(obj))


class SummaryWriter:
    """``summary.csv`` whose first column is ``key`` (``epoch`` or ``step``). Columns are fixed by the first row;
    a later row with new keys rewrites the file with the union of columns (still one header)."""

    def __init__(self, path: os.PathLike, key: str = 'epoch'):
        self.path, self.key = Path(path), key

    def read(self) -> List[Dict[str, str]]:
        if not self.path.exists():
            return []
        with open(self.path, newline='') as f:
            return list(csv.DictReader(f))

    def _write_all(self, rows: List[Dict[str, Any]], fieldnames: List[str]) -> None:
        buf = StringIO()
        writer = csv.DictWriter(buf, fieldnames=fieldnames, restval='')
        writer.writeheader()
        writer.writerows(rows)
        atomic_write_text(self.path, buf.getvalue())

    def _before(self, row: Dict[str, str], position: int) -> bool:
        try:  # a row torn by a crash mid-write has no parsable key: never kept
            return int(row[self.key]) < position
        except (TypeError, ValueError):
            return False

    def truncate(self, before_epoch: int) -> None:
        """On resume: drop the rows whose ``key`` is >= ``before_epoch`` (logged, not checkpointed, before a crash)."""
        rows = self.read()
        if not rows:
            return
        kept = [r for r in rows if self._before(r, before_epoch)]
        if len(kept) != len(rows):
            self._write_all(kept, list(rows[0].keys()))

    def copy_rows(self, source: 'SummaryWriter', before_epoch: int) -> None:
        """Start this file with ``source``'s rows before ``before_epoch``: a run continued from a checkpoint in a
        new folder keeps the curve that led to it."""
        rows = [r for r in source.read() if self._before(r, before_epoch)]
        if rows:
            self._write_all(rows, list(rows[0].keys()))

    def append(self, row: Dict[str, Any]) -> None:
        row = {k: (f'{v:.6g}' if isinstance(v, float) else v) for k, v in row.items()}
        rows = self.read()
        fieldnames = list(rows[0].keys()) if rows else []
        if not rows or set(row) - set(fieldnames):  # a new file, or new columns: written whole, one header
            self._write_all(rows + [row], fieldnames + [k for k in row if k not in fieldnames])
            return
        with open(open_own_file(self.path, os.O_WRONLY | os.O_APPEND), 'a', newline='') as f:
            csv.DictWriter(f, fieldnames=fieldnames, restval='').writerow(row)
            f.flush()
            os.fsync(f.fileno())


def _pyplot():
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        _logger.warning('matplotlib is not installed: no curves PNG (pip install matplotlib)')
        return None
    return plt


def _plot(runs: Dict[str, List[Dict[str, str]]], out_png: os.PathLike, title: str, x: str,
          panels: Sequence[Tuple[str, Sequence[str]]]) -> Optional[Path]:
    """``panels`` side by side in a PNG written by :func:`atomic_write`, each (its y label, its columns against
    column ``x``): a line per column of each run (``runs``: label -> ``summary.csv`` rows; several runs get a colour
    each). Columns missing from a run are skipped."""
    plt = _pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels) + 0.5, 4), squeeze=False)
    for r_i, (label, rows) in enumerate(runs.items()):
        style = {'marker': 'o', 'markersize': 3, **({'color': f'C{r_i}'} if len(runs) > 1 else {})}
        for ax, (_, names) in zip(axes[0], panels):
            for i, name in enumerate(names):
                points = [(float(r[x]), float(r[name])) for r in rows if r.get(name) not in (None, '')
                          and r.get(x) not in (None, '')]
                if points:
                    ax.plot(*zip(*points), _STYLES[i % len(_STYLES)], label=f'{label} {name}'.strip(), **style)
    for ax, (ylabel, _) in zip(axes[0], panels):
        ax.set_xlabel(x)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=.3)
        if ax.lines:
            ax.legend(fontsize=8 if len(runs) > 1 else None)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    try:
        atomic_write(out_png, lambda f: fig.savefig(f, dpi=110, format='png'))
    finally:
        plt.close(fig)
    return Path(out_png)


def plot_curves(summary_csv: os.PathLike, out_png: os.PathLike, title: str = '', x: str = 'epoch',
                loss_columns: Sequence[str] = ('train_loss', 'eval_loss', 'ema_eval_loss'),
                metric_columns: Sequence[str] = ('eval_top1', 'eval_top5', 'ema_eval_top1'),
                metric_label: str = 'accuracy (%)') -> Optional[Path]:
    """Loss columns (left) and metric columns (right) of ``summary.csv`` against column ``x``, as a PNG (defaults:
    train.py's); None without rows."""
    rows = SummaryWriter(summary_csv, key=x).read()
    panels = [('loss', loss_columns), (metric_label, metric_columns)]
    return _plot({'': rows}, out_png, title, x, panels) if rows else None


def plot_comparison(runs: Dict[str, os.PathLike], out_png: os.PathLike, title: str = '', x: str = 'step',
                    loss_columns: Sequence[str] = ('train_loss', 'val_loss'), metric_column: Optional[str] = None,
                    metric_label: str = '') -> Optional[Path]:
    """Several runs in one PNG (``runs``: label -> ``summary.csv``; one colour per run): each run's
    ``loss_columns`` on the left, its ``metric_column`` (when given) on the right."""
    panels = [('loss', loss_columns)] + ([(metric_label or metric_column, [metric_column])] if metric_column else [])
    return _plot({label: SummaryWriter(path, key=x).read() for label, path in runs.items()}, out_png, title, x, panels)
