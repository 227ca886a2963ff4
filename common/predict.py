"""Classify image files with an exported model: onnxruntime, numpy and Pillow only, no torch.

    python -m common.predict --onnx model.onnx IMAGE [IMAGE ...] [--threads N]

Detection models draw their boxes, with labels and scores, on the images (PNG files
in --out), from an exported model (no torch either: the images, each at its own
size, share one padded batch with a mask) or from a finished run's weights (this
path needs torch):

    python -m common.predict --onnx model.onnx IMAGE [IMAGE ...] --out DIR [--threshold 0.5]
    python -m common.predict --run RUN_DIR IMAGE [IMAGE ...] --out DIR [--threshold 0.5]

Segmentation models paint each pixel's class over the image (class 0, the background, left as it
is), from an exported model or a finished run's weights alike, and say which classes cover how much:

    python -m common.predict --onnx model.onnx IMAGE [IMAGE ...] --out DIR
    python -m common.predict --run RUN_DIR IMAGE [IMAGE ...] --out DIR

or from Python:

    from common.predict import predict
    predict("model.onnx", ["digit.png"])  # [("7", 0.98)]

Each image is preprocessed as the model's training data was, from the metadata
that common.export stores in the file: converted to its colour mode, resized
(bilinear) to its size, or for models trained on images of varying size to the
nearest multiple of its patch size, scaled and normalised. Models that read an
image row by row (an LSTM on digits-rows) get its rows as steps.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

# Nothing above imports numpy, onnxruntime or Pillow: --help and a mistyped flag are answered at once.
if TYPE_CHECKING:
    import numpy as np
    from PIL import Image

META_KEY = "paper_study"


class PredictError(ValueError):
    """The model or an image cannot be used; the message says why."""


class Predictor:
    """An onnxruntime session and the preprocessing read from its model's metadata."""

    def __init__(self, onnx_path: str | Path, threads: int | None = None):
        if not Path(onnx_path).is_file():
            raise PredictError(f"{onnx_path}: no such file")
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        self.session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        meta = self.session.get_modelmeta().custom_metadata_map.get(META_KEY)
        if meta is None:
            raise PredictError(f"{onnx_path} has no '{META_KEY}' metadata: export it with python -m common.export")
        self.meta = json.loads(meta)
        self.pre = self.meta["preprocess"]
        if self.pre is None or self.meta["task"] not in ("classification", "detection", "segmentation"):
            raise PredictError(f"{onnx_path} is a {self.meta['task']} model of {self.meta['dataset']}, which holds "
                               "no images to classify")
        self.detects, self.segments = self.meta["task"] == "detection", self.meta["task"] == "segmentation"

    def preprocess(self, image: Image.Image) -> np.ndarray:
        """One image as the model's input sample, (C, H, W) float32."""
        return prepare(image, self.pre, self.meta["size_multiple"])

    def probabilities(self, batch: np.ndarray) -> np.ndarray:
        """Class probabilities (B, classes) of a batch (B, C, H, W) of preprocessed images."""
        import numpy as np

        if self.pre["layout"] == "rows":  # each row of pixels is one step
            B, C, H, W = batch.shape
            x = batch.transpose(0, 2, 3, 1).reshape(B, H, W * C)
            feed = {"x": x, "lengths": np.full(B, H, dtype=np.int64)}
            feed = {k: v for k, v in feed.items() if k in self.meta["inputs"]}  # models of one length take no lengths
        else:
            feed = {"images": batch}
        logits = self.session.run(None, feed)[0]
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def __call__(self, images: list) -> list[tuple[str, float]]:
        """(label, probability) for each image (a path or a PIL image); images of one size share a batch."""
        if self.detects or self.segments:
            what, use, how = (("detection", "boxes", "detect") if self.detects else
                              ("segmentation", "a class per pixel", "segment"))
            raise PredictError(f"a {what} model of {self.meta['dataset']} gives {use}, not one label per image: "
                               f"use Predictor.{how}, or python -m common.predict --onnx FILE IMAGES --out DIR")
        import numpy as np

        samples = [self.preprocess(_open(image)) for image in images]
        results = [None] * len(samples)
        for shape in {s.shape for s in samples}:
            indices = [i for i, s in enumerate(samples) if s.shape == shape]
            for i, p in zip(indices, self.probabilities(np.stack([samples[i] for i in indices]))):
                results[i] = (self.pre["labels"][int(p.argmax())], float(p.max()))
        return results

    def detect(self, images: list, threshold: float = 0.5) -> list[list[tuple[str, float, list[float]]]]:
        """A detection model's (label, score, box x1 y1 x2 y2 in the image's pixels) with a score of at
        least `threshold`, best first, for each image (a path or a PIL image). Every image keeps its
        own size (resized only where the data set has one size); they share one batch, zero-padded at
        the bottom and right to multiples of size_multiple, with the mask of their valid pixels."""
        import numpy as np

        opened = [_open(image) for image in images]
        samples = [prepare(image, self.pre) for image in opened]  # (C, h_i, w_i)
        multiple = self.meta["size_multiple"]
        H, W = (multiple * -(-max(s.shape[k] for s in samples) // multiple) for k in (1, 2))  # rounded up
        batch = np.zeros((len(samples), samples[0].shape[0], H, W), dtype=np.float32)
        mask = np.zeros((len(samples), H, W), dtype=bool)
        for i, s in enumerate(samples):
            batch[i, :, :s.shape[1], :s.shape[2]], mask[i, :s.shape[1], :s.shape[2]] = s, True
        boxes, scores, labels = self.session.run(None, {"images": batch, "mask": mask})  # (B, N, 4), (B, N), (B, N)
        results = []
        for image, s, b, p, c in zip(opened, samples, boxes, scores, labels):
            b = b * np.array([image.width / s.shape[2], image.height / s.shape[1]] * 2)  # back to the file's pixels
            results.append([(self.pre["labels"][int(c[k])], float(p[k]), [round(float(v), 1) for v in b[k]])
                            for k in np.argsort(-p, kind="stable") if p[k] >= threshold])
        return results


    def segment(self, images: list) -> list[np.ndarray]:
        """A segmentation model's class of every pixel (H, W) of each image (a path or a PIL image), at the
        file's own size: each image alone, preprocessed as its training data was (where that resizes it, the
        classes are resized back, nearest)."""
        return [label_map(self.session.run(None, {"images": self.preprocess(image)[None]})[0][0], image.size)
                for image in map(_open, images)]


def label_map(scores: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The class of each pixel (H, W) from class scores (K, h, w), at an image's (width, height)."""
    import numpy as np
    from PIL import Image

    labels = scores.argmax(axis=0).astype(np.uint8)  # (h, w)
    if labels.shape[::-1] != tuple(size):
        labels = np.asarray(Image.fromarray(labels).resize(size, Image.NEAREST))
    return labels


def palette(n: int) -> np.ndarray:
    """PASCAL VOC's colour of each class 0..n-1 (n, 3) uint8: the bits of the index spread over R, G, B."""
    import numpy as np

    colours = np.zeros((n, 3), dtype=np.uint8)
    for k in range(n):
        c = k
        for shift in range(7, -1, -1):
            colours[k] |= np.array([(c >> 0) & 1, (c >> 1) & 1, (c >> 2) & 1], dtype=np.uint8) << shift
            c >>= 3
    return colours


def draw_mask(image: Image.Image, labels: np.ndarray, names: list[str]) -> Image.Image:
    """An image (RGB) with each pixel's class painted over it at half strength (class 0 left as it is), a
    key of the classes shown below, enlarged (nearest pixel) so that a small image can be read."""
    import numpy as np
    from PIL import Image, ImageDraw

    zoom = max(1, 400 // max(image.size))
    rgb = np.asarray(image.convert("RGB"), dtype=np.float32)  # (H, W, 3)
    colours = palette(len(names)).astype(np.float32)[labels]  # (H, W, 3)
    painted = np.where((labels > 0)[..., None], (rgb + colours) / 2, rgb).round().astype(np.uint8)
    shown = [k for k in np.unique(labels).tolist() if k > 0]
    picture = Image.new("RGB", (image.width * zoom, image.height * zoom + 14 * len(shown)))
    picture.paste(Image.fromarray(painted).resize((image.width * zoom, image.height * zoom), Image.NEAREST))
    pen = ImageDraw.Draw(picture)
    for row, k in enumerate(shown):
        y = image.height * zoom + 14 * row
        pen.rectangle((2, y + 2, 12, y + 12), fill=tuple(int(v) for v in palette(len(names))[k]))
        pen.text((16, y + 1), names[k], fill="white")
    return picture


def coverage(labels: np.ndarray, names: list[str]) -> str:
    """The classes of a label map but class 0, by their share of its pixels, largest first."""
    import numpy as np

    counts = np.bincount(labels.ravel(), minlength=len(names))
    shares = [(counts[k] / labels.size, names[k]) for k in np.argsort(-counts, kind="stable") if k > 0 and counts[k]]
    return ", ".join(f"{name} {share:.1%}" for share, name in shares) or f"{names[0]} only"


def draw_boxes(image: Image.Image, found: list[tuple[str, float, list[float]]], colour: str = "lime"
               ) -> Image.Image:
    """An image (RGB) with detections (label, score, box) drawn on, enlarged (nearest pixel) so that
    a small image's labels can be read."""
    from PIL import Image, ImageDraw

    zoom = max(1, 400 // max(image.size))
    picture = image.convert("RGB").resize((image.width * zoom, image.height * zoom), Image.NEAREST)
    pen = ImageDraw.Draw(picture)
    for label, score, box in found:
        x1, y1, x2, y2 = (v * zoom for v in box)
        pen.rectangle((x1, y1, x2, y2), outline=colour, width=1)
        pen.text((x1 + 2, y1 + 1), f"{label} {score:.2f}", fill=colour)
    return picture


def prepare(image: Image.Image, pre: dict, size_multiple: int = 1) -> np.ndarray:
    """An image as a data set's sample, (C, H, W) float32: converted to the colour mode, resized
    (bilinear) to the size, or to the nearest multiples of size_multiple where the size is None,
    scaled and normalised as `pre` (a data set's preprocessing, see common.data) says."""
    import numpy as np
    from PIL import Image

    image = image.convert(pre["mode"])
    if pre["size"]:
        size = (pre["size"][1], pre["size"][0])  # Pillow's (width, height)
    else:
        size = tuple(max(size_multiple, size_multiple * round(side / size_multiple)) for side in image.size)
    if image.size != size:
        image = image.resize(size, Image.BILINEAR)
    x = np.asarray(image, dtype=np.float32) * np.float32(pre["scale"])
    x = x[None] if x.ndim == 2 else x.transpose(2, 0, 1)  # (C, H, W)
    mean, std = (np.array(pre[k], dtype=np.float32)[:, None, None] for k in ("mean", "std"))
    return (x - mean) / std


def _open(image) -> Image.Image:
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, Image.Image):
        return image
    try:
        return Image.open(image)
    except FileNotFoundError:
        raise PredictError(f"{image}: no such file") from None
    except UnidentifiedImageError:
        raise PredictError(f"{image}: not an image Pillow can read") from None


def predict(onnx_path: str | Path, images: list, threads: int | None = None) -> list[tuple[str, float]]:
    """(label, probability) for each image file."""
    return Predictor(onnx_path, threads)(images)


def detect_onnx(model: str | Path | Predictor, images: list, out_dir: str | Path, threshold: float = 0.5
                ) -> list[list[tuple]]:
    """An exported detection model's (label, score, box x1 y1 x2 y2) above the threshold for each image
    file, and each image with them drawn on, as OUT_DIR/<image name>.png; no torch.

    Args:
        model: the ONNX file, or a Predictor of it.
    """
    found = (model if isinstance(model, Predictor) else Predictor(model)).detect(images, threshold)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    for image, boxes in zip(images, found):
        draw_boxes(_open(image), boxes).save(Path(out_dir) / f"{Path(str(image)).stem}.png")
    return found


def detect(run_dir: str | Path, images: list, out_dir: str | Path, threshold: float = 0.5) -> list[list[tuple]]:
    """A detection run's (label, score, box x1 y1 x2 y2 in the file's pixels) above the threshold, best
    first, for each image file, and each image with them drawn on, as OUT_DIR/<image name>.png."""
    import torch

    model, pre = run_model(run_dir, "detection")
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    results = []
    for image in images:
        opened = _open(image)
        x = torch.from_numpy(prepare(opened, pre))  # (3, h, w), at its own size
        with torch.no_grad():
            found = model(x[None])[0]
        scale = torch.tensor([opened.width / x.shape[2], opened.height / x.shape[1]] * 2)  # to the file's pixels
        order = found["scores"].argsort(descending=True, stable=True)
        results.append([(pre["labels"][int(found["labels"][k])], float(found["scores"][k]),
                         [round(float(v), 1) for v in found["boxes"][k] * scale])
                        for k in order.tolist() if found["scores"][k] >= threshold])
        draw_boxes(opened, results[-1]).save(Path(out_dir) / f"{Path(str(image)).stem}.png")
    return results


def segment_onnx(model: str | Path | Predictor, images: list, out_dir: str | Path
                 ) -> tuple[list[str], list[np.ndarray]]:
    """An exported segmentation model's class names and class of every pixel (H, W) of each image file, and
    each image with them painted on, as OUT_DIR/<image name>.png; no torch."""
    predictor = model if isinstance(model, Predictor) else Predictor(model)
    found, names = predictor.segment(images), predictor.pre["labels"]
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    for image, labels in zip(images, found):
        draw_mask(_open(image), labels, names).save(Path(out_dir) / f"{Path(str(image)).stem}.png")
    return names, found


def segment(run_dir: str | Path, images: list, out_dir: str | Path) -> tuple[list[str], list[np.ndarray]]:
    """A segmentation run's class names and class of every pixel (H, W) of each image file (the model's
    "out"), and each image with them painted on, as OUT_DIR/<image name>.png."""
    import torch

    model, pre = run_model(run_dir, "segmentation")
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    results = []
    for image in images:
        opened = _open(image)
        with torch.no_grad():
            out = model(torch.from_numpy(prepare(opened, pre))[None])  # (1, K, h, w), or torchvision's dict
        scores = out["out"] if isinstance(out, dict) else out
        results.append(label_map(scores[0].numpy(), opened.size))
        draw_mask(opened, results[-1], pre["labels"]).save(Path(out_dir) / f"{Path(str(image)).stem}.png")
    return pre["labels"], results


def run_model(run_dir: str | Path, task: str):
    """A finished run's model in eval mode and its data set's preprocessing; PredictError where the run is
    not one of this task."""
    from common.data import dataset_for, options
    from common.errors import ConfigError
    from common.export import load_run

    try:
        model, cfg = load_run(Path(run_dir))
    except ConfigError as e:
        raise PredictError(str(e)) from None
    data = dataset_for(cfg)
    if data.task != task:
        raise PredictError(f"{run_dir} is a {data.task} run: --run draws detections and segmentations; classify "
                           "with python -m common.export --run RUN_DIR, then --onnx")
    return model, data.preprocess(**options(cfg))


def run_task(run_dir: str | Path) -> str:
    """The task of a finished run's data set (from its config.json)."""
    from common.config import TrainConfig
    from common.data import dataset_for

    config = Path(run_dir) / "config.json"
    if not config.is_file():
        raise PredictError(f"{run_dir} is not a run directory: it has no config.json")
    return dataset_for(TrainConfig.from_dict(json.loads(config.read_text()))).task


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m common.predict", description=__doc__.split("\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--onnx", help="a model.onnx written by python -m common.export")
    source.add_argument("--run", help="a finished detection or segmentation run's directory: draw its detections or "
                        "its classes of every pixel")
    p.add_argument("images", nargs="+", help="image files")
    p.add_argument("--threads", type=int, help="onnxruntime threads (default: its own choice)")
    p.add_argument("--out", default="predictions", help="detection and segmentation: the folder for the drawn "
                   "images")
    p.add_argument("--threshold", type=float, default=0.5, help="detection: the lowest score drawn")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        predictor = None if args.run else Predictor(args.onnx, args.threads)
        if (predictor.segments if predictor else run_task(args.run) == "segmentation"):
            names, found = (segment(args.run, args.images, args.out) if predictor is None else
                            segment_onnx(predictor, args.images, args.out))
            for path, labels in zip(args.images, found):
                print(f"{path}: {coverage(labels, names)}")
            print(f"drew them into {args.out}/")
            return 0
        if predictor is None or predictor.detects:
            found = (detect(args.run, args.images, args.out, args.threshold) if predictor is None else
                     detect_onnx(predictor, args.images, args.out, args.threshold))
            for path, boxes in zip(args.images, found):
                print(f"{path}: " + ("; ".join(f"{n} {s:.2f} at {b}" for n, s, b in boxes) or "nothing found"))
            print(f"drew them into {args.out}/")
            return 0
        results = predictor(args.images)
    except PredictError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path, (label, probability) in zip(args.images, results):
        print(f"{path}: {label} ({probability:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
