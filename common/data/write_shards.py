"""Write an image data set as WebDataset tar shards for `--dataset wds`:

    python -m common.data.write_shards --from imagefolder DIR --out DIR [--shard-size N] [--force]

The folder is split as `--dataset imagefolder` splits it (DIR/train/ and DIR/test/, or a fixed
stratified 80/20 split), and each split is written by webdataset's ShardWriter as OUT/train-000000.tar,
OUT/train-000001.tar, ... and OUT/test-000000.tar, ..., N samples a shard. A sample is two entries:
KEY.png (the image file's bytes, unchanged, under its own extension) and KEY.cls (its class index),
KEY its position in its split; OUT/meta.json names the classes and counts the samples and shards.
The training samples go into the shards in a random order (seed 0), so that every shard holds every
class. Shards are written under temporary names until all are complete; a mistake in the input is
one line and exit code 2, with nothing written.
"""

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common.data import vision
from common.errors import ConfigError

SHARD_SIZE = 1000  # --shard-size's default
SOURCES = ("imagefolder",)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m common.data.write_shards",
                                description="Write an image data set as WebDataset tar shards (--dataset wds).")
    p.add_argument("--from", dest="source", nargs=2, metavar=("KIND", "DIR"), required=True,
                   help=f"what to read: {', '.join(SOURCES)} and its folder (split as --dataset imagefolder splits it)")
    p.add_argument("--out", required=True, help="folder for train-NNNNNN.tar, test-NNNNNN.tar and meta.json")
    p.add_argument("--shard-size", type=int, default=SHARD_SIZE, help=f"samples per shard (default {SHARD_SIZE})")
    p.add_argument("--force", action="store_true", help="replace shards already in --out")
    return p


def pattern(out: Path, split: str, shards: int) -> str:
    """The --data-dir pattern of a split's shards."""
    return str(out / f"{split}-{{000000..{shards - 1:06d}}}.tar")


def write(source: str, folder: str, out: str, shard_size: int = SHARD_SIZE, force: bool = False) -> dict:
    """Write the shards; returns what meta.json holds."""
    from webdataset import ShardWriter

    if source not in SOURCES:
        raise ConfigError(f"--from {source}: write_shards reads {', '.join(SOURCES)}")
    if shard_size <= 0:
        raise ConfigError(f"--shard-size must be a positive integer, got {shard_size}")
    out_dir = Path(out)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir} is a file")
    if out_dir.is_dir() and any(out_dir.glob("*.tar")) and not force:
        raise ConfigError(f"--out {out_dir} already holds shards; --force replaces them")
    classes, train, test = vision.imagefolder_files(folder)  # ConfigError for an unreadable folder
    train = [train[i] for i in np.random.default_rng(0).permutation(len(train))]
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = dict(source=f"{source} {folder}", classes=classes, shard_size=shard_size)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".writing-") as tmp:
        for split, samples in (("train", train), ("test", test)):
            with ShardWriter(str(Path(tmp) / f"{split}-%06d.tar"), maxcount=shard_size, verbose=0) as sink:
                for key, (path, label) in enumerate(samples):
                    sink.write({"__key__": f"{key:08d}", Path(path).suffix.lower().lstrip("."): Path(path).read_bytes(),
                                "cls": str(label)})
            shards = -(-len(samples) // shard_size)
            meta[split] = dict(samples=len(samples), shards=shards, data_dir=pattern(out_dir, split, shards))
        for old in out_dir.glob("*.tar"):
            old.unlink()
        for new in sorted(Path(tmp).glob("*.tar")):
            shutil.move(new, out_dir / new.name)
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    try:
        args = build_parser().parse_args(argv)
        meta = write(*args.source, args.out, args.shard_size, args.force)
    except ConfigError as e:
        print(f"write_shards: error: {e}", file=sys.stderr)
        return 2
    for split in ("train", "test"):
        print(f"{split}: {meta[split]['samples']:,} samples in {meta[split]['shards']} shards")
    print(f"written in {time.perf_counter() - start:.0f} s; train with: python train.py --dataset wds --data-dir "
          f"'{meta['train']['data_dir']}' --image-size N ...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
