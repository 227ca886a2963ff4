"""Fashion-MNIST canvases to segment: the items' real pixels, several to a canvas, touching and overlapping.

Each canvas has its own height and width (SIDES: 40 to 96 pixels in steps of 8, drawn independently)
and holds 1 to MAX_ITEMS Fashion-MNIST items at their own 28 x 28 pixels, each at a random place, in
front of those placed before it: an item's pixels are its non-zero ones (Fashion-MNIST's background is
exactly 0), and they hide what lies behind them. A place is kept where every item placed so far keeps
at least MIN_VISIBLE of its pixels in sight (else another is tried, TRIES times, before the item is left
out), so items touch and overlap as objects do in photographs, none hidden. A sample is the canvas
(1, H, W), normalised as Fashion-MNIST's images are (its training pixels' mean and std), and its
target, per pixel:

- "labels": 0 for the background, 1 + the item's Fashion-MNIST class (1 to 10) for its pixels, and
  IGNORE_INDEX (255, "void") on a band at every border (PASCAL VOC's convention): a pixel whose
  8-neighbourhood holds another item, or an item and the background, so the band runs a pixel deep on
  each side of every outline;
- "instances": 0 for the background, 1 to n for the items in the order they were placed (the void band
  keeps its item's id).

Training canvases draw their items from Fashion-MNIST's training split and test canvases from its test
split, with a fixed seed each (SEEDS): the same canvases on every run and machine. They are made once
(TRAIN_SIZE training canvases take a few seconds) and kept in the cache folder (common.cache), read
from there by every later run. The items come from the files `--dataset fashion-mnist` reads, with its
checks (common.data.mnist).
"""

from functools import lru_cache

import numpy as np
import torch
from torch.utils.data import Dataset

from common.cache import cache_dir, write_atomically
from common.data import mnist, vision
from common.data.collate import IGNORE_INDEX

VERSION = 1  # of the drawing below: a change to it makes new cache files
TRAIN_SIZE, TEST_SIZE = 5_000, 1_000
SEEDS = {"train": 0, "test": 1}
SIDES = tuple(range(40, 97, 8))  # 40, 48, ..., 96
ITEM = 28  # Fashion-MNIST's side
MAX_ITEMS = 4  # 1 to 4 items a canvas
MIN_VISIBLE = 0.5  # of each item's pixels, once every item is placed
TRIES = 20  # places tried for an item before it is left out
CLASSES = ["background", "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
           "Bag", "Ankle boot"]  # label k: Fashion-MNIST's class k - 1


def void_band(instances: np.ndarray) -> np.ndarray:
    """(H, W) bool: the pixels whose 8-neighbourhood (within the canvas) holds another instance id."""
    padded = np.pad(instances, 1, mode="edge")
    H, W = instances.shape
    band = np.zeros((H, W), dtype=bool)
    for dy in (0, 1, 2):
        for dx in (0, 1, 2):
            band |= padded[dy:dy + H, dx:dx + W] != instances
    return band


def draw(items: np.ndarray, classes: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """One canvas from a pool of items (N, 28, 28) uint8 and their classes (N,): its pixels, labels
    and instance ids, each (H, W) uint8, and where each item went: (item index, top, left) (n, 3)."""
    H, W = (int(rng.choice(SIDES)) for _ in range(2))
    canvas = np.zeros((H, W), dtype=np.uint8)
    instances = np.zeros((H, W), dtype=np.uint8)
    drawn = []  # (item index, its pixel count, top, left) of the items placed
    for _ in range(int(rng.integers(1, MAX_ITEMS + 1))):
        k = int(rng.integers(len(items)))
        shape = items[k] > 0  # (28, 28): the item's pixels
        for _ in range(TRIES):
            top, left = int(rng.integers(H - ITEM + 1)), int(rng.integers(W - ITEM + 1))
            trial = instances.copy()
            trial[top:top + ITEM, left:left + ITEM][shape] = len(drawn) + 1
            visible = np.bincount(trial.ravel(), minlength=len(drawn) + 2)[1:]
            if all(visible[i] >= MIN_VISIBLE * n for i, (_, n, _, _) in enumerate(drawn)):
                break
        else:
            continue  # no place leaves every item in sight: this one is left out
        instances = trial
        canvas[top:top + ITEM, left:left + ITEM][shape] = items[k][shape]
        drawn.append((k, int(shape.sum()), top, left))
    item_class = np.array([0] + [1 + int(classes[k]) for k, *_ in drawn], dtype=np.uint8)
    labels = item_class[instances]  # (H, W): 0 background, 1 + class
    labels[void_band(instances)] = IGNORE_INDEX
    return canvas, labels, instances, np.array([(k, top, left) for k, _, top, left in drawn]).reshape(-1, 3)


def generate(items: np.ndarray, classes: np.ndarray, count: int, seed: int) -> dict[str, np.ndarray]:
    """`count` canvases drawn from a seed, flat: "pixels", "labels", "instances" (every canvas's (H, W)
    maps raveled one after another) and "sizes" (count, 2)."""
    rng = np.random.default_rng(seed)
    canvases = [draw(items, classes, rng) for _ in range(count)]
    flat = {key: np.concatenate([c[i].ravel() for c in canvases]) for i, key in
            enumerate(("pixels", "labels", "instances"))}
    return flat | {"sizes": np.array([c[0].shape for c in canvases], dtype=np.int64).reshape(-1, 2)}


class FashionCanvas(Dataset):
    """Canvases as samples: (image (1, H, W) normalised, {"labels": (H, W) int64, "instances": (H, W) int64});
    `sizes` holds each canvas's (height, width) for size bucketing.

    Args:
        flat: `generate`'s arrays.
    """

    def __init__(self, flat: dict[str, np.ndarray]):
        self.sizes = [tuple(int(v) for v in s) for s in flat["sizes"]]
        starts = np.concatenate([[0], np.cumsum([h * w for h, w in self.sizes])])
        maps = {key: torch.from_numpy(flat[key]) for key in ("pixels", "labels", "instances")}
        self.maps = [{key: m[a:b].view(h, w) for key, m in maps.items()}
                     for a, b, (h, w) in zip(starts[:-1], starts[1:], self.sizes)]
        (mean,), (std,) = vision.FASHION_STATS
        self.mean, self.std = mean, std

    def __len__(self) -> int:
        return len(self.maps)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, dict]:
        m = self.maps[i]
        image = (m["pixels"].float().div(255) - self.mean) / self.std  # (H, W)
        return image[None], {"labels": m["labels"].long(), "instances": m["instances"].long()}


def fashion_items(data_dir: str | None, train: bool) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST's items (N, 28, 28) uint8 and classes (N,) of one split, through `--dataset
    fashion-mnist`'s files and checks (a ConfigError where they are missing or not the recorded ones)."""
    root = mnist.prepare("fashion-mnist", "FashionMNIST", data_dir)
    data = mnist._datasets().FashionMNIST(root, train=train)
    return data.data.numpy(), data.targets.numpy()


def canvases(data_dir: str | None, split: str, count: int) -> FashionCanvas:
    """One split's canvases, from the cache folder, or drawn and kept there (atomically: the ranks of a
    launch may draw them at once, and each writes the same file)."""
    path = cache_dir() / f"fashion-canvas-v{VERSION}-{split}-seed{SEEDS[split]}-{count}.npz"
    try:
        with np.load(path) as f:
            return FashionCanvas({key: f[key] for key in ("pixels", "labels", "instances", "sizes")})
    except (OSError, KeyError, ValueError):  # not made yet, or unreadable: made again
        pass
    flat = generate(*fashion_items(data_dir, split == "train"), count, SEEDS[split])
    write_atomically(path, lambda f: np.savez(f, **flat))
    return FashionCanvas(flat)


@lru_cache(maxsize=2)
def load(data_dir: str | None = None, **_) -> tuple[FashionCanvas, FashionCanvas]:
    """The training and test canvases, drawn from Fashion-MNIST's training and test splits."""
    mnist.prepare("fashion-mnist", "FashionMNIST", data_dir)  # the files checked on every call, as fashion-mnist's
    return canvases(data_dir, "train", TRAIN_SIZE), canvases(data_dir, "test", TEST_SIZE)


def facts(data_dir: str | None = None, **_) -> dict:
    """Eleven classes (the background and Fashion-MNIST's ten), one channel, sides of 40 to 96 (about 68)."""
    mnist.prepare("fashion-mnist", "FashionMNIST", data_dir)  # ConfigError when missing or not the recorded files
    return dict(num_classes=len(CLASSES), in_chans=1, img_size=68, classes=list(CLASSES))


def preprocessing(data_dir: str | None = None, **_) -> dict:
    """How an image file becomes a model input (see common.predict): grey, at its own size, scaled to
    [0, 1] and normalised as Fashion-MNIST."""
    facts(data_dir)
    (mean,), (std,) = vision.FASHION_STATS
    return dict(layout="image", mode="L", size=None, size_multiple=1, scale=1 / 255, mean=[mean], std=[std],
                labels=list(CLASSES))
