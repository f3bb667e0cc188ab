""" ``--threads``: the intra-op threads of every command that computes (train, validate, benchmark, complexity,
visualize, fill-mask and the text trainer), one definition for all.

``--threads N`` sets ``torch.set_num_threads(N)`` for the command's run (N from 1 to the CPUs this process may
use: more only oversubscribe them, and ``torch.set_num_threads(100000)`` crashes the process). Without it a
command keeps PyTorch's count, lowered to the CPUs that are idle by the 1-minute load average (at least 1).
Why: PyTorch's default is one thread per CPU, and its OpenMP threads spin-wait for each other at every
parallel region; on a machine whose CPUs are busy with other work a waiting thread burns the time slice the
working one needs. Measured on the demo (``python train.py``) on 2 cores under load 6-8: PyTorch's 2 threads
took several times longer than 1 thread (``results/threads/README.md``). A count set before the command (the
``OMP_NUM_THREADS`` variable, ``torch.set_num_threads`` by an in-process caller, torchrun's 1 per process) is
never raised. The load average lags: right after another heavy job ends it still counts that job for a minute
or two, and picks fewer threads; ``--threads N`` decides.

:func:`~mlp_vision.errors.run_cli` restores the caller's count after every command, so ``--threads`` of an
in-process run does not leak into the caller.
"""
import argparse
import os
from typing import Optional

import torch

from mlp_vision.errors import check_range

__all__ = ['THREADS_RANGE', 'usable_cpus', 'add_threads_argument', 'default_threads', 'set_threads']


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask on Linux, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# --threads in every command: more threads than CPUs only oversubscribe them, and torch.set_num_threads(100000)
# crashes the process (SIGSEGV)
THREADS_RANGE = dict(low=1, high=usable_cpus(), why='the CPUs this process may use')


def add_threads_argument(container: argparse._ActionsContainer) -> None:
    """``--threads N`` (a parser or an argument group), read by :func:`set_threads`."""
    container.add_argument(
        '--threads', type=int, default=None, metavar='N',
        help=f'PyTorch intra-op threads for this run, 1 to {THREADS_RANGE["high"]} (default: PyTorch\'s count, '
             f'lowered to the idle CPUs by the 1-minute load average: on a busy machine extra threads spin-wait '
             f'and slow every step)')


def default_threads() -> int:
    """The count without ``--threads``: torch's present count, lowered to the idle CPUs (the machine's CPUs minus
    its 1-minute load average, rounded; at least 1)."""
    current = torch.get_num_threads()
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average on this system: keep torch's count
        return current
    idle = round((os.cpu_count() or 1) - load)
    return max(1, min(current, idle))


def set_threads(requested: Optional[int]) -> str:
    """Set torch's intra-op threads to ``requested`` (checked against :data:`THREADS_RANGE`) or, for None, to
    :func:`default_threads`; returns the line a command logs, e.g. ``'1 compute thread (2 CPUs, load 6.3; --threads
    N to choose)'``."""
    if requested is not None:
        check_range('--threads', requested, **THREADS_RANGE)
        threads, why = requested, '--threads'
    else:
        before = torch.get_num_threads()
        threads = default_threads()
        why = f'{usable_cpus()} CPUs, load {os.getloadavg()[0]:.1f}' if hasattr(os, 'getloadavg') else ''
        why += (', fewer than PyTorch\'s ' + str(before) if threads < before else '') + '; --threads N to choose'
    torch.set_num_threads(threads)
    return f'{threads} compute thread{"s" if threads > 1 else ""} ({why.lstrip("; ")})'
