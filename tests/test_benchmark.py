""" benchmark.py end to end at a tiny size: a paired comparison writes its CSV / JSON / markdown, the two contenders
compute the same outputs, and the MAC count is the project's (no timing is asserted). """
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

from _helpers import exits_with_one_line  # noqa: E402
from mlp_vision import benchmark  # noqa: E402


def test_paired_comparison_writes_results(tmp_path):
    out = tmp_path / 'bench'
    cmd = [sys.executable, str(REPO / 'benchmark.py'), '--compare', 'smlpnet_t', 'ref:smlpnet_t',
           '--bench', 'both', '-b', '2', '--img-size', '64', '--samples', '2', '--min-sample-time', '0.02',
           '--threads', '1', '--no-memory', '--no-ceiling', '--out', str(out)]
    proc = subprocess.run(cmd, check=True, cwd=REPO, capture_output=True, text=True, timeout=600)
    rows = list(csv.DictReader(open(f'{out}.csv')))
    assert [r['mode'] for r in rows] == ['inference', 'train']
    # every long step says so as it goes (issue 36: 7 silent minutes), beside the result rows
    for line in ('1 compute thread (--threads)', 'smlpnet_t vs ref:smlpnet_t, train: building both',
                 'smlpnet_t: counting MACs', 'A smlpnet_t, train: warm-up step 2/2', 'train: pair 2/2'):
        assert line in proc.stdout, line
    assert ' faster than ' in proc.stdout
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


def test_two_architectures_compare_speed_only(tmp_path, monkeypatch, capsys):
    """A peer of another architecture (ConvNeXt against Mixer): both keep their own weights, the speed is
    compared, no output difference is claimed; a peer that takes no img_size runs at the same input size."""
    _run_bench_main(tmp_path, monkeypatch, '--compare', 'mixer_s16', 'convnext_atto', '-b', '2', '--img-size', '32')
    stderr = capsys.readouterr().err
    (row,) = list(csv.DictReader(open(tmp_path / 'bench.csv')))
    assert row['model'] == 'mixer_s16' and row['baseline'] == 'convnext_atto' and float(row['speedup']) > 0
    assert row['weights'].startswith('none (different architectures') and row['max_abs_diff'] == ''
    # one short note says so, not the load error of one family's weights in the other
    (note,) = [line for line in stderr.splitlines() if 'weights' in line]
    assert note == ('note: mixer_s16 and convnext_atto are different architectures: weights not shared, speed '
                    'only (no output comparison)')
    assert row['img_size'] == '32'
    # the same --out again: refused before any timing, the first results stay
    before = (tmp_path / 'bench.csv').read_bytes()
    assert 'bench.csv exists' in exits_with_one_line(benchmark.main, ['--model', 'mixer_s16', '--out',
                                                                     str(tmp_path / 'bench')], capsys, status=2)
    assert (tmp_path / 'bench.csv').read_bytes() == before


def test_bad_model_name_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        benchmark.main(['--model', 'no_such_model', '--out', str(tmp_path / 'x')])
    assert e.value.code != 0
    assert 'no_such_model' in capsys.readouterr().err


def _run_bench_main(tmp_path, monkeypatch, *args):
    """benchmark.py's run in this process, with the checkout's reference models as its script gives them
    (``test_paired_comparison_writes_results`` runs the script itself; each subprocess is a start of Python and an
    import of torch more)."""
    monkeypatch.setattr(benchmark, 'REFERENCE_DIR', REPO / 'tests' / 'reference')
    benchmark.main([*args, '--samples', '2', '--min-sample-time', '0.02', '--threads', '1', '--no-memory',
                    '--no-ceiling', '--out', str(tmp_path / 'bench')])


def _run_bench(tmp_path, monkeypatch, *args):
    _run_bench_main(tmp_path, monkeypatch, *args)
    out = tmp_path / 'bench'
    return list(csv.DictReader(open(f'{out}.csv'))), Path(f'{out}.md').read_text()


def test_sequence_layers_report_tokens_per_second(tmp_path, monkeypatch):
    d, d_i, length, batch, heads, ffn = 32, 48, 64, 2, 4, 96
    size = ['--dim', str(d), '--hidden-dim', str(d_i), '--num-states', '8', '--heads', str(heads),
            '--ffn-dim', str(ffn), '--seq-len', str(length), '-b', str(batch)]
    rows, md = _run_bench(tmp_path, monkeypatch, '--compare', 'bigs_layer', 'ref:bigs_layer', '--compare', 'bigs_layer',
                          'bert_layer', '--bench', 'both', *size)
    assert [(r['baseline'], r['mode']) for r in rows] == [
        ('ref:bigs_layer', 'inference'), ('ref:bigs_layer', 'train'), ('bert_layer', 'inference'),
        ('bert_layer', 'train')]
    for r in rows:
        assert int(r['seq_len']) == length and int(r['dim']) == d and not r.get('img_per_s')
        # tokens/s = batch x seq-len / step time
        assert float(r['tok_per_s']) == pytest.approx(batch * length / (float(r['step_ms']) / 1e3), rel=1e-6)
    same = rows[0]
    assert float(same['max_abs_diff']) <= 1e-4 * max(1., float(same['max_abs_out']))  # same weights, same function
    assert rows[2]['max_abs_diff'] == ''  # different layers: no output comparison
    # BERT layer MACs per sequence: Q, K, V, O projections, FFN, Q K^T + A V (fused SDPA, counted by the project's
    # handle) and fvcore's 5 per element for each of the two LayerNorms
    bert = 4 * length * d * d + 2 * length * d * ffn + 2 * length * length * d + 2 * 5 * length * d
    assert float(rows[2]['base_gmacs_per_seq']) * 1e9 == pytest.approx(bert, rel=1e-6)
    # BiGS: the seven projections, then each side's convolution as it runs: ours (conv_impl 'auto' on the CPU at 64
    # tokens) the dense Toeplitz GEMM of both directions, plus the LayerNorm and the two kernels' (1, N) x (N, L)
    # Vandermonde products; the official layer its FFTs
    bigs = length * (d * (2 * d + d_i) + 2 * d * d + 2 * d * d_i)
    ours, ref = float(same['gmacs_per_seq']) * 1e9, float(same['base_gmacs_per_seq']) * 1e9
    assert ours == pytest.approx(bigs + 2 * length * length * d + 5 * length * d + 2 * length * 8, rel=1e-6)
    assert bigs < ref < 1.3 * bigs
    assert 'tok/s' in md


@pytest.mark.parametrize('args, message', [
    (['--compare', 'bigs_layer', 'smlpnet_t'], 'cannot be mixed'),
    (['--model', 'bigs_layer', '--channels-last'], 'channels-last'),
    (['--model', 'ref:bert_layer'], 'ref:bert_layer'),
    (['--model', 'bigs_layer', '--seq-len', '0'], '--seq-len'),
    (['--model', 'smlpnet_t', '--threads', '100000'], "--threads must be in [1, "),
    (['--model', 'smlpnet_t', '--device', 'banana'], "--device 'banana' is not a device"),
    (['--model', 'smlpnet_t', '--compile-mode', 'fastest'], "invalid choice: 'fastest'"),
    (['--model', 'smlpnet_t', '--min-sample-time', 'nan'], '--min-sample-time must be a positive number'),
    (['--model', 'smlpnet_t', '--samples', '0'], '--samples must be >= 1'),
])
def test_bad_layer_arguments_are_clear_errors(args, message, capsys):
    # in this process (a subprocess per case spent 6 s importing torch): exit 2, one line, no traceback or usage
    assert message in exits_with_one_line(benchmark.main, args, capsys)


def test_reference_model_input_size_comes_from_its_twin(monkeypatch):
    """A ``ref:`` contender has no pretrained cfg of its own; its input is still an image (regression: the
    memory probe once fed it a (seq-len, dim) sequence and failed)."""
    import argparse
    monkeypatch.setattr(benchmark, 'REFERENCE_DIR', REPO / 'tests' / 'reference')  # as the checkout's benchmark.py
    args = argparse.Namespace(img_size=None, seq_len=128, dim=64, num_classes=10)
    ours = benchmark.build('smlpnet_t', args)
    ref = benchmark.build('ref:smlpnet_t', args, twin_of=ours)
    assert not hasattr(ref, 'pretrained_cfg')
    assert benchmark.input_size('ref:smlpnet_t', ref, args) == (3, 224, 224)
    assert benchmark.input_size('smlpnet_t', ours, args) == (3, 224, 224)
    assert benchmark.input_size('ref:bigs_layer', ref, args) == (128, 64)
    args.img_size = 96
    assert benchmark.input_size('ref:smlpnet_t', ref, args) == (3, 96, 96)


def test_reference_contenders_need_the_reference_folder(tmp_path, monkeypatch, capsys):
    """Without ``tests/reference`` (an installed package run outside a checkout), a ``ref:`` contender stops with
    one clear line naming the missing file; the package's own contenders do not need the folder."""
    missing = tmp_path / 'tests' / 'reference'
    monkeypatch.setattr(benchmark, 'REFERENCE_DIR', missing)
    with pytest.raises(SystemExit) as e:
        benchmark.main(['--compare', 'bigs_layer', 'ref:bigs_layer'])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no usage text
    assert 'ref: contenders need the straightforward reference models' in err[0] and str(missing / 'bigs.py') in err[0]
    monkeypatch.setattr(benchmark, 'REFERENCE_DIR', None)  # the installed command: no reads of the tests at all
    with pytest.raises(SystemExit):
        benchmark.main(['--compare', 'bigs_layer', 'ref:bigs_layer'])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run the checkout's benchmark.py" in err[0], err
    assert benchmark.parse_args(['--model', 'bigs_layer']).model == ['bigs_layer']


def test_bigs_layer_conv_impl_option(tmp_path, monkeypatch):
    """--bigs-conv-impl picks the BiGS layer's SSM route (the GPU script's Triton pairs use it); the straightforward
    layer built from it computes the same function (the Triton kernel runs in its interpreter on the CPU)."""
    pytest.importorskip('triton')
    rows, _ = _run_bench(tmp_path, monkeypatch, '--compare', 'bigs_layer', 'ref:bigs_layer', '--bigs-conv-impl',
                         'triton',
                         '--bench', 'inference', '--dim', '16', '--hidden-dim', '24', '--num-states', '4',
                         '--seq-len', '24', '-b', '1', '--no-flops')
    assert float(rows[0]['max_abs_diff']) <= 1e-4 * max(1., float(rows[0]['max_abs_out']))


def test_fused_contender_is_the_reparameterized_model(tmp_path, monkeypatch, capsys):
    """``fused:NAME``: the same weights after timm's reparameterize_model, the same eval function (max diff ~ float
    rounding), built from the other contender's weights; training steps are refused (the fusions are for
    inference)."""
    rows, md = _run_bench(tmp_path, monkeypatch, '--compare', 'fused:smlpnet_t', 'smlpnet_t', '-b', '2',
                          '--img-size', '64', '--no-flops')
    (r,) = rows
    assert (r['model'], r['baseline'], r['mode']) == ('fused:smlpnet_t', 'smlpnet_t', 'inference')
    assert float(r['max_abs_diff']) <= 1e-5 * max(1., float(r['max_abs_out']))
    assert 'fused:smlpnet_t' in md
    message = exits_with_one_line(benchmark.main, ['--compare', 'fused:smlpnet_t', 'smlpnet_t', '--bench', 'both'],
                                  capsys, status=2)
    assert 'fused: contenders are reparameterized for inference' in message


def _pair_row(speedup, q1, q3, rate_a, rate_b):
    return dict(model='A', baseline='B', speedup=speedup, speedup_q1=q1, speedup_q3=q3, pairs=8,
                img_per_s=rate_a, base_img_per_s=rate_b)


def test_paired_result_names_the_faster_contender():
    """'x1.117' beside '0.3 vs 0.4 img/s' read as a contradiction (issue 36): the sentence names the faster one,
    its throughputs follow the sentence's order with 3 significant digits, and a disagreement is said."""
    from mlp_vision.benchmark import speed_sentence
    assert speed_sentence(_pair_row(1.117, 1.09, 1.14, 0.412, 0.369)) == (
        'A is 1.117x faster than B (median of 8 paired ratios, q1-q3 1.090-1.140); 0.412 vs 0.369 img/s '
        '(median of each)')
    slower = speed_sentence(_pair_row(0.8, 0.75, 0.9, 10.0, 12.5))
    assert slower.startswith('B is 1.250x faster than A') and 'q1-q3 1.111-1.333' in slower
    assert '12.5 vs 10 img/s' in slower and 'disagree' not in slower
    noisy = speed_sentence(_pair_row(1.117, 1.0, 1.2, 0.349, 0.351))
    assert noisy.startswith('A is 1.117x faster than B') and '0.349 vs 0.351' in noisy
    assert 'the medians of each disagree with the paired ratio' in noisy


def test_error_notes_end_at_a_whole_word():
    """A note quoted '(RuntimeError: Error(s) in loading state_dict for SparseMLPNet:)': the first line of a
    multi-line message, which says nothing. Now the message's lines, bounded at a whole word, saying what is left."""
    from mlp_vision.benchmark import NOTE_CHARS, error_summary
    keys = ', '.join(f'"stages.{i}.blocks.0.token_mixer.conv_dw.weight"' for i in range(40))
    e = RuntimeError(f'Error(s) in loading state_dict for SparseMLPNet:\n\tMissing key(s) in state_dict: {keys}.')
    note = error_summary(e)
    assert note.startswith('RuntimeError: Error(s) in loading state_dict for SparseMLPNet: Missing key(s) in '
                           'state_dict: "stages.0.')
    cut, rest = note.split(' ... (')
    assert len(cut) <= NOTE_CHARS and f'RuntimeError: {" ".join(str(e).split())}'.startswith(cut + ' ')
    assert rest.endswith(' more characters)') and '\n' not in note
    assert error_summary(ValueError('short')) == 'ValueError: short'


def test_memory_probe_child_builds_the_same_contender(monkeypatch):
    """The memory probe's child process is given every flag that shapes the contender and its step (regression: it
    ran bigs_layer with the default --bigs-conv-impl whatever the parent's)."""
    flags = ['--model', 'bigs_layer', '--bigs-conv-impl', 'fft', '--dim', '24', '--hidden-dim', '40',
             '--num-states', '4', '--seq-len', '16', '-b', '3', '--precision', 'bf16', '--seed', '7']
    parent = benchmark.parse_args(flags)
    commands = []
    monkeypatch.setattr(benchmark.subprocess, 'run', lambda cmd, **kw: commands.append(cmd) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        benchmark.peak_memory('bigs_layer', 'train', parent)
    child = json.loads(commands[0][4])  # the settings, after python -c CODE PACKAGE_ROOT
    assert (child['spec'], child['mode']) == ('bigs_layer', 'train')
    for key in ('bigs_conv_impl', 'dim', 'hidden_dim', 'num_states', 'seq_len', 'batch_size', 'precision', 'seed',
                'heads', 'ffn_dim', 'device', 'channels_last'):
        assert child[key] == getattr(parent, key), key


def test_memory_probe_of_a_reference_contender(monkeypatch):
    """The memory probe's child has the checkout's reference folder too (regression: it ran without it, so a
    ``ref:`` contender's probe failed and its memory columns were missing)."""
    monkeypatch.setattr(benchmark, 'REFERENCE_DIR', REPO / 'tests' / 'reference')  # as the checkout's benchmark.py
    args = benchmark.parse_args(['--model', 'ref:bigs_layer', '--dim', '8', '--hidden-dim', '16', '--num-states',
                                 '2', '--seq-len', '8', '-b', '1', '--threads', '1'])
    memory = benchmark.peak_memory('ref:bigs_layer', 'train', args)
    assert set(memory) == {'peak_mem_mb', 'step_mem_mb'} and memory['peak_mem_mb'] > 0


def test_profile_file_holds_only_its_own_run(tmp_path):
    """Two runs in one process: the second's _profile.txt has its own table only (regression: the tables of every
    earlier run in the process were written again)."""
    for run in ('first', 'second'):
        benchmark.main(['--model', 'mixer_s16', '--img-size', '32', '-b', '1', '--samples', '1', '--warmup', '0',
                        '--min-sample-time', '0.01', '--threads', '1', '--no-memory', '--no-ceiling', '--no-flops',
                        '--profile', '--out', str(tmp_path / run)])
    assert (tmp_path / 'second_profile.txt').read_text().count('\n## ') == 1


def test_a_local_dir_contender_takes_the_weights_of_its_twin(tmp_path):
    """``--compare local-dir:FOLDER NAME``: A, built from a saved folder, gets B's weights through its model
    file's checkpoint filter and computes the same function (it raised a KeyError looking A up by name)."""
    import timm
    import torch
    from timm.models import save_for_hf
    from mlp_vision.benchmark import share_weights
    save_for_hf(timm.create_model('mixer_s16', img_size=32, num_classes=5), str(tmp_path))
    a = timm.create_model(f'local-dir:{tmp_path}', pretrained=True).eval()
    b = timm.create_model('mixer_s16', img_size=32, num_classes=5).eval()
    how, same = share_weights(a, f'local-dir:{tmp_path}', b, 'mixer_s16')
    assert same and how == f'mixer_s16 -> local-dir:{tmp_path}'
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(a(x), b(x))
