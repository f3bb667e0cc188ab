""" mlp_vision: attention-free backbones (gMLP, sMLPNet, MLP-Mixer) for timm, and text models on the same blocks.

``import mlp_vision`` registers the vision models with timm::

    import mlp_vision, timm
    model = timm.create_model('smlpnet_t', features_only=True)
"""
__version__ = '0.1.0'

from . import layers
from . import models
from .models import MlpMixer, SparseMLPNet

# the names this package registers with timm (kept next to the models so they cannot drift)
VISION_MODELS = (
    'gmlp_ti', 'gmlp_s', 'gmlp_b',
    'smlpnet_t', 'smlpnet_t_a2', 'smlpnet_s', 'smlpnet_b',
    'mixer_s16', 'mixer_b16', 'mixer_l16',
)
