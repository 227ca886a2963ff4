"""DenseNet against torchvision's, against the paper's Tables 1 and 2 and its text, and on padded
batches of mixed sizes."""

from contextlib import ExitStack, contextmanager
from unittest import mock

import pytest
import torch
import torch.nn as nn
import torchvision

from tests.conftest import assert_same_outputs, pad_batch, randomize_batch_norm
from papers.densenet import PAPER, from_torchvision
from papers.densenet.model import FLAVORS, DenseNet

TORCHVISION = {"DenseNet-121": "densenet121", "DenseNet-169": "densenet169", "DenseNet-201": "densenet201"}
# Table 2's "Params" column (CIFAR: 3 channels, 10 classes), in millions; the figures of the text
# (Section 4.3 "Capacity" and "Parameter Efficiency", Fig. 4) and of the authors' repository README,
# which reproduces the table: DenseNet-BC (L = 190, k = 40) 25.6M.
TABLE2 = {"DenseNet-40": 1.0, "DenseNet-100-k12": 7.0, "DenseNet-100-k24": 27.2, "DenseNet-BC-250": 15.3,
          "DenseNet-BC-190": 25.6}


@contextmanager
def on_meta():
    """Shapes only: the meta device, with the initialisers skipped (they are slow there)."""
    with ExitStack() as stack:
        for name in ("kaiming_normal_", "kaiming_uniform_", "normal_", "uniform_", "ones_", "zeros_", "constant_"):
            stack.enter_context(mock.patch.object(nn.init, name, lambda tensor, *args, **kwargs: tensor))
        stack.enter_context(torch.device("meta"))
        yield


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def small_torchvision(**kwargs) -> nn.Module:
    """A three-block torchvision DenseNet, small enough to test at odd sizes."""
    return torchvision.models.DenseNet(growth_rate=8, block_config=(2, 3, 2), num_init_features=16, bn_size=2,
                                       **kwargs)


@pytest.mark.parametrize("build, size", [
    (lambda: torchvision.models.densenet121(), (64, 64)),
    (lambda: small_torchvision(num_classes=7), (45, 37)),  # odd sides: the transitions' pools drop a row
    (lambda: small_torchvision(num_classes=5, drop_rate=0.2, memory_efficient=True), (40, 52)),
], ids=["densenet121", "small-odd-size", "small-dropout-memory-efficient"])
def test_logits_equal_torchvision(build, size):
    torch.manual_seed(0)
    theirs = randomize_batch_norm(build(), linear=True)
    ours = from_torchvision(theirs).eval()
    assert len(ours.state_dict()) == len(theirs.state_dict())  # every weight and buffer mapped
    x = torch.randn(2, 3, *size)
    assert_same_outputs(ours, theirs, x)


def test_from_torchvision_refuses_what_the_paper_has_not():
    with pytest.raises(ValueError, match="expected a torchvision DenseNet"):
        from_torchvision(torchvision.models.resnet18())
    theirs = small_torchvision()
    theirs.features.pool0 = nn.AvgPool2d(3, 2, 1)
    with pytest.raises(ValueError, match="stem"):
        from_torchvision(theirs)
    theirs = small_torchvision()
    theirs.features.transition1.pool = nn.MaxPool2d(2, 2)
    with pytest.raises(ValueError, match="transition1"):
        from_torchvision(theirs)
    theirs = small_torchvision()
    theirs.classifier = nn.Sequential(nn.Dropout(0.5), nn.Linear(theirs.classifier.in_features, 10))
    with pytest.raises(ValueError, match="classifier"):
        from_torchvision(theirs)


@pytest.mark.parametrize("flavor", TORCHVISION)
def test_imagenet_flavors_have_torchvision_parameter_counts(flavor):
    with on_meta():
        ours = PAPER.build(flavor)  # 224x224 images, 3 channels, 1000 classes
        theirs = getattr(torchvision.models, TORCHVISION[flavor])(weights=None)
    assert count(ours) == count(theirs)


def test_known_counts():
    with on_meta():
        counts = {flavor: count(PAPER.build(flavor)) for flavor in (*TORCHVISION, "DenseNet-264")}
    assert counts == {"DenseNet-121": 7_978_856, "DenseNet-169": 14_149_480, "DenseNet-201": 20_013_928,
                      "DenseNet-264": 33_337_704}  # 264: no reference; the paper gives no count
    # Section 4.4: "a DenseNet-201 with 20M parameters" (two digits: within 3%)
    assert abs(counts["DenseNet-201"] / 20e6 - 1) < 0.03


@pytest.mark.parametrize("flavor", TABLE2)
def test_table2_parameter_counts(flavor):
    with on_meta():
        model = PAPER.build(flavor)  # CIFAR: 3 channels, 10 classes
    paper = TABLE2[flavor] * 1e6
    tolerance = 0.015 if TABLE2[flavor] >= 10 else 0.03  # three digits, or two
    assert abs(count(model) / paper - 1) < tolerance, count(model)


def test_densenet_bc_100_has_0_8m_parameters():
    """Table 2 and Fig. 4: DenseNet-BC (L = 100, k = 12) has 0.8M parameters, one column for CIFAR-10 and
    CIFAR-100: 800,032 with CIFAR-100's classifier, 769,162 with CIFAR-10's (which the paper's one
    significant digit also gives)."""
    with on_meta():
        c100, c10 = PAPER.build("DenseNet-BC-100", num_classes=100), PAPER.build("DenseNet-BC-100", num_classes=10)
    assert abs(count(c100) / 0.8e6 - 1) < 0.03
    assert round(count(c10) / 1e6, 1) == 0.8


@pytest.mark.parametrize("flavor", [f for f in FLAVORS if f != "tiny"])
def test_depth_is_the_number_of_weight_layers(flavor):
    """L counts the layers with weights: the first convolution, two per bottleneck layer (one in the basic
    DenseNet), one per transition, the classifier (121 = 1 + 2 (6 + 12 + 24 + 16) + 3 + 1). Table 1's
    DenseNet-264 has 265 of them (6, 12, 64 and 48 layers per block)."""
    with on_meta():
        model = PAPER.build(flavor)
    layers = sum(isinstance(m, (nn.Conv2d, nn.Linear)) for m in model.modules())
    L = int(flavor.split("-")[-1] if flavor.startswith("DenseNet-BC") else flavor.split("-")[1])
    assert layers == (265 if flavor == "DenseNet-264" else L)


def test_table1_layout_and_output_sizes():
    """DenseNet-121 at 224x224: 2k = 64 stem channels, each layer sees k_0 + k (l - 1) feature-maps and
    adds k = 32 from a 4k-wide bottleneck; the transitions halve the feature-maps and the map; the
    blocks run at 56, 28, 14 and 7 pixels."""
    with on_meta():  # shapes only
        model = PAPER.build("DenseNet-121")
        x, _ = model.stem(torch.empty(1, 3, 224, 224))
    assert x.shape == (1, 64, 56, 56)
    for i, (block, side) in enumerate(zip(model.dense_blocks, (56, 28, 14, 7))):
        k0 = x.shape[1]
        for l, layer in enumerate(block.layers, start=1):
            assert layer.norm1.num_features == k0 + 32 * (l - 1)
            assert layer.conv1.out_channels == 4 * 32 and layer.conv2.out_channels == 32
        x = block(x)
        assert x.shape == (1, k0 + 32 * len(block.layers), side, side)
        if i < 3:
            x, _ = model.transitions[i](x)
            assert x.shape == (1, (k0 + 32 * len(block.layers)) // 2, side // 2, side // 2)
    assert model.num_features == 1024 and x.shape[1] == 1024


def test_a_dense_block_keeps_every_earlier_feature_map():
    """Eq. 2: the block's output is [x_0, x_1, ..., x_n]: its input passes unchanged, and each layer's
    output is the next layer's input from the channel where it was appended."""
    torch.manual_seed(0)
    model = PAPER.build("tiny").eval()
    block = model.dense_blocks[0]
    k = block.layers[0].conv2.out_channels
    x = torch.randn(2, block.layers[0].norm1.num_features, 8, 8)
    with torch.no_grad():
        y = block(x)
        x1 = block.layers[0]([x])
        x2 = block.layers[1]([x, x1])
    assert torch.equal(y[:, : x.shape[1]], x)
    assert torch.equal(y[:, x.shape[1]: x.shape[1] + k], x1)
    assert torch.equal(y[:, x.shape[1] + k: x.shape[1] + 2 * k], x2)
    assert y.shape == (2, x.shape[1] + k * len(block.layers), 8, 8)


def test_dropout_follows_every_convolution_but_the_first():
    """Section 4.2: "a dropout layer after each convolutional layer (except the first one)"."""
    model = PAPER.build("DenseNet-BC-100", dropout=0.2).train()
    calls = []
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        model(torch.randn(2, 3, 32, 32))
    convs = sum(isinstance(m, nn.Conv2d) for m in model.modules())
    assert len(calls) == convs - 1 == 98


def test_tiny_flavor_runs_on_32x32_shapes():
    torch.manual_seed(0)
    model = PAPER.build("tiny")  # 3 channels, 10 classes
    x = torch.randn(4, 3, 32, 32)
    features, mask = model.forward_features(x)
    assert features.shape == (4, model.num_features, 8, 8) and mask is None
    logits = model(x)
    assert logits.shape == (4, 10) and torch.isfinite(logits).all()
    assert PAPER.shard_blocks == "dense_blocks" and isinstance(model.dense_blocks, nn.ModuleList)
    assert (PAPER.defaults["dataset"], PAPER.defaults["image_size"]) == ("digits", 32)  # the digits resized to 32x32


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="unknown stem"):
        DenseNet(stem="svhn")
    with pytest.raises(ValueError, match="at least one layer"):
        DenseNet(block_config=(6, 0, 24))
    with pytest.raises(ValueError, match="compression"):
        DenseNet(compression=0)


@pytest.mark.parametrize("flavor, sizes", [
    ("tiny", [(13, 9), (16, 16), (7, 21), (32, 27)]),  # CIFAR stem; odd sides at both transitions
    ("imagenet", [(45, 37), (64, 64), (33, 50), (70, 41)]),  # 7x7/2 and max pool; 3 transitions
])
def test_a_padded_batch_gives_each_image_its_own_logits(flavor, sizes):
    """Eval mode, random batch-norm statistics: each image of a zero-padded batch of mixed sizes gets the
    logits it gets alone and unpadded, also where a 2x2 average pool drops the last row of an odd side."""
    torch.manual_seed(0)
    model = randomize_batch_norm(PAPER.build("tiny") if flavor == "tiny" else  # Table 1's layout, fewer, narrower
                                 DenseNet(growth_rate=8, block_config=(2, 3, 2, 2), stem="imagenet", num_classes=10),
                                 linear=True)
    images = [torch.randn(3, h, w) for h, w in sizes]
    batch, mask = pad_batch(images)
    with torch.no_grad():
        got = model(batch, mask)
        expected = torch.cat([model(x[None]) for x in images])
        unmasked = model(batch)
    assert (got - expected).abs().max() < 1e-5 * max(1.0, expected.abs().max().item())
    assert expected.std() > 0.1
    padded = ~mask.flatten(1).all(1)
    assert ((unmasked - expected).abs().amax(1)[padded] > 1e-3).all()  # without the mask, padding changes them
