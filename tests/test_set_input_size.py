""" ``set_input_size`` of the vision models (issue 27 item 5; timm's ``set_input_size`` contract).

A model built at size A and moved to size B must be the model built at B whose weights came from the A model
through ``checkpoint_filter_fn`` (the loader's resampling): same parameters bit for bit, same outputs, same sizes
recorded everywhere. Tiny widths and depths: these checks are about the resize, not the variant.
"""
import importlib

import pytest
import torch
import timm

import mlp_vision  # noqa: F401  (registers the models)

TINY = {  # one model per family, shrunk
    'mixer_s16': dict(num_blocks=3, embed_dim=32),
    'gmlp_ti': dict(num_blocks=3, embed_dim=32),
    'smlpnet_t': dict(depths=(1, 1, 1, 1), embed_dim=8),
}
# the loader takes a flattened patch grid to be square, so the isotropic models start at a square size
SIZE_A = {'mixer_s16': (64, 64), 'gmlp_ti': (64, 64), 'smlpnet_t': (64, 96)}
SIZES_B = [(96, 64), (32, 32), (128, 160)]  # larger, smaller, both; sMLPNet's last map is 1x1 at 32x32


def create(name, img_size, seed=0, **kwargs):
    torch.manual_seed(seed)
    return timm.create_model(name, img_size=img_size, num_classes=5, **dict(TINY[name], **kwargs))


def filter_fn(name):
    return importlib.import_module(timm.models.model_entrypoint(name).__module__).checkpoint_filter_fn


def make_input(img_size, batch=2):
    return torch.randn(batch, 3, *img_size, generator=torch.Generator().manual_seed(1))


def randomize_(model):
    """Non-trivial values everywhere (the SGU starts at W ~ 0, b = 1; Mixer's head at 0)."""
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model


def stem_sizes(model):
    if hasattr(model, 'grid_size'):
        return model.grid_size, model.stem.img_size, model.stem.grid_size, model.stem.num_patches
    return tuple(blk.token_mixer.smlp.feat_size for stage in model.stages for blk in stage.blocks)


@pytest.mark.parametrize('size_b', SIZES_B)
@pytest.mark.parametrize('name', sorted(TINY))
def test_equals_model_built_at_new_size_from_loader(name, size_b):
    moved = randomize_(create(name, SIZE_A[name])).eval()
    built = create(name, size_b, seed=1).eval()
    built.load_state_dict(filter_fn(name)(moved.state_dict(), built))

    moved.set_input_size(img_size=size_b)

    sd_moved, sd_built = moved.state_dict(), built.state_dict()
    assert sd_moved.keys() == sd_built.keys()
    for k in sd_built:
        assert torch.equal(sd_moved[k], sd_built[k]), k
    assert moved.img_size == built.img_size == size_b
    assert stem_sizes(moved) == stem_sizes(built)
    assert moved.feature_info == built.feature_info
    assert repr(moved) == repr(built)  # Linear in/out features, SGU seq_len, ... updated
    x = make_input(size_b)
    with torch.no_grad():
        assert torch.equal(moved(x), built(x))
        for a, b in zip(moved.forward_intermediates(x, intermediates_only=True),
                        built.forward_intermediates(x, intermediates_only=True)):
            assert torch.equal(a, b)
    # the old size is now refused, with the usual message
    with pytest.raises(ValueError, match='expected input spatial size'):
        moved(make_input(SIZE_A[name]))


@pytest.mark.parametrize('name', sorted(TINY))
def test_same_size_is_a_no_op(name):
    """At the current size (or None) nothing changes, not even the parameter objects. A round trip A -> B -> A is
    not the identity: interpolation loses what the coarser grid cannot hold (as loading a checkpoint twice would)."""
    model = randomize_(create(name, SIZE_A[name])).eval()
    params = dict(model.named_parameters())
    x = make_input(SIZE_A[name])
    with torch.no_grad():
        ref = model(x)
    model.set_input_size()
    model.set_input_size(img_size=None)
    model.set_input_size(img_size=SIZE_A[name])
    model.set_input_size(img_size=list(SIZE_A[name]))
    assert all(p is params[n] for n, p in model.named_parameters())
    with torch.no_grad():
        assert torch.equal(model(x), ref)


@pytest.mark.parametrize('name', sorted(TINY))
def test_features_only_at_new_size(name):
    model = create(name, SIZE_A[name], features_only=True)
    size_b = (96, 128)
    model.model.set_input_size(img_size=size_b)  # FeatureGetterNet wraps the model as .model
    with torch.no_grad():
        feats = model(make_input(size_b))
    reductions = model.feature_info.reduction()
    assert len(feats) == len(reductions)
    for f, r, c in zip(feats, reductions, model.feature_info.channels()):
        assert f.shape == (2, c, size_b[0] // r, size_b[1] // r)


@pytest.mark.parametrize('name', sorted(TINY))
def test_impossible_size_raises_and_changes_nothing(name):
    model = create(name, SIZE_A[name])
    stride = 32 if name.startswith('smlpnet') else 16
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    bad = [(64, 64 + stride // 2), stride // 2, 0, (-stride, stride), (64.0, 64.0), (64, 64, 64)]
    for img_size in bad:
        with pytest.raises(ValueError, match=rf'divisible by {stride} .*got img_size=') as err:
            model.set_input_size(img_size=img_size)
        assert '\n' not in str(err.value)
    assert model.img_size == SIZE_A[name]
    assert all(torch.equal(v, sd[k]) for k, v in model.state_dict().items())
    with torch.no_grad():
        model(make_input(SIZE_A[name]))


@pytest.mark.parametrize('name', ['mixer_s16', 'gmlp_ti'])
def test_patch_size_other_than_current_raises(name):
    model = create(name, SIZE_A[name])
    model.set_input_size(patch_size=16)  # the current one: accepted
    with pytest.raises(ValueError, match='cannot change patch_size'):
        model.set_input_size(img_size=(64, 64), patch_size=8)
    assert model.stem.patch_size == (16, 16)


@pytest.mark.parametrize('name', sorted(TINY))
def test_keeps_dtype_device_requires_grad_and_trains(name):
    model = create(name, SIZE_A[name], dtype=torch.bfloat16).train()
    frozen = next(n for n, _ in model.named_parameters() if n.endswith(('sgu.weight', 'fc1.weight', 'proj_h.weight')))
    model.get_parameter(frozen).requires_grad_(False)
    model.set_input_size(img_size=(96, 64))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert not model.get_parameter(frozen).requires_grad
    assert sum(not p.requires_grad for p in model.parameters()) == 1
    out = model(make_input((96, 64)).bfloat16())
    out.float().sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize('name', sorted(TINY))
def test_timm_data_config_follows_the_new_size(name):
    """Issue 36 item 5: after set_input_size every timm data helper gives the new size, so transforms built the
    usual timm way fit the model; no other model's cfg moves."""
    from timm.data import resolve_data_config, resolve_input_data_config, resolve_model_data_config
    model = create(name, SIZE_A[name])
    before = model.pretrained_cfg
    model.set_input_size(img_size=(96, 64))
    assert model.pretrained_cfg['input_size'] == model.default_cfg['input_size'] == (3, 96, 64)
    assert model.pretrained_cfg['fixed_input_size'] is True
    assert resolve_model_data_config(model)['input_size'] == (3, 96, 64)
    assert resolve_data_config(model=model)['input_size'] == (3, 96, 64)
    assert resolve_input_data_config(model)['input_size'] == (3, 96, 64)
    assert before['input_size'] == (3, 224, 224)  # the cfg object it had is not changed in place
    assert timm.create_model(name, **TINY[name]).pretrained_cfg['input_size'] == (3, 224, 224)
    transform = timm.data.create_transform(**resolve_model_data_config(model))
    from PIL import Image
    with torch.no_grad():
        assert model(transform(Image.new('RGB', (300, 200)))[None]).shape == (1, 5)
