""" A trained model you can share (issue 36 item 3): best / top-N checkpoints hold the weights only unless
``--keep-optimizer-state`` (``last.pth`` always holds the optimizer, for resume), such a file loads in validate and
refuses a resume with one line; ``timm.create_model(name, checkpoint_path=..., features_only=True)`` loads a
classifier checkpoint into the feature backbone of every family.

Every run here is tiny (a width-8 sMLPNet on 16 generated PNGs, a 1-layer text model for a few updates).
"""
import json
import sys
from pathlib import Path

import pytest
import timm
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import mlp_vision.train as train  # noqa: E402
import mlp_vision.train_text as text_train  # noqa: E402
import mlp_vision.validate as validate  # noqa: E402
from _helpers import TINY_GPT, TINY_VISION, exits_with_one_line, randomize_  # noqa: E402


def _load(path):
    return torch.load(path, map_location='cpu', weights_only=True)


@pytest.fixture(scope='module')
def default_run(images, tmp_path_factory):
    """2 epochs of AdamW with EMA weights, the 2 best epochs kept, no --keep-optimizer-state: (folder, argv)."""
    out = tmp_path_factory.mktemp('runs')
    argv = TINY_VISION + ['--data-dir', str(images), '--val-split', 'val', '--epochs', '2', '--checkpoint-hist', '2',
                          '--opt', 'adamw', '--model-ema', '--output', str(out), '--experiment', 'v']
    train.main(argv)
    return out / 'v', argv


def test_best_and_top_n_hold_the_weights_only_by_default(default_run):
    folder, _ = default_run
    last = _load(folder / 'last.pth')
    run_id = json.loads((folder / 'run.json').read_text())['run_id']
    assert 'optimizer' in last and last['run_id'] == run_id
    kept = ['model_best.pth'] + [h['file'] for h in last['checkpoint_history']['history']]
    assert len(kept) == 3
    for name in kept:
        ckpt = _load(folder / name)
        assert 'optimizer' not in ckpt and 'amp_scaler' not in ckpt, name
        assert ckpt['run_id'] == run_id and ckpt['arch'] == 'smlpnet_t'  # still a checkpoint of this run
        assert ckpt['state_dict'].keys() == ckpt['state_dict_ema'].keys() == last['state_dict'].keys()
        # AdamW keeps two moments per weight: weights + EMA weights are about half of last.pth
        assert (folder / name).stat().st_size < 0.6 * (folder / 'last.pth').stat().st_size, name
    # the kept file of the last epoch (2 kept of 2) holds exactly last.pth's weights
    top = _load(folder / 'checkpoint-1.pth')
    assert all(torch.equal(top['state_dict'][k], last['state_dict'][k]) for k in last['state_dict'])


def test_a_weights_only_best_validates(default_run, images):
    folder, _ = default_run
    res = validate.main(['--checkpoint', str(folder / 'model_best.pth'), '--data-dir', str(images), '--split', 'val',
                         '--workers', '0', '--use-ema'])
    best = _load(folder / 'model_best.pth')
    assert res['top1'] == pytest.approx(best['metric'], abs=1e-3)  # the EMA weights' accuracy chose the best


def test_resuming_a_weights_only_checkpoint_says_what_to_do(default_run, capsys):
    folder, _ = default_run
    before = sorted(p.name for p in folder.iterdir())
    msg = exits_with_one_line(train.main, ['--resume', str(folder / 'model_best.pth'), '--epochs', '3'], capsys)
    assert 'holds the weights only (written without --keep-optimizer-state)' in msg
    assert 'continue from last.pth' in msg and '--no-resume-opt' in msg and '--initial-checkpoint' in msg
    assert sorted(p.name for p in folder.iterdir()) == before


def test_a_weights_only_checkpoint_resumes_with_a_fresh_optimizer(default_run, tmp_path):
    folder, _ = default_run
    res = train.main(['--resume', str(folder / 'checkpoint-0.pth'), '--no-resume-opt', '--output', str(tmp_path),
                      '--experiment', 'fresh'])
    # epoch 1 again from epoch 0's weights, in a new folder (the run had gone further)
    assert Path(res['experiment_dir']) == (tmp_path / 'fresh').resolve()
    assert _load(tmp_path / 'fresh' / 'last.pth')['epoch'] == 1


def test_a_weights_only_checkpoint_starts_a_new_run(default_run, tmp_path):
    folder, argv = default_run
    res = train.main(argv[:argv.index('--output')] + ['--epochs', '1', '--initial-checkpoint',
                                                       str(folder / 'model_best.pth'), '--output', str(tmp_path)])
    assert _load(Path(res['experiment_dir']) / 'last.pth')['epoch'] == 0


def test_keep_optimizer_state_makes_best_and_top_n_resumable(images, tmp_path):
    train.main(TINY_VISION + ['--data-dir', str(images), '--val-split', 'val', '--epochs', '1', '--checkpoint-hist',
                              '1', '--keep-optimizer-state', '--output', str(tmp_path), '--experiment', 'k'])
    folder = tmp_path / 'k'
    for name in ('model_best.pth', 'checkpoint-0.pth'):  # links of last.pth, as written
        assert (folder / name).samefile(folder / 'last.pth')
        assert 'optimizer' in _load(folder / name)


def test_the_text_trainer_keeps_a_weights_only_best(text_file, tmp_path, capsys):
    text_train.main(TINY_GPT + ['--train-file', text_file, '--steps', '4', '--eval-interval', '2', '--output',
                                str(tmp_path), '--experiment', 't'])
    folder = tmp_path / 't'
    best, last = _load(folder / 'model_best.pth'), _load(folder / 'last.pth')
    assert 'optimizer' not in best and 'optimizer' in last and best['run_id'] == last['run_id']
    msg = exits_with_one_line(text_train.main, ['--resume', str(folder / 'model_best.pth')], capsys)
    assert 'holds the weights only' in msg and 'continue from last.pth' in msg and '--no-resume-opt' not in msg
