""" What every command shares (issue 36 items 1 and 6): one ``--threads`` flag, checked against the CPUs and given
back to an in-process caller afterwards, a default that is lowered on a busy machine; help text that states each
default once; top-5 only where it means something; the text trainer's default model per task; error lines
prefixed with the name a command was run as. """
import argparse
import os
import re

import pytest
import torch
import torch.nn as nn

from mlp_vision.errors import ScriptExit, UsageError, run_cli
from mlp_vision.arguments import THREADS_RANGE, add_threads_argument, default_threads, set_threads

CPUS = THREADS_RANGE['high']


def _benchmark(argv):
    from mlp_vision.benchmark import main
    return main(argv)


def _complexity(argv):
    from mlp_vision.complexity.report import main
    return main(argv)


def _text(argv):
    from mlp_vision.train_text import main
    return main(argv)


def _train(argv):
    from mlp_vision.train import main
    return main(argv)


def _validate(argv):
    from mlp_vision.validate import main
    return main(argv)


def _visualize(argv):
    from mlp_vision.visualize import main
    return main(argv)


# each command with the least it needs to reach --threads (nothing is built or read before the check)
COMMANDS = {
    'train': (_train, []),
    'validate': (_validate, ['--model', 'smlpnet_t']),
    'benchmark': (_benchmark, ['--model', 'smlpnet_t']),
    'complexity': (_complexity, ['--models', 'smlpnet_t']),
    'visualize': (_visualize, ['smlpnet_t', '--out', 'never-written']),
    'text-train': (_text, ['--train-file', 'no-such-file.txt']),
}


@pytest.mark.parametrize('name', sorted(COMMANDS))
@pytest.mark.parametrize('threads', ['0', str(CPUS + 1)])
def test_every_command_checks_threads_against_the_cpus(name, threads, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    main, argv = COMMANDS[name]
    with pytest.raises(SystemExit) as e:
        main(argv + ['--threads', threads])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f'--threads must be in [1, {CPUS}] (the CPUs this process may use), got {threads}' in err
    assert not os.path.exists(tmp_path / 'never-written')


def test_every_command_has_the_one_threads_flag():
    """The same flag, help and all, in every parser (one definition: ``add_threads_argument``)."""
    from mlp_vision import benchmark, train, validate, visualize
    from mlp_vision.complexity import report
    from mlp_vision.train_text import build_parser as text_parser
    reference = argparse.ArgumentParser()
    add_threads_argument(reference)
    (expected,) = [a for a in reference._actions if a.dest == 'threads']
    parsers = [train.build_parser(), validate.build_parser(), visualize.build_parser(), text_parser()]
    actions = [a for p in parsers for a in p._actions if a.dest == 'threads']
    assert len(actions) == len(parsers)
    for action in actions:
        assert (action.option_strings, action.type, action.default, action.help) == \
            (expected.option_strings, expected.type, expected.default, expected.help)
    for parse in (lambda a: benchmark.parse_args(['--model', 'smlpnet_t'] + a), report.parse_args):
        assert parse(['--threads', '1']).threads == 1 and parse([]).threads is None


def test_threads_are_given_back_to_an_in_process_caller():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(CPUS)
        assert run_cli('cmd', lambda argv: set_threads(1)) == '1 compute thread (--threads)'
        assert torch.get_num_threads() == CPUS
        with pytest.raises(ScriptExit):  # also when the command fails after setting them
            run_cli('cmd', lambda argv: (set_threads(1), set_threads(0)))
        assert torch.get_num_threads() == CPUS
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize('load', [0.0, 64.0])
def test_default_threads_are_one_whatever_the_load(monkeypatch, load):
    # the rule is fixed (mlp_vision.arguments): the machine's load never changes it
    monkeypatch.delenv('OMP_NUM_THREADS', raising=False)
    monkeypatch.setattr(os, 'getloadavg', lambda: (load, load, load))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(CPUS)
        assert default_threads() == 1
        line = set_threads(None)
        assert torch.get_num_threads() == 1
        assert line == '1 compute thread (the default; --threads N or OMP_NUM_THREADS to choose)'
    finally:
        torch.set_num_threads(before)


def test_omp_num_threads_keeps_the_count_it_chose(monkeypatch):
    monkeypatch.setenv('OMP_NUM_THREADS', str(CPUS))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(CPUS)  # what PyTorch reads from OMP_NUM_THREADS when it starts
        assert default_threads() == CPUS
        line = set_threads(None)
        assert torch.get_num_threads() == CPUS and line.startswith(f'{CPUS} compute thread')
        assert '(OMP_NUM_THREADS; --threads N to choose)' in line
    finally:
        torch.set_num_threads(before)


def test_explicit_threads_are_checked_and_set():
    before = torch.get_num_threads()
    try:
        assert set_threads(1) == '1 compute thread (--threads)' and torch.get_num_threads() == 1
        with pytest.raises(UsageError, match=r'--threads must be in \[1, '):
            set_threads(CPUS + 1)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize('name', ['train', 'validate', 'visualize', 'text-train'])
def test_help_states_each_default_once(name):
    from mlp_vision import train, validate, visualize
    from mlp_vision.train_text import build_parser as text_parser
    parser = {'train': train.build_parser, 'validate': validate.build_parser, 'visualize': visualize.build_parser,
              'text-train': text_parser}[name]()
    text = ' '.join(parser.format_help().split())
    assert re.findall(r'\(default:[^)]*\)[^-]{0,3}\(default:', text) == []
    assert "(default: the training set's)" in text if name == 'train' else True
    assert '(default: 0.0)' in text or name != 'train'  # argparse's own default is still shown where none is said


class _Classes(nn.Module):
    """Logits that put the right class last but one: top-1 0 %, top-k 100 % for every k >= 2."""

    def __init__(self, num_classes):
        super().__init__()
        self.num_classes = num_classes

    def forward(self, x):
        target = x[:, 0, 0, 0].long()
        logits = torch.arange(self.num_classes, dtype=torch.float32).repeat(len(x), 1)
        logits[torch.arange(len(x)), target] = self.num_classes - 1.5  # second best
        return logits


@pytest.mark.parametrize('num_classes, top5', [(2, None), (5, None), (6, 100.0), (10, 100.0)])
def test_top5_is_reported_only_for_more_than_five_classes(num_classes, top5):
    from mlp_vision.image_model import validate
    targets = torch.arange(8) % (num_classes - 1)  # never the last class (the best logit)
    x = targets.float()[:, None, None, None].expand(8, 3, 2, 2)
    loader = [(x[:4], targets[:4]), (x[4:], targets[4:])]
    metrics = validate(_Classes(num_classes), loader, log_interval=0)
    assert metrics['top1'] == 0.0 and metrics['top5'] == top5 and metrics['samples'] == 8


def test_eval_metric_top5_is_refused_for_five_classes_or_fewer(images, tmp_path, capsys):
    from mlp_vision.train import main
    with pytest.raises(SystemExit) as e:
        main([str(images), '--model', 'smlpnet_t', '--eval-metric', 'top5', '--output', str(tmp_path),
              '--threads', '1'])
    assert e.value.code == 2
    assert '--eval-metric top5 with 2 classes' in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_text_trainer_default_model_follows_the_task(tmp_path, capsys):
    """--task mlm without --model: the missing file is named (the causal default is no longer checked first)."""
    from mlp_vision.arguments import parse_args_with_config
    from mlp_vision.train_text import DEFAULT_MODELS, build_parser, check_args
    for task, model in DEFAULT_MODELS.items():
        args, _ = parse_args_with_config(build_parser(), ['--task', task])
        check_args(args)
        assert args.model == model  # derived: the arguments as given (args.yaml) keep --model unset
        assert args.given()['model'] is None and args.derived == {'model': model}
    with pytest.raises(SystemExit):
        _text(['--task', 'mlm', '--train-file', str(tmp_path / 'missing.txt'), '--threads', '1'])
    err = capsys.readouterr().err
    assert 'missing.txt' in err and 'does not exist' in err and 'causal_lm' not in err


CONSOLE_SCRIPTS = {  # COMMANDS' names -> the functions pip's console scripts call (mlp_vision.commands)
    'train': 'train', 'validate': 'validate', 'benchmark': 'benchmark', 'complexity': 'complexity',
    'visualize': 'visualize', 'text-train': 'text_train'}


@pytest.mark.parametrize('name', sorted(COMMANDS))
@pytest.mark.parametrize('bad, expected', [
    (['--no-such-flag'], 'unrecognized arguments: --no-such-flag'),
    (['--threads', 'many'], "argument --threads: invalid int value: 'many'"),
])
def test_every_command_has_one_argument_error_shape(name, bad, expected, tmp_path, monkeypatch, capsys):
    """Issue 35 item 4: one parser class and error path for every command: an unknown flag and a value of the wrong
    type are one line ``<the name it was run as>: error: ...`` on stderr and status 2, nothing on stdout."""
    from mlp_vision import commands
    monkeypatch.chdir(tmp_path)
    script = f'mlp-vision-{name}'
    assert script in commands.COMMANDS
    monkeypatch.setattr('sys.argv', [script] + COMMANDS[name][1] + bad)
    with pytest.raises(SystemExit) as e:
        getattr(commands, CONSOLE_SCRIPTS[name])()
    assert e.value.code == 2
    out, err = capsys.readouterr()
    assert err.splitlines() == [f'{script}: error: {expected}'] and out == ''
    assert not os.path.exists(tmp_path / 'never-written')
