""" Triton kernels of :mod:`mlp_vision.layers.longconv_triton` (kept apart so that module imports without triton).

The kernels are plain functions, compiled by ``triton.jit`` for CUDA tensors and run by Triton's interpreter
for CPU tensors, both from this one source. So they call no other jit function (``tl.zeros`` included: it is
one, use ``tl.full``): a helper would be bound to one of the two modes.
"""
import triton
import triton.language as tl

try:  # the interpreter's entry point (internal to triton): without it, CPU tensors are not supported
    from triton.runtime.interpreter import InterpretedFunction
except ImportError:
    InterpretedFunction = None

__all__ = ['CONV_KERNELS', 'TABLE_GRAD_KERNELS']


def _toeplitz_conv_kernel(
        u_ptr, table_ptr, bias_ptr, out_ptr, factor_ptr,
        L, C, n_blocks,
        stride_ub, stride_ul, stride_ud, stride_uc,
        stride_ob, stride_ol, stride_od, stride_oc,
        ADJOINT: tl.constexpr, GATED: tl.constexpr, NUM_DIRECTIONS: tl.constexpr, HAS_BIAS: tl.constexpr,
        SAVE_FACTORS: tl.constexpr, UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
        BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """One (BLOCK_L positions x BLOCK_C channels) output tile: ``acc = sum_j table[d, |i - j|] @ u[j]`` over
    the input block rows ``j <= i`` (causal) or ``j >= i`` (anti-causal). Direction 1 is anti-causal, and the
    adjoint (``ADJOINT``, table tiles transposed by the caller) flips both. Grid: (block rows, channel blocks,
    batch x directions), or batch alone when ``GATED`` (both directions of the tile, then their product)."""
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
    u_batch = u_ptr + batch.to(tl.int64) * stride_ub
    forward_factor = tl.full((BLOCK_L, BLOCK_C), 0.0, tl.float32)
    for step in tl.static_range(NUM_DIRECTIONS):
        if GATED:
            direction = step
        else:
            direction = pid_z % 2
        anticausal = (direction == 1) != ADJOINT
        if GATED:
            tile = pid_l  # both directions of one tile: n_blocks + 1 tile products for every program
        else:
            tile = tl.where(anticausal, pid_l, n_blocks - 1 - pid_l)  # the longest rows start first
        lo = tl.where(anticausal, tile, 0)
        hi = tl.where(anticausal, n_blocks, tile + 1)
        a_ptrs = table_ptr + direction * n_blocks * BLOCK_L * BLOCK_L + offs_r[:, None] * BLOCK_L + offs_r[None, :]
        x_ptrs = u_batch + direction * stride_ud + offs_c[None, :] * stride_uc
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
        if HAS_BIAS:
            acc += tl.load(bias_ptr + direction * C + offs_c, mask=c_mask, other=0.0).to(tl.float32)[None, :]
        rows = tile * BLOCK_L + offs_r
        out_mask = (rows < L)[:, None] & c_mask[None, :]
        if GATED:
            if SAVE_FACTORS:  # contiguous (B, L, 2, C)
                f_ptrs = factor_ptr + ((batch.to(tl.int64) * L + rows[:, None]) * 2 + direction) * C + offs_c[None, :]
                tl.store(f_ptrs, acc.to(factor_ptr.dtype.element_ty), mask=out_mask)
            if step == 0:
                forward_factor = acc
            else:
                acc = forward_factor * acc
        if step == NUM_DIRECTIONS - 1:
            o_ptrs = (out_ptr + batch.to(tl.int64) * stride_ob + rows[:, None] * stride_ol
                      + direction * stride_od + offs_c[None, :] * stride_oc)
            tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)


def _table_grad_kernel(
        g_ptr, u_ptr, partial_ptr,
        L, C, n_blocks, n_pairs, n_cblocks, n_split,
        stride_gb, stride_gl, stride_gd, stride_gc,
        stride_ub, stride_ul, stride_ud, stride_uc,
        UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
        BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Gradient of table tile ``m`` of direction ``d`` (forward orientation), one share of the sum:
    ``sum_{(b, c-block) = split, split + n_split, ...} sum_i G[b, i, d, c] U[b, j, d, c]^T`` with ``j = i - m``
    (causal) or ``i + m`` (anti-causal), into ``partial[split, d, m]``. Grid: (n_blocks, 2, n_split)."""
    lag_block = tl.program_id(0)
    direction = tl.program_id(1)
    split = tl.program_id(2)
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
        g_ptrs = g_ptr + batch.to(tl.int64) * stride_gb + direction * stride_gd + offs_c[None, :] * stride_gc
        x_ptrs = u_ptr + batch.to(tl.int64) * stride_ub + direction * stride_ud + offs_c[:, None] * stride_uc
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
