""" Moved: the classification trainer is :mod:`mlp_vision.training.text.classification`.

The text trainers live in :mod:`mlp_vision.training.text`, so that :mod:`mlp_vision.text` (the models)
imports nothing from them. Running or importing this module stops with one line naming the new place.
"""
from mlp_vision.errors import stop_moved_module

stop_moved_module(__name__, 'python -m mlp_vision.text.classification',
                  'python -m mlp_vision.train_text --task classify (code: mlp_vision.training.text.classification)')
