""" Experiment-folder outputs: ``summary.csv`` (one row per epoch, one header, resume-safe), the loss /
accuracy curves PNG, and JSON results (written atomically). """
import csv
import json
import logging
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

__all__ = ['SummaryWriter', 'write_json', 'plot_curves']

_logger = logging.getLogger(__name__)


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f'.{path.name}.tmp-{os.getpid()}')
    with open(tmp, 'w', newline='') as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path: os.PathLike, obj: Any) -> None:
    _atomic_write_text(Path(path), json.dumps(obj, indent=2, sort_keys=False, default=str) + '\n')


class SummaryWriter:
    """``summary.csv`` with an ``epoch`` column first.

    :meth:`truncate` (called on resume) keeps the rows of epochs before the resumed one, so an epoch that was
    logged but not checkpointed before a crash is not listed twice. Columns are fixed by the first row; later
    rows with new keys rewrite the file with the union of columns (still one header).
    """

    def __init__(self, path: os.PathLike):
        self.path = Path(path)

    def read(self) -> List[Dict[str, str]]:
        if not self.path.exists():
            return []
        with open(self.path, newline='') as f:
            return list(csv.DictReader(f))

    def _write_all(self, rows: List[Dict[str, Any]], fieldnames: List[str]) -> None:
        from io import StringIO
        buf = StringIO()
        writer = csv.DictWriter(buf, fieldnames=fieldnames, restval='')
        writer.writeheader()
        writer.writerows(rows)
        _atomic_write_text(self.path, buf.getvalue())

    def truncate(self, before_epoch: int) -> None:
        rows = self.read()
        if not rows:
            return
        def keep(row):  # a row torn by a crash mid-write has no parsable epoch: drop it
            try:
                return int(row['epoch']) < before_epoch
            except (TypeError, ValueError):
                return False
        kept = [r for r in rows if keep(r)]
        if len(kept) != len(rows):
            self._write_all(kept, list(rows[0].keys()))

    def append(self, row: Dict[str, Any]) -> None:
        row = {k: (f'{v:.6g}' if isinstance(v, float) else v) for k, v in row.items()}
        rows = self.read()
        fieldnames = list(rows[0].keys()) if rows else list(row.keys())
        if rows and set(row) - set(fieldnames):
            fieldnames += [k for k in row if k not in fieldnames]
            self._write_all(rows + [row], fieldnames)
            return
        if not rows:
            self._write_all([row], fieldnames)
            return
        with open(self.path, 'a', newline='') as f:
            csv.DictWriter(f, fieldnames=fieldnames, restval='').writerow(row)
            f.flush()
            os.fsync(f.fileno())


def plot_curves(summary_csv: os.PathLike, out_png: os.PathLike, title: str = '') -> Optional[Path]:
    """Loss (train / eval) and eval accuracy (top-1 / top-5, EMA if present) per epoch, as a PNG."""
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        _logger.warning('matplotlib is not installed: no curves PNG (pip install matplotlib)')
        return None
    rows = SummaryWriter(summary_csv).read()
    if not rows:
        return None

    def col(name):
        pts = [(int(r['epoch']), float(r[name])) for r in rows if r.get(name) not in (None, '')]
        return [p[0] for p in pts], [p[1] for p in pts]

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for name, style in (('train_loss', '-'), ('eval_loss', '--'), ('ema_eval_loss', ':')):
        x, y = col(name) if name in rows[0] else ([], [])
        if x:
            ax_loss.plot(x, y, style, marker='o', markersize=3, label=name)
    ax_loss.set_xlabel('epoch')
    ax_loss.set_ylabel('loss')
    ax_loss.grid(alpha=.3)
    ax_loss.legend()
    for name, style in (('eval_top1', '-'), ('eval_top5', '--'), ('ema_eval_top1', ':')):
        x, y = col(name) if name in rows[0] else ([], [])
        if x:
            ax_acc.plot(x, y, style, marker='o', markersize=3, label=name)
    ax_acc.set_xlabel('epoch')
    ax_acc.set_ylabel('accuracy (%)')
    ax_acc.grid(alpha=.3)
    if ax_acc.lines:
        ax_acc.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out_png = Path(out_png)
    tmp = out_png.with_name(f'.{out_png.name}.tmp-{os.getpid()}.png')
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, out_png)
    return out_png
