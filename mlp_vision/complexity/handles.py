""" fvcore plumbing: the op handles this project adds to fvcore's (kept: linear, conv, einsum, bmm, norms), and one
call that counts a module. Each handle's docstring gives its rule; why each is needed (what the stock set skips or
miscounts) is in ``docs/complexity.md``. Element-wise ops and lookups (:data:`NON_MAC_OPS`) are not
multiply-accumulates and stay uncounted, as in the papers.
"""
import contextlib
import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn


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
    return math.prod(_shape(outputs[0])) * _shape(inputs[0])[-1]


def batched_matmul_add_macs(inputs, outputs) -> int:
    """``aten::baddbmm`` / ``aten::addbmm`` / ``aten::addmv`` (self, a, b, ...): MACs of ``a @ b`` (the add is
    element-wise): ``prod(a @ b) x K``; for ``addbmm`` the batch is also summed over."""
    a, b = _shape(inputs[1]), _shape(inputs[2])
    cols = b[-1] if len(b) > 1 else 1
    return math.prod(a[:-1]) * a[-1] * cols


def toeplitz_conv_macs(inputs, outputs) -> float:
    """``mlp_vision::bidirectional_long_conv(u_f, u_b, table, ...)`` (BiGS's Triton route): both directions'
    tiles on one side of the block diagonal, ``B C L`` times
    :func:`~mlp_vision.layers.longconv_triton.toeplitz_conv_macs_per_token` each."""
    from ..layers.longconv_triton import toeplitz_conv_macs_per_token
    batch, length, channels = _shape(inputs[0])
    block_l = _shape(inputs[2])[-1]
    return 2 * batch * channels * length * toeplitz_conv_macs_per_token(length, block_l)


def vector_macs(inputs, outputs) -> int:
    """``aten::mv`` / ``aten::dot`` / ``aten::vdot``: ``prod(first operand)``."""
    return math.prod(_shape(inputs[0]))


def sdpa_macs(inputs, outputs) -> int:
    """``aten::scaled_dot_product_attention(q, k, v, ...)``: ``Q K^T`` + ``A V`` MACs, full L x S scores."""
    q, k, v = (_shape(x) for x in inputs[:3])
    rows = math.prod(_shape(outputs[0])[:-1])  # (..., L): batch dims of q (grouped-query heads broadcast)
    return rows * k[-2] * (q[-1] + v[-1])


def fft_flops(batch: int, size: int, complex_input: bool = False) -> float:
    """FLOPs of ``batch`` transforms of ``size`` points: 2.5 N log2 N (real: r2c / c2r) or 5 N log2 N (complex:
    c2c) each."""
    return batch * (5.0 if complex_input else 2.5) * size * math.log2(size) if size > 1 else 0.0


def fft_macs(batch: int, size: int, complex_input: bool = False) -> float:
    """MACs the FFT handles charge: half of :func:`fft_flops`."""
    return fft_flops(batch, size, complex_input) / 2


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
        return fft_macs(batch, math.prod(sizes), complex_input=(kind == 'c2c'))

    handle.__name__ = f'fft_{kind}_{variant}_macs'
    return handle


_FFT_OPS = {  # op name (without 'aten::') -> (kind, variant)
    'fft_rfft': ('r2c', '1d'), 'fft_irfft': ('c2r', '1d'), 'fft_fft': ('c2c', '1d'), 'fft_ifft': ('c2c', '1d'),
    'fft_rfft2': ('r2c', '2d'), 'fft_irfft2': ('c2r', '2d'), 'fft_fft2': ('c2c', '2d'), 'fft_ifft2': ('c2c', '2d'),
    'fft_rfftn': ('r2c', 'nd'), 'fft_irfftn': ('c2r', 'nd'), 'fft_fftn': ('c2c', 'nd'), 'fft_ifftn': ('c2c', 'nd'),
    '_fft_r2c': ('r2c', 'internal'), '_fft_c2r': ('c2r', 'internal'), '_fft_c2c': ('c2c', 'internal'),
}

EXTRA_HANDLES = {
    'aten::matmul': matmul_macs,
    'aten::mm': matmul_macs,
    **{f'aten::{op}': batched_matmul_add_macs for op in (
        'baddbmm', 'baddbmm_', 'addbmm', 'addbmm_', 'addmv', 'addmv_',
        'addmm_',  # fvcore handles the out-of-place aten::addmm
    )},
    **{f'aten::{op}': vector_macs for op in ('mv', 'dot', 'vdot')},
    'aten::scaled_dot_product_attention': sdpa_macs,
    'mlp_vision::bidirectional_long_conv': toeplitz_conv_macs,
    **{f'aten::{op}': _fft_handle(kind, variant) for op, (kind, variant) in _FFT_OPS.items()},
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
    """fvcore MACs of ``model(*inputs)`` with :data:`EXTRA_HANDLES`.

    Returns ``(total, by_operator, uncounted, encoder_total)``: ``uncounted`` maps each op fvcore skipped to its
    number of calls; ``encoder_total`` is the total of the submodule named ``encoder`` (None without one).

    BiGS layers are traced with the convolution route ``bigs_conv_impl``: by default their FFT convolution
    (``'fft'``), the O(L log L) formulation the paper counts, even where they would run a Toeplitz GEMM (faster on
    CPU up to L = 1024, more MACs) or the chunked route; ``None`` counts the route each layer takes for ``inputs``
    (``conv_impl``, or what ``'auto'`` picks on their device: what ``benchmark.py`` reports). Token GEMMs
    (gMLP's SGU, Mixer's token MLP) are traced unpadded (``token_multiple=1``): the papers' MACs, not the exact
    zeros they add for GPU kernels on CUDA inputs (196 -> 200 tokens)."""
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
