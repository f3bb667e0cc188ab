""" mlp_vision: attention-free backbones (gMLP, sMLPNet, MLP-Mixer) for timm, and text models on the same blocks.

``import mlp_vision`` registers the vision models with timm::

    import mlp_vision, timm
    model = timm.create_model('smlpnet_t', features_only=True)
"""
__version__ = '0.1.0'

from . import layers
from . import models
from .models import MlpMixer, SparseMLPNet


def _registered_vision_models():
    """The names this package's model files registered with timm, read back from timm's registry (one source)."""
    from timm.models import list_models, model_entrypoint
    return tuple(name for name in list_models() if model_entrypoint(name).__module__.startswith(__name__ + '.models.'))


VISION_MODELS = _registered_vision_models()
