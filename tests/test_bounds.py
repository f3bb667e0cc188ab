""" Bounded before trusted, said not skipped (issue 33, items 3 and 5): every size or value read from a file passes a
bound before anything is allocated, and data a reader leaves out is reported.

Each test makes the hostile or odd input for real in ``tmp_path`` (a yaml alias bomb, a FIFO named ``*.png``, a
``config.json`` of 100,000 wide layers, ...) and asserts the one line the user gets.
"""
import json
import logging
import os
import re
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mlp_vision.arguments import check_range
from mlp_vision.bounds import check_model_size
from mlp_vision.errors import UsageError, short_repr
from mlp_vision.arguments import load_yaml_config, read_yaml_file  # noqa: E402


# ------------------------------------------------------------------------------------------------ yaml files
def _yaml(tmp_path, text, name='c.yaml'):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def test_yaml_alias_bomb_is_refused_at_its_line(tmp_path):
    # the billion-laughs form: 9 levels of 9 aliases each would be 9**9 strings once expanded
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i, name in enumerate('bcdefghi'):
        prev = 'abcdefghi'[i]
        lines.append(f'{name}: &{name} [{",".join(["*" + prev] * 9)}]')
    path = _yaml(tmp_path, '\n'.join(['model_kwargs:'] + ['  ' + line for line in lines]) + '\n')
    assert os.path.getsize(path) < 1024
    with pytest.raises(UsageError, match=r"c\.yaml' line 3: an alias \(\*name\) is not accepted"):
        read_yaml_file(path)


def test_yaml_duplicate_keys_are_an_error(tmp_path):
    with pytest.raises(UsageError, match=r"line 3: duplicate key 'lr' \(first at line 1\); expected each key once"):
        read_yaml_file(_yaml(tmp_path, 'lr: 0.1\nepochs: 3\nlr: 0.2\n'))
    with pytest.raises(UsageError, match=r"line 2: duplicate key 'depth'"):  # inside a nested mapping too
        read_yaml_file(_yaml(tmp_path, 'model_kwargs: {depth: 1,\n  depth: 2}\n'))
    # an inline merge may be overridden (yaml's rule), and an anchor without an alias is harmless
    assert read_yaml_file(_yaml(tmp_path, 'm: {<<: {a: 1, b: 2}, a: 3}\nx: &x 4\n')) == {'m': {'a': 3, 'b': 2}, 'x': 4}


def test_yaml_binary_deep_huge_and_not_regular_files_are_one_line(tmp_path):
    with pytest.raises(UsageError, match=r"bin\.yaml' is not yaml text \(.*\); expected a UTF-8 yaml file"):
        read_yaml_file(_yaml(tmp_path, bytes(range(256)) * 4, 'bin.yaml'))
    deep = 'a: ' + '[' * 5000 + ']' * 5000 + '\n'
    with pytest.raises(UsageError, match='is nested too deeply to be a settings file'):
        read_yaml_file(_yaml(tmp_path, deep))
    with pytest.raises(UsageError, match='is not valid yaml: Exceeds the limit'):
        read_yaml_file(_yaml(tmp_path, 'seed: ' + '9' * 5000 + '\n'))
    with pytest.raises(UsageError, match=r'bytes; expected a yaml file of settings \(at most 1048576 bytes\)'):
        read_yaml_file(_yaml(tmp_path, '#' * (1 << 20) + '\n'))
    os.mkfifo(tmp_path / 'fifo.yaml')  # would block in open() until a writer came
    with pytest.raises(UsageError, match="fifo.yaml' is not a regular file"):
        read_yaml_file(str(tmp_path / 'fifo.yaml'))


def test_config_errors_show_a_bounded_value(tmp_path):
    """A value of the wrong type is echoed in at most a couple hundred characters, however large it is."""
    import mlp_vision.train as train
    path = _yaml(tmp_path, 'epochs: [' + ', '.join(['[' + ', '.join(['123456789'] * 200) + ']'] * 200) + ']\n')
    with pytest.raises(UsageError) as e:
        load_yaml_config(path, train.build_parser())
    assert 'epochs must be an integer (as --epochs), got [[123456789' in str(e.value) and len(str(e.value)) < 400
    with pytest.raises(UsageError, match=r'lr must be a number \(as --lr\), got <an integer of about 401 digits>'):
        load_yaml_config(_yaml(tmp_path, 'lr: 1' + '0' * 400 + '\n'), train.build_parser())  # float() overflows


def test_short_repr_is_bounded_in_length_and_work():
    value = {'a': [[0] * 10 ** 6] * 10 ** 3, 'b': 'x' * 10 ** 6}
    text = short_repr(value)
    assert len(text) <= 200 and text.startswith("{'a': [[0, 0")
    assert short_repr(10 ** 5000) == '<an integer of about 5001 digits>'  # str() of it raises ValueError
    assert short_repr('abc') == "'abc'" and short_repr(1.5) == '1.5' and short_repr(-7) == '-7'
    with pytest.raises(UsageError, match=r'--x must be <= 0, got <an integer of about 5001 digits>'):
        check_range('--x', 10 ** 5000, high=0)


# ------------------------------------------------------------------------------------------------ model sizes
def test_check_model_size_stops_the_meta_build_early():
    built = []

    def build():
        layers = torch.nn.ModuleList()
        for _ in range(100_000):
            layers.append(torch.nn.Linear(4096, 4096, device='meta'))
            built.append(1)
        return layers

    with pytest.raises(UsageError, match=r'stack would have more than 2e\+09 parameters \(the bound of '
                                         r'mlp_vision.bounds.MAX_PARAMS, 8 GB of float32 weights\)'):
        check_model_size(build, 'stack')
    assert len(built) < 200  # refused after ~120 layers, not after building 100,000
    assert check_model_size(lambda: torch.nn.Linear(3, 2, device='meta'), 'small') == 8
    assert check_model_size(lambda: None, 'not buildable on meta') is None


def test_checkpoint_model_cfg_sizes_are_bounded_before_building(tmp_path, capsys):
    """A checkpoint whose model_cfg says embed_dim 4096 and 1,000 blocks (or 100,000 narrow ones): one line from
    validate, in about a second, no gigabytes allocated."""
    import mlp_vision.validate as validate
    path = tmp_path / 'evil.pth'
    for kwargs, line in (({'embed_dim': 4096, 'num_blocks': 1_000},
                          f"model gmlp_ti with {{'embed_dim': 4096, 'num_blocks': 1000}} (from checkpoint {path}'s "
                          f"model_cfg) would have more than 2e+09 parameters"),
                         ({'embed_dim': 8, 'num_blocks': 100_000}, 'num_blocks=100000 asks for 100,000 blocks')):
        torch.save({'arch': 'gmlp_ti', 'state_dict': {}, 'epoch': 0,
                    'model_cfg': {'name': 'gmlp_ti', 'kwargs': kwargs}}, path)
        with pytest.raises(SystemExit) as e:
            validate.main(['--checkpoint', str(path), '--data-dir', str(tmp_path)])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        assert line in err


def test_command_line_model_sizes_are_bounded_too():
    from mlp_vision.image_model import create_model
    with pytest.raises(UsageError, match=r"model mixer_s16 with \{'embed_dim': 65536\} would have more than"):
        create_model('mixer_s16', embed_dim=65536)
    assert create_model('mixer_s16', num_classes=3, embed_dim=8, num_blocks=1, img_size=32).num_classes == 3


@pytest.mark.parametrize('name, kwargs, what', [
    ('smlpnet_t', dict(depths=(100_000, 1, 1, 1)), r'depths=\(100000, 1, 1, 1\) asks for 100,003 blocks'),
    ('gmlp_ti', dict(num_blocks=100_000), 'num_blocks=100000 asks for 100,000 blocks'),
    ('mixer_s16', dict(num_blocks=1_001), 'num_blocks=1001 asks for 1,001 blocks')])
def test_deep_narrow_models_are_refused_before_any_block_is_built(name, kwargs, what):
    """Narrow enough to pass the parameter bound, deep enough that building it (even on meta) took minutes: the
    block count is bounded from the configuration by every path that builds the model -- timm's create_model (the
    library, local-dir: folders, benchmark.py) and the commands' create_model."""
    import timm
    from mlp_vision.bounds import size_bounds
    from mlp_vision.image_model import create_model
    kwargs = dict(kwargs, embed_dim=8) if name != 'smlpnet_t' else dict(kwargs, embed_dim=4)
    line = what + r', more than the bound of 1,000 \(mlp_vision.bounds.MAX_BLOCKS.* --max-blocks'
    registered = []
    hook = torch.nn.modules.module.register_module_module_registration_hook(
        lambda module, child_name, child: registered.append(child_name))
    try:
        for build in (lambda: timm.create_model(name, **kwargs), lambda: create_model(name, **kwargs)):
            with pytest.raises(UsageError, match=line):
                build()
    finally:
        hook.remove()
    assert registered == []  # refused in the constructor's argument checks, before any submodule exists
    if name == 'mixer_s16':  # the opt-in: a bound raised for the block only
        with size_bounds(max_blocks=1_001):
            assert len(timm.create_model(name, device='meta', **kwargs).blocks) == 1_001


def test_text_config_json_sizes_are_bounded_before_building(tmp_path):
    import mlp_vision.text as mt
    from mlp_vision.text.tokenizer import byte_tokenizer
    tokenizer = byte_tokenizer()
    mt.create_model('gmlp_causal_char', vocab_size=tokenizer.vocab_size, hidden_size=8, num_hidden_layers=1,
                    max_position_embeddings=8).save_pretrained(str(tmp_path), tokenizer=tokenizer)
    payload = json.loads((tmp_path / 'config.json').read_text())
    payload.update(hidden_size=4096, num_hidden_layers=1_000)  # transformers' flat config.json
    (tmp_path / 'config.json').write_text(json.dumps(payload))
    with pytest.raises(UsageError, match=r"config\.json: GMLPForCausalLM with \{'hidden_size': 4096, .*"
                                         r"'num_hidden_layers': 1000, .*\} would have more than 2e\+09 parameters"):
        mt.from_pretrained(str(tmp_path))
    # deep and narrow: within the parameter bound, refused from the config before any layer is built
    payload.update(hidden_size=8, num_hidden_layers=100_000)
    (tmp_path / 'config.json').write_text(json.dumps(payload))
    line = r'GMLPConfig.num_hidden_layers=100000 asks for 100,000 blocks, more than the bound of 1,000'
    for load in (lambda: mt.from_pretrained(str(tmp_path)),
                 lambda: mt.create_model('gmlp_causal_char', hidden_size=8, num_hidden_layers=100_000)):
        with pytest.raises(UsageError, match=line):
            load()


# ------------------------------------------------------------------------------------------------ activation size
def test_activation_estimate_counts_leaf_outputs_on_meta():
    """Training: every leaf's output (autograd keeps them); evaluation: the largest leaf input + output pair."""
    from mlp_vision.bounds import check_activation_size
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to('meta')
    x = torch.empty(16, 4, device='meta')
    assert check_activation_size(lambda: model, [x], True, 'm') == 4 * 16 * (8 + 8 + 2)
    assert check_activation_size(lambda: model, [x], False, 'm') == 4 * 16 * (8 + 8)  # the ReLU's in + out
    assert model.training  # the caller's mode is kept


def test_activation_check_stops_the_meta_forward_early():
    from mlp_vision.bounds import check_activation_size
    ran = []

    class Counted(torch.nn.Linear):
        def forward(self, x):
            ran.append(1)
            return super().forward(x)

    build = lambda: torch.nn.Sequential(*[Counted(1024, 1024, device='meta') for _ in range(2000)])  # noqa: E731
    batch = [torch.empty(2 ** 20, 1024, device='meta')]  # 4 GiB per layer output
    with pytest.raises(UsageError, match=r'^stack, batch 2\*\*20 would hold more than 256 GiB of activations in a '
                                         r'training step \(estimated on the meta device: at least 260 GiB; the bound '
                                         r'is --max-activation-gib'):
        check_activation_size(build, batch, True, 'stack, batch 2**20')
    assert len(ran) == 65  # refused at the 65th layer's output, not after 2,000
    assert check_activation_size(build, [torch.empty(2, 1024, device='meta')], False, 'small') == 2 * 2 * 1024 * 4
    assert check_activation_size(lambda: None, batch, True, 'not buildable on meta') is None


def test_checkpoint_input_size_is_bounded_before_the_first_batch(tmp_path, capsys):
    """A checkpoint whose data_cfg says 8192 px (the most validate accepts): its first batch of 128 would hold 384
    GiB; validate stops with one line before the model sees it."""
    import timm
    import mlp_vision.validate as validate
    from _helpers import exits_with_one_line
    _png(tmp_path / 'data' / 'a' / '0.png')
    path = tmp_path / 'big.pth'
    weights = timm.create_model('test_convnext', num_classes=1).state_dict()
    torch.save({'arch': 'test_convnext', 'state_dict': weights, 'epoch': 0,
                'data_cfg': {'input_size': [3, 8192, 8192]},
                'model_cfg': {'name': 'test_convnext', 'kwargs': {'num_classes': 1}}}, path)
    msg = exits_with_one_line(validate.main, ['--checkpoint', str(path), '--data-dir', str(tmp_path / 'data'),
                                              '-b', '128', '--threads', '1'], capsys)
    assert (f"model test_convnext with {{'num_classes': 1}} at input (3, 8192, 8192), batch 128 (sizes from "
            f"checkpoint {path}'s model_cfg / data_cfg) would hold more than 256 GiB of activations in one forward "
            f"(estimated on the meta device: at least 384 GiB;") in msg


def test_text_trainer_batch_is_bounded_before_the_first_step(tmp_path, capsys):
    import mlp_vision.train_text as text_train
    from _helpers import exits_with_one_line
    (tmp_path / 'a.txt').write_text('to be or not to be\n' * 50)
    argv = ['--task', 'causal', '--model', 'gmlp_causal_char', '--model-kwargs', 'num_hidden_layers=1',
            'hidden_size=256', 'max_position_embeddings=1024', '--threads', '1', '--steps', '1', '-b', '65536',
            '--train-file', str(tmp_path / 'a.txt'), '--output', str(tmp_path / 'out')]
    msg = exits_with_one_line(text_train.main, argv, capsys)
    assert "--model gmlp_causal_char: GMLPForCausalLM with {" in msg
    assert 'batch 65536 x 1024 tokens would hold more than 256 GiB of activations in a training step' in msg


# ------------------------------------------------------------------------------------------------ bound flags
def test_size_bounds_set_the_flags_for_the_block_only():
    import threading
    import mlp_vision.bounds as bounds
    from mlp_vision.arguments import ArgumentParser
    parser = ArgumentParser()
    bounds.add_bound_arguments(parser)
    defaults = (2_000_000_000, 256 * 2 ** 30, 1_000)
    seen_by_other_thread = []
    with bounds.size_bounds(parser.parse_args(['--max-params', '5e9', '--max-activation-gib', '0.5'])):
        assert bounds.current_bounds() == (5_000_000_000, 2 ** 29, 1_000)
        with bounds.size_bounds(max_params=10):  # nested: the other bounds are the block's around it
            assert bounds.current_bounds() == (10, 2 ** 29, 1_000)
        assert bounds.current_bounds() == (5_000_000_000, 2 ** 29, 1_000)
        other = threading.Thread(target=lambda: seen_by_other_thread.append(bounds.current_bounds()))
        other.start()
        other.join()
        # the module's constants are never rewritten: a command's flags are its block's only
        assert (bounds.MAX_PARAMS, bounds.MAX_ACTIVATION_BYTES, bounds.MAX_BLOCKS) == defaults
    assert seen_by_other_thread == [defaults]
    assert bounds.current_bounds() == defaults
    for argv, line in ((['--max-params', '0.5'], r'^--max-params must be >= 1 \(a parameter count\), got 0.5$'),
                       (['--max-activation-gib', '1e300'],  # no OverflowError: a bound no machine reaches is refused
                        r'^--max-activation-gib must be in \(0, 1073741824\] \(GiB of activations\), got 1e\+300$')):
        with pytest.raises(UsageError, match=line):
            with bounds.size_bounds(parser.parse_args(argv)):
                pass
    with bounds.size_bounds(max_params=8):  # the bound the checks use
        with pytest.raises(UsageError, match='would have more than 8 parameters'):
            check_model_size(lambda: torch.nn.Linear(3, 3, device='meta'), 'linear 3x3')


@pytest.mark.parametrize('flag, line', [
    (['--max-params', '1000'], r"model mixer_s16 with \{.*\} would have more than 1e\+03 parameters"),
    (['--max-activation-gib', '1e-6'], r"model mixer_s16 with \{.*\} at input \(3, 32, 32\), batch 2 would hold "
                                       r"more than 9.99e-07 GiB of activations in one forward"),
])
def test_validate_bound_flags_reach_the_checks(flag, line, tmp_path, capsys):
    """Lowering a bound from the command line refuses a small model: the flag is what the check reads."""
    import mlp_vision.validate as validate
    from _helpers import exits_with_one_line
    _png(tmp_path / 'a' / '0.png')
    argv = ['--model', 'mixer_s16', '--model-kwargs', 'embed_dim=8', 'num_blocks=1', 'img_size=32',
            '--num-classes', '1', '--data-dir', str(tmp_path), '-b', '2', '--threads', '1'] + flag
    assert re.search(line, exits_with_one_line(validate.main, argv, capsys))


# ------------------------------------------------------------------------------------------------ image folders
def _png(path, colour=(200, 40, 40)):
    from PIL import Image
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new('RGB', (8, 8), colour).save(path)


def test_fifo_named_like_an_image_is_skipped_with_a_warning(tmp_path, caplog):
    """A FIFO named x.png would block the loader in open() forever: it is not read, and the warning says so."""
    from mlp_vision.image_data import ImageFileReader
    for c in ('a', 'b'):
        _png(tmp_path / c / '0.png')
    os.mkfifo(tmp_path / 'a' / 'pipe.png')
    os.symlink(tmp_path / 'a' / 'missing.png', tmp_path / 'b' / 'dangling.png')
    with caplog.at_level(logging.WARNING):
        reader = ImageFileReader(str(tmp_path))
    assert [p for p, _ in reader.samples] == ['a/0.png', 'b/0.png']
    assert (f'{tmp_path}: skipped 2 entries named like images that are not regular files (FIFOs, devices, sockets '
            f'or broken links; e.g. a/pipe.png): only regular files are read as images') in caplog.text


def test_images_of_other_formats_are_counted_in_a_warning(tmp_path, caplog):
    """timm's extensions decide what is read (.png .jpg .jpeg); .bmp, .gif and a multi-page .tiff are not dropped
    silently: one warning counts them by extension."""
    from PIL import Image
    from mlp_vision.image_data import ImageFileReader
    for c in ('a', 'b'):
        _png(tmp_path / c / '0.png')
    Image.new('RGB', (8, 8)).save(tmp_path / 'a' / '1.bmp')
    Image.new('RGB', (8, 8)).save(tmp_path / 'b' / '1.bmp')
    Image.new('P', (8, 8)).save(tmp_path / 'b' / '2.gif')
    pages = [Image.new('L', (8, 8), v) for v in (0, 255)]
    pages[0].save(tmp_path / 'b' / '3.tiff', save_all=True, append_images=pages[1:])
    (tmp_path / 'a' / 'notes.txt').write_text('not an image format: not counted')
    with caplog.at_level(logging.WARNING):
        reader = ImageFileReader(str(tmp_path))
    assert len(reader) == 2
    assert (f'{tmp_path}: left out 4 image files of other formats (2 .bmp, 1 .gif, 1 .tiff): only .jpeg .jpg .png '
            f'files are read') in caplog.text
    assert '.gif/.tiff files with several frames are then read by their first frame only' in caplog.text
    assert 'notes' not in caplog.text


def test_images_of_other_formats_in_a_tar_are_counted_too(tmp_path, caplog):
    import tarfile
    from mlp_vision.image_data import ImageFileReader
    for c in ('a', 'b'):
        _png(tmp_path / 'src' / c / '0.png')
    (tmp_path / 'src' / 'a' / '1.bmp').write_bytes(b'BM')
    with tarfile.open(tmp_path / 'train.tar', 'w') as tf:
        tf.add(tmp_path / 'src' / 'a', arcname='a')
        tf.add(tmp_path / 'src' / 'b', arcname='b')
    with caplog.at_level(logging.WARNING):
        reader = ImageFileReader(str(tmp_path / 'train.tar'))
    assert len(reader) == 2
    assert f'image tar {tmp_path / "train.tar"}: left out 1 image files of other formats (1 .bmp)' in caplog.text


# ------------------------------------------------------------------------------------------------ tokenizer files
def _with_regex_pre_tokenizer(folder):
    path = folder / 'tokenizer.json'
    payload = json.loads(path.read_text())
    payload['pre_tokenizer'] = {'type': 'Sequence', 'pretokenizers': [
        {'type': 'Split', 'pattern': {'Regex': '(a+)+$'}, 'behavior': 'Isolated', 'invert': False},
        payload['pre_tokenizer']]}
    path.write_text(json.dumps(payload))
    return path


@pytest.mark.parametrize('kind', ['wordpiece', 'bpe'])
def test_tokenizer_file_with_a_regex_is_refused_unless_allowed(kind, tmp_path):
    from mlp_vision.text.tokenizer import find_tokenizer, load_tokenizer, train_tokenizer
    texts = ['the cat sat on the mat', 'a dog ate the bone'] * 20
    ours = train_tokenizer(texts=texts, kind=kind, vocab_size=300)
    ours.save_pretrained(str(tmp_path))
    assert load_tokenizer(str(tmp_path)).encode('the cat') == ours.encode('the cat')  # ours keep loading
    path = _with_regex_pre_tokenizer(tmp_path)
    line = (f"{path}: pre_tokenizer.pretokenizers[0].pattern is the regular expression '(a+)+$', refused: a crafted "
            f"pattern takes minutes per text")
    for load in (lambda: find_tokenizer(str(tmp_path)), lambda: find_tokenizer(str(path))):
        with pytest.raises(UsageError) as e:
            load()
        assert str(e.value).startswith(line) and 'allow_regex=True' in str(e.value)
    trusted = load_tokenizer(str(tmp_path), allow_regex=True)
    assert len(trusted) == len(ours)



def test_allow_regex_flag_is_the_command_line_opt_in(tmp_path, capsys):
    """--init-from a folder whose tokenizer.json has a regex: refused with one line naming the flag; with
    allow_regex=True the folder loads and fills masks."""
    import mlp_vision.text as mt
    import mlp_vision.train_text as text_train
    from transformers import pipeline
    from mlp_vision.text.tokenizer import train_tokenizer
    from _helpers import exits_with_one_line
    tok = train_tokenizer(texts=['the cat sat on the mat', 'a dog ate the bone'] * 20, kind='wordpiece',
                          vocab_size=300)
    mt.create_model('gmlp_base', vocab_size=tok.vocab_size, num_hidden_layers=1, hidden_size=16,
                    intermediate_size=32, max_position_embeddings=16).save_pretrained(str(tmp_path), tokenizer=tok)
    path = _with_regex_pre_tokenizer(tmp_path)
    data = tmp_path / 'train.tsv'
    data.write_text('sentence\tlabel\n' + 'the cat sat\t1\na dog ate\t0\n' * 4)
    msg = exits_with_one_line(text_train.main, [
        '--task', 'classify', '--train-file', str(data), '--val-file', str(data), '--init-from', str(tmp_path),
        '--steps', '1', '--threads', '1', '--output', str(tmp_path / 'out')], capsys)
    assert f"{path}: pre_tokenizer.pretokenizers[0].pattern is the regular expression '(a+)+$', refused" in msg
    assert '--allow-regex' in msg
    model = mt.from_pretrained(str(tmp_path), allow_regex=True)
    assert len(pipeline('fill-mask', model=model, tokenizer=model.tokenizer)('the [MASK] sat', top_k=2)) == 2


# ------------------------------------------------------------------------------------------------ text data
WORDS = 'to be or not that is the question whether tis nobler in mind suffer slings arrows'.split()


@pytest.fixture(scope='module')
def english_wordpiece():
    import random
    from mlp_vision.text.tokenizer import train_tokenizer
    rng = random.Random(0)
    texts = [' '.join(rng.choice(WORDS) for _ in range(8)) for _ in range(200)]
    return train_tokenizer(texts=texts, kind='wordpiece', vocab_size=200)


def test_tsv_column_named_twice_is_an_error(tmp_path):
    from mlp_vision.text.labelled_data import read_labelled_file
    path = tmp_path / 'train.tsv'
    path.write_text('sentence\tlabel\tsentence\nto be\t1\tor not\nthat is\t0\tthe question\n')
    with pytest.raises(UsageError, match=r"train\.tsv' names the column 'sentence' 2 times in its header \(tab-"
                                         r"separated: \['sentence', 'label', 'sentence'\]\); expected each column "
                                         r"named once"):
        read_labelled_file(str(path))


def test_tsv_header_repeated_inside_the_file_is_an_error(tmp_path):
    from mlp_vision.text.labelled_data import read_labelled_file
    path = tmp_path / 'train.tsv'
    path.write_text('sentence\tlabel\nto be\t1\nsentence\tlabel\nthat is\t0\n')  # two files joined
    with pytest.raises(UsageError, match=r"train\.tsv' line 3 repeats the header row \(files joined with their "
                                         r"headers\?\)"):
        read_labelled_file(str(path))


def test_corpus_entirely_unknown_is_an_error_and_mostly_unknown_a_warning(english_wordpiece, caplog):
    from mlp_vision.text.training_data import check_unknown_tokens, encode_text
    greek = encode_text(english_wordpiece, 'άλφα βήτα γάμμα δέλτα ' * 20, 'training text')
    with pytest.raises(UsageError, match=r'the training text tokenizes entirely to \[UNK\] \(80 tokens\): the '
                                         r'tokenizer knows none of it'):
        check_unknown_tokens(greek, english_wordpiece, 'training text')
    mixed = encode_text(english_wordpiece, 'to be άλφα βήτα γάμμα ' * 20, 'training text')
    with caplog.at_level(logging.WARNING):
        check_unknown_tokens(mixed, english_wordpiece, 'training text')
    assert 'the training text: 60% of its 100 tokens are [UNK] (unknown to the tokenizer)' in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        check_unknown_tokens(encode_text(english_wordpiece, 'to be or not', 'x'), english_wordpiece, 'x')
    assert caplog.text == ''


def test_trainer_stops_on_a_corpus_the_tokenizer_does_not_know(english_wordpiece, tmp_path, capsys):
    import mlp_vision.train_text as text_train
    from _helpers import exits_with_one_line
    english_wordpiece.save_pretrained(str(tmp_path / 'tok'))
    (tmp_path / 'greek.txt').write_text('άλφα βήτα γάμμα δέλτα\n' * 200)
    argv = ['--task', 'mlm', '--model', 'gmlp_base', '--model-kwargs', 'num_hidden_layers=1', 'hidden_size=16',
            'intermediate_size=32', 'max_position_embeddings=16', '--threads', '1', '--steps', '1', '-b', '2',
            '--train-file', str(tmp_path / 'greek.txt'), '--tokenizer-from', str(tmp_path / 'tok'),
            '--output', str(tmp_path / 'out')]
    msg = exits_with_one_line(text_train.main, argv, capsys)
    assert 'the training text tokenizes entirely to [UNK]' in msg


@pytest.mark.parametrize('kind', ['wordpiece', 'bpe', 'char', 'byte'])
def test_tokenizing_in_pieces_gives_the_whole_text_ids(kind, monkeypatch):
    """The text is encoded in pieces (the stop flag read between them, lines crossing their ends) into one buffer,
    grown for byte tokens of non-ASCII text and cut down for subword ones: the ids must be exactly the whole text's
    encoded in one call, with or without a stop flag."""
    import random
    import mlp_vision.text.training_data as data
    rng = random.Random(1)
    # special-token strings (read as text by byte / char tokenizers, as tokens by subword ones) and non-ASCII
    extra = ['  ', 'Tis,', "o'er", '...', '<pad>', '<mask>', '[MASK]', '[UNK]', 'naïve', '日本語']
    lines = [' '.join(rng.choice(WORDS + extra) for _ in range(rng.randint(0, 9))) for _ in range(300)]
    text = '\n'.join(lines) + '\n'
    tok = data.build_tokenizer(kind, 'mlm', text, vocab_size=300)
    monkeypatch.setattr(data, 'ENCODE_CHUNK_CHARS', 50)
    monkeypatch.setattr(data, 'CHARACTER_PART_CHARS', 7)  # byte / char pieces in parts cut anywhere
    calls = []
    pieces = data.encode_text(tok, text, 'training text', stop=lambda: calls.append(1) or 0)  # a fresh tokenizer
    unflagged = data.encode_text(tok, text, 'training text')
    whole = torch.tensor(tok.encode(text, add_special_tokens=False))
    assert len(calls) > 20 and torch.equal(pieces, whole) and torch.equal(unflagged, whole)



def _foreign_tokenizer(kind):
    """A user's tokenizer.json of a kind whose pieces are not provably exact: GPT-2's byte-level BPE (a space added
    before a text), SentencePiece's Metaspace, and a Prepend normalizer (a mark before every text: no cut is exact)."""
    from tokenizers import Tokenizer as Backend, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    backend = Backend(models.BPE(unk_token='[UNK]'))
    if kind == 'byte_level':
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        backend.decoder = decoders.ByteLevel()
    elif kind == 'metaspace':
        backend.pre_tokenizer = pre_tokenizers.Metaspace()
    else:
        backend.normalizer = normalizers.Prepend('>')
        backend.pre_tokenizer = pre_tokenizers.Whitespace()
    alphabet = pre_tokenizers.ByteLevel.alphabet() if kind == 'byte_level' else []
    backend.train_from_iterator([' '.join(WORDS + ['Tis,', "o'er", '...', '>'])] * 20,
                                trainers.BpeTrainer(vocab_size=200, special_tokens=['[UNK]'], initial_alphabet=alphabet))
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token='[UNK]')


@pytest.mark.parametrize('kind, cut', [('byte_level', True), ('metaspace', True), ('prepend', False)])
def test_foreign_tokenizers_are_cut_only_where_the_ids_stay(kind, cut, monkeypatch, caplog):
    """A tokenizer.json that is not line-local is cut where the ids are checked to stay the whole text's (the stop
    flag read between pieces); one with no such place encodes the text in one call, never different ids."""
    import random
    import mlp_vision.text.training_data as data
    tok = _foreign_tokenizer(kind)
    assert not data._encodes_by_pieces(tok)
    rng = random.Random(2)
    text = '\n'.join(' '.join(rng.choice(WORDS + ['  ', 'Tis,', "o'er", '...']) for _ in range(rng.randint(0, 9)))
                     for _ in range(300)) + '\n'
    whole = torch.tensor(tok.encode(text, add_special_tokens=False))
    monkeypatch.setattr(data, 'ENCODE_CHUNK_CHARS', 50)
    monkeypatch.setattr(data, 'CUT_CHECK_CHARS', 40)
    calls = []
    with caplog.at_level(logging.WARNING):
        pieces = data.encode_text(tok, text, 'training text', stop=lambda: calls.append(1) or 0)
    assert torch.equal(pieces, whole)
    assert (len(calls) > 20) if cut else (len(calls) == 1)
    assert ('in one call' in caplog.text) == (not cut)  # the fallback says that a stop waits for the call


def test_stop_signal_is_honoured_while_tokenizing(monkeypatch):
    import signal
    import mlp_vision.text.training_data as data
    from mlp_vision.errors import Interrupted
    tok = data.build_tokenizer('byte', 'causal', '')
    monkeypatch.setattr(data, 'ENCODE_CHUNK_CHARS', 100)
    flags = iter([0, 0, signal.SIGTERM])  # pieces of 105 characters: the first break after 100
    with pytest.raises(Interrupted, match=r'interrupted by SIGTERM at tokenizing the training text \(210 tokens '
                                          r'so far\)') as e:
        data.encode_text(tok, 'word\n' * 1000, 'training text', stop=lambda: next(flags))
    assert e.value.exit_status == 128 + signal.SIGTERM



def test_stop_signal_is_honoured_while_tokenizing_a_classification_file(english_wordpiece, monkeypatch):
    """The classifier's examples are tokenized in pieces (each example on its own: the ids are the whole file's),
    the stop flag read between them."""
    import functools
    import signal
    import mlp_vision.text.labelled_data as classification
    from mlp_vision.errors import Interrupted
    texts = [' '.join(WORDS[i % 7:i % 7 + 3]) for i in range(25)]
    data = classification.LabelledData('train.tsv', ('sentence',), texts, texts[::-1], ['0'] * 25)
    examples = functools.partial(classification.classification_examples, english_wordpiece, data, ['0'], 16, True)
    whole = examples()
    monkeypatch.setattr(classification, 'ENCODE_EXAMPLES_PER_PIECE', 10)
    calls = []
    assert examples(stop=lambda: calls.append(1) or 0) == whole
    assert len(calls) == 3
    flags = iter([0, signal.SIGTERM])
    with pytest.raises(Interrupted, match=r'^interrupted by SIGTERM at tokenizing train.tsv \(10 of 25 examples so '
                                          r'far\)$'):
        examples(stop=lambda: next(flags))


def test_global_batch_beyond_the_data_is_a_warning_with_numbers(caplog):
    from mlp_vision.train import warn_global_batch_beyond_data
    with caplog.at_level(logging.WARNING):
        warn_global_batch_beyond_data(8, 2, 10 ** 9, 300)
    assert ('the global batch (8 x 2 processes x 1000000000 accumulation steps = 16,000,000,000) is larger than the '
            'training data (300 images); lower -b / --grad-accum-steps') in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        warn_global_batch_beyond_data(8, 2, 4, 300)
    assert caplog.text == ''
