"""MNIST and Fashion-MNIST: four idx files, checked, parsed by torchvision and served as one tensor.

Where the files come from, in this order:

1. `--data-dir DIR`: the four files, gzipped or not, in DIR itself or in torchvision's DIR/<Class>/raw/;
2. the Debian package's folder (`apt-get install dataset-fashion-mnist`: /usr/share/datasets/fashion-mnist;
   Debian has no MNIST package);
3. `--download`: torchvision's own download into the data dir (see `fetch`).

torchvision's readers parse uncompressed files in ROOT/<Class>/raw/, so gzipped files are decompressed
once into the cache folder (common.cache: PAPER_STUDY_CACHE, default ~/.cache/paper-study) and other files are linked
there. Before anything trains, each file's uncompressed content is checked against the size and
sha256 recorded below: a truncated, corrupt or wrong file is one line naming it (a ConfigError).
Checking all four takes about 0.08 s here, so it is done on every call rather than remembered.
The images are normalised once, as a whole, into a TensorDataset (no PIL image per sample).
"""

import gzip
import hashlib
import os
import struct
import tempfile
import zlib
from pathlib import Path

from torch.utils.data import Dataset

from common.cache import CACHE_VARIABLE, cache_dir
from common.data import vision
from common.errors import ConfigError

FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")

# Each file's uncompressed size and sha256, measured on the files of Debian's dataset-fashion-mnist (whose
# contents are byte for byte Zalando's: only the .gz headers differ, so torchvision's md5 of the .gz files
# fails on them). MNIST's sizes are the well-known ones; no checksum of its uncompressed files is recorded
# here (None), so MNIST is checked by size and idx header only.
RECORDED = {
    "fashion-mnist": {
        "train-images-idx3-ubyte": (47_040_016, "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888"),
        "train-labels-idx1-ubyte": (60_008, "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9"),
        "t10k-images-idx3-ubyte": (7_840_016, "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b"),
        "t10k-labels-idx1-ubyte": (10_008, "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34"),
    },
    "mnist": {
        "train-images-idx3-ubyte": (47_040_016, None),
        "train-labels-idx1-ubyte": (60_008, None),
        "t10k-images-idx3-ubyte": (7_840_016, None),
        "t10k-labels-idx1-ubyte": (10_008, None),
    },
}
DEBIAN = {"fashion-mnist": ("/usr/share/datasets/fashion-mnist", "dataset-fashion-mnist")}  # folder, package


def _datasets():
    from torchvision import datasets  # imported when the data is read (a second or two)

    return datasets


# ---------------------------------------------------------------- where the files are


def _in(folder: Path, reader: str) -> dict[str, Path]:
    """Each file found in `folder` or folder/<reader>/raw/, uncompressed before gzipped."""
    found = {}
    for name in FILES:
        candidates = [folder / name, folder / reader / "raw" / name, folder / f"{name}.gz",
                      folder / reader / "raw" / f"{name}.gz"]
        found.update({name: path for path in reversed(candidates) if path.is_file()})
    return found


def locate(dataset: str, reader: str, data_dir: str | None) -> dict[str, Path]:
    """The four files, from the first of --data-dir and Debian's folder that holds any of them."""
    system, package = DEBIAN.get(dataset, (None, None))
    folders = [Path(f) for f in (data_dir, system) if f]
    for folder in folders:
        found = _in(folder, reader)
        if len(found) == len(FILES):
            return found
        if found:
            missing = ", ".join(name for name in FILES if name not in found)
            raise ConfigError(f"--dataset {dataset}: {folder} lacks {missing} (gzipped or not, in it or in its "
                              f"{reader}/raw/)")
    where = f"are not in {' or '.join(map(str, folders))}" if folders else "are in no folder given (--data-dir DIR)"
    install = f"install them with apt-get update && apt-get install -y {package} (as root, on Debian or Ubuntu), " \
              f"or " if package else ""
    raise ConfigError(f"--dataset {dataset}: the four idx files ({', '.join(FILES)}, gzipped or not) {where}; "
                      f"{install}add --download to fetch them with torchvision into --data-dir (default data/)")


# ---------------------------------------------------------------- checked, uncompressed, where torchvision reads


def check(dataset: str, path: Path, shown: Path) -> None:
    """A ConfigError naming `shown` unless `path` (its uncompressed content) has the recorded size, an idx
    header of that many 28x28 images or labels, and the recorded sha256."""
    size, sha256 = RECORDED[dataset][shown.name.removesuffix(".gz")]
    images = "images" in shown.name
    count = (size - 16) // 784 if images else size - 8
    what = f"--dataset {dataset}: {shown}{' (uncompressed)' if shown.suffix == '.gz' else ''}"
    if path.stat().st_size != size:
        raise ConfigError(f"{what}: size {path.stat().st_size:,} bytes, expected {size:,}; the file is cut short "
                          f"or not the data set's")
    with open(path, "rb") as f:
        header = struct.unpack(">IIII" if images else ">II", f.read(16 if images else 8))
        expected = (0x803, count, 28, 28) if images else (0x801, count)
        if header != expected:
            raise ConfigError(f"{what}: idx header {header}, expected {expected} (magic, count, rows, columns)")
        if sha256 is not None:
            f.seek(0)
            digest = hashlib.file_digest(f, "sha256").hexdigest()
            if digest != sha256:
                raise ConfigError(f"{what}: sha256 {digest}, expected {sha256}; the file is corrupt or not the "
                                  f"data set's")


def _decompress(source: Path, target: Path) -> None:
    """source (.gz) into target, through a temporary file renamed into place, with source's mtime."""
    with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.", delete=False) as out:
        try:
            with gzip.open(source) as f:
                while chunk := f.read(1 << 22):
                    out.write(chunk)
        except (OSError, EOFError, zlib.error) as e:
            out.close()
            os.unlink(out.name)
            raise ConfigError(f"{source}: not a whole gzip file ({type(e).__name__}: {e})") from None
    os.utime(out.name, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns))
    os.replace(out.name, target)


def _link(source: Path, target: Path) -> None:
    if target.is_symlink() and target.readlink() == source:
        return
    temporary = target.with_name(f".{target.name}.link")
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(source)
    os.replace(temporary, target)


def prepare(dataset: str, reader: str, data_dir: str | None) -> Path:
    """A folder ROOT whose ROOT/<reader>/raw/ holds the four checked, uncompressed files: the files' own
    folder where they are so already, else a cache folder of the source folder's own (gzipped files
    decompressed once, as long as the source's mtime is the copy's; others linked), made under a file
    lock since every rank of a launch calls this."""
    from filelock import FileLock

    files = locate(dataset, reader, data_dir)
    folders = {path.parent for path in files.values()}
    if len(folders) == 1 and folders.pop().parts[-2:] == (reader, "raw") and all(
            path.suffix != ".gz" for path in files.values()):  # where torchvision reads them already
        for path in files.values():
            check(dataset, path, path)
        return files[FILES[0]].parents[2]
    source = files[FILES[0]].resolve().parent
    root = cache_dir() / dataset / hashlib.sha256(str(source).encode()).hexdigest()[:16]
    try:
        (root / reader / "raw").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--dataset {dataset}: cannot make the cache folder {root} for the uncompressed files "
                          f"({e.strerror}); set {CACHE_VARIABLE} to a folder you can write") from None
    with FileLock(root / ".lock"):
        for name, path in files.items():
            target = root / reader / "raw" / name
            if path.suffix == ".gz":
                if not target.is_file() or target.is_symlink() or \
                        target.stat().st_mtime_ns != path.stat().st_mtime_ns:
                    _decompress(path, target)
            else:
                _link(path.resolve(), target)
            check(dataset, target, path)
    return root


# ---------------------------------------------------------------- the data set


def tensors(data, stats, image_size: int | None) -> Dataset:
    """A torchvision reader's uint8 images (N, 28, 28), resized once where asked (bilinear, antialiased, on
    the 8-bit pixels as Pillow resizes an image for common.predict), scaled to [0, 1] and normalised,
    with its targets: a TensorDataset of (1, N, N) float images and int64 labels."""
    import torch
    from torchvision.transforms.v2 import functional as F

    x = data.data.unsqueeze(1)  # (N, 1, 28, 28) uint8
    if image_size and image_size != x.shape[-1]:
        x = F.resize(x, [image_size, image_size], interpolation=F.InterpolationMode.BILINEAR, antialias=True)
    mean, std = (torch.tensor(s).view(1, -1, 1, 1) for s in stats)
    return torch.utils.data.TensorDataset(x.float().div_(255).sub_(mean).div_(std), data.targets)  # in place


def _mnist_like(name: str, reader_name: str, stats):
    """facts, load, preprocess and fetch of torchvision's `reader_name` reader (MNIST's format)."""
    reader = lambda *args, **kwargs: getattr(_datasets(), reader_name)(*args, **kwargs)

    def facts(data_dir=None, image_size=None, **_) -> dict:
        prepare(name, reader_name, data_dir)  # ConfigError when missing or not the recorded files
        return dict(num_classes=10, in_chans=1, img_size=image_size or 28)

    def load(data_dir=None, image_size=None, **_) -> tuple[Dataset, Dataset]:
        root = prepare(name, reader_name, data_dir)
        return tuple(tensors(reader(root, train=train), stats, image_size) for train in (True, False))

    def preprocess(data_dir=None, image_size=None, **_) -> dict:
        facts(data_dir, image_size)
        return vision._preprocessing(stats, "L", image_size or 28, list(getattr(_datasets(), reader_name).classes))

    def fetch(data_dir: str) -> str | None:
        """Nothing where the files are already found (--data-dir, Debian's folder); else torchvision's
        download of the four files into data_dir/<reader_name>/raw/ (md5-checked, uncompressed)."""
        try:
            found = locate(name, reader_name, data_dir)
        except ConfigError:
            reader(data_dir, train=True, download=True)
            return None
        return f"--download: {name} is in {found[FILES[0]].parent}/ already; nothing fetched"

    return facts, load, preprocess, fetch


mnist_facts, mnist_load, mnist_preprocess, mnist_fetch = _mnist_like("mnist", "MNIST", vision.MNIST_STATS)
fashion_facts, fashion_load, fashion_preprocess, fashion_fetch = _mnist_like(
    "fashion-mnist", "FashionMNIST", vision.FASHION_STATS)


def rows(load, facts, preprocess):
    """The same data set read row by row, as a recurrent network reads it: each 28x28 image a sequence of
    28 steps of 28 pixels (B, 28, 28), normalised as the images are; no augmentation."""

    def rows_facts(data_dir=None, **_) -> dict:
        facts(data_dir)
        return dict(num_classes=10, input_size=28, seq_len=28)

    def rows_load(data_dir=None, **_) -> tuple[Dataset, Dataset]:
        from torch.utils.data import TensorDataset

        return tuple(TensorDataset(d.tensors[0].squeeze(1), d.tensors[1]) for d in load(data_dir))

    def rows_preprocess(data_dir=None, **_) -> dict:
        return preprocess(data_dir) | dict(layout="rows")

    return rows_facts, rows_load, rows_preprocess


fashion_rows_facts, fashion_rows_load, fashion_rows_preprocess = rows(fashion_load, fashion_facts, fashion_preprocess)
