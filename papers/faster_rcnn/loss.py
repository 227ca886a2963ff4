"""The training targets and losses of Faster R-CNN: the RPN's (Section 3.1.2, Eq. 1) and the Fast R-CNN
detector's (Fast R-CNN, Girshick 2015, Section 2.3), both per image.

Training is the paper's approximate joint training (Section 3.2): one network, the RPN's loss and the
detector's added; the proposals the detector is trained on are treated as fixed inputs (no gradient flows
through their coordinates).
"""

import torch
import torch.nn.functional as F
from torchvision.ops import box_iou

from papers.faster_rcnn.boxes import encode


def balanced_sample(positive: torch.Tensor, negative: torch.Tensor, batch_size: int, positive_fraction: float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to batch_size examples, at most positive_fraction of them positive, drawn at random; negatives
    fill the rest ("if there are fewer than 128 positive samples in an image, we pad the mini-batch with
    negative ones", Section 3.1.3).

    Args:
        positive, negative: (N,) bool.

    Returns:
        the indices of the sampled positives and of the sampled negatives.
    """
    pos, neg = torch.where(positive)[0], torch.where(negative)[0]
    n_pos = min(len(pos), int(batch_size * positive_fraction))
    n_neg = min(len(neg), batch_size - n_pos)
    pos = pos[torch.randperm(len(pos), device=pos.device)[:n_pos]]
    neg = neg[torch.randperm(len(neg), device=neg.device)[:n_neg]]
    return pos, neg


def label_anchors(anchors: torch.Tensor, inside: torch.Tensor, gt_boxes: torch.Tensor,
                  fg_iou: float = 0.7, bg_iou: float = 0.3) -> tuple[torch.Tensor, torch.Tensor]:
    """Section 3.1.2: each anchor is positive (1) if (i) it has the highest IoU with a ground-truth box
    or (ii) an IoU >= 0.7 with any; negative (0) if its IoU is < 0.3 with all; otherwise ignored (-1).
    Anchors that cross the image border are ignored too (Section 3.3: "we ignore all cross-boundary
    anchors so they do not contribute to the loss").

    Args:
        anchors: (N, 4).
        inside: (N,) bool, the anchors inside the image.
        gt_boxes: (G, 4); G may be 0 (every anchor inside the image is then negative).

    Returns:
        labels (N,) float in {1, 0, -1}, and for each anchor the index of its best ground-truth box (N,).
    """
    labels = torch.full((len(anchors),), -1.0, device=anchors.device)
    if len(gt_boxes) == 0:
        labels[inside] = 0.0
        return labels, torch.zeros(len(anchors), dtype=torch.long, device=anchors.device)
    iou = box_iou(gt_boxes, anchors)  # (G, N)
    iou[:, ~inside] = -1.0  # never positive nor negative
    best_iou, matched = iou.max(dim=0)  # (N,): each anchor's best box
    labels[(best_iou >= 0) & (best_iou < bg_iou)] = 0.0
    labels[best_iou >= fg_iou] = 1.0  # (ii)
    best_for_box = iou.max(dim=1, keepdim=True).values  # (G, 1)
    _, best_anchors = torch.where((iou == best_for_box) & (best_for_box > 0))  # (i), ties included
    labels[best_anchors] = 1.0
    return labels, matched


def rpn_loss(logits: torch.Tensor, t: torch.Tensor, anchors: torch.Tensor, labels: torch.Tensor,
             matched_boxes: torch.Tensor, n_locations: int, batch_size: int = 256, positive_fraction: float = 0.5,
             lam: float = 10.0, beta: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 1 for one image, on a mini-batch of 256 anchors sampled with up to half positives (Section 3.1.3):

        L({p_i}, {t_i}) = 1/N_cls sum_i L_cls(p_i, p_i*) + lambda 1/N_reg sum_i p_i* L_reg(t_i, t_i*),

    L_cls the log loss over object vs. not object, L_reg the smooth L1 loss of Fast R-CNN on the
    offsets of Eq. 2, N_cls the mini-batch size, N_reg the number of anchor locations (the feature
    map's positions), lambda = 10 so that both terms weigh about equally.

    Args:
        logits: (N,) objectness logits p_i (before the sigmoid) of every anchor of the image.
        t: (N, 4) predicted offsets t_i.
        anchors: (N, 4).
        labels: (N,) from `label_anchors`.
        matched_boxes: (N, 4) each anchor's ground-truth box (used where positive).
        n_locations: N_reg.
        beta: the smooth L1's switch point (1 in Fast R-CNN; py-faster-rcnn and torchvision use 1/9).

    Returns:
        the two terms, lambda included in the second.
    """
    pos, neg = balanced_sample(labels == 1, labels == 0, batch_size, positive_fraction)
    sampled = torch.cat([pos, neg])
    if len(sampled) == 0:  # no anchor inside the image: nothing to learn from it
        return logits.sum() * 0, t.sum() * 0
    L_cls = F.binary_cross_entropy_with_logits(logits[sampled], labels[sampled])  # 1/N_cls sum
    t_star = encode(matched_boxes[pos], anchors[pos], (1.0, 1.0, 1.0, 1.0))  # (P, 4)
    L_reg = F.smooth_l1_loss(t[pos], t_star, beta=beta, reduction="sum") / n_locations  # only p_i* = 1 count
    return L_cls, lam * L_reg


def sample_rois(proposals: torch.Tensor, gt_boxes: torch.Tensor, gt_labels: torch.Tensor, num_classes: int,
                batch_size: int = 128, positive_fraction: float = 0.25, fg_iou: float = 0.5,
                weights: tuple[float, ...] = (10.0, 10.0, 5.0, 5.0)
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The detector's training RoIs of one image (Fast R-CNN Section 2.3): the proposals and the
    ground-truth boxes themselves; 25% of the mini-batch foreground (IoU >= 0.5 with a box, labelled
    with its class), the rest background (IoU < 0.5; py-faster-rcnn's Faster R-CNN takes all of
    [0, 0.5), Fast R-CNN took [0.1, 0.5)), labelled num_classes.

    Args:
        proposals: (N, 4), detached.
        gt_boxes: (G, 4); gt_labels: (G,) in [0, num_classes).

    Returns:
        rois (R, 4), their labels u (R,) in [0, num_classes] and regression targets v (R, 4) (Eq. 2
        with weights; meaningful where u < num_classes).
    """
    rois = torch.cat([proposals, gt_boxes])  # (N + G, 4)
    if len(gt_boxes) == 0:
        u = torch.full((len(rois),), num_classes, dtype=torch.long, device=rois.device)
        matched = torch.zeros_like(rois)
    else:
        best_iou, best = box_iou(gt_boxes, rois).max(dim=0)  # (N + G,)
        u = torch.where(best_iou >= fg_iou, gt_labels[best], num_classes)
        matched = gt_boxes[best]
    fg, bg = balanced_sample(u < num_classes, u == num_classes, batch_size, positive_fraction)
    keep = torch.cat([fg, bg])
    return rois[keep], u[keep], encode(matched[keep], rois[keep], weights)


def fast_rcnn_loss(class_logits: torch.Tensor, t: torch.Tensor, u: torch.Tensor, v: torch.Tensor,
                   beta: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Fast R-CNN's Eq. 1 over the sampled RoIs of a batch: L = L_cls(p, u) + lambda [u >= 1] L_loc(t^u, v),
    lambda = 1; background is class num_classes here (0 in the paper), and L_loc, the smooth L1 loss of
    the true class's offsets, is summed over the foreground RoIs and divided by all RoIs.

    Args:
        class_logits: (R, K + 1).
        t: (R, K, 4) offsets for each class.
        u: (R,) labels in [0, K]; v: (R, 4) targets.
    """
    K = t.shape[1]
    L_cls = F.cross_entropy(class_logits, u)  # -log p_u, averaged
    fg = torch.where(u < K)[0]
    t_u = t[fg, u[fg]]  # (F, 4): only the true class's box is trained
    L_loc = F.smooth_l1_loss(t_u, v[fg], beta=beta, reduction="sum") / max(len(u), 1)
    return L_cls, L_loc
