""" Console / file logging for train.py and validate.py (rank 0 logs INFO, other ranks WARNING). """
import logging
import sys
from pathlib import Path

__all__ = ['setup_logging', 'add_log_file', 'remove_log_file']


class _StdoutHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stdout`` is at the time (safe when a caller swaps stdout, e.g. pytest)."""

    def __init__(self):
        super().__init__(sys.stdout)

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value):
        pass


def setup_logging(primary: bool = True) -> None:
    """One plain-message stdout handler on the root logger (idempotent across in-process runs)."""
    root = logging.getLogger()
    if not any(isinstance(h, _StdoutHandler) for h in root.handlers):
        handler = _StdoutHandler()
        handler.setFormatter(logging.Formatter('%(message)s'))
        root.addHandler(handler)
    root.setLevel(logging.INFO if primary else logging.WARNING)


def add_log_file(path: Path) -> logging.Handler:
    """Also log to ``path`` (appending, so a resumed run continues the same file)."""
    handler = logging.FileHandler(path, mode='a')
    handler.setFormatter(logging.Formatter('%(asctime)s %(message)s', datefmt='%Y-%m-%d %H:%M:%S'))
    logging.getLogger().addHandler(handler)
    return handler


def remove_log_file(handler: logging.Handler) -> None:
    logging.getLogger().removeHandler(handler)
    handler.close()
