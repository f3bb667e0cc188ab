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
    assert (tmp_path / 'routes.md').read_text().startswith('# routes:')


@pytest.fixture(scope='module')
def token_padding_script():
    path = SCRIPT.parent / 'token_padding.py'
    spec = importlib.util.spec_from_file_location('token_padding_script', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_token_padding_script_times_every_variant(token_padding_script, tmp_path):
    """Issue 34 item 1's GPU measurement at toy sizes on the CPU: every variant timed, padded outputs unchanged."""
    tp = token_padding_script
    common = ['--device', 'cpu', '--precision', 'fp32', '--samples', '2', '--iters', '1', '--warmup', '1',
              '--multiples', '1', '8', '16', '--tokens', '13', '--channels', '8', '--batch', '2']
    assert tp.main(['gemm', '--out', str(tmp_path / 'gemm')] + common) == 0
    rows = json.loads((tmp_path / 'gemm.json').read_text())['rows']
    assert [r['variant'] for r in rows] == ['unpadded', 'contracted_16', 'both_16']  # 8 and 16 both pad 13 to 16
    assert rows[0]['speedup_vs_unpadded'] == 1 and all(r['ms'] > 0 for r in rows)
    assert tp.main(['layers', '--out', str(tmp_path / 'layers')] + common) == 0
    rows = json.loads((tmp_path / 'layers.json').read_text())['rows']
    assert [(r['layer'], r['variant']) for r in rows] == [
        (layer, f'multiple_{k}') for layer in ('sgu', 'mixer_token_mlp') for k in (1, 8, 16)]
    assert all(r['max_abs_diff'] < 1e-5 for r in rows)
    assert tp.main(['models', '--models', 'gmlp_ti', 'mixer_s16', '--img-size', '48', '--out',
                    str(tmp_path / 'models')] + common) == 0
    rows = json.loads((tmp_path / 'models.json').read_text())['rows']
    # 3 x 3 = 9 tokens: gMLP-Ti's 30 SGUs, Mixer-S's 8 blocks x 2 token Linears carry the multiple
    assert [(r['model'], r['token_multiple_modules']) for r in rows[::3]] == [('gmlp_ti', 30), ('mixer_s16', 16)]
    assert (tmp_path / 'models.md').read_text().startswith('# models:')

