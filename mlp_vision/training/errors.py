""" User-facing errors of the training and validation scripts. """

__all__ = ['UsageError']


class UsageError(ValueError):
    """Bad input from the user (a path, a flag, a dataset or a checkpoint that does not fit).

    The message says what was wrong and what is expected. ``train.py`` / ``validate.py`` turn it into a
    ``SystemExit`` with that message instead of a traceback; library callers get a ``ValueError``.
    """
