""" Loading a backbone's weights into a model that may have another head (:func:`load_backbone`: fine-tuning an
image model, the official BiGS weights, the text classifier's ``--init-from``), and :func:`check_weights`, which
every loader of weights runs first (also ``from_pretrained`` and the strict
:func:`~mlp_vision.training.run.checkpoint.load_model_weights`): a tensor that cannot be right for any model (not a
tensor, integer values for a floating-point parameter, NaN or infinity) stops with one line naming the file and
the tensor before anything is loaded (``load_state_dict`` would cast integers silently, and NaN weights run
without a word).

At the top of the package because ``text/`` uses it and must not import the trainers. Missing, unexpected or
mis-shaped tensors are the caller's to report.
"""
import dataclasses
from typing import Dict, List, Mapping, Sequence

import torch
import torch.nn as nn

from .errors import UsageError

__all__ = ['LoadReport', 'check_weights', 'load_backbone', 'tied_aliases']


@dataclasses.dataclass
class LoadReport:
    """The state-dict keys of one :func:`load_backbone` call, each list in model (or file) order."""
    loaded: List[str]  # model tensors taken from the file
    new: List[str]  # head tensors not taken (absent, or of another shape): they keep their init
    missing: List[str]  # non-head model tensors the file lacks: they keep their init
    unused: List[str]  # file tensors not loaded (the model lacks them, or has them in another shape)
    mismatched: List[str]  # tensors in both with other shapes (head ones are also in ``new``)

    def mismatched_outside(self, head_prefixes: Sequence[str]) -> List[str]:
        """The shape-mismatched tensors outside the head: always an error (the file is another architecture)."""
        head = tuple(head_prefixes)
        return [k for k in self.mismatched if not (head and k.startswith(head))]


def tied_aliases(model: nn.Module) -> List[str]:
    """The state-dict names of parameters that repeat an earlier one (a tied LM decoder's weight is the embedding's):
    a file holds each tensor once, under its first name, and loading that name fills the alias."""
    first = {id(p): name for name, p in model.named_parameters()}  # remove_duplicate=True keeps the first name
    return [name for name, p in model.named_parameters(remove_duplicate=False) if first[id(p)] != name]


def check_weights(own: Mapping[str, torch.Tensor], state_dict: Mapping[str, object], source: str) -> None:
    """A :class:`~mlp_vision.errors.UsageError` naming ``source`` and the first bad entry of ``state_dict``: for a
    tensor the model has (``own``: its state dict), a value that is not a tensor or not of the model's kind
    (integer / bool for floating point, or the reverse, e.g. ``num_batches_tracked``); for every floating-point
    tensor (also under names a module renames while loading), NaN or infinite values."""
    for key, value in state_dict.items():
        mine = own.get(key)
        if mine is not None and not isinstance(value, torch.Tensor):
            kind = type(value).__name__
            raise UsageError(f'{source}: {key} is {"an" if kind[0] in "aeiou" else "a"} {kind}, not a tensor; the '
                             f'file is damaged or was crafted, and is not used')
        if mine is not None and (value.is_floating_point() != mine.is_floating_point()
                                 or value.is_complex() != mine.is_complex()):
            raise UsageError(f'{source}: {key} holds {value.dtype} values, but the model\'s {key} is '
                             f'{mine.dtype}; expected {"floating-point" if mine.is_floating_point() else "integer"} '
                             f'weights (the file is damaged, was crafted or holds other data), and it is not used')
        if isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            bad = int((~torch.isfinite(value)).sum())
            raise UsageError(f'{source}: {key} holds {bad} NaN / infinite value(s) of {value.numel()}; the weights '
                             f'are damaged (saved from a diverged run?) and are not used')


def load_backbone(model: nn.Module, state_dict: Mapping[str, torch.Tensor],
                  head_prefixes: Sequence[str] = (), source: str = 'the weights') -> LoadReport:
    """Load every tensor of ``state_dict`` (keys may carry DDP's ``module.``) that ``model`` has in the same shape;
    report what was loaded, what stays new, what is missing and what the file had in vain. ``head_prefixes`` name
    the task head (e.g. ``('head.',)``): its tensors may be absent or of another shape and are then ``new``. The
    model is changed only where a tensor is loaded, and not at all when :func:`check_weights` refuses one.
    """
    head = tuple(head_prefixes)
    in_head = (lambda k: k.startswith(head)) if head else (lambda k: False)
    own = model.state_dict()
    aliases = set(tied_aliases(model))
    if not isinstance(state_dict, Mapping) or not all(isinstance(k, str) for k in state_dict):
        raise UsageError(f'{source} is a {type(state_dict).__name__}, not a state dict (tensors by name); the file '
                         f'is damaged or holds other data')
    sd = {(k[len('module.'):] if k.startswith('module.') else k): v for k, v in state_dict.items()}
    check_weights(own, sd, source)
    mismatched = [k for k in own if k in sd and tuple(sd[k].shape) != tuple(own[k].shape)]
    usable: Dict[str, torch.Tensor] = {k: v for k, v in sd.items() if k in own and k not in mismatched}
    model.load_state_dict(usable, strict=False)
    not_loaded = [k for k in own if k not in usable and k not in aliases]
    return LoadReport(
        loaded=[k for k in own if k in usable],
        new=[k for k in not_loaded if in_head(k)],
        missing=[k for k in not_loaded if not in_head(k)],
        unused=[k for k in sd if k not in usable],
        mismatched=mismatched)
