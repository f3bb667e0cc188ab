""" Moved: the language-model data is :mod:`mlp_vision.training.text.data` (the text trainers live in :mod:`mlp_vision.training.text`, so that
:mod:`mlp_vision.text` -- the models -- imports nothing from them). Running or importing this module stops with one
line naming the new place. """
import sys

MESSAGE = 'mlp_vision.text.data moved: use mlp_vision.training.text.data'

if __name__ == '__main__':
    print(f'error: {MESSAGE}', file=sys.stderr)
    sys.exit(2)
raise ImportError(MESSAGE)
