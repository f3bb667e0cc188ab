""" The GPU speed table's rows (issue 34 item 5) from benchmark.py's ``--out`` JSON files: ours vs each contender,
throughput, the ratio, % of the measured matmul rate, compile time, and the issue's goal for the pair with its
verdict. ``scripts/gpu/lease.sh`` runs it after each part; a session commits its rows to results/gpu/README.md.

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
    ('bigs_layer', 'bert_layer'): ('ratio', 1.4),  # at 4,096 tokens; 3x at 16,384 (below)
}
HEADER = ('| date | device | ours | other | mode | batch | seq | ours img/s | other img/s | ours / other | '
          'ours % of mm | other % of mm | compile s (ours / other) | goal | met |\n'
          '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |')


def goal_of(row: Dict) -> Optional[Tuple[str, float]]:
    goal = GOALS.get((row['model'], row.get('baseline')))
    if goal and row['model'] == 'bigs_layer' and row.get('seq_len', 0) >= 16384:
        goal = ('ratio', 3.0)
    return goal


def _fmt(value, spec: str) -> str:
    return '–' if value is None else format(value, spec)


def table_row(row: Dict, env: Dict) -> str:
    """One markdown row of a paired benchmark result ``row`` (benchmark.py's JSON ``results`` entry)."""
    rate = 'img_per_s' if 'img_per_s' in row else 'seq_per_s'
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
            f"{_fmt(row.get('base_pct_of_matmul'), '.0f')} | {compile_s} | {goal_text} | {met} |")


def rows_of(paths: List[Path]) -> List[str]:
    out = []
    for path in paths:
        data = json.loads(path.read_text())
        env = data.get('environment', {})
        out += [table_row(r, env) for r in data.get('results', []) if r.get('baseline')]
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
