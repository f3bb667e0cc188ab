""" Bidirectional long convolution of the BiGS layer as a blocked Toeplitz GEMM in Triton, optionally with the
input GELUs in the same op (the layer's route) or fused with the multiplicative gate.

Paper: `Pretraining Without Attention` (BiGS) - https://arxiv.org/abs/2212.10544: an SSM is a convolution with a
long kernel ``K`` (§3.1), one causal and one anti-causal per layer, one kernel per direction shared by all channels
(§4). With ``D`` folded into lag 0, for u (B, L, 2, C) holding the two directions' inputs::

    y[b, l, 0, c] = sum_{j <= l} K_f[l - j] u[b, j, 0, c]        (causal, forward SSM)
    y[b, l, 1, c] = sum_{j >= l} K_b[j - l] u[b, j, 1, c]        (anti-causal, backward SSM)

and, with ``gated=True`` and a bias (2, C), the product ``(y[..., 0, :] + bias[0]) * (y[..., 1, :] + bias[1])``.

Formulation: blocked Toeplitz GEMM (why not FFTs)
-------------------------------------------------
Each direction is one product ``Y = T U`` of the (L, L) Toeplitz matrix ``T[i, j] = K[i - j]`` with the (L, B*C)
input. ``T`` is never built: its ``block_l``-square tile at block position (i, j) depends only on ``m = |i - j|``,
so a table of ``~L * block_l`` taps (:func:`lag_block_table`) held in L2 serves every tile, and each program sums
``table[|i - j|] @ U[j]`` over the non-zero tiles: ``L * C`` MACs per token for both directions, compute-bound at
GEMM speed. The FFT route (``ssm.bidirectional_fft_conv``) does fewer FLOPs but is memory-bound (~100 bytes per
element); FlashFFTConv (arXiv 2311.05908) avoids that traffic with a far larger kernel, built for a kernel per
channel. Going below L^2 (half attention's constant) needs the SSM structure (chunked state passing).

Precision: tiles are multiplied in the input dtype (the table cast to it: bf16 / fp16 taps carry the input's unit
roundoff) with float32 accumulation; float32 inputs use ``ieee`` products. Outputs are cast back to the input dtype.

Backward (both GEMMs in Triton): ``grad_u`` is the same kernel with each direction's causality flipped and the
table tiles transposed (the adjoint of a causal convolution is the anti-causal correlation); table tile ``m`` gets
``sum_{b, c-blocks, i} G[i] U[i -/+ m]^T`` (deterministic partial sums), carried to ``K`` through the gather. With
``gated=True`` the gate's backward runs in PyTorch on the two factors the forward saved.

Input GELU (:func:`bidirectional_gelu_long_conv`, the BiGS layer's Triton route): the forward op computes
``u = mask * GELU(a)`` once per element (``F.gelu``, then the padded positions zeroed) and runs the kernel on ``u``;
the backward op recomputes ``u`` from ``a`` for the table gradient, and the adjoint kernel multiplies each output
tile by ``mask * GELU'(a)`` once, after its tile loop (why not inside it: :mod:`._longconv_kernels`). ``u`` is
transient: the backward pass keeps only ``a``, and no stacked copy of the two directions is made.

Changing what runs on CUDA: what runs by default on CUDA changes only with a GPU row in ``results/gpu/`` showing it
is not slower, or with a FLOP count that falls at least 4x; otherwise the change lands opt-in. Triton's interpreter
proves a kernel exact, not fast.

Devices: CUDA tensors run the compiled kernels; CPU tensors the same source in Triton's interpreter (slow, for
tests on machines without a GPU; no ``TRITON_INTERPRET`` needed).
"""
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

try:  # triton ships with torch's CUDA builds; without it only the reference runs
    from ._longconv_kernels import CONV_KERNELS, TABLE_GRAD_KERNELS
except ImportError:
    CONV_KERNELS = TABLE_GRAD_KERNELS = {}

__all__ = ['bidirectional_long_conv', 'bidirectional_gelu_long_conv', 'causal_toeplitz', 'lag_block_table',
           'has_triton', 'toeplitz_conv_macs_per_token']

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def has_triton(device: torch.device) -> bool:
    """Whether :func:`bidirectional_long_conv` can run on ``device`` (CUDA with triton, or the CPU through
    Triton's interpreter)."""
    return torch.device(device).type in CONV_KERNELS


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def toeplitz_conv_macs_per_token(length: int, block_l: int = 128) -> float:
    """Multiply-accumulates per token and channel of one direction of the blocked Toeplitz kernel: the
    ``n (n + 1) / 2`` tiles of ``block_l^2`` taps on and below the block diagonal, ``n = ceil(L / block_l)``, over
    ``L`` tokens (about ``(L + block_l) / 2``: it grows with ``L``)."""
    n_blocks = _cdiv(length, block_l)
    return n_blocks * (n_blocks + 1) / 2 * block_l * block_l / length


def lag_block_table(kernels: torch.Tensor, block_l: int) -> torch.Tensor:
    """The distinct ``block_l x block_l`` tiles of both directions' Toeplitz matrices, as the forward pass
    multiplies them: ``table[0, m, r, s] = K_f[m * block_l + r - s]`` (the causal tile at block row ``i``, column
    ``i - m``), ``table[1, m, r, s] = K_b[m * block_l + s - r]`` (anti-causal, column ``i + m``); taps at lags outside
    ``0..L-1`` are zero. Differentiable (one gather). Shapes: kernels (2, L) -> (2, ceil(L / block_l), block_l,
    block_l), same dtype.
    """
    length = kernels.shape[-1]
    n_blocks = _cdiv(length, block_l)
    padded = F.pad(kernels, (block_l - 1, n_blocks * block_l - length))  # index p holds lag p - (block_l - 1)
    windows = padded.unfold(-1, 2 * block_l - 1, block_l)  # (2, n_blocks, 2 block_l - 1): lags m bl - bl + 1 ..
    pos = torch.arange(block_l, device=kernels.device)
    tiles = windows[..., pos[:, None] - pos[None, :] + block_l - 1]  # (2, n_blocks, bl, bl): K[m bl + r - s]
    return torch.stack([tiles[0], tiles[1].transpose(-1, -2)])


def causal_toeplitz(k: torch.Tensor, anticausal: bool = False) -> torch.Tensor:
    """The (L, L) matrix of the causal convolution with kernel ``k`` (L,): ``T[i, j] = k[i - j]`` for ``j <= i``,
    else 0, so ``T @ u`` (sequence on dim -2) is the causal convolution of ``u`` with ``k``; with ``anticausal=True``
    its transpose, ``T[i, j] = k[j - i]`` for ``j >= i``."""
    pos = torch.arange(k.shape[0], device=k.device)
    lag = pos.unsqueeze(1) - pos.unsqueeze(0)  # (L, L): i - j
    if anticausal:
        lag = -lag
    return torch.where(lag >= 0, k[lag.clamp(min=0)], k.new_zeros(()))


def bidirectional_long_conv(u: torch.Tensor, kernels: torch.Tensor, bias: Optional[torch.Tensor] = None,
                            gated: bool = False, block_l: int = 128, block_c: int = 128) -> torch.Tensor:
    """Causal convolution of ``u[:, :, 0]`` with ``kernels[0]`` and anti-causal convolution of ``u[:, :, 1]``
    with ``kernels[1]`` along the sequence, by the Triton blocked Toeplitz GEMM (module docstring);
    optionally plus a per-channel bias and multiplied together (the BiGS gate).

    Args:
        u: (B, L, 2, C) float16 / bfloat16 / float32, any strides; dim 2: the forward (causal) and backward
            (anti-causal) inputs.
        kernels: (2, L) float, ``[K_f, K_b]`` with ``D`` added to lag 0; cast to ``u.dtype`` for the products.
        bias: optional (2, C), added to each direction's output (before the gate).
        gated: return ``(y_f + bias_f) * (y_b + bias_b)`` (B, L, C) instead of ``y`` (B, L, 2, C).
        block_l, block_c: sequence and channel tiles (powers of two >= 16).

    Returns (B, L, 2, C), or (B, L, C) with ``gated``, in ``u.dtype``; differentiable in ``u``, ``kernels``, ``bias``.
    """
    _check_inputs(u, kernels, bias)
    table = _table_for(u.device, kernels, block_l, block_c)
    out = _long_conv(u[:, :, 0], u[:, :, 1], table, bias, None, 'identity', gated, block_c)
    return out if gated else torch.stack(out, 2)


def bidirectional_gelu_long_conv(a_f: torch.Tensor, a_b: torch.Tensor, kernels: torch.Tensor, approximate: str = 'none',
                                 mask: Optional[torch.Tensor] = None, block_l: int = 128,
                                 block_c: int = 128) -> Tuple[torch.Tensor, torch.Tensor]:
    """The BiGS layer's two SSM convolutions with their input GELUs (and padding mask) fused in:
    ``(causal_conv(m * GELU(a_f), K_f), anticausal_conv(m * GELU(a_b), K_b))`` with ``m`` the mask broadcast over
    channels (arXiv 2212.10544 §4: ``u = GELU(h W_u)`` feeds the SSM); the backward pass keeps only ``a_f`` and
    ``a_b`` (module docstring).

    Args:
        a_f, a_b: (B, L, C) pre-activations of the forward / backward inputs, one dtype (float16 / bfloat16 /
            float32), read in place (not copied when their strides agree).
        kernels: (2, L) float, ``[K_f, K_b]`` with ``D`` added to lag 0.
        approximate: ``'none'`` (exact, erf) or ``'tanh'``, as ``F.gelu``.
        mask: optional (B, L) bool, True = real token; the GELU outputs at False positions are zeroed.

    Returns ``(y_f, y_b)``, (B, L, C) each in the input dtype; differentiable in ``a_f``, ``a_b`` and ``kernels``.
    """
    if a_f.dim() != 3 or a_f.shape != a_b.shape or a_f.dtype != a_b.dtype:
        raise ValueError(f'a_f and a_b must be (B, L, C) tensors of one shape and dtype, got {a_f.dtype} '
                         f'{tuple(a_f.shape)} and {a_b.dtype} {tuple(a_b.shape)}')
    if approximate not in ('none', 'tanh'):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    if mask is not None and (mask.shape != a_f.shape[:2] or mask.dtype != torch.bool):
        raise ValueError(f'mask must be a bool (B, L) = {tuple(a_f.shape[:2])} tensor, got {mask.dtype} '
                         f'{tuple(mask.shape)}')
    _check_inputs(a_f.unsqueeze(2).expand(-1, -1, 2, -1), kernels, None)
    table = _table_for(a_f.device, kernels, block_l, block_c)
    if mask is not None:
        mask = mask.to(device=a_f.device, dtype=torch.int8).contiguous()
    return _long_conv(a_f, a_b, table, None, mask, approximate, False, block_c)


_ACT_CODES = {'identity': 0, 'none': 1, 'tanh': 2}  # the conv kernel's ACT constexpr (the adjoint's epilogue)


def _table_for(device, kernels, block_l, block_c) -> torch.Tensor:
    for name, value in (('block_l', block_l), ('block_c', block_c)):
        if value < 16 or value & (value - 1):
            raise ValueError(f'{name} must be a power of two >= 16 (a tl.dot tile), got {value}')
    if not has_triton(device):
        raise RuntimeError(f'bidirectional_long_conv needs triton on a CUDA device (or its interpreter on the '
                           f'CPU); not available for a {device.type} tensor here')
    return lag_block_table(kernels.float(), block_l)


def _check_inputs(u, kernels, bias, dtypes=SUPPORTED_DTYPES) -> None:
    if u.dim() != 4 or u.shape[2] != 2:
        raise ValueError(f'u must be (B, L, 2, C) (dim 2: forward / backward inputs), got {tuple(u.shape)}')
    if u.dtype not in dtypes:
        raise ValueError(f'u must be one of {[str(d) for d in dtypes]}, got {u.dtype}')
    if kernels.shape != (2, u.shape[1]) or not kernels.is_floating_point():
        raise ValueError(f'kernels must be a float (2, L) = (2, {u.shape[1]}) tensor, got {kernels.dtype} '
                         f'{tuple(kernels.shape)}')
    if bias is not None and (bias.shape != (2, u.shape[3]) or not bias.is_floating_point()):
        raise ValueError(f'bias must be a float (2, C) = (2, {u.shape[3]}) tensor, got {bias.dtype} '
                         f'{tuple(bias.shape)}')
    devices = {t.device for t in (u, kernels, bias) if t is not None}
    if len(devices) > 1:
        raise ValueError(f'u, kernels and bias must be on one device, got {sorted(map(str, devices))}')


def _shared_strides(a: torch.Tensor, b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The two directions' tensors with one set of strides (the kernels take one): as they are when they agree
    (two projections' outputs, two halves of one tensor), else contiguous copies."""
    if a.stride() == b.stride():
        return a, b
    return a.contiguous(), b.contiguous()


def _long_conv(u_f, u_b, table, bias, mask, act, gated, block_c):
    """:func:`_long_conv_op` on the pair ``u_f``, ``u_b`` given one set of strides (so that the backward pass keeps
    the caller's tensors when theirs agree), keeping the gate's factors only when a gradient will be asked for:
    ``(y_f, y_b)``, or the product when ``gated``."""
    u_f, u_b = _shared_strides(u_f, u_b)
    save_factors = gated and torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (u_f, u_b, table, bias))
    out = _long_conv_op(u_f, u_b, table, bias, mask, act, gated, save_factors, block_c)
    return out[0] if gated else tuple(out)


# The convolution as a pair of custom ops: opaque to torch.compile (dynamo cannot trace a Triton launch in the
# interpreter, and AOTAutograd's partitioner, seeing one extern call, keeps for the backward pass exactly what the
# registered autograd saves: the inputs, the lag table, the mask and, when gated, the factors). Ops return no None:
# the forward returns [y_f, y_b], or [product] (+ [factors] when the gate's backward needs them); the backward
# returns the gradients its flags ask for, in input order.

@torch.library.custom_op('mlp_vision::bidirectional_long_conv', mutates_args=())
def _long_conv_op(u_f: torch.Tensor, u_b: torch.Tensor, table: torch.Tensor, bias: Optional[torch.Tensor],
                  mask: Optional[torch.Tensor], act: str, gated: bool, save_factors: bool,
                  block_c: int) -> List[torch.Tensor]:
    """``u_f``, ``u_b`` (B, L, C) (the two directions' inputs, pre-activations when ``act`` is a GELU),
    ``table`` (2, n_blocks, bl, bl) float32 (:func:`lag_block_table`), ``bias`` (2, C) or None, ``mask`` (B, L)
    int8 or None -> ``[y_f, y_b]`` (B, L, C) each, or ``[y_f * y_b]`` (B, L, C) when ``gated``, followed by the
    factors ``y + bias`` (B, L, 2, C) when ``save_factors``. The kernel convolves ``mask * act(u)``
    (:func:`_activated`, a transient tensor unless ``act`` is ``'identity'`` without a mask)."""
    out, factors = _launch_conv(_activated(u_f, u_b, mask, act), table.to(u_f.dtype), bias, None, None, 'identity',
                                gated, adjoint=False, save_factors=save_factors, block_c=block_c)
    return _as_list(out, factors)


@_long_conv_op.register_fake
def _long_conv_fake(u_f, u_b, table, bias, mask, act, gated, save_factors, block_c):
    return _as_list(*_new_conv_outputs(u_f, gated, save_factors))


def _long_conv_setup_context(ctx, inputs, output) -> None:
    """Saved for the backward pass: ``u_f``, ``u_b`` (the caller's tensors, not copies: on the GELU route the
    pre-activations, never ``act(u)``), the table, the mask and, when gated, both factors ``y + bias``."""
    u_f, u_b, table, bias, mask, act, gated, save_factors, block_c = inputs
    ctx.save_for_backward(u_f, u_b, table, mask, output[1] if save_factors else None)
    ctx.act, ctx.gated, ctx.block_c = act, gated, block_c
    ctx.bias_dtype = None if bias is None else bias.dtype


def _long_conv_backward(ctx, grads):
    """The forward op's registered backward: the gate's product rule and the bias gradient in PyTorch (traceable),
    the two Triton GEMMs in :func:`_long_conv_backward_op` (opaque also when AOTAutograd traces this function)."""
    u_f, u_b, table, mask, factors = ctx.saved_tensors
    if ctx.gated:  # d(f_f * f_b): grad_f_f = grad * f_b, grad_f_b = grad * f_f (float32)
        grad_out = grads[0].float()
        grad_y = (grad_out * factors[:, :, 1].float(), grad_out * factors[:, :, 0].float())
    else:  # an output that took no part in the loss has no gradient
        grad_y = tuple(torch.zeros_like(u) if g is None else g for g, u in zip(grads, (u_f, u_b)))
    grad_bias = None
    if ctx.needs_input_grad[3]:
        grad_bias = torch.stack([g.float().sum((0, 1)) for g in grad_y]).to(ctx.bias_dtype)
    input_grads, table_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1], ctx.needs_input_grad[2]
    computed = iter(_long_conv_backward_op(*(g.to(u_f.dtype) for g in grad_y), u_f, u_b, table, mask, ctx.act,
                                           ctx.block_c, input_grads, table_grad))
    grad_u_f, grad_u_b = (next(computed), next(computed)) if input_grads else (None, None)
    grad_table = next(computed) if table_grad else None
    return grad_u_f, grad_u_b, grad_table, grad_bias, None, None, None, None, None


_long_conv_op.register_autograd(_long_conv_backward, setup_context=_long_conv_setup_context)


@torch.library.custom_op('mlp_vision::bidirectional_long_conv_backward', mutates_args=())
def _long_conv_backward_op(grad_f: torch.Tensor, grad_b: torch.Tensor, u_f: torch.Tensor, u_b: torch.Tensor,
                           table: torch.Tensor, mask: Optional[torch.Tensor], act: str, block_c: int,
                           input_grads: bool, table_grad: bool) -> List[torch.Tensor]:
    """The Triton GEMMs of :func:`_long_conv_op`'s backward pass: the gradients ``grad_f``, ``grad_b`` (B, L, C) of
    the two directions' outputs (before the gate), in ``u_f``'s dtype -> ``[grad_u_f, grad_u_b]`` (B, L, C) when
    ``input_grads`` (``T^T G``: adjoint tiles, causality flipped, times ``mask * act'(u)`` in the kernel's
    epilogue), then the float32 table's gradient (2, n_blocks, bl, bl) when ``table_grad`` (from ``mask * act(u)``,
    recomputed here as the forward op computed it)."""
    grad_y, u = _shared_strides(grad_f, grad_b), _shared_strides(u_f, u_b)
    grads = []
    if input_grads:
        grads += _launch_conv(grad_y, table.transpose(-1, -2).to(u_f.dtype), None, mask, u, act, gated=False,
                              adjoint=True, save_factors=False, block_c=block_c)[0]
    if table_grad:
        grads.append(_launch_table_grad(grad_y, _activated(*u, mask, act), table.shape[1], table.shape[-1], block_c))
    return grads


@_long_conv_backward_op.register_fake
def _long_conv_backward_fake(grad_f, grad_b, u_f, u_b, table, mask, act, block_c, input_grads, table_grad):
    grads = list(_new_conv_outputs(grad_f, gated=False, save_factors=False)[0]) if input_grads else []
    return grads + ([table.new_empty(table.shape, dtype=torch.float32)] if table_grad else [])


def _activated(u_f, u_b, mask, act) -> Tuple[torch.Tensor, torch.Tensor]:
    """``mask * act(u)`` of both directions, elementwise (``F.gelu``: float32, rounded to the input dtype), zero
    where the (B, L) int8 ``mask`` is 0; ``u_f``, ``u_b`` themselves when ``act`` is ``'identity'`` and there is no
    mask. Returned with one set of strides."""
    if act == 'identity' and mask is None:
        return _shared_strides(u_f, u_b)
    drop = None if mask is None else mask[:, :, None] == 0
    out = []
    for u in (u_f, u_b):
        if act != 'identity':
            u = F.gelu(u, approximate=act)
            if drop is not None:
                u.masked_fill_(drop, 0)  # in place: the GELU's output is this function's own tensor
        elif drop is not None:
            u = u.masked_fill(drop, 0)
        out.append(u)
    return _shared_strides(*out)


def _as_list(out, factors) -> List[torch.Tensor]:
    """The forward op's outputs as its schema's one list (no None)."""
    return ([out] if isinstance(out, torch.Tensor) else list(out)) + ([] if factors is None else [factors])


def _new_conv_outputs(u_f, gated, save_factors):
    """The empty outputs of :func:`_launch_conv` (also the ops' fake outputs, so shapes and strides agree): one
    (B, L, C) tensor when ``gated``, else a pair, contiguous, in ``u_f``'s dtype; and the (B, L, 2, C) factors
    when ``save_factors``, else None."""
    batch, length, channels = u_f.shape
    out = u_f.new_empty(u_f.shape) if gated else (u_f.new_empty(u_f.shape), u_f.new_empty(u_f.shape))
    return out, u_f.new_empty((batch, length, 2, channels)) if save_factors else None


def _launch_conv(u, table, bias, mask, pre, act, gated, adjoint, save_factors, block_c):
    """Run the tile-product kernel on the pair ``u`` (two (B, L, C) tensors of shared strides, used as they are):
    ``(out, factors)`` with ``out`` a pair of (B, L, C) tensors, or one when ``gated``; ``factors`` (B, L, 2, C)
    holds ``y + bias`` of both directions when ``save_factors``, else None. ``mask``, ``pre`` and ``act``: the
    adjoint's epilogue, ``* mask * act'(pre)`` (the forward passes None, None, ``'identity'``)."""
    u_f, u_b = u
    batch, length, channels = u_f.shape
    n_blocks, block_l = table.shape[1], table.shape[-1]
    out, factors = _new_conv_outputs(u_f, gated, save_factors)
    out_f, out_b = (out, out) if gated else out  # gated: both directions' stores go to the one product
    pre_f, pre_b = (u_f, u_b) if pre is None else pre
    grid = (n_blocks, _cdiv(channels, block_c), batch if gated else 2 * batch)
    CONV_KERNELS[u_f.device.type][grid](
        u_f, u_b, table.contiguous(), u_f if bias is None else bias.contiguous(),
        u_f if mask is None else mask.contiguous(),
        pre_f, pre_b, out_f, out_b, out_f if factors is None else factors,
        length, channels, n_blocks,
        *u_f.stride(), *pre_f.stride(), *out_f.stride(),
        ADJOINT=adjoint, GATED=gated, NUM_DIRECTIONS=2 if gated else 1, HAS_BIAS=bias is not None,
        SAVE_FACTORS=save_factors, ACT=_ACT_CODES[act], HAS_MASK=mask is not None,
        UPCAST_DOT=u_f.device.type == 'cpu', DOT_PRECISION=_dot_precision(u_f.dtype),
        BLOCK_L=block_l, BLOCK_C=block_c, **_launch_options(u_f, block_l, block_c),
    )
    return out, factors


def _launch_table_grad(grad_y, u, n_blocks, block_l, block_c) -> torch.Tensor:
    """Gradient of the float32 table: (2, n_blocks, bl, bl), summed over deterministic partial sums; ``grad_y``
    and ``u`` are pairs of (B, L, C) tensors of shared strides (``u`` what the forward kernel convolved: after the
    GELU and the mask)."""
    batch, length, channels = u[0].shape
    n_cblocks = _cdiv(channels, block_c)
    n_pairs = batch * n_cblocks
    # enough programs to fill the GPU (~4 per SM) without an oversized partial-sum buffer
    target = 4 * (torch.cuda.get_device_properties(u[0].device).multi_processor_count if u[0].is_cuda else 1)
    n_split = max(1, min(n_pairs, -(-target // (2 * n_blocks))))
    partial = torch.empty((n_split, 2, n_blocks, block_l, block_l), device=u[0].device, dtype=torch.float32)
    TABLE_GRAD_KERNELS[u[0].device.type][(n_blocks, 2, n_split)](
        *grad_y, *u, partial,
        length, channels, n_blocks, n_pairs, n_cblocks, n_split,
        *grad_y[0].stride(), *u[0].stride(),
        UPCAST_DOT=u[0].device.type == 'cpu', DOT_PRECISION=_dot_precision(u[0].dtype),
        BLOCK_L=block_l, BLOCK_C=block_c, **_launch_options(u[0], block_l, block_c),
    )
    return partial.sum(0)


def _dot_precision(dtype: torch.dtype) -> str:
    return 'ieee' if dtype == torch.float32 else 'tf32'  # half-precision tiles: the option is ignored


def _launch_options(u: torch.Tensor, block_l: int, block_c: int) -> dict:
    """Warps and software-pipeline depth: up to 3 stages of the two operand tiles within ~160 KiB of shared
    memory (the H100 has 228 KiB per SM; float32 128 x 128 tiles take 128 KiB a stage)."""
    if u.device.type == 'cpu':
        return {}
    stage_bytes = (block_l * block_l + block_l * block_c) * u.element_size()
    return {'num_warps': 8 if block_l * block_c >= 128 * 128 else 4,
            'num_stages': max(1, min(3, (160 * 1024) // stage_bytes))}
