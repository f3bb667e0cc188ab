""" The chunked (state-passing) route of BiGS's S4D convolution (mlp_vision.layers.ssm_chunked), on the CPU.

Against independent computations: the dense Toeplitz convolution of the kernel ``S4DKernel`` builds (float64), the
layer's FFT route (outputs and every gradient, float64, 1e-10 relative), the fvcore MAC count of what runs (flat in
the length), and what a training step keeps for the backward pass.
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mlp_vision.benchmark import saved_activation_bytes
from mlp_vision.complexity import count_module
from mlp_vision.layers.ssm import BidirectionalGatedSSM, S4DKernel, auto_conv_impl, causal_toeplitz, \
    chunked_route_pays
from mlp_vision.layers.ssm_chunked import CHUNK_LEN, SCAN_GROUP, bidirectional_chunked_conv, \
    chunked_conv_macs_per_token
from mlp_vision.layers.longconv_triton import has_triton, toeplitz_conv_macs_per_token


def _kernels(num_states=6, seed=0, a_re=(-1.0, -1e-3), dtype=torch.float64):
    """Two S4D kernels (forward / backward) with spread decays, and their D."""
    torch.manual_seed(seed)
    kernels = [S4DKernel(num_states).to(dtype) for _ in range(2)]
    with torch.no_grad():
        for k in kernels:
            k.A_re.uniform_(*a_re)
    return kernels, torch.randn(2, 1, dtype=dtype)


def _modes(kernels):
    (decay_f, weight_f), (decay_b, weight_b) = (k.modes() for k in kernels)
    return torch.stack([decay_f, decay_b]), torch.stack([weight_f, weight_b])


def _dense(u_f, u_b, kernels, skip):
    """The two convolutions as dense (L, L) Toeplitz products of the kernels S4DKernel builds."""
    length = u_f.shape[1]
    k = [kern(length) + F.pad(d, (0, length - 1)) for kern, d in zip(kernels, skip)]
    return causal_toeplitz(k[0]) @ u_f, causal_toeplitz(k[1], anticausal=True) @ u_b


def _rel(x, ref):
    return ((x - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize('length, chunk_len, group', [
    (1, 4, 2), (4, 4, 2), (7, 4, 2), (37, 4, 2), (37, 8, 3), (100, 5, 2), (300, 7, 3), (129, 128, 16), (600, 3, 4),
])
def test_chunked_conv_equals_dense_toeplitz(length, chunk_len, group):
    """Both directions, lengths that are and are not multiples of the chunk, one to five scan levels (600 / 3 =
    200 chunks in groups of 4), float64: the dense convolution to rounding."""
    kernels, skip = _kernels()
    u_f, u_b = torch.randn(2, 2, length, 3, dtype=torch.float64)
    decay, weight = _modes(kernels)
    with torch.no_grad():
        ref_f, ref_b = _dense(u_f, u_b, kernels, skip)
        y_f, y_b = bidirectional_chunked_conv(u_f, u_b, decay, weight, skip, chunk_len=chunk_len, group=group)
    assert y_f.shape == y_b.shape == (2, length, 3) and y_f.dtype == torch.float64
    assert _rel(y_f, ref_f) < 1e-12 and _rel(y_b, ref_b) < 1e-12


def _layer_step(layer, x, mask, upstream, run=None):
    """Output and gradients (input, every parameter by name) of one step of ``run`` (default: ``layer``)."""
    layer.zero_grad()
    x = x.detach().clone().requires_grad_()
    y = (layer if run is None else run)(x, mask)
    (y * upstream).sum().backward()
    return {'output': y.detach(), 'input': x.grad, **{n: p.grad.clone() for n, p in layer.named_parameters()}}


@pytest.mark.parametrize('length, gelu', [(300, 'none'), (2 * CHUNK_LEN * SCAN_GROUP + 37, 'tanh')])
def test_layer_chunked_route_equals_fft_route_in_float64(length, gelu):
    """The layer on the chunked route (GELUs, mask, checkpointed backward) against its FFT route: the output and the
    gradients of the input and of every parameter (log_step, A_re, A_im, C, D of both SSMs among them) within
    1e-10 relative, with right padding in one sequence. The longer length takes three scan levels."""
    torch.manual_seed(0)
    layer = BidirectionalGatedSSM(8, 12, num_states=6, gelu_approximate=gelu).double()
    with torch.no_grad():
        for ssm in (layer.ssm_forward, layer.ssm_backward):
            ssm.kernel.A_re.uniform_(-1.0, -1e-3)
            ssm.D.normal_()
    x = torch.randn(2, length, 8, dtype=torch.float64)
    mask = torch.ones(2, length, dtype=torch.bool)
    mask[1, length // 2:] = False
    upstream = torch.randn(2, length, 8, dtype=torch.float64)
    layer.conv_impl = 'fft'
    ref = _layer_step(layer, x, mask, upstream)
    layer.conv_impl = 'chunked'
    got = _layer_step(layer, x, mask, upstream)
    assert set(got) >= {'ssm_forward.kernel.log_step', 'ssm_backward.kernel.A_re', 'ssm_backward.kernel.A_im',
                        'ssm_forward.kernel.C', 'ssm_backward.D', 'input', 'output'}
    for name, value in ref.items():
        assert _rel(got[name], value) < 1e-10, name


@pytest.mark.parametrize('a_re, log_step', [(-1e-9, 2.5), (-1e-4, -5.0), (-1e4, 2.5)])
def test_extreme_decays_stay_finite_and_exact(a_re, log_step):
    """A_re at and past the clamp (-1e-4: memory over the whole sequence), a large step, A_im up to pi (N - 1), and
    decays that underflow to zero at once: the float32 route is finite and equals the float64 dense convolution to
    float32 rounding at 20,000 tokens (no power of lam above 1 is ever formed)."""
    kernels, skip = _kernels(num_states=16)
    with torch.no_grad():
        for k in kernels:
            k.A_re.fill_(a_re)
            k.log_step.fill_(log_step)
    length = 20_000
    u_f, u_b = torch.randn(2, 1, length, 2, dtype=torch.float64)
    decay, weight = _modes(kernels)
    with torch.no_grad():
        y_f, y_b = bidirectional_chunked_conv(u_f.float(), u_b.float(), decay, weight, skip)
        ref_f, ref_b = bidirectional_chunked_conv(u_f, u_b, decay, weight, skip)
        dense_f, _ = _dense(u_f[:, :3000], u_b[:, :3000], kernels, skip)
    assert torch.isfinite(y_f).all() and torch.isfinite(y_b).all()
    assert _rel(ref_f[:, :3000], dense_f) < 1e-10  # the float64 route is the dense convolution
    assert _rel(y_f.double(), ref_f) < 1e-4 and _rel(y_b.double(), ref_b) < 1e-4


class _ChunkedConv(nn.Module):
    def __init__(self, num_states, **kw):
        super().__init__()
        kernels, self.skip = _kernels(num_states, dtype=torch.float32)
        self.decay, self.weight = (t.detach() for t in _modes(kernels))
        self.kw = kw

    def forward(self, u):
        return torch.stack(bidirectional_chunked_conv(u, u, self.decay, self.weight, self.skip, **self.kw))


@pytest.mark.parametrize('length, chunk_len, group', [(1, 128, 16), (300, 8, 3), (2048, 128, 16), (5000, 128, 16),
                                                      (40_000, 128, 16)])
def test_mac_count_is_what_runs_and_flat_in_length(length, chunk_len, group):
    """fvcore's count of the GEMMs the route runs equals chunked_conv_macs_per_token (so the formula auto relies on
    is the route's), and per token it does not grow with the length: within 5 % of T + 4N from 2K to 1M tokens,
    while the Toeplitz kernel's grows as L / 2."""
    num_states, channels = 6, 3
    macs = count_module(_ChunkedConv(num_states, chunk_len=chunk_len, group=group),
                        (torch.randn(1, length, channels),))[0]
    assert macs == round(2 * channels * length * chunked_conv_macs_per_token(length, num_states, chunk_len, group))
    per_token = [chunked_conv_macs_per_token(n, 64) for n in (2048, 16_384, 65_536, 1 << 20)]
    assert max(per_token) <= 1.05 * min(per_token) and min(per_token) >= CHUNK_LEN + 4 * 64
    assert toeplitz_conv_macs_per_token(1 << 16) > 70 * per_token[2]


def test_fvcore_counts_the_route_a_layer_runs():
    """count_module counts the paper's FFT route by default and, with bigs_conv_impl=None, the route the layer runs:
    the chunked route's MACs (projections the same)."""
    layer = BidirectionalGatedSSM(8, 12, num_states=6, conv_impl='chunked').eval()
    x = torch.randn(1, 1000, 8)
    fft_total, fft_by_op, _, _ = count_module(layer, (x,))
    run_total, by_op, _, _ = count_module(layer, (x,), bigs_conv_impl=None)
    outside_conv = by_op['linear'] + by_op['layer_norm']
    assert by_op['linear'] == fft_by_op['linear'] == 1000 * (3 * 8 * 12 + 4 * 8 * 8)
    assert run_total - outside_conv == round(2 * 8 * 1000 * chunked_conv_macs_per_token(1000, 6))
    assert 'fft_rfft' in fft_by_op and not any('fft' in op for op in by_op)


def _kept_bytes(layer, x, mask=None):
    """Bytes of the distinct storages a training step keeps for its backward pass but the parameters."""
    return saved_activation_bytes(layer, x, mask=mask)


def test_chunked_route_keeps_only_the_pre_activations():
    """With a graph the chunked route's gate (GELUs, convolution, the two out-projections and their product) is
    recomputed in the backward pass: the layer keeps at least six (B, L, d) tensors less than on the FFT route (the
    stacked GELU outputs u that the FFT op saves, s_f and s_b, both projections' outputs), only a_f and a_b (which
    the FFT route keeps too, for its GELUs), no chunk state; per token the same at any length; eager and compiled."""
    torch.manual_seed(0)
    layer = BidirectionalGatedSSM(32, 48, num_states=8)
    x = torch.randn(2, 300, 32, requires_grad=True)
    mask = torch.ones(2, 300, dtype=torch.bool)
    activation = 2 * 300 * 32 * 4  # one (B, L, d) float32 tensor
    layer.conv_impl = 'fft'
    fft_bytes = _kept_bytes(layer, x, mask)
    layer.conv_impl = 'chunked'
    chunked_bytes = _kept_bytes(layer, x, mask)
    assert chunked_bytes <= fft_bytes - 6 * activation
    assert _kept_bytes(layer, torch.randn(2, 600, 32, requires_grad=True)) == 2 * _kept_bytes(layer, x)
    compiled = torch.compile(layer, fullgraph=True, backend='aot_eager_decomp_partition')
    upstream = torch.randn_like(x)
    eager_step, compiled_step = (_layer_step(layer, x, mask, upstream, run=run) for run in (layer, compiled))
    for name, value in eager_step.items():  # compiled (recursive scan, checkpoint): the same step
        torch.testing.assert_close(compiled_step[name], value, rtol=1e-5, atol=1e-6 * value.abs().max().item())
    # compiled, the mask (B, L) bool is saved as a graph input; eager, the recomputation holds it in a closure
    assert _kept_bytes(compiled, x, mask) <= chunked_bytes + mask.numel()


@pytest.mark.slow
def test_inductor_compiled_chunked_layer_equals_eager():
    """torch.compile(fullgraph=True) with inductor's code generation of a training step on the chunked route
    (three scan levels, checkpoint): the same output and gradients as eager."""
    torch.manual_seed(0)
    layer = BidirectionalGatedSSM(16, 24, num_states=6, conv_impl='chunked')
    x = torch.randn(2, CHUNK_LEN * SCAN_GROUP * 2 + 5, 16)
    upstream = torch.randn_like(x)
    eager = _layer_step(layer, x, None, upstream)
    compiled = _layer_step(layer, x, None, upstream, run=torch.compile(layer, fullgraph=True))
    for name, value in eager.items():
        torch.testing.assert_close(compiled[name], value, rtol=1e-5, atol=1e-6 * value.abs().max().item())


def test_bf16_within_its_rounding():
    """Under bf16 autocast (GEMMs in bf16, states in float32) the layer's output and gradients stay within bf16
    rounding of its float32 FFT route."""
    torch.manual_seed(0)
    layer = BidirectionalGatedSSM(32, 48, num_states=8)
    x = torch.randn(2, 700, 32)
    upstream = torch.randn_like(x)
    layer.conv_impl = 'fft'
    ref = _layer_step(layer, x, None, upstream)
    layer.conv_impl = 'chunked'
    with torch.autocast('cpu', dtype=torch.bfloat16):
        got = _layer_step(layer, x, None, upstream)
    a = torch.randn(2, 700, 32, dtype=torch.bfloat16)
    assert all(y.dtype == torch.bfloat16 for y in layer._chunked_ssm(a, a))
    for name in ('output', 'input', 'ssm_forward.kernel.C', 'ssm_backward.kernel.A_re', 'forward_in_proj.weight'):
        assert _rel(got[name].float(), ref[name]) < 3e-2, name


@pytest.mark.parametrize('args, match', [
    (lambda u: (u, u[:, :-1]), 'one shape and dtype'),
    (lambda u: (u, u.double()), 'one shape and dtype'),
    (lambda u: (u[0], u[0]), r'\(B, L, C\)'),
])
def test_bad_inputs_stop_with_one_clear_line(args, match):
    kernels, skip = _kernels()
    decay, weight = _modes(kernels)
    with pytest.raises(ValueError, match=match):
        bidirectional_chunked_conv(*args(torch.randn(2, 10, 3)), decay, weight, skip)
    with pytest.raises(ValueError, match='chunk_len'):
        bidirectional_chunked_conv(torch.randn(2, 10, 3), torch.randn(2, 10, 3), decay, weight, skip, group=1)


def test_auto_takes_the_chunked_route_on_cuda_where_it_needs_a_quarter_of_the_macs():
    """conv_impl='auto' on CUDA: the Triton Toeplitz kernel from TRITON_MIN_LEN tokens until the chunked route needs
    at most a quarter of its MACs (about 3,300 tokens for N = 64), the chunked route beyond; the CPU keeps its
    routes (direct, then FFT)."""
    bf16 = torch.bfloat16
    assert not chunked_route_pays(3072, 64) and chunked_route_pays(4096, 64)
    first = next(n for n in range(1024, 8192, 64) if chunked_route_pays(n, 64))
    assert 3000 <= first <= 3600
    for n, route in ((2048, 'triton'), (4096, 'chunked'), (16_384, 'chunked'), (1 << 16, 'chunked')):
        assert auto_conv_impl('cuda', bf16, n, True) == route
        assert auto_conv_impl('cpu', bf16, n, True) == 'fft'
        assert 4 * chunked_conv_macs_per_token(n, 64) <= toeplitz_conv_macs_per_token(n) or route == 'triton'
    assert auto_conv_impl('cuda', bf16, 16_384, False) == 'fft'  # without triton, as before
    assert auto_conv_impl('cuda', torch.float64, 16_384, True) == 'fft'
    layer = BidirectionalGatedSSM(8, 16, num_states=4)
    assert layer.conv_route(torch.zeros(1, 4096, 8)) == 'fft'
    if has_triton('cuda') and torch.cuda.is_available():
        assert layer.conv_route(torch.zeros(1, 4096, 8, device='cuda')) == 'chunked'
