""" The model code computes the same function as straightforward formulations (issues 6 and 25).

Each layer and model is checked against a plain implementation of the same parameters: the straightforward
sMLPNet (``tests/reference/smlpnet.py``: 1x1 convs on permuted tensors, concat, fuse), timm's gMLP and Mixer models
and blocks, the straightforward BiGS layer (``tests/reference/bigs.py``) and explicit formulas written here: the
layouts chosen inside the modules (``TokenLinear``'s memory-order GEMM, channels-last sMLPNet, both BiGS directions
in one convolution, in-place GELUs without gradients) change nothing but float32 rounding. Outputs and parameter
gradients must agree to float32 tolerance, in train mode (BatchNorm batch statistics, running-statistics updates)
and eval mode. Nothing here measures time.
"""
import importlib
from functools import partial

import pytest
import timm
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import Mlp
from timm.models.mlp_mixer import MixerBlock as TimmMixerBlock

import mlp_vision  # noqa: F401  (registers the models with timm)
from mlp_vision.layers import AxialSparseMLP, GatedMLPBlock, MixerBlock, SparseMLPTokenMixer

from _helpers import randomize_
from reference.smlpnet import reference_from

_randomize_ = partial(randomize_, std=0.2)

IMG = (64, 96)  # non-square, so H and W cannot be confused


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)





def _close(a, b, rtol=1e-5):
    """Equal to float32 tolerance relative to the output's scale."""
    torch.testing.assert_close(a, b, rtol=rtol, atol=rtol * max(1., float(b.detach().abs().max())))


def _grads(module: nn.Module):
    return {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}


def _assert_grads_close(ours, ref, rename=lambda k: k):
    assert len(ours) == len(ref)
    for name, g in ours.items():
        r = ref[rename(name)]
        _close(g, r.reshape(g.shape), rtol=1e-4)


# ---------------------------------------------------------------------------------------------------------------
# TokenLinear: nn.Linear along a strided token axis, contracted in memory order
# ---------------------------------------------------------------------------------------------------------------
def _strided_inputs():
    """Inputs whose last axis is a token axis of a contiguous tensor (and plain ones), as the models produce."""
    yield torch.randn(3, 20, 24).transpose(1, 2)  # Mixer: (B, C, n) view of (B, n, C)
    cl = torch.randn(2, 5, 6, 24).permute(0, 3, 1, 2)  # channels-last (B, C, H, W) view of (B, H, W, C)
    yield cl  # sMLP W-mix: last axis W, stride C
    yield cl.transpose(2, 3)  # sMLP H-mix: last axis H, stride W*C
    yield torch.randn(1, 4, 5, 6).transpose(-1, -3)  # batch 1 (size-1 axis)
    yield torch.randn(2, 3, 24)  # contiguous: plain F.linear
    yield torch.randn(7, 24)  # 2-D


@pytest.mark.parametrize('case', range(6))
@pytest.mark.parametrize('bias', [True, False])
def test_token_linear_is_linear(case, bias):
    from mlp_vision.layers import TokenLinear
    x = list(_strided_inputs())[case]
    n = x.shape[-1]
    lin = TokenLinear(n, 9, bias=bias)
    x = x.clone(memory_format=torch.preserve_format).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    y, y_ref = lin(x), F.linear(x_ref, lin.weight, lin.bias)
    assert y.shape == y_ref.shape
    _close(y, y_ref)
    g = torch.randn(y.shape)
    gx, *gp = torch.autograd.grad(y, (x, *lin.parameters()), g)
    gx_ref, *gp_ref = torch.autograd.grad(y_ref, (x_ref, *lin.parameters()), g)
    _close(gx, gx_ref, rtol=1e-4)
    for a, r in zip(gp, gp_ref):
        _close(a, r, rtol=1e-4)


def test_token_linear_empty_batch():
    """An empty batch on the strided route gives the empty result F.linear gives (no reshape ambiguity)."""
    from mlp_vision.layers import TokenLinear
    lin = TokenLinear(6, 4)
    x = torch.randn(0, 5, 6, 8).permute(0, 3, 1, 2)  # (0, 8, 5, 6) channels-last view, last axis strided
    y = lin(x)
    assert y.shape == (0, 8, 5, 4) and y.shape == F.linear(x, lin.weight, lin.bias).shape


def test_token_linear_keeps_memory_layout():
    """A token axis of channels-last activations comes back channels-last: no copy on the way out."""
    from mlp_vision.layers import TokenLinear
    x = torch.randn(2, 8, 6, 10).contiguous(memory_format=torch.channels_last)
    y = TokenLinear(10, 10)(x)
    assert y.is_contiguous(memory_format=torch.channels_last)
    y_h = TokenLinear(6, 6)(x.transpose(2, 3)).transpose(2, 3)
    assert y_h.is_contiguous(memory_format=torch.channels_last)


# ---------------------------------------------------------------------------------------------------------------
# sMLP layers against the straightforward formulation
# ---------------------------------------------------------------------------------------------------------------
def _plain_smlp(smlp: AxialSparseMLP, x):
    """Straightforward sMLP: BN -> GELU -> axial Linears on permuted tensors -> concat -> 1x1 fuse conv."""
    x = smlp.act(smlp.norm(x))
    x_h = F.linear(x.transpose(-1, -2), smlp.proj_h.weight, smlp.proj_h.bias).transpose(-1, -2)
    x_w = F.linear(x, smlp.proj_w.weight, smlp.proj_w.bias)
    return F.conv2d(torch.cat([x, x_h, x_w], dim=1), smlp.fuse_conv.weight)


def _plain_token_mixer(mixer: SparseMLPTokenMixer, x):
    return _plain_smlp(mixer.smlp, mixer.conv_dw(mixer.act(mixer.norm(x))))


@pytest.mark.parametrize('train', [False, True])
@pytest.mark.parametrize('channels_last', [False, True])
def test_axial_sparse_mlp_matches_plain(train, channels_last):
    c, h, w = 8, 6, 10
    ours = _randomize_(AxialSparseMLP(c, (h, w))).train(train)
    ref = _randomize_(AxialSparseMLP(c, (h, w))).train(train)  # same values, plain forward
    x = torch.randn(3, c, h, w)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, y_ref = ours(xa), _plain_smlp(ref, xb)
    _close(y, y_ref)
    if train:  # the batch statistics were used and the running statistics updated identically
        _close(ours.norm.running_mean, ref.norm.running_mean)
        _close(ours.norm.running_var, ref.norm.running_var)
    g = torch.randn(y.shape)
    y.backward(g)
    y_ref.backward(g)
    _close(xa.grad, xb.grad, rtol=1e-4)
    _assert_grads_close(_grads(ours), _grads(ref))


@pytest.mark.parametrize('train', [False, True])
def test_token_mixer_matches_plain(train):
    c, h, w = 8, 6, 10
    ours = _randomize_(SparseMLPTokenMixer(c, (h, w))).train(train)
    ref = _randomize_(SparseMLPTokenMixer(c, (h, w))).train(train)
    x = torch.randn(3, c, h, w)
    y, y_ref = ours(x), _plain_token_mixer(ref, x)
    _close(y, y_ref)
    g = torch.randn(y.shape)
    y.backward(g)
    y_ref.backward(g)
    _assert_grads_close(_grads(ours), _grads(ref))


# ---------------------------------------------------------------------------------------------------------------
# whole sMLPNet against the straightforward reference model
# ---------------------------------------------------------------------------------------------------------------
def _smlpnet(**kwargs):
    kwargs = dict(dict(img_size=IMG, embed_dim=16, depths=(1, 2, 1, 1), num_classes=10), **kwargs)
    return _randomize_(timm.create_model('smlpnet_t', **kwargs))


@pytest.mark.parametrize('channels_last', [False, True])
@pytest.mark.parametrize('train', [False, True])
@pytest.mark.parametrize('batch', [2, 17])
def test_smlpnet_matches_reference(train, batch, channels_last):
    """Outputs, parameter gradients and running statistics as the reference's (NCHW, concatenated fuse), for a
    contiguous and a channels-last model and input."""
    ours = _smlpnet().train(train)
    ref = reference_from(ours)
    assert ref.training == train
    x = torch.randn(batch, 3, *IMG)
    x_ours = x
    if channels_last:
        ours, x_ours = ours.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    y, y_ref = ours(x_ours), ref(x)
    assert y.shape == (batch, 10)
    _close(y, y_ref)
    g = torch.randn(y.shape)
    y.backward(g)
    y_ref.backward(g)
    _assert_grads_close(_grads(ours), _grads(ref))
    if train:
        ref_buffers = dict(ref.named_buffers())
        for name, buf in ours.named_buffers():
            if buf.is_floating_point():
                _close(buf, ref_buffers[name])


def test_smlpnet_features_match_reference():
    ours = _smlpnet().eval()
    ref = reference_from(ours)
    x = torch.randn(2, 3, *IMG).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        feats = ours.forward_intermediates(x, intermediates_only=True)
        y = ref.stem(x)
        for stage, feat in zip(ref.stages, feats):
            y = stage(y)
            _close(feat, y)


def test_smlpnet_grad_checkpointing_and_drop_path_match_reference():
    ours = _smlpnet().train()
    ref = reference_from(ours)
    ours.set_grad_checkpointing(True)
    x = torch.randn(2, 3, *IMG)
    y, y_ref = ours(x), ref(x)
    _close(y, y_ref)
    y.sum().backward()
    y_ref.sum().backward()
    _assert_grads_close(_grads(ours), _grads(ref))
    # with drop path in the model (the residual is added outside the token mixer in train mode): eval is the
    # same function as the reference
    dp = _smlpnet(drop_path_rate=0.5).eval()
    ref = reference_from(dp)
    with torch.no_grad():
        _close(dp(x), ref(x))
    dp.train()
    assert dp(x).shape == (2, 10)


# ---------------------------------------------------------------------------------------------------------------
# gMLP block / model
# ---------------------------------------------------------------------------------------------------------------
def _plain_gmlp_block(block: GatedMLPBlock, x, mask=None):
    """The straightforward gMLP block: one fc1, chunk, LayerNorm, W @ v + b, gate, fc2."""
    shortcut = x
    x = block.norm(x)
    res = block.attn(x, mask) if block.attn is not None else None
    z = F.gelu(F.linear(x, block.fc1.weight, block.fc1.bias))
    sgu = block.sgu
    u, v = z.chunk(2, dim=-1)
    v = sgu.norm(v)
    if mask is not None and block.sgu_mask:
        v = v * mask.unsqueeze(-1).to(v.dtype)
    n = x.shape[1]
    v = torch.einsum('ij,bjc->bic', sgu.spatial_weight(n), v) + sgu.bias[:n, None]
    if res is not None:
        v = v + res
    return shortcut + F.linear(u * v, block.fc2.weight, block.fc2.bias)


@pytest.mark.parametrize('mode,attn_dim,sgu_mask', [
    ('dense', 0, False), ('toeplitz', 0, False), ('causal', 0, False), ('toeplitz', 8, True), ('causal', 8, False),
])
@pytest.mark.parametrize('length', [20, 13])
def test_gmlp_block_matches_plain(mode, attn_dim, sgu_mask, length):
    dim, n = 16, 20
    block = _randomize_(GatedMLPBlock(dim, n, mlp_ratio=3, spatial_mode=mode, attn_dim=attn_dim,
                                      sgu_mask=sgu_mask)).eval()
    x = torch.randn(3, length, dim)
    mask = torch.ones(3, length, dtype=torch.bool)
    mask[1, length - 4:] = False
    for m in (None, mask):
        y = block(x, m)
        y_ref = _plain_gmlp_block(block, x, m)
        _close(y, y_ref)
        g = torch.randn(y.shape)
        ga = torch.autograd.grad(y, list(block.parameters()), g, allow_unused=True)
        gb = torch.autograd.grad(y_ref, list(block.parameters()), g, allow_unused=True)
        for a, b in zip(ga, gb):
            assert (a is None) == (b is None)
            if a is not None:
                _close(a, b, rtol=1e-4)


def _timm_filter(name):
    return importlib.import_module(timm.models.model_entrypoint(name).__module__).checkpoint_filter_fn


def _timm_isotropic(ours_name, **kwargs):
    """timm's own gMLP-Ti / Mixer-S architecture (its entry points fix the depth, so build the class directly)."""
    from timm.layers import GatedMlp
    from timm.models.mlp_mixer import MlpMixer, SpatialGatingBlock
    if ours_name.startswith('gmlp'):
        arch = dict(embed_dim=128, mlp_ratio=6, block_layer=SpatialGatingBlock, mlp_layer=GatedMlp)
    else:
        arch = dict(embed_dim=512, mlp_ratio=(0.5, 4.0))
    return MlpMixer(patch_size=16, **arch, **kwargs)


@pytest.mark.parametrize('ours_name', ['gmlp_ti', 'mixer_s16'])
@pytest.mark.parametrize('train', [False, True])
@pytest.mark.parametrize('batch', [2, 48])
def test_isotropic_models_match_timm(ours_name, train, batch):
    kwargs = dict(img_size=IMG, num_classes=10, num_blocks=3)
    theirs = _randomize_(_timm_isotropic(ours_name, **kwargs)).train(train)
    ours = timm.create_model(ours_name, **kwargs).train(train)
    ours.load_state_dict(_timm_filter(ours_name)(theirs.state_dict(), ours))
    x = torch.randn(batch, 3, *IMG)
    y, y_ref = ours(x), theirs(x)
    _close(y, y_ref)
    g = torch.randn(y.shape)
    y.backward(g)
    y_ref.backward(g)
    # gradients, mapped through the same key renaming as the weights
    ref_grads = _timm_filter(ours_name)(_grads(theirs), ours)
    _assert_grads_close(_grads(ours), ref_grads)


# ---------------------------------------------------------------------------------------------------------------
# Mixer block
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('train', [False, True])
def test_mixer_block_matches_timm(train):
    dim, n = 24, 20
    theirs = _randomize_(TimmMixerBlock(dim, n)).train(train)
    ours = MixerBlock(dim, n).train(train)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, n, dim)
    y, y_ref = ours(x), theirs(x)
    _close(y, y_ref)
    y.sum().backward()
    y_ref.sum().backward()
    _assert_grads_close(_grads(ours), _grads(theirs))


def test_mixer_block_other_mlp_layer_keeps_its_linears():
    class OtherMlp(Mlp):
        pass

    block = MixerBlock(16, 12, mlp_layer=OtherMlp)
    assert type(block.mlp_tokens.fc1) is nn.Linear  # only timm's own Mlp gets the TokenLinear swap
    x = torch.randn(2, 12, 16)
    assert block(x).shape == x.shape


# ---------------------------------------------------------------------------------------------------------------
# BiGS layer: one convolution (Toeplitz GEMM or FFT pair) for both directions, no flips
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('conv_impl', ['direct', 'fft', 'auto'])
@pytest.mark.parametrize('length', [128, 77, 1])
@pytest.mark.parametrize('gelu', ['none', 'tanh'])
def test_bigs_layer_matches_straightforward(length, gelu, conv_impl):
    from mlp_vision.layers import BidirectionalGatedSSM
    from reference.bigs import reference_bigs_layer_from
    ours = BidirectionalGatedSSM(48, 80, num_states=8, gelu_approximate=gelu, conv_impl=conv_impl)
    _randomize_(ours)
    ref = reference_bigs_layer_from(ours)
    x = torch.randn(9, length, 48, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    y, y_ref = ours(x), ref(x_ref)
    _close(y, y_ref)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    _close(x.grad, x_ref.grad, rtol=1e-4)
    grads, grads_ref = _grads(ours), _grads(ref)
    assert grads.keys() == grads_ref.keys()
    for name, grad in grads.items():
        # log_step and D are scalars whose gradients sum B * L * d float32 products with cancellation
        _close(grad, grads_ref[name], rtol=1e-3 if grad.numel() == 1 else 1e-4)
    ours.eval()
    ref.eval()
    with torch.inference_mode():  # the cached-kernel path
        _close(ours(x.detach()), ref(x.detach()))


@pytest.mark.parametrize('precision', ['autocast', 'cast'])
@pytest.mark.parametrize('conv_impl', ['direct', 'fft'])
def test_bigs_layer_and_straightforward_run_in_bf16(conv_impl, precision):
    """Both BiGS layers keep the SSM convolution in float32 in bf16 runs (AMP autocast, or the modules and
    inputs cast to bf16 as ``benchmark.py --precision bf16`` does) and agree with float32 to bf16 accuracy.
    Regression: the straightforward layer once sent bf16 activations to rfft, which has no bf16 kernel (CUDA
    autocast does not upcast FFTs; the CPU's does, so the CPU check is the 'cast' case)."""
    from mlp_vision.layers import BidirectionalGatedSSM
    from reference.bigs import reference_bigs_layer_from
    ours = _randomize_(BidirectionalGatedSSM(48, 80, num_states=8, conv_impl=conv_impl))
    ref = reference_bigs_layer_from(ours)
    x = torch.randn(2, 40, 48)
    expected = ref(x).detach()
    if precision == 'autocast':
        with torch.autocast('cpu', dtype=torch.bfloat16):
            y, y_ref = ours(x), ref(x)
    else:
        y, y_ref = ours.bfloat16()(x.bfloat16()), ref.bfloat16()(x.bfloat16())
        assert y.dtype == torch.bfloat16
    assert y.dtype == y_ref.dtype
    for out in (y, y_ref):
        assert float((out.detach().float() - expected).norm() / expected.norm()) < 3e-2


def test_bigs_conv_routes_agree_and_auto_switches(monkeypatch):
    """'direct' (Toeplitz GEMM) and 'fft' compute the same layer; 'auto' takes 'fft' above DIRECT_MAX_LEN."""
    from mlp_vision.layers import BidirectionalGatedSSM, causal_toeplitz
    from reference.ssm import fft_causal_conv
    k, u = torch.randn(40), torch.randn(2, 40, 3)
    for anti in (False, True):
        mat = causal_toeplitz(k, anticausal=anti)
        assert torch.equal(mat, mat.tril() if not anti else mat.triu())
        _close(mat @ u, fft_causal_conv(u, k, anticausal=anti))
    layer = _randomize_(BidirectionalGatedSSM(16, 24, num_states=4))
    x = torch.randn(2, 40, 16)
    outs = {}
    for impl in ('direct', 'fft'):
        layer.conv_impl = impl
        outs[impl] = layer(x)
    _close(outs['direct'], outs['fft'])
    calls = []
    monkeypatch.setattr('mlp_vision.layers.ssm.causal_toeplitz',
                        lambda *a, **kw: calls.append(1) or causal_toeplitz(*a, **kw))
    layer.conv_impl = 'auto'
    monkeypatch.setattr(BidirectionalGatedSSM, 'DIRECT_MAX_LEN', 39)
    layer(x)
    assert not calls  # 40 > 39: FFT
    monkeypatch.setattr(BidirectionalGatedSSM, 'DIRECT_MAX_LEN', 40)
    layer(x)
    assert calls  # 40 <= 40: Toeplitz GEMM
    with pytest.raises(ValueError, match='conv_impl'):
        layer.conv_impl = 'toeplitz'


# ---------------------------------------------------------------------------------------------------------------
# FreshGELU: in place on fresh activations when no gradient is recorded
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('approximate', ['none', 'tanh'])
def test_fresh_gelu_in_place_only_without_grad(approximate):
    from mlp_vision.layers import FreshGELU
    act = FreshGELU(approximate=approximate)
    x = torch.randn(4, 7)
    expected = F.gelu(x, approximate=approximate)
    kept = x.clone()
    y = act(x)  # gradients on: out of place, the input is untouched
    assert torch.equal(y, expected) and torch.equal(x, kept)
    w = x.clone().requires_grad_(True)
    act(w).sum().backward()
    torch.testing.assert_close(w.grad, torch.func.grad(lambda t: F.gelu(t, approximate=approximate).sum())(kept))
    with torch.no_grad():
        y = act(x)
    assert y.data_ptr() == x.data_ptr() and torch.equal(y, expected)  # overwrote its (fresh) input
    scripted = torch.jit.script(FreshGELU(approximate=approximate))
    with torch.inference_mode():
        torch.testing.assert_close(scripted(kept.clone()), expected)


def test_fresh_input_act_swaps_plain_gelu_only():
    from mlp_vision.layers import FreshGELU, fresh_input_act
    assert type(fresh_input_act(nn.GELU(approximate='tanh'))) is FreshGELU
    assert fresh_input_act(nn.GELU(approximate='tanh')).approximate == 'tanh'
    other = nn.SiLU()
    assert fresh_input_act(other) is other
    # a Mixer block with another MLP layer keeps a plain GELU (its inputs are not known to be fresh)
    from timm.layers import GluMlp
    assert type(MixerBlock(16, 8, mlp_layer=GluMlp).mlp_channels.act) is not FreshGELU


@pytest.mark.parametrize('name', ['smlpnet_t', 'gmlp_ti', 'mixer_s16'])
def test_vision_models_same_output_with_and_without_grad(name, single_thread):
    """Eval outputs under inference_mode (in-place GELUs) equal those with gradients on, and the input survives."""
    kwargs = dict(img_size=64) if name != 'smlpnet_t' else dict(img_size=64, depths=(1, 1, 1, 1))
    model = _randomize_(timm.create_model(name, num_classes=5, **kwargs)).eval()
    x = torch.randn(2, 3, 64, 64)
    kept = x.clone()
    with torch.enable_grad():
        expected = model(x)
    with torch.inference_mode():
        out = model(x)
    assert torch.equal(x, kept)
    _close(out, expected.detach())


@pytest.mark.parametrize('train', [False, True])
@pytest.mark.parametrize('name', ['smlpnet_t', 'gmlp_ti', 'mixer_s16'])
def test_vision_models_under_bf16_autocast(name, train, single_thread):
    """The models run under AMP (bf16 autocast, as train.py --amp on the CPU) and compute the float32 model's
    function to bf16 accuracy, forward and backward. Regression: an in-place ``baddbmm_`` (which autocast does not
    cast) once met bf16 activations with float32 axial weights in sMLPNet and failed."""
    # shrunk where depth and width make bf16 on the CPU slow; two blocks: the second takes the first's bf16 output
    shrink = {'smlpnet_t': dict(depths=(1, 1, 1, 1)), 'mixer_s16': dict(num_blocks=2)}
    kwargs = dict(img_size=64, **shrink.get(name, {}))
    model = _randomize_(timm.create_model(name, num_classes=5, **kwargs)).train(train)
    x = torch.randn(4, 3, 64, 64)
    state = {k: v.clone() for k, v in model.state_dict().items()}  # train mode updates BN running stats
    expected = model(x)
    expected.float().square().mean().backward()
    grads = _grads(model)
    model.zero_grad(set_to_none=True)
    model.load_state_dict(state)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = model(x)
    assert out.dtype == torch.bfloat16
    out.float().square().mean().backward()
    rel = lambda a, b: float((a.detach().float() - b).norm() / b.norm())  # noqa: E731
    assert rel(out, expected.detach()) < 5e-2
    amp_grads = _grads(model)
    assert amp_grads.keys() == grads.keys()
    assert all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in amp_grads.values())
    # per-tensor gradients are noisier in bf16; all of them together must still agree closely
    flat = lambda gs: torch.cat([g.flatten() for g in gs.values()])  # noqa: E731
    assert rel(flat(amp_grads), flat(grads)) < 1e-1
