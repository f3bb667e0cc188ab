""" Name registry of the text models: ``create_model(name, **overrides)``, ``list_models()``.

A separate registry from timm's (text models are not timm image models). Each entry builds a config from the
named defaults updated by the overrides and instantiates the entry's default task head::

    create_model('amlp_base')                                       # GMLPForMaskedLM, 108.8 M params
    create_model('gmlp_base', task='sequence_classification', num_labels=3)
    create_model('gmlp_base', depth=12, max_seq_len=128)            # any GMLPConfig field
    create_model('gmlp_xlarge', device='meta')                      # shapes only, no memory

Overrides are config fields, plus ``task`` (where the entry has several), ``device`` and ``dtype``.
"""
import fnmatch
from typing import Callable, Dict, List

import torch.nn as nn

from .bigs import BiGSConfig, BiGSForMaskedLM, BiGSForSequenceClassification
from .gmlp import GMLPConfig, GMLPForCausalLM, GMLPForMaskedLM, GMLPForSequenceClassification
from .gpt import GPTConfig, GPTLanguageModel

__all__ = ['create_model', 'list_models', 'is_model', 'model_config', 'register_model', 'MODEL_TASKS']

_ENTRIES: Dict[str, Callable[..., nn.Module]] = {}
_DEFAULTS: Dict[str, dict] = {}

# task name -> class, per config family
MODEL_TASKS = {
    'gmlp': {
        'masked_lm': GMLPForMaskedLM,
        'sequence_classification': GMLPForSequenceClassification,
        'causal_lm': GMLPForCausalLM,
    },
    'gpt': {'causal_lm': GPTLanguageModel},
    'bigs': {'masked_lm': BiGSForMaskedLM, 'sequence_classification': BiGSForSequenceClassification},
}
_CONFIGS = {'gmlp': GMLPConfig, 'gpt': GPTConfig, 'bigs': BiGSConfig}


def register_model(name: str, family: str, default_task: str, **defaults) -> None:
    """Register ``name``: a ``family`` config ('gmlp' | 'gpt' | 'bigs') with ``defaults``, built as ``default_task``."""
    if name in _ENTRIES:
        raise ValueError(f'text model {name!r} already registered')
    if default_task not in MODEL_TASKS[family]:
        raise ValueError(f'task {default_task!r} not available for family {family!r}')
    _CONFIGS[family](**defaults)  # validate the defaults now

    def entry(task: str = default_task, device=None, dtype=None, **overrides) -> nn.Module:
        tasks = MODEL_TASKS[family]
        if task not in tasks:
            raise ValueError(f'{name}: task must be one of {sorted(tasks)}, got {task!r}')
        config = _CONFIGS[family](**{**defaults, **overrides})
        return tasks[task](config, device=device, dtype=dtype)

    entry.__name__ = name
    entry.__doc__ = f'{name}: {family} config {defaults}, default task {default_task!r}.'
    _ENTRIES[name] = entry
    _DEFAULTS[name] = dict(family=family, task=default_task, **defaults)


def create_model(name: str, **overrides) -> nn.Module:
    """Build the registered text model ``name`` (see the module docstring for the overrides)."""
    if name not in _ENTRIES:
        raise KeyError(f'unknown text model {name!r}; known: {list_models()}')
    return _ENTRIES[name](**overrides)


def list_models(pattern: str = '*') -> List[str]:
    """Sorted registered names matching the shell-style ``pattern``."""
    return sorted(n for n in _ENTRIES if fnmatch.fnmatch(n, pattern))


def is_model(name: str) -> bool:
    return name in _ENTRIES


def model_config(name: str) -> dict:
    """The registered defaults of ``name`` (family, default task, config fields)."""
    return dict(_DEFAULTS[name])


# --- gMLP / aMLP masked LM, BERT setup (paper Table 5): vocab 32,000, seq 512, Toeplitz W --------------------
_BERT = dict(vocab_size=32000, max_seq_len=512, spatial_mode='toeplitz')
register_model('gmlp_base', 'gmlp', 'masked_lm', depth=48, dim=512, ffn_dim=3072, **_BERT)
register_model('gmlp_large', 'gmlp', 'masked_lm', depth=96, dim=768, ffn_dim=3072, **_BERT)
register_model('gmlp_xlarge', 'gmlp', 'masked_lm', depth=144, dim=1024, ffn_dim=4096, **_BERT)
register_model('amlp_base', 'gmlp', 'masked_lm', depth=36, dim=512, ffn_dim=3072, attn_dim=64, **_BERT)
register_model('amlp_large', 'gmlp', 'masked_lm', depth=72, dim=768, ffn_dim=3072, attn_dim=128, **_BERT)

# --- Table 4 scaling study (seq 128, d 512, d_ffn 3072; 0.5x / 1x / 2x / 4x depth) --------------------------
for _depth in (18, 36, 72, 144):
    register_model(f'gmlp_{_depth}l_seq128', 'gmlp', 'masked_lm', depth=_depth, dim=512, ffn_dim=3072,
                   vocab_size=32000, max_seq_len=128, spatial_mode='toeplitz')

# --- causal gMLP LM (annotated implementation, paper 001: d 512, d_ffn 2048, context 256, 6 layers as labml's
#     TransformerConfigs default; char-level Tiny Shakespeare vocab 65, untied generator) -----------------------
register_model('gmlp_causal_char', 'gmlp', 'causal_lm', depth=6, dim=512, ffn_dim=2048, vocab_size=65,
               max_seq_len=256, spatial_mode='causal', tie_word_embeddings=False)

# --- MLP-Attention paper (SPEC §1.5): vocab 65, 3 layers, 3 heads, d 384, T_max 256, d_hidden 256, dropout 0.2
_PAPER_GPT = dict(vocab_size=65, block_size=256, n_layer=3, n_head=3, n_embd=384, mlp_attn_hidden=256, dropout=0.2)
register_model('gpt_mlp_attention', 'gpt', 'causal_lm', attention='mlp', **_PAPER_GPT)
register_model('gpt_sdpa', 'gpt', 'causal_lm', attention='sdpa', **_PAPER_GPT)

# --- BiGS (SPEC §1.4, paper 004): BiGS-large = 23 layers, d 1024, d_i 3072, N 64, BERT uncased vocab 30522; the
#     official models differ only in their absolute positions (128 / 512 / 1024 / 4096). bigs_large_512: 346.7 M.
_BIGS_LARGE = dict(vocab_size=30522, hidden_size=1024, intermediate_size=3072, num_hidden_layers=23, num_ssm_states=64)
for _positions in (128, 512, 1024, 4096):
    register_model(f'bigs_large_{_positions}', 'bigs', 'masked_lm', max_position_embeddings=_positions, **_BIGS_LARGE)
# small BiGS for CPU experiments; vocab / pad id fit ByteTokenizer() (256 bytes + <pad> <cls> <sep> <mask>), override
# vocab_size and pad_token_id for another tokenizer
register_model('bigs_small', 'bigs', 'masked_lm', vocab_size=260, pad_token_id=256, hidden_size=256,
               intermediate_size=768, num_hidden_layers=4, num_ssm_states=64, max_position_embeddings=512)
