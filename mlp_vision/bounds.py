""" Bounds on the sizes a file or a flag may ask a command to build: a model's parameters (:data:`MAX_PARAMS`,
counted on the ``meta`` device before anything is allocated), its blocks (:data:`MAX_BLOCKS`, counted from the
configuration before any block is built, so that a deep, narrow model is refused at once) and the activations of
its first step (:data:`MAX_ACTIVATION_BYTES`, estimated on ``meta``). A command raises them for its run with
``--max-params`` / ``--max-blocks`` / ``--max-activation-gib`` (:func:`size_bounds`); the module constants are the
defaults and never change: the bounds a check uses are a context variable, set only inside a ``with
size_bounds(...)`` block (for the thread or task that entered it, as ``decimal.localcontext``), so a command never
changes what another caller in the process sees.
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
           'check_model_size', 'estimate_activation_bytes', 'check_activation_size', 'add_bound_arguments',
           'size_bounds', 'within_bounds', 'BOUND_RANGES']


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
                         f'mlp_vision.bounds.MAX_PARAMS, {4 * max_params / 1e9:.0f} GB of float32 weights); '
                         f'expected sizes of a model this machine can hold: check the sizes given (a damaged or '
                         f'edited file?), or raise the bound with --max-params (mlp_vision.bounds.size_bounds in '
                         f'Python) if the model is meant')
    return None if model is None else sum(p.numel() for p in model.parameters())


# the activations one forward may hold (estimate_activation_bytes): a size read from a file (a checkpoint's img_size,
# a config.json's max_position_embeddings) can make the first step take more memory than any machine has. A training
# step at 224 px, batch 256 is estimated at 33-59 GiB (resnet50 to smlpnet_t, 2026-11-26); 256 GiB is beyond any
# single accelerator's memory. --max-activation-gib raises it (size_bounds).
MAX_ACTIVATION_BYTES = 256 * 2 ** 30

# the most blocks (residual blocks, transformer layers) a model may stack, counted from its configuration before
# anything is built: the deepest published models have a few hundred (ResNet-1001: 333 blocks); a depth of 100,000
# in a file or a flag is damaged or hostile, and building it (even on the meta device) would take minutes
MAX_BLOCKS = 1_000


class Bounds(NamedTuple):
    params: int
    activation_bytes: int
    blocks: int


# what the checks use: the defaults above, or what size_bounds set for its block
_BOUNDS = contextvars.ContextVar('mlp_vision_size_bounds', default=Bounds(MAX_PARAMS, MAX_ACTIVATION_BYTES, MAX_BLOCKS))


def current_bounds() -> Bounds:
    """The bounds the checks use here: :data:`MAX_PARAMS`, :data:`MAX_ACTIVATION_BYTES` and :data:`MAX_BLOCKS`
    unless a :func:`size_bounds` block around the caller raised them."""
    return _BOUNDS.get()


def check_block_count(count: int, what: str) -> None:
    """A :class:`UsageError` when ``what`` (the configuration value, e.g. ``depths=(100000, 1, 1, 1)``) asks for
    more than the bound's blocks: called by a model's constructor before it builds any block."""
    max_blocks = current_bounds().blocks
    if count > max_blocks:
        raise UsageError(f'{what} asks for {count:,} blocks, more than the bound of {max_blocks:,} '
                         f'(mlp_vision.bounds.MAX_BLOCKS; the deepest published models have a few hundred): lower '
                         f'it (a damaged or edited file?), or raise the bound with --max-blocks '
                         f'(mlp_vision.bounds.size_bounds(max_blocks=N) in Python) if the model is meant')


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
    max_bytes = current_bounds().activation_bytes
    try:
        model = build_on_meta()
        estimate = None if model is None else estimate_activation_bytes(model, inputs, training, max_bytes)
    except Exception:  # an op without a meta kernel, a data-dependent branch: the real forward will tell
        return None
    if estimate is not None and estimate > max_bytes:
        step = 'a training step' if training else 'one forward'
        raise UsageError(f'{what} would hold more than {max_bytes / 2 ** 30:.3g} GiB of activations in {step} '
                         f'(estimated on the meta device: at least {estimate / 2 ** 30:.3g} GiB; '
                         f'the bound is --max-activation-gib, mlp_vision.bounds.size_bounds in Python); '
                         f'reduce the batch size or the input size / sequence length, check the sizes given (a '
                         f'damaged or edited file?), or raise --max-activation-gib if the model is meant')
    return estimate


def add_bound_arguments(group: argparse._ActionsContainer, activations: bool = True) -> None:
    """``--max-params`` (:data:`MAX_PARAMS`), ``--max-blocks`` (:data:`MAX_BLOCKS`) and, for a command that runs a
    forward pass (``activations``), ``--max-activation-gib`` (:data:`MAX_ACTIVATION_BYTES`): the opt-ins past the
    bounds on the sizes files may ask for, set for the command by :func:`size_bounds`."""
    group.add_argument('--max-params', type=float, default=None, metavar='N',
                       help=f'raises the bound on a model\'s parameter count (default {MAX_PARAMS:.0e}), checked '
                            f'before it is built: for a model this large that is meant, not a damaged or crafted '
                            f'checkpoint / config.json')
    group.add_argument('--max-blocks', type=int, default=None, metavar='N',
                       help=f'raises the bound on a model\'s blocks / layers (default {MAX_BLOCKS:,}), checked from '
                            f'its configuration before any block is built')
    if not activations:  # a flag accepted where it bounds nothing would be a silent no-op
        return
    group.add_argument('--max-activation-gib', type=float, default=None, metavar='GIB',
                       help=f'raises the bound on the activations one step may hold (default '
                            f'{MAX_ACTIVATION_BYTES // 2 ** 30} GiB, estimated on the meta device before the first '
                            f'batch): for a batch / input size this large that is meant')


# the range of each bound's flag (check_range's bounds, by destination): a count of parameters or blocks is a whole
# number of at least one (0.5 would round to a bound of 0), and no machine holds 2**30 GiB (an exbibyte) of
# activations (beyond, the byte count overflows a float)
BOUND_RANGES = {'max_params': dict(low=1, why='a parameter count'), 'max_blocks': dict(low=1, why='a block count'),
                'max_activation_gib': dict(low=0, high=2 ** 30, low_open=True, why='GiB of activations')}


@contextlib.contextmanager
def size_bounds(args: Optional[argparse.Namespace] = None, *, max_params: Optional[float] = None,
                max_activation_gib: Optional[float] = None, max_blocks: Optional[int] = None) -> Iterator[None]:
    """The checks of this module bounded, inside the ``with`` block, by ``max_params`` parameters,
    ``max_activation_gib`` GiB of activations and ``max_blocks`` blocks (from ``args``' ``--max-params`` /
    ``--max-activation-gib`` / ``--max-blocks`` when given; None: the bound around the block, by default the module's
    constants). A bound outside :data:`BOUND_RANGES` is a UsageError. Nothing outside the block (another thread, a
    later caller) sees it."""
    if args is not None:
        max_params, max_activation_gib, max_blocks = (getattr(args, name, None) for name in (
            'max_params', 'max_activation_gib', 'max_blocks'))
    for dest, value in (('max_params', max_params), ('max_activation_gib', max_activation_gib),
                        ('max_blocks', max_blocks)):
        if value is not None:
            check_range(f'--{dest.replace("_", "-")}', value, **BOUND_RANGES[dest])
    around = current_bounds()
    token = _BOUNDS.set(Bounds(
        around.params if max_params is None else int(max_params),
        around.activation_bytes if max_activation_gib is None else max(1, int(max_activation_gib * 2 ** 30)),
        around.blocks if max_blocks is None else int(max_blocks)))
    try:
        yield
    finally:
        _BOUNDS.reset(token)


def within_bounds(work: Callable[[argparse.Namespace], Any], args: argparse.Namespace) -> Any:
    """``work(args)`` under :func:`size_bounds` ``(args)``: a command's ``main`` in one expression."""
    with size_bounds(args):
        return work(args)
