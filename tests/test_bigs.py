""" Tests of BiGS: the S4D kernel / FFT convolution / bidirectional gated SSM layer (mlp_vision.layers.ssm) and the
BiGS text models (mlp_vision.text.bigs).

Covers: FFT causal convolution == direct O(L^2) convolution == recurrent ZOH scan of the diagonal SSM (float64,
lengths that are and are not powers of two); both directions of the layer against anti-causal / causal scans
without any flip; whole-model parity with an independent implementation of the BiGS layer (arXiv 2212.10544 §4) that reads a random state
dict in the official key layout (loaded into ours through the converter); converter errors; padding semantics
(mask => real positions equal the unpadded run; no mask => they differ); the BiGS-large parameter count (346 M);
kernel caching; save/load round trips; bf16 autocast with a float32 kernel; registry; a short MLM run on
WikiText-2 that must reduce the loss.
"""
import math
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import mlp_vision.layers as layers
import mlp_vision.text as mt
from mlp_vision.layers.ssm import BidirectionalGatedSSM, S4DKernel, S4DLayer, fast_fft_len
from reference.ssm import fft_causal_conv, s4d_conv
from mlp_vision.text.bigs import (
    BiGSConfig, BiGSForMaskedLM, BiGSForSequenceClassification, bigs_config_from_official, bigs_param_groups,
    convert_official_bigs_state_dict,
)

from _helpers import n_params

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WIKITEXT = os.path.join(REPO_ROOT, '..', 'shared', 'data', 'wikitext-2', 'valid.txt')

# exact count of bigs_large_512 (module docstring of mlp_vision.text.bigs); the paper says 346 M
BIGS_LARGE_512_PARAMS = 346_707_350








# ----------------------------------------------------------------------------------- independent references

def direct_causal_conv(u, k):
    """y[b, t, c] = sum_{j <= t} k[t - j] u[b, j, c] by an explicit lower-triangular Toeplitz matrix. u (B, L, C)."""
    length = u.shape[1]
    t = torch.arange(length)
    lag = t[:, None] - t[None, :]
    k2 = k if k.dim() == 2 else k[:, None]  # (L, C | 1)
    toeplitz = torch.where((lag >= 0)[..., None], k2[lag.clamp(min=0)], torch.zeros((), dtype=k.dtype))  # (L, L, C)
    return torch.einsum('tjc,bjc->btc', toeplitz, u)


def zoh_params(log_step, a_re, a_im, c_pairs):
    """ZOH discretisation of x' = A x + 1 u (diagonal A): A_bar = exp(dt A), B_bar = (exp(dt A) - 1) / A."""
    dt = torch.exp(log_step.double())
    a = torch.complex(a_re.double().clamp(max=-1e-4), a_im.double())
    c = torch.complex(c_pairs[:, 0].double(), c_pairs[:, 1].double())
    a_bar = torch.exp(dt * a)
    return a_bar, (a_bar - 1) / a, c


def scan_ssm(u, log_step, a_re, a_im, c_pairs, d, reverse=False):
    """Recurrent S4D: x_k = A_bar x_{k-1} + B_bar u_k, y_k = Re(sum_n C_n x_k) + D u_k, one SSM for all channels.

    ``reverse=True`` runs the same recurrence from the last position to the first (anti-causal). u: (B, L, C).
    """
    a_bar, b_bar, c = zoh_params(log_step, a_re, a_im, c_pairs)
    bsz, length, ch = u.shape
    x = torch.zeros(bsz, ch, a_bar.shape[0], dtype=torch.complex128)
    y = torch.empty_like(u)
    order = range(length - 1, -1, -1) if reverse else range(length)
    for k in order:
        x = a_bar * x + b_bar * u[:, k, :, None]
        y[:, k] = (x * c).sum(-1).real + d * u[:, k]
    return y


def spec_kernel(log_step, a_re, a_im, c_pairs, length):
    """The S4D kernel (arXiv 2206.11893; BiGS arXiv 2212.10544 §4): K[l] = Re(sum_n C_n (exp(dt A_n) - 1) / A_n exp(dt A_n l)), float64."""
    a_bar, b_bar, c = zoh_params(log_step, a_re, a_im, c_pairs)
    l = torch.arange(length, dtype=torch.float64)
    return (c[:, None] * b_bar[:, None] * torch.exp(torch.log(a_bar)[:, None] * l)).sum(0).real


def official_state_dict(vocab=40, dim=16, inter=24, n_layers=2, n_states=6, positions=32, types=2, seed=0,
                        pooler=True, classifier=0, dtype=torch.float64):
    """A random state dict in the official BiGS torch key layout (github.com/jxiw/BiGS, BiGS/modeling_bigs.py)."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape, std=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * std).to(dtype)

    def linear(prefix, d_out, d_in):
        sd[f'{prefix}.weight'] = randn(d_out, d_in, std=d_in ** -0.5)
        sd[f'{prefix}.bias'] = randn(d_out, std=0.1)

    def norm(prefix, d):
        sd[f'{prefix}.weight'] = 1 + randn(d, std=0.1)
        sd[f'{prefix}.bias'] = randn(d, std=0.1)

    sd = {}
    sd['bigs.embeddings.position_ids'] = torch.arange(positions).expand(1, -1)  # persistent buffer upstream
    sd['bigs.embeddings.word_embeddings.weight'] = randn(vocab, dim)
    sd['bigs.embeddings.position_embeddings.weight'] = randn(positions, dim, std=0.5)
    sd['bigs.embeddings.token_type_embeddings.weight'] = randn(types, dim, std=0.5)
    norm('bigs.embeddings.LayerNorm', dim)
    for i in range(n_layers):
        p = f'bigs.encoder.layer.{i}'
        norm(f'{p}.LayerNorm', dim)
        for ssm in ('fs4', 'bs4'):
            sd[f'{p}.{ssm}.D'] = randn(1)
            lo, hi = math.log(0.01), math.log(1.0)
            sd[f'{p}.{ssm}.kernel.log_step'] = (lo + (hi - lo) * torch.rand(1, generator=g, dtype=torch.float64)
                                                ).to(dtype)
            sd[f'{p}.{ssm}.kernel.A_re'] = -(0.05 + torch.rand(n_states, generator=g, dtype=torch.float64)).to(dtype)
            sd[f'{p}.{ssm}.kernel.A_im'] = (math.pi * torch.arange(n_states) + randn(n_states, std=0.1)).to(dtype)
            sd[f'{p}.{ssm}.kernel.C'] = randn(n_states, 2, std=0.5 ** 0.5)
        linear(f'{p}.dv', inter, dim)
        for name in ('du_forward', 'du_backward', 'duc_forward', 'duc_backward'):
            linear(f'{p}.{name}', dim, dim)
        linear(f'{p}.dol', inter, dim)
        linear(f'{p}.do', dim, inter)
    if pooler:
        linear('bigs.pooler.dense', dim, dim)
    linear('cls.predictions.transform.dense', dim, dim)
    norm('cls.predictions.transform.LayerNorm', dim)
    sd['cls.predictions.bias'] = randn(vocab, std=0.1)
    sd['cls.predictions.decoder.weight'] = sd['bigs.embeddings.word_embeddings.weight']  # tied upstream
    sd['cls.predictions.decoder.bias'] = sd['cls.predictions.bias']
    if classifier:
        linear('classifier', classifier, dim)
    return sd


def reference_mlm_logits(sd, input_ids, token_type_ids=None, eps=1e-12, layer_gelu='none'):
    """The BiGS model (arXiv 2212.10544 §4) written out from the official keys: embeddings, layers (direct O(L^2) SSM convolutions), MLM head."""
    def gelu(x):
        return F.gelu(x, approximate=layer_gelu)

    def lin(x, prefix):
        return x @ sd[f'{prefix}.weight'].T + sd[f'{prefix}.bias']

    def ln(x, prefix):
        return F.layer_norm(x, x.shape[-1:], sd[f'{prefix}.weight'], sd[f'{prefix}.bias'], eps)

    def ssm(u, prefix):
        k = spec_kernel(sd[f'{prefix}.kernel.log_step'], sd[f'{prefix}.kernel.A_re'], sd[f'{prefix}.kernel.A_im'],
                        sd[f'{prefix}.kernel.C'], u.shape[1])
        return direct_causal_conv(u, k) + sd[f'{prefix}.D'] * u

    length = input_ids.shape[1]
    if token_type_ids is None:
        token_type_ids = torch.zeros_like(input_ids)
    x = (sd['bigs.embeddings.word_embeddings.weight'][input_ids]
         + sd['bigs.embeddings.position_embeddings.weight'][:length]
         + sd['bigs.embeddings.token_type_embeddings.weight'][token_type_ids])
    x = ln(x, 'bigs.embeddings.LayerNorm')
    i = 0
    while f'bigs.encoder.layer.{i}.dv.weight' in sd:
        p = f'bigs.encoder.layer.{i}'
        h = ln(x, f'{p}.LayerNorm')
        v = gelu(lin(h, f'{p}.dv'))
        u_f = gelu(lin(h, f'{p}.du_forward'))
        u_b = gelu(lin(torch.flip(h, [1]), f'{p}.du_backward'))
        s_f = ssm(u_f, f'{p}.fs4')
        s_b = ssm(u_b, f'{p}.bs4')
        g = lin(s_f, f'{p}.duc_forward') * torch.flip(lin(s_b, f'{p}.duc_backward'), [1])
        x = x + lin(gelu(lin(g, f'{p}.dol')) * v, f'{p}.do')
        i += 1
    h = ln(F.gelu(lin(x, 'cls.predictions.transform.dense')), 'cls.predictions.transform.LayerNorm')
    return h @ sd['bigs.embeddings.word_embeddings.weight'].T + sd['cls.predictions.bias']


def small_config(**kw):
    cfg = dict(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_ssm_states=6,
               max_position_embeddings=32, hidden_dropout_prob=0.0, classifier_dropout=0.0)
    cfg.update(kw)
    return BiGSConfig(**cfg)


# ---------------------------------------------------------------------------------------- FFT / kernel / scan

def test_fast_fft_len():
    assert [fast_fft_len(n) for n in (1, 2, 7, 14, 200, 256, 257, 1024, 8193)] == [1, 2, 8, 15, 200, 256, 270,
                                                                                     1024, 8640]
    for n in range(1, 300):
        m = fast_fft_len(n)
        assert m >= n
        r = m
        for p in (2, 3, 5):
            while r % p == 0:
                r //= p
        assert r == 1


@pytest.mark.parametrize('length', [1, 5, 16, 33, 100])
@pytest.mark.parametrize('per_channel', [False, True])
def test_fft_causal_conv_equals_direct(length, per_channel):
    g = torch.Generator().manual_seed(length)
    u = torch.randn(2, length, 3, generator=g, dtype=torch.float64)
    k = torch.randn(length, 3, generator=g, dtype=torch.float64) if per_channel else \
        torch.randn(length, generator=g, dtype=torch.float64)
    y = fft_causal_conv(u, k)
    assert y.dtype == torch.float64 and y.shape == u.shape
    torch.testing.assert_close(y, direct_causal_conv(u, k), rtol=1e-10, atol=1e-10)
    # float32 path: computed in float32 and returned in the input dtype
    y32 = fft_causal_conv(u.float(), k.float())
    assert y32.dtype == torch.float32
    torch.testing.assert_close(y32.double(), y, rtol=1e-4, atol=1e-4)
    # anti-causal mode == flip(causal(flip(u))) == direct anti-causal sum
    y_anti = fft_causal_conv(u, k, anticausal=True)
    torch.testing.assert_close(y_anti, direct_causal_conv(u.flip(1), k).flip(1), rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError):
        fft_causal_conv(u, k[:-1] if length > 1 else torch.zeros(2, dtype=torch.float64))


@pytest.mark.parametrize('length', [1, 6, 9])
def test_bidirectional_fft_conv_function_forward_and_backward(length):
    """The layer's FFT route (a hand-written backward) equals fft_causal_conv both ways, and passes gradcheck."""
    from mlp_vision.layers.ssm import bidirectional_fft_conv
    g = torch.Generator().manual_seed(1)
    u = torch.randn(2, 2, 3, length, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, length, generator=g, dtype=torch.float64, requires_grad=True)
    n_fft = fast_fft_len(2 * length)
    y = bidirectional_fft_conv(u, k, n_fft)
    for group, anticausal in ((0, False), (1, True)):
        ref = fft_causal_conv(u[:, group].transpose(-1, -2), k[group], anticausal=anticausal).transpose(-1, -2)
        torch.testing.assert_close(y[:, group], ref)
    assert torch.autograd.gradcheck(lambda u_, k_: bidirectional_fft_conv(u_, k_, n_fft), (u, k))


def test_bidirectional_fft_conv_keeps_its_bf16_input_not_the_spectrum():
    """Under bf16 the FFT route transforms in float32 but keeps only the bf16 input (and the (2, L) kernels) for
    the backward pass; its input gradient comes back in bf16 and equals the float32 computation's, rounded once."""
    from mlp_vision.layers.ssm import bidirectional_fft_conv
    g = torch.Generator().manual_seed(2)
    u32 = torch.randn(2, 2, 8, 64, generator=g)
    k = torch.randn(2, 64, generator=g)
    n_fft = fast_fft_len(2 * 64)
    u16 = u32.bfloat16().requires_grad_()
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        y = bidirectional_fft_conv(u16, k, n_fft)
    assert y.dtype == torch.float32
    assert sorted((tuple(t.shape), t.dtype) for t in kept) == sorted(
        [((2, 2, 8, 64), torch.bfloat16), ((2, 64), torch.float32)])
    grad = torch.randn(y.shape, generator=g)
    y.backward(grad)
    u_ref = u16.detach().float().requires_grad_()
    bidirectional_fft_conv(u_ref, k, n_fft).backward(grad)
    assert u16.grad.dtype == torch.bfloat16 and torch.equal(u16.grad, u_ref.grad.bfloat16())


def test_fft_conv_ops_pass_opcheck():
    """The FFT route's forward and backward are custom ops: schema, autograd registration, fake (meta) outputs of
    the real shapes and strides, and the same results when AOTAutograd runs them (torch.compile) as in eager (a lazily
    conjugated spectrum was read unconjugated there: the anti-causal half came out wrong)."""
    from mlp_vision.layers.ssm import _bidirectional_fft_conv_backward, bidirectional_fft_conv
    g = torch.Generator().manual_seed(3)
    n_fft = fast_fft_len(2 * 9)
    for dtype in (torch.bfloat16, torch.float64):
        u = torch.randn(2, 2, 3, 9, generator=g, dtype=dtype, requires_grad=True)
        k = torch.randn(2, 9, generator=g, dtype=torch.float64 if dtype == torch.float64 else torch.float32,
                        requires_grad=True)
        torch.library.opcheck(bidirectional_fft_conv, (u, k, n_fft))
        grad_y = torch.randn(2, 2, 3, 9, generator=g, dtype=k.dtype)
        for needs in ((True, True), (True, False), (False, True)):
            torch.library.opcheck(_bidirectional_fft_conv_backward, (grad_y, u.detach(), k.detach(), n_fft, *needs))


def _training_step_kept_bytes(fn, layer: nn.Module, x: torch.Tensor, autocast: bool):
    """Output, input and parameter gradients of one training step of ``fn`` (``layer`` or a compiled ``layer``), and
    the bytes of the distinct storages saved for its backward pass but the weights (and their casts)."""
    weight_shapes = {s for p in layer.parameters() for s in (tuple(p.shape), tuple(p.shape[::-1]))}
    kept = {}

    def pack(t):
        if tuple(t.shape) not in weight_shapes:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    layer.zero_grad()
    x.grad = None
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
        y = fn(x)
    y.float().pow(2).sum().backward()
    return [y.detach().float(), x.grad] + [p.grad for p in layer.parameters()], sum(kept.values())


@pytest.mark.parametrize('autocast', [False, True])
def test_compiled_fft_route_equals_eager_and_keeps_no_more(autocast):
    """torch.compile (one graph, through AOTAutograd's partitioner) of a training step on the FFT route: in float32
    the same outputs and gradients as eager up to float rounding; under bf16 autocast no more kept for the backward
    pass than eager keeps (traced through, the partitioner kept u's complex float32 spectrum instead of u; with v
    computed before the SSMs, v's float32 upcast instead of v)."""
    torch.manual_seed(0)
    layer = BidirectionalGatedSSM(32, 96, conv_impl='fft')
    x = torch.randn(2, 40, 32, requires_grad=True)
    eager, eager_bytes = _training_step_kept_bytes(layer, layer, x, autocast)
    # AOTAutograd with inductor's decompositions and min-cut partitioner, without its code generation (the slow part)
    compiled_layer = torch.compile(layer, fullgraph=True, backend='aot_eager_decomp_partition')
    compiled, compiled_bytes = _training_step_kept_bytes(compiled_layer, layer, x, autocast)
    if autocast:
        assert compiled_bytes <= eager_bytes
    else:
        for a, b in zip(eager, compiled):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5 * a.abs().max().item())


@pytest.mark.parametrize('anticausal', [False, True])
def test_gradients_through_fft_and_kernel(anticausal):
    g = torch.Generator().manual_seed(0)
    u = torch.randn(1, 5, 2, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(5, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda u_, k_: fft_causal_conv(u_, k_, anticausal=anticausal), (u, k),
                                    fast_mode=True)
    ssm = S4DLayer(num_states=3).double()
    params = [ssm.D, ssm.kernel.log_step, ssm.kernel.A_re, ssm.kernel.A_im, ssm.kernel.C]  # kernel built in the graph

    def ssm_fn(d, *kernel_params):  # causal_conv(u, K) + D u, gradients to D and through the kernel's construction
        k = torch.func.functional_call(ssm.kernel, dict(zip(['log_step', 'A_re', 'A_im', 'C'], kernel_params)),
                                       (u.shape[-2],))
        return fft_causal_conv(u.detach(), k, anticausal=anticausal) + d * u.detach()

    assert torch.autograd.gradcheck(ssm_fn, tuple(p.detach().clone().requires_grad_() for p in params),
                                    fast_mode=True)


def test_kernel_init_and_official_shapes():
    torch.manual_seed(0)
    kern = S4DKernel(num_states=64)
    shapes = {n: tuple(p.shape) for n, p in kern.named_parameters()}
    assert shapes == {'log_step': (1,), 'A_re': (64,), 'A_im': (64,), 'C': (64, 2)}
    assert math.log(0.01) <= kern.log_step.item() <= math.log(1.0)
    assert torch.all(kern.A_re == -0.5)
    torch.testing.assert_close(kern.A_im, math.pi * torch.arange(64, dtype=torch.float32))
    big = S4DKernel(num_states=4096)
    assert abs(big.C.std().item() - math.sqrt(0.5)) < 0.03
    layer = S4DLayer(num_states=64)
    assert layer.D.shape == (1,) and layer.D.item() == 1.0


@pytest.mark.parametrize('length', [9, 16, 37])
def test_kernel_matches_spec_formula(length):
    torch.manual_seed(1)
    kern = S4DKernel(num_states=8).double()
    with torch.no_grad():
        kern.A_re.uniform_(-1.0, 0.3)  # some entries > -1e-4 exercise the clamp
    k = kern(length)
    assert k.shape == (length,) and k.dtype == torch.float64
    torch.testing.assert_close(k, spec_kernel(kern.log_step, kern.A_re, kern.A_im, kern.C, length),
                               rtol=1e-10, atol=1e-12)
    assert S4DKernel(num_states=8)(length).dtype == torch.float32


@pytest.mark.parametrize('length', [1, 8, 21])
def test_ssm_layer_equals_recurrent_scan(length):
    torch.manual_seed(length)
    ssm = S4DLayer(num_states=8).double()
    with torch.no_grad():
        ssm.D.normal_()
    u = torch.randn(2, length, 5, dtype=torch.float64)
    k = ssm.kernel
    ref = scan_ssm(u, k.log_step, k.A_re, k.A_im, k.C, ssm.D)
    torch.testing.assert_close(s4d_conv(ssm, u), ref, rtol=1e-9, atol=1e-9)


def _scan_reference_layer(layer: BidirectionalGatedSSM, x):
    """The BiGS layer with both SSMs as explicit recurrences and no flips: the backward branch is the same ZOH
    recurrence run from the last position to the first on GELU(h W_ub) in the original order."""
    h = layer.norm(x)
    v = F.gelu(layer.value_proj(h))
    u_f = F.gelu(layer.forward_in_proj(h))
    w_b = F.gelu(layer.backward_in_proj(h))  # original order
    kf, kb = layer.ssm_forward.kernel, layer.ssm_backward.kernel
    s_f = scan_ssm(u_f, kf.log_step, kf.A_re, kf.A_im, kf.C, layer.ssm_forward.D)
    s_b = scan_ssm(w_b, kb.log_step, kb.A_re, kb.A_im, kb.C, layer.ssm_backward.D, reverse=True)
    g = layer.forward_out_proj(s_f) * layer.backward_out_proj(s_b)
    return x + layer.out_proj(F.gelu(layer.gate_proj(g)) * v)


@pytest.mark.parametrize('length', [7, 16])
def test_layer_both_directions_match_scans(length):
    torch.manual_seed(0)
    layer = BidirectionalGatedSSM(12, 20, num_states=6).double()
    for m in layer.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.3)
    with torch.no_grad():
        layer.ssm_forward.D.fill_(0.3)
        layer.ssm_backward.D.fill_(-0.7)
    x = torch.randn(2, length, 12, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), _scan_reference_layer(layer, x), rtol=1e-9, atol=1e-9)
    # each direction really is one-sided: perturbing the last token changes the forward branch only there
    # (checked through s_f), and the first token changes the backward branch only there
    with torch.no_grad():
        h = layer.norm(x)
        s_f = s4d_conv(layer.ssm_forward, F.gelu(layer.forward_in_proj(h)))
        x2 = x.clone()
        x2[:, -1] += 1.0
        s_f2 = s4d_conv(layer.ssm_forward, F.gelu(layer.forward_in_proj(layer.norm(x2))))
        torch.testing.assert_close(s_f[:, :-1], s_f2[:, :-1], rtol=0, atol=1e-12)
        s_b = s4d_conv(layer.ssm_backward, F.gelu(layer.backward_in_proj(h.flip(1)))).flip(1)
        x3 = x.clone()
        x3[:, 0] += 1.0
        s_b3 = s4d_conv(layer.ssm_backward, F.gelu(layer.backward_in_proj(layer.norm(x3).flip(1)))).flip(1)
        torch.testing.assert_close(s_b[:, 1:], s_b3[:, 1:], rtol=0, atol=1e-12)


def test_layer_mask_exact_for_right_and_left_padding():
    torch.manual_seed(0)
    layer = BidirectionalGatedSSM(8, 16, num_states=4).double()
    n, pad = 9, 5
    x = torch.randn(1, n, 8, dtype=torch.float64)
    ref = layer(x)
    junk = torch.randn(1, pad, 8, dtype=torch.float64) * 3
    right = torch.cat([x, junk], 1)
    left = torch.cat([junk, x], 1)
    m_right = torch.tensor([[True] * n + [False] * pad])
    m_left = m_right.flip(1)
    torch.testing.assert_close(layer(right, m_right)[:, :n], ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(layer(left, m_left)[:, pad:], ref, rtol=1e-10, atol=1e-10)
    assert not torch.allclose(layer(right)[:, :n], ref, atol=1e-6)  # unmasked: the pads leak in


def test_auto_conv_impl_depends_only_on_device_dtype_and_length():
    """conv_impl='auto': the Triton kernel on CUDA from TRITON_MIN_LEN tokens (where triton is installed and the
    dtype is one it multiplies) until the chunked route pays, else the dense Toeplitz GEMM up to DIRECT_MAX_LEN and FFTs beyond, as before."""
    from types import SimpleNamespace
    from mlp_vision.layers.ssm import DIRECT_MAX_LEN, TRITON_MIN_LEN, auto_conv_impl
    bf16 = torch.bfloat16
    for dtype in (bf16, torch.float16, torch.float32):
        assert auto_conv_impl('cuda', dtype, TRITON_MIN_LEN, True) == 'triton'
        assert auto_conv_impl('cuda', dtype, 2048, True) == 'triton'
        assert auto_conv_impl('cuda', dtype, 16384, True) == 'chunked'  # tests/test_ssm_chunked.py
    below = TRITON_MIN_LEN - 1
    assert auto_conv_impl('cuda', bf16, below, True) == ('direct' if below <= DIRECT_MAX_LEN else 'fft')
    assert auto_conv_impl('cuda', bf16, 4096, False) == 'fft'  # no triton
    assert auto_conv_impl('cuda', torch.float64, 4096, True) == 'fft'  # the kernel has no float64 products
    assert auto_conv_impl('cuda', torch.float64, 128, True) == 'direct'
    for device_type in ('cpu', 'meta', 'mps'):
        assert auto_conv_impl(device_type, bf16, 4096, True) == 'fft'
        assert auto_conv_impl(device_type, bf16, DIRECT_MAX_LEN, True) == 'direct'
        assert auto_conv_impl(device_type, bf16, DIRECT_MAX_LEN + 1, True) == 'fft'
    assert auto_conv_impl('cuda', bf16, 300, True, direct_max_len=256, triton_min_len=512) == 'fft'
    assert auto_conv_impl('cuda', bf16, 512, True, direct_max_len=256, triton_min_len=512) == 'triton'
    # the layer asks it with its class thresholds and the input's device type, dtype and length
    layer = BidirectionalGatedSSM(8, 16, num_states=4)
    cuda_input = SimpleNamespace(device=torch.device('cuda'), dtype=bf16, shape=(2, TRITON_MIN_LEN, 8))
    assert layer.conv_route(cuda_input) == ('triton' if layers.longconv_triton.has_triton('cuda') else 'fft')
    assert layer.conv_route(torch.zeros(1, DIRECT_MAX_LEN, 8)) == 'direct'
    assert layer.conv_route(torch.zeros(1, TRITON_MIN_LEN + DIRECT_MAX_LEN, 8)) == 'fft'
    layer.conv_impl = 'fft'
    assert layer.conv_route(cuda_input) == 'fft'  # an explicit route is taken as it is


def test_autocast_projections_keep_one_copy_of_the_normed_input():
    """Under autocast the layer casts LayerNorm's float32 output once, so its three projections keep one bf16 copy
    for the backward pass (autocast's own cast would give each its own); the output is unchanged by it."""
    torch.manual_seed(0)
    layer = BidirectionalGatedSSM(16, 24, num_states=4)
    x = torch.randn(2, 12, 16, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t), \
            torch.autocast('cpu', dtype=torch.bfloat16):
        out = layer(x)
    h = layer.norm(x).detach().bfloat16()
    copies = {t.untyped_storage().data_ptr() for t in saved
              if t.dtype == torch.bfloat16 and t.numel() == h.numel() and torch.equal(t.reshape(h.shape), h)}
    assert len(copies) == 1
    with torch.autocast('cpu', dtype=torch.bfloat16):  # what the three projections compute on autocast's own casts
        h32 = layer.norm(x)
        a_f, a_b, v = (proj(h32) for proj in (layer.forward_in_proj, layer.backward_in_proj, layer.value_proj))
        s_f, s_b = layer._bidirectional_ssm(torch.stack([F.gelu(a_f), F.gelu(a_b)], 2), layer.conv_route(a_f)).unbind(2)
        g = layer.forward_out_proj(s_f) * layer.backward_out_proj(s_b)
        ref = x + layer.out_proj(F.gelu(layer.gate_proj(g)) * F.gelu(v))
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------- caching

def test_kernel_cache():
    kern = S4DKernel(num_states=4)
    k_grad = kern(10)
    assert k_grad.requires_grad and not kern._cache  # training / grad mode: never cached
    kern.eval()
    with torch.no_grad():
        k1 = kern(10)
        assert kern(10) is k1
        assert kern(12) is not k1 and kern(12).shape == (12,)
        kern.A_re.sub_(0.1)  # in-place update (optimizer step / load_state_dict) invalidates
        k2 = kern(10)
        assert k2 is not k1 and not torch.equal(k2, k1)
        torch.testing.assert_close(k2, kern._kernel(10))
    k3 = kern(10)  # grad enabled again: fresh, differentiable
    assert k3.requires_grad
    with torch.no_grad():
        kern(10)
        kern.A_im.data.add_(0.5)  # .data bypasses the version counter: clear_cache() is the documented remedy
        kern.clear_cache()
        torch.testing.assert_close(kern(10), kern._kernel(10))
    kern(10)
    kern.train()
    assert not kern._cache
    kern.load_state_dict({k: v + 0.01 for k, v in kern.state_dict().items()})
    kern.eval()
    with torch.no_grad():
        torch.testing.assert_close(kern(10), kern._kernel(10))
        assert not torch.equal(kern(10), k2)


# ----------------------------------------------------------------------------------- official checkpoints

@pytest.mark.parametrize('gelu', ['none', 'tanh'])
def test_official_state_dict_parity_with_spec_reference(gelu):
    sd = official_state_dict()
    model = BiGSForMaskedLM.from_official(sd, dtype=torch.float64, mask_padding=False, hidden_dropout_prob=0.0,
                                          gelu_approximate=gelu).eval()
    assert model.config.num_hidden_layers == 2 and model.config.num_ssm_states == 6
    ids = torch.randint(0, 40, (2, 19), generator=torch.Generator().manual_seed(0))
    tt = torch.randint(0, 2, (2, 19), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(ids, token_type_ids=tt).logits
    ref = reference_mlm_logits(sd, ids, tt, layer_gelu=gelu)
    torch.testing.assert_close(ours, ref, rtol=1e-9, atol=1e-9)
    other = reference_mlm_logits(sd, ids, tt, layer_gelu='tanh' if gelu == 'none' else 'none')
    assert (ours - other).abs().max() > 1e-6  # the two GELUs are distinguishable here


def test_converter_maps_every_official_key():
    sd = official_state_dict(pooler=True)
    ours = convert_official_bigs_state_dict(sd)
    model = BiGSForMaskedLM(bigs_config_from_official(sd))
    assert set(ours) == set(model.state_dict())
    assert ours['bigs.layers.1.ssm_backward.kernel.C'] is sd['bigs.encoder.layer.1.bs4.kernel.C']
    assert ours['bigs.layers.0.gate_proj.weight'] is sd['bigs.encoder.layer.0.dol.weight']
    assert ours['output_bias'] is sd['cls.predictions.bias']
    # sequence classification keeps the official pooler and a fine-tuned classifier
    sd_cls = official_state_dict(classifier=3)
    ours_cls = convert_official_bigs_state_dict(sd_cls, task='sequence_classification')
    assert ours_cls['pooler.dense.weight'] is sd_cls['bigs.pooler.dense.weight']
    clf = BiGSForSequenceClassification.from_official(sd_cls)
    assert clf.config.num_labels == 3 and torch.equal(clf.classifier.weight, sd_cls['classifier.weight'].float())
    base = convert_official_bigs_state_dict(sd, task='base')
    assert 'layers.0.norm.weight' in base and not any(k.startswith(('bigs.', 'mlm_head', 'pooler')) for k in base)
    # DDP prefix
    assert set(convert_official_bigs_state_dict({f'module.{k}': v for k, v in sd.items()})) == set(ours)


def test_converter_errors():
    sd = official_state_dict(n_layers=1)
    bad = dict(sd)
    del bad['bigs.encoder.layer.0.fs4.kernel.A_im']
    bad['bigs.encoder.layer.0.attention.self.query.weight'] = torch.zeros(1)
    with pytest.raises(ValueError) as e:
        convert_official_bigs_state_dict(bad)
    assert 'bigs.encoder.layer.0.fs4.kernel.A_im' in str(e.value)
    assert 'bigs.encoder.layer.0.attention.self.query.weight' in str(e.value)
    untied = dict(sd)
    untied['cls.predictions.decoder.weight'] = sd['cls.predictions.decoder.weight'] + 1
    with pytest.raises(ValueError, match='untied'):
        convert_official_bigs_state_dict(untied)
    with pytest.raises(ValueError, match='missing'):
        convert_official_bigs_state_dict({'cls.predictions.bias': torch.zeros(3)})
    with pytest.raises(ValueError):
        convert_official_bigs_state_dict(sd, task='token_classification')


@pytest.mark.parametrize('fmt', ['bin', 'safetensors'])
def test_from_official_file(tmp_path, fmt):
    sd = official_state_dict(dtype=torch.float32)
    if fmt == 'bin':
        path = tmp_path / 'pytorch_model.bin'
        torch.save(sd, path)
    else:
        from safetensors.torch import save_file
        path = tmp_path / 'model.safetensors'
        save_file({k: v.clone().contiguous() for k, v in sd.items()}, str(path))  # no shared storage in safetensors
    for src in (path, tmp_path):  # the file or its folder
        model = BiGSForMaskedLM.from_official(src, mask_padding=False, hidden_dropout_prob=0.0).eval()
        ids = torch.randint(0, 40, (1, 12), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            ours = model(ids).logits.double()
        ref = reference_mlm_logits({k: v.double() if v.is_floating_point() else v for k, v in sd.items()}, ids)
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------- padding

def test_model_padding_mask_matches_unpadded_run():
    torch.manual_seed(0)
    # a larger init than BERT's 0.02 so that the pads' effect on the unmasked run is far above rounding
    model = BiGSForMaskedLM(small_config(initializer_range=0.3)).double().eval()
    g = torch.Generator().manual_seed(0)
    lengths, total = (13, 20), 24
    rows = [torch.randint(1, 40, (n,), generator=g) for n in lengths]
    ids = torch.zeros(len(rows), total, dtype=torch.long)  # pad id 0
    mask = torch.zeros(len(rows), total, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
        mask[i, :len(r)] = True
    with torch.no_grad():
        masked = model(ids, attention_mask=mask).logits
        unmasked = model(ids).logits
        for i, r in enumerate(rows):
            alone = model(r[None]).logits[0]
            n = len(r)
            torch.testing.assert_close(masked[i, :n], alone, rtol=1e-10, atol=1e-10)
            assert (unmasked[i, :n] - alone).abs().max() > 1e-4  # without the mask the pads reach real tokens
    # mask_padding=False ignores the mask (official behaviour)
    model.config.mask_padding = False
    with torch.no_grad():
        torch.testing.assert_close(model(ids, attention_mask=mask).logits, unmasked, rtol=0, atol=0)


def test_sequence_classifier_pooler_ignores_pads():
    torch.manual_seed(0)
    clf = BiGSForSequenceClassification(small_config(num_labels=3)).double().eval()
    ids = torch.randint(1, 40, (1, 10))
    padded = torch.cat([ids, torch.zeros(1, 6, dtype=torch.long)], 1)
    mask = torch.cat([torch.ones(1, 10, dtype=torch.bool), torch.zeros(1, 6, dtype=torch.bool)], 1)
    with torch.no_grad():
        torch.testing.assert_close(clf(padded, attention_mask=mask).logits, clf(ids).logits, rtol=1e-10, atol=1e-10)
    out = clf(padded, attention_mask=mask, labels=torch.tensor([2]))
    assert out.logits.shape == (1, 3) and torch.isfinite(out.loss)
    reg = BiGSForSequenceClassification(small_config(num_labels=1))
    assert torch.isfinite(reg(ids, labels=torch.tensor([0.5])).loss)


# ------------------------------------------------------------------------------------ registry and counts

def test_registry_and_param_count():
    assert {'bigs_large_128', 'bigs_large_512', 'bigs_large_1024', 'bigs_large_4096', 'bigs_small'} <= set(
        mt.list_models('bigs_*'))
    assert mt.model_config('bigs_large_4096')['max_position_embeddings'] == 4096
    model = mt.create_model('bigs_large_512', device='meta')
    assert isinstance(model, BiGSForMaskedLM)
    n = n_params(model)
    assert n == BIGS_LARGE_512_PARAMS
    assert abs(n / 346e6 - 1) < 0.005
    # per-layer accounting of the module docstring
    d, di, N = 1024, 3072, 64
    per_layer = 2 * d + 2 * (d + 1) * di + 4 * (d + 1) * d + (di + 1) * d + 2 * (2 + 4 * N)
    assert n_params(model.bigs.layers[0]) == per_layer == 13_645_316
    clf = mt.create_model('bigs_large_128', task='sequence_classification', num_labels=3, device='meta')
    assert isinstance(clf, BiGSForSequenceClassification)


def test_meta_forward_for_shape_and_flop_tools():
    # complexity tools build the large models on 'meta' and run them (autocast does not exist there)
    model = mt.create_model('bigs_large_128', num_hidden_layers=2, device='meta').eval()
    ids = torch.zeros(1, 128, dtype=torch.long, device='meta')
    assert model(ids).logits.shape == (1, 128, 30522)
    with torch.no_grad():
        assert model.bigs(ids).last_hidden_state.shape == (1, 128, 1024)
    assert fast_fft_len(torch.tensor(256)) == 256  # sizes are 0-dim tensors under the JIT tracer


def test_shared_layer_class():
    assert layers.BidirectionalGatedSSM is BidirectionalGatedSSM
    model = BiGSForMaskedLM(small_config())
    assert all(type(l) is BidirectionalGatedSSM for l in model.bigs.layers)


def test_bigs_small_forward_backward(single_thread):
    torch.manual_seed(0)
    model = mt.create_model('bigs_small')
    tok = mt.byte_tokenizer()
    assert model.config.vocab_size == tok.vocab_size and model.config.pad_token_id == tok.pad_token_id
    ids = torch.randint(0, 256, (2, 40))
    out = model(ids, attention_mask=torch.ones_like(ids), labels=ids)
    assert out.logits.shape == (2, 40, 260) and torch.isfinite(out.loss)
    out.loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
    assert model.bigs.layers[0].ssm_backward.kernel.A_im.grad.abs().sum() > 0
    with pytest.raises(ValueError):
        model(torch.zeros(1, 513, dtype=torch.long))


def test_save_load_round_trip(tmp_path):
    torch.manual_seed(0)
    model = BiGSForMaskedLM(small_config()).eval()
    ids = torch.randint(0, 40, (2, 11))
    with torch.no_grad():
        ref = model(ids).logits
    model.save_pretrained(str(tmp_path))
    for loaded in (BiGSForMaskedLM.from_pretrained(str(tmp_path)), mt.from_pretrained(str(tmp_path))):
        assert type(loaded) is BiGSForMaskedLM
        loaded.eval()
        with torch.no_grad():
            torch.testing.assert_close(loaded(ids).logits, ref, rtol=0, atol=0)
    clf = BiGSForSequenceClassification.from_pretrained(str(tmp_path), num_labels=3)
    torch.testing.assert_close(clf.bigs.layers[1].ssm_forward.kernel.C, model.bigs.layers[1].ssm_forward.kernel.C)
    assert clf(ids).logits.shape == (2, 3)


def test_autocast_bf16_kernel_stays_float32(single_thread):
    torch.manual_seed(0)
    model = BiGSForMaskedLM(small_config())
    kernel_dtypes = []
    for m in model.modules():
        if isinstance(m, S4DKernel):
            m.register_forward_hook(lambda mod, args, out: kernel_dtypes.append(out.dtype))
    ids = torch.randint(0, 40, (2, 17))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = model(ids, labels=ids)
    assert kernel_dtypes and all(dt == torch.float32 for dt in kernel_dtypes)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert model.bigs.layers[0].ssm_forward.kernel.log_step.grad.dtype == torch.float32
    with torch.no_grad():
        ref = model(ids).logits
    torch.testing.assert_close(out.logits.float(), ref, rtol=0.1, atol=0.15)
    # the FFT convolution under autocast: float32 inside, input dtype out
    u = torch.randn(1, 9, 4).bfloat16()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert fft_causal_conv(u, torch.randn(9)).dtype == torch.bfloat16


# ---------------------------------------------------------------------------------- training on real text

def test_mlm_training_on_wikitext_reduces_loss(single_thread):
    if not os.path.exists(WIKITEXT):
        pytest.skip(f'WikiText-2 not found at {os.path.normpath(WIKITEXT)} '
                    '(../shared/data/wikitext-2/valid.txt relative to the repo root)')
    with open(WIKITEXT, encoding='utf-8') as f:
        text = f.read()
    tok = mt.byte_tokenizer()
    data = torch.tensor(tok.encode(text, add_special_tokens=False), dtype=torch.long)
    n = int(0.9 * len(data))
    train, val = data[:n], data[n:]
    torch.manual_seed(0)
    T, B, steps = 64, 16, 40
    model = mt.create_model('bigs_small', hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                            num_ssm_states=16, max_position_embeddings=T, hidden_dropout_prob=0.0)
    groups = bigs_param_groups(model, weight_decay=0.05)  # the BiGS optimizer settings (docs/training.md), larger lr for a short run
    assert sum(len(g['params']) for g in groups) == len(list(model.parameters()))
    assert any(p is model.output_bias for p in groups[1]['params'])
    opt = torch.optim.AdamW(groups, lr=3e-3, betas=(0.9, 0.98), eps=1e-6)
    g = torch.Generator().manual_seed(0)

    def batch(split):
        ix = torch.randint(len(split) - T, (B,), generator=g)
        x = torch.stack([split[i:i + T] for i in ix])
        masked = torch.rand(x.shape, generator=g) < 0.15
        labels = torch.where(masked, x, torch.full_like(x, -100))
        return torch.where(masked, torch.full_like(x, tok.mask_token_id), x), labels

    vx, vy = batch(val)
    model.eval()
    with torch.no_grad():
        val0 = model(vx, labels=vy).loss.item()
    model.train()
    for _ in range(steps):
        x, y = batch(train)
        loss = model(x, labels=y).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        val1 = model(vx, labels=vy).loss.item()
    # starts near ln(260) = 5.56; byte unigram statistics alone are worth ~2 nats
    assert val0 > 5.0, val0
    print(f'held-out masked-LM loss {val0:.3f} -> {val1:.3f} after {steps} steps')
    assert val1 < val0 - 1.5, (val0, val1)
