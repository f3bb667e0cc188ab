""" Triton kernels of :mod:`mlp_vision.layers.longconv_triton` (kept apart so that module imports without triton).

The kernels are plain functions, compiled by ``triton.jit`` for CUDA tensors and run by Triton's interpreter for
CPU tensors, from this one source. So they call no other jit function (``tl.zeros`` and ``tl.sigmoid`` are ones:
use ``tl.full`` and ``1 / (1 + exp(-x))``), since a helper would be bound to one of the two modes; hence the GELU
derivative written out in the adjoint's epilogue. Each direction's tensors come as two pointers with shared strides
(``*0_ptr`` forward / causal, ``*1_ptr`` backward / anti-causal): separate tensors or two halves of one, never
stacked.

Input tiles are plain loads: no transcendental (erf, exp, tanh) and no mask load runs inside a loop over GEMM tiles.
An input tile is read once per output block row (or table tile) that needs it, so an activation applied there would
be recomputed that many times per element, and the special-function unit would starve the tensor cores. The input
GELU is applied before the launch (:mod:`~mlp_vision.layers.longconv_triton`); only the adjoint's epilogue, once per
output element after the loop, multiplies by ``mask * GELU'(pre)`` (``ACT``: 0 none, 1 exact GELU, 2 tanh GELU;
``HAS_MASK``: (B, L) int8 keep-mask).
"""
import triton
import triton.language as tl

try:  # the interpreter's entry point (internal to triton): without it, CPU tensors are not supported
    from triton.runtime.interpreter import InterpretedFunction
except ImportError:
    InterpretedFunction = None

__all__ = ['CONV_KERNELS', 'TABLE_GRAD_KERNELS']


def _toeplitz_conv_kernel(
        u0_ptr, u1_ptr, table_ptr, bias_ptr, mask_ptr, pre0_ptr, pre1_ptr, out0_ptr, out1_ptr, factor_ptr,
        L, C, n_blocks,
        stride_ub, stride_ul, stride_uc,
        stride_pb, stride_pl, stride_pc,
        stride_ob, stride_ol, stride_oc,
        ADJOINT: tl.constexpr, GATED: tl.constexpr, NUM_DIRECTIONS: tl.constexpr, HAS_BIAS: tl.constexpr,
        SAVE_FACTORS: tl.constexpr, ACT: tl.constexpr, HAS_MASK: tl.constexpr,
        UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
        BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """One (BLOCK_L positions x BLOCK_C channels) output tile: ``acc = sum_j table[d, |i - j|] @ u[j]`` over
    the input block rows ``j <= i`` (causal) or ``j >= i`` (anti-causal). Direction 1 is anti-causal, and the
    adjoint (``ADJOINT``, table tiles transposed by the caller) flips both. Grid: (block rows, channel blocks,
    batch x directions), or batch alone when ``GATED`` (both directions of the tile, then their product).

    The input tiles are used as loaded. ``ACT`` and ``HAS_MASK`` are the adjoint's (the forward passes 0 and
    False): after the loop, the output tile is multiplied by ``mask * act'(pre)`` (epilogue), ``pre`` being the
    forward pass's pre-activation, so ``grad_u`` is never written before the GELU's derivative."""
    pid_l = tl.program_id(0)
    pid_c = tl.program_id(1)
    pid_z = tl.program_id(2)
    if GATED:
        batch = pid_z
    else:
        batch = pid_z // 2
    offs_r = tl.arange(0, BLOCK_L)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = offs_c < C
    forward_factor = tl.full((BLOCK_L, BLOCK_C), 0.0, tl.float32)
    for step in tl.static_range(NUM_DIRECTIONS):
        if GATED:
            direction = step
        else:
            direction = pid_z % 2
        if direction == 0:
            u_dir, pre_dir, out_dir = u0_ptr, pre0_ptr, out0_ptr
        else:
            u_dir, pre_dir, out_dir = u1_ptr, pre1_ptr, out1_ptr
        anticausal = (direction == 1) != ADJOINT
        if GATED:
            tile = pid_l  # both directions of one tile: n_blocks + 1 tile products for every program
        else:
            tile = tl.where(anticausal, pid_l, n_blocks - 1 - pid_l)  # the longest rows start first
        lo = tl.where(anticausal, tile, 0)
        hi = tl.where(anticausal, n_blocks, tile + 1)
        a_ptrs = table_ptr + direction * n_blocks * BLOCK_L * BLOCK_L + offs_r[:, None] * BLOCK_L + offs_r[None, :]
        x_ptrs = u_dir + batch.to(tl.int64) * stride_ub + offs_c[None, :] * stride_uc
        acc = tl.full((BLOCK_L, BLOCK_C), 0.0, tl.float32)
        for j in range(lo, hi):
            lag_block = tl.where(anticausal, j - tile, tile - j)
            a = tl.load(a_ptrs + lag_block * BLOCK_L * BLOCK_L)
            src = j * BLOCK_L + offs_r
            x = tl.load(x_ptrs + src[:, None] * stride_ul, mask=(src < L)[:, None] & c_mask[None, :], other=0.0)
            if UPCAST_DOT:  # the interpreter multiplies bf16 as raw uint16; bf16 x bf16 products are exact in fp32
                acc = tl.dot(a.to(tl.float32), x.to(tl.float32), acc)
            else:
                acc = tl.dot(a, x, acc, input_precision=DOT_PRECISION)
        rows = tile * BLOCK_L + offs_r
        out_mask = (rows < L)[:, None] & c_mask[None, :]
        if ADJOINT:  # epilogue: the chain rule through u = mask * act(pre)
            if ACT != 0:
                p = tl.load(pre_dir + batch.to(tl.int64) * stride_pb + rows[:, None] * stride_pl
                            + offs_c[None, :] * stride_pc, mask=out_mask, other=0.0).to(tl.float32)
                if ACT == 1:  # Phi(p) + p phi(p)
                    d_act = (0.5 + 0.5 * tl.erf(p * 0.7071067811865476)) + p * tl.exp(-0.5 * p * p) * 0.3989422804014327
                else:  # s = sigmoid(2 z): s + 2 p s (1 - s) z'
                    z = 0.7978845608028654 * (p + 0.044715 * p * p * p)
                    s = 1.0 / (1.0 + tl.exp(-2.0 * z))
                    d_act = s + 2.0 * p * s * (1.0 - s) * 0.7978845608028654 * (1.0 + 0.134145 * p * p)
                acc = acc * d_act
            if HAS_MASK:
                keep = tl.load(mask_ptr + batch.to(tl.int64) * L + rows, mask=rows < L, other=0)
                acc = tl.where((keep != 0)[:, None], acc, 0.0)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + direction * C + offs_c, mask=c_mask, other=0.0).to(tl.float32)[None, :]
        if GATED:
            if SAVE_FACTORS:  # contiguous (B, L, 2, C)
                f_ptrs = factor_ptr + ((batch.to(tl.int64) * L + rows[:, None]) * 2 + direction) * C + offs_c[None, :]
                tl.store(f_ptrs, acc.to(factor_ptr.dtype.element_ty), mask=out_mask)
            if step == 0:
                forward_factor = acc
            else:
                acc = forward_factor * acc
        if step == NUM_DIRECTIONS - 1:
            o_ptrs = out_dir + batch.to(tl.int64) * stride_ob + rows[:, None] * stride_ol + offs_c[None, :] * stride_oc
            tl.store(o_ptrs, acc.to(out_dir.dtype.element_ty), mask=out_mask)


def _table_grad_kernel(
        g0_ptr, g1_ptr, u0_ptr, u1_ptr, partial_ptr,
        L, C, n_blocks, n_pairs, n_cblocks, n_split,
        stride_gb, stride_gl, stride_gc,
        stride_ub, stride_ul, stride_uc,
        UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
        BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Gradient of table tile ``m`` of direction ``d`` (forward orientation), one share of the sum:
    ``sum_{(b, c-block) = split, split + n_split, ...} sum_i G[b, i, d, c] U[b, j, d, c]^T`` with ``j = i - m``
    (causal) or ``i + m`` (anti-causal), into ``partial[split, d, m]``; ``U`` is the forward pass's input as the
    conv kernel read it (activated and masked already). Grid: (n_blocks, 2, n_split)."""
    lag_block = tl.program_id(0)
    direction = tl.program_id(1)
    split = tl.program_id(2)
    if direction == 0:
        g_dir, u_dir = g0_ptr, u0_ptr
    else:
        g_dir, u_dir = g1_ptr, u1_ptr
    anticausal = direction == 1
    offs_r = tl.arange(0, BLOCK_L)
    offs_k = tl.arange(0, BLOCK_C)
    i_lo = tl.where(anticausal, 0, lag_block)
    i_hi = tl.where(anticausal, n_blocks - lag_block, n_blocks)
    acc = tl.full((BLOCK_L, BLOCK_L), 0.0, tl.float32)
    for pair in range(split, n_pairs, n_split):
        batch = pair // n_cblocks
        offs_c = (pair % n_cblocks) * BLOCK_C + offs_k
        c_mask = offs_c < C
        g_ptrs = g_dir + batch.to(tl.int64) * stride_gb + offs_c[None, :] * stride_gc
        x_ptrs = u_dir + batch.to(tl.int64) * stride_ub + offs_c[:, None] * stride_uc
        for i in range(i_lo, i_hi):
            dst = i * BLOCK_L + offs_r
            src = tl.where(anticausal, i + lag_block, i - lag_block) * BLOCK_L + offs_r
            g = tl.load(g_ptrs + dst[:, None] * stride_gl, mask=(dst < L)[:, None] & c_mask[None, :], other=0.0)
            x = tl.load(x_ptrs + src[None, :] * stride_ul, mask=c_mask[:, None] & (src < L)[None, :], other=0.0)
            if UPCAST_DOT:
                acc = tl.dot(g.to(tl.float32), x.to(tl.float32), acc)
            else:
                acc = tl.dot(g, x, acc, input_precision=DOT_PRECISION)
    p_ptrs = (partial_ptr + ((split * 2 + direction) * n_blocks + lag_block) * BLOCK_L * BLOCK_L
              + offs_r[:, None] * BLOCK_L + offs_r[None, :])
    tl.store(p_ptrs, acc)


# by device type: compiled for CUDA, interpreted for CPU tensors
CONV_KERNELS = {'cuda': triton.jit(_toeplitz_conv_kernel)}
TABLE_GRAD_KERNELS = {'cuda': triton.jit(_table_grad_kernel)}
if InterpretedFunction is not None:
    CONV_KERNELS['cpu'] = InterpretedFunction(_toeplitz_conv_kernel)
    TABLE_GRAD_KERNELS['cpu'] = InterpretedFunction(_table_grad_kernel)
