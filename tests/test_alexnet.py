"""AlexNet against torchvision's (the one-tower flavor), and the paper's two-tower model against Section 3."""

import functools

import pytest
import torch
import torch.nn as nn
import torchvision

from papers.alexnet import PAPER, from_torchvision
from papers.alexnet.model import AlexNet, LocalResponseNorm
from tests.conftest import assert_same_outputs


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@functools.cache
def random_torchvision(**kwargs) -> nn.Module:
    """torchvision's AlexNet in eval mode with random weights of about unit gain and random biases, so
    that the logits are large and differ by input and class (its default init gives logits near 0).
    Built once per configuration: the tests read it and never change it."""
    torch.manual_seed(0)
    with torch.device("meta"):
        model = torchvision.models.alexnet(weights=None, **kwargs)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                m.weight.normal_(0, (2 / m.weight[0].numel()) ** 0.5)
                m.bias.normal_(0, 0.2)
    return model.eval()


@pytest.mark.parametrize("kwargs, size", [({}, (64, 64)), (dict(num_classes=10, dropout=0.3), (96, 80))])
def test_logits_equal_torchvision(kwargs, size):
    theirs = random_torchvision(**kwargs)
    ours = from_torchvision(theirs).eval()
    x = torch.randn(2, 3, *size)
    assert assert_same_outputs(ours, theirs, x).shape == (2, kwargs.get("num_classes", 1000))
    assert ours.dropout.p == kwargs.get("dropout", 0.5)


def test_from_torchvision_maps_every_tensor():
    theirs = random_torchvision()
    ours = from_torchvision(theirs)
    assert len(ours.state_dict()) == len(theirs.state_dict()) == 16
    assert torch.equal(ours.layers[3].conv.weight, theirs.features[8].weight)
    assert torch.equal(ours.fc6.bias, theirs.classifier[1].bias)


@pytest.mark.parametrize("change, match", [
    (lambda m: setattr(m.features, "0", nn.Conv2d(3, 64, 11, 2, 2)), "features.0 is not a 11x11 convolution"),
    (lambda m: setattr(m.features, "8", nn.Conv2d(384, 256, 3, 1, 1, groups=2)), "features.8 .* groups 1"),
    (lambda m: setattr(m, "avgpool", nn.AdaptiveAvgPool2d(4)), "adaptive average pool to 6x6"),
    (lambda m: setattr(m.classifier, "0", nn.Identity()), "the classifier is"),
    (lambda m: setattr(m.features, "2", nn.AvgPool2d(3, 2)), "features.2 is not a 3x3 max pool"),
])
def test_from_torchvision_refuses_what_ours_cannot_hold(change, match):
    with torch.device("meta"):
        theirs = torchvision.models.alexnet(weights=None)
    change(theirs)
    with pytest.raises(ValueError, match=match):
        from_torchvision(theirs)
    with pytest.raises(ValueError, match="expected a torchvision AlexNet"):
        from_torchvision(nn.Linear(2, 2))


def test_parameter_counts():
    with torch.device("meta"):
        paper, ours, theirs = PAPER.build("AlexNet"), PAPER.build("torchvision"), torchvision.models.alexnet()
    assert abs(count(paper) / 60e6 - 1) < 0.03, count(paper)  # "60 million parameters" (abstract, Section 4)
    assert count(ours) == count(theirs) == 61_100_840


def test_two_towers_as_in_section_3_5():
    """The kernels of Section 3.5, both GPUs together: conv2, conv4 and conv5 read only their own GPU's
    maps (groups 2: 48 and 192 input maps per kernel), conv3 and the fully connected layers read all."""
    with torch.device("meta"):
        model = PAPER.build("AlexNet")
    shapes = [tuple(layer.conv.weight.shape) for layer in model.layers]
    assert shapes == [(96, 3, 11, 11), (256, 48, 5, 5), (384, 256, 3, 3), (384, 192, 3, 3), (256, 192, 3, 3)]
    assert [layer.conv.groups for layer in model.layers] == [1, 2, 1, 2, 2]
    assert [tuple(m.weight.shape) for m in (model.fc6, model.fc7, model.fc8)] == [(4096, 9216), (4096, 4096),
                                                                                  (1000, 4096)]
    torch.manual_seed(0)  # a grouped layer's first half of kernels sees only the first half of its inputs
    conv2 = AlexNet(num_classes=10, img_size=67).layers[1].conv
    x = torch.randn(1, 96, 9, 9)
    y = conv2(x)
    x[:, 48:] += 1.0  # change the second GPU's maps
    changed = (conv2(x) - y).abs().amax(dim=(0, 2, 3)) > 0
    assert not changed[:128].any() and changed[128:].all()


def test_feature_maps_of_fig_2():
    """224x224 with padding 2 on conv1 gives the paper's 55x55 maps (as 227x227 without padding does;
    224 without padding gives 54); then 27, 13, 13, 13 and 6 after pool5."""
    with torch.device("meta"):
        model = PAPER.build("AlexNet")
        x = torch.empty(1, 3, 224, 224)
        assert model.layers[0].conv(x).shape == (1, 96, 55, 55)
        assert nn.Conv2d(3, 96, 11, 4)(torch.empty(1, 3, 227, 227)).shape[-1] == 55
        assert nn.Conv2d(3, 96, 11, 4)(x).shape[-1] == 54
        sides = []
        for layer in model.layers:
            x = layer(x)
            sides.append(x.shape[-1])
    assert sides == [27, 13, 13, 13, 6] and model.feature_size((224, 224)) == (6, 6)


def test_local_response_normalisation_is_the_papers_formula():
    torch.manual_seed(0)
    a = 10 * torch.relu(torch.randn(2, 12, 3, 3))  # large enough that the denominator matters
    k, n, alpha, beta = 2.0, 5, 1e-4, 0.75  # Section 3.3
    N = a.shape[1]
    expected = torch.stack([a[:, i] / (k + alpha * (a[:, max(0, i - n // 2):min(N - 1, i + n // 2) + 1] ** 2).sum(1))
                            ** beta for i in range(N)], dim=1)
    got = LocalResponseNorm()(a)
    assert (got - expected).abs().max() < 1e-5 and (got - a).abs().max() > 1e-2
    with torch.device("meta"):
        model = PAPER.build("AlexNet")
    assert [isinstance(layer.norm, LocalResponseNorm) for layer in model.layers] == [True, True, False, False, False]
    assert [isinstance(layer.pool, nn.MaxPool2d) for layer in model.layers] == [True, True, False, False, True]
    assert all(layer.pool.kernel_size == 3 and layer.pool.stride == 2 for layer in model.layers
               if isinstance(layer.pool, nn.MaxPool2d)), "overlapping pooling, s = 2, z = 3 (Section 3.4)"


def test_the_papers_initialisation():
    """Section 5: weights N(0, 0.01); biases 1 in conv2, conv4, conv5, fc6 and fc7, 0 in conv1, conv3 and fc8.
    The AlexNet flavor starts so; tiny (narrower, where these weights stall training) starts from He's."""
    assert PAPER.flavors["AlexNet"].get("init", "paper") == "paper" and PAPER.flavors["tiny"]["init"] == "he"
    torch.manual_seed(0)
    model = PAPER.build("tiny", init="paper")
    convs = [layer.conv for layer in model.layers]
    for m, bias in zip([*convs, model.fc6, model.fc7, model.fc8], [0, 1, 0, 1, 1, 1, 1, 0]):
        assert torch.all(m.bias == bias)
        assert m.weight.mean().abs() < 0.002 and abs(m.weight.std().item() - 0.01) < 0.001
    model.reset_classifier(7)
    assert model.fc8.out_features == 7 and torch.all(model.fc8.bias == 0) and model.fc8.weight.std() < 0.012


def test_dropout_drops_the_outputs_of_fc6_and_fc7_in_training_only():
    torch.manual_seed(0)
    model = PAPER.build("tiny")
    seen = []
    hook = model.fc7.register_forward_hook(lambda m, i, o: seen.append(i[0]))
    x = torch.randn(8, 3, 32, 32)
    model.train()(x)
    fc6_relu = torch.relu(model.fc6(model.forward_features(x).flatten(1)))  # without dropout
    kept = seen[-1] != 0
    assert 0.3 < (kept & (fc6_relu > 0)).sum() / (fc6_relu > 0).sum() < 0.7  # about half of fc6's units dropped
    assert torch.allclose(seen[-1][kept], 2 * fc6_relu[kept], atol=1e-5)  # the rest scaled by 1 / (1 - p)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x), model(x))
    hook.remove()


def test_tiny_reads_32x32_shapes_and_fixed_sizes_only():
    torch.manual_seed(0)
    model = PAPER.build("tiny", num_classes=10, in_chans=3, img_size=32)
    assert model.forward_features(torch.randn(2, 3, 32, 32)).shape == (2, 64, 3, 3)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert (PAPER.defaults["dataset"], PAPER.defaults["image_size"]) == ("digits", 32) and not PAPER.padded_batches
    assert PAPER.shard_blocks == "layers" and isinstance(model.layers, nn.ModuleList)
    with pytest.raises(ValueError, match="leaves no map after pool5"):
        AlexNet(img_size=32)  # the paper's strides on 32x32 images
    with pytest.raises(ValueError, match="fc6 reads"):
        model.resize_position_embeddings(48)
    ours = from_torchvision(random_torchvision())
    ours.resize_position_embeddings(96)  # adaptive pooling: any large enough size
    assert ours.img_size == (96, 96)


def test_the_papers_recipe_is_one_the_trainer_takes():
    from common.config import resolve, validate

    cfg = resolve({"paper": "alexnet", "recipe": "paper"})
    validate(cfg)
    assert (cfg.optimizer, cfg.lr, cfg.momentum, cfg.weight_decay, cfg.batch_size) == ("sgd", 0.01, 0.9, 5e-4, 128)
    assert (cfg.schedule, cfg.gamma, len(cfg.milestones.split(","))) == ("step", 0.1, 3)  # divided by 10 three times
    assert cfg.augment.startswith("scale:1.1429-1.1429,flip,lighting:0.1")


def test_tanh_units_replace_every_relu_but_the_output():
    """Section 3.1's comparison: activation="tanh" puts f(x) = tanh(x) where the ReLUs were."""
    torch.manual_seed(0)
    relu, tanh = PAPER.build("tiny", in_chans=1), PAPER.build("tiny", in_chans=1, activation="tanh")
    tanh.load_state_dict(relu.state_dict())
    x = torch.randn(2, 1, 32, 32)
    assert not torch.allclose(relu.eval()(x), tanh.eval()(x))
    feats = tanh.forward_features(x)
    assert feats.abs().max() <= 1  # every convolution's units are tanh, pooled
    with pytest.raises(ValueError, match="relu, tanh"):
        PAPER.build("tiny", activation="sigmoid")


def test_figure_1s_four_layer_network():
    """Three 5x5 convolutions (32, 32, 64 maps), each with its activation and a 3x3/2 max pool, and one
    fully connected layer: 85,098 parameters on 32x32 colour images; the flavor trains on shapes."""
    spec = PAPER.for_flavor("figure-1")
    model = spec.build_for_data("figure-1", {"num_classes": 10, "in_chans": 3, "img_size": 32})
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size) for c in convs] == [(32, (5, 5)), (32, (5, 5)), (64, (5, 5))]
    assert [type(m) for m in model.modules() if isinstance(m, nn.Linear)] == [nn.Linear]
    assert sum(p.numel() for p in model.parameters()) == 85_098
    assert model(torch.randn(3, 3, 32, 32)).shape == (3, 10)
    assert spec.defaults["dataset"] == "shapes" and spec.defaults["weight_decay"] == 0.0  # no regularization
    tanh = spec.build_for_data("figure-1", {"num_classes": 10, "in_chans": 3, "img_size": 32}, {"activation": "tanh"})
    assert all(layer.f is torch.tanh for layer in tanh.layers)
