""" Bounds on the sizes a file or a flag may ask a command to build, checked before anything is allocated: a model's
parameters (:data:`MAX_PARAMS`, counted on the ``meta`` device), its blocks (:data:`MAX_BLOCKS`, from the
configuration before any block is built) and the activations of its first step (:data:`MAX_ACTIVATION_BYTES`,
estimated on ``meta``). ``--max-params`` / ``--max-blocks`` / ``--max-activation-gib`` raise them inside a ``with
size_bounds(args)`` block only (a context variable, as ``decimal.localcontext``); the constants never change.
"""
import argparse
import contextlib
import contextvars
from typing import Any, Callable, Iterator, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from mlp_vision.arguments import check_range
from mlp_vision.errors import UsageError

__all__ = ['MAX_PARAMS', 'MAX_ACTIVATION_BYTES', 'MAX_BLOCKS', 'Bounds', 'current_bounds', 'check_block_count',
           'check_model_size', 'check_activation_size', 'add_bound_arguments', 'size_bounds', 'within_bounds',
           'BOUND_RANGES']


# 2e9 parameters are 8 GB of float32 weights (32 GB with AdamW's state and the gradients): a size read from a file
# beyond it is far more likely damaged or hostile than meant
MAX_PARAMS = 2_000_000_000
# a training step at 224 px, batch 256 is estimated at 33-59 GiB; 256 GiB is beyond any single accelerator's memory
MAX_ACTIVATION_BYTES = 256 * 2 ** 30
# the deepest published models have a few hundred blocks (ResNet-1001: 333); building 100,000 (even on the meta
# device) would take minutes
MAX_BLOCKS = 1_000


class Bounds(NamedTuple):
    params: int
    activation_bytes: int
    blocks: int


# what the checks use: the defaults above, or what size_bounds set for its block
_BOUNDS = contextvars.ContextVar('mlp_vision_size_bounds', default=Bounds(MAX_PARAMS, MAX_ACTIVATION_BYTES, MAX_BLOCKS))


def current_bounds() -> Bounds:
    return _BOUNDS.get()


class _OverBudget(BaseException):
    """Raised inside a meta-device build as soon as the parameters registered pass the bound (a BaseException, so
    that no ``except Exception`` in a model's or the caller's build code takes it for a build error)."""


def check_model_size(build_on_meta: Callable[[], Optional[nn.Module]], what: str) -> Optional[int]:
    """The parameter count of the model ``build_on_meta()`` builds on ``meta`` (None for no model), or a
    :class:`UsageError` naming ``what`` as soon as the count passes the bound, before the rest is built."""
    max_params, seen, total = current_bounds().params, set(), 0

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
                         f'mlp_vision.bounds.MAX_PARAMS, {4 * max_params / 1e9:.0f} GB of float32 weights); check the '
                         f'sizes given (a damaged file?), or raise the bound with --max-params if the model is meant')
    return None if model is None else sum(p.numel() for p in model.parameters())


def check_block_count(count: int, what: str) -> None:
    """A :class:`UsageError` when ``what`` (``depths=(100000, 1, 1, 1)``) asks for more blocks than the bound."""
    max_blocks = current_bounds().blocks
    if count > max_blocks:
        raise UsageError(f'{what} asks for {count:,} blocks, more than the bound of {max_blocks:,} '
                         f'(mlp_vision.bounds.MAX_BLOCKS): lower it (a damaged file?), or raise the bound with '
                         f'--max-blocks if the model is meant')


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_tensor_bytes(v) for v in value)
    if isinstance(value, dict):  # transformers' ModelOutput is one
        return sum(_tensor_bytes(v) for v in value.values())
    return 0


def check_activation_size(build_on_meta: Callable[[], Optional[nn.Module]], inputs: Sequence[torch.Tensor],
                          training: bool, what: str) -> Optional[int]:
    """Bytes of activations one forward of the model ``build_on_meta()`` builds holds for the ``meta`` ``inputs``,
    over leaf modules: ``training``, the sum of their outputs (autograd keeps them); otherwise the largest input +
    output pair (functional ops between modules are not counted). A :class:`UsageError` naming ``what`` as soon as
    it passes the bound; None when the model cannot be built or run on ``meta``."""
    max_bytes, total, largest = current_bounds().activation_bytes, 0, 0

    def observe(module: nn.Module, args: Tuple[Any, ...], output: Any) -> None:
        nonlocal total, largest
        if next(module.children(), None) is None:
            total += _tensor_bytes(output)
            largest = max(largest, _tensor_bytes(args) + _tensor_bytes(output))
            if (total if training else largest) > max_bytes:
                raise _OverBudget

    try:
        model = build_on_meta()
        if model is None:
            return None
        was_training, handle = model.training, nn.modules.module.register_module_forward_hook(observe)
        try:
            with torch.set_grad_enabled(training):
                model.train(training)(*inputs)
        finally:
            handle.remove()
            model.train(was_training)
    except _OverBudget:
        estimate = total if training else largest
        raise UsageError(f'{what} would hold more than {max_bytes / 2 ** 30:.3g} GiB of activations in '
                         f'{"a training step" if training else "one forward"} (estimated on the meta device: at '
                         f'least {estimate / 2 ** 30:.3g} GiB; the bound is --max-activation-gib); reduce the batch '
                         f'size or the input size / sequence length, or raise the bound if the model is meant'
                         ) from None
    except Exception:  # an op without a meta kernel, a data-dependent branch: the real forward will tell
        return None
    return total if training else largest


# each bound's flag: (check_range's bounds, metavar, help). A count is a whole number >= 1 (0.5 would round to a bound
# of 0); no machine holds 2**30 GiB of activations (beyond, the byte count overflows a float)
_FLAGS = {
    'max_params': (dict(low=1, why='a parameter count'), 'N', f'raises the bound on a model\'s parameter count '
                   f'(default {MAX_PARAMS:.0e}), checked before it is built: for a model this large that is meant'),
    'max_blocks': (dict(low=1, why='a block count'), 'N', f'raises the bound on a model\'s blocks / layers (default '
                   f'{MAX_BLOCKS:,}), checked from its configuration before any block is built'),
    'max_activation_gib': (dict(low=0, high=2 ** 30, low_open=True, why='GiB of activations'), 'GIB',
                           f'raises the bound on the activations one step may hold (default '
                           f'{MAX_ACTIVATION_BYTES // 2 ** 30} GiB, estimated on the meta device before the first '
                           f'batch)'),
}
BOUND_RANGES = {dest: bounds for dest, (bounds, _, _) in _FLAGS.items()}  # by destination, for check_flag_ranges


def add_bound_arguments(group: argparse._ActionsContainer, activations: bool = True) -> None:
    """``--max-params``, ``--max-blocks`` and, for a command that runs a forward pass, ``--max-activation-gib``."""
    for dest, (_, metavar, text) in _FLAGS.items():
        if activations or dest != 'max_activation_gib':
            group.add_argument(f'--{dest.replace("_", "-")}', type=int if dest == 'max_blocks' else float,
                               default=None, metavar=metavar, help=text)


@contextlib.contextmanager
def size_bounds(args: Optional[argparse.Namespace] = None, *, max_params: Optional[float] = None,
                max_activation_gib: Optional[float] = None, max_blocks: Optional[int] = None) -> Iterator[None]:
    """The checks bounded inside the ``with`` block by these values (or ``args``' flags; None: the bound around the
    block), each checked against :data:`BOUND_RANGES`."""
    given = dict(max_params=max_params, max_activation_gib=max_activation_gib, max_blocks=max_blocks)
    if args is not None:
        given = {dest: getattr(args, dest, None) for dest in given}
    for dest, value in given.items():
        if value is not None:
            check_range(f'--{dest.replace("_", "-")}', value, **BOUND_RANGES[dest])
    around, gib = current_bounds(), given['max_activation_gib']
    token = _BOUNDS.set(Bounds(
        around.params if given['max_params'] is None else int(given['max_params']),
        around.activation_bytes if gib is None else max(1, int(gib * 2 ** 30)),
        around.blocks if given['max_blocks'] is None else int(given['max_blocks'])))
    try:
        yield
    finally:
        _BOUNDS.reset(token)


def within_bounds(work: Callable[[argparse.Namespace], Any], args: argparse.Namespace) -> Any:
    """``work(args)`` under :func:`size_bounds` ``(args)``: a command's ``main`` in one expression."""
    with size_bounds(args):
        return work(args)
