""" The ``features_only`` wrapper of every model here: timm's ``FeatureGetterNet`` (features from
``forward_intermediates``) that also loads the state dict of the classifier it was made from; and the builder.

``timm.create_model(name, features_only=True, checkpoint_path=ck)`` loads ``ck`` into the wrapper, whose keys are the
classifier's with a ``model.`` prefix and without the modules it pruned (head, final norm, later blocks): timm's
wrapper stops with missing and unexpected keys. :class:`FeatureBackbone` prefixes each key and drops only the keys
of the modules its own pruning removed; anything else fails the strict load as before (nothing dropped silently).
"""
from typing import Any, Callable, Dict, List, Sequence, Type, Union

import torch.nn as nn
from timm.models import build_model_with_cfg
from timm.models._features import FeatureGetterNet

from ..weights import pretrained_filter

__all__ = ['FeatureBackbone', 'build_model']


class FeatureBackbone(FeatureGetterNet):
    """timm's ``FeatureGetterNet`` (same arguments, same forward: a list of (B, C_i, H_i, W_i) maps of
    ``feature_info``) whose ``load_state_dict`` also takes the state dict of the unpruned classifier ``model``."""

    def __init__(self, model: nn.Module, *args, **kwargs):
        classifier_keys = list(model.state_dict())  # before the pruning in FeatureGetterNet.__init__
        super().__init__(model, *args, **kwargs)
        kept = set(self.model.state_dict())
        self.pruned_keys = tuple(k for k in classifier_keys if k not in kept)  # the classifier's keys no map uses
        self.register_load_state_dict_pre_hook(_classifier_state_to_features)


def _classifier_state_to_features(module: FeatureBackbone, state_dict: Dict[str, Any], prefix: str, *args) -> None:
    """A classifier's state dict (no key under ``model.``) -> this wrapper's, in place: ``model.`` + key, and the keys
    of the pruned modules left out. A state dict of the wrapper itself (``features.state_dict()``) is left as is."""
    keys: List[str] = [k for k in state_dict if k.startswith(prefix)]
    if not keys or any(k.startswith(prefix + 'model.') for k in keys):
        return
    pruned = set(module.pruned_keys)
    for k in keys:
        value = state_dict.pop(k)
        name = k[len(prefix):]
        if name not in pruned:
            state_dict[f'{prefix}model.{name}'] = value


def build_model(model_cls: Type[nn.Module], variant: str, pretrained: bool, filter_fn: Callable,
                default_out_indices: Union[int, Sequence[int]], **kwargs) -> nn.Module:
    """timm's ``build_model_with_cfg`` with the family's ``checkpoint_filter_fn`` and a ``features_only`` model that
    is a :class:`FeatureBackbone`: its getter runs ``forward_intermediates``, so it checks its input as the
    classifier does, and it loads a classifier's state dict (``create_model(checkpoint_path=...)``); its ``out_indices``
    are ``default_out_indices`` unless the caller gives them."""
    return build_model_with_cfg(
        model_cls, variant, pretrained, pretrained_filter_fn=pretrained_filter(filter_fn, kwargs),
        feature_cfg=dict(out_indices=default_out_indices, feature_cls=FeatureBackbone), **kwargs)
