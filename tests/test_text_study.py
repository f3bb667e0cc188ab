""" scripts/text_study: one round of the pretrain-then-fine-tune study (run_study.sh: prepare.py, masked-LM
pretraining of the four encoders, fine-tuning from the pretrained folders and from scratch) runs with today's
text trainer on tiny generated data, and collect.py tabulates its Trainer outputs: a row per encoder and arm.
"""
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / 'scripts' / 'text_study'
WORDS = ('the of and to in is was for on that with as by at from his her it an be are this which or had not but '
         'river city war album song team game season film book church ship station island road school').split()
GOOD, BAD = 'good great moving fine'.split(), 'bad dull awful poor'.split()
LABELS = ['gMLP', 'aMLP', 'BiGS', 'BERT']


def _wikitext(path: Path, articles: int, rng: random.Random):
    """WikiText-2's layout: ' = Title = ' lines start articles, ' = = Section = = ' lines sections."""
    lines = []
    for a in range(articles):
        lines += [f' = Article {a} = ', '', ' = = Part = = ', '']
        lines += [' '.join(rng.choice(WORDS) for _ in range(60)) + ' . ' for _ in range(3)]
    path.write_text('\n'.join(lines) + '\n')


def _reviews(path: Path, n: int, rng: random.Random):
    rows = ['sentence\tlabel']
    for _ in range(n):
        y = rng.randint(0, 1)
        rows.append(' '.join([rng.choice(WORDS) for _ in range(6)] + [rng.choice(GOOD if y else BAD)]) + f'\t{y}')
    path.write_text('\n'.join(rows) + '\n')


@pytest.fixture
def data(tmp_path):
    rng = random.Random(0)
    (tmp_path / 'data' / 'wikitext-2').mkdir(parents=True)
    (tmp_path / 'data' / 'rt-polarity').mkdir()
    _wikitext(tmp_path / 'data' / 'wikitext-2' / 'valid.txt', 4, rng)
    _wikitext(tmp_path / 'data' / 'wikitext-2' / 'test.txt', 4, rng)
    _reviews(tmp_path / 'data' / 'rt-polarity' / 'train.tsv', 120, rng)
    _reviews(tmp_path / 'data' / 'rt-polarity' / 'dev.tsv', 20, rng)
    return tmp_path / 'data'


def _study(tmp_path: Path, data: Path, **knobs) -> str:
    env = {**os.environ, 'PYTHONPATH': str(REPO), 'OMP_NUM_THREADS': '1', 'PY': sys.executable, 'DATA': str(data),
           'RUNS': str(tmp_path / 'runs'), 'WIDTH': '16', 'PREPARE_FLAGS': '--vocab-size 200 --val-articles 2',
           'PRE_STEPS': '2', 'PRE_BATCH': '2', 'PRE_EVALS': '1', 'PRE_LRS': '1e-3', 'PRE_LIMIT': '500',
           'FT_STEPS': '2', 'FT_EVAL': '1', 'FT_LRS': '1e-3', 'FT_PAR': '2', 'FT_LIMIT': '500', 'THREADS': '1',
           'AMP': '', **knobs}
    res = subprocess.run(['bash', str(SCRIPTS / 'run_study.sh')], capture_output=True, text=True, env=env,
                         cwd=REPO, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout + res.stderr


@pytest.mark.slow
def test_a_round_runs_with_todays_trainer_and_collect_tabulates_it(data, tmp_path):
    _study(tmp_path, data)
    runs = tmp_path / 'runs'
    for name in ('gmlp', 'amlp', 'bigs', 'bert'):
        pre = runs / f'pre_{name}_lr1e-3'
        assert (pre / 'eval_results.json').is_file() and (pre / 'checkpoint-2').is_dir()
        for arm in ('pre', 'scratch'):
            ft = runs / f'ft_{name}_{arm}_lr1e-3'
            assert set(json.loads((ft / 'test_results.json').read_text())) >= {'test_acc', 'test_f1', 'test_mcc'}
        # the pretrained arm started from the pretraining run's folder: its encoder weights, a new head
        config = json.loads((runs / f'ft_{name}_pre_lr1e-3' / 'config.json').read_text())
        assert config['hidden_size'] == 16 and config['num_hidden_layers'] == 4
    out = tmp_path / 'table'
    res = subprocess.run([sys.executable, str(SCRIPTS / 'collect.py'), str(runs), '--out', str(out)],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    table = (out / 'table.md').read_text()
    pretraining = [row for row in table.splitlines() if row.startswith('| ') and '| pre_' in row]
    assert [row.split(' | ')[0][2:] for row in pretraining] == LABELS
    summary = [row for row in table.splitlines() if row.split(' | ')[0][2:] in LABELS and '| pre_' not in row
               and ('pretrained' not in row and 'scratch' not in row)]
    assert len(summary) == 4 and not any('not run' in row for row in summary), table
    every_run = [tuple(row.split(' | ')[:2]) for row in table.splitlines()
                 if row.split(' | ')[0][2:] in LABELS and row.split(' | ')[1] in ('pretrained', 'scratch')]
    assert sorted(every_run) == sorted((f'| {label}', arm) for label in LABELS for arm in ('pretrained', 'scratch'))
    assert (out / 'pretraining_curves.png').is_file()
    assert (out / 'runs' / 'ft_bigs_pre_lr1e-3' / 'test_results.json').is_file()
    # a second invocation runs nothing again: every run is finished, and no file is rewritten
    before = {p: p.stat().st_mtime_ns for p in runs.rglob('*_results.json')}
    log = _study(tmp_path, data)
    assert 'pre_gmlp_lr1e-3: finished earlier' in log and '=== fine-tuning: 0 runs' in log
    assert before == {p: p.stat().st_mtime_ns for p in runs.rglob('*_results.json')}
