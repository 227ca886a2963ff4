"""Hugging Face datasets as data sets (--dataset hf:NAME_OR_PATH): save_to_disk folders, parquet files and
a Hub data set in the local cache, for images, text and sentence pairs; every data set is made here."""

import random
import shutil
import subprocess
import sys

import pytest
import torch

from common.data import get_dataset, hf, train_loader, vision
from common.errors import ConfigError
from tests.conftest import ROOT, bitwise_equal, interrupted_copy, load_json, weights

QUIET = ["--wandb", "disabled"]
WORDS = "the quick brown fox jumps over a lazy dog and runs far into the green woods".split()
EN = ["go", "run", "stop", "wait", "help", "hello", "jump"]
FR = ["va", "cours", "arrête", "attends", "aide", "bonjour", "saute"]


def colour_images(n: int, seed: int) -> dict:
    """n 8 x 8 images of noise, the even-numbered ones red (class 0), the odd ones blue (class 1): two
    classes a model tells apart at once, every image different."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    images = []
    for i in range(n):
        pixels = rng.integers(0, 70, (8, 8, 3), dtype=np.uint8)
        pixels[..., 0 if i % 2 == 0 else 2] += 170
        images.append(Image.fromarray(pixels))
    return {"img": images, "label": [i % 2 for i in range(n)]}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The data sets, and datasets' cache in a folder of the module's own (parquet reads write there)."""
    datasets = hf._datasets()
    root = tmp_path_factory.mktemp("hf")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", str(root / "cache"))
        features = datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(names=["red", "blue"])})
        colours = datasets.DatasetDict(train=datasets.Dataset.from_dict(colour_images(80, 0), features=features),
                                       test=datasets.Dataset.from_dict(colour_images(20, 1), features=features))
        colours.save_to_disk(root / "colours")
        (root / "colours-parquet").mkdir()
        for split in ("train", "test"):
            colours[split].to_parquet(root / "colours-parquet" / f"{split}.parquet")
        colours["train"].save_to_disk(root / "one")  # a single Dataset: no named splits
        rng = random.Random(0)
        lines = [" ".join(rng.choice(WORDS) for _ in range(10)) + "." for _ in range(120)]
        datasets.DatasetDict(train=datasets.Dataset.from_dict({"text": lines[:100] + ["", "  "]}),
                             test=datasets.Dataset.from_dict({"text": lines[100:]})).save_to_disk(root / "text")
        pairs = [(f"{EN[i % 7]} {EN[i // 7 % 7]} !", f"{FR[i % 7]} {FR[i // 7 % 7]} !") for i in range(60)]
        datasets.Dataset.from_dict({"en": [s for s, _ in pairs], "fr": [t for _, t in pairs]}).to_parquet(
            root / "pairs.parquet")
        yield root


def test_a_classification_set_learns_its_colours_and_a_run_stopped_mid_epoch_resumes_bitwise(data, tmp_path):
    from train import main

    flags = ["--paper", "lenet", "--dataset", f"hf:{data / 'colours'}", "--batch-size", "16", "--max-steps", "10",
             "--ckpt-every", "3", "--keep-ckpts", "5", "--results-dir", str(tmp_path / "r"), *QUIET]
    assert main(flags + ["--out", str(tmp_path / "whole")]) == 0
    result = load_json(tmp_path / "whole" / "result.json")
    assert result["metric"] == "accuracy" and result["final"] >= 0.9  # test accuracy; chance: 0.5
    resumed = interrupted_copy(tmp_path / "whole", 3, tmp_path / "resumed")  # step 3 of 5 in the first epoch
    assert main(["--resume", str(resumed)]) == 0
    assert bitwise_equal(weights(resumed), weights(tmp_path / "whole"))


def test_ranks_read_disjoint_shares_of_the_global_batches_and_a_resumed_epoch_reads_the_rest(data):
    train, _ = get_dataset(f"hf:{data / 'colours'}").read(image_size=8)
    index = {x.numpy().tobytes(): i for i, (x, _) in enumerate(train)}
    assert len(index) == len(train) == 80
    ids = lambda x: [index[image.numpy().tobytes()] for image in x]
    single = train_loader(train, 16, 16, rank=0, world_size=1, seed=3)
    ranks = [train_loader(train, 16, 8, rank=r, world_size=2, seed=3) for r in range(2)]
    single.epoch_sampler.set_epoch(1)
    batches = [ids(x) for x, _ in single]
    for loader in ranks:
        loader.epoch_sampler.set_epoch(1)
    shares = [[ids(x) for x, _ in loader] for loader in ranks]
    for batch, mine, theirs in zip(batches, *shares):
        assert not set(mine) & set(theirs) and sorted(mine + theirs) == sorted(batch)
    assert sorted(i for batch in batches for i in batch) == list(range(80))  # 5 whole batches: every sample
    single.epoch_sampler.set_epoch(1, start=32)  # stopped after two steps
    assert [ids(x) for x, _ in single] == batches[2:]


def test_the_parquet_files_read_as_the_saved_folder_and_images_preprocess_as_imagefolder(data):
    disk, parquet = (get_dataset(f"hf:{data / name}") for name in ("colours", "colours-parquet"))
    assert (disk.task, disk.inputs, parquet.task) == ("classification", "image", "classification")
    for a, b in zip(disk.read(image_size=12), parquet.read(image_size=12)):
        assert len(a) == len(b) > 0
        assert all(torch.equal(x, y) and i == j for (x, i), (y, j) in zip(a, b))
    x, label = disk.read(image_size=12)[0][1]
    assert x.shape == (3, 12, 12) and label == 1 and x[2].mean() > x[0].mean()  # blue, normalised
    assert disk.facts(image_size=12) == dict(num_classes=2, in_chans=3, img_size=12)
    as_imagefolder = vision._preprocessing(vision.IMAGENET_STATS, "RGB", 12, ["red", "blue"])  # the ClassLabel's names
    assert disk.preprocess(image_size=12) == parquet.preprocess(image_size=12) == as_imagefolder


def test_integer_labels_count_to_the_largest_and_an_unlabelled_split_is_one_error(tmp_path):
    datasets = hf._datasets()
    features = datasets.Features({"img": datasets.Image(), "label": datasets.Value("int64")})
    labelled = colour_images(20, 2) | {"label": [0, 2] * 10}  # no ClassLabel: ids 0 to 2, 1 never seen
    unlabelled = colour_images(4, 3) | {"label": [-1] * 4}  # as a Hub test split often is
    datasets.DatasetDict(train=datasets.Dataset.from_dict(labelled, features=features),
                         test=datasets.Dataset.from_dict(unlabelled, features=features)).save_to_disk(tmp_path / "ints")
    spec = get_dataset(f"hf:{tmp_path / 'ints'}")
    with pytest.raises(ConfigError, match="column 'label' holds label -1, not a class id from 0 to 2"):
        spec.facts(image_size=8)
    assert spec.facts(image_size=8, hf_split="train")["num_classes"] == 3
    assert spec.preprocess(image_size=8, hf_split="train")["labels"] == ["0", "1", "2"]


def test_a_single_dataset_is_cut_80_20_stratified_the_same_every_time(data):
    spec = get_dataset(f"hf:{data / 'one'}")
    train, test = spec.read(image_size=8)
    assert (len(train), len(test)) == (64, 16)
    assert sorted(label for _, label in test) == [0] * 8 + [1] * 8
    images = lambda ds: {x.numpy().tobytes() for x, _ in ds}
    assert not images(train) & images(test)
    hf._chosen.cache_clear()
    assert images(spec.read(image_size=8)[1]) == images(test)
    with pytest.raises(ConfigError, match="one Dataset saved on its own.*leave out --hf-split"):
        spec.facts(image_size=8, hf_split="train")
    saved = {"data-00000-of-00001.arrow", "dataset_info.json", "state.json"}
    assert {p.name for p in (data / "one").rglob("*")} == saved  # reading wrote nothing there


def test_a_text_column_trains_a_language_model(data, tmp_path):
    from train import main

    spec = get_dataset(f"hf:{data / 'text'}")
    assert (spec.task, spec.inputs) == ("language-modeling", "tokens")
    train_text, test_text = hf._texts(hf.chosen(spec.name))
    assert train_text.count("\n\n") == 99 and test_text.count(".") == 20  # empty rows left out
    assert spec.facts()["vocab_size"] == len(set(train_text + test_text)) + 1  # and <unk>
    assert main(["--paper", "gpt", "--dataset", spec.name, "--block-size", "16", "--batch-size", "8",
                 "--max-steps", "2", "--out", str(tmp_path / "run"), "--results-dir", str(tmp_path / "r"),
                 *QUIET]) == 0
    result = load_json(tmp_path / "run" / "result.json")
    assert result["metric"] == "bits_per_char" and result["final"] > 0


def test_source_and_target_columns_train_a_seq2seq_model(data, tmp_path):
    from train import main

    name = f"hf:{data / 'pairs.parquet'}"
    with pytest.raises(ConfigError, match=r"its columns \(en, fr\) do not say the task; name them with --hf-columns"):
        get_dataset(name)
    spec = get_dataset(name, hf_columns="source=en,target=fr")
    assert (spec.task, spec.inputs, spec.variable_size) == ("seq2seq", "pairs", True)
    train, test = spec.read(hf_columns="source=en,target=fr")
    assert (len(train), len(test)) == (48, 12)  # one split: cut 80/20
    facts = spec.facts(hf_columns="source=en,target=fr")
    assert facts["src_itos"][4:] and set(facts["src_itos"][4:]) <= set(EN) | {"!"}
    assert set(facts["itos"][4:]) <= set(FR) | {"!"}
    assert main(["--paper", "transformer", "--dataset", name, "--hf-columns", "source=en,target=fr", "--batch-size",
                 "8", "--max-steps", "2", "--out", str(tmp_path / "run"), "--results-dir", str(tmp_path / "r"),
                 *QUIET]) == 0
    assert load_json(tmp_path / "run" / "config.json")["hf_columns"] == "source=en,target=fr"


def test_a_translation_column_gives_its_languages_as_source_and_target(tmp_path):
    datasets = hf._datasets()
    rows = [{"en": f"{EN[i % 7]} !", "fr": f"{FR[i % 7]} !"} for i in range(30)]
    features = datasets.Features({"translation": datasets.Translation(languages=["en", "fr"])})
    datasets.Dataset.from_dict({"translation": rows}, features=features).save_to_disk(tmp_path / "opus")
    name, columns = f"hf:{tmp_path / 'opus'}", "source=translation.en,target=translation.fr"
    spec = get_dataset(name, hf_columns=columns)
    train, test = spec.read(hf_columns=columns)
    assert (len(train), len(test)) == (24, 6) and train.texts[0] == ("go !", "va !")
    assert set(spec.facts(hf_columns=columns)["src_itos"][4:]) == set(EN) | {"!"}
    with pytest.raises(ConfigError, match="column 'translation' has no 'de' .*; its keys: en, fr"):
        spec.facts(hf_columns="source=translation.en,target=translation.de")


def test_a_hub_data_set_is_read_from_the_cache_without_the_network(data, tmp_path, monkeypatch):
    """The cache as load_dataset leaves it for OWNER/NAME: a folder per configuration, version and
    commit, holding dataset_info.json and NAME-SPLIT.arrow (made here from the parquet files' copy)."""
    import socket

    load_dataset = hf._datasets().load_dataset
    built = load_dataset("parquet", data_dir=str(data / "colours-parquet"), cache_dir=str(tmp_path / "b"))
    folder = tmp_path / "cache" / "someone___colours" / "default" / "0.0.0" / "0123abc"
    shutil.copytree(built["train"].cache_files[0]["filename"].rsplit("/", 1)[0], folder)
    for arrow in folder.glob("parquet-*.arrow"):
        arrow.rename(folder / arrow.name.replace("parquet-", "colours-"))

    def no_network(*args):
        raise AssertionError("the network was asked")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    hub = get_dataset("hf:someone/colours", data_dir=str(tmp_path / "cache"))
    disk = get_dataset(f"hf:{data / 'colours'}")
    for a, b in zip(hub.read(data_dir=str(tmp_path / "cache"), image_size=8), disk.read(image_size=8)):
        assert len(a) == len(b) and all(torch.equal(x, y) for (x, _), (y, _) in zip(a, b))
    with pytest.raises(ConfigError, match="no Hub data set of that name is in the Hugging Face cache .*; --download"):
        get_dataset("hf:someone/other", data_dir=str(tmp_path / "cache"))


@pytest.mark.parametrize("dataset, flags, words", [
    ("/nowhere/at/all", [], "--dataset hf:/nowhere/at/all: /nowhere/at/all does not exist"),
    ("nobody/nothing", [], "no Hub data set of that name is in the Hugging Face cache"),
    ("colours", ["--hf-split", "train,validation"], "has no split 'validation'; its splits: train, test"),
    ("colours", ["--hf-split", "train,test,more"], "--hf-split 'train,test,more': give TRAIN or TRAIN,TEST"),
    ("colours", ["--hf-columns", "image=picture,label=label"],
     "has no column 'picture' (image=picture) in split 'train'; its columns: img, label"),
    ("colours", ["--hf-columns", "image:img"], "--hf-columns 'image:img': give image=COL,label=COL"),
    ("colours", ["--hf-columns", "image=img"], "--hf-columns 'image=img': give image=COL,label=COL"),
    ("colours", ["--paper", "gpt", "--hf-columns", "text=label"],
     "column 'label' (text) of split 'train' is ClassLabel"),
    ("text", ["--paper", "gpt", "--hf-columns", "text=body"],
     "has no column 'body' (text=body) in split 'train'; its columns: text"),
    ("colours", ["--paper", "gpt"], "gpt reads tokens inputs but dataset hf:"),
    ("colours", ["--paper", "vit"], "needs --image-size N"),
    ("colours", ["--download"], "--download does not apply to hf:"),
    ("digits", ["--hf-split", "train"], "--hf-split and --hf-columns choose the splits and columns of a Hugging Face"),
])
def test_a_mistake_is_one_line_exit_2_and_writes_nothing(dataset, flags, words, data, tmp_path, capsys):
    from train import main

    name = dataset if dataset == "digits" else "hf:" + (str(data / dataset) if (data / dataset).exists() else dataset)
    paper = [] if "--paper" in flags else ["--paper", "lenet"]
    assert main([*paper, "--dataset", name, *flags, "--out", str(tmp_path / "run"), *QUIET]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not (tmp_path / "run").exists()


def test_the_trainer_imports_neither_datasets_nor_this_module():
    code = "import sys, train, common.trainer, common.config; print({'datasets', 'common.data.hf'} & set(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "set()"
