""" Overlay the held-out loss curves of several runs of ``python -m mlp_vision.train_text`` in one PNG and print a
Markdown table of their final numbers (each run folder's ``trainer_state.json`` and ``eval_results.json``).

    python scripts/text/compare.py results/text/shakespeare/compare.png \\
        MLP-Attention=results/text/shakespeare/gpt_mlp_attention SDPA=results/text/shakespeare/gpt_sdpa
"""
import argparse
import json
import math
from pathlib import Path

import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
from safetensors import safe_open  # noqa: E402


def _params(run: Path) -> int:
    with safe_open(str(run / 'model.safetensors'), framework='pt') as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('out_png')
    parser.add_argument('runs', nargs='+', metavar='LABEL=RUN_DIR')
    parser.add_argument('--title', default='')
    args = parser.parse_args(argv)
    fig, ax = plt.subplots(figsize=(7, 4))
    print('| run | params (M) | steps | final held-out loss | ppl | train samples/s | train min |')
    print('|---|---|---|---|---|---|---|')
    for label, run in (r.split('=', 1) for r in args.runs):
        run = Path(run)
        history = json.loads((run / 'trainer_state.json').read_text())['log_history']
        evals = [(row['step'], row['eval_loss']) for row in history if 'eval_loss' in row]
        ax.plot(*zip(*evals), marker='o', label=label)
        final = json.loads((run / 'eval_results.json').read_text())
        train = next(row for row in history if 'train_runtime' in row)
        print(f'| {label} | {_params(run) / 1e6:.3f} | {train["step"]} | {final["eval_loss"]:.4f} | '
              f'{math.exp(final["eval_loss"]):.3f} | {train["train_samples_per_second"]:,.1f} | '
              f'{train["train_runtime"] / 60:.1f} |')
    ax.set(xlabel='update', ylabel='held-out loss', title=args.title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out_png, dpi=120)


if __name__ == '__main__':
    main()
