"""The overlap-tile strategy (Section 2, Figure 2): an image of any size segmented by the unpadded
U-Net tile by tile, each output tile predicted from an input tile that adds the net's context
(`UNet.margin`, 92 pixels a border in Figure 1) around it; "to predict the pixels in the border
region of the image, the missing context is extrapolated by mirroring the input image".

The output tiles tile the image. Each tile is placed at an offset that is a multiple of 2^depth,
so that its max poolings see the same 2x2 grid as a pass of the whole mirrored image would: the
tiles join seamlessly, and the result is that of the net on the whole mirrored image, `UNet.forward`'s
in one tile (the GPU's memory limits the tile; tiling bounds it). An output
tile's side is 4 more than a multiple of 16 in the paper's net (388), so its tiles overlap by
4 pixels (offsets 0, 384, 768, ...), where they predict the same scores.
"""

import math

import torch

from papers.unet.model import UNet, reflect


def mirror(images: torch.Tensor, top: int, bottom: int, left: int, right: int) -> torch.Tensor:
    """Images (B, C, H, W) extended by mirroring at their borders (`model.reflect`, at any width):
    (B, C, top + H + bottom, left + W + right)."""
    H, W = images.shape[-2:]
    rows = reflect(H, top, top + H + bottom)[0].to(images.device)
    cols = reflect(W, left, left + W + right)[0].to(images.device)
    return images[..., rows, :][..., cols]


def offsets(side: int, tile: int, step: int) -> list[int]:
    """The offsets of the fewest output tiles of `tile` pixels, `step` apart, that cover a side."""
    n = 1 + max(0, math.ceil((side - tile) / step))
    return [k * step for k in range(n)]


@torch.no_grad()
def overlap_tile(model: UNet, images: torch.Tensor, tile: int) -> torch.Tensor:
    """Segment images (B, C, H, W) of any size with the unpadded U-Net, tile by tile: (B, K, H, W).

    The model runs in the mode it is in (call `model.eval()` first for its dropout).

    Args:
        model: an unpadded `UNet`.
        images: the images, of any height and width.
        tile: the side of each tile's segmentation map (388 in Figure 2), a side the net gives: its
            input tile has tile + 2 * margin pixels a side (572).
    """
    if model.padding:
        raise ValueError("overlap-tile is for the unpadded U-Net; a padded one segments a whole image of any "
                         "size, model(images)")
    margin, grid = model.margin, 2 ** model.depth
    if model.output_side(tile + 2 * margin) != tile or tile < grid:
        below, above = model.nearest_sides(tile + 2 * margin)
        valid = [s - 2 * margin for s in (below, above) if s and s - 2 * margin >= grid]
        raise ValueError(f"the U-Net of depth {model.depth} gives no {tile}x{tile} output tile of at least {grid} "
                         f"pixels; the nearest it gives: {' and '.join(map(str, valid))}")
    step = tile - tile % grid  # a multiple of 2^depth: every tile on the whole image's pooling grid
    B, _, H, W = images.shape
    rows, cols = offsets(H, tile, step), offsets(W, tile, step)
    covered_H, covered_W = rows[-1] + tile, cols[-1] + tile  # >= H, W
    padded = mirror(images, margin, margin + covered_H - H, margin, margin + covered_W - W)  # (B, C, covered + 2m)
    out = None
    for top in rows:
        for left in cols:
            window = padded[..., top:top + tile + 2 * margin, left:left + tile + 2 * margin]  # (B, C, 572, 572)
            scores = model.forward_tile(window)  # (B, K, tile, tile)
            if out is None:
                out = scores.new_empty(B, scores.shape[1], covered_H, covered_W)
            out[..., top:top + tile, left:left + tile] = scores
    return out[..., :H, :W]  # (B, K, H, W)
