""" Overlay the curves of several runs of ``python -m mlp_vision.train_text`` in one PNG and print a Markdown
table of their final numbers (from each run's ``results.json``).

    python scripts/text/compare.py results/text/shakespeare/compare.png --metric val_ppl \\
        MLP-Attention=results/text/shakespeare/gpt_mlp_attention SDPA=results/text/shakespeare/gpt_sdpa
"""
import argparse
import json
from pathlib import Path

from mlp_vision.training.run.summary import plot_comparison


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('out_png')
    parser.add_argument('runs', nargs='+', metavar='LABEL=RUN_DIR')
    parser.add_argument('--metric', default=None, help='summary.csv column for the right panel, e.g. val_ppl')
    parser.add_argument('--metric-label', default='', help='y-axis label of the right panel')
    parser.add_argument('--title', default='')
    args = parser.parse_args(argv)
    runs = dict(r.split('=', 1) for r in args.runs)
    plot_comparison({label: Path(d) / 'summary.csv' for label, d in runs.items()}, args.out_png, title=args.title,
                    metric_column=args.metric, metric_label=args.metric_label)
    rows = []
    baseline = None
    for label, d in runs.items():
        res = json.loads((Path(d) / 'results.json').read_text())
        final = res['val_final']
        row = [label, res['model'], f'{res["params"] / 1e6:.3f}', res['steps'], f'{res["train_tokens"] / 1e6:.2f}',
               f'{final["loss"]:.4f}', f'{final["ppl"]:.3f}']
        if res['task'] == 'mlm':
            row += [f'{final["masked_acc"]:.2f}', f'{final["mask_token_acc"]:.2f}']
            baseline = res['unigram_baseline']
        row += [f'{res["tokens_per_sec"]:,.0f}', f'{res["train_seconds"] / 60:.1f}']
        rows.append(row)
    head = ['run', 'model', 'params (M)', 'steps', 'train tokens (M)', 'final val loss', 'val ppl']
    if baseline is not None:
        head += ['masked acc (%)', '<mask>-input acc (%)']
    head += ['train tokens/s', 'train min']
    if baseline is not None:
        rows.append(['unigram baseline', '-', '-', '-', '-', f'{baseline["loss"]:.4f}', f'{baseline["ppl"]:.3f}',
                     f'{baseline["masked_acc"]:.2f}', f'{baseline["mask_token_acc"]:.2f}', '-', '-'])
    print('| ' + ' | '.join(head) + ' |')
    print('|' + '---|' * len(head))
    for row in rows:
        print('| ' + ' | '.join(str(c) for c in row) + ' |')


if __name__ == '__main__':
    main()
