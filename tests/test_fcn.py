"""FCN against torchvision's fcn_resnet50, against the reference Caffe nets' crops and the paper's Table 1,
and the paper's initialisation: bilinear upsampling, and each finer net starting as the coarser one."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

from tests.conftest import randomize_batch_norm
from papers.fcn.model import FCN, FLAVORS, OFFSETS, TORCHVISION_FLAVORS, ResNetFCN, Upsampling, bilinear_kernel
from papers.fcn.spec import from_torchvision
from papers.vgg.model import D, VGG

SMALL = dict(width=0.125, fc_width=32)  # VGG-16's layout at 8 to 64 filters: the same geometry, fast


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def randomize(model: nn.Module) -> nn.Module:
    """He-scaled random convolutions and biases (score layers included), so that every layer's output
    varies over the map and a misplaced pixel or tensor shows; eval mode."""
    torch.manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            if type(m) is nn.Conv2d:
                nn.init.kaiming_normal_(m.weight)
                if m.bias is not None:
                    nn.init.normal_(m.bias, 0, 0.1)
    return model.eval()


@pytest.mark.parametrize("num_classes, size", [(5, (67, 53)), (12, (64, 48))])
def test_from_torchvision_equals_fcn_resnet50(num_classes, size):
    """Both outputs, "out" and "aux", of torchvision's fcn_resnet50 with random weights and batch-norm
    statistics, at class counts other than 21 and sizes that are not multiples of 8."""
    torch.manual_seed(0)
    theirs = randomize_batch_norm(torchvision.models.segmentation.fcn_resnet50(
        weights=None, weights_backbone=None, num_classes=num_classes, aux_loss=True))
    ours = from_torchvision(theirs).eval()
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        expected, got = theirs(x), ours(x)
    assert set(got) == set(expected) == {"out", "aux"}
    for key in ("out", "aux"):
        assert got[key].shape == expected[key].shape == (2, num_classes, *size)
        assert (got[key] - expected[key]).abs().max() < 1e-5, key
        assert expected[key].std() > 0.1  # outputs vary enough to tell a misplaced tensor


def test_from_torchvision_refuses_another_geometry():
    with torch.device("meta"):
        undilated = torchvision.models.segmentation.fcn_resnet50(weights=None, weights_backbone=None, aux_loss=True)
        undilated.backbone.layer4[1].conv2.dilation = (1, 1)  # the tensors map, the geometry does not
    with pytest.raises(ValueError, match="cannot map stages.3.1.conv2"):
        from_torchvision(undilated)
    with pytest.raises(ValueError, match="expected a torchvision FCN"):
        from_torchvision(nn.Linear(2, 2))


def test_the_torchvision_flavor_has_torchvision_parameter_count():
    build = torchvision.models.segmentation.fcn_resnet50
    with torch.device("meta"):
        flavor = ResNetFCN(**TORCHVISION_FLAVORS["torchvision-fcn_resnet50"])
        assert count(flavor) == count(build(weights=None, weights_backbone=None, aux_loss=True)) == 35_322_218
        for num_classes, aux_loss in [(5, False), (12, True)]:
            theirs = build(weights=None, weights_backbone=None, num_classes=num_classes, aux_loss=aux_loss)
            assert count(ResNetFCN(aux_loss=aux_loss, num_classes=num_classes)) == count(theirs)
    assert [b.conv2.dilation for b in flavor.stages[3]] == [(2, 2), (4, 4), (4, 4)]  # torchvision's layer4


@pytest.mark.parametrize("variant", ["32s", "16s", "8s"])
@pytest.mark.parametrize("size", [(64, 64), (100, 77), (224, 224), (31, 5)])
def test_output_has_the_input_size(variant, size):
    """The padding of 100 and Caffe's rounded-up pooling leave every upsampled map big enough to crop."""
    model = FCN(variant, num_classes=3, **SMALL).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, *size))["out"]
    assert out.shape == (1, 3, *size)


def coord_map(layers: list[nn.Module]) -> tuple[float, float]:
    """Caffe's coord_map: (a, b) with x = a y + b the input coordinate of a chain's output pixel y. A
    k x k layer with stride s and padding p maps y to s y + (k - 1)/2 - p; a deconvolution inverts it."""
    a, b = 1.0, 0.0
    for m in layers:
        if not isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.MaxPool2d)):
            continue
        k, s, p = (v if isinstance(v, int) else v[0] for v in (m.kernel_size, m.stride, m.padding))
        la, lb = (1 / s, (p - (k - 1) / 2) / s) if isinstance(m, nn.ConvTranspose2d) else (s, (k - 1) / 2 - p)
        a, b = a * la, a * lb + b
    return a, b


def test_crop_offsets_are_the_reference_nets():
    """voc-fcn32s: 19; voc-fcn16s: 5 and 27; voc-fcn8s: 5, 9 and 31 (their prototxt), recomputed from
    our layers: the offset lines a map up with the input (or with the map it is added to)."""
    models = {v: FCN(v, num_classes=3, **SMALL) for v in ("32s", "16s", "8s")}
    m32, m16, m8 = models.values()
    convs = lambda m, n: [layer for block in m.blocks[:n] for layer in block]  # up to pool n
    head = lambda m: convs(m, 5) + [m.fc6, m.fc7, m.score_fr]
    assert coord_map(head(m32) + [m32.upscore]) == (1, -OFFSETS["32s"]) == (1, -19)
    for m in (m16, m8):
        (a2, b2), (a4, b4) = coord_map(head(m) + [m.upscore2]), coord_map(convs(m, 4))
        assert a2 == a4 == 16 and (b2 - b4) / 16 == OFFSETS["score_pool4"] == 5
    assert coord_map(head(m16) + [m16.upscore2, m16.upscore16]) == (1, -OFFSETS["16s"]) == (1, -27)
    (a, b), (a3, b3) = coord_map(head(m8) + [m8.upscore2, m8.upscore_pool4]), coord_map(convs(m8, 3))
    assert a == a3 == 8 and (b - b3) / 8 == OFFSETS["score_pool3"] == 9
    assert coord_map(head(m8) + [m8.upscore2, m8.upscore_pool4, m8.upscore8]) == (1, -OFFSETS["8s"]) == (1, -31)


@pytest.mark.parametrize("factor", [2, 8, 16, 32])
def test_upsampling_starts_as_bilinear_interpolation(factor):
    """Output pixel z of the 2f x 2f, stride f deconvolution sits at input coordinate (z + 1/2)/f - 1,
    F.interpolate's pixel j (align_corners=False) at (j + 1/2)/f - 1/2: they agree at z = j + f/2 where
    neither reaches past the map (F.interpolate clamps there, the deconvolution reads zeros). Each class
    from itself only; a constant map stays constant inside."""
    n, C = 5, 3
    layer = Upsampling(C, factor)
    x = torch.randn(2, C, n, n + 1)
    with torch.no_grad():
        up, const = layer(x), layer(torch.full((1, C, n, n), 2.5))
    assert up.shape == (2, C, (n + 1) * factor, (n + 2) * factor)
    expected = F.interpolate(x, scale_factor=factor, mode="bilinear", align_corners=False)
    h = factor // 2
    inside = up[..., factor: n * factor, factor: (n + 1) * factor]
    assert (inside - expected[..., h: n * factor - h, h: (n + 1) * factor - h]).abs().max() < 1e-5
    assert (const[..., factor: n * factor, factor: n * factor] - 2.5).abs().max() < 1e-5
    assert torch.equal(layer.weight[0, 0], bilinear_kernel(2 * factor)) and not layer.weight[0, 1].any()


def test_the_nets_upsamplings_start_bilinear_and_the_final_one_stays():
    """Section 4.3: the final upsampling fixed to bilinear (a buffer), the intermediate ones learned."""
    model = FCN("8s", num_classes=4, **SMALL)
    ups = [model.upscore2, model.upscore_pool4, model.upscore8]
    assert [u.factor for u in ups] == [2, 2, 8]
    for u in ups:
        assert torch.equal(u.weight, torch.eye(4)[:, :, None, None] * bilinear_kernel(u.kernel_size[0]))
    learned = {name for name, _ in model.named_parameters() if name.startswith("upscore")}
    assert learned == {"upscore2.weight", "upscore_pool4.weight"} and "upscore8.weight" in model.state_dict()
    assert not [n for n, _ in FCN("8s", fixed_upsampling="all", **SMALL).named_parameters() if "upscore" in n]
    assert len([n for n, _ in FCN("8s", fixed_upsampling="none", **SMALL).named_parameters() if "upscore" in n]) == 3


def exact(n: int, period: int, first: int) -> torch.Tensor:
    """Pixels 0..n-1 where two bilinear steps (x2, then the rest) equal one: half of each period."""
    return (torch.arange(n) - first) % period < period // 2


def test_each_finer_net_starts_as_the_coarser_one():
    """Section 4.2: FCN-16s takes FCN-32s's weights by name, its score_pool4 starts at zero, "so the net
    starts with unmodified predictions"; FCN-8s likewise from FCN-16s. Unmodified up to interpolation:
    x2 then x16 bilinear equals x32 only away from the coarse grid's points. The coarse map's point n
    is at input x = 32 n + 12.5 (see OFFSETS); x2 samples it at n +- 1/4, so the pixels within a
    quarter cell of a point (x mod 32 in 5..20) differ, the other half (21..31, 0..4) are equal; for
    8s from 16s, points at x = 16 n - 11.5, equal at x mod 16 in 9..15, 0."""
    size = (100, 77)
    m32 = randomize(FCN("32s", num_classes=4, **SMALL))
    m16, m8 = FCN("16s", num_classes=4, **SMALL).eval(), FCN("8s", num_classes=4, **SMALL).eval()
    loaded = m16.load_state_dict(m32.state_dict(), strict=False)
    assert sorted(loaded.missing_keys) == ["score_pool4.bias", "score_pool4.weight", "upscore16.weight",
                                           "upscore2.weight"] and loaded.unexpected_keys == ["upscore.weight"]
    loaded = m8.load_state_dict(m16.state_dict(), strict=False)
    assert sorted(loaded.missing_keys) == ["score_pool3.bias", "score_pool3.weight", "upscore8.weight",
                                           "upscore_pool4.weight"] and loaded.unexpected_keys == ["upscore16.weight"]
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        out32, out16, out8 = (m(x)["out"] for m in (m32, m16, m8))
    for (a, b), (period, first) in [((out32, out16), (32, 21)), ((out16, out8), (16, 9))]:
        equal = exact(size[0], period, first)[:, None] & exact(size[1], period, first)[None]
        assert (a - b)[..., equal].abs().max() < 1e-5 * a.abs().max()
        assert (a - b)[..., ~equal].abs().max() > 1e-2 * a.std()  # the two interpolations do differ
    assert out32.std() > 0.5


def test_skips_at_once_are_scaled():
    """voc-fcn8s-atonce: pool4 scaled by 0.01, pool3 by 1e-4 before their score layers."""
    staged, at_once = FCN("8s", num_classes=3, **SMALL), FCN("8s", at_once=True, num_classes=3, **SMALL)
    randomize(staged)
    at_once.load_state_dict(staged.state_dict())
    with torch.no_grad():
        at_once.score_pool4.weight.mul_(100)
        at_once.score_pool3.weight.mul_(1e4)
        x = torch.randn(1, 3, 40, 40)
        assert torch.allclose(at_once.eval()(x)["out"], staged(x)["out"], rtol=1e-4, atol=1e-4)


def test_load_vgg_convolutionalises_the_classifier():
    """Section 3.1: fc6 and fc7 as convolutions read every 7x7 window of pool5 as VGG's classifier reads
    the one 7x7 map; on a 9x9 map, each cell of the 3x3 output is VGG's fc7 on its window."""
    torch.manual_seed(0)
    vgg = VGG(blocks=D, num_classes=5, **SMALL).eval()
    model = FCN("32s", num_classes=5, **SMALL).eval()
    model.load_vgg(vgg)
    assert all(torch.equal(a, b) for a, b in zip(model.blocks.state_dict().values(), vgg.blocks.state_dict().values()))
    pool5 = torch.randn(1, vgg.blocks[-1].out_chans, 9, 9)
    with torch.no_grad():
        dense = F.relu(model.fc7(F.relu(model.fc6(pool5))))  # (1, 32, 3, 3)
        window = pool5[:, :, 1:8, 2:9].flatten(1)  # (1, 64 * 7 * 7)
        fc7 = F.relu(vgg.fc7(F.relu(vgg.fc6(window))))  # (1, 32)
    assert dense.shape == (1, 32, 3, 3)
    assert (dense[:, :, 1, 2] - fc7).abs().max() < 1e-5 and fc7.abs().max() > 0


def test_score_layers_start_at_zero():
    model = FCN("8s", num_classes=3, **SMALL)
    for layer in (model.score_fr, model.score_pool4, model.score_pool3):
        assert not layer.weight.any() and not layer.bias.any()


def test_parameter_counts_against_table1():
    """Table 1: FCN-VGG16 (FCN-32s), 134M parameters: VGG-16's convolutions, fc6 and fc7 as convolutions
    and score_fr; its x32 upsampling (21 x 21 x 64 x 64 = 1.8M fixed filters) is not a parameter. The
    skip nets add their score layers and learned x2 upsamplings. Every one within 0.5M of 134M
    (Table 1's precision); with every filter a parameter (Caffe's blobs: fixed_upsampling="none"),
    voc-fcn8s has 134.49M."""
    with torch.device("meta"):
        counts = {flavor: count(FCN(**FLAVORS[flavor])) for flavor in ("FCN-32s", "FCN-16s", "FCN-8s")}
        every_filter = {v: count(FCN(v, fixed_upsampling="none")) for v in ("32s", "8s")}
    assert counts == {"FCN-32s": 134_346_581, "FCN-16s": 134_364_410, "FCN-8s": 134_376_863}
    with torch.device("meta"):
        assert count(FCN(**FLAVORS["tiny"])) == 654_841  # ours, for fashion-canvas (11 classes, one channel)
    assert every_filter == {"32s": 134_346_581 + 21 * 21 * 64 * 64, "8s": 134_489_759}
    assert all(abs(n - 134e6) < 0.5e6 for n in [*counts.values(), every_filter["8s"]])


def test_tiny_flavor_trains_a_step():
    model = FCN(**FLAVORS["tiny"])
    x, y = torch.randn(2, 1, 36, 28), torch.randint(0, 11, (2, 36, 28))
    out = model(x)["out"]
    assert out.shape == (2, 11, 36, 28)
    F.cross_entropy(out, y).backward()
    assert model.score_fr.weight.grad.abs().sum() > 0 and model.upscore2.weight.grad is not None


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="unknown variant"):
        FCN("4s")


def test_resnet_dilates_only_bottlenecks():
    """papers/resnet's `dilate` (torchvision's replace_stride_with_dilation) for a stride-8 backbone."""
    from papers.resnet.model import ResNet

    with pytest.raises(ValueError, match="needs bottlenecks"):
        ResNet(block="basic", dilate=(False, True, True))
    with torch.device("meta"):
        net = ResNet(block="bottleneck", layers=(1, 2, 2, 2), stride_on="3x3", dilate=(False, True, True))
    assert [[b.conv2.dilation[0] for b in stage] for stage in net.stages] == [[1], [1, 1], [1, 2], [2, 4]]
    assert [b.stride for stage in net.stages for b in stage] == [1, 2, 1, 1, 1, 1, 1]


@pytest.mark.parametrize("variant", ["32s", "16s", "8s", "resnet"])
def test_each_image_of_a_padded_batch_gets_its_scores_alone(variant):
    """Padded batches (common.layers): images of four sizes, zero-padded into one batch with their mask, get
    the scores each has alone, unpadded: the skips' crops and sums, the deconvolutions and torchvision's
    bilinear upsampling (at each image's own scale) read nothing of the padding."""
    if variant == "resnet":
        model = randomize_batch_norm(randomize(ResNetFCN(layers=(1, 1, 1, 1), num_classes=4, in_chans=1)))
    else:
        model = randomize(FCN(variant, num_classes=4, in_chans=1, **SMALL))
    images = [torch.randn(1, h, w) for h, w in [(40, 56), (67, 53), (31, 5), (96, 96)]]
    batch = torch.zeros(4, 1, 96, 96)
    mask = torch.zeros(4, 96, 96, dtype=torch.bool)
    for k, x in enumerate(images):
        batch[k, :, :x.shape[1], :x.shape[2]], mask[k, :x.shape[1], :x.shape[2]] = x, True
    with torch.no_grad():
        together = model.eval()(batch, mask=mask)
        for k, x in enumerate(images):
            alone = model(x[None])
            for key, scores in alone.items():
                got = together[key][k, :, :x.shape[1], :x.shape[2]]
                assert (got - scores[0]).abs().max() < 1e-5 * max(1.0, scores.abs().max()), (key, x.shape)
                assert scores.std() > 0.1
