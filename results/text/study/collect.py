""" Gather the study's round-2 runs (issue 13.4) into results/text/study: each run's args.yaml, summary.csv,
results.json and curves.png (no weights) under runs/, the pretraining curves of the four encoders in
pretraining_curves.png, and table.md.

Selection, as README.md describes: per encoder and arm (pretrained / from scratch) the fine-tuning learning rate and
checkpoint with the best accuracy on heldout.tsv (10 % of train.tsv); the reported number is that checkpoint's
accuracy on dev.tsv (``test`` in results.json), which nothing was chosen on. Where an encoder was pretrained at more
than one learning rate, the run with the lowest held-out MLM loss is the encoder (also a choice on held-out data).

    python results/text/study/collect.py RUNS_DIR
"""
import csv
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAMILIES = [('gmlp', 'gMLP'), ('amlp', 'aMLP'), ('bigs', 'BiGS'), ('bert', 'BERT')]
LRS = ('1e-4', '3e-4', '1e-3')


def load(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def copy_run(run: Path):
    dst = HERE / 'runs' / run.name
    dst.mkdir(parents=True, exist_ok=True)
    for name in ('args.yaml', 'summary.csv', 'results.json', 'curves.png'):
        if (run / name).exists():
            shutil.copy2(run / name, dst / name)


def pretraining_runs(runs: Path, key: str):
    """Every pretraining run of this encoder: pre_KEY (lr 1e-3) and pre_KEY_lrX."""
    return sorted(p for p in runs.glob(f'pre_{key}*') if (p / 'results.json').exists())


def fmt(m):
    return f"{m['acc']:.2f} % (F1 {m['f1']:.1f}, MCC {m['mcc']:.1f})"


def main(runs: Path):
    base = load(HERE / 'baselines.json')
    pre_rows, ft_rows, detail_rows, curves = [], [], [], {}
    for key, label in FAMILIES:
        candidates = pretraining_runs(runs, key)
        for run in candidates:
            r = load(run / 'results.json')
            vf = r['val_final']
            lr = r['optimizer']['lr'] if 'optimizer' in r else r.get('lr')
            pre_rows.append((vf['loss'], f"| {label} | {run.name} | {lr:g} | {r['params'] / 1e6:.2f} M | {vf['loss']:.3f} | "
                                         f"{vf['masked_acc']:.1f} % | {r['train_seconds'] / 60:.0f} min |"))
            copy_run(run)
        chosen = min(candidates, key=lambda p: load(p / 'results.json')['val_final']['loss']) if candidates else None
        if chosen is not None:
            with open(chosen / 'summary.csv', newline='') as f:
                curves[label] = list(csv.DictReader(f))
        cells = []
        for arm in ('pre', 'scratch'):
            results = {}
            for lr in LRS:
                run = runs / f'ft_{key}_{arm}_lr{lr}'
                r = load(run / 'results.json')
                if r is None:
                    continue
                copy_run(run)
                results[lr] = r
                detail_rows.append(f"| {label} | {'pretrained' if arm == 'pre' else 'scratch'} | {lr} | "
                                   f"{r['val_best']['acc']:.2f} % (step {r['best_step']}) | {fmt(r['test'])} | "
                                   f"{r['train_seconds'] / 60:.1f} min |")
            if not results:
                cells.append('not run')
                continue
            lr = max(results, key=lambda k: (results[k]['val_best']['acc'], -float(k)))
            r = results[lr]
            cells.append(f"{fmt(r['test'])}; lr {lr}, heldout {r['val_best']['acc']:.2f} %")
        ft_rows.append(f'| {label} | {cells[0]} | {cells[1]} |')

    plot_curves(curves)
    bow, bow_all, major = (base['tfidf_uni_bigram_logreg'], base['tfidf_uni_bigram_logreg_all_train'],
                           base['majority_class'])
    text = ['## Pretraining (masked LM on WikiText-2, WordPiece 8,000, 3,000 updates x 4,096 tokens)', '',
            '| encoder | run | lr | params | held-out MLM loss | masked-token acc | time |',
            '| --- | --- | --- | --- | --- | --- | --- |', *[row for _, row in pre_rows], '',
            '## Fine-tuning on rt-polarity: dev.tsv accuracy of the checkpoint chosen on heldout.tsv', '',
            '| encoder | pretrained | from scratch (same vocabulary) |', '| --- | --- | --- |', *ft_rows,
            f"| majority class (of fit.tsv) | {fmt(major)} | |",
            f"| TF-IDF uni+bigram logistic regression, C={bow['C']:g} chosen on heldout.tsv | {fmt(bow)} | |",
            f"| the same refitted on all of train.tsv | {fmt(bow_all)} | |", '',
            '### Every fine-tuning run', '',
            '| encoder | arm | lr | heldout acc (best checkpoint) | dev acc of that checkpoint | time |',
            '| --- | --- | --- | --- | --- | --- |', *detail_rows, '']
    (HERE / 'table.md').write_text('\n'.join(text))
    print('\n'.join(text))


def plot_curves(curves):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    for label, rows in curves.items():
        steps = [int(r['step']) for r in rows]
        ax_loss.plot(steps, [float(r['val_loss']) for r in rows], marker='o', label=label)
        ax_acc.plot(steps, [float(r['val_masked_acc']) for r in rows], marker='o', label=label)
    ax_loss.set(xlabel='update', ylabel='held-out MLM loss', title='WikiText-2 held-out articles')
    ax_acc.set(xlabel='update', ylabel='masked-token accuracy (%)', title='WikiText-2 held-out articles')
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(HERE / 'pretraining_curves.png', dpi=100)


if __name__ == '__main__':
    main(Path(sys.argv[1]))
