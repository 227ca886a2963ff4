"""Images in WebDataset tar shards (`--dataset wds --data-dir 'DIR/train-{000000..000099}.tar'`).

A shard is a tar file of samples, each a few entries sharing a key: `KEY.png` (or .jpg, .jpeg, .webp,
...: image bytes) and `KEY.cls` (the class index as text), as `python -m common.data.write_shards`
writes them. The test split is the shards beside them named alike, `test` for `train`
(test-*.tar).

Only the entries named here are ever read, and only through Pillow (images) and int() (labels):
nothing is unpickled or `torch.load`ed. webdataset's own decoders unpickle `.pyd` and `.pth`
entries, so a crafted shard would run code; here such entries are skipped unread.

At the start, every shard's tar headers (and its small `.cls` entries) are read once: the samples
per shard fix the epoch's length, and say at once when a shard is missing or not a tar file.

Training streams the shards (webdataset's tar iterator, reading each shard front to back), as
`ShardStream` describes: shards dealt to ranks and loader workers, a shuffle buffer, epochs of a
fixed number of samples, and an exact resume mid-epoch. The test split is read by sample, through
the headers' offsets, so every rank evaluates its own disjoint share as with any other data set.
"""

import io
import itertools
import json
import re
import tarfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from common.data import vision
from common.errors import ConfigError

IMAGE_EXTS = ("png", "jpg", "jpeg", "webp", "bmp", "ppm", "tif", "tiff", "gif")  # decoded by Pillow
LABEL_EXT = "cls"  # the class index, as decimal text
SHUFFLE_BUFFER = 1000  # samples held for shuffling, per loader worker (webdataset's usual size)
LAYOUT = ("tar shards of KEY.png (or .jpg, ...) and KEY.cls entries, named by a brace pattern such as "
          "'DIR/train-{000000..000009}.tar', with test shards named alike (python -m common.data.write_shards)")


def _split(name: str) -> tuple[str | None, str | None]:
    """An entry's (key, extension) as webdataset groups them: the extension is everything after the
    first dot of the base name."""
    m = re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", name)
    return (m.group(1), m.group(2).lower()) if m else (None, None)


def _ext(name: str) -> str | None:
    return _split(name)[1]


def _named(name: str) -> bool:
    """An entry this data set reads: an image or a label (never a .pyd, .pth, .json, ...)."""
    return _ext(name) in IMAGE_EXTS + (LABEL_EXT,)


def expand(pattern: str | None) -> list[Path]:
    """The shard files a brace pattern names, all of which must exist."""
    from braceexpand import braceexpand

    if not pattern:
        raise ConfigError(f"--dataset wds reads from --data-dir PATTERN: {LAYOUT}")
    paths = [Path(p) for p in braceexpand(pattern)]
    found = [p for p in paths if p.is_file()]
    if not found:
        raise ConfigError(f"--dataset wds: {pattern} matches no file; it needs {LAYOUT}")
    if len(found) < len(paths):
        missing = [str(p) for p in paths if not p.is_file()]
        raise ConfigError(f"--dataset wds: shard {missing[0]} is missing ({len(missing)} of the {len(paths)} "
                          f"shards {pattern} names)")
    return paths


def test_shards(pattern: str) -> list[Path]:
    """The test shards: the files beside the train shards named as their pattern with `test` for `train`
    and any {...} range as * (train-{000000..000099}.tar: test-*.tar), in order of name."""
    path = Path(pattern)
    if "train" not in path.name:
        raise ConfigError(f"--dataset wds: {pattern} does not name train shards (train-...); the test shards are "
                          f"found by putting test for train in the file name")
    name = re.sub(r"\{[^}]*\}", "*", path.name.replace("train", "test", 1))
    found = sorted(p for p in path.parent.glob(name) if p.is_file())
    if not found:
        raise ConfigError(f"--dataset wds: no test shards {path.parent / name} beside the train shards {pattern}")
    return found


@dataclass(frozen=True)
class Sample:
    """Where one sample's image is in its shard, and its label."""

    shard: int
    key: str
    offset: int  # of the image's bytes in the shard file
    size: int
    label: int


@lru_cache(maxsize=64)
def _scan(path: Path, mtime: float, size: int) -> tuple[tuple[str, int, int, int], ...]:
    """(key, image offset, image size, label) of each sample of a shard, from its headers."""
    images, labels = {}, {}
    try:
        with tarfile.open(path, "r:") as tar:  # reads each header, seeks over the data
            for member in tar:
                if not member.isreg() or not _named(member.name):
                    continue
                key, ext = _split(member.name)
                if ext == LABEL_EXT:
                    text = tar.extractfile(member).read(32).decode("ascii", "replace").strip()
                    if not text.isdigit():
                        raise ConfigError(f"--dataset wds: {path}: {member.name} holds '{text[:20]}', not a class "
                                          f"index")
                    labels[key] = int(text)
                elif key in images:
                    raise ConfigError(f"--dataset wds: {path}: sample {key} has more than one image")
                else:
                    images[key] = (member.offset_data, member.size)
    except (tarfile.TarError, OSError, EOFError) as e:
        raise ConfigError(f"--dataset wds: shard {path} is not a readable tar file ({e})") from None
    unlabelled = [k for k in images if k not in labels] + [k for k in labels if k not in images]
    if unlabelled:
        raise ConfigError(f"--dataset wds: {path}: sample {unlabelled[0]} lacks its "
                          f"{'.cls label' if unlabelled[0] in images else 'image'}")
    return tuple((key, *images[key], labels[key]) for key in images)


def scan(paths: list[Path]) -> list[Sample]:
    """Every sample of the shards, in order; a ConfigError naming a shard that cannot be read."""
    samples = []
    for i, path in enumerate(paths):
        stat = path.stat()
        samples += [Sample(i, *entry) for entry in _scan(path, stat.st_mtime, stat.st_size)]
    if not samples:
        raise ConfigError(f"--dataset wds: the shards {paths[0]}, ... hold no samples; they need {LAYOUT}")
    return samples


def classes(paths: list[Path], samples: list[Sample]) -> list[str]:
    """Class names from meta.json beside the shards (as write_shards writes it), else 0, 1, ..."""
    count = max(s.label for s in samples) + 1
    meta = paths[0].parent / "meta.json"
    if meta.is_file():
        names = json.loads(meta.read_text()).get("classes", [])
        if len(names) >= count:
            return [str(n) for n in names]
    return [str(k) for k in range(count)]


def decode(image: bytes, label: int | bytes, transform, where: str):
    """(image tensor, label) of one sample: the image through Pillow, in RGB, then the transform."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(image)) as im:
            x = transform(im.convert("RGB"))
    except OSError as e:
        raise ValueError(f"--dataset wds: {where} is not an image Pillow can read ({e})") from None
    return x, int(label)


class Shards(Dataset):
    """The samples of some shards, read one by one through their offsets (the test split, and any
    random access the trainer makes: a batch for measuring FLOPs)."""

    def __init__(self, paths: list[Path], transform):
        self.paths, self.transform = paths, transform
        self.samples = scan(paths)
        self.counts = np.bincount([s.shard for s in self.samples], minlength=len(paths))  # samples per shard
        self.classes = classes(paths, self.samples)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        s = self.samples[i]
        with open(self.paths[s.shard], "rb") as f:
            f.seek(s.offset)
            image = f.read(s.size)
        return decode(image, s.label, self.transform, f"{self.paths[s.shard]}: sample {s.key}")


def read_shard(path: Path):
    """A shard's samples front to back, as dicts of the named entries' bytes (webdataset's tar iterator:
    only image and label entries are read; the rest are skipped unread)."""
    from webdataset.tariterators import group_by_keys, tar_file_expander

    with open(path, "rb") as f:
        entries = tar_file_expander([dict(url=str(path), stream=f)], select_files=_named)
        for sample in group_by_keys(entries):
            image = [sample[ext] for ext in IMAGE_EXTS if ext in sample]
            if image and LABEL_EXT in sample:
                yield sample["__key__"], image[0], sample[LABEL_EXT]


def shuffled(items, size: int, rng: np.random.Generator):
    """A shuffle buffer, as webdataset's: hold `size` items, give out a random one as each new one comes in."""
    buffer = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        k = int(rng.integers(size))
        yield buffer[k]
        buffer[k] = item
    for k in rng.permutation(len(buffer)):
        yield buffer[k]


class ShardStream(IterableDataset):
    """One rank's training samples, streamed from its shards.

    Each epoch (seeded by seed + epoch, the same on every rank) the shards are put in a random order
    and dealt out: rank r takes every W-th from the r-th, and loader worker w of that rank every
    n-th of those (W ranks, n workers; --num-workers 0 is one worker). A worker reads its shards front
    to back through a shuffle buffer of SHUFFLE_BUFFER samples, and when they run out (the buffer
    emptied) reads them again in a fresh order, so that every rank gives exactly its share of the epoch:
    floor(samples / global batch) global batches, 1/W of each, whatever its shards hold. Ranks and
    workers read disjoint shards; with shards of unequal sizes some samples come twice in an epoch
    and others not (webdataset's resampling does the same).

    The DataLoader takes batches from its workers in turn, so batch k of the epoch is worker k mod n's.
    `set_epoch(epoch, start)` starts at batch k0 = start / (W x micro batch): worker w plays the part of
    worker (w + k0) mod n, reads (without decoding) the samples of that part's batches before k0 and
    gives the rest, so a resumed epoch goes on exactly as the uninterrupted one (with the same number
    of ranks and workers), at the cost of re-reading the shards up to that point.
    """

    def __init__(self, shards: Shards, global_batch: int, micro_batch: int, rank: int, world_size: int,
                 seed: int, num_workers: int = 0, augment=None):
        self.shards, self.augment = shards, augment
        self.micro_batch, self.global_batch = micro_batch, global_batch
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.workers = max(1, num_workers)
        if len(shards.paths) < world_size * self.workers:
            raise ConfigError(f"--dataset wds: {len(shards.paths)} shards cannot be dealt to {world_size} rank(s) x "
                              f"{self.workers} loader worker(s); write smaller shards (write_shards --shard-size)")
        self.batches = len(shards) // global_batch * (global_batch // world_size) // micro_batch  # per epoch
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Start epoch `epoch` after `start` samples (of all ranks) of it."""
        if start % self.global_batch:
            raise ValueError(f"position {start} is not a whole number of global batches of {self.global_batch}")
        self.epoch, self.start = epoch, start // self.world_size // self.micro_batch

    def __len__(self) -> int:
        return (self.batches - self.start) * self.micro_batch

    def part(self, role: int) -> list[int]:
        """The shards worker part `role` of this rank reads first this epoch."""
        order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.shards.paths))
        return order[self.rank::self.world_size][role::self.workers].tolist()

    def raw(self, role: int):
        """The endless stream of part `role`'s samples, (where, image bytes, label bytes): its shards
        read through the shuffle buffer, again and again (the buffer emptied at the end of each pass)."""
        rng = np.random.default_rng([self.seed, self.epoch, self.rank, role])
        shards = self.part(role)

        def read(order):
            for i in order:
                path = self.shards.paths[i]
                for key, image, label in read_shard(path):
                    yield f"{path}: sample {key}", image, label

        for p in itertools.count():
            yield from shuffled(read(shards if p == 0 else rng.permutation(shards).tolist()), SHUFFLE_BUFFER, rng)

    def __iter__(self):
        info = get_worker_info()
        role = ((info.id if info else 0) + self.start) % self.workers
        before = len(range(role, self.start, self.workers))  # this part's batches before the start
        mine = len(range(role, self.batches, self.workers)) - before
        b = self.micro_batch
        for where, image, label in itertools.islice(self.raw(role), before * b, (before + mine) * b):
            x, y = decode(image, label.decode("ascii", "replace").strip(), self.shards.transform, where)
            yield (self.augment(x) if self.augment is not None else x), y


def facts(data_dir=None, image_size=None, **_) -> dict:
    train = scan(expand(data_dir))
    if not image_size:
        raise ConfigError("--dataset wds needs --image-size N: every image is resized to N x N")
    return dict(num_classes=len(classes(expand(data_dir), train)), in_chans=3, img_size=image_size)


def load(data_dir=None, image_size=None, **_) -> tuple[Shards, Shards]:
    """(train, test) shards, resized to image_size and normalised as imagefolder's images."""
    facts(data_dir, image_size)
    transform = vision._transform(vision.IMAGENET_STATS, image_size)
    train, test = Shards(expand(data_dir), transform), Shards(test_shards(data_dir), transform)
    if max(s.label for s in test.samples) >= len(train.classes):
        raise ConfigError(f"--dataset wds: the test shards hold a class index the train shards do not "
                          f"({len(train.classes)} classes)")
    return train, test


def preprocess(data_dir=None, image_size=None, **_) -> dict:
    facts(data_dir, image_size)
    paths = expand(data_dir)
    return vision._preprocessing(vision.IMAGENET_STATS, "RGB", image_size, classes(paths, scan(paths)))
