"""ResNet against torchvision's, and against the paper's Table 6."""

import pytest
import torch
import torch.nn as nn
import torchvision

from papers.resnet import PAPER, from_torchvision
from papers.resnet.model import FLAVORS, PadShortcut, Projection, ResNet

IMAGENET = {"ResNet-18": "resnet18", "ResNet-34": "resnet34", "ResNet-50": "resnet50",
            "ResNet-101": "resnet101", "ResNet-152": "resnet152"}
TABLE6 = {"ResNet-20": 0.27, "ResNet-32": 0.46, "ResNet-44": 0.66, "ResNet-56": 0.85, "ResNet-110": 1.7}  # millions


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def random_torchvision(name: str, **kwargs) -> nn.Module:
    """A torchvision ResNet in eval mode with random weights and random batch-norm statistics,
    so that a scale, shift, mean or variance mapped to the wrong place changes the output."""
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None, **kwargs)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.2)
                m.running_mean.normal_(0, 0.2)
                m.running_var.uniform_(0.5, 2.0)
    return model.eval()


@pytest.mark.parametrize("name, kwargs", [("resnet18", {}), ("resnet50", {}), ("resnet18", dict(num_classes=7))])
def test_logits_equal_torchvision(name, kwargs):
    theirs = random_torchvision(name, **kwargs)
    ours = from_torchvision(theirs).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected, got = theirs(x), ours(x)
    assert got.shape == expected.shape
    assert (got - expected).abs().max() < 1e-5
    assert expected.std() > 0.1  # the outputs differ enough between inputs and classes to tell


def test_from_torchvision_maps_every_tensor_and_keeps_the_buffers():
    theirs = random_torchvision("resnet18")
    ours = from_torchvision(theirs)
    assert len(ours.state_dict()) == len(theirs.state_dict())
    assert torch.equal(ours.stages[1][0].shortcut.bn.running_var, theirs.layer2[0].downsample[1].running_var)
    assert torch.equal(ours.stages[3][1].bn2.running_mean, theirs.layer4[1].bn2.running_mean)


@pytest.mark.parametrize("name, kwargs", [("resnext50_32x4d", {}), ("wide_resnet50_2", {}),
                                          ("resnet50", dict(replace_stride_with_dilation=[False, False, True]))])
def test_from_torchvision_refuses_what_the_paper_has_not(name, kwargs):
    with torch.device("meta"):
        theirs = getattr(torchvision.models, name)(weights=None, **kwargs)
    with pytest.raises(ValueError, match="cannot map|does not map"):
        from_torchvision(theirs)


@pytest.mark.parametrize("flavor", IMAGENET)
def test_imagenet_flavors_have_torchvision_parameter_counts(flavor):
    with torch.device("meta"):
        ours = PAPER.build(flavor)  # 224x224 images, 3 channels, 1000 classes
        theirs = getattr(torchvision.models, IMAGENET[flavor])(weights=None)
    assert count(ours) == count(theirs)


def test_known_torchvision_counts():
    with torch.device("meta"):
        assert count(PAPER.build("ResNet-18")) == 11_689_512
        assert count(PAPER.build("ResNet-50")) == 25_557_032


@pytest.mark.parametrize("flavor", TABLE6)
def test_table6_parameter_counts(flavor):
    with torch.device("meta"):
        model = PAPER.build(flavor)  # 32x32 CIFAR-10: 3 channels, 10 classes
    digits = 1 if TABLE6[flavor] >= 1 else 2  # the paper prints 0.27M, ..., 0.85M, 1.7M
    assert round(count(model) / 1e6, digits) == TABLE6[flavor], count(model)
    assert 6 * sum(FLAVORS[flavor]["layers"]) // 3 + 2 == int(flavor.split("-")[1])  # 6n + 2 layers


def test_cifar_shortcuts_are_option_a_and_parameter_free():
    model = PAPER.build("ResNet-20")
    shortcuts = [block.shortcut for stage in model.stages for block in stage]
    assert sum(isinstance(s, PadShortcut) for s in shortcuts) == 2  # at the two increases of width
    assert not any(isinstance(s, Projection) for s in shortcuts)
    assert not any(p.numel() for s in shortcuts for p in s.parameters())
    assert not [name for name, _ in model.named_parameters() if "shortcut" in name]


def test_option_a_subsamples_and_pads_with_zeros():
    x = torch.randn(2, 16, 8, 8)
    y = PadShortcut(16, 32, stride=2)(x)
    assert y.shape == (2, 32, 4, 4)
    assert torch.equal(y[:, :16], x[:, :, ::2, ::2])
    assert not y[:, 16:].any()


def test_option_b_projects_only_where_the_shape_changes():
    model = PAPER.build("ResNet-34")
    projections = [(i, j) for i, stage in enumerate(model.stages) for j, block in enumerate(stage)
                   if isinstance(block.shortcut, Projection)]
    assert projections == [(1, 0), (2, 0), (3, 0)]
    model = PAPER.build("ResNet-50")  # the first bottleneck also widens 64 -> 256
    assert isinstance(model.stages[0][0].shortcut, Projection)
    assert isinstance(model.stages[0][1].shortcut, nn.Identity)


def test_stage_resolutions_follow_table1():
    with torch.device("meta"):  # shapes only
        model = PAPER.build("ResNet-50")
        x = model.stem(torch.empty(1, 3, 224, 224))
    assert x.shape == (1, 64, 56, 56)  # conv2_x
    for stage, (chans, side) in zip(model.stages, [(256, 56), (512, 28), (1024, 14), (2048, 7)]):
        x = stage(x)
        assert x.shape == (1, chans, side, side)


def test_tiny_flavor_runs_on_8x8_digits():
    torch.manual_seed(0)
    model = PAPER.build("tiny", num_classes=10, in_chans=1)
    x = torch.randn(4, 1, 8, 8)
    features = model.forward_features(x)
    assert features.shape == (4, model.num_features, 2, 2)
    logits = model(x)
    assert logits.shape == (4, 10) and torch.isfinite(logits).all()
    assert PAPER.shard_blocks == "stages" and isinstance(model.stages, nn.ModuleList)
    assert model.no_weight_decay() <= {name for name, _ in model.named_parameters()}


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="unknown block"):
        ResNet(block="dense")
    with pytest.raises(ValueError, match="unknown shortcut"):
        ResNet(shortcut="C")
    with pytest.raises(ValueError, match="same stages"):
        ResNet(layers=(2, 2), widths=(64, 128, 256))
