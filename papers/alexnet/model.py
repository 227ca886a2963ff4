"""ImageNet Classification with Deep Convolutional Neural Networks.

Krizhevsky, Sutskever, Hinton, 2012 (NIPS).
https://papers.nips.cc/paper/4824-imagenet-classification-with-deep-convolutional-neural-networks

A CNN of five convolutional and three fully connected layers, far larger than LeNet, trained on
1.2 million ImageNet images: ReLUs instead of saturating units, two GPUs that each hold half of
the kernels (Section 3.2), local response normalisation, overlapping max pooling, and against
overfitting dropout and label-preserving data augmentation (Section 4). The two-tower layout is a
grouped convolution (groups=2) wherever a layer reads only the maps of its own GPU.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from common.layers import ClassifierMixin

# Section 3.1: "neurons with this nonlinearity", f(x) = max(0, x), against the saturating f(x) = tanh(x)
ACTIVATIONS = {"relu": F.relu, "tanh": torch.tanh}


def activation_function(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation '{name}'; choose from: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def conv_out(size: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    """The side of a convolution's or pool's output."""
    return (size + 2 * padding - kernel) // stride + 1


class LocalResponseNorm(nn.Module):
    """Section 3.3: b^i_{x,y} = a^i_{x,y} / (k + alpha sum_j (a^j_{x,y})^2)^beta, the sum over the n maps
    adjacent to map i at the same position, from max(0, i - n/2) to min(N - 1, i + n/2).

    torch's F.local_response_norm divides alpha by n; we pass n * alpha, so that alpha is the
    paper's.

    Args:
        n: adjacent kernel maps in the sum.
        k, alpha, beta: the paper's constants, "determined using a validation set".
    """

    def __init__(self, n: int = 5, k: float = 2.0, alpha: float = 1e-4, beta: float = 0.75):
        super().__init__()
        self.n, self.k, self.alpha, self.beta = n, k, alpha, beta

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return F.local_response_norm(a, self.n, alpha=self.n * self.alpha, beta=self.beta, k=self.k)  # (B, C, H, W)

    def extra_repr(self) -> str:
        return f"n={self.n}, k={self.k}, alpha={self.alpha}, beta={self.beta}"


class ConvLayer(nn.Module):
    """One convolutional layer of Fig. 2: convolution, ReLU, then, where the paper puts them, response
    normalisation and overlapping max pooling (3x3, stride 2: Section 3.4).

    Args:
        in_chans, out_chans: kernel maps in and out (both GPUs together).
        kernel, stride, padding: of the convolution.
        groups: 2 where each GPU's kernels read only the maps on that GPU, 1 where they read all.
        lrn: a response-normalisation layer after the ReLU.
        pool: a max-pooling layer last.
        activation: "relu" (the paper's) or "tanh" (the saturating units it compares against).
    """

    def __init__(self, in_chans: int, out_chans: int, kernel: int, stride: int = 1, padding: int = 0,
                 groups: int = 1, lrn: bool = False, pool: bool = False, activation: str = "relu"):
        super().__init__()
        self.f = activation_function(activation)
        self.conv = nn.Conv2d(in_chans, out_chans, kernel, stride, padding, groups=groups)
        self.norm = LocalResponseNorm() if lrn else nn.Identity()
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2) if pool else nn.Identity()

    def out_size(self, size: int) -> int:
        c = self.conv
        size = conv_out(size, c.kernel_size[0], c.stride[0], c.padding[0])
        return conv_out(size, 3, 2) if isinstance(self.pool, nn.MaxPool2d) else size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.norm(self.f(self.conv(x))))  # (B, out_chans, H', W')


class AlexNet(ClassifierMixin, nn.Module):
    """AlexNet: five convolutional layers, then three fully connected ones.

    Args:
        num_classes: outputs of the last layer (fc8; 1000 in the paper).
        in_chans: input channels.
        img_size: the input side; fc6 reads the map it leaves after pool5 (6x6 at 224), unless
            adaptive_pool sets that size.
        widths: kernels of conv1..conv5 (both GPUs together).
        kernels, strides, paddings: of conv1..conv5.
        groups: of conv1..conv5; the paper's towers are (1, 2, 1, 2, 2); torchvision's one tower (1,) * 5.
        lrn: response normalisation after conv1 and conv2 (the paper); torchvision has none.
        pools: which of conv1..conv5 are followed by max pooling.
        hidden: units of fc6 and fc7.
        dropout: the probability of dropping a unit of fc6 and fc7 in training (Section 4.2).
        adaptive_pool: average-pool the last map to this side before fc6, as torchvision does
            (nn.AdaptiveAvgPool2d((6, 6))), so any large enough input fits; None: the paper's fc6
            reads pool5's map as it is, so the model reads one input size.
        dropout_before: torchvision drops fc6's and fc7's inputs, the paper (Section 4.2: "dropout in
            the first two fully-connected layers") their outputs; in eval mode they are the same.
        init: "paper" (Section 5: weights N(0, 0.01), biases 1 in conv2, conv4, conv5, fc6 and fc7,
            0 elsewhere), "torchvision" (PyTorch's layer defaults, what torchvision.models.alexnet does)
            or "he" (He et al. 2015's N(0, 2 / fan_in), biases 0).
        activation: "relu", the paper's, or "tanh" (Section 3.1's saturating units), in every layer
            but fc8.
    """

    classifier_name = "fc8"  # no_weight_decay, get_classifier, reset_classifier: common.layers.ClassifierMixin

    def __init__(
        self,
        num_classes: int = 1000,
        in_chans: int = 3,
        img_size: int | tuple[int, int] = 224,
        widths: tuple[int, ...] = (96, 256, 384, 384, 256),
        kernels: tuple[int, ...] = (11, 5, 3, 3, 3),
        strides: tuple[int, ...] = (4, 1, 1, 1, 1),
        paddings: tuple[int, ...] = (2, 2, 1, 1, 1),
        groups: tuple[int, ...] = (1, 2, 1, 2, 2),
        lrn: bool = True,
        pools: tuple[bool, ...] = (True, True, False, False, True),
        hidden: int = 4096,
        dropout: float = 0.5,
        adaptive_pool: int | None = None,
        dropout_before: bool = False,
        init: str = "paper",
        activation: str = "relu",
    ):
        super().__init__()
        if not len(widths) == len(kernels) == len(strides) == len(paddings) == len(groups) == len(pools) == 5:
            raise ValueError("widths, kernels, strides, paddings, groups and pools name the five convolutional layers")
        if init not in ("paper", "torchvision", "he"):
            raise ValueError(f"unknown init '{init}'; choose from: paper, torchvision, he")
        self.in_chans, self.init, self.f = in_chans, init, activation_function(activation)
        H, W = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        self.img_size = (H, W)
        self.layers = nn.ModuleList()
        chans = in_chans
        for i in range(5):
            self.layers.append(ConvLayer(chans, widths[i], kernels[i], strides[i], paddings[i], groups[i],
                                         lrn=lrn and i < 2, pool=pools[i], activation=activation))  # conv1 .. conv5
            chans = widths[i]
        self.adaptive_pool = adaptive_pool
        side = (adaptive_pool, adaptive_pool) if adaptive_pool else self.feature_size((H, W))
        if min(side) < 1:
            raise ValueError(f"a {H}x{W} image leaves no map after pool5; AlexNet needs larger inputs")
        self.pool = nn.AdaptiveAvgPool2d(adaptive_pool) if adaptive_pool else nn.Identity()
        self.dropout_before = dropout_before
        self.dropout = nn.Dropout(dropout)
        self.fc6 = nn.Linear(chans * side[0] * side[1], hidden)
        self.fc7 = nn.Linear(hidden, hidden)
        self.fc8 = nn.Linear(hidden, num_classes)
        self.reset_parameters()

    def feature_size(self, size: tuple[int, int]) -> tuple[int, int]:
        """The side (h, w) of pool5's map for an input (H, W)."""
        h, w = size
        for layer in self.layers:
            h, w = layer.out_size(h), layer.out_size(w)
        return h, w

    def reset_parameters(self) -> None:
        if self.init == "torchvision":
            for m in self.modules():
                if isinstance(m, (nn.Conv2d, nn.Linear)):
                    m.reset_parameters()
            return
        if self.init == "he":  # He et al. 2015: variance 2 / fan_in keeps a ReLU net's signal at any width
            for m in self.modules():
                if isinstance(m, (nn.Conv2d, nn.Linear)):
                    nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                    nn.init.zeros_(m.bias)
            return
        ones = {self.layers[1].conv, self.layers[3].conv, self.layers[4].conv, self.fc6, self.fc7}
        for m in [*(layer.conv for layer in self.layers), self.fc6, self.fc7, self.fc8]:
            nn.init.normal_(m.weight, 0.0, 0.01)
            nn.init.constant_(m.bias, 1.0 if m in ones else 0.0)  # ReLUs start with positive inputs

    def init_classifier(self, layer: nn.Linear) -> None:
        """A new fc8 (reset_classifier) starts as the paper initialises it: weights N(0, 0.01), bias 0
        (whatever the init of the rest, so that fine-tuning torchvision's weights starts as the paper would)."""
        nn.init.normal_(layer.weight, 0.0, 0.01)
        nn.init.zeros_(layer.bias)

    def resize_position_embeddings(self, img_size: int | tuple[int, int]) -> None:
        """What common.pretrained calls to fine-tune at another image size (the name is ViT's; AlexNet has no
        position embeddings). With adaptive pooling any large enough size is read as it is, so this
        records the size; without it fc6 reads one map size only, and another size is a ValueError."""
        H, W = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        if min(self.feature_size((H, W))) < 1:
            raise ValueError(f"a {H}x{W} image leaves no map after pool5; AlexNet needs larger inputs")
        if not self.adaptive_pool and self.feature_size((H, W)) != self.feature_size(self.img_size):
            raise ValueError(f"fc6 reads the {self.feature_size(self.img_size)} map of {self.img_size} images, "
                             f"which {H}x{W} images do not leave")
        self.img_size = (H, W)

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """pool5's map (B, 256, 6, 6) of images (B, 3, 224, 224)."""
        x = images
        for layer in self.layers:
            x = layer(x)  # conv1: (B, 96, 27, 27) after pooling; conv2: (B, 256, 13, 13); conv3..4: 13x13; conv5: 6x6
        return self.pool(x)  # torchvision: (B, 256, 6, 6) from any size; the paper: as it is

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)  # (B, 256 * 6 * 6)
        if self.dropout_before:  # torchvision: dropout, fc6, ReLU, dropout, fc7, ReLU, fc8
            x = self.f(self.fc6(self.dropout(x)))
            x = self.f(self.fc7(self.dropout(x)))
        else:  # the paper: fc6, ReLU, dropout, fc7, ReLU, dropout, fc8
            x = self.dropout(self.f(self.fc6(x)))  # (B, 4096)
            x = self.dropout(self.f(self.fc7(x)))  # (B, 4096)
        return self.fc8(x)  # (B, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits (B, classes) of images (B, C, H, W)."""
        return self.forward_head(self.forward_features(images))


class Figure1Net(nn.Module):
    """The four-layer network of Section 3.1 and Figure 1, which "reaches a 25% training error rate on
    CIFAR-10 six times faster than an equivalent network with tanh neurons".

    The paper gives no more of it than "a four-layer convolutional neural network", without
    regularization of any kind. We take three 5x5 convolutions (32, 32 and 64 maps, padding 2), each
    followed by the activation and an overlapping 3x3 max pool of stride 2 (Section 3.4), and one
    fully connected layer: the shape of the small CIFAR-10 networks of the time (our choice, not
    the paper's). No response normalisation and no dropout; PyTorch's layer initialisation, the
    same for both activations.

    Args:
        num_classes: outputs of the fully connected layer.
        in_chans: input channels.
        img_size: the input side (the fully connected layer reads the map it leaves).
        widths: maps of the three convolutions.
        activation: "relu" or "tanh", after every convolution.
    """

    def __init__(self, num_classes: int = 10, in_chans: int = 3, img_size: int = 32,
                 widths: tuple[int, int, int] = (32, 32, 64), activation: str = "relu"):
        super().__init__()
        self.in_chans = in_chans
        self.layers = nn.ModuleList()
        chans, side = in_chans, img_size
        for width in widths:
            self.layers.append(ConvLayer(chans, width, 5, padding=2, pool=True, activation=activation))
            chans, side = width, self.layers[-1].out_size(side)
        if side < 1:
            raise ValueError(f"a {img_size}x{img_size} image leaves no map after the third pool")
        self.fc = nn.Linear(chans * side * side, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits (B, classes) of images (B, C, 32, 32)."""
        x = images
        for layer in self.layers:
            x = layer(x)  # (B, 32, 15, 15), (B, 32, 7, 7), (B, 64, 3, 3) at 32x32
        return self.fc(x.flatten(1))  # (B, classes)


# The paper's two-tower model of Fig. 2 at 224x224 (padding 2 on conv1 gives its 55x55 maps, as
# torchvision's); torchvision's one-tower model, which the parity tests load; and "tiny", the
# same kinds of layers, narrower, for 32x32 images: conv1 5x5 with stride 1 (not 11x11 stride 4),
# pools at 32 -> 15 -> 7 -> 3, fc6 and fc7 of 256 units. The paper's N(0, 0.01) weights are sized
# for its widths: at tiny's the signal fades to nothing before fc8 and training stalls at chance
# (the loss stayed at ln 10 for two epochs of shapes at learning rates 1e-3, 3e-4 and 1e-4), so tiny
# starts from He et al.'s N(0, 2 / fan_in) weights with zero biases (init="he").
PAPER = dict(num_classes=1000, img_size=224)
TORCHVISION = dict(num_classes=1000, img_size=224, widths=(64, 192, 384, 256, 256), groups=(1,) * 5, lrn=False,
                   adaptive_pool=6, dropout_before=True, init="torchvision")
FLAVORS = {
    "tiny": dict(num_classes=10, img_size=32, widths=(32, 64, 96, 96, 64), kernels=(5, 5, 3, 3, 3),
                 strides=(1, 1, 1, 1, 1), paddings=(2, 2, 1, 1, 1), hidden=256, init="he"),
    "AlexNet": PAPER,
    "torchvision": TORCHVISION,
    "figure-1": dict(num_classes=10, img_size=32),  # Figure1Net (a variant in __init__.py)
}
