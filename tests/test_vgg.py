"""VGG against torchvision's, against the paper's Tables 1 and 2, and its dense evaluation."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

from common.config import TrainConfig
from common.data.augment import parse
from common.optim import parse_milestones
from papers.vgg import PAPER, from_torchvision
from papers.vgg.model import FLAVORS, VGG
from tests.conftest import assert_same_outputs

TABLE2 = {"VGG-11": 133, "VGG-11-LRN": 133, "VGG-13": 133, "VGG-16-C": 134, "VGG-16": 138, "VGG-19": 144}  # millions
WEIGHT_LAYERS = {"VGG-11": 11, "VGG-11-LRN": 11, "VGG-13": 13, "VGG-16-C": 16, "VGG-16": 16, "VGG-19": 19}
TORCHVISION = {f"torchvision-vgg{n}{bn}": f"vgg{n}{bn}" for n in (11, 13, 16, 19) for bn in ("", "_bn")}


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def random_torchvision(name: str, fc_width: int | None = None, **kwargs) -> nn.Module:
    """A torchvision VGG in eval mode with random weights (He-scaled, so that the logits are far from
    zero), random biases and random batch-norm statistics. Built on the meta device and then filled:
    initialising 130M weights twice would take most of this file's time. fc_width narrows the two
    hidden fully connected layers of torchvision's head (4096 there) for speed."""
    torch.manual_seed(0)
    with torch.device("meta"):
        model = getattr(torchvision.models, name)(weights=None, **kwargs)
        if fc_width is not None:
            head = model.classifier
            head[0], head[3] = nn.Linear(head[0].in_features, fc_width), nn.Linear(fc_width, fc_width)
            head[6] = nn.Linear(fc_width, head[6].out_features)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                m.weight.normal_(0, (2 / m.weight[0].numel()) ** 0.5)
                m.bias.normal_(0, 0.1)
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.2)
                m.running_mean.normal_(0, 0.2)
                m.running_var.uniform_(0.5, 2.0)
                m.num_batches_tracked.zero_()
    return model.eval()


@pytest.mark.parametrize("name, kwargs, size", [
    ("vgg11", {}, (32, 32)),  # torchvision's vgg11 as it is
    ("vgg16_bn", dict(num_classes=7, fc_width=256), (48, 40)),  # batch norm, another head, a non-square image
])
def test_logits_equal_torchvision(name, kwargs, size):
    theirs = random_torchvision(name, **kwargs)
    ours = from_torchvision(theirs).eval()
    x = torch.randn(2, 3, *size)
    assert assert_same_outputs(ours, theirs, x).shape == (2, kwargs.get("num_classes", 1000))
    assert len(ours.state_dict()) == len(theirs.state_dict())  # every tensor, batch-norm statistics too
    if name.endswith("_bn"):
        assert torch.equal(ours.blocks[4][-3].running_var, theirs.features[-3].running_var)  # conv5_3's batch norm


def test_from_torchvision_refuses_what_ours_cannot_hold():
    from torchvision.models.vgg import VGG as TorchvisionVGG

    with torch.device("meta"):
        resnet = torchvision.models.resnet18()
        big_filters = TorchvisionVGG(nn.Sequential(nn.Conv2d(3, 512, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2)))
        avg_pooled = TorchvisionVGG(nn.Sequential(nn.Conv2d(3, 512, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2)))
        other_head = torchvision.models.vgg11()
        other_head.avgpool = nn.AdaptiveAvgPool2d((6, 6))
    with pytest.raises(ValueError, match="expected a torchvision VGG"):
        from_torchvision(resnet)
    with pytest.raises(ValueError, match="3x3, stride 1"):
        from_torchvision(big_filters)
    with pytest.raises(ValueError, match="AvgPool2d"):
        from_torchvision(avg_pooled)
    with pytest.raises(ValueError, match=r"AdaptiveAvgPool2d\(\(7, 7\)\)"):
        from_torchvision(other_head)


@pytest.mark.parametrize("flavor", TABLE2)
def test_table2_parameter_counts(flavor):
    with torch.device("meta"):
        model = PAPER.build(flavor)  # 224x224, 3 channels, 1000 classes
    assert abs(count(model) / (TABLE2[flavor] * 1e6) - 1) < 0.015, count(model)


@pytest.mark.parametrize("flavor", TORCHVISION)
def test_torchvision_flavors_have_torchvisions_parameter_counts(flavor):
    with torch.device("meta"):
        ours, theirs = PAPER.build(flavor), getattr(torchvision.models, TORCHVISION[flavor])()
    assert count(ours) == count(theirs)


def test_known_counts():
    with torch.device("meta"):
        assert count(PAPER.build("VGG-16")) == count(PAPER.build("torchvision-vgg16")) == 138_357_544
        assert count(PAPER.build("VGG-19-BN")) == 143_678_248  # torchvision's vgg19_bn


@pytest.mark.parametrize("flavor", WEIGHT_LAYERS)
def test_table1_configurations(flavor):
    """Weight layers (A: 11 ... E: 19), 3x3 convolutions throughout but C's three 1x1, LRN in A-LRN only,
    widths 64 doubling to 512 after each of the five max poolings, and a head reading 7x7x512."""
    with torch.device("meta"):
        model = PAPER.build(flavor)
    convs = [m for m in model.blocks.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) + 3 == WEIGHT_LAYERS[flavor]
    assert [b.out_chans for b in model.blocks] == [64, 128, 256, 512, 512]
    assert all(isinstance(b[-1], nn.MaxPool2d) for b in model.blocks)
    ones = [i for i, block in enumerate(model.blocks) for m in block if isinstance(m, nn.Conv2d) and m.kernel_size == (1, 1)]
    assert ones == ([2, 3, 4] if flavor == "VGG-16-C" else [])
    assert all(m.stride == (1, 1) and m.padding == ((m.kernel_size[0] - 1) // 2,) * 2 for m in convs)
    lrn = [(i, j) for i, block in enumerate(model.blocks) for j, m in enumerate(block) if "ResponseNorm" in type(m).__name__]
    assert lrn == ([(0, 2)] if flavor == "VGG-11-LRN" else [])  # after the first convolution and its ReLU
    assert not any(isinstance(m, (nn.BatchNorm2d, nn.AdaptiveAvgPool2d)) for m in model.modules())
    assert (model.fc6.in_features, model.fc6.out_features, model.fc7.out_features) == (7 * 7 * 512, 4096, 4096)
    x = model.forward_features(torch.empty(1, 3, 224, 224, device="meta"))
    assert x.shape == (1, 512, 7, 7)


def test_lrn_has_alexnets_parameters():
    """b = a / (k + alpha sum_{5 adjacent maps} a^2)^beta with k = 2, alpha = 1e-4, beta = 0.75."""
    torch.manual_seed(0)
    lrn = PAPER.build("VGG-11-LRN", img_size=32).blocks[0][2]
    a = 20 * torch.randn(2, 8, 3, 3)
    sums = F.pad(a.square(), (0, 0, 0, 0, 2, 2)).unfold(1, 5, 1).sum(-1)  # over channels i-2 .. i+2
    assert torch.allclose(lrn(a), a / (2 + 1e-4 * sums) ** 0.75, atol=1e-5)


def test_paper_flavors_read_one_size_and_torchvision_flavors_any():
    with torch.device("meta"):
        paper, tv = PAPER.build("VGG-16"), PAPER.build("torchvision-vgg16")
    tv.resize_position_embeddings(64)  # adaptive pooling: any size gives 7x7
    assert tv.img_size == (64, 64)
    with pytest.raises(ValueError, match="reads a 7x7 map"):
        paper.resize_position_embeddings(256)
    paper.resize_position_embeddings(230)  # 230 // 32 is still 7
    with torch.device("meta"):
        assert PAPER.build("VGG-16", img_size=256).fc6.in_features == 8 * 8 * 512  # the head built for its size


def test_dense_evaluation_is_the_network_at_its_own_size():
    """Section 3.2: FC layers as 7x7 (here 2x2) and 1x1 convolutions; at the training size the class-score
    map is one position, equal to the network's logits; on a larger image it is a map, averaged."""
    torch.manual_seed(0)
    model = PAPER.build("tiny").eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert (model.dense(x) - model(x)).abs().max() < 1e-5
        big = torch.randn(2, 3, 64, 48)
        features = model.forward_features(big)  # (2, 64, 4, 3): a 3x2 map of 2x2 windows
        windows = [model.forward_head(features[:, :, i:i + 2, j:j + 2]) for i in range(3) for j in range(2)]
        assert (model.dense(big) - torch.stack(windows).mean(0)).abs().max() < 1e-5
    with pytest.raises(ValueError, match="paper's head"):
        PAPER.build("torchvision-vgg11", fc_width=16, num_classes=10).dense(x)


def test_initialisation():
    """Glorot & Bengio's uniform initialisation with zero biases for the paper's flavors (Section 3.1);
    torchvision's for its own."""
    torch.manual_seed(0)
    model = PAPER.build("tiny")
    for m in (model.blocks[2][0], model.fc6):
        fan_in, fan_out = m.weight[0].numel(), m.weight.shape[0] * m.weight[0, 0].numel()
        bound = (6 / (fan_in + fan_out)) ** 0.5
        assert m.weight.abs().max() <= bound and m.weight.abs().max() > 0.9 * bound and not m.bias.any()
    tv = PAPER.build("torchvision-vgg11", fc_width=256, num_classes=10)  # narrower than 4096, for speed
    assert abs(tv.fc8.weight.std() - 0.01) < 1e-3
    tv.reset_classifier(3)
    assert tv.get_classifier().out_features == 3 and abs(tv.fc8.weight.std() - 0.01) < 3e-3


def test_tiny_flavor_on_32x32_shapes():
    torch.manual_seed(0)
    model = PAPER.build("tiny")
    assert (model.img_size, model.in_chans, model.num_features) == ((32, 32), 3, 64 * 2 * 2)
    logits = model(torch.randn(4, 3, 32, 32))
    assert logits.shape == (4, 10) and torch.isfinite(logits).all()
    assert PAPER.shard_blocks == "blocks" and isinstance(model.blocks, nn.ModuleList)
    assert not PAPER.padded_batches  # the fully connected head reads one map size
    with pytest.raises(ValueError, match="too small"):
        VGG(blocks=FLAVORS["VGG-16"]["blocks"], img_size=16)


def test_recipe_is_section_3_1():
    recipe = PAPER.recipe
    cfg = TrainConfig.from_dict({"paper": "vgg", **PAPER.defaults, **recipe})  # types and keys are valid
    assert (cfg.optimizer, cfg.lr, cfg.momentum, cfg.weight_decay, cfg.batch_size, cfg.epochs) == (
        "sgd", 0.01, 0.9, 5e-4, 256, 74)
    assert cfg.schedule == "step" and cfg.gamma == 0.1 and len(parse_milestones(cfg.milestones)) == 3  # lr / 10, 3 times
    steps = dict(parse(cfg.augment))
    assert steps["scale"] == pytest.approx((256 / 224, 512 / 224), abs=1e-4) and "flip" in steps
    assert steps["lighting"] == (0.1,)


def table1_convs(blocks: tuple[tuple[str, ...], ...]) -> list[tuple[int, int]]:
    """(K, C) of every convK-C of a configuration, in order, read from Table 1's names."""
    return [tuple(map(int, name[4:].split("-"))) for block in blocks for name in block if name != "LRN"]


@pytest.mark.parametrize("flavor", ["VGG-19", "VGG-11-LRN"])
def test_width_multiplies_every_convolutions_filters(flavor):
    """Ours, to train the paper's configurations on a CPU: width 0.25 gives every convolution a quarter
    of Table 1's filters (16 to 128), each reading the one before; LRN stays where it was, the head keeps
    fc_width. Width 0.1 rounds to the nearest (6.4 -> 6, 12.8 -> 13, 25.6 -> 26, 51.2 -> 51, not
    floored), and a tiny width leaves one filter."""
    blocks = FLAVORS[flavor]["blocks"]
    for width, filters in ((0.25, {64: 16, 128: 32, 256: 64, 512: 128}), (0.1, {64: 6, 128: 13, 256: 26, 512: 51}),
                           (1e-3, {64: 1, 128: 1, 256: 1, 512: 1})):
        model = PAPER.build(flavor, width=width, fc_width=32, num_classes=10, img_size=32)
        convs = [m for m in model.blocks.modules() if isinstance(m, nn.Conv2d)]
        assert [(m.kernel_size[0], m.out_channels) for m in convs] == [(k, filters[C]) for k, C in table1_convs(blocks)]
        assert [m.in_channels for m in convs] == [3] + [m.out_channels for m in convs[:-1]]
        assert [b.out_chans for b in model.blocks] == [filters[C] for C in (64, 128, 256, 512, 512)]
        lrn = [(i, j) for i, block in enumerate(model.blocks) for j, m in enumerate(block) if "ResponseNorm" in type(m).__name__]
        assert lrn == ([(0, 2)] if flavor == "VGG-11-LRN" else [])
        assert (model.fc6.in_features, model.fc6.out_features, model.fc7.out_features) == (filters[512], 32, 32)
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)  # five poolings: 32 -> 1, a 1x1 map


def test_width_parameter_count_by_hand():
    """VGG-11 (A) at width 0.25, FC-128, 10 classes, 32x32 (a 1x1 map after five poolings): each convK-C
    has K*K*C_in*C weights and C biases, C a quarter of Table 1's, then 128 -> 128 -> 128 -> 10."""
    convs, c_in, total = table1_convs(FLAVORS["VGG-11"]["blocks"]), 3, 0
    assert len(convs) == 8
    for k, C in convs:
        total += k * k * c_in * (C // 4) + C // 4
        c_in = C // 4
    grid = 32 // 2 ** 5
    for fan_in, fan_out in ((c_in * grid * grid, 128), (128, 128), (128, 10)):
        total += fan_in * fan_out + fan_out
    assert count(PAPER.build("VGG-11", width=0.25, fc_width=128, num_classes=10, img_size=32)) == total
    assert count(PAPER.build("VGG-11-LRN", width=0.25, fc_width=128, num_classes=10, img_size=32)) == total


@pytest.mark.parametrize("flavor", ["VGG-11-LRN", "VGG-16-C", "VGG-13-BN"])
def test_width_one_is_the_paper(flavor):
    """width=1.0 builds and computes bit for bit what the flavor does without it (same seed, same draws)."""
    models = []
    for kwargs in ({}, dict(width=1.0)):
        torch.manual_seed(0)
        models.append(PAPER.build(flavor, **kwargs, fc_width=64, num_classes=10, img_size=32).eval())
    default, one = models
    assert [(k, v.shape) for k, v in default.state_dict().items()] == [(k, v.shape) for k, v in one.state_dict().items()]
    assert all(torch.equal(a, b) for a, b in zip(default.state_dict().values(), one.state_dict().values()))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(default(x), one(x))
    assert [b.out_chans for b in one.blocks] == [64, 128, 256, 512, 512]


@pytest.mark.parametrize("width", [0, -0.25, float("nan")])
def test_width_must_be_positive(width):
    with pytest.raises(ValueError, match="width .* must be positive"):
        PAPER.build("VGG-11", width=width, fc_width=32, num_classes=10, img_size=32)
