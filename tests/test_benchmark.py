""" benchmark.py end to end at a tiny size (a 1-block-per-stage sMLPNet at 32 px, 1 warm-up step, 2 samples of 2
steps): a paired comparison writes its CSV / JSON / markdown, the two contenders compute the same outputs, the MAC
count is the project's, a local-dir: folder passes the one door's checks (no timing is asserted). """
import argparse
import contextlib
import csv
import io
import json
import runpy
import shutil
import sys
from concurrent.futures import Future
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import load_file, save_file
from timm.models import save_for_hf

from _helpers import exits_with_one_line
from mlp_vision import benchmark

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / 'tests' / 'reference'
TINY_KWARGS = dict(embed_dim=8, depths=(1, 1, 1, 1))
TINY = ['--model-kwargs', 'embed_dim=8', 'depths=(1,1,1,1)', '--img-size', '32', '-b', '2']
FAST = ['--warmup', '1', '--iters', '2', '--samples', '2', '--threads', '1', '--no-memory', '--no-ceiling']


def _run(out: Path, *argv: str):
    """benchmark.py's run in this process with the checkout's reference models, as its script gives them; the rows
    of PREFIX.csv and the markdown."""
    benchmark.main([*argv, *FAST, '--out', str(out)], reference_dir=REFERENCE)
    return list(csv.DictReader(open(f'{out}.csv'))), Path(f'{out}.md').read_text()


@pytest.fixture(scope='module')
def paired(tmp_path_factory):
    """One run of the checkout's benchmark.py script (which hands the command its ref: models): a tiny sMLPNet
    against its straightforward twin, inference and training; (rows, JSON, markdown, stdout)."""
    out = tmp_path_factory.mktemp('bench') / 'pair'
    argv = [str(REPO / 'benchmark.py'), '--compare', 'smlpnet_t', 'ref:smlpnet_t', '--bench', 'both', *TINY, *FAST,
            '--out', str(out)]
    stdout = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(stdout):
        mp.setattr(sys, 'argv', argv)
        runpy.run_path(argv[0], run_name='__main__')
    return (list(csv.DictReader(open(f'{out}.csv'))), json.load(open(f'{out}.json')), Path(f'{out}.md').read_text(),
            stdout.getvalue())


def test_paired_comparison_writes_results(paired):
    rows, results, md, stdout = paired
    assert [r['mode'] for r in rows] == ['inference', 'train']
    # every long step says so as it goes (issue 36: 7 silent minutes), beside the result rows
    for line in ('1 compute thread (--threads)', 'smlpnet_t vs ref:smlpnet_t, train: building both',
                 'smlpnet_t: counting MACs', 'A smlpnet_t, train: warm-up step 1/1', 'train: pair 2/2',
                 ' faster than '):
        assert line in stdout, line
    from mlp_vision.complexity import count_module
    model = timm.create_model('smlpnet_t', img_size=32, **TINY_KWARGS).eval()
    macs = count_module(model, (torch.randn(1, 3, 32, 32),))[0]
    for r in rows:
        assert r['model'] == 'smlpnet_t' and r['baseline'] == 'ref:smlpnet_t' and r['img_size'] == '32'
        assert int(r['pairs']) == 2 and int(r['iters']) == 2 and float(r['speedup']) > 0
        assert float(r['max_abs_diff']) <= 1e-4 * max(1., float(r['max_abs_out']))  # same function
        assert float(r['gmacs_per_img']) * 1e9 == pytest.approx(macs, rel=1e-6)  # per image, the project's count
    env = results['environment']
    assert env['threads'] == 1 and env['torch'] == torch.__version__ and 'date_utc' in env and env['device'] == 'cpu'
    assert env['command'].startswith('python benchmark.py --compare smlpnet_t ref:smlpnet_t')
    assert '`smlpnet_t`' in md and env['command'] in md and f"torch {torch.__version__}" in md


def test_two_architectures_compare_speed_only(tmp_path, capsys):
    """A peer of another architecture (ConvNeXt against Mixer): both keep their own weights, the speed is
    compared, no output difference is claimed; a peer that takes no img_size runs at the same input size."""
    (row,), _ = _run(tmp_path / 'bench', '--compare', 'mixer_s16', 'convnext_atto', '-b', '1', '--img-size', '32',
                     '--no-flops')
    assert row['model'] == 'mixer_s16' and row['baseline'] == 'convnext_atto' and float(row['speedup']) > 0
    assert row['weights'].startswith('none (different architectures') and row['max_abs_diff'] == ''
    # one short note says so, not the load error of one family's weights in the other
    (note,) = [line for line in capsys.readouterr().err.splitlines() if 'weights' in line]
    assert note == ('note: mixer_s16 and convnext_atto are different architectures: weights not shared, speed '
                    'only (no output comparison)')
    assert row['img_size'] == '32'
    # the same --out again: refused before any timing, the first results stay
    before = (tmp_path / 'bench.csv').read_bytes()
    assert 'bench.csv exists' in exits_with_one_line(benchmark.main, ['--model', 'mixer_s16', '--out',
                                                                     str(tmp_path / 'bench')], capsys, status=2)
    assert (tmp_path / 'bench.csv').read_bytes() == before


def test_bad_model_name_is_a_clear_error_before_any_model_is_built(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(benchmark, 'build', lambda *a, **k: pytest.fail('a model was built'))
    line = exits_with_one_line(benchmark.main, ['--compare', 'smlpnet_t', 'no_such_model', '--out',
                                                str(tmp_path / 'x')], capsys)
    assert "unknown model(s) ['no_such_model']" in line and not list(tmp_path.iterdir())


def test_sequence_layers_report_tokens_per_second(tmp_path):
    d, d_i, length, batch, heads, ffn = 32, 48, 64, 2, 4, 96
    size = ['--dim', str(d), '--hidden-dim', str(d_i), '--num-states', '8', '--heads', str(heads),
            '--ffn-dim', str(ffn), '--seq-len', str(length), '-b', str(batch)]
    rows, md = _run(tmp_path / 'bench', '--compare', 'bigs_layer', 'ref:bigs_layer', '--compare', 'bigs_layer',
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
    (['--model', 'bigs_layer', '--model-kwargs', 'embed_dim=8'], '--model-kwargs applies to image models only'),
    (['--model', 'ref:bert_layer'], 'ref:bert_layer'),
    (['--model', 'bigs_layer', '--seq-len', '0'], '--seq-len'),
    (['--model', 'smlpnet_t', '--threads', '100000'], "--threads must be in [1, "),
    (['--model', 'smlpnet_t', '--device', 'banana'], "--device 'banana' is not a device"),
    (['--model', 'smlpnet_t', '--compile-mode', 'fastest'], "invalid choice: 'fastest'"),
    (['--model', 'smlpnet_t', '--min-sample-time', 'nan'], '--min-sample-time must be a positive number'),
    (['--model', 'smlpnet_t', '--samples', '0'], '--samples must be >= 1'),
    (['--model', 'smlpnet_t', '--model-kwargs', 'embed_dim'], "'embed_dim' is not NAME=VALUE"),
])
def test_bad_layer_arguments_are_clear_errors(args, message, capsys):
    # in this process (a subprocess per case spent 6 s importing torch): exit 2, one line, no traceback or usage
    assert message in exits_with_one_line(benchmark.main, args, capsys)


def test_reference_model_input_size_comes_from_its_twin():
    """A ``ref:`` contender has no pretrained cfg of its own; its input is still an image (regression: the
    memory probe once fed it a (seq-len, dim) sequence and failed)."""
    args = argparse.Namespace(img_size=None, seq_len=128, dim=64, num_classes=10, model_kwargs=TINY_KWARGS,
                              reference_dir=str(REFERENCE))
    ours = benchmark.build('smlpnet_t', args)
    ref = benchmark.build('ref:smlpnet_t', args, twin_of=ours)
    assert not hasattr(ref, 'pretrained_cfg')
    assert benchmark.input_size('ref:smlpnet_t', ref, args) == (3, 224, 224)
    assert benchmark.input_size('smlpnet_t', ours, args) == (3, 224, 224)
    assert benchmark.input_size('ref:bigs_layer', ref, args) == (128, 64)
    args.img_size = 96
    assert benchmark.input_size('ref:smlpnet_t', ref, args) == (3, 96, 96)


def test_reference_contenders_need_the_reference_folder(tmp_path, capsys):
    """Without ``tests/reference`` (an installed package run outside a checkout), a ``ref:`` contender stops with
    one clear line naming the missing file; the package's own contenders do not need the folder."""
    missing = tmp_path / 'tests' / 'reference'
    with pytest.raises(SystemExit) as e:
        benchmark.main(['--compare', 'bigs_layer', 'ref:bigs_layer'], reference_dir=missing)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no usage text
    assert 'ref: contenders need the straightforward reference models' in err[0] and str(missing / 'bigs.py') in err[0]
    # the installed command: no reads of the tests at all
    line = exits_with_one_line(benchmark.main, ['--compare', 'bigs_layer', 'ref:bigs_layer'], capsys)
    assert "run the checkout's benchmark.py" in line
    assert benchmark.parse_args(['--model', 'bigs_layer']).model == ['bigs_layer']


def test_bigs_layer_conv_impl_option(tmp_path):
    """--bigs-conv-impl picks the BiGS layer's SSM route (the GPU script's Triton pairs use it); the straightforward
    layer built from it computes the same function (the Triton kernel runs in its interpreter on the CPU)."""
    pytest.importorskip('triton')
    rows, _ = _run(tmp_path / 'bench', '--compare', 'bigs_layer', 'ref:bigs_layer', '--bigs-conv-impl', 'triton',
                   '--bench', 'inference', '--dim', '16', '--hidden-dim', '24', '--num-states', '4',
                   '--seq-len', '24', '-b', '1', '--no-flops')
    assert float(rows[0]['max_abs_diff']) <= 1e-4 * max(1., float(rows[0]['max_abs_out']))


def test_fused_contender_is_the_reparameterized_model(tmp_path, capsys):
    """``fused:NAME``: the same weights after timm's reparameterize_model, the same eval function (max diff ~ float
    rounding), built from the other contender's weights; training steps are refused (the fusions are for
    inference)."""
    (r,), md = _run(tmp_path / 'bench', '--compare', 'fused:smlpnet_t', 'smlpnet_t', *TINY, '--no-flops')
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


class _InProcess:
    """A stand-in for the memory probe's child process: runs what it is given here and records it."""
    calls = []

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def submit(self, fn, *args):
        self.calls.append(args)
        future = Future()
        future.set_result(fn(*args))
        return future


def test_memory_probe_child_builds_the_same_contender(monkeypatch, capsys):
    """The memory probe's child process is given the run's own settings and thread count (regressions: it ran
    bigs_layer with the default --bigs-conv-impl, and without the checkout's reference folder); what the child
    runs, run here, measures that contender; a child that fails is one note and no memory columns."""
    flags = ['--model', 'ref:bigs_layer', '--bigs-conv-impl', 'fft', '--dim', '24', '--hidden-dim', '40',
             '--num-states', '4', '--seq-len', '16', '-b', '3', '--precision', 'bf16', '--seed', '7', '--threads', '1']
    parent = benchmark.parse_args(flags, reference_dir=REFERENCE)
    monkeypatch.setattr(benchmark, 'ProcessPoolExecutor', _InProcess)
    monkeypatch.setattr(_InProcess, 'calls', [])
    memory = benchmark.peak_memory('ref:bigs_layer', 'train', parent)
    (call,) = _InProcess.calls  # the parent's own settings, the thread count it chose
    assert call == ('ref:bigs_layer', 'train', parent, torch.get_num_threads())
    assert set(memory) == {'peak_mem_mb', 'step_mem_mb'} and memory['peak_mem_mb'] > 0
    parent.dim = -3
    capsys.readouterr()
    assert benchmark.peak_memory('ref:bigs_layer', 'train', parent) == {}
    (note,) = capsys.readouterr().err.splitlines()
    assert note.startswith('note: memory probe failed for ref:bigs_layer (RuntimeError: '), note


@pytest.mark.slow
def test_memory_probe_of_a_reference_contender():
    """The probe's child process itself (a start of Python and torch: slow) measures a ``ref:`` contender."""
    args = benchmark.parse_args(['--model', 'ref:bigs_layer', '--dim', '8', '--hidden-dim', '16', '--num-states',
                                 '2', '--seq-len', '8', '-b', '1', '--threads', '1'], reference_dir=REFERENCE)
    memory = benchmark.peak_memory('ref:bigs_layer', 'train', args)
    assert set(memory) == {'peak_mem_mb', 'step_mem_mb'} and memory['peak_mem_mb'] > 0


def test_profile_file_holds_only_its_own_run(tmp_path):
    """Two runs in one process: the second's _profile.txt has its own table only (regression: the tables of every
    earlier run in the process were written again)."""
    for run in ('first', 'second'):
        _run(tmp_path / run, '--model', 'smlpnet_t', *TINY, '--no-flops', '--profile')
    assert (tmp_path / 'second_profile.txt').read_text().count('\n## ') == 1


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    """A run's pretrained/ folder (config.json + model.safetensors) of a tiny 2-class sMLPNet."""
    path = tmp_path_factory.mktemp('local') / 'smlpnet'
    save_for_hf(timm.create_model('smlpnet_t', img_size=32, num_classes=2, **TINY_KWARGS), str(path),
                safe_serialization=True)
    return path


def test_a_local_dir_contender_takes_the_weights_of_its_twin(folder):
    """``--compare local-dir:FOLDER NAME``: A, built from a saved folder (with its weights), gets B's weights through
    its model file's checkpoint filter and computes the same function (it raised a KeyError looking A up by name)."""
    a = benchmark.build(f'local-dir:{folder}', benchmark.parse_args(['--model', f'local-dir:{folder}'])).eval()
    saved = load_file(str(folder / 'model.safetensors'))
    assert set(saved) == set(a.state_dict()) and all(torch.equal(t, saved[k]) for k, t in a.state_dict().items())
    b = timm.create_model('smlpnet_t', img_size=32, num_classes=2, **TINY_KWARGS).eval()
    how, same = benchmark.share_weights(a, f'local-dir:{folder}', b, 'smlpnet_t')
    assert same and how == f'smlpnet_t -> local-dir:{folder}'
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(a(x), b(x))


def test_local_dir_weights_pass_the_one_door(folder, tmp_path, capsys):
    """A local-dir: folder's weights go through validate.py's checks (mlp_vision.weights): NaN weights or a
    truncated model.safetensors stop with one line naming the file; a good folder is timed with its own weights, and
    against a folder of another family the note is one short line."""
    nan = tmp_path / 'nan'
    shutil.copytree(folder, nan)
    sd = load_file(str(nan / 'model.safetensors'))
    sd['stem.weight'] = torch.full_like(sd['stem.weight'], float('nan'))
    save_file(sd, str(nan / 'model.safetensors'))
    line = exits_with_one_line(benchmark.main, ['--model', f'local-dir:{nan}', *FAST], capsys)
    assert line.startswith(f'benchmark.py: error: {nan}/model.safetensors: stem.weight holds'), line
    truncated = tmp_path / 'truncated'
    shutil.copytree(folder, truncated)
    (truncated / 'model.safetensors').write_bytes((folder / 'model.safetensors').read_bytes()[:1000])
    line = exits_with_one_line(benchmark.main, ['--model', f'local-dir:{truncated}', *FAST], capsys)
    assert f"'{truncated}/model.safetensors' is not a readable safetensors file" in line, line
    gmlp = tmp_path / 'gmlp'
    save_for_hf(timm.create_model('gmlp_ti', img_size=32, num_classes=2, embed_dim=8, num_blocks=1), str(gmlp),
                safe_serialization=True)
    rows, _ = _run(tmp_path / 'bench', '--compare', f'local-dir:{folder}', f'local-dir:{gmlp}', '-b', '1',
                   '--no-flops')
    assert rows[0]['img_size'] == '32' and rows[0]['weights'].startswith('none (different architectures')
    assert capsys.readouterr().err.strip().splitlines() == [
        f'note: local-dir:{folder} and local-dir:{gmlp} are different architectures: weights not shared, speed only '
        f'(no output comparison)']
