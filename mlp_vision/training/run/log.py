""" Console / file logging of the commands (rank 0 logs INFO, other ranks WARNING).

Not timm's ``setup_default_logging``: it adds a stderr handler at every call (a second in-process run prints each
line twice) and its ``RotatingFileHandler`` opens ``train.log`` by name (through a planted link) and renames it
away at 2 MB, where a resumed run continues the one ``train.log``. """
import logging
import os
import sys
from pathlib import Path

from mlp_vision.training.run.checkpoint import open_own_file

__all__ = ['setup_logging', 'add_log_file', 'remove_log_file']


class _StdoutHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stdout`` is at the time (safe when a caller swaps stdout, e.g. pytest)."""
    stream = property(lambda self: sys.stdout, lambda self, value: None)


def setup_logging(primary: bool = True) -> None:
    """One plain-message stdout handler on the root logger (idempotent across in-process runs)."""
    root = logging.getLogger()
    if not any(isinstance(h, _StdoutHandler) for h in root.handlers):
        handler = _StdoutHandler()
        handler.setFormatter(logging.Formatter('%(message)s'))
        root.addHandler(handler)
    root.setLevel(logging.INFO if primary else logging.WARNING)


class _OwnFileHandler(logging.FileHandler):
    """A ``FileHandler`` that appends only to a regular file of its own, never through a symbolic link
    (:func:`~mlp_vision.training.run.checkpoint.open_own_file`)."""

    def _open(self):
        return open(open_own_file(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT), 'a',
                    encoding=self.encoding, errors=self.errors)


def add_log_file(path: Path) -> logging.Handler:
    """Also log to ``path`` (appending, so a resumed run continues the same file)."""
    handler = _OwnFileHandler(path, mode='a', encoding='utf-8')
    handler.setFormatter(logging.Formatter('%(asctime)s %(message)s', datefmt='%Y-%m-%d %H:%M:%S'))
    logging.getLogger().addHandler(handler)
    return handler


def remove_log_file(handler: logging.Handler) -> None:
    logging.getLogger().removeHandler(handler)
    handler.close()
