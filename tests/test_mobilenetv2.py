"""MobileNetV2 against torchvision's, against the paper's Tables 1-3 and Section 4, on padded batches
of mixed sizes, and with the switches of Fig. 6's ablations."""

import copy
from contextlib import ExitStack, contextmanager
from functools import partial
from unittest import mock

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

from common.throughput import forward_macs
from tests.conftest import assert_same_outputs, pad_batch, randomize_batch_norm
from papers.mobilenetv2 import PAPER, from_torchvision
from papers.mobilenetv2.model import SHORTCUTS, TABLE2, ConvBN, InvertedResidual, MobileNetV2, make_divisible

WIDTHS = {"MobileNetV2-1.0": 1.0, "MobileNetV2-0.35": 0.35, "MobileNetV2-0.5": 0.5, "MobileNetV2-0.75": 0.75,
          "MobileNetV2-1.4": 1.4}


@contextmanager
def skip_init():
    """The initialisers skipped: they are slow on the meta device, where only shapes matter."""
    with ExitStack() as stack:
        for name in ("kaiming_normal_", "kaiming_uniform_", "normal_", "uniform_", "ones_", "zeros_", "constant_"):
            stack.enter_context(mock.patch.object(nn.init, name, lambda tensor, *args, **kwargs: tensor))
        yield


@contextmanager
def on_meta():
    """Shapes only: the meta device, without initialisers."""
    with skip_init(), torch.device("meta"):
        yield


def count(model: nn.Module, batch_norm: bool = True) -> int:
    """Parameters, with or without batch norm's scales and shifts."""
    skip = set() if batch_norm else {id(p) for m in model.modules() if isinstance(m, nn.BatchNorm2d)
                                     for p in m.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


SMALL = [[1, 8, 1, 1], [4, 12, 2, 2], [3, 20, 2, 2]]  # a shorter Table 2 with other expansions


@pytest.mark.parametrize("kwargs, size", [
    ({}, (64, 64)),
    (dict(width_mult=0.5, num_classes=7), (45, 37)),  # odd sides through five strided convolutions
    (dict(width_mult=1.3, inverted_residual_setting=SMALL, round_nearest=4, dropout=0.5, num_classes=5), (33, 40)),
], ids=["1.0", "0.5-odd-size", "small-setting"])
def test_logits_equal_torchvision(kwargs, size):
    torch.manual_seed(0)
    theirs = randomize_batch_norm(torchvision.models.mobilenet_v2(weights=None, **kwargs), linear=True)
    ours = from_torchvision(theirs).eval()
    assert len(ours.state_dict()) == len(theirs.state_dict())  # every weight and buffer mapped
    assert count(ours) == count(theirs)
    x = torch.randn(2, 3, *size)
    assert_same_outputs(ours, theirs, x)


def test_from_torchvision_refuses_what_the_paper_has_not():
    with pytest.raises(ValueError, match="expected a torchvision MobileNetV2"):
        from_torchvision(torchvision.models.resnet18())
    build = partial(torchvision.models.mobilenet_v2, width_mult=0.35, inverted_residual_setting=SMALL)
    with pytest.raises(ValueError, match="eps"):
        from_torchvision(build(norm_layer=partial(nn.BatchNorm2d, eps=1e-3)))
    theirs = build()
    theirs.features[2] = nn.Identity()
    with pytest.raises(ValueError, match="InvertedResidual"):
        from_torchvision(theirs)
    theirs = build()
    theirs.classifier = nn.Linear(theirs.last_channel, 10)
    with pytest.raises(ValueError, match="classifier"):
        from_torchvision(theirs)


@pytest.mark.parametrize("flavor", WIDTHS)
def test_flavors_have_torchvision_parameter_counts(flavor):
    with on_meta():
        ours = PAPER.build(flavor)  # 224x224 images, 3 channels, 1000 classes
        theirs = torchvision.models.mobilenet_v2(weights=None, width_mult=WIDTHS[flavor])
    assert count(ours) == count(theirs)
    assert ours.num_features == (1280 if WIDTHS[flavor] <= 1 else 1792)  # the last conv2d is not thinned


def test_parameter_counts_of_the_paper():
    """Section 4 and Table 3: MobileNetV2 (width 1) "uses 3.4 million parameters"; the models of width
    0.35 to 1.4 "vary between 1.7M and 6.9M parameters".

    The paper's 3.4M counts the convolution and classifier weights: 3,470,760 here (2.1% above);
    batch norm's 34,112 scales and shifts (folded into the convolutions for inference) make it 3,504,872,
    torchvision's count, 3.1% above. 0.35 is the smallest (1,677,128, 1.3% below 1.7M). The largest, 1.4
    (Table 3: 6.9M), is 6,108,776 here and in torchvision (11% below): the reference's rounding of the
    widths, which the flavors follow, does not give 6.9M, so that figure is not checked."""
    with on_meta():
        counts = {flavor: (count(m := PAPER.build(flavor)), count(m, batch_norm=False)) for flavor in WIDTHS}
    assert counts["MobileNetV2-1.0"] == (3_504_872, 3_470_760)
    assert abs(counts["MobileNetV2-1.0"][1] / 3.4e6 - 1) < 0.03
    assert abs(counts["MobileNetV2-0.35"][0] / 1.7e6 - 1) < 0.03
    assert min(counts.values()) == counts["MobileNetV2-0.35"] and max(counts.values()) == counts["MobileNetV2-1.4"]
    assert counts["MobileNetV2-1.4"][0] == 6_108_776


@pytest.mark.parametrize("flavor, millions", [("MobileNetV2-1.0", 300), ("MobileNetV2-1.4", 585)])
def test_table3_multiply_adds(flavor, millions):
    """Table 3 at 224x224: 300M multiply-adds for MobileNetV2, 585M for MobileNetV2 (1.4)."""
    with skip_init():
        macs = forward_macs(lambda: PAPER.build(flavor), 3, 224, 224)
    assert abs(macs / (millions * 1e6) - 1) < 0.05, macs


def test_table2_layout_and_output_sizes():
    """Table 2 at 224x224: conv2d 32 with stride 2, then rows (t, c, n, s) of bottlenecks, each row's first
    block with stride s; residuals in the blocks that keep the shape (n - 1 per row); conv2d 1x1 to 1280."""
    with on_meta():  # shapes only
        model = PAPER.build("MobileNetV2-1.0")
        x, _ = model.stem(torch.empty(1, 3, 224, 224))
    assert x.shape == (1, 32, 112, 112)
    blocks = iter(model.blocks)
    for (t, c, n, s), side in zip(TABLE2, (112, 56, 28, 14, 14, 7, 7)):
        for i in range(n):
            block = next(blocks)
            k = x.shape[1]
            assert (block.expand is None) == (t == 1)
            assert block.depthwise.conv.out_channels == t * k == block.depthwise.conv.groups  # depthwise, t k wide
            assert block.depthwise.conv.stride == ((s, s) if i == 0 else (1, 1))
            assert block.use_residual == (i > 0)
            x, _ = block(x)
            assert x.shape == (1, c, side, side)
    assert next(blocks, None) is None and len(model.blocks) == 17
    x, _ = model.conv_last(x)
    assert x.shape == (1, 1280, 7, 7)


def test_linear_bottlenecks_and_relu6():
    """Table 1: ReLU6 after the expansion and the depthwise convolution, none after the projection."""
    torch.manual_seed(0)
    model = randomize_batch_norm(PAPER.build("tiny"), linear=True)
    outputs = {}
    for name, m in model.named_modules():
        if isinstance(m, ConvBN):
            m.register_forward_hook(lambda mod, args, out, name=name: outputs.__setitem__(name, out[0]))
    with torch.no_grad():
        model(10 * torch.randn(2, 3, 32, 32))  # large enough to reach ReLU6's ceiling
    projections = [out for name, out in outputs.items() if name.endswith("project")]
    others = [out for name, out in outputs.items() if not name.endswith("project")]
    assert len(projections) == len(model.blocks) and all(out.min() < 0 for out in projections)
    assert all(out.min() >= 0 and out.max() <= 6 for out in others) and any(out.max() == 6 for out in others)


@pytest.mark.parametrize("flavor", WIDTHS)
def test_width_multiplier_rounds_channels_to_multiples_of_8(flavor):
    with on_meta():
        model = PAPER.build(flavor)
    w = WIDTHS[flavor]
    assert all(m.out_channels % 8 == 0 for m in model.modules() if isinstance(m, nn.Conv2d))
    assert model.stem.conv.out_channels == make_divisible(32 * w)
    assert model.blocks[-1].project.conv.out_channels == make_divisible(320 * w)


def test_tiny_flavor_runs_on_32x32_shapes_with_dropout_before_the_classifier():
    torch.manual_seed(0)
    model = PAPER.build("tiny")  # 3 channels, 10 classes
    x = torch.randn(4, 3, 32, 32)
    features, mask = model.forward_features(x)
    assert features.shape == (4, model.num_features, 4, 4) and mask is None
    with torch.no_grad():
        logits = model.eval()(x)
        assert torch.equal(model(x), logits) and not torch.equal(model.train()(x), model(x))  # dropout in training
    assert logits.shape == (4, 10) and torch.isfinite(logits).all()
    assert PAPER.shard_blocks == "blocks" and isinstance(model.blocks, nn.ModuleList)
    assert (PAPER.defaults["dataset"], PAPER.defaults["image_size"]) == ("digits", 32)  # the digits resized to 32x32


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="width multiplier"):
        MobileNetV2(width_mult=0)
    with pytest.raises(ValueError, match="settings"):
        MobileNetV2(settings=((6, 24, 2, 3),))


@pytest.mark.parametrize("flavor, sizes", [
    ("tiny", [(13, 9), (16, 16), (7, 21), (32, 27)]),  # the stem keeps the size; three strided rows
    ("MobileNetV2-0.35", [(45, 37), (64, 64), (33, 50), (70, 41)]),  # Table 2's five strided layers
])
def test_a_padded_batch_gives_each_image_its_own_logits(flavor, sizes):
    """Eval mode, random batch-norm statistics: each image of a zero-padded batch of mixed sizes (odd,
    even, taller, wider) gets the logits it gets alone and unpadded."""
    torch.manual_seed(0)
    assert_own_logits(randomize_batch_norm(PAPER.build(flavor, num_classes=10), linear=True), sizes)


def assert_own_logits(model, sizes) -> None:
    """Each image of a padded batch of these sizes gets its own logits, and without the mask it would not."""
    images = [torch.randn(3, h, w) for h, w in sizes]
    batch, mask = pad_batch(images)
    with torch.no_grad():
        got = model(batch, mask)
        expected = torch.cat([model(x[None]) for x in images])
        unmasked = model(batch)
    assert (got - expected).abs().max() < 1e-5
    assert expected.std() > 0.1
    padded = ~mask.flatten(1).all(1)
    assert ((unmasked - expected).abs().amax(1)[padded] > 1e-3).all()  # without the mask, padding changes them


# Fig. 6's ablations: every combination of the two switches; the first is the paper's network.
SWITCHES = [dict(linear_bottleneck=linear, shortcut=shortcut) for linear in (True, False) for shortcut in SHORTCUTS]


def test_figure_6a_relu6_after_every_projection_without_linear_bottlenecks():
    """Fig. 6a: with linear_bottleneck=False every block's projection (its output before any shortcut)
    is ReLU6 of its batch norm, in [0, 6]; the paper's linear bottleneck leaves it as it is, negative and
    above 6 in places. The rest of the network is the same."""
    projections = {}
    for linear in (True, False):
        torch.manual_seed(0)
        model = randomize_batch_norm(PAPER.build("tiny", linear_bottleneck=linear), linear=True)
        pairs = projections[linear] = []  # (batch norm's output, the projection's), one per block
        for block in model.blocks:
            block.project.register_forward_hook(
                lambda m, args, out, pairs=pairs: pairs.append((m.bn(m.conv(args[0])), out[0])))
        with torch.no_grad():
            model(10 * torch.randn(2, 3, 32, 32))  # large enough to reach ReLU6's ceiling
    assert len(projections[True]) == len(projections[False]) == len(model.blocks) == 9
    assert all(torch.equal(out, pre) for pre, out in projections[True])
    assert any(out.min() < 0 for _, out in projections[True]) and any(out.max() > 6 for _, out in projections[True])
    assert all(torch.equal(out, F.relu6(pre)) for pre, out in projections[False])
    assert all(out.min() >= 0 and out.max() <= 6 for _, out in projections[False])
    assert any(pre.min() < 0 for pre, _ in projections[False]) and any(out.max() == 6 for _, out in projections[False])
    assert sum(isinstance(m, ConvBN) and not m.linear for m in model.modules()) == 2 + 3 * 9 - 1  # t = 1: no expansion


def forward_by_hand(model: MobileNetV2, images: torch.Tensor, shortcut: str) -> tuple[torch.Tensor, list[int]]:
    """Eval logits from the model's own layers, its blocks unrolled with no bottleneck shortcut: "none"
    adds nothing; "expansion" adds the previous block's expansion output to a block's wherever the two
    tensors have the same shape (found from the tensors here, not from the model's flags). Also the
    blocks that took an addition."""
    x, _ = model.stem(images)
    e_prev, added = None, []
    for i, block in enumerate(model.blocks):
        e = block.expand(x)[0] if block.expand is not None else None  # (B, t k, H, W)
        if shortcut == "expansion" and e is not None and e_prev is not None and e.shape == e_prev.shape:
            e, added = e + e_prev, added + [i]
        x = block.project(block.depthwise(x if e is None else e)[0])[0]  # (B, k', H/s, W/s), nothing added
        e_prev = e
    x, _ = model.conv_last(x)
    return model.fc(x.mean((2, 3))), added


@pytest.mark.parametrize("shortcut, added", [("none", []), ("expansion", [3, 5, 6, 8])])
def test_figure_6b_shortcuts_between_expansions_or_none(shortcut, added):
    """Fig. 6b on tiny: "none" computes the blocks with their residual additions removed; "expansion"
    adds the previous block's expansion output where the shapes match, into blocks 3, 5, 6 and 8 (each
    after one of the four blocks with the paper's shortcut: 2, 4, 5, 7), and nothing else."""
    torch.manual_seed(0)
    model = randomize_batch_norm(PAPER.build("tiny", shortcut=shortcut), linear=True)
    paper = PAPER.build("tiny").eval()
    paper.load_state_dict(model.state_dict())
    images = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        expected, where = forward_by_hand(model, images, shortcut)
        got, theirs, plain = model(images), paper(images), forward_by_hand(model, images, "none")[0]
    assert where == added == [i for i, block in enumerate(model.blocks) if block.adds_expansion]
    assert [i for i, block in enumerate(paper.blocks) if block.use_residual] == [2, 4, 5, 7]
    assert not any(block.use_residual for block in model.blocks)
    assert (got - expected).abs().max() < 1e-5 and expected.std() > 0.1
    assert (theirs - expected).abs().max() > 1e-2  # the paper's shortcuts give other logits
    assert shortcut == "none" or (plain - expected).abs().max() > 1e-2  # and so do no shortcuts


def test_figure_6b_expansion_shortcut_of_one_pair_of_blocks():
    """Blocks 2 and 3 of tiny (24 to 24 channels at 8x8, then 24 to 32 with stride 2), computed from
    their convolutions and batch norms: block 3's expansion output gets block 2's added (both 144
    channels at 8x8), a shortcut around block 2's depthwise convolution and projection and block 3's
    expansion; block 2 takes nothing from block 1 (96 channels at 16x16) and adds no input."""
    torch.manual_seed(0)
    model = randomize_batch_norm(PAPER.build("tiny", shortcut="expansion"), linear=True)
    b2, b3 = model.blocks[2], model.blocks[3]
    layer = lambda m, x, act=F.relu6: act(m.bn(m.conv(x)))
    x, e1 = torch.randn(2, 24, 8, 8), torch.randn(2, 96, 16, 16)
    with torch.no_grad():
        e2 = layer(b2.expand, x)  # (2, 144, 8, 8)
        y2 = layer(b2.project, layer(b2.depthwise, e2), act=lambda h: h)  # (2, 24, 8, 8)
        e3 = layer(b3.expand, y2) + e2  # (2, 144, 8, 8)
        y3 = layer(b3.project, layer(b3.depthwise, e3), act=lambda h: h)  # (2, 32, 4, 4)
        got2 = b2(x, None, e1)
        got3 = b3(got2[0], None, got2[2])
        without = layer(b3.project, layer(b3.depthwise, e3 - e2), act=lambda h: h)
    assert (b2.adds_expansion, b3.adds_expansion) == (False, True) and y3.shape == (2, 32, 4, 4)
    for got, expected in zip((*got2, *got3), (y2, None, e2, y3, None, e3)):
        assert got is expected is None or (got - expected).abs().max() < 1e-5
    assert (without - y3).abs().max() > 1e-2


@pytest.mark.parametrize("flavor", ["tiny", "MobileNetV2-1.0"])
def test_figure_6_switches_change_no_parameter(flavor):
    """The ablations only change connections and activations: the same tensors, of the same shapes."""
    with on_meta():
        models = [PAPER.build(flavor, **switches) for switches in SWITCHES]
    shapes = [{name: t.shape for name, t in model.state_dict().items()} for model in models]
    assert len(models) == 6 and all(s == shapes[0] for s in shapes)
    assert {count(model) for model in models} == {232_010 if flavor == "tiny" else 3_504_872}


@pytest.mark.parametrize("switches", SWITCHES[1:], ids=lambda d: f"{d['linear_bottleneck']}-{d['shortcut']}")
def test_a_padded_batch_gives_each_image_its_own_logits_with_figure_6_switches(switches):
    """As the paper's network: each image of a padded batch (eval mode) gets its logits alone. The
    expansion outputs added between blocks are zero on the padding, as ReLU6 after batch norm leaves them."""
    torch.manual_seed(0)
    model = randomize_batch_norm(PAPER.build("tiny", **switches), linear=True)
    assert_own_logits(model, [(13, 9), (16, 16), (7, 21), (32, 27)])


def test_expansion_shortcuts_pass_between_checkpointed_blocks():
    """--ac full runs each block's forward under torch.utils.checkpoint, as FSDP wraps each: the expansion
    outputs are passed between blocks as arguments and results, so the gradients are the same."""
    from common.activations import apply_checkpointing

    torch.manual_seed(0)
    model = PAPER.build("tiny", shortcut="expansion", dropout=0.0)
    checkpointed = copy.deepcopy(model)
    apply_checkpointing(checkpointed, PAPER.shard_blocks, "full")
    x = torch.randn(4, 3, 32, 32)
    grads = []
    for m in (model, checkpointed):
        m(x).square().sum().backward()
        grads.append({name: p.grad for name, p in m.named_parameters()})
    assert all(g is not None and g.abs().sum() > 0 for g in grads[0].values())
    assert all(torch.allclose(grads[0][name], grads[1][name], atol=1e-6) for name in grads[0])


@pytest.mark.parametrize("switches, words", [
    (dict(shortcut="expansions"), "unknown shortcut 'expansions'; choose from: bottleneck, expansion, none"),
    (dict(shortcut=None), "choose from: bottleneck, expansion, none"),
    (dict(linear_bottleneck="False"), "linear_bottleneck is True or False"),
    (dict(linear_bottleneck=0), "linear_bottleneck is True or False"),
])
def test_figure_6_switches_refuse_unknown_values(switches, words):
    with pytest.raises(ValueError, match=words):
        MobileNetV2(**switches)
    with pytest.raises(ValueError, match=words):
        InvertedResidual(16, 16, 1, 6, **switches)
