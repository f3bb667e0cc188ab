""" Gather the study's runs (issue 13.4) into results/text/study: each run's args.yaml, summary.csv and
results.json (no weights), and table.md with the pretraining results and the dev accuracies beside the baselines.

    python results/text/study/collect.py RUNS_DIR
"""
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAMILIES = [('gmlp', 'gMLP'), ('amlp', 'aMLP'), ('bigs', 'BiGS'), ('bert', 'BERT')]


def main(runs: Path):
    out = HERE / 'runs'
    rows, pre_rows = [], []
    for key, label in FAMILIES:
        pre = runs / f'pre_{key}'
        if (pre / 'results.json').exists():
            r = json.loads((pre / 'results.json').read_text())
            vf = r.get('val_final', {})
            pre_rows.append(f"| {label} | {r.get('params', 0) / 1e6:.2f} M | {vf.get('loss', float('nan')):.3f} | "
                            f"{vf.get('masked_acc', float('nan')):.1f} % | {r.get('train_seconds', 0) / 60:.1f} min |")
        cells = []
        for arm in ('pre', 'scratch'):
            run = runs / f'ft_{key}_{arm}'
            res = run / 'results.json'
            if res.exists():
                r = json.loads(res.read_text())
                best = r['val_best']
                cells.append(f"{best['acc']:.2f} % (F1 {best['f1']:.1f}, MCC {best['mcc']:.1f}; "
                             f"{r.get('train_seconds', 0) / 60:.1f} min)")
            else:
                cells.append('not run')
        rows.append(f'| {label} | {cells[0]} | {cells[1]} |')
        for run in [pre] + [runs / f'ft_{key}_{a}' for a in ('pre', 'scratch')]:
            if run.is_dir():
                dst = out / run.name
                dst.mkdir(parents=True, exist_ok=True)
                for name in ('args.yaml', 'summary.csv', 'results.json', 'curves.png'):
                    if (run / name).exists():
                        shutil.copy2(run / name, dst / name)
    base = json.loads((HERE / 'baselines.json').read_text())
    text = ['## Pretraining (masked LM, WikiText-2 valid -> test, byte-level BPE 8,000, 400 updates x 4,096 tokens)', '',
            '| encoder | params | final val loss | masked-token acc | time |', '| --- | --- | --- | --- | --- |',
            *pre_rows, '',
            '## Fine-tuning on rt-polarity (dev accuracy, best of the evaluations every 100 of 400 updates)', '',
            '| encoder | pretrained | from scratch (same vocabulary) |', '| --- | --- | --- |', *rows,
            f"| majority class | {base['majority_class']['acc']:.2f} % | |",
            f"| TF-IDF uni+bigram logistic regression | {base['tfidf_uni_bigram_logreg']['acc']:.2f} % | |", '']
    (HERE / 'table.md').write_text('\n'.join(text))
    print('\n'.join(text))


if __name__ == '__main__':
    main(Path(sys.argv[1]))
