""" The bidirectional S4D convolution of BiGS in linear time: chunked state passing.

BiGS (arXiv 2212.10544, §4) convolves each direction with the kernel of a diagonal SSM (S4D, arXiv 2206.11893)
shared by all channels, ``K[l] = Re(sum_n w_n lam_n^l) + D [l = 0]`` with ``lam_n = exp(dt A_n)`` and
``w_n = C_n (lam_n - 1) / A_n`` (:class:`~mlp_vision.layers.ssm.S4DKernel`). A kernel that is a sum of N geometric
sequences lets the convolution be cut into chunks of T tokens joined by the N states, as the block decomposition of
Mamba-2's SSD algorithm does (arXiv 2405.21060). For the causal direction, position ``t = kT + r`` of chunk ``k``::

    y[kT + r] = sum_{s <= r} K[r - s] u[kT + s]                  within the chunk: a T x T Toeplitz GEMM
              + Re(sum_n w_n lam_n^(r + 1) h_n[k])               from every earlier chunk, through the states
    S_n[k] = sum_s lam_n^(T - 1 - s) u[kT + s]                   the chunk's share of the state at its end
    h_n[k] = sum_{k' < k} Lam_n^(k - 1 - k') S_n[k'],  Lam_n = lam_n^T   (exclusive scan over chunks)

The Toeplitz block and the N complex in-weights are one (T + 2N, T) matrix applied to every chunk, and the
out-weights one (T, 2N) matrix: per token and channel ``T + 4N`` MACs of batched GEMMs, plus the scan over
``L / T`` chunk states, whatever the length ``L``. The anti-causal direction is the same computation mirrored
(positions reversed within chunks, the scan run from the last chunk). Complex numbers are carried as (real,
imaginary) pairs in real tensors; every power of ``lam`` is ``exp(p log lam)`` with ``Re(log lam) = dt A_re < 0``
and ``p >= 0``, so no factor exceeds 1 in magnitude (nothing overflows for any ``A_re`` a checkpoint holds), and
the phases ``p dt A_im`` are formed in float64 before the cast.

Scan over chunks: recursive, ``group`` chunks at a time (a small (G + 1) x G matrix per state applied to every
group of chunk states gives the states within the group and the group's total; the totals are scanned the same way
with the decay ``Lam^G``), so the work stays linear and the depth is ``log_G(L / T)`` levels of GEMMs.

Precision: the GEMMs with the input multiply in its dtype (bf16 / fp16 tiles, float32 accumulation inside the
GEMM), float32 inputs in float32, float64 in float64; the chunk states are scanned in float32 (float64 for float64
input). The result is returned in the input dtype.
"""
import math
from typing import Tuple

import torch
import torch.nn.functional as F

from .longconv_triton import causal_toeplitz

__all__ = ['CHUNK_LEN', 'SCAN_GROUP', 'bidirectional_chunked_conv', 'chunked_conv_macs_per_token']

CHUNK_LEN = 128  # T: tokens per chunk (a T x T Toeplitz GEMM each; T + 4N MACs per token and channel)
SCAN_GROUP = 16  # G: chunk states combined per GEMM of the scan (G + 1 MACs per state element and level)


def chunked_conv_macs_per_token(length: int, num_states: int, chunk_len: int = CHUNK_LEN,
                                group: int = SCAN_GROUP) -> float:
    """Multiply-accumulates per token and channel of one direction of :func:`bidirectional_chunked_conv` at
    sequence length ``length``, as it runs: the (T, T) Toeplitz and (2N, T) state GEMMs and the (T, 2N) out-GEMM
    on the zero-padded chunk grid, and the scan's GEMMs (4 real MACs per complex product). Bounded in ``length``:
    about ``T + 4N`` plus a few percent for the scan."""
    chunk_len = min(chunk_len, length)
    g, n_groups = _grouping(-(-length // chunk_len), group)
    padded_len = g * n_groups * chunk_len
    if g * n_groups == 1:  # one chunk: the Toeplitz GEMM alone
        return chunk_len * padded_len / length
    macs = padded_len * (chunk_len + 4 * num_states)
    while True:
        macs += 4 * num_states * (g + 1) * g * n_groups  # the complex (g + 1) x g matrix per state and group
        if n_groups == 1:
            return macs / length
        macs += 4 * num_states * (g + 1) * n_groups  # adding the entering states (a K = 2 GEMM)
        g, n_groups = _grouping(n_groups, group)


def _powers(log_decay: torch.Tensor, exponents: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``lam^p`` for ``lam = exp(log_decay)``: ``log_decay`` (2, N) float64 (real part <= 0, imaginary part),
    ``exponents`` (P,) >= 0 -> (re, im), (N, P) each, float64."""
    p = exponents.to(torch.float64)
    magnitude = torch.exp(log_decay[0, :, None] * p)  # <= 1
    phase = torch.remainder(log_decay[1, :, None] * p, 2 * math.pi)  # reduced in float64: exact enough to cast
    return magnitude * torch.cos(phase), magnitude * torch.sin(phase)


def _chunk_operators(log_decay: torch.Tensor, weight: torch.Tensor, skip: torch.Tensor, chunk_len: int,
                     anticausal: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The per-chunk matrices of one direction, float64: ``toeplitz`` (T, T), the in-chunk block of K (``skip``
    on its diagonal); ``into_state`` (2N, T) = [Re lam^(T-1-s); Im lam^(T-1-s)], the chunk's share of its end
    state; ``w_out`` (T, 2N), columns (n, part), with ``Re(sum_n w_n lam_n^(r+1) h_n) = w_out[r] @ h`` for ``h``
    rows (n, part). Mirrored (positions reversed within the chunk) when ``anticausal``.

    ``log_decay`` (2, N): (dt A_re, dt A_im); ``weight`` (2, N): (Re w, Im w); ``skip`` (1,): D."""
    pos = torch.arange(chunk_len + 1, device=log_decay.device)
    p_re, p_im = _powers(log_decay, pos)  # (N, T + 1): lam^0 .. lam^T
    w_re, w_im = weight[0, :, None], weight[1, :, None]
    c_re = w_re * p_re - w_im * p_im  # w lam^p
    c_im = w_re * p_im + w_im * p_re
    taps = c_re[:, :chunk_len].sum(0) + F.pad(skip, (0, chunk_len - 1))  # K[0 .. T-1], D at lag 0
    toeplitz = causal_toeplitz(taps)
    into_state = torch.cat([p_re[:, :chunk_len].flip(-1), p_im[:, :chunk_len].flip(-1)])  # (2N, T): lam^(T-1-s)
    w_out = torch.stack([c_re[:, 1:], -c_im[:, 1:]], 1).view(-1, chunk_len).T  # c_re h_re - c_im h_im
    if anticausal:  # position r of the mirrored chunk is T - 1 - r
        toeplitz, into_state, w_out = toeplitz.T, into_state.flip(-1), w_out.flip(0)
    return toeplitz, into_state, w_out


def _grouping(n_items: int, group: int) -> Tuple[int, int]:
    """``(g, n_groups)``: the fewest groups of at most ``group`` items, as even as possible (``g * n_groups >=
    n_items``, padding under one item per group)."""
    n_groups = -(-n_items // group)
    return -(-n_items // n_groups), n_groups


def _scan_matrix(log_decay: torch.Tensor, group: int, reverse: bool) -> torch.Tensor:
    """The complex (G + 1) x G matrices of one scan level in real form, (N, 2, G + 1, 2, G) float64: entry
    ``[n, p, i, q, j]`` maps part q (0 real, 1 imaginary) of chunk state j to part p of row i, for ``P[i, j] =
    Lam_n^(i - 1 - j)`` (j < i, else 0): rows 0..G-1 the exclusive scan within a group of G chunk states, row G the
    group's total. Mirrored (``P[G-1-i, G-1-j]``, total row ``Lam^j``) when ``reverse``. ``log_decay`` (2, N)
    float64 = log Lam."""
    idx = torch.arange(group + 1, device=log_decay.device)
    lag = idx[:, None] - 1 - idx[None, :group]  # (G + 1, G)
    p_re, p_im = _powers(log_decay, lag.clamp(min=0).flatten())
    keep = (lag >= 0).flatten().to(p_re.dtype)
    p_re, p_im = (p_re * keep).view(-1, group + 1, group), (p_im * keep).view(-1, group + 1, group)
    if reverse:
        p_re, p_im = (torch.cat([p[:, :group].flip(1, 2), p[:, group:].flip(2)], 1) for p in (p_re, p_im))
    return torch.stack([torch.stack([p_re, -p_im], 2), torch.stack([p_im, p_re], 2)], 1)


def _grouped_scan(states: torch.Tensor, log_decay: torch.Tensor, group: int, reverse: bool) -> torch.Tensor:
    """Exclusive scan of chunk states, per state n in complex arithmetic on (real, imaginary) pairs:
    ``h[k] = sum_{k' < k} Lam^(k-1-k') s[k']`` (``k' > k``, ``Lam^(k'-k-1)`` when ``reverse``).

    ``states`` (2, N, g, B, G, C), contiguous: part (real / imaginary), state, then chunk ``k = gi * g + j`` of
    sequence b at ``[:, :, j, b, gi]``, so that one batched GEMM per part (batch N) applies the group matrices to
    every group. ``log_decay`` (2, N) float64 = log Lam. Returns (N, 2, g + 1, B, G, C) in ``states``' dtype whose
    rows ``[:, :, :g]`` hold ``h`` in the input's chunk order (row g: the groups' totals)."""
    _, n_states, g, batch, n_groups, channels = states.shape
    mats = _scan_matrix(log_decay, g, reverse).to(states.dtype).view(n_states, 2 * (g + 1), 2, g)
    x = states.view(2, n_states, g, -1)
    out = torch.bmm(mats[:, :, 0], x[0]).baddbmm_(mats[:, :, 1], x[1])  # (N, 2 (g + 1), B G C)
    if n_groups == 1:
        return out.view(n_states, 2, g + 1, batch, n_groups, channels)
    # the totals are the next level's chunk states (decay Lam^g); what enters each group comes back
    g2, n_groups2 = _grouping(n_groups, group)
    totals = out.view(n_states, 2, g + 1, batch, n_groups, channels)[:, :, g]
    totals = F.pad(totals, (0, 0, 0, g2 * n_groups2 - n_groups)).transpose(0, 1)  # (2, N, B, G', C)
    totals = totals.reshape(2, n_states, batch, n_groups2, g2, channels).permute(0, 1, 4, 2, 3, 5)
    sub = _grouped_scan(totals.clone(memory_format=torch.contiguous_format), log_decay * g, group, reverse)
    entering = sub[:, :, :g2].permute(0, 1, 3, 4, 2, 5).reshape(n_states, 2, batch, -1, channels)
    entering = entering[:, :, :, :n_groups].reshape(n_states, 2, -1)  # (N, 2, B G C), as the columns of out
    # position j of a group gets Lam^j (Lam^(g-1-j) mirrored) times the state entering the group: one more GEMM
    # (K = 2) into out, rows (part, j), the totals' rows untouched
    exponents = torch.arange(g, device=states.device)
    e_re, e_im = _powers(log_decay, exponents.flip(0) if reverse else exponents)  # (N, g)
    zero = e_re.new_zeros(n_states, 1)
    carry = torch.stack([torch.cat([e_re, zero, e_im, zero], 1),  # times Re h: Re(e h) rows, then Im(e h) rows
                         torch.cat([-e_im, zero, e_re, zero], 1)], 2)  # times Im h
    out.baddbmm_(carry.to(states.dtype), entering)
    return out.view(n_states, 2, g + 1, batch, n_groups, channels)


def _chunked_direction(u: torch.Tensor, log_decay: torch.Tensor, weight: torch.Tensor, skip: torch.Tensor,
                       anticausal: bool, chunk_len: int, group: int) -> torch.Tensor:
    """One direction: ``u`` (B, L, C) -> (B, L, C) in ``u.dtype`` (see the module docstring).

    Layout: chunk ``k = gi * g + j`` of sequence b goes to column block ``(j, b, gi)``, positions within a chunk on
    the rows: (T, g, B, G, C). So the in- and out-GEMMs are each one GEMM over every chunk, and the chunk states come
    out as the scan's batched GEMMs take them (:func:`_grouped_scan`)."""
    batch, length, channels = u.shape
    chunk_len = min(chunk_len, length)
    g, n_groups = _grouping(-(-length // chunk_len), group)
    padded_len = g * n_groups * chunk_len
    n_states = log_decay.shape[-1]
    state_dtype = torch.float64 if u.dtype == torch.float64 else torch.float32
    toeplitz, into_state, w_out = (m.to(u.dtype) for m in _chunk_operators(log_decay, weight, skip, chunk_len,
                                                                           anticausal))
    if padded_len != length:  # zeros after the end change no output of either direction
        u = F.pad(u, (0, 0, 0, padded_len - length))
    if g * n_groups == 1:  # one chunk: nothing enters it
        return torch.matmul(toeplitz, u)
    chunks = u.view(batch, n_groups, g, chunk_len, channels).permute(3, 2, 0, 1, 4).reshape(chunk_len, -1)
    states = torch.mm(into_state, chunks).view(2, n_states, g, batch, n_groups, channels)  # the chunks' shares
    h = _grouped_scan(states.to(state_dtype), log_decay * chunk_len, group, reverse=anticausal)
    h = h.view(2 * n_states, g + 1, -1)[:, :g].reshape(2 * n_states, -1)  # rows (n, part), no copy
    # in-chunk outputs, then what the states bring, accumulated in place
    y = torch.mm(toeplitz, chunks).addmm_(w_out, h.to(u.dtype))  # (T, g B G C)
    y = y.view(chunk_len, g, batch, n_groups, channels).permute(2, 3, 1, 0, 4).reshape(batch, padded_len, channels)
    return y[:, :length]


def bidirectional_chunked_conv(u_f: torch.Tensor, u_b: torch.Tensor, log_decay: torch.Tensor, weight: torch.Tensor,
                               skip: torch.Tensor, chunk_len: int = CHUNK_LEN,
                               group: int = SCAN_GROUP) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(causal_conv(u_f, K_f), anticausal_conv(u_b, K_b))`` of two S4D kernels by chunked state passing (module
    docstring), in time and memory linear in the sequence length; differentiable in every input (plain ops).

    Args:
        u_f, u_b: (B, L, C) the two directions' inputs, one dtype (float16 / bfloat16 / float32 / float64).
        log_decay: (2, 2, N) per direction [real, imaginary] parts of ``log lam = dt A`` (real part < 0).
        weight: (2, 2, N) per direction [real, imaginary] parts of ``w = C (lam - 1) / A``.
        skip: (2, 1) per direction ``D`` (the lag-0 tap added to ``K``).
        chunk_len: tokens per chunk ``T``; group: chunk states per scan GEMM (>= 2).

    Returns ``(y_f, y_b)``, (B, L, C) each in the inputs' dtype.
    """
    if u_f.dim() != 3 or u_f.shape != u_b.shape or u_f.dtype != u_b.dtype:
        raise ValueError(f'u_f and u_b must be (B, L, C) tensors of one shape and dtype, got {u_f.dtype} '
                         f'{tuple(u_f.shape)} and {u_b.dtype} {tuple(u_b.shape)}')
    if chunk_len < 1 or group < 2:
        raise ValueError(f'chunk_len must be >= 1 and group >= 2, got chunk_len={chunk_len}, group={group}')
    log_decay, weight, skip = (t.to(torch.float64) for t in (log_decay, weight, skip))
    return tuple(_chunked_direction(u, log_decay[d], weight[d], skip[d], anticausal=d == 1, chunk_len=chunk_len,
                                    group=group) for d, u in enumerate((u_f, u_b)))
