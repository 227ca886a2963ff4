"""Very Deep Convolutional Networks for Large-Scale Image Recognition.

Simonyan, Zisserman, 2014. https://arxiv.org/abs/1409.1556

Keep the classical ConvNet (convolutions, max pooling, three fully connected layers) and push its
depth to 16-19 weight layers by using only very small 3x3 filters, stride 1, throughout. A stack of
two (three) 3x3 convolutions sees a 5x5 (7x7) field with fewer weights and more non-linearities
than one large filter (Section 2.3); depth, not normalisation or large filters, lowers the error.

The network reads one image size: its first fully connected layer reads the 7x7x512 map of a
224x224 crop. At test time the paper turns the fully connected layers into convolutions and
averages the class-score map over a whole image of any size (Section 3.2, `VGG.dense`).
torchvision's VGG instead pools every map to 7x7 (AdaptiveAvgPool2d) before the head; the
`torchvision-*` flavors do that too (`adaptive_pool=True`).
"""

import math
import re

import torch
import torch.nn as nn
import torch.nn.functional as F

from common.layers import ClassifierMixin
from papers.alexnet.model import LocalResponseNorm  # A-LRN takes AlexNet's LRN and its parameters (Section 2.1)


class ConvBlock(nn.Sequential):
    """The layers between two max poolings, then the 2x2/2 max pooling (one column group of Table 1).

    Args:
        in_chans: channels of the input.
        layers: Table 1's names, e.g. ("conv3-256", "conv3-256", "conv1-256") or ("conv3-64", "LRN"):
            convK-C is a KxK convolution with C filters, stride 1 and padding (K - 1) / 2 (the
            resolution is kept), followed by a ReLU; LRN is local response normalisation.
        batch_norm: batch norm between every convolution and its ReLU (torchvision's vgg*_bn; the
            paper has none).
        width: multiplies every convolution's C, rounded to the nearest integer (halves up), at
            least 1 (see `VGG`; 1: Table 1's C).
    """

    def __init__(self, in_chans: int, layers: tuple[str, ...], batch_norm: bool = False, width: float = 1.0):
        modules, chans = [], in_chans
        for layer in layers:
            if layer == "LRN":
                modules.append(LocalResponseNorm())  # k = 2, n = 5, alpha = 1e-4, beta = 0.75
                continue
            match = re.fullmatch(r"conv(\d+)-(\d+)", layer)
            if match is None:
                raise ValueError(f"unknown layer '{layer}'; Table 1 has convK-C and LRN")
            k, C = map(int, match.groups())
            C = max(1, math.floor(C * width + 0.5))  # Table 1's C at width 1
            modules.append(nn.Conv2d(chans, C, kernel_size=k, padding=(k - 1) // 2))  # (B, C, H, W)
            if batch_norm:
                modules.append(nn.BatchNorm2d(C))
            modules.append(nn.ReLU(inplace=True))
            chans = C
        modules.append(nn.MaxPool2d(kernel_size=2, stride=2))  # (B, C, H/2, W/2)
        super().__init__(*modules)
        self.out_chans = chans


class VGG(ClassifierMixin, nn.Module):
    """A VGG ConvNet: blocks of small convolutions, each ending in max pooling, then FC-4096,
    FC-4096 and FC-classes (Table 1), dropout after the first two fully connected layers.

    Args:
        blocks: the layers of each block (see `ConvBlock`); the paper's five blocks are Table 1's
            columns A to E.
        batch_norm: batch norm after every convolution (torchvision's vgg*_bn, not in the paper).
        width: ours, not the paper's: every convolution's number of filters multiplied by it
            (rounded to the nearest integer, at least 1), so that the paper's configurations, at
            their depths and in their layout, train on a CPU in minutes (0.25: 16 to 128 filters
            instead of 64 to 512). Local response normalisation is unchanged, and the fully
            connected layers keep `fc_width`. 1: the paper's widths.
        fc_width: units of the two hidden fully connected layers (4096).
        dropout: dropout ratio after them (0.5, Section 3.1).
        adaptive_pool: torchvision's AdaptiveAvgPool2d((7, 7)) before the head, so that any image
            size gives a 7x7 map; the paper's nets have none and read img_size alone.
        init: "glorot": Glorot & Bengio's uniform initialisation, zero biases (end of Section 3.1);
            "torchvision": torchvision's VGG initialisation.
        num_classes: outputs of the last fully connected layer.
        in_chans: input channels.
        img_size: the image side H = W the head is built for (224: a 7x7 map after five poolings).
    """

    classifier_name = "fc8"  # no_weight_decay, get_classifier, reset_classifier: common.layers.ClassifierMixin

    def __init__(
        self,
        blocks: tuple[tuple[str, ...], ...],
        batch_norm: bool = False,
        width: float = 1.0,
        fc_width: int = 4096,
        dropout: float = 0.5,
        adaptive_pool: bool = False,
        init: str = "glorot",
        num_classes: int = 1000,
        in_chans: int = 3,
        img_size: int | tuple[int, int] = 224,
    ):
        super().__init__()
        if init not in ("glorot", "torchvision"):
            raise ValueError(f"unknown init '{init}'; choose from: glorot, torchvision")
        if not width > 0:
            raise ValueError(f"width multiplies the convolutions' filters and must be positive, got {width}")
        H, W = (img_size, img_size) if isinstance(img_size, int) else img_size
        self.in_chans, self.img_size, self.adaptive_pool, self.init = in_chans, (H, W), adaptive_pool, init
        layers, chans = [], in_chans
        for block in blocks:
            layers.append(ConvBlock(chans, block, batch_norm, width))
            chans = layers[-1].out_chans
        self.blocks = nn.ModuleList(layers)
        self.grid = (7, 7) if adaptive_pool else (self.feature_side(H), self.feature_side(W))  # the map the head reads
        if min(self.grid) < 1:
            raise ValueError(f"a {H}x{W} image is too small for {len(blocks)} max poolings")
        self.pool = nn.AdaptiveAvgPool2d((7, 7)) if adaptive_pool else nn.Identity()
        self.num_features = chans * self.grid[0] * self.grid[1]  # 512 x 7 x 7 = 25088 in the paper
        self.fc6 = nn.Linear(self.num_features, fc_width)  # FC-4096
        self.fc7 = nn.Linear(fc_width, fc_width)  # FC-4096
        self.fc8 = nn.Linear(fc_width, num_classes)  # FC-1000, then the soft-max (in the loss)
        self.dropout = nn.Dropout(dropout)
        self.reset_parameters()

    def feature_side(self, side: int) -> int:
        """The side of the last feature map for an input side (each max pooling floors side / 2)."""
        for _ in self.blocks:
            side //= 2
        return side

    def reset_parameters(self) -> None:
        for m in self.modules():
            if self.init == "glorot" and isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_uniform_(m.weight)  # Glorot & Bengio (2010), Eq. 16
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Conv2d):  # torchvision's VGG
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)
            if isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def init_classifier(self, layer: nn.Linear) -> None:
        """A new last layer (reset_classifier) starts as the flavor initialises it."""
        if self.init == "glorot":
            nn.init.xavier_uniform_(layer.weight)
        else:
            nn.init.normal_(layer.weight, 0, 0.01)
        nn.init.zeros_(layer.bias)

    def resize_position_embeddings(self, img_size: int | tuple[int, int]) -> None:
        """The trainer's hook for fine-tuning at another image size (common.pretrained); VGG has no
        position embeddings. With torchvision's adaptive pooling any size gives the head its 7x7 map,
        so only `img_size` changes; the paper's head reads one size and refuses another."""
        H, W = (img_size, img_size) if isinstance(img_size, int) else img_size
        if not self.adaptive_pool and (self.feature_side(H), self.feature_side(W)) != self.grid:
            raise ValueError(f"the paper's VGG head reads a {self.grid[0]}x{self.grid[1]} map, which {H}x{W} "
                             f"images do not give; use a torchvision-* flavor (adaptive pooling)")
        self.img_size = (H, W)

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        x = images  # (B, C, H, W)
        for block in self.blocks:
            x = block(x)  # each block halves H and W: (B, 512, H/32, W/32) after five
        return x

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(x).flatten(1)  # (B, 512 * 7 * 7)
        x = self.dropout(F.relu(self.fc6(x), inplace=True))  # (B, 4096)
        x = self.dropout(F.relu(self.fc7(x), inplace=True))  # (B, 4096)
        return self.fc8(x)  # (B, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Classify images (B, C, H, W) of the size the head reads into logits (B, classes)."""
        return self.forward_head(self.forward_features(images))

    def dense(self, images: torch.Tensor) -> torch.Tensor:
        """Dense evaluation (Section 3.2): the first fully connected layer becomes a grid x grid
        convolution and the other two 1x1 convolutions; the fully convolutional net runs over the
        whole image (of side >= img_size) and its class-score map is averaged. At img_size it is
        `forward` in eval mode."""
        if self.adaptive_pool:
            raise ValueError("dense evaluation needs the paper's head (no adaptive pooling)")
        x = self.forward_features(images)  # (B, 512, h, w)
        (kh, kw), out6 = self.grid, self.fc6.out_features
        W6 = self.fc6.weight.view(out6, -1, kh, kw)  # FC-4096 as a 7x7 convolution
        x = F.relu(F.conv2d(x, W6, self.fc6.bias))  # (B, 4096, h - 6, w - 6)
        x = F.relu(F.conv2d(x, self.fc7.weight[:, :, None, None], self.fc7.bias))  # (B, 4096, h', w')
        scores = F.conv2d(x, self.fc8.weight[:, :, None, None], self.fc8.bias)  # class-score map (B, classes, h', w')
        return scores.mean(dim=(2, 3))  # spatially averaged, (B, classes)


# Table 1: the five blocks of configurations A to E (each block ends with a max pooling).
A = (("conv3-64",), ("conv3-128",), ("conv3-256",) * 2, ("conv3-512",) * 2, ("conv3-512",) * 2)
A_LRN = (("conv3-64", "LRN"), *A[1:])
B = (("conv3-64",) * 2, ("conv3-128",) * 2, ("conv3-256",) * 2, ("conv3-512",) * 2, ("conv3-512",) * 2)
C = (*B[:2], ("conv3-256",) * 2 + ("conv1-256",), ("conv3-512",) * 2 + ("conv1-512",),
     ("conv3-512",) * 2 + ("conv1-512",))
D = (*B[:2], ("conv3-256",) * 3, ("conv3-512",) * 3, ("conv3-512",) * 3)
E = (*B[:2], ("conv3-256",) * 4, ("conv3-512",) * 4, ("conv3-512",) * 4)
TORCHVISION = dict(adaptive_pool=True, init="torchvision")  # torchvision.models.vgg*: pooled to 7x7 first

# tiny: the repo's own for 32x32 shapes (four blocks of 3x3 convolutions, 16 to 64 filters: 32 -> 2,
# FC-128 twice);
# the paper's configurations of Table 1 (224x224, 1000 classes) under its names; batch-norm
# variants as torchvision's vgg*_bn (the paper has none), still without adaptive pooling; and the
# torchvision-equal flavors that `from_torchvision` loads.
FLAVORS = {
    "tiny": dict(blocks=(("conv3-16",), ("conv3-32",), ("conv3-64",) * 2, ("conv3-64",) * 2), fc_width=128,
                 num_classes=10, img_size=32),
    "VGG-11": dict(blocks=A),
    "VGG-11-LRN": dict(blocks=A_LRN),
    "VGG-13": dict(blocks=B),
    "VGG-16-C": dict(blocks=C),
    "VGG-16": dict(blocks=D),
    "VGG-19": dict(blocks=E),
    **{f"VGG-{n}-BN": dict(blocks=cfg, batch_norm=True) for n, cfg in ((11, A), (13, B), (16, D), (19, E))},
    **{f"torchvision-vgg{n}": dict(blocks=cfg, **TORCHVISION) for n, cfg in ((11, A), (13, B), (16, D), (19, E))},
    **{f"torchvision-vgg{n}_bn": dict(blocks=cfg, batch_norm=True, **TORCHVISION)
       for n, cfg in ((11, A), (13, B), (16, D), (19, E))},
}
