""" Straightforward SSM convolutions, the references the BiGS layer's fused routes are tested against.

``fft_causal_conv`` is one direction's convolution by real FFTs; ``s4d_conv`` one :class:`S4DLayer`'s SSM,
``causal_conv(u, K) + D * u`` (BiGS, arXiv 2212.10544, §4), run on its own. The package's layer convolves both
directions in one pass (``BidirectionalGatedSSM._bidirectional_ssm``) and never calls these.
"""
import torch

from mlp_vision.layers.ssm import S4DLayer, _autocast_off, _compute_dtype, _conv_with_spectrum, fast_fft_len

__all__ = ['fft_causal_conv', 's4d_conv']


def fft_causal_conv(u: torch.Tensor, k: torch.Tensor, anticausal: bool = False) -> torch.Tensor:
    """Causal convolution along the sequence axis: ``y[t] = sum_{j <= t} k[t - j] u[j]``.

    With ``anticausal=True`` the mirror image ``y[t] = sum_{j >= t} k[j - t] u[j]``, which equals
    ``flip(causal_conv(flip(u), k))`` without the two flips (a correlation: the kernel's spectrum is conjugated).

    Computed with real FFTs of length ``fast_fft_len(2L)`` (no circular wrap-around: every lag that could wrap
    lands on the kernel's zero padding), in float32 (float64 when ``u`` or ``k`` is float64) with autocast
    disabled, and cast back to ``u.dtype``.

    Shapes:
        u: (..., L, C), sequence on dim -2 (no transpose needed for the (B, L, C) activations of a layer).
        k: (L,) one kernel shared by all channels, or (L, C) one kernel per channel.
        output: same shape and dtype as ``u``.
    """
    length = u.shape[-2]
    if k.shape[0] != length:
        raise ValueError(f'kernel length {k.shape[0]} != sequence length {length}')
    n_fft = fast_fft_len(2 * length)
    dtype = _compute_dtype(u, k)
    with _autocast_off(u.device):
        k = k.to(dtype)
        if k.dim() == 1:
            k = k.unsqueeze(-1)  # (L, 1): broadcast over channels
        k_f = torch.fft.rfft(k, n=n_fft, dim=0)
        y = _conv_with_spectrum(u.to(dtype), k_f.conj() if anticausal else k_f, n_fft, dim=-2)
    return y.to(u.dtype)


def s4d_conv(ssm: S4DLayer, u: torch.Tensor, anticausal: bool = False) -> torch.Tensor:
    """``causal_conv(u, K) + D * u`` for one :class:`S4DLayer`; ``anticausal=True`` runs it from the last position to
    the first (``flip(ssm(flip(u)))`` without the flips). u (B, L, C) -> (B, L, C), computed in float32."""
    k = ssm.kernel(u.shape[-2])  # (L,) float32
    dtype = _compute_dtype(u, k)
    y = fft_causal_conv(u.to(dtype), k, anticausal=anticausal)
    with _autocast_off(u.device):
        y = y + ssm.D.to(dtype) * u.to(dtype)
    return y.to(u.dtype)
