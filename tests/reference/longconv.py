""" The bidirectional long convolution computed directly, the reference the Triton route is tested against
(``tests/test_longconv_triton.py``, ``scripts/gpu/longconv_check.py``). Not part of the installed package. """
from typing import Optional

import torch

from mlp_vision.layers.longconv_triton import SUPPORTED_DTYPES, _check_inputs, causal_toeplitz

__all__ = ['bidirectional_long_conv_reference']


def bidirectional_long_conv_reference(u: torch.Tensor, kernels: torch.Tensor, bias: Optional[torch.Tensor] = None,
                                      gated: bool = False) -> torch.Tensor:
    """The same function as :func:`~mlp_vision.layers.longconv_triton.bidirectional_long_conv`, computed directly:
    dense (L, L) Toeplitz matrices times the input, in float32 (float64 when ``u`` or ``kernels`` is), result in
    ``u.dtype``."""
    _check_inputs(u, kernels, bias, dtypes=SUPPORTED_DTYPES + (torch.float64,))
    dtype = torch.float64 if torch.float64 in (u.dtype, kernels.dtype) else torch.float32
    k = kernels.to(dtype)
    x = u.to(dtype)
    y = torch.stack([causal_toeplitz(k[0]) @ x[:, :, 0], causal_toeplitz(k[1], anticausal=True) @ x[:, :, 1]], 2)
    if bias is not None:
        y = y + bias.to(dtype)
    if gated:
        y = y[:, :, 0] * y[:, :, 1]
    return y.to(u.dtype)
