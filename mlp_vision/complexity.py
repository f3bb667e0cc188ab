""" Complexity report: parameters and MACs of every model, beside the paper tables (fvcore).

Usage::

    python -m mlp_vision.complexity                                  # full report (markdown) to stdout
    python -m mlp_vision.complexity --output results/complexity.md results/complexity.csv   # the committed one
    python -m mlp_vision.complexity --models 'smlpnet_*' 'bigs_*' --format csv
    python -m mlp_vision.complexity --img-size 384 --models gmlp_ti gmlp_s gmlp_b   # vision models at 384 x 384
    python -m mlp_vision.complexity --models 'gpt_*' --seq-len 128
    python -m mlp_vision.complexity --plot results/complexity_scaling.png

Exit status: 0, or 1 when a paper row FAILs or a model could not be counted (ERROR), 2 for bad arguments.

Counting conventions (also printed in the report header):

* **MACs**: :class:`fvcore.nn.FlopCountAnalysis` totals, which count one multiply-accumulate as one "flop".
  sMLPNet Table 6 "FLOPs" and gMLP Table 2 "MAdds" are MACs and are compared directly. FLOPs = 2 x MACs: gMLP
  Table 1 "FLOPs" (2.7 / 8.9 / 31.6 B for the models Table 2 lists at 1.4 / 4.5 / 15.8 MAdds -- so not every
  vision "FLOPs" is a MAC count), gMLP Table 5 "FLOPs", BiGS Table 6.
* fvcore's stock handles are kept (linear, conv, einsum, bmm, norms: LayerNorm 5 / BatchNorm-eval 2 per
  element) except for these, registered here:

  - ``aten::matmul`` / ``aten::mm``: broadcast-aware, ``prod(output shape) x K``. The stock handle multiplies
    the *first* operand's shape by the last output dim and so drops broadcast batch dims of the second operand
    (sMLP's ``W_h @ x`` over (B, C, H, W): sMLPNet-T 4.94 G instead of 5.01 G).
  - ``aten::baddbmm`` / ``addbmm`` / ``addmv`` and their in-place forms, ``addmm_`` (the MACs of the product),
    ``aten::mv`` / ``dot``.
  - ``aten::scaled_dot_product_attention``: ``Q K^T + A V`` = ``rows x S x (E + E_v)`` with rows = batch x heads
    x L (the full L x S score matrix, causal or not, as explicit matmuls would count it).
  - FFTs (``aten::fft_rfft``, ``fft_irfft``, ``fft_fft``, ``fft_ifft``, the ``*2``/``*n`` variants and
    ``_fft_r2c`` / ``_fft_c2r`` / ``_fft_c2c``): **2.5 N log2 N FLOPs per real transform of length N** (5 N log2 N
    per complex one; N = product of the transformed sizes), SPEC §2, i.e. half of that in MACs so that the FLOPs
    column carries exactly 2.5 N log2 N. (This is what the SPEC's measured BiGS reproduction used: 8.08e10 at
    L = 128; counting 2.5 N log2 N *MACs* would give 8.12e10 and add ~2 % at 4096, not the "< 1 %" it states.)

  Element-wise ops (add, mul, GELU, softmax, ...) and embedding lookups are not MACs and stay uncounted, as in the
  papers; the report lists every op fvcore skipped for each model, and flags any that is not of that kind.
* Models are built on ``device='meta'`` (no memory, no init). Text models (up to gMLP-xlarge, 941 M), BiGS and the
  BERT-large baseline are traced on meta directly (a text model whose forward cannot run on meta would fall back
  to CPU with zero weights; the report's "traced on" column says which). Vision models contain convolutions, whose
  meta kernel cannot run under the JIT tracer (it compares traced sizes: ``TypeError: cond must be a bool``), so
  they are materialised with ``to_empty(device='cpu')``, zero-filled (no random init, deterministic) and traced on
  CPU with a zero image: the counts depend only on shapes.
* Encoder MACs (text): the backbone (``.gmlp`` / ``.bigs`` / ``.bert``) without the MLM head, what gMLP Table 5
  and BiGS Table 6 count. The BERT-large baseline (:class:`mlp_vision.text.bert.BertForMaskedLMBaseline`, names
  ``bert_large_{L}``) uses ``F.scaled_dot_product_attention``, whose Q K^T and A V MACs the
  ``aten::scaled_dot_product_attention`` handle counts (fvcore alone sees nothing inside fused attention).

The paper tables live in :data:`PAPER_ROWS`. A row passes when ours is within its tolerance (params 0.5 %, MACs /
FLOPs 3 %) **or** equals the paper's number at the paper's printed precision (``59`` M: ours rounds to 59).
Rows that cannot pass carry a documented reason (status ``KNOWN``); rows whose model is not available (BiGS not
registered yet) report ``PENDING``. Nothing is skipped silently.
"""
import argparse
import csv
import fnmatch
import io
import json
import math
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .text.bert import BertForMaskedLMBaseline as BertLargeBaseline

__all__ = [
    'matmul_macs', 'sdpa_macs', 'fft_macs', 'fft_flops', 'EXTRA_HANDLES', 'NON_MAC_OPS',
    'Count', 'count_module', 'count_vision', 'count_text', 'count_bert_large', 'BertLargeBaseline',
    'PaperRow', 'PAPER_ROWS', 'compare', 'CountCache', 'known_models', 'resolve_models', 'build_report',
    'render_markdown', 'render_csv', 'render_json', 'plot_scaling', 'main',
]

FFT_FLOPS_REAL = 2.5  # FLOPs per point per log2(N) of a real transform (r2c / c2r)
FFT_FLOPS_COMPLEX = 5.0  # ... of a complex transform (c2c)
BIGS_LENGTHS = (128, 512, 1024, 4096)
DEFAULT_IMG_SIZE = 224
COMMAND = 'python -m mlp_vision.complexity --output results/complexity.md results/complexity.csv'
COMMAND_PLOT = 'python -m mlp_vision.complexity --plot results/complexity_scaling.png'


# ------------------------------------------------------------------------------------------------------------------
# fvcore handles
# ------------------------------------------------------------------------------------------------------------------
def _shape(value) -> List[int]:
    from fvcore.nn.jit_handles import get_shape
    shape = get_shape(value)
    if shape is None:
        raise ValueError(f'fvcore handle: no complete tensor shape for {value}')
    return list(shape)


def _const(value):
    """The constant a traced graph value holds (None when it is None or not a constant)."""
    try:
        return value.toIValue()
    except Exception:  # a computed (non-constant) value
        return None


def matmul_macs(inputs, outputs) -> int:
    """``aten::matmul`` / ``aten::mm``: ``prod(output shape) x K`` (counts broadcast batch dims of either side)."""
    a = _shape(inputs[0])
    out = _shape(outputs[0])
    return math.prod(out) * a[-1]


def batched_matmul_add_macs(inputs, outputs) -> int:
    """``aten::baddbmm`` / ``aten::addbmm`` / ``aten::addmv`` (self, a, b, ...): MACs of ``a @ b`` (the add is
    element-wise): ``prod(a @ b) x K``; for ``addbmm`` the batch is also summed over."""
    a, b = _shape(inputs[1]), _shape(inputs[2])
    k = a[-1]
    rows = math.prod(a[:-1])  # (batch x) n
    cols = b[-1] if len(b) > 1 else 1
    return rows * k * cols


def vector_macs(inputs, outputs) -> int:
    """``aten::mv`` / ``aten::dot`` / ``aten::vdot``: ``prod(first operand)``."""
    return math.prod(_shape(inputs[0]))


def sdpa_macs(inputs, outputs) -> int:
    """``aten::scaled_dot_product_attention(q, k, v, ...)``: ``Q K^T`` + ``A V`` MACs, full L x S scores."""
    q, k, v = (_shape(x) for x in inputs[:3])
    out = _shape(outputs[0])  # (..., L, E_v), batch dims of q (grouped-query heads broadcast)
    rows = math.prod(out[:-1])
    return rows * k[-2] * (q[-1] + v[-1])


def fft_flops(batch: int, size: int, complex_input: bool = False) -> float:
    """FLOPs of ``batch`` transforms of ``size`` points: 2.5 N log2 N (real) or 5 N log2 N (complex) each."""
    if size <= 1:
        return 0.0
    coef = FFT_FLOPS_COMPLEX if complex_input else FFT_FLOPS_REAL
    return batch * coef * size * math.log2(size)


def _dims(dim, ndim: int, default: Sequence[int]) -> List[int]:
    if dim is None:
        dim = default
    if isinstance(dim, int):
        dim = [dim]
    return [d % ndim for d in dim]


def _fft_handle(kind: str, variant: str):
    """fvcore handle for one FFT op. kind: 'r2c' | 'c2r' | 'c2c'; variant: '1d' | 'nd' | '2d' | 'internal'."""

    def handle(inputs, outputs) -> float:
        x = _shape(inputs[0])
        out = _shape(outputs[0])
        ndim = len(out)
        if variant == '1d':  # fft_rfft(self, n, dim, norm)
            dims = _dims(_const(inputs[2]), ndim, [-1])
        elif variant in ('nd', '2d'):  # fft_rfftn(self, s, dim, norm)
            s = _const(inputs[1])
            default = [-2, -1] if variant == '2d' else (list(range(-len(s), 0)) if s else list(range(ndim)))
            dims = _dims(_const(inputs[2]), ndim, default)
        else:  # _fft_r2c(self, dim, normalization, onesided) and friends
            dims = _dims(_const(inputs[1]), ndim, [-1])
        if kind == 'r2c':
            # the input holds the signal; with an explicit n / s the signal is cropped or zero-padded to it
            sizes = [x[d] for d in dims]
            n = _const(inputs[1]) if variant != 'internal' else None
            if n is not None:
                sizes = [n] if isinstance(n, int) else list(n)
            elif x[dims[-1]] // 2 + 1 != out[dims[-1]]:  # computed n: the output's half-spectrum says 2(m - 1)
                sizes[-1] = 2 * (out[dims[-1]] - 1)
            batch = math.prod(out) // out[dims[-1]] // math.prod(out[d] for d in dims[:-1])
        else:  # c2r: the output holds the signal; c2c: input and output sizes agree
            sizes = [out[d] for d in dims]
            batch = math.prod(out) // math.prod(sizes)
        return fft_flops(batch, math.prod(sizes), complex_input=(kind == 'c2c')) / 2  # FLOPs -> MACs

    handle.__name__ = f'fft_{kind}_{variant}_macs'
    return handle


def fft_macs(batch: int, size: int, complex_input: bool = False) -> float:
    """MACs the FFT handles charge: half of :func:`fft_flops`."""
    return fft_flops(batch, size, complex_input) / 2


EXTRA_HANDLES = {
    'aten::matmul': matmul_macs,
    'aten::mm': matmul_macs,
    'aten::baddbmm': batched_matmul_add_macs,
    'aten::baddbmm_': batched_matmul_add_macs,
    'aten::addbmm': batched_matmul_add_macs,
    'aten::addbmm_': batched_matmul_add_macs,
    'aten::addmv': batched_matmul_add_macs,
    'aten::addmv_': batched_matmul_add_macs,
    'aten::addmm_': batched_matmul_add_macs,  # fvcore handles the out-of-place aten::addmm
    'aten::mv': vector_macs,
    'aten::dot': vector_macs,
    'aten::vdot': vector_macs,
    'aten::scaled_dot_product_attention': sdpa_macs,
    'aten::fft_rfft': _fft_handle('r2c', '1d'),
    'aten::fft_irfft': _fft_handle('c2r', '1d'),
    'aten::fft_fft': _fft_handle('c2c', '1d'),
    'aten::fft_ifft': _fft_handle('c2c', '1d'),
    'aten::fft_rfft2': _fft_handle('r2c', '2d'),
    'aten::fft_irfft2': _fft_handle('c2r', '2d'),
    'aten::fft_fft2': _fft_handle('c2c', '2d'),
    'aten::fft_ifft2': _fft_handle('c2c', '2d'),
    'aten::fft_rfftn': _fft_handle('r2c', 'nd'),
    'aten::fft_irfftn': _fft_handle('c2r', 'nd'),
    'aten::fft_fftn': _fft_handle('c2c', 'nd'),
    'aten::fft_ifftn': _fft_handle('c2c', 'nd'),
    'aten::_fft_r2c': _fft_handle('r2c', 'internal'),
    'aten::_fft_c2r': _fft_handle('c2r', 'internal'),
    'aten::_fft_c2c': _fft_handle('c2c', 'internal'),
}

# ops that fvcore leaves uncounted and that are not multiply-accumulates (element-wise maths, reductions, lookups):
# uncounted by the papers' convention too. Any other uncounted op is flagged in the report.
NON_MAC_OPS = frozenset({
    'aten::add', 'aten::add_', 'aten::sub', 'aten::rsub', 'aten::mul', 'aten::mul_', 'aten::div', 'aten::div_',
    'aten::neg', 'aten::exp', 'aten::log', 'aten::pow', 'aten::sqrt', 'aten::rsqrt', 'aten::reciprocal',
    'aten::abs', 'aten::sin', 'aten::cos', 'aten::real', 'aten::imag', 'aten::complex', 'aten::view_as_real',
    'aten::view_as_complex', 'aten::polar', 'aten::conj', 'aten::clamp_max', 'aten::clamp_min', 'aten::where',
    'aten::gelu', 'aten::gelu_', 'aten::silu', 'aten::sigmoid', 'aten::tanh', 'aten::softmax', 'aten::log_softmax',
    'aten::softplus', 'aten::mean', 'aten::sum', 'aten::cumsum', 'aten::embedding', 'aten::tril', 'aten::triu',
    'aten::flip', 'aten::fill_', 'aten::zeros', 'aten::zeros_like', 'aten::ones_like', 'aten::lt', 'aten::le',
    'aten::ne', 'aten::logical_not', 'aten::logical_and', 'aten::any', 'aten::all', 'aten::unsqueeze',
    'aten::view', 'aten::unflatten', 'aten::repeat', 'aten::pad', 'aten::scalar_tensor', 'aten::linspace',
    'aten::_unsafe_view', 'aten::alias', 'aten::lift_fresh', 'aten::resolve_conj', 'aten::exp_', 'aten::sub_',
    'aten::_conj', 'aten::conj_physical', 'aten::angle', 'aten::view_as', 'aten::addcmul',
})


# ------------------------------------------------------------------------------------------------------------------
# counting
# ------------------------------------------------------------------------------------------------------------------
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


def count_module(model: nn.Module, inputs: Tuple[torch.Tensor, ...], encoder: Optional[str] = None):
    """fvcore MACs of ``model(*inputs)`` with :data:`EXTRA_HANDLES`: (total, by_operator, uncounted, encoder).

    BiGS layers are traced with their FFT convolution (``conv_impl='fft'``), the O(L log L) formulation the paper
    counts, even where they would run it as a Toeplitz GEMM (faster on CPU up to L = 1024, more MACs)."""
    from fvcore.nn import FlopCountAnalysis
    from .layers.ssm import ssm_conv_impl
    fca = FlopCountAnalysis(model, inputs)
    fca.set_op_handle(**EXTRA_HANDLES)
    fca.unsupported_ops_warnings(False)
    fca.uncalled_modules_warnings(False)
    fca.tracer_warnings('none')
    with torch.no_grad(), ssm_conv_impl(model, 'fft'):
        total = int(round(fca.total()))
        by_op = {k: int(round(v)) for k, v in sorted(fca.by_operator().items(), key=lambda kv: -kv[1])}
        uncounted = dict(sorted(fca.unsupported_ops().items()))
        enc = int(round(fca.total(encoder))) if encoder else None
    return total, by_op, uncounted, enc


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
    import timm
    from . import VISION_MODELS
    if name not in VISION_MODELS:
        raise KeyError(f'unknown vision model {name!r}; known: {list(VISION_MODELS)}')
    model = timm.create_model(name, img_size=img_size, device='meta').eval()
    params = _param_count(model)
    head = sum(p.numel() for p in model.get_classifier().parameters())
    model = _materialise_zeros(model)
    total, by_op, uncounted, _ = count_module(model, (torch.zeros(1, 3, img_size, img_size),))
    return Count(name, f'1x3x{img_size}x{img_size}', params, total, by_op, uncounted,
                 params_no_head=params - head, traced_on='cpu (zero weights)')


def _text_seq_len(name: str) -> int:
    import mlp_vision.text as mt
    cfg = mt.model_config(name)
    for key in ('max_seq_len', 'block_size', 'max_position_embeddings'):
        if key in cfg:
            return cfg[key]
    if cfg['family'] == 'bigs':
        from .text.bigs import BiGSConfig
        return BiGSConfig().max_position_embeddings
    raise KeyError(f'{name}: cannot tell its maximum sequence length from {cfg}')


_ENCODER_ATTR = ('gmlp', 'bigs', 'bert')  # backbone attribute of the MLM / classification wrappers


def count_text(name: str, seq_len: Optional[int] = None) -> Count:
    import mlp_vision.text as mt
    if not mt.is_model(name):
        raise KeyError(f'unknown text model {name!r}; known: {mt.list_models()}')
    max_len = _text_seq_len(name)
    seq_len = max_len if seq_len is None else seq_len
    if not 1 <= seq_len <= max_len:
        raise ValueError(f'{name}: --seq-len must be in [1, {max_len}] (its maximum sequence length), got {seq_len}')
    model = mt.create_model(name, device='meta').eval()
    total, by_op, uncounted, enc, traced_on = _count_meta_or_cpu(model, seq_len)
    return Count(name, f'1x{seq_len} tokens', _param_count(model), total, by_op, uncounted, encoder_macs=enc,
                 traced_on=traced_on)


def _count_meta_or_cpu(model: nn.Module, seq_len: int):
    """Trace a meta-device text model on meta; if its forward cannot run on meta, on CPU with zero weights."""
    encoder = next((a for a in _ENCODER_ATTR if isinstance(getattr(model, a, None), nn.Module)), None)
    try:
        ids = torch.zeros(1, seq_len, dtype=torch.long, device='meta')
        return (*count_module(model, (ids,), encoder), 'meta')
    except Exception as e:  # e.g. torch.autocast(device_type='meta') is unsupported
        reason = f'{type(e).__name__}: {str(e).splitlines()[0][:80]}' if str(e) else type(e).__name__
    model = _materialise_zeros(model)
    ids = torch.zeros(1, seq_len, dtype=torch.long)
    return (*count_module(model, (ids,), encoder), f'cpu (zero weights; meta failed: {reason})')


def count_bert_large(seq_len: int) -> Count:
    model = BertLargeBaseline(max_len=seq_len, device='meta').eval()  # BERT-large (mlp_vision.text.bert)
    ids = torch.zeros(1, seq_len, dtype=torch.long, device='meta')
    total, by_op, uncounted, enc = count_module(model, (ids,), 'bert')
    return Count(f'bert_large_{seq_len}', f'1x{seq_len} tokens', _param_count(model), total, by_op, uncounted,
                 encoder_macs=enc)


# ------------------------------------------------------------------------------------------------------------------
# model names
# ------------------------------------------------------------------------------------------------------------------
def _bigs_names() -> List[str]:
    return [f'bigs_large_{n}' for n in BIGS_LENGTHS]


def _bert_names() -> List[str]:
    return [f'bert_large_{n}' for n in BIGS_LENGTHS]


def known_models() -> List[str]:
    """Every name the report knows, in report order: vision, text registry, BiGS-large (even if pending), BERT."""
    from . import VISION_MODELS
    import mlp_vision.text as mt
    text = [n for n in mt.list_models() if n not in _bigs_names()]
    return list(VISION_MODELS) + text + _bigs_names() + _bert_names()


def is_pending(name: str) -> bool:
    """A BiGS-large name the text registry does not have (yet)."""
    import mlp_vision.text as mt
    return name in _bigs_names() and not mt.is_model(name)


def resolve_models(patterns: Optional[Sequence[str]]) -> List[str]:
    """Known names matching any of the shell-style ``patterns`` (all when None); error for a pattern with no match."""
    known = known_models()
    if not patterns:
        return known
    selected = set()
    for pattern in patterns:
        hits = [n for n in known if fnmatch.fnmatch(n, pattern)]
        if not hits:
            raise ValueError(f'--models: pattern {pattern!r} matches no model; expected shell-style patterns over '
                             f'the known names: {", ".join(known)}')
        selected.update(hits)
    return [n for n in known if n in selected]


def family(name: str) -> str:
    from . import VISION_MODELS
    if name in VISION_MODELS:
        return 'vision'
    if name in _bert_names():
        return 'bert'
    if name in _bigs_names():
        return 'bigs'
    return 'text'


PENDING_NOTE = 'pending: BiGS not implemented yet (not registered in mlp_vision.text); lights up once it is'


class CountCache:
    """Memoised counts keyed by (name, size). ``None`` with :meth:`problem` saying why: BiGS not registered yet
    (pending) or counting raised (error: the message, e.g. a model fvcore's JIT trace cannot run)."""

    def __init__(self):
        self.cache: Dict[Tuple[str, Optional[int]], Optional[Count]] = {}
        self.problems: Dict[Tuple[str, Optional[int]], Tuple[str, str]] = {}

    def get(self, name: str, size: Optional[int] = None) -> Optional[Count]:
        key = (name, size)
        if key not in self.cache:
            fam = family(name)
            self.cache[key] = None
            try:
                if fam == 'vision':
                    self.cache[key] = count_vision(name, size or DEFAULT_IMG_SIZE)
                elif fam == 'bert':
                    self.cache[key] = count_bert_large(int(name.rsplit('_', 1)[1]))
                elif is_pending(name):
                    self.problems[key] = ('PENDING', PENDING_NOTE)
                else:
                    self.cache[key] = count_text(name, size)
            except Exception as e:  # reported as ERROR rows, the rest of the report still runs
                where = ''
                tb = e.__traceback__
                while tb is not None:
                    if 'mlp_vision' in tb.tb_frame.f_code.co_filename:
                        where = f' at {tb.tb_frame.f_code.co_filename.split("mlp_vision")[-1]}:{tb.tb_lineno}'
                    tb = tb.tb_next
                msg = str(e).splitlines()[0][:160] if str(e) else ''
                self.problems[key] = ('ERROR', f'error counting {name}: {type(e).__name__}: {msg}{where}')
        return self.cache[key]

    def problem(self, name: str, size: Optional[int] = None) -> Tuple[str, str]:
        return self.problems.get((name, size), ('', ''))


# ------------------------------------------------------------------------------------------------------------------
# paper tables
# ------------------------------------------------------------------------------------------------------------------
QUANTITIES = {
    # name: (Count attribute, unit, unit label, default tolerance)
    'params': ('params', 1e6, ' M', 0.005),
    'params_no_head': ('params_no_head', 1e6, ' M', 0.005),
    'macs': ('macs', 1e9, ' G', 0.03),
    'flops': ('flops', 1e9, ' G', 0.03),
    'encoder_flops': ('encoder_flops', 1e9, ' G', 0.03),
    'encoder_flops_raw': ('encoder_flops', 1.0, '', 0.03),
}


@dataclass(frozen=True)
class PaperRow:
    """One number of a paper table (``paper`` as printed: its digits set the precision)."""
    source: str
    model: str  # our name
    quantity: str  # key of QUANTITIES
    paper: str  # as printed, in the quantity's unit ('59', '19.5', '8.1e10')
    note: str = ''
    known: str = ''  # documented reason why it cannot match -> status KNOWN instead of FAIL

    @property
    def value(self) -> float:
        return float(self.paper)

    @property
    def resolution(self) -> float:
        """Place value of the last printed digit (``19.5`` -> 0.1, ``59`` -> 1, ``8.1e10`` -> 1e9)."""
        return float(Decimal(1).scaleb(Decimal(self.paper).as_tuple().exponent))

    @property
    def tolerance(self) -> float:
        return QUANTITIES[self.quantity][3]


_T1 = 'gMLP T1'
_T2 = 'gMLP T2'
_S6 = 'sMLPNet T6'
_OFF = 'official sMLPNet code (SPEC §2)'
_NO_HEAD = 'paper counts the model without its 1000-class head (ours with head: {})'
_LAYOUT = 'timm layout (loads timm gMLP-S/B weights); paper layout differs slightly (README)'
PAPER_ROWS: Tuple[PaperRow, ...] = (
    # gMLP paper Table 1 (params; "FLOPs" = 2 x MACs: Table 2 lists the same models' MAdds at half of them)
    PaperRow(_T1, 'gmlp_ti', 'params', '5.9'),
    PaperRow(_T1, 'gmlp_ti', 'flops', '2.7', 'Table 1 "FLOPs" = 2 x MACs'),
    PaperRow(_T1, 'gmlp_s', 'params', '19.5', _LAYOUT),
    PaperRow(_T1, 'gmlp_s', 'flops', '8.9', 'Table 1 "FLOPs" = 2 x MACs'),
    PaperRow(_T1, 'gmlp_b', 'params', '73.4', _LAYOUT),
    PaperRow(_T1, 'gmlp_b', 'flops', '31.6', 'Table 1 "FLOPs" = 2 x MACs'),
    # gMLP paper Table 2 (params rounded to 1 M, MAdds)
    PaperRow(_T2, 'gmlp_ti', 'params', '6'),
    PaperRow(_T2, 'gmlp_ti', 'macs', '1.4', known=(
        'Table 2 halves Table 1 (2.7 B FLOPs / 2 = 1.35, printed 1.4); ours 1.344 G matches Table 1 (2.69 B); '
        'the linear, SGU and patch-embedding MACs alone are 1.33 G')),
    PaperRow(_T2, 'gmlp_s', 'params', '20', known=(
        'Table 2 rounds Table 1\'s 19.5 M up to 20; the timm layout has 19.42 M (-0.40 % vs 19.5, passes '
        'the Table 1 row)')),
    PaperRow(_T2, 'gmlp_s', 'macs', '4.5'),
    PaperRow(_T2, 'gmlp_b', 'params', '73'),
    PaperRow(_T2, 'gmlp_b', 'macs', '15.8'),
    # sMLPNet paper Table 6 (FLOPs = MACs); the Mixer rows equal gMLP Table 2's
    PaperRow(_S6, 'smlpnet_t_a2', 'params', '19.2', 'sMLPNet-T* (alpha = 2)'),
    PaperRow(_S6, 'smlpnet_t_a2', 'macs', '4.0', 'sMLPNet-T* (alpha = 2)'),
    PaperRow(_S6, 'smlpnet_t', 'params', '24.1'),
    PaperRow(_S6, 'smlpnet_t', 'macs', '5.0'),
    PaperRow(_S6, 'smlpnet_s', 'params', '48.6'),
    PaperRow(_S6, 'smlpnet_s', 'macs', '10.3'),
    PaperRow(_S6, 'smlpnet_b', 'params', '65.9'),
    PaperRow(_S6, 'smlpnet_b', 'macs', '14.0'),
    PaperRow(_S6 + ' / ' + _T2, 'mixer_b16', 'params_no_head', '59', _NO_HEAD),
    PaperRow(_S6 + ' / ' + _T2, 'mixer_b16', 'macs', '12.7'),
    PaperRow(_S6 + ' / ' + _T2, 'mixer_l16', 'params_no_head', '207', _NO_HEAD),
    PaperRow(_S6 + ' / ' + _T2, 'mixer_l16', 'macs', '44.8'),
    # fvcore on the official sMLPNet implementation (SPEC §2)
    PaperRow(_OFF, 'smlpnet_t_a2', 'params', '19.18'),
    PaperRow(_OFF, 'smlpnet_t_a2', 'macs', '3.97'),
    PaperRow(_OFF, 'smlpnet_t', 'params', '24.12'),
    PaperRow(_OFF, 'smlpnet_t', 'macs', '5.01'),
    PaperRow(_OFF, 'smlpnet_s', 'params', '48.56'),
    PaperRow(_OFF, 'smlpnet_s', 'macs', '10.35'),
    PaperRow(_OFF, 'smlpnet_b', 'params', '65.88'),
    PaperRow(_OFF, 'smlpnet_b', 'macs', '14.03'),
    # gMLP paper Tables 3-5 (text; BERT setup, vocab 32,000, tied embeddings)
    PaperRow('gMLP T3', 'gmlp_36l_seq128', 'params', '102', 'multiplicative split gMLP, 36 x d512, seq 128'),
    PaperRow('gMLP T4', 'gmlp_18l_seq128', 'params', '59'),
    PaperRow('gMLP T4', 'gmlp_36l_seq128', 'params', '102'),
    PaperRow('gMLP T4', 'gmlp_72l_seq128', 'params', '187'),
    PaperRow('gMLP T4', 'gmlp_144l_seq128', 'params', '357'),
    PaperRow('gMLP T5', 'gmlp_base', 'params', '130'),
    PaperRow('gMLP T5', 'amlp_base', 'params', '109'),
    PaperRow('gMLP T5', 'gmlp_large', 'params', '365'),
    PaperRow('gMLP T5', 'amlp_large', 'params', '316'),
    PaperRow('gMLP T5', 'gmlp_xlarge', 'params', '941'),
    PaperRow('gMLP T5', 'gmlp_base', 'encoder_flops', '158.0', 'FLOPs = 2 x encoder MACs at seq 512 (no MLM head)'),
    PaperRow('gMLP T5', 'amlp_base', 'encoder_flops', '128.9', 'FLOPs = 2 x encoder MACs at seq 512 (no MLM head)'),
    PaperRow('gMLP T5', 'gmlp_large', 'encoder_flops', '430.1', 'FLOPs = 2 x encoder MACs at seq 512 (no MLM head)'),
    PaperRow('gMLP T5', 'amlp_large', 'encoder_flops', '370.3', 'FLOPs = 2 x encoder MACs at seq 512 (no MLM head)'),
    PaperRow('gMLP T5', 'gmlp_xlarge', 'encoder_flops', '1091.3',
             'FLOPs = 2 x encoder MACs at seq 512 (no MLM head)'),
    PaperRow('gMLP T5', 'bert_large_512', 'encoder_flops', '341.2',
             'BERT-large baseline (ours, explicit attention), encoder only'),
    # MLP-Attention paper (text: "6 million" vs "5.5 million")
    PaperRow('MLP-Attention', 'gpt_mlp_attention', 'params', '6',
             'paper: "6 million" (SPEC writes 6.0; ours 6.061 M = the reference code\'s own record)'),
    PaperRow('MLP-Attention', 'gpt_sdpa', 'params', '5.5', 'paper: "5.5 million"'),
    # BiGS paper: 346 M (BiGS-large, pretrained at 128 tokens), Table 6 forward FLOPs, encoder only
    PaperRow('BiGS §5', 'bigs_large_128', 'params', '346', 'BiGS-large with 128 positions (pretraining length)'),
    *(PaperRow('BiGS T6', f'bigs_large_{n}', 'encoder_flops_raw', p, 'forward FLOPs = 2 x encoder MACs')
      for n, p in zip(BIGS_LENGTHS, ('8.1e10', '3.2e11', '6.5e11', '2.6e12'))),
    *(PaperRow('BiGS T6', f'bert_large_{n}', 'encoder_flops_raw', p, 'forward FLOPs = 2 x encoder MACs')
      for n, p in zip(BIGS_LENGTHS, ('7.9e10', '3.4e11', '7.2e11', '4.1e12'))),
    *(PaperRow('SPEC §2 measured', f'bigs_large_{n}', 'encoder_flops_raw', p, 'official BiGS code, fvcore x 2')
      for n, p in zip(BIGS_LENGTHS, ('8.08e10', '3.24e11', '6.48e11', '2.59e12'))),
    *(PaperRow('SPEC §2 measured', f'bert_large_{n}', 'encoder_flops_raw', p, 'explicit BERT-large, fvcore x 2')
      for n, p in zip(BIGS_LENGTHS, ('7.90e10', '3.35e11', '7.22e11', '4.13e12'))),
)


STATUSES = ('PASS', 'KNOWN', 'FAIL', 'PENDING', 'ERROR')


@dataclass
class Comparison:
    row: PaperRow
    ours: Optional[float]  # in the quantity's unit; None when pending
    rel_diff: Optional[float]
    status: str  # PASS | KNOWN | FAIL | PENDING
    how: str  # 'tolerance' | 'precision' | ''
    note: str


def _fmt_like(value: float, paper: str) -> str:
    """``value`` with two more digits than the paper printed (scientific when the paper is)."""
    d = Decimal(paper)
    if 'e' in paper.lower():
        mantissa_decimals = max(0, len(paper.lower().split('e')[0].split('.')[-1]) if '.' in paper else 0)
        mantissa, exponent = f'{value:.{mantissa_decimals + 2}e}'.split('e')
        return f'{mantissa}e{int(exponent)}'
    decimals = max(0, -d.as_tuple().exponent) + 2
    return f'{value:.{decimals}f}'


def compare(row: PaperRow, count: Optional[Count], problem: Tuple[str, str] = ('PENDING', PENDING_NOTE)
            ) -> Comparison:
    """``row`` against ``count`` (None: ``problem`` = (status, note) says why there is no count)."""
    attr, unit, _, tol = QUANTITIES[row.quantity]
    if count is None:
        return Comparison(row, None, None, problem[0], '', problem[1])
    raw = getattr(count, attr)
    ours = raw / unit
    rel = ours / row.value - 1
    within_tol = abs(rel) <= tol + 1e-12
    at_precision = abs(ours - row.value) <= row.resolution / 2 + 1e-9 * row.resolution
    how = 'tolerance' if within_tol else ('precision' if at_precision else '')
    note = row.note.format(f'{count.params / 1e6:.2f} M') if '{}' in row.note else row.note
    if how:
        status = 'PASS'
    elif row.known:
        status, note = 'KNOWN', (note + '; ' if note else '') + row.known
    else:
        status = 'FAIL'
    return Comparison(row, ours, rel, status, how, note)


# ------------------------------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------------------------------
@dataclass
class Report:
    img_size: int
    seq_len: Optional[int]
    models: List[str]
    counts: Dict[str, Optional[Count]] = field(default_factory=dict)
    problems: Dict[str, Tuple[str, str]] = field(default_factory=dict)  # name -> (PENDING | ERROR, note)
    comparisons: List[Comparison] = field(default_factory=list)
    skipped_rows: List[str] = field(default_factory=list)


def build_report(models: Optional[Sequence[str]] = None, img_size: int = DEFAULT_IMG_SIZE,
                 seq_len: Optional[int] = None, counter: Optional[CountCache] = None) -> Report:
    """Count ``models`` (names or patterns; all when None) and compare the paper rows that concern them."""
    if not isinstance(img_size, int) or img_size < 32 or img_size % 32:
        raise ValueError(f'--img-size must be a positive multiple of 32 (sMLPNet needs H, W divisible by 32, '
                         f'gMLP / Mixer by 16), got {img_size}')
    if seq_len is not None and (not isinstance(seq_len, int) or seq_len < 1):
        raise ValueError(f'--seq-len must be a positive integer, got {seq_len}')
    names = resolve_models(models)
    counter = counter or CountCache()
    report = Report(img_size, seq_len, names)
    for name in names:
        fam = family(name)
        size = img_size if fam == 'vision' else (seq_len if fam in ('text', 'bigs') else None)
        if fam == 'vision' and img_size == DEFAULT_IMG_SIZE:
            size = None
        if size is not None and fam in ('text', 'bigs') and not is_pending(name) and size > _text_seq_len(name):
            report.counts[name] = None
            report.skipped_rows.append(f'{name}: not counted, --seq-len {seq_len} exceeds its maximum '
                                       f'{_text_seq_len(name)}')
            continue
        report.counts[name] = counter.get(name, size)
        if report.counts[name] is None:
            report.problems[name] = counter.problem(name, size)
    for row in PAPER_ROWS:
        if row.model not in names:
            continue
        # the paper numbers are at the paper settings (224 px, each text model at its own length)
        count = counter.get(row.model, None)
        report.comparisons.append(compare(row, count, counter.problem(row.model, None)))
    return report


def _g(x: Optional[float], unit: float = 1e9, digits: int = 3) -> str:
    return '–' if x is None else f'{x / unit:.{digits}f}'


def _uncounted_str(count: Count) -> str:
    parts = [f'{op.replace("aten::", "")}×{n}' for op, n in count.uncounted.items()]
    flagged = count.flagged
    s = ', '.join(parts) if parts else 'none'
    if flagged:
        s += ' — **not element-wise: ' + ', '.join(flagged) + '**'
    return s


def conventions() -> List[str]:
    return [
        'MACs: fvcore `FlopCountAnalysis` totals (fvcore counts one multiply-accumulate as one flop). sMLPNet '
        'Table 6 "FLOPs" and gMLP Table 2 "MAdds" are MACs; gMLP Table 1 "FLOPs" are 2 × MACs (2.7 / 8.9 / 31.6 B '
        'for the models Table 2 lists at 1.4 / 4.5 / 15.8 MAdds), as are gMLP Table 5 and BiGS Table 6 FLOPs.',
        'Handles added to fvcore\'s: broadcast-aware `aten::matmul`/`aten::mm` (prod(output) × K; the stock one '
        'drops broadcast batch dims: sMLPNet-T 4.94 G instead of 5.01 G), `baddbmm`/`addbmm`/`addmv` (their product), '
        '`mv`/`dot`; `aten::scaled_dot_product_attention` '
        '= QKᵀ + AV = batch·heads·L·S·(E + E_v); FFTs (`fft_rfft`, `fft_irfft`, `fft_fft`, n-D variants, '
        '`_fft_r2c`/`_fft_c2r`/`_fft_c2c`) = **2.5·N·log₂N FLOPs per real transform of length N** (5·N·log₂N '
        'complex), i.e. 1.25·N·log₂N MACs, so the FLOPs columns carry 2.5·N·log₂N (SPEC §2).',
        'fvcore\'s stock LayerNorm (5 per element) and eval BatchNorm (2 per element) counts are kept. '
        'Element-wise ops and embedding lookups are not MACs and stay uncounted (listed per model).',
        'Vision models: traced on CPU with zero weights and a zero image (the meta-device convolution kernel '
        'cannot run under the JIT tracer); text, BiGS and BERT models: built and traced on `device="meta"`.',
        'Encoder MACs/FLOPs: the backbone only (`.gmlp` / `.bigs` / `.bert`), without the MLM head; the BiGS '
        'and gMLP Table 5 FLOPs are per sequence (batch 1), forward only, inputs padded to full length.',
        'Paper comparison: PASS when within tolerance (params 0.5 %, MACs/FLOPs 3 %) or when ours equals the '
        'paper\'s number at the paper\'s printed precision ("59" M: ours rounds to 59) — the `by` column says '
        'which; KNOWN = cannot match, documented reason in the note; PENDING = model not available yet.',
    ]


def render_markdown(report: Report, command: str = COMMAND) -> str:
    import fvcore
    import timm
    out = io.StringIO()
    w = out.write
    w('# Model complexity: parameters and MACs vs the paper tables\n\n')
    w(f'Generated by `{command}`  \n')
    w(f'(scaling plot `complexity_scaling.png`: `{COMMAND_PLOT}`)\n\n')
    text_len = "each model's maximum sequence length" if report.seq_len is None else f'{report.seq_len} tokens'
    w(f'torch {torch.__version__.split("+")[0]}, timm {timm.__version__}, fvcore {fvcore.__version__}; '
      f'vision models at {report.img_size}×{report.img_size}, text models at {text_len}, batch 1.\n\n')
    w('## Conventions\n\n')
    for line in conventions():
        w(f'- {line}\n')
    w('\n## Paper tables vs ours\n\n')
    if report.comparisons:
        statuses = Counter(c.status for c in report.comparisons)
        w('Rows: ' + ', '.join(f'{k} {statuses[k]}' for k in STATUSES if statuses[k])
          + '.\n\n')
        w('| source | model | quantity | paper | ours | diff | by | status | note |\n')
        w('| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n')
        for c in report.comparisons:
            unit = QUANTITIES[c.row.quantity][2]
            ours = '–' if c.ours is None else _fmt_like(c.ours, c.row.paper)
            diff = '–' if c.rel_diff is None else f'{100 * c.rel_diff:+.2f} %'
            w(f'| {c.row.source} | `{c.row.model}` | {c.row.quantity} | {c.row.paper}{unit} | {ours}{unit} | '
              f'{diff} | {c.how or "–"} | {c.status} | {c.note} |\n')
    else:
        w('No paper row concerns the selected models.\n')
    if report.img_size != DEFAULT_IMG_SIZE or report.seq_len is not None:
        w('\nPaper rows are always compared at the paper settings (224 px; each text model at its own length).\n')
    w('\n## Models\n\n')
    w('| model | input | params (M) | params w/o head (M) | MACs (G) | encoder MACs (G) | FLOPs (G) | traced on '
      '| uncounted ops (calls) |\n')
    w('| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n')
    for name in report.models:
        c = report.counts.get(name)
        if c is None:
            reason = report.problems.get(name, ('', 'not counted (see below)'))[1]
            w(f'| `{name}` | – | – | – | – | – | – | – | {reason} |\n')
            continue
        w(f'| `{name}` | {c.input} | {c.params / 1e6:.3f} | {_g(c.params_no_head, 1e6)} | {_g(c.macs)} | '
          f'{_g(c.encoder_macs)} | {_g(c.flops)} | {c.traced_on} | {_uncounted_str(c)} |\n')
    if report.skipped_rows:
        w('\n' + ''.join(f'- {line}\n' for line in report.skipped_rows))
    w('\n## MACs by operator (G)\n\n')
    w('| model | by operator |\n| --- | --- |\n')
    for name in report.models:
        c = report.counts.get(name)
        if c is None:
            continue
        ops = ', '.join(f'{op} {v / 1e9:.4g}' for op, v in c.by_operator.items())
        w(f'| `{name}` | {ops} |\n')
    return out.getvalue()


def _csv_rows(report: Report) -> List[dict]:
    rows = []
    for c in report.comparisons:
        unit = QUANTITIES[c.row.quantity][2]
        rows.append(dict(
            section='paper', source=c.row.source, model=c.row.model, input='', quantity=c.row.quantity,
            unit=unit.strip(), paper=c.row.paper, ours='' if c.ours is None else _fmt_like(c.ours, c.row.paper),
            rel_diff_pct='' if c.rel_diff is None else f'{100 * c.rel_diff:.3f}',
            tolerance_pct=f'{100 * c.row.tolerance:g}', by=c.how, status=c.status, note=c.note))
    for name in report.models:
        c = report.counts.get(name)
        base = dict(section='model', source='', model=name, paper='', rel_diff_pct='', tolerance_pct='', by='')
        if c is None:
            status, note = report.problems.get(name, ('SKIPPED', 'not counted'))
            rows.append(dict(base, input='', quantity='', unit='', ours='', status=status, note=note))
            continue
        values = [('params', c.params, 1), ('params_no_head', c.params_no_head, 1), ('macs', c.macs, 1),
                  ('encoder_macs', c.encoder_macs, 1)]
        for q, v, _ in values:
            if v is None:
                continue
            rows.append(dict(base, input=c.input, quantity=q, unit='', ours=str(v), status='',
                             note='' if q != 'macs' else 'uncounted: ' + _uncounted_str(c)))
    return rows


CSV_FIELDS = ('section', 'source', 'model', 'input', 'quantity', 'unit', 'paper', 'ours', 'rel_diff_pct',
              'tolerance_pct', 'by', 'status', 'note')


def render_csv(report: Report) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator='\n')
    writer.writeheader()
    writer.writerows(_csv_rows(report))
    return out.getvalue()


def render_json(report: Report) -> str:
    data = dict(
        conventions=conventions(), img_size=report.img_size, seq_len=report.seq_len,
        models={n: (None if c is None else dict(asdict(c), flops=c.flops, encoder_flops=c.encoder_flops))
                for n, c in report.counts.items()},
        comparisons=[dict(asdict(c.row), ours=c.ours, rel_diff=c.rel_diff, status=c.status, by=c.how, note=c.note)
                     for c in report.comparisons],
    )
    return json.dumps(data, indent=1) + '\n'


# ------------------------------------------------------------------------------------------------------------------
# scaling plot
# ------------------------------------------------------------------------------------------------------------------
PLOT_IMG_SIZES = (224, 320, 448, 640, 832, 1024)
PLOT_VISION = ('smlpnet_t', 'mixer_s16', 'gmlp_s')
PLOT_SEQ_LENS = (128, 256, 512, 1024, 2048, 4096)


def _bigs_at(seq_len: int) -> Optional[Count]:
    import mlp_vision.text as mt
    if not mt.is_model('bigs_large_512'):
        return None
    model = mt.create_model('bigs_large_512', max_position_embeddings=seq_len, device='meta').eval()
    total, by_op, uncounted, enc, traced_on = _count_meta_or_cpu(model, seq_len)
    return Count(f'bigs_large@{seq_len}', f'1x{seq_len} tokens', _param_count(model), total, by_op, uncounted,
                 encoder_macs=enc, traced_on=traced_on)


def scaling_data() -> dict:
    vision = {n: [count_vision(n, s).macs for s in PLOT_IMG_SIZES] for n in PLOT_VISION}
    bert = [count_bert_large(n).encoder_macs for n in PLOT_SEQ_LENS]
    bigs_counts = [_bigs_at(n) for n in PLOT_SEQ_LENS]
    bigs = None if any(c is None for c in bigs_counts) else [c.encoder_macs for c in bigs_counts]
    return dict(img_sizes=list(PLOT_IMG_SIZES), vision=vision, seq_lens=list(PLOT_SEQ_LENS), bert=bert, bigs=bigs)


def _slope(x: Sequence[float], y: Sequence[float]) -> float:
    """log-log slope between the last two points."""
    return math.log(y[-1] / y[-2]) / math.log(x[-1] / x[-2])


def plot_scaling(path: str, data: Optional[dict] = None) -> dict:
    """Two log-log panels: vision MACs vs tokens (image side 224 ... 1024) with slope-1 / 1.5 / 2 references, and
    BiGS-large vs BERT-large forward FLOPs vs sequence length with L log L and L^2 references. Returns the data."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    data = data or scaling_data()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12.5, 5.2))
    sizes = data['img_sizes']
    tokens = [(s / 16) ** 2 for s in sizes]  # /16 patches; sMLPNet's stage tokens are proportional
    labels = {'smlpnet_t': 'sMLPNet-T', 'mixer_s16': 'Mixer-S/16', 'gmlp_s': 'gMLP-S'}
    for name, macs in data['vision'].items():
        g = [m / 1e9 for m in macs]
        ax1.loglog(tokens, g, 'o-', label=f'{labels.get(name, name)} (end slope {_slope(tokens, g):.2f})')
    ref0 = data['vision']['smlpnet_t'][0] / 1e9
    for slope, style, text in ((1.0, ':', 'slope 1 (N)'), (1.5, '--', 'slope 1.5 (N√N)'),
                               (2.0, '-.', 'slope 2 (N²)')):
        ax1.loglog(tokens, [ref0 * (t / tokens[0]) ** slope for t in tokens], 'k' + style, lw=0.8, label=text)
    ax1.set_xticks(tokens, [f'{int(t)}\n{s}px' for t, s in zip(tokens, sizes)], fontsize=7)
    ax1.minorticks_off()
    ax1.set_xlabel('tokens N = (image side / 16)²')
    ax1.set_ylabel('MACs (G, fvcore)')
    ax1.set_title('Vision: MACs vs input size (fixed widths)')
    ax1.grid(True, which='major', alpha=0.3)
    ax1.legend(fontsize=8)
    L = data['seq_lens']
    bert = [2 * m for m in data['bert']]
    ax2.loglog(L, bert, 'o-', label=f'BERT-large, explicit attention (end slope {_slope(L, bert):.2f})')
    if data['bigs'] is not None:
        bigs = [2 * m for m in data['bigs']]
        ax2.loglog(L, bigs, 's-', label=f'BiGS-large (end slope {_slope(L, bigs):.2f})')
    else:
        ax2.text(0.05, 0.9, 'BiGS: pending (not implemented yet)', transform=ax2.transAxes)
    paper = {'BiGS': (8.1e10, 3.2e11, 6.5e11, 2.6e12), 'BERT': (7.9e10, 3.4e11, 7.2e11, 4.1e12)}
    for (name, values), marker in zip(paper.items(), ('x', '+')):
        ax2.loglog(BIGS_LENGTHS, values, marker, color='k', ms=8, label=f'{name}, BiGS paper Table 6')
    r0 = bert[0]
    ax2.loglog(L, [r0 * (n / L[0]) * math.log2(2 * n) / math.log2(2 * L[0]) for n in L], 'k:', lw=0.8,
               label='∝ L log L')
    ax2.loglog(L, [r0 * (n / L[0]) ** 2 for n in L], 'k-.', lw=0.8, label='∝ L²')
    ax2.set_xticks(L, [str(n) for n in L])
    ax2.minorticks_off()
    ax2.set_xlabel('sequence length L')
    ax2.set_ylabel('forward FLOPs per sequence (2 × encoder MACs)')
    ax2.set_title('Text: BiGS-large vs BERT-large (encoders, batch 1)')
    ax2.grid(True, which='major', alpha=0.3)
    ax2.legend(fontsize=8)
    fig.suptitle(f'fvcore counts (mlp_vision.complexity); `{COMMAND_PLOT}`', fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return data


# ------------------------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------------------------
FORMATS = ('md', 'csv', 'json')


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected a positive integer, got {text!r}')
    if value < 1:
        raise argparse.ArgumentTypeError(f'expected a positive integer, got {value}')
    return value


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog='python -m mlp_vision.complexity',
        description='Parameters and fvcore MACs of every model beside the paper tables (see module docstring).')
    p.add_argument('--models', nargs='+', metavar='PATTERN',
                   help='shell-style name patterns (default: every model); e.g. "smlpnet_*" "bigs_*"')
    p.add_argument('--img-size', type=_positive_int, default=DEFAULT_IMG_SIZE,
                   help='image side for the vision models, a multiple of 32 (default 224)')
    p.add_argument('--seq-len', type=_positive_int, default=None,
                   help='sequence length for the registered text models incl. BiGS (default: each model\'s '
                        'maximum; longer than a model\'s maximum: that model is listed as not counted); the '
                        'bert_large_L baselines stay at their L')
    p.add_argument('--format', choices=FORMATS, default=None,
                   help='output format (default: from each --output suffix, else md)')
    p.add_argument('--output', nargs='+', metavar='PATH',
                   help='write here instead of stdout; several paths (.md / .csv / .json) share one count')
    p.add_argument('--plot', metavar='PNG', help='write the MACs-scaling plot (vision sizes, BiGS/BERT lengths) '
                                                 'and exit')
    args = p.parse_args(argv)
    if args.img_size % 32:
        p.error(f'--img-size must be a multiple of 32 (sMLPNet needs H and W divisible by 32), got {args.img_size}')
    outputs = args.output or [None]
    if args.format is not None and len(outputs) > 1:
        p.error('--format applies to a single --output; with several, each path\'s suffix sets its format')
    args.targets = []
    for path in outputs:
        suffix = (path or '').rsplit('.', 1)[-1].lower() if path and '.' in path else ''
        fmt = args.format or (suffix if suffix in FORMATS else None)
        if fmt is None:
            if path is not None and len(outputs) > 1:
                p.error(f'--output {path!r}: cannot tell the format, expected a .md, .csv or .json suffix')
            fmt = 'md'
        args.targets.append((path, fmt))
    return args


def _command_line(args: argparse.Namespace) -> str:
    parts = ['python -m mlp_vision.complexity']
    if args.models:
        parts += ['--models'] + [f"'{m}'" for m in args.models]
    if args.img_size != DEFAULT_IMG_SIZE:
        parts += ['--img-size', str(args.img_size)]
    if args.seq_len is not None:
        parts += ['--seq-len', str(args.seq_len)]
    if args.format is not None:
        parts += ['--format', args.format]
    if args.output:
        parts += ['--output'] + list(args.output)
    return ' '.join(parts)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.plot:
        plot_scaling(args.plot)
        print(f'wrote {args.plot}', file=sys.stderr)
        return 0
    try:
        report = build_report(args.models, args.img_size, args.seq_len)
    except ValueError as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    for path, fmt in args.targets:
        if fmt == 'md':
            text = render_markdown(report, _command_line(args))
        elif fmt == 'csv':
            text = render_csv(report)
        else:
            text = render_json(report)
        if path:
            with open(path, 'w') as f:
                f.write(text)
        else:
            sys.stdout.write(text)
    bad = [c for c in report.comparisons if c.status in ('FAIL', 'ERROR')]
    bad_models = [n for n, (status, _) in report.problems.items() if status == 'ERROR']
    if bad or bad_models:
        print(f'{len(bad)} paper rows FAIL/ERROR, {len(bad_models)} models could not be counted', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
