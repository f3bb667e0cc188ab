""" Gather one round of the study's runs (issue 13.4) into a results folder (``--out``, results/text/study by
default): each run's trainer_state.json (its whole log), eval_results.json and test_results.json (what the tables are
made from; no weights) under runs/, the pretraining curves of the encoders in pretraining_curves.png, and table.md.
The runs are ``python -m mlp_vision.train_text`` run folders (transformers.Trainer) named as run_study.sh names them:
``pre_KEY_lrX`` (masked-LM pretraining) and ``ft_KEY_ARM_lrX[_seedS]`` (fine-tuning, ARM = pre or scratch). The
baselines come from results/text/study/baselines.json (baselines.py) when it exists.

Selection, as README.md describes: per encoder and arm (pretrained / from scratch) the fine-tuning learning rate with
the best accuracy on heldout.tsv (``eval_acc`` of the run's best checkpoint, which the run keeps as its final model);
the reported number is that model's accuracy on dev.tsv (``test_acc``, scored once with --test-file), which nothing
was chosen on. Where an encoder was pretrained at more than one learning rate, the run with the lowest held-out MLM
loss is the encoder (also a choice on held-out data; :func:`pretrained_encoder`, which run_study.sh calls through
``--encoder``). With several fine-tuning seeds (suffix ``_seedS``; seed 42 has none) the choice is made per seed and
the table gives the mean dev accuracy over the seeds, each seed's number beside it; where every seed ran the same
learning rates, a second table chooses one learning rate per encoder and arm on the mean heldout accuracy of the
seeds and gives the mean dev accuracy of those runs.

``--lrs 1e-3 --table-name table_lr1e-3.md`` makes the same tables from the runs at those learning rates only.
The tables of rounds 1 to 6 (results/text/study/roundN/) were made from the old trainer's files (results.json,
summary.csv) by this script as it was at commit cc06155; it does not read them.

    python scripts/text_study/collect.py RUNS_DIR [--out DIR] [--pretraining-text "WikiText-2"] [--lrs LR ...]
    python scripts/text_study/collect.py RUNS_DIR --encoder gmlp   # prints the folder fine-tuning starts from
"""
import argparse
import json
import re
import shutil
import statistics
from pathlib import Path
from typing import Optional

STUDY = Path(__file__).resolve().parents[2] / 'results' / 'text' / 'study'  # the study's results folder
FAMILIES = [('gmlp', 'gMLP'), ('amlp', 'aMLP'), ('bigs', 'BiGS'), ('bert', 'BERT')]
KEPT = ('trainer_state.json', 'eval_results.json', 'test_results.json', 'config.json')


def load(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def latest_checkpoint(run: Path) -> Optional[Path]:
    """The run's checkpoint-N/ folder with the largest N, or None."""
    found = [(int(p.name.split('-')[1]), p) for p in run.glob('checkpoint-*') if p.name.split('-')[1].isdigit()]
    return max(found)[1] if found else None


def finished(run: Path) -> bool:
    """A run that trained to its last update and saved its final model (Trainer's eval_results.json beside it)."""
    return (run / 'eval_results.json').exists() and (run / 'model.safetensors').exists()


def run_state(run: Path):
    """The run's trainer_state.json: the final one, else its latest checkpoint's (a run stopped early), else None."""
    if (run / 'trainer_state.json').exists():
        return load(run / 'trainer_state.json')
    last = latest_checkpoint(run)
    return load(last / 'trainer_state.json') if last is not None else None


def copy_run(run: Path, out: Path):
    dst = out / 'runs' / run.name
    dst.mkdir(parents=True, exist_ok=True)
    source = run if finished(run) else latest_checkpoint(run)
    for name in KEPT:
        if source is not None and (source / name).exists():
            shutil.copy2(source / name, dst / name)


def run_lr(run: Path) -> str:
    """The peak learning rate, as the run's name spells it (``..._lrX``; Trainer's log holds the scheduled one)."""
    return re.search(r'_lr([0-9.e+-]+?)(?:_seed\d+)?$', run.name).group(1)


def params(run: Path) -> Optional[int]:
    """Parameters of the run's saved weights (read from the safetensors header, no tensor loaded)."""
    from safetensors import safe_open
    source = run if finished(run) else latest_checkpoint(run)
    path = source / 'model.safetensors' if source is not None else None
    if path is None or not path.exists():
        return None
    with safe_open(str(path), 'pt') as f:
        return sum(_numel(f.get_slice(k).get_shape()) for k in f.keys())


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def pretraining_runs(runs: Path, key: str):
    """Every pretraining run of this encoder that evaluated at least once."""
    return sorted(p for p in runs.glob(f'pre_{key}_lr*') if p.is_dir() and evaluations(p))


def evaluations(run: Path):
    """[(step, held-out loss)] of the run's periodic and final evaluations."""
    state = run_state(run) or {'log_history': []}
    rows = [(r['step'], r['eval_loss']) for r in state['log_history'] if 'eval_loss' in r]
    final = load(run / 'eval_results.json')
    if final is not None and (not rows or rows[-1][0] != state['global_step']):
        rows.append((state['global_step'], final['eval_loss']))
    return rows


def pretraining_outcome(run: Path):
    """(held-out MLM loss, lr, params or None, minutes or None, note) of a pretraining run: its final evaluation, or
    for a run stopped before its last update its latest checkpoint's lowest evaluation."""
    state, evals = run_state(run), evaluations(run)
    minutes = next((r['train_runtime'] / 60 for r in reversed(state['log_history']) if 'train_runtime' in r), None)
    if finished(run):
        return evals[-1][1], run_lr(run), params(run), minutes, ''
    step, loss = min(evals, key=lambda e: e[1])
    return (loss, run_lr(run), params(run), minutes,
            f" (stopped at update {state['global_step']} of {state['max_steps']}; best evaluation, update {step})")


def pretrained_encoder(runs: Path, key: str) -> Optional[Path]:
    """The folder the pretrained arm of encoder ``key`` starts from (``--init-from``): of its pretraining runs, the
    one with the lowest held-out MLM loss; its final model, or for a run stopped early its latest checkpoint."""
    outcomes = {run: pretraining_outcome(run) for run in pretraining_runs(runs, key)}
    if not outcomes:
        return None
    run = min(outcomes, key=lambda p: outcomes[p][0])
    return run if finished(run) else latest_checkpoint(run)


def scores(results: dict, prefix: str) -> dict:
    return {k: results[f'{prefix}_{k}'] for k in ('acc', 'f1', 'mcc')}


def fmt(m):
    return f"{m['acc']:.2f} % (F1 {m['f1']:.1f}, MCC {m['mcc']:.1f})"


def finetuning_runs(runs: Path, key: str, arm: str, lrs=None):
    """{seed: {lr: run folder}} of this encoder and arm, from the run names ft_KEY_ARM_lrX[_seedS] (no suffix: 42);
    only the learning rates in ``lrs`` when given."""
    name = re.compile(rf'ft_{key}_{arm}_lr([0-9.e+-]+?)(?:_seed(\d+))?$')
    found = {}
    for p in runs.glob(f'ft_{key}_{arm}_lr*'):
        m = name.match(p.name)
        if p.is_dir() and m and (lrs is None or m.group(1) in lrs):
            found.setdefault(int(m.group(2) or 42), {})[m.group(1)] = p
    return {seed: dict(sorted(found[seed].items(), key=lambda kv: float(kv[0]))) for seed in sorted(found)}


def finetuning_result(run: Path) -> Optional[dict]:
    """{'heldout', 'dev', 'best_step', 'minutes'} of a finished fine-tuning run with a --test-file score, else None."""
    held, dev, state = load(run / 'eval_results.json'), load(run / 'test_results.json'), load(run / 'trainer_state.json')
    if held is None or dev is None or state is None:
        return None
    best = state.get('best_model_checkpoint')
    minutes = next((r['train_runtime'] / 60 for r in reversed(state['log_history']) if 'train_runtime' in r), 0.)
    return {'heldout': scores(held, 'eval'), 'dev': scores(dev, 'test'), 'minutes': minutes,
            'best_step': int(best.rsplit('-', 1)[1]) if best else state['global_step']}


def arm_cells(runs: Path, key: str, label: str, arm: str, lrs, out: Path, detail_rows: list):
    """(cell, mean dev acc, pooled cell, pooled mean, an LR choice was made) of one encoder's arm."""
    chosen_per_seed, results_per_seed = [], {}
    for seed, by_lr in finetuning_runs(runs, key, arm, lrs).items():
        results = results_per_seed[seed] = {}
        for lr, run in by_lr.items():
            r = finetuning_result(run)
            if r is None:
                continue
            copy_run(run, out)
            results[lr] = r
            detail_rows.append(f"| {label} | {'pretrained' if arm == 'pre' else 'scratch'} | {lr} | {seed} | "
                               f"{r['heldout']['acc']:.2f} % (step {r['best_step']}) | {fmt(r['dev'])} | "
                               f"{r['minutes']:.1f} min |")
        if results:
            lr = max(results, key=lambda k: (results[k]['heldout']['acc'], -float(k)))
            chosen_per_seed.append((seed, lr, results[lr]))
    if not chosen_per_seed:
        cell, mean = 'not run', None
    elif len(chosen_per_seed) == 1:
        _, lr, r = chosen_per_seed[0]
        cell, mean = f"{fmt(r['dev'])}; lr {lr}, heldout {r['heldout']['acc']:.2f} %", r['dev']['acc']
    else:
        accs = [r['dev']['acc'] for _, _, r in chosen_per_seed]
        mean = statistics.mean(accs)
        each = ', '.join(f"{r['dev']['acc']:.2f} (seed {seed}, lr {lr})" for seed, lr, r in chosen_per_seed)
        cell = f"**{mean:.2f} %** mean of {len(accs)} seeds (sd {statistics.stdev(accs):.2f}): {each}"
    # second rule: one LR for all seeds, the one with the best mean held-out accuracy (among the LRs every seed ran)
    shared = set.intersection(*(set(r) for r in results_per_seed.values())) if results_per_seed else set()
    if len(results_per_seed) > 1 and shared:
        def heldout_mean(lr):
            return statistics.mean(r[lr]['heldout']['acc'] for r in results_per_seed.values())
        lr = max(shared, key=lambda k: (heldout_mean(k), -float(k)))
        accs = [r[lr]['dev']['acc'] for r in results_per_seed.values()]
        pooled_mean = statistics.mean(accs)
        pooled = (f"**{pooled_mean:.2f} %** (sd {statistics.stdev(accs):.2f}), lr {lr}: heldout mean "
                  f"{heldout_mean(lr):.2f} % (" + ', '.join(f"{k}: {heldout_mean(k):.2f} %"
                                                            for k in sorted(shared, key=float)) + ')')
    else:
        pooled, pooled_mean = 'not run (needs every seed at a common LR)', None
    return cell, mean, pooled, pooled_mean, len(shared) > 1


def main(runs: Path, out: Path, text_label: str, lrs=None, table_name: str = 'table.md'):
    out.mkdir(parents=True, exist_ok=True)
    pre_rows, ft_rows, pooled_rows, detail_rows, curves, budgets = [], [], [], [], {}, set()
    lr_choice_made = False  # some arm ran every seed at more than one LR: the second table is worth printing
    for key, label in FAMILIES:
        outcomes = {run: pretraining_outcome(run) for run in pretraining_runs(runs, key)}
        for run, (loss, lr, n, minutes, note) in outcomes.items():
            n = '' if n is None else f'{n / 1e6:.2f} M'
            time = '' if minutes is None else f'{minutes:.0f} min'
            pre_rows.append(f'| {label} | {run.name}{note} | {lr} | {n} | {loss:.3f} | {time} |')
            state = run_state(run)
            budgets.add((state['max_steps'], state['train_batch_size']))
            copy_run(run, out)
        if outcomes:
            curves[label] = evaluations(min(outcomes, key=lambda p: outcomes[p][0]))
        arms = [arm_cells(runs, key, label, arm, lrs, out, detail_rows) for arm in ('pre', 'scratch')]
        cells, means, pooled_cells, pooled_means, choices = zip(*arms)
        lr_choice_made |= any(choices)
        gain = 'n/a' if None in means else f'{means[0] - means[1]:+.2f}'
        ft_rows.append(f'| {label} | {cells[0]} | {cells[1]} | {gain} |')
        gain = 'n/a' if None in pooled_means else f'{pooled_means[0] - pooled_means[1]:+.2f}'
        pooled_rows.append(f'| {label} | {pooled_cells[0]} | {pooled_cells[1]} | {gain} |')

    if curves:
        plot_curves(curves, out)
    base = load(STUDY / 'baselines.json')
    baseline_rows = [] if base is None else [
        f"| majority class (of fit.tsv) | {fmt(base['majority_class'])} | | |",
        f"| TF-IDF uni+bigram logistic regression, C={base['tfidf_uni_bigram_logreg']['C']:g} chosen on heldout.tsv | "
        f"{fmt(base['tfidf_uni_bigram_logreg'])} | | |",
        f"| the same refitted on all of train.tsv | {fmt(base['tfidf_uni_bigram_logreg_all_train'])} | | |"]
    text = [f'## Pretraining (masked LM on {text_label}, '
            f"{' / '.join(f'{s:,} updates x {b:,} blocks' for s, b in sorted(budgets))})", '',
            '| encoder | run | lr | params | held-out MLM loss | time |',
            '| --- | --- | --- | --- | --- | --- |', *pre_rows, '',
            '## Fine-tuning on rt-polarity: dev.tsv accuracy of the checkpoint chosen on heldout.tsv'
            + (f" (fine-tuning learning rates {', '.join(lrs)} only)" if lrs else ''), '',
            '| encoder | pretrained | from scratch (same vocabulary) | pretraining gain (points) |',
            '| --- | --- | --- | --- |', *ft_rows, *baseline_rows, '',
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
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, rows in curves.items():
        ax.plot([s for s, _ in rows], [loss for _, loss in rows], marker='o', label=label)
    ax.set(xlabel='update', ylabel='held-out MLM loss', title='held-out pretraining text')
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / 'pretraining_curves.png', dpi=100)
    plt.close(fig)


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('runs', type=Path, help='the folder the runs were written to (RUNS)')
    parser.add_argument('--out', type=Path, default=STUDY, help='results folder (default: %(default)s)')
    parser.add_argument('--pretraining-text', default='WikiText-2', help='what the encoders were pretrained on')
    parser.add_argument('--lrs', nargs='+', default=None,
                        help='only the fine-tuning runs at these learning rates, as spelt in the run names (e.g. 1e-3)')
    parser.add_argument('--table-name', default='table.md', help='file name of the table under --out')
    parser.add_argument('--encoder', default='', choices=[''] + [k for k, _ in FAMILIES],
                        help='print the folder the pretrained arm of this encoder starts from (empty: none) and exit')
    args = parser.parse_args()
    if args.encoder:
        print(pretrained_encoder(args.runs, args.encoder) or '')
    else:
        main(args.runs, args.out, args.pretraining_text, args.lrs, args.table_name)
