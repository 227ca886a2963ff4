"""Built-in generated data (digits rows, the adding problem), and real data sets read from a local
folder in their real on-disk formats: CIFAR-10 python batches, MNIST idx files, an image folder."""

import gzip
import hashlib
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from common.data import adding, eval_loader, get_dataset, mnist
from common.data.collate import pad_sequences
from common.errors import ConfigError
from common.predict import prepare
from tests.conftest import load_json
from train import main


def test_digits_rows_are_the_digits_read_row_by_row():
    (images, labels), (rows, row_labels) = (get_dataset(n).load()[0].tensors for n in ("digits", "digits-rows"))
    assert rows.shape[1:] == (8, 8) and torch.equal(rows, images[:, 0]) and torch.equal(labels, row_labels)


def test_adding_problem_is_fixed_and_its_constant_baseline_is_0167():
    train, test = get_dataset("adding").load()
    assert (len(train), len(test)) == (adding.TRAIN_SIZE, adding.TEST_SIZE)
    x, y = train[5]
    again, _ = adding.load()
    assert torch.equal(again[5][0], x), "the same sequences every time"
    assert adding.MIN_LENGTH <= len(x) <= adding.MAX_LENGTH and x.shape[1] == 2
    assert x[:, 1].sum() == 2 and torch.isclose(y, (x[:, 0] * x[:, 1]).sum())
    lengths = {len(s) for s, _ in test}
    assert min(lengths) == adding.MIN_LENGTH and max(lengths) == adding.MAX_LENGTH
    targets = torch.stack([t for _, t in test])
    assert abs(((targets - 1.0) ** 2).mean().item() - adding.BASELINE_MSE) < 0.01


def check_1997(data: adding.AddingProblem1997, T: int) -> None:
    """Every sequence as the 1997 paper defines it."""
    assert len(data.marked) == len(data)
    for (x, y), L, (first, second) in zip(data, data.sizes, data.marked.tolist()):
        values, markers = x[:, 0], x[:, 1]
        assert x.shape == (L, 2) and T <= L <= T + T // 10
        assert values.abs().max() <= 1 and set(markers.unique().tolist()) <= {-1.0, 0.0, 1.0}
        assert (markers == 1).nonzero().flatten().tolist() == sorted([first, second])  # exactly two marked pairs
        assert first < 10, "X1 among the first ten pairs"
        assert second - (second > first) < T // 2 - 1, "X2 among the first T/2 - 1 pairs still unmarked"
        assert markers[-1] == -1 and markers[0] == (1 if 0 in (first, second) else -1)  # the first and final pair
        assert (markers == -1).sum() == (1 if 0 in (first, second) else 2)  # and no other
        X1, X2 = (0.0 if first == 0 else values[first]), values[second]  # "we set X1 to zero"
        assert first != 0 or values[0] == 0, "the input holds X1's zero too"
        assert torch.isclose(y, 0.5 + (X1 + X2) / 4) and y.dtype == x.dtype == torch.float32


def test_adding_problem_of_1997_is_the_papers():
    train, test = get_dataset("adding-1997").read()  # no --seq-len: T = 100
    assert (len(train), len(test)) == (adding.TRAIN_SIZE_1997, adding.TEST_SIZE_1997) == (10_000, 2_560)
    T = adding.DEFAULT_T
    check_1997(train, T)
    firsts, seconds = train.marked.T
    assert set(firsts.tolist()) == set(range(10))  # all of the first ten pairs, and X2's whole range:
    ranks = seconds - (seconds > firsts).long()
    assert set(ranks.tolist()) == set(range(T // 2 - 1)) and seconds.max() == T // 2 - 1
    assert 0.08 < (firsts == 0).float().mean() < 0.12  # X1 is the first pair (and zero) in 1 of 10
    assert min(train.sizes) == T and max(train.sizes) == T + T // 10 and train.sizes == [len(x) for x, _ in train]
    check_1997(test, T)
    again, again_test = adding.AddingProblem1997(adding.TRAIN_SIZE_1997, adding.TRAIN_SEED, T), adding.load_1997()[1]
    assert all(torch.equal(again[i][0], train[i][0]) and again[i][1] == train[i][1] for i in (0, 5, 9_999))
    assert torch.equal(again_test[7][0], test[7][0]), "the same sequences every time"
    assert not torch.equal(test[0][0][:T], train[0][0][:T]), "the test split is not the training split"
    # always predicting the mean scores Var(0.5 + (X1 + X2)/4) = 0.0396 (0.0417 if X1 were never zero);
    # the standard error over 10,000 sequences is about 0.0005
    targets = torch.stack([y for _, y in train])
    assert abs(((targets - targets.mean()) ** 2).mean().item() - adding.BASELINE_MSE_1997) < 0.0015
    assert abs(adding.BASELINE_MSE_1997 - 0.0396) < 1e-4
    assert get_dataset("adding-1997").facts() == dict(num_classes=1, input_size=2, tolerance=0.04)


@pytest.mark.parametrize("T", [20, 21, 1000])
def test_adding_problem_of_1997_at_other_lengths(T):
    """The shortest T, an odd T (T/2 is T // 2), and the paper's longest."""
    data = adding.AddingProblem1997(300, seed=3, T=T)
    check_1997(data, T)
    assert get_dataset("adding-1997").read(seq_len=T)[0].sizes[0] >= T


def test_adding_problem_of_1997_refuses_a_short_T_and_ignores_other_options():
    for T in (19, 10, 0):
        with pytest.raises(ConfigError, match=rf"--seq-len {T}: .* T must be at least 20"):
            get_dataset("adding-1997").read(seq_len=T)
        with pytest.raises(ConfigError, match="at least 20"):
            adding.facts_1997(seq_len=T)
    spec = get_dataset("adding-1997")
    assert spec.facts(data_dir=None, image_size=None, block_size=None, tokenizer=None, vocab_size=None,
                      seq_len=None)["tolerance"] == adding.TOLERANCE_1997
    assert spec.read(data_dir="unused", block_size=None, seq_len=500) is adding.load_1997(seq_len=500)  # cached


def test_padding_collation_keeps_lengths_and_zero_pads():
    inputs, targets = pad_sequences([(torch.ones(3, 2), torch.tensor(1.0)), (torch.ones(5, 2), torch.tensor(2.0))])
    assert inputs["x"].shape == (2, 5, 2) and inputs["lengths"].tolist() == [3, 5]
    assert inputs["x"][0, 3:].abs().sum() == 0 and targets.tolist() == [1.0, 2.0]
    _, test = get_dataset("adding").load()
    batch, _ = next(iter(eval_loader(test, 64, 0, 1, collate=pad_sequences)))
    assert batch["x"].shape[1] == batch["lengths"].max()


# ---------------------------------------------------------------- files in the real formats


def write_cifar10(root, n=24):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), "labels": list(rng.integers(0, 10, n))}
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"class{i}" for i in range(10)]}))


def write_idx(root, folder, n_train=40, n_test=20, gz=False, flat=False) -> dict:
    """The four idx files of n_train and n_test random 28x28 images in root/folder/raw/ (flat: in root),
    gzipped or not; returns their sizes and sha256, to stand for the recorded ones (common.data.mnist's
    RECORDED) in a test."""
    raw = root if flat else root / folder / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng, record = np.random.default_rng(0), {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        for name, data in ((f"{prefix}-images-idx3-ubyte", struct.pack(">IIII", 0x0803, n, 28, 28) + images.tobytes()),
                           (f"{prefix}-labels-idx1-ubyte", struct.pack(">II", 0x0801, n) + labels.tobytes())):
            (raw / (name + ".gz" if gz else name)).write_bytes(gzip.compress(data) if gz else data)
            record[name] = (len(data), hashlib.sha256(data).hexdigest())
    return record


def write_image_folder(root, classes=("cat", "dog", "owl"), per_class=10):
    rng = np.random.default_rng(0)
    for name in classes:
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            size = (int(rng.integers(12, 30)), int(rng.integers(12, 30)))  # sizes differ: they are resized
            Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(root / name / f"{i}.png")


@pytest.fixture
def cifar_md5_free(monkeypatch):
    """torchvision checks the real CIFAR-10 files' md5 sums; these small files are in the same format."""
    import os

    import torchvision.datasets.cifar as cifar

    monkeypatch.setattr(cifar, "check_integrity", lambda path, md5=None: os.path.isfile(path))


@pytest.mark.parametrize("dataset, writer, extra", [
    ("cifar10", write_cifar10, []),
    ("mnist", lambda root: write_idx(root, "MNIST"), []),
    ("fashion-mnist", lambda root: write_idx(root, "FashionMNIST"), []),
    ("imagefolder", write_image_folder, ["--image-size", "16"]),
])
def test_real_formats_train_a_few_steps(dataset, writer, extra, tmp_path, cifar_md5_free, monkeypatch):
    data_dir = tmp_path / "data"
    record = writer(data_dir)
    if dataset in mnist.RECORDED:  # the small files stand for the real ones
        monkeypatch.setitem(mnist.RECORDED, dataset, record)
    train, test = get_dataset(dataset).load(data_dir=str(data_dir), image_size=int(extra[1]) if extra else None)
    x, y = train[0]
    assert x.dtype == torch.float32 and x.ndim == 3 and 0 <= int(y) < 10
    assert main(["--paper", "vit", "--dataset", dataset, "--data-dir", str(data_dir), *extra, "--max-steps", "2",
                 "--batch-size", "8", "--wandb", "disabled", "--out", str(tmp_path / "run")]) == 0
    result = load_json(tmp_path / "run" / "result.json")
    assert result["dataset"] == dataset and result["steps"] == 2

    # the preprocessing that export stores for common.predict turns the image file into the same sample
    pre = get_dataset(dataset).preprocess(data_dir=str(data_dir), image_size=int(extra[1]) if extra else None)
    if dataset == "imagefolder":
        image, expected_labels = Image.open(train.dataset.samples[train.indices[0]][0]), ["cat", "dog", "owl"]
    elif dataset == "cifar10":
        image, expected_labels = Image.fromarray(np.asarray(train.data[0])), [f"class{i}" for i in range(10)]
    else:  # the images as torchvision's reader parses the files
        from torchvision import datasets

        reader = getattr(datasets, "MNIST" if dataset == "mnist" else "FashionMNIST")
        image, expected_labels = Image.fromarray(reader(data_dir).data[0].numpy()), reader.classes
    assert pre["labels"] == expected_labels
    assert np.abs(prepare(image, pre) - x.numpy()).max() < 1e-5


def test_image_folder_with_train_and_test_subfolders(tmp_path):
    write_image_folder(tmp_path / "data" / "train")
    write_image_folder(tmp_path / "data" / "test", per_class=2)
    facts = get_dataset("imagefolder").facts(data_dir=str(tmp_path / "data"), image_size=8)
    assert facts == dict(num_classes=3, in_chans=3, img_size=8)
    train, test = get_dataset("imagefolder").load(data_dir=str(tmp_path / "data"), image_size=8)
    assert (len(train), len(test)) == (30, 6) and train[0][0].shape == (3, 8, 8)


@pytest.mark.parametrize("flags, words", [
    (["--dataset", "cifar10"], ["--data-dir", "cifar-10-batches-py", "data_batch_1"]),
    (["--dataset", "cifar10", "--data-dir", "{empty}"], ["lacks", "cifar-10-batches-py/data_batch_1", "test_batch"]),
    (["--dataset", "mnist", "--data-dir", "{empty}"], ["train-images-idx3-ubyte", "t10k-labels-idx1-ubyte",
                                                       "gzipped or not", "--download"]),
    (["--dataset", "fashion-mnist", "--data-dir", "{empty}"], ["{empty} or {debian}", "apt-get install -y "
                                                               "dataset-fashion-mnist", "--download"]),
    (["--dataset", "fashion-mnist"], ["not in {debian};", "apt-get update", "--download"]),
    (["--dataset", "imagefolder", "--data-dir", "{empty}", "--image-size", "32"], ["holds no images", "class subfolders"]),
    (["--dataset", "imagefolder", "--data-dir", "{missing}", "--image-size", "32"], ["not a folder"]),
    (["--dataset", "imagefolder", "--data-dir", "{folder}"], ["needs --image-size"]),
    (["--dataset", "adding", "--paper", "lstm", "--image-size", "32"], ["does not apply to adding", "cifar10"]),
    (["--dataset", "digits-rows"], ["vit reads image inputs", "digits-rows has sequence inputs"]),
])
def test_missing_data_is_one_line_naming_the_files(flags, words, tmp_path, capsys, monkeypatch):
    (tmp_path / "empty").mkdir()
    write_image_folder(tmp_path / "folder", per_class=2)
    monkeypatch.chdir(tmp_path)
    debian = tmp_path / "not-installed"  # wherever Debian's package is installed or not
    monkeypatch.setitem(mnist.DEBIAN, "fashion-mnist", (str(debian), "dataset-fashion-mnist"))
    names = dict(empty=tmp_path / "empty", missing=tmp_path / "missing", folder=tmp_path / "folder", debian=debian)
    assert main(["--paper", "vit", "--wandb", "disabled", *[f.format(**names) for f in flags]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    for word in words:
        assert word.format(**names) in err[0], err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "folder"], "nothing written"


# ---------------------------------------------------------------- folders that cannot be read


def corrupt_cifar(root):
    write_cifar10(root)
    batch = root / "cifar-10-batches-py" / "data_batch_1"
    batch.write_bytes(batch.read_bytes()[:100])  # cut short


def corrupt_image(root):
    write_image_folder(root, per_class=3)
    (root / "dog" / "1.png").write_bytes(b"\x89PNG not really")


@pytest.mark.parametrize("dataset, writer, md5_free, extra, words", [
    ("cifar10", write_cifar10, False, [], ["cannot read", "Dataset not found or corrupted", "--download"]),
    ("cifar10", corrupt_cifar, True, [], ["cannot read", "UnpicklingError"]),
    ("mnist", lambda root: (write_idx(root, "MNIST"), (root / "MNIST/raw/t10k-images-idx3-ubyte").write_bytes(b"x"))[0],
     False, [], ["MNIST/raw/t10k-images-idx3-ubyte: size 1 bytes, expected 15,696"]),
    ("imagefolder", corrupt_image, False, ["--image-size", "16"], ["dog/1.png", "not an image"]),
])
def test_a_data_folder_that_cannot_be_read_is_one_line(dataset, writer, md5_free, extra, words, tmp_path, capsys,
                                                        monkeypatch, request):
    """Files in place but not readable (torchvision's md5 check fails, a file cut short, an image that is
    not one): one line naming the folder (or file) and what is wrong, exit 2, nothing written."""
    if md5_free:
        request.getfixturevalue("cifar_md5_free")
    data = tmp_path / "data"
    record = writer(data)
    if dataset in mnist.RECORDED:  # the small files stand for the real ones
        monkeypatch.setitem(mnist.RECORDED, dataset, record)
    monkeypatch.chdir(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert main(["--paper", "vit", "--dataset", dataset, "--data-dir", str(data), *extra, "--wandb", "disabled"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0] and str(data) in err[0], err
    assert all(word in err[0] for word in words), err[0]
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before, "nothing written"


# ---------------------------------------------------------------- --download


def test_download_fetches_into_data_and_trains(tmp_path, capsys, monkeypatch, cifar_md5_free):
    """--download with no --data-dir: torchvision's download (here a stand-in that writes the files, since
    tests never download) fills data/, the run says where, and trains on it."""
    import torchvision.datasets.cifar as cifar

    fetched = []

    def fake_download(url, download_root, **_):
        fetched.append(url)
        write_cifar10(Path(download_root))

    monkeypatch.setattr(cifar, "download_and_extract_archive", fake_download)
    monkeypatch.chdir(tmp_path)
    assert main(["--paper", "vit", "--dataset", "cifar10", "--download", "--max-steps", "2", "--batch-size", "8",
                 "--wandb", "disabled", "--out", "run"]) == 0
    assert fetched == [cifar.CIFAR10.url] and (tmp_path / "data/cifar-10-batches-py/data_batch_1").is_file()
    assert "--download: cifar10 is in data/" in capsys.readouterr().out
    assert load_json(tmp_path / "run/config.json")["data_dir"] == "data"
    assert main(["--paper", "vit", "--dataset", "cifar10", "--download", "--max-steps", "2", "--batch-size", "8",
                 "--wandb", "disabled", "--out", "again"]) == 0
    assert len(fetched) == 1, "what is there and passes the check is not fetched again"


@pytest.mark.parametrize("dataset", ["cifar10", "mnist"])
def test_download_without_a_network_is_one_line_and_leaves_no_folder(dataset, tmp_path, capsys, monkeypatch):
    import urllib.error

    import torchvision.datasets.utils as utils

    def no_network(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(utils.urllib.request, "urlopen", no_network)
    monkeypatch.chdir(tmp_path)
    assert main(["--paper", "vit", "--dataset", dataset, "--download", "--wandb", "disabled"]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "could not fetch" in lines[0] and "data" in lines[0] and out == "", (out, err)
    assert list(tmp_path.iterdir()) == [], "the folder the attempt made is gone"


def test_download_of_a_data_set_that_cannot_be_downloaded_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["--paper", "vit", "--download", "--wandb", "disabled"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--download does not apply to digits" in err[0] and "cifar10, mnist, fashion-mnist" in err[0]
