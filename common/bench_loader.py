"""Row i of common.bench: is the loader the bottleneck?

    python -m common.bench --rows i [--papers vit,resnet] [--repeats 5]

The shapes data set's first IMAGES training images are written three ways into a temporary folder:
an image folder of PNG files (`--dataset imagefolder`), WebDataset shards written from it
(`--dataset wds`), and a Hugging Face dataset saved with `save_to_disk` (`--dataset hf:DIR`). For each,
with 0, 1 and 2 loader workers, the trainer's own loader (`common.data.train_loader`: decoding, resizing
to SIZE x SIZE, normalising, batching) is timed alone, in samples/s after its first batch (the
workers' start); each image paper's tiny model is timed alone in training samples/s on batches of the
same shape. Loader / model above 1: the loader outpaces the model, which then limits the run;
below 1, the loader does (or would, were the two not sharing the CPU: on a CPU, loader workers and
the training step compete for the same cores, so the ratio is an upper bound of what a run gets).
"""

import statistics
import tempfile
import time
from pathlib import Path

from common.data import get_dataset, train_loader
from common.data.collate import stack

IMAGES, SIZE, BATCH = 5000, 32, 64  # images written (80% train), their side, the batch
WORKERS = (0, 1, 2)


def write_sets(root: Path, n: int) -> dict[str, tuple[str, str | None]]:
    """The first n shapes training images as an image folder, wds shards and a saved HF dataset:
    {label: (--dataset, --data-dir)}."""
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Image as HFImage, disable_progress_bars
    from PIL import Image

    from common.data import shapes, write_shards

    images, labels = shapes._split("train")
    pictures = [Image.fromarray(images[i].permute(1, 2, 0).numpy()) for i in range(n)]
    for i, (picture, label) in enumerate(zip(pictures, labels[:n].tolist())):
        folder = root / "folder" / shapes.CLASSES[label]
        folder.mkdir(parents=True, exist_ok=True)
        picture.save(folder / f"{i:05d}.png")
    meta = write_shards.write("imagefolder", str(root / "folder"), str(root / "shards"), shard_size=max(1, n // 16))
    features = Features({"image": HFImage(), "label": ClassLabel(names=list(shapes.CLASSES))})
    table = Dataset.from_dict({"image": pictures, "label": labels[:n].tolist()}, features=features)
    disable_progress_bars()
    DatasetDict(train=table).save_to_disk(str(root / "hf"))  # one split: cut 80/20 as imagefolder's
    return {"imagefolder": ("imagefolder", str(root / "folder")), "wds": ("wds", meta["train"]["data_dir"]),
            "hf": (f"hf:{root / 'hf'}", None)}


def loader_rate(dataset: str, data_dir: str | None, workers: int, batches: int) -> float:
    """Samples/s of the trainer's loader over `batches` batches after its first."""
    train_set, _ = get_dataset(dataset).read(data_dir=data_dir, image_size=SIZE)
    loader = train_loader(train_set, BATCH, BATCH, 0, 1, seed=0, num_workers=workers, collate=stack)
    loader.epoch_sampler.set_epoch(0)
    batches = min(batches, len(loader) - 1)
    it = iter(loader)
    next(it)
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    return batches * BATCH / (time.perf_counter() - start)


def rows(models: dict[str, float], repeats: int, steps: int, images: int = IMAGES) -> list[dict]:
    """Row i: one row per data set and number of workers, against each model's training samples/s
    (`models`: {paper: samples/s}, measured by common.bench)."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, (dataset, data_dir) in write_sets(Path(tmp), images).items():
            for workers in WORKERS:
                rate = statistics.median(loader_rate(dataset, data_dir, workers, steps) for _ in range(repeats))
                row = {"row": "i", "data set": label, "workers": workers, "loader samples/s": f"{rate:,.0f}"}
                for p, m in models.items():
                    row[f"{p} training samples/s"] = f"{m:,.0f}"
                    row[f"loader / {p}"] = f"{rate / m:.2f}"
                out.append(row)
    return out
