""" The GPU speed table's rows (issue 34 item 5) from benchmark.py's ``--out`` JSON files: ours vs each contender,
throughput, the ratio, % of the measured matmul rate, compile time, and the issue's goal for the pair with its
verdict. ``scripts/gpu/lease.sh`` runs it after each part; a session commits its rows to results/gpu/README.md.
Files it does not understand (another script's JSON, such as ``text_models.py``'s, or one cut short by a step's time
limit) are skipped with a note on stderr.

    python scripts/gpu/speed_rows.py output/gpu/work/bench/*.json      # markdown rows on stdout
"""
import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

# issue 34's goals (H100 / H200, bf16, channels_last, compiled training step): (ours, other) -> (what, threshold)
GOALS: Dict[Tuple[str, str], Tuple[str, float]] = {
    ('smlpnet_t', 'convnext_tiny'): ('ratio', 1.0),
    ('gmlp_s', 'vit_small_patch16_224'): ('ratio', 0.8),
    ('gmlp_s', 'gmlp_s16_224'): ('ratio', 1.3),
    ('mixer_b16', 'mixer_b16_224'): ('ratio', 1.3),
    ('mixer_b16', 'vit_base_patch16_224'): ('pct_of_matmul', 45.0),
    ('bigs_layer', 'bert_layer'): ('ratio', 1.4),  # at 4,096 tokens; 3x at 16,384, 8x at 65,536 (below)
}
# issue 42: the BiGS-large layer vs the BERT-large layer from these lengths on (memory per token <= BERT's: the step
# memory column, both sides at one batch and length)
BIGS_RATIO_FROM_LEN = ((65536, 8.0), (16384, 3.0))
HEADER = ('| date | device | ours | other | mode | batch | seq | ours img/s or tok/s | other img/s or tok/s | '
          'ours / other | ours % of mm | other % of mm | compile s (ours / other) | step mem MiB (ours / other) | '
          'goal | met |\n'
          '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |')


def goal_of(row: Dict) -> Optional[Tuple[str, float]]:
    goal = GOALS.get((row['model'], row.get('baseline')))
    if goal and row['model'] == 'bigs_layer':
        goal = next((('ratio', r) for n, r in BIGS_RATIO_FROM_LEN if row.get('seq_len', 0) >= n), goal)
    return goal


def _fmt(value, spec: str) -> str:
    return '–' if value is None else format(value, spec)


def table_row(row: Dict, env: Dict) -> str:
    """One markdown row of a paired benchmark result ``row`` (benchmark.py's JSON ``results`` entry)."""
    rate = 'img_per_s' if 'img_per_s' in row else 'tok_per_s'  # a sequence layer's: tokens/s
    goal = goal_of(row)
    value = {'ratio': row.get('speedup'), 'pct_of_matmul': row.get('pct_of_matmul')}.get(goal[0]) if goal else None
    met = '–' if goal is None or value is None else ('yes' if value >= goal[1] else 'no')
    goal_text = '–' if goal is None else (f'>= {goal[1]:g}x' if goal[0] == 'ratio' else f'>= {goal[1]:g} % of mm')
    compile_s = (f"{_fmt(row.get('compile_s'), '.0f')} / {_fmt(row.get('base_compile_s'), '.0f')}"
                 if row.get('compile') else '–')
    return (f"| {env.get('date_utc', '?')} | {env.get('device_name', env.get('device', '?'))} | {row['model']} | "
            f"{row.get('baseline', '–')} | {row['mode']} | {row['batch_size']} | {row.get('seq_len', '–')} | "
            f"{_fmt(row.get(rate), ',.0f')} | {_fmt(row.get('base_' + rate), ',.0f')} | "
            f"{_fmt(row.get('speedup'), '.2f')}x | {_fmt(row.get('pct_of_matmul'), '.0f')} | "
            f"{_fmt(row.get('base_pct_of_matmul'), '.0f')} | {compile_s} | "
            f"{_fmt(row.get('step_mem_mb'), ',.0f')} / {_fmt(row.get('base_step_mem_mb'), ',.0f')} | "
            f"{goal_text} | {met} |")


def _paired_results(path: Path) -> Optional[Tuple[List[Dict], Dict]]:
    """benchmark.py's paired ``results`` rows of ``path`` and its ``environment``; None for a file of another shape
    (``text_models.py``'s ``{env, rows}``, a list) or one that is not JSON (cut short)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get('results'), list):
        return None
    env = data.get('environment') if isinstance(data.get('environment'), dict) else {}
    rows = [r for r in data['results'] if isinstance(r, dict) and r.get('baseline')]
    if not all({'model', 'mode', 'batch_size'} <= set(r) for r in rows):
        return None
    return rows, env


def rows_of(paths: List[Path]) -> List[str]:
    out = []
    for path in paths:
        found = _paired_results(path)
        if found is None:
            print(f'speed_rows: skipped {path} (not a benchmark.py --out JSON)', file=sys.stderr)
            continue
        rows, env = found
        out += [table_row(r, env) for r in rows]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('files', nargs='*', type=Path, help="benchmark.py --out PREFIX.json files")
    args = p.parse_args(argv)
    rows = rows_of([f for f in args.files if f.is_file()])
    print(HEADER)
    print('\n'.join(rows) if rows else '| (no paired results found) |')
    return 0


if __name__ == '__main__':
    sys.exit(main())
