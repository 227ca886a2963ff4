"""WebDataset shards (common.data.wds, common.data.write_shards): written from an image folder with its
split and pixels, streamed to ranks and loader workers in disjoint shares of fixed length, resumed
exactly mid-epoch, read without unpickling anything, and refused in one line when broken."""

import io
import pickle
import shutil
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image

from common.data import get_dataset, train_loader, wds, write_shards
from tests.conftest import bitwise_equal, interrupted_copy, load_json, refused, weights
from train import main as train

GLOBAL, MICRO = 8, 4  # a global batch of 8: two ranks of 4, or one rank of two micro-batches


def write_folder(root, classes=("cat", "dog", "owl"), per_class=20):
    """Small images of random pixels (so every image tells which sample it is) in class subfolders."""
    rng = np.random.default_rng(0)
    for name in classes:
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)).save(root / name / f"{i}.png")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """(image folder, shards folder): 60 images, split 48 train (12 shards of 4) / 12 test (3 shards)."""
    root = tmp_path_factory.mktemp("wds")
    write_folder(root / "folder")
    assert write_shards.main(["--from", "imagefolder", str(root / "folder"), "--out", str(root / "shards"),
                              "--shard-size", "4"]) == 0
    return root / "folder", root / "shards"


def pattern(folder) -> str:
    return str(folder / "train-{000000..000011}.tar")


def key_of(train_set) -> dict:
    """Each sample's pixels -> its index in the (map-style) training set."""
    return {train_set[i][0].numpy().tobytes(): i for i in range(len(train_set))}


def epoch(loader, keys, epoch: int = 0, start: int = 0) -> list[list[int]]:
    """The epoch's batches from `start` as lists of sample indices."""
    loader.epoch_sampler.set_epoch(epoch, start=start)
    batches = [[keys[x.numpy().tobytes()] for x in inputs] for inputs, _ in loader]
    assert len(batches) == len(loader)
    return batches


def test_shards_hold_the_image_folders_split_labels_and_pixels(shards):
    folder, out = shards
    meta = load_json(out / "meta.json")
    assert meta["classes"] == ["cat", "dog", "owl"] and meta["train"]["shards"] == 12 and meta["test"]["shards"] == 3
    ours = get_dataset("wds").read(data_dir=pattern(out), image_size=6)
    theirs = get_dataset("imagefolder").read(data_dir=str(folder), image_size=6)
    for a, b in zip(ours, theirs):
        assert len(a) == len(b)
        as_set = lambda d: sorted((d[i][0].numpy().tobytes(), int(d[i][1])) for i in range(len(d)))
        assert as_set(a) == as_set(b)  # the same samples, pixels and labels (in another order)
    # an epoch of the training stream is the training set, once
    loader = train_loader(ours[0], GLOBAL, GLOBAL, 0, 1, seed=0)
    assert sorted(sum(epoch(loader, key_of(ours[0])), [])) == list(range(48))
    assert get_dataset("wds").preprocess(data_dir=pattern(out), image_size=6) == \
        get_dataset("imagefolder").preprocess(data_dir=str(folder), image_size=6)


@pytest.mark.parametrize("workers", [0, 2])
def test_ranks_and_workers_read_disjoint_shares_and_a_resumed_epoch_goes_on_exactly(shards, workers):
    train_set, _ = get_dataset("wds").read(data_dir=pattern(shards[1]), image_size=6)
    keys = key_of(train_set)
    loaders = [train_loader(train_set, GLOBAL, MICRO, rank, 2, seed=3, num_workers=workers) for rank in (0, 1)]
    ranks = [epoch(loader, keys, epoch=1) for loader in loaders]
    seen = [sum(batches, []) for batches in ranks]
    assert len(ranks[0]) == len(ranks[1]) == 6 and not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == list(range(48))  # 12 shards of 4: each sample once
    assert epoch(loaders[0], keys, epoch=2) != ranks[0]  # a new order each epoch
    for k in (1, 3, 5):  # stopped after k global batches, the epoch goes on where it was
        assert epoch(loaders[0], keys, epoch=1, start=k * GLOBAL) == ranks[0][k:]


def test_unequal_shards_still_give_every_rank_the_same_number_of_batches(shards, tmp_path):
    assert write_shards.main(["--from", "imagefolder", str(shards[0]), "--out", str(tmp_path / "s"),
                              "--shard-size", "7"]) == 0  # 48 = 6 x 7 + 6: seven shards, one short
    train_set, _ = get_dataset("wds").read(data_dir=str(tmp_path / "s/train-{000000..000006}.tar"), image_size=6)
    keys = key_of(train_set)
    ranks = [epoch(train_loader(train_set, GLOBAL, MICRO, rank, 2, seed=0), keys) for rank in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == 6  # 4 shards and 3 shards: the second reads one of its own twice


class Payload:
    """Unpickled, it creates a file: what a crafted .pyd entry could do."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (str(self.path), "w")


def with_payload(source, dest, payload: bytes):
    """A copy of a shard with a .pyd and a .pth entry added to every sample."""
    with tarfile.open(source) as tar_in, tarfile.open(dest, "w") as tar_out:
        for member in tar_in:
            tar_out.addfile(member, tar_in.extractfile(member))
            if member.name.endswith(".cls"):
                for ext in ("pyd", "pth"):
                    info = tarfile.TarInfo(member.name.replace(".cls", f".{ext}"))
                    info.size = len(payload)
                    tar_out.addfile(info, io.BytesIO(payload))


def test_a_shard_with_a_pickle_trains_without_unpickling_it_and_resumes_bitwise(shards, tmp_path):
    """webdataset's default decoders would unpickle the .pyd entry and create the file; training reads
    only the image and the label. The run checkpoints mid-epoch (6 steps an epoch) and resumes to the
    uninterrupted run's weights."""
    planted = tmp_path / "planted"
    payload = pickle.dumps(Payload(planted))
    pickle.loads(payload).close()  # the payload works: loading it creates the file
    assert planted.exists()
    planted.unlink()
    hostile = tmp_path / "hostile"
    hostile.mkdir()
    for shard in shards[1].glob("*.tar"):
        with_payload(shard, hostile / shard.name, payload)
    flags = ["--paper", "lenet", "--dataset", "wds", "--data-dir", pattern(hostile), "--image-size", "32",
             "--epochs", "2", "--batch-size", "8", "--ckpt-every", "4", "--keep-ckpts", "5", "--wandb", "disabled",
             "--results-dir", str(tmp_path / "results")]
    assert train(flags + ["--out", str(tmp_path / "run")]) == 0
    assert load_json(tmp_path / "run" / "result.json")["steps"] == 12
    resumed = interrupted_copy(tmp_path / "run", 4, tmp_path / "resumed")
    assert train(["--resume", str(resumed)]) == 0
    assert bitwise_equal(weights(resumed), weights(tmp_path / "run"))
    assert not planted.exists()


def test_each_broken_shard_set_is_one_line_exit_2_and_nothing_written(shards, tmp_path, capsys):
    def broken(name: str, shard: str, content: bytes | None) -> str:
        """A copy of the shards with one shard rewritten (None: removed)."""
        folder = tmp_path / name
        shutil.copytree(shards[1], folder)
        (folder / shard).unlink() if content is None else (folder / shard).write_bytes(content)
        return pattern(folder)

    labelled = tmp_path / "label"
    shutil.copytree(shards[1], labelled)
    with tarfile.open(shards[1] / "train-000003.tar") as tar_in, tarfile.open(labelled / "train-000003.tar", "w") as out:
        for member in tar_in:
            data = b"dog" if member.name.endswith(".cls") else tar_in.extractfile(member).read()
            member.size = len(data)
            out.addfile(member, io.BytesIO(data))
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    for shard in shards[1].glob("train-*.tar"):
        shutil.copy(shard, renamed / shard.name.replace("train", "part"))
    good = pattern(shards[1])
    cases = [
        ([], "--dataset wds reads from --data-dir PATTERN"),
        (["--data-dir", str(tmp_path / "none-{0..3}.tar")], "matches no file"),
        (["--data-dir", broken("missing", "train-000005.tar", None)], "train-000005.tar is missing (1 of the 12"),
        (["--data-dir", broken("corrupt", "train-000002.tar", b"not a tar file" * 40)],
         "train-000002.tar is not a readable tar file"),
        (["--data-dir", broken("cut", "train-000002.tar", (shards[1] / "train-000002.tar").read_bytes()[:1200])],
         "train-000002.tar is not a readable tar file"),
        (["--data-dir", pattern(labelled)], "holds 'dog', not a class index"),
        (["--data-dir", str(renamed / "part-{000000..000011}.tar")], "does not name train shards"),
        (["--data-dir", good, "--train-fraction", "0.5"], "--train-fraction takes a fixed share"),
        (["--data-dir", good, "--num-workers", "13"], "12 shards cannot be dealt to 1 rank(s) x 13 loader worker(s)"),
    ]
    for flags, words in cases:
        line = refused(capsys, ["--paper", "lenet", "--dataset", "wds", *flags, "--image-size", "32",
                                "--batch-size", "8", "--wandb", "disabled", "--out", str(tmp_path / "run")])
        assert line.startswith("train.py: error: ") and words in line, (line, words)
        assert not (tmp_path / "run").exists()
    notest = tmp_path / "notest"
    shutil.copytree(shards[1], notest, ignore=shutil.ignore_patterns("test-*"))
    line = refused(capsys, ["--paper", "lenet", "--dataset", "wds", "--data-dir", pattern(notest), "--image-size", "32",
                            "--wandb", "disabled", "--out", str(tmp_path / "run")])
    assert "no test shards" in line and not (tmp_path / "run").exists()


def test_write_shards_refuses_in_one_line_and_keeps_shards_unless_forced(shards, tmp_path, capsys):
    folder, out = shards
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert write_shards.main(["--from", "imagefolder", str(folder), "--out", str(out)]) == 2
    assert "already holds shards; --force replaces them" in capsys.readouterr().err
    assert write_shards.main(["--from", "imagefolder", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")]) == 2
    assert "not a folder" in capsys.readouterr().err and not (tmp_path / "o").exists()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    assert write_shards.main(["--from", "imagefolder", str(folder), "--out", str(copy), "--shard-size", "24",
                              "--force"]) == 0
    assert sorted(p.name for p in copy.glob("*.tar")) == ["test-000000.tar", "train-000000.tar", "train-000001.tar"]
