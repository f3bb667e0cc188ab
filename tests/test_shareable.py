""" A trained model you can share (issue 36 item 3): best / top-N checkpoints hold the weights only unless
``--keep-optimizer-state`` (``last.pth`` always holds the optimizer, for resume), such a file loads in validate and
refuses a resume with one line; ``timm.create_model(name, checkpoint_path=..., features_only=True)`` loads a
classifier checkpoint into the feature backbone of every family.

Every run here is tiny (a width-8 sMLPNet on 16 generated PNGs).
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
import mlp_vision.validate as validate  # noqa: E402
from _helpers import TINY_VISION, exits_with_one_line, randomize_  # noqa: E402


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


# ------------------------------------------------------------------------------------------------ checkpoint_path=
FAMILIES = {  # tiny models of each family, 2 feature maps so the pruning removes blocks too (isotropic)
    'gmlp_ti': dict(embed_dim=16, num_blocks=4, patch_size=8, img_size=(32, 48)),
    'mixer_s16': dict(embed_dim=16, num_blocks=4, patch_size=8, img_size=(32, 48)),
    'smlpnet_t': dict(embed_dim=8, depths=(1, 1, 1, 1), img_size=(64, 96)),
}
OUT_INDICES = {'gmlp_ti': (0, 1), 'mixer_s16': (0, 1), 'smlpnet_t': (0, 1, 2, 3)}


def _classifier_checkpoint(name, path, num_classes=5):
    model = randomize_(timm.create_model(name, num_classes=num_classes, **FAMILIES[name])).eval()
    torch.save({'state_dict': model.state_dict(), 'arch': name}, path)
    return model


@pytest.mark.parametrize('name', list(FAMILIES))
def test_checkpoint_path_loads_a_classifier_into_its_features_only_backbone(name, tmp_path):
    model = _classifier_checkpoint(name, tmp_path / 'ck.pth')
    features = timm.create_model(name, features_only=True, out_indices=OUT_INDICES[name], **FAMILIES[name],
                                 checkpoint_path=str(tmp_path / 'ck.pth')).eval()
    size = FAMILIES[name]['img_size']
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        got = features(x)
        expected = model.forward_intermediates(x, indices=OUT_INDICES[name], intermediates_only=True)
    assert len(got) == len(expected) == len(OUT_INDICES[name])
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    # only the pruned modules' keys were left out: the head and final norm, and blocks after the last map
    assert any(k.startswith('head') for k in features.pruned_keys)
    assert {k for k in model.state_dict() if 'model.' + k not in features.state_dict()} == set(features.pruned_keys)
    features.load_state_dict(features.state_dict())  # its own state dict loads as it always did


@pytest.mark.parametrize('name', list(FAMILIES))
def test_checkpoint_path_drops_nothing_but_the_pruned_modules(name, tmp_path):
    model = _classifier_checkpoint(name, tmp_path / 'ck.pth')
    state = dict(model.state_dict(), **{'extra.weight': torch.zeros(1)})
    torch.save({'state_dict': state}, tmp_path / 'extra.pth')
    with pytest.raises(RuntimeError, match=r'Unexpected key\(s\) in state_dict: "model.extra.weight"'):
        timm.create_model(name, features_only=True, **FAMILIES[name], checkpoint_path=str(tmp_path / 'extra.pth'))
    state = {k: v for k, v in model.state_dict().items() if not k.startswith('stem')}
    torch.save({'state_dict': state}, tmp_path / 'missing.pth')
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "model.stem'):
        timm.create_model(name, features_only=True, **FAMILIES[name], checkpoint_path=str(tmp_path / 'missing.pth'))


def test_a_backbone_inside_a_larger_model_loads_a_classifier_state(tmp_path):
    # the wrapper is usually a part (e.g. ``detector.backbone.body``): its keys are mapped under its own prefix
    name = 'smlpnet_t'
    model = _classifier_checkpoint(name, tmp_path / 'ck.pth')
    outer = torch.nn.ModuleDict({'body': timm.create_model(name, features_only=True, **FAMILIES[name])})
    outer.load_state_dict({f'body.{k}': v for k, v in model.state_dict().items()})
    assert torch.equal(outer['body'].model.stem.weight, model.stem.weight)


def test_a_runs_best_checkpoint_is_a_features_only_backbone(default_run):
    # the case: timm.create_model(name, checkpoint_path=RUN/model_best.pth, features_only=True) (EMA weights)
    folder, _ = default_run
    best = _load(folder / 'model_best.pth')
    features = timm.create_model('smlpnet_t', features_only=True, embed_dim=8, depths=(1, 1, 1, 1), img_size=32,
                                 checkpoint_path=str(folder / 'model_best.pth'))
    state, ema = features.state_dict(), best['state_dict_ema']
    kept = set(ema) - set(features.pruned_keys)
    assert {k[len('model.'):] for k in state} == kept and len(kept) > len(features.pruned_keys)
    assert all(torch.equal(state['model.' + k], ema[k]) for k in kept)
