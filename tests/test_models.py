"""Tests for cosmos_pl.models (backbone factory, small-input stems, Kaiming init)."""

from __future__ import annotations

import math

import pytest
import timm
import torch
from torch import nn

from cosmos_pl.models import (
    TORCHVISION_BACKBONES,
    available_backbones,
    create_backbone,
    kaiming_init_,
)

NUM_CLASSES = 10

_SMALL = ["mobilenetv3_small_050", "lcnet_050", "resnet10t"]
_SMALL += [n for n in ("test_resnet", "test_efficientnet") if timm.is_model(n)]

BACKBONES = [
    "alexnet",
    "squeezenet1_0",
    "squeezenet1_1",
    "resnet18",
    "mobilenetv2_100",
    "mobilenetv3_small_100",
    "vgg16",
    *_SMALL,
]

# (in_chans, image_size): CIFAR-10 and (Fashion-)MNIST.
SHAPES = [(3, 32), (1, 28)]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def _first_conv(model: nn.Module) -> nn.Conv2d:
    return next(m for m in model.modules() if isinstance(m, nn.Conv2d))


def _forward_backward(model: nn.Module, in_chans: int, image_size: int) -> torch.Tensor:
    model.train()
    x = torch.randn(2, in_chans, image_size, image_size)
    logits = model(x)
    assert logits.shape == (2, NUM_CLASSES)
    assert logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    loss = nn.functional.cross_entropy(logits, torch.tensor([1, 7]))
    loss.backward()
    return logits


@pytest.mark.parametrize("in_chans,image_size", SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("name", BACKBONES)
def test_forward_backward(name, in_chans, image_size):
    model = create_backbone(name, NUM_CLASSES, in_chans=in_chans, image_size=image_size)
    _forward_backward(model, in_chans, image_size)
    conv = _first_conv(model)
    assert conv.in_channels == in_chans
    grad = conv.weight.grad
    assert grad is not None
    assert torch.isfinite(grad).all()
    assert grad.abs().sum() > 0


@pytest.mark.parametrize("name", [*_SMALL, "squeezenet1_1", "squeezenet1_0", "alexnet"])
def test_digits_8x8(name):
    """scikit-learn digits (8x8x1) must run: no pooling stage may collapse to 0."""
    model = create_backbone(name, NUM_CLASSES, in_chans=1, image_size=8)
    _forward_backward(model, 1, 8)
    assert torch.isfinite(_first_conv(model).weight.grad).all()


def test_resnet18_small_input_stem():
    model = create_backbone("resnet18", NUM_CLASSES, in_chans=3, image_size=32)
    assert isinstance(model.conv1, nn.Conv2d)
    assert model.conv1.kernel_size == (3, 3)
    assert model.conv1.stride == (1, 1)
    assert model.conv1.padding == (1, 1)
    assert isinstance(model.maxpool, nn.Identity)


def test_resnet18_large_input_keeps_imagenet_stem():
    model = create_backbone("resnet18", NUM_CLASSES, in_chans=3, image_size=224)
    assert model.conv1.kernel_size == (7, 7)
    assert model.conv1.stride == (2, 2)
    assert isinstance(model.maxpool, nn.MaxPool2d)


def test_resnet10t_deep_stem_stride1():
    model = create_backbone("resnet10t", NUM_CLASSES, in_chans=1, image_size=28)
    assert model.conv1[0].stride == (1, 1)
    assert isinstance(model.maxpool, nn.Identity)


def test_conv_stem_stride_depends_on_image_size():
    assert create_backbone("lcnet_050", NUM_CLASSES, image_size=32).conv_stem.stride == (1, 1)
    assert create_backbone("lcnet_050", NUM_CLASSES, image_size=64).conv_stem.stride == (2, 2)


@pytest.mark.parametrize("name", ["squeezenet1_0", "squeezenet1_1"])
def test_squeezenet_small_stem_and_head(name):
    model = create_backbone(name, NUM_CLASSES, in_chans=1, image_size=28)
    stem = model.features[0]
    assert (stem.in_channels, stem.kernel_size, stem.stride, stem.padding) == (1, (3, 3), (1, 1), (1, 1))
    assert model.classifier[1].out_channels == NUM_CLASSES


def test_vgg16_small_head_param_count():
    model = create_backbone("vgg16", NUM_CLASSES, in_chans=3, image_size=32)
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params < 20_000_000
    assert 14_000_000 < n_params < 15_000_000  # 13 convs (~14.71M) + Linear(512, 10)
    assert isinstance(model.pre_logits, nn.Identity)
    assert model.get_classifier().in_features == 512


def test_alexnet_small_is_modest():
    model = create_backbone("alexnet", NUM_CLASSES, in_chans=3, image_size=32)
    assert sum(p.numel() for p in model.parameters()) < 5_000_000
    assert model.features[0].stride == (1, 1)


def test_kaiming_init_conv_std_and_zero_biases():
    model = create_backbone("resnet18", NUM_CLASSES, in_chans=3, image_size=32)
    conv = model.layer1[0].conv1  # Conv2d(64, 64, 3x3): fan_in = 64 * 3 * 3
    fan_in = 64 * 3 * 3
    expected = math.sqrt(2.0 / fan_in)
    std = conv.weight.detach().std().item()
    assert std == pytest.approx(expected, rel=0.05)
    assert conv.weight.detach().mean().abs().item() < 0.05 * expected
    fc = model.get_classifier()
    assert fc.weight.detach().std().item() == pytest.approx(math.sqrt(2.0 / 512), rel=0.1)
    assert torch.count_nonzero(fc.bias) == 0
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert torch.all(m.weight == 1) and torch.all(m.bias == 0)


def test_kaiming_init_biases_zero_with_bias_convs():
    model = create_backbone("squeezenet1_1", NUM_CLASSES, in_chans=3, image_size=32)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert convs and all(torch.count_nonzero(m.bias) == 0 for m in convs)
    fire_expand = model.features[3].expand3x3  # Conv2d(16, 64, 3x3): fan_in = 144
    assert fire_expand.weight.detach().std().item() == pytest.approx(math.sqrt(2.0 / 144), rel=0.1)


def test_kaiming_init_returns_module_and_resets_norm():
    module = nn.Sequential(nn.Conv2d(3, 256, 3, bias=True), nn.BatchNorm2d(256), nn.Linear(400, 300))
    nn.init.constant_(module[0].bias, 3.0)
    nn.init.constant_(module[1].weight, 0.0)
    nn.init.constant_(module[1].bias, 2.0)
    assert kaiming_init_(module) is module
    assert torch.count_nonzero(module[0].bias) == 0
    assert torch.all(module[1].weight == 1) and torch.all(module[1].bias == 0)
    assert module[0].weight.std().item() == pytest.approx(math.sqrt(2.0 / 27), rel=0.05)
    assert module[2].weight.std().item() == pytest.approx(math.sqrt(2.0 / 400), rel=0.05)


def test_unknown_name_suggests_close_match():
    with pytest.raises(ValueError) as excinfo:
        create_backbone("resnet18x", NUM_CLASSES)
    msg = str(excinfo.value)
    assert "'resnet18x'" in msg
    assert "'resnet18'" in msg
    assert "timm.list_models(" in msg


def test_a_pretrained_tag_is_refused_not_ignored():
    # every backbone trains from scratch: resnet18.a1_in1k would silently give a random resnet18
    from cosmos_pl.errors import ConfigError
    from cosmos_pl.models import check_backbone_name

    with pytest.raises(ConfigError) as excinfo:
        create_backbone("resnet18.a1_in1k", NUM_CLASSES)
    assert str(excinfo.value) == (
        "backbone='resnet18.a1_in1k': '.a1_in1k' is a timm pretrained tag, but cosmos-pl loads no pretrained weights "
        "(every backbone trains from scratch with Kaiming initialisation, as in the COSMOS paper); give the "
        "architecture alone: 'resnet18'")
    with pytest.raises(ConfigError, match=r"^clients.backbones\[2\]='resnet18.a1_in1k': '.a1_in1k' is a timm "):
        check_backbone_name("resnet18.a1_in1k", "clients.backbones[2]")
    with pytest.raises(ConfigError, match="unknown backbone"):  # an unknown architecture is named as such first
        check_backbone_name("resnet18x.a1_in1k", "clients.backbones[0]")
    check_backbone_name("resnet18", "clients.backbones[0]")
    check_backbone_name("squeezenet1_1", "clients.backbones[0]")


def test_unknown_torchvision_like_name_suggests_squeezenet():
    with pytest.raises(ValueError, match="squeezenet1_1"):
        create_backbone("squeezenet1_2", NUM_CLASSES)


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_invalid_num_classes(bad):
    with pytest.raises(ValueError, match="num_classes"):
        create_backbone("resnet18", bad)


def test_available_backbones():
    names = available_backbones()
    for name in TORCHVISION_BACKBONES:
        assert name in names
    assert "resnet18" in names and "vgg16" in names
    assert len(names) == len(timm.list_models()) + len(TORCHVISION_BACKBONES)


@pytest.mark.parametrize("name", ["squeezenet1_0", "squeezenet1_1"])
def test_squeezenet_logits_are_signed_and_every_class_gets_gradient(name):
    # every class map below 0 (weight 0, bias -1): torchvision's head would clamp the logits to 0 and pass no
    # gradient; ours gives -1 and cross-entropy's bias gradient mean_i(softmax - onehot) = 1/M - [k == y]
    model = create_backbone(name, NUM_CLASSES, in_chans=1, image_size=28).eval()
    conv = model.classifier[1]
    nn.init.zeros_(conv.weight)
    nn.init.constant_(conv.bias, -1.0)
    logits = model(torch.randn(4, 1, 28, 28))
    assert torch.equal(logits, torch.full((4, NUM_CLASSES), -1.0))
    torch.nn.functional.cross_entropy(logits, torch.zeros(4, dtype=torch.long)).backward()
    expected = torch.full((NUM_CLASSES,), 1.0 / NUM_CLASSES)
    expected[0] -= 1.0
    assert torch.allclose(conv.bias.grad, expected)
