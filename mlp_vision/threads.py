""" ``--threads``: the intra-op threads of every command that computes, one definition for all.

``--threads N`` sets ``torch.set_num_threads(N)`` (N from 1 to the CPUs this process may use). Without it: one
thread, or the count PyTorch took from ``OMP_NUM_THREADS`` when that is set (torchrun sets 1 per process). The rule
is fixed, never the machine's load, so a command rounds the same way whenever it runs. Why one: PyTorch's default
(a spin-waiting OpenMP thread per CPU) stalls whenever another process holds a core (``results/threads/README.md``);
a larger, quiet machine gives a larger model more with ``--threads N``. ``run_cli`` restores the caller's count.
"""
import argparse
import os
from typing import Optional

import torch

from mlp_vision.arguments import check_range

__all__ = ['THREADS_RANGE', 'usable_cpus', 'add_threads_argument', 'default_threads', 'set_threads',
           'set_run_threads']


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask on Linux, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


THREADS_RANGE = dict(low=1, high=usable_cpus(), why='the CPUs this process may use')


def add_threads_argument(container: argparse._ActionsContainer) -> None:
    container.add_argument(
        '--threads', type=int, default=None, metavar='N',
        help=f'PyTorch intra-op threads for this run, 1 to {THREADS_RANGE["high"]} (default: 1, or OMP_NUM_THREADS '
             f'when set: on a shared CPU more threads spin-wait and slow every step several-fold)')


def default_threads() -> int:
    """The count without ``--threads``: torch's when ``OMP_NUM_THREADS`` is set (it chose that count), else 1."""
    return torch.get_num_threads() if os.environ.get('OMP_NUM_THREADS') else 1


def _set(threads: int, why: str) -> str:
    torch.set_num_threads(threads)
    return f'{threads} compute thread{"s" if threads > 1 else ""} ({why})'


def set_threads(requested: Optional[int]) -> str:
    """Set torch's intra-op threads to ``requested`` (checked against :data:`THREADS_RANGE`), or for None to
    :func:`default_threads`; returns the line a command logs."""
    if requested is not None:
        check_range('--threads', requested, **THREADS_RANGE)
        return _set(requested, '--threads')
    return _set(default_threads(), 'OMP_NUM_THREADS; --threads N to choose' if os.environ.get('OMP_NUM_THREADS')
                else 'the default; --threads N or OMP_NUM_THREADS to choose')


def set_run_threads(requested: Optional[int], resume_ckpt: Optional[dict]) -> str:
    """:func:`set_threads` for a training run, except that a resume without ``--threads`` computes with the count of
    the run it continues (its checkpoint's ``threads``, capped at the CPUs here): the count changes float rounding,
    so only the same count resumes bit-identically. Returns the line to log."""
    saved = (resume_ckpt or {}).get('threads')
    if requested is not None or isinstance(saved, bool) or not isinstance(saved, int) or saved < 1:
        return set_threads(requested)
    capped = f', capped from its {saved} at the CPUs here' if saved > usable_cpus() else ''
    return _set(min(saved, usable_cpus()), f'the count of the run it continues{capped}: results are bit-identical to '
                f'an uninterrupted run only with the same count; --threads N to choose')
