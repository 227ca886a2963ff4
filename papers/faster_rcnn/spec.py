"""Faster R-CNN: Ren, He, Girshick and Sun, 2015. The spec, and weight loading from torchvision."""

import torch
import torch.nn as nn

from papers import PaperSpec
from papers.faster_rcnn.model import FLAVORS, FasterRCNN


class TorchvisionBackbone(nn.Module):
    """One of our backbones as torchvision's FasterRCNN reads a backbone: `forward(images)` gives the one
    feature map, `out_channels` its channels. To assemble a torchvision FasterRCNN around our ResNet
    (or VGG) backbone, which `from_torchvision` then maps back.

    Args:
        body: a `ResNetBackbone` or `VGGBackbone`.
    """

    def __init__(self, body: nn.Module):
        super().__init__()
        self.body, self.out_channels = body, body.out_chans

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.body(images)[0]


def _vgg_blocks(features: nn.Sequential) -> tuple[tuple[str, ...], ...]:
    """The blocks (papers/vgg's names) of VGG features cut before the last max pooling, as torchvision's
    `vgg16().features[:-1]` or `torchvision.models.vgg.make_layers(cfg)` without the final "M"."""
    blocks, block = [], []
    for i, m in enumerate(features):
        if isinstance(m, nn.Conv2d):
            if (m.kernel_size, m.stride, m.padding, m.dilation, m.groups) != ((3, 3), (1, 1), (1, 1), (1, 1), 1) \
                    or m.bias is None:
                raise ValueError(f"cannot map backbone.{i} ({m}); VGG's convolutions are 3x3, stride 1, padding 1, "
                                 "with a bias")
            block.append(f"conv3-{m.out_channels}")
        elif isinstance(m, nn.MaxPool2d):
            if (m.kernel_size, m.stride, m.padding, m.ceil_mode) not in ((2, 2, 0, False), ((2, 2), (2, 2), 0, False)):
                raise ValueError(f"cannot map backbone.{i} ({m}); VGG's max pooling is 2x2 with stride 2")
            blocks.append(tuple(block))
            block = []
        elif not isinstance(m, nn.ReLU):
            raise ValueError(f"cannot map backbone.{i} ({type(m).__name__}); a VGG backbone has 3x3 convolutions, "
                             "ReLUs and max poolings (no batch norm)")
    if not block:
        raise ValueError("cannot map VGG features that end in a max pooling; Faster R-CNN reads the last "
                         "convolution (features[:-1])")
    return (*blocks, tuple(block))


def from_torchvision(tv_model: nn.Module) -> FasterRCNN:
    """Our Faster R-CNN holding the weights and settings of a torchvision `FasterRCNN` with one feature map.

    Labels: torchvision counts background as class 0 and the objects from 1; ours are the objects from 0
    and background last, so our label = theirs - 1, and the classifier's rows are rolled accordingly.
    torchvision also regresses a box for background, which it never uses; the paper has K box
    regressors, so those 4 rows are dropped. Detections agree where torchvision's transform leaves the
    images as they are: no resizing (min_size and max_size equal to the images' short and long sides),
    sides that its padding to size_divisible does not change, and the same normalisation (its
    image_mean and image_std become ours). Our map's stride is the backbone's; torchvision infers it
    from the image and map sizes, which agree for such images.

    Args:
        tv_model: a `torchvision.models.detection.FasterRCNN` whose backbone is VGG features without the
            last max pooling (an nn.Sequential of 3x3 convolutions, ReLUs and 2x2 max poolings) or our
            backbone in a `TorchvisionBackbone`; one anchor level; an RPNHead with one convolution; a
            MultiScaleRoIAlign on the one map; a TwoMLPHead and a FastRCNNPredictor. Anything else is
            a ValueError.
    """
    from torchvision.models.detection import FasterRCNN as TorchvisionFasterRCNN
    from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
    from torchvision.models.detection.rpn import RPNHead
    from torchvision.ops import MultiScaleRoIAlign

    if not isinstance(tv_model, TorchvisionFasterRCNN):
        raise ValueError(f"expected a torchvision FasterRCNN, got {type(tv_model).__name__}")
    rpn, heads, transform = tv_model.rpn, tv_model.roi_heads, tv_model.transform
    if heads.has_mask() or heads.has_keypoint():
        raise ValueError("cannot map mask or keypoint heads; Faster R-CNN detects boxes")
    backbone = tv_model.backbone
    if isinstance(backbone, TorchvisionBackbone):
        backbone_config, backbone_state = backbone.body.config, backbone.body.state_dict()
    elif isinstance(backbone, nn.Sequential):
        backbone_config = dict(kind="vgg", blocks=_vgg_blocks(backbone))
        backbone_state = None  # mapped below, by position
    else:
        raise ValueError(f"cannot map a {type(backbone).__name__} backbone; use VGG features (nn.Sequential) "
                         "or ours in a TorchvisionBackbone (one feature map, no FPN)")
    generator = rpn.anchor_generator
    if len(generator.sizes) != 1:
        raise ValueError(f"cannot map {len(generator.sizes)} anchor levels; the paper's RPN reads one map")
    if not isinstance(rpn.head, RPNHead) or len(rpn.head.conv) != 1 or len(rpn.head.conv[0]) != 2:
        raise ValueError("cannot map an RPN head other than torchvision's RPNHead with one 3x3 convolution")
    if tuple(rpn.box_coder.weights) != (1.0, 1.0, 1.0, 1.0) or rpn.score_thresh > 0:
        raise ValueError("cannot map an RPN with box-coding weights or a score threshold; Eq. 2 has neither")
    pool, box_head, predictor = heads.box_roi_pool, heads.box_head, heads.box_predictor
    if not isinstance(pool, MultiScaleRoIAlign) or len(pool.featmap_names) != 1:
        raise ValueError("cannot map RoI pooling other than a MultiScaleRoIAlign on one feature map")
    if len(set(pool.output_size)) != 1:
        raise ValueError(f"cannot map a non-square RoI grid {pool.output_size}")
    if not isinstance(box_head, TwoMLPHead) or not isinstance(predictor, FastRCNNPredictor):
        raise ValueError("cannot map a box head other than TwoMLPHead and FastRCNNPredictor (fc6, fc7, two siblings)")

    kwargs = dict(
        backbone=backbone_config,
        num_classes=predictor.cls_score.out_features - 1,
        anchor_sizes=tuple(generator.sizes[0]),
        aspect_ratios=tuple(generator.aspect_ratios[0]),
        rpn_pre_nms_top_n=(rpn._pre_nms_top_n["training"], rpn._pre_nms_top_n["testing"]),
        rpn_post_nms_top_n=(rpn._post_nms_top_n["training"], rpn._post_nms_top_n["testing"]),
        rpn_nms_thresh=rpn.nms_thresh,
        rpn_min_size=rpn.min_size,
        rpn_batch_size=rpn.fg_bg_sampler.batch_size_per_image,
        rpn_positive_fraction=rpn.fg_bg_sampler.positive_fraction,
        rpn_iou_thresholds=(rpn.proposal_matcher.low_threshold, rpn.proposal_matcher.high_threshold),
        roi="align",
        roi_size=pool.output_size[0],
        sampling_ratio=pool.sampling_ratio,
        fc_width=box_head.fc7.out_features,
        dropout=0.0,
        roi_batch_size=heads.fg_bg_sampler.batch_size_per_image,
        roi_positive_fraction=heads.fg_bg_sampler.positive_fraction,
        roi_fg_iou=heads.proposal_matcher.high_threshold,
        box_weights=tuple(heads.box_coder.weights),
        score_thresh=heads.score_thresh,
        nms_thresh=heads.nms_thresh,
        detections_per_img=heads.detections_per_img,
        image_mean=tuple(transform.image_mean),
        image_std=tuple(transform.image_std),
        in_chans=len(transform.image_mean),
    )
    model = FasterRCNN(**kwargs)

    src = {k: v.detach() for k, v in tv_model.state_dict().items()}
    state = {}
    if backbone_state is not None:
        state |= {f"backbone.{k}": v for k, v in backbone_state.items()}
    else:  # convolutions in the same order
        ours = [n for n, m in model.backbone.named_modules() if isinstance(m, nn.Conv2d)]
        theirs = [n for n, m in backbone.named_modules() if isinstance(m, nn.Conv2d)]
        state |= {f"backbone.{a}.{p}": src[f"backbone.{b}.{p}"]
                  for a, b in zip(ours, theirs, strict=True) for p in ("weight", "bias")}
    rpn_conv = "rpn.head.conv.0.0"
    for ours, theirs in (("rpn.conv", rpn_conv), ("rpn.cls", "rpn.head.cls_logits"), ("rpn.reg", "rpn.head.bbox_pred"),
                         ("head.fc6", "roi_heads.box_head.fc6"), ("head.fc7", "roi_heads.box_head.fc7")):
        state |= {f"{ours}.{p}": src[f"{theirs}.{p}"] for p in ("weight", "bias")}
    for p in ("weight", "bias"):
        cls, box = src[f"roi_heads.box_predictor.cls_score.{p}"], src[f"roi_heads.box_predictor.bbox_pred.{p}"]
        state[f"head.cls_score.{p}"] = torch.cat([cls[1:], cls[:1]])  # background from first to last
        state[f"head.bbox_pred.{p}"] = box[4:]  # the background's box, never used, dropped
    dst = model.state_dict()
    unmatched = sorted(set(dst) - set(state))
    wrong_shape = sorted(k for k in dst if k in state and dst[k].shape != state[k].shape)
    if unmatched or wrong_shape:
        raise ValueError(f"this torchvision FasterRCNN does not map onto ours: tensors of ours not found "
                         f"{unmatched[:3]}, of another shape {wrong_shape[:3]}")
    with torch.no_grad():
        model.load_state_dict({k: v.clone() for k, v in state.items()})  # strict
    return model


PAPER = PaperSpec(
    name="faster_rcnn",
    family="cnn",
    title="Faster R-CNN: Towards Real-Time Object Detection with Region Proposal Networks",
    authors="Ren, He, Girshick, Sun",
    year=2015,
    url="https://arxiv.org/abs/1506.01497",
    model=FasterRCNN,
    flavors=FLAVORS,
    inputs="image",
    task="detection",
    data_kwargs=("num_classes",),
    padded_batches=True,
    # tiny on digits-detect: 49 canvases/s with ddp (42 with fsdp) on 2 processes of this 2-core CPU (the curated
    # default run's samples_per_s), 313 steps of 16 canvases an epoch
    defaults=dict(dataset="digits-detect", epochs=5, batch_size=16, lr=1e-3, weight_decay=1e-4, warmup_steps=100,
                  clip_grad=5.0),
    reference="torchvision.models.detection.FasterRCNN with one feature map (from_torchvision)",
    shard_blocks="backbone.blocks",
    # Section 4.1 (PASCAL VOC): SGD with momentum 0.9 and weight decay 5e-4, one image per mini-batch,
    # lr 1e-3 for 60k mini-batches then 1e-4 for 20k; approximate joint training as py-faster-rcnn's
    # end-to-end scripts (the paper's main tables use 4-step alternating training). Images rescaled to a
    # short side of 600 px and flipped horizontally: not here (the data set fixes the sizes, and a flip must
    # move the boxes too).
    recipe=dict(optimizer="sgd", lr=1e-3, momentum=0.9, weight_decay=5e-4, batch_size=1, max_steps=80000,
                schedule="step", milestones="0.75", gamma=0.1, warmup_steps=0, clip_grad=0.0,
                label_smoothing=0.0, augment="none"),
)
