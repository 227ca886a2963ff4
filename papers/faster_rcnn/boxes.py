"""Anchors (Section 3.1.1) and the box parameterisation of Eq. 2, shared by the RPN and the Fast R-CNN head.

Boxes are (x1, y1, x2, y2) in pixels throughout; the (x, y, w, h) centre form of Eq. 2 is
torchvision.ops.box_convert's "cxcywh".
"""

import math

import torch
from torchvision.ops import box_convert

# The largest log-scale change a predicted t_w, t_h may make (exp(t_w) <= 1000/16), as py-faster-rcnn and
# torchvision clamp it, so that an untrained regressor does not overflow exp().
MAX_LOG_SCALE = math.log(1000.0 / 16)


def anchor_shapes(sizes: tuple[float, ...], aspect_ratios: tuple[float, ...], device=None) -> torch.Tensor:
    """The k = len(aspect_ratios) x len(sizes) anchors of one sliding-window position, centred on 0 (Section 3.1.1).

    An anchor of size s and aspect ratio r = h / w covers s^2 pixels: w = s / sqrt(r), h = s sqrt(r).
    Ratio-major order (all sizes of the first ratio first), the order of torchvision's AnchorGenerator;
    corners rounded to whole pixels, as py-faster-rcnn's generate_anchors and torchvision round them.

    Returns:
        (k, 4) boxes x1 y1 x2 y2 around (0, 0).
    """
    s = torch.as_tensor(sizes, dtype=torch.float32, device=device)  # (n_s,)
    sqrt_r = torch.as_tensor(aspect_ratios, dtype=torch.float32, device=device).sqrt()  # (n_r,)
    w = ((1 / sqrt_r)[:, None] * s[None]).flatten()  # (k,)
    h = (sqrt_r[:, None] * s[None]).flatten()  # (k,)
    return (torch.stack([-w, -h, w, h], dim=1) / 2).round()  # (k, 4)


def grid_anchors(shapes: torch.Tensor, height: int, width: int, stride: int) -> torch.Tensor:
    """The anchors of every position of an (height, width) feature map: the k shapes shifted to
    (x * stride, y * stride), the image pixel at the top-left of each cell (torchvision's convention;
    py-faster-rcnn centres them at (x + 1/2) * stride - 1/2).

    Returns:
        (height * width * k, 4), position-major: (y, x, anchor), as the RPN's outputs are flattened.
    """
    ys = torch.arange(height, device=shapes.device) * stride  # (h,)
    xs = torch.arange(width, device=shapes.device) * stride  # (w,)
    y, x = torch.meshgrid(ys, xs, indexing="ij")  # (h, w) each
    shifts = torch.stack([x, y, x, y], dim=-1).reshape(-1, 1, 4)  # (h w, 1, 4)
    return (shifts + shapes[None]).reshape(-1, 4)  # (h w k, 4)


def encode(boxes: torch.Tensor, reference: torch.Tensor, weights: tuple[float, ...]) -> torch.Tensor:
    """Eq. 2: the regression targets t* of boxes relative to reference boxes (anchors or proposals),

        t_x = (x - x_a) / w_a,  t_y = (y - y_a) / h_a,  t_w = log(w / w_a),  t_h = log(h / h_a),

    each multiplied by its weight ((1, 1, 1, 1) in the RPN, (10, 10, 5, 5) in the Fast R-CNN head: the
    targets scaled to about unit variance, py-faster-rcnn's BBOX_NORMALIZE_STDS 0.1 0.1 0.2 0.2).

    Args:
        boxes, reference: (N, 4) each, x1 y1 x2 y2.
    """
    x, y, w, h = box_convert(boxes, "xyxy", "cxcywh").unbind(-1)  # (N,) each
    x_a, y_a, w_a, h_a = box_convert(reference, "xyxy", "cxcywh").unbind(-1)
    wx, wy, ww, wh = weights
    return torch.stack([wx * (x - x_a) / w_a, wy * (y - y_a) / h_a,
                        ww * torch.log(w / w_a), wh * torch.log(h / h_a)], dim=-1)  # (N, 4)


def decode(t: torch.Tensor, reference: torch.Tensor, weights: tuple[float, ...]) -> torch.Tensor:
    """Eq. 2 inverted: the boxes that predicted offsets t make of reference boxes.

    Args:
        t: (N, 4) offsets, or (N, K, 4): one set per class for each reference box.
        reference: (N, 4) x1 y1 x2 y2.

    Returns:
        boxes of t's shape, x1 y1 x2 y2.
    """
    ref = box_convert(reference, "xyxy", "cxcywh").view(-1, *[1] * (t.dim() - 2), 4)  # (N, [1,] 4)
    x_a, y_a, w_a, h_a = ref.unbind(-1)  # (N, [1]) each
    t = t / torch.as_tensor(weights, dtype=t.dtype, device=t.device)
    t_x, t_y, t_w, t_h = t.unbind(-1)  # (N, [K]) each
    x, y = x_a + t_x * w_a, y_a + t_y * h_a
    w = w_a * torch.exp(t_w.clamp(max=MAX_LOG_SCALE))
    h = h_a * torch.exp(t_h.clamp(max=MAX_LOG_SCALE))
    return box_convert(torch.stack([x, y, w, h], dim=-1), "cxcywh", "xyxy")  # (N, [K,] 4)
