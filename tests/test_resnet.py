"""ResNet against torchvision's, against the paper's Tables 1 and 6, and on padded batches of mixed sizes."""

import pytest
import torch
import torch.nn as nn
import torchvision

from common.layers import MaskedBatchNorm2d
from common.throughput import forward_macs
from tests.conftest import pad_batch, randomize_batch_norm
from papers.resnet import PAPER, from_torchvision
from papers.resnet.model import FLAVORS, PadShortcut, Projection, ResNet

TORCHVISION = {f"torchvision-{name}": name for name in ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")}
TABLE1 = {"ResNet-18": 1.8, "ResNet-34": 3.6, "ResNet-50": 3.8, "ResNet-101": 7.6, "ResNet-152": 11.3}  # 10^9 FLOPs
TABLE6 = {"ResNet-20": 0.27, "ResNet-32": 0.46, "ResNet-44": 0.66, "ResNet-56": 0.85, "ResNet-110": 1.7}  # millions


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def random_torchvision(name: str, **kwargs) -> nn.Module:
    """A torchvision ResNet in eval mode with random weights and random batch-norm statistics,
    so that a scale, shift, mean or variance mapped to the wrong place changes the output."""
    torch.manual_seed(0)
    return randomize_batch_norm(getattr(torchvision.models, name)(weights=None, **kwargs))


@pytest.mark.parametrize("name, kwargs", [("resnet18", {}), ("resnet50", {}), ("resnet18", dict(num_classes=7))])
def test_logits_equal_torchvision(name, kwargs):
    """Our torchvision flavor holding the weights `from_torchvision` maps gives torchvision's logits."""
    theirs = random_torchvision(name, **kwargs)
    ours = PAPER.build(f"torchvision-{name}", **kwargs)
    ours.load_state_dict(from_torchvision(theirs).state_dict())
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected, got, loaded = theirs(x), ours.eval()(x), from_torchvision(theirs).eval()(x)
    assert got.shape == expected.shape
    assert (got - expected).abs().max() < 1e-5 and (loaded - expected).abs().max() < 1e-5
    assert expected.std() > 0.1  # the outputs differ enough between inputs and classes to tell


@pytest.mark.parametrize("flavor", TORCHVISION)
def test_from_torchvision_builds_the_torchvision_flavor(flavor):
    with torch.device("meta"):
        loaded = from_torchvision(getattr(torchvision.models, TORCHVISION[flavor])(weights=None))
        assert repr(loaded) == repr(PAPER.build(flavor))  # every layer, stride and shortcut


def test_the_papers_resnet50_strides_the_1x1_and_torchvisions_the_3x3():
    """The same tensors, so torchvision's weights load strictly into either; the stride placement changes
    the outputs."""
    ours, tv = PAPER.build("ResNet-50"), PAPER.build("torchvision-resnet50")
    for model, s_1x1, s_3x3 in [(ours, 2, 1), (tv, 1, 2)]:
        for stage in model.stages[1:]:  # conv3_1, conv4_1, conv5_1 halve the feature map
            assert (stage[0].conv1.stride, stage[0].conv2.stride) == ((s_1x1, s_1x1), (s_3x3, s_3x3))
            assert all(b.conv1.stride == b.conv2.stride == (1, 1) for b in stage[1:])
    theirs = random_torchvision("resnet50")
    ours.load_state_dict(from_torchvision(theirs).state_dict())
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert (ours.eval()(x) - theirs(x)).abs().max() > 1e-2


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


@pytest.mark.parametrize("flavor", TORCHVISION)
def test_torchvision_flavors_have_torchvision_parameter_counts_and_multiply_adds(flavor):
    with torch.device("meta"):
        ours = PAPER.build(flavor)  # 224x224 images, 3 channels, 1000 classes
        theirs = getattr(torchvision.models, TORCHVISION[flavor])(weights=None)
    assert count(ours) == count(theirs)
    build_theirs = lambda: getattr(torchvision.models, TORCHVISION[flavor])(weights=None)
    assert forward_macs(lambda: PAPER.build(flavor), 3, 224, 224) == forward_macs(build_theirs, 3, 224, 224)


def test_known_parameter_counts():
    """torchvision's; the paper's ResNet-18/34 have no projections (option A), its bottleneck nets
    torchvision's tensors (the stride moves, no parameter does)."""
    counts = {"torchvision-resnet18": 11_689_512, "torchvision-resnet50": 25_557_032,
              "ResNet-18": 11_515_688, "ResNet-34": 21_623_848, "ResNet-50": 25_557_032,
              "ResNet-101": 44_549_160, "ResNet-152": 60_192_808}
    with torch.device("meta"):
        assert {flavor: count(PAPER.build(flavor)) for flavor in counts} == counts


@pytest.mark.parametrize("flavor", TABLE1)
def test_table1_flops(flavor):
    """Table 1's FLOPs (multiply-adds) of one 224x224 image, within 5%: 1.8, 3.6, 3.8, 7.6, 11.3 x 10^9.
    torchvision's ResNet-50, striding the 3x3, has 4.09 x 10^9, 8% over."""
    macs = forward_macs(lambda: PAPER.build(flavor), 3, 224, 224)
    assert abs(macs / 1e9 - TABLE1[flavor]) < 0.05 * TABLE1[flavor], macs


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


@pytest.mark.parametrize("flavor, kind", [("ResNet-18", PadShortcut), ("ResNet-34", PadShortcut),
                                           ("torchvision-resnet18", Projection), ("torchvision-resnet34", Projection)])
def test_shortcuts_change_the_shape_only_where_a_stage_starts(flavor, kind):
    """The paper's ResNet-18/34 pad with zeros (option A, Table 2); torchvision's project (option B)."""
    with torch.device("meta"):
        model = PAPER.build(flavor)
    changing = [(i, j) for i, stage in enumerate(model.stages) for j, block in enumerate(stage)
                if not isinstance(block.shortcut, nn.Identity)]
    assert changing == [(1, 0), (2, 0), (3, 0)]
    assert all(isinstance(model.stages[i][j].shortcut, kind) for i, j in changing)
    assert bool([name for name, _ in model.named_parameters() if "shortcut" in name]) == (kind is Projection)


@pytest.mark.parametrize("flavor", ["ResNet-50", "torchvision-resnet50"])
def test_option_b_projects_only_where_the_shape_changes(flavor):
    with torch.device("meta"):
        model = PAPER.build(flavor)
    projections = [(i, j) for i, stage in enumerate(model.stages) for j, block in enumerate(stage)
                   if isinstance(block.shortcut, Projection)]
    assert projections == [(0, 0), (1, 0), (2, 0), (3, 0)]  # the first bottleneck also widens 64 -> 256
    assert isinstance(model.stages[0][1].shortcut, nn.Identity)


@pytest.mark.parametrize("flavor", ["ResNet-50", "torchvision-resnet50"])
def test_stage_resolutions_follow_table1(flavor):
    with torch.device("meta"):  # shapes only
        model = PAPER.build(flavor)
        x, _ = model.stem(torch.empty(1, 3, 224, 224))
    assert x.shape == (1, 64, 56, 56)  # conv2_x
    for stage, (chans, side) in zip(model.stages, [(256, 56), (512, 28), (1024, 14), (2048, 7)]):
        x, _ = stage(x)
        assert x.shape == (1, chans, side, side)


def test_tiny_flavor_runs_on_8x8_digits():
    torch.manual_seed(0)
    model = PAPER.build("tiny", num_classes=10, in_chans=1)
    x = torch.randn(4, 1, 8, 8)
    features, mask = model.forward_features(x)
    assert features.shape == (4, model.num_features, 2, 2) and mask is None
    logits = model(x)
    assert logits.shape == (4, 10) and torch.isfinite(logits).all()
    assert PAPER.shard_blocks == "stages" and isinstance(model.stages, nn.ModuleList)
    assert model.no_weight_decay() <= {name for name, _ in model.named_parameters()}


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="unknown block"):
        ResNet(block="dense")
    with pytest.raises(ValueError, match="unknown shortcut"):
        ResNet(shortcut="C")
    with pytest.raises(ValueError, match="unknown stride_on"):
        ResNet(block="bottleneck", stride_on="2x2")
    with pytest.raises(ValueError, match="same stages"):
        ResNet(layers=(2, 2), widths=(64, 128, 256))


def test_without_a_mask_the_model_is_bitwise_torchvision():
    """mask=None computes what the model computed before masks existed: exactly torchvision's
    numbers, in eval mode and in training mode (batch statistics, running estimates, gradients)."""
    theirs = random_torchvision("resnet18")
    ours = from_torchvision(theirs).eval()
    x = torch.randn(2, 3, 40, 36)
    with torch.no_grad():
        assert torch.equal(ours(x), theirs(x))
    theirs.train(), ours.train()
    expected, got = theirs(x), ours(x)
    assert torch.equal(got, expected)
    expected.square().sum().backward(), got.square().sum().backward()
    pairs = zip(ours.named_parameters(), theirs.named_parameters(), strict=True)  # both in the same order
    assert all(torch.equal(p.grad, q.grad) for (_, p), (_, q) in pairs)
    pairs = zip(ours.named_buffers(), theirs.named_buffers(), strict=True)  # running statistics, batch counts
    assert all(torch.equal(p, q) for (_, p), (_, q) in pairs)


@pytest.mark.parametrize("flavor, sizes, atol", [
    ("ResNet-20", [(13, 9), (16, 16), (7, 21), (32, 24)], 1e-5),  # CIFAR stem, option A
    ("ResNet-18", [(45, 37), (64, 64), (33, 50), (40, 40)], 1e-5),  # 7x7/2 and max pool, option A
    ("torchvision-resnet18", [(45, 37), (64, 64), (33, 50), (40, 40)], 1e-5),  # option B
    ("ResNet-50", [(45, 37), (64, 64), (33, 50), (40, 40)], 1e-4),  # bottlenecks striding the 1x1
    ("torchvision-resnet50", [(45, 37), (64, 64), (33, 50), (40, 40)], 1e-4),  # the 3x3; logits up to about 40
])
def test_a_padded_batch_gives_each_image_its_own_logits(flavor, sizes, atol):
    """Eval mode, random weights and batch-norm statistics: each image of a zero-padded batch of mixed
    sizes (odd, even, taller, wider) gets the logits it gets alone and unpadded."""
    torch.manual_seed(0)
    model = randomize_batch_norm(PAPER.build(flavor, num_classes=10))
    images = [torch.randn(3, h, w) for h, w in sizes]
    batch, mask = pad_batch(images)
    with torch.no_grad():
        got = model(batch, mask)
        expected = torch.cat([model(x[None]) for x in images])
        unmasked = model(batch)
    assert (got - expected).abs().max() < atol
    assert expected.std() > 0.1  # logits vary enough between images and classes to tell
    padded = ~mask.flatten(1).all(1)
    assert ((unmasked - expected).abs().amax(1)[padded] > 1e-2).all()  # without the mask, padding changes them


@pytest.mark.parametrize("momentum", [0.1, None])
def test_masked_batch_norm_trains_as_batch_norm_on_the_valid_pixels(momentum):
    """Training mode: statistics, output, gradients and running estimates equal nn.BatchNorm2d's on
    the valid pixels alone, whatever the padding holds; the padding comes out zero."""
    torch.manual_seed(0)
    ours, reference = MaskedBatchNorm2d(5, momentum=momentum), nn.BatchNorm2d(5, momentum=momentum)
    randomize_batch_norm(ours).train()
    reference.load_state_dict(ours.state_dict())
    for step in range(2):  # the second step checks the running estimates move with the momentum
        x = (3 * torch.randn(3, 5, 9, 11) + 1).requires_grad_()  # padding too: it must be ignored
        _, mask = pad_batch([torch.empty(0, h, w) for h, w in [(9, 4), (5, 11), (2 + step, 3)]])
        valid = x.detach().permute(1, 0, 2, 3)[:, mask].requires_grad_()  # (C, N) valid pixels
        y, y_ref = ours(x, mask), reference(valid[None, :, :, None])  # reference: N pixels as one image
        assert (y.permute(1, 0, 2, 3)[:, mask] - y_ref[0, :, :, 0]).abs().max() < 1e-5
        assert not y.permute(1, 0, 2, 3)[:, ~mask].any()
        w = torch.randn_like(y_ref)  # a loss that weighs the pixels unequally
        (y.permute(1, 0, 2, 3)[:, mask] * w[0, :, :, 0]).sum().backward()
        (y_ref * w).sum().backward()
        assert (x.grad.permute(1, 0, 2, 3)[:, mask] - valid.grad).abs().max() < 1e-5
        assert (ours.weight.grad - reference.weight.grad).abs().max() < 1e-4
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            assert torch.allclose(getattr(ours, name), getattr(reference, name), atol=1e-6), name
    ours.eval(), reference.eval()
    with torch.no_grad():  # eval mode: the running estimates, and zero padding
        y, y_ref = ours(x, mask), reference(x)
    assert torch.allclose(y, y_ref * mask[:, None], atol=1e-6)


@pytest.mark.parametrize("arch", ["resnet18", "resnet50"])
def test_without_a_mask_it_dispatches_torchvisions_operations(arch):
    """The mask-aware layers cost nothing when there is no mask: forward and backward of our model
    dispatch the same aten operations, as many times each, as torchvision's."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class CountOperations(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.counts = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.counts[str(func.overloadpacket)] += 1
            return func(*args, **(kwargs or {}))

    theirs = getattr(torchvision.models, arch)()
    ours = from_torchvision(theirs)
    x = torch.randn(2, 3, 64, 64)
    counts = []
    for model in (ours, theirs):
        with CountOperations() as counter:
            model(x).sum().backward()
        counts.append(counter.counts)
    assert counts[0] == counts[1], (counts[0] - counts[1], counts[1] - counts[0])
    assert sum(counts[0].values()) > 200


def test_the_plain_nets_are_the_same_layers_without_the_shortcuts():
    """shortcut="none" (Section 4's plain nets): the same parameters, and each block's output is
    ReLU(F(x)) alone, where the residual net's is ReLU(F(x) + x)."""
    torch.manual_seed(0)
    plain = ResNet(**FLAVORS["ResNet-20"] | {"shortcut": "none"}).eval()
    residual = ResNet(**FLAVORS["ResNet-20"]).eval()
    residual.load_state_dict(plain.state_dict())
    assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in residual.parameters())
    x = torch.randn(2, 16, 32, 32)
    for j, (a, b) in enumerate(zip(plain.stages[0], residual.stages[0])):
        F_x = b.bn2(b.conv2(torch.relu(b.bn1(b.conv1(x)))))
        assert torch.allclose(a(x)[0], torch.relu(F_x), atol=1e-6), j
        assert torch.allclose(b(x)[0], torch.relu(F_x + x), atol=1e-6), j
    images = torch.randn(2, 3, 32, 32)
    assert not torch.allclose(plain(images), residual(images))
    with pytest.raises(ValueError, match="A, B, none"):
        ResNet(**FLAVORS["ResNet-20"] | {"shortcut": "C"})
