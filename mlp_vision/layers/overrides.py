""" One attribute of some modules set for the length of a ``with`` block: what a tool changes explicitly (FLOP
counters count the papers' formulation: the FFT route of the BiGS convolution, the token GEMM without its padding),
never a route the model takes by itself. """
import contextlib
from typing import Any, Iterable, Iterator

import torch.nn as nn

__all__ = ['attribute_set_to']


@contextlib.contextmanager
def attribute_set_to(modules: Iterable[nn.Module], name: str, value: Any) -> Iterator[None]:
    """Set ``module.<name> = value`` on every module of ``modules``; each one's own value is restored on exit."""
    modules = list(modules)
    saved = [getattr(m, name) for m in modules]
    try:
        for m in modules:
            setattr(m, name, value)
        yield
    finally:
        for m, old in zip(modules, saved):
            setattr(m, name, old)
