""" What a user gives a command, parsed and checked where it enters: the commands' parser (:class:`ArgumentParser`,
whose errors are one line through :func:`~mlp_vision.errors.run_cli`), range checks of flag values
(:func:`check_range`), devices (:func:`parse_device`), JSON config files (:func:`read_json_file`), and the flags
several commands share (``--allow-regex``; the size bounds' flags are :func:`mlp_vision.bounds.add_bound_arguments`).
"""
import argparse
import json
import math
import os
import sys
from typing import Sequence

import torch
from timm.utils import ParseKwargs as TimmParseKwargs

from mlp_vision.errors import UsageError, short_repr

__all__ = ['ArgumentParser', 'ParseKwargs', 'check_kwargs_flags', 'DefaultsHelpFormatter', 'check_range', 'parse_device', 'read_json_file',
           'CONFIG_MAX_BYTES', 'add_allow_regex_argument']


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors (a bad choice, a value of the wrong type, an unknown flag, a word of
    the command line that is not UTF-8) raise :class:`UsageError`: one line and status 2 through :func:`run_cli`,
    not argparse's usage text."""

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        _check_utf8_words(args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        raise UsageError(message)


def _check_utf8_words(argv: Sequence[str]) -> None:
    """A :class:`UsageError` naming the first word of ``argv`` that is not UTF-8 (Python holds its bytes as lone
    surrogates), and the flag it is given to: a run writes its names and paths into logs, ``args.yaml`` and its
    records, as UTF-8 text, which such a word cannot be (the logging errors would come after the run)."""
    flag = ''
    for word in argv:
        if not isinstance(word, str):
            continue
        try:
            word.encode('utf-8')
        except UnicodeEncodeError as e:
            shown = word.encode('utf-8', 'surrogateescape' if _is_escaped_bytes(word) else 'backslashreplace')
            where = f'{flag} ' if flag and not word.startswith('-') else ''
            raise UsageError(f'{where}\'{shown.decode("utf-8", "backslashreplace")}\' is not UTF-8 text (character '
                             f'{e.start}); names and paths given to a command must be UTF-8: a run writes them into '
                             f'its logs and records') from None
        if word.startswith('-') and len(word) > 1 and not _is_number(word):
            flag = word.split('=', 1)[0]


def _is_escaped_bytes(word: str) -> bool:
    """Whether every surrogate of ``word`` stands for a byte (Python's ``surrogateescape`` of the command line)."""
    return all(0xdc80 <= ord(c) <= 0xdcff for c in word if 0xd800 <= ord(c) <= 0xdfff)


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


class ParseKwargs(TimmParseKwargs):
    """timm's action of ``--model-kwargs`` / ``--opt-kwargs`` (``NAME=VALUE`` words, each value a Python literal,
    else a string), with a word that is not ``NAME=VALUE`` argparse's one-line error instead of a ``ValueError``
    traceback, and an empty or non-identifier name refused (it would reach the model or optimizer as no argument
    it takes)."""

    def __call__(self, parser, namespace, values, option_string=None):
        for value in values:
            name, equals, _ = value.partition('=')
            if value and not (equals and name.isidentifier()):
                raise argparse.ArgumentError(self, f'{value!r} is not NAME=VALUE; expected e.g. embed_dim=32 '
                                                   f'depths="(1,1,2,1)"')
        super().__call__(parser, namespace, values, option_string)


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's ``(default: X)`` after each flag's help, except where the help already says its default in
    words."""

    def _get_help_string(self, action):
        if 'default' in (action.help or '').lower():
            return action.help
        return super()._get_help_string(action)

def check_range(name: str, value, low=None, high=None, *, low_open: bool = False, high_open: bool = False,
                why: str = '') -> None:
    """A :class:`UsageError` ``<name> must be <range>[ (why)], got <value>`` unless ``value`` is a finite number in
    the range: ``low`` / ``high`` None leave that side open-ended, ``low_open`` / ``high_open`` exclude the bound.

    NaN and infinities are never in range: no flag means anything by them, and NaN passes every ``<`` test.
    """
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = number and (isinstance(value, int) or math.isfinite(value))  # an int may be too large for a float
    ok = ok and (low is None or (value > low if low_open else value >= low))
    ok = ok and (high is None or (value < high if high_open else value <= high))
    if ok:
        return
    if low is not None and high is not None:
        expected = f'in {"(" if low_open else "["}{low}, {high}{")" if high_open else "]"}'
    elif low == 0 and low_open:
        expected = 'a positive number'
    elif low is not None:
        expected = f'{">" if low_open else ">="} {low}'
    elif high is not None:
        expected = f'{"<" if high_open else "<="} {high}'
    else:
        expected = 'a finite number'
    raise UsageError(f'{name} must be {expected}{f" ({why})" if why else ""}, got {short_repr(value)}')


def check_kwargs_flags(args: argparse.Namespace, *dests: str) -> None:
    """A :class:`UsageError` unless each ``NAME=VALUE`` flag of ``dests`` (``model_kwargs``, ``opt_kwargs``) holds a
    mapping of Python names to values: a ``-c`` yaml file or a resumed run's settings give them without
    :class:`ParseKwargs` (``model_kwargs: 5`` was a TypeError traceback)."""
    for dest in dests:
        value = getattr(args, dest, None)
        if value is not None and not (isinstance(value, dict) and all(
                isinstance(name, str) and name.isidentifier() for name in value)):
            raise UsageError(f'--{dest.replace("_", "-")} is {short_repr(value)}; expected a mapping of names to '
                             f'values (in yaml: {dest}: {{embed_dim: 32}}; on the command line NAME=VALUE words)')


def parse_device(device: str, flag: str = '--device') -> torch.device:
    """``device`` as a ``torch.device`` this machine has; a :class:`UsageError` for a name torch does not know,
    CUDA without a GPU or a GPU index beyond the count (torch would fail later, with a traceback)."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise UsageError(f'{flag} {device!r} is not a device; expected cpu, cuda or cuda:N') from None
    if parsed.type == 'cuda':
        if not torch.cuda.is_available():
            raise UsageError(f'{flag} {device} asked for CUDA, but no CUDA device is available (use {flag} cpu)')
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise UsageError(f'{flag} {device}: this machine has {torch.cuda.device_count()} CUDA device(s), '
                             f'cuda:0 to cuda:{torch.cuda.device_count() - 1}')
    elif parsed.type != 'cpu':
        backend = getattr(torch, parsed.type, None)  # torch.mps, torch.xpu, ... say whether one is present
        if backend is not None and hasattr(backend, 'is_available') and not backend.is_available():
            raise UsageError(f'{flag} {device}: no {parsed.type} device is available here (use {flag} cpu)')
    return parsed


CONFIG_MAX_BYTES = 16 * 2 ** 20  # a config.json is kilobytes (a 21k-class label map is ~1 MB); beyond, it is not one


def read_json_file(path: str):
    """The parsed JSON of the file ``path``; a :class:`UsageError` naming it when it is larger than
    :data:`CONFIG_MAX_BYTES` (checked before it is read), not UTF-8, not JSON, or nested too deeply for the parser."""
    size = os.path.getsize(path)
    if size > CONFIG_MAX_BYTES:
        raise UsageError(f'{path} is {size:,} bytes, more than the {CONFIG_MAX_BYTES:,} a JSON config can need; it is '
                         f'not one, and is not read')
    try:
        with open(path, encoding='utf-8') as f:
            return json.load(f)
    except UnicodeDecodeError as e:
        raise UsageError(f'{path} is not UTF-8 text (byte {e.object[e.start]:#04x} at {e.start}); expected JSON') \
            from None
    except RecursionError:
        raise UsageError(f'{path} is nested too deeply to be a config (JSON arrays / objects inside each other '
                         f'beyond Python\'s recursion limit)') from None
    except ValueError as e:  # JSONDecodeError
        raise UsageError(f'{path} is not valid JSON ({e}); the file is damaged or truncated') from None


def add_allow_regex_argument(group: argparse._ActionsContainer) -> None:
    """``--allow-regex`` (``args.allow_regex``): the command-line opt-in of the tokenizer readers' ``allow_regex``."""
    group.add_argument('--allow-regex', action='store_true', default=False,
                       help='UNSAFE: read a tokenizer.json whose pre-tokenizer or normalizer has a regular '
                            'expression; a crafted pattern can take minutes per text (backtracking). Only for '
                            'tokenizer files you made or whose maker you trust')
