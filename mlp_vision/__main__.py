""" ``python -m mlp_vision``: the list of the package's commands. """
from .commands import describe

print(describe())
