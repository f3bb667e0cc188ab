""" The one error path of the commands (``mlp_vision.train`` / ``validate`` / ``benchmark``, ``mlp_vision.train_text``).

A script's ``main`` runs its work through :func:`run_cli`, which turns every expected failure into one line on
stderr, ``<prog>: error: <what was wrong and what is expected>``, and an exit status:

* :class:`UsageError` -- bad input (a flag, a path, a dataset, a checkpoint that does not fit): status 2, as
  argparse's own usage errors;
* :class:`RunError` -- a run that cannot go on (NaN loss, a full disk): status 1; its message says what is intact;
* :class:`Interrupted` -- SIGINT / SIGTERM: status 128 + signal number, after the resumable checkpoint is saved;
* an ``OSError`` (e.g. ``No space left on device``) anywhere in the exception chain: status 1, its text and file;
* memory running out (``MemoryError``, ``torch.OutOfMemoryError``, the CPU allocator's error), a Rust library's
  panic (``tokenizers``' ``PanicException``): status 1, what failed and what to reduce; input nested beyond
  Python's recursion limit or not UTF-8 where a reader did not say so itself: status 2.

``--debug`` on the command line re-raises instead, with the full traceback. Library callers get the exceptions.
"""
import argparse
import errno
import json
import math
import os
import signal
import sys
from typing import Callable, Optional, Sequence, Tuple

import torch

__all__ = ['ArgumentParser', 'UsageError', 'RunError', 'Interrupted', 'ScriptExit', 'run_cli', 'find_os_error',
           'check_range', 'parse_device', 'read_json_file', 'stop_moved_module']


class UsageError(ValueError):
    """Bad input from the user (a path, a flag, a dataset or a checkpoint that does not fit).

    The message says what was wrong and what is expected. The scripts exit with status 2 and that one line
    instead of a traceback; library callers get a ``ValueError``.
    """
    exit_status = 2


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors (a bad choice, a value of the wrong type, an unknown flag) raise
    :class:`UsageError`, so a script run through :func:`run_cli` reports them as its one line with status 2, like
    every other usage error, instead of argparse's usage text plus the message."""

    def error(self, message: str):
        raise UsageError(message)


def check_range(name: str, value, low=None, high=None, *, low_open: bool = False, high_open: bool = False,
                why: str = '') -> None:
    """A :class:`UsageError` ``<name> must be <range>[ (why)], got <value>`` unless ``value`` is a finite number in
    the range: ``low`` / ``high`` None leave that side open-ended, ``low_open`` / ``high_open`` exclude the bound.

    NaN and infinities are never in range: no flag or config value means anything by them, and NaN passes every
    ``<`` test unnoticed (``not 0 < nan`` is how NaN used to slip through to a NaN loss).
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
    raise UsageError(f'{name} must be {expected}{f" ({why})" if why else ""}, got {value}')


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


def read_json_file(path: str, max_bytes: int = CONFIG_MAX_BYTES):
    """The parsed JSON of the file ``path``; a :class:`UsageError` naming it when it is larger than ``max_bytes``
    (checked before it is read: a multi-gigabyte "config" would fill the memory), not UTF-8, not JSON, or nested
    too deeply for the parser (a ``RecursionError`` in ``json``)."""
    size = os.path.getsize(path)
    if size > max_bytes:
        raise UsageError(f'{path} is {size:,} bytes, more than the {max_bytes:,} a JSON config can need; it is not '
                         f'one, and is not read')
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


def stop_moved_module(module_name: str, old: str, new: str) -> None:
    """The body of a module that moved: run (``module_name == '__main__'``) it prints one line naming the new place
    and exits 2; imported, it raises ``ImportError`` with that line."""
    message = f'{old} moved: use {new}'
    if module_name == '__main__':
        print(f'error: {message}', file=sys.stderr)
        sys.exit(2)
    raise ImportError(message)


class RunError(RuntimeError):
    """A run that cannot go on (the loss became NaN, the disk is full). The message says what was kept."""
    exit_status = 1


class Interrupted(RunError):
    """SIGINT / SIGTERM ``signum`` arrived; raised at the next safe point ``where`` (between batches / updates)."""

    def __init__(self, signum: int, where: str = '', message: str = ''):
        self.signum, self.where = signum, where
        self.exit_status = 128 + signum
        name = signal.Signals(signum).name
        super().__init__(message or f'interrupted by {name}' + (f' at {where}' if where else ''))


class ScriptExit(SystemExit):
    """The ``SystemExit`` of :func:`run_cli`: ``code`` is the exit status, ``message`` the line written to stderr."""

    def __init__(self, status: int, message: str):
        super().__init__(status)
        self.message = message


def find_os_error(error: BaseException) -> Optional[OSError]:
    """The first ``OSError`` with an errno in ``error``'s chain (torch's serializer wraps the file's own error)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno is not None:
            return error
        error = error.__cause__ or error.__context__
    return None


def _os_error_line(error: OSError) -> str:
    where = f': {error.filename}' if error.filename else ''
    text = error.strerror or errno.errorcode.get(error.errno, str(error))
    return f'{text}{where}'


_ALLOCATION_FAILURES = ("can't allocate memory", 'out of memory', 'failed to allocate')  # torch's RuntimeError texts


def _boundary_line(error: BaseException) -> Optional[Tuple[int, str]]:
    """(status, one line) of a failure no input check rules out everywhere (None for any other error): memory
    running out (``MemoryError``, ``torch.OutOfMemoryError``, the CPU allocator's RuntimeError) and a Rust
    library's panic (``pyo3_runtime.PanicException``, e.g. from ``tokenizers``: a ``BaseException``, so no ``except
    Exception`` sees it), status 1; input nested beyond Python's recursion limit or bytes that are not UTF-8, status
    2 (the readers that know the file name say it themselves; this is the net under the others)."""
    text = ' '.join(str(error).split())[:300]
    if isinstance(error, (MemoryError, getattr(torch, 'OutOfMemoryError', MemoryError))) or (
            isinstance(error, RuntimeError) and any(m in text.lower() for m in _ALLOCATION_FAILURES)):
        return 1, (f'out of memory ({type(error).__name__}: {text}); reduce the batch size (-b), the model or input '
                   f'size, or the data held in memory, or use a machine with more memory')
    if type(error).__name__ == 'PanicException':
        return 1, (f'a Rust library stopped with a panic ({text}); the input it was given (a tokenizer file, a text '
                   f'or a setting) is one it cannot handle: check or replace it')
    if isinstance(error, RecursionError):
        return 2, f'an input is nested too deeply to read ({text}); it is damaged or was crafted'
    if isinstance(error, UnicodeDecodeError):
        return 2, f'an input file is not UTF-8 text ({text}); expected UTF-8 (yaml, json, text)'
    return None


def run_cli(prog: str, main: Callable[[Sequence[str]], object], argv: Optional[Sequence[str]] = None):
    """``main(argv)`` with the scripts' error path (see the module docstring); returns what ``main`` returns."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = '--debug' in argv
    try:
        return main(argv)
    except (UsageError, RunError) as e:
        if debug:
            raise
        status, message = e.exit_status, str(e)
    except OSError as e:
        if debug or e.errno is None:
            raise
        status, message = 1, _os_error_line(e)
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as e:  # noqa: B036  (a Rust panic is a BaseException; the three above go on)
        # torch's serializer and loaders wrap the OSError that says what went wrong
        os_error = find_os_error(e) if isinstance(e, RuntimeError) else None
        known = (1, _os_error_line(os_error)) if os_error is not None else _boundary_line(e)
        if debug or known is None:
            raise
        status, message = known
    rank = int(os.environ.get('RANK', 0) or 0)
    line = f'{prog}: error: {" ".join(message.split())}'
    if rank == 0 or status == UsageError.exit_status:  # a run's stop is reported once, by rank 0 (it holds the files)
        print(line if rank == 0 else f'[rank {rank}] {line}', file=sys.stderr, flush=True)
    raise ScriptExit(status, line)
