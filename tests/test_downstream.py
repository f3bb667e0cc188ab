""" The ``features_only`` backbones in real downstream heads (issue 36 item 4): torchvision's Faster R-CNN and
RetinaNet through a feature pyramid (``torchvision.ops.FeaturePyramidNetwork`` over the maps ``feature_info``
describes), and a segmentation head (torchvision's ``DeepLabHead`` on the last map), one training step each on tiny
models and non-square synthetic images. The adapter is the few lines of the README's "Backbones in detection and
segmentation".

Every model here is built for one input size (the token-mixing weights of gMLP / Mixer span the token grid, sMLPNet's
mix along H and W), so the detector's transform resizes each image to exactly that size (``fixed_size=(W, H)``).
The isotropic models give maps of one stride (their patch size): several blocks' outputs feed the pyramid.
"""
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
import timm
import torch
import torch.nn as nn
import torch.nn.functional as F

pytest.importorskip('torchvision')
from torchvision.models.detection import FasterRCNN, RetinaNet  # noqa: E402
from torchvision.models.detection.anchor_utils import AnchorGenerator  # noqa: E402
from torchvision.models.segmentation.deeplabv3 import DeepLabHead  # noqa: E402
from torchvision.ops import FeaturePyramidNetwork, MultiScaleRoIAlign  # noqa: E402
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import mlp_vision  # noqa: E402,F401  (registers the models)

H, W = 64, 96  # non-square; a multiple of 32, the detector transform's default size_divisible


# ------------------------------------------------------------------------------------------------ the README's lines
class FPNBackbone(nn.Module):
    """A features_only model + torchvision's FPN: the ``backbone`` torchvision's detectors take (an ``out_channels``
    attribute, a dict of maps)."""

    def __init__(self, features: nn.Module, out_channels: int = 32):
        super().__init__()
        self.body, self.out_channels = features, out_channels
        self.fpn = FeaturePyramidNetwork(features.feature_info.channels(), out_channels, LastLevelMaxPool())

    def forward(self, x):
        return self.fpn(OrderedDict((str(i), f) for i, f in enumerate(self.body(x))))


def anchors_for(features: nn.Module) -> AnchorGenerator:
    n = len(features.feature_info.channels()) + 1  # + the FPN's max-pooled level
    return AnchorGenerator(tuple((16 * 2 ** i,) for i in range(n)), ((0.5, 1.0, 2.0),) * n)


def faster_rcnn(features: nn.Module, num_classes: int) -> FasterRCNN:
    names = [str(i) for i in range(len(features.feature_info.channels()))]
    cfg = features.pretrained_cfg
    return FasterRCNN(FPNBackbone(features), num_classes, rpn_anchor_generator=anchors_for(features),
                      box_roi_pool=MultiScaleRoIAlign(names, output_size=7, sampling_ratio=2),
                      min_size=H, max_size=W, fixed_size=(W, H), image_mean=list(cfg['mean']), image_std=list(cfg['std']))


def retinanet(features: nn.Module, num_classes: int) -> RetinaNet:
    cfg = features.pretrained_cfg
    return RetinaNet(FPNBackbone(features), num_classes, anchor_generator=anchors_for(features), min_size=H,
                     max_size=W, fixed_size=(W, H), image_mean=list(cfg['mean']), image_std=list(cfg['std']))


# ------------------------------------------------------------------------------------------------ tiny backbones
def _backbone(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name == 'smlpnet_t':  # 4 maps, strides 4..32
        return timm.create_model(name, features_only=True, embed_dim=8, depths=(1, 1, 1, 1), img_size=(H, W))
    # isotropic: the outputs of blocks 1 and 3, both at stride 8 (the patch size)
    kwargs = dict(features_only=True, embed_dim=16, num_blocks=4, patch_size=8, out_indices=(1, 3))
    if name == 'gmlp_ti':  # made for another size (e.g. its pretrained one), then set to the detector's
        features = timm.create_model(name, img_size=(32, 48), **kwargs)
        features.model.set_input_size(img_size=(H, W))
        return features
    return timm.create_model(name, img_size=(H, W), **kwargs)


FAMILIES = ['smlpnet_t', 'gmlp_ti', 'mixer_s16']


def _images_and_targets():
    images = [torch.rand(3, H, W), torch.rand(3, 80, 100)]  # the second resized by the transform to H x W
    targets = [dict(boxes=torch.tensor([[4., 6., 40., 50.]]), labels=torch.tensor([1])),
               dict(boxes=torch.tensor([[10., 8., 90., 70.], [0., 0., 20., 20.]]), labels=torch.tensor([2, 1]))]
    return images, targets


def _train_step(model: nn.Module, backbone: nn.Module, loss_of) -> None:
    """loss finite, every backbone weight gets a finite gradient (the stem's non-zero), a step changes them."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in backbone.parameters()]
    loss = loss_of()
    assert torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in backbone.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert all(p.grad.abs().sum() > 0 for p in backbone.model.stem.parameters())  # it reaches the input end
    optimizer.step()
    assert any(not torch.equal(a, p) for a, p in zip(before, backbone.parameters()))


@pytest.mark.parametrize('name', FAMILIES)
def test_faster_rcnn_trains_a_step_on_the_backbone(name, single_thread):
    backbone = _backbone(name)
    detector = faster_rcnn(backbone, num_classes=3).train()
    images, targets = _images_and_targets()

    def loss():
        losses = detector(images, targets)
        assert set(losses) == {'loss_classifier', 'loss_box_reg', 'loss_objectness', 'loss_rpn_box_reg'}
        return sum(losses.values())
    _train_step(detector, backbone, loss)
    detector.eval()
    detector.roi_heads.score_thresh = 0.  # an untrained detector: keep every box
    with torch.no_grad():
        found = detector(images)
    assert len(found) == 2 and all(len(d['boxes']) > 0 for d in found)
    # boxes lie within each image as given (the second is 100 x 80, resized to W x H inside the detector)
    assert found[0]['boxes'][:, 2].max() <= W and found[0]['boxes'][:, 3].max() <= H
    assert found[1]['boxes'][:, 2].max() <= 100 and found[1]['boxes'][:, 3].max() <= 80


@pytest.mark.parametrize('name', FAMILIES)
def test_retinanet_trains_a_step_on_the_backbone(name, single_thread):
    backbone = _backbone(name)
    detector = retinanet(backbone, num_classes=3).train()
    images, targets = _images_and_targets()
    _train_step(detector, backbone, lambda: sum(detector(images, targets).values()))


@pytest.mark.parametrize('name', FAMILIES)
def test_a_segmentation_head_trains_a_step_on_the_backbone(name, single_thread):
    backbone = _backbone(name)
    head = DeepLabHead(backbone.feature_info.channels()[-1], num_classes=3)
    model = nn.ModuleDict({'backbone': backbone, 'head': head}).train()
    x, masks = torch.rand(2, 3, H, W), torch.randint(0, 3, (2, H, W))

    def loss():
        logits = F.interpolate(head(backbone(x)[-1]), size=x.shape[-2:], mode='bilinear', align_corners=False)
        assert logits.shape == (2, 3, H, W)
        return F.cross_entropy(logits, masks)
    _train_step(model, backbone, loss)


def test_feature_info_gives_the_pyramid_its_channels_and_strides():
    smlp, gmlp = _backbone('smlpnet_t'), _backbone('gmlp_ti')
    assert smlp.feature_info.channels() == [8, 16, 32, 64] and smlp.feature_info.reduction() == [4, 8, 16, 32]
    assert gmlp.feature_info.channels() == [16, 16] and gmlp.feature_info.reduction() == [8, 8]
    with torch.no_grad():
        maps = FPNBackbone(smlp).eval()(torch.rand(1, 3, H, W))
    assert [tuple(m.shape[-2:]) for m in maps.values()] == [(16, 24), (8, 12), (4, 6), (2, 3), (1, 2)]
