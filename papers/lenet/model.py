"""Gradient-Based Learning Applied to Document Recognition.

LeCun, Bottou, Bengio, Haffner, 1998 (Proceedings of the IEEE).
https://yann.lecun.com/exdb/publis/pdf/lecun-01a.pdf

A convolutional network builds shift, scale and distortion invariance into its architecture
with local receptive fields, shared weights and spatial sub-sampling, so that raw pixels go in
and the feature extractor is learned by gradient descent rather than designed by hand. LeNet-5
(Section II.B) alternates convolutions (C1, C3, C5) and sub-sampling (S2, S4), ends with a fully
connected layer F6 and Euclidean RBF output units whose centres are fixed +1/-1 codes.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from common.layers import ClassifierMixin

A, S = 1.7159, 2 / 3  # the squashing function f(a) = A tanh(S a) (Eq. 6, Appendix A)

# Table I: which S2 feature maps each C3 feature map reads. The first six read every contiguous
# subset of three maps, the next six every contiguous subset of four, the next three some
# discontinuous subsets of four, and the last one reads all six.
TABLE_I = (
    *[tuple(sorted((j + k) % 6 for k in range(3))) for j in range(6)],  # maps 0-5
    *[tuple(sorted((j + k) % 6 for k in range(4))) for j in range(6)],  # maps 6-11
    (0, 1, 3, 4), (1, 2, 4, 5), (0, 2, 3, 5),  # maps 12-14
    (0, 1, 2, 3, 4, 5),  # map 15
)


def squash(a: torch.Tensor) -> torch.Tensor:
    """x = f(a) = A tanh(S a): the state of every unit up to F6."""
    return A * torch.tanh(S * a)


# the units' function: the paper's squashing function, or (to find what limits LeNet-5 on harder
# images than digits, papers/lenet/README.md) the ReLU that later CNNs use instead
ACTIVATIONS = {"squash": squash, "relu": F.relu}
OUTPUTS = ("rbf", "linear")


def init_uniform(tensor: torch.Tensor, fan_in: int) -> None:
    """The paper's initialisation (Appendix A): uniform in [-2.4 / F_i, 2.4 / F_i], F_i the fan-in of the unit."""
    nn.init.uniform_(tensor, -2.4 / fan_in, 2.4 / fan_in)


class Subsampling(nn.Module):
    """S2 and S4: each unit adds the four inputs of its 2x2 field, multiplies the sum by its map's
    trainable coefficient, adds its map's trainable bias and passes the result through the squashing
    function. Two parameters per map.

    Args:
        maps: feature maps in and out.
        f: the units' function (the squashing function).
    """

    def __init__(self, maps: int, f=squash):
        super().__init__()
        self.f = f
        self.coefficient = nn.Parameter(torch.empty(maps))
        self.bias = nn.Parameter(torch.empty(maps))

    def reset_parameters(self) -> None:
        init_uniform(self.coefficient, 4)  # four inputs per unit
        init_uniform(self.bias, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = 4 * F.avg_pool2d(x, 2)  # the four inputs added: (B, maps, H/2, W/2)
        return self.f(total * self.coefficient[:, None, None] + self.bias[:, None, None])


class PartialConv(nn.Module):
    """C3: a 5x5 convolution in which each output map reads only the input maps its row of the
    connection table names (Table I), each with its own kernel and bias.

    Output maps that read the same number of inputs are computed by one grouped convolution over
    their inputs, gathered side by side; the outputs are then put back in the table's order.

    Args:
        table: for every output map, the input maps it reads.
        kernel_size: the side of the receptive field.
    """

    def __init__(self, table: tuple[tuple[int, ...], ...], kernel_size: int = 5):
        super().__init__()
        self.table = table
        self.fan_ins = sorted({len(row) for row in table})
        self.convs = nn.ModuleList()
        order = []
        for n in self.fan_ins:
            maps = [j for j, row in enumerate(table) if len(row) == n]
            order += maps
            self.register_buffer(f"inputs_{n}", torch.tensor([i for j in maps for i in table[j]]), persistent=False)
            self.convs.append(nn.Conv2d(n * len(maps), len(maps), kernel_size, groups=len(maps)))
        self.register_buffer("order", torch.tensor(order).argsort(), persistent=False)  # back to the table's order

    def reset_parameters(self) -> None:
        for conv in self.convs:
            fan_in = conv.in_channels // conv.groups * conv.kernel_size[0] * conv.kernel_size[1]
            init_uniform(conv.weight, fan_in)
            init_uniform(conv.bias, fan_in)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outputs = []
        for n, conv in zip(self.fan_ins, self.convs):
            inputs = x.index_select(1, getattr(self, f"inputs_{n}"))  # each map's inputs side by side: (B, n maps, H, W)
            outputs.append(conv(inputs))  # (B, maps, H - 4, W - 4)
        return torch.cat(outputs, dim=1).index_select(1, self.order)  # (B, len(table), H - 4, W - 4)


class EuclideanRBF(nn.Module):
    """The output layer: one unit per class computes the squared Euclidean distance between its
    input vector and its parameter vector, y_i = sum_j (x_j - w_ij)^2 (Eq. 7).

    The parameter vectors are fixed, not trained: codes of +1 and -1. The paper draws them as
    stylised 7x12 bitmaps of the characters (Fig. 3) and says they could as well be drawn at random
    with equal probabilities; we draw them from a fixed seed, the same for every model.

    Args:
        in_features: the length of x (84 = 7 x 12 for F6).
        out_features: the number of classes.
    """

    def __init__(self, in_features: int, out_features: int, seed: int = 0):
        super().__init__()
        self.in_features, self.out_features, self.seed = in_features, out_features, seed
        self.register_buffer("W", torch.empty(out_features, in_features))  # fixed centres, kept in the state dict

    def reset_parameters(self) -> None:
        g = torch.Generator().manual_seed(self.seed)
        codes = torch.randint(0, 2, (self.out_features, self.in_features), generator=g, device="cpu") * 2.0 - 1  # +1 / -1
        with torch.no_grad():
            self.W.copy_(codes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x[:, None, :] - self.W).square().sum(-1)  # y_i, penalties: (B, classes)


class LeNet5(ClassifierMixin, nn.Module):
    """LeNet-5 (Fig. 2): C1, S2, C3, S4, C5, F6 and the RBF output layer.

    The classifier's outputs are penalties (a distance: lower is better); `forward` returns their
    negatives as logits, so that cross-entropy on them is the paper's MAP criterion (Eq. 9) with the
    "rubbish class" constant j left out, and the argmax is the class of the nearest centre.

    Args:
        num_classes: RBF output units.
        in_chans: input channels (1 in the paper: grey levels).
        maps: feature maps of C1, C3 and C5.
        f6: units of F6 (84: a 7 x 12 bitmap).
        table: the C3 connection table (Table I; None: every C3 map reads every S2 map).
        img_size: the input side: 32, the only one whose S4 maps C5's 5x5 kernels cover exactly, or
            MNIST's 28, padded to 32 as the paper's inputs are (see `forward_features`); a ValueError
            otherwise, which the trainer turns into one line naming --image-size 32.
        activation: "squash", the paper's f(a) = A tanh(S a) in every unit up to F6, or "relu".
        output: "rbf", the paper's Euclidean RBF units with fixed codes, or "linear": a trained fully
            connected layer whose outputs are the logits (the soft-max output of later CNNs). The
            two switches let a sweep tell what limits LeNet-5 where it learns little.
    """

    classifier_name = "output"  # no_weight_decay, get_classifier: common.layers.ClassifierMixin

    def __init__(
        self,
        num_classes: int = 10,
        in_chans: int = 1,
        maps: tuple[int, int, int] = (6, 16, 120),
        f6: int = 84,
        table: tuple[tuple[int, ...], ...] | None = TABLE_I,
        img_size: int | tuple[int, int] = 32,
        activation: str = "squash",
        output: str = "rbf",
    ):
        super().__init__()
        if activation not in ACTIVATIONS or output not in OUTPUTS:
            raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)} and output one of "
                             f"{', '.join(OUTPUTS)}; got {activation!r} and {output!r}")
        H, W = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        if (H, W) not in ((32, 32), (28, 28)):
            raise ValueError(f"LeNet-5 reads 32x32 images (Section II.B), or MNIST's 28x28 padded to 32x32, not "
                             f"{H}x{W}; resize them with --image-size 32")
        if table is not None and (len(table) != maps[1] or max(max(row) for row in table) >= maps[0]):
            raise ValueError(f"the connection table must have {maps[1]} rows over {maps[0]} S2 maps")
        self.in_chans, self.img_size, self.f, self.rbf = in_chans, (H, W), ACTIVATIONS[activation], output == "rbf"
        self.pad = (32 - H) // 2  # 2 for MNIST's 28x28 field
        self.C1 = nn.Conv2d(in_chans, maps[0], 5)
        self.S2 = Subsampling(maps[0], self.f)
        self.C3 = PartialConv(table) if table is not None else nn.Conv2d(maps[0], maps[1], 5)
        self.S4 = Subsampling(maps[1], self.f)
        self.C5 = nn.Conv2d(maps[1], maps[2], 5)  # as wide as S4's 5x5 maps: a full connection, 1x1 maps
        self.F6 = nn.Linear(maps[2], f6)
        self.output = EuclideanRBF(f6, num_classes) if self.rbf else nn.Linear(f6, num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for m in (self.C1, self.C3, self.C5, self.F6) + (() if self.rbf else (self.output,)):
            if isinstance(m, PartialConv):
                m.reset_parameters()
            else:
                fan_in = m.weight[0].numel()
                init_uniform(m.weight, fan_in)
                init_uniform(m.bias, fan_in)
        self.S2.reset_parameters()
        self.S4.reset_parameters()
        if self.rbf:
            self.output.reset_parameters()

    def reset_classifier(self, num_classes: int) -> None:
        """New RBF units for num_classes, with fixed +1/-1 codes drawn as the model draws them (or a new
        linear output layer, initialised as the paper's layers)."""
        W = self.output.W if self.rbf else self.output.weight
        if self.rbf:
            self.output = EuclideanRBF(self.output.in_features, num_classes).to(W.device, W.dtype)
            self.output.reset_parameters()
        else:
            self.output = nn.Linear(self.output.in_features, num_classes).to(W.device, W.dtype)
            init_uniform(self.output.weight, self.output.in_features)
            init_uniform(self.output.bias, self.output.in_features)

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """The F6 states (B, f6) of images (B, C, 32, 32), or of MNIST's (B, C, 28, 28) placed in the
        32x32 input with 2 pixels of background on every side, as the paper's are ("the largest
        character ... at most 20x20 pixels centered in a 28x28 field", Section II.B). The background
        is each image's lowest level: the pixels of value 0, the blank paper, in MNIST and Fashion-MNIST
        (whose normalisation makes them negative, where a zero pad would be the mean grey)."""
        if tuple(images.shape[-2:]) != self.img_size:
            H, W = self.img_size
            raise ValueError(f"LeNet-5 reads {H}x{W} images (Section II.B), got {images.shape[-2]}x{images.shape[-1]}; "
                             f"resize them (--image-size {H})")
        if self.pad:
            background = images.amin(dim=(-2, -1), keepdim=True)  # (B, C, 1, 1)
            images = F.pad(images - background, (self.pad,) * 4) + background  # (B, C, 32, 32)
        x = self.f(self.C1(images))  # (B, 6, 28, 28)
        x = self.S2(x)  # (B, 6, 14, 14)
        x = self.f(self.C3(x))  # (B, 16, 10, 10)
        x = self.S4(x)  # (B, 16, 5, 5)
        x = self.f(self.C5(x)).flatten(1)  # (B, 120, 1, 1) -> (B, 120)
        return self.f(self.F6(x))  # (B, 84)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits (B, classes): the negative RBF penalties of images (B, C, 32, 32) (or, with a linear
        output, its outputs)."""
        x = self.output(self.forward_features(images))
        return -x if self.rbf else x


# LeNet-5 of Section II.B; "tiny" is LeNet-5 itself (60,000 trainable parameters train on a CPU in
# seconds), for the built-in digits resized to 32x32.
FLAVORS = {
    "tiny": dict(num_classes=10, in_chans=1),
    "LeNet-5": dict(num_classes=10, in_chans=1),
}
