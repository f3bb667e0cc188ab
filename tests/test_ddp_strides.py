""" DDP gets every gradient in its parameter's strides (issue 36 item 6: PyTorch's "Grad strides do not match bucket
view strides" on every rank). The reducer compares ``param.grad.stride()`` with its bucket view, which has the
parameter's strides; the checks here compare the same two, so they do not depend on PyTorch printing its warning
only once per process. """
import warnings

import pytest
import timm
import torch
import torch.distributed as dist

import mlp_vision  # noqa: F401  (registers the models)
from mlp_vision.image_model import DistInfo
from mlp_vision.train import wrap_ddp

# contiguous sMLPNet: the depthwise and 1x1 fuse convs see channels-last activations, so their weight gradients come
# in strides that differ from the parameter's in size-1 dims (with --channels-last, as of 2026-11-26, none do)
CASES = {'contiguous': (dict(embed_dim=16, depths=(1, 1, 1, 1), img_size=64), False),
         'contiguous_32': (dict(embed_dim=8, depths=(1, 1, 1, 1), img_size=32), False)}


@pytest.fixture
def one_rank_group():
    dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _model(case):
    kwargs, channels_last = CASES[case]
    torch.manual_seed(0)
    model = timm.create_model('smlpnet_t', num_classes=10, **kwargs)
    x = torch.randn(4, 3, kwargs['img_size'], kwargs['img_size'])
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    return model, x


def _mismatched(model):
    return [n for n, p in model.named_parameters() if p.grad is not None and p.grad.stride() != p.stride()]


@pytest.mark.parametrize('case', sorted(CASES))
def test_ddp_gets_gradients_in_the_parameters_strides(case, one_rank_group, single_thread):
    plain, x = _model(case)
    plain(x).sum().backward()
    assert _mismatched(plain), 'the case no longer makes a kernel return other strides: it tests nothing'
    expected = {n: p.grad.clone() for n, p in plain.named_parameters()}

    model, x = _model(case)
    ddp = wrap_ddp(model, DistInfo(torch.device('cpu'), True, 1, 0, 0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        for _ in range(2):  # the second backward accumulates into the first's gradients
            ddp(x).sum().backward()
    assert _mismatched(model) == []
    assert not [w for w in caught if 'Grad strides' in str(w.message)]
    for n, p in model.named_parameters():  # the same values: a view of the same memory, accumulated twice
        assert torch.equal(p.grad, 2 * expected[n]), n
