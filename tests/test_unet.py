"""U-Net against the paper's Figure 1 (the sizes at every level, the parameter count), a hand-unrolled
forward, the overlap-tile strategy (Figure 2), the weight map of equation 2 and the elastic deformation
(Section 3.1). No reference implementation shares the paper's architecture, so the paper is the reference."""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torchvision import tv_tensors
from torchvision.transforms import v2

from common.data import get_dataset
from common.tasks import Segmentation
from papers.unet.augment import ElasticDeformation
from papers.unet.model import FLAVORS, UNet
from papers.unet.tiling import mirror, overlap_tile
from papers.unet.weights import target_weights, weight_map
from tests.conftest import need_files
from train import main


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# Figure 1, top to bottom and back up: (channels, side) after every 3x3 convolution (and its ReLU), max
# pooling, up-convolution and the 1x1 convolution, for a 572x572 input tile.
FIGURE1 = [
    (64, 570), (64, 568), (64, 284),
    (128, 282), (128, 280), (128, 140),
    (256, 138), (256, 136), (256, 68),
    (512, 66), (512, 64), (512, 32),
    (1024, 30), (1024, 28),  # the bottom level
    (512, 56), (512, 54), (512, 52),  # up-convolution, then two 3x3 convolutions on 1024 concatenated channels
    (256, 104), (256, 102), (256, 100),
    (128, 200), (128, 198), (128, 196),
    (64, 392), (64, 390), (64, 388),
    (2, 388),  # the 1x1 convolution: the output segmentation map
]


def test_figure1_sizes_at_every_level():
    """572x572 in, 388x388 out, and Figure 1's sizes at every layer; the cropped skip concatenated to every
    up-convolution's output (1024 channels at 56, ... 128 at 392); the dropout at the end of the contracting
    path (the bottom level's 1024 channels)."""
    torch.manual_seed(0)
    model = UNet(**FLAVORS["u-net"]).eval()
    sizes, concatenated, dropped = [], [], []
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.MaxPool2d)):
            m.register_forward_hook(lambda m, args, out: sizes.append((out.shape[1], out.shape[-1])))
    for level in model.expansive:
        level.register_forward_pre_hook(lambda m, args: concatenated.append(tuple(args[0].shape)))
    model.dropout.register_forward_pre_hook(lambda m, args: dropped.append(tuple(args[0].shape)))
    with torch.no_grad():
        out = model.forward_tile(torch.randn(1, 1, 572, 572))
    assert out.shape == (1, 2, 388, 388) and torch.isfinite(out).all()
    assert sizes == FIGURE1
    assert concatenated == [(1, 1024, 56, 56), (1, 512, 104, 104), (1, 256, 200, 200), (1, 128, 392, 392)]
    assert dropped == [(1, 1024, 28, 28)]
    assert model.margin == 92 and model.output_side(572) == 388


def test_parameter_count_by_hand_from_figure1():
    """Figure 1 has 23 convolutional layers (Section 2): 18 3x3 convolutions (weights 9 * C_in * C_out and
    C_out biases), 4 2x2 up-convolutions (4 * C_in * C_out + C_out) and the 1x1 output convolution
    (64 * 2 + 2). The paper states no count; counted from the figure: 28,244,288 + 2,786,240 + 130."""
    convs3 = [(1, 64), (64, 64), (64, 128), (128, 128), (128, 256), (256, 256), (256, 512), (512, 512),
              (512, 1024), (1024, 1024),  # the contracting path and the bottom
              (1024, 512), (512, 512), (512, 256), (256, 256), (256, 128), (128, 128), (128, 64), (64, 64)]
    ups = [(1024, 512), (512, 256), (256, 128), (128, 64)]
    assert len(convs3) + len(ups) + 1 == 23
    total = sum(9 * a * b + b for a, b in convs3) + sum(4 * a * b + b for a, b in ups) + (64 * 2 + 2)
    assert total == 28_244_288 + 2_786_240 + 130 == 31_030_658
    with torch.device("meta"):
        paper, padded = UNet(**FLAVORS["u-net"]), UNet(**FLAVORS["u-net-padded"])
    assert count(paper) == count(padded) == total  # padding adds no parameters
    layers = [m for m in paper.modules() if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d))]
    assert [m.kernel_size for m in layers].count((3, 3)) == 18 and len(layers) == 23


def conv_relu2(x: torch.Tensor, level: nn.Sequential, padding: int) -> torch.Tensor:
    x = F.relu(F.conv2d(x, level[0].weight, level[0].bias, padding=padding))
    return F.relu(F.conv2d(x, level[2].weight, level[2].bias, padding=padding))


@pytest.mark.parametrize("padding, side", [(1, 12), (0, 20)])
def test_one_level_net_equals_a_hand_unrolled_forward(padding, side):
    """A net of one level written out with torch.nn.functional on its weights: two 3x3 convolutions and
    ReLUs, 2x2 max pooling, the bottom's two, a 2x2 stride-2 transposed convolution (no ReLU), the skip
    (cropped by 4 pixels a border unpadded: 16 -> 8) concatenated before the up-convolution's channels,
    two 3x3 convolutions and the 1x1 convolution."""
    torch.manual_seed(0)
    model = UNet(in_chans=2, num_classes=3, width=4, depth=1, padding=padding).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # nonzero biases
    x = torch.randn(2, 2, side, side)
    skip = conv_relu2(x, model.contracting[0], padding)  # (2, 4, 12, 12) padded, (2, 4, 16, 16) unpadded
    h = conv_relu2(F.max_pool2d(skip, 2, 2), model.bottom, padding)  # (2, 8, 6, 6) or (2, 8, 4, 4)
    h = F.conv_transpose2d(h, model.up[0].weight, model.up[0].bias, stride=2)  # (2, 4, 12, 12) or (2, 4, 8, 8)
    if padding == 0:
        skip = skip[..., 4:12, 4:12]
    h = conv_relu2(torch.cat([skip, h], dim=1), model.expansive[0], padding)
    expected = F.conv2d(h, model.head.weight, model.head.bias)
    with torch.no_grad():
        got = model.forward_tile(x)
    out_side = side if padding else 4
    assert got.shape == expected.shape == (2, 3, out_side, out_side)
    assert (got - expected).abs().max() < 1e-6 and expected.std() > 0.01


def test_refuses_an_input_tile_it_cannot_take():
    """The net of Figure 1 on one tile: unpadded sides are 16k + 124 at depth 4 (556, 572, ...), 570 would
    max-pool an odd side; padded ones multiples of 2^depth; one line naming the nearest valid sides."""
    with torch.device("meta"):
        paper, tiny = UNet(**FLAVORS["u-net"]), UNet(**FLAVORS["tiny"])
    with pytest.raises(ValueError, match=r"unpadded U-Net of depth 4 cannot take an input height of 570 .* "
                                         r"nearest valid sides are 556 and 572$"):
        paper.forward_tile(torch.empty(1, 1, 570, 572, device="meta"))
    with pytest.raises(ValueError, match=r"input width of 100 .* nearest valid sides are 188 \(none is smaller\)"):
        paper.forward_tile(torch.empty(1, 1, 572, 100, device="meta"))
    with pytest.raises(ValueError, match=r"padded U-Net of depth 2 cannot take an input width of 30 \(it needs a "
                                         r"multiple of 2\^2\); the nearest valid sides are 28 and 32"):
        tiny.forward_tile(torch.empty(1, 1, 28, 30, device="meta"))
    with pytest.raises(ValueError, match="padding is 0 .* or 1, got 2"):
        UNet(padding=2)


def test_tiny_and_padded_keep_the_input_size():
    torch.manual_seed(0)
    tiny = UNet(**FLAVORS["tiny"])
    for H, W in ((28, 28), (44, 128)):  # canvases of 28 to 128 pixels, multiples of 4
        out = tiny.forward_tile(torch.randn(2, 1, H, W))
        assert out.shape == (2, 11, H, W) and torch.isfinite(out).all()
    assert tiny.margin == 0 and UNet(width=2, padding=1).output_side(64) == 64


def perturbed(**kwargs) -> UNet:
    """A small net in eval mode with every weight and bias moved off its initialisation (zero biases would
    leave the padding zero by themselves)."""
    torch.manual_seed(0)
    model = UNet(in_chans=2, num_classes=3, width=4, **kwargs).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def test_forward_scores_every_pixel_of_an_image_of_any_size():
    """forward: the padded net on the image zero-padded to whole cells of its pooling grid (42 x 57 -> 48 x 64
    at depth 3), the unpadded one on the image mirrored at its borders, which is the overlap-tile
    strategy's result in one tile (Figure 2); both at the image's size."""
    x = torch.randn(2, 2, 42, 57)
    padded, unpadded = perturbed(depth=3, padding=1), perturbed(depth=2, padding=0)
    with torch.no_grad():
        out = padded(x)
        assert out.shape == (2, 3, 42, 57)
        assert torch.equal(out, padded.forward_tile(F.pad(x, (0, 7, 0, 6)))[..., :42, :57])
        out = unpadded(x)
    assert out.shape == (2, 3, 42, 57) and out.std() > 0.01
    assert (out - overlap_tile(unpadded, x, tile=12)).abs().max() < 1e-5


@pytest.mark.parametrize("padding", [1, 0])
def test_a_padded_batch_gives_each_image_its_scores_alone(padding):
    """Images of different sizes, odd ones too, zero-padded into one batch with their mask: each gets the
    scores it has alone, unpadded and without a mask (the padded net sets its maps back to zero beyond each
    image's cells of the pooling grid; the unpadded one mirrors each image at its own borders)."""
    model = perturbed(depth=2, padding=padding)
    torch.manual_seed(1)
    images = [torch.randn(2, h, w) for h, w in ((13, 30), (30, 7), (22, 22), (1, 5))]
    batch, mask = torch.zeros(4, 2, 32, 32), torch.zeros(4, 32, 32, dtype=torch.bool)
    for i, image in enumerate(images):
        batch[i, :, :image.shape[1], :image.shape[2]], mask[i, :image.shape[1], :image.shape[2]] = image, True
    with torch.no_grad():
        together = model(batch, mask)
        for i, image in enumerate(images):
            alone = model(image[None])[0]  # within float rounding of scores up to about 3
            assert (together[i, :, :image.shape[1], :image.shape[2]] - alone).abs().max() < 1e-5 * alone.abs().max(), i
        assert (together - model(batch)).abs().max() > 0.01, "the mask changes what a smaller image gets"


def test_initialisation_is_section_3():
    """Gaussian weights of std sqrt(2/N), N the incoming nodes of one neuron: 9 * C_in for a 3x3
    convolution, C_in for a 2x2 stride-2 up-convolution (not 4 * C_out, PyTorch's fan-in of a transposed
    convolution's weight), zero biases."""
    torch.manual_seed(0)
    model = UNet(**FLAVORS["u-net"])
    for layer, N in ((model.bottom[2], 9 * 1024), (model.expansive[0][0], 9 * 1024), (model.up[0], 1024),
                     (model.up[3], 128), (model.contracting[1][0], 9 * 64), (model.head, 64)):
        assert abs(layer.weight.std().item() / math.sqrt(2 / N) - 1) < 0.05, layer
        assert abs(layer.weight.mean().item()) < 0.1 * math.sqrt(2 / N) and not layer.bias.any()


def small_unpadded(depth: int) -> UNet:
    torch.manual_seed(0)
    return UNet(in_chans=1, num_classes=3, width=4, depth=depth, padding=0).eval()


def test_mirror_reflects_about_the_border_pixels_at_any_width():
    row = torch.tensor([[[[0.0, 1.0, 2.0]]]])  # (1, 1, 1, 3)
    assert mirror(row, 0, 0, 2, 5).flatten().tolist() == [2, 1, 0, 1, 2, 1, 0, 1, 2, 1]  # past the image too
    x = torch.arange(6.0).view(1, 1, 2, 3)
    assert mirror(x, 1, 0, 0, 1).squeeze().tolist() == [[3, 4, 5, 4], [0, 1, 2, 1], [3, 4, 5, 4]]


@pytest.mark.parametrize("depth, tile, size, covered", [
    (3, 20, (37, 50), (52, 52)),  # tiles at 0, 16, 32: 20 is 4 more than a multiple of 8, so they overlap by 4
    (2, 12, (30, 13), (36, 24)),  # tiles at 0, 12, 24 and 0, 12: no overlap
])
def test_overlap_tile_is_the_net_on_the_whole_mirrored_image(depth, tile, size, covered):
    """Figure 2: the output has the input's size, and equals the unpadded net's output on the whole image
    mirrored by the margin (44 pixels at depth 3: more than the image's height, so mirrored repeatedly) and
    out to the tiles' extent, a valid size."""
    model, (H, W), (cH, cW) = small_unpadded(depth), size, covered
    x = torch.randn(2, 1, H, W)
    m = model.margin
    assert m == {3: 44, 2: 20}[depth]
    whole = mirror(x, m, m + cH - H, m, m + cW - W)  # (2, 1, cH + 2m, cW + 2m)
    with torch.no_grad():
        expected = model.forward_tile(whole)
    assert expected.shape == (2, 3, cH, cW)
    tiled = overlap_tile(model, x, tile)
    assert tiled.shape == (2, 3, H, W)
    assert (tiled - expected[..., :H, :W]).abs().max() < 1e-5


@pytest.mark.parametrize("size", [(1, 1), (5, 70), (41, 17)])
def test_overlap_tile_output_has_the_input_size(size):
    out = overlap_tile(small_unpadded(3), torch.randn(1, 1, *size), tile=28)
    assert out.shape == (1, 3, *size) and torch.isfinite(out).all()


def test_overlap_tile_refusals():
    with pytest.raises(ValueError, match="gives no 21x21 output tile .* nearest it gives: 20 and 28"):
        overlap_tile(small_unpadded(3), torch.randn(1, 1, 30, 30), tile=21)
    with pytest.raises(ValueError, match="overlap-tile is for the unpadded U-Net"):
        overlap_tile(UNet(width=2, depth=2, padding=1), torch.randn(1, 1, 30, 30), tile=12)


def two_rectangles() -> tuple[torch.Tensor, torch.Tensor]:
    """A 32x48 canvas: cell 1 (class 3) at rows 5-14, columns 3-10; cell 2 (class 7) at rows 5-14, columns
    14-22; a gap of 3 background pixels (columns 11-13) between them."""
    instances = torch.zeros(32, 48, dtype=torch.int64)
    instances[5:15, 3:11], instances[5:15, 14:23] = 1, 2
    classes = torch.zeros_like(instances)
    classes[instances == 1], classes[instances == 2] = 3, 7
    return instances, classes


def test_weight_map_separates_touching_cells():
    """Equation 2 with w0 = 10, sigma = 5: highest in the gap, where d1 + d2 = 4 at every pixel (column 12:
    2 to each cell; column 11: 1 and 3); far from both cells only w_c; inside the cells only w_c."""
    instances, classes = two_rectangles()
    w = weight_map(instances, classes, w0=10.0, sigma=5.0)
    assert w.shape == (32, 48) and w.dtype == torch.float32
    N, background = 32 * 48, 32 * 48 - 80 - 90  # cell 1: 10 x 8 pixels, cell 2: 10 x 9
    w_c = {0: N / (3 * background), 3: N / (3 * 80), 7: N / (3 * 90)}
    assert w[9, 12].item() == pytest.approx(w_c[0] + 10 * math.exp(-4 ** 2 / (2 * 5 ** 2)), rel=1e-6)
    gap = torch.zeros(32, 48, dtype=torch.bool)
    gap[5:15, 11:14] = True
    assert torch.equal(w == w.max(), gap)
    assert w[31, 47].item() == pytest.approx(w_c[0], abs=1e-6)  # d1 + d2 > 70: the border term below 1e-40
    assert torch.allclose(w[instances == 1], torch.tensor(w_c[3])) and torch.allclose(w[instances == 2], torch.tensor(w_c[7]))


def test_class_weights_balance_the_classes_and_skip_the_void():
    """w_c gives every class the same total weight, mean 1; pixels of the ignore index weigh 0 and are
    not counted; one cell alone has no border term."""
    instances, classes = two_rectangles()
    w = weight_map(instances, classes, w0=0.0)
    assert [w[classes == c].sum().item() for c in (0, 3, 7)] == pytest.approx([32 * 48 / 3] * 3)
    assert w.mean().item() == pytest.approx(1.0)
    classes[:2] = 255  # a void band along the top
    w = weight_map(instances, classes, w0=0.0, ignore_index=255)
    assert not w[:2].any() and w[2:].mean().item() == pytest.approx(1.0)
    instances[instances == 2] = 0  # one cell
    classes[classes == 7] = 0
    alone = weight_map(instances, classes, ignore_index=255)
    assert torch.allclose(alone, weight_map(instances, classes, w0=0.0, ignore_index=255))
    with pytest.raises(ValueError, match=r"two \(H, W\) maps of one size"):
        weight_map(instances, classes[:10])


def test_weights_of_a_mask_without_instances_take_its_connected_regions_as_cells():
    """A target of labels alone (segfolder's masks): each connected region of a class other than the
    background and the void is a cell, as the instances would give them."""
    instances, classes = two_rectangles()
    classes[0] = 255
    expected = weight_map(instances, classes, ignore_index=255)
    assert torch.equal(target_weights({"labels": classes}), expected)
    assert torch.equal(target_weights({"labels": classes, "instances": instances}), expected)


def training_targets(tmp_path, monkeypatch, *flags: str) -> list[dict]:
    """The targets of one training step of unet on fashion-canvas (one process, a batch of 4), as its loss
    reads them."""
    need_files("/usr/share/datasets/fashion-mnist", "apt-get install -y dataset-fashion-mnist")
    seen = []
    loss = Segmentation.loss
    monkeypatch.setattr(Segmentation, "loss", lambda self, outputs, targets: seen.append(targets) or
                        loss(self, outputs, targets))
    assert main(["--paper", "unet", "--max-steps", "1", "--batch-size", "4", "--train-fraction", "0.002",
                 "--eval-samples", "4", "--wandb", "disabled", "--out", str(tmp_path / "run"),
                 "--results-dir", str(tmp_path / "results"), *flags]) == 0
    return [t for t in seen if t["labels"].device.type != "meta"][:1]  # the training step's (not the FLOP count's
    # on the meta device, nor the evaluation's, which follow)


def test_training_targets_hold_the_weight_map_unless_switched_off(tmp_path, monkeypatch):
    """The trainer adds equation 2's weight map of every training canvas to its targets (PaperSpec.pixel_weights),
    from its items and classes, 0 on the padding; `--pixel-weights none` leaves the weights out."""
    [targets] = training_targets(tmp_path / "on", monkeypatch)
    train, _ = get_dataset("fashion-canvas").load()
    assert targets["weights"].shape == targets["labels"].shape and targets["weights"].dtype == torch.float32
    for weights, labels, instances in zip(targets["weights"], targets["labels"], targets["instances"]):
        [(h, w, canvas)] = [(h, w, train[i][1]) for i, (h, w) in enumerate(train.sizes)  # the canvas it is
                            if torch.equal(labels[:h, :w], train.maps[i]["labels"].long())
                            and torch.equal(instances[:h, :w], train.maps[i]["instances"].long())
                            and not labels[h:].ne(255).any() and not labels[:, w:].ne(255).any()]
        assert torch.equal(weights[:h, :w], target_weights(canvas))
        assert not weights[h:].any() and not weights[:, w:].any()
        assert weights.max() > 1.5, "a border term or a rare class weighs more than the mean"
    [targets] = training_targets(tmp_path / "off", monkeypatch, "--pixel-weights", "none")
    assert "weights" not in targets and set(targets) == {"labels", "instances"}


def labelled_canvas() -> torch.Tensor:
    mask = torch.zeros(1, 65, 65, dtype=torch.int64)
    mask[0, 10:30, 8:40], mask[0, 36:60, 30:58], mask[0, 2:8, 50:62] = 3, 7, 9
    return mask


def test_elastic_deformation_moves_mask_and_image_together():
    """One field warps both: an image equal to the mask, resampled by nearest neighbour, is the warped mask;
    the mask stays int64 with a subset of its labels and the fill; bilinear images follow it too."""
    torch.manual_seed(0)
    mask = labelled_canvas()
    image, target = ElasticDeformation(interpolation="nearest")(tv_tensors.Image(mask.float()), tv_tensors.Mask(mask))
    assert isinstance(target, tv_tensors.Mask) and target.dtype == torch.int64
    assert set(target.unique().tolist()) <= {0, 3, 7, 9}
    assert torch.equal(image, target.float())
    assert (target != mask).float().mean() > 0.05  # it moved
    torch.manual_seed(1)
    image, target = ElasticDeformation()(tv_tensors.Image((mask > 0).float()), tv_tensors.Mask(mask))
    assert set(target.unique().tolist()) <= {0, 3, 7, 9} and (target != mask).float().mean() > 0.05
    assert ((image > 0.5) == (target > 0)).float().mean() > 0.97


def test_elastic_field_is_the_papers():
    """The displacement at the 3x3 grid's points (corners, the borders' middles, the centre of a 65x65 image)
    is the drawn vector: std 10 pixels over many draws; between them bicubic, so smooth."""
    torch.manual_seed(0)
    deform, image = ElasticDeformation(), torch.zeros(1, 65, 65)
    fields = torch.cat([deform.make_params([image])["displacement"] for _ in range(300)]) * 65 / 2  # pixels
    at_grid = fields[:, [0, 32, 64]][:, :, [0, 32, 64]]  # (300, 3, 3, 2)
    assert at_grid.std().item() == pytest.approx(10, abs=0.3) and at_grid.mean().abs() < 0.5
    assert fields.diff(dim=1).abs().max() < 3  # neighbouring pixels move nearly alike
    with pytest.raises(ValueError, match="grid is the coarse grid's points a side, at least 2"):
        ElasticDeformation(grid=1)


def test_torchvision_alpha_sigma_in_pixels():
    """augment.py's reading of torchvision's own parametrisation: displacements alpha / 2 times uniform noise
    smoothed by sigma, std about alpha / (4 sqrt(3 pi) sigma) pixels away from the borders."""
    torch.manual_seed(0)
    for alpha, sigma in ((50.0, 5.0), (200.0, 3.0)):
        deform = v2.ElasticTransform(alpha=alpha, sigma=sigma)
        fields = torch.cat([deform.make_params([torch.zeros(1, 160, 160)])["displacement"] for _ in range(10)])
        pixels = fields[:, 40:120, 40:120, 0] * 160 / 2
        assert pixels.std().item() == pytest.approx(alpha / (4 * math.sqrt(3 * math.pi) * sigma), rel=0.05)


def test_elastic_augment_warps_a_canvas_and_its_maps_together_before_the_weight_map():
    """`--augment elastic:STD` on a segmentation data set: the image, the labels and the instances warped by one
    field (an image that is its labels stays its labels), a pixel from outside the canvas void and of no item,
    and the weight map of the warped maps; refused on a classification data set and beside a step for images of
    one size."""
    from common.data import PixelWeights
    from common.data.augment import parse, warped
    from common.data.elastic import Warped
    from common.data.collate import IGNORE_INDEX
    from papers.unet.weights import target_weights

    labels = torch.zeros(40, 48, dtype=torch.long)
    labels[8:20, 6:30], labels[22:36, 20:44] = 3, 7
    instances = (labels == 3).long() + 2 * (labels == 7).long()
    canvas = [(labels[None].float(), {"labels": labels, "instances": instances})]
    assert parse("elastic:10") == [("elastic", (10.0,))] and warped("none", canvas) is canvas
    torch.manual_seed(0)  # the image resampled by nearest neighbour, as the maps, to compare them exactly
    image, target = Warped(canvas, ElasticDeformation(interpolation="nearest"))[0]
    inside = target["labels"] != IGNORE_INDEX
    assert (~inside).any() and inside.float().mean() > 0.5  # the paper's field takes some pixels from outside
    assert torch.equal(image[0][inside].long(), target["labels"][inside])  # one field for the image and the maps
    assert torch.equal(target["instances"][~inside], torch.zeros_like(target["instances"][~inside]))
    assert torch.equal(target["instances"] == 1, target["labels"] == 3) and not torch.equal(target["labels"], labels)
    torch.manual_seed(1)
    bilinear = warped("elastic:10", canvas)[0][1]
    torch.manual_seed(1)
    weighted = PixelWeights(warped("elastic:10", canvas), target_weights)[0][1]
    assert torch.equal(weighted["labels"], bilinear["labels"]) and not torch.equal(bilinear["labels"], target["labels"])
    assert torch.equal(weighted["weights"], target_weights(bilinear))  # the weight map of the warped maps


def test_elastic_augment_is_a_segmentation_step():
    from common.config import build_parser, resolve, validate
    from common.errors import ConfigError

    def refusal(*flags):
        with pytest.raises(ConfigError) as e:
            validate(resolve(vars(build_parser().parse_args([*flags, "--wandb", "disabled"]))), world_size=1)
        return str(e.value)

    validate(resolve(vars(build_parser().parse_args(["--paper", "unet", "--augment", "elastic:10"]))), world_size=1)
    assert "a segmentation sample's image and target maps" in refusal("--paper", "lenet", "--augment", "elastic:10")
    assert "elastic:STD warps a segmentation sample of any size" in refusal("--paper", "unet", "--augment",
                                                                           "elastic:10,flip")
    assert "elastic:STD" in refusal("--paper", "unet", "--augment", "elastic")
