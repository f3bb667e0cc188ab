""" The tools users point at a model see the real model (issue 12).

Forward hooks, PEFT LoRA, int8 dynamic quantisation, stock fvcore and ``FlopCounterMode``, ONNX Runtime,
``torch.export`` with a dynamic batch, ``torch.jit.trace`` with its default checks and ``torch.compile`` across a
batch-size change: each is used the ordinary way, with no project-specific handles, and must give the right answer.
Tools that are test-only dependencies (peft, onnxruntime) skip cleanly when absent.
"""
import logging
import warnings

import pytest
import timm
import torch
import torch.nn as nn
import torch.nn.functional as F

import mlp_vision
from mlp_vision.complexity import count_module, model_macs
from mlp_vision.layers import BidirectionalGatedSSM, TokenLinear

from _helpers import randomize_

MODELS = list(mlp_vision.VISION_MODELS)
ONE_PER_FAMILY = ['gmlp_ti', 'smlpnet_t', 'mixer_s16']
SMALL = {  # a shrunk model of each family for the tools whose cost grows with depth (trace, export, compile)
    'gmlp_ti': dict(num_blocks=3),
    'smlpnet_t': dict(depths=(1, 1, 2, 1), embed_dim=32),
    'mixer_s16': dict(num_blocks=3),
}
IMG = (64, 96)  # non-square: divisible by 32 (sMLPNet) and 16 (gMLP / Mixer)


def small(name, **kwargs):
    """A shrunk model with random weights everywhere (timm's init zeroes the head: outputs would all be 0)."""
    torch.manual_seed(0)
    return randomize_(timm.create_model(name, img_size=IMG, num_classes=10, **SMALL[name], **kwargs), std=0.05)


def batch(n=2, img=IMG, seed=0):
    return torch.randn(n, 3, *img, generator=torch.Generator().manual_seed(seed))


def _quiet_fvcore(flops):
    flops.unsupported_ops_warnings(False)
    flops.uncalled_modules_warnings(False)
    return flops


# ---------------------------------------------------------------------------------------------------------------
# hooks: every Linear / Conv2d is called as a module, once per forward
# ---------------------------------------------------------------------------------------------------------------
def _check_hooks(model, x):
    calls = {}
    handles = [m.register_forward_hook(lambda mod, inp, out, name=n: calls.__setitem__(name, calls.get(name, 0) + 1))
               for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    expected = {n for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))}
    assert set(calls) == expected, f'hooks never fired on {sorted(expected - set(calls))[:5]}'
    assert set(calls.values()) == {1}


LARGE = ['gmlp_b', 'smlpnet_s', 'smlpnet_b', 'mixer_l16']  # same blocks as the smaller variants: slow only


@pytest.mark.parametrize('name', [m if m not in LARGE else pytest.param(m, marks=pytest.mark.slow) for m in MODELS])
def test_forward_hooks_fire_on_every_linear_and_conv(name):
    torch.manual_seed(0)
    model = timm.create_model(name, img_size=IMG, num_classes=10).eval()
    _check_hooks(model, batch(1))


def test_forward_hooks_fire_in_bigs_layer():
    _check_hooks(BidirectionalGatedSSM(16, 24, num_states=4).eval(), torch.randn(2, 12, 16))


def _calls_per_module(model, x, only=None):
    """How often each module's forward hook fires in one forward (hooks on every module, or on ``only``)."""
    calls = {}
    handles = [m.register_forward_hook(lambda mod, inp, out, name=n: calls.__setitem__(name, calls.get(name, 0) + 1))
               for n, m in model.named_modules() if only is None or n == only]
    try:
        with torch.no_grad():
            out = model(x)
    finally:
        for h in handles:
            h.remove()
    return calls, out


@pytest.mark.parametrize('name', ONE_PER_FAMILY + ['bigs_layer'])
def test_a_hook_on_any_single_module_fires(name):
    """Grad-CAM style: a forward hook on any one module -- norms, activations, the SGU, the sMLP, not only the
    Linears -- fires as often as that module runs in a module-by-module forward (hooks everywhere), and the output
    stays the same."""
    if name == 'bigs_layer':
        torch.manual_seed(0)
        model, x = randomize_(BidirectionalGatedSSM(16, 24, num_states=4), std=0.05).eval(), torch.randn(2, 12, 16)
    else:
        model, x = small(name).eval(), batch(1)  # one forward per module: one image is enough to count calls
    with torch.no_grad():
        ref = model(x)
    expected, out = _calls_per_module(model, x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for module_name, count in expected.items():
        calls, out = _calls_per_module(model, x, only=module_name)
        assert calls == {module_name: count}, f'{module_name}: {calls.get(module_name, 0)} calls, expected {count}'
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('name', ONE_PER_FAMILY)
def test_replaced_linear_is_used(name):
    """A child Linear swapped for another module computes with the replacement (here: the first channel-MLP fc1
    replaced by a Linear with other weights, then by one that raises)."""
    model = small(name).eval()
    x = batch()
    fc1_name = next(n for n, m in model.named_modules() if n.endswith('fc1') and type(m) is nn.Linear)
    parent = model.get_submodule(fc1_name.rsplit('.', 1)[0])
    old = parent.fc1
    with torch.no_grad():
        ref = model.forward_features(x)  # (the classifier starts at zero: compare features)
        new = nn.Linear(old.in_features, old.out_features)
        parent.fc1 = new
        assert not torch.allclose(model.forward_features(x), ref)

        class Boom(nn.Module):
            def forward(self, t):
                raise RuntimeError('replacement called')

        parent.fc1 = Boom()
        with pytest.raises(RuntimeError, match='replacement called'):
            model.forward_features(x)


# ---------------------------------------------------------------------------------------------------------------
# FLOP counters: stock fvcore (no handles) and torch's FlopCounterMode
# ---------------------------------------------------------------------------------------------------------------
def _stock_fvcore(model, x):
    """``fvcore.nn.FlopCountAnalysis`` as a user calls it: no custom handles."""
    from fvcore.nn import FlopCountAnalysis
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        flops = _quiet_fvcore(FlopCountAnalysis(model, x))
        flops.total()  # runs the trace inside the warnings filter
    return flops


def _check_flop_counters(model, x, ours):
    """Stock fvcore and torch's ``FlopCounterMode`` on ``model(x)`` against ``ours``, the report's MACs of it."""
    with torch.no_grad():
        stock = _stock_fvcore(model, x)
        assert abs(stock.total() / ours - 1) < 0.01, \
            f'stock fvcore {stock.total() / 1e9:.3f} G vs report {ours / 1e9:.3f} G MACs'
        from torch.utils.flop_counter import FlopCounterMode
        counter = FlopCounterMode(display=False)
        with counter:
            model(x)
    fcm_macs = counter.get_total_flops() / 2  # FlopCounterMode counts a MAC as 2 FLOPs
    # FlopCounterMode has no formula for normalisation layers (fvcore counts ~5 per element); all else must agree
    expected = ours - sum(v for k, v in stock.by_operator().items() if 'norm' in k)
    assert abs(fcm_macs / expected - 1) < 0.01, f'FlopCounterMode {fcm_macs / 1e9:.3f} G vs {expected / 1e9:.3f} G'


def test_stock_fvcore_gmlp_ti_is_the_paper_number():
    """The issue's check: stock fvcore on gMLP-Ti at 224 gives 1.34 G MACs (paper Table 1: 2.7 G FLOPs = 2 MACs)."""
    model = timm.create_model('gmlp_ti').eval()
    with torch.no_grad():
        macs = _stock_fvcore(model, torch.randn(1, 3, 224, 224)).total()
    assert abs(macs / 1.34e9 - 1) < 0.01


@pytest.mark.parametrize('name', ONE_PER_FAMILY)
def test_flop_counters_agree_with_report(name):
    """Every op kind of a family (SMALL: a few blocks, every stage) on a small input, counted by the report's handles
    (``count_module``); the registered models at 224 x 224 against ``model_macs``: the slow test below."""
    model = timm.create_model(name, img_size=IMG, **SMALL[name]).eval()
    x = torch.randn(1, 3, *IMG)
    _check_flop_counters(model, x, count_module(model, (x,))[0])


@pytest.mark.slow
@pytest.mark.parametrize('name', MODELS)
def test_flop_counters_agree_with_report_all_models(name):
    _check_flop_counters(timm.create_model(name).eval(), torch.randn(1, 3, 224, 224), model_macs(name))


# ---------------------------------------------------------------------------------------------------------------
# int8 dynamic quantisation
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('name', ONE_PER_FAMILY)
def test_quantize_dynamic_int8(name):
    from torch.ao.nn.quantized.dynamic import Linear as QLinear
    model = small(name).eval()
    x = batch(4)
    with torch.no_grad():
        ref = model(x)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # torch.ao.quantization's deprecation notice
        qmodel = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    mods = list(qmodel.modules())
    n_quant = sum(isinstance(m, QLinear) for m in mods)
    # every plain Linear was swapped (TokenLinear, the token-axis subclass, is left in float by this exact-type API)
    assert n_quant > 0 and not any(type(m) is nn.Linear for m in mods)
    assert n_quant == sum(type(m) is nn.Linear for m in model.modules())
    with torch.no_grad():
        out = qmodel(x)
    assert torch.isfinite(out).all()
    assert not torch.equal(out, ref)  # the int8 GEMMs were used
    cos = F.cosine_similarity(out.flatten(), ref.flatten(), dim=0)
    assert cos > 0.98, f'int8 output far from float32 (cosine {cos:.4f})'


# ---------------------------------------------------------------------------------------------------------------
# PEFT LoRA
# ---------------------------------------------------------------------------------------------------------------
def _lora(model, targets):
    peft = pytest.importorskip('peft')
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False)
    return peft.get_peft_model(model, config)


@pytest.mark.parametrize('name', ONE_PER_FAMILY)
def test_peft_lora_changes_output_and_trains(name):
    model = small(name)
    x, y = batch(8), torch.arange(8) % 10
    with torch.no_grad():
        ref = model.eval()(x)
    base = {k: v.detach().clone() for k, v in model.named_parameters()}  # (BN running statistics may move)
    lora = _lora(model, ['fc1', 'fc2'])
    assert any('lora_A' in n for n, _ in lora.named_parameters())
    with torch.no_grad():
        assert not torch.allclose(lora.eval()(x), ref, atol=1e-4)  # the adapter is used, not bypassed
    params = [p for p in lora.parameters() if p.requires_grad]
    assert params and all('lora_' in n for n, p in lora.named_parameters() if p.requires_grad)
    opt = torch.optim.AdamW(params, lr=1e-2)
    lora.train()
    losses = []
    for _ in range(8):
        loss = F.cross_entropy(lora(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1, losses
    merged_base = {k.replace('base_model.model.', '').replace('.base_layer', ''): v
                   for k, v in lora.named_parameters() if 'lora_' not in k}
    for k, v in base.items():
        assert torch.equal(merged_base[k], v), f'base weight {k} changed'


def test_peft_lora_on_bigs_projections():
    layer = BidirectionalGatedSSM(16, 24, num_states=4).eval()
    x = torch.randn(2, 12, 16)
    with torch.no_grad():
        ref = layer(x)
    lora = _lora(layer, ['value_proj', 'forward_in_proj', 'backward_in_proj', 'gate_proj', 'out_proj'])
    with torch.no_grad():
        assert not torch.allclose(lora(x), ref, atol=1e-5)


def test_lora_wraps_token_linear():
    """TokenLinear is an nn.Linear: PEFT wraps it, and the adapter's plain Linear reads the strided input correctly."""
    model = small('mixer_s16').eval()
    lora = _lora(model, ['fc1', 'fc2'])
    wrapped = lora.base_model.model.blocks[0].mlp_tokens.fc1
    assert isinstance(wrapped.base_layer, TokenLinear)
    x = torch.randn(2, 24, 3).transpose(1, 2)  # (B, C, n): n = 24 tokens, strided last axis
    with torch.no_grad():
        a, b = wrapped.lora_A['default'], wrapped.lora_B['default']
        expected = wrapped.base_layer(x) + b(a(x)) * wrapped.scaling['default']
        torch.testing.assert_close(wrapped(x), expected)


# ---------------------------------------------------------------------------------------------------------------
# exporters and compilers
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('name', ONE_PER_FAMILY)
def test_jit_trace_default_checks_with_grad(name):
    model = small(name).eval()
    x = batch()
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # TracerWarnings of the input check (shapes are constants in a trace)
        traced = torch.jit.trace(model, x)  # check_trace=True: re-traces and compares the graphs
    with torch.no_grad():
        torch.testing.assert_close(traced(batch(seed=1)), model(batch(seed=1)), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('name', ONE_PER_FAMILY)
def test_torch_export_dynamic_batch(name):
    from torch.export import Dim
    model = small(name).eval()
    ep = torch.export.export(model, (batch(2),), dynamic_shapes=({0: Dim('batch')},))
    with torch.no_grad():
        for n in (1, 5, 17):
            x = batch(n, seed=n)
            torch.testing.assert_close(ep.module()(x), model(x), atol=1e-5, rtol=1e-5)


# one block (per stage): every op of the family's graph, exported at about half the cost of SMALL's depth
ONE_BLOCK = {'gmlp_ti': dict(num_blocks=1), 'smlpnet_t': dict(SMALL['smlpnet_t'], depths=(1, 1, 1, 1)),
             'mixer_s16': dict(num_blocks=1)}


@pytest.mark.parametrize('name', ONE_PER_FAMILY)
def test_onnx_runtime_matches(name):
    ort = pytest.importorskip('onnxruntime')
    pytest.importorskip('onnxscript')
    import io
    for img in ((64, 64), IMG):
        torch.manual_seed(0)
        model = timm.create_model(name, img_size=img, num_classes=10, **ONE_BLOCK[name]).eval()
        x = batch(2, img)
        buf = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            logging.disable(logging.WARNING)
            try:
                torch.onnx.export(model, (x,), buf, dynamo=True)
            finally:
                logging.disable(logging.NOTSET)
        session = ort.InferenceSession(buf.getvalue(), providers=['CPUExecutionProvider'])
        (out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        with torch.no_grad():
            torch.testing.assert_close(torch.from_numpy(out), model(x), atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize('name', ONE_PER_FAMILY)
def test_torch_compile_batch_size_change(name):
    """Default torch.compile across a batch-size change (the partial last batch of an epoch): recompiles once
    (dynamic batch) and matches eager at both sizes."""
    torch._dynamo.reset()
    model = small(name).eval()
    compiled = torch.compile(model)
    with torch.no_grad():
        for n in (2, 3, 5):
            x = batch(n, seed=n)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)
