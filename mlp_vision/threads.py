""" ``--threads``: the intra-op threads of every command that computes, one definition for all.

``--threads N`` sets ``torch.set_num_threads(N)`` for the command's run (N from 1 to the CPUs this process may
use: more only oversubscribe them, and ``torch.set_num_threads(100000)`` crashes the process). Without it a
command keeps PyTorch's count, lowered to the CPUs the rest of the machine leaves idle: the CPUs minus the
1-minute load average minus this run's own data-loader processes, rounded, at least 1; a count set before the
command (``OMP_NUM_THREADS``, an in-process caller's, torchrun's 1 per process) is never raised.

Why: PyTorch's OpenMP threads spin-wait for each other at every parallel region, so when another process holds a
core every step waits for the thread that is not running: on the busy 2-core machine 3 demo epochs took 3-8 min
with PyTorch's 2 threads and 27-43 s with 1 (``results/threads/README.md``). The load average lags a minute or
two behind the machine; ``--threads N`` decides. :func:`~mlp_vision.errors.run_cli` restores the caller's count
after every command.
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
        help=f'PyTorch intra-op threads for this run, 1 to {THREADS_RANGE["high"]} (default: PyTorch\'s count, '
             f'lowered to the CPUs left idle by the 1-minute load average and this run\'s loader workers: on a busy '
             f'machine extra threads spin-wait and slow every step several-fold)')


def _load_average() -> Optional[float]:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average on this system
        return None


def default_threads(loader_workers: int = 0) -> int:
    """The count without ``--threads``: torch's present count, lowered to the idle CPUs -- the machine's CPUs minus
    its 1-minute load average and minus ``loader_workers`` (this run's data-loader processes, not yet in the load),
    rounded; at least 1. Without a load average, torch's count."""
    current = torch.get_num_threads()
    load = _load_average()
    if load is None:
        return current
    idle = round((os.cpu_count() or 1) - load - loader_workers)
    return max(1, min(current, idle))


def set_threads(requested: Optional[int], loader_workers: int = 0) -> str:
    """Set torch's intra-op threads to ``requested`` (checked against :data:`THREADS_RANGE`) or, for None, to
    :func:`default_threads`; returns the line a command logs, e.g. ``'1 compute thread (2 CPUs, load 6.3, 1 loader
    worker, fewer than PyTorch's 2; --threads N to choose)'``."""
    if requested is not None:
        check_range('--threads', requested, **THREADS_RANGE)
        threads, why = requested, '--threads'
    else:
        before, load = torch.get_num_threads(), _load_average()
        threads = default_threads(loader_workers)
        why = [f'{os.cpu_count() or 1} CPUs'] + ([f'load {load:.1f}'] if load is not None else [])
        why += [f'{loader_workers} loader worker{"s" if loader_workers > 1 else ""}'] if loader_workers else []
        why += [f'fewer than PyTorch\'s {before}'] if threads < before else []
        why = ', '.join(why) + '; --threads N to choose'
    torch.set_num_threads(threads)
    return f'{threads} compute thread{"s" if threads > 1 else ""} ({why})'


def set_run_threads(requested: Optional[int], resume_ckpt: Optional[dict], loader_workers: int = 0) -> str:
    """:func:`set_threads` for a training run: ``--threads``, else -- when resuming -- the count the run computed with
    (every checkpoint stores it as ``threads``: the thread count changes float rounding, e.g. gradients at 1e-6, so a
    resume is bit-identical to the uninterrupted run only with the same count; capped at this machine's CPUs), else
    :func:`default_threads`. Returns the line to log."""
    saved = (resume_ckpt or {}).get('threads')
    if requested is not None or isinstance(saved, bool) or not isinstance(saved, int) or saved < 1:
        return set_threads(requested, loader_workers)
    threads = min(saved, usable_cpus())
    torch.set_num_threads(threads)
    capped = f', capped from its {saved} at the CPUs here' if threads < saved else ''
    return (f'{threads} compute thread{"s" if threads > 1 else ""} (the count of the run it continues{capped}: results '
            f'are bit-identical to an uninterrupted run only with the same count; --threads N to choose)')
