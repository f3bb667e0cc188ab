""" ``--threads``: the intra-op threads of every command that computes, one definition for all.

``--threads N`` sets ``torch.set_num_threads(N)`` for the command's run (N from 1 to the CPUs this process may
use: more only oversubscribe them, and ``torch.set_num_threads(100000)`` crashes the process). Without it a
command computes with one thread, unless ``OMP_NUM_THREADS`` is set (torchrun sets it to 1 per process): then with
the count PyTorch took from it. The rule is fixed: it does not look at the machine's load, so the same command
computes the same way (and rounds the same way) whenever it runs.

Why one: PyTorch's own default, one OpenMP thread per CPU, spin-waits at every parallel region for a thread that
is not running as soon as another process holds a core; on the shared 2-core machine that made 3 demo epochs 6 to
16 times slower than one thread, for the same accuracy, and one thread was as fast or faster in every other run
measured there (the demo beside its loader worker; without a worker a second thread saved about a tenth):
``results/threads/README.md``. On a larger, quiet machine more threads help a larger model: ``--threads N``.
:func:`~mlp_vision.errors.run_cli` restores the caller's count after every command.
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
    """``--threads N`` (a parser or an argument group), read by :func:`set_threads`."""
    container.add_argument(
        '--threads', type=int, default=None, metavar='N',
        help=f'PyTorch intra-op threads for this run, 1 to {THREADS_RANGE["high"]} (default: 1, or OMP_NUM_THREADS '
             f'when set: on a shared CPU more threads spin-wait and slow every step several-fold)')


def default_threads() -> int:
    """The count without ``--threads``: torch's present count when ``OMP_NUM_THREADS`` is set (it chose that count),
    else 1 (one compute thread leaves the other CPUs to the run's data-loader processes)."""
    return torch.get_num_threads() if os.environ.get('OMP_NUM_THREADS') else 1


def set_threads(requested: Optional[int]) -> str:
    """Set torch's intra-op threads to ``requested`` (checked against :data:`THREADS_RANGE`) or, for None, to
    :func:`default_threads`; returns the line a command logs, e.g. ``'1 compute thread (the default; --threads N
    or OMP_NUM_THREADS to choose)'``."""
    if requested is not None:
        check_range('--threads', requested, **THREADS_RANGE)
        threads, why = requested, '--threads'
    else:
        threads = default_threads()
        why = ('OMP_NUM_THREADS; --threads N to choose' if os.environ.get('OMP_NUM_THREADS') else
               'the default; --threads N or OMP_NUM_THREADS to choose')
    torch.set_num_threads(threads)
    return f'{threads} compute thread{"s" if threads > 1 else ""} ({why})'


def set_run_threads(requested: Optional[int], resume_ckpt: Optional[dict]) -> str:
    """:func:`set_threads` for a training run: ``--threads``, else -- when resuming -- the count the run computed with
    (every checkpoint stores it as ``threads``: the thread count changes float rounding, e.g. gradients at 1e-6, so a
    resume is bit-identical to the uninterrupted run only with the same count; capped at this machine's CPUs), else
    :func:`default_threads`. Returns the line to log."""
    saved = (resume_ckpt or {}).get('threads')
    if requested is not None or isinstance(saved, bool) or not isinstance(saved, int) or saved < 1:
        return set_threads(requested)
    threads = min(saved, usable_cpus())
    torch.set_num_threads(threads)
    capped = f', capped from its {saved} at the CPUs here' if threads < saved else ''
    return (f'{threads} compute thread{"s" if threads > 1 else ""} (the count of the run it continues{capped}: results '
            f'are bit-identical to an uninterrupted run only with the same count; --threads N to choose)')
