#!/usr/bin/env python3
""" ``python benchmark.py`` in a checkout: the ``mlp_vision.benchmark`` command (installed: ``mlp-vision-benchmark`` or
``python -m mlp_vision.benchmark``); its flags and behaviour are documented there. Run from
the checkout, it also has the ``ref:`` contenders: the reference models kept with the tests (``tests/reference``). """
from pathlib import Path

from mlp_vision.benchmark import main

if __name__ == '__main__':
    main(reference_dir=Path(__file__).resolve().parent / 'tests' / 'reference')
