""" Parameters and MACs of one model: building it without memory, tracing it with fvcore, caching the counts.

Models are built on ``device='meta'`` (no memory, no init). Text models (up to gMLP-xlarge, 941 M), BiGS and the
BERT-large baseline are traced on meta directly (one whose forward cannot run on meta is an ERROR row of the
report). The meta kernel of the vision models' convolutions cannot run under the JIT tracer (``TypeError: cond
must be a bool``), so they are materialised with ``to_empty(device='cpu')``, zero-filled (no random init,
deterministic) and traced on CPU with a zero image: the counts depend only on shapes.
"""
import fnmatch
import traceback
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .handles import NON_MAC_OPS, count_module
from ..errors import UsageError


DEFAULT_IMG_SIZE = 224
BIGS_LENGTHS = (128, 512, 1024, 4096)  # BiGS Table 6 (arXiv:2212.10544): BiGS-large and BERT-large lengths
_ENCODER_ATTR = ('gmlp', 'bigs', 'bert')  # backbone attribute of the MLM / classification wrappers


@dataclass
class Count:
    """Parameters and fvcore MACs of one model at one input size."""
    name: str
    input: str  # e.g. '1x3x224x224' or '1x512 tokens'
    params: int
    macs: int
    by_operator: Dict[str, int]
    uncounted: Dict[str, int]  # op -> number of calls fvcore skipped
    params_no_head: Optional[int] = None  # vision: without the classifier
    encoder_macs: Optional[int] = None  # text encoders: backbone only (no LM head); BiGS / BERT comparisons
    traced_on: str = 'meta'

    @property
    def flops(self) -> int:
        return 2 * self.macs

    @property
    def encoder_flops(self) -> Optional[int]:
        return None if self.encoder_macs is None else 2 * self.encoder_macs

    @property
    def flagged(self) -> Dict[str, int]:
        """Uncounted ops that are not element-wise / lookups (should be empty for our models)."""
        return {k: v for k, v in self.uncounted.items() if k not in NON_MAC_OPS}


def _param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # shared (tied) parameters once


def _materialise_zeros(model: nn.Module) -> nn.Module:
    """meta -> CPU without random init: uninitialised storage, then zeros (deterministic, no denormals)."""
    model = model.to_empty(device='cpu')
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if t.is_floating_point() or t.is_complex():
                t.zero_()
    return model


def count_vision(name: str, img_size: int = DEFAULT_IMG_SIZE) -> Count:
    """A registered vision model at ``img_size`` x ``img_size`` (batch 1), traced on CPU with zero weights."""
    import timm
    from .. import VISION_MODELS
    if name not in VISION_MODELS:
        raise KeyError(f'unknown vision model {name!r}; known: {list(VISION_MODELS)}')
    model = timm.create_model(name, img_size=img_size, device='meta').eval()
    params = _param_count(model)
    head = sum(p.numel() for p in model.get_classifier().parameters())
    model = _materialise_zeros(model)
    total, by_op, uncounted, _ = count_module(model, (torch.zeros(1, 3, img_size, img_size),))
    return Count(name, f'1x3x{img_size}x{img_size}', params, total, by_op, uncounted,
                 params_no_head=params - head, traced_on='cpu (zero weights)')


def text_seq_len(name: str, **overrides) -> int:
    """The maximum sequence length of the registered text model ``name`` (with config ``overrides``)."""
    import mlp_vision.text as mt
    return mt.model_config(name, **overrides)['max_position_embeddings']


def count_text(name: str, seq_len: Optional[int] = None, label: Optional[str] = None, **overrides) -> Count:
    """A registered text model (built with config ``overrides``) on one sequence of ``seq_len`` tokens (default:
    its maximum length), padded to full length; ``label`` names the count (default ``name``)."""
    import mlp_vision.text as mt
    if not mt.is_model(name):
        raise KeyError(f'unknown text model {name!r}; known: {mt.list_models()}')
    max_len = text_seq_len(name, **overrides)
    seq_len = max_len if seq_len is None else seq_len
    if not 1 <= seq_len <= max_len:
        raise ValueError(f'{name}: --seq-len must be in [1, {max_len}] (its maximum sequence length), got {seq_len}')
    model = mt.create_model(name, device='meta', **overrides).eval()
    encoder = next((a for a in _ENCODER_ATTR if isinstance(getattr(model, a, None), nn.Module)), None)
    total, by_op, uncounted, enc = count_module(model, (torch.zeros(1, seq_len, dtype=torch.long, device='meta'),),
                                                encoder)
    return Count(label or name, f'1x{seq_len} tokens', _param_count(model), total, by_op, uncounted,
                 encoder_macs=enc)


def count_bert_large(seq_len: int) -> Count:
    """``bert_large_{seq_len}``: the BERT-large baseline of BiGS Table 6 (the registered ``bert_large`` with
    ``seq_len`` positions; its fused SDPA attention counted by the SDPA handle) on one sequence of that length."""
    return count_text('bert_large', seq_len, label=f'bert_large_{seq_len}', max_position_embeddings=seq_len)


_BIGS_NAMES = [f'bigs_large_{n}' for n in BIGS_LENGTHS]
_BERT_NAMES = [f'bert_large_{n}' for n in BIGS_LENGTHS]  # the BERT-large baselines, counted by count_bert_large


def known_models() -> List[str]:
    """Every name the report knows, in report order: vision, the text registry (BiGS-large last, by length), the
    BERT-large baselines."""
    from .. import VISION_MODELS
    import mlp_vision.text as mt
    text = [n for n in mt.list_models() if n not in _BIGS_NAMES]
    return list(VISION_MODELS) + text + _BIGS_NAMES + _BERT_NAMES


def resolve_models(patterns: Optional[Sequence[str]]) -> List[str]:
    """Known names matching any of the shell-style ``patterns`` (all when None); a :class:`UsageError` (a
    ``ValueError``) for a pattern with no match."""
    known = known_models()
    selected = set()
    for pattern in patterns or ['*']:
        hits = [n for n in known if fnmatch.fnmatch(n, pattern)]
        if not hits:
            raise UsageError(f'--models: pattern {pattern!r} matches no model; expected shell-style patterns over '
                             f'the known names: {", ".join(known)}')
        selected.update(hits)
    return [n for n in known if n in selected]


def family(name: str) -> str:
    """'vision' (timm-registered), 'bert' (the BERT-large baselines) or 'text' (the text registry)."""
    from .. import VISION_MODELS
    if name in VISION_MODELS:
        return 'vision'
    if name in _BERT_NAMES:
        return 'bert'
    return 'text'


def count(name: str, size: Optional[int] = None) -> Count:
    """Count any known model: vision at ``size`` px (default 224), text at ``size`` tokens (default: its maximum),
    ``bert_large_L`` at its L (``size`` ignored)."""
    fam = family(name)
    if fam == 'vision':
        return count_vision(name, size or DEFAULT_IMG_SIZE)
    if fam == 'bert':
        return count_bert_large(int(name.rsplit('_', 1)[1]))
    return count_text(name, size)


def model_macs(name: str, size: Optional[int] = None) -> int:
    """The MACs ``python -m mlp_vision.complexity`` reports for ``name`` (batch 1; ``size`` as in :func:`count`).

    The number to hold a stock ``fvcore.nn.FlopCountAnalysis(model, x).total()`` (no custom handles) against."""
    return count(name, size).macs


class CountCache:
    """Memoised counts keyed by (name, size). ``None`` when counting raised; :meth:`problem` then gives
    ``('ERROR', message)`` with where it failed, and the rest of the report still runs."""

    def __init__(self):
        self.cache: Dict[Tuple[str, Optional[int]], Optional[Count]] = {}
        self.problems: Dict[Tuple[str, Optional[int]], Tuple[str, str]] = {}

    def get(self, name: str, size: Optional[int] = None) -> Optional[Count]:
        key = (name, size)
        if key not in self.cache:
            self.cache[key] = None
            try:
                self.cache[key] = count(name, size)
            except Exception as e:  # reported as ERROR rows
                ours = [f for f in traceback.extract_tb(e.__traceback__) if 'mlp_vision' in f.filename]
                where = f' at {ours[-1].filename.split("mlp_vision")[-1]}:{ours[-1].lineno}' if ours else ''
                msg = str(e).splitlines()[0][:160] if str(e) else ''
                self.problems[key] = ('ERROR', f'error counting {name}: {type(e).__name__}: {msg}{where}')
        return self.cache[key]

    def problem(self, name: str, size: Optional[int] = None) -> Tuple[str, str]:
        return self.problems.get((name, size), ('', ''))
