"""ResNeXt: the three forms of Fig. 3, against torchvision's, and against the paper's Tables 1, 3, 4 and 7."""

import pytest
import torch
import torch.nn as nn
import torchvision
from torchvision.models.resnet import Bottleneck, ResNet

from common.throughput import forward_macs
from tests.conftest import randomize_batch_norm
from papers.resnext import PAPER, from_torchvision
from papers.resnext.model import FLAVORS, AggregatedBottleneck, ResNeXt, SplitTransformMerge


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def gmacs(flavor: str, size: int = 224, **kwargs) -> float:
    """Multiply-adds of one image (3 channels; the tiny flavors' 1) of size x size, in billions."""
    chans = FLAVORS[flavor].get("in_chans", 3)
    return forward_macs(lambda: PAPER.build(flavor, **kwargs), chans, size, size) / 1e9


@pytest.mark.parametrize("in_chans, width, stride, C, d", [(256, 64, 1, 32, 4), (64, 32, 2, 8, 3), (16, 16, 1, 1, 8)])
def test_the_three_forms_of_fig3_are_one_block(in_chans, width, stride, C, d):
    """Form (a), C separate paths summed, and form (b), early concatenation, on the weights of form (c), the
    grouped convolution, give its outputs within 1e-5 (eval mode, random batch-norm statistics)."""
    torch.manual_seed(0)
    grouped = randomize_batch_norm(AggregatedBottleneck(in_chans, width, stride, C, d)).eval()
    paths = SplitTransformMerge.from_grouped(grouped).eval()
    assert len(paths.paths) == C and paths.paths[0][0].out_channels == d
    x = torch.relu(torch.randn(2, in_chans, 9, 10))
    with torch.no_grad():
        y_c, mask = grouped(x)
        y_a, y_b = paths(x), paths(x, early_concatenation=True)
    assert y_c.shape == (2, 4 * width, 9 // stride + 9 % stride, 10 // stride) and mask is None
    assert (y_a - y_c).abs().max() < 1e-5 and (y_b - y_c).abs().max() < 1e-5
    assert y_c.std() > 0.1
    assert count(paths) == count(grouped)  # the same parameters, laid out as C paths


def random_torchvision(build, *args, **kwargs) -> nn.Module:
    """A torchvision ResNet in eval mode with random weights and random batch-norm statistics."""
    torch.manual_seed(0)
    return randomize_batch_norm(build(*args, **kwargs))


def test_logits_equal_torchvisions_resnext50_32x4d():
    theirs = random_torchvision(torchvision.models.resnext50_32x4d)
    ours = PAPER.build("resnext50_32x4d")
    ours.load_state_dict(from_torchvision(theirs).state_dict())
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected, got, loaded = theirs(x), ours.eval()(x), from_torchvision(theirs).eval()(x)
    assert got.shape == expected.shape == (2, 1000)
    assert (got - expected).abs().max() < 1e-5 and (loaded - expected).abs().max() < 1e-5
    assert expected.std() > 0.1


@pytest.mark.parametrize("layers, groups, width_per_group, num_classes", [
    ([1, 2, 1, 1], 8, 16, 7),  # other cardinality and width
    ([2, 1, 1, 2], 3, 5, 11),  # odd ones
    ([1, 1, 1, 1], 1, 64, 5),  # 1x64d: ResNet's bottleneck
    ([1, 1, 2, 1], 2, 40, 10),  # Table 3's 2x40d
])
def test_from_torchvision_maps_other_group_counts_widths_and_classes(layers, groups, width_per_group, num_classes):
    theirs = random_torchvision(ResNet, Bottleneck, layers, groups=groups, width_per_group=width_per_group,
                                num_classes=num_classes)
    ours = from_torchvision(theirs).eval()
    assert ours.cardinality == groups and ours.stages[3][0].conv2.groups == groups
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected = theirs(x)
        assert (ours(x) - expected).abs().max() < 1e-5 and expected.shape == (2, num_classes)
    assert len(ours.state_dict()) == len(theirs.state_dict())


@pytest.mark.parametrize("flavor, build", [
    ("resnext50_32x4d", torchvision.models.resnext50_32x4d),
    ("resnext101_64x4d", torchvision.models.resnext101_64x4d),
    ("resnext101_32x4d", lambda: ResNet(Bottleneck, [3, 4, 23, 3], groups=32, width_per_group=4)),
])
def test_from_torchvision_builds_the_flavor(flavor, build):
    with torch.device("meta"):
        theirs = build()
        assert repr(from_torchvision(theirs)) == repr(PAPER.build(flavor))  # every layer, stride and group
        assert count(PAPER.build(flavor)) == count(theirs)


@pytest.mark.parametrize("build, match", [
    (lambda: torchvision.models.resnet18(), "BasicBlock"),
    (lambda: torchvision.models.resnext50_32x4d(replace_stride_with_dilation=[False, False, True]), "dilated"),
    (lambda: torchvision.models.resnext50_32x4d(norm_layer=lambda c: nn.GroupNorm(32, c)), "GroupNorm"),
    (lambda: torchvision.models.alexnet(), "expected a torchvision ResNet"),
])
def test_from_torchvision_refuses_what_does_not_map(build, match):
    with torch.device("meta"):
        theirs = build()
    with pytest.raises(ValueError, match=f"cannot map.*{match}|{match}"):
        from_torchvision(theirs)


def test_from_torchvision_refuses_another_stem():
    with torch.device("meta"):
        theirs = torchvision.models.resnext50_32x4d()
        theirs.conv1 = nn.Conv2d(3, 64, kernel_size=3, padding=1, bias=False)
    with pytest.raises(ValueError, match="stem"):
        from_torchvision(theirs)


def test_table1_resnext50_32x4d():
    """Table 1: 25.0 x 10^6 parameters and 4.2 x 10^9 FLOPs (multiply-adds) at 224x224, each within 1%;
    exactly torchvision's counts. The groups' width doubles with each stage: 128, 256, 512, 1024."""
    with torch.device("meta"):
        model, theirs = PAPER.build("resnext50_32x4d"), torchvision.models.resnext50_32x4d()
    assert count(model) == count(theirs) == 25_028_904
    assert abs(count(model) / 1e6 - 25.0) < 0.01 * 25.0
    macs = gmacs("resnext50_32x4d")
    assert abs(macs - 4.2) < 0.01 * 4.2, macs
    assert macs * 1e9 == forward_macs(torchvision.models.resnext50_32x4d, 3, 224, 224)
    assert [(s[0].conv2.out_channels, s[0].conv2.groups, s[0].conv3.out_channels) for s in model.stages] == [
        (128, 32, 256), (256, 32, 512), (512, 32, 1024), (1024, 32, 2048)]


def test_table3_templates_at_resnet50_complexity():
    """Table 2's templates at ResNet-50's depth (1x64d, 2x40d, 4x24d, 8x14d, 32x4d, via the model's arguments):
    about 4.1 x 10^9 multiply-adds each (Table 3, "preserved complexity"), within 5%; 1x64d is ResNet-50
    (torchvision's, which strides the 3x3 as ResNeXt does), parameter for parameter."""
    for C, d in [(1, 64), (2, 40), (4, 24), (8, 14), (32, 4)]:
        macs = gmacs("resnext50_32x4d", cardinality=C, bottleneck_width=d)
        assert abs(macs - 4.1) < 0.05 * 4.1, (C, d, macs)
    with torch.device("meta"):
        resnet50 = PAPER.build("resnext50_32x4d", cardinality=1, bottleneck_width=64)
        assert count(resnet50) == count(torchvision.models.resnet50()) == 25_557_032


@pytest.mark.parametrize("flavor, gflops", [("resnext101_32x4d", 7.8), ("resnext101_64x4d", 15.6)])
def test_table3_and_4_resnext101_multiply_adds(flavor, gflops):
    """ResNet-101's complexity, "~7.8 billion FLOPs" (Table 3), and twice it for 64x4d (Table 4), within 5%:
    7.97 and 15.46 x 10^9."""
    assert abs(gmacs(flavor) - gflops) < 0.05 * gflops


@pytest.mark.parametrize("flavor, millions", [("cifar-29-8x64d", 34.4), ("cifar-29-16x64d", 68.1)])
def test_table7_cifar_parameter_counts(flavor, millions):
    """Table 7: ResNeXt-29 8x64d has 34.4M parameters, 16x64d 68.1M (10 classes), within 0.1M (ours:
    34,426,698 and 68,155,210; the paper seems to cut the second's 68.16 to 68.1); 29 layers: three stages of
    three blocks of three convolutions, the first convolution and the classifier."""
    with torch.device("meta"):
        model = PAPER.build(flavor)
    assert abs(count(model) / 1e6 - millions) < 0.1, count(model)
    blocks = [block for stage in model.stages for block in stage]
    assert 1 + 3 * len(blocks) + 1 == 29
    C = FLAVORS[flavor]["cardinality"]
    assert [(s[0].conv2.out_channels, s[0].conv3.out_channels) for s in model.stages] == [
        (C * 64, 256), (C * 128, 512), (C * 256, 1024)]  # d = 64, doubled with each stage


def test_tiny_cardinalities_at_matched_multiply_adds():
    """The tiny analogue of Table 3: 32x2d (tiny), 4x11d and 1x28d within 5% of one another's multiply-adds,
    at Fashion-MNIST's 28x28 and the digits' 8x8."""
    for size in (28, 8):
        base = gmacs("tiny", size)
        for flavor in ("tiny-1x28d", "tiny-4x11d"):
            assert abs(gmacs(flavor, size) / base - 1) < 0.05, (flavor, size)
    model = PAPER.build("tiny")
    assert [(s[0].conv2.out_channels, s[0].conv2.groups) for s in model.stages] == [(64, 32), (128, 32), (256, 32)]
    logits = model(torch.randn(4, 1, 28, 28))
    assert logits.shape == (4, 10) and torch.isfinite(logits).all()


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="unknown stem"):
        ResNeXt(stem="vit")
    with pytest.raises(ValueError, match="same stages"):
        ResNeXt(layers=(2, 2), widths=(64, 128, 256))
    with pytest.raises(ValueError, match="at least 1"):
        ResNeXt(cardinality=0)
    with pytest.raises(ValueError, match="whole"):
        ResNeXt(widths=(48, 64), layers=(1, 1), bottleneck_width=1)
