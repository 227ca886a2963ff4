"""The bipartite matching of DETR (Section 3.1, Eq. 1): each ground-truth object gets the one prediction
that the Hungarian algorithm finds cheapest over the whole set.

    sigma_hat = argmin_sigma sum_i L_match(y_i, y_hat_sigma(i))
    L_match(y_i, y_hat_sigma(i)) = -1{c_i != no-object} p_hat_sigma(i)(c_i) + 1{c_i != no-object} L_box(b_i, b_hat_sigma(i))
    L_box(b_i, b_hat) = lambda_iou L_iou(b_i, b_hat) + lambda_L1 ||b_i - b_hat||_1, L_iou = -GIoU (up to a constant)

The probability itself, not its log, is the class cost, so that it is on the scale of the box costs.
Objects are padded with no-object to the N predictions; a no-object costs nothing whichever
prediction it takes, so only the real objects' n columns enter the assignment (N >= n).
"""

import torch
import torch.nn as nn
from scipy.optimize import linear_sum_assignment
from torchvision.ops import box_convert, generalized_box_iou


def matching_cost(logits: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor, target_boxes: torch.Tensor,
                  cost_class: float = 1.0, cost_bbox: float = 5.0, cost_giou: float = 2.0) -> torch.Tensor:
    """L_match of every prediction with every object of one image.

    Args:
        logits: class scores (N, K + 1), the last one no-object.
        boxes: predicted (cx, cy, w, h) (N, 4), normalised by the image's size.
        labels: the objects' classes (n,).
        target_boxes: the objects' (cx, cy, w, h) (n, 4), normalised the same way.
        cost_class, cost_bbox, cost_giou: the weights of -p(c), the L1 distance and -GIoU (1, 5, 2 in Section 4).

    Returns:
        the cost (N, n).
    """
    prob = logits.softmax(-1)  # (N, K + 1)
    cost_p = -prob[:, labels]  # -p_hat(c_i), (N, n)
    cost_l1 = torch.cdist(boxes, target_boxes, p=1)  # ||b_i - b_hat||_1, (N, n)
    cost_iou = -generalized_box_iou(box_convert(boxes, "cxcywh", "xyxy"),
                                    box_convert(target_boxes, "cxcywh", "xyxy"))  # (N, n)
    return cost_class * cost_p + cost_bbox * cost_l1 + cost_giou * cost_iou


class HungarianMatcher(nn.Module):
    """The optimal assignment of predictions to objects under `matching_cost`, image by image (Eq. 1).

    Args:
        cost_class, cost_bbox, cost_giou: the weights of the three costs.
    """

    def __init__(self, cost_class: float = 1.0, cost_bbox: float = 5.0, cost_giou: float = 2.0):
        super().__init__()
        self.cost_class, self.cost_bbox, self.cost_giou = cost_class, cost_bbox, cost_giou

    @torch.no_grad()
    def forward(self, logits: torch.Tensor, boxes: torch.Tensor, targets: list[dict]
                ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Match one decoder layer's predictions to the objects.

        Args:
            logits: (B, N, K + 1).
            boxes: (B, N, 4), normalised (cx, cy, w, h).
            targets: B dicts with "labels" (n_i,) and "boxes" (n_i, 4), normalised (cx, cy, w, h).

        Returns:
            B pairs (prediction indices, object indices), each of length n_i (int64, on the logits' device).
        """
        indices = []
        for logit, box, target in zip(logits.float(), boxes.float(), targets):
            C = matching_cost(logit, box, target["labels"], target["boxes"].float(),
                              self.cost_class, self.cost_bbox, self.cost_giou)  # (N, n_i)
            rows, cols = linear_sum_assignment(C.cpu().numpy())  # the Hungarian algorithm (Kuhn, 1955)
            indices.append((torch.as_tensor(rows, dtype=torch.int64, device=logits.device),
                            torch.as_tensor(cols, dtype=torch.int64, device=logits.device)))
        return indices
