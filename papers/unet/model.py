"""U-Net: Convolutional Networks for Biomedical Image Segmentation.

Ronneberger, Fischer, Brox, MICCAI 2015. https://arxiv.org/abs/1505.04597

A contracting path of convolutions and max poolings captures context; a symmetric expansive path of
up-convolutions, each followed by the concatenation with the cropped feature map of the same level
of the contracting path, localises it, down to class scores for every pixel (Figure 1). The
convolutions are unpadded, so every output pixel is computed from its full context and nothing
else: a 572x572 tile gives a 388x388 segmentation map, and an image of any size is segmented
seamlessly tile by tile, the missing context at its borders mirrored (Figure 2, `tiling.py`).

Trained with a pixel-wise weighted cross-entropy whose weights separate touching cells (equation 2,
`weights.py`) and with elastic deformations (`augment.py`). `padding=1` is ours, not the paper's: the
same net with padded convolutions, whose map has the input's size.

`forward_tile` is the net of Figure 1 on one input tile (572 -> 388); `forward` gives the scores of every
pixel of an image of any size, as the trainer reads them: the unpadded net on the image mirrored at its
borders (Figure 2's extrapolation, one tile), the padded one on the image zero-padded to whole cells of
its pooling grid. Padded batches (images of different sizes zero-padded at the bottom and right, with a
mask (B, H, W) of each one's pixels): each image gets the scores it has alone, mirrored at its own
borders, or with the feature maps set back to zero beyond its own extent after every layer that would
leave something there, where the next convolution reads the zeros it reads alone.
"""

import itertools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from common.layers import downsample_mask, masked


class DoubleConv(nn.Sequential):
    """Two 3x3 convolutions, each followed by a ReLU (the blue arrows of one level of Figure 1).
    Unpadded (the paper's), each takes a pixel off every border: 572 -> 570 -> 568.

    Args:
        in_chans: channels of the input.
        out_chans: channels of both convolutions.
        padding: 0 (the paper's) or 1 (the side is kept).
    """

    def __init__(self, in_chans: int, out_chans: int, padding: int):
        super().__init__(
            nn.Conv2d(in_chans, out_chans, kernel_size=3, padding=padding),  # (B, C_out, H - 2, W - 2) unpadded
            nn.ReLU(inplace=True),
            nn.Conv2d(out_chans, out_chans, kernel_size=3, padding=padding),  # (B, C_out, H - 4, W - 4) unpadded
            nn.ReLU(inplace=True),
        )

    def forward(self, x: torch.Tensor, extent: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, C_in, H, W) -> (B, C_out, H', W'); extent (B, H, W): each image's cells in a padded batch,
        beyond which both ReLUs' outputs are set back to zero (None: as they are)."""
        conv1, relu1, conv2, relu2 = self
        x = masked(relu1(conv1(x)), extent)  # (B, C_out, H - 2, W - 2) unpadded
        return masked(relu2(conv2(x)), extent)  # (B, C_out, H - 4, W - 4) unpadded


def reflect(n: torch.Tensor | int, before: int, length: int) -> torch.Tensor:
    """The indices (B, length) of a side of n pixels (n: (B, 1), or one int) extended by mirroring,
    `before` pixels ahead of it and out to `length` in all: ... 2 1 | 0 1 ... n-1 | n-2 n-3 ...
    (reflection about the border pixels; beyond the image the mirror images repeat, numpy's "reflect")."""
    n = torch.as_tensor(n).reshape(-1, 1)  # (B, 1)
    period = (2 * (n - 1)).clamp(min=1)  # there and back; a side of one pixel repeats it
    k = (torch.arange(length, device=n.device) - before).remainder(period)  # (B, length)
    return torch.where(k < n, k, period - k)


def center_crop(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """The centre (B, C, h, w) of a feature map of the contracting path, "necessary due to the loss of
    border pixels in every convolution" (Section 2); the differences are even (8, 32, 80, 176 in Figure 1)."""
    h, w = size
    top, left = (x.shape[-2] - h) // 2, (x.shape[-1] - w) // 2
    return x[..., top:top + h, left:left + w]  # (B, C, h, w)


class UNet(nn.Module):
    """The U-Net of Figure 1: `depth` levels of two 3x3 convolutions and a 2x2 max pooling (stride 2),
    the number of feature channels doubled at every level (64 to 512, then 1024 at the bottom); then
    at every level back up a 2x2 up-convolution halving the channels, the concatenation with the
    cropped feature map of the contracting path, and two 3x3 convolutions; a 1x1 convolution maps the
    64 channels to the classes. 23 convolutional layers at depth 4 (Section 2).

    Not stated in the paper, chosen here: no ReLU after the up-convolutions (Section 2 names one after
    each 3x3 convolution only), the up-convolution a transposed convolution of kernel 2 and stride 2,
    dropout after the two convolutions of the bottom level ("drop-out layers at the end of the
    contracting path", Section 3.1) at rate 0.5, zero biases, and the skip's channels before the
    up-convolution's in the concatenation.

    Args:
        in_chans: input channels (1: the paper's grey microscopy images).
        num_classes: output channels, one score map per class (2: cell and background).
        width: channels of the first level (64), doubled at every level below.
        depth: max poolings (4); the bottom level has width * 2^depth channels.
        padding: 0, the paper's unpadded convolutions (572 in, 388 out); 1, padded ones: the map has
            the input's size, for sides divisible by 2^depth.
        dropout: the dropout rate after the bottom level.
    """

    def __init__(self, in_chans: int = 1, num_classes: int = 2, width: int = 64, depth: int = 4, padding: int = 0,
                 dropout: float = 0.5):
        super().__init__()
        if padding not in (0, 1):
            raise ValueError(f"padding is 0 (the paper's unpadded convolutions) or 1, got {padding}")
        if depth < 1 or width < 1:
            raise ValueError(f"depth and width must be at least 1, got depth={depth}, width={width}")
        self.depth, self.padding = depth, padding
        chans = [width * 2 ** i for i in range(depth + 1)]  # 64, 128, 256, 512, 1024 in Figure 1
        self.contracting = nn.ModuleList(
            DoubleConv(c_in, c, padding) for c_in, c in zip([in_chans, *chans[:-2]], chans[:-1]))
        self.pool = nn.MaxPool2d(kernel_size=2, stride=2)
        self.bottom = DoubleConv(chans[-2], chans[-1], padding)  # the lowest level, 1024 channels
        self.dropout = nn.Dropout(dropout)
        self.up = nn.ModuleList(nn.ConvTranspose2d(c, c // 2, kernel_size=2, stride=2) for c in reversed(chans[1:]))
        self.expansive = nn.ModuleList(DoubleConv(c, c // 2, padding) for c in reversed(chans[1:]))
        self.head = nn.Conv2d(width, num_classes, kernel_size=1)  # "to map each 64-component feature vector"
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Section 3: weights drawn from a Gaussian with std sqrt(2/N), N the incoming nodes of one
        neuron (a 3x3 convolution on 64 channels: N = 9 * 64 = 576). An up-convolution of stride 2 and
        kernel 2 reads one tap of every input channel for each output pixel: N = C_in."""
        for m in self.modules():
            if isinstance(m, nn.ConvTranspose2d):
                N = m.in_channels
            elif isinstance(m, nn.Conv2d):
                N = m.in_channels * m.kernel_size[0] * m.kernel_size[1]
            else:
                continue
            nn.init.normal_(m.weight, 0.0, math.sqrt(2 / N))
            nn.init.zeros_(m.bias)

    def output_side(self, side: int) -> int | None:
        """The side of the segmentation map for an input side, or None where the net cannot take it:
        a 2x2 max pooling of an odd side ("all 2x2 max-pooling operations are applied to a layer with
        an even x- and y-size", Section 2) or nothing left of the map."""
        if self.padding:
            return side if side >= 2 ** self.depth and side % 2 ** self.depth == 0 else None
        for _ in range(self.depth):
            side -= 4  # two unpadded 3x3 convolutions
            if side < 2 or side % 2:
                return None
            side //= 2  # max pooling
        side -= 4  # the bottom level
        for _ in range(self.depth):
            side = 2 * side - 4  # up-convolution, two 3x3 convolutions
            if side < 1:
                return None
        return side if side >= 1 else None

    @property
    def margin(self) -> int:
        """The context, in pixels, that the net takes off each border (92 in Figure 1: 572 -> 388);
        0 when padded. The same for every valid input side."""
        side = next(s for s in itertools.count(1) if self.output_side(s))
        return (side - self.output_side(side)) // 2

    def nearest_sides(self, side: int) -> tuple[int | None, int]:
        """The valid input sides nearest below (None if there is none) and above a side."""
        below = next((s for s in range(side - 1, 0, -1) if self.output_side(s)), None)
        above = next(s for s in itertools.count(side + 1) if self.output_side(s))
        return below, above

    def check_size(self, height: int, width: int) -> None:
        """One clear error for an input the net cannot take, naming the nearest sides it can."""
        for name, side in (("height", height), ("width", width)):
            if self.output_side(side) is None:
                below, above = self.nearest_sides(side)
                nearest = f"{below} and {above}" if below else f"{above} (none is smaller)"
                rule = (f"a multiple of 2^{self.depth}" if self.padding else
                        f"an even side at each of its {self.depth} max poolings")
                raise ValueError(f"the {'padded' if self.padding else 'unpadded'} U-Net of depth {self.depth} "
                                 f"cannot take an input {name} of {side} (it needs {rule}); the nearest valid "
                                 f"sides are {nearest}")

    def forward_tile(self, tile: torch.Tensor, extents: list[torch.Tensor] | None = None) -> torch.Tensor:
        """The net of Figure 1 on input tiles (B, C, H, W): class scores (B, K, H', W'), H' = H - 2 * margin
        unpadded (572 -> 388), H' = H padded. extents (padded, in a padded batch): each image's cells at every
        level, (B, H / 2^l, W / 2^l) for l = 0 ... depth (`extents`)."""
        self.check_size(tile.shape[-2], tile.shape[-1])
        extents = extents or [None] * (self.depth + 1)
        x, skips = tile, []
        for level, extent in zip(self.contracting, extents):
            x = level(x, extent)  # (B, 64, 568, 568) at the first level of Figure 1
            skips.append(x)
            x = self.pool(x)  # (B, 64, 284, 284): zeros beyond an image pool to zeros
        x = self.dropout(self.bottom(x, extents[-1]))  # (B, 1024, 28, 28)
        for up, level, skip, extent in zip(self.up, self.expansive, reversed(skips), reversed(extents[:-1])):
            x = masked(up(x), extent)  # (B, 512, 56, 56): twice the side, half the channels
            x = torch.cat([center_crop(skip, x.shape[-2:]), x], dim=1)  # (B, 1024, 56, 56), the skip cropped from 64
            x = level(x, extent)  # (B, 512, 52, 52)
        return self.head(x)  # (B, K, 388, 388)

    def forward(self, images: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Class scores (B, K, H, W) for every pixel of images (B, C, H, W) of any size. mask (B, H, W): each
        image's valid pixels, a top-left rectangle, in a padded batch (None: all valid)."""
        H, W = images.shape[-2:]
        if not self.padding:
            return self.forward_tile(self.mirrored(images, mask))[..., :H, :W]  # (B, K, H, W)
        grid = 2 ** self.depth
        x = F.pad(images, (0, -W % grid, 0, -H % grid))  # (B, C, H0, W0): zeros out to whole cells of the grid
        return self.forward_tile(x, None if mask is None else self.extents(mask))[..., :H, :W]  # (B, K, H, W)

    def extents(self, mask: torch.Tensor) -> list[torch.Tensor]:
        """The padded net in a padded batch: each image's pixels (mask (B, H, W)) rounded up to whole cells of
        the 2^depth pooling grid, as far as it alone is zero-padded, at every level: (B, H0 / 2^l, W0 / 2^l)
        for l = 0 ... depth, H0 and W0 the sides rounded up to multiples of 2^depth."""
        grid = 2 ** self.depth
        cells = F.max_pool2d(mask[:, None].float(), grid, ceil_mode=True)[:, 0] > 0  # (B, H0 / grid, W0 / grid)
        extent = cells.repeat_interleave(grid, dim=1).repeat_interleave(grid, dim=2)  # (B, H0, W0)
        return [downsample_mask(extent, 2 ** level) for level in range(self.depth + 1)]

    def mirrored(self, images: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The unpadded net's input for images (B, C, H, W) of any size: each image extended by mirroring
        about its own border pixels (mask (B, H, W): its extent in a padded batch), by the margin at the top
        and left and out to the nearest sides the net takes whose output covers H x W: (B, C, S_H, S_W)."""
        H, W = images.shape[-2:]
        S_H, S_W = (next(s for s in itertools.count(n + 2 * self.margin) if self.output_side(s)) for n in (H, W))
        sizes = (torch.tensor([[H, W]], device=images.device) if mask is None else
                 torch.stack([mask[:, :, 0].sum(1), mask[:, 0, :].sum(1)], dim=1))  # (B or 1, 2): each one's (h, w)
        rows = reflect(sizes[:, :1], self.margin, S_H)  # (B, S_H)
        cols = reflect(sizes[:, 1:], self.margin, S_W)  # (B, S_W)
        batch = torch.arange(images.shape[0], device=images.device)[:, None, None]  # (B, 1, 1)
        return images[batch, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)  # (B, C, S_H, S_W)


# tiny: ours, for canvases of about 28 to 128 pixels: padded, 32 to 128 channels over 2 poolings (a canvas
# zero-padded to sides divisible by 4), background and 10 classes. The paper's net (Figure 1: one grey
# channel, two classes, unpadded) and the same net padded.
FLAVORS = {
    "tiny": dict(width=32, depth=2, padding=1, in_chans=1, num_classes=11),
    "u-net": dict(width=64, depth=4, padding=0, in_chans=1, num_classes=2),
    "u-net-padded": dict(width=64, depth=4, padding=1, in_chans=1, num_classes=2),
}
