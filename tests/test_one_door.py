""" One door for weights and configs (mlp_vision/weights.py): every way a model and its weights arrive -- a
``local-dir:`` folder through validate.py / train.py / benchmark.py, ``timm.create_model(..., pretrained=True)`` in a
user's own code (through our models' ``checkpoint_filter_fn``), a checkpoint file -- passes the same checks, and a
bad file or config stops with one line naming it. Each family of docs/what_happens_when.md ("Loaded weights and
what used to be a traceback") has a test here; the folders are made here from a tiny model, as train.py exports
them (timm's ``save_for_hf``).
"""
import json
import os
import shutil

import pytest
import timm
import torch
from safetensors.torch import load_file, save_file
from timm.models import save_for_hf

import mlp_vision  # noqa: F401  (registers our models)
from mlp_vision.errors import UsageError
from mlp_vision.image_model import create_model, create_model_for_eval, model_create_kwargs
from mlp_vision.validate import main as validate_main
from _helpers import exits_with_one_line, randomize_

KWARGS = dict(embed_dim=8, depths=(1, 1, 1, 1), img_size=32, num_classes=2)
LABELS = ['class0', 'class1']  # the `images` fixture's class folders


def _export(model, folder, label_names=LABELS):
    save_for_hf(model, str(folder), model_config={'label_names': list(label_names)}, safe_serialization=True,
                data_config=dict(input_size=(3, 32, 32), interpolation='bicubic', mean=(0.5,) * 3, std=(0.25,) * 3,
                                 crop_pct=1.0, crop_mode='center'))
    return folder


@pytest.fixture(scope='module')
def good(tmp_path_factory):
    """A run's pretrained/ folder of a tiny sMLPNet (2 classes, random non-trivial weights)."""
    model = randomize_(timm.create_model('smlpnet_t', **KWARGS)).eval()
    return _export(model, tmp_path_factory.mktemp('door') / 'good')


def _copy(good, tmp_path, config=None, weights=None, raw=None):
    """A copy of ``good`` with ``config(cfg)`` applied to its config.json, ``weights(sd)`` to its tensors, or
    ``raw`` bytes as its model.safetensors."""
    folder = tmp_path / 'folder'
    shutil.copytree(good, folder)
    if config is not None:
        cfg = json.loads((folder / 'config.json').read_text())
        config(cfg)
        (folder / 'config.json').write_text(json.dumps(cfg))
    if weights is not None:
        sd = load_file(str(folder / 'model.safetensors'))
        save_file(weights(sd) or sd, str(folder / 'model.safetensors'))
    if raw is not None:
        (folder / 'model.safetensors').write_bytes(raw)
    return folder


def _nan_stem(sd):
    sd['stem.weight'] = torch.full_like(sd['stem.weight'], float('nan'))


def _int_stem(sd):
    sd['stem.weight'] = sd['stem.weight'].to(torch.int32)


def _no_stem_not_strict(sd):
    del sd['stem.weight']


def _data_cfg(key, value):
    return lambda cfg: cfg['pretrained_cfg'].__setitem__(key, value)


# (config change, weights change, raw weights bytes, what the one line must say)
BAD_FOLDERS = {
    'nan weights': (None, _nan_stem, None, 'stem.weight holds'),
    'integer weights': (None, _int_stem, None, 'stem.weight holds torch.int32'),
    'mean NaN': (_data_cfg('mean', [float('nan')] * 3), None, None, 'mean must be a finite number'),
    'std 0': (_data_cfg('std', [0, 0, 0]), None, None, 'std must be a positive number'),
    'mean a string': (_data_cfg('mean', 'abc'), None, None, "mean is 'abc'"),
    'crop_pct -5': (_data_cfg('crop_pct', -5), None, None, 'crop_pct must be in (0, 1]'),
    'interpolation evil': (_data_cfg('interpolation', 'evil'), None, None, "interpolation is 'evil'"),
    'input_size of 2': (_data_cfg('input_size', [3, 32]), None, None, 'input_size is [3, 32]'),
    'architecture 5': (lambda cfg: cfg.__setitem__('architecture', 5), None, None, 'architecture is 5'),
    'label_names short': (lambda cfg: cfg.__setitem__('label_names', ['a']), None, None, "label_names is ['a']"),
    'num_classes -1': (lambda cfg: cfg.__setitem__('num_classes', -1), None, None, 'num_classes is -1'),
    'stem missing, pretrained_strict false': (
        lambda cfg: cfg['model_args'].__setitem__('pretrained_strict', False), _no_stem_not_strict, None,
        'missing from the file (stem.weight)'),
    'empty weights file': (None, None, b'', 'model.safetensors'),
    'truncated weights file': (None, None, 'half', 'model.safetensors'),
    'absurd header': (None, None, (2 ** 60).to_bytes(8, 'little') + b'{}', 'model.safetensors'),
}


@pytest.mark.parametrize('case', list(BAD_FOLDERS))
def test_a_bad_local_dir_folder_stops_with_one_line_in_every_command_and_in_timm(case, good, tmp_path):
    """Through our commands' create path (validate / train --pretrained / visualize) and through
    timm.create_model('local-dir:...', pretrained=True) in a user's code: the same UsageError, naming the file."""
    config, weights, raw, expected = BAD_FOLDERS[case]
    if raw == 'half':
        raw = (good / 'model.safetensors').read_bytes()[:1000]
    folder = _copy(good, tmp_path, config, weights, raw)
    with pytest.raises(UsageError) as ours:
        create_model_for_eval(f'local-dir:{folder}', pretrained=True)
    assert expected in str(ours.value) and str(folder) in str(ours.value) and '\n' not in str(ours.value)
    if raw is None and not any(k in case for k in ('architecture', 'label_names', 'num_classes', 'input_size')):
        # timm reads the weights file and parses the config itself (and sets input_size from model_args); from
        # there on our filter checks
        with pytest.raises(UsageError) as theirs:
            timm.create_model(f'local-dir:{folder}', pretrained=True)
        assert expected in str(theirs.value)


def test_validate_says_one_line_for_a_damaged_folder_and_where_a_folder_goes(good, images, tmp_path, capsys):
    folder = _copy(good, tmp_path, weights=_nan_stem)
    data = ['--data-dir', str(images), '--split', 'val', '--workers', '0']
    line = exits_with_one_line(validate_main, ['--model', f'local-dir:{folder}', '--pretrained'] + data, capsys)
    assert line.startswith(f'validate.py: error: {folder}/model.safetensors: stem.weight holds'), line
    line = exits_with_one_line(validate_main, ['--checkpoint', str(good)] + data, capsys)
    assert f'give it as --model local-dir:{good} --pretrained' in line


def test_a_good_folder_loads_the_same_weights_through_our_commands_and_timm(good):
    ours, info = create_model_for_eval(f'local-dir:{good}', pretrained=True)
    theirs = timm.create_model(f'local-dir:{good}', pretrained=True)
    saved = load_file(str(good / 'model.safetensors'))
    for model in (ours, theirs):
        assert all(torch.equal(t, saved[k]) for k, t in model.state_dict().items() if k in saved)
        assert set(saved) == set(model.state_dict())
    assert info['class_names'] == LABELS


def test_timm_still_adapts_the_classifier_and_the_stem_after_our_filter(good):
    """Another class count drops the classifier, one input channel sums the stem over RGB (timm's
    adapt_input_conv): our filter's checks leave both to timm, and check everything else."""
    saved = load_file(str(good / 'model.safetensors'))
    model = timm.create_model(f'local-dir:{good}', pretrained=True, in_chans=1, num_classes=5)
    assert torch.allclose(model.stem.weight, saved['stem.weight'].sum(dim=1, keepdim=True))
    assert model.head.fc.weight.shape[0] == 5
    assert all(torch.equal(t, saved[k]) for k, t in model.state_dict().items() if not k.startswith(('stem.', 'head.')))


def test_the_user_may_opt_out_of_strict_keys_in_python_but_a_config_may_not(good, tmp_path, caplog):
    """pretrained_strict=False given by the user loads what there is with a WARNING naming the tensors left at
    init; the same setting from a config.json's model_args is refused (test above)."""
    folder = _copy(good, tmp_path, weights=_no_stem_not_strict)
    with pytest.raises(UsageError, match=r'stem\.weight'):
        timm.create_model(f'local-dir:{folder}', pretrained=True)
    model = timm.create_model(f'local-dir:{folder}', pretrained=True, pretrained_strict=False)
    assert 'stem.weight' in caplog.text and 'keep their random init' in caplog.text
    saved = load_file(str(folder / 'model.safetensors'))
    assert torch.equal(model.state_dict()['head.fc.weight'], saved['head.fc.weight'])


def test_allow_missing_weights_is_the_commands_opt_out_for_every_way_in(good, tmp_path, caplog):
    """train.py --allow-missing-weights reaches a local-dir: folder and a registered name's weights file alike."""
    folder = _copy(good, tmp_path, weights=_no_stem_not_strict)
    init = timm.create_model('smlpnet_t', **KWARGS).stem.weight
    for name, kwargs in ((f'local-dir:{folder}', {}), ('smlpnet_t', dict(
            KWARGS, pretrained_cfg_overlay=dict(file=str(folder / 'model.safetensors'))))):
        with pytest.raises(UsageError, match=r'stem\.weight'):
            create_model(name, pretrained=True, **kwargs)
        caplog.clear()
        model = create_model(name, pretrained=True, allow_missing=True, **kwargs)
        assert 'stem.weight' in caplog.text and model.stem.weight.shape == init.shape


def test_timm_create_model_with_a_weights_file_passes_the_checks(good, tmp_path):
    """The user's other way in: our architecture name, pretrained=True, pretrained_cfg_overlay=dict(file=...)."""
    sd = load_file(str(good / 'model.safetensors'))
    _nan_stem(sd)
    save_file(sd, str(tmp_path / 'nan.safetensors'))
    with pytest.raises(UsageError, match=r'stem\.weight holds \d+ NaN'):
        timm.create_model('smlpnet_t', pretrained=True, **KWARGS,
                          pretrained_cfg_overlay=dict(file=str(tmp_path / 'nan.safetensors')))
    fine = timm.create_model('smlpnet_t', pretrained=True, **KWARGS,
                             pretrained_cfg_overlay=dict(file=str(good / 'model.safetensors')))
    assert torch.equal(fine.stem.weight, load_file(str(good / 'model.safetensors'))['stem.weight'])


@pytest.mark.parametrize('damage', [_nan_stem, _int_stem], ids=['nan', 'int'])
@pytest.mark.parametrize('features_only', [False, True], ids=['classifier', 'features'])
def test_timm_checkpoint_path_and_load_state_dict_pass_the_checks(damage, features_only, good, tmp_path):
    """timm's checkpoint_path= (its load_checkpoint: a strict load_state_dict of the file) and a user's own
    load_state_dict get the value checks too: the model checks what is loaded into it, and keeps its weights."""
    sd = load_file(str(good / 'model.safetensors'))
    damage(sd)
    torch.save(sd, tmp_path / 'bad.pth')
    kwargs = dict(KWARGS, features_only=features_only)
    with pytest.raises(UsageError, match=r'the state dict loaded into smlpnet_t: stem\.weight holds'):
        timm.create_model('smlpnet_t', checkpoint_path=str(tmp_path / 'bad.pth'), **kwargs)
    model = timm.create_model('smlpnet_t', **kwargs)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(UsageError, match=r'stem\.weight holds'):
        model.load_state_dict(sd)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    good_sd = load_file(str(good / 'model.safetensors'))
    torch.save(good_sd, tmp_path / 'good.pth')
    loaded = timm.create_model('smlpnet_t', checkpoint_path=str(tmp_path / 'good.pth'), **kwargs)
    stem = loaded.model.stem if features_only else loaded.stem
    assert torch.equal(stem.weight, good_sd['stem.weight'])


def test_gmlp_and_mixer_check_what_is_loaded_into_them():
    """The check sits in both model classes (gMLP is built on the Mixer class), with a prefix when wrapped."""
    for name, kwargs in [('gmlp_ti', dict(img_size=32, patch_size=8, num_blocks=1)),
                         ('mixer_s16', dict(img_size=32, patch_size=8, num_blocks=1))]:
        model = timm.create_model(name, num_classes=2, **kwargs)
        sd = model.state_dict()
        key = next(k for k, v in sd.items() if v.is_floating_point())
        sd[key] = torch.full_like(sd[key], float('inf'))
        with pytest.raises(UsageError, match=f'loaded into {name}: {key} holds'):
            model.load_state_dict(sd)
        wrapper = torch.nn.Sequential(model)
        with pytest.raises(UsageError, match=f'{key} holds'):
            wrapper.load_state_dict({f'0.{k}': v for k, v in sd.items()})


@pytest.mark.parametrize('kind', ['FIFO', 'device'])
def test_a_config_json_that_is_no_regular_file_is_refused_unread(kind, good, tmp_path):
    folder = _copy(good, tmp_path)
    os.remove(folder / 'config.json')
    if kind == 'FIFO':
        os.mkfifo(folder / 'config.json')  # opening it would block until a writer comes: never opened
    else:
        os.symlink('/dev/zero', folder / 'config.json')  # reading it would never end
    with pytest.raises(UsageError, match=f'config.json is a {kind}, not a regular file'):
        create_model(f'local-dir:{folder}', pretrained=True)


def test_a_folder_without_weights_says_so_not_download(good, tmp_path):
    folder = _copy(good, tmp_path)
    os.remove(folder / 'model.safetensors')
    with pytest.raises(UsageError, match='has no weights file') as e:
        create_model(f'local-dir:{folder}', pretrained=True)
    assert 'download' not in str(e.value)


def test_a_folder_with_another_weights_file_name_loads_as_timm_finds_it(good, tmp_path):
    folder = _copy(good, tmp_path)
    os.rename(folder / 'model.safetensors', folder / 'weights.safetensors')
    model = create_model(f'local-dir:{folder}', pretrained=True)
    assert torch.equal(model.stem.weight, load_file(str(folder / 'weights.safetensors'))['stem.weight'])


def _val_top1(folder, images, capsys):
    results = validate_main(['--model', f'local-dir:{folder}', '--pretrained', '--data-dir', str(images),
                             '--split', 'val', '-b', '8', '--workers', '0', '--threads', '1'])
    capsys.readouterr()
    return results['top1'], results['loss']


def test_validate_labels_the_folders_by_the_models_label_names(good, images, tmp_path, capsys):
    """The same model with its classes listed the other way round (head rows swapped with them) scores exactly
    the same; its label_names swapped alone score the complement (2 classes); names the data lacks: one line."""
    top1, loss = _val_top1(good, images, capsys)

    def swap_head(sd):
        for k in ('head.fc.weight', 'head.fc.bias'):
            sd[k] = sd[k].flip(0).contiguous()
    swapped = _copy(good, tmp_path / 'swapped', lambda cfg: cfg.__setitem__('label_names', LABELS[::-1]), swap_head)
    assert _val_top1(swapped, images, capsys) == pytest.approx((top1, loss))
    names_only = _copy(good, tmp_path / 'names', lambda cfg: cfg.__setitem__('label_names', LABELS[::-1]))
    assert _val_top1(names_only, images, capsys)[0] == pytest.approx(100 - top1)
    other = _copy(good, tmp_path / 'other', lambda cfg: cfg.__setitem__('label_names', ['cat', 'dog']))
    line = exits_with_one_line(validate_main, ['--model', f'local-dir:{other}', '--pretrained', '--data-dir',
                                               str(images), '--split', 'val', '--workers', '0'], capsys)
    assert 'cat, dog' in line and 'class0' in line


@pytest.mark.parametrize('given', [0, 5])
def test_model_kwargs_num_classes_is_checked_like_num_classes(given):
    """train.py passes the data's class count (or --num-classes) as num_classes: --model-kwargs may not differ."""
    with pytest.raises(UsageError, match=f'--model-kwargs num_classes={given}, but --num-classes'):
        model_create_kwargs(num_classes=2, model_kwargs={'num_classes': given})
    assert model_create_kwargs(num_classes=2, model_kwargs={'num_classes': 2})['num_classes'] == 2


@pytest.mark.slow
def test_train_refuses_model_kwargs_num_classes_other_than_the_data(images, tmp_path, capsys):
    from mlp_vision.train import main as train_main
    from _helpers import TINY_VISION
    line = exits_with_one_line(train_main, TINY_VISION + ['--data-dir', str(images), '--epochs', '1', '--output',
                                                          str(tmp_path), '--model-kwargs', 'num_classes=5'], capsys)
    assert 'num_classes=5' in line and '2 classes' in line
    assert not any(tmp_path.iterdir())


def test_a_text_model_folder_given_as_an_image_model_says_which_command(tmp_path, images, capsys):
    from mlp_vision.text.registry import create_model as create_text_model
    text = create_text_model('bigs_small', num_hidden_layers=1, hidden_size=16, intermediate_size=32,
                             max_position_embeddings=16)
    text.save_pretrained(str(tmp_path / 'text'))
    for argv in (['--model', f'local-dir:{tmp_path / "text"}', '--pretrained'],
                 ['--checkpoint', str(tmp_path / 'text')], ['--model', str(tmp_path / 'text')]):
        line = exits_with_one_line(validate_main, argv + ['--data-dir', str(images), '--split', 'val'], capsys)
        assert 'is a text model' in line and 'pipeline' in line, line
