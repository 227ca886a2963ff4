"""Aggregated Residual Transformations for Deep Neural Networks.

Xie, Girshick, Dollár, Tu, He, 2017. https://arxiv.org/abs/1611.05431

A ResNet bottleneck whose transformation is split into C paths of the same topology and summed:
F(x) = sum_{i=1}^{C} T_i(x), y = x + F(x) (Eq. 3, 4). The number of paths, the cardinality C, is a
dimension beside depth and width: at equal multiply-adds, more and narrower paths are more accurate
(Table 3). The C paths are one grouped 3x3 convolution between two 1x1 convolutions (Fig. 3c).

The stem, stages, shortcuts (option B), pooling, head, mask handling for padded batches and the
initialisation are ResNet's (papers.resnet.model); the block's forward is ResNet's bottleneck's.
Only the block's widths and its grouped 3x3 are new.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from common.layers import MaskedBatchNorm2d
from papers.resnet.model import Bottleneck, ResNet, Stage, Stem, conv1x1, make_shortcut


def grouped_conv3x3(chans: int, cardinality: int, stride: int = 1) -> nn.Conv2d:
    """C 3x3 convolutions of chans / C channels each, side by side: the C paths' middle layers (Fig. 3c)."""
    return nn.Conv2d(chans, chans, kernel_size=3, stride=stride, padding=1, groups=cardinality, bias=False)


class AggregatedBottleneck(Bottleneck):
    """The ResNeXt block of Fig. 3(c): 1x1 to C x d channels, a 3x3 in C groups of d, 1x1 to 4 x width.

    Equivalent to C paths T_i (1x1 to d, 3x3, 1x1 to 4 x width) summed (Fig. 3a; `SplitTransformMerge`)
    and to their early concatenation (Fig. 3b). Batch norm after every convolution, ReLU after each batch
    norm but the last, which comes after the addition of the shortcut (Section 4). Where the block halves
    the feature map, the grouped 3x3 strides, as torchvision's ResNet "v1.5" ("Downsampling of conv3, 4,
    and 5 is done by stride-2 convolutions in the 3x3 layer of the first block in each stage", Section 4).
    The forward, with its mask for padded batches, is ResNet's bottleneck's.

    Args:
        in_chans: channels of x.
        width: a quarter of the output's channels (ResNet's bottleneck width; 64 in conv2).
        stride: 2 on the first block of a stage (conv3_1, conv4_1, conv5_1), else 1.
        cardinality: C, the number of paths.
        group_width: d, the width of each path in this block (4 in conv2 of ResNeXt-50 32x4d, doubled
            in each later stage).
    """

    expansion = 4

    def __init__(self, in_chans: int, width: int, stride: int = 1, cardinality: int = 32, group_width: int = 4):
        nn.Module.__init__(self)  # ResNet's bottleneck's layers, at other widths
        out_chans, D = width * self.expansion, cardinality * group_width  # D = C x d: the grouped conv's width
        self.stride, self.cardinality = stride, cardinality
        self.conv1 = conv1x1(in_chans, D)  # the C paths' first 1x1s, concatenated
        self.bn1 = MaskedBatchNorm2d(D)
        self.conv2 = grouped_conv3x3(D, cardinality, stride)  # the C paths' 3x3s, each on its own d channels
        self.bn2 = MaskedBatchNorm2d(D)
        self.conv3 = conv1x1(D, out_chans)  # the C paths' last 1x1s, summed
        self.bn3 = MaskedBatchNorm2d(out_chans)
        self.shortcut = make_shortcut("B", in_chans, out_chans, stride)


class SplitTransformMerge(nn.Module):
    """Fig. 3(a) and (b): the same block as C separate paths, for reading and checking (eval mode, no mask).

    Path i is T_i: a 1x1 convolution to d channels, batch norm, ReLU, a 3x3 convolution, batch norm, ReLU
    (`paths[i]`), and a 1x1 convolution to the output width (`W_out[i]`). Form (a) sums the C outputs of the
    last 1x1s (Eq. 3); form (b) concatenates the C paths' 3x3 outputs and applies one wide 1x1. Then batch
    norm, the shortcut, ReLU, as in the grouped block.
    """

    def __init__(self, in_chans: int, width: int, stride: int = 1, cardinality: int = 32, group_width: int = 4):
        super().__init__()
        d, out_chans = group_width, width * AggregatedBottleneck.expansion
        self.paths = nn.ModuleList(
            nn.Sequential(conv1x1(in_chans, d), nn.BatchNorm2d(d), nn.ReLU(),
                          nn.Conv2d(d, d, kernel_size=3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(d),
                          nn.ReLU())
            for _ in range(cardinality))
        self.W_out = nn.ModuleList(conv1x1(d, out_chans) for _ in range(cardinality))
        self.bn = nn.BatchNorm2d(out_chans)
        self.shortcut = make_shortcut("B", in_chans, out_chans, stride)

    @classmethod
    def from_grouped(cls, block: AggregatedBottleneck) -> "SplitTransformMerge":
        """The C paths holding the grouped block's weights: path i takes the i-th slice of d channels of
        its first 1x1 and 3x3 (and of their batch norms) and the i-th d input channels of its last 1x1."""
        C, d = block.cardinality, block.conv2.out_channels // block.cardinality
        paths = cls(block.conv1.in_channels, block.conv3.out_channels // block.expansion, block.stride, C, d)
        with torch.no_grad():
            for i, (path, W_out) in enumerate(zip(paths.paths, paths.W_out)):
                part = slice(i * d, (i + 1) * d)
                path[0].weight.copy_(block.conv1.weight[part])
                path[3].weight.copy_(block.conv2.weight[part])  # a grouped weight is (D, d, 3, 3) already
                W_out.weight.copy_(block.conv3.weight[:, part])
                for ours, theirs in ((path[1], block.bn1), (path[4], block.bn2)):
                    for name in ("weight", "bias", "running_mean", "running_var"):
                        getattr(ours, name).copy_(getattr(theirs, name)[part])
        paths.bn.load_state_dict(block.bn3.state_dict())
        paths.shortcut.load_state_dict(block.shortcut.state_dict())
        return paths

    def forward(self, x: torch.Tensor, early_concatenation: bool = False) -> torch.Tensor:
        """Form (a): y = ReLU(BN(sum_i T_i(x)) + shortcut(x)); form (b) with early_concatenation."""
        h = [path(x) for path in self.paths]  # C maps (B, d, H/s, W/s)
        if early_concatenation:  # Fig. 3(b): concatenate, then one 1x1 of C x d inputs
            W = torch.cat([W_out.weight for W_out in self.W_out], dim=1)  # (out, C d, 1, 1)
            F_x = F.conv2d(torch.cat(h, dim=1), W)  # (B, out, H/s, W/s)
        else:  # Fig. 3(a): sum_i T_i(x), Eq. 3
            F_x = sum(W_out(h_i) for W_out, h_i in zip(self.W_out, h))  # (B, out, H/s, W/s)
        return F.relu(self.bn(F_x) + self.shortcut(x))


class ResNeXt(ResNet):
    """ResNeXt classifier: ResNet's stem, stages of aggregated bottlenecks, global average pooling and fc.

    The template of Section 3.1: blocks in a stage share their widths; where a stage halves the feature
    map, the width of the blocks doubles, the paths' width d with it (Table 1: conv2 32x4d, conv3 32x8d,
    conv4 32x16d, conv5 32x32d), so every stage costs about the same.

    Args:
        layers: blocks per stage: (3, 4, 6, 3) for ResNeXt-50, (3, 3, 3) for the 29-layer CIFAR nets.
        widths: a quarter of each stage's output channels (ResNet's bottleneck widths); the stem has
            widths[0] filters. Every stage after the first halves the feature map.
        cardinality: C, the number of paths in every block.
        bottleneck_width: d, the width of each path in the first stage; stage i has
            d x widths[i] / widths[0].
        stem: "imagenet" (7x7/2 convolution and 3x3/2 max pool) or "cifar" (one 3x3 convolution).
        num_classes: outputs of the linear head.
        in_chans: input channels.
    """

    def __init__(
        self,
        layers: tuple[int, ...] = (3, 4, 6, 3),
        widths: tuple[int, ...] = (64, 128, 256, 512),
        cardinality: int = 32,
        bottleneck_width: int = 4,
        stem: str = "imagenet",
        num_classes: int = 1000,
        in_chans: int = 3,
    ):
        nn.Module.__init__(self)  # ResNet's parts, built from aggregated bottlenecks
        check_template(layers, widths, cardinality, bottleneck_width, stem)
        self.in_chans, self.cardinality, self.bottleneck_width = in_chans, cardinality, bottleneck_width
        self.stem = Stem(stem, in_chans, widths[0])
        stages, chans = [], widths[0]
        for i, (n, width) in enumerate(zip(layers, widths)):
            stride = 1 if i == 0 else 2  # the first stage keeps the stem's resolution
            d = bottleneck_width * width // widths[0]  # the paths widen with the stage
            blocks = []
            for j in range(n):
                blocks.append(AggregatedBottleneck(chans, width, stride if j == 0 else 1, cardinality, d))
                chans = width * AggregatedBottleneck.expansion
            stages.append(Stage(*blocks))
        self.stages = nn.ModuleList(stages)
        self.num_features = chans
        self.fc = nn.Linear(chans, num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """ResNet's (He-normal convolutions with fan_out, batch norm scale 1 and shift 0), and the linear
        layer's bias at zero, as the paper's code (fb.resnet.torch's)."""
        super().reset_parameters()
        nn.init.zeros_(self.fc.bias)


def check_template(layers, widths, cardinality: int, bottleneck_width: int, stem: str) -> None:
    if stem not in ("imagenet", "cifar"):
        raise ValueError(f"unknown stem '{stem}'; choose from: imagenet, cifar")
    if len(layers) != len(widths) or not layers:
        raise ValueError(f"layers {tuple(layers)} and widths {tuple(widths)} must name the same stages")
    if cardinality < 1 or bottleneck_width < 1:
        raise ValueError(f"cardinality {cardinality} and bottleneck_width {bottleneck_width} must be at least 1")
    if any((bottleneck_width * w) % widths[0] for w in widths):
        raise ValueError(f"bottleneck_width {bottleneck_width} x widths {tuple(widths)} / {widths[0]} must be whole")


IMAGENET = dict(stem="imagenet", widths=(64, 128, 256, 512))  # Table 1: 224x224, 1000 classes
CIFAR = dict(stem="cifar", layers=(3, 3, 3), widths=(64, 128, 256), num_classes=10)  # Section 5.3: 9 x 3 + 2 layers
TINY = dict(stem="cifar", layers=(1, 1, 1), widths=(16, 32, 64), num_classes=10, in_chans=1)

# The repo's tiny flavor, 32x2d (32 paths of 2, 4 and 8 channels in its three stages), and at its multiply-adds
# (within 3%) its 1- and 4-path forms 1x28d and 4x11d: the analogue of Table 3's 32x4d, 1x64d and 4x24d. Then
# the ImageNet models of Tables 1, 3 and 4 and the CIFAR models of Table 7.
FLAVORS = {
    "tiny": dict(cardinality=32, bottleneck_width=2, **TINY),
    "tiny-1x28d": dict(cardinality=1, bottleneck_width=28, **TINY),
    "tiny-4x11d": dict(cardinality=4, bottleneck_width=11, **TINY),
    "resnext50_32x4d": dict(layers=(3, 4, 6, 3), cardinality=32, bottleneck_width=4, **IMAGENET),
    "resnext101_32x4d": dict(layers=(3, 4, 23, 3), cardinality=32, bottleneck_width=4, **IMAGENET),
    "resnext101_64x4d": dict(layers=(3, 4, 23, 3), cardinality=64, bottleneck_width=4, **IMAGENET),
    "cifar-29-8x64d": dict(cardinality=8, bottleneck_width=64, **CIFAR),
    "cifar-29-16x64d": dict(cardinality=16, bottleneck_width=64, **CIFAR),
}
