""" A straightforward BiGS layer, written the obvious way: the speed and correctness baseline for ours.

It follows the gated BiGS layer (Wang et al., arXiv:2212.10544, §4, Fig. 2; S4D kernel: Gu et al.,
arXiv:2206.11893) as the official implementation (github.com/jxiw/BiGS) writes it, operator by operator: the
backward branch really flips the sequence (``torch.flip`` copies) before its input projection and flips the result
back; each of the seven projections is its own ``nn.Linear``; each SSM recomputes its kernel on every call and
runs its own FFT convolution on a (B, C, L) transposed copy of its input, with FFT length 2L. It is not
registered anywhere and is not part of the package: ``benchmark.py`` times
:class:`mlp_vision.layers.BidirectionalGatedSSM` against it and ``tests/test_equivalence.py`` checks that both
compute the same function.

Module and parameter names mirror :class:`~mlp_vision.layers.BidirectionalGatedSSM`, so our state dict loads
into it unchanged (:func:`reference_bigs_layer_from`).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ['ReferenceBiGSLayer', 'reference_bigs_layer_from']


class _RefKernel(nn.Module):
    def __init__(self, num_states: int) -> None:
        super().__init__()
        self.log_step = nn.Parameter(torch.zeros(1))
        self.A_re = nn.Parameter(torch.zeros(num_states))
        self.A_im = nn.Parameter(torch.zeros(num_states))
        self.C = nn.Parameter(torch.zeros(num_states, 2))

    def forward(self, length: int) -> torch.Tensor:
        # in float32 whatever the parameters' dtype (there are no bfloat16 complex kernels)
        dt = torch.exp(self.log_step.float())
        a = torch.clamp(self.A_re.float(), max=-1e-4) + 1j * self.A_im.float()
        c = torch.view_as_complex(self.C.float().contiguous()) * (torch.exp(dt * a) - 1.0) / a
        powers = dt * a.unsqueeze(-1) * torch.arange(length, device=a.device)  # (N, L)
        return torch.einsum('n,nl->l', c, torch.exp(powers)).real


class _RefSSM(nn.Module):
    def __init__(self, num_states: int) -> None:
        super().__init__()
        self.kernel = _RefKernel(num_states)
        self.D = nn.Parameter(torch.zeros(1))

    def forward(self, u: torch.Tensor) -> torch.Tensor:  # (B, L, C)
        length = u.shape[1]
        k = self.kernel(length)
        dtype = u.dtype
        # FFTs in float32 (cuFFT has no bfloat16, and half precision loses the long kernel's tail), autocast off
        with torch.autocast(u.device.type, enabled=False):
            u = u.transpose(1, 2).float()  # (B, C, L)
            y = torch.fft.irfft(torch.fft.rfft(u, n=2 * length) * torch.fft.rfft(k.float(), n=2 * length),
                                n=2 * length)
            y = y[..., :length] + u * self.D
        return y.transpose(1, 2).to(dtype)


class ReferenceBiGSLayer(nn.Module):
    """The BiGS layer written out (``docs/models.md``; fp32, no padding mask). Shapes: (B, L, dim) -> (B, L, dim)."""

    def __init__(self, dim: int, hidden_dim: int, num_states: int = 64, norm_eps: float = 1e-12,
                 gelu_approximate: str = 'none') -> None:
        super().__init__()
        self.gelu_approximate = gelu_approximate
        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.value_proj = nn.Linear(dim, hidden_dim)
        self.forward_in_proj = nn.Linear(dim, dim)
        self.backward_in_proj = nn.Linear(dim, dim)
        self.ssm_forward = _RefSSM(num_states)
        self.ssm_backward = _RefSSM(num_states)
        self.forward_out_proj = nn.Linear(dim, dim)
        self.backward_out_proj = nn.Linear(dim, dim)
        self.gate_proj = nn.Linear(dim, hidden_dim)
        self.out_proj = nn.Linear(hidden_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = self.gelu_approximate
        h = self.norm(x)
        v = F.gelu(self.value_proj(h), approximate=act)
        u_f = F.gelu(self.forward_in_proj(h), approximate=act)
        u_b = F.gelu(self.backward_in_proj(torch.flip(h, dims=[1])), approximate=act)
        s_f = self.ssm_forward(u_f)
        s_b = self.ssm_backward(u_b)
        g = self.forward_out_proj(s_f) * torch.flip(self.backward_out_proj(s_b), dims=[1])
        return x + self.out_proj(F.gelu(self.gate_proj(g), approximate=act) * v)


def reference_bigs_layer_from(layer: nn.Module) -> ReferenceBiGSLayer:
    """The straightforward twin of a :class:`~mlp_vision.layers.BidirectionalGatedSSM`, with its weights."""
    ref = ReferenceBiGSLayer(layer.dim, layer.hidden_dim, layer.ssm_forward.kernel.num_states,
                             norm_eps=layer.norm.eps, gelu_approximate=layer.gelu_approximate)
    ref.load_state_dict(layer.state_dict())
    return ref.to(next(layer.parameters()).device)
