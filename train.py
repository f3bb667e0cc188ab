#!/usr/bin/env python3
""" ``python train.py`` in a checkout: the ``mlp_vision.train`` command (installed: ``mlp-vision-train`` or
``python -m mlp_vision.train``); its flags and behaviour are documented there. """
from mlp_vision.train import main

if __name__ == '__main__':
    main()
