""" The one door weights and model configs pass on their way into a model: a training checkpoint, ``--pretrained-path``,
a ``local-dir:`` folder, and ``timm.create_model(..., pretrained=True)`` in a user's own code (our models'
``checkpoint_filter_fn``, :func:`checked_filter`). Files are read without running code from them
(:func:`load_checkpoint_file`); every state dict passes :func:`check_state_dict` before a tensor enters a model.
At the top of the package because ``text/`` and ``models/`` use it and must not import the trainers.
"""
import dataclasses
import functools
import logging
import os
import pickle
import re
import stat
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .arguments import check_range, read_json_file
from .errors import UsageError, find_os_error, short_repr

__all__ = ['LoadReport', 'TRUST_FLAG', 'ALLOW_MISSING_FLAG', 'check_weights', 'refuse_damaged_weights',
           'check_state_dict', 'load_backbone', 'load_checkpoint_file', 'is_training_checkpoint',
           'clean_state_dict', 'load_model_weights', 'checked_filter', 'pretrained_filter', 'check_data_config',
           'read_model_folder', 'model_folder_weights', 'text_model_hint']

_logger = logging.getLogger(__name__)

TRUST_FLAG = '--trust-checkpoint'  # the scripts' opt-in to a full unpickle
ALLOW_MISSING_FLAG = '--allow-missing-weights'  # the scripts' opt-in to backbone tensors left at their init
_ZIP_MAGIC = b'PK\x03\x04'  # torch.save's default (zip) format
_LEGACY_MAGIC = b'\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19.'  # pickled magic number of the pre-1.6 format
MAX_INPUT_SIDE = 8192  # pixels; an input_size beyond it is damage, not a model (3 x 8192^2 floats = 0.8 GB)
CROP_MODES = ('center', 'squash', 'border')  # timm's eval crop modes
WEIGHTS_FILES = ('model.safetensors', 'pytorch_model.bin', 'pytorch_model.pth', 'model.pth')  # timm's, in its order


@dataclasses.dataclass
class LoadReport:
    """The state-dict keys of one :func:`check_state_dict` call, each list in model (or file) order."""
    loaded: List[str]  # model tensors taken from the file
    new: List[str]  # head tensors not taken (absent, or of another shape): they keep their init
    missing: List[str]  # non-head model tensors the file lacks: they keep their init
    unused: List[str]  # file tensors not loaded (the model lacks them, or has them in another shape)
    mismatched: List[str]  # tensors in both with other shapes (head ones are also in ``new``)


def check_weights(own: Mapping[str, torch.Tensor], state_dict: Mapping[str, object], source: str) -> None:
    """A :class:`~mlp_vision.errors.UsageError` naming ``source`` and the first bad entry of ``state_dict``: for a
    tensor the model has (``own``), a value that is not a tensor or not of the model's kind (integer / bool for
    floating point, or the reverse); for every floating-point tensor, NaN or infinite values."""
    for key, value in state_dict.items():
        mine = own.get(key)
        if mine is not None and not isinstance(value, torch.Tensor):
            kind = type(value).__name__
            raise UsageError(f'{source}: {key} is {"an" if kind[0] in "aeiou" else "a"} {kind}, not a tensor; the '
                             f'file is damaged or was crafted')
        if mine is not None and (value.is_floating_point() != mine.is_floating_point()
                                 or value.is_complex() != mine.is_complex()):
            raise UsageError(f'{source}: {key} holds {value.dtype} values, but the model\'s {key} is {mine.dtype}; '
                             f'expected {"floating-point" if mine.is_floating_point() else "integer"} weights')
        if isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            bad = int((~torch.isfinite(value)).sum())
            raise UsageError(f'{source}: {key} holds {bad} NaN / infinite value(s) of {value.numel()}; expected '
                             f'finite weights (saved from a diverged run?)')


def refuse_damaged_weights(module: nn.Module, state_dict: Dict[str, Any], prefix: str, *args) -> None:
    """A ``load_state_dict`` pre-hook our models register: what any loader (timm's ``load_checkpoint`` too) puts
    into ``module`` passes :func:`check_weights`; meta tensors are left alone."""
    own = {k: v for k, v in module.state_dict().items() if not v.is_meta}
    loaded = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)
              and not (isinstance(v, torch.Tensor) and v.is_meta)}
    name = (getattr(module, 'pretrained_cfg', None) or {}).get('architecture') or type(module).__name__
    check_weights(own, loaded, f'the state dict loaded into {name}')


def _short_list(keys: List[str], n: int = 4) -> str:
    return ', '.join(keys[:n]) + (f' and {len(keys) - n} more' if len(keys) > n else '')


def _misfit(report: LoadReport, shapes: List[str], sd: Mapping[str, torch.Tensor],
            own: Mapping[str, torch.Tensor]) -> str:
    """What keeps ``sd`` from fitting a model (``own``: its state dict): ``shapes``, the tensors of other shapes that
    count, then the missing and left-over ones; '' when it fits."""
    missing, unused = ([k for k in keys if k not in report.mismatched] for keys in (report.missing, report.unused))
    k = shapes[0] if shapes else ''
    return '; '.join(part for part in (
        f'{len(shapes)} tensors with other shapes (e.g. {k}: file {tuple(sd[k].shape)}, model {tuple(own[k].shape)})'
        if shapes else '',
        f'{len(missing)} model tensors missing from the file ({_short_list(missing)})' if missing else '',
        f'{len(unused)} file tensors the model does not have ({_short_list(unused)})' if unused else '') if part)


def check_state_dict(model: nn.Module, state_dict: Mapping[str, Any], source: str, head_prefixes: Sequence[str] = (),
                     keys: str = 'refuse') -> Tuple[Dict[str, torch.Tensor], LoadReport]:
    """``state_dict`` (prefixes of DDP / torch.compile stripped) and what it would load (:class:`LoadReport`), after
    :func:`check_weights`; else a :class:`UsageError` naming ``source``. ``head_prefixes``: the classifier, which may
    be absent or of another shape. Outside it, a tensor of another shape is an error; missing or left-over ones are
    an error (``keys='refuse'``: they would keep their random init), a WARNING (``'warn'``,
    ``--allow-missing-weights``) or left to the caller (``'report'``)."""
    if not isinstance(state_dict, Mapping) or not all(isinstance(k, str) for k in state_dict):
        raise UsageError(f'{source}: its weights are a {type(state_dict).__name__}, not a state dict (tensors by '
                         f'name); the file is damaged or holds other data')
    sd = clean_state_dict(state_dict)
    own = model.state_dict()
    check_weights(own, sd, source)
    head = tuple(head_prefixes)
    in_head = (lambda k: k.startswith(head)) if head else (lambda k: False)
    # a tied parameter (an LM decoder's weight) is in a file once, under its first name, which fills the others
    first = {id(p): name for name, p in model.named_parameters()}
    aliases = {name for name, p in model.named_parameters(remove_duplicate=False) if first[id(p)] != name}
    mismatched = [k for k in own if k in sd and tuple(sd[k].shape) != tuple(own[k].shape)]
    not_loaded = [k for k in own if (k not in sd or k in mismatched) and k not in aliases]
    report = LoadReport(
        loaded=[k for k in own if k in sd and k not in mismatched],
        new=[k for k in not_loaded if in_head(k)],
        missing=[k for k in not_loaded if not in_head(k)],
        unused=[k for k in sd if k not in own or k in mismatched],
        mismatched=mismatched)
    if keys == 'report':
        return sd, report
    name = (getattr(model, 'pretrained_cfg', None) or {}).get('architecture') or type(model).__name__
    shapes = [k for k in mismatched if not in_head(k)]  # always an error: the file is another architecture's
    detail = _misfit(report, shapes, sd, own)
    if shapes:
        raise UsageError(f'{source} does not fit {name}: {detail}. Expected weights of this architecture and settings '
                         f'(--model-kwargs, --img-size)')
    if detail and keys != 'warn':
        raise UsageError(f'{source} does not cover {name}: {detail}. These would keep their random init; pass '
                         f'{ALLOW_MISSING_FLAG} (in Python: pretrained_strict=False) if that is intended')
    if detail:
        _logger.warning(f'{ALLOW_MISSING_FLAG}: {source}: {detail}; the missing ones keep their random init')
    return sd, report


def load_backbone(model: nn.Module, state_dict: Mapping[str, torch.Tensor],
                  head_prefixes: Sequence[str] = (), source: str = 'the weights', keys: str = 'report') -> LoadReport:
    """Load every tensor of ``state_dict`` that ``model`` has in the same shape, after :func:`check_state_dict`
    (``keys='report'``: the caller reports what stays new, missing or unused); nothing when a check refuses."""
    sd, report = check_state_dict(model, state_dict, source, head_prefixes, keys)
    model.load_state_dict({k: sd[k] for k in report.loaded}, strict=False)
    return report


def load_checkpoint_file(path: os.PathLike, trust: bool = False, what: str = 'checkpoint') -> Dict[str, Any]:
    """A checkpoint file loaded on the CPU without running code from it (``torch.load(weights_only=True)``, or
    safetensors for ``.safetensors``); one that needs more (pickled objects: code) is refused unless ``trust``.
    Anything else (a bare pickle, random bytes, a truncated file) is a :class:`UsageError` naming it as ``what``."""
    path = Path(path)
    name = f'{what} {str(path)!r}'
    if not path.is_file():
        if path.is_dir() and (path / 'config.json').exists():
            raise UsageError(text_model_hint(path) or f'{name} is a model folder (config.json and its weights), not '
                                                      f'a file: give it as --model local-dir:{path} --pretrained')
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
    if kind is None:  # a bare pickle would run its code before torch.load saw that it is no checkpoint
        found = 'empty (0 bytes)' if not head else 'a bare Python pickle' if head[:1] == b'\x80' else 'other bytes'
        raise UsageError(f'{name} is {found}, not a PyTorch checkpoint (torch.save\'s zip or legacy format, or '
                         f'.safetensors); it is not loaded')
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True)
    except pickle.UnpicklingError as e:
        if not trust:
            found = re.search(r'GLOBAL ([\w.]+)', str(e))
            detail = f' (it names {found.group(1)})' if found else ''
            raise UsageError(f'{name} holds more than tensors and plain values{detail}: loading it would run code '
                             f'from the file. If you trust who made it, pass {TRUST_FLAG} (unsafe)') from None
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
    """``model.load_state_dict(strict=True)`` after :func:`check_state_dict`, else a :class:`UsageError` naming
    ``source``. Strict, not :func:`load_backbone`: a resumed or evaluated model takes every one of its tensors from
    the file, none left at its random init."""
    sd, report = check_state_dict(model, state_dict, source, keys='report')
    try:
        model.load_state_dict(sd, strict=True)
    except RuntimeError as e:
        detail = _misfit(report, report.mismatched, sd, model.state_dict())
        raise UsageError(f'{source} does not fit model {model_name}: {detail or e}. Expected a checkpoint of the same '
                         f'architecture and settings (--model, --model-kwargs, --img-size, --num-classes)') from e


def checked_filter(convert: Callable[[Dict[str, torch.Tensor], nn.Module], Dict[str, torch.Tensor]]) -> Callable:
    """A model family's ``checkpoint_filter_fn`` (timm's ``load_pretrained`` calls it) from its conversion
    ``convert``, with our commands' checks: :func:`check_data_config` of the ``pretrained_cfg``, then
    :func:`check_state_dict` of the converted weights, where the classifier may differ only for another class count
    (timm drops it), the stem only for other input channels (timm adapts it)."""
    @functools.wraps(convert)
    def checkpoint_filter_fn(state_dict: Dict[str, torch.Tensor], model: nn.Module,
                             keys: str = 'refuse') -> Dict[str, torch.Tensor]:
        cfg = getattr(model, 'pretrained_cfg', None) or {}
        where = cfg.get('file') or cfg.get('hf_hub_id') or cfg.get('url') or 'the state dict given'
        source = f'the pretrained weights of {cfg.get("architecture") or type(model).__name__} ({where})'
        check_data_config(cfg, f'{source}: pretrained_cfg')  # the weights' own channels: timm adapts the stem
        if not isinstance(state_dict, Mapping) or not all(isinstance(k, str) for k in state_dict):
            check_state_dict(model, state_dict, source, keys='report')  # its one line
        num_classes, in_chans = getattr(model, 'num_classes', None), getattr(model, 'in_chans', None)
        adapted = [cfg.get('classifier') if num_classes != cfg.get('num_classes', num_classes) else None,
                   cfg.get('first_conv') if in_chans != (cfg.get('input_size') or (in_chans,))[0] else None]
        head = tuple(f'{n}.' for names in adapted if names for n in ([names] if isinstance(names, str) else names))
        return check_state_dict(model, convert(clean_state_dict(state_dict), model), source, head, keys)[0]
    return checkpoint_filter_fn


def pretrained_filter(filter_fn: Callable, kwargs: Mapping[str, Any]) -> Callable:
    """timm's ``pretrained_filter_fn`` of ``filter_fn`` (a :func:`checked_filter`): backbone tensors may be missing
    only where the user passed ``pretrained_strict=False``, not a ``local-dir:`` ``config.json``'s ``model_args``."""
    saved = kwargs.get('pretrained_model_args') or {}
    if kwargs.get('pretrained_strict', True) is False and saved.get('pretrained_strict', True) is not False:
        return functools.partial(filter_fn, keys='warn')
    return filter_fn


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_data_config(cfg: Mapping[str, Any], where: str, in_chans: Optional[int] = None) -> None:
    """The preprocessing values of ``cfg`` (a ``pretrained_cfg``, a training checkpoint's ``data_cfg``) as timm uses
    them, else a :class:`UsageError` ``<where> <key> is <value>; expected ...``: ``input_size`` (C, H, W), C =
    ``in_chans`` where known; ``mean`` / ``std`` one finite number or one per channel (std > 0); ``crop_pct`` in
    (0, 1]; ``interpolation`` and ``crop_mode`` timm's. Absent (None / empty) values are the model's."""
    from timm.data.transforms import str_to_interp_mode
    if not isinstance(cfg, Mapping):
        raise UsageError(f'{where} is {short_repr(cfg)}, not a dict; the file is damaged or was crafted')
    size = cfg.get('input_size')
    channels = in_chans if in_chans is not None else size[0] if isinstance(size, (list, tuple)) and size else None
    if size is not None and not (isinstance(size, (list, tuple)) and len(size) == 3 and size[0] == channels and all(
            _is_int(n) and 1 <= n <= MAX_INPUT_SIDE for n in size)):
        raise UsageError(f'{where} input_size is {short_repr(size)}; expected ({channels or "C"}, H, W), the '
                         f'model\'s channels and H, W in [1, {MAX_INPUT_SIDE}] (whole numbers)')
    for key, bounds in (('mean', {}), ('std', dict(low=0, low_open=True))):
        values = cfg.get(key)
        if values is None:
            continue
        counts = f'1 or {channels}' if channels not in (None, 1) else '1'
        if not isinstance(values, (list, tuple)) or len(values) not in (1, channels or 1) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise UsageError(f'{where} {key} is {short_repr(values)}; expected {counts} numbers (a list)')
        for v in values:
            check_range(f'{where} {key}', v, **bounds)
    if cfg.get('crop_pct') is not None:
        check_range(f'{where} crop_pct', cfg['crop_pct'], low=0, high=1, low_open=True)
    interpolation = cfg.get('interpolation')
    if interpolation:
        try:
            str_to_interp_mode(interpolation)
        except (KeyError, TypeError):
            raise UsageError(f'{where} interpolation is {short_repr(interpolation)}; expected one of timm\'s: '
                             f'nearest, bilinear, bicubic, box, hamming, lanczos') from None
    if cfg.get('crop_mode') is not None and cfg['crop_mode'] not in CROP_MODES:
        raise UsageError(f'{where} crop_mode is {short_repr(cfg["crop_mode"])}; expected one of '
                         f'{", ".join(CROP_MODES)}')


def text_model_hint(folder: os.PathLike) -> Optional[str]:
    """The line for a text model's folder (``save_pretrained``, a transformers ``checkpoint-N``) given where an image
    model is expected; None for any other folder (a ``config.json`` that is no regular file is not read)."""
    path = Path(folder) / 'config.json'
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            return None
        cfg = read_json_file(str(path))
    except (OSError, UsageError):
        return None
    if not isinstance(cfg, dict) or 'architecture' in cfg or not isinstance(cfg.get('model_type'), str):
        return None
    return (f'{folder} is a text model ({cfg["model_type"]}, a transformers / mlp_vision.text folder), not an image '
            f'model: use it with the text commands (python -m mlp_vision.train_text --init-from {folder}, '
            f'mlp-vision-visualize {folder}) or transformers\' pipeline / AutoModel.from_pretrained in Python')


def read_model_folder(folder: os.PathLike) -> Dict[str, Any]:
    """The checked ``config.json`` of a ``local-dir:`` folder (timm's layout, or its older single-dict one), else a
    :class:`UsageError`: no folder, no ``config.json`` or one that is no regular file (refused unread), a text
    model's, or values of the wrong type or range."""
    import timm
    folder = Path(folder)
    path = folder / 'config.json'
    if not folder.is_dir():
        raise UsageError(f'local-dir:{folder}: {"no such folder" if not folder.exists() else "not a folder"}; '
                         f'expected a folder with config.json and model.safetensors (a training run\'s pretrained/)')
    if not path.is_file():  # follows links: a FIFO or a link to /dev/zero is refused unread
        kind = 'FIFO' if path.is_fifo() else 'device' if path.is_char_device() or path.is_block_device() else \
            'folder' if path.is_dir() else 'socket' if path.is_socket() else ''
        raise UsageError(f'{path} is a {kind}, not a regular file; expected a JSON config, and it is not read' if kind
                         else f'local-dir:{folder}: no config.json; expected a folder with config.json and '
                              f'model.safetensors (a training run\'s pretrained/)')
    cfg = read_json_file(str(path))
    hint = text_model_hint(folder)
    if hint:
        raise UsageError(hint)
    where = str(path)
    if not isinstance(cfg, dict):
        raise UsageError(f'{where} holds a {type(cfg).__name__}, not a JSON object (timm\'s model config)')
    pretrained_cfg = cfg.get('pretrained_cfg', cfg)  # timm's older single-dict layout has no pretrained_cfg
    model_args = cfg.get('model_args', {})
    arch = cfg.get('architecture')
    if not isinstance(arch, str) or not timm.is_model(arch):
        raise UsageError(f'{where}: architecture is {short_repr(arch)}; expected a model name timm knows (e.g. '
                         f'smlpnet_t, gmlp_s)')
    if not isinstance(pretrained_cfg, dict) or not isinstance(model_args, dict):
        bad = 'pretrained_cfg' if not isinstance(pretrained_cfg, dict) else 'model_args'
        raise UsageError(f'{where}: {bad} is {short_repr(cfg.get(bad))}; expected a JSON object')
    num_classes, in_chans = cfg.get('num_classes', pretrained_cfg.get('num_classes')), model_args.get('in_chans')
    for key, value, low in (('num_classes', num_classes, 0), ('model_args in_chans', in_chans, 1),
                            ('model_args num_classes', model_args.get('num_classes'), 0)):
        if value is not None and not (_is_int(value) and value >= low):
            raise UsageError(f'{where}: {key} is {short_repr(value)}; expected a whole number >= {low}')
    names = cfg.get('label_names', pretrained_cfg.get('label_names'))
    if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)
                                  and len(set(names)) == len(names) and len(names) == num_classes):
        raise UsageError(f'{where}: label_names is {short_repr(names)}; expected a list of {num_classes} distinct '
                         f'class names (strings), one per output')
    check_data_config(pretrained_cfg, f'{where}: pretrained_cfg', in_chans)
    return cfg


def model_folder_weights(folder: os.PathLike) -> Path:
    """The weights file timm reads from a ``local-dir:`` folder (:data:`WEIGHTS_FILES`, else the first
    ``*.safetensors``, ``*.pth``, ``*.bin``), else a :class:`UsageError`."""
    folder = Path(folder)
    found = [folder / name for name in WEIGHTS_FILES] + [p for ext in ('.safetensors', '.pth', '.bin')
                                                         for p in sorted(folder.glob(f'*{ext}'))]
    for path in found:
        if path.exists():
            return path
    raise UsageError(f'local-dir:{folder} has no weights file ({", ".join(WEIGHTS_FILES)}, *.safetensors, ...); '
                     f'a training run\'s pretrained/ holds model.safetensors beside config.json')
