"""Faster R-CNN: Towards Real-Time Object Detection with Region Proposal Networks.

Ren, He, Girshick, Sun, 2015. https://arxiv.org/abs/1506.01497

Fast R-CNN classifies and refines region proposals on a shared convolutional feature map, but the
proposals came from Selective Search, slow and outside the network. A Region Proposal Network slides a
small network over the same feature map and, at every position, scores k reference boxes ("anchors" of
3 scales x 3 aspect ratios) as object or not and regresses each to a box: proposals become nearly free
(10 ms), and one network, trained end to end, proposes and detects.

Pipeline (Fig. 2): image -> backbone (VGG-16 to conv5_3, stride 16) -> RPN (3x3 conv, sibling 1x1
cls and reg convs) -> proposals (decode, clip, NMS 0.7, top N) -> RoI pooling to 7x7 -> two fully
connected layers -> (K + 1)-way softmax and per-class box regression -> per-class NMS 0.3.

Padded batches: images are zero-padded at the bottom and right, and mask (B, H, W) marks their pixels.
The backbone keeps the padding at zero (as each image's own zero padding is), so every valid feature is
what the image gives alone; the RPN then reads each image's own part of the map (its anchors, its
border), and RoI pooling reads it alone, so no image's detections depend on the others.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange
from torchvision.ops import batched_nms, clip_boxes_to_image, nms, remove_small_boxes, roi_align, roi_pool

from common.layers import masked
from papers.faster_rcnn.boxes import anchor_shapes, decode, grid_anchors
from papers.faster_rcnn.loss import fast_rcnn_loss, label_anchors, rpn_loss, sample_rois
from papers.resnet.model import ResNet
from papers.vgg.model import ConvBlock, D

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def valid_sizes(mask: torch.Tensor | None, batch: int, height: int, width: int) -> list[tuple[int, int]]:
    """(h_i, w_i) of every image of a padded batch: the rows and columns of its valid top-left rectangle."""
    if mask is None:
        return [(height, width)] * batch
    return list(zip(mask.any(2).sum(1).tolist(), mask.any(1).sum(1).tolist()))


class VGGBackbone(nn.Module):
    """The 13 shareable convolutional layers of VGG-16 (conv1_1 ... conv5_3, papers/vgg), without pool5:
    one map of stride 16 with 512 channels (Section 3.1: "the last shared convolutional layer").

    Args:
        blocks: the layers of each block, as papers/vgg's Table 1 names them; each block but the last
            ends in a 2x2/2 max pooling.
        in_chans: input channels.
    """

    def __init__(self, blocks: tuple[tuple[str, ...], ...], in_chans: int = 3):
        super().__init__()
        layers, chans = [], in_chans
        for block in blocks:
            layers.append(ConvBlock(chans, block))
            chans = layers[-1].out_chans
        del layers[-1][-1]  # the RPN and RoI pooling read conv5_3, before pool5
        self.blocks = nn.ModuleList(layers)
        self.out_chans, self.stride = chans, 2 ** (len(blocks) - 1)
        self.config = dict(kind="vgg", blocks=tuple(tuple(b) for b in blocks))
        for m in self.modules():  # Glorot & Bengio, as VGG's paper (the paper starts from ImageNet weights)
            if isinstance(m, nn.Conv2d):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, C, H, W), zero outside mask (B, H, W); the map (B, 512, H/16, W/16) and its valid cells."""
        for block in self.blocks:
            for layer in block:
                x = layer(x)
                if isinstance(layer, nn.MaxPool2d) and mask is not None:
                    mask = mask[:, 1::2, 1::2]  # floor(h / 2): the pool drops an odd last row alone
                if isinstance(layer, (nn.ReLU, nn.MaxPool2d)):
                    x = masked(x, mask)  # padding back to zero, as the next convolution's own padding
        return x, mask


class ResNetBackbone(nn.Module):
    """A ResNet's stem and stages (papers/resnet) without pooling and classifier: one map of stride
    2^(stages - 1) with the CIFAR stem (4 for three stages), 4 times more with the ImageNet stem.
    Batch norm counts only the valid pixels of a padded batch (common.layers.MaskedBatchNorm2d).

    Args: those of papers.resnet.model.ResNet, but the classifier's.
    """

    def __init__(self, block: str = "basic", layers: tuple[int, ...] = (1, 1, 1),
                 widths: tuple[int, ...] = (16, 32, 64), stem: str = "cifar", shortcut: str = "A",
                 stride_on: str = "1x1", in_chans: int = 3):
        super().__init__()
        net = ResNet(block, layers, widths, stem, shortcut, stride_on, num_classes=1, in_chans=in_chans)
        self.stem, self.blocks = net.stem, net.stages
        self.out_chans = net.num_features
        self.stride = (4 if stem == "imagenet" else 1) * 2 ** (len(layers) - 1)
        self.config = dict(kind="resnet", block=block, layers=tuple(layers), widths=tuple(widths), stem=stem,
                           shortcut=shortcut, stride_on=stride_on)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        x, mask = self.stem(x, mask)  # (B, widths[0], H, W) with the CIFAR stem
        for stage in self.blocks:
            x, mask = stage(x, mask)  # each stage after the first halves H and W
        return x, mask  # (B, C, H/stride, W/stride), (B, H/stride, W/stride)


BACKBONES = {"vgg": VGGBackbone, "resnet": ResNetBackbone}


class RegionProposalNetwork(nn.Module):
    """Section 3.1: an n x n (n = 3) convolution slides over the shared map, each position's window mapped
    to a feature of the map's width (512-d for VGG) and a ReLU, then two sibling 1x1 convolutions: cls
    (k objectness scores) and reg (4k offsets t of Eq. 2) for the k anchors of that position.

    The paper's cls layer is a two-class softmax (2k scores); its footnote names the alternative used
    here, a logistic regression with k scores (the softmax of (a, b) is the sigmoid of a - b).

    Args:
        in_chans: channels of the shared map.
        sizes, aspect_ratios: the anchors (128, 256, 512 pixels; 1:2, 1:1, 2:1: k = 9).
        stride: the map's stride in pixels (16 for conv5_3).
        pre_nms_top_n, post_nms_top_n: (training, testing) proposals kept before and after NMS
            (py-faster-rcnn: 12000 and 2000 in training, 6000 and 300 at test, Section 3.3 and 4.1).
        nms_thresh: the NMS IoU threshold of proposals (0.7).
        min_size: proposals with a side below it (pixels) are dropped.
    """

    def __init__(self, in_chans: int, sizes: tuple[float, ...], aspect_ratios: tuple[float, ...], stride: int,
                 pre_nms_top_n: tuple[int, int] = (12000, 6000), post_nms_top_n: tuple[int, int] = (2000, 300),
                 nms_thresh: float = 0.7, min_size: float = 1e-3):
        super().__init__()
        self.sizes, self.aspect_ratios, self.stride = tuple(sizes), tuple(aspect_ratios), stride
        self.pre_nms_top_n, self.post_nms_top_n = tuple(pre_nms_top_n), tuple(post_nms_top_n)
        self.nms_thresh, self.min_size = nms_thresh, min_size
        k = len(sizes) * len(aspect_ratios)
        self.conv = nn.Conv2d(in_chans, in_chans, kernel_size=3, padding=1)  # the sliding window
        self.cls = nn.Conv2d(in_chans, k, kernel_size=1)  # objectness of each anchor
        self.reg = nn.Conv2d(in_chans, 4 * k, kernel_size=1)  # t_x, t_y, t_w, t_h of each anchor
        for conv in (self.conv, self.cls, self.reg):  # "zero-mean Gaussian with standard deviation 0.01"
            nn.init.normal_(conv.weight, std=0.01)
            nn.init.zeros_(conv.bias)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.relu(self.conv(x))  # (B, C, h, w)
        return self.cls(x), self.reg(x)  # (B, k, h, w), (B, 4k, h, w)

    def anchors(self, height: int, width: int, device: torch.device) -> torch.Tensor:
        """The anchors of an (height, width) map, (height * width * k, 4), in the order of `flatten`."""
        return grid_anchors(anchor_shapes(self.sizes, self.aspect_ratios, device), height, width, self.stride)

    @staticmethod
    def flatten(logits: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One image's outputs (k, h, w) and (4k, h, w) as one row per anchor: (h w k,) and (h w k, 4)."""
        return rearrange(logits, "k h w -> (h w k)"), rearrange(t, "(k c) h w -> (h w k) c", c=4)

    def propose(self, logits: torch.Tensor, t: torch.Tensor, anchors: torch.Tensor, image_size: tuple[int, int]
                ) -> torch.Tensor:
        """One image's proposals (Section 3.3): the top pre-NMS N anchors by objectness, moved by their
        offsets (Eq. 2), clipped to the image, the tiny ones dropped, NMS at IoU 0.7, the top post-NMS N.

        Args:
            logits: (N,) objectness; t: (N, 4) offsets; anchors: (N, 4); image_size: (h, w).

        Returns:
            (n, 4) proposals, best first; no gradient flows through them (approximate joint training).
        """
        phase = 0 if self.training else 1
        pre, post = self.pre_nms_top_n[phase], self.post_nms_top_n[phase]
        top = logits.detach().topk(min(pre, len(logits))).indices  # (pre,)
        boxes = decode(t.detach()[top], anchors[top], (1.0, 1.0, 1.0, 1.0))  # (pre, 4)
        scores = logits.detach()[top].sigmoid()
        boxes = clip_boxes_to_image(boxes, image_size)
        keep = remove_small_boxes(boxes, self.min_size)
        boxes, scores = boxes[keep], scores[keep]
        keep = nms(boxes, scores, self.nms_thresh)[:post]
        return boxes[keep]  # (n, 4)


class FastRCNNHead(nn.Module):
    """The detector (Fast R-CNN, Section 2): RoI pooling of each proposal on the shared map to a fixed
    7 x 7 grid, two fully connected layers (fc6, fc7: 4096 for VGG-16), then two sibling layers: a
    softmax over K + 1 classes (background the last one here) and per-class box offsets t^k, k = 1..K.

    Args:
        in_chans: channels of the shared map; stride: its stride in pixels.
        num_classes: K, the object classes.
        roi: "pool" (the paper's RoI max pooling, torchvision.ops.roi_pool) or "align" (RoIAlign with
            bilinear sampling, Mask R-CNN's, which torchvision's FasterRCNN uses: MultiScaleRoIAlign).
        roi_size: the pooled grid's side (7).
        sampling_ratio: RoIAlign's sampling points per bin side (torchvision: 2).
        fc_width: fc6's and fc7's units.
        dropout: after fc6 and fc7 in training (0.5 in VGG-16's fully connected layers).
    """

    def __init__(self, in_chans: int, stride: int, num_classes: int, roi: str = "pool", roi_size: int = 7,
                 sampling_ratio: int = 2, fc_width: int = 4096, dropout: float = 0.5):
        super().__init__()
        if roi not in ("pool", "align"):
            raise ValueError(f"unknown roi '{roi}'; choose from: pool, align")
        self.roi, self.roi_size, self.sampling_ratio, self.stride = roi, roi_size, sampling_ratio, stride
        self.fc6 = nn.Linear(in_chans * roi_size**2, fc_width)
        self.fc7 = nn.Linear(fc_width, fc_width)
        self.cls_score = nn.Linear(fc_width, num_classes + 1)  # p = (p_0 ... p_K), background last
        self.bbox_pred = nn.Linear(fc_width, 4 * num_classes)  # t^k for each object class
        self.dropout = nn.Dropout(dropout)
        nn.init.normal_(self.cls_score.weight, std=0.01)  # as py-faster-rcnn's train.prototxt
        nn.init.normal_(self.bbox_pred.weight, std=0.001)
        nn.init.zeros_(self.cls_score.bias)
        nn.init.zeros_(self.bbox_pred.bias)

    def pool(self, features: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        """RoI pooling of one image's rois (n, 4), in pixels, on its own map (1, C, h, w): (n, C, 7, 7)."""
        size, scale = (self.roi_size, self.roi_size), 1.0 / self.stride
        if self.roi == "pool":
            return roi_pool(features, [rois], size, scale)  # max over each of the 7 x 7 sub-windows
        return roi_align(features, [rois], size, scale, self.sampling_ratio)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.flatten(1)  # (R, C * 7 * 7)
        x = self.dropout(F.relu(self.fc6(x)))  # (R, fc_width)
        x = self.dropout(F.relu(self.fc7(x)))  # (R, fc_width)
        return self.cls_score(x), rearrange(self.bbox_pred(x), "r (k c) -> r k c", c=4)  # (R, K + 1), (R, K, 4)


class FasterRCNN(nn.Module):
    """Faster R-CNN: a backbone giving one shared feature map, the RPN on it, and the Fast R-CNN detector
    on the RPN's proposals (Fig. 2).

    Args:
        backbone: {"kind": "vgg", "blocks": ...} (`VGGBackbone`) or {"kind": "resnet", ...} (`ResNetBackbone`).
        num_classes: K, the object classes (20 for PASCAL VOC); the model adds background.
        anchor_sizes, aspect_ratios: the anchors, in pixels and h / w (Section 3.1.1).
        rpn_pre_nms_top_n, rpn_post_nms_top_n, rpn_nms_thresh, rpn_min_size: proposals, (training, testing)
            where a pair (see `RegionProposalNetwork`).
        rpn_batch_size, rpn_positive_fraction: anchors sampled per image for Eq. 1 (256, half).
        rpn_iou_thresholds: (negative below, positive from) for anchors (0.3, 0.7).
        rpn_lambda: Eq. 1's lambda (10).
        roi, roi_size, sampling_ratio, fc_width, dropout: the detector (see `FastRCNNHead`).
        roi_batch_size, roi_positive_fraction, roi_fg_iou: RoIs sampled per image for the detector's loss
            (128, 25% foreground at IoU >= 0.5).
        box_weights: the detector's weights on the offsets of Eq. 2 (10, 10, 5, 5).
        smooth_l1_beta: the smooth L1's switch point, in both losses (1, as Fast R-CNN defines it).
        score_thresh, nms_thresh, detections_per_img: detections at test: per class, scores above the
            threshold, NMS at IoU 0.3 (Section 4.1 footnote / py-faster-rcnn), the best ones per image.
        image_mean, image_std: the images ([0, 1]) are normalised with these inside the model.
        in_chans: input channels.
    """

    def __init__(
        self,
        backbone: dict,
        num_classes: int = 20,
        anchor_sizes: tuple[float, ...] = (128, 256, 512),
        aspect_ratios: tuple[float, ...] = (0.5, 1.0, 2.0),
        rpn_pre_nms_top_n: tuple[int, int] = (12000, 6000),
        rpn_post_nms_top_n: tuple[int, int] = (2000, 300),
        rpn_nms_thresh: float = 0.7,
        rpn_min_size: float = 1e-3,
        rpn_batch_size: int = 256,
        rpn_positive_fraction: float = 0.5,
        rpn_iou_thresholds: tuple[float, float] = (0.3, 0.7),
        rpn_lambda: float = 10.0,
        roi: str = "pool",
        roi_size: int = 7,
        sampling_ratio: int = 2,
        fc_width: int = 4096,
        dropout: float = 0.5,
        roi_batch_size: int = 128,
        roi_positive_fraction: float = 0.25,
        roi_fg_iou: float = 0.5,
        box_weights: tuple[float, float, float, float] = (10.0, 10.0, 5.0, 5.0),
        smooth_l1_beta: float = 1.0,
        score_thresh: float = 0.05,
        nms_thresh: float = 0.3,
        detections_per_img: int = 100,
        image_mean: tuple[float, ...] = IMAGENET_MEAN,
        image_std: tuple[float, ...] = IMAGENET_STD,
        in_chans: int = 3,
    ):
        super().__init__()
        kwargs = dict(backbone)
        kind = kwargs.pop("kind", None)
        if kind not in BACKBONES:
            raise ValueError(f"unknown backbone kind '{kind}'; choose from: {', '.join(BACKBONES)}")
        if len(image_mean) != in_chans or len(image_std) != in_chans:
            raise ValueError(f"image_mean and image_std need one value per input channel ({in_chans})")
        self.num_classes, self.in_chans = num_classes, in_chans
        self.rpn_batch_size, self.rpn_positive_fraction = rpn_batch_size, rpn_positive_fraction
        self.rpn_iou_thresholds, self.rpn_lambda = tuple(rpn_iou_thresholds), rpn_lambda
        self.roi_batch_size, self.roi_positive_fraction = roi_batch_size, roi_positive_fraction
        self.roi_fg_iou = roi_fg_iou
        self.box_weights, self.smooth_l1_beta = tuple(box_weights), smooth_l1_beta
        self.score_thresh, self.nms_thresh, self.detections_per_img = score_thresh, nms_thresh, detections_per_img
        self.register_buffer("image_mean", torch.tensor(image_mean).view(-1, 1, 1), persistent=False)
        self.register_buffer("image_std", torch.tensor(image_std).view(-1, 1, 1), persistent=False)

        self.backbone = BACKBONES[kind](**kwargs, in_chans=in_chans)
        C, stride = self.backbone.out_chans, self.backbone.stride
        self.rpn = RegionProposalNetwork(C, anchor_sizes, aspect_ratios, stride, rpn_pre_nms_top_n,
                                         rpn_post_nms_top_n, rpn_nms_thresh, rpn_min_size)
        self.head = FastRCNNHead(C, stride, num_classes, roi, roi_size, sampling_ratio, fc_width, dropout)

    # common.export reads this: torch.export stops at torchvision's nms, whose output size depends on the
    # data ("Could not extract specialized integer from data-dependent expression Min(100, u1)")
    onnx_refusal = ("its proposals and detections come out of non-maximum suppression, whose number of boxes "
                    "depends on the data, and torch.export (torch.onnx's first step) cannot trace that")

    def no_weight_decay(self) -> set[str]:
        """Nothing beyond the biases and batch-norm parameters that never get weight decay."""
        return set()

    def forward(self, images: torch.Tensor, mask: torch.Tensor | None = None, targets: list[dict] | None = None):
        """Detect objects in a batch of images (B, C, H, W) in [0, 1], zero-padded outside mask (B, H, W)
        (True on each image's valid top-left rectangle; None: all valid).

        Args:
            targets: in training, one dict per image: "boxes" (n_i, 4) x1 y1 x2 y2 in pixels and
                "labels" (n_i,) in [0, num_classes); n_i may be 0.

        Returns:
            in training with targets, the weighted loss terms {"rpn_cls", "rpn_reg", "fast_rcnn_cls",
            "fast_rcnn_loc"} (their sum is Eq. 1 of both networks); otherwise one dict per image:
            "boxes" (k, 4) in its pixels, clipped to it, "scores" (k,), "labels" (k,) in [0, num_classes).
        """
        B, _, H, W = images.shape
        train = self.training and targets is not None
        if train and len(targets) != B:
            raise ValueError(f"{len(targets)} targets for {B} images")
        x = masked((images - self.image_mean) / self.image_std, mask)  # (B, C, H, W), padding still 0
        features, feature_mask = self.backbone(x, mask)  # (B, C', h, w): the shared map
        image_sizes = valid_sizes(mask, B, H, W)  # [(h_i, w_i)]
        feature_sizes = valid_sizes(feature_mask, B, *features.shape[-2:])  # [(h_i / stride, w_i / stride)]
        objectness, t = (o.float() for o in self.rpn(features))  # (B, k, h, w), (B, 4k, h, w), fp32 under autocast

        rpn_terms, rois, pooled, u, v = [], [], [], [], []
        for i, ((h, w), (fh, fw)) in enumerate(zip(image_sizes, feature_sizes)):
            logits_i, t_i = self.rpn.flatten(objectness[i, :, :fh, :fw], t[i, :, :fh, :fw])  # image i's own cells
            anchors = self.rpn.anchors(fh, fw, images.device)  # (fh fw k, 4)
            proposals = self.rpn.propose(logits_i, t_i, anchors, (h, w))  # (n, 4)
            if train:
                gt_boxes, gt_labels = targets[i]["boxes"].float(), targets[i]["labels"]
                rpn_terms.append(self.rpn_loss(logits_i, t_i, anchors, gt_boxes, (h, w), n_locations=fh * fw))
                proposals, u_i, v_i = sample_rois(proposals, gt_boxes, gt_labels, self.num_classes,
                                                  self.roi_batch_size, self.roi_positive_fraction, self.roi_fg_iou,
                                                  self.box_weights)  # the detector's mini-batch of RoIs
                u.append(u_i)
                v.append(v_i)
            rois.append(proposals)
            pooled.append(self.head.pool(features[i : i + 1, :, :fh, :fw], proposals))  # (n, C', 7, 7)
        class_logits, t_k = (o.float() for o in self.head(torch.cat(pooled)))  # (R, K + 1), (R, K, 4)

        if train:
            L_cls, L_reg = (torch.stack(terms).mean() for terms in zip(*rpn_terms))  # averaged over images
            L_det_cls, L_det_loc = fast_rcnn_loss(class_logits, t_k, torch.cat(u), torch.cat(v), self.smooth_l1_beta)
            return {"rpn_cls": L_cls, "rpn_reg": L_reg, "fast_rcnn_cls": L_det_cls, "fast_rcnn_loc": L_det_loc}
        n = [len(r) for r in rois]
        return [self.detect(*outputs) for outputs in
                zip(class_logits.split(n), t_k.split(n), rois, image_sizes)]

    def rpn_loss(self, logits: torch.Tensor, t: torch.Tensor, anchors: torch.Tensor, gt_boxes: torch.Tensor,
                 image_size: tuple[int, int], n_locations: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Eq. 1 for one image: its anchors labelled against its boxes, those crossing its border ignored."""
        h, w = image_size
        inside = (anchors[:, 0] >= 0) & (anchors[:, 1] >= 0) & (anchors[:, 2] <= w) & (anchors[:, 3] <= h)
        labels, matched = label_anchors(anchors, inside, gt_boxes, *self.rpn_iou_thresholds)
        matched_boxes = gt_boxes[matched] if len(gt_boxes) else torch.zeros_like(anchors)
        return rpn_loss(logits, t, anchors, labels, matched_boxes, n_locations, self.rpn_batch_size,
                        self.rpn_positive_fraction, self.rpn_lambda, self.smooth_l1_beta)

    def detect(self, class_logits: torch.Tensor, t_k: torch.Tensor, rois: torch.Tensor, image_size: tuple[int, int]
               ) -> dict[str, torch.Tensor]:
        """One image's detections: each RoI's box for each class (Eq. 2 inverted), clipped to the image;
        the class scores of the softmax above the threshold; NMS per class; the best detections_per_img."""
        K = self.num_classes
        scores = F.softmax(class_logits, dim=-1)[:, :K]  # (R, K), background dropped
        boxes = clip_boxes_to_image(decode(t_k, rois, self.box_weights), image_size)  # (R, K, 4)
        labels = torch.arange(K, device=rois.device).expand_as(scores)  # (R, K)
        boxes, scores, labels = boxes.reshape(-1, 4), scores.reshape(-1), labels.reshape(-1)  # one per (RoI, class)
        keep = torch.where(scores > self.score_thresh)[0]
        boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
        keep = remove_small_boxes(boxes, min_size=1e-2)  # empty boxes, as torchvision
        boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
        keep = batched_nms(boxes, scores, labels, self.nms_thresh)[: self.detections_per_img]  # best first
        return {"boxes": boxes[keep], "scores": scores[keep], "labels": labels[keep]}


VGG16 = dict(kind="vgg", blocks=D)  # VGG-16's convolutional layers (papers/vgg, Table 1 column D)

# tiny: the repo's own for digits-detect (48-128 px canvases, 8-32 px digits, 10 classes): a ResNet of
# papers/resnet with the ImageNet stem (7x7/2 convolution, 3x3/2 max pooling) and two stages of one basic
# block (32, 64 filters): a map of stride 8, on which an 8 px digit is one cell; anchors of 8, 16, 32 px;
# RoIAlign (RoI max pooling quantises a one-cell digit to nothing useful); for at most 6 digits a canvas,
# fewer proposals (600 before NMS and 150 after in training, 300 and 100 at test) and 32 RoIs per image
# (up to 8 foreground); fc layers of 128, no dropout. The CIFAR stem's stride-4 map (three stages of 16, 32,
# 64, as many parameters) was tried first: its layers at full resolution made a step about twice as long.
# VGG-16: the paper's PASCAL VOC model (20 classes, Sections 3 and 4.1, py-faster-rcnn's end-to-end settings).
FLAVORS = {
    "tiny": dict(backbone=dict(kind="resnet", block="basic", layers=(1, 1), widths=(32, 64), stem="imagenet",
                               shortcut="A"),
                 num_classes=10, anchor_sizes=(8, 16, 32), rpn_pre_nms_top_n=(600, 300),
                 rpn_post_nms_top_n=(150, 100), roi="align", fc_width=128, dropout=0.0, roi_batch_size=32),
    "VGG-16": dict(backbone=VGG16, num_classes=20),
}
