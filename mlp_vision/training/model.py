""" Model creation for train.py / validate.py: timm's factory with our models registered, clear errors, and
loading our training checkpoints, timm train.py checkpoints or foreign state dicts for evaluation. """
import logging
from typing import Any, Dict, Optional, Tuple

import timm
import torch.nn as nn

import mlp_vision  # noqa: F401  (registers gmlp_* / smlpnet_* / mixer_* with timm)
from .checkpoint import is_training_checkpoint, load_checkpoint_file, load_model_weights
from .errors import UsageError

__all__ = ['model_create_kwargs', 'create_model', 'create_model_for_eval']

_logger = logging.getLogger(__name__)


def model_create_kwargs(
        num_classes: Optional[int] = None,
        in_chans: Optional[int] = None,
        img_size: Optional[Any] = None,
        drop_rate: Optional[float] = None,
        drop_path_rate: Optional[float] = None,
        global_pool: Optional[str] = None,
        model_kwargs: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """The keyword arguments for ``timm.create_model`` (unset values are left to the model's defaults).

    ``model_kwargs`` (``--model-kwargs k=v ...``) come last and win over the dedicated flags.
    """
    kwargs = dict(num_classes=num_classes, in_chans=in_chans, img_size=img_size, drop_rate=drop_rate,
                  drop_path_rate=drop_path_rate, global_pool=global_pool)
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    if isinstance(kwargs.get('img_size'), list):
        kwargs['img_size'] = tuple(kwargs['img_size'])
    kwargs.update(model_kwargs or {})
    for k in ('depths', 'img_size', 'mlp_ratio'):  # yaml gives lists where the models document tuples
        if isinstance(kwargs.get(k), list):
            kwargs[k] = tuple(kwargs[k])
    return kwargs


def create_model(
        name: str,
        pretrained: bool = False,
        pretrained_file: Optional[str] = None,
        file_has_head: bool = False,
        **kwargs,
) -> nn.Module:
    """``timm.create_model`` with a :class:`UsageError` for an unknown name, bad kwargs or unloadable weights.

    ``pretrained_file`` loads a local file through the model's pretrained filter fn (official / timm layouts are
    converted, token-mixing weights resampled), as ``pretrained_cfg_overlay=dict(file=...)``. timm drops the
    file's classifier when ``num_classes`` differs from the model's pretrained config (fine-tuning); with
    ``file_has_head`` (evaluation) the file's classifier must fit ``num_classes`` and is loaded strictly.
    """
    if not name:
        raise UsageError('no model given: pass --model NAME (e.g. smlpnet_t, gmlp_ti, mixer_b16)')
    if not timm.is_model(name):
        ours = ', '.join(mlp_vision.VISION_MODELS)
        raise UsageError(f'unknown model {name!r}: use one of ours ({ours}) or any timm model name')
    if pretrained_file:
        pretrained = True
        overlay = dict(file=str(pretrained_file))
        if file_has_head and kwargs.get('num_classes') is not None:
            overlay['num_classes'] = kwargs['num_classes']
        kwargs['pretrained_cfg_overlay'] = overlay
    try:
        return timm.create_model(name, pretrained=pretrained, **kwargs)
    except TypeError as e:
        raise UsageError(f'model {name} does not take these arguments {kwargs}: {e}') from e
    except (RuntimeError, ValueError, KeyError) as e:
        msg = ' '.join(str(e).split())  # torch's load errors are multi-line lists
        if len(msg) > 600:
            msg = msg[:600] + ' ...'
        if pretrained_file:
            raise UsageError(
                f'{pretrained_file} does not load into {name} (through its checkpoint filter): {msg}. '
                f'Expected weights of this architecture (ours, timm\'s or the official layout)') from e
        if pretrained:
            raise UsageError(f'cannot load the pretrained weights of {name}: {msg}') from e
        raise UsageError(f'cannot build {name} with {kwargs}: {msg}') from e


def create_model_for_eval(
        name: Optional[str],
        checkpoint: Optional[str] = None,
        pretrained: bool = False,
        use_ema: bool = False,
        create_kwargs: Optional[Dict[str, Any]] = None,
) -> Tuple[nn.Module, Dict[str, Any]]:
    """Build a model and load weights for evaluation.

    * our training checkpoint: the model is rebuilt from the checkpoint's ``model_cfg``, with ``create_kwargs``
      (the explicitly given flags) on top; ``name`` defaults to the checkpoint's and must match it;
    * a timm train.py checkpoint (``arch`` + ``state_dict``): ``name`` defaults to ``arch``;
    * any other file: a state dict (ours, timm's, the official layout) loaded through the model's
      pretrained filter fn; ``name`` is required.

    Returns the model (eval mode, CPU) and info: ``source``, ``checkpoint_kind``, ``data_cfg`` (ours only),
    ``epoch``, ``model_name``, ``create_kwargs``.
    """
    create_kwargs = dict(create_kwargs or {})
    info: Dict[str, Any] = {'source': 'random init', 'checkpoint_kind': None, 'data_cfg': None, 'epoch': None}
    if checkpoint:
        ckpt = load_checkpoint_file(checkpoint)
        if is_training_checkpoint(ckpt):
            arch = ckpt['arch']
            if name and name != arch:
                raise UsageError(
                    f'checkpoint {checkpoint} was trained for model {arch!r}, not --model {name!r}: '
                    f'drop --model or pass --model {arch}')
            name = arch
            model_cfg = ckpt.get('model_cfg') or {}
            kwargs = dict(model_cfg.get('kwargs') or {})
            kwargs.update(create_kwargs)
            model = create_model(name, **kwargs)
            key = 'state_dict'
            if use_ema:
                if ckpt.get('state_dict_ema') is None:
                    raise UsageError(f'--use-ema: checkpoint {checkpoint} has no EMA weights '
                                     f'(it was trained without --model-ema)')
                key = 'state_dict_ema'
            load_model_weights(model, ckpt[key], f'checkpoint {checkpoint}', name)
            info.update(source=f'{checkpoint} ({key}, epoch {ckpt.get("epoch")})',
                        checkpoint_kind='ours' if 'model_cfg' in ckpt else 'timm-train',
                        data_cfg=ckpt.get('data_cfg'), epoch=ckpt.get('epoch'), create_kwargs=kwargs)
        else:
            if use_ema:
                raise UsageError(f'--use-ema: {checkpoint} is a plain state dict with no EMA weights')
            if not name:
                raise UsageError(f'{checkpoint} is a plain state dict: pass --model NAME to say which model it is for')
            kwargs = create_kwargs
            model = create_model(name, pretrained_file=checkpoint, file_has_head=True, **kwargs)
            info.update(source=f'{checkpoint} (state dict through the {name} filter)', checkpoint_kind='foreign',
                        create_kwargs=kwargs)
    else:
        kwargs = create_kwargs
        model = create_model(name, pretrained=pretrained, **kwargs)
        info.update(source='pretrained weights' if pretrained else 'random init', create_kwargs=kwargs)
        if not pretrained:
            _logger.warning(f'no --checkpoint or --pretrained: evaluating a randomly initialised {name}')
    info['model_name'] = name
    model.eval()
    return model, info
