"""A user's own segmentation data from --data-dir: images, and a mask of class indices per image.

    DIR/classes.txt                    the class names, one a line: index 0 first (the background, say)
    DIR/images/NAME.png|.jpg|...       the images, at their own sizes
    DIR/masks/NAME.png                 each image's mask, of the same name (stem) and the same size

or DIR/train/{images,masks}/ and DIR/test/{images,masks}/ for splits of one's own; without them, a
fixed 20% of the images (seed 0) is the test split, as imagefolder splits a folder. A mask is a PNG of
class indices, one a pixel: a palette image (PASCAL VOC's SegmentationClass) or a grayscale one;
index 255 is "void" (no loss and no score there, PASCAL VOC's object borders). Images are read as RGB
at their own size (no resizing), normalised by ImageNet's mean and std.

Every file is checked before anything trains: an image without its mask, a mask of another size than
its image, a mask that is not a palette or grayscale PNG, or an index beyond the classes of
classes.txt (and not 255) is one line naming the file (a ConfigError).
"""

from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from common.data import vision
from common.data.collate import IGNORE_INDEX
from common.errors import ConfigError

LAYOUT = ("DIR/classes.txt (a class name a line, index 0 first), DIR/images/ and DIR/masks/ (a PNG of class "
          "indices per image, of the same name), or DIR/train/ and DIR/test/ each holding images/ and masks/")


def _root(data_dir: str | None) -> Path:
    if not data_dir:
        raise ConfigError(f"--dataset segfolder reads from --data-dir DIR, which needs {LAYOUT}")
    root = Path(data_dir)
    if not (root / "classes.txt").is_file():
        raise ConfigError(f"--dataset segfolder: {root} has no classes.txt; it needs {LAYOUT}")
    return root


def classes(data_dir: str | None) -> list[str]:
    names = [line.strip() for line in (_root(data_dir) / "classes.txt").read_text().splitlines() if line.strip()]
    if not names or len(names) > IGNORE_INDEX:
        raise ConfigError(f"--dataset segfolder: {Path(data_dir) / 'classes.txt'} names {len(names)} classes; "
                          f"it needs 1 to {IGNORE_INDEX} (index {IGNORE_INDEX} is void)")
    return names


def splits(data_dir: str | None) -> list[Path]:
    """The folders holding images/ and masks/: [train, test], or [the one to split]."""
    root = _root(data_dir)
    folders = [root / "train", root / "test"] if (root / "train").is_dir() and (root / "test").is_dir() else [root]
    for folder in folders:
        if not (folder / "images").is_dir() or not (folder / "masks").is_dir():
            raise ConfigError(f"--dataset segfolder: {folder} lacks images/ or masks/; it needs {LAYOUT}")
    return folders


def check_pair(image: Path, mask: Path, num_classes: int) -> tuple[int, int]:
    """The (height, width) of an image whose mask is there, of its size, of indices, with indices below
    num_classes or void; else a ConfigError naming the file."""
    from PIL import Image, UnidentifiedImageError

    if not mask.is_file():
        raise ConfigError(f"--dataset segfolder: {image} has no mask {mask}")
    try:
        with Image.open(image) as im:
            size = im.size
    except (OSError, UnidentifiedImageError) as e:
        raise ConfigError(f"--dataset segfolder: {image} is not an image Pillow can read ({e})") from None
    try:
        with Image.open(mask) as m:
            mode, mask_size, indices = m.mode, m.size, np.asarray(m) if m.mode in ("P", "L") else None
    except (OSError, UnidentifiedImageError) as e:
        raise ConfigError(f"--dataset segfolder: {mask} is not an image Pillow can read ({e})") from None
    if indices is None:
        raise ConfigError(f"--dataset segfolder: {mask} is a {mode} image; a mask holds class indices, as a "
                          f"palette (P) or grayscale (L) PNG")
    if mask_size != size:
        raise ConfigError(f"--dataset segfolder: {mask} is {mask_size[0]}x{mask_size[1]}, its image {image} "
                          f"{size[0]}x{size[1]}; a mask has its image's size")
    beyond = np.unique(indices[(indices >= num_classes) & (indices != IGNORE_INDEX)])
    if beyond.size:
        raise ConfigError(f"--dataset segfolder: {mask} holds index {int(beyond[0])}, beyond the {num_classes} "
                          f"classes of classes.txt (0 to {num_classes - 1}, and {IGNORE_INDEX} for void)")
    return size[1], size[0]


@lru_cache(maxsize=4)
def scan(data_dir: str) -> tuple[tuple[tuple[Path, Path, tuple[int, int]], ...], ...]:
    """Each split folder's (image, mask, (height, width)), in the order of the images' names, checked."""
    num_classes, found = len(classes(data_dir)), []
    for folder in splits(data_dir):
        images = sorted(p for p in (folder / "images").iterdir() if p.suffix.lower() in vision.IMAGE_SUFFIXES)
        if not images:
            raise ConfigError(f"--dataset segfolder: {folder / 'images'} holds no images")
        pairs = [(p, folder / "masks" / f"{p.stem}.png") for p in images]
        found.append(tuple((image, mask, check_pair(image, mask, num_classes)) for image, mask in pairs))
    return tuple(found)


class SegmentationFolder(Dataset):
    """(image (3, H, W) normalised, {"labels": (H, W) int64}) for pairs of files; `sizes` holds each
    image's (height, width) for size bucketing."""

    def __init__(self, pairs: tuple[tuple[Path, Path, tuple[int, int]], ...]):
        self.pairs = pairs
        self.sizes = [size for _, _, size in pairs]
        self.mean, self.std = (torch.tensor(s)[:, None, None] for s in vision.IMAGENET_STATS)

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, dict]:
        from PIL import Image

        image_path, mask_path, _ = self.pairs[i]
        with Image.open(image_path) as im:
            pixels = torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1)  # (3, H, W) uint8
        with Image.open(mask_path) as m:
            labels = torch.from_numpy(np.array(m)).long()  # (H, W): the palette's or grey level's indices
        return (pixels.float().div(255) - self.mean) / self.std, {"labels": labels}


def load(data_dir: str | None = None, **_) -> tuple[Dataset, Dataset]:
    found = scan(str(_root(data_dir)))
    if len(found) == 2:
        return SegmentationFolder(found[0]), SegmentationFolder(found[1])
    everything = SegmentationFolder(found[0])
    train, test = vision.split_80_20([0] * len(everything))
    return SizedSubset(everything, train), SizedSubset(everything, test)


class SizedSubset(Subset):
    """A Subset that keeps its samples' `sizes` (for bucketing and the ordered evaluation)."""

    def __init__(self, dataset: SegmentationFolder, indices: list[int]):
        super().__init__(dataset, sorted(indices))
        self.sizes = [dataset.sizes[i] for i in self.indices]


def facts(data_dir: str | None = None, **_) -> dict:
    names = classes(data_dir)
    scan(str(_root(data_dir)))  # every pair checked before anything trains
    return dict(num_classes=len(names), in_chans=3, img_size=224, classes=names)


def preprocessing(data_dir: str | None = None, **_) -> dict:
    names = facts(data_dir)["classes"]
    return dict(layout="image", mode="RGB", size=None, size_multiple=1, scale=1 / 255,
                mean=list(vision.IMAGENET_STATS[0]), std=list(vision.IMAGENET_STATS[1]), labels=names)
