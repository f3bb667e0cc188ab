""" What a user gives a command, parsed and checked where it enters: the commands' parser (:class:`ArgumentParser`,
whose errors are one line through :func:`~mlp_vision.errors.run_cli`), range checks of flag values
(:func:`check_range`), devices (:func:`parse_device`), JSON config files (:func:`read_json_file`), and the flags
several commands share (``--allow-regex``; the size bounds' flags are :func:`mlp_vision.bounds.add_bound_arguments`).
"""
import argparse
import json
import math
import os

import torch

from mlp_vision.errors import UsageError, short_repr

__all__ = ['ArgumentParser', 'DefaultsHelpFormatter', 'check_range', 'parse_device', 'read_json_file',
           'CONFIG_MAX_BYTES', 'add_allow_regex_argument']


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors (a bad choice, a value of the wrong type, an unknown flag) raise
    :class:`UsageError`: one line and status 2 through :func:`run_cli`, not argparse's usage text."""

    def error(self, message: str):
        raise UsageError(message)


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
