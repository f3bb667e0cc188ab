""" sMLPNet's blocks in token-major memory (issue 34, item 2): the same function, the same state dict, and a training
graph without layout copies inside a block or small batched GEMMs.

sMLPNet's stages run their blocks on (B, C, H, W) activations stored (H, W, B, C) (``to_token_major``), where each
sMLP mixes H as one GEMM and W as H GEMMs over B*C columns (channels-last memory needs B and B*H small GEMMs). Here:
the token-major block, token mixer, sMLP and depthwise conv against the straightforward formulation
(``tests/reference/smlpnet.py`` and plain functional ops on a contiguous NCHW copy), outputs and gradients; and the
ATen training graph (``scripts/compile/graph_counts.py``) bounded per block. Nothing here measures time.
"""
import copy
import importlib.util
from functools import partial
from pathlib import Path

import pytest
import timm
import torch
import torch.nn as nn
import torch.nn.functional as F

import mlp_vision  # noqa: F401
from mlp_vision.layers import SparseMLPBlock, SparseMLPTokenMixer
from mlp_vision.layers.sparse_mlp import FoldedDepthwiseConv2d, to_token_major

from _helpers import randomize_
from reference.smlpnet import _RefBlock

_randomize_ = partial(randomize_, std=0.2)
SCRIPT = Path(__file__).resolve().parents[1] / 'scripts' / 'compile' / 'graph_counts.py'


def _close(a, b, rtol=1e-5):
    torch.testing.assert_close(a, b, rtol=rtol, atol=rtol * max(1., float(b.detach().abs().max())))


def _layouts(x):
    """The same values as channels-last and as token-major (H, W, B, C) memory."""
    return x.contiguous(memory_format=torch.channels_last), to_token_major(x)


def test_to_token_major_memory_order():
    x = torch.randn(3, 4, 5, 6)
    t = to_token_major(x)
    assert torch.equal(t, x) and t.shape == x.shape
    assert t.permute(2, 3, 0, 1).is_contiguous() and not t.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize('bias', [False, True])
@pytest.mark.parametrize('batch', [1, 3])
def test_folded_depthwise_conv_is_the_conv(bias, batch):
    """On token-major input the batch-folded route computes nn.Conv2d's function and gradients, and returns
    token-major memory; the reparameterized conv (with bias) too."""
    conv = _randomize_(FoldedDepthwiseConv2d(6, 6, 3, padding=1, groups=6, bias=bias))
    x = torch.randn(batch, 6, 5, 7)
    xt = to_token_major(x).requires_grad_()
    x_ref = x.clone().requires_grad_()
    y, y_ref = conv(xt), F.conv2d(x_ref, conv.weight, conv.bias, padding=1, groups=6)
    _close(y, y_ref)
    if batch > 1:
        assert y.permute(2, 3, 0, 1).is_contiguous()
    g = torch.randn(y.shape)
    grads = torch.autograd.grad(y, (xt, *conv.parameters()), g)
    grads_ref = torch.autograd.grad(y_ref, (x_ref, *conv.parameters()), g)
    for a, r in zip(grads, grads_ref):
        _close(a, r, rtol=1e-4)


def test_folded_depthwise_conv_refuses_a_non_depthwise_conv():
    with pytest.raises(ValueError, match='groups == in_channels'):
        FoldedDepthwiseConv2d(6, 6, 3, groups=3)


@pytest.mark.parametrize('train', [False, True])
def test_block_in_either_layout_matches_the_reference_block(train):
    """An sMLPNet block (token mixer, channel MLP, residuals) on token-major and on channels-last memory computes
    the reference block's function (``tests/reference/smlpnet.py``, NCHW, 1x1 convs on permuted tensors), with the
    same parameter gradients and running statistics; the output keeps the input's memory order."""
    c, h, w = 8, 6, 10
    ours = _randomize_(SparseMLPBlock(c, (h, w), mlp_ratio=3.)).train(train)
    ref = _RefBlock(c, (h, w), 3.).train(train)
    state = {k: v.reshape(ref.state_dict()[k].shape) for k, v in ours.state_dict().items()}
    ref.load_state_dict(state)
    x = torch.randn(3, c, h, w)
    x_ref = x.clone().requires_grad_()
    y_ref = ref(x_ref)
    g = torch.randn(y_ref.shape)
    y_ref.backward(g)
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    for xl in _layouts(x):
        block = copy.deepcopy(ours)
        xl = xl.clone(memory_format=torch.preserve_format).requires_grad_()
        y = block(xl)
        _close(y, y_ref)
        assert y.stride() == xl.stride()  # no layout change on the way out
        y.backward(g)
        _close(xl.grad, x_ref.grad, rtol=1e-4)
        for name, p in block.named_parameters():
            _close(p.grad, ref_grads[name].reshape(p.shape), rtol=1e-4)
        if train:
            for name, buf in block.named_buffers():
                if buf.is_floating_point():
                    _close(buf, ref.state_dict()[name])


def test_reparameterized_token_mixer_in_token_major_memory():
    """The folded BatchNorm (conv_dw with bias, still a FoldedDepthwiseConv2d) computes the eval-mode mixer on
    token-major memory too."""
    mixer = _randomize_(SparseMLPTokenMixer(8, (6, 10))).eval()
    x = torch.randn(3, 8, 6, 10)
    with torch.no_grad():
        y = mixer(x)
        mixer.reparameterize()
        assert isinstance(mixer.conv_dw, FoldedDepthwiseConv2d) and mixer.conv_dw.bias is not None
        for xl in _layouts(x):
            _close(mixer(xl), y)


def test_model_runs_its_blocks_token_major_and_returns_channels_last():
    """Every block of a stage sees token-major input; stage outputs (features) are channels-last."""
    model = timm.create_model('smlpnet_t', img_size=64, embed_dim=8, depths=(1, 2, 1, 1), num_classes=0)
    seen = []
    hooks = [blk.register_forward_pre_hook(lambda m, a: seen.append(a[0].permute(2, 3, 0, 1).is_contiguous()))
             for blk in model.modules() if isinstance(blk, SparseMLPBlock)]
    with torch.no_grad():
        feats = model.forward_intermediates(torch.randn(2, 3, 64, 64), intermediates_only=True)
    for hook in hooks:
        hook.remove()
    assert seen == [True] * 5
    assert all(f.is_contiguous(memory_format=torch.channels_last) for f in feats)


@pytest.fixture(scope='module')
def graph_counts():
    spec = importlib.util.spec_from_file_location('graph_counts', SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_training_graph_has_no_layout_copy_in_a_block_and_no_small_gemms(graph_counts):
    """The compiled training graph (forward + backward, ATen ops as inductor decomposes them) of a small sMLPNet,
    per block: no copy in the forward; in the backward at most the two copies of the concatenation's gradient
    slices that feed the H and W mixes (a (*, C) slice of the (*, 3C) gradient is not a GEMM operand); every
    batched GEMM has at most H batches (the W mix over B*C columns; the H mix is one GEMM), never B or B*H. Per
    stage outside its blocks: the two layout changes (into token-major memory and back), no more."""
    batch, img, dims = 3, 64, (8, 16, 32, 64)
    model = timm.create_model('smlpnet_t', img_size=img, embed_dim=dims[0], depths=(1, 2, 1, 1), num_classes=10)
    x = torch.randn(batch, 3, img, img).contiguous(memory_format=torch.channels_last)
    counts = graph_counts.aten_block_counts(model.train(), x)
    blocks = {k: v for k, v in counts.items() if '.blocks.' in k}
    assert len(blocks) == 5
    for name, entry in blocks.items():
        height = img // (4 * 2 ** int(name.split('.')[1]))
        assert entry['copies']['fw'] == 0, (name, entry['copies'])
        assert entry['copies']['bw'] <= 2, (name, entry['copies'])
        assert entry['gemms']['fw'] == 4 and entry['gemms']['bw'] == 8, (name, entry['gemms'])  # 2 mixes, fc1, fc2
        assert entry['bmm_batches'] and max(entry['bmm_batches']) <= height, (name, entry['bmm_batches'])
        assert batch not in entry['bmm_batches'] and batch * height not in entry['bmm_batches']  # (3 != H here)
    for stage in range(4):
        outside = counts.get(f'stages.{stage}')
        assert outside is not None and outside['copies']['fw'] <= 2, (stage, outside and outside['copies'])
