""" Hostile inputs, round three (issue 33, items 4 and 6): loaded weights are checked (floating point where the model
is, finite) on every path that loads them, a NaN stop says where the NaN came from and names only checkpoints that
exist, and what used to end in a traceback (a checkpoint's fields of the wrong type, damaged RNG states, a TSV
field over csv's limit, a tokenizer panic, memory running out, ...) is one line.

Every command runs in-process through its ``main`` on tiny inputs: a width-8 sMLPNet checkpoint made here (never
trained), a 1-layer text run of 4 updates, an official-layout BiGS folder of ``test_fill_mask`` (given to ``--init-from``).
"""
import json
import random
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import mlp_vision.text as mt  # noqa: E402
import mlp_vision.train as train  # noqa: E402
import mlp_vision.train_text as text_train  # noqa: E402
import mlp_vision.validate as validate  # noqa: E402
from mlp_vision import benchmark, visualize  # noqa: E402
from mlp_vision.errors import UsageError, run_cli  # noqa: E402
from mlp_vision.run_files import get_rng_state, set_rng_state  # noqa: E402
from mlp_vision.weights import check_weights  # noqa: E402
from _helpers import TINY_GPT, TINY_VISION, crafted_checkpoint, exits_with_one_line  # noqa: E402
from test_fill_mask import make_official_folder  # noqa: E402

_fail = exits_with_one_line
NAN = float('nan')
KWARGS = dict(embed_dim=8, depths=(1, 1, 1, 1), img_size=32, num_classes=2)
DATA_CFG = {'input_size': (3, 32, 32), 'interpolation': 'bicubic', 'mean': (0.5, 0.5, 0.5), 'std': (0.25,) * 3,
            'crop_pct': 0.9, 'crop_mode': 'center'}


def _floats(state_dict, change):
    return {k: change(v) if v.is_floating_point() else v for k, v in state_dict.items()}


@pytest.fixture(scope='module')
def vision_ckpt():
    """A checkpoint as train.py writes its evaluation fields (arch, model_cfg, data_cfg, class_names, EMA)."""
    torch.manual_seed(0)
    sd = timm.create_model('smlpnet_t', **KWARGS).state_dict()
    return {'arch': 'smlpnet_t', 'state_dict': sd, 'state_dict_ema': sd, 'model_cfg': {'name': 'smlpnet_t',
            'kwargs': dict(KWARGS)}, 'data_cfg': dict(DATA_CFG), 'class_names': ['class0', 'class1'], 'epoch': 1}


def _save(ckpt, path: Path, change=None) -> str:
    ckpt = {k: (dict(v) if isinstance(v, dict) else v) for k, v in ckpt.items()}
    if change is not None:
        change(ckpt)
    torch.save(ckpt, path)
    return str(path)


def _validate(ckpt_path, images, *extra):
    return ['--checkpoint', ckpt_path, '--data-dir', str(images), '--split', 'val', '--workers', '0', *extra]


# ------------------------------------------------------------------------------------------------ item 4: weights
def test_check_weights_keeps_each_tensor_kind():
    own = nn.BatchNorm1d(3).state_dict()  # weight / bias / running stats float, num_batches_tracked int64
    check_weights(own, {k: v.clone() for k, v in own.items()}, 'f')  # as saved: fine
    check_weights(own, {'weight': torch.ones(3, dtype=torch.float16), 'other': torch.tensor([NAN + 0])[:0]}, 'f')
    for key, value, problem in [
        ('weight', torch.ones(3, dtype=torch.int64), 'weight holds torch.int64 values'),
        ('running_var', torch.ones(3, dtype=torch.bool), 'running_var holds torch.bool values'),
        ('num_batches_tracked', torch.tensor(3.), 'expected integer weights'),
        ('bias', torch.tensor([0., NAN, 1.]), 'bias holds 1 NaN / infinite value(s) of 3'),
        ('unknown', torch.tensor([float('inf')]), 'unknown holds 1 NaN'),  # e.g. an old name a module renames
        ('weight', [1., 2., 3.], 'weight is a list, not a tensor'),
    ]:
        with pytest.raises(UsageError, match='^f: ') as e:
            check_weights(own, {key: value}, 'f')
        assert problem in str(e.value), str(e.value)


@pytest.mark.parametrize('key, change, problem', [
    ('state_dict', lambda v: v.round().long(), 'holds torch.int64 values, but the model\'s'),
    ('state_dict', lambda v: v > 0, 'holds torch.bool values'),
    ('state_dict', lambda v: v * NAN, 'NaN / infinite value(s)'),
    ('state_dict_ema', lambda v: v * NAN, 'NaN / infinite value(s)'),
])
def test_validate_refuses_weights_of_another_kind_or_not_finite(vision_ckpt, images, tmp_path, capsys, key, change,
                                                              problem):
    path = _save(vision_ckpt, tmp_path / 'c.pth', lambda c: c.update({key: _floats(c[key], change)}))
    extra = ['--use-ema'] if key == 'state_dict_ema' else []
    msg = _fail(validate.main, _validate(path, images, *extra), capsys)
    assert msg.startswith(f'validate.py: error: checkpoint {path}: stem.weight ') and problem in msg, msg
    # a plain state dict goes through load_pretrained_weights / load_backbone: the same check
    torch.save(_floats(vision_ckpt['state_dict'], change), tmp_path / 'sd.pth')
    msg = _fail(validate.main, _validate(str(tmp_path / 'sd.pth'), images, '--model', 'smlpnet_t', '--model-kwargs',
                                         'embed_dim=8', 'depths=(1,1,1,1)', 'img_size=32', 'num_classes=2'), capsys)
    assert 'stem.weight' in msg and problem.split(',')[0] in msg, msg


@pytest.mark.parametrize('flag', ['--initial-checkpoint', '--pretrained-path'])
@pytest.mark.parametrize('weights, problem', [
    (lambda sd: {k: 1 for k in sd}, 'stem.weight is an int, not a tensor'),
    (lambda sd: {k: 'x' for k in sd}, "stem.weight is a str, not a tensor"),
    (lambda sd: _floats(sd, lambda v: v.long()), 'stem.weight holds torch.int64 values'),
    (lambda sd: _floats(sd, lambda v: v * NAN), 'stem.weight holds 384 NaN'),
])
def test_train_refuses_bad_starting_weights(vision_ckpt, images, tmp_path, capsys, flag, weights, problem):
    torch.save(weights(vision_ckpt['state_dict']), tmp_path / 'w.pth')
    msg = _fail(train.main, TINY_VISION + ['--data-dir', str(images), '--epochs', '1', '--output', str(tmp_path),
                                           flag, str(tmp_path / 'w.pth')], capsys)
    if flag == '--pretrained-path' and 'not a tensor' in problem:  # refused by the model's checkpoint filter
        assert 'does not convert to smlpnet_t' in msg and 'has no attribute' in msg, msg
    else:
        assert f'{flag} {tmp_path / "w.pth"}: {problem}' in msg, msg
    assert list(tmp_path.iterdir()) == [tmp_path / 'w.pth']  # refused before a run folder was made


def _init_from(folder: Path, tmp_path: Path) -> list:
    """The text trainer's flags that load ``folder`` (``--init-from``), with a labelled file made here."""
    data = tmp_path / 'train.tsv'
    data.write_text('sentence\tlabel\n' + 'the good film\t1\nthe bad film\t0\n' * 4)
    return ['--task', 'classify', '--train-file', str(data), '--val-file', str(data), '--init-from', str(folder),
            '--steps', '1', '--threads', '1', '--output', str(tmp_path / 'out')]


def test_text_loaders_and_visualize_refuse_nan_weights(vision_ckpt, tmp_path, capsys):
    make_official_folder(tmp_path / 'BiGS')
    sd = torch.load(tmp_path / 'BiGS' / 'pytorch_model.bin', weights_only=True)
    next(v for k, v in sd.items() if k.startswith('bigs.encoder.layer.1.') and v.is_floating_point()).view(-1)[0] = NAN
    torch.save(sd, tmp_path / 'BiGS' / 'pytorch_model.bin')
    msg = _fail(text_train.main, _init_from(tmp_path / 'BiGS', tmp_path), capsys)
    assert f'the official BiGS weights in {tmp_path / "BiGS"}' in msg and 'NaN / infinite' in msg, msg
    tok = mt.byte_tokenizer()
    model = mt.create_model('amlp_base', vocab_size=tok.vocab_size, num_hidden_layers=1, hidden_size=16,
                            intermediate_size=32, tiny_attention_size=8, max_position_embeddings=32)
    with torch.no_grad():
        model.get_input_embeddings().weight[3, 5] = float('inf')
    model.save_pretrained(str(tmp_path / 'ours'), tokenizer=tok)
    msg = _fail(text_train.main, _init_from(tmp_path / 'ours', tmp_path), capsys)
    assert 'ours/model.safetensors: ' in msg and '1 NaN / infinite value(s)' in msg, msg
    msg = _fail(visualize.main, [str(tmp_path / 'ours'), '--out', str(tmp_path / 'figs')], capsys)
    assert '1 NaN / infinite value(s)' in msg and not (tmp_path / 'figs').exists()
    path = _save(vision_ckpt, tmp_path / 'c.pth', lambda c: c.update(state_dict=_floats(c['state_dict'], torch.log)))
    msg = _fail(visualize.main, [path, '--out', str(tmp_path / 'figs')], capsys)
    assert f'checkpoint {path}: ' in msg and 'NaN / infinite' in msg and not (tmp_path / 'figs').exists()


# ------------------------------------------------------------------------------------------------ resume
@pytest.fixture(scope='module')
def text_run(text_file, tmp_path_factory):
    """A text run stopped after 2 of 4 updates (resumable): its checkpoint-2/ folder."""
    out = tmp_path_factory.mktemp('text_runs')
    text_train.main(TINY_GPT + ['--train-file', text_file, '--steps', '4', '--eval-interval', '2', '--output',
                                str(out), '--experiment', 'r', '--stop-after-step', '2'])
    return out / 'r' / 'checkpoint-2'


def test_text_resume_refuses_weights_that_are_not_finite(text_run, text_file, tmp_path, capsys):
    crafted = tmp_path / 'run' / 'checkpoint-2'
    shutil.copytree(text_run, crafted)
    weights = load_file(str(crafted / 'model.safetensors'))
    save_file({k: v * NAN if v.is_floating_point() else v for k, v in weights.items()},
              str(crafted / 'model.safetensors'), metadata={'format': 'pt'})
    msg = _fail(text_train.main, TINY_GPT + ['--train-file', text_file, '--steps', '4', '--resume', str(crafted)],
                capsys)
    assert 'NaN / infinite value(s)' in msg and 'model.safetensors' in msg, msg
    assert sorted(p.name for p in crafted.parent.iterdir()) == ['checkpoint-2']  # nothing written


_crafted = crafted_checkpoint


def test_a_checked_rng_state_takes_what_get_rng_state_gives_and_refuses_damage():
    state = get_rng_state()
    drawn = (random.random(), np.random.rand(), torch.rand(3))
    set_rng_state(state, check=True)
    assert random.random() != drawn[0] and np.random.rand() != drawn[1] and not torch.equal(torch.rand(3), drawn[2])
    py_version, py_words, _ = state['python']
    for part, damaged in [
            ('torch', {**state, 'torch': state['torch'][:-1]}),
            ('Python', {**state, 'python': (py_version, py_words[:-1] + (625,), None)}),  # a position past the words
            ('Python', {**state, 'python': (py_version, py_words, 'not a gauss')}),  # random.setstate takes it
            ('numpy', {**state, 'numpy': {**state['numpy'], 'pos': 10 ** 6}}),  # numpy takes it, then reads past
            ('numpy', {**state, 'numpy': {**state['numpy'], 'keys': state['numpy']['keys'][:-1]}}),
            ('CUDA', {**state, 'cuda': ['not a generator state']})]:
        with pytest.raises(ValueError, match=f'its {part} random-number state is not one this trainer writes'):
            set_rng_state(damaged, check=True)
    set_rng_state(state)  # for real: the streams from the saved state again
    assert (random.random(), np.random.rand()) == drawn[:2] and torch.equal(torch.rand(3), drawn[2])


# ------------------------------------------------------------------------------------------------ item 6: validate
@pytest.mark.parametrize('change, problem', [
    (lambda c: c.update(model_cfg=[1, 2]), 'its model_cfg is [1, 2], not a {name, kwargs'),
    (lambda c: c['model_cfg'].update(kwargs=[1, 2]), 'its model_cfg is'),
    (lambda c: c['model_cfg'].update(kwargs={1: 2}), 'its model_cfg is'),
    (lambda c: c.update(arch=5), 'its arch is 5, not a model name'),
    (lambda c: c.update(arch=['smlpnet_t']), "its arch is ['smlpnet_t'], not a model name"),
    (lambda c: c.update(class_names={'class0': 0}), "its class_names is {'class0': 0}, not a list of distinct"),
    (lambda c: c.update(class_names=[0, 1]), 'its class_names is [0, 1]'),
    (lambda c: c.update(class_names='ab'), "its class_names is 'ab'"),
    (lambda c: c.update(class_names=['class0', 'class0']), 'not a list of distinct class names'),
    (lambda c: c.update(class_names=['class0', 'class1', 'class2']), 'its class_names list 3 classes, but its '
                                                                     'model has 2 outputs'),
    (lambda c: c.update(data_cfg=[1]), 'its data_cfg is [1], not a dict'),
    (lambda c: c['data_cfg'].update(input_size=[0, 0, 0]), 'its data_cfg input_size is [0, 0, 0]; expected (3, H, W)'),
    (lambda c: c['data_cfg'].update(input_size=[3, 32]), 'input_size is [3, 32]'),
    (lambda c: c['data_cfg'].update(input_size=[3, 10 ** 6, 32]), 'H, W in [1, 8192]'),
    (lambda c: c['data_cfg'].update(std=[0, 0, 0]), 'its data_cfg std must be a positive number, got 0'),
    (lambda c: c['data_cfg'].update(mean=[NAN] * 3), 'its data_cfg mean must be a finite number, got nan'),
    (lambda c: c['data_cfg'].update(mean='abc'), "its data_cfg mean is 'abc'; expected 1 or 3 numbers"),
    (lambda c: c['data_cfg'].update(crop_pct=5.), 'its data_cfg crop_pct must be in (0, 1], got 5.0'),
    (lambda c: c['data_cfg'].update(interpolation='banana'), "its data_cfg interpolation is 'banana'; expected one"),
    (lambda c: c['data_cfg'].update(crop_mode='banana'), "its data_cfg crop_mode is 'banana'"),
])
def test_validate_checks_the_checkpoints_fields(vision_ckpt, images, tmp_path, capsys, change, problem):
    path = _save(vision_ckpt, tmp_path / 'c.pth', change)
    msg = _fail(validate.main, _validate(path, images), capsys)
    assert msg.startswith(f'validate.py: error: checkpoint {path}: ') and problem in msg, msg


def test_validate_accepts_the_checkpoints_fields(vision_ckpt, images, tmp_path):
    results = validate.main(_validate(_save(vision_ckpt, tmp_path / 'c.pth'), images))
    assert results['samples'] == 8 and results['crop_pct'] == 0.9 and results['interpolation'] == 'bicubic'


# ------------------------------------------------------------------------------------------------ item 6: commands
def _command_boundary(error: BaseException):
    def main(argv):
        raise error
    return main


@pytest.mark.parametrize('error, status, line', [
    (MemoryError(), 1, 'x: error: out of memory (MemoryError: ); reduce the batch size (-b)'),
    (torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB'), 1, 'out of memory (OutOfMemoryError: '
                                                                                  'CUDA out of memory.'),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried to "
                  "allocate 10000000000000 bytes."), 1, "out of memory (RuntimeError: [enforce fail"),
    (RecursionError('maximum recursion depth exceeded'), 2, 'an input is nested too deeply to read'),
    (UnicodeDecodeError('utf-8', b'\xff', 0, 1, 'invalid start byte'), 2, 'an input file is not UTF-8 text'),
])
def test_run_cli_turns_boundary_failures_into_one_line(capsys, error, status, line):
    msg = _fail(lambda argv: run_cli('x', _command_boundary(error), argv), [], capsys, status=status)
    assert line in msg, msg
    with pytest.raises(type(error)):  # --debug: the traceback
        run_cli('x', _command_boundary(error), ['--debug'])
    with pytest.raises(ValueError):  # any other error is still a traceback (a bug to see, not to hide)
        run_cli('x', _command_boundary(ValueError('a bug')), [])


def test_a_tokenizer_panic_is_one_line(tmp_path, capsys):
    """A tokenizer.json whose BPE continuing-subword prefix is longer than its pieces makes ``tokenizers`` panic
    (``pyo3_runtime.PanicException``, a BaseException) while loading: --init-from ends with one line naming the file,
    status 2 (issue 33; it was run_cli's line without the file)."""
    tok = mt.train_tokenizer(texts=['the movie was good', 'the film was bad'] * 20, kind='bpe', vocab_size=300)
    model = mt.create_model('amlp_base', vocab_size=tok.vocab_size, num_hidden_layers=1, hidden_size=16,
                            intermediate_size=32, tiny_attention_size=8, max_position_embeddings=32)
    model.save_pretrained(str(tmp_path / 'm'), tokenizer=tok)
    spec = json.loads((tmp_path / 'm' / 'tokenizer.json').read_text())
    spec['model']['continuing_subword_prefix'] = 'abcdefgh'
    (tmp_path / 'm' / 'tokenizer.json').write_text(json.dumps(spec))
    msg = _fail(text_train.main, _init_from(tmp_path / 'm', tmp_path), capsys)
    assert f'{tmp_path / "m" / "tokenizer.json"} is not a tokenizer file this package reads (PanicException: range ' \
           f'end index' in msg, msg


def test_text_bad_argv_and_config_files(tmp_path, capsys):
    make_official_folder(tmp_path / 'BiGS')
    argv = _init_from(tmp_path / 'BiGS', tmp_path)
    msg = _fail(text_train.main, argv + ['--experiment', 'the \udcff run'], capsys)  # argv byte 0xff (PEP 383)
    assert "'the \\xff run' is not UTF-8 text (character 4)" in msg, msg  # the parser's check of every word
    config = tmp_path / 'BiGS' / 'config.json'
    config.write_text('[' * 100_000 + ']' * 100_000)
    assert f'{config} is nested too deeply to be a config' in _fail(text_train.main, argv, capsys)
    config.write_text('{"a": "' + 'x' * (17 * 2 ** 20) + '"}')
    msg = _fail(text_train.main, argv, capsys)
    assert f'{config} is 17,825,801 bytes, more than the 16,777,216 a JSON config can need' in msg, msg
    config.write_bytes(b'\xff\xfe{}')
    assert f'{config} is not UTF-8 text' in _fail(text_train.main, argv, capsys)
    config.write_text('[1, 2]')
    assert 'holds a JSON list, not a config object' in _fail(text_train.main, argv, capsys)


def test_text_trainer_bounds_and_fields(text_file, tmp_path, capsys):
    base = TINY_GPT + ['--train-file', text_file, '--steps', '2', '--output', str(tmp_path)]
    msg = _fail(text_train.main, base + ['-b', '1000000000'], capsys)
    assert '--batch-size must be in [1, 65536] (samples per micro-batch per process' in msg, msg
    assert "argument -b/--batch-size: invalid int value: '1e9'" in _fail(text_train.main, base + ['-b', '1e9'], capsys)
    msg = _fail(text_train.main, base + ['--tokenizer', 'wordpiece', '--vocab-size', '1000000000'], capsys)
    assert '--vocab-size must be <= 1048576' in msg, msg  # before tokenizers' trainer aborts the process
    tsv = tmp_path / 'train.tsv'
    tsv.write_text('sentence\tlabel\n' + 'a b\t0\n' * 5 + 'x' * 140_000 + '\t1\n' + 'b a\t1\n' * 5)
    msg = _fail(text_train.main, ['--task', 'classify', '--model', 'gmlp_base', '--train-file', str(tsv),
                                  '--tokenizer', 'char', '--output', str(tmp_path)], capsys)
    assert f"--train-file '{tsv}' line 7: field larger than field limit (131072)" in msg, msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ['train.tsv']


def test_train_yaml_that_is_binary_or_nested_is_one_line(tmp_path, capsys):
    base = TINY_VISION + ['--data-dir', str(tmp_path), '--output', str(tmp_path)]
    (tmp_path / 'binary.yaml').write_bytes(b'\xff\xfe\x00binary\x80')
    msg = _fail(train.main, base + ['-c', str(tmp_path / 'binary.yaml')], capsys)
    assert 'binary.yaml' in msg, msg  # the strict yaml reader names it (these bytes decode as UTF-16: not a mapping)
    (tmp_path / 'nested.yaml').write_text('[' * 100_000 + ']' * 100_000)
    assert 'nested too deeply' in _fail(train.main, base + ['-c', str(tmp_path / 'nested.yaml')], capsys)


def test_visualize_and_benchmark_one_line_cases(tmp_path, capsys):
    text = mt.create_model('bigs_small', num_hidden_layers=1, hidden_size=16, intermediate_size=32,
                           max_position_embeddings=16)
    text.save_pretrained(str(tmp_path / 'saved'))
    out = ['--out', str(tmp_path / 'figs')]
    msg = _fail(visualize.main, [str(tmp_path / 'saved'), '--model-kwargs', 'bogus=1'] + out, capsys)
    assert "--model-kwargs {'bogus': 1} do not apply to the model in" in msg and 'bogus' in msg, msg
    msg = _fail(visualize.main, [str(tmp_path / 'saved'), '--model-kwargs', 'hidden_dropout_prob=abc'] + out, capsys)
    assert 'hidden_dropout_prob must be a float' in msg, msg
    msg = _fail(visualize.main, ['bigs_small', '--pretrained'] + out, capsys)
    assert "'bigs_small' is none (text models have none" in msg, msg
    msg = _fail(visualize.main, [str(tmp_path / 'saved'), '--model', 'gmlp_s'] + out, capsys)
    assert '--model names the model of a weights file' in msg and 'is a folder' in msg, msg
    assert not (tmp_path / 'figs').exists()
    msg = _fail(benchmark.main, ['--model', 'smlpnet_t', '--img-size', '1', '--no-ceiling', '--no-memory',
                                 '--threads', '1'], capsys)
    assert 'cannot build smlpnet_t with' in msg and 'divisible by 32' in msg, msg


def test_image_resume_refuses_nan_ema_weights(images, tmp_path, capsys):
    """train.py --resume loads state_dict_ema through the same check (after the weights, once the EMA is built)."""
    train.main(TINY_VISION + ['--data-dir', str(images), '--val-split', 'val', '--epochs', '1', '--model-ema',
                              '--output', str(tmp_path), '--experiment', 'ema'])
    crafted = _crafted(tmp_path / 'ema' / 'last.pth', tmp_path / 'crafted',
                       lambda c: c.update(state_dict_ema=_floats(c['state_dict_ema'], lambda v: v * NAN)))
    msg = _fail(train.main, ['--resume', str(crafted), '--epochs', '2'], capsys)
    assert f'--resume {crafted} (EMA): stem.weight holds 384 NaN / infinite value(s)' in msg, msg
    assert sorted(p.name for p in crafted.parent.iterdir()) == ['last.pth']  # refused before the folder is written
