""" Layout variants of gMLP and sMLPNet (issue 45 item 1): each computes today's function with today's parameters.

gMLP: ``GatedMLPBlock(split_fc1=...)`` (fc1's halves as two tensors) and ``token_major=...`` ((L, B, C)
activations, the SGU's token mix one GEMM); sMLPNet: ``one_gemm_mixes=...`` (each axial mix one GEMM). Checked in
float64 against the default module holding the same state dict: outputs and the gradients of the input and of
every parameter to 1e-10 relative; the state dicts interchange; the model contract (TorchScript, FX feature
extraction, torch.export, torch.compile capture, features_only) holds for every variant.
"""
import pytest
import timm
import torch
from timm.models._features_fx import create_feature_extractor, get_graph_node_names

import mlp_vision  # noqa: F401  (registers the models with timm)
from mlp_vision.layers import AxialSparseMLP, GatedMLPBlock, SpatialGatingUnit
from mlp_vision.layers.linear import SplitLinear, aligned_rows

from _helpers import randomize_

GMLP_VARIANTS = [dict(split_fc1=True), dict(token_major=True), dict(split_fc1=True, token_major=True)]
SMLP_VARIANTS = [dict(one_gemm_mixes=True)]
IMG = (64, 96)  # non-square: H and W cannot be confused


def _assert_close(actual, expected, what, floor=1e-30):
    """Relative to the largest |expected|, or to ``floor`` for a tensor that is zero but for rounding (a bias
    before a train-mode BatchNorm gets no gradient)."""
    scale = expected.abs().max().clamp_min(floor)
    err = (actual - expected).abs().max() / scale
    assert err < 1e-10, f'{what}: relative error {err.item():.3g}'


def _check_same_function(ref, variant, *inputs, **kwargs):
    """Outputs, input gradients and parameter gradients of ``variant`` equal ``ref``'s (same state dict)."""
    variant.load_state_dict(ref.state_dict())  # strict: the same keys and shapes
    assert {k: v.shape for k, v in ref.state_dict().items()} == {k: v.shape for k, v in variant.state_dict().items()}
    grads = []
    for model in (ref, variant):
        xs = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
        out = model(*xs, **kwargs)
        out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out))
        grads.append((out, [x.grad for x in xs if x.is_floating_point()],
                      {n: p.grad for n, p in model.named_parameters()}))
    (out_r, gx_r, gp_r), (out_v, gx_v, gp_v) = grads
    _assert_close(out_v, out_r, 'output')
    for a, b in zip(gx_v, gx_r):
        _assert_close(a, b, 'input gradient')
    assert gp_v.keys() == gp_r.keys()
    floor = 1e-6 * max(g.abs().max() for g in gp_r.values())
    for name in gp_r:
        _assert_close(gp_v[name], gp_r[name], f'gradient of {name}', floor)


@pytest.mark.parametrize('variant', GMLP_VARIANTS, ids=str)
@pytest.mark.parametrize('mode', ['dense', 'toeplitz', 'causal'])
@pytest.mark.parametrize('sgu_mask', [False, True])
def test_gmlp_block_variant_same_function(variant, mode, sgu_mask):
    torch.manual_seed(0)
    kw = dict(dim=12, seq_len=7, mlp_ratio=3, spatial_mode=mode, sgu_mask=sgu_mask, dtype=torch.float64)
    ref = randomize_(GatedMLPBlock(**kw))
    x = torch.randn(3, 6, 12, dtype=torch.float64)  # L = 6 < seq_len: the leading block of W
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2, [True] * 2 + [False] * 4])
    _check_same_function(ref, GatedMLPBlock(**kw, **variant), x, mask)


def test_split_linear_is_linear_halves():
    torch.manual_seed(0)
    lin = SplitLinear(5, 8, dtype=torch.float64)
    x = torch.randn(2, 3, 5, dtype=torch.float64)
    u, v = lin(x)
    ref_u, ref_v = torch.nn.functional.linear(x, lin.weight, lin.bias).chunk(2, dim=-1)
    assert u.is_contiguous() and v.is_contiguous()
    _assert_close(u, ref_u, 'first half')
    _assert_close(v, ref_v, 'second half')
    assert isinstance(lin, torch.nn.Linear) and list(lin.state_dict()) == ['weight', 'bias']
    with pytest.raises(ValueError, match='out_features must be even'):
        SplitLinear(5, 7)


def test_aligned_rows_same_values_aligned_stride():
    w = torch.randn(196, 196)
    a = aligned_rows(w, 8)
    assert torch.equal(a, w) and a.stride() == (200, 1)
    assert aligned_rows(w, 1) is w and aligned_rows(torch.randn(8, 16), 8).stride() == (16, 1)


def test_aligned_rows_gemm_same_product_and_gradients():
    """The token-major SGU's GEMM on CUDA (``addmm`` with W at a padded row stride) against W as is, here on the
    CPU: the same product and the same gradients of W, b and the activations."""
    torch.manual_seed(0)
    w, b, v = (torch.randn(*shape, dtype=torch.float64, requires_grad=True) for shape in ((13, 13), (13, 1), (13, 6)))
    results = []
    for multiple in (1, 8):
        out = torch.addmm(b, aligned_rows(w, multiple), v)
        results.append((out, *torch.autograd.grad(out, (w, b, v), torch.ones_like(out))))
    for a, ref in zip(*results):
        _assert_close(a, ref, 'aligned GEMM')


def _gemm_calls(run):
    """(aten op, tensor argument shapes) of every matrix product ``run()`` dispatches."""
    seen = []

    class Ops(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append((str(func), [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]))
            return func(*args, **(kwargs or {}))
    with Ops():
        run()
    return [s for s in seen if 'mm' in s[0]]


def test_token_major_sgu_one_gemm():
    """The token-major SGU's token mix is a single (L, L) x (L, B * C) matrix product, no batched one."""
    sgu = SpatialGatingUnit(8, 5, token_major=True)
    gemms = _gemm_calls(lambda: sgu(torch.randn(5, 3, 8)))
    assert gemms == [('aten.addmm.default', [(5, 1), (5, 5), (5, 12)])]


def test_token_major_refuses_tiny_attention():
    with pytest.raises(ValueError, match='token_major=True is for the plain gMLP block'):
        GatedMLPBlock(8, 5, attn_dim=4, token_major=True)


def test_token_major_model_keeps_layout():
    """From the second block on, a token-major gMLP's blocks pass (L, B, C)-contiguous activations (no copies)."""
    model = timm.create_model('gmlp_ti', num_blocks=3, img_size=IMG, num_classes=10,
                              block_kwargs=dict(token_major=True))
    strides = []
    for blk in model.blocks:
        blk.register_forward_hook(lambda m, i, o: strides.append(o.transpose(0, 1).is_contiguous()))
    model(torch.randn(2, 3, *IMG).contiguous(memory_format=torch.channels_last))
    assert strides == [True, True, True]


def _gmlp(seed=0, **block_kwargs):
    torch.manual_seed(seed)
    return timm.create_model('gmlp_ti', num_blocks=2, img_size=IMG, num_classes=10, drop_path_rate=0.,
                             block_kwargs=block_kwargs or None).double()


def _smlp(seed=0, **kwargs):
    torch.manual_seed(seed)
    return timm.create_model('smlpnet_t', depths=(1, 1, 1, 1), embed_dim=16, img_size=IMG, num_classes=10,
                             **kwargs).double()


@pytest.mark.parametrize('variant', GMLP_VARIANTS, ids=str)
def test_gmlp_model_variant_same_function(variant):
    x = torch.randn(2, 3, *IMG, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    _check_same_function(randomize_(_gmlp()), _gmlp(seed=1, **variant), x)


@pytest.mark.parametrize('train', [False, True])
def test_axial_sparse_mlp_one_gemm_same_function(train):
    torch.manual_seed(0)
    ref = randomize_(AxialSparseMLP(6, (4, 5), dtype=torch.float64)).train(train)
    variant = AxialSparseMLP(6, (4, 5), one_gemm_mixes=True, dtype=torch.float64).train(train)
    variant.load_state_dict(ref.state_dict())
    _check_same_function(ref, variant, torch.randn(3, 6, 4, 5, dtype=torch.float64))


@pytest.mark.parametrize('variant', SMLP_VARIANTS, ids=str)
def test_smlpnet_model_variant_same_function(variant):
    x = torch.randn(2, 3, *IMG, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    _check_same_function(randomize_(_smlp()), _smlp(seed=1, **variant), x)


def test_one_gemm_mixes_gemm_count():
    """Each axial mix of a one-GEMM sMLP is one GEMM with the whole batch in it: P = 1 for the bmm along H."""
    smlp = AxialSparseMLP(6, (4, 5), one_gemm_mixes=True)
    gemms = _gemm_calls(lambda: smlp(torch.randn(3, 6, 4, 5)))
    assert gemms == [('aten.bmm.default', [(1, 4, 4), (1, 4, 90)]), ('aten.addmm.default', [(5,), (72, 5), (5, 5)])]


# the model contract, for each variant (the default's is tests/test_models_contract.py)
CONTRACT = [('gmlp', v) for v in GMLP_VARIANTS] + [('smlp', v) for v in SMLP_VARIANTS]


def _contract_model(family, variant):
    model = (_gmlp(**variant) if family == 'gmlp' else _smlp(**variant)).float().eval()
    ref = (_gmlp() if family == 'gmlp' else _smlp()).float().eval()
    ref.load_state_dict(model.state_dict())
    return model, ref, torch.randn(2, 3, *IMG)


def _export(model, x):
    return torch.export.export(model, (x,)).module()


def _compile_capture(model, x):
    torch._dynamo.reset()
    return torch.compile(model, fullgraph=True, backend='aot_eager')  # inductor: tests/test_models_contract.py


def _fx(model, x):
    final = get_graph_node_names(model)[1][-1]
    extractor = create_feature_extractor(model, return_nodes=[final])
    return lambda inp: extractor(inp)[final]


ROUTES = {'script': lambda model, x: torch.jit.script(model),
          'trace': lambda model, x: torch.jit.trace(model, x, check_trace=False),
          'fx': _fx, 'export': _export, 'compile': _compile_capture}


@pytest.mark.parametrize('route', list(ROUTES))
@pytest.mark.parametrize('family,variant', CONTRACT, ids=str)
def test_variant_contract(family, variant, route):
    """TorchScript, jit.trace, FX feature extraction, torch.export and torch.compile capture of each variant compute
    the default model's outputs."""
    model, ref, x = _contract_model(family, variant)
    with torch.no_grad():
        torch.testing.assert_close(ROUTES[route](model, x)(x), ref(x))


@pytest.mark.parametrize('family,variant', CONTRACT, ids=str)
def test_variant_forward_intermediates(family, variant):
    model, ref, x = _contract_model(family, variant)
    with torch.no_grad():
        feats = model.forward_intermediates(x, intermediates_only=True)
        for a, b in zip(feats, ref.forward_intermediates(x, intermediates_only=True)):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize('family,variant', CONTRACT, ids=str)
def test_variant_features_only(family, variant):
    kwargs = dict(block_kwargs=variant) if family == 'gmlp' else variant
    name, size = ('gmlp_ti', dict(num_blocks=3)) if family == 'gmlp' else ('smlpnet_t', dict(depths=(1, 1, 1, 1)))
    torch.manual_seed(0)
    feat = timm.create_model(name, features_only=True, img_size=IMG, **size, **kwargs).eval()
    torch.manual_seed(0)
    ref = timm.create_model(name, features_only=True, img_size=IMG, **size).eval()
    x = torch.randn(2, 3, *IMG)
    with torch.no_grad():
        for a, b in zip(feat(x), ref(x)):
            torch.testing.assert_close(a, b)
