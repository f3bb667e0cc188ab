""" The training core shared by train.py, validate.py and the text trainer (mlp_vision/run_files.py,
outputs.py, training/run/checkpoint.py, arguments.py, errors.py): no code runs from a checkpoint file, every bad
input is one line with exit status 2, a full disk is one line, nothing written is lost (finished runs, earlier
results, killed runs' temp files), a resumed run remembers its settings and a longer schedule is well defined.

Everything runs on data the tests make themselves: a tiny ImageFolder of generated PNGs and a generated text.
"""
import builtins
import json
import os
import pickle
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import mlp_vision.train as train  # noqa: E402  (the commands' code; train.py / validate.py at the root run it)
import mlp_vision.validate as validate  # noqa: E402
import mlp_vision.train_text as text_train  # noqa: E402
import mlp_vision.outputs as outputs_module  # noqa: E402
from mlp_vision.outputs import atomic_save, clean_stale_temp_files, keep_previous, temp_path  # noqa: E402
from mlp_vision.weights import load_checkpoint_file  # noqa: E402
from mlp_vision.errors import UsageError  # noqa: E402
from mlp_vision.image_model import create_model, load_pretrained_weights  # noqa: E402
from _helpers import TINY_GPT, TINY_VISION, exits_with_one_line  # noqa: E402

_fail = exits_with_one_line


# ------------------------------------------------------------------------------------------------ malicious files
class _Payload:
    """Unpickling it creates ``marker`` (the stand-in for any code a file could run)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return builtins.open, (self.marker, 'w')


@pytest.fixture
def payloads(tmp_path):
    """name -> (file, words the refusal must contain); every file would create tmp_path/RAN if unpickled."""
    marker = tmp_path / 'RAN'
    files = tmp_path / 'files'
    files.mkdir()
    bare = files / 'bare.pth'
    with open(bare, 'wb') as f:
        pickle.dump({'state_dict': _Payload(marker)}, f)
    nested = files / 'nested.pth'
    torch.save({'version': 1, 'kind': 'image', 'arch': 'smlpnet_t', 'epoch': 0, 'state_dict': {},
                'optimizer': {}, 'args': {'lr': _Payload(marker)}}, nested)
    legacy = files / 'legacy.pth'
    torch.save({'state_dict': {'w': torch.zeros(1)}, 'extra': _Payload(marker)}, legacy,
               _use_new_zipfile_serialization=False)
    noise = files / 'noise.pth'
    noise.write_bytes(random.Random(0).randbytes(4096))
    empty = files / 'empty.pth'
    empty.write_bytes(b'')
    return marker, {
        'bare pickle': (bare, 'bare Python pickle'),
        'nested in a checkpoint': (nested, '--trust-checkpoint'),
        'legacy format': (legacy, '--trust-checkpoint'),
        'random bytes': (noise, 'not a PyTorch checkpoint'),
        'empty file': (empty, 'is empty'),
    }


def test_payloads_are_real(payloads):
    # the refusals below mean something: unpickled in full (the explicit opt-in), the payload does run
    marker, files = payloads
    load_checkpoint_file(files['nested in a checkpoint'][0], trust=True)
    assert marker.exists()


def test_no_entry_point_runs_code_from_a_file(payloads, images, text_file, tmp_path, capsys):
    marker, files = payloads
    out = ['--output', str(tmp_path / 'out')]
    vision = TINY_VISION + ['--data-dir', str(images), '--val-split', 'val', '--epochs', '1'] + out
    entry_points = {
        'train.py --resume': lambda p: (train.main, vision + ['--resume', str(p)]),
        'train.py --initial-checkpoint': lambda p: (train.main, vision + ['--initial-checkpoint', str(p)]),
        'train.py --pretrained-path': lambda p: (train.main, vision + ['--pretrained-path', str(p)]),
        'validate.py --checkpoint': lambda p: (validate.main, ['--checkpoint', str(p), '--model', 'smlpnet_t',
                                                                '--data-dir', str(images), '--split', 'val']),
    }
    for entry, make in entry_points.items():
        for kind, (path, words) in files.items():
            main, argv = make(path)
            msg = _fail(main, argv, capsys)
            assert not marker.exists(), f'{entry} ran the payload of a {kind} file'
            assert str(path) in msg and words in msg, (entry, kind, msg)
            assert 'weights_only=False' not in msg, msg


def test_trusted_old_checkpoint_still_loads(tmp_path):
    # --trust-checkpoint is the way to a full unpickle of a file that holds objects (here a plain Python class)
    path = tmp_path / 'objects.pth'
    torch.save({'state_dict': {'w': torch.ones(2)}, 'meta': nn.Identity()}, path)
    with pytest.raises(UsageError, match='names torch.nn.modules.linear.Identity'):
        load_checkpoint_file(path)
    assert isinstance(load_checkpoint_file(path, trust=True)['meta'], nn.Identity)


# ------------------------------------------------------------------------------------------------ bad input
def test_pretrained_weights_without_a_network_are_one_line(monkeypatch):
    # the hub's error when the weights are not cached and cannot be fetched (FileNotFoundError subclass)
    def offline(*args, **kwargs):
        raise FileNotFoundError('An error happened while trying to locate the file on the Hub')
    monkeypatch.setattr('mlp_vision.image_model.timm.create_model', offline)
    with pytest.raises(UsageError, match=r'not in the local cache and could not be downloaded .* train.py '
                                         r'--pretrained-path FILE, validate.py --checkpoint FILE, visualize FILE '
                                         r'--model gmlp_s \(in Python: pretrained_cfg_overlay=dict\(file=FILE\)\)'):
        create_model('gmlp_s', pretrained=True)
    with pytest.raises(FileNotFoundError):  # without --pretrained it is not about weights: raised as it is
        create_model('gmlp_s', pretrained=False)


def test_train_bad_inputs_one_line_exit_2(images, tmp_path, capsys):
    base = TINY_VISION + ['--data-dir', str(images), '--val-split', 'val', '--output', str(tmp_path / 'out')]
    empty = tmp_path / 'empty.pth'
    empty.write_bytes(b'')
    float_batch = tmp_path / 'batch.yaml'
    float_batch.write_text('batch_size: 32.5\n')
    a_file = tmp_path / 'a_file'
    a_file.write_text('not a folder')
    pickled_map = tmp_path / 'map.pkl'
    pickled_map.write_bytes(pickle.dumps({'class0': 0, 'class1': 1}))
    cases = {
        ('--epochs', '0'): '--epochs must be >= 1, got 0',
        ('--smoothing', '1.5'): '--smoothing must be in [0, 1), got 1.5',
        ('--opt', 'nosuchopt'): "--opt 'nosuchopt' is not an optimizer timm knows",
        ('--sched', 'nosuchsched'): "invalid choice: 'nosuchsched'",
        ('--lr', '-0.1'): '--lr must be a positive number, got -0.1',
        ('--lr', 'nan'): '--lr must be a positive number, got nan',
        ('--pretrained-path', str(tmp_path / 'missing.pth')): 'missing.pth\' does not exist',
        ('--pretrained-path', str(empty)): 'is empty (0 bytes), not a PyTorch checkpoint',
        ('-c', str(float_batch)): 'batch_size must be an integer (as --batch-size), got 32.5',
        ('--output', str(a_file)): 'is not a folder; expected a folder',
        ('--drop-path', '1.0'): '--drop-path must be in [0, 1), got 1.0',
        # issue 29: every family of flag values, checked before anything is built
        ('--input-img-mode', 'XYZ'): "invalid choice: 'XYZ'",
        ('--input-img-mode', 'RGBA'): '--input-img-mode RGBA gives 4-channel images, the model takes 3',
        ('--in-chans', '0'): '--in-chans must be >= 1, got 0',
        ('--mean', '0.5', '0.5'): '--mean needs 1 or 3 values',
        ('--std', '0', '0', '0'): '--std must be a positive number, got 0.0',
        ('--crop-pct', '-1'): '--crop-pct must be in (0, 1]',
        ('--crop-pct', 'nan'): '--crop-pct must be in (0, 1]',
        ('--crop-pct', '100'): '--crop-pct must be in (0, 1]',
        ('--interpolation', 'banana'): "invalid choice: 'banana'",
        ('--train-interpolation', 'banana'): "invalid choice: 'banana'",
        ('--hflip', '2'): '--hflip must be in [0, 1], got 2',
        ('--color-jitter', '-1'): '--color-jitter must be >= 0',
        ('--aa', 'banana'): "--aa 'banana' is not an augmentation policy",
        ('--aug-repeats', '-1'): '--aug-repeats must be >= 0',
        ('--remode', 'banana'): "invalid choice: 'banana'",
        ('--mixup', '-1'): '--mixup must be >= 0',
        ('--cutmix', 'nan'): '--cutmix must be >= 0, got nan',
        ('--mixup-prob', '2'): '--mixup-prob must be in [0, 1]',
        ('--scale', '0.5'): '--scale takes two values',
        ('--scale', '1', '0.1'): '--scale takes low then high',
        ('--lr-noise', '0.5', '0.8', '0.9'): '--lr-noise takes two values (low high), got 3',  # timm used two of them
        ('--ratio', '-1', '1'): '--ratio must be a positive number',
        ('--opt', 'adamw', '--opt-betas', '2', '0.9'): '--opt-betas must be in [0, 1)',
        ('--opt-eps', '-1'): '--opt-eps must be a positive number',
        ('--momentum', '-1'): '--momentum must be in [0, 1]',
        ('--weight-decay', 'nan'): '--weight-decay must be >= 0, got nan',
        ('--clip-grad', 'nan'): '--clip-grad must be a positive number, got nan',
        ('--clip-grad', '0'): '--clip-grad must be a positive number, got 0.0',  # clipping to 0 would stop learning
        ('--clip-mode', 'banana'): "invalid choice: 'banana'",
        ('--layer-decay', '0'): '--layer-decay must be in (0, 1]',
        ('--opt-kwargs', 'foo=1'): "--opt sgd cannot be built with {'foo': 1}",
        ('--device', 'banana'): "--device 'banana' is not a device",
        ('--device', 'mps'): '--device mps: no mps device is available here',
        ('--seed', '-1'): '--seed must be in [0, 2147483647], got -1',
        ('--sched', 'step', '--decay-epochs', '0'): '--decay-epochs must be a positive number',
        ('--lr-cycle-mul', '-1'): '--lr-cycle-mul must be a positive number',
        ('--model-ema', '--model-ema-decay', '2'): '--model-ema-decay must be in [0, 1), got 2',
        ('--class-map', str(tmp_path / 'none.txt')): 'is not a file',
        ('--class-map', str(pickled_map)): 'is a pickle: loading one can run code',
        ('--torchcompile', 'banana'): "--torchcompile 'banana' is not a torch.compile backend",
        ('--gp', 'banana'): "global_pool must be one of '', 'avg', 'max'",
        ('--dataset', 'banana/x'): "--dataset 'banana/x' is not a dataset timm reads",
        ('--experiment', '../up'): 'is not a folder name',
    }
    for flags, expected in cases.items():
        msg = _fail(train.main, base + ['--epochs', '1'] + list(flags), capsys)
        assert msg.startswith('train.py: error: ') and expected in msg, (flags, msg)
    # --debug: the traceback instead (the exception itself)
    with pytest.raises(UsageError, match='--epochs must be >= 1'):
        train.main(base + ['--epochs', '0', '--debug'])


def test_text_trainer_bad_inputs_one_line_exit_2(text_file, tmp_path, capsys):
    base = TINY_GPT + ['--train-file', text_file, '--steps', '2', '--output', str(tmp_path)]
    cases = {
        ('--lr', '-1'): '--lr must be a positive number',
        ('--steps', '0'): '--steps must be >= 1',
        ('--resume', str(tmp_path / 'none')): f"--resume {tmp_path / 'none'} is not a folder",
    }
    for flags, expected in cases.items():
        assert expected in _fail(text_train.main, base + list(flags), capsys), flags


def test_full_disk_is_one_line_and_keeps_the_last_checkpoint(images, tmp_path, capsys, monkeypatch):
    argv = TINY_VISION + ['--data-dir', str(images), '--val-split', 'val', '--output', str(tmp_path),
                          '--experiment', 'disk']
    train.main(argv + ['--epochs', '1'])
    exp = tmp_path / 'disk'
    before = (exp / 'last.pth').read_bytes()
    # the next write of last.pth goes to /dev/full (ENOSPC), as on a full disk (a link planted in the run folder
    # would be refused, so the file the atomic write opens is swapped in the process instead)
    open_own_file = outputs_module.open_own_file

    def full_disk(path, flags):
        if Path(path) == temp_path(exp / 'last.pth'):
            return os.open('/dev/full', os.O_WRONLY)
        return open_own_file(path, flags)
    monkeypatch.setattr(outputs_module, 'open_own_file', full_disk)
    msg = _fail(train.main, ['--resume', str(exp / 'last.pth'), '--epochs', '2'], capsys, status=1)
    assert msg == f'train.py: error: No space left on device: {exp / "last.pth"}'
    assert (exp / 'last.pth').read_bytes() == before
    assert torch.load(exp / 'last.pth', weights_only=True)['epoch'] == 0


# ------------------------------------------------------------------------------------------------ pretrained files
def test_pretrained_path_missing_backbone_weights(images, tmp_path, capsys, caplog):
    model = create_model('smlpnet_t', num_classes=2, img_size=32, embed_dim=8, depths=(1, 1, 1, 1))
    state = model.state_dict()
    dropped = next(k for k in state if k.startswith('stages.'))
    partial_file = tmp_path / 'partial.pth'
    torch.save({k: v for k, v in state.items() if k != dropped}, partial_file)
    argv = TINY_VISION + ['--data-dir', str(images), '--val-split', 'val', '--epochs', '1', '--output',
                          str(tmp_path), '--pretrained-path', str(partial_file)]
    msg = _fail(train.main, argv, capsys)
    assert 'does not cover smlpnet_t' in msg and dropped in msg and '--allow-missing-weights' in msg
    res = train.main(argv + ['--allow-missing-weights', '--experiment', 'allowed'])
    assert res['final_epoch'] == 0
    assert any(r.levelname == 'WARNING' and dropped in r.getMessage() for r in caplog.records)


def test_new_class_count_reinitialises_the_head_with_a_warning(caplog):
    source = create_model('smlpnet_t', num_classes=3, img_size=32, embed_dim=8, depths=(1, 1, 1, 1))
    target = create_model('smlpnet_t', num_classes=2, img_size=32, embed_dim=8, depths=(1, 1, 1, 1))
    load_pretrained_weights(target, 'smlpnet_t', source.state_dict(), 'file.pth')
    warning = [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
    assert len(warning) == 1 and 'head.fc.weight, head.fc.bias start at random init' in warning[0] and 'for 2 classes' in warning[0]
    for k, v in target.state_dict().items():
        if not k.startswith('head.'):
            assert torch.equal(v, source.state_dict()[k]), k
    # evaluation needs the file's classifier to fit
    with pytest.raises(UsageError, match='other shapes'):
        load_pretrained_weights(target, 'smlpnet_t', source.state_dict(), 'file.pth', head_must_fit=True)


# ------------------------------------------------------------------------------------------------ nothing lost
def test_resume_remembers_settings_and_extends_the_schedule(images, tmp_path, caplog):
    first = train.main(TINY_VISION + ['--data-dir', str(images), '--val-split', 'val', '--epochs', '1', '--opt',
                                      'adamw', '--lr', '1e-3', '--output', str(tmp_path), '--experiment', 'r'])
    exp = Path(first['experiment_dir'])
    old_results = (exp / 'results.json').read_bytes()
    # --resume alone: the run's own settings (not train.py's defaults: sgd, batch 128, 300 epochs)
    caplog.clear()
    res = train.main(['--resume', str(exp / 'last.pth'), '--epochs', '2'])
    assert res['global_batch'] == 4 and res['lr'] == 1e-3 and res['epochs'] == 2
    log = '\n'.join(r.getMessage() for r in caplog.records)
    assert 'changed: --epochs 2 (was 1)' in log
    assert 'the learning-rate schedule differs from the checkpoint\'s (num_epochs 2 (was 1))' in log
    # epoch 1 follows the cosine over 2 epochs (lr / 2), not LR 0 after the old 1-epoch schedule
    lrs = [float(r.split(',')[1]) for r in (exp / 'summary.csv').read_text().splitlines()[1:]]
    assert lrs == pytest.approx([1e-3, 5e-4], rel=1e-5)
    # the first finish's results are kept
    assert (exp / 'results-1.json').read_bytes() == old_results
    assert json.loads((exp / 'results.json').read_text())['final_epoch'] == 1


def test_atomic_helpers(tmp_path):
    path = tmp_path / 'results.json'
    assert keep_previous(path) is None
    path.write_text('1')
    assert keep_previous(path).name == 'results-1.json' and not path.exists()
    path.write_text('2')
    assert keep_previous(path).name == 'results-2.json'
    assert (tmp_path / 'results-1.json').read_text() == '1' and (tmp_path / 'results-2.json').read_text() == '2'
    atomic_save({'a': 1}, tmp_path / 'x.pth')
    assert clean_stale_temp_files(tmp_path) == [] and torch.load(tmp_path / 'x.pth', weights_only=True) == {'a': 1}


def test_link_fallback_copy_never_writes_through_a_planted_link(tmp_path, monkeypatch):
    """Where hard links fail, atomic_link copies: into a file of its own, not through a (dangling) link planted
    at its temporary name."""
    src, dst, outside = tmp_path / 'last.pth', tmp_path / 'model_best.pth', tmp_path / 'elsewhere' / 'victim'
    atomic_save({'a': 1}, src)
    outside.parent.mkdir()
    temp_path(dst).symlink_to(outside)

    def no_links(*args):
        raise OSError(1, 'Operation not permitted')
    monkeypatch.setattr(outputs_module.os, 'link', no_links)
    outputs_module.atomic_link(src, dst)
    assert not outside.exists() and not os.path.lexists(temp_path(dst))
    assert dst.read_bytes() == src.read_bytes() and not dst.is_symlink()


def test_a_run_needs_no_matplotlib(images, tmp_path, monkeypatch):
    """matplotlib is the viz extra's (visualize draws with it): a training run to its end neither imports it nor
    needs it."""
    monkeypatch.setitem(sys.modules, 'matplotlib', None)  # any import of it now raises ImportError
    res = train.main(TINY_VISION + ['--data-dir', str(images), '--val-split', 'val', '--epochs', '1', '--output',
                                    str(tmp_path), '--experiment', 'plain'])
    assert json.loads((tmp_path / 'plain' / 'results.json').read_text())['final_epoch'] == 0
    assert res['experiment_dir'] == str((tmp_path / 'plain').resolve())


# ------------------------------------------------------------------------------------------------ signals
def _env():
    env = dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1')
    env['PYTHONPATH'] = os.pathsep.join([str(REPO)] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
    return env


def _signal_when(cmd, line_start, signum, cwd):
    """Run ``cmd``, send ``signum`` when a stdout line starts with ``line_start``; returns (status, stdout, stderr)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=cwd)
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith(line_start):
                proc.send_signal(signum)
                break
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, ''.join(seen) + out, err


def test_sigterm_stops_image_training_at_its_last_epoch_checkpoint(images, tmp_path):
    argv = TINY_VISION + ['--data-dir', str(images), '--val-split', 'val', '--epochs', '2', '--log-interval', '1',
                          '--output', str(tmp_path), '--experiment', 'term']
    status, out, err = _signal_when([sys.executable, str(REPO / 'train.py')] + argv, 'Train: 1/1 [1/', signal.SIGTERM,
                                    tmp_path)
    exp = tmp_path / 'term'
    assert status == 128 + signal.SIGTERM, out[-2000:] + err
    assert err.strip().splitlines() == [
        f'train.py: error: interrupted by SIGTERM at epoch 1, batch {err.split("batch ")[1].split(";")[0]}; the '
        f'resumable checkpoint is {exp / "last.pth"} (epoch 0): continue with --resume {exp / "last.pth"}'], err
    assert torch.load(exp / 'last.pth', weights_only=True)['epoch'] == 0
    assert 'interrupted by SIGTERM' in (exp / 'train.log').read_text()
    assert train.main(['--resume', str(exp / 'last.pth')])['final_epoch'] == 1


def test_sigint_saves_the_last_step_and_resume_equals_an_uninterrupted_run(text_file, tmp_path):
    argv = TINY_GPT + ['--train-file', text_file, '--steps', '12', '--eval-interval', '5', '--log-interval', '1',
                       '--lr', '3e-3', '--seed', '5', '--output', str(tmp_path)]
    text_train.main(argv + ['--experiment', 'ref'])
    status, out, err = _signal_when([sys.executable, '-m', 'mlp_vision.train_text'] + argv + ['--experiment', 'int'],
                                    "{'loss'", signal.SIGINT, tmp_path)
    exp = tmp_path / 'int'
    assert status == 128 + signal.SIGINT, out[-2000:] + err
    ckpt = max(exp.glob('checkpoint-*'), key=lambda p: int(p.name.split('-')[1]))  # saved where the signal came
    stopped = int(ckpt.name.split('-')[1])
    assert 1 <= stopped < 12 and 'Traceback' not in err
    assert err.strip().splitlines()[-1] == (f'python -m mlp_vision.train_text: error: interrupted by SIGINT: checkpoint '
                                            f'{ckpt} saved; continue with --resume {ckpt}')
    text_train.main(argv + ['--resume', str(ckpt)])
    ref, resumed = (load_file(str(p / 'model.safetensors')) for p in (tmp_path / 'ref', exp))
    for k, v in ref.items():
        assert torch.equal(v, resumed[k]), k
