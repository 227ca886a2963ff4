"""scikit-learn's bundled handwritten digits: 1,797 images of 8x8 pixels, 10 classes.

The data ships inside scikit-learn, so nothing is downloaded. The train/test
split is fixed (stratified, seed 0, 20% test) and does not depend on the run's
seed, so every run of every paper is scored on the same 360 test images.
"""

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, TensorDataset

SPLIT_SEED = 0
TEST_FRACTION = 0.2


def split_digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The fixed stratified split: x_train, x_test (N, 8, 8) in [0, 16], y_train, y_test.

    Made by scikit-learn once and kept in the cache folder (common.cache) under scikit-learn's
    version: importing scikit-learn costs each process about 1.5 s of its start."""
    import zipfile
    from importlib.metadata import version

    from common.cache import cache_dir, write_atomically

    path = cache_dir() / f"digits-split-sklearn-{version('scikit-learn')}.npz"
    try:
        with np.load(path) as f:
            return f["x_train"], f["x_test"], f["y_train"], f["y_test"]
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):  # not made yet, or unreadable: made again
        pass
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.images, digits.target, test_size=TEST_FRACTION, stratify=digits.target, random_state=SPLIT_SEED
    )
    write_atomically(path, lambda f: np.savez(f, x_train=x_train, x_test=x_test, y_train=y_train, y_test=y_test))
    return x_train, x_test, y_train, y_test


def preprocessing(layout: str = "image", size: tuple[int, int] | None = (8, 8), size_multiple: int = 1, **_) -> dict:
    """How an image file becomes a model input (see common.predict): grey pixels 0..255 scaled to the
    digits' 0..16 (ink is high), normalised by the training set's mean and std."""
    x_train = split_digits()[0]
    return dict(layout=layout, mode="L", size=list(size) if size else None, size_multiple=size_multiple,
                scale=16 / 255, mean=[float(x_train.mean())], std=[float(x_train.std())],
                labels=[str(d) for d in range(10)])


def load(image_size: int | None = None, **_) -> tuple[TensorDataset, TensorDataset]:
    """Train and test sets of (image (1, 8, 8), label), normalised by the training set's mean and std;
    with image_size N, each image resized (bilinear) to N x N, for models built for larger inputs."""
    x_train, x_test, y_train, y_test = split_digits()
    mean, std = x_train.mean(), x_train.std()

    def to_dataset(x: np.ndarray, y: np.ndarray) -> TensorDataset:
        images = torch.from_numpy((x - mean) / std).float().unsqueeze(1)  # (N, 1, 8, 8)
        if image_size and image_size != 8:
            images = F.interpolate(images, size=(image_size, image_size), mode="bilinear", align_corners=False)
        return TensorDataset(images, torch.from_numpy(y).long())

    return to_dataset(x_train, y_train), to_dataset(x_test, y_test)


def facts(image_size: int | None = None, **_) -> dict:
    return dict(num_classes=10, in_chans=1, img_size=image_size or 8)


def image_preprocessing(image_size: int | None = None, **_) -> dict:
    """`preprocessing` of the digits as images, at 8 x 8 or resized to N x N."""
    return preprocessing(size=(image_size or 8,) * 2)


def load_rows(**_) -> tuple[TensorDataset, TensorDataset]:
    """The same digits read row by row: sequences of 8 steps of 8 pixels, (8, 8) per sample."""
    return tuple(TensorDataset(d.tensors[0].squeeze(1), d.tensors[1]) for d in load())


CANVAS_SEEDS = {"train": 0, "test": 1}
CANVAS_SIDES = range(16, 49, 4)  # multiples of 4, so that 4x4 and 2x2 patches tile every canvas


class DigitsCanvas(torch.utils.data.Dataset):
    """Each digit scaled by 1x to 3x and placed at a random spot of a square canvas of random side.

    Sides are 16 to 48 pixels, in steps of 4; the scaled digit always fits. Drawn
    from a fixed seed per split, so every run sees the same images. `sizes` holds
    each image's (height, width) for size bucketing.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, seed: int):
        g = torch.Generator().manual_seed(seed)
        sides = torch.tensor(list(CANVAS_SIDES))
        self.images, self.labels, self.sizes = [], labels, []
        for image in images:  # (1, 8, 8), normalised
            side = int(sides[torch.randint(len(sides), (), generator=g)])
            scale = 1 + 2 * float(torch.rand((), generator=g))  # 1x to 3x
            digit = min(round(8 * scale), side)
            scaled = F.interpolate(image[None], size=(digit, digit), mode="bilinear", align_corners=False)[0]
            top, left = (int(torch.randint(side - digit + 1, (), generator=g)) for _ in range(2))
            canvas = torch.full((1, side, side), float(image.min()))  # the digits' own background value
            canvas[:, top:top + digit, left:left + digit] = scaled
            self.images.append(canvas)
            self.sizes.append((side, side))

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[i], self.labels[i]


def load_canvas(image_size: int | None = None, **_) -> tuple[Dataset, Dataset]:
    """The digits' fixed train/test split, each image drawn onto its own canvas; with image_size N,
    every canvas resized (bilinear) to N x N, for models that read one size only."""
    splits = tuple(DigitsCanvas(*d.tensors, seed=CANVAS_SEEDS[split]) for split, d in zip(("train", "test"), load()))
    if not image_size:
        return splits
    resize = lambda im: F.interpolate(im[None], size=(image_size, image_size), mode="bilinear", align_corners=False)[0]
    return tuple(TensorDataset(torch.stack([resize(im) for im in s.images]), s.labels) for s in splits)


def canvas_facts(image_size: int | None = None, **_) -> dict:
    """What a model is built for: sides of 16 to 48 in steps of 4 (about 32), or N x N when resized."""
    if image_size:
        return dict(num_classes=10, in_chans=1, img_size=image_size)
    return dict(num_classes=10, in_chans=1, img_size=32, size_multiple=4)


def canvas_preprocessing(image_size: int | None = None, **_) -> dict:
    """As `preprocessing`: images of any size in multiples of 4, or resized to N x N."""
    if image_size:
        return preprocessing(size=(image_size, image_size))
    return preprocessing(size=None, size_multiple=4)
