""" timm model definitions; importing this package registers every model with timm. """
from .gmlp import *
from .mlp_mixer import *
from .smlpnet import *
