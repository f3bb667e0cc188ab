""" Parameters and MACs of one model: fvcore with the op handles added here (each docstring gives its rule; why it
is needed: ``docs/complexity.md``), every model built on ``device='meta'`` (no memory, no init), the counts cached.

Text models (up to gMLP-xlarge, 941 M), BiGS and BERT-large are traced on meta. The meta kernel of the vision
models' convolutions cannot run under the JIT tracer (``TypeError: cond must be a bool``), so they are materialised
on CPU, zero-filled (deterministic) and traced with a zero image: the counts depend only on shapes.
"""
import contextlib
import dataclasses
import fnmatch
import math
import traceback
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from ..errors import UsageError


DEFAULT_IMG_SIZE = 224
BIGS_LENGTHS = (128, 512, 1024, 4096)  # BiGS Table 6 (arXiv:2212.10544): BiGS-large and BERT-large lengths
_ENCODER_ATTR = ('gmlp', 'bigs', 'bert')  # backbone attribute of the MLM / classification wrappers
_BIGS_NAMES = [f'bigs_large_{n}' for n in BIGS_LENGTHS]
_BERT_NAMES = [f'bert_large_{n}' for n in BIGS_LENGTHS]  # the BERT-large baselines (count)


# ------------------------------------------------------------------------------------------------ fvcore handles
def _shape(value) -> List[int]:
    from fvcore.nn.jit_handles import get_shape
    shape = get_shape(value)
    if shape is None:
        raise ValueError(f'fvcore handle: no complete tensor shape for {value}')
    return list(shape)


def matmul_macs(inputs, outputs) -> int:
    """``aten::matmul`` / ``mm`` / ``mv`` / ``dot``: ``prod(output shape) x K`` (counts broadcast batch dims of
    either side)."""
    return math.prod(_shape(outputs[0])) * _shape(inputs[0])[-1]


def addmm_macs(inputs, outputs) -> int:
    """``aten::baddbmm`` / ``addbmm`` / ``addmv`` / ``addmm_`` (``self + a @ b``, the addition element-wise):
    ``prod(a) x`` b's columns (1 for a vector), so addbmm's summed batch counts too."""
    a, b = _shape(inputs[1]), _shape(inputs[2])
    return math.prod(a) * (b[-1] if len(b) > 1 else 1)


def toeplitz_conv_macs(inputs, outputs) -> float:
    """``mlp_vision::bidirectional_long_conv(u_f, u_b, table, ...)`` (BiGS's Triton route): both directions'
    tiles on one side of the block diagonal, ``B C L`` times
    :func:`~mlp_vision.layers.longconv_triton.toeplitz_conv_macs_per_token` each."""
    from ..layers.longconv_triton import toeplitz_conv_macs_per_token
    batch, length, channels = _shape(inputs[0])
    return 2 * batch * channels * length * toeplitz_conv_macs_per_token(length, _shape(inputs[2])[-1])


def sdpa_macs(inputs, outputs) -> int:
    """``aten::scaled_dot_product_attention(q, k, v, ...)``: ``Q K^T`` + ``A V`` MACs, full L x S scores."""
    q, k, v = (_shape(x) for x in inputs[:3])
    rows = math.prod(_shape(outputs[0])[:-1])  # (..., L): batch dims of q (grouped-query heads broadcast)
    return rows * k[-2] * (q[-1] + v[-1])


def fft_macs(batch: int, size: int, complex_input: bool = False) -> float:
    """MACs of ``batch`` transforms of ``size`` points: half of 2.5 N log2 N FLOPs (real: r2c / c2r) or of
    5 N log2 N (complex: c2c) each."""
    return batch * (2.5 if complex_input else 1.25) * size * math.log2(size) if size > 1 else 0.0


def _fft_handle(kind: str):
    """Handle of a 1-D FFT op ``(self, n, dim, norm)``; kind: 'r2c' | 'c2r' | 'c2c'."""
    def handle(inputs, outputs) -> float:
        x, out = _shape(inputs[0]), _shape(outputs[0])
        dim = inputs[2].toIValue()  # a traced value's constant; None when it is None or computed
        dim = (-1 if dim is None else dim) % len(out)
        n = inputs[1].toIValue()  # r2c: the signal is cropped or zero-padded to n
        if kind != 'r2c':  # c2r: the output holds the signal; c2c: input and output sizes agree
            n = out[dim]
        elif n is None:  # no n, or a computed one: the output's half-spectrum says 2 (m - 1) where not the input's
            n = x[dim] if x[dim] // 2 + 1 == out[dim] else 2 * (out[dim] - 1)
        return fft_macs(math.prod(out) // out[dim], n, complex_input=kind == 'c2c')
    return handle


EXTRA_HANDLES = {
    **{f'aten::{op}': matmul_macs for op in ('matmul', 'mm', 'mv', 'dot', 'vdot')},
    **{f'aten::{op}': addmm_macs for op in (  # fvcore handles the out-of-place aten::addmm
        'baddbmm', 'baddbmm_', 'addbmm', 'addbmm_', 'addmv', 'addmv_', 'addmm_')},
    'aten::scaled_dot_product_attention': sdpa_macs,
    'mlp_vision::bidirectional_long_conv': toeplitz_conv_macs,
    **{f'aten::fft_{op}': _fft_handle(kind) for op, kind in (
        ('rfft', 'r2c'), ('irfft', 'c2r'), ('fft', 'c2c'), ('ifft', 'c2c'))},
}

# ops that fvcore leaves uncounted and that are not multiply-accumulates (element-wise maths, reductions, lookups):
# uncounted by the papers' convention too. Any other uncounted op is flagged in the report.
NON_MAC_OPS = frozenset('aten::' + op for op in (
    'add', 'add_', 'sub', 'rsub', 'mul', 'mul_', 'div', 'div_', 'neg', 'exp', 'log', 'pow', 'sqrt', 'rsqrt',
    'reciprocal', 'abs', 'sin', 'cos', 'real', 'imag', 'complex', 'view_as_real', 'view_as_complex', 'polar',
    'conj', 'clamp_max', 'clamp_min', 'where', 'gelu', 'gelu_', 'silu', 'sigmoid', 'tanh', 'softmax', 'log_softmax',
    'softplus', 'mean', 'sum', 'cumsum', 'embedding', 'tril', 'triu', 'flip', 'fill_', 'zeros', 'zeros_like',
    'ones_like', 'lt', 'le', 'ne', 'logical_not', 'logical_and', 'any', 'all', 'unsqueeze', 'view', 'unflatten',
    'repeat', 'pad', 'scalar_tensor', 'linspace', '_unsafe_view', 'alias', 'lift_fresh', 'resolve_conj', 'exp_',
    'sub_', '_conj', 'conj_physical', 'angle', 'view_as', 'addcmul',
))


def count_module(model: nn.Module, inputs: Tuple[torch.Tensor, ...], encoder: Optional[str] = None,
                 bigs_conv_impl: Optional[str] = 'fft') -> Tuple[int, Dict[str, int], Dict[str, int], Optional[int]]:
    """fvcore MACs of ``model(*inputs)`` with :data:`EXTRA_HANDLES`: ``(total, by_operator, uncounted,
    encoder_total)``, ``uncounted`` the calls of each op fvcore skipped, ``encoder_total`` the submodule
    ``encoder``'s total (None without one). BiGS layers run the convolution route ``bigs_conv_impl``: by default the
    O(L log L) FFT the paper counts; ``None``: each layer's own route for ``inputs`` (what ``benchmark.py`` times).
    Token GEMMs run unpadded: the papers' MACs, not the zeros added for GPU kernels (196 -> 200 tokens)."""
    from fvcore.nn import FlopCountAnalysis
    from ..layers.linear import tokens_padded_to
    from ..layers.ssm import ssm_conv_impl
    fca = FlopCountAnalysis(model, inputs)
    fca.set_op_handle(**EXTRA_HANDLES)
    fca.unsupported_ops_warnings(False)
    fca.uncalled_modules_warnings(False)
    fca.tracer_warnings('none')
    route = ssm_conv_impl(model, bigs_conv_impl) if bigs_conv_impl else contextlib.nullcontext(model)
    with torch.no_grad(), route, tokens_padded_to(model, 1):
        total = int(round(fca.total()))
        by_op = {k: int(round(v)) for k, v in sorted(fca.by_operator().items(), key=lambda kv: -kv[1])}
        uncounted = dict(sorted(fca.unsupported_ops().items()))
        enc = int(round(fca.total(encoder))) if encoder else None
    return total, by_op, uncounted, enc


# ------------------------------------------------------------------------------------------------ models
@dataclasses.dataclass
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


def count_vision(name: str, img_size: int = DEFAULT_IMG_SIZE) -> Count:
    """A registered vision model at ``img_size`` x ``img_size`` (batch 1), traced on CPU with zero weights."""
    import timm
    model = timm.create_model(name, img_size=img_size, device='meta').eval()
    params = sum(p.numel() for p in model.parameters())  # shared (tied) parameters once
    head = sum(p.numel() for p in model.get_classifier().parameters())
    model = model.to_empty(device='cpu')  # uninitialised storage, then zeros: deterministic, no denormals
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if t.is_floating_point() or t.is_complex():
                t.zero_()
    total, by_op, uncounted, _ = count_module(model, (torch.zeros(1, 3, img_size, img_size),))
    return Count(name, f'1x3x{img_size}x{img_size}', params, total, by_op, uncounted,
                 params_no_head=params - head, traced_on='cpu (zero weights)')


def text_seq_len(name: str, **overrides) -> int:
    """The maximum sequence length of the registered text model ``name`` (with config ``overrides``)."""
    import mlp_vision.text as mt
    return mt.model_config(name, **overrides)['max_position_embeddings']


def count_text(name: str, seq_len: Optional[int] = None, **overrides) -> Count:
    """A registered text model (built with config ``overrides``) on one sequence of ``seq_len`` tokens (default:
    its maximum length), padded to full length."""
    import mlp_vision.text as mt
    max_len = text_seq_len(name, **overrides)
    seq_len = max_len if seq_len is None else seq_len
    if not 1 <= seq_len <= max_len:
        raise ValueError(f'{name}: --seq-len must be in [1, {max_len}] (its maximum sequence length), got {seq_len}')
    model = mt.create_model(name, device='meta', **overrides).eval()
    encoder = next((a for a in _ENCODER_ATTR if isinstance(getattr(model, a, None), nn.Module)), None)
    total, by_op, uncounted, enc = count_module(model, (torch.zeros(1, seq_len, dtype=torch.long, device='meta'),),
                                                encoder)
    params = sum(p.numel() for p in model.parameters())
    return Count(name, f'1x{seq_len} tokens', params, total, by_op, uncounted, encoder_macs=enc)


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
    for pattern in patterns or ['*']:
        if not fnmatch.filter(known, pattern):
            raise UsageError(f'--models: pattern {pattern!r} matches no model; expected shell-style patterns over '
                             f'the known names: {", ".join(known)}')
    return [n for n in known if any(fnmatch.fnmatch(n, p) for p in patterns or ['*'])]


def family(name: str) -> str:
    """'vision' (timm-registered), 'bert' (the BERT-large baselines) or 'text' (the text registry)."""
    from .. import VISION_MODELS
    return 'vision' if name in VISION_MODELS else 'bert' if name in _BERT_NAMES else 'text'


def count(name: str, size: Optional[int] = None) -> Count:
    """Count any known model: vision at ``size`` px (default 224), text at ``size`` tokens (default: its maximum),
    ``bert_large_L``, BiGS Table 6's BERT-large baseline, with L positions on L tokens (``size`` ignored)."""
    fam = family(name)
    if fam == 'vision':
        return count_vision(name, size or DEFAULT_IMG_SIZE)
    if fam == 'bert':
        length = int(name.rsplit('_', 1)[1])
        return dataclasses.replace(count_text('bert_large', length, max_position_embeddings=length), name=name)
    return count_text(name, size)


def model_macs(name: str, size: Optional[int] = None) -> int:
    """The MACs ``python -m mlp_vision.complexity`` reports for ``name`` (batch 1; ``size`` as in :func:`count`): the
    number to hold a stock ``fvcore.nn.FlopCountAnalysis(model, x).total()`` (no custom handles) against."""
    return count(name, size).macs


class CountCache:
    """Memoised counts keyed by (name, size). ``None`` when counting raised; :meth:`problem` then gives
    ``('ERROR', message)`` with where it failed, and the rest of the report still runs."""

    def __init__(self):
        self.cache: Dict[Tuple[str, Optional[int]], Optional[Count]] = {}
        self.problems: Dict[Tuple[str, Optional[int]], Tuple[str, str]] = {}

    def get(self, name: str, size: Optional[int] = None) -> Optional[Count]:
        if (name, size) not in self.cache:
            self.cache[name, size] = None
            try:
                self.cache[name, size] = count(name, size)
            except Exception as e:  # reported as ERROR rows
                ours = [f for f in traceback.extract_tb(e.__traceback__) if 'mlp_vision' in f.filename]
                where = f' at {ours[-1].filename.split("mlp_vision")[-1]}:{ours[-1].lineno}' if ours else ''
                msg = f'{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ""}{where}'
                self.problems[name, size] = ('ERROR', f'error counting {name}: {msg}')
        return self.cache[name, size]

    def problem(self, name: str, size: Optional[int] = None) -> Tuple[str, str]:
        return self.problems.get((name, size), ('', ''))
