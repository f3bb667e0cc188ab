""" Moved: the language-model data is :mod:`mlp_vision.training.text.data`.

The text trainers live in :mod:`mlp_vision.training.text`, so that :mod:`mlp_vision.text` (the models)
imports nothing from them. Running or importing this module stops with one line naming the new place.
"""
from mlp_vision.errors import stop_moved_module

stop_moved_module(__name__, 'mlp_vision.text.data',
                  'mlp_vision.training.text.data')
