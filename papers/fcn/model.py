"""Fully Convolutional Networks for Semantic Segmentation.

Long, Shelhamer, Darrell, CVPR 2015. https://arxiv.org/abs/1411.4038

Turn a classification net into a dense predictor: its fully connected layers become convolutions
(Section 3.1), so a net of any input size gives a coarse map of class scores, which a learned
backwards-strided convolution, initialised to bilinear interpolation, upsamples to the pixels
(Section 3.3). Skips fuse the coarse, semantic scores with scores of finer, shallower layers
(pool4, pool3): FCN-32s, -16s, -8s predict at strides 32, 16, 8 (Section 4.2, Figure 3).

`FCN` is the paper's net on VGG-16 (configuration D of papers/vgg) as the released Caffe nets build
it (shelhamer/fcn.berkeleyvision.org, voc-fcn{32,16,8}s); `ResNetFCN` is torchvision's
fcn_resnet50, a dilated ResNet-50 (papers/resnet) with a 3x3 convolutional head and bilinear
upsampling, which `papers.fcn.spec.from_torchvision` loads.

Padded batches: images of different sizes share a batch zero-padded at the bottom and right, with a
mask (B, H, W) of each one's valid pixels (common.layers). Both nets give every image the scores it
has alone: the feature maps are set back to zero outside each image's own extent after every layer
that would leave something there (`within`), so that the next layer reads there the zeros it reads
alone, and every upsampling reads only the image's own cells.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from common.layers import MaskedBatchNorm2d
from papers.resnet.model import FLAVORS as RESNET_FLAVORS
from papers.resnet.model import ResNet
from papers.vgg.model import D, VGG, ConvBlock


def bilinear_kernel(size: int) -> torch.Tensor:
    """The size x size bilinear interpolation filter (Caffe's "bilinear" filler, the reference's
    surgery.upsample_filt): for upsampling by f, size 2f and centre f - 1/2, weights
    (1 - |i - c| / f)(1 - |j - c| / f)."""
    factor = (size + 1) // 2
    center = factor - 1 if size % 2 == 1 else factor - 0.5
    tent = 1 - (torch.arange(size, dtype=torch.float64) - center).abs() / factor  # (size,)
    return torch.outer(tent, tent).float()  # (size, size)


class Upsampling(nn.ConvTranspose2d):
    """Upsampling by an integer factor f as backwards-strided convolution (a "deconvolution"), with
    stride f and a 2f x 2f filter, no bias (Section 3.3). It starts as bilinear interpolation, each
    class from itself only (the reference's `surgery.interp`), and "need not be fixed": its filters
    may be learned with the net. Its output of an n x n map is (n + 1) f: the net crops it.

    Args:
        chans: classes in and out.
        factor: the upsampling factor f.
        learn: the filters are parameters; False: a constant buffer, bilinear for good.
    """

    def __init__(self, chans: int, factor: int, learn: bool = True):
        super().__init__(chans, chans, kernel_size=2 * factor, stride=factor, bias=False)
        self.factor = factor
        if not learn:
            weight = self.weight.detach()  # (C, C, 2f, 2f), bilinear
            del self.weight
            self.register_buffer("weight", weight)

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.zero_()  # (C_in, C_out, 2f, 2f)
            kernel = bilinear_kernel(self.kernel_size[0]).to(self.weight.device, self.weight.dtype)
            for c in range(self.in_channels):
                self.weight[c, c] = kernel  # class c from class c alone


def valid_sizes(mask: torch.Tensor) -> torch.Tensor:
    """Each image's (height, width) (B, 2) from its mask (B, H, W), a top-left rectangle of True."""
    return torch.stack([mask[:, :, 0].sum(1), mask[:, 0, :].sum(1)], dim=1)


def within(x: torch.Tensor, hw: torch.Tensor | None) -> torch.Tensor:
    """x (B, C, H, W) set to zero outside each image's top-left hw (B, 2) (None: x as it is)."""
    if hw is None:
        return x
    rows = torch.arange(x.shape[2], device=x.device) < hw[:, :1]  # (B, H)
    cols = torch.arange(x.shape[3], device=x.device) < hw[:, 1:]  # (B, W)
    return x * (rows[:, None, :, None] & cols[:, None, None, :])


def output_size(hw: torch.Tensor | None, layer: nn.Module) -> torch.Tensor | None:
    """The (height, width) (B, 2) that a layer gives an image of size hw alone: (n + 2p - k) / s + 1 for a
    convolution or max pooling, rounded down, or up for Caffe's pooling (ceil_mode); (n - 1) s - 2p + k for
    a backwards-strided convolution. Other layers keep it."""
    if hw is None or not isinstance(layer, (nn.Conv2d, nn.MaxPool2d, nn.ConvTranspose2d)):
        return hw
    k, s, p = (v if isinstance(v, int) else v[0] for v in (layer.kernel_size, layer.stride, layer.padding))
    if isinstance(layer, nn.ConvTranspose2d):
        return (hw - 1) * s - 2 * p + k
    n = hw + 2 * p - k
    return (-(-n // s) if getattr(layer, "ceil_mode", False) else n // s) + 1


def crop(x: torch.Tensor, offset: int, size: torch.Size | tuple[int, int]) -> torch.Tensor:
    """x (B, C, H', W') cut to (B, C, *size) from (offset, offset): Caffe's Crop layer."""
    return x[:, :, offset: offset + size[0], offset: offset + size[1]]


class Block(ConvBlock):
    """papers/vgg's block (its convolutions with ReLUs, then the max pooling) in a padded batch: it also
    takes and gives each image's extent hw (B, 2), and after every ReLU sets the map to zero beyond it,
    where the next convolution reads zeros alone. The pooling reads values >= 0 and zeros beyond, so its
    windows at an image's edge take the maximum of the image's own pixels, as alone."""

    def forward(self, x: torch.Tensor, hw: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        for layer in self:
            x, hw = layer(x), output_size(hw, layer)
            if isinstance(layer, nn.ReLU):
                x = within(x, hw)
        return x, hw


# The reference's crops (voc-fcn{32,16,8}s/*.prototxt, computed there by caffe.coord_map): map an
# output pixel back to input coordinates layer by layer (a k x k, stride s, padding p layer:
# x = s y + (k - 1)/2 - p; its deconvolution the inverse). The padding of 100 on conv1_1 puts
# pool5 at x = 32 y - 83.5 and fc6 (7x7) at 32 y + 12.5, so the x32 upsampling (64x64, stride 32,
# centre 31.5) lands at z - 19; the x2 upsampling puts score_fr at 16 z - 11.5 and pool4 (at
# 16 y - 91.5) lines up at y = z + 5; then x16 gives z - 27, and for FCN-8s pool3 (8 y - 95.5)
# lines up at z + 9 and x8 gives z - 31. tests/test_fcn.py recomputes them from the layers.
OFFSETS = {"score_pool4": 5, "score_pool3": 9, "32s": 19, "16s": 27, "8s": 31}


class FCN(nn.Module):
    """FCN-32s, -16s or -8s on VGG-16 (Section 4.1-4.2, Figure 3), as the reference Caffe nets.

    The backbone is VGG-16's five blocks (papers/vgg `ConvBlock`, configuration D, the same layer
    names `blocks.i.j`), with two changes of the reference: conv1_1 pads by 100, so that an input of
    any size leaves fc6 a map to read, and the max poolings round up (Caffe's). fc6 and fc7 are
    VGG's classifier as convolutions, 7x7 and 1x1 with 4096 filters, each with ReLU and dropout
    (Section 3.1: "these fully connected layers can also be viewed as convolutions with kernels
    that cover their entire input regions"; `load_vgg` carries a VGG's weights over). score_fr is a
    1x1 convolution to the classes. Then:

    - 32s: upscore, x32, crop: "a single-stream net ... upsamples stride 32 predictions back to
      pixels in a single step".
    - 16s: upscore2 (x2) of score_fr, plus score_pool4 (a 1x1 convolution on pool4) cropped, then
      upscore16 (x16) and crop.
    - 8s: that sum upsampled x2 (upscore_pool4), plus score_pool3 on pool3, then upscore8 (x8).

    The staged original (Section 4.2): the new score layers start at zero, so each net starts as
    the coarser one it is trained from (its weights carried over by name: `load_state_dict(coarser,
    strict=False)`). `at_once` is the reference's later net trained in one stage
    (voc-fcn8s-atonce), whose fixed scales 0.01 and 1e-4 on pool4 and pool3 stand in for the stages.

    Args:
        variant: "32s", "16s" or "8s".
        width: our own, papers/vgg's: the convolutions' filters multiplied by it (1: VGG-16's).
        fc_width: filters of fc6 and fc7 (4096).
        dropout: after fc6 and fc7 (0.5).
        at_once: scale the pool4 and pool3 skips (voc-fcn8s-atonce); False: the staged nets.
        fixed_upsampling: which upsamplings stay bilinear (buffers, not parameters): "final", the
            paper's ("Final layer deconvolutional filters are fixed to bilinear interpolation, while
            intermediate upsampling layers are initialized to bilinear upsampling, and then learned",
            Section 4.3); "all", the released nets' (lr_mult 0 on every Deconvolution); "none".
        num_classes: classes scored, background included (PASCAL VOC: 21).
        in_chans: input channels.
    """

    def __init__(self, variant: str = "8s", width: float = 1.0, fc_width: int = 4096, dropout: float = 0.5,
                 at_once: bool = False, fixed_upsampling: str = "final", num_classes: int = 21, in_chans: int = 3):
        super().__init__()
        if variant not in ("32s", "16s", "8s"):
            raise ValueError(f"unknown variant '{variant}'; choose from: 32s, 16s, 8s")
        if fixed_upsampling not in ("final", "all", "none"):
            raise ValueError(f"unknown fixed_upsampling '{fixed_upsampling}'; choose from: final, all, none")
        self.variant, self.in_chans = variant, in_chans
        self.scales = (0.01, 1e-4) if at_once else (1.0, 1.0)  # on pool4, pool3
        blocks, chans = [], in_chans
        for block in D:
            blocks.append(Block(chans, block, width=width))
            blocks[-1][-1].ceil_mode = True  # Caffe's pooling: H/2 rounded up
            chans = blocks[-1].out_chans
        blocks[0][0].padding = (100, 100)  # conv1_1, the reference's
        self.blocks = nn.ModuleList(blocks)
        self.fc6 = nn.Conv2d(chans, fc_width, kernel_size=7)  # FC-4096 as a 7x7 convolution
        self.fc7 = nn.Conv2d(fc_width, fc_width, kernel_size=1)  # FC-4096 as a 1x1 convolution
        self.dropout = nn.Dropout(dropout)
        self.score_fr = nn.Conv2d(fc_width, num_classes, kernel_size=1)
        K, learn, learn_final = num_classes, fixed_upsampling != "all", fixed_upsampling == "none"
        if variant == "32s":
            self.upscore = Upsampling(K, 32, learn_final)
        else:
            self.upscore2 = Upsampling(K, 2, learn)
            self.score_pool4 = nn.Conv2d(blocks[3].out_chans, K, kernel_size=1)
        if variant == "16s":
            self.upscore16 = Upsampling(K, 16, learn_final)
        if variant == "8s":
            self.upscore_pool4 = Upsampling(K, 2, learn)
            self.score_pool3 = nn.Conv2d(blocks[2].out_chans, K, kernel_size=1)
            self.upscore8 = Upsampling(K, 8, learn_final)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Glorot for the VGG layers (papers/vgg's, where a net trains without ImageNet weights);
        zero for every score layer: "we zero-initialize the class scoring convolution layer"
        (Section 4.3) and score_pool4 and score_pool3 "so the net starts with unmodified
        predictions" (Section 4.2; the reference's default filler). Upsamplings: bilinear."""
        for name, m in self.named_modules():
            if isinstance(m, nn.Conv2d) and name.startswith("score"):
                nn.init.zeros_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Conv2d):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def load_vgg(self, vgg: VGG) -> None:
        """A classification net's weights, convolutionalised (Section 3.1): the convolutions by name,
        fc6 (4096, 512 x 7 x 7) viewed as 4096 filters of 512 x 7 x 7, fc7 as 4096 of 4096 x 1 x 1.
        Its fc8 is discarded ("decapitated"), the score layers keep theirs."""
        with torch.no_grad():
            for ours, theirs in zip(self.blocks, vgg.blocks, strict=True):
                ours.load_state_dict(theirs.state_dict())
            for ours, theirs in ((self.fc6, vgg.fc6), (self.fc7, vgg.fc7)):
                ours.weight.copy_(theirs.weight.view_as(ours.weight))  # (out, in * k * k) -> (out, in, k, k)
                ours.bias.copy_(theirs.bias)

    def forward(self, images: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Score every pixel of images (B, C, H, W), of any size: {"out": (B, classes, H, W)} (a dict as
        torchvision's segmentation models give). mask (B, H, W): each image's valid pixels in a padded
        batch; `hw` then follows each image's own extent through the layers (None: all valid)."""
        size = images.shape[-2:]  # (H, W)
        hw = None if mask is None else valid_sizes(mask)  # (B, 2)
        x, pools = images, []
        for block in self.blocks:
            x, hw = block(x, hw)  # pool1 ... pool5: (B, C_i, (H + 198) / 2^i, ...) rounded up
            pools.append(x)
        pool3, pool4, pool5 = pools[2:]
        hw = output_size(hw, self.fc6)  # pool5's - 6
        x = within(self.dropout(F.relu(self.fc6(pool5), inplace=True)), hw)  # (B, 4096, h, w)
        x = within(self.dropout(F.relu(self.fc7(x), inplace=True)), hw)  # (B, 4096, h, w)
        score = within(self.score_fr(x), hw)  # coarse class scores, stride 32: (B, K, h, w)
        if self.variant == "32s":
            return {"out": crop(self.upscore(score), OFFSETS["32s"], size)}  # (B, K, 32 h + 32, ...) -> (B, K, H, W)
        score, hw = self.upscore2(score), output_size(hw, self.upscore2)  # (B, K, 2 h + 2, 2 w + 2)
        score = score + crop(self.score_pool4(pool4 * self.scales[0]), OFFSETS["score_pool4"], score.shape[-2:])
        score = within(score, hw)  # the padding's own scores of pool4 set back to zero
        if self.variant == "16s":
            return {"out": crop(self.upscore16(score), OFFSETS["16s"], size)}  # (B, K, H, W)
        score, hw = self.upscore_pool4(score), output_size(hw, self.upscore_pool4)  # stride 8: (B, K, 4 h + 6, ...)
        score = score + crop(self.score_pool3(pool3 * self.scales[1]), OFFSETS["score_pool3"], score.shape[-2:])
        return {"out": crop(self.upscore8(within(score, hw)), OFFSETS["8s"], size)}  # (B, K, H, W)


class FCNHead(nn.Sequential):
    """torchvision's FCN head: a 3x3 convolution to a quarter of the channels, batch norm, ReLU,
    dropout 0.1, and a 1x1 convolution to the classes (torchvision's layer indices, so its weights
    map by name). Batch norm counts the valid pixels only (and zeroes the padding) where a mask is given."""

    def __init__(self, in_chans: int, num_classes: int):
        mid = in_chans // 4
        super().__init__(nn.Conv2d(in_chans, mid, kernel_size=3, padding=1, bias=False), MaskedBatchNorm2d(mid),
                         nn.ReLU(), nn.Dropout(0.1), nn.Conv2d(mid, num_classes, kernel_size=1))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        conv, bn, relu, dropout, classify = self
        return classify(dropout(relu(bn(conv(x), mask))))  # (B, in, h, w) -> (B, mid, h, w) -> (B, K, h, w)


def upsample(x: torch.Tensor, size: torch.Size, hw: torch.Tensor | None = None,
             hw_coarse: torch.Tensor | None = None) -> torch.Tensor:
    """Bilinear upsampling of x (B, K, h', w') to (B, K, *size), as F.interpolate (align_corners=False)
    does it. In a padded batch (hw: each image's (height, width), hw_coarse: its cells in x, both (B, 2))
    each image's own cells are stretched over its own pixels, at its own scale h'_i / h_i: pixel j reads
    x at (j + 1/2) h'_i / h_i - 1/2, held within 0 and h'_i - 1, from the two cells around it, as
    F.interpolate computes it, one axis after the other."""
    if hw is None:
        return F.interpolate(x, size=size, mode="bilinear", align_corners=False)
    for axis, n in ((2, size[0]), (3, size[1])):  # rows, then columns
        cells = hw_coarse[:, axis - 2, None]  # (B, 1)
        scale = cells.float() / hw[:, axis - 2, None].float()  # (B, 1)
        src = ((torch.arange(n, device=x.device) + 0.5) * scale - 0.5).clamp(min=0)  # (B, n)
        i0 = torch.minimum(src.long(), cells - 1)  # the cell at or before, (B, n)
        i1 = torch.minimum(i0 + 1, cells - 1)  # and the next, held at the image's last
        lam = (src - i0).clamp(max=1).to(x.dtype)  # its weight, (B, n)
        shape = [x.shape[0], x.shape[1], *x.shape[2:]]
        shape[axis] = n
        view = (slice(None), None, slice(None), None) if axis == 2 else (slice(None), None, None, slice(None))
        take = lambda i: x.gather(axis, i[view].expand(shape))  # (B, K, n, w') or (B, K, H, n)
        x = take(i0) * (1 - lam[view]) + take(i1) * lam[view]
    return x  # (B, K, H, W)


class ResNetFCN(nn.Module):
    """torchvision's fcn_resnet50 / fcn_resnet101: not the paper's net but the FCN most code uses.
    The backbone is torchvision's ResNet (papers/resnet, the stride on the 3x3) with layer3 and
    layer4 dilated instead of strided, so the map has stride 8; an FCNHead on layer4 scores it,
    an auxiliary FCNHead on layer3 helps training (torchvision's references weight its loss 0.5);
    both are upsampled to the input by bilinear interpolation, not learned.

    Args:
        layers: bottlenecks per stage ((3, 4, 6, 3): ResNet-50; (3, 4, 23, 3): ResNet-101).
        aux_loss: build the auxiliary head (torchvision's aux_loss).
        num_classes: classes scored, background included.
        in_chans: input channels.
    """

    def __init__(self, layers: tuple[int, ...] = (3, 4, 6, 3), aux_loss: bool = True, num_classes: int = 21,
                 in_chans: int = 3):
        super().__init__()
        resnet = {**RESNET_FLAVORS["torchvision-resnet50"], "layers": layers}
        net = ResNet(**resnet, dilate=(False, True, True), num_classes=1, in_chans=in_chans)
        self.in_chans = in_chans
        self.stem, self.stages = net.stem, net.stages  # the pooling and classifier (net.fc) are dropped
        self.classifier = FCNHead(net.num_features, num_classes)  # on layer4: 2048 -> 512 -> K
        self.aux_classifier = FCNHead(net.num_features // 2, num_classes) if aux_loss else None  # layer3: 1024

    def forward(self, images: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """images (B, C, H, W) -> {"out": (B, K, H, W)} and, with aux_loss, "aux" (B, K, H, W):
        torchvision's dict, so that a loss can weigh the two (and eval code reads "out"). mask (B, H, W):
        each image's valid pixels in a padded batch (None: all valid)."""
        size, coarse = images.shape[-2:], mask
        x, coarse = self.stem(images, coarse)  # (B, 64, H/4, W/4)
        features = []
        for stage in self.stages:
            x, coarse = stage(x, coarse)  # layer1 (B, 256, H/4, W/4), layer2 (B, 512, H/8, W/8), then stride 8 kept
            features.append(x)
        layer3, layer4 = features[-2:]  # (B, 1024, H/8, W/8), (B, 2048, H/8, W/8)
        hw, hw_coarse = (None, None) if mask is None else (valid_sizes(mask), valid_sizes(coarse))
        out = self.classifier(layer4, coarse)  # (B, K, H/8, W/8)
        result = {"out": upsample(out, size, hw, hw_coarse)}  # (B, K, H, W)
        if self.aux_classifier is not None:
            aux = self.aux_classifier(layer3, coarse)  # (B, K, H/8, W/8)
            result["aux"] = upsample(aux, size, hw, hw_coarse)  # (B, K, H, W)
        return result


# tiny: ours, for small grey canvases: VGG-16's layout at an eighth of its filters (8 to 64; the
# padding of 100 makes every canvas of about 68 x 68 a map of about 266 x 266 at full resolution), fc6
# and fc7 of 128, one input channel, 11 classes as fashion-canvas counts them (the background and
# Fashion-MNIST's ten; the data set sets num_classes and in_chans). The paper's
# nets on PASCAL VOC (20 classes and background), trained in stages, 32s first, and the reference's
# at-once FCN-8s; torchvision's fcn_resnet50 with its auxiliary head (`ResNetFCN`).
FLAVORS = {
    "tiny": dict(variant="8s", width=0.125, fc_width=128, num_classes=11, in_chans=1),
    "FCN-32s": dict(variant="32s"),
    "FCN-16s": dict(variant="16s"),
    "FCN-8s": dict(variant="8s"),
    "FCN-8s-at-once": dict(variant="8s", at_once=True),
}
TORCHVISION_FLAVORS = {"torchvision-fcn_resnet50": dict(layers=(3, 4, 6, 3), aux_loss=True, num_classes=21)}
