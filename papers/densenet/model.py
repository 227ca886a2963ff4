"""Densely Connected Convolutional Networks.

Huang, Liu, van der Maaten, Weinberger, 2016. https://arxiv.org/abs/1608.06993

Inside a dense block every layer takes the feature-maps of all layers before it,
concatenated, as its input, x_l = H_l([x_0, x_1, ..., x_{l-1}]) (Eq. 2), and adds k
new ones (the growth rate) to this "collective knowledge". Features are reused rather
than relearned, so the layers are narrow and the networks small; transition layers
(batch norm, 1x1 convolution, 2x2 average pooling) between the blocks halve the map and,
in DenseNet-BC, the number of feature-maps (compression theta = 0.5).

Variable-size batches: images are zero-padded at the bottom and right, and a mask
(B, H, W) marks the valid pixels. Every convolution of a DenseNet comes after a batch
norm (pre-activation, "BN-ReLU-Conv"), which counts only valid pixels and sets the padding
to zero (common.layers), so no convolution reads anything but zeros beyond an image's edge.
The 2x2 average pooling of a transition keeps only the outputs whose whole window is
valid (`pooled_mask`): an image of odd side alone loses its last row, as it does here.
With mask=None every layer is the plain one.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from common.layers import ClassifierMixin, MaskedBatchNorm2d, downsample_mask, masked, masked_mean


def pooled_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """The valid outputs of a 2x2 average pool with stride 2 (no padding, floor): those whose
    2x2 window lies inside the image. A top-left h x w rectangle becomes floor(h/2) x floor(w/2)."""
    return None if mask is None else mask[:, 1::2, 1::2]


class DenseLayer(nn.Module):
    """H_l of Eq. 2, the composite function BN-ReLU-Conv(1x1)-BN-ReLU-Conv(3x3) of DenseNet-B
    ("Bottleneck layers", Section 3), or BN-ReLU-Conv(3x3) of the basic DenseNet.

    Args:
        in_chans: k_0 + k (l - 1), the feature-maps of all preceding layers.
        growth_rate: k, the feature-maps this layer adds.
        bottleneck: the 1x1 convolution produces bottleneck * k feature-maps (4k in the paper);
            0: no bottleneck layer (the basic DenseNet).
        dropout: after each convolution (Section 4.2: 0.2 on the data sets without augmentation).
    """

    def __init__(self, in_chans: int, growth_rate: int, bottleneck: int = 4, dropout: float = 0.0):
        super().__init__()
        self.norm1 = MaskedBatchNorm2d(in_chans)
        if bottleneck:
            width = bottleneck * growth_rate
            self.conv1 = nn.Conv2d(in_chans, width, kernel_size=1, bias=False)
            self.norm2 = MaskedBatchNorm2d(width)
        else:
            width, self.conv1, self.norm2 = in_chans, None, None
        self.conv2 = nn.Conv2d(width, growth_rate, kernel_size=3, padding=1, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, features: list[torch.Tensor], mask: torch.Tensor | None = None) -> torch.Tensor:
        """x_l from the list [x_0, ..., x_{l-1}] of (B, C_i, H, W) maps."""
        x = torch.cat(features, 1)  # [x_0, x_1, ..., x_{l-1}]: (B, k_0 + k (l - 1), H, W)
        x = F.relu(self.norm1(x, mask), inplace=True)
        if self.conv1 is not None:
            x = self.dropout(self.conv1(x))  # the bottleneck: (B, 4k, H, W)
            x = F.relu(self.norm2(x, mask), inplace=True)
        return self.dropout(self.conv2(x))  # x_l: (B, k, H, W)


class DenseBlock(nn.Module):
    """Layers each connected to every later one (Fig. 1): a block of n layers adds n k feature-maps.

    Args:
        num_layers: n.
        in_chans: k_0, the feature-maps entering the block.
        growth_rate, bottleneck, dropout: as `DenseLayer`.
    """

    def __init__(self, num_layers: int, in_chans: int, growth_rate: int, bottleneck: int = 4, dropout: float = 0.0):
        super().__init__()
        self.layers = nn.ModuleList(DenseLayer(in_chans + i * growth_rate, growth_rate, bottleneck, dropout)
                                    for i in range(num_layers))
        self.out_chans = in_chans + num_layers * growth_rate

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        features = [x]  # x_0: (B, k_0, H, W)
        for layer in self.layers:
            features.append(layer(features, mask))  # x_l: (B, k, H, W)
        return torch.cat(features, 1)  # (B, k_0 + n k, H, W)


class Transition(nn.Module):
    """Between two dense blocks: BN-ReLU-Conv(1x1) to floor(theta m) feature-maps, then 2x2 average
    pooling with stride 2 ("Pooling layers" and "Compression", Section 3).

    Args:
        in_chans: m, the feature-maps of the block before.
        out_chans: floor(theta m).
        dropout: after the convolution.
    """

    def __init__(self, in_chans: int, out_chans: int, dropout: float = 0.0):
        super().__init__()
        self.norm = MaskedBatchNorm2d(in_chans)
        self.conv = nn.Conv2d(in_chans, out_chans, kernel_size=1, bias=False)
        self.dropout = nn.Dropout(dropout)
        self.pool = nn.AvgPool2d(kernel_size=2, stride=2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = self.dropout(self.conv(F.relu(self.norm(x, mask), inplace=True)))  # (B, theta m, H, W)
        return self.pool(x), pooled_mask(mask)  # (B, theta m, H/2, W/2)


class Stem(nn.Module):
    """The convolution before the first dense block.

    "imagenet": 7x7 convolution with stride 2, batch norm, ReLU, 3x3 max pool with stride 2
    (Table 1; 224x224 becomes 56x56). "cifar": one 3x3 convolution at full resolution
    (Implementation Details, Section 3); the first dense layer's BN-ReLU follows it.
    """

    def __init__(self, kind: str, in_chans: int, width: int):
        super().__init__()
        if kind == "imagenet":
            self.conv = nn.Conv2d(in_chans, width, kernel_size=7, stride=2, padding=3, bias=False)
            self.norm = MaskedBatchNorm2d(width)
            self.pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        else:
            self.conv = nn.Conv2d(in_chans, width, kernel_size=3, padding=1, bias=False)
            self.norm = self.pool = None

    def forward(self, images: torch.Tensor, mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        mask = downsample_mask(mask, self.conv.stride[0])
        x = self.conv(images)  # (B, width, H/2, W/2) or (B, width, H, W)
        if self.pool is not None:
            x = F.relu(self.norm(x, mask), inplace=True)
            # x >= 0 after the ReLU and zero on the padding, so at the valid outputs the pool takes the
            # max of its own -inf padding; the windows on the edge reach into the padding: re-zero it.
            mask = downsample_mask(mask, self.pool.stride)
            x = masked(self.pool(x), mask)  # (B, width, H/4, W/4)
        return x, mask


class DenseNet(ClassifierMixin, nn.Module):
    """DenseNet classifier: a stem, dense blocks with transition layers between them, a final
    BN-ReLU, global average pooling and a linear (softmax) classifier.

    Args:
        growth_rate: k.
        block_config: layers per dense block, e.g. (6, 12, 24, 16) for DenseNet-121 or
            (16, 16, 16) for DenseNet-BC-100.
        stem: "imagenet" (7x7/2 convolution and 3x3/2 max pool) or "cifar" (one 3x3 convolution).
        stem_chans: the stem's output channels; default 2k (DenseNet-BC; the basic DenseNet uses 16).
        bottleneck: bottleneck width in multiples of k (4: DenseNet-B); 0: no bottleneck layers.
        compression: theta, transitions keep floor(theta m) of m feature-maps (0.5: DenseNet-C).
        dropout: after every convolution but the first (Section 4.2).
        num_classes: outputs of the classifier.
        in_chans: input channels.
    """

    def __init__(
        self,
        growth_rate: int = 32,
        block_config: tuple[int, ...] = (6, 12, 24, 16),
        stem: str = "imagenet",
        stem_chans: int | None = None,
        bottleneck: int = 4,
        compression: float = 0.5,
        dropout: float = 0.0,
        num_classes: int = 1000,
        in_chans: int = 3,
    ):
        super().__init__()
        if stem not in ("imagenet", "cifar"):
            raise ValueError(f"unknown stem '{stem}'; choose from: imagenet, cifar")
        if not block_config or min(block_config) < 1:
            raise ValueError(f"every dense block needs at least one layer, got {tuple(block_config)}")
        if not 0 < compression <= 1:
            raise ValueError(f"the compression factor theta must be in (0, 1], got {compression}")
        self.in_chans = in_chans
        chans = 2 * growth_rate if stem_chans is None else stem_chans
        self.stem = Stem(stem, in_chans, chans)
        blocks, transitions = [], []
        for i, num_layers in enumerate(block_config):
            blocks.append(DenseBlock(num_layers, chans, growth_rate, bottleneck, dropout))
            chans = blocks[-1].out_chans
            if i < len(block_config) - 1:  # a transition between two blocks, none after the last
                out_chans = math.floor(compression * chans)
                transitions.append(Transition(chans, out_chans, dropout))
                chans = out_chans
        self.dense_blocks = nn.ModuleList(blocks)
        self.transitions = nn.ModuleList(transitions)
        self.norm = MaskedBatchNorm2d(chans)  # the BN-ReLU before the global pooling
        self.num_features = chans
        self.fc = nn.Linear(chans, num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """He initialisation ([10] of Section 4.2) as the authors' Torch code draws it: normal with
        std sqrt(2 / (k k out_chans)); batch norm scale 1 and shift 0; the classifier's bias 0 (its
        weights keep nn.Linear's uniform default, as Torch's)."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.zeros_(self.fc.bias)

    def init_classifier(self, layer: nn.Linear) -> None:
        """A new classifier (reset_classifier, common.layers.ClassifierMixin) starts as in `reset_parameters`."""
        nn.init.zeros_(layer.bias)

    def forward_features(self, images: torch.Tensor, mask: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The last feature map after its BN-ReLU (B, num_features, h, w), and its valid pixels (B, h, w) or None."""
        x, mask = self.stem(images, mask)  # (B, 2k, H/4, W/4) for imagenet, (B, 2k, H, W) for cifar
        for i, block in enumerate(self.dense_blocks):
            x = block(x, mask)  # (B, m, h, w)
            if i < len(self.transitions):
                x, mask = self.transitions[i](x, mask)  # (B, theta m, h/2, w/2)
        return F.relu(self.norm(x, mask), inplace=True), mask

    def forward_head(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = masked_mean(x, mask)  # global average pooling over the valid pixels: (B, num_features)
        return self.fc(x)  # (B, classes)

    def forward(self, images: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Classify a batch of images (B, C, H, W), zero-padded outside mask (B, H, W) (True on valid
        pixels, a top-left rectangle per image; None: all valid), into logits (B, classes)."""
        return self.forward_head(*self.forward_features(images, mask))


IMAGENET = dict(growth_rate=32, stem="imagenet", bottleneck=4, compression=0.5)  # Table 1: DenseNet-BC, k = 32
BC = dict(stem="cifar", bottleneck=4, compression=0.5, num_classes=10)  # DenseNet-BC, stem of 2k channels
BASIC = dict(stem="cifar", stem_chans=16, bottleneck=0, compression=1.0, num_classes=10)  # Section 3

# Our tiny flavor for 32x32 shapes; the ImageNet models of Table 1 (224x224, 1000 classes); the CIFAR
# models of Table 2 (three blocks of equal depth: L = 3n + 4 layers, DenseNet-BC: L = 6n + 4).
FLAVORS = {
    "tiny": dict(growth_rate=8, block_config=(3, 3, 3), **BC),  # DenseNet-BC, L = 22, k = 8
    "DenseNet-121": dict(block_config=(6, 12, 24, 16), **IMAGENET),
    "DenseNet-169": dict(block_config=(6, 12, 32, 32), **IMAGENET),
    "DenseNet-201": dict(block_config=(6, 12, 48, 32), **IMAGENET),
    "DenseNet-264": dict(block_config=(6, 12, 64, 48), **IMAGENET),
    "DenseNet-40": dict(growth_rate=12, block_config=(12, 12, 12), **BASIC),
    "DenseNet-100-k12": dict(growth_rate=12, block_config=(32, 32, 32), **BASIC),
    "DenseNet-100-k24": dict(growth_rate=24, block_config=(32, 32, 32), **BASIC),
    "DenseNet-BC-100": dict(growth_rate=12, block_config=(16, 16, 16), **BC),
    "DenseNet-BC-250": dict(growth_rate=24, block_config=(41, 41, 41), **BC),
    "DenseNet-BC-190": dict(growth_rate=40, block_config=(31, 31, 31), **BC),
}
