""" A straightforward sMLPNet, written the obvious way: the speed and correctness baseline for ours.

This follows sMLPNet (Tang et al., arXiv:2109.05422, "Sparse MLP (sMLP)", eq. 1, Alg. 1) as the official code
(github.com/microsoft/SPACH) writes it, operator by operator: NCHW tensors; 1x1 ``nn.Conv2d`` on permuted tensors
for the axial mixes; ``torch.cat`` of [x, H-mixed, W-mixed] then a 1x1 fuse conv; the channel MLP on a permuted
(non-contiguous) view, as einops' ``Rearrange`` gives it. It is not registered with timm and is not part of the
package; ``benchmark.py`` times ours against it and ``tests/test_equivalence.py`` checks that ours computes the
same function.

Module names mirror :class:`mlp_vision.models.SparseMLPNet` so that OUR state dict loads into it
(:meth:`ReferenceSparseMLPNet.load_ours`); the only layout difference is that the axial mixes are 1x1 convs,
whose weights are (N, N, 1, 1) instead of (N, N). Unlike the official code, ``proj_h`` here mixes along H and
``proj_w`` along W (our names; the official ones are swapped), and any H x W divisible by 32 works.
"""
from typing import Dict, Sequence, Tuple

import torch
import torch.nn as nn

__all__ = ['ReferenceSparseMLPNet', 'reference_from']


class _RefAxialMLP(nn.Module):
    def __init__(self, dim: int, feat_size: Tuple[int, int]) -> None:
        super().__init__()
        height, width = feat_size
        self.norm = nn.BatchNorm2d(dim)
        self.act = nn.GELU()
        self.proj_h = nn.Conv2d(height, height, 1)
        self.proj_w = nn.Conv2d(width, width, 1)
        self.fuse_conv = nn.Conv2d(3 * dim, dim, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.norm(x))
        # put the mixed axis where a conv mixes (dim 1), mix, put it back
        x_h = self.proj_h(x.permute(0, 2, 1, 3)).permute(0, 2, 1, 3)
        x_w = self.proj_w(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        return self.fuse_conv(torch.cat([x, x_h, x_w], dim=1))


class _RefTokenMixer(nn.Module):
    def __init__(self, dim: int, feat_size: Tuple[int, int]) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(dim)
        self.act = nn.GELU()
        self.conv_dw = nn.Conv2d(dim, dim, 3, padding=1, groups=dim, bias=False)
        self.smlp = _RefAxialMLP(dim, feat_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.smlp(self.conv_dw(self.act(self.norm(x))))


class _RefMlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class _RefBlock(nn.Module):
    def __init__(self, dim: int, feat_size: Tuple[int, int], mlp_ratio: float) -> None:
        super().__init__()
        self.token_mixer = _RefTokenMixer(dim, feat_size)
        self.norm = nn.LayerNorm(dim)
        self.mlp = _RefMlp(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.token_mixer(x)
        # channel mixing on a 'b c h w -> b h w c' view and back, as the official Rearrange layers do
        return x + self.mlp(self.norm(x.permute(0, 2, 3, 1))).permute(0, 3, 1, 2)


class _RefStage(nn.Module):
    def __init__(self, in_chs: int, out_chs: int, depth: int, feat_size: Tuple[int, int], downsample: bool,
                 mlp_ratio: float) -> None:
        super().__init__()
        self.downsample = nn.Conv2d(in_chs, out_chs, 2, stride=2, bias=False) if downsample else nn.Identity()
        self.blocks = nn.Sequential(*[_RefBlock(out_chs, feat_size, mlp_ratio) for _ in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.downsample(x))


class _RefHead(nn.Module):
    def __init__(self, dim: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, num_classes) if num_classes > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.mean(dim=(2, 3)))


class ReferenceSparseMLPNet(nn.Module):
    """Straightforward sMLPNet (no drop path, no dropout: the official model has neither in effect)."""

    def __init__(
            self,
            num_classes: int = 1000,
            in_chans: int = 3,
            img_size: Tuple[int, int] = (224, 224),
            embed_dim: int = 80,
            depths: Sequence[int] = (2, 8, 14, 2),
            mlp_ratio: float = 3.,
    ) -> None:
        super().__init__()
        dims = [embed_dim * 2 ** i for i in range(len(depths))]
        self.stem = nn.Conv2d(in_chans, dims[0], 4, stride=4, bias=False)
        stages = []
        stride, prev = 4, dims[0]
        for i, depth in enumerate(depths):
            stride = stride * 2 if i > 0 else stride
            feat = (img_size[0] // stride, img_size[1] // stride)
            stages.append(_RefStage(prev, dims[i], depth, feat, i > 0, mlp_ratio))
            prev = dims[i]
        self.stages = nn.Sequential(*stages)
        self.norm = nn.BatchNorm2d(dims[-1])
        self.head = _RefHead(dims[-1], num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.stages(self.stem(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x))

    def load_ours(self, state_dict: Dict[str, torch.Tensor]) -> None:
        """Load an ``mlp_vision`` sMLPNet state dict (axial Linear weights become 1x1 conv weights)."""
        sd = {}
        for k, v in state_dict.items():
            if k.endswith(('smlp.proj_h.weight', 'smlp.proj_w.weight')):
                v = v[:, :, None, None]
            sd[k] = v
        self.load_state_dict(sd)


def reference_from(model: nn.Module) -> ReferenceSparseMLPNet:
    """The straightforward twin of an ``mlp_vision`` SparseMLPNet, with its weights, mode, device and dtype."""
    depths = [len(s.blocks) for s in model.stages]
    embed_dim = model.stem.out_channels
    blk = model.stages[0].blocks[0]
    mlp_ratio = blk.mlp.fc1.out_features / embed_dim
    num_classes = model.num_classes
    ref = ReferenceSparseMLPNet(
        num_classes=num_classes, in_chans=model.in_chans, img_size=model.img_size, embed_dim=embed_dim,
        depths=depths, mlp_ratio=mlp_ratio)
    p = next(model.parameters())
    ref.to(device=p.device, dtype=p.dtype)
    ref.load_ours(model.state_dict())
    ref.train(model.training)
    return ref
