""" The image classifier of train.py / validate.py: creation (timm's factory, clear errors), weights of any kind
through :mod:`mlp_vision.weights` (the one door), the evaluation loop :func:`validate` (exact over distributed
ranks), the device and torchrun, AMP, ``torch.compile``, and the flags of these. """
import argparse
import dataclasses
import logging
import os
import reprlib
import sys
import time
from contextlib import suppress
from functools import partial
from typing import Any, Dict, Optional, Tuple

import timm
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from timm.data import resolve_data_config
from timm.utils import NativeScaler
from timm.utils.distributed import init_distributed_device_so

import mlp_vision  # noqa: F401  (registers gmlp_* / smlpnet_* / mixer_* with timm)
from mlp_vision.weights import (
    TRUST_FLAG, clean_state_dict, is_training_checkpoint, load_backbone, load_checkpoint_file,
    load_model_weights, model_folder_weights, read_model_folder, text_model_hint)
from mlp_vision.arguments import ParseKwargs, add_threads_argument, parse_device
from mlp_vision.bounds import add_bound_arguments, check_activation_size, check_model_size
from mlp_vision.errors import UsageError, short_repr
from mlp_vision.image_data import IMAGE_MODE_CHANNELS, INTERPOLATIONS, default_workers

__all__ = ['model_create_kwargs', 'resolve_model_data_config', 'create_model', 'load_pretrained_weights',
           'create_model_for_eval', 'validate', 'reports_top5', 'DistInfo', 'process_group_backend', 'init_device',
           'setup_amp', 'COMPILE_MODES', 'add_compile_arguments', 'compile_model', 'check_compile_backend',
           'add_common_arguments', 'add_device_arguments', 'add_dataset_arguments', 'add_input_arguments',
           'CROP_PCT_RANGE']

_logger = logging.getLogger(__name__)


def model_create_kwargs(model_kwargs: Optional[Dict[str, Any]] = None, **given) -> Dict[str, Any]:
    """The keyword arguments for ``timm.create_model``: ``given`` (``num_classes=``, ``img_size=``, ...; None: the
    model's default), then ``model_kwargs`` (``--model-kwargs k=v ...``), which win -- except a ``num_classes``
    other than the given one (``--num-classes``, or the data's class count): a :class:`UsageError`."""
    kwargs = {k: v for k, v in given.items() if v is not None}
    extra = model_kwargs or {}
    if extra.get('num_classes') is not None and kwargs.get('num_classes', extra['num_classes']) != extra['num_classes']:
        raise UsageError(f'--model-kwargs num_classes={short_repr(extra["num_classes"])}, but --num-classes (or the '
                         f'data) says {kwargs["num_classes"]} classes; drop num_classes from --model-kwargs '
                         f'(--num-classes sets it)')
    kwargs.update(extra)
    for k in ('depths', 'img_size', 'mlp_ratio'):  # yaml gives lists where the models document tuples
        if isinstance(kwargs.get(k), list):
            kwargs[k] = tuple(kwargs[k])
    return kwargs


def resolve_model_data_config(args, model: nn.Module, stored: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The preprocessing of ``model``: timm's ``resolve_data_config`` of the flags and the model; for each value no
    flag gives, ``stored`` (a training checkpoint's ``data_cfg``), else the input size the model was built for (its
    pretrained config does not know ``--model-kwargs img_size=...``); lists (yaml's, torch.load's) as tuples."""
    data_config = resolve_data_config(vars(args), model=model, verbose=False)
    stored = stored or {}
    given = {'input_size': args.input_size or args.img_size, 'interpolation': args.interpolation, 'mean': args.mean,
             'std': args.std, 'crop_pct': args.crop_pct, 'crop_mode': getattr(args, 'crop_mode', None)}
    for key, value in given.items():
        if not value and key in stored:
            data_config[key] = stored[key]
    if getattr(model, 'img_size', None) is not None and not given['input_size'] and 'input_size' not in stored:
        data_config['input_size'] = (data_config['input_size'][0], *model.img_size)
    return {k: (tuple(v) if isinstance(v, list) else v) for k, v in data_config.items()}


def is_local_dir(name: str) -> bool:
    """Whether ``name`` is ``local-dir:FOLDER``; the folder must pass :func:`~mlp_vision.weights.read_model_folder`."""
    if not name.startswith('local-dir:'):
        return False
    read_model_folder(name[len('local-dir:'):])
    return True


def _build_on_meta(name: str, kwargs: Dict[str, Any]) -> Optional[nn.Module]:
    """``name`` built with ``kwargs`` on the ``meta`` device (shapes only): through timm's ``device`` argument, else
    under ``torch.device('meta')``; None where that fails (an init reading values): the real build reports it."""
    try:  # any failure but the bound's (not an Exception) is left to the real build, which raises it again
        return timm.create_model(name, device='meta', **kwargs)
    except Exception as e:
        if not (isinstance(e, TypeError) and "'device'" in str(e)):
            return None
    try:
        with torch.device('meta'):
            return timm.create_model(name, **kwargs)
    except Exception:
        return None


def create_model(name: str, pretrained: bool = False, sizes_from: str = '', head_must_fit: bool = False,
                 allow_missing: bool = False, **kwargs) -> nn.Module:
    """``timm.create_model`` with a :class:`UsageError` for an unknown name, bad kwargs or unloadable weights, and for
    a model over :data:`~mlp_vision.bounds.MAX_PARAMS` parameters (counted on ``meta``; ``sizes_from``: where
    ``kwargs`` came from). A ``local-dir:`` folder's weights go through :func:`load_pretrained_weights`
    (``head_must_fit``, ``allow_missing`` as there), a registered name's through its checkpoint filter."""
    if not name:
        raise UsageError('no model given: pass --model NAME (e.g. smlpnet_t, gmlp_ti, mixer_b16)')
    if not (timm.is_model(name) or is_local_dir(name)):
        hint = text_model_hint(name) if os.path.isdir(name) else None
        raise UsageError(hint or f'unknown model {name!r}: use one of ours ({", ".join(mlp_vision.VISION_MODELS)}), '
                         f'any timm model name, or local-dir:FOLDER for a folder with a timm config.json (a training '
                         f'run\'s pretrained/)')
    if name.startswith('local-dir:') and pretrained:
        path = model_folder_weights(name[len('local-dir:'):])
        weights = load_checkpoint_file(path, what=f'{name} weights file')  # before the build
        model = create_model(name, sizes_from=sizes_from, **kwargs)
        stored = model.pretrained_cfg.get('num_classes')
        load_pretrained_weights(model, model.pretrained_cfg['architecture'], weights, str(path),
                                head_must_fit=head_must_fit or getattr(model, 'num_classes', None) == stored,
                                allow_missing=allow_missing)
        return model
    if pretrained and allow_missing:
        kwargs['pretrained_strict'] = False  # the user's opt-out, which our checkpoint filters honour (weights.py)
    try:
        what = f'model {name} with {short_repr(kwargs)}' + (f' (from {sizes_from})' if sizes_from else '')
        check_model_size(lambda: _build_on_meta(name, kwargs), what)
        return timm.create_model(name, pretrained=pretrained, **kwargs)
    except UsageError:
        raise
    except TypeError as e:
        raise UsageError(f'model {name} does not take these arguments {short_repr(kwargs)}: {e}') from e
    except OSError as e:
        if not pretrained:
            raise
        # the hub's "not cached and no connection" (a FileNotFoundError) and urllib's URLError are OSErrors
        raise UsageError(f'the pretrained weights of {name} are not in the local cache and could not be downloaded '
                         f'({type(e).__name__}: {" ".join(str(e).split())[:160]}); give the downloaded file itself: '
                         f'train.py --pretrained-path FILE, validate.py --checkpoint FILE, visualize FILE --model '
                         f'{name} (in Python: pretrained_cfg_overlay=dict(file=FILE))') from e
    except (RuntimeError, ValueError, KeyError, AssertionError) as e:  # timm asserts on e.g. a global-pool name
        msg = ' '.join(str(e).split())  # torch's load errors are multi-line lists
        what = f'load the pretrained weights of {name}' if pretrained else f'build {name} with {short_repr(kwargs)}'
        raise UsageError(f'cannot {what}: {msg[:600]}{" ..." * (len(msg) > 600)}') from e


def check_activations(name: str, kwargs: Dict[str, Any], input_size: Tuple[int, ...], batch_size: int,
                      training: bool, sizes_from: str = '') -> None:
    """Refuse (:func:`~mlp_vision.bounds.check_activation_size`, on ``meta``) a model whose forward of a
    ``batch_size`` batch of ``input_size`` (C, H, W) images exceeds the activation bound; ``training``: autograd keeps
    every layer's output (False: evaluation, gradient checkpointing)."""
    what = (f'model {name} with {short_repr(kwargs)} at input {tuple(input_size)}, batch {batch_size}'
            + (f' (sizes from {sizes_from})' if sizes_from else ''))
    images = torch.empty(batch_size, *input_size, device='meta')
    check_activation_size(lambda: _build_on_meta(name, kwargs), [images], training, what)


def load_pretrained_weights(model: nn.Module, name: str, state_dict: Dict[str, torch.Tensor], source: str,
                            head_must_fit: bool = False, allow_missing: bool = False) -> None:
    """Load a state dict of another layout (official, timm's, ours) through ``name``'s checkpoint filter, then
    :func:`~mlp_vision.weights.load_backbone`'s checks: every backbone tensor in the file and fitting (else a
    :class:`UsageError`; ``allow_missing``: a WARNING, random init kept). A classifier of another class count is
    dropped with a WARNING (fine-tuning) unless ``head_must_fit`` (evaluation)."""
    if is_training_checkpoint(state_dict):
        state_dict = state_dict['state_dict']
    if not isinstance(state_dict, dict) or not all(isinstance(k, str) for k in state_dict):
        raise UsageError(f'{source} is a {type(state_dict).__name__} of other keys, not a state dict (tensors by '
                         f'name); the file is damaged or holds other data')
    # timm's convention: a family's checkpoint_filter_fn lives beside its entrypoint; families without one load their
    # state dicts as they are. Ours are checked_filter's: their conversion alone (__wrapped__), checked below
    convert = getattr(sys.modules.get(timm.models.model_entrypoint(name).__module__), 'checkpoint_filter_fn', None)
    convert = getattr(convert, '__wrapped__', convert)
    state_dict = clean_state_dict(state_dict)
    try:
        if convert is not None:
            state_dict = convert(state_dict, model)
    except (KeyError, ValueError, RuntimeError, IndexError, AttributeError, TypeError) as e:  # e.g. an int, no .shape
        raise UsageError(f'{source} does not convert to {name} (through its checkpoint filter): '
                         f'{" ".join(str(e).split())[:300]}') from e
    heads = (getattr(model, 'pretrained_cfg', None) or {}).get('classifier') or 'head'
    heads = () if head_must_fit else tuple(f'{n}.' for n in ((heads,) if isinstance(heads, str) else heads))
    report = load_backbone(model, state_dict, heads, source, keys='warn' if allow_missing else 'refuse')
    dropped = [k for k in report.mismatched if k in report.new]  # a classifier of another class count
    if report.new:
        why = f' (the file\'s classifier has another class count: {", ".join(dropped)} dropped)' if dropped else ''
        _logger.warning(f'{source}: classifier weights not loaded{why}; {", ".join(report.new)} start at random '
                        f'init (fine-tuning for {getattr(model, "num_classes", "?")} classes)')


def _check_saved_fields(ckpt: Dict[str, Any], checkpoint: str) -> None:
    """A training checkpoint's ``arch``, ``model_cfg`` and ``class_names`` as train.py writes them, else a
    :class:`UsageError` showing the bounded ``repr`` before any is used: they are data from whoever made the file."""
    cfg, names = ckpt.get('model_cfg'), ckpt.get('class_names')
    kwargs = cfg.get('kwargs') if isinstance(cfg, dict) else None
    for key, fits, expected in (
            ('arch', isinstance(ckpt.get('arch'), str) and ckpt['arch'], 'a model name'),
            ('model_cfg', cfg is None or isinstance(cfg, dict) and isinstance(cfg.get('name', ''), str) and (
                kwargs is None or isinstance(kwargs, dict) and all(isinstance(k, str) for k in kwargs)),
             'a {name, kwargs: {argument: value}} dict'),
            ('class_names', names is None or isinstance(names, (list, tuple)) and names and all(
                isinstance(n, str) for n in names) and len(set(names)) == len(names),
             'a list of distinct class names (strings)')):
        if not fits:
            raise UsageError(f'checkpoint {checkpoint}: its {key} is {reprlib.repr(ckpt.get(key))}, not {expected}; '
                             f'the file is damaged or was crafted, and is not used')


def create_model_for_eval(name: Optional[str], checkpoint: Optional[str] = None, pretrained: bool = False,
                          use_ema: bool = False, create_kwargs: Optional[Dict[str, Any]] = None,
                          trust_checkpoint: bool = False) -> Tuple[nn.Module, Dict[str, Any]]:
    """A model with weights for evaluation: from a training checkpoint (ours or timm's: rebuilt from its ``arch`` and
    ``model_cfg``, ``create_kwargs`` on top; ``name``, if given, must match), any other state dict through the
    model's filter (``name`` required), or ``pretrained``. Returns the model (eval mode, CPU) and info: ``source``,
    ``checkpoint_kind``, ``data_cfg``, ``epoch``, ``model_name``, ``create_kwargs``, ``class_names`` (label order;
    None where the weights have none)."""
    create_kwargs = dict(create_kwargs or {})
    info: Dict[str, Any] = {'source': 'random init', 'checkpoint_kind': None, 'data_cfg': None, 'epoch': None,
                            'class_names': None, 'create_kwargs': create_kwargs}
    ckpt = load_checkpoint_file(checkpoint, trust=trust_checkpoint, what='--checkpoint') if checkpoint else None
    if ckpt is not None and is_training_checkpoint(ckpt):
        _check_saved_fields(ckpt, checkpoint)
        if name and name != ckpt['arch']:
            raise UsageError(f'checkpoint {checkpoint} was trained for model {ckpt["arch"]!r}, not --model {name!r}: '
                             f'drop --model or pass --model {ckpt["arch"]}')
        name, key = ckpt['arch'], 'state_dict_ema' if use_ema else 'state_dict'
        kwargs = {**((ckpt.get('model_cfg') or {}).get('kwargs') or {}), **create_kwargs}  # given flags win
        model = create_model(name, sizes_from=f"checkpoint {checkpoint}'s model_cfg", **kwargs)
        if ckpt.get(key) is None:
            raise UsageError(f'--use-ema: checkpoint {checkpoint} has no EMA weights (it was trained without '
                             f'--model-ema)')
        load_model_weights(model, ckpt[key], f'checkpoint {checkpoint}', name)
        class_names = ckpt.get('class_names')
        if class_names is not None and len(class_names) != getattr(model, 'num_classes', len(class_names)):
            raise UsageError(f'checkpoint {checkpoint}: its class_names list {len(class_names)} classes, but its '
                             f'model has {model.num_classes} outputs; the file is damaged or was crafted')
        info.update(source=f'{checkpoint} ({key}, epoch {ckpt.get("epoch")})',
                    checkpoint_kind='ours' if 'model_cfg' in ckpt else 'timm-train', data_cfg=ckpt.get('data_cfg'),
                    epoch=ckpt.get('epoch'), create_kwargs=kwargs, class_names=class_names)
    elif ckpt is not None:
        if use_ema:
            raise UsageError(f'--use-ema: {checkpoint} is a plain state dict with no EMA weights')
        if not name:
            raise UsageError(f'{checkpoint} is a plain state dict: pass --model NAME to say which model it is for')
        model = create_model(name, **create_kwargs)
        load_pretrained_weights(model, name, ckpt, f'--checkpoint {checkpoint}', head_must_fit=True)
        info.update(source=f'{checkpoint} (state dict through the {name} filter)', checkpoint_kind='foreign')
    else:
        model = create_model(name, pretrained=pretrained, head_must_fit=True, **create_kwargs)
        if pretrained and name.startswith('local-dir:'):  # the folder's classes label the data, as a checkpoint's
            info.update(source=f'{name} (pretrained weights)', class_names=model.pretrained_cfg.get('label_names'))
        elif pretrained:
            info['source'] = 'pretrained weights'
        else:
            _logger.warning(f'no --checkpoint or --pretrained: evaluating a randomly initialised {name}')
    info['model_name'] = name
    model.eval()
    return model, info


def reports_top5(num_classes: int) -> bool:
    """Whether top-5 accuracy means anything: with 5 classes or fewer it is 100 % whatever the model does."""
    return num_classes > 5


@torch.no_grad()
def validate(model: nn.Module, loader, *, amp_autocast=suppress, channels_last: bool = False, distributed: bool = False,
             log_interval: int = 50, primary: bool = True) -> Dict[str, float]:
    """Top-1 / top-5 accuracy (%; ``top5`` None per :func:`reports_top5`), mean cross-entropy and images/s over the
    loader. Distributed: each rank evaluates its own samples (nothing padded) and the sums, kept on the device, are
    all-reduced once, so the numbers equal a one-process run."""
    model.eval()
    num_batches = len(loader)
    sums = None
    processed = 0
    start = time.perf_counter()
    for batch_idx, (input, target) in enumerate(loader):
        if channels_last:
            input = input.contiguous(memory_format=torch.channels_last)
        with amp_autocast():
            output = model(input)
        if isinstance(output, (tuple, list)):
            output = output[0]
        output = output.float()
        processed += len(target)
        loss = F.cross_entropy(output, target, reduction='sum')
        num_classes = output.shape[1]
        correct = output.topk(min(5, num_classes), dim=1).indices.eq(target[:, None])
        batch = torch.stack([loss.double(), correct[:, :1].sum().double(), correct.sum().double()])
        sums = batch if sums is None else sums + batch  # on the device: no host sync per batch
        if primary and log_interval and ((batch_idx + 1) % log_interval == 0 or batch_idx == num_batches - 1):
            elapsed = time.perf_counter() - start
            _logger.info(f'Test: [{batch_idx + 1:>{len(str(num_batches))}d}/{num_batches}]  '
                         f'{processed / max(elapsed, 1e-9):,.0f} img/s')
    if sums is None:
        raise RuntimeError('evaluation loader yielded no batches')
    sums = torch.cat([sums, sums.new_tensor([processed])])
    if distributed:
        dist.all_reduce(sums)
    seconds = time.perf_counter() - start
    loss_sum, c1, c5, n = sums.tolist()  # the evaluation's one host sync
    return {'loss': loss_sum / n, 'top1': 100. * c1 / n, 'top5': 100. * c5 / n if reports_top5(num_classes) else None,
            'samples': int(n), 'img_per_sec': n / seconds, 'seconds': seconds}


# ------------------------------------------------------------------------------------------------ device, AMP, compile
# timm's init_distributed_device_so reads torchrun's / SLURM's environment. Multi-node: the same command on every node
# with torchrun's rendezvous (README); set GLOO_SOCKET_IFNAME where the host name resolves to the wrong interface.
@dataclasses.dataclass
class DistInfo:
    """Where this process runs."""
    device: torch.device
    distributed: bool
    world_size: int
    rank: int
    local_rank: int

    @property
    def primary(self) -> bool:
        return self.rank == 0


def process_group_backend(device_type: str, dist_backend: Optional[str] = None) -> Optional[str]:
    """``init_process_group``'s backend on ``device_type``: ``dist_backend`` (``--dist-backend``), checked; else on
    CUDA ``'cpu:gloo,cuda:nccl'`` (object collectives -- RNG states, digests -- through gloo), elsewhere None (gloo)."""
    if dist_backend is None:
        return 'cpu:gloo,cuda:nccl' if device_type == 'cuda' else None
    names = [b for b in dist.Backend.backend_list if b not in ('undefined', 'fake')]
    devices = dist.Backend.default_device_backend_map  # the device types torch pairs with backends
    pairs = [part.partition(':') for part in dist_backend.split(',')]
    if dist_backend not in names and not all(sep and d in devices and name in names for d, sep, name in pairs):
        raise UsageError(f'--dist-backend {dist_backend!r} is not a torch.distributed backend; use one of '
                         f'{", ".join(names)}, or device:backend pairs such as cpu:gloo,cuda:nccl (default: '
                         f'cpu:gloo,cuda:nccl for CUDA, gloo for CPU)')
    return dist_backend


def init_device(device: Optional[str] = None, dist_backend: Optional[str] = None,
                dist_url: Optional[str] = None) -> DistInfo:
    """The device (default: cuda if available) and torchrun's process group; with CUDA, GPU ``LOCAL_RANK``."""
    if device is None:
        device = 'cuda' if torch.cuda.is_available() else 'cpu'
    device_type = parse_device(device).type
    dist_backend = process_group_backend(device_type, dist_backend)
    if device_type not in ('cpu', 'cuda'):
        _logger.warning(f'device type {device_type!r} is untested here (CPU and CUDA are)')
    if dist.is_available() and dist.is_initialized():
        # a second call in the same process (train.py's demo runs validate.py's code in-process): reuse the group
        local_rank = int(os.environ.get('LOCAL_RANK', 0))
        if device_type == 'cuda':
            device = f'cuda:{local_rank}'
        return DistInfo(torch.device(device), True, dist.get_world_size(), dist.get_rank(), local_rank)
    result = init_distributed_device_so(device=device, dist_backend=dist_backend, dist_url=dist_url)
    return DistInfo(torch.device(result['device']), result['distributed'], result['world_size'],
                    result['global_rank'], result['local_rank'])


def setup_amp(enabled: bool, dtype_name: Optional[str], device: torch.device):
    """(autocast context factory, timm's NativeScaler for float16 (CUDA) or None, dtype or None)."""
    if not enabled:
        return suppress, None, None
    dtype = getattr(torch, dtype_name or ('float16' if device.type == 'cuda' else 'bfloat16'))
    if dtype == torch.float16 and device.type != 'cuda':
        raise UsageError('--amp-dtype float16 needs CUDA; on the CPU use bfloat16 (the default)')
    scaler = NativeScaler(device=device.type) if dtype == torch.float16 else None
    return partial(torch.autocast, device_type=device.type, dtype=dtype), scaler, dtype


COMPILE_MODES = ('default', 'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs')  # torch.compile's modes


def add_compile_arguments(group) -> None:
    """``--torchcompile [BACKEND]`` and ``--torchcompile-mode``, the same flags in every command."""
    group.add_argument('--torchcompile', nargs='?', type=str, const='inductor', help='torch.compile (backend)')
    group.add_argument('--torchcompile-mode', type=str, choices=COMPILE_MODES, help='torch.compile mode')


def compile_model(model: nn.Module, args) -> nn.Module:
    """``torch.compile(model)`` as ``--torchcompile`` / ``--torchcompile-mode`` ask; ``model`` unchanged without."""
    return torch.compile(model, backend=args.torchcompile, mode=args.torchcompile_mode) if args.torchcompile else model


def check_compile_backend(backend: Optional[str]) -> None:
    """``--torchcompile BACKEND`` names a ``torch.compile`` backend (checked before anything is built)."""
    if backend and backend not in torch.compiler.list_backends(exclude_tags=()):
        raise UsageError(f'--torchcompile {backend!r} is not a torch.compile backend (e.g. inductor; all: '
                         f'torch.compiler.list_backends())')


def add_dataset_arguments(group) -> None:
    """The dataset and loader flags of train.py and validate.py (the split flags are each command's)."""
    group.add_argument('data', nargs='?', metavar='DIR', help='path to dataset (positional, same as --data-dir)')
    group.add_argument('--data-dir', metavar='DIR', help='path to dataset root (ImageFolder tree or folder of tars)')
    group.add_argument('--dataset', metavar='NAME', default='',
                       help="dataset type + name ('' = image folder / tar, torch/cifar10, hfds/NAME, wds/...)")
    group.add_argument('--dataset-download', action='store_true', help='allow download (torch/ and tfds/ datasets)')
    group.add_argument('--class-map', default='', type=str, metavar='FILENAME', help='class to index mapping file')
    group.add_argument('--input-img-mode', default='RGB', type=str, choices=tuple(IMAGE_MODE_CHANNELS),
                       help='PIL mode every image is converted to (its channel count must equal the model\'s)')
    group.add_argument('-j', '--workers', type=int, default=default_workers(), metavar='N',
                       help='data loading processes (default: 4, at most the CPUs this process may use)')
    group.add_argument('--pin-mem', action='store_true', help='pin CPU memory in the loader')


def add_input_arguments(group) -> None:
    """The model input and preprocessing flags of train.py and validate.py."""
    group.add_argument('--gp', type=str, metavar='POOL', help='global pool type (model default)')
    group.add_argument('--img-size', type=int, metavar='N', help="image size (the model's default if unset)")
    group.add_argument('--in-chans', type=int, metavar='N', help='image input channels')
    group.add_argument('--input-size', nargs=3, type=int, metavar='N', help='input (c h w), overrides --img-size')
    group.add_argument('--crop-pct', type=float, metavar='N', help='eval center crop pct')
    group.add_argument('--mean', type=float, nargs='+', metavar='MEAN', help='override mean')
    group.add_argument('--std', type=float, nargs='+', metavar='STD', help='override std')
    group.add_argument('--interpolation', default='', type=str, choices=INTERPOLATIONS,
                       help="eval resize interpolation ('': the model's; validate.py: a training checkpoint's first)")
    group.add_argument('--channels-last', action='store_true', help='use channels_last memory layout')
    group.add_argument('--model-kwargs', nargs='*', default={}, action=ParseKwargs,
                       help='extra model arguments k=v (python literals), e.g. embed_dim=32 depths="(1,1,2,1)"')


CROP_PCT_RANGE = dict(low=0, high=1, low_open=True, why="the crop's fraction of the resized image; above 1 the "
                                                         "image is resized smaller than the crop and padded")


def add_common_arguments(group: argparse._ActionsContainer, activations: bool = True) -> None:
    """``--trust-checkpoint``, ``--debug`` and the size bounds (``activations=False``: ``--max-params`` only, for
    a command that runs no forward pass): the same in every script that reads checkpoint files."""
    group.add_argument(TRUST_FLAG, action='store_true',
                       help='UNSAFE: allow checkpoint files that need a full unpickle; that runs arbitrary code from '
                            'the file. Only for files you made or whose maker you trust')
    group.add_argument('--debug', action='store_true', help="an error's full traceback instead of its one line")
    add_bound_arguments(group, activations)


def add_device_arguments(group: argparse._ActionsContainer, distributed: bool = True) -> None:
    """``--device``, ``--threads``, ``--amp``, ``--amp-dtype``; for a trainer ``--dist-backend``, ``--dist-url``."""
    group.add_argument('--device', type=str, help="'cuda', 'cuda:1', 'cpu' (default: cuda if available)")
    if distributed:
        group.add_argument('--dist-backend', type=str, help='a backend or device:backend pairs '
                           '(default: cpu:gloo,cuda:nccl for CUDA, gloo for CPU)')
        group.add_argument('--dist-url', type=str, help="default: 'env://' (torchrun)")
    add_threads_argument(group)
    group.add_argument('--amp', action='store_true', help='mixed precision (float16 training: with a loss scaler)')
    group.add_argument('--amp-dtype', choices=('float16', 'bfloat16'), help='default: bfloat16 on CPU, float16 on CUDA')
