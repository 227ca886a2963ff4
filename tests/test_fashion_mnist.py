"""Fashion-MNIST (and MNIST, its format) as a checked benchmark (common.data.mnist): where the files come
from, the checks that stop a wrong file before anything trains, the tensors it serves, its default
augmentation, every image paper at 28x28, resume, sweeps, export and predict, on small idx files standing
for the real ones; then the real files of Debian's dataset-fashion-mnist, where they are installed (a
test of them is skipped without them, and fails without them under CI)."""

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from common import export, parallel, sweep
from common.config import build_parser, resolve, validate
from common.data import download, get_dataset, mnist, vision
from common.data.augment import Augmented
from common.errors import ConfigError
from common.predict import Predictor, predict, prepare
from common.pretrained import build_model
from common.trainer import Trainer
from papers import get_paper, list_papers
from tests.conftest import bitwise_equal, interrupted_copy, load_json, need_files, torchrun, weights
from tests.test_datasets import write_idx
from train import main

DEBIAN, PACKAGE = mnist.DEBIAN["fashion-mnist"]
GET_THEM = f"on Debian or Ubuntu: apt-get update && apt-get install -y {PACKAGE}"
RUN = ["--wandb", "disabled", "--batch-size", "8"]
N_TRAIN, N_TEST = 64, 32


@pytest.fixture
def small(tmp_path, monkeypatch):
    """A --data-dir of 64 train / 32 test random images in torchvision's layout (DIR/FashionMNIST/raw/),
    taken for Fashion-MNIST's files (their sizes and sha256 recorded in place of the real ones), and no
    Debian files."""
    data = tmp_path / "data"
    monkeypatch.setitem(mnist.RECORDED, "fashion-mnist", write_idx(data, "FashionMNIST", N_TRAIN, N_TEST))
    monkeypatch.setitem(mnist.DEBIAN, "fashion-mnist", (str(tmp_path / "no-debian"), PACKAGE))
    return data


def raw(data: Path, name: str) -> Path:
    return data / "FashionMNIST" / "raw" / name


# ---------------------------------------------------------------- where the files come from


def test_files_gzipped_or_not_in_the_folder_or_in_torchvisions_layout_read_alike(small, tmp_path, monkeypatch):
    spec = get_dataset("fashion-mnist")
    assert mnist.prepare("fashion-mnist", "FashionMNIST", str(small)) == small, "read where they are"
    expected_train, expected_test = spec.load(data_dir=str(small))
    assert (len(expected_train), len(expected_test)) == (N_TRAIN, N_TEST)
    cache = tmp_path / "cache"
    monkeypatch.setenv(mnist.CACHE_VARIABLE, str(cache))
    write_idx(tmp_path / "gz", "", N_TRAIN, N_TEST, gz=True, flat=True)
    write_idx(tmp_path / "flat", "", N_TRAIN, N_TEST, flat=True)
    for folder in ("gz", "flat"):
        train, test = spec.load(data_dir=str(tmp_path / folder))
        assert all(torch.equal(a, b) for a, b in zip(train.tensors + test.tensors,
                                                       expected_train.tensors + expected_test.tensors))
    copies = sorted(cache.rglob("*-ubyte"))
    assert len(copies) == 8 and sum(p.is_symlink() for p in copies) == 4, "4 decompressed, 4 linked"
    decompressed = {p: p.stat().st_ino for p in copies if not p.is_symlink()}
    spec.facts(data_dir=str(tmp_path / "gz"))
    assert {p: p.stat().st_ino for p in decompressed} == decompressed, "decompressed once"
    (tmp_path / "gz" / "train-labels-idx1-ubyte.gz").touch()  # a newer file: decompressed again
    spec.facts(data_dir=str(tmp_path / "gz"))
    changed = [p.name for p in decompressed if p.stat().st_ino != decompressed[p]]
    assert changed == ["train-labels-idx1-ubyte"]


def test_debians_folder_comes_after_the_data_dir(tmp_path, monkeypatch):
    debian = tmp_path / "debian"
    monkeypatch.setitem(mnist.RECORDED, "fashion-mnist", write_idx(debian, "", N_TRAIN, N_TEST, gz=True, flat=True))
    monkeypatch.setitem(mnist.DEBIAN, "fashion-mnist", (str(debian), PACKAGE))
    spec = get_dataset("fashion-mnist")
    assert len(spec.load()[0]) == N_TRAIN  # no --data-dir
    assert len(spec.load(data_dir=str(tmp_path / "empty"))[0]) == N_TRAIN  # a --data-dir without them
    write_idx(tmp_path / "own", "FashionMNIST", N_TRAIN, N_TEST)
    assert mnist.prepare("fashion-mnist", "FashionMNIST", str(tmp_path / "own")) == tmp_path / "own"
    # --download fetches nothing when the files are found, and leaves no empty folder behind
    assert download(spec) == f"--download: fashion-mnist is in {debian}/ already; nothing fetched"
    assert not Path("data").exists()


def cut_gzip(data):
    path = raw(data, "train-labels-idx1-ubyte")
    packed = gzip.compress(path.read_bytes())
    path.unlink()
    path.with_name(path.name + ".gz").write_bytes(packed[: len(packed) // 2])


def change_a_pixel(data):
    path = raw(data, "train-images-idx3-ubyte")
    content = bytearray(path.read_bytes())
    content[1000] ^= 0xFF
    path.write_bytes(bytes(content))


def change_the_count(data):
    path = raw(data, "t10k-labels-idx1-ubyte")
    content = bytearray(path.read_bytes())
    content[7] += 1
    path.write_bytes(bytes(content))


@pytest.mark.parametrize("spoil, words", [
    (lambda data: raw(data, "t10k-images-idx3-ubyte").write_bytes(b"\0" * 1000),
     ["FashionMNIST/raw/t10k-images-idx3-ubyte: size 1,000 bytes, expected 25,104", "cut short"]),
    (cut_gzip, ["FashionMNIST/raw/train-labels-idx1-ubyte.gz: not a whole gzip file"]),
    (change_a_pixel, ["FashionMNIST/raw/train-images-idx3-ubyte: sha256 ", ", expected "]),
    (change_the_count, ["FashionMNIST/raw/t10k-labels-idx1-ubyte: idx header (2049, 33), expected (2049, 32)"]),
    (lambda data: raw(data, "train-labels-idx1-ubyte").unlink(), ["data lacks train-labels-idx1-ubyte"]),
], ids=["cut-short", "gzip-cut-short", "a-changed-pixel", "another-header", "a-file-missing"])
def test_a_wrong_file_is_one_line_before_anything_is_written(spoil, words, small, capsys):
    spoil(small)
    assert main(["--paper", "vit", "--dataset", "fashion-mnist", "--data-dir", str(small), *RUN]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert all(word in err[0] for word in words), err[0]
    assert list(Path.cwd().iterdir()) == [], "no runs/, no results/"


def test_a_mnist_file_is_checked_by_size_and_header():
    assert all(sha256 is None for _, sha256 in mnist.RECORDED["mnist"].values())  # none recorded here
    assert {name: size for name, (size, _) in mnist.RECORDED["mnist"].items()} == {
        name: size for name, (size, _) in mnist.RECORDED["fashion-mnist"].items()}
    data = Path("data")
    write_idx(data, "MNIST", 60_000, 10_000)
    spec = get_dataset("mnist")
    assert spec.facts(data_dir="data")["img_size"] == 28
    path = data / "MNIST/raw/t10k-images-idx3-ubyte"
    content = bytearray(path.read_bytes())
    content[3] = 0x01  # the magic number of a 1-d idx file
    path.write_bytes(bytes(content))
    with pytest.raises(ConfigError, match=r"t10k-images-idx3-ubyte: idx header \(2049, 10000, 28, 28\)"):
        spec.facts(data_dir="data")


# ---------------------------------------------------------------- what it serves


def test_tensors_normalised_once_and_resized_as_predict_resizes(small):
    from torchvision.datasets import FashionMNIST

    spec = get_dataset("fashion-mnist")
    pixels = FashionMNIST(small).data  # (N, 28, 28) uint8, as torchvision's reader parses the files
    (mean,), (std,) = vision.FASHION_STATS
    train, _ = spec.load(data_dir=str(small))
    x, y = train[3]
    assert x.shape == (1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert torch.allclose(x[0], (pixels[3].float() / 255 - mean) / std, atol=1e-6)
    resized, _ = spec.load(data_dir=str(small), image_size=32)
    pre = spec.preprocess(data_dir=str(small), image_size=32)  # what export stores for common.predict
    assert pre["size"] == [32, 32] and pre["mode"] == "L" and (pre["mean"], pre["std"]) == ([mean], [std])
    for i in range(8):
        got = resized[i][0].numpy()
        from_png = prepare(Image.fromarray(pixels[i].numpy()), pre)  # Pillow's bilinear resize
        grey_level = 1 / 255 / std
        assert got.shape == from_png.shape == (1, 32, 32)
        assert np.abs(got - from_png).max() <= grey_level + 1e-5 and np.abs(got - from_png).mean() < grey_level / 4



def test_the_rows_are_the_images_read_row_by_row_and_a_recurrent_network_trains_on_them(small, tmp_path):
    images, _ = get_dataset("fashion-mnist").load(data_dir=str(small))
    spec = get_dataset("fashion-mnist-rows")
    rows, _ = spec.read(data_dir=str(small))
    assert spec.facts(data_dir=str(small)) == dict(num_classes=10, input_size=28, seq_len=28)
    assert spec.inputs == "sequence" and spec.preprocess(data_dir=str(small))["layout"] == "rows"
    assert torch.equal(rows.tensors[0], images.tensors[0][:, 0]) and torch.equal(rows.tensors[1], images.tensors[1])
    assert main(["--paper", "lstm", "--dataset", "fashion-mnist-rows", "--data-dir", str(small), "--max-steps", "2",
                 "--out", str(tmp_path / "run"), *RUN]) == 0

@pytest.mark.parametrize("dataset, flags, expected", [
    ("fashion-mnist", [], "crop:4,flip"),
    ("mnist", [], "crop:4"),
    ("fashion-mnist", ["--augment", "none"], "none"),
    ("fashion-mnist", ["--augment", "flip"], "flip"),
    ("digits", [], "none"),
])
def test_the_default_augmentation_is_the_data_sets_own(dataset, flags, expected, tmp_path, monkeypatch):
    data = tmp_path / "data"
    reader = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}.get(dataset)
    if reader:
        monkeypatch.setitem(mnist.RECORDED, dataset, write_idx(data, reader, N_TRAIN, N_TEST))
    argv = ["--paper", "resnet", "--dataset", dataset, *(["--data-dir", str(data)] if reader else []), *RUN, *flags]
    cfg = resolve(vars(build_parser().parse_args(argv)))
    assert cfg.augment == ("auto" if not flags else flags[1])
    validate(cfg)
    trainer = Trainer(cfg, parallel.setup(), argv, resuming=False)
    assert trainer.cfg.augment == expected, "what config.json records"
    assert isinstance(trainer.train_set, Augmented) == (expected != "none")
    plain_train, plain_test = get_dataset(dataset).read(data_dir=str(data) if reader else None)
    assert not isinstance(trainer.test_set, Augmented), "the test split is never augmented"
    batch, _ = next(iter(trainer.test_loader))
    assert torch.equal(batch, torch.stack([plain_test[i][0] for i in range(len(batch))]))
    torch.manual_seed(0)
    changed = sum(not torch.equal(trainer.train_set[i][0], plain_train[i][0]) for i in range(16))
    assert changed >= 8 if expected != "none" else changed == 0


# ---------------------------------------------------------------- every image paper at 28x28

IMAGE_PAPERS = [n for n in list_papers() if get_paper(n).inputs == "image" and get_paper(n).task == "classification"]


def test_the_image_classifiers_are_the_cnn_lineage_and_the_vision_transformers():
    assert sorted(IMAGE_PAPERS) == sorted(["lenet", "alexnet", "vgg", "googlenet", "resnet", "resnext", "densenet",
                                           "mobilenetv2", "convnext", "vit", "deit", "swin"])


@pytest.mark.parametrize("name", IMAGE_PAPERS)
def test_every_image_papers_tiny_flavor_takes_28x28(name, small):
    """Built as train.py builds it from the data set's facts; LeNet-5 pads to its 32x32 (papers/lenet),
    ViT's tiny flavors cut 28 into patches of 2 (tiny) or 4 (tiny/4), Swin's into patches of 2."""
    facts = get_dataset("fashion-mnist").facts(data_dir=str(small))
    assert facts == dict(num_classes=10, in_chans=1, img_size=28)
    for flavor in [f for f in get_paper(name).flavors if f.startswith("tiny")]:
        torch.manual_seed(0)
        model = build_model(get_paper(name), flavor, None, facts).eval()
        with torch.no_grad():
            out = model(torch.randn(2, 1, 28, 28))
        assert out.shape == (2, 10) and torch.isfinite(out).all(), flavor


# every paper's forward at 28x28 is checked above; train.py's whole path on the data set, for the two whose
# inputs change most: LeNet-5 pads 28 to 32, ViT cuts 28 into patches
@pytest.mark.parametrize("name", ["lenet", "vit"])
def test_every_image_paper_trains_on_fashion_mnist_at_28x28(name, small, tmp_path):
    """--image-size 28: the files' own size (several papers' defaults resize to 32)."""
    assert main(["--paper", name, "--dataset", "fashion-mnist", "--data-dir", str(small), "--image-size", "28",
                 "--max-steps", "2", *RUN, "--out", str(tmp_path / "run")]) == 0
    result = load_json(tmp_path / "run" / "result.json")
    assert (result["dataset"], result["steps"], result["config"]["augment"]) == ("fashion-mnist", 2, "crop:4,flip")


# ---------------------------------------------------------------- resume, export, predict, sweeps


@pytest.mark.slow
def test_a_run_resumes_exports_and_predicts(small, tmp_path):
    run = tmp_path / "run"
    assert main(["--paper", "vit", "--flavor", "tiny/4", "--dataset", "fashion-mnist", "--data-dir", str(small),
                 "--max-steps", "4", "--ckpt-every", "2", *RUN, "--out", str(run)]) == 0
    assert load_json(run / "config.json")["augment"] == "crop:4,flip"
    resumed = interrupted_copy(run, 2, tmp_path / "resumed")
    assert main(["--resume", str(resumed)]) == 0
    assert bitwise_equal(weights(resumed), weights(run)), "the augmentation's draws resume too"

    assert export.main(["--run", str(run), "--samples", "4"]) == 0
    samples = sorted((run / "samples").glob("*.png"))
    labels = [name.replace("/", "_") for name in get_dataset("fashion-mnist").preprocess(data_dir=str(small))["labels"]]
    assert len(samples) == 4 and all(p.stem.split("_", 1)[1] in labels for p in samples)
    model, _ = export.load_run(run)
    _, test_set = get_dataset("fashion-mnist").load(data_dir=str(small))
    predictor = Predictor(run / "model.onnx")
    for i, path in enumerate(samples):
        x = predictor.preprocess(Image.open(path))  # (1, 28, 28), the run's preprocessing
        assert np.abs(x - test_set[i][0].numpy()).max() <= predictor.pre["scale"] / predictor.pre["std"][0]
        with torch.no_grad():
            expected = torch.softmax(model.eval()(torch.from_numpy(x)[None]), dim=1)[0]
        label, probability = predict(run / "model.onnx", [path])[0]
        assert label == predictor.pre["labels"][int(expected.argmax())]
        assert abs(probability - float(expected.max())) < 1e-4


@pytest.mark.slow
def test_a_sweep_over_fashion_mnist_checks_its_files_first(small, tmp_path, capsys):
    path = tmp_path / "fashion.yaml"
    path.write_text(f"name: fashion\nprogram: train.py\nmethod: grid\nparameters:\n  paper: {{value: resnet}}\n"
                    f"  dataset: {{value: fashion-mnist}}\n  data-dir: {{value: {small}}}\n"
                    f"  augment: {{values: [auto, none]}}\n  seed: {{values: [0, 1]}}\n")
    assert sweep.main([str(path), "--dry-run"]) == 0
    assert "sweep fashion: 4 combinations, all valid" in capsys.readouterr().out
    change_a_pixel(small)
    assert sweep.main([str(path), "--dry-run"]) == 2
    assert "train-images-idx3-ubyte: sha256" in capsys.readouterr().err


# ---------------------------------------------------------------- Debian's real files


@pytest.fixture
def debian():
    return need_files(DEBIAN, f"{GET_THEM} to run the tests of the real files")


def test_debians_files_are_fashion_mnist(debian):
    spec = get_dataset("fashion-mnist")
    assert spec.facts() == dict(num_classes=10, in_chans=1, img_size=28)  # every file's size and sha256 agree
    assert spec.preprocess()["labels"] == ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                                           "Sneaker", "Bag", "Ankle boot"]
    train, test = spec.load()
    assert (len(train), len(test)) == (60_000, 10_000)
    assert torch.bincount(train.tensors[1]).tolist() == [6_000] * 10
    assert torch.bincount(test.tensors[1]).tolist() == [1_000] * 10
    x = train.tensors[0]
    assert abs(x.mean()) < 1e-3 and abs(x.std() - 1) < 1e-3, "normalised by the training set's own statistics"
    batch = x[torch.randperm(len(x), generator=torch.Generator().manual_seed(0))[:256]]
    assert abs(batch.mean()) < 0.1 and abs(batch.std() - 1) < 0.1
    assert torch.equal(x.flatten(1).amin(1), torch.full((60_000,), x.min())), "every image has blank paper"


def test_download_finds_debians_files_and_fetches_nothing(debian, monkeypatch):
    import torchvision.datasets.utils as utils

    monkeypatch.setattr(utils.urllib.request, "urlopen", lambda *a, **k: pytest.fail("nothing is fetched"))
    cfg = resolve(vars(build_parser().parse_args(["--paper", "vit", "--dataset", "fashion-mnist", "--download"])))
    assert cfg.data_dir == "data"
    assert download(get_dataset("fashion-mnist"), cfg.data_dir) == (f"--download: fashion-mnist is in {DEBIAN}/ "
                                                                   f"already; nothing fetched")
    assert not Path("data").exists(), "nor an empty folder left"


@pytest.mark.slow
def test_ddp_under_torchrun_on_the_real_files(debian, tmp_path):
    torchrun(["--paper", "vit", "--flavor", "tiny/4", "--dataset", "fashion-mnist", "--max-steps", "2",
              "--batch-size", "16", "--wandb", "disabled", "--out", "run"], cwd=tmp_path)
    result = load_json(tmp_path / "run" / "result.json")
    assert (result["world_size"], result["strategy"], result["steps"]) == (2, "ddp", 2)
    assert result["config"]["augment"] == "crop:4,flip" and result["dataset"] == "fashion-mnist"
