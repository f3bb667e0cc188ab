""" Helpers shared by the test files (imported as ``from _helpers import ...``; pytest puts ``tests/`` on the path). """
import pytest
import torch
import torch.nn as nn


def randomize_(module: nn.Module, seed: int = 1234, std: float = 0.3) -> nn.Module:
    """Give every float parameter and buffer non-trivial values (norm affine, biases, BN statistics, head), in place.

    Initial values (zero biases, unit norms, W ~ 0 in the SGU) would hide mistakes in how they are used.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if not t.is_floating_point():
                continue
            if name.endswith('running_var'):
                t.copy_(0.5 + torch.rand(t.shape, generator=g))
            elif name.endswith('running_mean'):
                t.copy_(0.3 * torch.randn(t.shape, generator=g))
            elif t.ndim == 1 and name.endswith('weight'):  # norm scales
                t.copy_(1. + 0.3 * torch.randn(t.shape, generator=g))
            else:
                t.copy_(std * torch.randn(t.shape, generator=g))
    return module


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# tiny runs of the two trainers (seconds each): a width-8 sMLPNet at 32x32 and a 1-layer 16-wide text model
TINY_VISION = ['--model', 'smlpnet_t', '--model-kwargs', 'embed_dim=8', 'depths=(1,1,1,1)', '--img-size', '32',
               '--workers', '0', '--log-interval', '100', '-b', '4', '--warmup-epochs', '0']
TINY_GPT = ['--model', 'gpt_mlp_attention', '--model-kwargs', 'num_hidden_layers=1', 'hidden_size=16',
            'num_attention_heads=2', 'max_position_embeddings=16', 'mlp_attention_hidden_size=16', '--threads', '1',
            '--log-interval', '1000', '-b', '2', '--device', 'cpu']


def exits_with_one_line(main, argv, capsys, status: int = 2) -> str:
    """Run a script's ``main(argv)``: it must exit with ``status`` and exactly one line on stderr (no traceback, no
    usage text). Returns that line."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == status, e.value.message
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [e.value.message], err
    return e.value.message


def crafted_checkpoint(source, folder, change):
    """A copy of checkpoint ``source`` as ``folder/last.pth`` with ``change(ckpt)`` applied (still weights-only
    data: what a hostile or damaged file can hold)."""
    from pathlib import Path
    from mlp_vision.outputs import atomic_save
    ckpt = torch.load(source, map_location='cpu', weights_only=True)
    change(ckpt)
    Path(folder).mkdir(parents=True, exist_ok=True)
    atomic_save(ckpt, Path(folder) / 'last.pth')
    return Path(folder) / 'last.pth'
