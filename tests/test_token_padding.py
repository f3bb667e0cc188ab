""" Token padding of the SGU and Mixer token GEMMs (issue 34 item 1): the same function, gradients and state dict.

The Spatial Gating Unit (gMLP, arXiv 2105.08050 §2) and Mixer's token MLP (arXiv 2105.01601 §2) contract the token
axis of a CUDA input padded with zeros to a multiple of ``token_multiple`` (default 8); CPU inputs are not padded
(issue 45 item 4). One function decides from the input's device, ``token_multiple_on``: its CUDA decision is tested
directly, and the padded path is run on the CPU by the ``pad_as_on_cuda`` fixture, which makes the modules take that
CUDA decision for their CPU inputs (the test patches the module-level name; the model has no switch). Checked against
the unpadded modules (``token_multiple=1``, same parameters) and against plain formulas written with ``einsum`` /
``F.linear``; whether the padding happens is read from PyTorch's public FLOP counter (the padded GEMM does more
multiply-adds).
"""
import pytest
import timm
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import mlp_vision  # noqa: F401  (registers the models with timm)
from mlp_vision.layers import GatedMLPBlock, MixerBlock, SpatialGatingUnit, TokenLinear
from mlp_vision.layers import gating, linear
from mlp_vision.layers.linear import token_matmul, token_multiple_on, token_padding, tokens_padded_to

from _helpers import randomize_


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _as_on_cuda(device: torch.device, token_multiple: int) -> int:
    """The decision ``token_multiple_on`` takes for a CUDA input, whatever ``device``."""
    return token_multiple_on(torch.device('cuda'), token_multiple)


@pytest.fixture
def pad_as_on_cuda(monkeypatch):
    """The modules pad their CPU inputs as they pad CUDA ones (the padded path, run without a GPU)."""
    for module in (linear, gating):
        monkeypatch.setattr(module, 'token_multiple_on', _as_on_cuda)
    torch._dynamo.reset()  # no graph compiled with the other decision is reused
    yield
    torch._dynamo.reset()


def _tight(a, b):
    """float32 agreement up to a different summation order of the same terms (padding adds only exact zeros)."""
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6 * max(1., float(b.detach().abs().max())))


def _same_function(padded: nn.Module, unpadded: nn.Module, *inputs):
    """Equal outputs, parameter gradients and input gradients of two modules with the same parameters."""
    ins_a = [t.detach().clone().requires_grad_(t.is_floating_point()) if t is not None else None for t in inputs]
    ins_b = [t.detach().clone().requires_grad_(t.is_floating_point()) if t is not None else None for t in inputs]
    y_a, y_b = padded(*ins_a), unpadded(*ins_b)
    _tight(y_a, y_b)
    g = torch.randn(y_a.shape)
    y_a.backward(g)
    y_b.backward(g)
    for (name, p_a), p_b in zip(padded.named_parameters(), unpadded.parameters()):
        assert p_a.shape == p_b.shape, name
        _tight(p_a.grad, p_b.grad)
    for a, b in zip(ins_a, ins_b):
        if a is not None and a.is_floating_point():
            _tight(a.grad, b.grad)


def _bmm_flops(fn) -> int:
    return _flops(fn).get(torch.ops.aten.bmm, 0)


def _flops(fn) -> dict:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_flop_counts()['Global']


# ---------------------------------------------------------------------------------------------------------------
# The decision: CUDA inputs are padded, others are not
# ---------------------------------------------------------------------------------------------------------------
def test_only_cuda_inputs_are_padded():
    assert token_multiple_on(torch.device('cuda'), 8) == 8 and token_multiple_on(torch.device('cuda:1'), 16) == 16
    assert token_multiple_on(torch.device('cuda'), 1) == 1
    for device in ('cpu', 'meta'):
        assert token_multiple_on(torch.empty(0, device=device).device, 8) == 1


def test_cpu_gemms_see_the_unpadded_tokens():
    """The defaults (multiple 8) on CPU inputs: every token GEMM contracts the n tokens as they are."""
    sgu = SpatialGatingUnit(16, 196)
    assert sgu.token_multiple == 8
    assert _bmm_flops(lambda: sgu(torch.randn(2, 196, 16))) == 2 * 2 * 196 * 196 * 8
    block = MixerBlock(16, 20)
    assert block.mlp_tokens.fc1.token_multiple == 8
    # fc1 contracts the 20 tokens (not 24) into 8, fc2 the 8 hidden ones into the 20 tokens
    assert _bmm_flops(lambda: block(torch.randn(3, 20, 16))) == 2 * 3 * 16 * 8 * (20 + 20)
    layer = TokenLinear(13, 9, token_multiple=8)  # the F.linear route (contiguous last axis)
    assert sum(_flops(lambda: layer(torch.randn(2, 3, 13))).values()) == 2 * 6 * 13 * 9


@pytest.mark.parametrize('n,multiple', [(13, 8), (196, 8), (20, 16), (16, 8)])
def test_the_padded_gemm_is_the_unpadded_one(n, multiple):
    """The padded helper the CUDA path runs, called on the CPU: outputs and gradients of the unpadded GEMM."""
    w = torch.randn(n, n, requires_grad=True)
    x = torch.randn(3, n, 5, requires_grad=True)
    y_pad, y = token_matmul(w, x, multiple), token_matmul(w, x, 1)
    _tight(y_pad, y)
    _tight(y, torch.einsum('ij,bjc->bic', w, x))
    g = torch.randn(y.shape)
    grads_pad, grads = torch.autograd.grad(y_pad, (w, x), g), torch.autograd.grad(y, (w, x), g)
    for a, b in zip(grads_pad, grads):
        _tight(a, b)
    flops = _bmm_flops(lambda: token_matmul(w, x, multiple))
    assert flops == 2 * 3 * n * (n + token_padding(n, multiple)) * 5


@pytest.mark.parametrize('n,multiple', [(0, 8), (1, 8), (7, 8), (8, 8), (196, 8), (196, 16), (200, 8), (13, 1)])
def test_token_padding_rounds_up_to_the_multiple(n, multiple):
    pad = token_padding(n, multiple)
    assert 0 <= pad < multiple and (n + pad) % multiple == 0


@pytest.mark.parametrize('bad', [0, -8, 2.5, True, '8'])
def test_bad_token_multiple_is_a_clear_error(bad):
    for make in (lambda: SpatialGatingUnit(8, 5, token_multiple=bad), lambda: TokenLinear(5, 3, token_multiple=bad),
                 lambda: MixerBlock(8, 5, token_multiple=bad), lambda: GatedMLPBlock(8, 5, token_multiple=bad)):
        with pytest.raises(ValueError, match='token_multiple must be an int >= 1'):
            make()


# ---------------------------------------------------------------------------------------------------------------
# Spatial Gating Unit: dense (vision), Toeplitz and causal (text); full and shorter lengths, mask and residual
# ---------------------------------------------------------------------------------------------------------------
def _sgu_pair(mode, n, multiple):
    padded = randomize_(SpatialGatingUnit(16, n, spatial_mode=mode, token_multiple=multiple))
    unpadded = SpatialGatingUnit(16, n, spatial_mode=mode, token_multiple=1)
    unpadded.load_state_dict(padded.state_dict())
    return padded, unpadded


def _plain_sgu(sgu: SpatialGatingUnit, x, res=None, mask=None):
    """s(Z) = Z1 * (W · norm(Z2) + b [+ res]) over the unpadded tokens, with einsum (gMLP eq. 2-3)."""
    u, v = x.chunk(2, dim=-1)
    v = sgu.norm(v)
    if mask is not None:
        v = v * mask.unsqueeze(-1).to(v.dtype)
    length = x.shape[1]
    v = torch.einsum('ij,bjc->bic', sgu.spatial_weight(length), v) + sgu.bias[:length, None]
    return u * (v if res is None else v + res)


@pytest.mark.parametrize('mode', ['dense', 'toeplitz', 'causal'])
@pytest.mark.parametrize('length', [20, 13, 16])
@pytest.mark.parametrize('multiple', [8, 16])
def test_sgu_padding_is_the_same_function(mode, length, multiple, pad_as_on_cuda):
    n = 20
    padded, unpadded = _sgu_pair(mode, n, multiple)
    x = torch.randn(3, length, 16)
    res = torch.randn(3, length, 8)
    mask = torch.rand(3, length) > 0.3
    _same_function(padded, unpadded, x)
    padded.zero_grad()
    unpadded.zero_grad()
    _same_function(padded, unpadded, x, res, mask)
    with torch.no_grad():
        _tight(padded(x, res, mask), _plain_sgu(padded, x, res, mask))
    assert padded.state_dict().keys() == unpadded.state_dict().keys()
    assert padded.weight.shape == ((2 * n - 1,) if mode == 'toeplitz' else (n, n)) and padded.bias.shape == (n,)


def test_sgu_padding_happens_and_only_when_needed(pad_as_on_cuda):
    """Padded (CUDA's decision), the token GEMM contracts the padded axis (FLOPs of L x L_pad x C per sample); a
    multiple length is untouched."""
    sgu = SpatialGatingUnit(16, 196)  # default multiple 8: gMLP's 14 x 14 patches
    assert sgu.token_multiple == 8
    assert _bmm_flops(lambda: sgu(torch.randn(2, 196, 16))) == 2 * 2 * 196 * 200 * 8
    assert _bmm_flops(lambda: sgu(torch.randn(2, 192, 16))) == 2 * 2 * 192 * 192 * 8
    sgu.token_multiple = 1  # an attribute, read at each call
    assert _bmm_flops(lambda: sgu(torch.randn(2, 196, 16))) == 2 * 2 * 196 * 196 * 8


def test_sgu_padding_is_invisible_to_hooks(pad_as_on_cuda):
    sgu = randomize_(SpatialGatingUnit(16, 13))
    seen = []
    sgu.register_forward_hook(lambda m, args, out: seen.append((args[0].shape, out.shape)))
    sgu(torch.randn(2, 13, 16))
    assert seen == [((2, 13, 16), (2, 13, 8))]


@pytest.mark.parametrize('mode,attn_dim', [('dense', 0), ('toeplitz', 8), ('causal', 8)])
def test_gmlp_block_passes_token_multiple_and_keeps_its_function(mode, attn_dim, pad_as_on_cuda):
    padded = randomize_(GatedMLPBlock(16, 20, mlp_ratio=2, spatial_mode=mode, attn_dim=attn_dim, token_multiple=16))
    unpadded = GatedMLPBlock(16, 20, mlp_ratio=2, spatial_mode=mode, attn_dim=attn_dim, token_multiple=1)
    unpadded.load_state_dict(padded.state_dict())
    assert padded.sgu.token_multiple == 16 and GatedMLPBlock(16, 20).sgu.token_multiple == 8
    _same_function(padded.eval(), unpadded.eval(), torch.randn(2, 13, 16))


def test_sgu_scripted_is_eager():
    """TorchScript compiles the device decision (a CPU input: unpadded) and reads the attribute at each call."""
    sgu = randomize_(SpatialGatingUnit(16, 13, spatial_mode='causal')).eval()
    x = torch.randn(2, 13, 16)
    scripted = torch.jit.script(sgu)
    _tight(scripted(x), sgu(x))
    scripted.token_multiple = 1
    _tight(scripted(x), sgu(x))
    assert 'token_multiple_on' in scripted.code


# ---------------------------------------------------------------------------------------------------------------
# TokenLinear and the Mixer block's token MLP
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('layout', ['token_axis_of_bnc', 'channels_last_w', 'contiguous', '2d'])
@pytest.mark.parametrize('bias', [True, False])
def test_token_linear_padding_is_linear(layout, bias, pad_as_on_cuda):
    x = {
        'token_axis_of_bnc': lambda: torch.randn(3, 13, 24).transpose(1, 2),  # Mixer: (B, C, n) view, strided
        'channels_last_w': lambda: torch.randn(2, 5, 13, 24).permute(0, 3, 1, 2),  # sMLP W-mix layout
        'contiguous': lambda: torch.randn(2, 3, 13),  # the F.linear route
        '2d': lambda: torch.randn(7, 13),
    }[layout]()
    padded = TokenLinear(13, 9, bias=bias, token_multiple=8)
    unpadded = TokenLinear(13, 9, bias=bias)  # default 1: the layer sMLPNet uses, unpadded
    unpadded.load_state_dict(padded.state_dict())
    assert unpadded.token_multiple == 1 and padded.weight.shape == (9, 13)
    _same_function(padded, unpadded, x)
    with torch.no_grad():
        _tight(padded(x), F.linear(x, padded.weight, padded.bias))
    strided = layout in ('token_axis_of_bnc', 'channels_last_w')
    assert _bmm_flops(lambda: padded(x)) == (2 * x[..., 0].numel() * 16 * 9 if strided else 0)
    assert sum(_flops(lambda: padded(x)).values()) == 2 * x[..., 0].numel() * 16 * 9  # either route pads


def test_token_linear_padding_keeps_the_output_layout(pad_as_on_cuda):
    x = torch.randn(2, 8, 6, 13).contiguous(memory_format=torch.channels_last)
    y = TokenLinear(13, 13, token_multiple=8)(x)
    assert y.shape == x.shape and y.is_contiguous(memory_format=torch.channels_last)


def test_mixer_block_padding_is_the_same_function(pad_as_on_cuda):
    n = 20
    padded = randomize_(MixerBlock(16, n))
    unpadded = MixerBlock(16, n, token_multiple=1)
    unpadded.load_state_dict(padded.state_dict())
    assert padded.mlp_tokens.fc1.token_multiple == padded.mlp_tokens.fc2.token_multiple == 8
    assert padded.state_dict().keys() == unpadded.state_dict().keys()
    assert padded.mlp_tokens.fc1.weight.shape == (8, n) and padded.mlp_tokens.fc2.weight.shape == (n, 8)
    _same_function(padded.train(), unpadded.train(), torch.randn(3, n, 16))
    x = torch.randn(3, n, 16)
    # fc1 contracts the 24 padded tokens into 8, fc2 the 8 hidden ones (already a multiple) into the 20 tokens
    assert _bmm_flops(lambda: padded(x)) == 2 * 3 * 16 * 8 * (24 + n)


# ---------------------------------------------------------------------------------------------------------------
# Models: the defaults, and the whole model the same function
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('name', ['gmlp_ti', 'mixer_s16'])
def test_models_pad_by_default_and_compute_the_same(name, pad_as_on_cuda):
    # 3 x 4 = 12 tokens; two blocks (every block is built with the same token_multiple)
    model = randomize_(timm.create_model(name, img_size=(48, 64), num_classes=5, num_blocks=2), std=0.1)
    reference = timm.create_model(name, img_size=(48, 64), num_classes=5, num_blocks=2,
                                  block_kwargs={'token_multiple': 1})
    reference.load_state_dict(model.state_dict())
    multiples = {m.token_multiple for m in model.modules() if hasattr(m, 'token_multiple')}
    assert multiples == {8}
    assert {k: v.shape for k, v in model.state_dict().items()} == {
        k: v.shape for k, v in reference.state_dict().items()}
    _same_function(model.train(), reference.train(), torch.randn(2, 3, 48, 64))


def test_tokens_padded_to_sets_and_restores_every_padding_module(pad_as_on_cuda):
    model = timm.create_model('mixer_s16', img_size=48, num_blocks=2)  # 9 tokens
    model.blocks[0].mlp_tokens.fc2.token_multiple = 16
    before = [m.token_multiple for m in model.modules() if isinstance(m, TokenLinear)]
    x = torch.randn(1, 3, 48, 48)
    with pytest.raises(RuntimeError, match='inside'):
        with tokens_padded_to(model, 1):
            assert all(m.token_multiple == 1 for m in model.modules() if isinstance(m, TokenLinear))
            # 2 blocks, fc1 and fc2 each 9 tokens x 256 hidden x 512 channels, 2 FLOPs a multiply-add
            assert _bmm_flops(lambda: model(x)) == 2 * 2 * 512 * 256 * (9 + 9)
            raise RuntimeError('inside')
    assert [m.token_multiple for m in model.modules() if isinstance(m, TokenLinear)] == before == [8, 16, 8, 8]
    with pytest.raises(ValueError, match='token_multiple must be an int >= 1'):
        with tokens_padded_to(model, 0):
            pass


def test_flop_counter_counts_the_unpadded_tokens(pad_as_on_cuda):
    """The project's MAC counts are the papers' (n tokens), not the zeros added for GPU kernels."""
    from mlp_vision.complexity import count_module
    model = timm.create_model('gmlp_ti', img_size=(48, 64), num_blocks=2).eval()  # 12 tokens, padded to 16
    macs, by_op, _, _ = count_module(model, (torch.randn(1, 3, 48, 64),))
    assert by_op['bmm'] == 2 * 12 * 12 * 384  # two SGUs: (12 x 12) @ (12 x 384)
    assert model.blocks[0].sgu.token_multiple == 8


def test_smlpnet_token_linears_stay_unpadded():
    model = timm.create_model('smlpnet_t', embed_dim=8, depths=(1, 1, 1, 1), img_size=32)
    linears = [m for m in model.modules() if isinstance(m, TokenLinear)]
    assert linears and all(m.token_multiple == 1 for m in linears)


@pytest.mark.parametrize('padded', [False, True], ids=['cpu_unpadded', 'padded_as_on_cuda'])
@pytest.mark.parametrize('name', ['gmlp_ti', 'mixer_s16'])
def test_padded_models_work_with_every_tool(name, padded, request):
    """On a CPU input (unpadded) and with CUDA's decision (12 tokens -> 16; the contract tests' 4 x 6 grid is already
    a multiple): one dynamo graph without breaks in training mode, TorchScript trace, torch.export and timm's FX
    extraction give the eager outputs; TorchScript script too on the CPU path (a scripted function is compiled once
    per process, so the patched decision would not be the one compiled)."""
    from timm.models import create_feature_extractor, get_graph_node_names
    if padded:
        request.getfixturevalue('pad_as_on_cuda')
    model = timm.create_model(name, img_size=(48, 64), num_classes=5, num_blocks=2)
    x = torch.randn(2, 3, 48, 64)
    with tokens_padded_to(model, 1):
        unpadded_flops = _bmm_flops(lambda: model(x))
    assert unpadded_flops > 0 and (_bmm_flops(lambda: model(x)) > unpadded_flops) == padded  # padded iff CUDA's
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model.train())(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons
    model.eval()
    with torch.no_grad():
        ref = model(x)
        if not padded:
            _tight(torch.jit.script(model)(x), ref)
        _tight(torch.jit.trace(model, x, check_trace=False)(x), ref)
        _tight(torch.export.export(model, (x,)).module()(x), ref)
        final = get_graph_node_names(model)[1][-1]
        _tight(create_feature_extractor(model, return_nodes=[final])(x)[final], ref)
