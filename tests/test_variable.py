"""Variable-size batches: pad-and-mask collation, size bucketing, and models whose answer for a
sample does not depend on what it was batched with."""

import math

import pytest
import torch

from common.data import DATASETS, get_dataset, train_loader
from common.data.collate import element_counts, pad_images, pad_sequences
from common.data.samplers import BucketBatchSampler
from common.export import randomize
from common.tasks import call
from papers import get_paper, list_papers
from tests.conftest import bitwise_equal, interrupted_copy, load_json, max_difference, torchrun, weights
from train import main

pytestmark = pytest.mark.slow  # processes launched or runs trained: left out of `-m "not slow"`


def test_images_are_padded_bottom_right_with_a_mask():
    samples = [(torch.ones(1, 5, 7), torch.tensor(3)), (2 * torch.ones(1, 9, 4), torch.tensor(1))]
    inputs, targets = pad_images(samples, pad_multiple=4)
    assert inputs["images"].shape == (2, 1, 12, 8) and inputs["mask"].shape == (2, 12, 8)
    assert inputs["mask"][0, :5, :7].all() and inputs["mask"][0].sum() == 35 and inputs["mask"][1].sum() == 36
    assert inputs["images"][0, 0, 5:].abs().sum() == 0 and inputs["images"][1, 0, :9, :4].eq(2).all()
    assert targets.tolist() == [3, 1]
    assert element_counts(inputs) == (71, 2 * 96)


def test_sequences_are_padded_at_the_end_with_lengths_and_a_mask():
    inputs, _ = pad_sequences([(torch.ones(3, 2), torch.tensor(1.0)), (torch.ones(6, 2), torch.tensor(0.5))],
                              pad_multiple=4)
    assert inputs["x"].shape == (2, 8, 2) and inputs["lengths"].tolist() == [3, 6]
    assert inputs["mask"].tolist() == [[True] * 3 + [False] * 5, [True] * 6 + [False] * 2]
    assert inputs["x"][0, 3:].abs().sum() == 0


# ---------------------------------------------------------------- bucketing


def bucket(sizes, rank=0, world_size=1, micro=None, B=8, seed=0):
    return BucketBatchSampler(sizes, B, micro or B // world_size, rank, world_size, seed)


def test_bucketing_is_deterministic_groups_sizes_and_reshuffles_each_epoch():
    sizes = [int(s) for s in torch.randint(1, 100, (203,), generator=torch.Generator().manual_seed(0))]
    a, b = bucket(sizes), bucket(sizes)
    assert list(a) == list(b)
    batches = list(a)
    assert len(batches) == 203 // 8 and all(len(batch) == 8 for batch in batches)
    spread = sum(max(sizes[i] for i in batch) - min(sizes[i] for i in batch) for batch in batches) / len(batches)
    assert spread < 10, "a batch holds samples of similar size"
    a.set_epoch(1)
    assert sorted(map(tuple, a)) != sorted(map(tuple, batches)) or list(a) != batches
    assert list(a) != batches, "a new order every epoch"


def test_ranks_share_every_global_batch_and_have_as_many_batches():
    sizes = [(h, h) for h in torch.randint(16, 49, (301,), generator=torch.Generator().manual_seed(1)).tolist()]
    single = list(bucket(sizes, B=12))
    ranks = [list(bucket(sizes, rank=r, world_size=2, micro=3, B=12)) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == 2 * len(single), "no rank waits for another at an epoch's end"
    for k, batch in enumerate(single):
        together = ranks[0][2 * k] + ranks[0][2 * k + 1] + ranks[1][2 * k] + ranks[1][2 * k + 1]
        assert sorted(together) == sorted(batch)


def test_bucketing_starts_part_way_through_an_epoch():
    sizes = list(range(100))
    whole = bucket(sizes)
    whole.set_epoch(2)
    part = bucket(sizes)
    part.set_epoch(2, start=3 * 8)
    assert list(part) == list(whole)[3:] and len(part) == len(whole) - 3


def epoch_waste(dataset: str, bucketing: str, B: int = 64) -> float:
    spec = get_dataset(dataset)
    train, _ = spec.load()
    loader = train_loader(train, B, B, 0, 1, seed=0, collate=spec.collate(1), bucketing=bucketing)
    loader.epoch_sampler.set_epoch(0)
    valid, total = map(sum, zip(*(element_counts(x) for x, _ in loader)))
    return 1 - valid / total


def test_bucketing_cuts_the_padding_of_digits_canvas_below_a_tenth():
    assert epoch_waste("digits-canvas", "size") <= 0.10 < 0.3 < epoch_waste("digits-canvas", "none")


# ---------------------------------------------------------------- models read the masks

# one built-in data set per kind of input, and one for detection (whose models read boxes' images)
VARIABLE = {(d.inputs, d.task == "detection"): name for name, d in reversed(DATASETS.items())
            if d.variable_size and not d.reads_folder}
PADDED = [name for name in list_papers() if get_paper(name).padded_batches]  # the papers that opt in


@pytest.mark.parametrize("name", PADDED)
def test_a_sample_gives_the_same_output_alone_and_in_a_padded_batch(name):
    spec = get_paper(name)
    # a segmentation paper on its own canvases (read from Debian's Fashion-MNIST files, so not in VARIABLE)
    data = get_dataset(spec.defaults["dataset"] if spec.task == "segmentation" else
                       VARIABLE[spec.inputs, spec.task == "detection"])
    torch.manual_seed(0)
    model = spec.build_for_data("tiny", data.facts()).eval()
    if spec.task == "segmentation":  # every weight perturbed: FCN's score layers start at zero, its scores with them
        randomize(model)
    _, test = data.load()
    picked, seen = [], set()
    for i in range(len(test)):  # four samples of four different sizes
        if test.sizes[i] not in seen:
            seen.add(test.sizes[i])
            picked.append(test[i])
        if len(picked) == 4:
            break
    inputs, _ = data.collate(math.lcm(4, getattr(model, "input_multiple", 1)))(picked)
    # a segmentation model's scores (B, K, H, W), read as torchvision's dict of them
    scored = (lambda out: {"out": out} if torch.is_tensor(out) else out) if spec.task == "segmentation" else None
    with torch.no_grad():
        together = call(model, inputs) if scored is None else scored(call(model, inputs))
        for k, (x, _) in enumerate(picked):
            if spec.inputs == "pairs" or isinstance(x, dict):  # a batch of one sample, unpadded: a pair's logits
                # over its own target; each head's outputs of a sample of several inputs (BERT's ids and segments)
                alone = call(model, data.collate()([picked[k]])[0])
                heads = lambda out: out if isinstance(out, tuple) else (out,)
                for t, a in zip(heads(together), heads(alone)):
                    assert (t[k, :a.shape[1]] - a[0]).abs().max() < 1e-5, (name, k)
                continue
            alone = model(x[None]) if scored is None else scored(model(x[None]))  # unpadded, no mask
            if isinstance(alone, dict):  # a segmentation model's scores of every pixel (and an auxiliary head's)
                for key, scores in alone.items():
                    got, largest = together[key][k, :, :x.shape[1], :x.shape[2]], scores.abs().max()
                    assert (got - scores[0]).abs().max() < 1e-5 * max(1.0, largest) and scores.std() > 0, (name, key)
            elif isinstance(alone[0], dict):  # one dict of detections per image
                same_detections(alone[0], together[k], atol=1e-5)
            else:
                assert (together[k] - alone[0]).abs().max() < 1e-5, (name, k, x.shape)


def same_detections(a: dict, b: dict, atol: float, top: int = 30) -> None:
    """The best `top` detections of one image, given twice: the same scores, and the same boxes and
    labels wherever the order is unambiguous (an untrained detector's near-equal scores may swap
    places by a rounding error, which says nothing about padding)."""
    n = min(top, len(a["scores"]), len(b["scores"]))
    assert n > 0 and torch.allclose(a["scores"][:n], b["scores"][:n], rtol=0, atol=atol)
    gaps = a["scores"][:n + 1].diff().abs()  # to the next detection
    clear = torch.ones(n, dtype=torch.bool)
    clear[: len(gaps)] &= gaps[:n] > 10 * atol
    clear[1:] &= gaps[: n - 1] > 10 * atol  # to the previous one (an untrained detector may tie everywhere:
    # then the scores alone are compared here, and the paper's own test spreads its weights to compare boxes)
    for key in ("boxes", "labels"):
        assert torch.allclose(a[key][:n][clear].float(), b[key][:n][clear].float(), rtol=0, atol=1e-3), key


# ---------------------------------------------------------------- in training

ADDING = ["--paper", "lstm", "--dataset", "adding", "--flavor", "exp4-adding", "--label-smoothing", "0",
          "--wandb", "disabled"]


def test_two_processes_end_an_uneven_bucketed_epoch_and_match_one_process(tmp_path):
    """10,000 sequences in global batches of 48 leave 16 over: both ranks still end the epoch together."""
    flags = ADDING + ["--bucketing", "size", "--batch-size", "48", "--epochs", "1", "--pad-multiple", "4"]
    torchrun(flags + ["--out", str(tmp_path / "ddp")], cwd=tmp_path, timeout=120)
    assert main(flags + ["--out", str(tmp_path / "single")]) == 0
    ddp, single = (load_json(tmp_path / n / "result.json") for n in ("ddp", "single"))
    assert ddp["steps"] == single["steps"] == 10_000 // 48
    assert ddp["padding_waste"] <= single["padding_waste"] < 0.1  # each rank pads only its own share
    assert max_difference(weights(tmp_path / "ddp"), weights(tmp_path / "single")) < 1e-4


def test_a_bucketed_run_resumed_mid_epoch_sees_the_same_batches(tmp_path):
    flags = ADDING + ["--bucketing", "size", "--max-steps", "30", "--ckpt-every", "7", "--keep-ckpts", "10"]
    assert main(flags + ["--out", str(tmp_path / "run")]) == 0
    resumed = interrupted_copy(tmp_path / "run", 14, tmp_path / "resumed")
    assert main(["--resume", str(resumed)]) == 0
    assert bitwise_equal(weights(resumed), weights(tmp_path / "run"))


def test_padding_waste_is_recorded_and_bucketing_lowers_it(tmp_path):
    for bucketing in ("none", "size"):
        assert main(ADDING + ["--bucketing", bucketing, "--max-steps", "20", "--out", str(tmp_path / bucketing)]) == 0
    none, size = (load_json(tmp_path / b / "result.json")["padding_waste"] for b in ("none", "size"))
    assert 0 <= size < none / 3 and none > 0.1
    assert load_json(tmp_path / "size" / "result.json")["bucketing"] == "size"


def test_digits_canvas_resized_by_image_size_is_a_data_set_of_one_size():
    """--image-size N: every canvas resized to N x N, stacked without a mask, for papers of one size."""
    spec = get_dataset("digits-canvas")
    assert spec.is_variable() and not spec.is_variable(image_size=20)
    train, _ = spec.load(image_size=20)
    inputs, targets = spec.collate(4, image_size=20)([train[i] for i in range(5)])
    assert torch.is_tensor(inputs) and inputs.shape == (5, 1, 20, 20) and targets.shape == (5,)
    assert not hasattr(train, "sizes") and spec.facts(image_size=20) == dict(num_classes=10, in_chans=1, img_size=20)
    canvas, _ = spec.load()
    assert torch.equal(canvas.labels, train.tensors[1]), "the same images, in the same order"
