"""The set prediction loss of DETR (Section 3.1, Eq. 2): the Hungarian loss over the matched pairs.

    L_Hungarian(y, y_hat) = sum_i [ -log p_hat_sigma_hat(i)(c_i) + 1{c_i != no-object} L_box(b_i, b_hat_sigma_hat(i)) ]

with sigma_hat the optimal matching (matcher.py). Every prediction gets a class target, no-object
where no object was matched to it; "we down-weight the log-probability term when c_i = no-object by a
factor 10 to account for class imbalance" (eos_coef 0.1, a weighted mean as nn.CrossEntropyLoss takes
one). The box loss is lambda_L1 ||b - b_hat||_1 + lambda_iou (1 - GIoU) on the matched pairs, summed
and divided by the number of objects in the batch (lambda_L1 = 5, lambda_iou = 2, Section 4). The
same loss, with its own matching, is added after every decoder layer ("auxiliary decoding losses",
Section 3.2).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchvision.ops import box_convert, generalized_box_iou_loss

from papers.detr.matcher import HungarianMatcher


def normalise_targets(targets: list[dict], sizes: torch.Tensor, device: torch.device) -> list[dict]:
    """Targets in the interface's form (x1, y1, x2, y2 in pixels) -> (cx, cy, w, h) divided by each
    image's own width and height, as the predictions are.

    Args:
        targets: B dicts with "boxes" (n_i, 4) and "labels" (n_i,).
        sizes: (B, 2) each image's valid height and width.
    """
    out = []
    for target, (h, w) in zip(targets, sizes.to(device, torch.float32)):
        boxes = box_convert(target["boxes"].to(device, torch.float32).reshape(-1, 4), "xyxy", "cxcywh")  # (n_i, 4)
        out.append({"labels": target["labels"].to(device, torch.int64),
                    "boxes": boxes / torch.stack([w, h, w, h])})
    return out


class SetCriterion(nn.Module):
    """The Hungarian loss of every decoder layer, as three weighted terms summed over the layers.

    Args:
        num_classes: object classes K; class K is no-object.
        matcher: the bipartite matching.
        eos_coef: the weight of the no-object class in the cross-entropy (0.1).
        weight_ce, weight_bbox, weight_giou: the weights of the three terms (1, lambda_L1 = 5, lambda_iou = 2).
    """

    def __init__(self, num_classes: int, matcher: HungarianMatcher, eos_coef: float = 0.1, weight_ce: float = 1.0,
                 weight_bbox: float = 5.0, weight_giou: float = 2.0):
        super().__init__()
        self.num_classes, self.matcher, self.eos_coef = num_classes, matcher, eos_coef
        self.weight_ce, self.weight_bbox, self.weight_giou = weight_ce, weight_bbox, weight_giou

    def layer_losses(self, logits: torch.Tensor, boxes: torch.Tensor, targets: list[dict], num_boxes: float
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The unweighted classification, L1 and GIoU losses of one decoder layer's predictions.

        Args:
            logits: (B, N, K + 1).
            boxes: (B, N, 4), normalised (cx, cy, w, h).
            targets: normalised targets (see `normalise_targets`).
            num_boxes: objects in the batch (at least 1), what the box losses are divided by.
        """
        B, N, _ = logits.shape
        indices = self.matcher(logits, boxes, targets)  # sigma_hat, one pair of index tensors per image
        batch_idx = torch.cat([torch.full_like(pred, i) for i, (pred, _) in enumerate(indices)])  # (M,)
        pred_idx = torch.cat([pred for pred, _ in indices])  # (M,) matched predictions
        target_classes = torch.full((B, N), self.num_classes, dtype=torch.int64, device=logits.device)  # no-object
        target_classes[batch_idx, pred_idx] = torch.cat([t["labels"][j] for t, (_, j) in zip(targets, indices)])
        class_weight = torch.ones(self.num_classes + 1, device=logits.device)
        class_weight[-1] = self.eos_coef  # no-object down-weighted by 10
        loss_ce = F.cross_entropy(logits.transpose(1, 2).float(), target_classes, class_weight)  # -log p_hat(c_i)

        src = boxes[batch_idx, pred_idx].float()  # (M, 4) b_hat_sigma_hat(i)
        tgt = torch.cat([t["boxes"][j] for t, (_, j) in zip(targets, indices)])  # (M, 4) b_i
        loss_bbox = F.l1_loss(src, tgt, reduction="sum") / num_boxes  # ||b_i - b_hat||_1
        loss_giou = generalized_box_iou_loss(box_convert(src, "cxcywh", "xyxy"), box_convert(tgt, "cxcywh", "xyxy"),
                                             reduction="sum") / num_boxes  # 1 - GIoU
        return loss_ce, loss_bbox, loss_giou

    def forward(self, logits: torch.Tensor, boxes: torch.Tensor, targets: list[dict], sizes: torch.Tensor
                ) -> dict[str, torch.Tensor]:
        """The weighted loss terms; their sum is the training loss.

        Args:
            logits: (L, B, N, K + 1), one set per decoder layer whose loss is taken.
            boxes: (L, B, N, 4), sigmoid (cx, cy, w, h) normalised by each image's own size.
            targets: B dicts {"boxes": (n_i, 4) x1 y1 x2 y2 in pixels, "labels": (n_i,)}; n_i may be 0.
            sizes: (B, 2) each image's valid height and width in pixels.

        Returns:
            {"loss_ce", "loss_bbox", "loss_giou"}: each weighted and summed over the L layers.
        """
        targets = normalise_targets(targets, sizes, logits.device)
        num_boxes = max(sum(len(t["labels"]) for t in targets), 1)
        terms = [self.layer_losses(logits[l], boxes[l], targets, num_boxes) for l in range(logits.shape[0])]
        loss_ce, loss_bbox, loss_giou = (torch.stack(t).sum() for t in zip(*terms))  # summed over the layers
        return {"loss_ce": self.weight_ce * loss_ce, "loss_bbox": self.weight_bbox * loss_bbox,
                "loss_giou": self.weight_giou * loss_giou}
