"""A ConvNet for the 2020s.

Liu, Mao, Wu, Feichtenhofer, Darrell, Xie, 2022. https://arxiv.org/abs/2201.03545

Start from a standard ResNet and modernise it, one design decision at a time, towards the
hierarchical vision Transformer (Swin), while keeping it a pure ConvNet (Fig. 2): Swin's stage
ratio 1:1:3:1, a "patchify" stem, depthwise convolutions and more width, the inverted bottleneck,
a large 7x7 kernel, and the Transformer's micro design (GELU, fewer activations and norms, LN for
BN, separate downsampling layers). The block that results (Fig. 4, right) reads

    y = x + drop_path(gamma * pwconv2(GELU(pwconv1(LN(dwconv7x7(x))))))

with gamma the layer scale, initialised at 1e-6.

The later steps of the roadmap are the constructor's switches (`stem`, `kernel_size`, `act`,
`activations`, `norms`, `norm`, `downsample`; `depths` for the stage ratio): each set to its
earlier value gives the block the next step of Fig. 2 changes (see `Block` and README.md).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange
from timm.layers import DropPath

from common.layers import ClassifierMixin

ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU}  # Fig. 2 "ReLU -> GELU"


class LayerNorm2d(nn.LayerNorm):
    """LN over the channels of a (B, C, H, W) map at every pixel (the official code's channels_first LayerNorm):
    the norm of the stem and of the downsampling layers."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = rearrange(x, "b c h w -> b h w c")
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return rearrange(x, "b h w c -> b c h w")


class BatchNormLast(nn.BatchNorm2d):
    """ResNet's batch norm, on a channels-last map (B, H, W, C): BN where the block has LN (before "BN -> LN")."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


def norm_layer(kind: str, dim: int, channels_last: bool) -> nn.Module:
    """LN (eps 1e-6, as the official code) or BN over `dim` channels, of a channels-last or channels-first map."""
    if kind == "ln":
        return nn.LayerNorm(dim, eps=1e-6) if channels_last else LayerNorm2d(dim, eps=1e-6)
    return BatchNormLast(dim) if channels_last else nn.BatchNorm2d(dim)


class Projection(nn.Module):
    """ResNet's projection shortcut (option B): a strided 1x1 convolution and a norm, for a block that
    downsamples itself (downsample="block", before "separate downsampling layers")."""

    def __init__(self, in_dim: int, out_dim: int, stride: int, norm: str):
        super().__init__()
        self.conv = nn.Conv2d(in_dim, out_dim, kernel_size=1, stride=stride, bias=False)
        self.norm = norm_layer(norm, out_dim, channels_last=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))  # (B, C_out, H/s, W/s)


class Block(nn.Module):
    """The ConvNeXt block (Fig. 4 right): 7x7 depthwise conv, LN, 1x1 conv to 4x the width, GELU, 1x1 conv
    back, layer scale, stochastic depth, and the residual. The 1x1 convs are linear layers on a channels-last
    map, as in the official code.

    With its switches at their earlier values, it is the block each step of Fig. 2 starts from:

    - norm="bn": BN where the block has LN (the block before "BN -> LN");
    - norms="all": a norm after each of the three layers, as ResNet (before "fewer norms");
    - activations="all": an activation after each norm but the last one, and after the addition, as ResNet
      (before "fewer activations");
    - act="relu" (before "ReLU -> GELU");
    - kernel_size=3 (before "large kernel");
    - stride=2 (with out_dim): the block downsamples, as the first block of a ResNet stage: the depthwise conv
      strided, the 1x1 convs to out_dim, a projection shortcut (before "separate downsampling layers").

    Args:
        dim: channels of x.
        out_dim: channels of y (default dim).
        stride: of the depthwise conv; 1 in ConvNeXt, whose downsampling layers are separate.
        kernel_size: of the depthwise conv.
        act: "gelu" or "relu".
        norm: "ln" or "bn".
        norms: "one" (after the depthwise conv only) or "all".
        activations: "one" (between the 1x1 convs only) or "all".
        layer_scale_init: gamma's initial value; 0: no layer scale.
        drop_path: the probability that stochastic depth drops the residual branch of a sample.
    """

    def __init__(self, dim: int, out_dim: int | None = None, stride: int = 1, kernel_size: int = 7, act: str = "gelu",
                 norm: str = "ln", norms: str = "one", activations: str = "one", layer_scale_init: float = 1e-6,
                 drop_path: float = 0.0):
        super().__init__()
        out_dim = out_dim or dim
        Act = ACTIVATIONS[act]
        self.dwconv = nn.Conv2d(dim, dim, kernel_size, stride, padding=kernel_size // 2, groups=dim)  # depthwise
        self.norm = norm_layer(norm, dim, channels_last=True)
        self.act_dw = Act() if activations == "all" else nn.Identity()
        self.pwconv1 = nn.Linear(dim, 4 * out_dim)  # the inverted bottleneck: 4x wider
        self.norm1 = norm_layer(norm, 4 * out_dim, channels_last=True) if norms == "all" else nn.Identity()
        self.act = Act()
        self.pwconv2 = nn.Linear(4 * out_dim, out_dim)
        self.norm2 = norm_layer(norm, out_dim, channels_last=True) if norms == "all" else nn.Identity()
        self.gamma = nn.Parameter(torch.full((out_dim,), layer_scale_init)) if layer_scale_init > 0 else None
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.act_out = Act() if activations == "all" else nn.Identity()
        changes = stride != 1 or out_dim != dim
        self.shortcut = Projection(dim, out_dim, stride, norm) if changes else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, C, H, W) -> (B, C_out, H/s, W/s)."""
        residual = self.dwconv(x)  # (B, C, H/s, W/s)
        residual = rearrange(residual, "b c h w -> b h w c")  # channels last: the 1x1 convs are linear layers
        residual = self.act_dw(self.norm(residual))
        residual = self.act(self.norm1(self.pwconv1(residual)))  # (B, H/s, W/s, 4 C_out)
        residual = self.norm2(self.pwconv2(residual))  # (B, H/s, W/s, C_out)
        if self.gamma is not None:
            residual = self.gamma * residual  # layer scale
        residual = rearrange(residual, "b h w c -> b c h w")  # (B, C_out, H/s, W/s)
        return self.act_out(self.shortcut(x) + self.drop_path(residual))


class Stem(nn.Module):
    """The layers before the first stage.

    "patchify": a p x p convolution with stride p (non-overlapping patches, p = 4 in ConvNeXt) and a norm;
    a 224 x 224 image becomes 56 x 56. "resnet": ResNet's 7x7 stride-2 convolution, norm, activation and
    3x3 stride-2 max pool (the stem before "patchify" in Fig. 2), also 56 x 56.
    """

    def __init__(self, kind: str, in_chans: int, dim: int, patch_size: int, norm: str, act: str):
        super().__init__()
        if kind == "patchify":
            self.conv = nn.Conv2d(in_chans, dim, kernel_size=patch_size, stride=patch_size)
            self.act, self.pool = nn.Identity(), nn.Identity()
        else:
            self.conv = nn.Conv2d(in_chans, dim, kernel_size=7, stride=2, padding=3, bias=False)
            self.act, self.pool = ACTIVATIONS[act](), nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.norm = norm_layer(norm, dim, channels_last=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.act(self.norm(self.conv(images)))  # (B, dim, H/p, W/p); resnet: (B, dim, H/2, W/2)
        return self.pool(x)  # resnet: (B, dim, H/4, W/4)


class Stage(nn.Module):
    """One stage: its downsampling layer (LN and a 2x2 stride-2 conv, Section 2.6; none before the first stage,
    nor where the first block downsamples), then its blocks. The unit fsdp shards and --pp chains."""

    def __init__(self, in_dim: int, dim: int, depth: int, downsample: str | None, norm: str,
                 drop_paths: list[float], **block_kwargs):
        super().__init__()
        if downsample == "separate":
            self.downsample = nn.Sequential(norm_layer(norm, in_dim, channels_last=False),
                                            nn.Conv2d(in_dim, dim, kernel_size=2, stride=2))
        else:
            self.downsample = nn.Identity()
        first = dict(dim=in_dim, out_dim=dim, stride=2) if downsample == "block" else dict(dim=dim)
        self.blocks = nn.Sequential(*(Block(**(first if j == 0 else dict(dim=dim)), norm=norm, drop_path=drop_paths[j],
                                            **block_kwargs) for j in range(depth)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.downsample(x))  # (B, dim, H/2, W/2), or (B, dim, H, W) for the first stage
        # the sum of a channels-first shortcut and a channels-last branch may come out in either layout: give
        # the next stage (on another process under --pp, which sends the tensor as it lies) the standard one
        return x.contiguous()


CHOICES = dict(stem=("patchify", "resnet"), downsample=("separate", "block"), act=tuple(ACTIVATIONS),
               norm=("ln", "bn"), norms=("one", "all"), activations=("one", "all"))


class ConvNeXt(ClassifierMixin, nn.Module):
    """ConvNeXt classifier: a stem, stages of blocks, global average pooling, LN and a linear head.

    Args:
        depths: blocks per stage; (3, 3, 9, 3) for ConvNeXt-T, Swin-T's 1:1:3:1 (ResNet-50: 3, 4, 6, 3).
        dims: channels of each stage (C in Table 1's (C, C, C, C) x (1, 2, 4, 8)).
        patch_size: the patchify stem's patch and stride.
        kernel_size: of the depthwise convs (7; 3 before "large kernel").
        drop_path_rate: stochastic depth, rising linearly over the blocks from 0 to this rate.
        layer_scale_init: the initial value of every block's gamma (1e-6); 0: no layer scale.
        head_init_scale: the head's initial weights and biases are scaled by it (1; the official code's
            fine-tuning at 384 x 384 uses 0.001).
        stem: "patchify" or "resnet" (before "patchify stem").
        downsample: "separate" (LN and a 2x2 stride-2 conv between stages, and an LN after the pooling) or
            "block" (each stage's first block strides, ResNet's head without a norm; before "separate
            downsampling layers").
        act, norm, norms, activations: the micro design, see `Block`.
        num_classes: outputs of the head.
        in_chans: input channels.
    """

    classifier_name = "head"  # get_classifier, reset_classifier: common.layers.ClassifierMixin

    def __init__(self, depths: tuple[int, ...] = (3, 3, 9, 3), dims: tuple[int, ...] = (96, 192, 384, 768),
                 patch_size: int = 4, kernel_size: int = 7, drop_path_rate: float = 0.0, layer_scale_init: float = 1e-6,
                 head_init_scale: float = 1.0, stem: str = "patchify", downsample: str = "separate", act: str = "gelu",
                 norm: str = "ln", norms: str = "one", activations: str = "one", num_classes: int = 1000,
                 in_chans: int = 3):
        super().__init__()
        for name, value in dict(stem=stem, downsample=downsample, act=act, norm=norm, norms=norms,
                                activations=activations).items():
            if value not in CHOICES[name]:
                raise ValueError(f"unknown {name} '{value}'; choose from: {', '.join(CHOICES[name])}")
        if len(depths) != len(dims) or not depths:
            raise ValueError(f"depths {tuple(depths)} and dims {tuple(dims)} must name the same stages")
        self.in_chans, self.num_features, self.head_init_scale = in_chans, dims[-1], head_init_scale
        self.stem = Stem(stem, in_chans, dims[0], patch_size, norm, act)
        n = sum(depths)
        rates = [drop_path_rate * i / max(n - 1, 1) for i in range(n)]  # stochastic depth, 0 to the rate linearly
        blocks = dict(kernel_size=kernel_size, act=act, norms=norms, activations=activations,
                      layer_scale_init=layer_scale_init)
        self.stages = nn.ModuleList(
            Stage(dims[max(i - 1, 0)], dims[i], depths[i], downsample if i else None, norm,
                  rates[sum(depths[:i]):sum(depths[:i + 1])], **blocks) for i in range(len(depths)))
        separate = downsample == "separate"  # with the separate downsampling layers, an LN after the pooling
        self.norm = (nn.LayerNorm(dims[-1], eps=1e-6) if norm == "ln" else nn.BatchNorm1d(dims[-1])) if separate \
            else nn.Identity()
        self.head = nn.Linear(dims[-1], num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The official code's: truncated normal weights (std .02) and zero biases for the convolutions and
        linear layers, norms at 1 and 0, gamma at layer_scale_init, the head's scaled by head_init_scale."""
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        self.init_classifier(self.head)

    def init_classifier(self, layer: nn.Linear) -> None:
        """A new head (reset_classifier too): truncated normal (std .02) times head_init_scale, zero bias."""
        with torch.no_grad():
            nn.init.trunc_normal_(layer.weight, std=0.02)
            layer.weight.mul_(self.head_init_scale)
            nn.init.zeros_(layer.bias)

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        x = self.stem(images)  # (B, C, H/4, W/4) with patches of 4
        for stage in self.stages:
            x = stage(x)  # every stage after the first halves H and W: (B, 8C, H/32, W/32) at the end
        return x

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x.mean(dim=(-2, -1)))  # global average pooling, then LN: (B, 8C)
        return self.head(x)  # (B, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Classify images (B, C, H, W) into logits (B, classes)."""
        return self.forward_head(self.forward_features(images))


# The paper's models (Section 3, "ConvNeXt-T/S/B/L": C = 96, 96, 128, 192 and B = (3, 3, 9, 3), (3, 3, 27, 3);
# Table 1's ConvNeXt-T), at 224 x 224 and 1000 classes, with the stochastic depth rates of their ImageNet-1K
# training (Table 5: 0.1, 0.4, 0.5, 0.5). `tiny` is the repo's own for 28 x 28 images: patches of 1, so that its
# four stages see 28, 14, 7 and 3 pixels a side, as ConvNeXt-T's see 56, 28, 14 and 7 at 224 (patches of 4
# would leave 7, 3, 1 and 0); Swin's 1:1:3:1 stage ratio at depth 6, dims 16 to 128.
FLAVORS = {
    "tiny": dict(depths=(1, 1, 3, 1), dims=(16, 32, 64, 128), patch_size=1, drop_path_rate=0.1, num_classes=10,
                 in_chans=1),
    "convnext_t": dict(depths=(3, 3, 9, 3), dims=(96, 192, 384, 768), drop_path_rate=0.1),
    "convnext_s": dict(depths=(3, 3, 27, 3), dims=(96, 192, 384, 768), drop_path_rate=0.4),
    "convnext_b": dict(depths=(3, 3, 27, 3), dims=(128, 256, 512, 1024), drop_path_rate=0.5),
    "convnext_l": dict(depths=(3, 3, 27, 3), dims=(192, 384, 768, 1536), drop_path_rate=0.5),
}
