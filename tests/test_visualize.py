""" ``python -m mlp_vision.visualize``: the drawn arrays are what the layers apply (each checked against the layer's
own forward on basis inputs), and the command writes one PNG set per model family with one-line errors. """
import os

import pytest
import torch
import torch.nn as nn
from timm.models.mlp_mixer import SpatialGatingUnit as TimmSpatialGatingUnit

from _helpers import exits_with_one_line, randomize_
from mlp_vision.layers.gating import SpatialGatingUnit
from mlp_vision.layers.sparse_mlp import AxialSparseMLP
from mlp_vision.layers.ssm import BidirectionalGatedSSM
from mlp_vision.visualize import axial_weights, load_model, main, spatial_projections, ssm_responses


@pytest.mark.parametrize('sgu', [
    SpatialGatingUnit(4, 6, spatial_mode='dense'),
    SpatialGatingUnit(4, 6, spatial_mode='toeplitz'),
    SpatialGatingUnit(4, 6, spatial_mode='causal'),
    TimmSpatialGatingUnit(4, 6),
], ids=['dense', 'toeplitz', 'causal', 'timm'])
def test_spatial_projection_is_the_sgu_response(sgu):
    randomize_(sgu)
    sgu.norm = nn.Identity()  # so the gate half enters the token projection as it is
    n = 6
    x = torch.zeros(n, n, 4)
    x[..., :2] = 1.  # the multiplicative bypass u = 1
    x[torch.arange(n), torch.arange(n), 2] = 1.  # sample j: a one-hot gate at token j (gate channel 0)
    with torch.no_grad():
        out = sgu(x)[:, :, 0]  # (j, i) = W[i, j] + b[i]
        zero = sgu(torch.cat([torch.ones(1, n, 2), torch.zeros(1, n, 2)], -1))[0, :, 0]  # b[i]
    (name, w), = spatial_projections(nn.Sequential(sgu))
    torch.testing.assert_close(w, (out - zero).T)


def test_axial_weights_are_what_the_smlp_applies():
    smlp = randomize_(AxialSparseMLP(1, (3, 5))).eval()
    smlp.norm, smlp.act = nn.Identity(), nn.Identity()
    (_, w_h, w_w), = axial_weights(nn.Sequential(smlp))
    for branch, w, size in ((1, w_h, 3), (2, w_w, 5)):
        with torch.no_grad():
            smlp.fuse_conv.weight.zero_()
            smlp.fuse_conv.weight[0, branch] = 1.  # the output is the H-mixed (1) or W-mixed (2) input
            x = torch.zeros(size, 1, 3, 5)  # sample j: one-hot at row j (H) or column j (W)
            for j in range(size):
                if branch == 1:
                    x[j, 0, j, :] = 1.
                else:
                    x[j, 0, :, j] = 1.
            y = smlp(x)[:, 0]
            y = y[:, :, 0] if branch == 1 else y[:, 0, :]  # (j, i): W[i, j] + bias[i]
            bias = (smlp.proj_h if branch == 1 else smlp.proj_w).bias
        torch.testing.assert_close(w, (y - bias).T)


@pytest.mark.parametrize('conv_impl', ['direct', 'fft'])
def test_ssm_responses_are_the_layer_impulse_response(conv_impl):
    layer = BidirectionalGatedSSM(4, 8, num_states=4, conv_impl=conv_impl)
    with torch.no_grad():
        layer.ssm_forward.D.fill_(0.7)
        layer.ssm_backward.D.fill_(-0.4)
    length = 12
    (_, r), = ssm_responses(nn.Sequential(layer), length)
    u = torch.zeros(1, length, 2, 1)
    u[0, 0, 0, 0] = 1.  # forward: an impulse at the first token; output t = weight of lag t
    u[0, -1, 1, 0] = 1.  # backward: at the last token; output t = weight of lag L - 1 - t
    with torch.no_grad():
        y = layer._bidirectional_ssm(u)[0, :, :, 0]  # (L, 2)
    torch.testing.assert_close(r[0], y[:, 0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(r[1], y[:, 1].flip(0), atol=1e-5, rtol=1e-5)
    assert r[0, 0].item() == pytest.approx(0.7 + layer.ssm_forward.kernel(length)[0].item(), abs=1e-5)


_TINY_BIGS = ['num_hidden_layers=2', 'hidden_size=16', 'intermediate_size=32', 'max_position_embeddings=16']


@pytest.mark.parametrize('argv, files', [
    (['gmlp_ti', '--grid-tokens', '2', '--model-kwargs', 'num_blocks=2', 'img_size=32', 'patch_size=8',
      'mlp_ratio=1'],
     ['gmlp_spatial_filters_layers00-01.png']),
    (['smlpnet_t', '--model-kwargs', 'embed_dim=8', 'depths=(1,1,1,1)', 'img_size=32'],
     [f'smlp_axial_weights_stage{i}.png' for i in range(4)]),
    (['bigs_small', '--model-kwargs', *_TINY_BIGS], ['bigs_ssm_kernels.png']),
    (['gmlp_base', '--model-kwargs', *_TINY_BIGS, 'vocab_size=40'], ['gmlp_text_spatial_filters.png']),
], ids=['gmlp', 'smlpnet', 'bigs', 'gmlp_text'])
def test_command_writes_one_figure_set(argv, files, tmp_path, capsys):
    out = tmp_path / 'figs'
    paths = main(argv + ['--out', str(out)])
    assert sorted(os.listdir(out)) == sorted(files) == sorted(os.path.basename(p) for p in paths)
    assert f'in {out}' in capsys.readouterr().out


def test_command_reads_checkpoints_and_text_folders(tmp_path):
    import timm
    from mlp_vision.text.registry import create_model as create_text_model
    model = timm.create_model('smlpnet_t', embed_dim=8, depths=(1, 1, 1, 1), img_size=32)
    torch.save(model.state_dict(), tmp_path / 'weights.pth')
    main([str(tmp_path / 'weights.pth'), '--model', 'smlpnet_t', '--out', str(tmp_path / 'a'),
          '--model-kwargs', 'embed_dim=8', 'depths=(1,1,1,1)', 'img_size=32'])
    assert len(os.listdir(tmp_path / 'a')) == 4
    text = create_text_model('bigs_small', num_hidden_layers=2, hidden_size=16, intermediate_size=32,
                             max_position_embeddings=16)
    text.save_pretrained(str(tmp_path / 'saved'))
    main([str(tmp_path / 'saved'), '--out', str(tmp_path / 'b')])
    assert os.listdir(tmp_path / 'b') == ['bigs_ssm_kernels.png']


def test_command_errors_are_one_line(tmp_path, capsys):
    full = tmp_path / 'full'
    full.mkdir()
    (full / 'keep.png').write_bytes(b'mine')
    line = exits_with_one_line(main, ['bigs_small', '--out', str(full)], capsys)
    assert 'is not empty' in line and os.listdir(full) == ['keep.png']
    line = exits_with_one_line(main, [str(tmp_path / 'missing.pth'), '--out', str(tmp_path / 'o')], capsys)
    assert 'is no file, folder or model name' in line
    line = exits_with_one_line(main, ['mixer_s16', '--model-kwargs', 'num_blocks=1', 'img_size=32',
                                      '--out', str(tmp_path / 'o')], capsys)
    assert 'has none of the layers this command draws' in line and not (tmp_path / 'o').exists()


def test_without_matplotlib_one_line_names_the_extra(tmp_path, capsys, monkeypatch):
    import importlib.util
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None if name == 'matplotlib' else find_spec(name, *a))
    line = exits_with_one_line(main, ['bigs_small', '--out', str(tmp_path / 'o')], capsys)
    assert 'pip install "mlp_vision[viz]"' in line and not (tmp_path / 'o').exists()

def test_only_the_size_bounds_that_apply_are_flags(tmp_path, capsys):
    """visualize runs no forward pass, so --max-activation-gib (a bound on a forward's activations) is no flag of
    it (it was accepted and did nothing); --max-params bounds the model it builds."""
    out = ['--out', str(tmp_path / 'o')]
    line = exits_with_one_line(main, ['smlpnet_t', '--max-activation-gib', '1e-9'] + out, capsys)
    assert 'unrecognized arguments: --max-activation-gib' in line
    tiny = ['--model-kwargs', 'embed_dim=8', 'depths=(1,1,1,1)', 'img_size=32']
    line = exits_with_one_line(main, ['smlpnet_t', '--max-params', '1000'] + tiny + out, capsys)
    assert 'would have more than 1e+03 parameters' in line and not (tmp_path / 'o').exists()


TINY_SMLPNET = dict(embed_dim=8, depths=(1, 1, 1, 1), img_size=32, num_classes=2)


def _local_dir(folder):
    """A run's pretrained/ folder (config.json + model.safetensors, as train.py exports it) of a tiny sMLPNet."""
    import timm
    from timm.models import save_for_hf
    model = randomize_(timm.create_model('smlpnet_t', **TINY_SMLPNET)).eval()
    save_for_hf(model, str(folder), model_config={'label_names': ['a', 'b']}, safe_serialization=True)
    return model


def test_a_local_dir_folder_is_drawn_with_its_weights(tmp_path):
    """``local-dir:FOLDER`` loads through validate.py's door (create_model_for_eval): the folder's own weights."""
    saved = _local_dir(tmp_path / 'pretrained')
    model, what = load_model(f'local-dir:{tmp_path / "pretrained"}')
    assert what == f'local-dir:{tmp_path / "pretrained"} (pretrained weights)'
    assert model.state_dict().keys() == saved.state_dict().keys()
    assert all(torch.equal(t, saved.state_dict()[k]) for k, t in model.state_dict().items())
    paths = main([f'local-dir:{tmp_path / "pretrained"}', '--out', str(tmp_path / 'figs')])
    assert sorted(os.listdir(tmp_path / 'figs')) == [f'smlp_axial_weights_stage{i}.png' for i in range(4)]
    assert len(paths) == 4


def _nan_stem(folder):
    from safetensors.torch import load_file, save_file
    sd = load_file(str(folder / 'model.safetensors'))
    sd['stem.weight'] = torch.full_like(sd['stem.weight'], float('nan'))
    save_file(sd, str(folder / 'model.safetensors'))


def _truncate(folder):
    path = folder / 'model.safetensors'
    path.write_bytes(path.read_bytes()[:1000])


@pytest.mark.parametrize('damage, says', [(_nan_stem, 'stem.weight holds 384 NaN / infinite value(s)'),
                                           (_truncate, 'is not a readable safetensors file')], ids=['nan', 'truncated'])
def test_a_damaged_local_dir_folder_is_one_line_naming_the_file(damage, says, tmp_path, capsys):
    """The checks validate.py makes on a local-dir: folder (weights.py's check_state_dict, load_checkpoint_file)."""
    folder = tmp_path / 'pretrained'
    _local_dir(folder)
    damage(folder)
    line = exits_with_one_line(main, [f'local-dir:{folder}', '--out', str(tmp_path / 'figs')], capsys)
    assert f'{folder}/model.safetensors' in line and says in line and not (tmp_path / 'figs').exists()
