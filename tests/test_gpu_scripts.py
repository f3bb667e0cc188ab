"""The GPU measurement scripts' logic, run on the CPU at toy sizes (their numbers come from a GPU lease:
``scripts/gpu/run_gpu.sh``); no time is asserted."""
import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / 'scripts' / 'gpu' / 'text_models.py'


@pytest.fixture(scope='module')
def text_models():
    spec = importlib.util.spec_from_file_location('text_models', SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize('limit', [300, 1024, 1500, 2047, 2048, 5000, 9000])
def test_longest_fitting_finds_the_limit_to_the_granularity(text_models, limit):
    tried = []

    def fits(n):
        tried.append(n)
        return n <= limit
    found = text_models.longest_fitting(fits, start=1024, max_len=1 << 20, granularity=256)
    assert found['longest_fitting'] == limit // 256 * 256
    assert found['longest_fitting'] <= limit < found['first_failing']
    assert found['first_failing'] - found['longest_fitting'] <= 256
    assert len(tried) == len(set(tried))  # no length measured twice


def test_longest_fitting_stops_at_the_cap(text_models):
    assert text_models.longest_fitting(lambda n: True, 64, 256, 32) == dict(longest_fitting=256, capped_at=256)


def test_pair_and_routes_run_and_write_their_tables(text_models, tmp_path):
    common = ['--device', 'cpu', '--precision', 'fp32', '--hidden', '32', '--samples', '2', '--iters', '1',
              '--warmup', '1', '--batch-tokens', '128']
    assert text_models.main(['pair', '--layers', '1', '--seq-lens', '32', '64', '--out', str(tmp_path / 'pair')]
                            + common) == 0
    rows = json.loads((tmp_path / 'pair.json').read_text())['rows']
    assert [(r['seq_len'], r['batch']) for r in rows] == [(32, 4), (64, 2)]
    assert all(r['speedup_bigs_over_bert'] > 0 and r['bigs_tokens_per_s'] > 0 for r in rows)
    assert text_models.main(['routes', '--seq-lens', '64', '--out', str(tmp_path / 'routes')] + common) == 0
    row = json.loads((tmp_path / 'routes.json').read_text())['rows'][0]
    assert {'direct_train_ms', 'fft_train_ms'} <= set(row) and 'triton_train_ms' not in row  # no CUDA here
    assert row['auto_route'] == 'direct'  # 64 tokens on the CPU
    assert (tmp_path / 'routes.md').read_text().startswith('# routes:')
