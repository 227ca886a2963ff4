"""Real image data sets, read from a local folder (--data-dir) with torchvision's readers (MNIST and
Fashion-MNIST: common.data.mnist).

Nothing is downloaded unless the user asks (--download: torchvision fetches
CIFAR-10 into the folder). A missing or empty folder
is an input error that says which files are expected where.
"""

import pickle
from collections import Counter
from pathlib import Path

from torch.utils.data import Dataset, Subset

from common.errors import ConfigError

# per-channel mean and std of each training set, the usual constants
CIFAR10_STATS = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))
MNIST_STATS = ((0.1307,), (0.3081,))
FASHION_STATS = ((0.2860,), (0.3530,))
IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
SPLIT_SEED, TEST_FRACTION = 0, 0.2


def _datasets():
    """torchvision.datasets, imported when a real data set is read (it takes a second or two to import)."""
    from torchvision import datasets

    return datasets


def _transform(stats, image_size: int | None):
    from torchvision import transforms

    steps = [transforms.Resize((image_size, image_size))] if image_size else []
    return transforms.Compose(steps + [transforms.ToTensor(), transforms.Normalize(*stats)])


def _preprocessing(stats, mode: str, size: int, labels: list[str]) -> dict:
    """How an image file becomes a model input (see common.predict), as the transform above does it:
    resized (bilinear), pixels scaled to [0, 1], normalised per channel."""
    return dict(layout="image", mode=mode, size=[size, size], size_multiple=1, scale=1 / 255,
                mean=list(stats[0]), std=list(stats[1]), labels=labels)


def _need(data_dir: str | None, dataset: str, expected: list[str], where: str) -> Path:
    """The folder, or an input error naming the files expected in it."""
    if not data_dir:
        raise ConfigError(f"--dataset {dataset} reads from --data-dir DIR, which needs {where}")
    root = Path(data_dir)
    missing = [name for name in expected if not (root / name).is_file()]
    if missing:
        raise ConfigError(f"--dataset {dataset}: {root} lacks {', '.join(missing)}; it needs {where}")
    return root


# ---------------------------------------------------------------- CIFAR-10

CIFAR10_FILES = [f"cifar-10-batches-py/data_batch_{i}" for i in range(1, 6)] + [
    "cifar-10-batches-py/test_batch", "cifar-10-batches-py/batches.meta"]


def cifar10_facts(data_dir=None, image_size=None, **_) -> dict:
    _need(data_dir, "cifar10", CIFAR10_FILES, "cifar-10-batches-py/ from the CIFAR-10 python version "
          "(data_batch_1..5, test_batch, batches.meta)")
    return dict(num_classes=10, in_chans=3, img_size=image_size or 32)


def cifar10_preprocess(data_dir=None, image_size=None, **_) -> dict:
    cifar10_facts(data_dir, image_size)
    with open(Path(data_dir) / "cifar-10-batches-py/batches.meta", "rb") as f:
        labels = [str(name) for name in pickle.load(f, encoding="latin1")["label_names"]]
    return _preprocessing(CIFAR10_STATS, "RGB", image_size or 32, labels)


def cifar10_load(data_dir=None, image_size=None, **_) -> tuple[Dataset, Dataset]:
    cifar10_facts(data_dir, image_size)
    t = _transform(CIFAR10_STATS, image_size)
    return (_datasets().CIFAR10(data_dir, train=True, transform=t, download=False),
            _datasets().CIFAR10(data_dir, train=False, transform=t, download=False))


def cifar10_fetch(data_dir: str) -> None:
    """torchvision's download of the python version into data_dir/cifar-10-batches-py/ (md5-checked)."""
    _datasets().CIFAR10(data_dir, train=True, download=True)


# ---------------------------------------------------------------- a folder of class subfolders

FOLDER_LAYOUT = ("class subfolders of images (DIR/<class>/*.png), or DIR/train/<class>/ and DIR/test/<class>/")


def _classes(root: Path) -> list[str]:
    return sorted(d.name for d in root.iterdir() if d.is_dir() and any(
        f.suffix.lower() in IMAGE_SUFFIXES for f in d.iterdir()))


def _folder_roots(data_dir: str | None) -> tuple[Path, Path | None]:
    """(train root, test root or None when the test set is split off the train root)."""
    if not data_dir:
        raise ConfigError(f"--dataset imagefolder reads from --data-dir DIR, which needs {FOLDER_LAYOUT}")
    root = Path(data_dir)
    if not root.is_dir():
        raise ConfigError(f"--dataset imagefolder: {root} is not a folder; it needs {FOLDER_LAYOUT}")
    if (root / "train").is_dir() and (root / "test").is_dir():
        return root / "train", root / "test"
    return root, None


def imagefolder_facts(data_dir=None, image_size=None, **_) -> dict:
    train, test = _folder_roots(data_dir)
    classes = _classes(train)
    if not classes:
        raise ConfigError(f"--dataset imagefolder: {train} holds no images; it needs {FOLDER_LAYOUT}")
    if test is not None and _classes(test) != classes:
        raise ConfigError(f"--dataset imagefolder: {test} must hold the same classes as {train} ({', '.join(classes)})")
    if not image_size:
        raise ConfigError("--dataset imagefolder needs --image-size N: every image is resized to N x N")
    return dict(num_classes=len(classes), in_chans=3, img_size=image_size)


def _check_image(path: str) -> None:
    """An image file Pillow can open (its header, read now rather than in the middle of training)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image.size
    except (OSError, UnidentifiedImageError) as e:
        raise ConfigError(f"--dataset imagefolder: {path} is not an image Pillow can read ({e})") from None


def imagefolder_preprocess(data_dir=None, image_size=None, **_) -> dict:
    imagefolder_facts(data_dir, image_size)
    return _preprocessing(IMAGENET_STATS, "RGB", image_size, _classes(_folder_roots(data_dir)[0]))


def imagefolder_load(data_dir=None, image_size=None, **_) -> tuple[Dataset, Dataset]:
    """ImageFolder in RGB; without train/ and test/ a fixed stratified 80/20 split (seed 0)."""
    imagefolder_facts(data_dir, image_size)
    train_root, test_root = _folder_roots(data_dir)
    t = _transform(IMAGENET_STATS, image_size)
    train = _datasets().ImageFolder(train_root, transform=t)
    test = _datasets().ImageFolder(test_root, transform=t) if test_root is not None else None
    for path, _ in train.samples + (test.samples if test is not None else []):
        _check_image(path)
    if test is not None:
        return train, test
    train_idx, test_idx = split_80_20(train.targets)
    return Subset(train, train_idx), Subset(train, test_idx)


def split_80_20(targets: list[int]) -> tuple[list[int], list[int]]:
    """The fixed test split of a folder without train/ and test/: 20% of the samples, stratified by class
    where every class has two or more (seed 0). Returns (train indices, test indices)."""
    from sklearn.model_selection import train_test_split

    counts = Counter(targets)
    stratified = min(counts.values()) >= 2 and round(TEST_FRACTION * len(targets)) >= len(counts)
    return train_test_split(list(range(len(targets))), test_size=TEST_FRACTION, random_state=SPLIT_SEED,
                            stratify=targets if stratified else None)


def imagefolder_files(data_dir: str | None) -> tuple[list[str], list[tuple[str, int]], list[tuple[str, int]]]:
    """(class names, train (path, label) pairs, test pairs) of an image folder, split as imagefolder_load
    splits it (checked as it checks it)."""
    imagefolder_facts(data_dir, image_size=1)
    train, test = imagefolder_load(data_dir, image_size=1)
    samples = lambda d: [d.dataset.samples[i] for i in d.indices] if isinstance(d, Subset) else list(d.samples)
    return _classes(_folder_roots(data_dir)[0]), samples(train), samples(test)
