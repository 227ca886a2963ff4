"""LeNet-5 against the paper's own numbers (Section II.B, Table I): there is no reference implementation."""

import pytest
import torch
import torch.nn as nn

from papers.lenet import PAPER
from papers.lenet.model import TABLE_I, EuclideanRBF, LeNet5, PartialConv, Subsampling, squash

# Section II.B: trainable parameters and connections of each layer, for 1 input channel and 10 classes
PARAMETERS = {"C1": 156, "S2": 12, "C3": 1_516, "S4": 32, "C5": 48_120, "F6": 10_164}
CONNECTIONS = {"C1": 122_304, "S2": 5_880, "C3": 151_600, "S4": 2_000, "C5": 48_120, "F6": 10_164}

# Table I as the paper prints it: row i, column j is X where C3 map j reads S2 map i
TABLE_I_PRINTED = [
    "X . . . X X X . . X X X X . X X",
    "X X . . . X X X . . X X X X . X",
    "X X X . . . X X X . . X . X X X",
    ". X X X . . X X X X . . X . X X",
    ". . X X X . . X X X X . X X . X",
    ". . . X X X . . X X X X . X X X",
]


def trainable(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def test_each_layer_has_the_trainable_parameters_of_section_II_B():
    model = PAPER.build("LeNet-5")  # 32x32 grey images, 10 classes
    assert {name: trainable(getattr(model, name)) for name in PARAMETERS} == PARAMETERS
    assert trainable(model.output) == 0, "the RBF centres are fixed"
    assert trainable(model) == 60_000  # "60,000 trainable free parameters"


def test_each_layer_has_the_connections_of_section_II_B():
    """connections = units x (inputs per unit + 1 for the bias); the output layer's 10 x 84 have no bias.
    The total, 340,908, counts the output layer's."""
    model = PAPER.build("LeNet-5")
    shapes = {}
    hooks = [getattr(model, n).register_forward_hook(lambda m, i, o, n=n: shapes.__setitem__(n, o.shape[1:]))
             for n in [*PARAMETERS, "output"]]
    model(torch.zeros(1, 1, 32, 32))
    for h in hooks:
        h.remove()
    positions = lambda name: shapes[name][1:].numel()  # units per map

    def fan_ins(name):  # inputs per unit of each output map
        m = getattr(model, name)
        if isinstance(m, PartialConv):
            return [25 * len(row) for row in m.table]
        if isinstance(m, Subsampling):
            return [4] * len(m.coefficient)
        if isinstance(m, nn.Conv2d):
            return [m.weight[0].numel()] * m.out_channels
        return [m.in_features] * m.out_features  # F6

    counted = {name: sum(positions(name) * (f + 1) for f in fan_ins(name)) for name in CONNECTIONS}
    assert {name: shapes[name] for name in PARAMETERS} == {
        "C1": (6, 28, 28), "S2": (6, 14, 14), "C3": (16, 10, 10), "S4": (16, 5, 5), "C5": (120, 1, 1), "F6": (84,)}
    assert counted == CONNECTIONS
    assert sum(counted.values()) + 10 * 84 == 340_908


def test_c3_reads_the_maps_of_table_I():
    printed = [[c == "X" for c in row.split()] for row in TABLE_I_PRINTED]
    assert [tuple(i for i in range(6) if printed[i][j]) for j in range(16)] == list(TABLE_I)
    # and the layer is wired so: changing one S2 map changes exactly the C3 maps that read it
    torch.manual_seed(0)
    c3 = PartialConv(TABLE_I)
    c3.reset_parameters()
    x = torch.randn(1, 6, 14, 14)
    with torch.no_grad():
        y = c3(x)
        for i in range(6):
            x2 = x.clone()
            x2[:, i] += torch.randn(14, 14)
            changed = (c3(x2) - y).abs().amax(dim=(0, 2, 3)) > 0
            assert changed.tolist() == [printed[i][j] for j in range(16)], f"S2 map {i}"


def test_c3_maps_equal_a_convolution_over_their_own_inputs():
    torch.manual_seed(0)
    c3 = PartialConv(TABLE_I)
    c3.reset_parameters()
    x = torch.randn(2, 6, 14, 14)
    with torch.no_grad():
        y = c3(x)
        for j, row in enumerate(TABLE_I):
            n = len(row)
            conv = c3.convs[c3.fan_ins.index(n)]
            k = [m for m, r in enumerate(TABLE_I) if len(r) == n].index(j)  # its place among maps of n inputs
            expected = torch.nn.functional.conv2d(x[:, list(row)], conv.weight[k:k + 1], conv.bias[k:k + 1])
            assert (y[:, j:j + 1] - expected).abs().max() < 1e-5


def test_squashing_and_subsampling_are_the_papers():
    assert abs(squash(torch.tensor(1.0)).item() - 1) < 1e-4 and abs(squash(torch.tensor(-1.0)).item() + 1) < 1e-4
    assert squash(torch.tensor(100.0)).item() == pytest.approx(1.7159)  # the amplitude A
    torch.manual_seed(0)
    s2 = Subsampling(6)
    s2.reset_parameters()
    x = torch.randn(2, 6, 28, 28)
    with torch.no_grad():
        y = s2(x)
    four = x[:, :, 0::2, 0::2] + x[:, :, 0::2, 1::2] + x[:, :, 1::2, 0::2] + x[:, :, 1::2, 1::2]  # the four inputs added
    expected = 1.7159 * torch.tanh(2 / 3 * (four * s2.coefficient[:, None, None] + s2.bias[:, None, None]))
    assert y.shape == (2, 6, 14, 14) and (y - expected).abs().max() < 1e-5


def test_the_rbf_output_is_a_fixed_code_and_logits_are_its_negative_penalties():
    torch.manual_seed(0)
    model = PAPER.build("LeNet-5")
    W = model.output.W
    assert W.shape == (10, 84) and set(W.unique().tolist()) == {-1.0, 1.0}
    assert "output.W" in model.state_dict() and not list(model.output.parameters())
    assert torch.equal(PAPER.build("LeNet-5").output.W, W), "the same codes in every model"
    assert len({tuple(w.tolist()) for w in W}) == 10, "one code per class"
    x = torch.randn(3, 1, 32, 32)
    features = model.forward_features(x)
    penalties = ((features[:, None, :] - W) ** 2).sum(-1)  # Eq. 7
    assert torch.allclose(model(x), -penalties, atol=1e-5)
    # training moves every weight but the centres
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    nn.functional.cross_entropy(model(x), torch.tensor([0, 1, 2])).backward()
    opt.step()
    assert torch.equal(model.output.W, W)


def test_the_papers_initialisation():
    """Weights and biases uniform in [-2.4/F_i, 2.4/F_i], F_i the fan-in of the unit (Appendix A)."""
    torch.manual_seed(0)
    model = PAPER.build("LeNet-5")
    bounds = {"C1": 2.4 / 25, "S2": 2.4 / 4, "S4": 2.4 / 4, "C5": 2.4 / 400, "F6": 2.4 / 120}
    for name, bound in bounds.items():
        for p in getattr(model, name).parameters():
            assert p.abs().max() <= bound and p.abs().max() > 0.8 * bound, name
    for conv in model.C3.convs:
        n = conv.in_channels // conv.groups
        assert conv.weight.abs().max() <= 2.4 / (25 * n) and conv.weight.abs().max() > 0.8 * 2.4 / (25 * n)


def test_only_32x32_images_or_mnists_28x28_padded_with_background():
    with pytest.raises(ValueError, match="reads 32x32 images.*--image-size 32"):
        LeNet5(img_size=8)
    with pytest.raises(ValueError, match="reads 32x32 images.*--image-size 32"):
        PAPER.build("LeNet-5")(torch.zeros(1, 1, 28, 28))
    torch.manual_seed(0)
    at_28 = PAPER.build("LeNet-5", img_size=28).eval()
    at_32 = PAPER.build("LeNet-5").eval()
    at_32.load_state_dict(at_28.state_dict())
    x = torch.rand(3, 1, 28, 28)
    x[:, :, 5, 5] = torch.tensor([-0.81, -0.42, -1.3])[:, None]  # each image's background level, its lowest
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2), value=0.0)
    border = torch.ones(32, 32, dtype=torch.bool)
    border[2:30, 2:30] = False
    padded[:, 0, border] = torch.tensor([-0.81, -0.42, -1.3])[:, None]  # 2 pixels of it on every side
    with torch.no_grad():
        assert torch.allclose(at_28(x), at_32(padded), atol=1e-5)
        assert not torch.allclose(at_28(x), at_32(torch.nn.functional.pad(x, (2, 2, 2, 2))), atol=1e-3)


def test_tiny_is_lenet5_on_the_digits_at_32x32():
    assert PAPER.flavors["tiny"] == PAPER.flavors["LeNet-5"]
    assert PAPER.defaults["dataset"] == "digits" and PAPER.defaults["image_size"] == 32
    assert not PAPER.padded_batches and PAPER.data_kwargs == ("num_classes", "in_chans", "img_size")
    model = PAPER.build("tiny", num_classes=10, in_chans=1, img_size=32)
    assert model(torch.randn(4, 1, 32, 32)).shape == (4, 10)
    model.reset_classifier(5)
    assert isinstance(model.get_classifier(), EuclideanRBF) and model(torch.randn(2, 1, 32, 32)).shape == (2, 5)


def test_the_papers_recipe_is_one_the_trainer_takes():
    from common.config import resolve, validate

    cfg = resolve({"paper": "lenet", "recipe": "paper"})
    validate(cfg)
    assert (cfg.optimizer, cfg.lr, cfg.momentum, cfg.batch_size, cfg.epochs) == ("sgd", 5e-4, 0.0, 1, 20)
    from common.optim import schedule

    # the global rate of Section III.B pass by pass: 0.0005 for two passes, 0.0002 for three, 0.0001 for
    # three, 0.00005 for four, 0.00001 thereafter
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=cfg.lr)
    scheduler = schedule(optimizer, 20, cfg.warmup_steps, cfg.schedule, cfg.milestones, cfg.gamma, 1, cfg.gammas)
    rates = []
    for _ in range(20):  # one step a pass
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    expected = [5e-4] * 2 + [2e-4] * 3 + [1e-4] * 3 + [5e-5] * 4 + [1e-5] * 8
    assert rates == pytest.approx(expected)


def test_the_switches_that_find_what_limits_it():
    """activation="relu" puts max(0, a) where the squashing function was (S2 and S4 too); output="linear" a
    trained layer whose outputs are the logits, where the RBF units' negative penalties were."""
    torch.manual_seed(0)
    paper, relu, linear = LeNet5(), LeNet5(activation="relu"), LeNet5(output="linear")
    relu.load_state_dict(paper.state_dict())
    x = torch.randn(4, 1, 32, 32)
    assert (relu.forward_features(x) >= 0).all() and (paper.forward_features(x) < 0).any()
    assert relu.S2.f is torch.nn.functional.relu and paper.S2.f is squash
    assert isinstance(linear.output, torch.nn.Linear) and "output.W" not in linear.state_dict()
    with torch.no_grad():
        assert torch.equal(linear(x), linear.output(linear.forward_features(x)))
    assert sum(p.numel() for p in linear.parameters()) == 60_000 + 84 * 10 + 10
    with pytest.raises(ValueError, match="squash, relu"):
        LeNet5(activation="tanh")
