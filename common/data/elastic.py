"""The elastic deformation U-Net trains with (Section 3.1; `--augment elastic:STD` on a segmentation data
set): "We generate smooth deformations using random displacement vectors on a coarse 3 by 3 grid. The
displacements are sampled from a Gaussian distribution with 10 pixels standard deviation. Per-pixel
displacements are then computed using bicubic interpolation."

torchvision's `v2.ElasticTransform` warps an image and its masks with one displacement field
(masks, `tv_tensors.Mask`, by nearest neighbour, so that their labels stay labels). Its own field is
Simard et al.'s (2003): uniform noise in [-1, 1] at every pixel, smoothed by a Gaussian of std
`sigma` (a (8 sigma + 1)^2 kernel) and scaled by alpha / side in grid units of 2 / side a pixel,
that is alpha / 2 times the smoothed noise in pixels. Its std is then about
alpha / (4 sqrt(3 pi) sigma) pixels (the smoothed noise has variance (1/3) sum k^2 over the
kernel k, about 1 / (12 pi sigma^2)), and the field varies over about sigma pixels
(tests/test_unet.py checks the std). The paper's field varies over half the image; smoothing at
that scale would take sigma near a quarter of the side, a kernel as large as the image, at every
pixel. So `ElasticDeformation` keeps torchvision's transform (its warp, its masks, its fill) and
draws the paper's field instead of alpha and sigma's: 3x3 displacement vectors of 10 pixels std,
interpolated bicubically to every pixel (grid points at the corners, the borders' middles and the
centre). Images are resampled bilinearly (torchvision's default; the paper names bicubic for the
displacements only).
"""

from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from torchvision.transforms import v2

from common.data.mapped import Mapped


class ElasticDeformation(v2.ElasticTransform):
    """Warps images and masks together by the paper's field: `grid` x `grid` displacement vectors
    drawn from N(0, std^2) pixels, interpolated bicubically to every pixel.

    Args:
        std: the displacement vectors' standard deviation in pixels (10).
        grid: the coarse grid's points a side (3).
        interpolation: how images are resampled (masks: nearest, always).
        fill: the value of pixels taken from outside the input, or a dict by type as torchvision's
            (`{tv_tensors.Image: 0, tv_tensors.Mask: 255}`).
    """

    def __init__(self, std: float = 10.0, grid: int = 3, interpolation: str = "bilinear", fill: Any = 0):
        if not std >= 0:
            raise ValueError(f"std is the displacements' standard deviation in pixels, at least 0, got {std}")
        if grid < 2:
            raise ValueError(f"grid is the coarse grid's points a side, at least 2, got {grid}")
        super().__init__(alpha=0.0, sigma=0.0, interpolation=interpolation, fill=fill)  # alpha, sigma unused
        self.std, self.grid = std, grid

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        H, W = v2.query_size(flat_inputs)
        coarse = torch.randn(1, 2, self.grid, self.grid) * self.std  # (1, 2, 3, 3): (dx, dy) in pixels
        d = F.interpolate(coarse, size=(H, W), mode="bicubic", align_corners=True)  # (1, 2, H, W)
        d = d * torch.tensor([2 / W, 2 / H]).view(1, 2, 1, 1)  # pixels to torchvision's grid units
        return dict(displacement=d.permute(0, 2, 3, 1))  # (1, H, W, 2): output(p) = input(p + d(p))


class Warped(Mapped):
    """A segmentation training set whose samples are warped, the image and every target map with one field
    (`ElasticDeformation`), each time they are read: a pixel the field takes from outside the canvas is void
    in "labels" (IGNORE_INDEX) and of no item in "instances" (0); the weight map, where the paper's loss wants
    one (PixelWeights), is then computed from the warped maps. A warp keeps the size."""

    def __init__(self, dataset: Dataset, deform: ElasticDeformation):
        super().__init__(dataset)
        self.deform = deform

    def map(self, image: torch.Tensor, target: dict) -> tuple[torch.Tensor, dict]:
        from torchvision import tv_tensors

        from common.data.collate import IGNORE_INDEX

        inside = torch.ones(image.shape[-2:], dtype=torch.uint8)
        maps = {key: tv_tensors.Mask(value) for key, value in target.items()} | {"inside": tv_tensors.Mask(inside)}
        image, maps = self.deform(tv_tensors.Image(image), maps)  # one field for all; fill 0
        inside = maps.pop("inside").as_subclass(torch.Tensor).bool()
        out = {key: value.as_subclass(torch.Tensor) for key, value in maps.items()}
        if "labels" in out:
            out["labels"] = out["labels"].masked_fill(~inside, IGNORE_INDEX)
        return image.as_subclass(torch.Tensor), out
