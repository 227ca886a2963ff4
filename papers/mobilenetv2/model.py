"""MobileNetV2: Inverted Residuals and Linear Bottlenecks.

Sandler, Howard, Zhu, Zhmoginov, Chen, 2018. https://arxiv.org/abs/1801.04381

The building block inverts the residual bottleneck: a thin k-channel input is expanded t
times by a 1x1 convolution, filtered by a cheap 3x3 depthwise convolution, and projected
back to k' channels by a 1x1 convolution with no non-linearity after it (a linear
bottleneck, since ReLU in a low-dimensional space destroys information), and the shortcut
joins the thin bottlenecks (Table 1, Fig. 3). Stacked as in Table 2 with ReLU6, it reaches
MobileNetV1's accuracy and better at fewer multiply-adds; a width multiplier scales every
layer's channels for smaller or larger models. Two switches give Fig. 6's ablations: a ReLU6
after the projection (linear_bottleneck=False, Fig. 6a) and the shortcuts between the expanded
layers, or none at all (shortcut="expansion" or "none", Fig. 6b).

Variable-size batches: images are zero-padded at the bottom and right, and a mask (B, H, W)
marks the valid pixels. Every convolution is followed by a batch norm that counts only the
valid pixels and sets the padding back to zero (common.layers), and ReLU6(0) = 0, so every
convolution, the strided depthwise ones included, reads zeros beyond an image's edge, as it
reads its own zero padding when the image is alone; global average pooling takes the valid
pixels only. With mask=None every layer is the plain one.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from common.layers import ClassifierMixin, MaskedBatchNorm2d, downsample_mask, masked_mean


def make_divisible(v: float, divisor: int = 8) -> int:
    """The channel rounding of the reference implementation (TensorFlow-Slim's, as torchvision's
    `_make_divisible`): the nearest multiple of divisor, at least divisor, and never more than
    10% below v."""
    rounded = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * v else rounded


class ConvBN(nn.Module):
    """A convolution, batch norm after it ("batch normalization after every layer", Section 6.1)
    and, unless linear, ReLU6.

    Args:
        in_chans, out_chans: channels.
        kernel_size: 1 or 3 (padding keeps the size at stride 1).
        stride: 1 or 2.
        groups: in_chans for a depthwise convolution.
        linear: no non-linearity (the projection of a linear bottleneck).
    """

    def __init__(self, in_chans: int, out_chans: int, kernel_size: int = 1, stride: int = 1, groups: int = 1,
                 linear: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(in_chans, out_chans, kernel_size, stride, padding=(kernel_size - 1) // 2,
                              groups=groups, bias=False)
        self.bn = MaskedBatchNorm2d(out_chans)
        self.linear = linear

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        mask = downsample_mask(mask, self.conv.stride[0])
        x = self.bn(self.conv(x), mask)  # (B, out_chans, H/s, W/s)
        return (x if self.linear else F.relu6(x)), mask


SHORTCUTS = ("bottleneck", "expansion", "none")  # Fig. 6b's three ways to place the identity shortcuts


def check_switches(linear_bottleneck: bool, shortcut: str) -> None:
    """A ValueError, naming the choices, for a value of Fig. 6's switches that is none of them."""
    if not isinstance(linear_bottleneck, bool):
        raise ValueError(f"linear_bottleneck is True or False, got {linear_bottleneck!r}")
    if shortcut not in SHORTCUTS:
        raise ValueError(f"unknown shortcut '{shortcut}'; choose from: {', '.join(SHORTCUTS)}")


class InvertedResidual(nn.Module):
    """The bottleneck residual block of Table 1, from k to k' channels with stride s and expansion t:
    1x1 conv2d + ReLU6 to tk channels, 3x3 depthwise conv2d with stride s + ReLU6, linear 1x1 conv2d
    to k' channels; the shortcut adds the input where the shapes match (s = 1 and k = k', Fig. 3b).

    With t = 1 (the first block of Table 2) there is nothing to expand and the depthwise convolution
    reads the input directly, as in the reference implementation.

    Fig. 6's ablations change connections and activations only, never the parameters. Fig. 6a, the
    impact of non-linearities: linear_bottleneck=False puts ReLU6 after the projection, a bottleneck
    with a non-linearity. Fig. 6b, the impact of residual connections: shortcut "expansion" joins the
    expanded layers instead of the bottlenecks, as in a classic residual bottleneck. This block's
    expansion output e (after ReLU6, t k channels) then gets the previous block's e added where the two
    have the same shape (`adds_expansion`): e = ReLU6(BN(W_expand x)) + e_prev, which the depthwise
    convolution reads and which goes on to the next block. The shortcut so spans the previous block's
    depthwise convolution and projection and this block's expansion (wide, thin, wide); with no
    bottleneck shortcut the block's output is its projection. Shortcut "none" adds nothing anywhere.

    Args:
        in_chans: k.
        out_chans: k'.
        stride: s, of the depthwise convolution.
        expansion: t; the inner width is round(t k).
        linear_bottleneck: no non-linearity after the projection (Section 3.2); False: ReLU6 after it.
        shortcut: "bottleneck" (Fig. 3b), "expansion" or "none" (Fig. 6b).
        previous: the block before this one, or None for the first. With shortcut "expansion" its
            expansion output has this block's shape, and is added, where both blocks expand (t > 1;
            a block with t = 1 has no expansion, and neither gives nor takes this shortcut) to the
            same width and the previous block's depthwise convolution keeps the size (stride 1).
    """

    def __init__(self, in_chans: int, out_chans: int, stride: int, expansion: float, linear_bottleneck: bool = True,
                 shortcut: str = "bottleneck", previous: "InvertedResidual | None" = None):
        super().__init__()
        check_switches(linear_bottleneck, shortcut)
        hidden = int(round(in_chans * expansion))
        self.expand = ConvBN(in_chans, hidden, 1) if expansion != 1 else None
        self.depthwise = ConvBN(hidden, hidden, 3, stride, groups=hidden)
        self.project = ConvBN(hidden, out_chans, 1, linear=linear_bottleneck)
        self.shortcut = shortcut
        self.use_residual = shortcut == "bottleneck" and stride == 1 and in_chans == out_chans
        self.adds_expansion = (shortcut == "expansion" and self.expand is not None and previous is not None
                               and previous.expand is not None and previous.depthwise.conv.stride == (1, 1)
                               and previous.depthwise.conv.out_channels == hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, e_prev: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, ...]:
        """x (B, k, H, W), zero outside mask (B, H, W); returns y (B, k', H/s, W/s) and its mask. With
        shortcut "expansion" it also reads e_prev, the previous block's expansion output (B, t k, H, W)
        (None for the first block), and returns its own expansion output third (None where t = 1), for
        the next block."""
        h, out_mask = x, mask
        if self.expand is not None:
            h, _ = self.expand(h, mask)  # (B, t k, H, W)
        if self.adds_expansion:
            h = h + e_prev  # Fig. 6b, the shortcut between expansions: both (B, t k, H, W), zero outside mask
        e = h if self.expand is not None else None  # a block with t = 1 gives no expansion output
        h, out_mask = self.depthwise(h, mask)  # (B, t k, H/s, W/s)
        h, _ = self.project(h, out_mask)  # the linear bottleneck (or ReLU6 after it, Fig. 6a): (B, k', H/s, W/s)
        y = x + h if self.use_residual else h
        return (y, out_mask, e) if self.shortcut == "expansion" else (y, out_mask)


# Table 2: each row (t, c, n, s) is n blocks with expansion t and c output channels, the first with
# stride s and the others with stride 1.
TABLE2 = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


class MobileNetV2(ClassifierMixin, nn.Module):
    """MobileNetV2 classifier (Table 2): a 3x3 conv2d of 32 filters with stride 2, the bottleneck
    blocks, a 1x1 conv2d to 1280 channels, global average pooling, dropout and a linear classifier
    (Table 2's final "conv2d 1x1" on the pooled 1x1 map).

    Args:
        width_mult: the width multiplier: every layer's channels times it, rounded to a multiple of
            round_nearest; the last 1x1 conv2d keeps its 1280 channels for multipliers below one
            (Section 4, "Trade-off hyper parameters").
        settings: the (t, c, n, s) rows of Table 2.
        stem_chans: filters of the first conv2d (32), before the multiplier.
        stem_stride: its stride (2).
        last_chans: channels of the last 1x1 conv2d (1280), before the multiplier.
        round_nearest: channels are multiples of this (8, as the reference; 1: no rounding).
        dropout: before the classifier (the paper uses dropout but gives no rate; 0.2 as torchvision).
        num_classes: outputs of the classifier.
        in_chans: input channels.
        linear_bottleneck: Fig. 6a: True, the paper's linear bottlenecks; False, ReLU6 after every
            block's projection (the bottleneck with a non-linearity it compares them with).
        shortcut: Fig. 6b: "bottleneck", the paper's shortcuts between the thin bottlenecks (Fig. 3b);
            "expansion", shortcuts between the expanded layers of consecutive blocks where their shapes
            match (see InvertedResidual); "none", no residual connections.
    """

    def __init__(
        self,
        width_mult: float = 1.0,
        settings: tuple[tuple[float, int, int, int], ...] = TABLE2,
        stem_chans: int = 32,
        stem_stride: int = 2,
        last_chans: int = 1280,
        round_nearest: int = 8,
        dropout: float = 0.2,
        num_classes: int = 1000,
        in_chans: int = 3,
        linear_bottleneck: bool = True,
        shortcut: str = "bottleneck",
    ):
        super().__init__()
        check_switches(linear_bottleneck, shortcut)
        if width_mult <= 0:
            raise ValueError(f"the width multiplier must be positive, got {width_mult}")
        if not settings or any(len(row) != 4 or row[2] < 1 or row[3] not in (1, 2) for row in settings):
            raise ValueError(f"settings must be (t, c, n, s) rows with n >= 1 and s in (1, 2), got {settings}")
        self.in_chans = in_chans
        self.linear_bottleneck, self.shortcut = linear_bottleneck, shortcut
        chans = make_divisible(stem_chans * width_mult, round_nearest)
        self.stem = ConvBN(in_chans, chans, 3, stem_stride)
        blocks = []
        for t, c, n, s in settings:
            out_chans = make_divisible(c * width_mult, round_nearest)
            for i in range(n):
                blocks.append(InvertedResidual(chans, out_chans, s if i == 0 else 1, t, linear_bottleneck, shortcut,
                                               previous=blocks[-1] if blocks else None))
                chans = out_chans
        self.blocks = nn.ModuleList(blocks)
        self.num_features = make_divisible(last_chans * max(1.0, width_mult), round_nearest)
        self.conv_last = ConvBN(chans, self.num_features, 1)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(self.num_features, num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The paper gives no initialisation; torchvision's: He-normal convolutions (fan_out), batch
        norm scale 1 and shift 0, the classifier normal with std 0.01 and bias 0."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.fc.weight, 0, 0.01)
        nn.init.zeros_(self.fc.bias)

    def init_classifier(self, layer: nn.Linear) -> None:
        """A new classifier (reset_classifier, common.layers.ClassifierMixin) starts as in `reset_parameters`."""
        nn.init.normal_(layer.weight, 0, 0.01)
        nn.init.zeros_(layer.bias)

    def forward_features(self, images: torch.Tensor, mask: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The last feature map (B, num_features, h, w) and its valid pixels (B, h, w), or None."""
        x, mask = self.stem(images, mask)  # (B, 32, H/2, W/2)
        e = None  # with shortcut "expansion": the last block's expansion output, (B, t k, H, W)
        for block in self.blocks:
            if self.shortcut == "expansion":
                x, mask, e = block(x, mask, e)  # e: what the next block adds where the shapes match
            else:
                x, mask = block(x, mask)  # down to (B, 320, H/32, W/32) in Table 2
        return self.conv_last(x, mask)  # (B, 1280, H/32, W/32)

    def forward_head(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = masked_mean(x, mask)  # global average pooling over the valid pixels: (B, num_features)
        return self.fc(self.dropout(x))  # (B, classes)

    def forward(self, images: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Classify a batch of images (B, C, H, W), zero-padded outside mask (B, H, W) (True on valid
        pixels, a top-left rectangle per image; None: all valid), into logits (B, classes)."""
        return self.forward_head(*self.forward_features(images, mask))


# Our tiny flavor for 32x32 shapes: Table 2's stem and first five rows with fewer repeats, the row of
# 64 channels at stride 1, so that three stride-2 layers take 32x32 to 4x4 (Table 2's five take 224x224
# to 7x7), the last two rows dropped and a last conv2d of 320. Then the paper's width multipliers at
# 224x224 (Section 4, Table 3, Fig. 4).
FLAVORS = {
    "tiny": dict(settings=((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 2, 1), (6, 96, 1, 1)),
                 last_chans=320, num_classes=10),
    "MobileNetV2-1.0": dict(width_mult=1.0),
    "MobileNetV2-0.35": dict(width_mult=0.35),
    "MobileNetV2-0.5": dict(width_mult=0.5),
    "MobileNetV2-0.75": dict(width_mult=0.75),
    "MobileNetV2-1.4": dict(width_mult=1.4),
}
