""" Checkpoint conversion and resampling.

* sMLPNet: the official microsoft/SPACH layout (docs/models.md, sMLPNet) is generated here from that description, loaded
  through timm's pretrained machinery, and the model's output is compared with an independent functional
  implementation of the official forward that runs directly on the official state dict.
* gMLP / MLP-Mixer: timm's own ``gmlp_*16_224`` / ``mixer_*16_224`` checkpoints give the same outputs in ours.
* Resampling of token-mixing weights to other input sizes (mlp_vision.layers.resample + the filter fns).

The only file read outside the repository is the official sMLPNet-T key list
``../shared/reference/spach_smlpnet_tiny_keys.tsv`` (relative to the repo root); its test skips when absent.
"""
import math
from pathlib import Path
from typing import Dict, Sequence, Tuple, Union

import pytest
import timm
import torch
import torch.nn.functional as F

import mlp_vision  # noqa: F401  (registers the models with timm)
from mlp_vision.layers import resample_token_axis, resample_token_weight
from mlp_vision.models import gmlp as gmlp_module
from mlp_vision.models import mlp_mixer as mixer_module
from mlp_vision.models import smlpnet as smlpnet_module

REPO_ROOT = Path(__file__).resolve().parents[1]
TSV_PATH = REPO_ROOT.parent / 'shared' / 'reference' / 'spach_smlpnet_tiny_keys.tsv'

SMALL_DIM = 16
SMALL_DEPTHS = (1, 1, 2, 1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# --------------------------------------------------------------------------------------------------------------
# the official sMLPNet layout, generated from its description in docs/models.md (no official code involved)
# --------------------------------------------------------------------------------------------------------------

def _pair(s: Union[int, Sequence[int]]) -> Tuple[int, int]:
    return (s, s) if isinstance(s, int) else (int(s[0]), int(s[1]))


def interp_matrix(old: int, new: int) -> torch.Tensor:
    """(new, old) float64 matrix of 1-D bilinear resampling, ``align_corners=False``, antialiased when shrinking.

    Written out from the definition (PIL-style triangle filter of half-width max(old/new, 1) centred on the output
    cell, normalised over the input cells it covers; for upsampling this is plain linear interpolation with
    border clamping), independently of ``F.interpolate``.
    """
    m = torch.zeros(new, old, dtype=torch.float64)
    scale = old / new
    support = max(scale, 1.0)
    for i in range(new):
        center = scale * (i + 0.5)
        lo, hi = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), old)
        w = torch.tensor([max(0.0, 1.0 - abs((j - center + 0.5) / support)) for j in range(lo, hi)],
                         dtype=torch.float64)
        m[i, lo:hi] = w / w.sum()
    return m


def grid_interp_matrix(old: Sequence[int], new: Sequence[int]) -> torch.Tensor:
    """(prod(new), prod(old)) resampling matrix of a row-major flattened 1-D or 2-D token grid."""
    if len(old) == 1:
        return interp_matrix(old[0], new[0])
    return torch.kron(interp_matrix(old[0], new[0]), interp_matrix(old[1], new[1]))


def official_smlpnet_layout(
        embed_dim: int,
        depths: Sequence[int],
        img_size: Union[int, Sequence[int]],
        mlp_ratio: float = 3.,
        num_classes: int = 1000,
        in_chans: int = 3,
):
    """[(key, shape, kind)] of the official checkpoint, in the official module order.

    The official ``proj_h`` mixes along W (its size is the stage's W) and ``proh_w`` along H (size H); at 224
    both are 56/28/14/7. ``num_batches_tracked`` is a scalar buffer.
    """
    height, width = _pair(img_size)
    dims = [embed_dim * 2 ** i for i in range(len(depths))]
    layout = []
    for s in range(len(depths)):
        if s == 0:
            layout.append((f'to_patch_embedding.{s}.0.weight', (dims[0], in_chans, 4, 4), 'param'))
        else:
            layout.append((f'to_patch_embedding.{s}.0.weight', (dims[s], dims[s - 1], 2, 2), 'param'))

    def bn(prefix, c):
        return [(prefix + 'weight', (c,), 'param'), (prefix + 'bias', (c,), 'param'),
                (prefix + 'running_mean', (c,), 'buffer'), (prefix + 'running_var', (c,), 'buffer'),
                (prefix + 'num_batches_tracked', (), 'buffer')]

    stage_of_block = [s for s, d in enumerate(depths) for _ in range(d)]
    for i, s in enumerate(stage_of_block):
        c = dims[s]
        stride = 4 * 2 ** s
        hs, ws = height // stride, width // stride
        p = f'token_mix.{i}.'
        layout += bn(p + '0.conv_merge.BN.', c)
        layout.append((p + '0.conv_merge.Conv.weight', (c, 1, 3, 3), 'param'))
        layout += bn(p + '1.BN.', c)
        layout += [
            (p + '1.proj_h.weight', (ws, ws, 1, 1), 'param'), (p + '1.proj_h.bias', (ws,), 'param'),
            (p + '1.proh_w.weight', (hs, hs, 1, 1), 'param'), (p + '1.proh_w.bias', (hs,), 'param'),
            (p + '1.fuse.weight', (c, 3 * c, 1, 1), 'param'),
        ]
    for i, s in enumerate(stage_of_block):
        c = dims[s]
        hidden = int(c * mlp_ratio)
        p = f'channel_mix.{i}.'
        layout += [
            (p + '1.weight', (c,), 'param'), (p + '1.bias', (c,), 'param'),
            (p + '2.net.0.weight', (hidden, c), 'param'), (p + '2.net.0.bias', (hidden,), 'param'),
            (p + '2.net.3.weight', (c, hidden), 'param'), (p + '2.net.3.bias', (c,), 'param'),
        ]
    layout += bn('batch_norm.', dims[-1])
    layout += [('mlp_head.0.weight', (num_classes, dims[-1]), 'param'), ('mlp_head.0.bias', (num_classes,), 'param')]
    return layout


def official_smlpnet_state_dict(
        embed_dim: int,
        depths: Sequence[int],
        img_size: Union[int, Sequence[int]] = 224,
        mlp_ratio: float = 3.,
        num_classes: int = 1000,
        seed: int = 0,
) -> Dict[str, torch.Tensor]:
    """A random state dict in the official SPACH sMLPNet layout (docs/models.md).

    Weights are random normal with a fan-in scale (so activations stay O(1) through the network), biases are
    non-trivial, BatchNorm running statistics random with a positive variance.
    """
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    sd = {}
    for key, shape, kind in official_smlpnet_layout(embed_dim, depths, img_size, mlp_ratio, num_classes):
        name = key.rsplit('.', 1)[-1]
        if name == 'num_batches_tracked':
            t = torch.tensor(7, dtype=torch.long)
        elif name == 'running_mean':
            t = 0.2 * randn(*shape)
        elif name == 'running_var':
            t = 0.5 + torch.rand(*shape, generator=g)
        elif name == 'bias':
            t = 0.2 * randn(*shape)
        elif len(shape) == 1:  # BN / LayerNorm scale
            t = 1. + 0.2 * randn(*shape)
        else:
            fan_in = math.prod(shape[1:])
            t = randn(*shape) / math.sqrt(fan_in)
        sd[key] = t
    return sd


def official_smlpnet_forward(sd: Dict[str, torch.Tensor], x: torch.Tensor, depths: Sequence[int]) -> torch.Tensor:
    """The official sMLPNet forward (arXiv 2109.05422 Alg. 1; docs/models.md), written with torch.nn.functional on the official state dict."""

    def bn(t, prefix):
        return F.batch_norm(t, sd[prefix + 'running_mean'], sd[prefix + 'running_var'],
                            sd[prefix + 'weight'], sd[prefix + 'bias'], training=False, eps=1e-5)

    blk = 0
    for s, depth in enumerate(depths):
        stride = 4 if s == 0 else 2
        x = F.conv2d(x, sd[f'to_patch_embedding.{s}.0.weight'], stride=stride)
        channels = x.shape[1]
        for _ in range(depth):
            p = f'token_mix.{blk}.'
            # DWConv branch: BN -> GELU -> depthwise 3x3 (conv_merge)
            t = F.gelu(bn(x, p + '0.conv_merge.BN.'))
            t = F.conv2d(t, sd[p + '0.conv_merge.Conv.weight'], padding=1, groups=channels)
            # sMLP
            t = F.gelu(bn(t, p + '1.BN.'))
            # official proj_h: a 1x1 conv over the W axis moved into the channel position -> mixes along W
            t_a = F.conv2d(t.permute(0, 3, 1, 2), sd[p + '1.proj_h.weight'], sd[p + '1.proj_h.bias']).permute(0, 2, 3, 1)
            # official proh_w: the H axis in the channel position -> mixes along H
            t_b = F.conv2d(t.permute(0, 2, 1, 3), sd[p + '1.proh_w.weight'], sd[p + '1.proh_w.bias']).permute(0, 2, 1, 3)
            t = F.conv2d(torch.cat([t, t_a, t_b], dim=1), sd[p + '1.fuse.weight'])
            x = x + t
            # channel mixing on channels-last tokens
            q = f'channel_mix.{blk}.'
            y = x.permute(0, 2, 3, 1)
            y = F.layer_norm(y, (channels,), sd[q + '1.weight'], sd[q + '1.bias'], eps=1e-5)
            y = F.linear(y, sd[q + '2.net.0.weight'], sd[q + '2.net.0.bias'])
            y = F.linear(F.gelu(y), sd[q + '2.net.3.weight'], sd[q + '2.net.3.bias'])
            x = x + y.permute(0, 3, 1, 2)
            blk += 1
    assert blk == 1 + max(int(k.split('.')[1]) for k in sd if k.startswith('token_mix.'))
    x = bn(x, 'batch_norm.')
    x = x.mean(dim=(2, 3))
    return F.linear(x, sd['mlp_head.0.weight'], sd['mlp_head.0.bias'])


def _assert_close_scaled(out: torch.Tensor, ref: torch.Tensor, rtol: float = 1e-4):
    assert out.shape == ref.shape
    assert torch.isfinite(ref).all()
    scale = ref.abs().max().item()
    assert scale > 1e-3, 'degenerate reference output'
    err = (out - ref).abs().max().item()
    assert err <= rtol * scale, f'max abs error {err:.3g} vs output scale {scale:.3g}'


def _load_smlpnet(tmp_path, sd, wrap=True, name='smlp.pth', **kwargs):
    path = tmp_path / name
    torch.save({'model': sd} if wrap else sd, path)
    model = timm.create_model('smlpnet_t', pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **kwargs)
    return model.eval()


# --------------------------------------------------------------------------------------------------------------
# the generated layout against the real checkpoint's key list
# --------------------------------------------------------------------------------------------------------------

def test_official_layout_matches_reference_tsv():
    if not TSV_PATH.is_file():
        pytest.skip(f'official sMLPNet-T key list not found at {TSV_PATH} (shared reference data absent)')
    rows = []
    with open(TSV_PATH) as f:
        header = f.readline().rstrip('\n').split('\t')
        assert header == ['key', 'shape', 'numel', 'kind']
        for line in f:
            if not line.strip():
                continue
            key, shape, numel, kind = line.rstrip('\n').split('\t')
            shape = () if shape == 'scalar' else tuple(int(s) for s in shape.split('x'))
            assert math.prod(shape) == int(numel)
            rows.append((key, shape, kind))
    layout = official_smlpnet_layout(80, (2, 8, 14, 2), 224, mlp_ratio=3.)
    assert [r[0] for r in layout] == [r[0] for r in rows]  # same keys, same order
    assert layout == rows  # and the same shapes and param/buffer kinds

    sd = official_smlpnet_state_dict(80, (2, 8, 14, 2), 224, mlp_ratio=3.)
    assert [(k, tuple(v.shape)) for k, v in sd.items()] == [(r[0], r[1]) for r in rows]
    # 24.12 M parameters (docs/complexity.md, measured on the official code)
    n_params = sum(v.numel() for (k, _, kind), v in zip(layout, sd.values()) if kind == 'param')
    assert abs(n_params / 1e6 - 24.12) < 0.01


# --------------------------------------------------------------------------------------------------------------
# sMLPNet official conversion
# --------------------------------------------------------------------------------------------------------------

# sMLPNet-T's full depth and widths; the paper's 224 x 224 with -m slow (the image size only sizes the token mixes,
# whose conversion the reduced tests below also check at other sizes)
@pytest.mark.parametrize('img_size', [64, pytest.param(224, marks=pytest.mark.slow)])
def test_smlpnet_t_official_conversion(tmp_path, img_size):
    torch.manual_seed(0)
    depths = (2, 8, 14, 2)
    sd = official_smlpnet_state_dict(80, depths, img_size, seed=1)
    model = _load_smlpnet(tmp_path, sd, img_size=img_size)
    assert sum(p.numel() for p in model.parameters()) == sum(
        v.numel() for k, v in sd.items() if not k.split('.')[-1].startswith(('running_', 'num_batches')))
    x = torch.randn(1, 3, img_size, img_size)
    with torch.no_grad():
        out = model(x)
        ref = official_smlpnet_forward(sd, x, depths)
    _assert_close_scaled(out, ref)


@pytest.mark.parametrize('img_size', [64, (64, 96), (96, 64)])
def test_smlpnet_official_conversion_reduced(tmp_path, img_size):
    sd = official_smlpnet_state_dict(SMALL_DIM, SMALL_DEPTHS, img_size, seed=2)
    model = _load_smlpnet(tmp_path, sd, embed_dim=SMALL_DIM, depths=SMALL_DEPTHS, img_size=img_size)
    h, w = _pair(img_size)
    x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = model(x)
        ref = official_smlpnet_forward(sd, x, SMALL_DEPTHS)
    _assert_close_scaled(out, ref)


def test_smlpnet_official_bare_state_dict(tmp_path):
    sd = official_smlpnet_state_dict(SMALL_DIM, SMALL_DEPTHS, 64, seed=4)
    wrapped = _load_smlpnet(tmp_path, sd, wrap=True, name='wrapped.pth',
                            embed_dim=SMALL_DIM, depths=SMALL_DEPTHS, img_size=64)
    bare = _load_smlpnet(tmp_path, sd, wrap=False, name='bare.pth',
                         embed_dim=SMALL_DIM, depths=SMALL_DEPTHS, img_size=64)
    ws, bs = wrapped.state_dict(), bare.state_dict()
    assert ws.keys() == bs.keys()
    for k in ws:
        assert torch.equal(ws[k], bs[k]), k
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        _assert_close_scaled(bare(x), official_smlpnet_forward(sd, x, SMALL_DEPTHS))


@pytest.mark.parametrize('ckpt_depths', [(1, 1, 1, 1), (1, 1, 3, 1), (2, 1, 2, 1)])
def test_smlpnet_official_block_count_mismatch_raises(tmp_path, ckpt_depths):
    sd = official_smlpnet_state_dict(SMALL_DIM, ckpt_depths, 64, seed=5)
    if sum(ckpt_depths) == sum(SMALL_DEPTHS):
        # same total but a different split over the stages: the error names both stage layouts
        with pytest.raises(ValueError, match='stage depths'):
            _load_smlpnet(tmp_path, sd, embed_dim=SMALL_DIM, depths=SMALL_DEPTHS, img_size=64)
    else:
        with pytest.raises(ValueError, match='blocks'):
            _load_smlpnet(tmp_path, sd, embed_dim=SMALL_DIM, depths=SMALL_DEPTHS, img_size=64)


def test_smlpnet_official_names_are_swapped():
    c = SMALL_DIM
    sd = official_smlpnet_state_dict(c, SMALL_DEPTHS, (64, 96), seed=6)
    model = timm.create_model('smlpnet_t', embed_dim=c, depths=SMALL_DEPTHS, img_size=(64, 96))
    out = smlpnet_module.checkpoint_filter_fn(dict(sd), model)
    # block 0 of stage 0: feature map 16 x 24; official proj_h mixes along W (24), proh_w along H (16)
    p = 'stages.0.blocks.0.token_mixer.smlp.'
    assert torch.equal(out[p + 'proj_w.weight'], sd['token_mix.0.1.proj_h.weight'].flatten(1))
    assert torch.equal(out[p + 'proj_w.bias'], sd['token_mix.0.1.proj_h.bias'])
    assert torch.equal(out[p + 'proj_h.weight'], sd['token_mix.0.1.proh_w.weight'].flatten(1))
    assert torch.equal(out[p + 'proj_h.bias'], sd['token_mix.0.1.proh_w.bias'])
    assert out[p + 'proj_h.weight'].shape == (16, 16) and out[p + 'proj_w.weight'].shape == (24, 24)
    # fuse input blocks: official [x, W-mixed (proj_h), H-mixed (proh_w)] -> ours [x, H-mixed, W-mixed]
    fo, fn = sd['token_mix.0.1.fuse.weight'], out[p + 'fuse_conv.weight']
    assert fn.shape == fo.shape == (c, 3 * c, 1, 1)
    assert torch.equal(fn[:, :c], fo[:, :c])
    assert torch.equal(fn[:, c:2 * c], fo[:, 2 * c:])
    assert torch.equal(fn[:, 2 * c:], fo[:, c:2 * c])
    # the global block numbering: official block 3 is stage 2, block 1 (depths 1, 1, 2, 1)
    assert torch.equal(out['stages.2.blocks.1.mlp.fc1.weight'], sd['channel_mix.3.2.net.0.weight'])
    assert torch.equal(out['stages.2.blocks.1.token_mixer.conv_dw.weight'], sd['token_mix.3.0.conv_merge.Conv.weight'])
    assert torch.equal(out['stages.3.downsample.weight'], sd['to_patch_embedding.3.0.weight'])
    assert torch.equal(out['head.fc.weight'], sd['mlp_head.0.weight'])
    assert torch.equal(out['norm.running_var'], sd['batch_norm.running_var'])


def test_smlpnet_unswapped_conversion_would_differ():
    """Mapping the official names literally (proj_h -> our proj_h, fuse unpermuted) gives another function."""
    sd = official_smlpnet_state_dict(SMALL_DIM, SMALL_DEPTHS, 64, seed=7)
    model = timm.create_model('smlpnet_t', embed_dim=SMALL_DIM, depths=SMALL_DEPTHS, img_size=64).eval()
    good = smlpnet_module.checkpoint_filter_fn(dict(sd), model)
    naive = dict(good)
    c_of = {k: v.shape[0] for k, v in good.items() if k.endswith('smlp.fuse_conv.weight')}
    for k in list(good):
        if k.endswith(('smlp.proj_h.weight', 'smlp.proj_h.bias')):
            naive[k] = good[k.replace('smlp.proj_h.', 'smlp.proj_w.')]
            naive[k.replace('smlp.proj_h.', 'smlp.proj_w.')] = good[k]
        elif k in c_of:
            x_id, x_h, x_w = good[k].chunk(3, dim=1)
            naive[k] = torch.cat([x_id, x_w, x_h], dim=1)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        ref = official_smlpnet_forward(sd, x, SMALL_DEPTHS)
        model.load_state_dict(good, strict=True)
        out_good = model(x)
        model.load_state_dict(naive, strict=True)
        out_naive = model(x)
    _assert_close_scaled(out_good, ref)
    assert (out_naive - ref).abs().max() > 1e-2 * ref.abs().max()


# --------------------------------------------------------------------------------------------------------------
# timm gMLP / Mixer checkpoints
# --------------------------------------------------------------------------------------------------------------

def _perturbed_timm_state_dict(name: str, seed: int) -> Tuple[torch.nn.Module, Dict[str, torch.Tensor]]:
    torch.manual_seed(seed)
    ref = timm.create_model(name).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for k, v in ref.state_dict().items():
            if v.is_floating_point():
                v.add_(0.02 * torch.randn(v.shape, generator=g))
    return ref, ref.state_dict()


@pytest.mark.parametrize('ours,theirs', [  # the wider variants load through the same filter: -m slow
    ('gmlp_ti', 'gmlp_ti16_224'),
    pytest.param('gmlp_s', 'gmlp_s16_224', marks=pytest.mark.slow),
    ('mixer_s16', 'mixer_s16_224'),
    pytest.param('mixer_b16', 'mixer_b16_224', marks=pytest.mark.slow),
])
def test_timm_checkpoint_equivalence(tmp_path, ours, theirs):
    ref, sd = _perturbed_timm_state_dict(theirs, seed=10)
    if theirs.startswith('gmlp'):
        w = sd['blocks.0.mlp_channels.gate.proj.weight']
        assert w.abs().max() > 1e-2  # the SGU W is no longer ~0, so token mixing matters
    path = tmp_path / f'{theirs}.pth'
    torch.save(sd, path)
    model = timm.create_model(ours, pretrained=True, pretrained_cfg_overlay=dict(file=str(path))).eval()
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        expected = ref(x)
        out = model(x)
    assert expected.abs().max() > 1e-2
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


# --------------------------------------------------------------------------------------------------------------
# resampling
# --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('name,kwargs', [
    ('gmlp_ti', dict(img_size=64)),
    ('mixer_s16', dict(img_size=(64, 96), num_blocks=2)),
    ('smlpnet_t', dict(img_size=(64, 96), embed_dim=SMALL_DIM, depths=SMALL_DEPTHS)),
])
def test_resample_identity_same_size_is_bit_exact(tmp_path, name, kwargs):
    src = timm.create_model(name, **kwargs)
    g = torch.Generator().manual_seed(12)
    with torch.no_grad():
        for v in src.state_dict().values():
            if v.is_floating_point():
                v.add_(0.1 * torch.randn(v.shape, generator=g))
    sd = src.state_dict()
    filter_fn = {'gmlp_ti': gmlp_module.checkpoint_filter_fn, 'mixer_s16': mixer_module.checkpoint_filter_fn,
                 'smlpnet_t': smlpnet_module.checkpoint_filter_fn}[name]
    out = filter_fn(dict(sd), timm.create_model(name, **kwargs))
    assert out.keys() == sd.keys()
    for k in sd:
        assert out[k].dtype == sd[k].dtype and torch.equal(out[k], sd[k]), k
    # and through timm's loader
    path = tmp_path / 'same.pth'
    torch.save(sd, path)
    loaded = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **kwargs)
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, sd[k]), k


def test_smlpnet_official_same_size_not_resampled():
    sd = official_smlpnet_state_dict(SMALL_DIM, SMALL_DEPTHS, (64, 96), seed=13)
    model = timm.create_model('smlpnet_t', embed_dim=SMALL_DIM, depths=SMALL_DEPTHS, img_size=(64, 96))
    out = smlpnet_module.checkpoint_filter_fn(dict(sd), model)
    for i, (s, b) in enumerate([(0, 0), (1, 0), (2, 0), (2, 1), (3, 0)]):
        p = f'stages.{s}.blocks.{b}.token_mixer.smlp.'
        assert torch.equal(out[p + 'proj_h.weight'], sd[f'token_mix.{i}.1.proh_w.weight'].flatten(1))
        assert torch.equal(out[p + 'proj_w.weight'], sd[f'token_mix.{i}.1.proj_h.weight'].flatten(1))


@pytest.mark.parametrize('ours,theirs,key', [
    ('gmlp_ti', 'gmlp_ti16_224', 'blocks.0.sgu.weight'),
    ('mixer_s16', 'mixer_s16_224', 'blocks.0.mlp_tokens.fc1.weight'),
])
@pytest.mark.parametrize('img_size', [(160, 192), (288, 256)])
def test_isotropic_resample_from_224(tmp_path, ours, theirs, key, img_size):
    _, sd = _perturbed_timm_state_dict(theirs, seed=14)
    path = tmp_path / 'ckpt.pth'
    torch.save(sd, path)
    # timm's loader is strict: every key present with the right shape
    model = timm.create_model(ours, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)),
                              img_size=img_size).eval()
    n = (img_size[0] // 16) * (img_size[1] // 16)
    msd = model.state_dict()
    if ours.startswith('gmlp'):
        assert msd['blocks.0.sgu.weight'].shape == (n, n)
        assert msd['blocks.0.sgu.bias'].shape == (n,)
    else:
        assert msd['blocks.0.mlp_tokens.fc1.weight'].shape == (256, n)
        assert msd['blocks.0.mlp_tokens.fc2.weight'].shape == (n, 256)
        assert msd['blocks.0.mlp_tokens.fc2.bias'].shape == (n,)
    # token tensors resampled over the 14 x 14 grid: outputs R x, contracted axes R x * (196 / n)
    r = grid_interp_matrix((14, 14), (img_size[0] // 16, img_size[1] // 16))
    if ours.startswith('gmlp'):
        w, b = sd['blocks.0.mlp_channels.gate.proj.weight'].double(), sd['blocks.0.mlp_channels.gate.proj.bias'].double()
        torch.testing.assert_close(msd['blocks.0.sgu.weight'].double(), r @ w @ r.T * (196 / n), atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(msd['blocks.0.sgu.bias'].double(), r @ b, atol=2e-5, rtol=1e-4)
    else:
        w1 = sd['blocks.0.mlp_tokens.fc1.weight'].double()
        w2, b2 = sd['blocks.0.mlp_tokens.fc2.weight'].double(), sd['blocks.0.mlp_tokens.fc2.bias'].double()
        torch.testing.assert_close(msd['blocks.0.mlp_tokens.fc1.weight'].double(), w1 @ r.T * (196 / n),
                                   atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(msd['blocks.0.mlp_tokens.fc2.weight'].double(), r @ w2, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(msd['blocks.0.mlp_tokens.fc2.bias'].double(), r @ b2, atol=2e-5, rtol=1e-4)
        assert torch.equal(msd['blocks.0.mlp_tokens.fc1.bias'], sd['blocks.0.mlp_tokens.fc1.bias'])
    # non-token tensors are untouched
    assert torch.equal(msd['stem.proj.weight'], sd['stem.proj.weight'])
    assert torch.equal(msd['head.weight'], sd['head.weight'])
    x = torch.randn(1, 3, *img_size)
    with torch.no_grad():
        y = model(x)
    assert y.shape == (1, 1000) and torch.isfinite(y).all()


@pytest.mark.parametrize('img_size', [(256, 320), (160, 192)])
def test_smlpnet_official_resample_from_224(tmp_path, img_size):
    sd = official_smlpnet_state_dict(SMALL_DIM, SMALL_DEPTHS, 224, seed=15)
    model = _load_smlpnet(tmp_path, sd, embed_dim=SMALL_DIM, depths=SMALL_DEPTHS, img_size=img_size)
    msd = model.state_dict()
    h, w = img_size
    for i, (s, b) in enumerate([(0, 0), (1, 0), (2, 0), (2, 1), (3, 0)]):
        stride = 4 * 2 ** s
        hs, ws = h // stride, w // stride
        p = f'stages.{s}.blocks.{b}.token_mixer.smlp.'
        assert msd[p + 'proj_h.weight'].shape == (hs, hs)
        assert msd[p + 'proj_h.bias'].shape == (hs,)
        assert msd[p + 'proj_w.weight'].shape == (ws, ws)
        assert msd[p + 'proj_w.bias'].shape == (ws,)
        # the H mix comes from the official proh_w, the W mix from proj_h, resampled from 224 / stride:
        # W' = R W R^T * (n / n'), b' = R b with R the explicit interpolation matrix
        n = 224 // stride
        for ours, theirs, m in (('proj_h', 'proh_w', hs), ('proj_w', 'proj_h', ws)):
            r = interp_matrix(n, m)
            w_off = sd[f'token_mix.{i}.1.{theirs}.weight'].flatten(1).double()
            b_off = sd[f'token_mix.{i}.1.{theirs}.bias'].double()
            torch.testing.assert_close(msd[p + ours + '.weight'].double(), r @ w_off @ r.T * (n / m),
                                       atol=2e-5, rtol=1e-4, msg=lambda e: f'{p}{ours}.weight: {e}')
            torch.testing.assert_close(msd[p + ours + '.bias'].double(), r @ b_off,
                                       atol=2e-5, rtol=1e-4, msg=lambda e: f'{p}{ours}.bias: {e}')
    x = torch.randn(1, 3, h, w)
    with torch.no_grad():
        y = model(x)
    assert y.shape == (1, 1000) and torch.isfinite(y).all()


def _ramp_atol(old: int, new: int, slope: float) -> float:
    """Interior tolerance for a resampled linear ramp of ``slope`` per unit of normalised position.

    Upsampling is plain linear interpolation, exact on a ramp. Downsampling uses the antialiased (PIL-style
    triangle) filter, whose integer-aligned support makes it slightly asymmetric: interior values are off by a
    few percent of one output step (at most ~6 % measured), so allow 10 % of a step.
    """
    return 1e-5 if new >= old else 0.1 * slope / new


@pytest.mark.parametrize('old,new', [(14, 20), (14, 9), (7, 7 * 3), (56, 40), (28, 20)])
def test_resample_token_axis_1d_smooth(old, new):
    c = 0.37
    const = torch.full((5, old, old), c)
    # output axis keeps its values (a constant stays the same constant)
    out_axis = resample_token_axis(const, 1, (old,), (new,), contracted=False)
    assert out_axis.shape == (5, new, old)
    torch.testing.assert_close(out_axis, torch.full((5, new, old), c))
    # contracted axis: scaled by old / new, so a constant input mixes to the same output
    contr = resample_token_axis(const, 2, (old,), (new,), contracted=True)
    assert contr.shape == (5, old, new)
    torch.testing.assert_close(contr, torch.full((5, old, new), c * old / new))
    weight = resample_token_weight(const[0], (old,), (new,), out_dims=(0,), in_dims=(1,))
    assert weight.shape == (new, new)
    torch.testing.assert_close(weight @ torch.ones(new), torch.full((new,), c * old))

    # a linear ramp over token position (cell centres in [0, 1]) keeps its values on the output grid,
    # away from the borders (where interpolation clamps / the antialiasing filter is truncated)
    def ramp(n):
        return 2.0 - 3.0 * (torch.arange(n) + 0.5) / n

    r = resample_token_axis(ramp(old)[None, :].repeat(3, 1), 1, (old,), (new,))
    assert r.shape == (3, new)
    margin = max(2, math.ceil(2 * new / old), math.ceil(2 * old / new))
    if new > 2 * margin:
        torch.testing.assert_close(r[:, margin:-margin], ramp(new)[None, margin:-margin].expand(3, -1),
                                   atol=_ramp_atol(old, new, slope=3.0), rtol=0)
    # everywhere (borders included) within one grid step of the ramp, and monotone
    assert (r - ramp(new)).abs().max() <= 3.0 / min(old, new)
    assert (r[:, 1:] <= r[:, :-1]).all()  # non-increasing (borders may clamp)
    # dtype is preserved
    assert resample_token_axis(const.double(), 1, (old,), (new,)).dtype == torch.float64


@pytest.mark.parametrize('old,new', [((14, 14), (10, 12)), ((14, 14), (18, 16)), ((4, 6), (8, 3))])
def test_resample_token_axis_2d_smooth(old, new):
    old_n, new_n = math.prod(old), math.prod(new)
    const = torch.full((old_n, 3), -1.25)
    out = resample_token_axis(const, 0, old, new)
    torch.testing.assert_close(out, torch.full((new_n, 3), -1.25))
    contr = resample_token_axis(const.t(), 1, old, new, contracted=True)
    torch.testing.assert_close(contr, torch.full((3, new_n), -1.25 * old_n / new_n))
    # a dense (N, N) mixing matrix that is constant maps a constant input to the same output after resampling
    w = torch.full((old_n, old_n), 0.5)
    w2 = resample_token_weight(w, old, new, out_dims=(0,), in_dims=(1,))
    assert w2.shape == (new_n, new_n)
    torch.testing.assert_close(w2 @ torch.full((new_n,), 2.), torch.full((new_n,), 0.5 * 2. * old_n))

    # row-major (h, w) flattening: a ramp along the columns only stays a ramp along the columns only
    def col_ramp(grid):
        h, wd = grid
        cols = 1.0 + 4.0 * (torch.arange(wd) + 0.5) / wd
        return cols[None, :].expand(h, wd).reshape(-1)

    def row_ramp(grid):
        h, wd = grid
        rows = -1.0 + 2.0 * (torch.arange(h) + 0.5) / h
        return rows[:, None].expand(h, wd).reshape(-1)

    for fn, axis in ((col_ramp, 1), (row_ramp, 0)):
        r = resample_token_axis(fn(old), 0, old, new).reshape(new)
        # constant along the other axis everywhere
        other = 1 - axis
        assert (r - r.mean(dim=other, keepdim=True)).abs().max() < 1e-5
        # monotone along the ramp axis and equal to the ramp away from the borders
        line = r.mean(dim=other)
        target = fn(new).reshape(new).mean(dim=other)
        n_old, n_new = old[axis], new[axis]
        margin = max(2, math.ceil(2 * n_new / n_old), math.ceil(2 * n_old / n_new))
        if n_new > 2 * margin:
            slope = (target[-1] - target[0]).abs().item() * n_new / (n_new - 1)
            torch.testing.assert_close(line[margin:-margin], target[margin:-margin],
                                       atol=_ramp_atol(n_old, n_new, slope), rtol=0)
        span = (target[-1] - target[0]).abs().item() * n_new / (n_new - 1)  # ramp change over [0, 1]
        assert (line - target).abs().max() <= span / min(n_old, n_new)


@pytest.mark.parametrize('old,new', [(14, 20), (14, 9), (7, 21), (56, 40), (28, 20), (56, 64), (7, 6)])
@pytest.mark.parametrize('contracted', [False, True])
def test_resample_token_axis_1d_matches_explicit_interpolation(old, new, contracted):
    g = torch.Generator().manual_seed(old * 100 + new)
    t = torch.randn(3, old, 4, generator=g)
    out = resample_token_axis(t, 1, (old,), (new,), contracted=contracted)
    assert out.shape == (3, new, 4) and out.dtype == t.dtype
    expected = torch.einsum('nm,bmc->bnc', interp_matrix(old, new), t.double())
    if contracted:
        expected = expected * (old / new)
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize('old,new', [((14, 14), (10, 12)), ((14, 14), (18, 16)), ((14, 14), (10, 16)), ((4, 6), (8, 3))])
@pytest.mark.parametrize('contracted', [False, True])
def test_resample_token_axis_2d_matches_explicit_interpolation(old, new, contracted):
    g = torch.Generator().manual_seed(sum(old) * 100 + sum(new))
    old_n, new_n = math.prod(old), math.prod(new)
    t = torch.randn(5, old_n, generator=g)
    out = resample_token_axis(t, 1, old, new, contracted=contracted)
    assert out.shape == (5, new_n)
    expected = t.double() @ grid_interp_matrix(old, new).T
    if contracted:
        expected = expected * (old_n / new_n)
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=1e-4)


def test_resample_token_axis_identity_and_errors():
    t = torch.randn(4, 49, 3)
    assert resample_token_axis(t, 1, (7, 7), (7, 7)) is t
    assert resample_token_axis(t, 1, (49,), (49,), contracted=True) is t
    with pytest.raises(ValueError):
        resample_token_axis(t, 1, (6, 6), (8, 8))  # axis length 49 != 36
    with pytest.raises(ValueError):
        resample_token_axis(t, 1, (7, 7), (10,))  # grid ranks differ
    with pytest.raises(ValueError):
        resample_token_axis(t, 1, (7, 7, 1), (7, 7, 1))


def test_non_square_checkpoint_grid_raises(tmp_path):
    # a gMLP checkpoint made at 160 x 192 (10 x 12 = 120 tokens) cannot be resampled: its grid is unknown
    src = timm.create_model('gmlp_ti', img_size=(160, 192), num_blocks=2)
    sd = src.state_dict()
    model = timm.create_model('gmlp_ti', img_size=224, num_blocks=2)
    with pytest.raises(ValueError, match='120'):
        gmlp_module.checkpoint_filter_fn(dict(sd), model)
    path = tmp_path / 'nonsquare.pth'
    torch.save(sd, path)
    with pytest.raises(ValueError):
        timm.create_model('gmlp_ti', pretrained=True, pretrained_cfg_overlay=dict(file=str(path)),
                          img_size=224, num_blocks=2)
    mixer_src = timm.create_model('mixer_s16', img_size=(160, 192), num_blocks=1)
    with pytest.raises(ValueError):
        mixer_module.checkpoint_filter_fn(
            dict(mixer_src.state_dict()), timm.create_model('mixer_s16', img_size=224, num_blocks=1))
