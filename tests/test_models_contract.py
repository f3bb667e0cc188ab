""" timm model contract for every vision model registered by ``mlp_vision``.

Mirrors what timm's own ``tests/test_models.py`` asserts (forward / backward, default cfgs, forward_intermediates,
features_only, TorchScript, FX, torch.export, torch.compile, drop path, grad checkpointing, group_matcher,
device / dtype kwargs), plus parameter counts against the papers' tables (docs/models.md) and registry hygiene.

Contract checks run at a small non-square input (``IMG``) with ``NUM_CLASSES`` outputs. Where a check is about
the contract rather than the variant, depth is shrunk (``small_kwargs``: one block per sMLPNet stage, four
blocks for gMLP / Mixer) while the variant's widths are kept. Heavier variants of the checks are marked
``slow`` (run with ``-m slow``).
"""
import copy
import functools
import importlib

import pytest
import torch
import torch.nn as nn
import timm
import timm.optim
from timm.data import (
    IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, IMAGENET_INCEPTION_MEAN, IMAGENET_INCEPTION_STD)
from timm.layers import DropPath
from timm.models._features_fx import create_feature_extractor, get_graph_node_names

import mlp_vision
from mlp_vision import MlpMixer, SparseMLPNet

# ---------------------------------------------------------------------------------------------------------------
# Parameter-count targets at 224x224, 1000 classes (the papers' model tables; docs/models.md).
#   sMLPNet: the counts measured on the official SPACH code (fvcore, 224x224), pinned within 0.5 %.
#   gMLP-S / -B: the timm-layout counts (19.42 M, 73.08 M), within 0.5 %.
#   gMLP-Ti: the paper's 5.9 M, rounded to 0.1 M (our 5.867 M must round to it; it must also equal timm's count).
#   Mixer-B/16, -L/16: the Mixer paper's 59 M / 207 M count the model WITHOUT the 1000-class head (rounded to 1 M).
#   Mixer-S/16: no paper number; must equal timm's mixer_s16_224.
# ---------------------------------------------------------------------------------------------------------------
PARAMS_WITHIN_HALF_PERCENT = {  # millions, |ours / target - 1| <= 0.5 %
    'smlpnet_t_a2': 19.18,  # sMLPNet-T* (alpha = 2)
    'smlpnet_t': 24.12,
    'smlpnet_s': 48.56,
    'smlpnet_b': 65.88,
    'gmlp_s': 19.42,
    'gmlp_b': 73.08,
}
PARAMS_ROUNDED = {  # model -> (millions, decimals to round ours to, head included?)
    'gmlp_ti': (5.9, 1, True),
    'mixer_b16': (59, 0, False),
    'mixer_l16': (207, 0, False),
}
TIMM_EQUIVALENT = {  # ours -> timm's model of the same architecture (same parameter count at 224)
    'gmlp_ti': 'gmlp_ti16_224',
    'gmlp_s': 'gmlp_s16_224',
    'gmlp_b': 'gmlp_b16_224',
    'mixer_s16': 'mixer_s16_224',
    'mixer_b16': 'mixer_b16_224',
    'mixer_l16': 'mixer_l16_224',
}

# Architecture of each variant (paper tables): width C (first stage for sMLPNet) and depth.
VARIANTS = {
    'gmlp_ti': dict(dim=128, depth=30, mlp_ratio=6),
    'gmlp_s': dict(dim=256, depth=30, mlp_ratio=6),
    'gmlp_b': dict(dim=512, depth=30, mlp_ratio=6),
    'smlpnet_t': dict(dim=80, depths=(2, 8, 14, 2), mlp_ratio=3),
    'smlpnet_t_a2': dict(dim=80, depths=(2, 8, 14, 2), mlp_ratio=2),
    'smlpnet_s': dict(dim=96, depths=(2, 10, 24, 2), mlp_ratio=3),
    'smlpnet_b': dict(dim=112, depths=(2, 10, 24, 2), mlp_ratio=3),
    'mixer_s16': dict(dim=512, depth=8, mlp_ratio=4),
    'mixer_b16': dict(dim=768, depth=12, mlp_ratio=4),
    'mixer_l16': dict(dim=1024, depth=24, mlp_ratio=4),
}

MODELS = list(mlp_vision.VISION_MODELS)
# the smallest model of each family (for the checks that are slow-ish per model)
ONE_PER_FAMILY = ['gmlp_ti', 'smlpnet_t_a2', 'mixer_s16']
# The wider / deeper variants build the classes of the smallest model of their family (that model's checks run
# the same code); the checks of code rather than of a variant's numbers run them with -m slow only.
LARGER_SIBLING_OF = {'smlpnet_t': 'smlpnet_t_a2', 'smlpnet_s': 'smlpnet_t_a2', 'smlpnet_b': 'smlpnet_t_a2',
                     'gmlp_s': 'gmlp_ti', 'gmlp_b': 'gmlp_ti', 'mixer_b16': 'mixer_s16', 'mixer_l16': 'mixer_s16'}
assert set(LARGER_SIBLING_OF.values()) == set(ONE_PER_FAMILY) and set(LARGER_SIBLING_OF) | set(ONE_PER_FAMILY) == set(
    MODELS)


def siblings_slow(models):
    return [pytest.param(m, marks=pytest.mark.slow) if m in LARGER_SIBLING_OF else m for m in models]


MODELS_SIBLINGS_SLOW = siblings_slow(MODELS)
SMLP_MODELS = [m for m in MODELS if m.startswith('smlpnet')]
ISO_MODELS = [m for m in MODELS if not m.startswith('smlpnet')]

IMG = (64, 96)  # non-square; divisible by 32 (sMLPNet) and 16 (gMLP / Mixer)
NUM_CLASSES = 10
B = 2
ISO_SMALL_BLOCKS = 4  # >= 3, the default number of features_only maps of the isotropic models


def is_smlp(name):
    return name.startswith('smlpnet')


def small_kwargs(name):
    """Shrink depth (keep the variant's widths) for checks about the contract rather than the variant."""
    if is_smlp(name):
        return dict(depths=(1, 1, 1, 1))
    return dict(num_blocks=ISO_SMALL_BLOCKS)


@functools.lru_cache(maxsize=None)
def meta_model(name):
    """The full-size model on the meta device, built once (a large sMLPNet takes seconds even there); shared by the
    checks that only read it: do not change it."""
    return timm.create_model(name, device='meta')


_PROTOTYPES = {}


def _build(name, small, kwargs):
    kwargs = dict(kwargs)
    kwargs.setdefault('img_size', IMG)
    kwargs.setdefault('num_classes', NUM_CLASSES)
    if small:
        kwargs = dict(small_kwargs(name), **kwargs)
    return timm.create_model(name, **kwargs)


def create(name, small=True, **kwargs):
    """Build a model (contract size by default). The plain contract-size model is built once, with a fixed
    seed, and deep-copied for each use (construction dominates the cost of many checks)."""
    if kwargs or not small:
        return _build(name, small, kwargs)
    key = name
    if key not in _PROTOTYPES:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            _PROTOTYPES[key] = _build(name, small, {})
    return copy.deepcopy(_PROTOTYPES[key])


def make_input(batch=B, img=IMG, chans=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, chans, *img, generator=g)


def dim_of(name):
    return VARIANTS[name]['dim']


def num_features_of(name):
    return dim_of(name) * 8 if is_smlp(name) else dim_of(name)


def grid(img=IMG, stride=16):
    return img[0] // stride, img[1] // stride


def all_blocks(model):
    if isinstance(model, SparseMLPNet):
        return [blk for stage in model.stages for blk in stage.blocks]
    return list(model.blocks)


def count_params(model, exclude_prefix=None):
    return sum(p.numel() for n, p in model.named_parameters() if not (exclude_prefix and n.startswith(exclude_prefix)))


def assert_same(a, b, atol=1e-6, rtol=1e-6):
    torch.testing.assert_close(a, b, atol=atol, rtol=rtol)


# ---------------------------------------------------------------------------------------------------------------
# 1. forward + backward
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('name, sibling', sorted(LARGER_SIBLING_OF.items()))
def test_larger_variants_build_the_classes_of_their_sibling(name, sibling):
    """What lets the default run check the code on the smaller sibling only: the same module classes, in the same
    order of first use, at other widths and depths."""
    def kinds(model_name):
        return list(dict.fromkeys(type(m) for m in meta_model(model_name).modules()))
    assert kinds(name) == kinds(sibling)


@pytest.mark.parametrize('name', MODELS_SIBLINGS_SLOW)
def test_forward_backward(name):
    """Full-depth variant: (B, num_classes) finite output and a non-zero gradient for every parameter."""
    torch.manual_seed(0)
    model = create(name, small=False)
    model.train()
    # the Mixer / gMLP head is zero-initialised (as timm's), which would zero every upstream gradient
    nn.init.normal_(model.get_classifier().weight, std=0.02)
    x = make_input()
    out = model(x)
    assert out.shape == (B, NUM_CLASSES)
    assert torch.isfinite(out).all()
    (out * torch.randn_like(out)).sum().backward()
    num_params = sum(p.numel() for p in model.parameters())
    num_grad = 0
    for n, p in model.named_parameters():
        assert p.grad is not None, f'no gradient for {n} (unused parameter)'
        assert torch.isfinite(p.grad).all(), f'non-finite gradient for {n}'
        assert p.grad.abs().max() > 0, f'all-zero gradient for {n}'
        num_grad += p.grad.numel()
    assert num_grad == num_params


@pytest.mark.parametrize('name', MODELS)
def test_variant_architecture(name):
    """Widths / depths / MLP ratios of each variant (built on meta, at 224)."""
    v = VARIANTS[name]
    model = meta_model(name)
    if is_smlp(name):
        assert isinstance(model, SparseMLPNet)
        assert tuple(len(s.blocks) for s in model.stages) == v['depths']
        for i, stage in enumerate(model.stages):
            for blk in stage.blocks:
                assert blk.mlp.fc1.in_features == v['dim'] * 2 ** i
                assert blk.mlp.fc1.out_features == v['dim'] * 2 ** i * v['mlp_ratio']
    else:
        assert isinstance(model, MlpMixer)
        assert len(model.blocks) == v['depth']
        assert model.embed_dim == v['dim']
        assert model.stem.proj.kernel_size == (16, 16) and model.stem.proj.stride == (16, 16)
        blk = model.blocks[0]
        if name.startswith('gmlp'):
            assert isinstance(blk, mlp_vision.layers.GatedMLPBlock)
            assert blk.fc1.out_features == v['dim'] * v['mlp_ratio']
            assert blk.sgu.weight.shape == (196, 196)
        else:
            assert isinstance(blk, mlp_vision.layers.MixerBlock)
            assert blk.mlp_channels.fc1.out_features == v['dim'] * 4
            assert blk.mlp_tokens.fc1.in_features == 196
            assert blk.mlp_tokens.fc1.out_features == v['dim'] // 2


# ---------------------------------------------------------------------------------------------------------------
# 2. default cfgs (timm's test_model_default_cfgs / _non_std)
# ---------------------------------------------------------------------------------------------------------------
def expected_cfg(name):
    if is_smlp(name):
        return dict(
            mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD, crop_pct=0.875, interpolation='bicubic',
            first_conv='stem', classifier='head.fc', license='mit', paper_ids='arXiv:2109.05422',
            origin_url='https://github.com/microsoft/SPACH', pool_size=(7, 7))
    if name.startswith('gmlp'):
        # gMLP: no official weights; only gmlp_s has (timm's) weights, and only that entry sets origin_url
        origin = 'https://github.com/huggingface/pytorch-image-models' if name == 'gmlp_s' else None
        return dict(
            mean=IMAGENET_INCEPTION_MEAN, std=IMAGENET_INCEPTION_STD, crop_pct=0.875, interpolation='bicubic',
            first_conv='stem.proj', classifier='head', license='apache-2.0', paper_ids='arXiv:2105.08050',
            origin_url=origin, pool_size=None)
    return dict(
        mean=IMAGENET_INCEPTION_MEAN, std=IMAGENET_INCEPTION_STD, crop_pct=0.875, interpolation='bicubic',
        first_conv='stem.proj', classifier='head', license='apache-2.0', paper_ids='arXiv:2105.01601',
        origin_url='https://github.com/google-research/vision_transformer', pool_size=None)


@pytest.mark.parametrize('name', MODELS)
def test_default_cfg(name):
    model = create(name).eval()
    cfg = model.pretrained_cfg
    assert cfg == model.default_cfg
    for k, v in expected_cfg(name).items():
        assert cfg.get(k) == v, f'{name}: pretrained_cfg[{k!r}] = {cfg.get(k)!r}, expected {v!r}'
    assert cfg['fixed_input_size'] is True
    assert cfg['input_size'] == (3, 224, 224)
    assert cfg['num_classes'] == 1000
    assert cfg['architecture'] == name

    # first_conv / classifier name the right modules (timm checks '<name>.weight' is in the state dict)
    sd = model.state_dict()
    first_conv = model.get_submodule(cfg['first_conv'])
    assert cfg['first_conv'] + '.weight' in sd
    assert isinstance(first_conv, nn.Conv2d) and first_conv.in_channels == 3
    classifier = model.get_submodule(cfg['classifier'])
    assert cfg['classifier'] + '.weight' in sd
    assert isinstance(classifier, nn.Linear) and classifier.out_features == NUM_CLASSES
    assert classifier is model.get_classifier()

    nf = num_features_of(name)
    assert model.num_features == nf and model.head_hidden_size == nf
    assert classifier.in_features == nf

    x = make_input()
    with torch.no_grad():
        feat = model.forward_features(x)
        if is_smlp(name):
            assert feat.shape == (B, nf, IMG[0] // 32, IMG[1] // 32)
        else:
            assert feat.shape == (B, grid()[0] * grid()[1], nf)
        pre = model.forward_head(feat, pre_logits=True)
        assert pre.shape == (B, model.head_hidden_size)
        assert_same(pre, feat.mean(dim=(2, 3)) if is_smlp(name) else feat.mean(dim=1))
        out = model(x)
        assert_same(model.forward_head(feat), out)

        # classifier removed: pooled features
        model.reset_classifier(0)
        out0 = model(x)
        assert out0.shape == (B, model.num_features)
        assert_same(out0, pre)

        # new classifier
        model.reset_classifier(5)
        head = model.get_classifier()
        assert isinstance(head, nn.Linear) and head.out_features == 5 and head.in_features == nf
        assert head is model.get_submodule(cfg['classifier'])
        assert model.num_classes == 5
        assert model(x).shape == (B, 5)

        # no pooling, no classifier: unpooled features (timm: reset_classifier(0, ''))
        model.reset_classifier(0, '')
        assert_same(model(x), feat)


@pytest.mark.parametrize('name', SMLP_MODELS)
def test_default_cfg_pool_size(name):
    """timm: forward_features at the cfg's input_size has the cfg's pool_size (checked on meta, full model)."""
    model = meta_model(name).eval()
    cfg = model.pretrained_cfg
    feat = model.forward_features(torch.empty(1, *cfg['input_size'], device='meta'))
    assert tuple(feat.shape[-2:]) == cfg['pool_size']
    assert feat.shape[1] == model.num_features


@pytest.mark.parametrize('name', MODELS_SIBLINGS_SLOW)
def test_num_classes_zero_and_global_pool(name):
    x = make_input()
    model = create(name).eval()
    cls = model.pretrained_cfg['classifier'] + '.'
    backbone_sd = {k: v for k, v in model.state_dict().items() if not k.startswith(cls)}
    with torch.no_grad():
        feat = model.forward_features(x)
        pooled = model.forward_head(feat, pre_logits=True)

    model0 = create(name, num_classes=0).eval()
    assert not any(k.startswith(cls) for k in model0.state_dict())
    model0.load_state_dict(backbone_sd, strict=True)
    assert isinstance(model0.get_classifier(), nn.Identity)
    with torch.no_grad():
        out0 = model0(x)
    assert out0.shape == (B, model0.num_features) == (B, num_features_of(name))
    assert_same(out0, pooled)

    model_np = create(name, num_classes=0, global_pool='').eval()
    model_np.load_state_dict(backbone_sd, strict=True)
    with torch.no_grad():
        out_np = model_np(x)
    if is_smlp(name):
        assert out_np.shape == (B, num_features_of(name), IMG[0] // 32, IMG[1] // 32)
    else:
        assert out_np.shape == (B, grid()[0] * grid()[1], num_features_of(name))
    assert_same(out_np, feat)


@pytest.mark.parametrize('name', MODELS)
def test_pretrained_tags(name):
    """Every pretrained tag has a weight location; tags that reuse timm's files also reuse timm's preprocessing."""
    cfgs = timm.models.get_arch_pretrained_cfgs(name)
    assert cfgs, f'{name} has no pretrained cfg'
    for full_name, cfg in cfgs.items():
        assert full_name.startswith(name + '.')
        if cfg.tag == 'untrained':
            assert not cfg.url and not cfg.hf_hub_id
            continue
        assert cfg.url or cfg.hf_hub_id
        if cfg.hf_hub_id and cfg.hf_hub_id.startswith('timm/'):
            timm_name = cfg.hf_hub_id[len('timm/'):]
            ref = timm.models.get_pretrained_cfg(timm_name)
            assert ref is not None, f'{full_name} points at {timm_name}, which timm does not have'
            for k in ('url', 'mean', 'std', 'crop_pct', 'interpolation', 'num_classes', 'input_size',
                      'first_conv', 'classifier'):
                assert getattr(cfg, k) == getattr(ref, k), f'{full_name}.{k} differs from {timm_name}'


# ---------------------------------------------------------------------------------------------------------------
# 3. forward_intermediates / prune_intermediate_layers
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('name', MODELS_SIBLINGS_SLOW)
def test_forward_intermediates(name):
    model = create(name).eval()
    x = make_input()
    C = dim_of(name)
    with torch.no_grad():
        feat = model.forward_features(x)
        final, inter = model.forward_intermediates(x)
        assert torch.equal(final, feat)
        assert len(inter) == len(model.feature_info)
        for t, info in zip(inter, model.feature_info):  # as timm's test_model_forward_intermediates
            assert t.shape == (B, info['num_chs'], IMG[0] // info['reduction'], IMG[1] // info['reduction'])

        if is_smlp(name):
            assert [t.shape for t in inter] == [
                (B, C * 2 ** i, IMG[0] // s, IMG[1] // s) for i, s in enumerate((4, 8, 16, 32))]
            assert [i['reduction'] for i in model.feature_info] == [4, 8, 16, 32]
            # norm=True normalises (only) the last map with the final norm: it is then forward_features' output
            _, inter_n = model.forward_intermediates(x, norm=True)
            assert torch.equal(inter_n[-1], feat)
            for a, b in zip(inter_n[:-1], inter[:-1]):
                assert torch.equal(a, b)
            with pytest.raises(ValueError):
                model.forward_intermediates(x, output_fmt='NLC')
        else:
            n = ISO_SMALL_BLOCKS
            h, w = grid()
            assert len(inter) == n
            assert all(t.shape == (B, C, h, w) for t in inter)
            _, inter_nlc = model.forward_intermediates(x, output_fmt='NLC')
            assert all(t.shape == (B, h * w, C) for t in inter_nlc)
            # NCHW is the row-major token grid of NLC
            for a, b in zip(inter, inter_nlc):
                assert torch.equal(a, b.transpose(1, 2).reshape(B, C, h, w))
            # the last block's output, normalised, is forward_features
            assert_same(model.norm(inter_nlc[-1]), feat)
            _, inter_n = model.forward_intermediates(x, norm=True, output_fmt='NLC')
            for a, b in zip(inter_n, inter_nlc):
                assert_same(a, model.norm(b))

        n_all = len(inter)
        # indices as int: the last n
        _, last2 = model.forward_intermediates(x, indices=2)
        assert len(last2) == 2
        for a, b in zip(last2, inter[-2:]):
            assert torch.equal(a, b)
        # indices as list
        _, sel = model.forward_intermediates(x, indices=[0, 2])
        assert len(sel) == 2
        assert torch.equal(sel[0], inter[0]) and torch.equal(sel[1], inter[2])
        # stop_early: same intermediates
        _, sel_early = model.forward_intermediates(x, indices=[0, 2], stop_early=True)
        for a, b in zip(sel_early, sel):
            assert torch.equal(a, b)
        # intermediates_only
        only = model.forward_intermediates(x, indices=[1, n_all - 1], intermediates_only=True)
        assert isinstance(only, list) and len(only) == 2
        assert torch.equal(only[0], inter[1]) and torch.equal(only[1], inter[-1])
        only_early = model.forward_intermediates(x, indices=[1], stop_early=True, intermediates_only=True)
        assert len(only_early) == 1 and torch.equal(only_early[0], inter[1])


@pytest.mark.parametrize('name', MODELS)
def test_prune_intermediate_layers(name):
    model = create(name).eval()
    x = make_input()
    indices = [0, 1]
    with torch.no_grad():
        ref = model.forward_intermediates(x, indices=indices, intermediates_only=True)
        taken = model.prune_intermediate_layers(indices)
        assert list(taken) == indices
        n_kept = len(model.stages) if is_smlp(name) else len(model.blocks)
        assert n_kept == 2
        pruned = model.forward_intermediates(x, indices=indices, intermediates_only=True)
        assert len(pruned) == len(ref)
        for a, b in zip(pruned, ref):
            assert torch.equal(a, b)
        # the pruned model still runs forward (head removed: unpooled features of the last kept block / stage)
        out = model(x)
        if is_smlp(name):
            assert model.num_features == model.head_hidden_size == dim_of(name) * 2
            assert out.shape == (B, dim_of(name) * 2, IMG[0] // 8, IMG[1] // 8)
            assert torch.equal(out, ref[-1])
        else:
            assert out.shape == (B, grid()[0] * grid()[1], dim_of(name))


# ---------------------------------------------------------------------------------------------------------------
# 4. features_only
# ---------------------------------------------------------------------------------------------------------------
def _features_vs_intermediates(name, indices, **kwargs):
    """features_only model and a plain model with identical weights (same seed, same construction order)."""
    x = make_input()
    torch.manual_seed(0)
    fmodel = create(name, features_only=True, **kwargs).eval()
    torch.manual_seed(0)
    model = create(name).eval()
    with torch.no_grad():
        feats = fmodel(x)
        ref = model.forward_intermediates(x, indices=indices, intermediates_only=True)
    assert isinstance(feats, list) and len(feats) == len(ref)
    for a, b in zip(feats, ref):
        assert_same(a, b)
    return fmodel, feats


@pytest.mark.parametrize('name', siblings_slow(SMLP_MODELS))
def test_features_only_smlpnet(name):
    C = dim_of(name)
    fmodel, feats = _features_vs_intermediates(name, None)
    assert fmodel.feature_info.reduction() == [4, 8, 16, 32]
    assert fmodel.feature_info.channels() == [C, 2 * C, 4 * C, 8 * C]
    assert [f.shape for f in feats] == [(B, C * 2 ** i, IMG[0] // s, IMG[1] // s)
                                        for i, s in enumerate((4, 8, 16, 32))]

    fmodel, feats = _features_vs_intermediates(name, [1, 3], out_indices=(1, 3))
    assert fmodel.feature_info.reduction() == [8, 32]
    assert fmodel.feature_info.channels() == [2 * C, 8 * C]
    assert [f.shape for f in feats] == [(B, 2 * C, IMG[0] // 8, IMG[1] // 8), (B, 8 * C, IMG[0] // 32, IMG[1] // 32)]


@pytest.mark.parametrize('name', siblings_slow(ISO_MODELS))
def test_features_only_isotropic(name):
    C = dim_of(name)
    h, w = grid()
    fmodel, feats = _features_vs_intermediates(name, 3)  # getter path, default out_indices: the last 3 blocks
    assert len(feats) == 3
    assert fmodel.feature_info.reduction() == [16, 16, 16]
    assert fmodel.feature_info.channels() == [C, C, C]
    assert all(f.shape == (B, C, h, w) for f in feats)

    fmodel, feats = _features_vs_intermediates(name, [0, 2], out_indices=(0, 2))
    assert fmodel.feature_info.reduction() == [16, 16]
    assert fmodel.feature_info.channels() == [C, C]
    assert all(f.shape == (B, C, h, w) for f in feats)


# ---------------------------------------------------------------------------------------------------------------
# 5. TorchScript (script and trace)
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('name', MODELS_SIBLINGS_SLOW)
def test_torchscript(name):
    model = create(name).eval()
    x = make_input()
    with torch.no_grad():
        ref = model(x)
        scripted = torch.jit.script(model)
        for _ in range(2):  # the second call runs the optimised graph
            assert_same(scripted(x), ref, atol=1e-5, rtol=1e-5)
        traced = torch.jit.trace(model, x, check_trace=False)
        assert_same(traced(x), ref, atol=1e-5, rtol=1e-5)
        assert_same(traced(make_input(seed=1)), model(make_input(seed=1)), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# 6. FX (timm's feature extraction)
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('name', MODELS)
def test_fx(name):
    model = create(name).eval()
    x = make_input()
    train_nodes, eval_nodes = get_graph_node_names(model)
    assert train_nodes and eval_nodes
    final = eval_nodes[-1]
    fx_model = create_feature_extractor(model, return_nodes=[final])
    with torch.no_grad():
        out = fx_model(x)[final]
        assert_same(out, model(x))


@pytest.mark.parametrize('name', MODELS)
def test_fx_keeps_input_check(name):
    """FX-extracted models validate their input as the eager model does (ValueError naming the expected size).

    For gMLP / Mixer an input with H and W swapped has the same number of tokens, so without the check it would
    run and silently mix the wrong tokens.
    """
    model = create(name).eval()
    final = get_graph_node_names(model)[1][-1]
    fx_models = [create_feature_extractor(model, return_nodes=[final])]
    if is_smlp(name):
        fx_models.append(create(name, features_only=True, feature_cls='fx').eval())
    swapped = make_input(img=(IMG[1], IMG[0]), batch=1)
    with torch.no_grad():
        for fx_model in fx_models:
            with pytest.raises(ValueError, match=f'{IMG[0]}x{IMG[1]}'):
                fx_model(swapped)


@pytest.mark.parametrize('name', SMLP_MODELS)
def test_features_only_fx_smlpnet(name):
    C = dim_of(name)
    x = make_input()
    torch.manual_seed(0)
    fx_feat = create(name, features_only=True, feature_cls='fx').eval()
    torch.manual_seed(0)
    model = create(name).eval()
    assert fx_feat.feature_info.reduction() == [4, 8, 16, 32]
    assert fx_feat.feature_info.channels() == [C, 2 * C, 4 * C, 8 * C]
    with torch.no_grad():
        feats = fx_feat(x)
        ref = model.forward_intermediates(x, intermediates_only=True)
    assert len(feats) == 4
    for a, b in zip(feats, ref):
        assert torch.equal(a, b)  # the FX graph calls the same modules as the eager forward: equal to the last bit


# ---------------------------------------------------------------------------------------------------------------
# 7. torch.export
# ---------------------------------------------------------------------------------------------------------------
def _check_export(model):
    model.eval()
    x = make_input()
    ep = torch.export.export(model, (x,))
    with torch.no_grad():
        assert_same(ep.module()(x), model(x), atol=1e-5, rtol=1e-5)
        x2 = make_input(seed=1)
        assert_same(ep.module()(x2), model(x2), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('name', MODELS_SIBLINGS_SLOW)
def test_torch_export(name):
    # shrunk depth: export takes < 1 s per model this way
    _check_export(create(name))


@pytest.mark.slow
@pytest.mark.parametrize('name', MODELS)
def test_torch_export_full_depth(name):
    _check_export(create(name, small=False))


# ---------------------------------------------------------------------------------------------------------------
# 8. torch.compile(fullgraph=True)
# ---------------------------------------------------------------------------------------------------------------
def _check_compile(model, x, backend='inductor'):
    model.eval()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    with torch.no_grad():
        assert_same(compiled(x), model(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize('name', ONE_PER_FAMILY)
def test_torch_compile_fullgraph_capture(name):
    """Dynamo captures the whole model (fullgraph=True: no graph break) and AOTAutograd runs it.

    The inductor backend costs 35-50 s for even the tiniest model on this 2-core CPU with a cold cache, so only
    ``test_torch_compile_tiny`` uses it by default (``test_torch_compile``, every model, is ``slow``); this checks
    the capture of one model per family in ~2 s each.
    """
    _check_compile(create(name), make_input(), backend='aot_eager')


@pytest.mark.parametrize('name', MODELS_SIBLINGS_SLOW)
def test_no_graph_breaks_in_training(name):
    """Dynamo captures every vision model in training mode (drop path, the BatchNorm statistics update) as one graph:
    ``torch._dynamo.explain`` counts no graph break. Eval mode: ``test_torch_compile_fullgraph_capture``."""
    model = create(name).train()
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(make_input())
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_torch_compile_tiny():
    """inductor, one tiny config: two stages hold every kind of op of the model (stem, block, the downsampling
    between stages, norm, head); each more stage is only more kernels of the same kinds to compile."""
    model = timm.create_model('smlpnet_t', img_size=32, depths=(1, 1), embed_dim=16, num_classes=NUM_CLASSES)
    _check_compile(model, make_input(img=(32, 32)))


@pytest.mark.slow
@pytest.mark.parametrize('name', MODELS)
def test_torch_compile(name):
    """inductor, every model (contract size)."""
    _check_compile(create(name), make_input())


# ---------------------------------------------------------------------------------------------------------------
# 9. drop path
# ---------------------------------------------------------------------------------------------------------------
def _block_drop_rates(model):
    return [blk.drop_path.drop_prob if isinstance(blk.drop_path, DropPath) else 0. for blk in all_blocks(model)]


@pytest.mark.parametrize('name', MODELS)
def test_drop_path_schedule(name):
    rate = 0.3
    model = timm.create_model(name, device='meta', drop_path_rate=rate)
    rates = _block_drop_rates(model)
    n = len(rates)
    assert n == (sum(VARIANTS[name]['depths']) if is_smlp(name) else VARIANTS[name]['depth'])
    assert rates == pytest.approx([rate * i / (n - 1) for i in range(n)], abs=1e-6)
    # every DropPath module belongs to a block (none anywhere else) and the first block has none
    drop_paths = [m for m in model.modules() if isinstance(m, DropPath)]
    assert len(drop_paths) == n - 1
    assert all(isinstance(blk.drop_path, DropPath) for blk in all_blocks(model)[1:])

    model0 = meta_model(name)
    assert not any(isinstance(m, DropPath) for m in model0.modules())


@pytest.mark.parametrize('name', MODELS)
def test_drop_path_train_vs_eval(name):
    x = make_input()
    torch.manual_seed(0)
    model = create(name, drop_path_rate=0.5)
    nn.init.normal_(model.get_classifier().weight, std=0.02)

    model.train()
    with torch.no_grad():
        torch.manual_seed(1)
        a = model(x)
        torch.manual_seed(2)
        b = model(x)
        torch.manual_seed(1)
        a_again = model(x)
    assert not torch.allclose(a, b), 'drop path has no effect in train mode'
    assert torch.equal(a, a_again)

    # eval: deterministic, and the same function as the model without drop path (drop path has no parameters)
    plain = create(name).eval()
    plain.load_state_dict(model.state_dict(), strict=True)
    model.eval()
    with torch.no_grad():
        e1 = model(x)
        e2 = model(x)
        ref = plain(x)
    assert torch.equal(e1, e2)
    assert_same(e1, ref)


# ---------------------------------------------------------------------------------------------------------------
# 10. gradient checkpointing
# ---------------------------------------------------------------------------------------------------------------
def _count_saved_tensors(model, x):
    count = [0]

    def pack(t):
        count[0] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return count[0]


@pytest.mark.parametrize('name', MODELS_SIBLINGS_SLOW)
def test_grad_checkpointing(name):
    x = make_input()
    torch.manual_seed(0)
    model = create(name).train()
    nn.init.normal_(model.get_classifier().weight, std=0.02)
    w = torch.randn(B, NUM_CLASSES, generator=torch.Generator().manual_seed(3))
    state = {k: v.clone() for k, v in model.state_dict().items()}

    def run():
        model.load_state_dict(state)  # reset BatchNorm running stats
        model.zero_grad(set_to_none=True)
        out = model(x)
        (out * w).sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    out_ref, grads_ref = run()
    saved_ref = _count_saved_tensors(model, x)
    model.set_grad_checkpointing(True)
    out_ckpt, grads_ckpt = run()
    saved_ckpt = _count_saved_tensors(model, x)

    assert saved_ckpt < saved_ref / 2, 'set_grad_checkpointing(True) does not checkpoint the blocks'
    assert_same(out_ckpt, out_ref)
    assert grads_ckpt.keys() == grads_ref.keys()
    for n in grads_ref:
        assert_same(grads_ckpt[n], grads_ref[n], atol=1e-6, rtol=1e-5)

    # forward_intermediates honours it too and gives the same values
    model.eval()
    with torch.no_grad():
        final_ckpt, inter_ckpt = model.forward_intermediates(x)
        model.set_grad_checkpointing(False)
        final, inter = model.forward_intermediates(x)
    assert_same(final_ckpt, final)
    for a, b in zip(inter_ckpt, inter):
        assert_same(a, b)


# ---------------------------------------------------------------------------------------------------------------
# 11. group_matcher, layer-wise lr decay
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('name', MODELS)
@pytest.mark.parametrize('coarse', [False, True])
def test_group_matcher(name, coarse):
    # an uneven sMLPNet so that per-block (fine) and per-stage (coarse) grouping differ
    model = create(name, depths=(1, 2, 1, 1)) if is_smlp(name) else create(name)
    groups = timm.models.group_parameters(model, model.group_matcher(coarse=coarse))
    grouped = [n for names in groups.values() for n in names]
    all_names = [n for n, _ in model.named_parameters()]
    assert sorted(grouped) == sorted(all_names), 'group_matcher misses or duplicates parameters'
    ordered = list(groups.values())
    assert all(n.startswith('stem') for n in ordered[0]), 'the stem is not the first group'
    head = model.pretrained_cfg['classifier']
    head_groups = [i for i, names in enumerate(ordered) if any(n.startswith(head + '.') for n in names)]
    assert head_groups == [len(ordered) - 1], 'the classifier is not in the last group'
    # timm convention: the final norm joins the last block's group (fine) or the head's group (coarse)
    assert any(n.startswith('norm.') for n in ordered[-2] + ordered[-1])
    # stem, then one group per block (fine) or per stage (coarse, sMLPNet), then final norm + head
    if is_smlp(name):
        n_middle = len(model.stages) if coarse else len(all_blocks(model))
    else:
        n_middle = len(model.blocks)
    assert len(ordered) == 1 + n_middle + 1


@pytest.mark.parametrize('name', MODELS)
def test_layer_decay_optimizer(name):
    model = create(name)
    opt = timm.optim.create_optimizer_v2(model, 'adamw', lr=1e-3, layer_decay=0.75)
    params_in_opt = [p for g in opt.param_groups for p in g['params']]
    assert len(params_in_opt) == len(list(model.parameters()))
    assert {id(p) for p in params_in_opt} == {id(p) for p in model.parameters()}
    scale = {}
    for g in opt.param_groups:
        for p in g['params']:
            scale[id(p)] = g['lr_scale']
    named = dict(model.named_parameters())
    stem_scale = scale[id(named['stem.weight' if is_smlp(name) else 'stem.proj.weight'])]
    head_scale = scale[id(model.get_classifier().weight)]
    first_block = all_blocks(model)[0]
    last_block = all_blocks(model)[-1]
    first_scale = scale[id(next(first_block.parameters()))]
    last_scale = scale[id(next(last_block.parameters()))]
    assert head_scale == pytest.approx(1.0)
    assert stem_scale < first_scale < last_scale < head_scale


# ---------------------------------------------------------------------------------------------------------------
# 12. device / dtype kwargs
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('name', MODELS)
def test_device_meta(name):
    model = timm.create_model(name, device='meta')
    assert all(p.device.type == 'meta' for p in model.parameters())
    assert all(b.device.type == 'meta' for b in model.buffers())
    model.reset_classifier(5)
    assert model.get_classifier().weight.device.type == 'meta'


@pytest.mark.parametrize('name', MODELS_SIBLINGS_SLOW)
def test_dtype_bfloat16(name):
    model = create(name, dtype=torch.bfloat16).eval()
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert all(b.dtype == torch.bfloat16 for b in model.buffers() if b.is_floating_point())
    with torch.no_grad():
        out = model(make_input().to(torch.bfloat16))
    assert out.dtype == torch.bfloat16 and out.shape == (B, NUM_CLASSES)
    assert torch.isfinite(out.float()).all()
    model.reset_classifier(5)
    assert model.get_classifier().weight.dtype == torch.bfloat16


# ---------------------------------------------------------------------------------------------------------------
# 13. parameter counts at 224 (the papers; table at the top of this file)
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('name', sorted(PARAMS_WITHIN_HALF_PERCENT))
def test_param_count_spec(name):
    target = PARAMS_WITHIN_HALF_PERCENT[name] * 1e6
    n = count_params(meta_model(name))
    assert abs(n / target - 1) <= 0.005, f'{name}: {n / 1e6:.3f} M params, the paper says {target / 1e6} M'


@pytest.mark.parametrize('name', sorted(PARAMS_ROUNDED))
def test_param_count_paper_rounded(name):
    target, decimals, with_head = PARAMS_ROUNDED[name]
    model = meta_model(name)
    n = count_params(model, exclude_prefix=None if with_head else 'head.')
    assert round(n / 1e6, decimals) == target, f'{name}: {n / 1e6:.3f} M params, paper says {target} M'


@pytest.mark.parametrize('name', sorted(TIMM_EQUIVALENT))
def test_param_count_equals_timm(name):
    ours = meta_model(name)
    theirs = timm.create_model(TIMM_EQUIVALENT[name], device='meta')
    assert count_params(ours) == count_params(theirs)
    assert count_params(ours, 'head.') == count_params(theirs, 'head.')


@pytest.mark.parametrize('name, timm_name', [('mixer_s16', 'mixer_s16_224'), ('gmlp_ti', 'gmlp_ti16_224')])
def test_timm_weights_give_timm_outputs(name, timm_name):
    """timm's parameters, through the model's checkpoint_filter_fn, reproduce timm's outputs exactly."""
    torch.manual_seed(0)
    theirs = timm.create_model(timm_name, img_size=IMG, num_classes=NUM_CLASSES).eval()
    with torch.no_grad():
        for p in theirs.parameters():  # randomise everything (the SGU's W starts ~1e-6, the head at 0)
            p.normal_(std=0.05)
    ours = create(name, small=False).eval()
    filter_fn = importlib.import_module(timm.models.model_entrypoint(name).__module__).checkpoint_filter_fn
    ours.load_state_dict(filter_fn(theirs.state_dict(), ours), strict=True)
    x = make_input()
    with torch.no_grad():
        assert_same(ours(x), theirs(x), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# 14. registry
# ---------------------------------------------------------------------------------------------------------------
def test_registry_ours_distinct_and_registered():
    assert len(set(MODELS)) == len(MODELS) == 10
    for name in MODELS:
        assert timm.is_model(name)
        assert timm.models.model_entrypoint(name).__module__.startswith('mlp_vision.models.')
    for timm_name in ('gmlp_ti16_224', 'gmlp_s16_224', 'gmlp_b16_224', 'mixer_s16_224', 'mixer_b16_224',
                      'mixer_l16_224'):
        assert timm_name not in MODELS
        assert timm.models.model_entrypoint(timm_name).__module__ == 'timm.models.mlp_mixer'


def test_registry_timm_entries_intact():
    import timm.models.mlp_mixer as timm_mixer
    for timm_name in ('gmlp_s16_224', 'mixer_b16_224'):
        model = timm.create_model(timm_name, device='meta')
        assert type(model) is timm_mixer.MlpMixer
        assert type(model) is not MlpMixer
        assert model.pretrained_cfg['architecture'] == timm_name
    assert set(timm.list_pretrained('mixer_b16_224*')) == {
        'mixer_b16_224.goog_in21k', 'mixer_b16_224.goog_in21k_ft_in1k',
        'mixer_b16_224.miil_in21k', 'mixer_b16_224.miil_in21k_ft_in1k'}
    assert 'gmlp_s16_224.ra3_in1k' in timm.list_pretrained('gmlp_s16_224*')
    cfg = timm.models.get_pretrained_cfg('gmlp_s16_224.ra3_in1k')
    assert cfg.architecture == 'gmlp_s16_224' and cfg.hf_hub_id == 'timm/gmlp_s16_224.ra3_in1k'
    cfg = timm.models.get_pretrained_cfg('mixer_b16_224.miil_in21k_ft_in1k')
    assert cfg.architecture == 'mixer_b16_224' and cfg.mean == (0., 0., 0.) and cfg.interpolation == 'bilinear'
    # our pretrained tags live under our names only
    for name in MODELS:
        for full_name in timm.models.get_arch_pretrained_cfgs(name):
            assert full_name.split('.')[0] == name


# ---------------------------------------------------------------------------------------------------------------
# 15. bad input
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('name', MODELS)
def test_bad_input_raises(name):
    model = create(name).eval()
    expected_size = f'{IMG[0]}x{IMG[1]}'
    wrong_sizes = [(IMG[1], IMG[0]), (IMG[0] + 32, IMG[1])]
    with torch.no_grad():
        for fn in (model, model.forward_features, lambda t: model.forward_intermediates(t)):
            for size in wrong_sizes:
                with pytest.raises(ValueError, match=expected_size):
                    fn(make_input(img=size, batch=1))
            with pytest.raises(ValueError, match='expected 3 input channels') as e:
                fn(make_input(chans=1, batch=1))
            assert 'got 1' in str(e.value)
            with pytest.raises(ValueError, match='4-D'):
                fn(torch.randn(3, *IMG))  # missing batch dimension

    # in_chans is honoured
    model1 = create(name, in_chans=1).eval()
    with torch.no_grad():
        assert model1(make_input(chans=1, batch=1)).shape == (1, NUM_CLASSES)
    with pytest.raises(ValueError, match='expected 1 input channels'):
        model1(make_input(chans=3, batch=1))


@pytest.mark.parametrize('name', MODELS)
def test_bad_img_size_raises(name):
    stride = 32 if is_smlp(name) else 16
    bad = [(IMG[0] + stride // 2, IMG[1]), (IMG[0], IMG[1] + 8), IMG[0] + 8]
    if is_smlp(name):
        bad.append((48, 96))  # divisible by 16, not by 32
    for img_size in bad:
        with pytest.raises(ValueError, match=rf'\b{stride}\b'):
            create(name, img_size=img_size, device='meta')


# ---------------------------------------------------------------------------------------------------------------
# 16. non-square inputs
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('name', MODELS)
@pytest.mark.parametrize('img', [(96, 64), (32, 128)])  # (64, 96) is IMG, used everywhere
def test_non_square(name, img):
    model = create(name, img_size=img).eval()
    assert model.img_size == img
    x = make_input(img=img, batch=1)
    with torch.no_grad():
        out = model(x)
        inter = model.forward_intermediates(x, intermediates_only=True)
    assert out.shape == (1, NUM_CLASSES) and torch.isfinite(out).all()
    if is_smlp(name):
        for i, (stage, t) in enumerate(zip(model.stages, inter)):
            stride = 4 * 2 ** i
            h, w = img[0] // stride, img[1] // stride
            assert t.shape[-2:] == (h, w)
            for blk in stage.blocks:
                smlp = blk.token_mixer.smlp
                assert smlp.feat_size == (h, w)
                assert smlp.proj_h.weight.shape == (h, h)  # mixes along H
                assert smlp.proj_w.weight.shape == (w, w)  # mixes along W
    else:
        h, w = img[0] // 16, img[1] // 16
        assert model.grid_size == (h, w)
        assert all(t.shape[-2:] == (h, w) for t in inter)
        for blk in model.blocks:
            if isinstance(blk, mlp_vision.layers.GatedMLPBlock):
                assert blk.sgu.weight.shape == (h * w, h * w)
            else:
                assert blk.mlp_tokens.fc1.in_features == h * w


@pytest.mark.parametrize('name', SMLP_MODELS)
def test_smlpnet_axial_mixing_directions(name):
    """On a non-square map, the H mix only mixes within a column and the W mix only within a row."""
    model = create(name).eval()
    smlp = model.stages[0].blocks[0].token_mixer.smlp
    h, w = smlp.feat_size
    C = dim_of(name)
    # isolate the H- and W-mixed channel blocks of the fuse input: [identity, H-mixed, W-mixed]
    with torch.no_grad():
        smlp.norm.eval()
        x = torch.zeros(1, C, h, w)
        x[0, :, 2, 3] = 1.
        fused_weight = smlp.fuse_conv.weight.clone()
        for block, axis in ((1, 'h'), (2, 'w')):
            smlp.fuse_conv.weight.zero_()
            smlp.fuse_conv.weight[:, block * C:(block + 1) * C] = torch.eye(C)[:, :, None, None]
            delta = smlp(x) - smlp(torch.zeros(1, C, h, w))
            changed = delta.abs().amax(dim=(0, 1)) > 0
            if axis == 'h':  # only column 3 changes
                assert changed[:, 3].any() and not changed[:, [j for j in range(w) if j != 3]].any()
            else:  # only row 2 changes
                assert changed[2, :].any() and not changed[[i for i in range(h) if i != 2], :].any()
        smlp.fuse_conv.weight.copy_(fused_weight)


# ---------------------------------------------------------------------------------------------------------------
# bad arguments and bad inputs: one clear error, at construction or at the forward call, never a silent result
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('family', ONE_PER_FAMILY)
@pytest.mark.parametrize('kwargs,match', [
    (dict(in_chans=0), 'in_chans must be an integer >= 1'),
    (dict(num_classes=-1), 'num_classes must be an integer >= 0'),
    (dict(drop_path_rate=1.0), r'drop_path_rate must be in \[0, 1\)'),
    (dict(drop_path_rate=-0.1), r'drop_path_rate must be in \[0, 1\)'),
    (dict(drop_rate=1.5), r'drop_rate must be in \[0, 1\)'),
    (dict(proj_drop_rate=float('nan')), r'proj_drop_rate must be in \[0, 1\)'),
    (dict(embed_dim=0), 'embed_dim must be an integer >= 1, got 0'),
    (dict(embed_dim=2.5), 'embed_dim must be an integer >= 1, got 2.5'),
    (dict(mlp_ratio=0), r'mlp_ratio must be a finite number > 0 \(hidden width / embed_dim\), got 0'),
    (dict(mlp_ratio=float('nan')), 'mlp_ratio must be a finite number > 0'),
    (dict(mlp_ratio=-1.), 'mlp_ratio must be a finite number > 0'),
    (dict(mlp_ratio=1e-4), r'mlp_ratio 0.0001 gives a hidden width of int\(0.0001 \* \d+\) = 0'),
    (dict(global_pool='bogus'), r"global_pool must be one of '', 'avg'.*, got 'bogus'"),
])
def test_bad_constructor_arguments(family, kwargs, match):
    with pytest.raises(ValueError, match=match):
        create(family, **kwargs)


@pytest.mark.parametrize('family,kwargs,match', [
    ('smlpnet_t_a2', dict(depths=(-1, 1, 1, 1)), r'depths must be a non-empty sequence of integers >= 1 \(blocks per '
                                                 r'stage\), got \(-1, 1, 1, 1\)'),
    ('smlpnet_t_a2', dict(depths=(0, 1, 1, 1)), 'depths must be a non-empty sequence of integers >= 1'),
    ('smlpnet_t_a2', dict(depths=(1.5, 1, 1, 1)), 'depths must be a non-empty sequence of integers >= 1'),
    ('smlpnet_t_a2', dict(depths=()), 'depths must be a non-empty sequence of integers >= 1'),
    ('mixer_s16', dict(num_blocks=0), 'num_blocks must be an integer >= 1, got 0'),
    ('gmlp_ti', dict(num_blocks=-1), 'num_blocks must be an integer >= 1, got -1'),
    ('mixer_s16', dict(patch_size=0), 'patch_size must be an integer >= 1, got 0'),
    ('mixer_s16', dict(patch_size=7), r'needs H and W divisible by 7 \(its patch size\)'),
    ('mixer_s16', dict(mlp_ratio=(0., 4.)), r'mlp_ratio must be a finite number > 0 .*got \(0.0, 4.0\)'),
])
def test_bad_sizes_of_one_family(family, kwargs, match):
    """Sizes no model of the family can be built with (or that built another model: ``mlp_ratio=0`` gave a
    ratio of 1, ``depths`` with a 0 an empty stage) are a ValueError saying what is expected."""
    with pytest.raises(ValueError, match=match):
        create(family, **kwargs)


@pytest.mark.parametrize('features_only', [False, True])
@pytest.mark.parametrize('name', ONE_PER_FAMILY)
def test_bad_inputs_are_clear_errors(name, features_only):
    model = create(name, features_only=features_only) if features_only else create(name)
    model.eval()
    with torch.no_grad():
        with pytest.raises(TypeError, match='expected a floating-point image batch, got dtype torch.uint8'):
            model(torch.zeros(2, 3, *IMG, dtype=torch.uint8))
        with pytest.raises(TypeError, match='got dtype torch.int64'):
            model(torch.zeros(2, 3, *IMG, dtype=torch.long))
        with pytest.raises(ValueError, match='expected a non-empty batch'):
            model(torch.zeros(0, 3, *IMG))
        with pytest.raises(ValueError, match='expected 3 input channels, got 1'):
            model(torch.zeros(2, 1, *IMG))
        with pytest.raises(ValueError, match='expected input spatial size'):
            model(torch.zeros(2, 3, 32, 32))
