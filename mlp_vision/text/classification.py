""" Moved: the classification trainer is :mod:`mlp_vision.training.text.classification` (the text trainers live in :mod:`mlp_vision.training.text`, so that
:mod:`mlp_vision.text` -- the models -- imports nothing from them). Running or importing this module stops with one
line naming the new place. """
import sys

MESSAGE = 'python -m mlp_vision.text.classification moved: use python -m mlp_vision.train_text --task classify (code: mlp_vision.training.text.classification)'

if __name__ == '__main__':
    print(f'error: {MESSAGE}', file=sys.stderr)
    sys.exit(2)
raise ImportError(MESSAGE)
