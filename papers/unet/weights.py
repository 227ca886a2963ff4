"""The weight map of equation 2 (Section 3, Figure 3d): the pixel-wise weights of U-Net's
cross-entropy, pre-computed for every ground-truth segmentation "to compensate the different
frequency of pixels from a certain class" and "to force the network to learn the small separation
borders that we introduce between touching cells":

    w(x) = w_c(x) + w0 * exp(-(d1(x) + d2(x))^2 / (2 sigma^2)),

d1 and d2 the distances to the border of the nearest and of the second nearest cell, w0 = 10 and
sigma ~ 5 pixels in the paper's experiments.

Not fixed by the paper, chosen here: w_c gives every class present the same total weight, with
mean 1 over the pixels (w_c = N / (L N_l) for a pixel of class l, N pixels in all, N_l of class l,
L classes present); d1, d2 are Euclidean distances from the pixel to the nearest pixel of each cell
(scipy's distance transform), so 1 next to a cell; and the border term is added to the pixels of
no cell only, the separating background that Figure 3d weighs (inside a cell d1 would be 0, and the
term would weigh the cell's own rim as much as the gap).
"""

import numpy as np
import torch
from scipy import ndimage


def class_balance(classes: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """w_c (H, W): N / (L N_l) at a valid pixel of class l, 0 where not valid."""
    labels, counts = np.unique(classes[valid], return_counts=True)
    w_c = np.zeros(classes.shape)
    for label, count in zip(labels, counts):
        w_c[(classes == label) & valid] = valid.sum() / (len(labels) * count)
    return w_c


def border_distances(instances: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """d1, d2 (H, W): every pixel's distance to the nearest and the second nearest cell (instance
    ids > 0); None with fewer than two cells."""
    ids = np.unique(instances[instances > 0])
    if len(ids) < 2:
        return None
    d = np.stack([ndimage.distance_transform_edt(instances != i) for i in ids])  # (cells, H, W), 0 inside cell i
    d1, d2 = np.partition(d, 1, axis=0)[:2]  # the two smallest at every pixel
    return d1, d2


def weight_map(instances, classes, w0: float = 10.0, sigma: float = 5.0, ignore_index: int | None = None) -> torch.Tensor:
    """The weights w (H, W), float32, of equation 2 for one ground-truth segmentation.

    Args:
        instances: (H, W) integers, the cell (instance) of every pixel, 0 where there is none.
        classes: (H, W) integers, the class of every pixel.
        w0: the border term's height (10).
        sigma: its width in pixels (about 5).
        ignore_index: a class value whose pixels the loss ignores (a void band): weight 0 there, and
            left out of the class frequencies.
    """
    instances, classes = np.asarray(instances), np.asarray(classes)
    if instances.ndim != 2 or instances.shape != classes.shape:
        raise ValueError(f"instances and classes must be two (H, W) maps of one size, got {instances.shape} "
                         f"and {classes.shape}")
    valid = classes != ignore_index if ignore_index is not None else np.ones(classes.shape, dtype=bool)
    w = class_balance(classes, valid)  # w_c
    distances = border_distances(instances)
    if distances is not None:
        d1, d2 = distances
        w += w0 * np.exp(-(d1 + d2) ** 2 / (2 * sigma ** 2)) * ((instances == 0) & valid)
    return torch.from_numpy(w.astype(np.float32))


def target_weights(target: dict, w0: float = 10.0, sigma: float = 5.0, void: int = 255) -> torch.Tensor:
    """The weight map (H, W) of one training sample's target maps (PaperSpec.pixel_weights): its classes
    "labels", the `void` band weighing 0; its cells "instances" where the data set gives them
    (fashion-canvas), else the connected regions of pixels of one class other than the background (0)
    and the void (segfolder's masks), cells of one class that touch then one region."""
    labels = np.asarray(target["labels"])
    if "instances" in target:
        instances = np.asarray(target["instances"])
    else:
        instances = np.zeros(labels.shape, dtype=np.int64)
        for c in np.unique(labels[(labels != 0) & (labels != void)]):
            regions, n = ndimage.label(labels == c)
            instances[regions > 0] = regions[regions > 0] + instances.max()
    return weight_map(instances, labels, w0, sigma, ignore_index=void)
