"""COCO-format detection data from --data-dir: a user's own annotated images.

The folder holds the annotations as COCO "instances" JSON and the images its
`file_name`s name, relative to the folder (or to an `images/` folder in it):

    DIR/train.json + DIR/test.json     two splits as given, or
    DIR/<one>.json                     one file, split 80/20 by image with a fixed seed

Images are read with torchvision's CocoDetection (pycocotools) at their own
size, as RGB in [0, 1]. Boxes ([x, y, width, height] in COCO) become x1 y1 x2 y2;
categories become labels 0..K-1 in the order of their ids; crowd annotations are
left out. Every annotation is checked before training: a box outside its image, a
box of negative width or height, or an unknown category is one error naming the
file and the annotation.
"""

import contextlib
import io
import json
from functools import lru_cache
from pathlib import Path

import torch
from torch.utils.data import Dataset

from common.errors import ConfigError

SPLIT_SEED, TEST_FRACTION = 0, 0.2


def _files(data_dir: str | None) -> tuple[Path, ...]:
    if not data_dir:
        raise ConfigError("--dataset coco reads COCO-format annotations from --data-dir DIR")
    root = Path(data_dir)
    if (root / "train.json").is_file() and (root / "test.json").is_file():
        return root / "train.json", root / "test.json"
    found = sorted(root.glob("*.json"))
    if len(found) != 1:
        raise ConfigError(f"--dataset coco: {root} should hold train.json and test.json, or one .json file of "
                          f"COCO annotations; found {', '.join(p.name for p in found) or 'none'}")
    return (found[0],)


@lru_cache(maxsize=8)
def _read(path: Path) -> dict:
    """The annotations of one file, checked: one ConfigError naming the file and the annotation."""
    try:
        coco = json.loads(path.read_text())
        images, annotations, categories = coco["images"], coco["annotations"], coco["categories"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"--dataset coco: {path} is not a COCO instances file ({type(e).__name__}: {e})") from None
    sizes = {im["id"]: (im["height"], im["width"]) for im in images}
    known = {c["id"] for c in categories}
    for a in annotations:
        where = f"{path}: annotation {a.get('id')} (image {a.get('image_id')})"
        if a.get("category_id") not in known:
            raise ConfigError(f"--dataset coco: {where} has category {a.get('category_id')}, which 'categories' "
                              f"does not list")
        if a.get("image_id") not in sizes:
            raise ConfigError(f"--dataset coco: {where} belongs to no image of 'images'")
        x, y, w, h = a["bbox"]
        H, W = sizes[a["image_id"]]
        if w < 0 or h < 0:
            raise ConfigError(f"--dataset coco: {where} has a negative width or height: bbox {a['bbox']}")
        if x < 0 or y < 0 or x + w > W or y + h > H:
            raise ConfigError(f"--dataset coco: {where} lies outside its {W}x{H} image: bbox {a['bbox']}")
    return coco


def categories(data_dir: str | None) -> list[dict]:
    """The categories of the training file, in the order of their ids (label k is the k-th)."""
    return sorted(_read(_files(data_dir)[0])["categories"], key=lambda c: c["id"])


class CocoImages(Dataset):
    """(image (3, H, W) in [0, 1], {"boxes", "labels"}) for some images of one COCO file; `sizes` holds
    each image's (height, width) for size bucketing."""

    def __init__(self, path: Path, image_ids: list[int], labels: dict[int, int]):
        from torchvision.datasets import CocoDetection

        root = path.parent / "images" if (path.parent / "images").is_dir() else path.parent
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints as it indexes
            self.coco = CocoDetection(str(root), str(path))
        self.ids, self.labels, self.path = image_ids, labels, path
        info = self.coco.coco.imgs
        self.sizes = [(info[i]["height"], info[i]["width"]) for i in image_ids]

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, dict]:
        from torchvision.transforms.v2.functional import pil_to_tensor

        image_id = self.ids[i]
        try:
            image = self.coco._load_image(image_id).convert("RGB")
        except OSError as e:
            raise ConfigError(f"--dataset coco: image {image_id} of {self.path}: {e}") from None
        annotations = [a for a in self.coco._load_target(image_id) if not a.get("iscrowd", 0)]
        boxes = torch.tensor([a["bbox"] for a in annotations], dtype=torch.float32).reshape(-1, 4)
        boxes[:, 2:] += boxes[:, :2]  # x, y, width, height -> x1, y1, x2, y2
        target = {"boxes": boxes,
                  "labels": torch.tensor([self.labels[a["category_id"]] for a in annotations], dtype=torch.int64)}
        return pil_to_tensor(image).float().div(255), target


def load(data_dir: str | None = None, **_) -> tuple[CocoImages, CocoImages]:
    files = _files(data_dir)
    labels = {c["id"]: k for k, c in enumerate(categories(data_dir))}
    if len(files) == 2:
        return tuple(CocoImages(f, sorted(im["id"] for im in _read(f)["images"]), labels) for f in files)
    ids = sorted(im["id"] for im in _read(files[0])["images"])
    order = torch.randperm(len(ids), generator=torch.Generator().manual_seed(SPLIT_SEED)).tolist()
    n_test = max(1, round(TEST_FRACTION * len(ids)))
    test, train = sorted(ids[k] for k in order[:n_test]), sorted(ids[k] for k in order[n_test:])
    return CocoImages(files[0], train, labels), CocoImages(files[0], test, labels)


def facts(data_dir: str | None = None, **_) -> dict:
    return dict(num_classes=len(categories(data_dir)), in_chans=3, img_size=224)


def preprocessing(data_dir: str | None = None, **_) -> dict:
    return dict(layout="image", mode="RGB", size=None, size_multiple=1, scale=1 / 255, mean=[0.0] * 3,
                std=[1.0] * 3, labels=[c["name"] for c in categories(data_dir)])
