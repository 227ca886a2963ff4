"""Deep Residual Learning for Image Recognition.

He, Zhang, Ren, Sun, 2015. https://arxiv.org/abs/1512.03385

Instead of asking a few stacked layers to fit a mapping H(x), let them fit the
residual F(x) = H(x) - x and add x back through a shortcut: y = F(x, {W_i}) + x
(Eq. 1). If the identity were optimal, the layers only need to push F towards
zero, so networks of 100 and more layers train, and get better with depth.

Variable-size batches: images are zero-padded at the bottom and right, and a mask
(B, H, W) marks the valid pixels. Every block takes and returns (x, mask); batch norm
counts only valid pixels and sets the padding back to zero (common.layers), so each
image is classified as if it were alone (mask=None: every pixel valid, plain
nn.BatchNorm2d).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from common.layers import ClassifierMixin, MaskedBatchNorm2d, downsample_mask, masked, masked_mean


def conv3x3(in_chans: int, out_chans: int, stride: int = 1, dilation: int = 1) -> nn.Conv2d:
    """3x3 convolution, padding 1 (its dilation where dilated, keeping the size), no bias (batch norm
    follows every convolution)."""
    return nn.Conv2d(in_chans, out_chans, kernel_size=3, stride=stride, padding=dilation, dilation=dilation,
                     bias=False)


def conv1x1(in_chans: int, out_chans: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_chans, out_chans, kernel_size=1, stride=stride, bias=False)


# With a mask: at the valid outputs, a convolution reads zeros from the padding, as it reads
# its own zero padding when the image is alone; at the edge it spreads values into the padding.
# Every convolution is followed by a MaskedBatchNorm2d, which skips the padding and zeroes it
# again. The shortcuts take the mask of their output.

class Identity(nn.Identity):
    """The identity shortcut, where the shape is kept."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return x


class PadShortcut(nn.Module):
    """Option A: identity, subsampled by the stride and zero-padded with the extra channels.

    Parameter-free. The extra channels carry no residual learning (Section 4.1). Subsampling
    a map that is zero on the padding gives one that is zero on the subsampled padding.
    """

    def __init__(self, in_chans: int, out_chans: int, stride: int):
        super().__init__()
        self.stride, self.extra = stride, out_chans - in_chans

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x[:, :, :: self.stride, :: self.stride]  # (B, C_in, H/s, W/s)
        return F.pad(x, (0, 0, 0, 0, 0, self.extra))  # zero entries for the new channels: (B, C_out, H/s, W/s)


class Projection(nn.Module):
    """Option B: the projection W_s of Eq. 2, a strided 1x1 convolution and batch norm."""

    def __init__(self, in_chans: int, out_chans: int, stride: int):
        super().__init__()
        self.conv = conv1x1(in_chans, out_chans, stride)
        self.bn = MaskedBatchNorm2d(out_chans)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.bn(self.conv(x), mask)  # W_s x: (B, C_out, H/s, W/s)


def make_shortcut(kind: str, in_chans: int, out_chans: int, stride: int) -> nn.Module | None:
    """The identity where the shape is kept; option A or B where it changes; None for the paper's
    plain networks (kind "none"), which have no shortcut at all."""
    if kind == "none":
        return None
    if stride == 1 and in_chans == out_chans:
        return Identity()
    if kind == "A":
        if out_chans < in_chans:
            raise ValueError(f"option A shortcuts can only add channels, not go from {in_chans} to {out_chans}")
        return PadShortcut(in_chans, out_chans, stride)
    return Projection(in_chans, out_chans, stride)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a shortcut around them (Fig. 2, Fig. 5 left).

    Args:
        in_chans: channels of x.
        width: channels of both convolutions and of the output.
        stride: 2 on the first block of a stage (conv3_1, conv4_1, conv5_1), else 1.
        shortcut: "A" (zero-padding identity) or "B" (projection) where the shape changes; "none":
            no shortcut, the plain net's two stacked layers.
    """

    expansion = 1

    def __init__(self, in_chans: int, width: int, stride: int = 1, shortcut: str = "B"):
        super().__init__()
        self.stride = stride
        self.conv1 = conv3x3(in_chans, width, stride)
        self.bn1 = MaskedBatchNorm2d(width)
        self.conv2 = conv3x3(width, width)
        self.bn2 = MaskedBatchNorm2d(width)
        self.shortcut = make_shortcut(shortcut, in_chans, width, stride)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, C, H, W), zero outside mask (B, H, W); returns y and its mask (B, H/s, W/s)."""
        mask = downsample_mask(mask, self.stride)
        residual = F.relu(self.bn1(self.conv1(x), mask), inplace=True)  # (B, width, H/s, W/s)
        residual = self.bn2(self.conv2(residual), mask)  # F(x, {W_1, W_2})
        if self.shortcut is not None:
            residual += self.shortcut(x, mask)  # y = F(x) + x; a plain net: y = F(x)
        return F.relu(residual, inplace=True), mask  # then the second nonlinearity


class Bottleneck(nn.Module):
    """1x1 (reduce), 3x3, 1x1 (restore to 4 x width) with a shortcut around them (Fig. 5 right).

    Where the block halves the feature map (conv3_1, conv4_1, conv5_1: "downsampling is
    performed ... with a stride of 2", Table 1), the paper's released models stride the first
    1x1 convolution, so all three convolutions compute at the new, quarter-size resolution.
    torchvision strides the 3x3 instead ("ResNet v1.5", from fb.resnet.torch): the same
    parameters, but the first 1x1 computes at every pixel, which costs more multiply-adds
    (ResNet-50: 4.1 billion against Table 1's 3.8).

    Args:
        in_chans: channels of x.
        width: channels of the 1x1 and 3x3 convolutions; the output has 4 x width.
        stride: 2 on the first block of a stage (conv3_1, conv4_1, conv5_1), else 1.
        shortcut: "A" (zero-padding identity) or "B" (projection) where the shape changes; "none":
            no shortcut (a plain net).
        stride_on: "1x1" (the paper's) or "3x3" (torchvision's): which convolution strides.
        dilation: of the 3x3 convolution (1: the paper's; see `ResNet`'s dilate).
    """

    expansion = 4

    def __init__(self, in_chans: int, width: int, stride: int = 1, shortcut: str = "B", stride_on: str = "1x1",
                 dilation: int = 1):
        super().__init__()
        out_chans = width * self.expansion
        s_1x1, s_3x3 = (stride, 1) if stride_on == "1x1" else (1, stride)
        self.stride = stride
        self.conv1 = conv1x1(in_chans, width, s_1x1)
        self.bn1 = MaskedBatchNorm2d(width)
        self.conv2 = conv3x3(width, width, s_3x3, dilation)
        self.bn2 = MaskedBatchNorm2d(width)
        self.conv3 = conv1x1(width, out_chans)
        self.bn3 = MaskedBatchNorm2d(out_chans)
        self.shortcut = make_shortcut(shortcut, in_chans, out_chans, stride)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, C, H, W), zero outside mask (B, H, W); returns y and its mask (B, H/s, W/s)."""
        mid_mask = downsample_mask(mask, self.conv1.stride[0])  # after the first 1x1: strided or not
        out_mask = downsample_mask(mask, self.stride)
        residual = F.relu(self.bn1(self.conv1(x), mid_mask), inplace=True)  # (B, width, H/s, W/s) or (H, W)
        residual = F.relu(self.bn2(self.conv2(residual), out_mask), inplace=True)  # (B, width, H/s, W/s)
        residual = self.bn3(self.conv3(residual), out_mask)  # F(x), (B, 4 width, H/s, W/s)
        if self.shortcut is not None:
            residual += self.shortcut(x, out_mask)  # y = F(x) + x; a plain net: y = F(x)
        return F.relu(residual, inplace=True), out_mask


BLOCKS = {"basic": BasicBlock, "bottleneck": Bottleneck}


class Stage(nn.Sequential):
    """Residual blocks in sequence, the mask passed along with the feature map; the unit fsdp shards."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        for block in self:
            x, mask = block(x, mask)
        return x, mask


class Stem(nn.Module):
    """The layers before the first stage.

    "imagenet": 7x7 convolution with stride 2, batch norm, ReLU, 3x3 max pool with stride 2
    (conv1 and the start of conv2_x in Table 1): a 224 x 224 image becomes 56 x 56.
    "cifar": one 3x3 convolution, batch norm, ReLU, at full resolution (Section 4.2).
    """

    def __init__(self, kind: str, in_chans: int, width: int):
        super().__init__()
        if kind == "imagenet":
            self.conv = nn.Conv2d(in_chans, width, kernel_size=7, stride=2, padding=3, bias=False)
            self.pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        else:
            self.conv = conv3x3(in_chans, width)
            self.pool = None
        self.bn = MaskedBatchNorm2d(width)

    def forward(self, images: torch.Tensor, mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        mask = downsample_mask(mask, self.conv.stride[0])
        x = F.relu(self.bn(self.conv(images), mask), inplace=True)  # (B, width, H/2, W/2) or (B, width, H, W)
        if self.pool is not None:
            # x >= 0 after the ReLU, so zero padding gives the max of the pool's own -inf padding
            # at the valid outputs; but a window on the edge reaches into the padding, so re-zero it.
            mask = downsample_mask(mask, self.pool.stride)
            x = masked(self.pool(x), mask)  # (B, width, H/4, W/4)
        return x, mask


class ResNet(ClassifierMixin, nn.Module):
    """ResNet classifier: a stem, stages of residual blocks, global average pooling and one linear layer.

    Args:
        block: "basic" (two 3x3 convolutions) or "bottleneck" (1x1, 3x3, 1x1).
        layers: blocks per stage, e.g. (3, 4, 6, 3) for ResNet-50 or (3, 3, 3) for ResNet-20.
        widths: filters of each stage (a bottleneck's output has 4 times as many); the stem
            has widths[0] filters. Every stage after the first halves the feature map.
        stem: "imagenet" (7x7/2 convolution and 3x3/2 max pool) or "cifar" (one 3x3 convolution).
        shortcut: "A" (identity with zero-padding, parameter-free) or "B" (projection) for the
            shortcuts that change the shape; all others are identities. "none": no shortcuts at
            all, the "plain" networks of Section 4 (Fig. 3 middle, Table 2, Fig. 6 left), the
            same layers without the additions.
        stride_on: where a bottleneck that halves the feature map strides: "1x1" (its first
            convolution, the paper's) or "3x3" (torchvision's). A basic block strides its first 3x3.
        dilate: not the paper's: for each stage after the first, True replaces its stride 2 by doubling
            the dilation of the 3x3 convolutions from its second block on (the first keeps the previous
            dilation), so the map keeps its resolution: torchvision's `replace_stride_with_dilation`,
            whose (False, True, True) is the stride-8 backbone of its segmentation models. Bottlenecks only.
        num_classes: outputs of the linear head.
        in_chans: input channels.
    """

    def __init__(
        self,
        block: str = "basic",
        layers: tuple[int, ...] = (2, 2, 2, 2),
        widths: tuple[int, ...] = (64, 128, 256, 512),
        stem: str = "imagenet",
        shortcut: str = "B",
        stride_on: str = "1x1",
        dilate: tuple[bool, ...] = (),
        num_classes: int = 1000,
        in_chans: int = 3,
    ):
        super().__init__()
        if block not in BLOCKS:
            raise ValueError(f"unknown block '{block}'; choose from: {', '.join(BLOCKS)}")
        if stem not in ("imagenet", "cifar"):
            raise ValueError(f"unknown stem '{stem}'; choose from: imagenet, cifar")
        if shortcut not in ("A", "B", "none"):
            raise ValueError(f"unknown shortcut option '{shortcut}'; choose from: A, B, none")
        if stride_on not in ("1x1", "3x3"):
            raise ValueError(f"unknown stride_on '{stride_on}'; choose from: 1x1, 3x3")
        if len(layers) != len(widths) or not layers:
            raise ValueError(f"layers {tuple(layers)} and widths {tuple(widths)} must name the same stages")
        if any(dilate) and (block != "bottleneck" or len(dilate) != len(layers) - 1):
            raise ValueError(f"dilate {tuple(dilate)} needs bottlenecks and one entry per stage after the first")
        Block = BLOCKS[block]
        self.in_chans = in_chans
        self.stem = Stem(stem, in_chans, widths[0])
        stages, chans, dilation = [], widths[0], 1
        for i, (n, width) in enumerate(zip(layers, widths)):
            stride = 1 if i == 0 else 2  # the first stage keeps the stem's resolution
            first_dilation = dilation  # torchvision's: a dilated stage's first block keeps the previous one
            if i > 0 and any(dilate) and dilate[i - 1]:
                stride, dilation = 1, dilation * 2
            blocks = []
            for j in range(n):
                where = dict(stride_on=stride_on, dilation=first_dilation if j == 0 else dilation) \
                    if Block is Bottleneck else {}
                blocks.append(Block(chans, width, stride if j == 0 else 1, shortcut, **where))
                chans = width * Block.expansion
            stages.append(Stage(*blocks))
        self.stages = nn.ModuleList(stages)
        self.num_features = chans
        self.fc = nn.Linear(chans, num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """As torchvision: He-normal convolutions (fan_out), batch norm scale 1 and shift 0,
        the default uniform init of the linear layer."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward_features(self, images: torch.Tensor, mask: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The last feature map (B, num_features, h, w) and its valid pixels (B, h, w), or None."""
        x, mask = self.stem(images, mask)  # (B, widths[0], H/4, W/4) for imagenet, (B, widths[0], H, W) for cifar
        for stage in self.stages:
            x, mask = stage(x, mask)  # each stage after the first halves H and W
        return x, mask  # (B, num_features, h, w), (B, h, w)

    def forward_head(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = masked_mean(x, mask)  # global average pooling over the valid pixels, (B, num_features)
        return self.fc(x)  # (B, classes)

    def forward(self, images: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Classify a batch of images (B, C, H, W), zero-padded outside mask (B, H, W) (True on
        valid pixels, a top-left rectangle per image; None: all valid), into logits (B, classes)."""
        return self.forward_head(*self.forward_features(images, mask))


IMAGENET = dict(stem="imagenet", widths=(64, 128, 256, 512))  # Table 1: 224x224, 1000 classes
CIFAR = dict(block="basic", stem="cifar", shortcut="A", widths=(16, 32, 64), num_classes=10)  # Section 4.2
TORCHVISION = dict(shortcut="B", stride_on="3x3", **IMAGENET)  # torchvision.models.resnet18 ... resnet152

# The repo's own tiny flavor for 8x8 digits; the ImageNet models of Table 1 as the paper builds them:
# option A for 18 and 34 layers ("zero-padding for increasing dimensions", Section 4.1, Table 2),
# option B for the bottleneck nets (Section 4.1) with the stride on the first 1x1; the CIFAR-10
# models of Section 4.2 (6n + 2 layers, n = 3, 5, 7, 9, 18); and torchvision's ImageNet models
# (option B throughout, the stride on the 3x3), the ones `from_torchvision` loads.
FLAVORS = {
    "tiny": dict(block="basic", layers=(1, 1, 1), widths=(32, 64, 128), stem="cifar", shortcut="A",
                 num_classes=10, in_chans=1),
    "ResNet-18": dict(block="basic", layers=(2, 2, 2, 2), shortcut="A", **IMAGENET),
    "ResNet-34": dict(block="basic", layers=(3, 4, 6, 3), shortcut="A", **IMAGENET),
    "ResNet-50": dict(block="bottleneck", layers=(3, 4, 6, 3), shortcut="B", stride_on="1x1", **IMAGENET),
    "ResNet-101": dict(block="bottleneck", layers=(3, 4, 23, 3), shortcut="B", stride_on="1x1", **IMAGENET),
    "ResNet-152": dict(block="bottleneck", layers=(3, 8, 36, 3), shortcut="B", stride_on="1x1", **IMAGENET),
    **{f"ResNet-{6 * n + 2}": dict(layers=(n, n, n), **CIFAR) for n in (3, 5, 7, 9, 18)},
    "torchvision-resnet18": dict(block="basic", layers=(2, 2, 2, 2), **TORCHVISION),
    "torchvision-resnet34": dict(block="basic", layers=(3, 4, 6, 3), **TORCHVISION),
    "torchvision-resnet50": dict(block="bottleneck", layers=(3, 4, 6, 3), **TORCHVISION),
    "torchvision-resnet101": dict(block="bottleneck", layers=(3, 4, 23, 3), **TORCHVISION),
    "torchvision-resnet152": dict(block="bottleneck", layers=(3, 8, 36, 3), **TORCHVISION),
}
