"""Striving for Simplicity: The All Convolutional Net.

Springenberg, Dosovitskiy, Brox, Riedmiller, 2014. https://arxiv.org/abs/1412.6806

Max pooling can be replaced by a convolution with stride 2, and the fully
connected layers by 1x1 convolutions and a global average: a network of
convolutions alone (All-CNN-C, Table 2) matches the pooled ones on CIFAR-10.

The README's worked example of a paper folder: a model of one input size that
reads no padded batches, so it needs no mask code and no batch norm.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import reduce


class AllConvNet(nn.Module):
    """All-CNN-C of Table 2: three 3x3 convolutions, the last with stride 2 in place of max pooling,
    three more, a 3x3 and two 1x1 convolutions in place of fully connected layers, a global average.

    Args:
        num_classes: outputs of the last 1x1 convolution.
        in_chans: input channels.
        widths: channels of the first three and of the later convolutions (96, 192 in the paper).
        valid: the paper's 3x3 convolution before the 1x1 ones has no padding (8x8 -> 6x6 on CIFAR);
            False pads it, for inputs too small for that (8x8 digits are 2x2 there).
        dropout: on the input and after each stride-2 convolution (20% and 50% in the paper).
    """

    def __init__(self, num_classes: int = 10, in_chans: int = 3, widths: tuple[int, int] = (96, 192),
                 valid: bool = True, dropout: tuple[float, float] = (0.2, 0.5)):
        super().__init__()
        w1, w2 = widths
        conv = lambda c_in, c_out, k=3, stride=1, padding=1: nn.Conv2d(c_in, c_out, k, stride, padding)
        self.convs = nn.ModuleList([
            conv(in_chans, w1), conv(w1, w1), conv(w1, w1, stride=2),  # the stride replaces 3x3 max pooling
            conv(w1, w2), conv(w2, w2), conv(w2, w2, stride=2),
            conv(w2, w2, padding=0 if valid else 1), conv(w2, w2, k=1, padding=0),  # 1x1: per-position layers
            conv(w2, num_classes, k=1, padding=0),
        ])
        self.drop_input, self.drop = nn.Dropout(dropout[0]), nn.Dropout(dropout[1])

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) -> logits (B, classes)."""
        x = self.drop_input(images)
        for i, conv in enumerate(self.convs):
            x = F.relu(conv(x))  # every convolution, the last one too, is followed by a ReLU
            if conv.stride == (2, 2):
                x = self.drop(x)  # (B, C, H/2, W/2)
        return reduce(x, "b c h w -> b c", "mean")  # global averaging over 6x6 (CIFAR), (B, classes)


# tiny: the repo's flavor for 8x8 digits; All-CNN-C: Table 2 on 32x32 CIFAR-10, 1,369,738 parameters
FLAVORS = {
    "tiny": dict(widths=(32, 64), valid=False, in_chans=1),
    "All-CNN-C": dict(widths=(96, 192)),
}
