"""Digits to detect: scikit-learn's 8x8 digits scaled 1x to 4x and scattered over canvases of varying size.

Each canvas has its own height and width (48 to 128 pixels in steps of 16, drawn
independently, so most are not square) and holds 0 to 6 digits, each scaled by a
random factor of 1 to 4 (8 to 32 pixels a side) and placed at a random spot where
its square overlaps no digit already there by more than a tenth of either's area.
A target is the dict torchvision's detection models take: `boxes` (n, 4) float,
x1 y1 x2 y2 in pixels, the tight box around each digit's ink, and `labels` (n,)
int64, the digits 0 to 9; n is 0 for about one canvas in twenty. Training
canvases draw their digits from the digits' fixed training split and test canvases
from its test split, so no test digit was seen in training. Fixed seeds give the
same 5,000 training and 1,000 test canvases every time (generated in a few
seconds, kept for the process). Images are white ink on black, three equal
channels in [0, 1]; models normalise them themselves.
"""

from functools import lru_cache

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from common.data import digits

TRAIN_SIZE, TEST_SIZE = 5_000, 1_000
SEEDS = {"train": 0, "test": 1}
SIDES = tuple(range(48, 129, 16))  # 48, 64, ..., 128: multiples of 16
SCALE = (1.0, 4.0)  # each digit 8 to 32 pixels a side
MAX_DIGITS, EMPTY = 6, 0.05  # 1 to 6 digits, or none with this probability
MAX_OVERLAP = 0.1  # of either square's area
TRIES = 20  # places tried for a digit before it is left out
INK = 0.1  # a pixel of the scaled digit above this is ink (the box is the ink's extent)
CLASSES = tuple(str(d) for d in range(10))


def _overlap(a: tuple[int, int, int], b: tuple[int, int, int]) -> float:
    """The shared area of two squares (top, left, side) over the smaller one's area."""
    (t1, l1, s1), (t2, l2, s2) = a, b
    h = min(t1 + s1, t2 + s2) - max(t1, t2)
    w = min(l1 + s1, l2 + s2) - max(l1, l2)
    return max(h, 0) * max(w, 0) / min(s1, s2) ** 2


def draw(glyphs: torch.Tensor, labels: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, dict]:
    """One canvas from a pool of digits (N, 8, 8) in [0, 1]: the image (3, H, W) and its target."""
    H, W = (SIDES[int(torch.randint(len(SIDES), (), generator=g))] for _ in range(2))
    canvas = torch.zeros(H, W)
    n = 0 if float(torch.rand((), generator=g)) < EMPTY else int(torch.randint(1, MAX_DIGITS + 1, (), generator=g))
    placed, boxes, classes = [], [], []
    for _ in range(n):
        k = int(torch.randint(len(glyphs), (), generator=g))
        side = min(round(8 * (SCALE[0] + (SCALE[1] - SCALE[0]) * float(torch.rand((), generator=g)))), H, W)
        for _ in range(TRIES):
            top = int(torch.randint(H - side + 1, (), generator=g))
            left = int(torch.randint(W - side + 1, (), generator=g))
            if all(_overlap((top, left, side), p) <= MAX_OVERLAP for p in placed):
                break
        else:
            continue  # no room: this digit is left out
        patch = F.interpolate(glyphs[k][None, None], size=(side, side), mode="bilinear", align_corners=False)[0, 0]
        patch = patch.clamp(0, 1)
        rows, cols = (patch > INK).any(1).nonzero(), (patch > INK).any(0).nonzero()
        if len(rows) == 0:
            continue
        canvas[top:top + side, left:left + side] = torch.maximum(canvas[top:top + side, left:left + side], patch)
        placed.append((top, left, side))
        boxes.append([left + int(cols[0]), top + int(rows[0]), left + int(cols[-1]) + 1, top + int(rows[-1]) + 1])
        classes.append(int(labels[k]))
    target = {"boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
              "labels": torch.tensor(classes, dtype=torch.int64)}
    return canvas.expand(3, H, W), target


class DigitsDetect(Dataset):
    """Canvases of digits with their boxes and labels; `sizes` holds each canvas's (height, width)
    for size bucketing. Images are kept as bytes (uint8) and made float when read."""

    def __init__(self, glyphs: torch.Tensor, labels: torch.Tensor, size: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.images, self.targets, self.sizes = [], [], []
        for _ in range(size):
            image, target = draw(glyphs, labels, g)
            self.images.append((image[0] * 255).round().to(torch.uint8))  # (H, W): the three channels are equal
            self.targets.append(target)
            self.sizes.append(tuple(image.shape[1:]))

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, dict]:
        image = self.images[i].float().div(255)  # (H, W) in [0, 1]
        return image.expand(3, *image.shape), self.targets[i]


@lru_cache(maxsize=1)
def load(**_) -> tuple[DigitsDetect, DigitsDetect]:
    """The training and test canvases, from the digits' fixed training and test splits."""
    x_train, x_test, y_train, y_test = digits.split_digits()  # (N, 8, 8) in [0, 16]
    glyphs = lambda x: torch.from_numpy(x).float() / 16
    return (DigitsDetect(glyphs(x_train), torch.from_numpy(y_train), TRAIN_SIZE, SEEDS["train"]),
            DigitsDetect(glyphs(x_test), torch.from_numpy(y_test), TEST_SIZE, SEEDS["test"]))


def facts(**_) -> dict:
    """What a model is built for: 10 classes, 3 channels, sides of 48 to 128 (about 88) in multiples of 16."""
    return dict(num_classes=len(CLASSES), in_chans=3, img_size=88, size_multiple=16)


def preprocessing(**_) -> dict:
    """How an image file becomes a model input (see common.predict): RGB at its own size, scaled to [0, 1]."""
    return dict(layout="image", mode="RGB", size=None, size_multiple=16, scale=1 / 255, mean=[0.0] * 3,
                std=[1.0] * 3, labels=list(CLASSES))
