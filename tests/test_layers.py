""" The shared blocks in mlp_vision.layers, each checked against an explicit reference computation (definitions in docs/models.md). """
import math

import pytest
import timm
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.models.mlp_mixer import MixerBlock as TimmMixerBlock

import mlp_vision  # noqa: F401  (registers the models with timm)
from mlp_vision.layers import (
    AxialSparseMLP, GatedMLPBlock, MixerBlock, SparseMLPTokenMixer, SpatialGatingUnit, TinyAttention,
    check_image_input,
)

from _helpers import randomize_ as _randomize_


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)





def _ln(x, norm: nn.LayerNorm):
    """LayerNorm written out: (x - mean) / sqrt(var + eps) * gamma + beta over the last axis."""
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def _bn_eval(x, bn: nn.BatchNorm2d):
    shape = (1, -1, 1, 1)
    return ((x - bn.running_mean.view(shape)) / torch.sqrt(bn.running_var.view(shape) + bn.eps)
            * bn.weight.view(shape) + bn.bias.view(shape))


def _close(a, b, atol=1e-5, rtol=1e-5):
    torch.testing.assert_close(a, b, atol=atol, rtol=rtol)


# --------------------------------------------------------------------------------------------------------------
# SpatialGatingUnit
# --------------------------------------------------------------------------------------------------------------

def _sgu_reference(x, sgu: SpatialGatingUnit, w_full: torch.Tensor, res=None):
    """s(Z) = Z1 * (W · LN(Z2) + b [+ res]) with an explicit einsum over tokens; w_full is the (n, n) matrix."""
    length = x.shape[1]
    half = x.shape[-1] // 2
    z1, z2 = x[..., :half], x[..., half:]
    z2 = _ln(z2, sgu.norm)
    w = w_full[:length, :length]
    g = torch.einsum('ij,bjc->bic', w, z2) + sgu.bias[:length][None, :, None]
    if res is not None:
        g = g + res
    return z1 * g


def _explicit_matrix(sgu: SpatialGatingUnit) -> torch.Tensor:
    """The (n, n) token-mixing matrix built by hand from the raw parameter, per the papers' definitions."""
    n = sgu.seq_len
    if sgu.spatial_mode == 'toeplitz':
        w = torch.empty(n, n)
        for i in range(n):
            for j in range(n):
                w[i, j] = sgu.weight[i - j + n - 1]
        return w
    w = sgu.weight.detach().clone()
    if sgu.spatial_mode == 'causal':
        w = w * (torch.arange(n)[None, :] <= torch.arange(n)[:, None])
    return w


@pytest.mark.parametrize('mode', ['dense', 'toeplitz', 'causal'])
def test_sgu_init(mode):
    sgu = SpatialGatingUnit(64, 50, spatial_mode=mode)
    assert torch.equal(sgu.bias, torch.ones(50))
    assert sgu.weight.abs().max() < 1e-4
    assert 1e-7 < sgu.weight.std() < 1e-5  # normal, std 1e-6
    # the unit starts as Z1 * (LN(Z2) ~ 0 after mixing + b = 1) ~ Z1, i.e. the block starts as a plain FFN
    x = torch.randn(2, 50, 64)
    with torch.no_grad():
        _close(sgu(x), x[..., :32], atol=1e-3, rtol=1e-3)


def test_sgu_init_survives_model_init():
    model = timm.create_model('gmlp_ti', img_size=64)
    n = (64 // 16) ** 2
    sgus = [m for m in model.modules() if isinstance(m, SpatialGatingUnit)]
    assert len(sgus) == 30
    for sgu in sgus:
        assert sgu.weight.shape == (n, n)
        assert torch.equal(sgu.bias, torch.ones(n))
        assert sgu.weight.abs().max() < 1e-4
        assert sgu.weight.abs().max() > 0  # initialised, not left as torch.empty garbage / zeros
        # the gate's LayerNorm is a LayerNorm at identity
        assert torch.equal(sgu.norm.weight, torch.ones_like(sgu.norm.weight))
        assert torch.equal(sgu.norm.bias, torch.zeros_like(sgu.norm.bias))
    # the rest of the model did get the model-level init (fc1 xavier: not tiny)
    assert model.blocks[0].fc1.weight.std() > 1e-2


def test_sgu_toeplitz_structure():
    n = 7
    sgu = SpatialGatingUnit(8, n, spatial_mode='toeplitz')
    assert sgu.weight.shape == (2 * n - 1,)
    assert sum(p.numel() for p in sgu.parameters()) == (2 * n - 1) + n + 2 * 4  # w, b, gate LayerNorm
    with torch.no_grad():
        sgu.weight.copy_(torch.arange(2 * n - 1, dtype=torch.float32) * 0.5 - 3.)
    w = sgu.spatial_weight(n)
    assert w.shape == (n, n)
    for i in range(n):
        for j in range(n):
            assert w[i, j] == sgu.weight[i - j + n - 1]
    # constant along every diagonal: depends only on i - j
    for k in range(-(n - 1), n):
        d = torch.diagonal(w, offset=k)
        assert torch.all(d == d[0])
    # the leading L x L block for shorter inputs is again Toeplitz with the same generator
    _close(sgu.spatial_weight(4), w[:4, :4], atol=0, rtol=0)
    # gradients reach the 2n - 1 parameters only
    sgu.spatial_weight(n).sum().backward()
    assert sgu.weight.grad.shape == (2 * n - 1,)


def test_sgu_causal_structure():
    n = 9
    sgu = SpatialGatingUnit(8, n, spatial_mode='causal')
    with torch.no_grad():
        sgu.weight.normal_()
    w = sgu.spatial_weight(n)
    assert torch.equal(torch.triu(w, diagonal=1), torch.zeros(n, n))
    assert torch.equal(torch.tril(w), torch.tril(sgu.weight))
    assert torch.equal(sgu.spatial_weight(5), torch.tril(sgu.weight[:5, :5]))


@pytest.mark.parametrize('mode', ['dense', 'toeplitz', 'causal'])
@pytest.mark.parametrize('length', [12, 5, 1])
def test_sgu_forward_matches_reference(mode, length):
    n, dim = 12, 16
    sgu = _randomize_(SpatialGatingUnit(dim, n, spatial_mode=mode), std=0.5)
    x = torch.randn(3, length, dim)
    res = torch.randn(3, length, dim // 2)
    w_full = _explicit_matrix(sgu)
    with torch.no_grad():
        _close(sgu(x), _sgu_reference(x, sgu, w_full))
        # res is added after the projection (and bias), before the product with Z1
        _close(sgu(x, res), _sgu_reference(x, sgu, w_full, res))
        _close(sgu(x, res), x[..., :dim // 2] * (sgu(x) / x[..., :dim // 2] + res), atol=1e-4, rtol=1e-4)
        # shorter inputs use W[:L, :L] and b[:L] (by hand, for the sliced case)
        if length < n:
            z1, z2 = x[..., :dim // 2], _ln(x[..., dim // 2:], sgu.norm)
            g = z2.transpose(1, 2) @ w_full[:length, :length].T + sgu.bias[:length]
            _close(sgu(x), z1 * g.transpose(1, 2))


@pytest.mark.parametrize('mode', ['causal'])
def test_sgu_causal_no_future_leak(mode):
    n, dim = 10, 16
    sgu = _randomize_(SpatialGatingUnit(dim, n, spatial_mode=mode))
    x = torch.randn(2, n, dim)
    with torch.no_grad():
        y = sgu(x)
        for t in range(n - 1):
            x2 = x.clone()
            x2[:, t + 1:] = torch.randn(2, n - t - 1, dim) * 5
            y2 = sgu(x2)
            assert torch.equal(y2[:, :t + 1], y[:, :t + 1]), t
            assert not torch.allclose(y2[:, t + 1:], y[:, t + 1:])
    # a dense SGU does leak (the check above can fail)
    dense = _randomize_(SpatialGatingUnit(dim, n, spatial_mode='dense'))
    with torch.no_grad():
        x2 = x.clone()
        x2[:, -1] = torch.randn(2, dim)  # (a constant shift would be removed by the gate LayerNorm)
        assert not torch.allclose(dense(x2)[:, 0], dense(x)[:, 0])


def test_sgu_invalid_args():
    with pytest.raises(ValueError, match='spatial_mode'):
        SpatialGatingUnit(8, 4, spatial_mode='circulant')
    with pytest.raises(ValueError, match='even'):
        SpatialGatingUnit(7, 4)
    with pytest.raises(ValueError):
        GatedMLPBlock(16, 4, spatial_mode='banana')


# --------------------------------------------------------------------------------------------------------------
# TinyAttention
# --------------------------------------------------------------------------------------------------------------

def _attn_reference(attn: TinyAttention, x, mask=None, causal=False):
    d = attn.attn_dim
    qkv = x @ attn.qkv.weight.T + attn.qkv.bias
    q, k, v = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]
    logits = q @ k.transpose(-1, -2) / math.sqrt(d)
    length = x.shape[1]
    allowed = torch.ones(x.shape[0], length, length, dtype=torch.bool)
    if mask is not None:
        allowed = allowed & mask[:, None, :]
    if causal:
        allowed = allowed & torch.ones(length, length, dtype=torch.bool).tril()
    logits = logits.masked_fill(~allowed, float('-inf'))
    a = torch.softmax(logits, dim=-1)
    return (a @ v) @ attn.proj.weight.T + attn.proj.bias


def test_tiny_attention_matches_manual():
    attn = _randomize_(TinyAttention(24, attn_dim=8, out_dim=40)).eval()
    x = torch.randn(3, 11, 24)
    with torch.no_grad():
        y = attn(x)
        assert y.shape == (3, 11, 40)
        _close(y, _attn_reference(attn, x))
    assert attn.qkv.weight.shape == (3 * 8, 24) and attn.proj.weight.shape == (40, 8)
    # out_dim defaults to the input width
    assert TinyAttention(24, attn_dim=8).proj.out_features == 24


@pytest.mark.parametrize('causal', [False, True])
def test_tiny_attention_padding_mask(causal):
    attn = _randomize_(TinyAttention(16, attn_dim=8, out_dim=12, causal=causal)).eval()
    lengths = [9, 4, 1]
    length = max(lengths)
    x = torch.randn(len(lengths), length, 16)
    mask = torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]
    with torch.no_grad():
        y = attn(x, mask)
        _close(y, _attn_reference(attn, x, mask, causal=causal))
        for b, n in enumerate(lengths):
            # real positions equal the same module on the unpadded sequence
            _close(y[b, :n], attn(x[b:b + 1, :n])[0])
            # the padding content does not matter for real positions
            x2 = x.clone()
            x2[b, n:] = 100 * torch.randn(length - n, 16)
            _close(attn(x2, mask)[b, :n], y[b, :n])
        assert torch.isfinite(y).all()


def test_tiny_attention_causal_matches_manual_mask():
    attn = _randomize_(TinyAttention(16, attn_dim=8, causal=True)).eval()
    x = torch.randn(2, 7, 16)
    with torch.no_grad():
        y = attn(x)
        _close(y, _attn_reference(attn, x, causal=True))
        # and differs from the non-causal attention (except for the last position, which sees everything)
        non_causal = _attn_reference(attn, x, causal=False)
        assert not torch.allclose(y[:, :-1], non_causal[:, :-1], atol=1e-4)
        _close(y[:, -1], non_causal[:, -1])
        # causal + an all-True mask equals causal alone (the mask path builds its own causal mask)
        _close(attn(x, torch.ones(2, 7, dtype=torch.bool)), y)


def test_tiny_attention_causal_left_padding_finite():
    # causal + left padding: the first (padded) queries have no allowed key; they must not produce NaN
    attn = _randomize_(TinyAttention(16, attn_dim=8, causal=True)).eval()
    x = torch.randn(1, 6, 16)
    mask = torch.tensor([[False, False, True, True, True, True]])
    with torch.no_grad():
        y = attn(x, mask)
        assert torch.isfinite(y).all()
        _close(y[:, 2:], _attn_reference(attn, x, mask, causal=True)[:, 2:])


# --------------------------------------------------------------------------------------------------------------
# GatedMLPBlock
# --------------------------------------------------------------------------------------------------------------

def _block_reference(block: GatedMLPBlock, x, mask=None):
    h = _ln(x, block.norm)
    z = F.gelu(h @ block.fc1.weight.T + block.fc1.bias)
    res = None
    if block.attn is not None:
        res = _attn_reference(block.attn, h, mask, causal=block.attn.causal)
    g = _sgu_reference(z, block.sgu, _explicit_matrix(block.sgu), res)
    return x + g @ block.fc2.weight.T + block.fc2.bias


@pytest.mark.parametrize('mode', ['dense', 'toeplitz', 'causal'])
@pytest.mark.parametrize('attn_dim', [0, 8])
def test_gated_mlp_block_matches_manual(mode, attn_dim):
    dim, n = 16, 10
    block = _randomize_(GatedMLPBlock(dim, n, mlp_ratio=4, spatial_mode=mode, attn_dim=attn_dim)).eval()
    assert block.fc1.weight.shape == (64, dim) and block.fc2.weight.shape == (dim, 32)
    assert block.sgu.spatial_mode == mode
    if attn_dim:
        assert isinstance(block.attn, TinyAttention)
        assert block.attn.attn_dim == attn_dim
        assert block.attn.proj.out_features == 32  # d_ffn / 2
        assert block.attn.causal == (mode == 'causal')
    else:
        assert block.attn is None
    x = torch.randn(2, n, dim)
    with torch.no_grad():
        y = block(x)
        assert y.shape == x.shape
        _close(y, _block_reference(block, x), atol=1e-4, rtol=1e-4)
        # shorter input (text)
        _close(block(x[:, :6]), _block_reference(block, x[:, :6]), atol=1e-4, rtol=1e-4)
        if attn_dim:
            # the attention really contributes (gate = W LN(Z2) + b + attn), and the mask reaches it
            mask = torch.tensor([[True] * n, [True] * 7 + [False] * 3])
            _close(block(x, mask), _block_reference(block, x, mask), atol=1e-4, rtol=1e-4)
            no_attn = _randomize_(GatedMLPBlock(dim, n, mlp_ratio=4, spatial_mode=mode, attn_dim=0)).eval()
            sd = {k: v for k, v in block.state_dict().items() if not k.startswith('attn.')}
            no_attn.load_state_dict(sd, strict=True)
            assert not torch.allclose(no_attn(x), y, atol=1e-3)


def test_amlp_block_causal_no_future_leak():
    dim, n = 16, 8
    block = _randomize_(GatedMLPBlock(dim, n, mlp_ratio=2, spatial_mode='causal', attn_dim=8)).eval()
    x = torch.randn(1, n, dim)
    with torch.no_grad():
        y = block(x)
        x2 = x.clone()
        x2[:, 5:] = torch.randn(1, n - 5, dim)
        y2 = block(x2)
    assert torch.equal(y2[:, :5], y[:, :5])
    assert not torch.allclose(y2[:, 5:], y[:, 5:])


def test_gated_mlp_block_drop_path():
    dim, n = 8, 4
    assert isinstance(GatedMLPBlock(dim, n, mlp_ratio=2).drop_path, nn.Identity)
    block = _randomize_(GatedMLPBlock(dim, n, mlp_ratio=2, drop_path=0.5))
    x = torch.randn(256, n, dim)
    with torch.no_grad():
        block.eval()
        y_eval = block(x)
        branch = y_eval - x
        assert branch.abs().amax(dim=(1, 2)).min() > 1e-3
        block.train()
        y_train = block(x)
    # per sample: either the branch is dropped (y == x) or kept and scaled by 1 / keep_prob
    dropped = torch.isclose(y_train, x, atol=1e-6).flatten(1).all(dim=1)
    kept = torch.isclose(y_train, x + 2 * branch, atol=1e-5, rtol=1e-5).flatten(1).all(dim=1)
    assert torch.all(dropped ^ kept)
    assert 0.3 < dropped.float().mean() < 0.7


# --------------------------------------------------------------------------------------------------------------
# MixerBlock
# --------------------------------------------------------------------------------------------------------------

def test_mixer_block_matches_timm():
    dim, n = 32, 16
    theirs = _randomize_(TimmMixerBlock(dim, n)).eval()
    ours = MixerBlock(dim, n).eval()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(3, n, dim)
    with torch.no_grad():
        y = ours(x)
        assert y.shape == x.shape
        _close(y, theirs(x))  # the token MLP is a batched GEMM here, timm's a GEMM on a transposed copy
        # and an explicit reference: token MLP over n (n -> n/2... tokens_dim) then channel MLP
        t = _ln(x, ours.norm1).transpose(1, 2)
        m = ours.mlp_tokens
        t = F.gelu(t @ m.fc1.weight.T + m.fc1.bias) @ m.fc2.weight.T + m.fc2.bias
        h = x + t.transpose(1, 2)
        c = ours.mlp_channels
        ref = h + F.gelu(_ln(h, ours.norm2) @ c.fc1.weight.T + c.fc1.bias) @ c.fc2.weight.T + c.fc2.bias
        _close(y, ref)
    assert ours.mlp_tokens.fc1.weight.shape == (dim // 2, n)
    assert ours.mlp_channels.fc1.weight.shape == (4 * dim, dim)


# --------------------------------------------------------------------------------------------------------------
# Axial sparse MLP (sMLP) and the sMLPNet token mixer
# --------------------------------------------------------------------------------------------------------------

def _smlp_parts(smlp: AxialSparseMLP, x):
    """(x, H-mixed, W-mixed) after BN -> GELU, computed with explicit einsums."""
    x = F.gelu(_bn_eval(x, smlp.norm))
    x_h = torch.einsum('ij,bcjw->bciw', smlp.proj_h.weight, x) + smlp.proj_h.bias[None, None, :, None]
    x_w = torch.einsum('ij,bchj->bchi', smlp.proj_w.weight, x) + smlp.proj_w.bias[None, None, None, :]
    return x, x_h, x_w


def test_axial_sparse_mlp_matches_reference():
    c, h, w = 8, 6, 10
    smlp = _randomize_(AxialSparseMLP(c, (h, w))).eval()
    assert smlp.proj_h.weight.shape == (h, h) and smlp.proj_w.weight.shape == (w, w)
    assert smlp.fuse_conv.weight.shape == (c, 3 * c, 1, 1) and smlp.fuse_conv.bias is None
    x = torch.randn(2, c, h, w)
    with torch.no_grad():
        y = smlp(x)
        assert y.shape == x.shape
        parts = _smlp_parts(smlp, x)
        ref = torch.einsum('oc,bchw->bohw', smlp.fuse_conv.weight[:, :, 0, 0], torch.cat(parts, dim=1))
        _close(y, ref)
        # also with explicit permutes + Linear (the way the official code does it)
        xa = F.gelu(_bn_eval(x, smlp.norm))
        x_h = F.linear(xa.permute(0, 1, 3, 2), smlp.proj_h.weight, smlp.proj_h.bias).permute(0, 1, 3, 2)
        x_w = F.linear(xa, smlp.proj_w.weight, smlp.proj_w.bias)
        _close(x_h, parts[1])
        _close(x_w, parts[2])
        # fuse input order is [x, H-mixed, W-mixed]: select one block at a time
        for k in range(3):
            sel = torch.zeros(c, 3 * c, 1, 1)
            sel[:, k * c:(k + 1) * c, 0, 0] = torch.eye(c)
            smlp.fuse_conv.weight.copy_(sel)
            _close(smlp(x), parts[k])


def test_axial_sparse_mlp_axes():
    # changing one pixel (i0, j0) changes the H-mixed map only in column j0, the W-mixed map only in row i0,
    # and the sMLP output exactly on row i0 and column j0
    c, h, w = 4, 6, 10
    i0, j0 = 2, 7
    smlp = _randomize_(AxialSparseMLP(c, (h, w))).eval()
    x = torch.randn(1, c, h, w)
    x2 = x.clone()
    x2[0, :, i0, j0] += 1.
    cross = torch.zeros(h, w, dtype=torch.bool)
    cross[i0, :] = True
    cross[:, j0] = True
    with torch.no_grad():
        _, x_h, x_w = _smlp_parts(smlp, x)
        _, x_h2, x_w2 = _smlp_parts(smlp, x2)
        assert torch.equal((x_h2 - x_h).abs().amax(dim=(0, 1)) > 0, cross & (torch.arange(w) == j0)[None, :])
        assert torch.equal((x_w2 - x_w).abs().amax(dim=(0, 1)) > 0, cross & (torch.arange(h) == i0)[:, None])
        changed = (smlp(x2) - smlp(x)).abs().amax(dim=(0, 1)) > 1e-6
        assert torch.equal(changed, cross)
    # H and W are not interchangeable: a transposed input is rejected
    with pytest.raises(RuntimeError):
        smlp(torch.randn(1, c, w, h))


def test_sparse_mlp_token_mixer_matches_reference():
    c, h, w = 8, 6, 10
    mixer = _randomize_(SparseMLPTokenMixer(c, (h, w))).eval()
    assert mixer.conv_dw.weight.shape == (c, 1, 3, 3) and mixer.conv_dw.bias is None
    assert mixer.conv_dw.groups == c
    x = torch.randn(2, c, h, w)
    with torch.no_grad():
        t = F.gelu(_bn_eval(x, mixer.norm))
        # depthwise 3x3 with zero padding, written out
        tp = F.pad(t, (1, 1, 1, 1))
        dw = torch.zeros_like(t)
        for di in range(3):
            for dj in range(3):
                dw += tp[:, :, di:di + h, dj:dj + w] * mixer.conv_dw.weight[:, 0, di, dj][None, :, None, None]
        ref = torch.einsum('oc,bchw->bohw', mixer.smlp.fuse_conv.weight[:, :, 0, 0],
                           torch.cat(_smlp_parts(mixer.smlp, dw), dim=1))
        _close(mixer(x), ref, atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------------------------------------------
# input checks
# --------------------------------------------------------------------------------------------------------------

def test_check_image_input():
    check_image_input(torch.zeros(2, 3, 64, 96), 3, (64, 96))  # ok
    with pytest.raises(ValueError, match=r'64x96.*got 96x64'):
        check_image_input(torch.zeros(1, 3, 96, 64), 3, (64, 96))
    with pytest.raises(ValueError, match='expected 3 input channels, got 1'):
        check_image_input(torch.zeros(1, 1, 64, 96), 3, (64, 96))
    with pytest.raises(ValueError, match=r'\(B, 3, 64, 96\)'):
        check_image_input(torch.zeros(3, 64, 96), 3, (64, 96))


@pytest.mark.parametrize('name,kwargs', [
    ('gmlp_ti', dict(img_size=64, num_blocks=1)),
    ('mixer_s16', dict(img_size=64, num_blocks=1)),
    ('smlpnet_t', dict(img_size=64, embed_dim=8, depths=(1, 1, 1, 1))),
])
def test_models_reject_wrong_input_size(name, kwargs):
    model = timm.create_model(name, **kwargs).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64, 64)).shape == (1, 1000)
        with pytest.raises(ValueError, match='expected input spatial size 64x64'):
            model(torch.randn(1, 3, 96, 64))


# ------------------------------------------------------------------------------------------------ gelu_product
def _saved_bytes(fn):
    """Bytes of the distinct storages autograd keeps for the backward pass of ``fn()``."""
    kept = {}

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(kept.values())


@pytest.mark.parametrize('approximate', ['none', 'tanh'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_gelu_product_is_autograds_gelu_product_with_half_the_saved_activations(approximate, dtype):
    from mlp_vision.layers.activations import gelu_product
    g = torch.Generator().manual_seed(0)
    a0, b0, grad = (torch.randn(3, 7, 16, generator=g).to(dtype) for _ in range(3))
    a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    ref, ref_bytes = _saved_bytes(lambda: F.gelu(a, approximate=approximate) * F.gelu(b, approximate=approximate))
    ref.backward(grad)
    a2, b2 = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    out, out_bytes = _saved_bytes(lambda: gelu_product(a2, b2, approximate))
    out.backward(grad)
    assert torch.equal(out, ref) and torch.equal(a2.grad, a.grad) and torch.equal(b2.grad, b.grad)
    assert out_bytes * 2 == ref_bytes  # a and b, where autograd keeps a, b, GELU(a), GELU(b)
    with torch.no_grad():  # in place on the caller's fresh tensors, same values
        assert torch.equal(gelu_product(a0.clone(), b0.clone(), approximate), ref)
    only_a = a0.clone().requires_grad_()
    gelu_product(only_a, b0, approximate).backward(grad)
    assert torch.equal(only_a.grad, a.grad)
