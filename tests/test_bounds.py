""" Bounded before trusted, said not skipped (issue 33, items 3 and 5): every size or value read from a file passes a
bound before anything is allocated, and data a reader leaves out is reported.

Each test makes the hostile or odd input for real in ``tmp_path`` (a yaml alias bomb, a FIFO named ``*.png``, a
``config.json`` of 100,000 wide layers, ...) and asserts the one line the user gets.
"""
import json
import logging
import math
import os
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mlp_vision.errors import UsageError, check_model_size, check_range, short_repr  # noqa: E402
from mlp_vision.training.config import MAX_YAML_DEPTH, load_yaml_config, read_yaml_file  # noqa: E402


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
    with pytest.raises(UsageError, match=f'line 1: nested deeper than {MAX_YAML_DEPTH} levels'):
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


def test_short_repr_is_bounded_in_length_and_work():
    value = {'a': [[0] * 10 ** 6] * 10 ** 3, 'b': 'x' * 10 ** 6}
    text = short_repr(value)
    assert len(text) <= 200 and text.startswith("{'a': [[0, 0")
    assert short_repr(10 ** 5000) == '<an integer of about 5001 digits>'  # str() of it raises ValueError
    assert short_repr('abc') == "'abc'" and short_repr(1.5) == '1.5' and short_repr(-7) == '-7'
    with pytest.raises(UsageError, match=r'--x must be <= 0, got <an integer of about 5001 digits>'):
        check_range('--x', 10 ** 5000, high=0)
