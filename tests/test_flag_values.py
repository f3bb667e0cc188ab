""" Every numeric flag of every command is checked where it enters (issue 44, item 5): NaN, infinity and a negative
value each stop with one line naming the flag (exit status 2, no traceback) before anything is read or built, or
are listed in :data:`ALLOWED` with the reason they mean something. The flags are walked from each command's parser,
so a flag added later without a range fails here. Only the commands' parsing and checks run: no data, no model.
"""
import argparse

import pytest

from mlp_vision import benchmark, train, train_text, validate
from mlp_vision.errors import ScriptExit, run_cli
from mlp_vision import image_data
from mlp_vision.image_model import init_device


def _train_checks(argv):
    args, _, _ = train.parse_args(argv)
    train.check_args(args, init_device(args.device, args.dist_backend, args.dist_url))


def _validate_checks(argv):
    validate.check_args(validate.build_parser().parse_args(argv))


def _text_checks(argv):
    train_text.check_args(train_text.parse_args(argv))


# command -> (its parser, the flags a valid command line needs, its parsing and checks)
COMMANDS = {
    'train.py': (train.build_parser, ['--device', 'cpu'], _train_checks),
    'validate.py': (validate.build_parser, ['--model', 'smlpnet_t', '--device', 'cpu'], _validate_checks),
    'benchmark.py': (benchmark.build_parser, ['--model', 'smlpnet_t'], benchmark.parse_args),
    'train_text': (train_text.build_parser, ['--device', 'cpu'], _text_checks),
}

# (command, flag, value) -> why the value is meaningful and goes through
ALLOWED = {
    ('train.py', '--mean', '-1'): 'a channel mean (of the [0, 1] pixel scale) may be any finite number',
    ('validate.py', '--mean', '-1'): 'a channel mean (of the [0, 1] pixel scale) may be any finite number',
    ('train_text', '--clip-grad', '-1'): '<= 0 turns gradient clipping off (documented in --help)',
}
VALUES = ('nan', 'inf', '-1')


def _numeric_flags(parser: argparse.ArgumentParser):
    """(the flag's longest name, its option strings, how many values it takes) of each int / float flag."""
    for action in parser._actions:
        if action.type in (int, float) and action.option_strings:
            count = action.nargs if isinstance(action.nargs, int) else 1
            yield max(action.option_strings, key=len), action.option_strings, count


@pytest.mark.parametrize('command', list(COMMANDS))
def test_every_numeric_flag_refuses_nan_inf_and_negative_in_one_line(command, capsys):
    build_parser, base, checks = COMMANDS[command]
    run_cli(command, checks, base)  # the base command line itself passes the checks
    flags = list(_numeric_flags(build_parser()))
    assert len(flags) >= 5, flags
    accepted, wrong = [], []
    for flag, names, count in flags:
        for value in VALUES:
            argv = base + [flag] + [value] * count
            try:
                run_cli(command, checks, argv)
            except ScriptExit as e:
                err = capsys.readouterr().err.strip().splitlines()
                if e.code != 2 or err != [e.message] or not any(name in e.message for name in names):
                    wrong.append((flag, value, e.code, err))
                continue
            if (command, flag, value) not in ALLOWED:
                accepted.append(f'{flag} {value}')
    assert not wrong, f'not one line of exit status 2 naming the flag: {wrong}'
    assert not accepted, f'{command} accepted (add a range to its table, or to ALLOWED with a reason): {accepted}'
    unused = [key for key in ALLOWED if key[0] == command and key[1] not in {f for f, _, _ in flags}]
    assert not unused, f'ALLOWED names flags {command} no longer has: {unused}'


# the families of issue 44 that are one flag's value: (command, flags) -> the one line's text
FAMILIES = {
    ('train.py', '--max-activation-gib', '1e300'): '--max-activation-gib must be in (0, 1073741824]',  # OverflowError
    ('validate.py', '--max-activation-gib', '1e300'): '--max-activation-gib must be in (0, 1073741824]',
    ('train.py', '--max-params', '0.5'): '--max-params must be >= 1 (a parameter count), got 0.5',  # was a bound of 0
    ('train.py', '--model-kwargs', 'embed_dim'): "argument --model-kwargs: 'embed_dim' is not NAME=VALUE",
    ('validate.py', '--model-kwargs', '=5'): "argument --model-kwargs: '=5' is not NAME=VALUE",
    ('train_text', '--model-kwargs', 'hidden_size'): "argument --model-kwargs: 'hidden_size' is not NAME=VALUE",
    ('train.py', '--opt-kwargs', 'eps'): "argument --opt-kwargs: 'eps' is not NAME=VALUE",
    ('train.py', '--min-lr', '1', '--lr', '0.1'): '--min-lr 1 is above --lr 0.1: the schedule would raise the LR',
    ('train_text', '--steps', '10', '--warmup-steps', '10'): '--warmup-steps must be in [0, 9]',
    ('validate.py', '--crop-pct', '100'): '--crop-pct must be in (0, 1]',
    ('train.py', '--experiment', '\udcff'): "--experiment '\\xff' is not UTF-8 text",  # $'\xff' in bash
    ('train_text', '--experiment', 'a\udcffb'): "--experiment 'a\\xffb' is not UTF-8 text",
    ('validate.py', '--dataset', 'hfds/mnist'): 'which is not installed: pip install datasets (or give an image folder',
}


@pytest.mark.parametrize('case', list(FAMILIES), ids=' '.join)
def test_issue_44_flag_families_are_one_line(case, capsys, monkeypatch):
    command, *flags = case
    monkeypatch.setitem(image_data.DATASET_PACKAGES, 'hfds', ('datasets_not_installed', 'datasets'))  # if it is
    _, base, checks = COMMANDS[command]
    with pytest.raises(ScriptExit) as e:
        run_cli(command, checks, base + flags)
    assert e.value.code == 2 and FAMILIES[case] in e.value.message, e.value.message
    assert capsys.readouterr().err.strip().splitlines() == [e.value.message]


def test_warmup_as_long_as_the_run_is_said_in_one_line(caplog):
    """Allowed (a recipe's warmup in a short trial run: the demo's --epochs 1), but said: the LR never reaches the
    scheduled rate."""
    _train_checks(['--device', 'cpu', '--warmup-epochs', '5', '--epochs', '2'])
    said = [r.getMessage() for r in caplog.records if 'warmup' in r.getMessage()]
    assert said == ['--warmup-epochs 5 is not shorter than --epochs 2: the whole run is warmup, its LR rising from '
                    '--warmup-lr 0.0001 and never reaching the scheduled rate; give --warmup-epochs 1 or less (0: '
                    'none) to train at it'], said
    caplog.clear()
    _train_checks(['--device', 'cpu', '--warmup-epochs', '1', '--epochs', '2'])
    assert not [r for r in caplog.records if 'warmup' in r.getMessage()]


@pytest.mark.parametrize('command', ['train.py', 'train_text'])
def test_kwargs_flags_from_a_yaml_file_are_a_mapping(command, tmp_path, capsys):
    """``-c`` gives ``model_kwargs`` without the command line's NAME=VALUE action: a number there was a TypeError
    traceback when the model was built."""
    (tmp_path / 'c.yaml').write_text('model_kwargs: 5\n')
    _, base, checks = COMMANDS[command]
    with pytest.raises(ScriptExit) as e:
        run_cli(command, checks, base + ['-c', str(tmp_path / 'c.yaml')])
    assert e.value.code == 2 and '--model-kwargs is 5; expected a mapping of names to values' in e.value.message
    assert capsys.readouterr().err.strip().splitlines() == [e.value.message]
