""" sMLPNet's fuse conv without the concatenation (issue 34, item 2): ``ChannelConcatConv2d([x, x_h, x_w])`` is the
1x1 conv over ``torch.cat([x, x_h, x_w], 1)`` (outputs and gradients, channels-last and contiguous maps, TorchScript),
refuses bad input with one line, and the compiled training graph of an sMLPNet block has no layout copy
(``scripts/compile/graph_counts.py``; the concatenation's gradient gave the H mix a strided slice that it copied, one
per block). The whole model against the reference is ``tests/test_equivalence.py``. Nothing here measures time.
"""
import importlib.util
from pathlib import Path

import pytest
import timm
import torch
import torch.nn.functional as F

import mlp_vision  # noqa: F401
from mlp_vision.layers import AxialSparseMLP, ChannelConcatConv2d

SCRIPT = Path(__file__).resolve().parents[1] / 'scripts' / 'compile' / 'graph_counts.py'


def _close(a, b, rtol=1e-5):
    torch.testing.assert_close(a, b, rtol=rtol, atol=rtol * max(1., float(b.detach().abs().max())))


@pytest.mark.parametrize('bias', [False, True])
@pytest.mark.parametrize('channels_last', [False, True])
def test_channel_concat_conv_is_the_conv_over_the_concatenation(bias, channels_last):
    torch.manual_seed(0)
    conv = ChannelConcatConv2d(4 + 6 + 5, 7, bias=bias)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    parts = [torch.randn(3, c, 5, 8).contiguous(memory_format=fmt).requires_grad_() for c in (4, 6, 5)]
    parts_ref = [p.detach().clone().requires_grad_() for p in parts]
    y = conv(parts)
    y_ref = F.conv2d(torch.cat(parts_ref, dim=1), conv.weight, conv.bias)
    _close(y, y_ref)
    assert y.is_contiguous(memory_format=torch.channels_last)
    g = torch.randn(y.shape)
    params = list(conv.parameters())
    grads = torch.autograd.grad(y, parts + params, g)
    grads_ref = torch.autograd.grad(y_ref, parts_ref + params, g)
    for a, r in zip(grads, grads_ref):
        _close(a, r, rtol=1e-4)
        assert a.shape == r.shape
    assert grads[len(parts)].stride() == conv.weight.stride()  # the weight gradient in the weight's own strides
    assert torch.equal(conv(torch.cat(parts, dim=1)), F.conv2d(torch.cat(parts, dim=1), conv.weight, conv.bias))


def test_channel_concat_conv_scripts():
    conv = ChannelConcatConv2d(6, 4)
    parts = [torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)]
    scripted = torch.jit.script(conv)
    _close(scripted(parts), conv(parts))
    _close(scripted(torch.cat(parts, dim=1)), conv(torch.cat(parts, dim=1)))


def test_channel_concat_conv_bad_input_is_one_clear_line():
    conv = ChannelConcatConv2d(6, 4)
    with pytest.raises(ValueError, match=r'maps of 6 channels in all, got \[3, 2\]'):
        conv([torch.randn(2, 3, 4, 5), torch.randn(2, 2, 4, 5)])
    with pytest.raises(ValueError, match=r'maps of one \(B, H, W\), got shapes \[\[2, 3, 4, 5\], \[2, 3, 4, 6\]\]'):
        conv([torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 6)])
    with pytest.raises(ValueError, match='1x1 conv with stride 1'):
        ChannelConcatConv2d(6, 4, kernel_size=3)


def test_smlp_state_dict_is_the_conv_one():
    """fuse_conv keeps nn.Conv2d's parameter (C, 3C, 1, 1), name and initialisation: every checkpoint loads."""
    smlp = AxialSparseMLP(8, (4, 6))
    assert isinstance(smlp.fuse_conv, torch.nn.Conv2d)
    assert {k: tuple(v.shape) for k, v in smlp.state_dict().items() if 'fuse' in k} == {'fuse_conv.weight': (8, 24, 1, 1)}


@pytest.fixture(scope='module')
def graph_counts():
    spec = importlib.util.spec_from_file_location('graph_counts', SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_training_graph_has_no_layout_copy_in_a_block(graph_counts):
    """The compiled training graph (forward + backward, ATen ops as inductor decomposes them) of a small
    channels-last sMLPNet: no layout copy in any block, forward or backward; per stage outside its blocks, at most
    the one backward copy of the last stage, which gets the head's gradient (pooling and BatchNorm backward) in NCHW
    strides and makes it channels-last once for all its blocks."""
    model = timm.create_model('smlpnet_t', img_size=64, embed_dim=8, depths=(1, 2, 1, 1), num_classes=10)
    model = model.train().to(memory_format=torch.channels_last)
    x = torch.randn(3, 3, 64, 64).contiguous(memory_format=torch.channels_last)
    counts = graph_counts.aten_block_counts(model, x)
    blocks = {k: v for k, v in counts.items() if '.blocks.' in k}
    assert len(blocks) == 5
    for name, entry in blocks.items():
        assert entry['copies']['fw'] == 0 and entry['copies']['bw'] == 0, (name, entry['copies'])
        # the two axial mixes, the three GEMMs of the fuse, fc1, fc2; no 1x1 conv
        assert entry['gemms']['fw'] == 7 and entry['convs']['fw'] == 1, (name, entry['gemms'], entry['convs'])
    stage_copies = [dict(counts[f'stages.{s}']['copies']) for s in range(4) if f'stages.{s}' in counts]
    assert sum(c.get('fw', 0) for c in stage_copies) == 0 and sum(c.get('bw', 0) for c in stage_copies) <= 1, \
        stage_copies
