""" The one error path of every command: :func:`run_cli` turns every expected failure into one line on stderr,
``<prog>: error: <what was wrong and what is expected>``, and an exit status: :class:`UsageError` (bad input) 2, as
argparse's own errors; :class:`RunError` (a run that cannot go on; its message says what is intact) 1;
:class:`Interrupted` (SIGINT / SIGTERM, after the resumable checkpoint is saved) 128 + the signal number; an
``OSError`` anywhere in the exception chain 1; memory running out or a Rust library's panic 1; input nested beyond
Python's recursion limit or not UTF-8, where no reader said so itself, 2. ``--debug`` re-raises instead, with the
traceback; library callers get the exceptions.
"""
import errno
import math
import os
import reprlib
import signal
import sys
from typing import Any, Callable, Optional, Sequence, Tuple

import torch

__all__ = ['UsageError', 'RunError', 'Interrupted', 'ScriptExit', 'run_cli', 'find_os_error', 'short_repr']


class UsageError(ValueError):
    """Bad input: the message says what was wrong and what is expected (a ``ValueError`` for library callers)."""
    exit_status = 2


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxdict, _SHORT.maxlist, _SHORT.maxtuple, _SHORT.maxset = 3, 6, 6, 6, 6
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 120, 120, 40


def short_repr(value: Any, limit: int = 200) -> str:
    """``repr(value)`` bounded in work and length, for messages echoing a value from the user or a file: the full
    ``repr`` of a huge nested value would never end, of a 10**5000 integer fail (``ValueError``: too many digits)."""
    if isinstance(value, int) and value.bit_length() > 256:  # repr of >4300 digits raises; of fewer takes long
        return f'<an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits>'
    try:
        text = _SHORT.repr(value)
    except Exception:  # a broken __repr__ (an integer over Python's digit limit inside a container)
        text = f'<{type(value).__name__} object>'
    return text if len(text) <= limit else text[:limit - 3] + '...'


class RunError(RuntimeError):
    """A run that cannot go on (NaN loss, a full disk); the message says what was kept."""
    exit_status = 1


class Interrupted(RunError):
    """SIGINT / SIGTERM ``signum`` arrived; raised at the next safe point ``where`` (between batches / updates)."""

    def __init__(self, signum: int, where: str = '', message: str = ''):
        self.signum, self.where, self.exit_status = signum, where, 128 + signum
        super().__init__(message or f'interrupted by {signal.Signals(signum).name}' + (f' at {where}' if where else ''))


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


_ALLOCATION_FAILURES = ("can't allocate memory", 'out of memory', 'failed to allocate')  # torch's RuntimeError texts


def _boundary_line(error: BaseException) -> Optional[Tuple[int, str]]:
    """(status, one line) of a failure no input check rules out everywhere (the module docstring), else None."""
    os_error = find_os_error(error) if isinstance(error, (OSError, RuntimeError)) else None  # torch wraps the file's
    if os_error is not None:
        where = f': {os_error.filename}' if os_error.filename else ''
        return 1, (os_error.strerror or errno.errorcode.get(os_error.errno, str(os_error))) + where
    text = ' '.join(str(error).split())[:300]
    if isinstance(error, (MemoryError, getattr(torch, 'OutOfMemoryError', MemoryError))) or (
            isinstance(error, RuntimeError) and any(m in text.lower() for m in _ALLOCATION_FAILURES)):
        return 1, f'out of memory ({type(error).__name__}: {text}); reduce the batch size (-b), the model or input size'
    if type(error).__name__ == 'PanicException':
        return 1, f'a Rust library stopped with a panic ({text}); check or replace the input it was given'
    if isinstance(error, RecursionError):
        return 2, f'an input is nested too deeply to read ({text}); it is damaged or was crafted'
    if isinstance(error, UnicodeDecodeError):
        return 2, f'an input file is not UTF-8 text ({text}); expected UTF-8 (yaml, json, text)'
    return None


def run_cli(prog: str, main: Callable[[Sequence[str]], object], argv: Optional[Sequence[str]] = None):
    """``main(argv)`` with the commands' error path (the module docstring); returns what ``main`` returns. torch's
    thread count is the caller's again afterwards (``--threads`` is for the run only)."""
    threads = torch.get_num_threads()
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = '--debug' in argv
    try:
        return main(argv)
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as e:  # noqa: B036  (a Rust panic is a BaseException)
        known = (e.exit_status, str(e)) if isinstance(e, (UsageError, RunError)) else _boundary_line(e)
        if debug or known is None:
            raise
        status, message = known
    finally:
        torch.set_num_threads(threads)
    rank = int(os.environ.get('RANK', 0) or 0)
    line = f'{prog}: error: {" ".join(message.split())}'
    if rank == 0 or status == UsageError.exit_status:  # a run's stop is reported once, by rank 0 (it holds the files)
        print(line if rank == 0 else f'[rank {rank}] {line}', file=sys.stderr, flush=True)
    raise ScriptExit(status, line)
