""" Shared plumbing of the text models: output tuple, save/load (safetensors + JSON config), sampling.

Every text model has a config dataclass in ``self.config`` and inherits :class:`PretrainedMixin`:

    model.save_pretrained('ckpt/')           # ckpt/config.json + ckpt/model.safetensors
    model = type(model).from_pretrained('ckpt/')
    model = mlp_vision.text.from_pretrained('ckpt/')   # dispatches on the architecture stored in config.json

``config.json`` holds ``{"architecture": <class name>, "config": <dataclass fields>, "format_version": 1}``.
Weights go through :func:`safetensors.torch.save_model` / :func:`~safetensors.torch.load_model`, which handle
tied (shared) tensors.
"""
import dataclasses
import json
import os
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Type

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_model, save_model

__all__ = [
    'TextOutput', 'PretrainedMixin', 'GenerationMixin', 'from_pretrained', 'list_architectures',
    'lm_loss', 'init_linear_embedding', 'CONFIG_NAME', 'WEIGHTS_NAME',
]

CONFIG_NAME = 'config.json'
WEIGHTS_NAME = 'model.safetensors'
_FORMAT_VERSION = 1

# class name -> class, filled by PretrainedMixin.__init_subclass__ (used by the generic from_pretrained)
_ARCHITECTURES: Dict[str, Type['PretrainedMixin']] = {}


class TextOutput(NamedTuple):
    """What the text models' ``forward`` returns; unpacks as ``logits, loss = model(...)``.

    logits: (B, L, vocab) for language models, (B, num_labels) for sequence classification.
    loss: scalar mean loss when labels/targets were given, else None.
    """
    logits: torch.Tensor
    loss: Optional[torch.Tensor] = None


class PretrainedMixin:
    """``save_pretrained`` / ``from_pretrained`` for an ``nn.Module`` with a dataclass ``self.config``.

    Subclasses set ``config_class`` and may set ``head_prefixes``: the state-dict prefixes of their
    task-specific head. Loading a checkpoint of a *different* architecture with the same config class (e.g. a
    masked-LM checkpoint into a sequence classifier) is allowed when the only missing keys are the new head's.
    """
    config_class: Type = None
    head_prefixes: Tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _ARCHITECTURES[cls.__name__] = cls

    def save_pretrained(self, save_directory: str) -> None:
        """Write ``config.json`` and ``model.safetensors`` to ``save_directory`` (created if needed).

        Each file is written to a temporary name and renamed, so an interrupted save never leaves a torn file.
        """
        os.makedirs(save_directory, exist_ok=True)
        payload = {
            'architecture': type(self).__name__,
            'config': dataclasses.asdict(self.config),
            'format_version': _FORMAT_VERSION,
        }
        cfg_path = os.path.join(save_directory, CONFIG_NAME)
        with open(cfg_path + '.tmp', 'w', encoding='utf-8') as f:
            json.dump(payload, f, indent=2, sort_keys=True)
        os.replace(cfg_path + '.tmp', cfg_path)
        w_path = os.path.join(save_directory, WEIGHTS_NAME)
        save_model(self, w_path + '.tmp', metadata={'format': 'pt', 'architecture': type(self).__name__})
        os.replace(w_path + '.tmp', w_path)

    @classmethod
    def from_pretrained(
            cls,
            directory: str,
            device: str = 'cpu',
            strict: Optional[bool] = None,
            **overrides: Any,
    ):
        """Build the model from ``directory/config.json`` (fields updated by ``overrides``) and load its weights.

        Args:
            directory: a folder written by :meth:`save_pretrained`.
            device: where the weights are loaded to.
            strict: require every key to match. Default: True when the checkpoint's architecture is this
                class; False when it is another architecture of the same config class, in which case only the
                keys of this class's head (``head_prefixes``) may be missing.
            **overrides: config fields to change (e.g. ``num_labels=3``, ``dropout=0.1``). Fields that change
                parameter shapes make the load fail.
        """
        arch, config = _read_config(directory)
        if cls.config_class is not None and not isinstance(config, cls.config_class):
            raise TypeError(f'{directory} holds a {type(config).__name__}; {cls.__name__} needs a '
                            f'{cls.config_class.__name__}')
        config = dataclasses.replace(config, **overrides)
        model = cls(config)
        same_arch = arch == cls.__name__
        strict = same_arch if strict is None else strict
        missing, unexpected = load_model(model, os.path.join(directory, WEIGHTS_NAME), strict=strict, device=device)
        if not strict and not same_arch:
            bad = [k for k in missing if not k.startswith(cls.head_prefixes)] if cls.head_prefixes else list(missing)
            if bad:
                raise RuntimeError(f'{arch} checkpoint in {directory} lacks weights {cls.__name__} needs '
                                   f'outside its head: {bad[:8]}{"..." if len(bad) > 8 else ""}')
        model.to(device)
        return model


def _read_config(directory: str) -> Tuple[str, Any]:
    with open(os.path.join(directory, CONFIG_NAME), encoding='utf-8') as f:
        payload = json.load(f)
    arch = payload['architecture']
    if arch not in _ARCHITECTURES:
        raise KeyError(f'unknown architecture {arch!r} in {directory}; known: {sorted(_ARCHITECTURES)}')
    config_class = _ARCHITECTURES[arch].config_class
    fields = {f.name for f in dataclasses.fields(config_class)}
    unknown = set(payload['config']) - fields
    if unknown:
        raise ValueError(f'{directory}: config fields {sorted(unknown)} unknown to {config_class.__name__}')
    return arch, config_class(**payload['config'])


def from_pretrained(directory: str, device: str = 'cpu', **overrides: Any) -> nn.Module:
    """Load any text model saved with ``save_pretrained``, dispatching on the stored architecture name."""
    arch, _ = _read_config(directory)
    return _ARCHITECTURES[arch].from_pretrained(directory, device=device, **overrides)


def list_architectures() -> List[str]:
    """Class names that :func:`from_pretrained` can build."""
    return sorted(_ARCHITECTURES)


class GenerationMixin:
    """Autoregressive sampling for causal LMs whose ``forward(idx)`` returns :class:`TextOutput`.

    The model must expose ``max_seq_len`` (the longest context it accepts); longer contexts are cropped to
    their last ``max_seq_len`` tokens, as in nanoGPT.
    """
    max_seq_len: int

    @torch.no_grad()
    def generate(
            self,
            idx: torch.Tensor,
            max_new_tokens: int,
            temperature: float = 1.0,
            top_k: Optional[int] = None,
            generator: Optional[torch.Generator] = None,
    ) -> torch.Tensor:
        """Append ``max_new_tokens`` sampled tokens to ``idx``.

        Args:
            idx: (B, T) int64 prompt, T >= 1 (a single token works).
            max_new_tokens: number of tokens to sample.
            temperature: logits are divided by it; ``<= 0`` means greedy (argmax) decoding.
            top_k: keep only the k most likely tokens before sampling (None = all).
            generator: optional ``torch.Generator`` for reproducible sampling.

        Returns: (B, T + max_new_tokens) int64. The model runs in eval mode (dropout off) during sampling and is
        put back into its previous mode afterwards.
        """
        if idx.dim() != 2 or idx.shape[1] < 1:
            raise ValueError(f'idx must be (B, T) with T >= 1, got shape {tuple(idx.shape)}')
        was_training = self.training
        self.eval()
        try:
            for _ in range(max_new_tokens):
                logits = self(idx[:, -self.max_seq_len:]).logits[:, -1, :]  # (B, vocab)
                if temperature <= 0:
                    idx_next = logits.argmax(dim=-1, keepdim=True)
                else:
                    logits = logits / temperature
                    if top_k is not None:
                        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
                        logits = logits.masked_fill(logits < kth, float('-inf'))
                    idx_next = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
                idx = torch.cat((idx, idx_next), dim=1)
        finally:
            self.train(was_training)
        return idx


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Mean token cross-entropy. logits: (B, L, V); targets: (B, L) int64, ``ignore_index`` entries skipped."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                           ignore_index=ignore_index)


def init_linear_embedding(module: nn.Module, std: float) -> None:
    """BERT/GPT-style init: Linear and Embedding weights ~ N(0, std), Linear biases 0.

    Only ``nn.Linear`` / ``nn.Embedding`` are touched, so the SGU's raw ``weight`` / ``bias`` parameters
    (W ~ 0, b = 1; SPEC §1.1) and LayerNorms keep their own init. Use with ``model.apply``.
    """
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=std)
