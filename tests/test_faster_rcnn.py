"""Faster R-CNN against torchvision's FasterRCNN, its training losses, and padded batches of mixed sizes."""

import pytest
import torch
import torch.nn as nn
import torchvision
from torchvision.models.detection import FasterRCNN as TorchvisionFasterRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
from torchvision.ops import MultiScaleRoIAlign

from papers.faster_rcnn import PAPER, TorchvisionBackbone, from_torchvision
from papers.faster_rcnn.boxes import anchor_shapes, decode, encode, grid_anchors
from papers.faster_rcnn.loss import label_anchors
from papers.faster_rcnn.model import FasterRCNN, ResNetBackbone
from tests.conftest import pad_batch, randomize_batch_norm

# a small VGG: four 2x2 poolings, then the last convolutions without pooling (stride 16, as conv5_3)
SMALL_VGG_CFG = [16, "M", 32, "M", 32, 32, "M", 64, 64, "M", 64, 64]
SMALL_VGG = dict(kind="vgg", blocks=(("conv3-16",), ("conv3-32",), ("conv3-32",) * 2, ("conv3-64",) * 2,
                                     ("conv3-64",) * 2))
FAST = dict(rpn_pre_nms_top_n=(600, 300), rpn_post_nms_top_n=(100, 50), roi_batch_size=32)  # fewer boxes: quick


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def spread(model: nn.Module) -> nn.Module:
    """Random batch-norm statistics and larger random RPN and predictor weights, in eval mode: the scores
    spread (not all near 1 / (K + 1)), so that a weight mapped to the wrong place, or a tie broken
    differently, changes the detections."""
    randomize_batch_norm(model)
    with torch.no_grad():
        for name, m in model.named_modules():
            if isinstance(m, nn.Conv2d) and "rpn" in name:
                m.weight.normal_(0, 0.1)
                m.bias.normal_(0, 0.1)
            elif isinstance(m, nn.Linear) and any(k in name for k in ("predictor", "cls_score", "bbox_pred")):
                m.weight.normal_(0, 0.3)
                m.bias.zero_()
    return model.eval()


def torchvision_faster_rcnn(backbone: nn.Module, sizes, fc_width: int, num_classes: int, H: int, W: int):
    """torchvision's FasterRCNN around a backbone of one map, its transform a no-op on H x W images."""
    return TorchvisionFasterRCNN(
        backbone, num_classes=None, min_size=H, max_size=W,
        rpn_anchor_generator=AnchorGenerator((sizes,), ((0.5, 1.0, 2.0),)),
        box_roi_pool=MultiScaleRoIAlign(["0"], output_size=7, sampling_ratio=2),
        box_head=TwoMLPHead(backbone.out_channels * 7 * 7, fc_width),
        box_predictor=FastRCNNPredictor(fc_width, num_classes + 1),
        rpn_pre_nms_top_n_test=500, rpn_post_nms_top_n_test=100, box_nms_thresh=0.3, box_score_thresh=0.05)


def assert_same_detections(ours: list[dict], theirs: list[dict], label_offset: int = 0, atol: float = 1e-4):
    for a, b in zip(ours, theirs, strict=True):
        assert a["boxes"].shape == b["boxes"].shape, (a["boxes"].shape, b["boxes"].shape)
        torch.testing.assert_close(a["boxes"], b["boxes"], rtol=0, atol=atol)
        torch.testing.assert_close(a["scores"], b["scores"], rtol=0, atol=atol)
        assert torch.equal(a["labels"], b["labels"] - label_offset)


def tiny_backbone() -> nn.Module:
    return TorchvisionBackbone(ResNetBackbone(**{k: v for k, v in PAPER.flavors["tiny"]["backbone"].items()
                                                 if k != "kind"}))


def small_vgg_backbone() -> nn.Module:
    features = torchvision.models.vgg.make_layers(SMALL_VGG_CFG)  # conv, ReLU, ..., max pooling: a torchvision VGG
    features.out_channels = 64
    return features


@pytest.mark.parametrize("make_backbone, sizes, H, W", [(tiny_backbone, (8, 16, 32), 64, 96),
                                                          (small_vgg_backbone, (32, 64, 128), 96, 128)],
                         ids=["tiny-resnet", "small-vgg"])
def test_detections_equal_torchvision(make_backbone, sizes, H, W):
    """`from_torchvision` gives our model torchvision's weights and settings; on the same images both
    detect the same boxes, scores and labels (ours = theirs - 1: background is their class 0)."""
    torch.manual_seed(0)
    theirs = spread(torchvision_faster_rcnn(make_backbone(), sizes, fc_width=64, num_classes=5, H=H, W=W))
    ours = from_torchvision(theirs).eval()
    images = torch.rand(2, 3, H, W)
    with torch.no_grad():
        expected, got = theirs(list(images)), ours(images)
        transformed, _ = theirs.transform(list(images))
    # torchvision's transform only normalised, as ours does: no resizing, no padding, so its boxes are
    # in the images' own pixels as ours are
    assert transformed.image_sizes == [(H, W)] * 2 and transformed.tensors.shape == images.shape
    torch.testing.assert_close(transformed.tensors, (images - ours.image_mean) / ours.image_std)
    assert_same_detections(got, expected, label_offset=1)
    assert all(len(d["boxes"]) > 20 and len(d["labels"].unique()) > 1 for d in got)  # enough to tell
    assert all((d["boxes"][:, 2:] <= torch.tensor([W, H])).all() and (d["boxes"] >= 0).all() for d in got)


def test_from_torchvision_maps_background_and_drops_its_box():
    torch.manual_seed(0)
    theirs = spread(torchvision_faster_rcnn(tiny_backbone(), (8, 16, 32), fc_width=32, num_classes=3, H=64, W=64))
    ours = from_torchvision(theirs)
    W_cls, W_box = theirs.roi_heads.box_predictor.cls_score.weight, theirs.roi_heads.box_predictor.bbox_pred.weight
    assert torch.equal(ours.head.cls_score.weight[-1], W_cls[0])  # background: their first, our last
    assert torch.equal(ours.head.cls_score.weight[:3], W_cls[1:])
    assert torch.equal(ours.head.bbox_pred.weight, W_box[4:])
    assert count(theirs) - count(ours) == 4 * 32 + 4
    assert ours.rpn.pre_nms_top_n == (2000, 500) and ours.nms_thresh == 0.3 and ours.head.roi == "align"


def test_from_torchvision_refuses_what_the_paper_has_not():
    with torch.device("meta"):
        fpn = torchvision.models.detection.fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None)
    with pytest.raises(ValueError, match="cannot map"):
        from_torchvision(fpn)
    with torch.device("meta"):
        features = torchvision.models.vgg.make_layers(SMALL_VGG_CFG + ["M"])
        features.out_channels = 64
        pooled = torchvision_faster_rcnn(features, (32, 64, 128), 64, 5, 96, 128)
    with pytest.raises(ValueError, match="last convolution"):
        from_torchvision(pooled)


def test_vgg16_parameter_count_against_torchvision():
    """The paper's VGG-16 model (20 VOC classes) against torchvision's FasterRCNN assembled the same way
    (VGG-16's features without pool5, 9 anchors, fc6/fc7 of 4096): the same but for torchvision's box
    regressor for background (4 x 4096 + 4), which the paper has not. The paper gives no count."""
    with torch.device("meta"):
        ours = PAPER.build("VGG-16")
        backbone = torchvision.models.vgg16(weights=None).features[:-1]
        backbone.out_channels = 512
        theirs = TorchvisionFasterRCNN(
            backbone, rpn_anchor_generator=AnchorGenerator(((128, 256, 512),), ((0.5, 1.0, 2.0),)),
            box_roi_pool=MultiScaleRoIAlign(["0"], 7, 2), box_head=TwoMLPHead(512 * 7 * 7, 4096),
            box_predictor=FastRCNNPredictor(4096, 21))
    assert count(ours) == count(theirs) - (4 * 4096 + 4) == 137_057_234
    assert count(ours.backbone) == 14_714_688  # VGG-16's 13 convolutions
    assert count(ours.rpn) == 2_382_893 and count(ours.head) == 119_959_653
    assert ours.backbone.stride == 16 and ours.head.roi == "pool"


def test_tiny_flavor_size_and_stride():
    model = PAPER.build("tiny")
    assert 200_000 < count(model) < 2_000_000, count(model)
    assert model.backbone.stride == 8 and model.num_classes == 10
    with torch.no_grad():
        features, _ = model.backbone(torch.zeros(1, 3, 64, 96))
    assert features.shape == (1, 64, 8, 12)


def test_anchors_are_three_scales_and_three_ratios():
    shapes = anchor_shapes((128, 256, 512), (0.5, 1.0, 2.0))  # (9, 4), ratio-major
    w, h = shapes[:, 2] - shapes[:, 0], shapes[:, 3] - shapes[:, 1]
    torch.testing.assert_close(w * h, torch.tensor([128.0, 256, 512] * 3) ** 2, rtol=0.01, atol=0)
    torch.testing.assert_close(h / w, torch.tensor([0.5] * 3 + [1.0] * 3 + [2.0] * 3), rtol=0.02, atol=0)
    assert torch.equal(shapes, AnchorGenerator().cell_anchors[0])  # torchvision's, same order and rounding
    anchors = grid_anchors(shapes, 2, 3, 16)  # (y, x, anchor)
    assert anchors.shape == (2 * 3 * 9, 4)
    assert torch.equal(anchors[9 * 4], shapes[0] + torch.tensor([16.0, 16, 16, 16]))  # y = 1, x = 1


def test_box_coding_inverts():
    boxes = torch.tensor([[10.0, 20, 50, 40], [0, 0, 8, 32]])
    anchors = torch.tensor([[12.0, 18, 44, 50], [2, 2, 10, 10]])
    for weights in [(1.0, 1.0, 1.0, 1.0), (10.0, 10.0, 5.0, 5.0)]:
        torch.testing.assert_close(decode(encode(boxes, anchors, weights), anchors, weights), boxes)


def test_anchor_labels_follow_section_3_1_2():
    anchors = torch.tensor([[0.0, 0, 20, 20], [0, 0, 10, 10], [50, 50, 60, 60], [-5, 0, 15, 20], [30, 30, 40, 40]])
    inside = torch.tensor([True, True, True, False, True])
    gt = torch.tensor([[0.0, 0, 19, 20], [30, 30, 48, 48]])
    labels, matched = label_anchors(anchors, inside, gt)
    # 0: IoU 0.95 (>= 0.7); 1: 0.26 (< 0.3); 2: no overlap; 3: crosses the border, ignored;
    # 4: IoU 0.31 only, but the best anchor of the second box
    assert labels.tolist() == [1.0, 0.0, 0.0, -1.0, 1.0]
    assert matched[0] == 0 and matched[4] == 1
    labels, _ = label_anchors(anchors, inside, gt[:0])  # no boxes: every anchor inside is negative
    assert labels.tolist() == [0.0, 0.0, 0.0, -1.0, 0.0]


def scene(h: int, w: int, boxes: list) -> torch.Tensor:
    """A black image with grey squares where the boxes are."""
    image = torch.zeros(3, h, w)
    for x1, y1, x2, y2 in boxes:
        image[:, y1:y2, x1:x2] = 0.8
    return image


def synthetic_batch():
    boxes = [[(8, 8, 24, 24), (40, 20, 48, 36)], [(30, 30, 62, 62)]]
    images, mask = pad_batch([scene(64, 80, boxes[0]), scene(72, 64, boxes[1])])
    targets = [{"boxes": torch.tensor(b, dtype=torch.float), "labels": torch.tensor(c)}
               for b, c in zip(boxes, [[1, 4], [7]], strict=True)]
    return images, mask, targets


def test_training_returns_the_four_terms_and_the_loss_falls():
    torch.manual_seed(0)
    model = PAPER.build("tiny", **FAST).train()
    images, mask, targets = synthetic_batch()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0)
    history = []
    for _ in range(20):
        losses = model(images, mask, targets)
        assert set(losses) == {"rpn_cls", "rpn_reg", "fast_rcnn_cls", "fast_rcnn_loc"}
        assert all(v.dim() == 0 and torch.isfinite(v) for v in losses.values())
        loss = sum(losses.values())
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(loss.item())
    first, last = sum(history[:3]) / 3, sum(history[-3:]) / 3
    assert last < 0.5 * first, history


def test_an_image_without_boxes_trains_on_background_only():
    torch.manual_seed(0)
    model = PAPER.build("tiny", **FAST).train()
    images, mask, targets = synthetic_batch()
    empty = [{"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.long)}]
    losses = model(images[1:], mask[1:], empty)
    assert losses["rpn_reg"] == 0 and losses["fast_rcnn_loc"] == 0  # nothing to regress to
    assert losses["rpn_cls"] > 0 and losses["fast_rcnn_cls"] > 0  # every sample is background
    sum(losses.values()).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    losses = model(images, mask, [targets[0], empty[0]])  # beside an image with boxes
    assert all(torch.isfinite(v) for v in losses.values()) and losses["fast_rcnn_loc"] > 0


@pytest.mark.parametrize("kwargs", [dict(PAPER.flavors["tiny"], **FAST),
                                    dict(backbone=SMALL_VGG, num_classes=5, anchor_sizes=(32, 64, 128), fc_width=64,
                                         **FAST)], ids=["tiny", "small-vgg"])
def test_a_padded_batch_gives_each_image_its_own_detections(kwargs):
    """An image alone and the same image padded beside a larger one: the same detections. Odd sizes, so
    that pooling and strided convolutions meet a last row and column of their own."""
    torch.manual_seed(0)
    model = spread(FasterRCNN(**kwargs))
    small, large = torch.rand(3, 61, 83), torch.rand(3, 100, 118)
    images, mask = pad_batch([small, large])
    with torch.no_grad():
        alone, together, large_alone = model(small[None]), model(images, mask), model(large[None])
    assert len(alone[0]["boxes"]) > 10
    assert_same_detections(alone, together[:1])
    assert (together[0]["boxes"][:, 2] <= 83).all() and (together[0]["boxes"][:, 3] <= 61).all()  # its own size
    assert_same_detections(large_alone, together[1:])


def test_eval_ignores_targets_and_spec():
    model = PAPER.build("tiny", **FAST).eval()
    images, mask, targets = synthetic_batch()
    with torch.no_grad():
        out = model(images, mask, targets)
    assert isinstance(out, list) and len(out) == 2
    assert all(d["labels"].dtype == torch.int64 and ((d["labels"] >= 0) & (d["labels"] < 10)).all() for d in out)
    assert PAPER.task == "detection" and PAPER.padded_batches and PAPER.data_kwargs == ("num_classes",)
    with torch.device("meta"):
        blocks = PAPER.build("tiny").get_submodule(PAPER.shard_blocks)
    assert isinstance(blocks, nn.ModuleList) and len(blocks) == 2
