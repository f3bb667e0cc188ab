""" Safe loading of checkpoint files (ours, timm's train.py's, foreign state dicts, safetensors).

Our training checkpoints (:mod:`mlp_vision.training.run_files` writes them) are dicts of tensors and plain Python
values, so they load with ``torch.load(weights_only=True)``. No file is unpickled in full unless the caller passes
``trust=True`` (``--trust-checkpoint``): a full unpickle runs whatever code the file names.
"""
import logging
import os
import pickle
import re
from pathlib import Path
from typing import Any, Dict

import torch
import torch.nn as nn

from mlp_vision.errors import UsageError, find_os_error
from mlp_vision.weights import check_weights

__all__ = ['TRUST_FLAG', 'load_checkpoint_file', 'is_training_checkpoint', 'clean_state_dict', 'load_model_weights']

_logger = logging.getLogger(__name__)

TRUST_FLAG = '--trust-checkpoint'  # the scripts' opt-in to a full unpickle
_ZIP_MAGIC = b'PK\x03\x04'  # torch.save's default (zip) format
_LEGACY_MAGIC = b'\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19.'  # pickled magic number of the pre-1.6 format


def load_checkpoint_file(path: os.PathLike, trust: bool = False, what: str = 'checkpoint') -> Dict[str, Any]:
    """Load a checkpoint file on the CPU without running code from it; a :class:`UsageError` (naming the file as
    ``what``) says why not. ``torch.save`` files load with ``weights_only=True``; one that needs more (pickled
    objects: code) is refused unless ``trust``. ``.safetensors`` files load with safetensors. Anything else (a bare
    pickle, random bytes, a truncated file) is refused with what it is."""
    path = Path(path)
    name = f'{what} {str(path)!r}'
    if not path.is_file():
        raise UsageError(f'{name} does not exist' if not path.exists() else f'{name} is not a file')
    if path.suffix == '.safetensors':
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        try:
            return load_file(str(path), device='cpu')
        except (SafetensorError, OSError, ValueError) as e:
            raise UsageError(f'{name} is not a readable safetensors file: {e}') from e
    with open(path, 'rb') as f:
        head = f.read(len(_LEGACY_MAGIC))
    kind = 'zip' if head.startswith(_ZIP_MAGIC) else 'legacy' if head == _LEGACY_MAGIC else None
    if not head:
        raise UsageError(f'{name} is empty (0 bytes), not a PyTorch checkpoint')
    if kind is None and head[:1] == b'\x80':
        raise UsageError(f'{name} is a bare Python pickle, not a PyTorch checkpoint (torch.save file); pickles can '
                         f'run code when loaded and are never loaded here')
    if kind is None:
        raise UsageError(f'{name} is not a PyTorch checkpoint (neither torch.save\'s zip nor its legacy format, '
                         f'nor .safetensors)')
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True)
    except pickle.UnpicklingError as e:
        if not trust:
            found = re.search(r'GLOBAL ([\w.]+)', str(e))
            detail = f' (it names {found.group(1)})' if found else ''
            raise UsageError(
                f'{name} holds more than tensors and plain Python values{detail}: loading it would unpickle '
                f'objects, which runs code from the file. If you trust who made it, pass {TRUST_FLAG} '
                f'(unsafe: it runs arbitrary code from the file)') from None
        _logger.warning(f'{TRUST_FLAG}: unpickling {path} in full (runs any code it contains)')
        try:
            ckpt = torch.load(path, map_location='cpu', weights_only=False)
        except Exception as e2:
            raise UsageError(f'cannot read {name}: {" ".join(str(e2).split())[:300]}') from e2
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        if find_os_error(e) is not None and not isinstance(e, (EOFError, ValueError)):
            raise
        raise UsageError(f'{name} is damaged or truncated ({kind} format): '
                         f'{" ".join(str(e).split())[:200]}') from None
    if not isinstance(ckpt, dict):
        raise UsageError(f'{name} holds a {type(ckpt).__name__}, expected a dict / state dict')
    return ckpt


def is_training_checkpoint(ckpt: Dict[str, Any]) -> bool:
    """A checkpoint written by a train.py (ours or timm's): a dict with ``state_dict`` and ``arch``."""
    return isinstance(ckpt.get('state_dict'), dict) and 'arch' in ckpt


def clean_state_dict(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Strip DDP's ``module.`` and torch.compile's ``_orig_mod.`` prefixes."""
    return {re.sub(r'^(module\.|_orig_mod\.)+', '', k): v for k, v in state_dict.items()}


def load_model_weights(model: nn.Module, state_dict: Dict[str, torch.Tensor], source: str, model_name: str) -> None:
    """``model.load_state_dict(strict=True)`` (``--resume``, ``--initial-checkpoint``, validate's ``--checkpoint``)
    after :func:`~mlp_vision.weights.check_weights`, with a :class:`UsageError` naming ``source`` when the weights
    are another model's. Strict, not :func:`~mlp_vision.weights.load_backbone`: modules may rename keys of older
    files while loading (``AxialSparseMLP``'s ``fuse`` -> ``fuse_conv``), which only ``load_state_dict`` sees."""
    if not isinstance(state_dict, dict) or not all(isinstance(k, str) for k in state_dict):
        raise UsageError(f'{source}: its weights are a {type(state_dict).__name__}, not a state dict (tensors by '
                         f'name); the file is damaged or holds other data')
    ckpt = clean_state_dict(state_dict)
    check_weights(model.state_dict(), ckpt, source)
    try:
        model.load_state_dict(ckpt, strict=True)
        return
    except RuntimeError as e:
        result_error = e
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(ckpt)), sorted(set(ckpt) - set(own))
    shape = [k for k in sorted(set(own) & set(ckpt)) if tuple(ckpt[k].shape) != tuple(own[k].shape)]
    parts = [f'{len(missing)} weights missing (e.g. {", ".join(missing[:3])})'] if missing else []
    if unexpected:
        parts.append(f'{len(unexpected)} unexpected (e.g. {", ".join(unexpected[:3])})')
    if shape:
        k = shape[0]
        parts.append(f'{len(shape)} with other shapes (e.g. {k}: checkpoint {tuple(ckpt[k].shape)}, '
                     f'model {tuple(own[k].shape)})')
    detail = '; '.join(parts) or str(result_error)
    raise UsageError(
        f'{source} does not fit model {model_name}: {detail}. Expected a checkpoint of the same architecture '
        f'and settings (--model, --model-kwargs, --img-size, --num-classes)') from result_error
