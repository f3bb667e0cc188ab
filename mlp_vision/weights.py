""" The one door weights and model configs pass on their way into a model, whichever way they arrive: a training
checkpoint (``--resume``, ``--initial-checkpoint``, validate's ``--checkpoint``), ``--pretrained-path``, a
``local-dir:`` folder (a run's ``pretrained/``: ``config.json`` + ``model.safetensors``) through our commands, and
``timm.create_model(<our arch> or 'local-dir:...', pretrained=True)`` in a user's own code, through our models'
``checkpoint_filter_fn`` (:func:`checked_filter`).

* :func:`load_checkpoint_file` reads a file without running code from it (``torch.load(weights_only=True)`` or
  safetensors); a damaged, empty or truncated file is one line naming it.
* :func:`check_state_dict` is what every loader runs before a tensor enters a model: :func:`check_weights` (a
  tensor, of the model's kind, finite), and the keys: no tensor outside the classifier missing, left over or of
  another shape unless the user opted out (``--allow-missing-weights``, ``pretrained_strict=False`` in Python) -- a
  model called pretrained never keeps a random stem without a word.
* :func:`read_model_folder` checks a ``local-dir:`` folder and its ``config.json`` (a regular file, refused unread
  otherwise; the types of ``architecture``, ``num_classes``, ``label_names``) and :func:`check_data_config` the
  preprocessing it (or a checkpoint's ``data_cfg``, or a model's ``pretrained_cfg``) gives: ``mean`` / ``std``,
  ``crop_pct``, ``interpolation``, ``input_size``.

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

__all__ = ['LoadReport', 'TRUST_FLAG', 'ALLOW_MISSING_FLAG', 'check_weights', 'refuse_damaged_weights', 'check_state_dict', 'load_backbone',
           'tied_aliases', 'load_checkpoint_file', 'is_training_checkpoint', 'clean_state_dict', 'load_model_weights',
           'checked_filter', 'pretrained_filter', 'check_data_config', 'read_model_folder', 'model_folder_weights',
           'text_model_hint']

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

    def mismatched_outside(self, head_prefixes: Sequence[str]) -> List[str]:
        """The shape-mismatched tensors outside the head: always an error (the file is another architecture)."""
        head = tuple(head_prefixes)
        return [k for k in self.mismatched if not (head and k.startswith(head))]


def tied_aliases(model: nn.Module) -> List[str]:
    """The state-dict names of parameters that repeat an earlier one (a tied LM decoder's weight is the embedding's):
    a file holds each tensor once, under its first name, and loading that name fills the alias."""
    first = {id(p): name for name, p in model.named_parameters()}  # remove_duplicate=True keeps the first name
    return [name for name, p in model.named_parameters(remove_duplicate=False) if first[id(p)] != name]


def check_weights(own: Mapping[str, torch.Tensor], state_dict: Mapping[str, object], source: str) -> None:
    """A :class:`~mlp_vision.errors.UsageError` naming ``source`` and the first bad entry of ``state_dict``: for a
    tensor the model has (``own``: its state dict), a value that is not a tensor or not of the model's kind
    (integer / bool for floating point, or the reverse, e.g. ``num_batches_tracked``); for every floating-point
    tensor (also under names a module renames while loading), NaN or infinite values."""
    for key, value in state_dict.items():
        mine = own.get(key)
        if mine is not None and not isinstance(value, torch.Tensor):
            kind = type(value).__name__
            raise UsageError(f'{source}: {key} is {"an" if kind[0] in "aeiou" else "a"} {kind}, not a tensor; the '
                             f'file is damaged or was crafted, and is not used')
        if mine is not None and (value.is_floating_point() != mine.is_floating_point()
                                 or value.is_complex() != mine.is_complex()):
            raise UsageError(f'{source}: {key} holds {value.dtype} values, but the model\'s {key} is '
                             f'{mine.dtype}; expected {"floating-point" if mine.is_floating_point() else "integer"} '
                             f'weights (the file is damaged, was crafted or holds other data), and it is not used')
        if isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            bad = int((~torch.isfinite(value)).sum())
            raise UsageError(f'{source}: {key} holds {bad} NaN / infinite value(s) of {value.numel()}; the weights '
                             f'are damaged (saved from a diverged run?) and are not used')



def refuse_damaged_weights(module: nn.Module, state_dict: Dict[str, Any], prefix: str, *args) -> None:
    """A ``load_state_dict`` pre-hook our models register on themselves: the tensors loaded into ``module`` (those
    under ``prefix``) pass :func:`check_weights`, whoever calls ``load_state_dict`` -- also
    ``timm.create_model(name, checkpoint_path=...)`` and timm's ``load_checkpoint``, which read a file and load it
    strictly but do not look at its values. Meta tensors (a model built without data) are left alone."""
    own = {k: v for k, v in module.state_dict().items() if not v.is_meta}
    loaded = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)
              and not (isinstance(v, torch.Tensor) and v.is_meta)}
    name = (getattr(module, 'pretrained_cfg', None) or {}).get('architecture') or type(module).__name__
    check_weights(own, loaded, f'the state dict loaded into {name}')

def _short_list(keys: List[str], n: int = 4) -> str:
    return ', '.join(keys[:n]) + (f' and {len(keys) - n} more' if len(keys) > n else '')


def check_state_dict(model: nn.Module, state_dict: Mapping[str, Any], source: str, head_prefixes: Sequence[str] = (),
                     keys: str = 'refuse') -> Tuple[Dict[str, torch.Tensor], LoadReport]:
    """The check every state dict passes before it enters ``model``; returns it with DDP's ``module.`` and
    torch.compile's ``_orig_mod.`` prefixes stripped, and what it would load (:class:`LoadReport`).

    Always: a state dict (tensors by name) whose tensors pass :func:`check_weights`, else a :class:`UsageError`
    naming ``source``. ``head_prefixes`` name the classifier, whose tensors may be absent or of another shape (a
    fine-tuning head). ``keys``: ``'refuse'`` -- a tensor outside the head missing, left over or of another shape
    is an error (the file is another model's, or would leave part of it at random init); ``'warn'`` -- the user
    opted out (``--allow-missing-weights``): missing and left-over ones are a WARNING, other shapes still an error;
    ``'report'`` -- the caller reports them (a strict ``load_state_dict`` follows, which also sees keys a module
    renames while loading, or a caller with its own message).
    """
    if not isinstance(state_dict, Mapping) or not all(isinstance(k, str) for k in state_dict):
        raise UsageError(f'{source}: its weights are a {type(state_dict).__name__}, not a state dict (tensors by '
                         f'name); the file is damaged or holds other data')
    sd = clean_state_dict(state_dict)
    own = model.state_dict()
    check_weights(own, sd, source)
    head = tuple(head_prefixes)
    in_head = (lambda k: k.startswith(head)) if head else (lambda k: False)
    aliases = set(tied_aliases(model))
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
    wrong_shape = report.mismatched_outside(head)
    if wrong_shape:
        k = wrong_shape[0]
        raise UsageError(f'{source} does not fit {name}: {len(wrong_shape)} tensors with other shapes (e.g. {k}: '
                         f'file {tuple(sd[k].shape)}, model {tuple(own[k].shape)}). Expected weights of this '
                         f'architecture and settings (--model-kwargs, --img-size)')
    missing = [k for k in report.missing if k not in mismatched]
    unexpected = [k for k in report.unused if k not in mismatched]
    if missing or unexpected:
        detail = '; '.join(p for p in (
            f'{len(missing)} model tensors missing from the file ({_short_list(missing)})' if missing else '',
            f'{len(unexpected)} file tensors the model does not have ({_short_list(unexpected)})' if unexpected
            else '') if p)
        if keys != 'warn':
            raise UsageError(f'{source} does not cover {name}: {detail}. These would keep their random init; pass '
                             f'{ALLOW_MISSING_FLAG} (in Python: pretrained_strict=False) if that is intended')
        _logger.warning(f'{ALLOW_MISSING_FLAG}: {source}: {detail}; the missing ones keep their random init')
    return sd, report


def load_backbone(model: nn.Module, state_dict: Mapping[str, torch.Tensor],
                  head_prefixes: Sequence[str] = (), source: str = 'the weights', keys: str = 'report') -> LoadReport:
    """Load every tensor of ``state_dict`` that ``model`` has in the same shape, after :func:`check_state_dict`
    (``head_prefixes``, ``keys`` as there; by default the caller reports what stays new, missing or unused). The
    model is changed only where a tensor is loaded, and not at all when a check refuses the file."""
    sd, report = check_state_dict(model, state_dict, source, head_prefixes, keys)
    model.load_state_dict({k: sd[k] for k in report.loaded}, strict=False)
    return report


def load_checkpoint_file(path: os.PathLike, trust: bool = False, what: str = 'checkpoint') -> Dict[str, Any]:
    """Load a checkpoint file on the CPU without running code from it; a :class:`UsageError` (naming the file as
    ``what``) says why not. ``torch.save`` files load with ``weights_only=True``; one that needs more (pickled
    objects: code) is refused unless ``trust``. ``.safetensors`` files load with safetensors. Anything else (a bare
    pickle, random bytes, a truncated file) is refused with what it is."""
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
    after :func:`check_state_dict`, with a :class:`UsageError` naming ``source`` when the weights
    are another model's. Strict, not :func:`load_backbone`: modules may rename keys of older
    files while loading (``AxialSparseMLP``'s ``fuse`` -> ``fuse_conv``), which only ``load_state_dict`` sees."""
    ckpt, _ = check_state_dict(model, state_dict, source, keys='report')
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


def checked_filter(convert: Callable[[Dict[str, torch.Tensor], nn.Module], Dict[str, torch.Tensor]]) -> Callable:
    """A model family's ``checkpoint_filter_fn`` (what timm's ``load_pretrained`` calls with the file's state dict
    and the model) from its conversion ``convert``: the model's ``pretrained_cfg`` passes :func:`check_data_config`
    and the converted state dict :func:`check_state_dict`, so ``timm.create_model(..., pretrained=True)`` in a
    user's own code gets the checks our commands make. The classifier may be absent or of another shape only where
    the model has another class count than the weights (timm then drops it), the stem only where it has other input
    channels (timm adapts it). ``keys``: as in
    :func:`check_state_dict`, ``'warn'`` where the user passed ``pretrained_strict=False`` (:func:`pretrained_filter`).
    ``checkpoint_filter_fn.__wrapped__`` is ``convert``: our commands run the checks themselves."""
    @functools.wraps(convert)
    def checkpoint_filter_fn(state_dict: Dict[str, torch.Tensor], model: nn.Module,
                             keys: str = 'refuse') -> Dict[str, torch.Tensor]:
        cfg = getattr(model, 'pretrained_cfg', None) or {}
        where = cfg.get('file') or cfg.get('hf_hub_id') or cfg.get('url') or 'the state dict given'
        source = f'the pretrained weights of {cfg.get("architecture") or type(model).__name__} ({where})'
        check_data_config(cfg, f'{source}: pretrained_cfg')  # the weights' own channels: timm adapts the stem
        if not isinstance(state_dict, Mapping) or not all(isinstance(k, str) for k in state_dict):
            check_state_dict(model, state_dict, source, keys='report')  # its one line
        sd, _ = check_state_dict(model, convert(clean_state_dict(state_dict), model), source,
                                 _adapted_by_timm(model, cfg), keys)
        return sd
    return checkpoint_filter_fn


def _adapted_by_timm(model: nn.Module, cfg: Mapping[str, Any]) -> Tuple[str, ...]:
    """The prefixes of the tensors timm's ``load_pretrained`` changes after the filter: the classifier where the
    model has another class count than the weights (dropped), the stem where it has other input channels
    (adapted)."""
    def prefixes(names):
        return tuple(f'{n}.' for n in ((names,) if isinstance(names, str) else names or ()))
    num_classes, in_chans = getattr(model, 'num_classes', None), getattr(model, 'in_chans', None)
    source_chans = (cfg.get('input_size') or (in_chans,))[0]
    return ((prefixes(cfg.get('classifier')) if num_classes != cfg.get('num_classes', num_classes) else ())
            + (prefixes(cfg.get('first_conv')) if in_chans != source_chans else ()))


def pretrained_filter(filter_fn: Callable, kwargs: Mapping[str, Any]) -> Callable:
    """The ``pretrained_filter_fn`` for timm's ``build_model_with_cfg``: ``filter_fn`` (a :func:`checked_filter`),
    letting backbone tensors be missing only where the user passed ``pretrained_strict=False`` -- not where a
    ``local-dir:`` ``config.json``'s ``model_args`` did (timm gives both as the same argument)."""
    saved = kwargs.get('pretrained_model_args') or {}
    if kwargs.get('pretrained_strict', True) is False and saved.get('pretrained_strict', True) is not False:
        return functools.partial(filter_fn, keys='warn')
    return filter_fn


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_data_config(cfg: Mapping[str, Any], where: str, in_chans: Optional[int] = None) -> None:
    """The preprocessing values of ``cfg`` (a ``pretrained_cfg``, a ``config.json``'s, a training checkpoint's
    ``data_cfg``) as timm uses them, else a :class:`UsageError` ``<where> <key> is <value>; expected ...``:
    ``input_size`` (C, H, W) with C = ``in_chans`` where known and H, W in [1, :data:`MAX_INPUT_SIDE`]; ``mean`` /
    ``std`` one finite number or one per channel (std > 0); ``crop_pct`` in (0, 1]; ``interpolation`` one of
    timm's names; ``crop_mode`` one of :data:`CROP_MODES`. Absent (or None / empty) values are the model's."""
    from timm.data.transforms import str_to_interp_mode
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
    """The line for a text model's folder (a ``save_pretrained`` folder of :mod:`mlp_vision.text`, a transformers
    ``checkpoint-N``) given where an image model is expected; None for any other folder. The ``config.json`` is
    read only when it is a regular file."""
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
    """The checked ``config.json`` of a ``local-dir:`` folder (timm's layout: ``architecture``, ``num_classes``,
    ``label_names``, ``model_args``, ``pretrained_cfg``; or its older single-dict one), else a
    :class:`UsageError` naming the folder: no folder, no ``config.json`` or one that is no regular file (a FIFO, a
    device: refused unread), a text model's (:func:`text_model_hint`), or values of the wrong type or range
    (:func:`check_data_config` for the preprocessing)."""
    import timm
    folder = Path(folder)
    path = folder / 'config.json'
    if not folder.is_dir():
        raise UsageError(f'local-dir:{folder}: {"no such folder" if not folder.exists() else "not a folder"}; '
                         f'expected a folder with config.json and model.safetensors (a training run\'s pretrained/)')
    try:
        mode = path.stat().st_mode  # follows links: a link to /dev/zero is a device
    except OSError as e:
        raise UsageError(f'local-dir:{folder}: no readable config.json ({e.strerror}); expected a folder with '
                         f'config.json and model.safetensors (a training run\'s pretrained/)') from None
    if not stat.S_ISREG(mode):
        kind = 'FIFO' if stat.S_ISFIFO(mode) else 'device' if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else \
            'folder' if stat.S_ISDIR(mode) else 'socket'
        raise UsageError(f'{path} is a {kind}, not a regular file; expected a JSON config, and it is not read')
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
    num_classes = cfg.get('num_classes', pretrained_cfg.get('num_classes'))
    for key, value in (('num_classes', num_classes), ('model_args num_classes', model_args.get('num_classes'))):
        if value is not None and not (_is_int(value) and value >= 0):
            raise UsageError(f'{where}: {key} is {short_repr(value)}; expected a whole number >= 0')
    names = cfg.get('label_names', pretrained_cfg.get('label_names'))
    if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)
                                  and len(set(names)) == len(names) and len(names) == num_classes):
        raise UsageError(f'{where}: label_names is {short_repr(names)}; expected a list of {num_classes} distinct '
                         f'class names (strings), one per output')
    in_chans = model_args.get('in_chans')
    if in_chans is not None and not (_is_int(in_chans) and in_chans >= 1):
        raise UsageError(f'{where}: model_args in_chans is {short_repr(in_chans)}; expected a whole number >= 1')
    check_data_config(pretrained_cfg, f'{where}: pretrained_cfg', in_chans)
    return cfg


def model_folder_weights(folder: os.PathLike) -> Path:
    """The weights file timm reads from a ``local-dir:`` folder (the first of :data:`WEIGHTS_FILES` there, else the
    first ``*.safetensors``, ``*.pth``, ``*.bin`` by name), else a :class:`UsageError` naming the folder."""
    folder = Path(folder)
    found = [folder / name for name in WEIGHTS_FILES] + [p for ext in ('.safetensors', '.pth', '.bin')
                                                         for p in sorted(folder.glob(f'*{ext}'))]
    for path in found:
        if path.exists():
            return path
    raise UsageError(f'local-dir:{folder} has no weights file ({", ".join(WEIGHTS_FILES)}, *.safetensors, ...); '
                     f'a training run\'s pretrained/ holds model.safetensors beside config.json')
