""" Gather one round of the study's runs (issue 13.4) into a results folder (``--out``, results/text/study by
default): each run's args.yaml, derived.yaml, summary.csv and results.json (what the tables are made from; no
weights, logs or per-run plots) under runs/, the pretraining curves of the four encoders in pretraining_curves.png,
and table.md.
The baselines come from results/text/study/baselines.json (baselines.py).

Selection, as README.md describes: per encoder and arm (pretrained / from scratch) the fine-tuning learning rate and
checkpoint with the best accuracy on heldout.tsv (10 % of train.tsv); the reported number is that checkpoint's
accuracy on dev.tsv (``test`` in results.json), which nothing was chosen on. Where an encoder was pretrained at more
than one learning rate, the run with the lowest held-out MLM loss is the encoder (also a choice on held-out data).
With several fine-tuning seeds (run names ``..._seedS``; seed 42 has no suffix) the choice is made per seed and the
table gives the mean dev accuracy over the seeds, each seed's number beside it; where every seed ran the same
learning rates, a second table chooses one learning rate per encoder and arm on the mean heldout accuracy of the
seeds (less noisy than one seed's 991 held-out sentences) and gives the mean dev accuracy of those runs.

``--lrs 1e-3 --table-name table_lr1e-3.md`` makes the same tables from the runs at those learning rates only (an
LR fixed before the round, no choice among LRs).

    python scripts/text_study/collect.py RUNS_DIR [--out DIR] [--pretraining-text "WikiText-2"] [--lrs LR ...]
"""
import argparse
import csv
import json
import re
import shutil
import statistics
from pathlib import Path

STUDY = Path(__file__).resolve().parents[2] / 'results' / 'text' / 'study'  # the study's results folder
FAMILIES = [('gmlp', 'gMLP'), ('amlp', 'aMLP'), ('bigs', 'BiGS'), ('bert', 'BERT')]


def load(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def copy_run(run: Path, out: Path):
    dst = out / 'runs' / run.name
    dst.mkdir(parents=True, exist_ok=True)
    for name in ('args.yaml', 'derived.yaml', 'summary.csv', 'results.json'):
        if (run / name).exists():
            shutil.copy2(run / name, dst / name)


def pretraining_runs(runs: Path, key: str):
    """Every pretraining run of this encoder that evaluated at least once: pre_KEY (round 2: lr 1e-3) and
    pre_KEY_lrX."""
    return sorted(p for p in runs.glob(f'pre_{key}*') if (p / 'results.json').exists() or (p / 'summary.csv').exists())


def pretraining_outcome(run: Path):
    """(held-out MLM loss, masked-token accuracy, lr, params or None, minutes, note) of a pretraining run: its final
    evaluation, or for a run stopped before its last update (no results.json) its best periodic evaluation -- the
    model_best.pth that fine-tuning starts from."""
    r = load(run / 'results.json')
    if r is not None:
        vf = r['val_final']
        lr = r['optimizer']['lr'] if 'optimizer' in r else r.get('lr')
        return vf['loss'], vf['masked_acc'], lr, r['params'], r['train_seconds'] / 60, ''
    with open(run / 'summary.csv', newline='') as f:
        rows = [row for row in csv.DictReader(f) if row.get('val_loss')]
    best = min(rows, key=lambda row: float(row['val_loss']))
    planned = yaml_field(run / 'args.yaml', 'steps')
    logged = re.search(r'\(([0-9.]+) M params', (run / 'train.log').read_text()) if (run / 'train.log').exists() else None
    return (float(best['val_loss']), float(best['val_masked_acc']), run_lr(run),
            float(logged.group(1)) * 1e6 if logged else None, float(rows[-1]['elapsed_s']) / 60,
            f" (stopped at update {rows[-1]['step']} of {planned}; best periodic evaluation, update {best['step']})")


def earlier_run(run: Path):
    """The folder of the run this one continued (``--resume`` of a checkpoint in another folder, e.g. run_study.sh
    CONTINUE_FROM), or None."""
    resumed = yaml_field(run / 'args.yaml', 'resume')
    earlier = Path(resumed).parent if resumed else None
    return earlier if earlier is not None and earlier.resolve() != run.resolve() else None


def pretraining_curve(run: Path):
    """The run's summary.csv rows, preceded by those of the run it continued (:func:`earlier_run`) up to the update
    it continued from."""
    with open(run / 'summary.csv', newline='') as f:
        rows = list(csv.DictReader(f))
    earlier = earlier_run(run)
    if earlier is not None and (earlier / 'summary.csv').exists():
        first = int(rows[0]['step']) if rows else float('inf')
        with open(earlier / 'summary.csv', newline='') as f:
            rows = [r for r in csv.DictReader(f) if int(r['step']) < first] + rows
    return rows


def run_lr(run: Path):
    """The lr a run trained with: its derived.yaml's (a recipe's, when --lr was not given), else its args.yaml's (the
    --lr given; runs written before derived.yaml held the recipe's value there too)."""
    derived = run / 'derived.yaml'
    lr = yaml_field(derived, 'lr', None) if derived.exists() else None
    return lr if lr is not None else yaml_field(run / 'args.yaml', 'lr')


def yaml_field(path: Path, name: str, *default):
    import yaml
    fields = yaml.safe_load(path.read_text()) or {}
    return fields.get(name, *default) if default else fields[name]


def fmt(m):
    return f"{m['acc']:.2f} % (F1 {m['f1']:.1f}, MCC {m['mcc']:.1f})"


def raw_weights_note(run: Path) -> str:
    """A --model-ema run: '; raw weights' best X %', the best heldout accuracy of the trained weights themselves
    (the EMA's is the run's); '' otherwise."""
    with open(run / 'summary.csv', newline='') as f:
        raw = [float(row['raw_val_acc']) for row in csv.DictReader(f) if row.get('raw_val_acc')]
    return f"; raw weights' best {max(raw):.2f} %" if raw else ''


def finetuning_runs(runs: Path, key: str, arm: str, lrs=None):
    """{seed: {lr: run folder}} of this encoder and arm, from the run names ft_KEY_ARM_lrX[_seedS] (no suffix: 42);
    only the learning rates in ``lrs`` when given."""
    name = re.compile(rf'ft_{key}_{arm}_lr([0-9.e+-]+)(?:_seed(\d+))?$')
    found = {}
    for p in runs.glob(f'ft_{key}_{arm}_lr*'):
        m = name.match(p.name)
        if p.is_dir() and m and (lrs is None or m.group(1) in lrs):
            found.setdefault(int(m.group(2) or 42), {})[m.group(1)] = p
    return {seed: dict(sorted(found[seed].items(), key=lambda kv: float(kv[0]))) for seed in sorted(found)}


def main(runs: Path, out: Path, text_label: str, lrs=None, table_name: str = 'table.md'):
    out.mkdir(parents=True, exist_ok=True)
    base = load(STUDY / 'baselines.json')
    pre_rows, ft_rows, pooled_rows, detail_rows, curves = [], [], [], [], {}
    lr_choice_made = False  # some arm ran every seed at more than one LR: the second table is worth printing
    for key, label in FAMILIES:
        outcomes = {run: pretraining_outcome(run) for run in pretraining_runs(runs, key)}
        for run, (loss, acc, lr, params, minutes, note) in outcomes.items():
            params = '' if params is None else f'{params / 1e6:.2f} M'
            earlier = earlier_run(run)
            continued = f' (continues {earlier.parent.name}/{earlier.name})' if earlier is not None else ''
            pre_rows.append((loss, f"| {label} | {run.name}{continued}{note} | {lr:g} | {params} | {loss:.3f} | "
                                   f"{acc:.1f} % | {minutes:.0f} min |"))
            copy_run(run, out)
        chosen = min(outcomes, key=lambda p: outcomes[p][0]) if outcomes else None
        if chosen is not None:
            curves[label] = pretraining_curve(chosen)
        cells, means, pooled_cells, pooled_means = [], [], [], []
        for arm in ('pre', 'scratch'):
            chosen_per_seed, results_per_seed = [], {}
            for seed, by_lr in finetuning_runs(runs, key, arm, lrs).items():
                results = results_per_seed[seed] = {}
                for lr, run in by_lr.items():
                    r = load(run / 'results.json')
                    if r is None:
                        continue
                    copy_run(run, out)
                    results[lr] = r
                    detail_rows.append(f"| {label} | {'pretrained' if arm == 'pre' else 'scratch'} | {lr} | {seed} | "
                                       f"{r['val_best']['acc']:.2f} % (step {r['best_step']}{raw_weights_note(run)}) | "
                                       f"{fmt(r['test'])} | {r['train_seconds'] / 60:.1f} min |")
                if results:
                    lr = max(results, key=lambda k: (results[k]['val_best']['acc'], -float(k)))
                    chosen_per_seed.append((seed, lr, results[lr]))
            if not chosen_per_seed:
                cells.append('not run')
                means.append(None)
            elif len(chosen_per_seed) == 1:
                _, lr, r = chosen_per_seed[0]
                cells.append(f"{fmt(r['test'])}; lr {lr}, heldout {r['val_best']['acc']:.2f} %")
                means.append(r['test']['acc'])
            else:
                accs = [r['test']['acc'] for _, _, r in chosen_per_seed]
                means.append(statistics.mean(accs))
                each = ', '.join(f"{r['test']['acc']:.2f} (seed {seed}, lr {lr})" for seed, lr, r in chosen_per_seed)
                cells.append(f"**{means[-1]:.2f} %** mean of {len(accs)} seeds (sd {statistics.stdev(accs):.2f}): {each}")
            # second rule: one LR for all seeds, the one with the best mean held-out accuracy (among the LRs every
            # seed ran), so that one seed's held-out noise does not pick the LR
            shared = set.intersection(*(set(r) for r in results_per_seed.values())) if results_per_seed else set()
            lr_choice_made |= len(shared) > 1
            if len(results_per_seed) > 1 and shared:
                def heldout_mean(lr):
                    return statistics.mean(r[lr]['val_best']['acc'] for r in results_per_seed.values())
                lr = max(shared, key=lambda k: (heldout_mean(k), -float(k)))
                accs = [r[lr]['test']['acc'] for r in results_per_seed.values()]
                pooled_means.append(statistics.mean(accs))
                pooled_cells.append(f"**{pooled_means[-1]:.2f} %** (sd {statistics.stdev(accs):.2f}), lr {lr}: heldout "
                                    f"mean {heldout_mean(lr):.2f} % (" + ', '.join(
                                        f"{k}: {heldout_mean(k):.2f} %" for k in sorted(shared, key=float)) + ')')
            else:
                pooled_cells.append('not run (needs every seed at a common LR)')
                pooled_means.append(None)
        gain = 'n/a' if None in means else f'{means[0] - means[1]:+.2f}'
        ft_rows.append(f'| {label} | {cells[0]} | {cells[1]} | {gain} |')
        gain = 'n/a' if None in pooled_means else f'{pooled_means[0] - pooled_means[1]:+.2f}'
        pooled_rows.append(f'| {label} | {pooled_cells[0]} | {pooled_cells[1]} | {gain} |')

    plot_curves(curves, out)
    bow, bow_all, major = (base['tfidf_uni_bigram_logreg'], base['tfidf_uni_bigram_logreg_all_train'],
                           base['majority_class'])
    budgets = sorted({(r['steps'], r['tokens_per_step']) for r in (load(p / 'results.json') for p in runs.glob('pre_*'))
                      if r is not None})  # the planned budget (a run stopped early says so in its row)
    text = [f'## Pretraining (masked LM on {text_label}, WordPiece 8,000, '
            f"{' / '.join(f'{s:,} updates x {t:,} tokens' for s, t in budgets)})", '',
            '| encoder | run | lr | params | held-out MLM loss | masked-token acc | time |',
            '| --- | --- | --- | --- | --- | --- | --- |', *[row for _, row in pre_rows], '',
            '## Fine-tuning on rt-polarity: dev.tsv accuracy of the checkpoint chosen on heldout.tsv'
            + (f" (fine-tuning learning rates {', '.join(lrs)} only)" if lrs else ''), '',
            '| encoder | pretrained | from scratch (same vocabulary) | pretraining gain (points) |',
            '| --- | --- | --- | --- |', *ft_rows,
            f"| majority class (of fit.tsv) | {fmt(major)} | | |",
            f"| TF-IDF uni+bigram logistic regression, C={bow['C']:g} chosen on heldout.tsv | {fmt(bow)} | | |",
            f"| the same refitted on all of train.tsv | {fmt(bow_all)} | | |", '',
            *(['### The same runs, one learning rate per encoder and arm: the best mean heldout.tsv accuracy over '
               'the seeds (mean dev.tsv accuracy of those runs)', '',
               '| encoder | pretrained | from scratch | pretraining gain (points) |', '| --- | --- | --- | --- |',
               *pooled_rows, ''] if lr_choice_made else []),
            '### Every fine-tuning run', '',
            '| encoder | arm | lr | seed | heldout acc (best checkpoint) | dev acc of that checkpoint | time |',
            '| --- | --- | --- | --- | --- | --- | --- |', *detail_rows, '']
    (out / table_name).write_text('\n'.join(text))
    print('\n'.join(text))


def plot_curves(curves, out: Path):
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
    fig.savefig(out / 'pretraining_curves.png', dpi=100)


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('runs', type=Path, help='the folder the runs were written to (RUNS)')
    parser.add_argument('--out', type=Path, default=STUDY, help='results folder (default: %(default)s)')
    parser.add_argument('--pretraining-text', default='WikiText-2', help='what the encoders were pretrained on')
    parser.add_argument('--lrs', nargs='+', default=None,
                        help='only the fine-tuning runs at these learning rates, as spelt in the run names (e.g. 1e-3)')
    parser.add_argument('--table-name', default='table.md', help='file name of the table under --out')
    args = parser.parse_args()
    main(args.runs, args.out, args.pretraining_text, args.lrs, args.table_name)
