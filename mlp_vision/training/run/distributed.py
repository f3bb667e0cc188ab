""" Device selection and distributed (torchrun) setup for CPU (gloo) and CUDA (NCCL, with gloo beside it).

timm's ``init_distributed_device_so`` reads torchrun's / SLURM's environment and initialises the process group with
the backend of :func:`process_group_backend`. The DDP wrapper is ours: on CPU, ``DistributedDataParallel`` must get
no ``device_ids`` (timm's train.py passes ``[device]``, which PyTorch rejects for CPU modules). Multi-node: the same
command on every node with torchrun's rendezvous (README); gloo connects the nodes over TCP on the interface their
host names resolve to (set ``GLOO_SOCKET_IFNAME`` where that is not the right one).
"""
import dataclasses
import hashlib
import logging
import os
from typing import Any, List, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from timm.utils.distributed import init_distributed_device_so

from mlp_vision.arguments import parse_device
from mlp_vision.errors import UsageError

__all__ = ['DistInfo', 'process_group_backend', 'init_device', 'wrap_ddp', 'all_gather_objects', 'state_dict_digest']

_logger = logging.getLogger(__name__)


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
    """The ``backend`` that ``torch.distributed.init_process_group`` gets for a run on ``device_type``:
    ``dist_backend`` (``--dist-backend``: a backend name or ``device:backend`` pairs) when given, checked; else on
    CUDA ``'cpu:gloo,cuda:nccl'`` (the loops' tensor collectives run on the GPU through NCCL, the object
    collectives -- RNG states, digests, the tokenizer -- in CPU memory through gloo), elsewhere None (timm's gloo).
    """
    if dist_backend is None:
        return 'cpu:gloo,cuda:nccl' if device_type == 'cuda' else None
    names = [b for b in dist.Backend.backend_list if b not in ('undefined', 'fake')]
    pairs = [part.partition(':') for part in dist_backend.split(',')]
    if len(pairs) == 1 and not pairs[0][1]:
        valid = dist_backend in names
    else:
        valid = all(sep and _is_device_type(device) and name in names for device, sep, name in pairs)
    if not valid:
        raise UsageError(f'--dist-backend {dist_backend!r} is not a torch.distributed backend; use one of '
                         f'{", ".join(names)}, or device:backend pairs such as cpu:gloo,cuda:nccl (default: '
                         f'cpu:gloo,cuda:nccl for CUDA, gloo for CPU)')
    return dist_backend


def _is_device_type(name: str) -> bool:
    try:
        return torch.device(name).type == name
    except RuntimeError:
        return False


def init_device(device: Optional[str] = None, dist_backend: Optional[str] = None,
                dist_url: Optional[str] = None) -> DistInfo:
    """Pick the device ('cuda' if available, else 'cpu', unless given) and join torchrun's process group (backend:
    :func:`process_group_backend`); under torchrun with CUDA each process takes GPU ``LOCAL_RANK``."""
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


def wrap_ddp(model: nn.Module, info: DistInfo, **kwargs) -> nn.Module:
    """DistributedDataParallel with ``device_ids`` for CUDA and none for the CPU; every parameter's gradient reaches
    DDP with the parameter's strides (:func:`_grad_in_param_strides`)."""
    from torch.nn.parallel import DistributedDataParallel
    for param in model.parameters():
        if param.requires_grad and 1 in param.shape:
            param.register_hook(_grad_in_param_strides(param))
    if info.device.type == 'cuda':
        return DistributedDataParallel(model, device_ids=[info.device], **kwargs)
    return DistributedDataParallel(model, **kwargs)


def _grad_in_param_strides(param: torch.Tensor):
    """A gradient hook that gives the gradient the parameter's strides where the two differ only along size-1 dims.

    Convolution kernels return their weight gradient in the memory format of their input (sMLPNet's 1x1 fuse conv
    of a channels-last activation: strides (C_in, 1, C_in, C_in) for a parameter's (C_in, 1, 1, 1)). A size-1 dim's
    stride is never used, so autograd accepts it, but DDP's reducer compares all strides and warns "Grad strides do
    not match bucket view strides" on every rank. The restrided view is the same memory; a gradient laid out
    differently along a dim longer than 1 is left as it is.
    """
    def restride(grad: torch.Tensor) -> torch.Tensor:
        if grad.layout != torch.strided or grad.shape != param.shape or grad.stride() == param.stride():
            return grad
        if any(g != p for g, p, n in zip(grad.stride(), param.stride(), param.shape) if n != 1):
            return grad
        return grad.as_strided(grad.shape, param.stride(), grad.storage_offset())
    return restride


def all_gather_objects(obj: Any, info: DistInfo) -> List[Any]:
    """Every rank's ``obj`` (rank order); ``[obj]`` outside distributed mode."""
    if not info.distributed:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def state_dict_digest(module: nn.Module) -> str:
    """SHA-256 of every tensor in the state dict (names, dtypes, shapes, bytes): equal digests = equal weights."""
    h = hashlib.sha256()
    for k, v in module.state_dict().items():
        v = v.detach().cpu().contiguous()
        h.update(f'{k}:{v.dtype}:{tuple(v.shape)};'.encode())
        h.update(v.reshape(-1).view(torch.uint8).numpy().tobytes() if v.numel() else b'')
    return h.hexdigest()
