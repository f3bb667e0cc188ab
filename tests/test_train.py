""" train.py / validate.py: exact resume (in-process and after SIGKILL), 2-process gloo DDP, validation of the
produced checkpoints, NaN stop, outputs, and the clear errors for bad input.

Everything runs on a few hundred real images (scikit-learn's bundled handwritten digits, written as an
ImageFolder tree) with a tiny sMLPNet (BatchNorm included) at 32x32, on the CPU.
"""
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

pytest.importorskip('sklearn', reason='the test images come from scikit-learn (pip install scikit-learn)')

import mlp_vision.train as train  # noqa: E402  (the commands' code; train.py / validate.py at the root run it)
import mlp_vision.validate as validate  # noqa: E402
from mlp_vision.outputs import atomic_save  # noqa: E402
from mlp_vision.arguments import (  # noqa: E402
    args_to_yaml, find_recipe, parse_args_with_config, recipe_names)
from mlp_vision.errors import UsageError  # noqa: E402
from mlp_vision.image_data import prepare_digits_folder  # noqa: E402

MODEL_ARGS = ['--model', 'smlpnet_t', '--model-kwargs', 'embed_dim=8', 'depths=(1,1,1,1)', '--img-size', '32']
# every source of training randomness on, so exact resume covers them all
RECIPE_ARGS = [
    '--epochs', '2', '-b', '8', '--opt', 'adamw', '--lr', '2e-3', '--weight-decay', '0.05',
    '--sched', 'cosine', '--sched-on-updates', '--warmup-epochs', '1', '--warmup-lr', '1e-4',
    '--drop-path', '0.1', '--mixup', '0.8', '--cutmix', '1.0', '--reprob', '0.25', '--smoothing', '0.1',
    '--aa', 'rand-m9-mstd0.5-inc1', '--hflip', '0', '--scale', '0.6', '1.0', '--crop-pct', '1.0',
    '--model-ema', '--model-ema-decay', '0.9', '--grad-accum-steps', '2', '--clip-grad', '1.0',
    '--checkpoint-hist', '2', '--seed', '7', '--keep-optimizer-state',  # resumes from checkpoint-0.pth
    '--threads', '1',  # one count for every run compared here: the count changes float rounding
]


def _state(path):
    return torch.load(path, map_location='cpu', weights_only=True)


def _assert_same_weights(a, b):
    sa, sb = _state(a), _state(b)
    assert sa['epoch'] == sb['epoch']
    for key in ('state_dict', 'state_dict_ema'):
        assert sa[key].keys() == sb[key].keys()
        for k in sa[key]:
            assert torch.equal(sa[key][k], sb[key][k]), f'{key}.{k} differs'


@pytest.fixture(scope='module')
def digits(tmp_path_factory):
    """240 train / 60 val real digit images (24 / 6 per class), 32x32 PNGs."""
    return prepare_digits_folder(tmp_path_factory.mktemp('data') / 'digits', size=32, max_per_class=30)


@pytest.fixture(scope='module')
def reference_run(digits, tmp_path_factory):
    """Two uninterrupted epochs (in this process, no loader workers); returns the experiment folder."""
    out = tmp_path_factory.mktemp('ref')
    train.main(MODEL_ARGS + RECIPE_ARGS + [
        '--data-dir', str(digits), '--val-split', 'val', '--workers', '0', '--log-interval', '5',
        '--output', str(out), '--experiment', 'ref'])
    return out / 'ref'


def _env():
    env = dict(os.environ, PYTHONUNBUFFERED='1')
    env['PYTHONPATH'] = os.pathsep.join([str(REPO)] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
    return env


def test_outputs_of_a_run(reference_run):
    exp = reference_run
    for name in ('args.yaml', 'train.log', 'summary.csv', 'last.pth', 'model_best.pth', 'results.json',
                 'checkpoint-0.pth', 'checkpoint-1.pth'):
        assert (exp / name).is_file(), name
    rows = list(csv.DictReader(open(exp / 'summary.csv')))
    assert [r['epoch'] for r in rows] == ['0', '1']
    results = json.loads((exp / 'results.json').read_text())
    assert results['final_epoch'] == 1 and results['ranks_agree']
    assert 0 <= results['eval']['top1'] <= 100
    # args.yaml is the resolved configuration and loads back as a config
    args = yaml.safe_load((exp / 'args.yaml').read_text())
    assert args['model'] == 'smlpnet_t' and args['model_kwargs'] == {'embed_dim': 8, 'depths': [1, 1, 1, 1]}
    assert not list(exp.glob('.*tmp*')), 'temporary files left behind'


def test_a_run_writes_a_timm_folder_of_its_best_weights(reference_run):
    # issue 36 item 3: beside the checkpoints, a weights-only folder timm loads as it is (classifier and backbone)
    folder = reference_run / 'pretrained'
    assert sorted(p.name for p in folder.iterdir()) == ['config.json', 'model.safetensors']  # nothing to unpickle
    best = _state(reference_run / 'model_best.pth')
    model = timm.create_model(f'local-dir:{folder}', pretrained=True).eval()
    state = model.state_dict()
    assert state.keys() == best['state_dict_ema'].keys()  # the run used --model-ema: its EMA weights chose the best
    assert all(torch.equal(state[k], best['state_dict_ema'][k]) for k in state)
    config = json.loads((folder / 'config.json').read_text())
    assert config['label_names'] == [str(d) for d in range(10)]
    assert config['pretrained_cfg']['input_size'] == [3, 32, 32]
    assert json.loads((reference_run / 'results.json').read_text())['pretrained'] == str(folder.resolve())
    backbone = timm.create_model(f'local-dir:{folder}', pretrained=True, features_only=True).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        feats, expected = backbone(x), model.forward_intermediates(x, intermediates_only=True)
    assert len(feats) == len(expected) == 4
    assert all(torch.equal(a, b) for a, b in zip(feats, expected))


def test_the_exported_config_describes_the_run_not_the_upstream_weights(reference_run):
    folder = reference_run / 'pretrained'
    config = json.loads((folder / 'config.json').read_text())
    cfg = config['pretrained_cfg']
    for key in ('tag', 'license', 'origin_url', 'paper_name', 'paper_ids', 'hf_hub_id', 'url', 'notes'):
        assert key not in cfg, key
    assert cfg['description'] == 'smlpnet_t trained by mlp_vision from digits, 10 classes'
    assert config['architecture'] == 'smlpnet_t' and config['num_classes'] == 10
    assert config['label_names'] == [str(d) for d in range(10)]
    model = timm.create_model(f'local-dir:{folder}', pretrained=True).eval()
    assert model.pretrained_cfg['description'] == cfg['description'] and 'license' not in model.pretrained_cfg
    reference = timm.create_model('smlpnet_t', num_classes=10, embed_dim=8, depths=(1, 1, 1, 1), img_size=32).eval()
    reference.load_state_dict(_state(reference_run / 'model_best.pth')['state_dict_ema'])
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), reference(x))


def test_resume_is_bit_identical(reference_run, digits, tmp_path):
    # continue from the end of epoch 0 (another folder, loader workers this time): same weights as 2 epochs
    exp = tmp_path / 'resumed'
    exp.mkdir()
    shutil.copy(reference_run / 'checkpoint-0.pth', exp / 'checkpoint-0.pth')
    res = train.main(MODEL_ARGS + RECIPE_ARGS + [
        '--data-dir', str(digits), '--val-split', 'val', '--workers', '2', '--log-interval', '100',
        '--resume', str(exp / 'checkpoint-0.pth')])
    # a folder holding a copied checkpoint is not a run (no run.json): the run continues beside it
    assert Path(res['experiment_dir']) == (tmp_path / 'resumed-1').resolve()
    assert sorted(p.name for p in exp.iterdir()) == ['checkpoint-0.pth']
    _assert_same_weights(reference_run / 'last.pth', tmp_path / 'resumed-1' / 'last.pth')
    assert _state(reference_run / 'checkpoint-0.pth')['threads'] == 1


def test_a_resume_computes_with_the_threads_of_the_run_it_continues(reference_run, digits, tmp_path, caplog):
    # a run started without --threads (its count chosen by default_threads, stored in each checkpoint as 'threads')
    ckpt = _state(reference_run / 'checkpoint-0.pth')
    ckpt['args']['threads'] = None
    exp = tmp_path / 'r'
    exp.mkdir()
    torch.save(ckpt, exp / 'checkpoint-0.pth')
    argv = ['--data-dir', str(digits), '--val-split', 'val', '--workers', '0', '--resume', str(exp / 'checkpoint-0.pth')]
    res = train.main(argv)  # no --threads: the run's own count (1), whatever the machine's load suggests
    assert any(r.getMessage().startswith('1 compute thread (the count of the run it continues') for r in caplog.records)
    assert _state(Path(res['experiment_dir']) / 'last.pth')['threads'] == 1


def test_sigkill_mid_epoch_then_resume(reference_run, digits, tmp_path):
    args = MODEL_ARGS + RECIPE_ARGS + ['--data-dir', str(digits), '--val-split', 'val', '--workers', '1',
                                       '--log-interval', '1']
    proc = subprocess.Popen(
        [sys.executable, str(REPO / 'train.py')] + args + ['--output', str(tmp_path), '--experiment', 'k'],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), cwd=tmp_path)
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith('Train: 1/1 [ 2/'):  # epoch 1 under way (epoch 0 checkpointed)
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.stdout.close()
        proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL, ''.join(seen[-20:])
    exp = tmp_path / 'k'
    assert _state(exp / 'last.pth')['epoch'] == 0, 'the kill came too late: epoch 1 was already saved'

    train.main(args + ['--resume', str(exp / 'last.pth')])  # continues in the same folder
    _assert_same_weights(reference_run / 'last.pth', exp / 'last.pth')
    lines = (exp / 'summary.csv').read_text().splitlines()
    assert sum(line.startswith('epoch,') for line in lines) == 1
    assert [line.split(',')[0] for line in lines[1:]] == ['0', '1']


def test_validate_reproduces_training_eval(reference_run, digits, tmp_path):
    reported = json.loads((reference_run / 'results.json').read_text())
    out = tmp_path / 'val.json'
    res = validate.main(['--checkpoint', str(reference_run / 'last.pth'), '--data-dir', str(digits),
                         '--split', 'val', '--workers', '0', '-b', '8', '--results-file', str(out)])
    assert res['top1'] == pytest.approx(reported['eval']['top1'], abs=1e-4)
    assert res['top5'] == pytest.approx(reported['eval']['top5'], abs=1e-4)
    assert res['loss'] == pytest.approx(reported['eval']['loss'], abs=1e-5)
    assert res['samples'] == 60
    assert json.loads(out.read_text())['top1'] == res['top1']
    ema = validate.main(['--checkpoint', str(reference_run / 'last.pth'), '--use-ema', '--data-dir', str(digits),
                         '--split', 'val', '--workers', '0', '-b', '8', '--results-file', str(tmp_path / 'v.csv')])
    assert ema['top1'] == pytest.approx(reported['ema_eval']['top1'], abs=1e-4)
    assert (tmp_path / 'v.csv').read_text().startswith('model,')


def test_amp_channels_last_on_cpu(digits, tmp_path):
    """train.py --amp (bf16 autocast on the CPU) with channels_last trains sMLPNet (BatchNorm, the in-place axial
    mixes) to finite losses, and validate.py evaluates the checkpoint the same way. Regression: the axial mixes once
    failed under autocast (found on CUDA, where --amp is the common case)."""
    amp = ['--amp', '--channels-last']
    results = train.main(MODEL_ARGS + amp + [
        '--epochs', '1', '-b', '16', '--lr', '1e-3', '--warmup-epochs', '0', '--data-dir', str(digits),
        '--val-split', 'val', '--workers', '0', '--output', str(tmp_path), '--experiment', 'amp'])
    assert results['epochs'] == 1 and results['cuda_peak_mem_gib'] is None  # no CUDA: no GPU memory field
    rows = list(csv.DictReader(open(tmp_path / 'amp' / 'summary.csv')))
    assert all(torch.isfinite(torch.tensor(float(r[k]))) for r in rows for k in ('train_loss', 'eval_loss'))
    assert 'peak_mem_gib' not in rows[0]
    val = validate.main(['--checkpoint', str(tmp_path / 'amp' / 'last.pth'), '--data-dir', str(digits),
                         '--split', 'val', '--workers', '0', '-b', '16'] + amp)
    assert val['amp'] == 'torch.bfloat16' and val['channels_last'] and val['samples'] == 60
    # bf16 evaluation of the same weights: the loss agrees with train.py's (also bf16) to rounding
    assert val['loss'] == pytest.approx(results['eval']['loss'], rel=2e-2)


def test_validate_foreign_state_dict_through_filter(reference_run, digits, tmp_path):
    # a bare state dict (as timm / the official release ship them) goes through the model's filter fn
    sd_path = tmp_path / 'weights.pth'
    torch.save(_state(reference_run / 'last.pth')['state_dict'], sd_path)
    reported = json.loads((reference_run / 'results.json').read_text())
    res = validate.main(['--checkpoint', str(sd_path), '--model', 'smlpnet_t', '--model-kwargs', 'embed_dim=8',
                         'depths=(1,1,1,1)', '--img-size', '32', '--num-classes', '10', '--crop-pct', '1.0',
                         '--data-dir', str(digits), '--split', 'val', '--workers', '0', '-b', '8'])
    assert res['top1'] == pytest.approx(reported['eval']['top1'], abs=1e-4)


def test_ddp_two_processes_gloo(digits, tmp_path):
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
           str(REPO / 'train.py')] + MODEL_ARGS + [
        '--epochs', '2', '-b', '8', '--opt', 'adamw', '--lr', '1e-3', '--aug-repeats', '2', '--model-ema',
        '--drop-path', '0.1', '--data-dir', str(digits), '--val-split', 'val', '--workers', '0',
        '--output', str(tmp_path), '--experiment', 'ddp', '--log-interval', '100']
    # (contiguous: sMLPNet's depthwise and 1x1 fuse weights get gradients of other (size-1 dim) strides)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert 'Grad strides do not match' not in proc.stderr  # wrap_ddp gives DDP the parameters' strides
    assert 'backend gloo' in proc.stdout
    results = json.loads((tmp_path / 'ddp' / 'results.json').read_text())
    assert results['world_size'] == 2
    digests = results['weights_sha256_per_rank']
    assert len(digests) == 2 and digests[0] == digests[1] and results['ranks_agree']
    # the exact distributed eval counts every validation image once
    res = validate.main(['--checkpoint', str(tmp_path / 'ddp' / 'last.pth'), '--data-dir', str(digits),
                         '--split', 'val', '--workers', '0'])
    assert res['top1'] == pytest.approx(results['eval']['top1'], abs=1e-4)


IMAGENETTE = REPO.parent / 'shared' / 'data' / 'imagenette-mini'


@pytest.mark.skipif(not (IMAGENETTE / 'train.tar').is_file(),
                    reason=f'needs the shared imagenette-mini tars at {IMAGENETTE} (../shared beside the repo)')
def test_train_and_validate_from_image_tars(tmp_path):
    # timm reads the tars directly (labels from the class folder inside): 3,000 train / 1,000 val real photos
    results = train.main(MODEL_ARGS + [
        '--data-dir', str(IMAGENETTE), '--train-split', 'train.tar', '--val-split', 'val.tar',
        '--epochs', '1', '-b', '32', '--opt', 'adamw', '--lr', '1e-3', '--workers', '2', '--log-interval', '1000',
        '--output', str(tmp_path), '--experiment', 'tar'])
    assert results['eval']['samples'] == 1000
    res = validate.main(['--checkpoint', str(tmp_path / 'tar' / 'last.pth'), '--data-dir', str(IMAGENETTE),
                         '--split', 'val.tar', '--workers', '2'])
    assert res['top1'] == pytest.approx(results['eval']['top1'], abs=1e-4)


def test_no_loader_worker_outlives_its_command(digits, tmp_path):
    """train.main and validate.main in one process (a notebook, a sweep) leave no loader worker processes behind:
    left to the garbage collector, a finished run's loaders kept their workers and a later collection stalled
    about 10 s per loader."""
    import multiprocessing
    train.main(MODEL_ARGS + ['--epochs', '1', '-b', '8', '--workers', '1', '--data-dir', str(digits), '--threads', '1',
                             '--val-split', 'val', '--output', str(tmp_path), '--experiment', 'w', '--log-interval',
                             '100'])
    assert multiprocessing.active_children() == []
    validate.main(['--checkpoint', str(tmp_path / 'w' / 'last.pth'), '--data-dir', str(digits), '--split', 'val',
                   '--workers', '1', '--threads', '1'])
    assert multiprocessing.active_children() == []


def test_nan_loss_stops_and_keeps_last_good_checkpoint(digits, tmp_path):
    # epoch 0 at the warmup LR trains normally; epoch 1's LR of 1e25 diverges at its second batch
    with pytest.raises(SystemExit) as e:
        train.main(MODEL_ARGS + [
            '--epochs', '2', '-b', '8', '--opt', 'sgd', '--lr', '1e25', '--warmup-epochs', '1', '--warmup-lr', '1e-3',
            '--data-dir', str(digits), '--val-split', 'val', '--workers', '0', '--log-interval', '100',
            '--output', str(tmp_path), '--experiment', 'nan'])
    assert e.value.code == 1
    msg = e.value.message
    assert 'training loss is nan' in msg or 'training loss is inf' in msg
    assert 'epoch 1' in msg and 'last good checkpoint' in msg and 'intact' in msg
    ckpt = _state(tmp_path / 'nan' / 'last.pth')
    assert ckpt['epoch'] == 0
    assert all(torch.isfinite(v).all() for v in ckpt['state_dict'].values() if v.is_floating_point())
    assert 'loss is' in (tmp_path / 'nan' / 'train.log').read_text()


def _class_folders(digits, root, classes, splits=('train', 'val')):
    """root/<split>/<class> with the digits images of ``classes`` only; returns root."""
    for split in splits:
        for c in classes:
            shutil.copytree(digits / split / c, root / split / c)
    return root


@pytest.fixture(scope='module')
def three_class_run(digits, tmp_path_factory):
    """One epoch on the digits 0, 1, 2 only (6 validation images each); returns its last.pth."""
    out = tmp_path_factory.mktemp('three')
    data = _class_folders(digits, out / 'data', '012')
    # --threads 1: a resume keeps the run's count, and the count chosen from an idle machine's load (2 here) made
    # the resumes below take a minute when they ran on a machine the suite had made busy
    train.main(MODEL_ARGS + ['--epochs', '1', '-b', '8', '--workers', '0', '--data-dir', str(data), '--threads', '1',
                             '--val-split', 'val', '--output', str(out), '--experiment', 'run', '--log-interval', '100'])
    return out / 'run' / 'last.pth'


def test_settings_are_saved_as_given_and_derived_values_apart(three_class_run):
    """Issue 35 item 3: args.yaml and a checkpoint's 'args' hold the arguments as given (no --lr, no --num-classes);
    the lr timm's rule scaled to the batch and the classes counted in the data are derived values, saved apart."""
    folder, ckpt = three_class_run.parent, _state(three_class_run)
    given = yaml.safe_load((folder / 'args.yaml').read_text())
    derived = yaml.safe_load((folder / 'derived.yaml').read_text())
    assert given['lr'] is None and given['num_classes'] is None and given['lr_base_scale'] == ''
    assert derived == {'num_classes': 3, 'lr': pytest.approx(0.1 * 8 / 256), 'lr_base_scale': 'linear'}
    assert yaml.safe_load(args_to_yaml(ckpt['args'])) == given and ckpt['derived'] == derived  # tuples: lists
    assert ckpt['schedule']['lr'] == derived['lr']


def _resumed_with_batch(checkpoint, data, folder, batch_size):
    """A second epoch of ``checkpoint`` (copied into ``folder``, so the fixture's run is left as it is) at
    ``batch_size``; returns the resumed run's last.pth."""
    folder.mkdir()
    shutil.copy(checkpoint, folder / 'last.pth')
    res = train.main(['--resume', str(folder / 'last.pth'), '--epochs', '2', '-b', str(batch_size), '--workers', '0',
                      '--data-dir', str(data), '--log-interval', '100'])
    return _state(Path(res['experiment_dir']) / 'last.pth')


def test_a_resume_derives_the_lr_again_from_the_given_one(three_class_run, tmp_path, caplog):
    # the run was at -b 8 with no --lr: at -b 4 the lr is scaled again from --lr-base, not from the saved lr
    data = Path(_state(three_class_run)['args']['data_dir'])
    resumed = _resumed_with_batch(three_class_run, data, tmp_path / 'r', 4)
    assert resumed['args']['lr'] is None and resumed['args']['batch_size'] == 4
    assert resumed['derived']['lr'] == pytest.approx(0.1 * 4 / 256) and resumed['derived']['num_classes'] == 3
    assert resumed['optimizer']['param_groups'][0]['initial_lr'] == pytest.approx(0.1 * 4 / 256)
    assert any('derived again: lr 0.0015625 (was 0.003125)' in r.getMessage() for r in caplog.records)


def test_a_checkpoint_without_derived_values_still_resumes(three_class_run, tmp_path):
    # written before the derived values were kept apart: its 'args' hold them, and a resume takes them as given
    old = _state(three_class_run)
    old['args'].update(old.pop('derived'))
    (tmp_path / 'old').mkdir()
    torch.save(old, tmp_path / 'old' / 'made-the-old-way.pth')
    resumed = _resumed_with_batch(tmp_path / 'old' / 'made-the-old-way.pth', old['args']['data_dir'],
                                  tmp_path / 'r', 4)
    assert resumed['epoch'] == 1
    assert resumed['args']['lr'] == pytest.approx(0.1 * 8 / 256) and 'lr' not in resumed['derived']
    assert resumed['optimizer']['param_groups'][0]['initial_lr'] == pytest.approx(0.1 * 8 / 256)


def _validate_with_dataset(monkeypatch, argv):
    """validate.main(argv) and the validation set it labelled."""
    made = []
    create = validate.create_image_dataset
    monkeypatch.setattr(validate, 'create_image_dataset', lambda *a, **k: made.append(create(*a, **k)) or made[-1])
    res = validate.main(argv + ['--workers', '0', '-b', '8'])
    return res, made[-1]


def _folder_labels(ds):
    return [(p.split('/')[0], t) for p, t in ds.samples]


def test_checkpoints_store_the_class_names(three_class_run):
    for name in ('last.pth', 'model_best.pth'):  # a plain list of str: loads with weights_only=True
        assert _state(three_class_run.parent / name)['class_names'] == ['0', '1', '2']


def test_validate_labels_class_folders_by_the_checkpoint_class_names(three_class_run, digits, tmp_path, monkeypatch):
    """Trained on {0, 1, 2}, validated on folders {1, 2}: by folder order 1 and 2 were labelled 0 and 1 (a wrong
    score, no warning). The checkpoint's class names label each folder by its name."""
    data = _class_folders(digits, tmp_path / 'sub', '12', splits=('val',))
    argv = ['--checkpoint', str(three_class_run), '--data-dir', str(data), '--split', 'val']
    res, ds = _validate_with_dataset(monkeypatch, argv)
    assert res['labels'] == 'class names stored in the checkpoint' and res['samples'] == 12
    assert sorted(set(_folder_labels(ds))) == [('1', 1), ('2', 2)]
    # the same metrics as with the right labels given by hand
    (tmp_path / 'map.txt').write_text('0\n1\n2\n')
    by_hand, ds = _validate_with_dataset(monkeypatch, argv + ['--class-map', str(tmp_path / 'map.txt')])
    assert sorted(set(_folder_labels(ds))) == [('1', 1), ('2', 2)]
    assert {k: res[k] for k in ('top1', 'top5', 'loss', 'samples')} == \
        {k: by_hand[k] for k in ('top1', 'top5', 'loss', 'samples')}


def test_validate_refuses_class_folders_the_model_was_not_trained_on(three_class_run, digits, tmp_path, monkeypatch):
    """Folders {1, 2, 3} for a model of {0, 1, 2} (the issue: 16.7 % with no warning) or {8, 9}: exit 2 with both
    lists. An explicit --class-map overrides."""
    def err(data):
        with pytest.raises(SystemExit) as e:
            validate.main(['--checkpoint', str(three_class_run), '--data-dir', str(data), '--split', 'val',
                           '--workers', '0'])
        assert e.value.code == 2 and '\n' not in e.value.message
        return e.value.message

    data = _class_folders(digits, tmp_path / 'other', '123', splits=('val',))
    assert 'has class folders [3] not among its classes [0, 1, 2]' in err(data)
    disjoint = _class_folders(digits, tmp_path / 'disjoint', '89', splits=('val',))
    assert 'has class folders [8, 9] not among its classes [0, 1, 2]' in err(disjoint)
    (tmp_path / 'map.txt').write_text('1\n2\n3\n')  # the user says: folder 1 is label 0, ...
    res, ds = _validate_with_dataset(monkeypatch, ['--checkpoint', str(three_class_run), '--data-dir', str(data),
                                                   '--split', 'val', '--class-map', str(tmp_path / 'map.txt')])
    assert res['samples'] == 18 and res['labels'] == f'--class-map {tmp_path / "map.txt"}'
    assert sorted(set(_folder_labels(ds))) == [('1', 0), ('2', 1), ('3', 2)]


def test_validate_checkpoint_without_class_names_warns(three_class_run, digits, tmp_path, monkeypatch, caplog):
    """An older checkpoint (or foreign weights) has no class names: folder order, as before, with a warning."""
    old = tmp_path / 'old.pth'
    torch.save({k: v for k, v in _state(three_class_run).items() if k != 'class_names'}, old)
    data = _class_folders(digits, tmp_path / 'other', '123', splits=('val',))
    argv = ['--checkpoint', str(old), '--data-dir', str(data), '--split', 'val']
    res, ds = _validate_with_dataset(monkeypatch, argv)
    assert res['labels'] == 'dataset class order (assumed)' and res['samples'] == 18
    assert sorted(set(_folder_labels(ds))) == [('1', 0), ('2', 1), ('3', 2)]
    assert 'do not store the class names the model was trained on: labels are assumed to follow' in caplog.text


def test_validate_bad_inputs(reference_run, digits, tmp_path):
    ckpt = str(reference_run / 'last.pth')

    def err(*argv):
        with pytest.raises(SystemExit) as e:
            validate.main(list(argv) + ['--workers', '0'])
        assert e.value.code == 2
        return e.value.message

    assert 'does not exist' in err('--checkpoint', ckpt, '--data-dir', str(tmp_path / 'missing'))
    (tmp_path / 'empty' / 'val' / 'cls').mkdir(parents=True)
    assert 'is empty' in err('--checkpoint', ckpt, '--data-dir', str(tmp_path / 'empty'), '--split', 'val')
    _class_folders(digits, tmp_path / 'three', '012', splits=('val',))
    # a checkpoint without class names (written before they were stored) labels by folder order: the class
    # count must match (with class names, 3 of the 10 classes are fine: test_validate_labels_class_folders_...)
    old = tmp_path / 'old.pth'
    torch.save({k: v for k, v in _state(ckpt).items() if k != 'class_names'}, old)
    msg = err('--checkpoint', str(old), '--data-dir', str(tmp_path / 'three'), '--split', 'val')
    assert 'class-count mismatch' in msg and '3 classes' in msg and '10 outputs' in msg
    msg = err('--checkpoint', ckpt, '--model', 'gmlp_ti', '--data-dir', str(digits), '--split', 'val')
    assert "trained for model 'smlpnet_t'" in msg
    sd_path = tmp_path / 'sd.pth'
    torch.save(_state(ckpt)['state_dict'], sd_path)
    msg = err('--checkpoint', str(sd_path), '--model', 'mixer_s16', '--num-classes', '10', '--img-size', '32',
              '--model-kwargs', 'patch_size=8', '--data-dir', str(digits), '--split', 'val')
    assert 'does not fit mixer_s16' in msg and 'other shapes' in msg
    assert 'pass --model' in err('--checkpoint', str(sd_path), '--data-dir', str(digits), '--split', 'val')
    assert 'does not exist' in err('--checkpoint', str(tmp_path / 'nope.pth'), '--data-dir', str(digits))
    assert 'unknown model' in err('--model', 'no_such_model', '--data-dir', str(digits))
    # issue 29: every flag value checked before work starts, one line each
    data = ['--checkpoint', ckpt, '--data-dir', str(digits), '--split', 'val']
    for flags, expected in {
        ('--batch-size', '0'): '--batch-size must be >= 1, got 0',
        ('--log-interval', '0'): '--log-interval must be >= 1',
        ('--interpolation', 'banana'): "invalid choice: 'banana'",
        ('--crop-mode', 'banana'): "invalid choice: 'banana'",
        ('--crop-pct', 'nan'): '--crop-pct must be in (0, 1]',
        ('--input-img-mode', 'XYZ'): "invalid choice: 'XYZ'",
        ('--input-img-mode', 'L'): '--input-img-mode L gives 1-channel images, the model takes 3',
        ('--std', '0'): '--std must be a positive number',
        ('--mean', '0.5', '0.5'): '--mean needs 1 or 3 values',
        ('--torchcompile', 'banana'): "--torchcompile 'banana' is not a torch.compile backend",
        ('--device', 'banana'): "--device 'banana' is not a device",
        ('--class-map', str(tmp_path / 'map.pkl')): 'is not a file',
        ('--results-file', str(tmp_path)): 'is a folder',
    }.items():
        msg = err(*data, *flags)
        assert expected in msg, (flags, msg)


def test_validate_keeps_an_earlier_results_file(reference_run, digits, tmp_path):
    out = tmp_path / 'val.csv'
    argv = ['--checkpoint', str(reference_run / 'last.pth'), '--data-dir', str(digits), '--split', 'val',
            '--workers', '0', '--results-file', str(out)]
    validate.main(argv)
    first = out.read_text()
    validate.main(argv)
    assert (tmp_path / 'val-1.csv').read_text() == first and out.read_text().splitlines()[0] == first.splitlines()[0]


def test_train_bad_inputs(reference_run, digits, tmp_path):
    base = MODEL_ARGS + ['--epochs', '1', '-b', '8', '--workers', '0', '--output', str(tmp_path)]

    def err(*argv):
        with pytest.raises(SystemExit) as e:
            train.main(base + list(argv))
        assert e.value.code == 2
        return e.value.message

    assert 'does not exist' in err('--data-dir', str(tmp_path / 'missing'))
    msg = err('--data-dir', str(digits), '--val-split', 'val', '--num-classes', '5')
    assert 'class-count mismatch' in msg and '10 classes' in msg
    cfg = tmp_path / 'bad.yaml'
    cfg.write_text('lrr: 0.1\n')
    assert "unknown key 'lrr'" in err('-c', str(cfg), '--data-dir', str(digits))
    # resuming a checkpoint of another model
    msg = err('--data-dir', str(digits), '--val-split', 'val', '--model', 'gmlp_ti',
              '--resume', str(reference_run / 'last.pth'))
    assert "checkpoint of model 'smlpnet_t'" in msg
    # a checkpoint of the same model name but other settings
    msg = err('--data-dir', str(digits), '--val-split', 'val', '--model-kwargs', 'embed_dim=16',
              'depths=(1,1,1,1)', '--resume', str(reference_run / 'last.pth'))
    assert 'does not fit model smlpnet_t' in msg and 'other shapes' in msg


def _bce(logits, target):
    return torch.nn.functional.binary_cross_entropy_with_logits(logits, target)


def _soft_ce(logits, target):
    return -(target * logits.log_softmax(-1)).sum(-1).mean()


def _one_hot(target, smoothing=0.):
    return torch.nn.functional.one_hot(target, 10).float() * (1 - smoothing) + smoothing / 10


# flags -> the loss on (logits, class indices), computed from its formula; with mixup, on mixup's soft targets
TRAINING_LOSSES = {
    '--smoothing 0': lambda x, y: torch.nn.functional.cross_entropy(x, y),
    '': lambda x, y: _soft_ce(x, _one_hot(y, 0.1)),  # label smoothing 0.1 is timm's default
    '--bce-loss --smoothing 0': lambda x, y: _bce(x, _one_hot(y)),  # was nn.BCEWithLogitsLoss on indices: a crash
    '--bce-loss': lambda x, y: _bce(x, _one_hot(y, 0.1)),
    '--mixup 0.8': _soft_ce,
    '--mixup 0.8 --bce-loss': _bce,
}


@pytest.mark.parametrize('flags', list(TRAINING_LOSSES))
def test_the_training_loss_of_each_target_kind(flags):
    args = train.build_parser().parse_args(flags.split() + ['--num-classes', '10'])
    mixup_fn, loss_fn = train._create_mixup_and_loss(args, torch.device('cpu'))
    torch.manual_seed(0)
    images, target, logits = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,)), torch.randn(4, 10)
    if mixup_fn is not None:
        images, target = mixup_fn(images, target)
    assert (mixup_fn is not None) == ('--mixup' in flags)
    torch.testing.assert_close(loss_fn(logits, target), TRAINING_LOSSES[flags](logits, target))


def test_config_yaml_and_cli_precedence(tmp_path):
    cfg = tmp_path / 'c.yaml'
    cfg.write_text('lr: 0.5\nweight-decay: 0.01\nmodel_kwargs: {embed_dim: 8}\nscale: [0.5, 1.0]\n')
    args, files = parse_args_with_config(train.build_parser(), ['-c', str(cfg), '--lr', '0.1', '--data-dir', 'x'])
    assert files == [str(cfg)]
    assert args.lr == 0.1  # the explicit flag wins
    assert args.weight_decay == 0.01 and args.model_kwargs == {'embed_dim': 8} and args.scale == [0.5, 1.0]


@pytest.mark.parametrize('path', sorted((REPO / 'configs').glob('*.yaml')), ids=lambda p: p.name)
def test_recipes_parse(path):
    # every key of every recipe is a train.py flag, and the resolved values have the flag's type
    args, _ = parse_args_with_config(train.build_parser(), ['-c', str(path), '--data-dir', 'x'])
    assert args.model
    assert isinstance(args.epochs, int) and args.epochs > 0
    if path.name != 'demo_digits.yaml':
        assert args.lr is None and args.lr_base > 0 and args.lr_base_scale == 'linear'


def test_recipes_are_found_by_name(capsys):
    """``-c smlpnet_t`` is ``configs/smlpnet_t.yaml`` (from a checkout here; tests/test_installed.py: installed);
    an unknown name is one line listing the recipes; the text trainer (no recipes) reads ``-c`` as a path only."""
    assert recipe_names() == sorted(p.stem for p in (REPO / 'configs').glob('*.yaml'))
    assert find_recipe('smlpnet_t') == REPO / 'configs' / 'smlpnet_t.yaml'
    by_name, files = parse_args_with_config(train.build_parser(), ['-c', 'smlpnet_t', '--data-dir', 'x'], recipes=True)
    by_path, _ = parse_args_with_config(train.build_parser(), ['-c', files[0], '--data-dir', 'x'])
    assert files == [str(REPO / 'configs' / 'smlpnet_t.yaml')]
    assert {**vars(by_name), 'config': ''} == {**vars(by_path), 'config': ''}
    with pytest.raises(UsageError, match='config file .smlpnet_t. does not exist'):
        parse_args_with_config(train.build_parser(), ['-c', 'smlpnet_t'])
    with pytest.raises(SystemExit) as e:
        train.main(['-c', 'smlpnet_x', '--data-dir', 'x'])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('train.py: error: -c smlpnet_x: no such file, and no recipe'), err
    assert ', '.join(recipe_names()) in err[0]


def _help_default(capsys, argv, flag='--warmup-epochs N'):
    """The default --help states for ``flag`` after ``train.main(argv + ['--help'])`` (status 0)."""
    with pytest.raises(SystemExit) as e:
        train.main(argv + ['--help'])
    assert e.value.code == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith(flag))
    return line.rsplit('(default: ', 1)[1].rstrip(')')


def test_help_states_the_defaults_of_the_recipe_and_the_resumed_run(reference_run, capsys):
    """``-c smlpnet_t --help`` shows the recipe's values as the defaults (20 warmup epochs, not the parser's 5), the
    demo recipe is not shown (it applies only without a dataset), and ``--resume`` shows the resumed run's."""
    assert _help_default(capsys, []) == '5'
    assert _help_default(capsys, ['-c', 'smlpnet_t']) == '20'
    assert _help_default(capsys, ['--resume', str(reference_run / 'last.pth')], '--opt OPTIMIZER') == 'adamw'
    assert _help_default(capsys, ['-c', 'smlpnet_t', '--hel']) == '20'  # argparse's abbreviation of --help


def test_atomic_save_keeps_previous_file_on_failure(tmp_path):
    path = tmp_path / 'last.pth'
    atomic_save({'epoch': 1}, path)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError('boom')

    with pytest.raises(RuntimeError, match='boom'):
        atomic_save({'epoch': 2, 'bad': Unpicklable()}, path)
    assert torch.load(path, weights_only=True) == {'epoch': 1}
    assert [p.name for p in tmp_path.iterdir()] == ['last.pth']


def test_demo_wiring_one_epoch(tmp_path, monkeypatch):
    # `python train.py` with no dataset: digits cache + demo recipe + validation of the saved checkpoint
    monkeypatch.setenv('MLP_VISION_CACHE', str(tmp_path / 'cache'))
    results = train.main(['--epochs', '1', '--workers', '0', '--output', str(tmp_path / 'out'),
                          '--log-interval', '100'])
    assert (tmp_path / 'cache' / 'digits' / 'train' / '0').is_dir()
    val = results['demo_validation']
    assert val['samples'] == 364
    # the demo recipe is part of the arguments as given; the data folder it trains on is derived
    folder = Path(results['experiment_dir'])
    given = yaml.safe_load((folder / 'args.yaml').read_text())
    assert given['data_dir'] is None and given['epochs'] == 1 and given['lr'] == 2e-3  # demo_digits.yaml's lr
    derived = yaml.safe_load((folder / 'derived.yaml').read_text())
    assert derived['data_dir'] == str(tmp_path / 'cache' / 'digits') and derived['val_split'] == 'val'
    assert val['top1'] == pytest.approx(results['best']['metric'], abs=1e-4)


@pytest.mark.slow
def test_demo_full_run_learns(tmp_path, monkeypatch):
    """The full default demo (about a minute or two on 2 CPU cores): validated accuracy far above chance."""
    monkeypatch.setenv('MLP_VISION_CACHE', str(tmp_path / 'cache'))
    results = train.main(['--output', str(tmp_path / 'out')])
    assert results['demo_validation']['top1'] > 90.


@pytest.mark.slow
@pytest.mark.skipif(not (IMAGENETTE / 'train.tar').is_file(),
                    reason=f'needs the shared imagenette-mini tars at {IMAGENETTE} (../shared beside the repo)')
def test_imagenette_short_run_learns(tmp_path):
    """A shorter version of the recorded run (results/imagenette_mini): sMLPNet-T at 64x64 for 5 epochs on the
    3,000 imagenette-mini training photos reaches a validation top-1 well above chance (10 %)."""
    results = train.main([
        '-c', str(REPO / 'configs' / 'imagenette_mini_cpu.yaml'), '--data-dir', str(IMAGENETTE),
        '--model', 'smlpnet_t', '--img-size', '64', '--epochs', '5', '--warmup-epochs', '1',
        '--log-interval', '1000', '--output', str(tmp_path), '--experiment', 'short'])
    assert results['eval']['samples'] == 1000
    assert results['best']['metric'] > 25.
