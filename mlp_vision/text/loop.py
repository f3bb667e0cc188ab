""" Moved: the text step loop is :mod:`mlp_vision.training.text.steps` (the text trainers live in :mod:`mlp_vision.training.text`, so that
:mod:`mlp_vision.text` -- the models -- imports nothing from them). Running or importing this module stops with one
line naming the new place. """
import sys

MESSAGE = 'python -m mlp_vision.text.loop moved: use python -m mlp_vision.train_text (code: mlp_vision.training.text.steps)'

if __name__ == '__main__':
    print(f'error: {MESSAGE}', file=sys.stderr)
    sys.exit(2)
raise ImportError(MESSAGE)
