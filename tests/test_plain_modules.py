""" Plain modules (issue 25): a model computes module by module, the same whatever observes it.

A no-op forward hook (or pre-hook, or a global module hook) on any module -- one at a time or all at once --
leaves every model's output bit-identical (``torch.equal``): every vision model family, the BiGS layer and the text
models. Nothing here measures time.
"""
import pytest
import timm
import torch
import torch.nn as nn

import mlp_vision
import mlp_vision.text as mt
from mlp_vision.layers import BidirectionalGatedSSM

from _helpers import randomize_

IMG = (64, 96)  # non-square: divisible by 32 (sMLPNet) and 16 (gMLP / Mixer)
VISION_MODELS = list(mlp_vision.VISION_MODELS)


def _shrink(name):
    """Overrides that keep a registered vision model's blocks (its other settings, e.g. sMLPNet-T*'s MLP ratio)
    but few and narrow ones: the same code paths at a fraction of the cost."""
    if name.startswith('smlpnet'):
        return dict(depths=(1, 1, 1, 1), embed_dim=16)
    if name.startswith('mixer'):
        return dict(num_blocks=2, embed_dim=64)
    return dict(num_blocks=2)


def small_vision(name):
    torch.manual_seed(0)
    model = timm.create_model(name, img_size=IMG, num_classes=10, **_shrink(name))
    return randomize_(model, std=0.05)  # timm's init zeroes the head and the SGU's W: outputs would hide errors


def _images(n=2):
    return torch.randn(n, 3, *IMG, generator=torch.Generator().manual_seed(0))


def _text_models():
    """(name, small model of each text family and task kind, input ids)."""
    base = dict(vocab_size=50, max_position_embeddings=16, hidden_size=32, num_hidden_layers=2)
    yield 'gmlp_base', mt.create_model('gmlp_base', intermediate_size=64, **base)
    yield 'amlp_base', mt.create_model('amlp_base', intermediate_size=64, tiny_attention_size=8, **base)
    yield 'gmlp_causal_char', mt.create_model('gmlp_causal_char', intermediate_size=64, **base)
    yield 'bigs_small', mt.create_model('bigs_small', intermediate_size=48, num_ssm_states=4, pad_token_id=0, **base)
    yield 'bert_small', mt.create_model('bert_small', intermediate_size=64, num_attention_heads=2, pad_token_id=0,
                                        **base)
    gpt = dict(base, num_attention_heads=2, mlp_attention_hidden_size=24)
    yield 'gpt_mlp_attention', mt.create_model('gpt_mlp_attention', **gpt)
    yield 'gpt_sdpa', mt.create_model('gpt_sdpa', **gpt)


TEXT_NAMES = [name for name, _ in _text_models()]


def _output(model, x):
    out = model(x)
    return out if isinstance(out, torch.Tensor) else out.logits


def _run(model, x, train=False):
    """The output in eval / no_grad (inference, where in-place activations apply) or train mode with gradients."""
    model.train(train)
    torch.manual_seed(1)  # dropout, if any, draws the same masks
    if train:
        return _output(model, x).detach()
    with torch.no_grad():
        return _output(model, x)


def _with_hooks(model, x, modules, train=False, pre=False):
    """The output with a no-op forward hook (and a forward pre-hook) on each of ``modules``; hooks that fired."""
    fired = set()
    handles = []
    for m in modules:
        handles.append(m.register_forward_hook(lambda mod, inp, out: fired.add(id(mod))))
        if pre:
            handles.append(m.register_forward_pre_hook(lambda mod, inp: None))
    try:
        return _run(model, x, train), fired
    finally:
        for h in handles:
            h.remove()


def _check_hooks_change_nothing(model, x, one_at_a_time: bool):
    """Hooks (forward and pre-hooks) on all modules at once and a global module hook, in eval / no_grad and in train
    mode with gradients; with ``one_at_a_time`` also a hook on each module alone (eval): outputs equal to the bit."""
    for train in (False, True):
        ref = _run(model, x, train)
        out, fired = _with_hooks(model, x, list(model.modules()), train, pre=True)
        assert torch.equal(out, ref), f'hooks on every module changed the output (train={train})'
        assert id(model) in fired
        handle = nn.modules.module.register_module_forward_hook(lambda mod, inp, out: None)
        try:
            assert torch.equal(_run(model, x, train), ref), f'a global module hook changed the output (train={train})'
        finally:
            handle.remove()
        if not one_at_a_time or train:
            continue
        for name, m in model.named_modules():
            out, fired = _with_hooks(model, x, [m])
            where = f'{name or "the model"} ({type(m).__name__})'
            assert torch.equal(out, ref), f'a no-op hook on {where} changed the output'


@pytest.mark.parametrize('name', VISION_MODELS)
def test_noop_hooks_leave_vision_outputs_bit_identical(name, single_thread):
    """Every registered vision model: no-op hooks on all modules at once, a global hook, and (eval) a hook on each
    module alone leave the output equal to the last bit, in eval / no_grad and in train mode with gradients."""
    _check_hooks_change_nothing(small_vision(name), _images(), one_at_a_time=True)


def test_noop_hooks_leave_bigs_layer_bit_identical(single_thread):
    torch.manual_seed(0)
    layer = randomize_(BidirectionalGatedSSM(16, 24, num_states=4), std=0.05)
    x = torch.randn(2, 12, 16)
    for impl in ('direct', 'fft'):
        layer.conv_impl = impl
        _check_hooks_change_nothing(layer, x, one_at_a_time=True)


@pytest.mark.parametrize('name', TEXT_NAMES)
def test_noop_hooks_leave_text_outputs_bit_identical(name, single_thread):
    torch.manual_seed(0)
    model = randomize_(dict(_text_models())[name], std=0.05)
    x = torch.randint(1, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    _check_hooks_change_nothing(model, x, one_at_a_time=True)


# ---------------------------------------------------------------------------------------------------------------
# explicit inference fusion: timm.utils.reparameterize_model (issue 25, item 2)
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('name', VISION_MODELS)
def test_reparameterize_model_keeps_the_eval_function(name, single_thread):
    """timm's reparameterize_model runs on every vision model (a child named ``fuse`` used to be called as a fusion
    method: TypeError on every sMLPNet), computes the eval model's outputs to float32 rounding, leaves the original
    alone, and gives a model of plain modules: a hook on every module fires and changes nothing."""
    model = small_vision(name).eval()
    x = _images()
    with torch.no_grad():
        ref = model(x)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    fused = timm.utils.reparameterize_model(model)
    with torch.no_grad():
        out = fused(x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())  # not inplace: untouched
    with torch.no_grad():
        twice = timm.utils.reparameterize_model(fused)(x)
    assert torch.equal(twice, out)  # nothing left to fuse
    _check_hooks_change_nothing(fused, x, one_at_a_time=False)  # (its train-mode pass updates BN statistics)


def test_reparameterize_folds_the_smlp_batchnorm_into_the_depthwise_conv():
    """sMLPNet: every token mixer's conv_dw becomes one conv with bias computing BN(conv_dw(x)) with the running
    statistics, smlp.norm an Identity; the first BatchNorm (followed by GELU) stays. Checked on the module itself
    against BN(conv(x)) and through the hooks of the new tree."""
    from mlp_vision.layers import SparseMLPTokenMixer
    model = small_vision('smlpnet_t').eval()
    mixers = [m for m in model.modules() if isinstance(m, SparseMLPTokenMixer)]
    before = [(m.conv_dw, m.smlp.norm) for m in mixers]
    timm.utils.reparameterize_model(model, inplace=True)
    for mixer, (conv, bn) in zip(mixers, before):
        assert type(mixer.smlp.norm) is nn.Identity and type(mixer.norm) is nn.BatchNorm2d
        assert type(mixer.conv_dw) is nn.Conv2d and mixer.conv_dw.bias is not None
        x = torch.randn(2, conv.in_channels, 6, 8)
        with torch.no_grad():
            torch.testing.assert_close(mixer.conv_dw(x), bn(conv(x)), rtol=1e-5, atol=1e-5)
    seen = []
    handle = mixers[0].conv_dw.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    with torch.no_grad():
        model(_images(1))
    handle.remove()
    assert len(seen) == 1
