""" benchmark.py end to end at a tiny size: a paired comparison writes its CSV / JSON / markdown, the two contenders
compute the same outputs, and the MAC count is the project's (no timing is asserted). """
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_paired_comparison_writes_results(tmp_path):
    out = tmp_path / 'bench'
    cmd = [sys.executable, str(REPO / 'benchmark.py'), '--compare', 'smlpnet_t', 'ref:smlpnet_t',
           '--bench', 'both', '-b', '2', '--img-size', '64', '--samples', '2', '--min-sample-time', '0.02',
           '--threads', '1', '--no-memory', '--no-ceiling', '--out', str(out)]
    subprocess.run(cmd, check=True, cwd=REPO, capture_output=True, text=True, timeout=600)
    rows = list(csv.DictReader(open(f'{out}.csv')))
    assert [r['mode'] for r in rows] == ['inference', 'train']
    for r in rows:
        assert r['model'] == 'smlpnet_t' and r['baseline'] == 'ref:smlpnet_t'
        assert int(r['pairs']) == 2 and float(r['speedup']) > 0
        assert float(r['max_abs_diff']) <= 1e-4 * max(1., float(r['max_abs_out']))  # same function
        # sMLPNet-T MACs scale with the token count: 5.01 G at 224 -> (64/224)^2 of it at 64, within the
        # stem / head terms that do not scale
        assert float(r['gmacs_per_img']) == pytest.approx(5.0067 * (64 / 224) ** 2, rel=0.05)
    env = json.load(open(f'{out}.json'))['environment']
    assert env['threads'] == 1 and 'torch' in env and 'date_utc' in env
    assert 'smlpnet_t' in Path(f'{out}.md').read_text()


def test_bad_model_name_is_a_clear_error(tmp_path):
    res = subprocess.run([sys.executable, str(REPO / 'benchmark.py'), '--model', 'no_such_model', '--out',
                          str(tmp_path / 'x')], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0
    assert 'no_such_model' in res.stderr
