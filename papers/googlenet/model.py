"""Going Deeper with Convolutions.

Szegedy, Liu, Jia, Sermanet, Reed, Anguelov, Erhan, Vanhoucke, Rabinovich, 2014.
https://arxiv.org/abs/1409.4842

The Inception module covers a layer's correlated units with 1x1, 3x3 and 5x5 convolutions and a
3x3 max pooling side by side, their outputs concatenated; 1x1 convolutions first reduce the
channels the expensive 3x3 and 5x5 convolutions read (Fig. 2b). Stacking nine such modules gives
GoogLeNet (Table 1): 22 layers deep, 12 times fewer parameters than AlexNet, within a budget of
1.5 billion multiply-adds; two auxiliary classifiers on 4a and 4d add their loss (weight 0.3) in
training only (Section 5).

The paper's own network has local response normalisation in its stem and no batch norm. The
`torchvision` flavor is torchvision's GoogLeNet: batch norm after every convolution, no LRN, a
3x3 convolution in the "5x5" branch, a 2x2 pooling before 5a, auxiliary classifiers that pool
adaptively to 4x4 and dropout 0.2 (see README.md).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from common.layers import ClassifierMixin


class Conv(nn.Module):
    """A convolution and its ReLU ("all the convolutions ... use rectified linear activation").

    batch_norm: torchvision's BasicConv2d, a convolution without bias, batch norm (eps 1e-3), ReLU.
    """

    def __init__(self, in_chans: int, out_chans: int, kernel_size: int, stride: int = 1, padding: int = 0,
                 batch_norm: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(in_chans, out_chans, kernel_size, stride, padding, bias=not batch_norm)
        self.bn = nn.BatchNorm2d(out_chans, eps=1e-3) if batch_norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)), inplace=True)  # (B, out_chans, H / stride, W / stride)


def max_pool(kernel_size: int = 3, stride: int = 2, padding: int = 0) -> nn.MaxPool2d:
    """Max pooling that rounds the output size up, as Caffe (and torchvision's GoogLeNet) do:
    3x3/2 turns 112 into 56 (Table 1)."""
    return nn.MaxPool2d(kernel_size, stride, padding, ceil_mode=True)


class Inception(nn.Module):
    """The Inception module with dimension reductions (Fig. 2b), one row of Table 1.

    Args:
        in_chans: channels of the previous layer.
        n1x1, n3x3_reduce, n3x3, n5x5_reduce, n5x5, pool_proj: Table 1's columns "#1x1",
            "#3x3 reduce", "#3x3", "#5x5 reduce", "#5x5", "pool proj".
        k5: the kernel of the "5x5" branch (torchvision's GoogLeNet has 3 there).
        batch_norm: batch norm in every convolution (torchvision).
    """

    def __init__(self, in_chans: int, n1x1: int, n3x3_reduce: int, n3x3: int, n5x5_reduce: int, n5x5: int,
                 pool_proj: int, k5: int = 5, batch_norm: bool = False):
        super().__init__()
        self.branch1 = Conv(in_chans, n1x1, 1, batch_norm=batch_norm)
        self.branch2 = nn.Sequential(Conv(in_chans, n3x3_reduce, 1, batch_norm=batch_norm),
                                     Conv(n3x3_reduce, n3x3, 3, padding=1, batch_norm=batch_norm))
        self.branch3 = nn.Sequential(Conv(in_chans, n5x5_reduce, 1, batch_norm=batch_norm),
                                     Conv(n5x5_reduce, n5x5, k5, padding=k5 // 2, batch_norm=batch_norm))
        self.branch4 = nn.Sequential(max_pool(3, stride=1, padding=1),
                                     Conv(in_chans, pool_proj, 1, batch_norm=batch_norm))
        self.out_chans = n1x1 + n3x3 + n5x5 + pool_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branches = [self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)]  # (B, n_i, H, W) each
        return torch.cat(branches, dim=1)  # filter concatenation: (B, out_chans, H, W)


class AuxClassifier(nn.Module):
    """The auxiliary classifier on 4a and 4d (Section 5): 5x5 average pooling with stride 3 (14x14 ->
    4x4), a 1x1 convolution with 128 filters, a fully connected layer of 1024 units, dropout 0.7
    and a linear classifier.

    Args:
        in_chans: channels of the module it reads (512 for 4a, 528 for 4d).
        grid: the side of the pooled map; with adaptive=False the one the average pooling gives for
            the map side it reads.
        pool: the average pooling's kernel and stride (5, 3).
        adaptive: torchvision's adaptive average pooling to grid x grid instead.
    """

    def __init__(self, in_chans: int, num_classes: int, grid: int = 4, width: int = 128, fc_width: int = 1024,
                 dropout: float = 0.7, pool: tuple[int, int] = (5, 3), adaptive: bool = False,
                 batch_norm: bool = False):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(grid) if adaptive else nn.AvgPool2d(pool[0], stride=pool[1])
        self.conv = Conv(in_chans, width, 1, batch_norm=batch_norm)
        self.fc1 = nn.Linear(width * grid * grid, fc_width)
        self.fc2 = nn.Linear(fc_width, num_classes)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(x)  # (B, C, 4, 4) at 224
        x = self.conv(x).flatten(1)  # (B, 128 * 4 * 4)
        x = self.dropout(F.relu(self.fc1(x), inplace=True))  # (B, 1024)
        return self.fc2(x)  # (B, classes)


class Stem(nn.Module):
    """The layers before 3a (Table 1 and Fig. 3): conv 7x7/2, max pool 3x3/2, LRN, conv 1x1 (the
    "3x3 reduce"), conv 3x3, LRN, max pool 3x3/2: 224x224 becomes 28x28x192.

    Args:
        widths: filters of the 7x7, 1x1 and 3x3 convolutions (64, 64, 192).
        kernel_size, stride: of the first convolution (7, 2); the tiny flavor's is 3x3/1.
        first_pool: the 3x3/2 max pooling after the first convolution (the tiny flavor has none).
        lrn: local response normalisation as in Caffe's reference model (size 5, alpha 1e-4 over the
            size, beta 0.75, k 1); torchvision has none.
    """

    def __init__(self, in_chans: int, widths: tuple[int, int, int] = (64, 64, 192), kernel_size: int = 7,
                 stride: int = 2, first_pool: bool = True, lrn: bool = True, batch_norm: bool = False):
        super().__init__()
        w1, w2, w3 = widths
        norm = lambda: nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75, k=1.0) if lrn else nn.Identity()
        self.conv1 = Conv(in_chans, w1, kernel_size, stride, padding=kernel_size // 2, batch_norm=batch_norm)
        self.pool1 = max_pool() if first_pool else nn.Identity()
        self.norm1 = norm()
        self.conv2_reduce = Conv(w1, w2, 1, batch_norm=batch_norm)
        self.conv2 = Conv(w2, w3, 3, padding=1, batch_norm=batch_norm)
        self.norm2 = norm()
        self.pool2 = max_pool()
        self.out_chans = w3

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.pool1(self.conv1(images))  # (B, 64, 112, 112) -> (B, 64, 56, 56)
        x = self.conv2(self.conv2_reduce(self.norm1(x)))  # (B, 192, 56, 56)
        return self.pool2(self.norm2(x))  # (B, 192, 28, 28)


class GoogLeNet(ClassifierMixin, nn.Module):
    """GoogLeNet (Table 1): the stem, Inception modules in stages separated by max pooling, global
    average pooling, dropout and a linear classifier; auxiliary classifiers in training.

    Args:
        stages: the Inception modules of each stage as Table 1's rows (n1x1, n3x3_reduce, n3x3,
            n5x5_reduce, n5x5, pool_proj); the modules are named 3a, 3b, 4a, ... by stage and order.
        stem: keyword arguments of `Stem` (widths, kernel_size, stride, first_pool).
        pool_kernels: the max pooling between consecutive stages (3x3/2; torchvision's last is 2x2/2).
        aux_at: the modules whose output an auxiliary classifier reads ("4a", "4d").
        aux_widths: its 1x1 convolution's filters and fully connected units (128, 1024).
        aux_pool: its average pooling's kernel and stride (5, 3).
        aux_adaptive: torchvision's adaptive 4x4 average pooling instead.
        aux_weight: the weight of each auxiliary loss (0.3).
        aux_logits: build the auxiliary classifiers (False: inference only, as torchvision's
            pretrained model).
        dropout, aux_dropout: before the main classifier (0.4) and in the auxiliary ones (0.7).
        lrn: local response normalisation in the stem (the paper's; not in torchvision's).
        batch_norm: batch norm in every convolution (torchvision's; not in the paper's).
        k5: the kernel of the "5x5" branches (torchvision: 3).
        init: "caffe": the BVLC Caffe reference model's fillers (the paper states none);
            "torchvision": torchvision's GoogLeNet initialisation.
        num_classes, in_chans: the data set's classes and input channels.
        img_size: the image side the auxiliary classifiers' fully connected layers are built for.
    """

    def __init__(
        self,
        stages: tuple[tuple[tuple[int, ...], ...], ...],
        stem: dict | None = None,
        pool_kernels: tuple[int, ...] = (3, 3),
        aux_at: tuple[str, ...] = ("4a", "4d"),
        aux_widths: tuple[int, int] = (128, 1024),
        aux_pool: tuple[int, int] = (5, 3),
        aux_adaptive: bool = False,
        aux_weight: float = 0.3,
        aux_logits: bool = True,
        dropout: float = 0.4,
        aux_dropout: float = 0.7,
        lrn: bool = True,
        batch_norm: bool = False,
        k5: int = 5,
        init: str = "caffe",
        num_classes: int = 1000,
        in_chans: int = 3,
        img_size: int | tuple[int, int] = 224,
    ):
        super().__init__()
        if init not in ("caffe", "torchvision"):
            raise ValueError(f"unknown init '{init}'; choose from: caffe, torchvision")
        if len(pool_kernels) != len(stages) - 1:
            raise ValueError(f"{len(stages)} stages need {len(stages) - 1} max poolings between them, "
                             f"got pool_kernels {pool_kernels}")
        H, W = (img_size, img_size) if isinstance(img_size, int) else img_size
        self.in_chans, self.img_size, self.init, self.aux_weight = in_chans, (H, W), init, aux_weight
        self.aux_pool = aux_pool
        # torchvision's transform_input as an affine map of each input channel, kept in the state dict
        # (so that a checkpoint restores it); the identity for the paper's model.
        self.register_buffer("input_scale", torch.ones(in_chans))
        self.register_buffer("input_shift", torch.zeros(in_chans))

        self.stem = Stem(in_chans, **(stem or {}), lrn=lrn, batch_norm=batch_norm)
        self.pools = nn.ModuleList(max_pool(k, stride=2) for k in pool_kernels)
        modules, self.names, self.stage_of = [], [], []
        chans = self.stem.out_chans
        for s, stage in enumerate(stages):
            for j, row in enumerate(stage):
                modules.append(Inception(chans, *row, k5=k5, batch_norm=batch_norm))
                chans = modules[-1].out_chans
                self.names.append(f"{3 + s}{'abcdefgh'[j]}")  # 3a, 3b, 4a, ..., 5b
                self.stage_of.append(s)
        self.inceptions = nn.ModuleList(modules)
        unknown = set(aux_at) - set(self.names)
        if unknown:
            raise ValueError(f"no Inception module named {', '.join(sorted(unknown))}; there are {', '.join(self.names)}")

        self.aux = nn.ModuleDict()
        if aux_logits:
            sides = self._module_sides((H, W))
            for name in aux_at:
                side = 4 if aux_adaptive else self._aux_side(sides[name])  # 5x5/3 average pooling: 14 -> 4
                if side < 1:
                    raise ValueError(f"{H}x{W} images leave {name} a map of {sides[name]}, too small for the "
                                     f"auxiliary classifier's {aux_pool[0]}x{aux_pool[0]} average pooling")
                self.aux[name] = AuxClassifier(self.inceptions[self.names.index(name)].out_chans, num_classes, side,
                                               *aux_widths, aux_dropout, aux_pool, aux_adaptive, batch_norm)
        self.num_features = chans  # 1024
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(chans, num_classes)  # the linear layer before the soft-max
        self.reset_parameters()

    def _aux_side(self, side: tuple[int, int]) -> int:
        """The side of the auxiliary classifiers' pooled map for a module's map (h, w)."""
        kernel, stride = self.aux_pool
        return (min(side) - kernel) // stride + 1

    def _module_sides(self, size: tuple[int, int]) -> dict[str, tuple[int, int]]:
        """Each Inception module's map size (h, w) for an input size (an Inception module keeps it)."""
        def conv(side: int, m: nn.Conv2d) -> int:
            return (side + 2 * m.padding[0] - m.kernel_size[0]) // m.stride[0] + 1

        def pool(side: int, m: nn.Module) -> int:  # ceil_mode
            return side if isinstance(m, nn.Identity) else -(-(side - m.kernel_size) // m.stride) + 1

        def stem(side: int) -> int:
            return pool(pool(conv(side, self.stem.conv1.conv), self.stem.pool1), self.stem.pool2)

        sides, (h, w) = {}, (stem(size[0]), stem(size[1]))
        for i, name in enumerate(self.names):
            if i and self.stage_of[i] != self.stage_of[i - 1]:
                p = self.pools[self.stage_of[i - 1]]
                h, w = pool(h, p), pool(w, p)
            sides[name] = (h, w)
        return sides

    def reset_parameters(self) -> None:
        classifiers = {self.fc, *(aux.fc2 for aux in self.aux.values())}
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)) and self.init == "caffe":
                # Caffe's "xavier" filler: uniform in +-sqrt(3 / fan_in); biases 0.2, 0 for the classifiers
                nn.init.kaiming_uniform_(m.weight, nonlinearity="linear")
                nn.init.constant_(m.bias, 0.0 if m in classifiers else 0.2)
            elif isinstance(m, (nn.Conv2d, nn.Linear)):  # torchvision: the biases keep nn.Linear's default
                nn.init.trunc_normal_(m.weight, mean=0.0, std=0.01, a=-2, b=2)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def reset_classifier(self, num_classes: int) -> None:
        """New last layers, of the main and the auxiliary classifiers, for num_classes (the main one:
        common.layers.ClassifierMixin's)."""
        super().reset_classifier(num_classes)
        for aux in self.aux.values():
            aux.fc2 = self.new_classifier(aux.fc2, num_classes)

    def init_classifier(self, layer: nn.Linear) -> None:
        """How a new last layer starts: as the flavor's init starts the last layers."""
        if self.init == "caffe":
            nn.init.kaiming_uniform_(layer.weight, nonlinearity="linear")
            nn.init.zeros_(layer.bias)
        else:
            nn.init.trunc_normal_(layer.weight, mean=0.0, std=0.01, a=-2, b=2)

    def resize_position_embeddings(self, img_size: int | tuple[int, int]) -> None:
        """The trainer's hook for fine-tuning at another image size (common.pretrained); GoogLeNet has no
        position embeddings. Global average pooling reads any size; the auxiliary classifiers' 5x5/3
        pooling gives their fully connected layers another grid, which is refused (torchvision's
        adaptive pooling does not)."""
        H, W = (img_size, img_size) if isinstance(img_size, int) else img_size
        sides = self._module_sides((H, W))
        for name, aux in self.aux.items():
            if isinstance(aux.pool, nn.AvgPool2d) and aux.fc1.in_features != aux.conv.conv.out_channels * (
                    self._aux_side(sides[name])) ** 2:
                raise ValueError(f"the auxiliary classifier on {name} reads another grid at {H}x{W}")
        self.img_size = (H, W)

    def forward(self, images: torch.Tensor):
        """Images (B, C, H, W) -> logits (B, classes); in training with auxiliary classifiers,
        {"logits": (B, classes), "aux": [(aux logits (B, classes), 0.3), ...]}."""
        x = images * self.input_scale[:, None, None] + self.input_shift[:, None, None]  # identity but for torchvision's
        x = self.stem(x)  # (B, 192, 28, 28)
        aux = []
        for i, (name, module) in enumerate(zip(self.names, self.inceptions)):
            if i and self.stage_of[i] != self.stage_of[i - 1]:
                x = self.pools[self.stage_of[i - 1]](x)  # 28 -> 14 before 4a, 14 -> 7 before 5a
            x = module(x)  # (B, out_chans, h, w): 3a 256, 3b 480, 4a 512, ..., 5b 1024 channels
            if self.training and name in self.aux:
                aux.append((self.aux[name](x), self.aux_weight))  # used in training only
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)  # average pooling 7x7/1 at 224: (B, 1024)
        logits = self.fc(self.dropout(x))  # (B, classes)
        return {"logits": logits, "aux": aux} if aux else logits


# Table 1: the Inception modules (#1x1, #3x3 reduce, #3x3, #5x5 reduce, #5x5, pool proj) of stages 3, 4, 5
TABLE1 = (
    ((64, 96, 128, 16, 32, 32), (128, 128, 192, 32, 96, 64)),  # 3a, 3b
    ((192, 96, 208, 16, 48, 64), (160, 112, 224, 24, 64, 64), (128, 128, 256, 24, 64, 64),
     (112, 144, 288, 32, 64, 64), (256, 160, 320, 32, 128, 128)),  # 4a to 4e
    ((256, 160, 320, 32, 128, 128), (384, 192, 384, 48, 128, 128)),  # 5a, 5b
)
TORCHVISION = dict(stages=TABLE1, pool_kernels=(3, 2), aux_adaptive=True, dropout=0.2, lrn=False, batch_norm=True,
                   k5=3, init="torchvision")

# tiny: the repo's own for 32x32 shapes, a quarter of Table 1's widths: a stem with a 3x3/1 first
# convolution (32 -> 16 -> 8), 3a and 3b at 8x8, 4a (with the auxiliary classifier, its pooling 2x2/2:
# 4x4 -> 2x2) and 4e's widths as 4b at 4x4, 5b's as 5a at 2x2. GoogLeNet: Table 1 at 224x224.
# torchvision: torchvision's GoogLeNet.
FLAVORS = {
    "tiny": dict(stages=(((16, 24, 32, 4, 8, 8), (32, 32, 48, 8, 24, 16)),
                         ((48, 24, 52, 4, 12, 16), (64, 40, 80, 8, 32, 32)),
                         ((96, 48, 96, 12, 32, 32),)),
                 stem=dict(widths=(16, 16, 48), kernel_size=3, stride=1),
                 aux_at=("4a",), aux_widths=(32, 128), aux_pool=(2, 2), num_classes=10, img_size=32),
    "GoogLeNet": dict(stages=TABLE1),
    "torchvision": TORCHVISION,
}
