#!/usr/bin/env python3
""" ``python validate.py`` in a checkout: the ``mlp_vision.validate`` command (installed: ``mlp-vision-validate`` or
``python -m mlp_vision.validate``); its flags and behaviour are documented there. """
from mlp_vision.validate import main

if __name__ == '__main__':
    main()
