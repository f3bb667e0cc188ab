""" Shared pieces of ``train.py`` and ``validate.py`` (repo root): datasets and loaders, model creation and
checkpoint loading, the training epoch and evaluation loop, checkpoints, distributed setup, outputs.

Built from timm's library pieces (``timm.data``, ``timm.optim``, ``timm.scheduler``, ``timm.loss``,
``timm.utils``); every function here has one implementation used by both scripts.
"""
from .errors import UsageError

__all__ = ['UsageError']
