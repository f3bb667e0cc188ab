#!/usr/bin/env python3
""" ``python benchmark.py`` in a checkout: the ``mlp_vision.benchmark`` command (installed: ``mlp-vision-benchmark`` or
``python -m mlp_vision.benchmark``); its flags and behaviour are documented there. """
from mlp_vision.benchmark import main

if __name__ == '__main__':
    main()
