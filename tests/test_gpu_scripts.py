"""The GPU measurement scripts' logic, run on the CPU at toy sizes (their numbers come from a GPU lease:
``scripts/gpu/run_gpu.sh``); no time is asserted."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / 'scripts' / 'gpu' / 'text_models.py'


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope='module')
def text_models():
    return _load(SCRIPT)


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
    assert text_models.main(['pair', '--layers', '1', '--seq-lens', '32', '64', '--profile',
                             '--out', str(tmp_path / 'pair')] + common) == 0
    rows = json.loads((tmp_path / 'pair.json').read_text())['rows']
    assert [(r['seq_len'], r['batch']) for r in rows] == [(32, 4), (64, 2)]
    assert all(r['speedup_bigs_over_bert'] > 0 and r['bigs_tokens_per_s'] > 0 for r in rows)
    profiles = (tmp_path / 'pair_profile.txt').read_text()  # both models' top ops, at the first length only
    assert [line for line in profiles.splitlines() if line.startswith('## ')] == [
        '## bigs, 1 layers, batch 4 x 32 tokens, training step', '## bert, 1 layers, batch 4 x 32 tokens, training step']
    assert profiles.count('Self CPU') >= 2 and 'aten::' in profiles
    assert text_models.main(['routes', '--seq-lens', '64', '--out', str(tmp_path / 'routes')] + common) == 0
    row = json.loads((tmp_path / 'routes.json').read_text())['rows'][0]
    assert {'direct_train_ms', 'fft_train_ms', 'chunked_train_ms', 'bert_train_ms'} <= set(row)
    assert 'triton_train_ms' not in row  # no CUDA here
    # memory per token on the CPU: the activations kept for the backward pass; the chunked route keeps less than FFT
    assert 0 < row['chunked_train_kib_per_token'] < row['fft_train_kib_per_token']
    assert row['bert_train_tokens_per_s'] > 0
    assert row['auto_route'] == 'direct'  # 64 tokens on the CPU
    assert (tmp_path / 'routes.md').read_text().startswith('# routes:')


# ------------------------------------------------------------------------------------------------ issue 34 item 5
GPU_DIR = SCRIPT.parent
LEASE_PARTS = ['a_gmlp', 'b_smlpnet', 'c_mixer', 'd_bigs_layer', 'e_bigs_model', 'f_text_trainer',
               'g_bigs_layer_compiled', 'h_bigs_linear', 'i_bigs_linear_more', 'j_vision_variants']


def _plan(part, tmp_path):
    import subprocess
    out = subprocess.run(['bash', str(GPU_DIR / 'run_gpu.sh'), part], capture_output=True, text=True, check=True,
                         env={'DRY': '1', 'WORK': str(tmp_path), 'PATH': '/usr/bin:/bin'}, cwd=GPU_DIR.parents[1])
    return [line.split('\t')[1:] for line in out.stdout.splitlines() if line.startswith('STEP\t')]


@pytest.mark.parametrize('part', LEASE_PARTS)
def test_each_lease_part_fits_a_lease_and_its_commands_parse(part, tmp_path, monkeypatch):
    import shlex
    import mlp_vision.benchmark as benchmark
    steps = _plan(part, tmp_path)
    assert steps, f'{part} runs nothing'
    assert sum(int(secs) for _, secs, _ in steps) <= 480  # the part's steps, compiles included, within 8 minutes
    monkeypatch.setattr(benchmark, 'parse_device', lambda device, flag='--device': device)  # no GPU here
    for name, _, command in steps:
        argv = shlex.split(command)
        if 'benchmark.py' in argv[1]:
            args = benchmark.parse_args(argv[2:])  # every flag exists and every value passes the checks
            assert args.device == 'cuda' and args.out, name
        elif argv[1] == '-m':
            assert argv[2] == 'mlp_vision.train_text', name
            from mlp_vision.train_text import build_parser
            build_parser().parse_args(argv[3:])
        elif argv[1] == 'scripts/gpu/vision_variants.py':
            args = _load(GPU_DIR / 'vision_variants.py').build_parser().parse_args(argv[2:])
            assert args.device == 'cuda' and args.compile != 'none' and args.out, name
        else:
            assert argv[1] == 'scripts/gpu/text_models.py', name
            args = _load(SCRIPT).build_parser().parse_args(argv[2:])
            assert args.device == 'cuda' and args.out, name


def test_speed_rows_give_ratio_matmul_share_and_the_goal_verdict():
    speed_rows = _load(GPU_DIR / 'speed_rows.py')
    recorded = GPU_DIR.parents[1] / 'results' / 'benchmarks' / 'cpu_2t_compiled_gmlp_s_vs_timm.json'
    rows = speed_rows.rows_of([recorded])
    results = json.loads(recorded.read_text())['results']
    assert len(rows) == len(results)
    cells = [c.strip() for c in rows[0].strip('|').split('|')]
    assert cells[2:5] == ['gmlp_s', 'gmlp_s16_224', results[0]['mode']]
    assert cells[9] == f"{results[0]['speedup']:.2f}x"
    assert cells[14:] == ['>= 1.3x', 'yes' if results[0]['speedup'] >= 1.3 else 'no']
    mixer = {'model': 'mixer_b16', 'baseline': 'vit_base_patch16_224', 'mode': 'train', 'batch_size': 128,
             'speedup': 1.19, 'pct_of_matmul': 36.0, 'img_per_s': 3760., 'base_img_per_s': 3167.}
    assert speed_rows.table_row(mixer, {}).endswith('| >= 45 % of mm | no |')
    assert speed_rows.table_row(dict(mixer, pct_of_matmul=46.), {}).endswith('| >= 45 % of mm | yes |')
    bigs = {'model': 'bigs_layer', 'baseline': 'bert_layer', 'mode': 'train', 'batch_size': 2, 'seq_len': 16384,
            'speedup': 2.0, 'seq_per_s': 1.0, 'base_seq_per_s': 0.5}
    assert speed_rows.table_row(bigs, {}).endswith('| >= 3x | no |')
    # issue 42: a sequence layer's throughput is tokens/s; 8x at 64K tokens; the step memory of both sides
    bigs = dict(bigs, seq_len=65536, batch_size=1, speedup=7.5, tok_per_s=9.0e5, base_tok_per_s=1.2e5,
                step_mem_mb=2500., base_step_mem_mb=3600.)
    cells = [c.strip() for c in speed_rows.table_row(bigs, {}).strip('|').split('|')]
    assert cells[7:10] == ['900,000', '120,000', '7.50x'] and cells[13:] == ['2,500 / 3,600', '>= 8x', 'no']
    assert len(cells) == speed_rows.HEADER.splitlines()[0].count('|') - 1


def test_speed_rows_skip_files_they_do_not_understand(tmp_path, capsys):
    """lease.sh hands speed_rows every WORK/bench/*.json: text_models.py's {env, rows} and files cut short by a step's
    time limit are skipped (a note on stderr), the benchmark.py files beside them still make rows."""
    speed_rows = _load(GPU_DIR / 'speed_rows.py')
    recorded = GPU_DIR.parents[1] / 'results' / 'benchmarks' / 'gpu_h100_bigs_vs_bert_4096.json'
    others = {'longest.json': json.dumps(dict(env={}, rows=[dict(model='bigs', longest_fitting=65536)])),
              'cut.json': '{"environment": {"date_utc": ', 'list.json': '[1, 2]',
              'odd.json': json.dumps(dict(results=[dict(baseline='x')]))}
    for name, text in others.items():
        (tmp_path / name).write_text(text)
    assert speed_rows.main([str(tmp_path / n) for n in others] + [str(recorded)]) == 0
    out, err = capsys.readouterr()
    rows = [line for line in out.splitlines()[2:]]
    assert len(rows) == 2 and all('| bigs_layer | bert_layer |' in r for r in rows)
    assert ' tok/s' not in rows[0] and '| 5,843,246 | 9,551,282 | 0.61x |' in rows[0]
    assert all(f'skipped {tmp_path / n}' in err for n in others)


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



def test_vision_variants_script_times_every_contender(tmp_path, monkeypatch):
    """Issue 45 items 3 and 5 at toy sizes on the CPU (eager): every contender of every group timed, with its FLOPs
    and share of the matmul rate; an existing --out is refused before any work. The matmul rate is a fixed one
    here (measuring it is most of this run's time on a CPU): ``-m slow`` runs the script with the measured rate."""
    vv = _load(GPU_DIR / 'vision_variants.py')
    ceilings = []

    def fixed_ceiling(device, precision):
        ceilings.append((device, precision))
        return dict(matmul_n=8, matmul_dtype='float32', matmul_gflops=2.0)
    monkeypatch.setattr(vv, 'matmul_ceiling', fixed_ceiling)
    prefix = str(tmp_path / 'vv')
    argv = ['--device', 'cpu', '--precision', 'fp32', '--compile', 'none', '--tiny', '--img-size', '32', '--batch', '2',
            '--samples', '2', '--iters', '1', '--warmup', '1', '--out', prefix]
    assert vv.main(argv) == 0
    assert ceilings == [(torch.device('cpu'), 'fp32')]
    env, rows = (json.loads((tmp_path / 'vv.json').read_text())[k] for k in ('environment', 'rows'))
    assert env['matmul_gflops'] == 2.0
    assert [r['contender'] for r in rows] == [label for group in vv.GROUPS.values() for label, _, _ in group]
    assert all(r['img_per_s'] > 0 and r['gflop_per_img'] > 0 for r in rows)
    for r in rows:  # the share of the matmul rate: FLOPs per image x images/s over the rate
        assert r['pct_of_matmul'] == pytest.approx(100 * r['gflop_per_img'] * r['img_per_s'] / 2.0, rel=1e-9)
    flops = {r['contender']: r['gflop_per_img'] for r in rows}
    assert flops['gmlp_s token_major'] == flops['gmlp_s split_fc1'] == flops['gmlp_s']  # same function, same work
    assert '| gmlp | gmlp_s token_major |' in (tmp_path / 'vv.md').read_text()
    with pytest.raises(SystemExit, match='exists'):
        vv.main(argv)


@pytest.mark.slow
def test_vision_variants_script_measures_the_matmul_rate(tmp_path):
    """The script with the measured matmul rate (``mlp_vision.benchmark.matmul_ceiling``), one group."""
    vv = _load(GPU_DIR / 'vision_variants.py')
    assert vv.main(['--device', 'cpu', '--precision', 'fp32', '--compile', 'none', '--tiny', '--img-size', '32',
                    '--batch', '2', '--samples', '1', '--iters', '1', '--warmup', '1', '--groups', 'mixer',
                    '--out', str(tmp_path / 'vv')]) == 0
    env, rows = (json.loads((tmp_path / 'vv.json').read_text())[k] for k in ('environment', 'rows'))
    assert env['matmul_gflops'] > 0 and env['matmul_n'] == 2048
    assert len(rows) == 2 and all(r['pct_of_matmul'] > 0 for r in rows)
