""" Diagonal state-space (S4D) convolution and the bidirectional gated SSM layer of BiGS.

Paper: `Pretraining Without Attention` (BiGS) - https://arxiv.org/abs/2212.10544 (§3-4). The SSM is S4D
(https://arxiv.org/abs/2206.11893) with zero-order-hold discretisation and B = 1; per complex state n::

    x_k = exp(dt A) x_{k-1} + ((exp(dt A) - 1) / A) u_k
    y_k = Re(sum_n C_n x_{n,k}) + D u_k

which unrolled (x_{-1} = 0) is a causal convolution ``y = causal_conv(u, K) + D u`` with the kernel
``K[l] = Re(sum_n C_n (exp(dt A_n) - 1) / A_n exp(dt A_n l))``, l = 0..L-1.

BiGS uses **one** kernel (and one ``D``) for all hidden channels of a layer and direction: ``2 + 4N`` parameters
per SSM (258 for N = 64), named and shaped as the official checkpoints (``fs4.kernel.{log_step, A_re, A_im, C}``,
``fs4.D``; ``C`` (N, 2) holds [real, imag]), so they load without reshaping.

FFT route: real FFTs of length ``n_fft = fast_fft_len(2L)`` (256 for L = 128), long enough that the circular
convolution equals the linear one on the first L outputs.
"""
import contextlib
import math
from typing import Dict, Iterator, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .activations import fresh_gelu, gelu_product
from .longconv_triton import SUPPORTED_DTYPES as TRITON_DTYPES, bidirectional_gelu_long_conv, bidirectional_long_conv, \
    causal_toeplitz, has_triton, toeplitz_conv_macs_per_token
from .linear import attribute_set_to
from .ssm_chunked import bidirectional_chunked_conv, chunked_conv_macs_per_token

__all__ = [
    'fast_fft_len', 'causal_toeplitz', 'S4DKernel', 'S4DLayer', 'BidirectionalGatedSSM',
    'ssm_conv_impl', 'auto_conv_impl', 'chunked_route_pays', 'DIRECT_MAX_LEN', 'TRITON_MIN_LEN',
]

# conv_impl='auto' (auto_conv_impl): the longest sequence convolved as a dense Toeplitz GEMM, and on CUDA the shortest
# convolved by the Triton kernel (provisional: `scripts/gpu/text_models.py routes` times every route per length)
DIRECT_MAX_LEN = 1024
TRITON_MIN_LEN = 1024


def chunked_route_pays(length: int, num_states: int) -> bool:
    """Whether the chunked route needs at most a quarter of the Triton Toeplitz kernel's MACs at ``length`` tokens
    (about 3,300 tokens with N = 64): the rule for GPU defaults until a GPU measures them."""
    return 4 * chunked_conv_macs_per_token(length, num_states) <= toeplitz_conv_macs_per_token(length)


def auto_conv_impl(device_type: str, dtype: torch.dtype, length: int, triton_available: bool, num_states: int = 64,
                   direct_max_len: int = DIRECT_MAX_LEN, triton_min_len: int = TRITON_MIN_LEN) -> str:
    """The SSM convolution route ``conv_impl='auto'`` takes. On CUDA, for ``length >= triton_min_len`` when triton
    is installed and multiplies the dtype: ``'chunked'`` where :func:`chunked_route_pays`, else ``'triton'``.
    Otherwise ``'direct'`` up to ``direct_max_len`` and ``'fft'`` beyond (on the CPU FFTs beat the chunked route up
    to 16K tokens: ``results/bigs_linear/``). Static facts of the input only, never timings, so a model computes the
    same thing on every run."""
    if device_type == 'cuda' and triton_available and dtype in TRITON_DTYPES and length >= triton_min_len:
        return 'chunked' if chunked_route_pays(length, num_states) else 'triton'
    return 'direct' if length <= direct_max_len else 'fft'


def fast_fft_len(n: int) -> int:
    """Smallest integer >= ``n`` whose prime factors are 2, 3 and 5 (sizes pocketFFT / cuFFT handle fastest)."""
    n = int(n)  # sizes arrive as 0-dim tensors under the JIT tracer (fvcore)
    best = 1 << max(n - 1, 0).bit_length()  # the next power of two, an upper bound
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            best = min(best, p35 << (-(-n // p35) - 1).bit_length())  # p35 times the least power of two reaching n
            p35 *= 3
        p5 *= 5
    return best


def _autocast_off(device: torch.device):
    """Disable autocast on ``device`` (a no-op context where autocast does not exist, e.g. 'meta')."""
    if torch.amp.is_autocast_available(device.type):
        return torch.autocast(device_type=device.type, enabled=False)
    return contextlib.nullcontext()


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _bidirectional_spectrum(kernels: torch.Tensor, n_fft: int) -> torch.Tensor:
    """Spectra of a causal (``kernels[0]``) and an anti-causal (``kernels[1]``) kernel, (2, L) -> (2, 1, n_f),
    broadcasting against (B, 2, C, n_f) transforms."""
    k_f = torch.fft.rfft(kernels, n=n_fft)  # (2, n_f)
    # conj_physical here and in the backward op: inside a custom op run by AOTAutograd, a lazy .conj() view was read
    # unconjugated
    return torch.stack([k_f[0], k_f[1].conj_physical()]).unsqueeze(1)


def _conv_with_spectrum(u: torch.Tensor, k_f: torch.Tensor, n_fft: int, dim: int) -> torch.Tensor:
    """``irfft(rfft(u) * k_f)`` along ``dim`` of ``u``, cut to ``u``'s length (``k_f`` broadcasts against the
    transformed ``u``)."""
    length = u.shape[dim]
    u_f = torch.fft.rfft(u, n=n_fft, dim=dim)
    u_f = u_f.mul_(k_f) if not torch.is_grad_enabled() else u_f * k_f  # in place: see layers.activations
    return torch.fft.irfft(u_f, n=n_fft, dim=dim).narrow(dim, 0, length)


@torch.library.custom_op('mlp_vision::bidirectional_fft_conv', mutates_args=())
def bidirectional_fft_conv(u: torch.Tensor, k: torch.Tensor, n_fft: int) -> torch.Tensor:
    """``y[:, 0] = causal_conv(u[:, 0], k[0])``, ``y[:, 1] = anticausal_conv(u[:, 1], k[1])`` along the last axis,
    by real FFTs of length ``n_fft``, with a hand-written backward (:func:`_bidirectional_fft_conv_backward`).

    Why: autograd's backward of rfft -> product -> irfft -> narrow copies full padded buffers and runs a complex
    FFT. Here ``grad_u = irfft(rfft(grad_y) conj(S))[:L]`` (the adjoint is the correlation) and the kernel gradient
    is the correlation of ``grad_y`` with ``u`` summed over batch and channels; ``u`` is kept in its own dtype, not
    as its spectrum, and transformed again. Custom ops, so that ``torch.compile``'s partitioner keeps what this
    forward keeps (traced through, it kept the spectrum).

    Shapes: u (B, 2, C, L) real, any float dtype, transformed in ``dtype`` (``k``'s: float32 / float64); k (2, L)
    real (group 0 causal, group 1 anti-causal); output (B, 2, C, L) in ``dtype``.
    """
    return _conv_with_spectrum(u.to(k.dtype), _bidirectional_spectrum(k, n_fft), n_fft, dim=-1)


@bidirectional_fft_conv.register_fake
def _(u: torch.Tensor, k: torch.Tensor, n_fft: int) -> torch.Tensor:
    return u.new_empty((*u.shape[:-1], n_fft), dtype=k.dtype).narrow(-1, 0, u.shape[-1])


@torch.library.custom_op('mlp_vision::bidirectional_fft_conv_backward', mutates_args=())
def _bidirectional_fft_conv_backward(grad_y: torch.Tensor, u: torch.Tensor, k: torch.Tensor, n_fft: int,
                                     needs_grad_u: bool, needs_grad_k: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """The gradients of :func:`bidirectional_fft_conv` for ``u`` and ``k`` (an empty tensor for one not needed)."""
    length = u.shape[-1]
    g_f = torch.fft.rfft(grad_y, n=n_fft)  # (B, 2, C, n_f)
    grad_u, grad_k = u.new_empty(0), k.new_empty(0)
    if needs_grad_k:
        u_f_conj = torch.fft.rfft(u.to(grad_y.dtype), n=n_fft).conj_physical_()  # again, as in the forward pass
        # sum_{b,c} of the cross-spectra: causal group conj(U) G, anti-causal group U conj(G)
        cross = (g_f * u_f_conj).sum(dim=(0, 2))  # (2, n_f)
        cross = torch.stack([cross[0], cross[1].conj_physical()])
        grad_k = torch.fft.irfft(cross, n=n_fft).narrow(-1, 0, length)
    if needs_grad_u:
        spectrum = _bidirectional_spectrum(k, n_fft)  # (2, 1, n_f), as in the forward pass
        grad_u = torch.fft.irfft(g_f.mul_(spectrum.conj_physical()), n=n_fft).narrow(-1, 0, length).to(u.dtype)
    return grad_u, grad_k


@_bidirectional_fft_conv_backward.register_fake
def _(grad_y, u, k, n_fft, needs_grad_u, needs_grad_k):
    length = u.shape[-1]
    grad_u = (grad_y.new_empty((*u.shape[:-1], n_fft)).narrow(-1, 0, length).to(u.dtype) if needs_grad_u
              else u.new_empty(0))
    grad_k = k.new_empty((2, n_fft)).narrow(-1, 0, length) if needs_grad_k else k.new_empty(0)
    return grad_u, grad_k


def _fft_conv_setup_context(ctx, inputs, output) -> None:
    u, k, n_fft = inputs
    ctx.save_for_backward(u, k)  # u in its own dtype; the kernels' spectrum is recomputed from k (2, L)
    ctx.n_fft = n_fft


def _fft_conv_backward(ctx, grad_y: torch.Tensor):
    u, k = ctx.saved_tensors
    needs_u, needs_k = ctx.needs_input_grad[:2]
    grad_u, grad_k = _bidirectional_fft_conv_backward(grad_y, u, k, ctx.n_fft, needs_u, needs_k)
    return grad_u if needs_u else None, grad_k if needs_k else None, None


bidirectional_fft_conv.register_autograd(_fft_conv_backward, setup_context=_fft_conv_setup_context)


class S4DKernel(nn.Module):
    """Convolution kernel of a diagonal SSM with N complex states, one kernel shared by all channels.

    Parameters (official BiGS names and shapes): ``log_step`` (1,), log of the step dt, init uniform in
    [log dt_min, log dt_max]; ``A_re`` (N,), init -0.5, clamped to <= -1e-4 when used (keeps the SSM stable);
    ``A_im`` (N,), init pi * n (S4D-Lin); ``C`` (N, 2) as [real, imag], each part ~ N(0, 0.5).

    ``forward(L)`` returns the kernel ``K`` (L,) of the module docstring, computed with autocast disabled in float32
    (float64 if the parameters are float64).

    Caching: in eval mode with gradients disabled the kernel of each length is computed once and reused. The key
    holds each parameter's version counter and storage address, so an in-place update (optimizer step,
    ``load_state_dict``, ``.to()``) recomputes it; ``train()`` / ``eval()`` clear it. Writes through ``param.data``
    bypass the version counter: call :meth:`clear_cache` (or ``eval()``) after them.
    """

    def __init__(self, num_states: int = 64, dt_min: float = 0.01, dt_max: float = 1.0, device=None,
                 dtype=None) -> None:
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        self.num_states = num_states
        self.dt_min = dt_min
        self.dt_max = dt_max
        self.log_step = nn.Parameter(torch.empty(1, **dd))
        self.A_re = nn.Parameter(torch.empty(num_states, **dd))
        self.A_im = nn.Parameter(torch.empty(num_states, **dd))
        self.C = nn.Parameter(torch.empty(num_states, 2, **dd))
        self._cache: Dict[Tuple, torch.Tensor] = {}
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        if self.log_step.is_meta:
            return
        self.log_step.uniform_(math.log(self.dt_min), math.log(self.dt_max))
        self.A_re.fill_(-0.5)
        self.A_im.copy_(math.pi * torch.arange(self.num_states, dtype=torch.float64))
        self.C.normal_(0.0, math.sqrt(0.5))
        self._cache.clear()

    def clear_cache(self) -> None:
        """Drop the cached eval-mode kernels."""
        self._cache.clear()

    def train(self, mode: bool = True):
        self._cache.clear()
        return super().train(mode)

    def modes(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """The kernel as N decaying modes, ``K[l] = Re(sum_n w_n lam_n^l)``, in float64 real arithmetic (for the
        chunked route, :mod:`~mlp_vision.layers.ssm_chunked`): ``log_decay`` (2, N) = [Re, Im] of
        ``log lam = dt A`` (real part <= -1e-4 dt) and ``weight`` (2, N) = [Re, Im] of ``w = C (lam - 1) / A``."""
        dt = self.log_step.to(torch.float64).exp()
        a_re = self.A_re.to(torch.float64).clamp(max=-1e-4)
        a_im = self.A_im.to(torch.float64)
        x, y = dt * a_re, dt * a_im
        # lam - 1 = exp(x) cos(y) - 1 + i exp(x) sin(y), its real part without cancellation for small |dt A|
        e_re = torch.expm1(x) * torch.cos(y) - 2 * torch.sin(y / 2) ** 2
        e_im = torch.exp(x) * torch.sin(y)
        norm = a_re * a_re + a_im * a_im
        q_re, q_im = (e_re * a_re + e_im * a_im) / norm, (e_im * a_re - e_re * a_im) / norm  # (lam - 1) / A
        c_re, c_im = self.C[:, 0].to(torch.float64), self.C[:, 1].to(torch.float64)
        return torch.stack([x, y]), torch.stack([c_re * q_re - c_im * q_im, c_re * q_im + c_im * q_re])

    def _kernel(self, length: int) -> torch.Tensor:
        with _autocast_off(self.log_step.device):
            dtype = _compute_dtype(self.log_step)  # float32, or float64 for float64 parameters
            dt = self.log_step.to(dtype).exp()
            a = torch.complex(self.A_re.to(dtype).clamp(max=-1e-4), self.A_im.to(dtype))
            c = torch.complex(self.C[:, 0].to(dtype), self.C[:, 1].to(dtype))
            dt_a = dt * a  # (N,)
            c_b = c * (torch.exp(dt_a) - 1) / a  # (N,): C_n B_bar_n
            pos = torch.arange(length, device=a.device, dtype=dt.dtype)  # (L,)
            vandermonde = torch.exp(dt_a.unsqueeze(-1) * pos)  # (N, L): A_bar_n^l as exp(dt A_n l)
            return torch.matmul(c_b.unsqueeze(0), vandermonde).squeeze(0).real  # (L,)

    def forward(self, length: int) -> torch.Tensor:
        """Kernel ``K`` of shape (length,), float32 (float64 with float64 parameters)."""
        if self.training or torch.is_grad_enabled():
            return self._kernel(length)
        params = (self.log_step, self.A_re, self.A_im, self.C)
        key = (length,) + tuple((p._version, p.data_ptr(), p.device, p.dtype) for p in params)
        k = self._cache.get(key)
        if k is None:
            if len(self._cache) >= 8:
                self._cache.clear()
            k = self._kernel(length)
            self._cache[key] = k
        return k

    def extra_repr(self) -> str:
        return f'num_states={self.num_states}, dt_min={self.dt_min}, dt_max={self.dt_max}'


class S4DLayer(nn.Module):
    """The parameters of a diagonal SSM along the sequence, ``y = causal_conv(u, K) + D * u`` (arXiv 2212.10544, §4;
    S4D kernel: arXiv 2206.11893).

    One kernel ``K`` (:class:`S4DKernel`) and one ``D`` (official shape (1,)) for all channels; ``D`` starts at 1 as
    in the official Flax pretraining code (its torch port draws N(0, 1); checkpoints overwrite it). No forward of its
    own: :class:`BidirectionalGatedSSM` convolves both directions' kernels (``D`` folded into lag 0) in one pass.
    """

    def __init__(self, num_states: int = 64, dt_min: float = 0.01, dt_max: float = 1.0, device=None,
                 dtype=None) -> None:
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        self.kernel = S4DKernel(num_states, dt_min=dt_min, dt_max=dt_max, **dd)
        self.D = nn.Parameter(torch.empty(1, **dd))
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        if not self.D.is_meta:
            self.D.fill_(1.0)
        self.kernel.init_weights()


class BidirectionalGatedSSM(nn.Module):
    """The BiGS layer (arXiv 2212.10544, §4, Fig. 2): pre-LayerNorm, two gated S4D branches, multiplicative gating.

    ::

        h   = LayerNorm(x)
        v   = GELU(h W_v)                                   # value_proj:        d -> d_i
        u_f = GELU(h W_uf)                                  # forward_in_proj:   d -> d
        u_b = GELU(flip(h) W_ub)                            # backward_in_proj:  d -> d (sequence reversed)
        s_f = SSM_f(u_f);  s_b = SSM_b(u_b)                 # ssm_forward / ssm_backward, causal along L
        g   = (s_f W_cf) * flip(s_b W_cb)                   # forward_out_proj / backward_out_proj: d -> d
        out = x + W_o(GELU(g W_ol) * v)                     # gate_proj: d -> d_i, out_proj: d_i -> d

    ``flip`` reverses the sequence axis: the backward branch is an anti-causal SSM over the original order, and the
    layer computes it that way (``flip(GELU(flip(h) W_ub)) = GELU(h W_ub)``, ``flip(SSM_b(flip(w))) =
    SSM_b(w, anticausal=True)``): the same function without reversed copies, both SSMs in one pass (checked against
    the straightforward layer in ``tests/test_equivalence.py``). Every projection is its own ``nn.Linear`` (hooks,
    LoRA and quantised replacements act on it); names map one-to-one onto the official ones (``dv, du_forward,
    du_backward, duc_forward, duc_backward, dol, do, fs4, bs4, LayerNorm``).

    SSM convolution route (``conv_impl``), computations of the same convolution:
        * ``'direct'``: the (L, L) Toeplitz matrix of the kernel (:func:`causal_toeplitz`, ``D`` on the diagonal)
          times the input, one batched GEMM for both directions (``L^2 d`` MACs);
        * ``'fft'``: real FFTs of length ``fast_fft_len(2L)``, ``O(L log L)`` per channel (the paper's formulation);
        * ``'triton'``: the direct route as a blocked-Toeplitz Triton kernel with the input GELUs and the mask in the
          same op (:func:`~mlp_vision.layers.longconv_triton.bidirectional_gelu_long_conv`), for CUDA;
        * ``'chunked'``: linear in L (:mod:`~mlp_vision.layers.ssm_chunked`), recomputed in the backward pass from
          the pre-activations, as the Triton route;
        * ``'auto'`` (default): :func:`auto_conv_impl`.
        The direct and FFT routes run in float32 (float64 for float64 inputs) with autocast off.

    GELU: exact (erf) by default, as the official torch port; ``gelu_approximate='tanh'`` as the official Flax code
    (which pretrained the released weights).

    Padding (``mask``, (B, L) bool, True = real token): ``u_f`` and ``u_b`` are zeroed at padded positions before
    the SSMs, so for right (or left) padding the outputs at real positions equal those of the unpadded input up to
    float rounding (the anti-causal sum over j >= t meets only zeros past the end). Without a mask, pads are mixed
    like real tokens, as the official BiGS models were pretrained.

    Shapes: x (B, L, d); mask: optional (B, L) bool; output (B, L, d).
    """

    def __init__(self, dim: int, hidden_dim: int, num_states: int = 64, norm_eps: float = 1e-12, dt_min: float = 0.01,
                 dt_max: float = 1.0, gelu_approximate: str = 'none', conv_impl: str = 'auto', device=None,
                 dtype=None) -> None:
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        if gelu_approximate not in ('none', 'tanh'):
            raise ValueError(f"gelu_approximate must be 'none' or 'tanh', got {gelu_approximate!r}")
        self.conv_impl = conv_impl  # validated by the property setter
        self.dim = dim
        self.hidden_dim = hidden_dim
        self.gelu_approximate = gelu_approximate
        self.norm = nn.LayerNorm(dim, eps=norm_eps, **dd)
        self.value_proj = nn.Linear(dim, hidden_dim, **dd)
        self.forward_in_proj = nn.Linear(dim, dim, **dd)
        self.backward_in_proj = nn.Linear(dim, dim, **dd)
        self.ssm_forward = S4DLayer(num_states, dt_min=dt_min, dt_max=dt_max, **dd)
        self.ssm_backward = S4DLayer(num_states, dt_min=dt_min, dt_max=dt_max, **dd)
        self.forward_out_proj = nn.Linear(dim, dim, **dd)
        self.backward_out_proj = nn.Linear(dim, dim, **dd)
        self.gate_proj = nn.Linear(dim, hidden_dim, **dd)
        self.out_proj = nn.Linear(hidden_dim, dim, **dd)

    DIRECT_MAX_LEN = DIRECT_MAX_LEN  # 'auto' (auto_conv_impl): longest sequence convolved as a Toeplitz GEMM
    TRITON_MIN_LEN = TRITON_MIN_LEN  # 'auto' on CUDA: shortest sequence convolved by the Triton kernel
    CONV_IMPLS = ('auto', 'direct', 'fft', 'triton', 'chunked')

    @property
    def conv_impl(self) -> str:
        return self._conv_impl

    @conv_impl.setter
    def conv_impl(self, value: str) -> None:
        if value not in self.CONV_IMPLS:
            raise ValueError(f'conv_impl must be one of {self.CONV_IMPLS}, got {value!r}')
        self._conv_impl = value

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        act = self.gelu_approximate
        h = self.norm(x)
        if torch.amp.is_autocast_available(h.device.type) and torch.is_autocast_enabled(h.device.type):
            # cast once, as autocast would: the three projections then keep one copy of h, not a cast each
            h = h.to(torch.get_autocast_dtype(h.device.type))
        a_f = self.forward_in_proj(h)  # (B, L, d): pre-activation of u_f
        a_b = self.backward_in_proj(h)  # flip(GELU(flip(h) W_ub)) = GELU(h W_ub): the flips cancel
        g = self._gate(a_f, a_b, mask)  # (s_f W_cf) * flip(s_b W_cb), (B, L, d)
        # v only now, next to its use: computed before the SSMs, torch.compile's partitioner kept its float32
        # upcast for the backward pass instead of v itself
        v = self.value_proj(h)  # (B, L, d_i)
        y = gelu_product(self.gate_proj(g), v, act)  # GELU(gate) * GELU(v), keeping only the pre-activations
        return x + self.out_proj(y)

    def conv_route(self, u: torch.Tensor) -> str:
        """The convolution route for input ``u`` (B, L, ...): ``conv_impl``, or :func:`auto_conv_impl`'s choice for
        ``'auto'``."""
        if self.conv_impl != 'auto':
            return self.conv_impl
        return auto_conv_impl(u.device.type, u.dtype, u.shape[1], has_triton(u.device),
                              num_states=self.ssm_forward.kernel.num_states, direct_max_len=self.DIRECT_MAX_LEN,
                              triton_min_len=self.TRITON_MIN_LEN)

    def _gate(self, a_f: torch.Tensor, a_b: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        """``forward_out_proj(SSM_f(u_f)) * backward_out_proj(SSM_b(u_b))`` from the pre-activations ``a_f``,
        ``a_b`` (B, L, d). On the chunked route with a graph, all of it is recomputed in the backward pass: two d x d
        projections computed twice (a few percent of the FLOPs) for four (B, L, d) activations fewer kept."""
        route = self.conv_route(a_f)
        if route == 'chunked' and torch.is_grad_enabled() and not torch.jit.is_tracing():
            return checkpoint(self._gate_by, a_f, a_b, mask, route, use_reentrant=False, preserve_rng_state=False)
        return self._gate_by(a_f, a_b, mask, route)

    def _gate_by(self, a_f: torch.Tensor, a_b: torch.Tensor, mask: Optional[torch.Tensor], route: str) -> torch.Tensor:
        s_f, s_b = self._bidirectional_gelu_ssm(a_f, a_b, mask, route)  # SSM_f(u_f), flip(SSM_b(flip(u_b)))
        g = self.forward_out_proj(s_f)
        g_b = self.backward_out_proj(s_b)
        return g * g_b if torch.is_grad_enabled() else g.mul_(g_b)  # in place: see layers.activations

    def _bidirectional_gelu_ssm(self, a_f: torch.Tensor, a_b: torch.Tensor, mask: Optional[torch.Tensor],
                                route: str) -> Tuple[torch.Tensor, torch.Tensor]:
        """``SSM_f(u_f)`` and ``SSM_b(u_b, anticausal=True)`` of ``u = GELU(a)`` (zeroed at padded positions), (B, L, d)
        each in ``a``'s dtype. The Triton and chunked routes take the pre-activations (and keep only them for the
        backward pass); the others apply the GELUs and the mask first and convolve the stacked inputs
        (:meth:`_bidirectional_ssm`)."""
        act = self.gelu_approximate
        if route == 'chunked':
            u_f, u_b = fresh_gelu(a_f, act), fresh_gelu(a_b, act)
            if mask is not None:
                keep = mask[:, :, None].to(u_f.dtype)
                u_f, u_b = u_f * keep, u_b * keep
            return self._chunked_ssm(u_f, u_b)
        if route == 'triton':
            kernels = self._ssm_kernels(a_f.shape[1], a_f)
            with _autocast_off(a_f.device):
                return bidirectional_gelu_long_conv(a_f, a_b, kernels.float(), act, mask)
        u = torch.stack([fresh_gelu(a_f, act), fresh_gelu(a_b, act)], dim=2)  # (B, L, 2, d): one pass, both
        if mask is not None:
            u = u * mask[:, :, None, None].to(u.dtype)
        return self._bidirectional_ssm(u, route).unbind(2)

    def _chunked_ssm(self, u_f: torch.Tensor, u_b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``SSM_f(u_f)`` and ``SSM_b(u_b, anticausal=True)`` by chunked state passing, (B, L, d) each in the
        inputs' dtype, autocast off (GEMMs in the inputs' dtype, states in float32; float64 for float64)."""
        fwd, bwd = self.ssm_forward, self.ssm_backward
        (decay_f, weight_f), (decay_b, weight_b) = fwd.kernel.modes(), bwd.kernel.modes()
        with _autocast_off(u_f.device):
            return bidirectional_chunked_conv(u_f, u_b, torch.stack([decay_f, decay_b]),
                                              torch.stack([weight_f, weight_b]), torch.stack([fwd.D, bwd.D]))

    def _ssm_kernels(self, length: int, like: torch.Tensor) -> torch.Tensor:
        """Both directions' kernels (2, L) with ``D`` folded into lag 0 (the ``D u`` term is the lag-0 tap of the
        convolution), float32 (float64 when ``like`` or the parameters are)."""
        fwd, bwd = self.ssm_forward, self.ssm_backward
        k_f, k_b = fwd.kernel(length), bwd.kernel(length)  # (L,) each, float32 (float64)
        dtype = _compute_dtype(like, k_f)
        with _autocast_off(like.device):
            return torch.stack([k.to(dtype) + F.pad(ssm.D.to(dtype), (0, length - 1))
                                for k, ssm in ((k_f, fwd), (k_b, bwd))])

    def _bidirectional_ssm(self, u: torch.Tensor, route: Optional[str] = None) -> torch.Tensor:
        """Both SSMs at once on stacked inputs: ``u`` (B, L, 2, d) holds ``u_f`` / ``u_b`` on dim 2; returns
        ``SSM_f(u_f)`` (causal) and ``SSM_b(u_b, anticausal=True)`` stacked the same way, in ``u.dtype``, by ``route``
        (by default :meth:`conv_route`'s; the layer's forward runs 'triton' and 'chunked' from the pre-activations)."""
        route = self.conv_route(u) if route is None else route
        if route == 'chunked':
            return torch.stack(self._chunked_ssm(u[:, :, 0], u[:, :, 1]), 2)
        length = u.shape[1]
        kernels = self._ssm_kernels(length, u)  # (2, L)
        dtype = kernels.dtype
        with _autocast_off(u.device):
            if route == 'direct':
                mats = torch.stack([causal_toeplitz(kernels[0]), causal_toeplitz(kernels[1], anticausal=True)])
                batch, _, _, d = u.shape
                # one GEMM per direction over all sequences: (L, L) @ (L, B d)
                y = torch.bmm(mats, u.to(dtype).permute(2, 1, 0, 3).reshape(2, length, batch * d))
                y = y.view(2, length, batch, d).permute(2, 1, 0, 3)  # (B, L, 2, d)
            elif route == 'fft':
                # transform along the last axis: pocketFFT is much faster there than along a strided axis
                u_t = u.permute(0, 2, 3, 1)  # (B, 2, d, L)
                n_fft = fast_fft_len(2 * length)
                if torch.is_grad_enabled() and (u_t.requires_grad or kernels.requires_grad) \
                        and not torch.jit.is_tracing():
                    # training: the hand-written backward, which keeps u in its own dtype (it casts u itself)
                    y = bidirectional_fft_conv(u_t, kernels, n_fft)
                else:  # no graph (and what FLOP counters trace): plain ops, the product in place
                    y = _conv_with_spectrum(u_t.to(dtype), _bidirectional_spectrum(kernels, n_fft), n_fft, dim=-1)
                y = y.permute(0, 3, 1, 2)  # (B, L, 2, d)
            elif route == 'triton':  # tiles multiply in u's dtype, float32 accumulation
                y = bidirectional_long_conv(u, kernels.float())
            else:
                raise ValueError(f"route must be one of 'direct', 'fft', 'triton', 'chunked', got {route!r}")
        return y.to(u.dtype)

    def extra_repr(self) -> str:
        return (f'dim={self.dim}, hidden_dim={self.hidden_dim}, gelu_approximate={self.gelu_approximate!r}, '
                f'conv_impl={self.conv_impl!r}')


@contextlib.contextmanager
def ssm_conv_impl(model: nn.Module, impl: str) -> Iterator[nn.Module]:
    """Temporarily run every :class:`BidirectionalGatedSSM` in ``model`` with ``conv_impl=impl``; restored on exit.

    FLOP counters use ``'fft'``: the paper's O(L log L) formulation, whatever route ``'auto'`` would take."""
    layers = [m for m in model.modules() if isinstance(m, BidirectionalGatedSSM)]
    with attribute_set_to(layers, 'conv_impl', impl):
        yield model
