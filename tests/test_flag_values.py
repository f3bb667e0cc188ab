""" Every numeric flag of every command is checked where it enters (issue 44, item 5): NaN, infinity and a negative
value each stop with one line naming the flag (exit status 2, no traceback) before anything is read or built, or
are listed in :data:`ALLOWED` with the reason they mean something. The flags are walked from each command's parser,
so a flag added later without a range fails here. Only the commands' parsing and checks run: no data, no model.
"""
import argparse

import pytest

from mlp_vision import benchmark, train, train_text, validate
from mlp_vision.errors import ScriptExit, run_cli
from mlp_vision.training.run.distributed import init_device


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
