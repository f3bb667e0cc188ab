""" Shared pieces of ``mlp_vision.train``, ``mlp_vision.validate`` (also ``train.py`` / ``validate.py`` at the
repository root) and ``mlp_vision.train_text``: the training core
(:mod:`.driver`: the one driver of every trainer and its task interface; :mod:`.run`: run setup, resume,
checkpoint payload, AMP + optimizer step, LR schedule, NaN / signal stops, results), datasets and loaders, model
creation and safe checkpoint loading, the image training epoch and evaluation loop, distributed setup, outputs,
and the one error path of the scripts (:mod:`.errors`).

Built from timm's library pieces (``timm.data``, ``timm.optim``, ``timm.scheduler``, ``timm.loss``,
``timm.utils``); every function here has one implementation used by both scripts.
"""
from mlp_vision.errors import RunError, UsageError

__all__ = ['UsageError', 'RunError']
