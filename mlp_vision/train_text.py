""" mlp_vision text training command: causal LM, masked LM or sequence classification with the text models of
:mod:`mlp_vision.text`. Run as ``mlp-vision-text-train`` or ``python -m mlp_vision.train_text``; ``--help`` lists the
flags, :mod:`mlp_vision.training.text` holds the trainers.

    python -m mlp_vision.train_text --task causal --model gpt_mlp_attention --train-file input.txt --steps 2000
"""
from mlp_vision.training.text.cli import main

__all__ = ['main']

if __name__ == '__main__':
    main(prog='python -m mlp_vision.train_text')
