"""The few layers that several papers share: what a CNN needs to read padded batches.

A paper that sets `padded_batches=True` gets images zero-padded at the bottom
and right, with a mask (B, H, W) that is True on each image's valid pixels (a
top-left rectangle), and must give every image the output it has alone. For a
CNN that means three things, all here:

- after a layer that mixes in the padding (a convolution at the edge, a pool),
  set the padding back to zero: `masked(x, mask)`;
- after a strided layer, the valid pixels are `downsample_mask(mask, stride)`;
- batch norm counts only the valid pixels (`MaskedBatchNorm2d`), and global
  average pooling averages only them (`masked_mean`).

With mask=None each of them is the plain layer, so a model written with them
reads unpadded batches exactly as without them.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import reduce


def downsample_mask(mask: torch.Tensor | None, stride: int) -> torch.Tensor | None:
    """The valid pixels after a layer with this stride.

    A top-left h x w rectangle becomes ceil(h/s) x ceil(w/s), which is the valid output of
    a k x k convolution or pool with stride s and padding (k - 1) / 2 (3x3/s with padding 1,
    7x7/2 with padding 3, 3x3/2 max pool with padding 1), of a strided 1x1 convolution and
    of subsampling by s.
    """
    return None if mask is None else mask[:, ::stride, ::stride]


def masked(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """x (B, C, H, W) with the padding set back to zero."""
    return x if mask is None else x * mask[:, None]


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Global average pooling (B, C, H, W) -> (B, C) over each image's valid pixels."""
    if mask is None:
        return F.adaptive_avg_pool2d(x, 1).flatten(1)  # as torchvision's models pool
    m = mask[:, None].to(x.dtype)  # (B, 1, H, W)
    return reduce(x * m, "b c h w -> b c", "sum") / reduce(m, "b c h w -> b c", "sum")


class MaskedBatchNorm2d(nn.BatchNorm2d):
    """Batch norm over the valid pixels only; the output is zero on the padding.

    In training, the mean and biased variance of the valid pixels normalise, and the
    running estimates take the unbiased variance with the momentum, as nn.BatchNorm2d.
    In eval mode, the running estimates normalise. With mask=None it is nn.BatchNorm2d.
    """

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if mask is None:
            return super().forward(x)
        if not (self.training or self.running_mean is None):  # running estimates, as nn.BatchNorm2d decides
            return masked(super().forward(x), mask)
        x32, m = x.float(), mask[:, None].float()  # statistics in fp32, also under autocast; m: (B, 1, H, W)
        n = m.sum()  # valid pixels per channel
        mean = reduce(x32 * m, "b c h w -> c", "sum") / n  # (C,)
        var = reduce((x32 - mean[:, None, None]) ** 2 * m, "b c h w -> c", "sum") / n  # biased, (C,)
        if self.training and self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                momentum = 1 / self.num_batches_tracked.item() if self.momentum is None else self.momentum
                self.running_mean.lerp_(mean, momentum)
                self.running_var.lerp_(var * n / (n - 1), momentum)  # unbiased
        y = (x32 - mean[:, None, None]) * torch.rsqrt(var[:, None, None] + self.eps)
        if self.affine:
            y = y * self.weight[:, None, None] + self.bias[:, None, None]
        return (y * m).to(x.dtype)
