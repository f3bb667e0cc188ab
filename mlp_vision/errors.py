""" The one error path of every command (:mod:`mlp_vision.commands`); each parses with :class:`ArgumentParser`.

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
import contextlib
import errno
import json
import math
import os
import reprlib
import signal
import sys
from typing import Any, Callable, Iterator, Optional, Sequence, Tuple

import torch
import torch.nn as nn

__all__ = ['ArgumentParser', 'DefaultsHelpFormatter', 'UsageError', 'RunError', 'Interrupted', 'ScriptExit', 'run_cli',
           'find_os_error', 'check_range', 'parse_device', 'read_json_file', 'short_repr', 'MAX_PARAMS',
           'check_model_size', 'MAX_ACTIVATION_BYTES', 'estimate_activation_bytes', 'check_activation_size',
           'add_bound_arguments', 'add_allow_regex_argument', 'size_bounds', 'within_bounds']


class UsageError(ValueError):
    """Bad input from the user: the message says what was wrong and what is expected. The scripts exit with status
    2 and that one line instead of a traceback; library callers get a ``ValueError``."""
    exit_status = 2


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


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxdict, _SHORT.maxlist, _SHORT.maxtuple, _SHORT.maxset = 3, 6, 6, 6, 6
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 120, 120, 40


def short_repr(value: Any, limit: int = 200) -> str:
    """``repr(value)`` bounded in work and length (3 levels, 6 items each, long strings and numbers cut, at most
    ``limit`` characters), for every message that echoes a value from the user or a file: a full ``repr`` of a
    yaml alias bomb or of a 10**5000 integer (``ValueError``: too many digits) would never end or fail."""
    if isinstance(value, int) and value.bit_length() > 256:  # repr of >4300 digits raises; of fewer takes long
        return f'<an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits>'
    try:
        text = _SHORT.repr(value)
    except Exception:  # a broken __repr__ (an integer over Python's digit limit inside a container)
        text = f'<{type(value).__name__} object>'
    return text if len(text) <= limit else text[:limit - 3] + '...'


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


# the largest model any command builds unasked: 2e9 parameters are 8 GB of float32 weights (32 GB with AdamW's
# state and the gradients); a size read from a file beyond it is far more likely damaged or hostile than meant
MAX_PARAMS = 2_000_000_000


class _OverBudget(BaseException):
    """Raised inside a meta-device build as soon as the parameters registered pass the bound (a BaseException, so
    that no ``except Exception`` in a model's or the caller's build code takes it for a build error)."""


def check_model_size(build_on_meta: Callable[[], Optional[nn.Module]], what: str) -> Optional[int]:
    """The parameter count of the model ``build_on_meta()`` builds on the ``meta`` device (only shapes), or a
    :class:`UsageError` naming ``what`` (the model, and the file its sizes came from) when it exceeds
    :data:`MAX_PARAMS`. The build stops as soon as the count passes the bound, so 100,000 wide layers are refused
    after a few. ``build_on_meta`` returning None skips the check (None is returned)."""
    max_params, seen, total = MAX_PARAMS, set(), 0

    def count(module: nn.Module, name: str, param: Optional[nn.Parameter]) -> None:
        nonlocal total
        if param is not None and id(param) not in seen:  # a tied weight counts once
            seen.add(id(param))
            total += param.numel()
            if total > max_params:
                raise _OverBudget

    handle = nn.modules.module.register_module_parameter_registration_hook(count)
    try:
        model = build_on_meta()
    except _OverBudget:
        model = None
    finally:
        handle.remove()
    if total > max_params:
        raise UsageError(f'{what} would have more than {max_params:.3g} parameters (the bound of '
                         f'mlp_vision.errors.MAX_PARAMS, {4 * max_params / 1e9:.0f} GB of float32 weights); '
                         f'expected sizes of a model this machine can hold: check the sizes given (a damaged or '
                         f'edited file?), or raise the bound with --max-params (mlp_vision.errors.MAX_PARAMS in '
                         f'Python) if the model is meant')
    return None if model is None else sum(p.numel() for p in model.parameters())


# the activations one forward may hold (estimate_activation_bytes): a size read from a file (a checkpoint's img_size,
# a config.json's max_position_embeddings) can make the first step take more memory than any machine has. A training
# step at 224 px, batch 256 is estimated at 33-59 GiB (resnet50 to smlpnet_t, 2026-11-26); 256 GiB is beyond any
# single accelerator's memory. --max-activation-gib raises it (size_bounds).
MAX_ACTIVATION_BYTES = 256 * 2 ** 30


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_tensor_bytes(v) for v in value)
    if isinstance(value, dict):  # transformers' ModelOutput is one
        return sum(_tensor_bytes(v) for v in value.values())
    return 0


def estimate_activation_bytes(model: nn.Module, inputs: Sequence[torch.Tensor], training: bool,
                              stop_above: Optional[int] = None) -> int:
    """Bytes of activations one forward of ``model`` on ``inputs`` holds, from a run on the ``meta`` device (shapes
    only, nothing allocated), counted over leaf modules' outputs: ``training``, their sum (autograd keeps them until
    backward); otherwise the largest leaf input + output pair (the most one layer holds under ``no_grad``).

    An estimate, not a bound: functional ops between modules (residual adds, reshapes) are not counted. With
    ``stop_above``, the forward stops as soon as the estimate passes it and a value above it is returned."""
    total, largest = 0, 0

    def observe(module: nn.Module, args: Tuple[Any, ...], output: Any) -> None:
        nonlocal total, largest
        if next(module.children(), None) is not None:
            return
        out_bytes = _tensor_bytes(output)
        total += out_bytes
        largest = max(largest, _tensor_bytes(args) + out_bytes)
        if stop_above is not None and (total if training else largest) > stop_above:
            raise _OverBudget

    was_training = model.training
    handle = nn.modules.module.register_module_forward_hook(observe)
    try:
        with torch.set_grad_enabled(training):
            model.train(training)(*inputs)
    except _OverBudget:
        pass
    finally:
        handle.remove()
        model.train(was_training)
    return total if training else largest


def check_activation_size(build_on_meta: Callable[[], Optional[nn.Module]], inputs: Sequence[torch.Tensor],
                          training: bool, what: str) -> Optional[int]:
    """:func:`estimate_activation_bytes` of the model ``build_on_meta()`` builds on the ``meta`` device for
    ``inputs`` (``meta`` tensors of the batch to come), or a :class:`UsageError` naming ``what`` when it exceeds
    :data:`MAX_ACTIVATION_BYTES`: checked before the real first forward, so a crafted ``img_size`` or sequence
    length stops here. A model that cannot be built or run on ``meta`` skips the check (None is returned)."""
    max_bytes = MAX_ACTIVATION_BYTES
    try:
        model = build_on_meta()
        estimate = None if model is None else estimate_activation_bytes(model, inputs, training, max_bytes)
    except Exception:  # an op without a meta kernel, a data-dependent branch: the real forward will tell
        return None
    if estimate is not None and estimate > max_bytes:
        step = 'a training step' if training else 'one forward'
        raise UsageError(f'{what} would hold more than {max_bytes / 2 ** 30:.3g} GiB of activations in {step} '
                         f'(estimated on the meta device: at least {estimate / 2 ** 30:.3g} GiB; '
                         f'the bound is --max-activation-gib, mlp_vision.errors.MAX_ACTIVATION_BYTES in Python); '
                         f'reduce the batch size or the input size / sequence length, check the sizes given (a '
                         f'damaged or edited file?), or raise --max-activation-gib if the model is meant')
    return estimate


def add_bound_arguments(group: argparse._ActionsContainer, activations: bool = True) -> None:
    """``--max-params`` (:data:`MAX_PARAMS`) and, for a command that runs a forward pass (``activations``),
    ``--max-activation-gib`` (:data:`MAX_ACTIVATION_BYTES`): the opt-ins past the bounds on the sizes files may ask
    for, set for the command by :func:`size_bounds`."""
    group.add_argument('--max-params', type=float, default=None, metavar='N',
                       help=f'raises the bound on a model\'s parameter count (default {MAX_PARAMS:.0e}), checked '
                            f'before it is built: for a model this large that is meant, not a damaged or crafted '
                            f'checkpoint / config.json')
    if not activations:  # a flag accepted where it bounds nothing would be a silent no-op
        return
    group.add_argument('--max-activation-gib', type=float, default=None, metavar='GIB',
                       help=f'raises the bound on the activations one step may hold (default '
                            f'{MAX_ACTIVATION_BYTES // 2 ** 30} GiB, estimated on the meta device before the first '
                            f'batch): for a batch / input size this large that is meant')


def add_allow_regex_argument(group: argparse._ActionsContainer) -> None:
    """``--allow-regex`` (``args.allow_regex``): the command-line opt-in of the tokenizer readers' ``allow_regex``."""
    group.add_argument('--allow-regex', action='store_true', default=False,
                       help='UNSAFE: read a tokenizer.json whose pre-tokenizer or normalizer has a regular '
                            'expression; a crafted pattern can take minutes per text (backtracking). Only for '
                            'tokenizer files you made or whose maker you trust')


@contextlib.contextmanager
def size_bounds(args: argparse.Namespace) -> Iterator[None]:
    """:data:`MAX_PARAMS` and :data:`MAX_ACTIVATION_BYTES` as ``args``' ``--max-params`` / ``--max-activation-gib``
    say (absent or None: unchanged) for the ``with`` block, restored after it; a bound that is not a positive
    number is a UsageError."""
    global MAX_PARAMS, MAX_ACTIVATION_BYTES
    max_params, max_gib = getattr(args, 'max_params', None), getattr(args, 'max_activation_gib', None)
    for flag, value in (('--max-params', max_params), ('--max-activation-gib', max_gib)):
        if value is not None:
            check_range(flag, value, low=0, low_open=True)
    saved = MAX_PARAMS, MAX_ACTIVATION_BYTES
    MAX_PARAMS = saved[0] if max_params is None else int(max_params)
    MAX_ACTIVATION_BYTES = saved[1] if max_gib is None else int(max_gib * 2 ** 30)
    try:
        yield
    finally:
        MAX_PARAMS, MAX_ACTIVATION_BYTES = saved


def within_bounds(work: Callable[[argparse.Namespace], Any], args: argparse.Namespace) -> Any:
    """``work(args)`` under :func:`size_bounds` ``(args)``: a command's ``main`` in one expression."""
    with size_bounds(args):
        return work(args)


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


class RunError(RuntimeError):
    """A run that cannot go on (the loss became NaN, the disk is full); the message says what was kept."""
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
    """(status, one line) of a failure no input check rules out everywhere, as the module docstring lists them
    (None for any other error). A Rust panic (``pyo3_runtime.PanicException``) is a ``BaseException``; recursion
    and UTF-8 errors here are the net under the readers that name their file themselves."""
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
    """``main(argv)`` with the scripts' error path (see the module docstring); returns what ``main`` returns.
    torch's intra-op thread count is the caller's again afterwards: a command's ``--threads`` is for its run only."""
    threads = torch.get_num_threads()
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
    finally:
        torch.set_num_threads(threads)
    rank = int(os.environ.get('RANK', 0) or 0)
    line = f'{prog}: error: {" ".join(message.split())}'
    if rank == 0 or status == UsageError.exit_status:  # a run's stop is reported once, by rank 0 (it holds the files)
        print(line if rank == 0 else f'[rank {rank}] {line}', file=sys.stderr, flush=True)
    raise ScriptExit(status, line)
