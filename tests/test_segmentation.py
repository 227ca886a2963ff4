"""Semantic segmentation: the task's loss and metrics (padded batches score as their images one at a time),
the fashion-canvas data set, a user's segfolder and its refusals, the leaderboard, and prediction drawn
over an image."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from common import leaderboard
from common.export import randomize
from common.data import canvas, get_dataset, segfolder
from common.data.collate import IGNORE_INDEX, pad_segmentation
from common.tasks import get_task
from papers import get_paper, list_papers
from tests.conftest import need_files, refused

SEGMENTATION = [name for name in list_papers() if get_paper(name).task == "segmentation"]
FASHION = "/usr/share/datasets/fashion-mnist"
GET_THEM = "apt-get install -y dataset-fashion-mnist"


# ---------------------------------------------------------------- the task


def test_the_loss_is_the_cross_entropy_of_the_labelled_pixels_with_the_aux_head_at_half():
    torch.manual_seed(0)
    task = get_task("segmentation", {"num_classes": 4})
    scores, aux = torch.randn(2, 4, 5, 6), torch.randn(2, 4, 5, 6)
    labels = torch.randint(0, 4, (2, 5, 6))
    labels[0, :2] = IGNORE_INDEX  # void, or padding
    labelled = labels != IGNORE_INDEX
    expected = F.cross_entropy(scores.permute(0, 2, 3, 1)[labelled], labels[labelled])
    assert torch.allclose(task.loss(scores, {"labels": labels}), expected)
    expected_aux = F.cross_entropy(aux.permute(0, 2, 3, 1)[labelled], labels[labelled])
    assert torch.allclose(task.loss({"out": scores, "aux": aux}, {"labels": labels}), expected + expected_aux / 2)
    weights = torch.rand(2, 5, 6) * 3  # per-pixel weights (U-Net's), where a data set gives them
    each = F.cross_entropy(scores, labels.masked_fill(~labelled, 0), reduction="none")[labelled]
    assert torch.allclose(task.loss(scores, {"labels": labels, "weights": weights}), (each * weights[labelled]).mean())


def test_mean_iou_per_class_iou_and_pixel_accuracy_are_the_papers_on_the_labelled_pixels():
    """Long et al.'s Section 4: n_ij pixels of class i predicted j, t_i = sum_j n_ij; pixel accuracy
    sum_i n_ii / sum_i t_i, IU_i = n_ii / (t_i + sum_j n_ji - n_ii), mean IU over the classes present."""
    torch.manual_seed(0)
    K = 5
    task = get_task("segmentation", {"num_classes": K, "classes": ["background", "T-shirt/top", "b", "c", "d"]})
    labels = torch.randint(0, K - 1, (3, 7, 9))  # class 4 never present ...
    labels[1, 3:] = IGNORE_INDEX
    scores = torch.randn(3, K, 7, 9)
    scores[:, 4] = -10  # ... nor predicted: no IU for it
    metrics = task.build_metrics(torch.device("cpu"))
    task.update(metrics, scores, {"labels": labels})
    got = task.compute(metrics)
    keep = labels != IGNORE_INDEX
    t, p = labels[keep], scores.argmax(1)[keep]
    n = torch.zeros(K, K, dtype=torch.float64)
    n.index_put_((t, p), torch.ones(len(t), dtype=torch.float64), accumulate=True)  # n_ij
    iu = n.diag() / (n.sum(1) + n.sum(0) - n.diag())
    assert got["pixel_accuracy"] == pytest.approx(float(n.diag().sum() / n.sum()), abs=1e-6)
    assert got["mean_iou"] == pytest.approx(float(iu[:4].mean()), abs=1e-6)
    assert [k for k in got if k.startswith("iou_")] == ["iou_background", "iou_t_shirt_top", "iou_b", "iou_c"]
    assert got["iou_t_shirt_top"] == pytest.approx(float(iu[1]), abs=1e-6)
    expected_loss = F.cross_entropy(scores.permute(0, 2, 3, 1)[keep], t)
    assert got["loss"] == pytest.approx(float(expected_loss), rel=1e-6)
    assert task.metric == "mean_iou" and task.higher_is_better


def canvases_of_different_sizes(n: int = 5):
    """Test canvases of n different sizes, from a small set drawn from Fashion-MNIST's test split."""
    need_files(FASHION, GET_THEM)
    flat = canvas.generate(*canvas.fashion_items(None, train=False), count=40, seed=5)
    data, picked, seen = canvas.FashionCanvas(flat), [], set()
    for i in range(len(data)):
        if data.sizes[i] not in seen:
            seen.add(data.sizes[i])
            picked.append(data[i])
    assert len(picked) >= n
    return picked[:n]


@pytest.mark.parametrize("paper", SEGMENTATION)
def test_a_padded_batch_of_canvases_scores_as_its_canvases_one_at_a_time(paper):
    """What a user relies on to compare runs: evaluation pads images of different sizes into one batch, and
    the mean IoU, per-class IoU and pixel accuracy are those of the images evaluated one at a time."""
    picked = canvases_of_different_sizes()
    spec, data = get_paper(paper), get_dataset("fashion-canvas")
    torch.manual_seed(0)
    model = randomize(spec.build_for_data("tiny", data.facts())).eval()  # score layers start at zero: not here
    task = get_task("segmentation", data.facts())
    inputs, targets = pad_segmentation(picked, pad_multiple=8)
    assert not inputs["mask"].all() and (targets["labels"][~inputs["mask"]] == IGNORE_INDEX).all()
    together, alone = task.build_metrics(torch.device("cpu")), task.build_metrics(torch.device("cpu"))
    with torch.no_grad():
        task.update(together, task.forward(model, inputs, targets), targets)
        for image, target in picked:
            task.update(alone, model(image[None]), {k: v[None] for k, v in target.items()})
    padded, one_at_a_time = task.compute(together), task.compute(alone)
    assert padded.keys() == one_at_a_time.keys() and 0 < padded["pixel_accuracy"] < 1
    assert sum(k.startswith("iou_") for k in padded) > 3, "predictions of several classes"
    for key, value in one_at_a_time.items():
        assert padded[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key  # counts equal; the loss summed otherwise


# ---------------------------------------------------------------- fashion-canvas


@pytest.fixture(scope="module")
def test_items():
    need_files(FASHION, GET_THEM)
    return canvas.fashion_items(None, train=False)


def test_canvases_are_fixed_by_their_seed(test_items):
    a, b, c = (canvas.generate(*test_items, count=30, seed=s) for s in (3, 3, 4))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["sizes"], c["sizes"]) or not np.array_equal(a["pixels"], c["pixels"])


def neighbours_differ(ids: np.ndarray) -> np.ndarray:
    """(H, W) bool: a pixel with an 8-neighbour of another id (within the canvas)."""
    H, W = ids.shape
    padded = np.pad(ids, 1, mode="edge")
    return np.any([padded[1 + dy:1 + dy + H, 1 + dx:1 + dx + W] != ids
                   for dy in (-1, 0, 1) for dx in (-1, 0, 1)], axis=0)


def test_a_canvas_shows_real_items_with_their_classes_instances_and_a_void_band_at_every_border(test_items):
    """Each item's visible pixels are its own, at its place; its instance id and its class (1 + Fashion-
    MNIST's) on them, void exactly where another id (item or background) is next to a pixel; items touch and
    hide parts of each other, none more than half."""
    items, classes = test_items
    rng, touching, overlapping, sides = np.random.default_rng(0), 0, 0, set()
    for _ in range(200):
        pixels, labels, instances, placed = canvas.draw(items, classes, rng)
        sides |= set(pixels.shape)
        band = neighbours_differ(instances)
        assert ((labels == IGNORE_INDEX) == band).all()
        assert (labels[~band & (instances == 0)] == 0).all() and ((pixels > 0) == (instances > 0)).all()
        for i, (k, top, left) in enumerate(placed, start=1):
            mine = instances == i
            window = (slice(top, top + 28), slice(left, left + 28))
            assert mine[window].sum() == mine.sum() >= canvas.MIN_VISIBLE * (items[k] > 0).sum()
            assert np.array_equal(pixels[window][mine[window]], items[k][mine[window]])
            assert (labels[mine & ~band] == 1 + classes[k]).all()
            overlapping += mine.sum() < (items[k] > 0).sum()
        pairs = {(a, b) for a, b in zip(instances[:, :-1].ravel(), instances[:, 1:].ravel()) if a and b and a != b}
        touching += bool(pairs)
    assert sides == set(canvas.SIDES) and touching > 20 and overlapping > 20, (touching, overlapping)


def test_the_test_canvases_are_drawn_from_the_test_split(test_items, tmp_path, monkeypatch):
    monkeypatch.setenv("PAPER_STUDY_CACHE", str(tmp_path))
    monkeypatch.setattr(canvas, "TEST_SIZE", 20)
    monkeypatch.setattr(canvas, "TRAIN_SIZE", 20)
    canvas.load.cache_clear()
    try:
        train, test = canvas.load()
    finally:
        canvas.load.cache_clear()
    expected = canvas.FashionCanvas(canvas.generate(*test_items, count=20, seed=canvas.SEEDS["test"]))
    assert test.sizes == expected.sizes and all(torch.equal(test[i][0], expected[i][0]) for i in range(20))
    assert train.sizes != test.sizes


def test_the_canvases_are_made_once_and_read_from_the_cache(test_items, tmp_path, monkeypatch):
    monkeypatch.setenv("PAPER_STUDY_CACHE", str(tmp_path))
    first = canvas.canvases(None, "test", 25)
    [path] = tmp_path.glob("fashion-canvas-*-test-*-25.npz")
    monkeypatch.setattr(canvas, "generate", lambda *a: pytest.fail("drawn again"))
    again = canvas.canvases(None, "test", 25)
    assert again.sizes == first.sizes and all(torch.equal(a, b) for x, y in zip(first.maps, again.maps)
                                              for a, b in zip(x.values(), y.values()))
    assert path.stat().st_size > 0


def test_fashion_canvas_names_its_classes_and_batches_with_the_padding_ignored():
    need_files(FASHION, GET_THEM)
    data = get_dataset("fashion-canvas")
    facts = data.facts()
    assert facts["num_classes"] == 11 and facts["classes"][0] == "background" and facts["in_chans"] == 1
    assert data.task == "segmentation" and data.variable_size and data.preprocess()["labels"] == facts["classes"]
    train, test = data.load()
    assert (len(train), len(test)) == (canvas.TRAIN_SIZE, canvas.TEST_SIZE)
    inputs, targets = data.collate(pad_multiple=4)([train[0], train[1], train[2]])
    assert set(targets) == {"labels", "instances"} and targets["labels"].shape == inputs["mask"].shape
    assert inputs["images"].shape[2] % 4 == 0 and (targets["instances"][~inputs["mask"]] == 0).all()


# ---------------------------------------------------------------- segfolder


def write_folder(root, sizes=((20, 30), (24, 18), (16, 16), (30, 22), (18, 26)), classes=("background", "cat", "dog"),
                 mode="P"):
    """Images and masks (a palette or grayscale PNG of class indices, 255 on a border) of the given sizes."""
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    (root / "classes.txt").write_text("\n".join(classes) + "\n")
    rng = np.random.default_rng(0)
    masks = {}
    for i, (h, w) in enumerate(sizes):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / "images" / f"im{i}.jpg")
        mask = rng.integers(0, len(classes), (h, w)).astype(np.uint8)
        mask[0] = IGNORE_INDEX
        picture = Image.fromarray(mask, mode="L")
        if mode == "P":
            picture = picture.convert("P")
            picture.putpalette([v for k in range(256) for v in (k, 255 - k, k // 2)])
        picture.save(root / "masks" / f"im{i}.png")
        masks[f"im{i}"] = mask
    return masks


@pytest.mark.parametrize("mode", ["P", "L"])
def test_a_segfolder_reads_each_image_with_its_masks_indices(tmp_path, mode):
    masks = write_folder(tmp_path, mode=mode)
    data = get_dataset("segfolder")
    facts = data.facts(data_dir=str(tmp_path))
    assert facts == dict(num_classes=3, in_chans=3, img_size=224, classes=["background", "cat", "dog"])
    train, test = data.read(data_dir=str(tmp_path))
    assert (len(train), len(test)) == (4, 1)
    for split in (train, test):
        for i in range(len(split)):
            image, target = split[i]
            name = split.dataset.pairs[split.indices[i]][0].stem
            assert torch.equal(target["labels"], torch.from_numpy(masks[name]).long())
            assert image.shape == (3, *masks[name].shape) and split.sizes[i] == masks[name].shape


def test_a_segfolder_with_train_and_test_folders_keeps_them(tmp_path):
    write_folder(tmp_path / "train")
    write_folder(tmp_path / "test", sizes=((12, 14),))
    (tmp_path / "train" / "classes.txt").rename(tmp_path / "classes.txt")
    train, test = get_dataset("segfolder").read(data_dir=str(tmp_path))
    assert (len(train), len(test)) == (5, 1) and test.sizes == [(12, 14)]


def spoil(root, what: str) -> str:
    """Break one file of a good folder; the part of the error line that names it."""
    mask = root / "masks" / "im2.png"
    if what == "size":
        Image.fromarray(np.zeros((17, 16), dtype=np.uint8)).save(mask)
        return f"{mask} is 16x17, its image {root / 'images' / 'im2.jpg'} 16x16; a mask has its image's size"
    if what == "missing":
        mask.unlink()
        return f"{root / 'images' / 'im2.jpg'} has no mask {mask}"
    if what == "index":
        Image.fromarray(np.full((16, 16), 7, dtype=np.uint8)).save(mask)
        return f"{mask} holds index 7, beyond the 3 classes of classes.txt (0 to 2, and 255 for void)"
    Image.fromarray(np.zeros((16, 16, 3), dtype=np.uint8)).save(mask)
    return f"{mask} is a RGB image; a mask holds class indices, as a palette (P) or grayscale (L) PNG"


@pytest.mark.parametrize("what", ["size", "missing", "index", "rgb"])
def test_a_bad_mask_is_one_line_naming_the_file_before_anything_trains(tmp_path, capsys, what):
    write_folder(tmp_path / "data")
    says = spoil(tmp_path / "data", what)
    err = refused(capsys, ["--paper", "fcn", "--dataset", "segfolder", "--data-dir", str(tmp_path / "data"),
                           "--out", str(tmp_path / "run"), "--wandb", "disabled"])
    assert err == f"train.py: error: --dataset segfolder: {says}"
    assert not (tmp_path / "run").exists()


def test_a_segfolder_without_classes_is_one_line_saying_what_it_needs(tmp_path, capsys):
    err = refused(capsys, ["--paper", "fcn", "--dataset", "segfolder", "--data-dir", str(tmp_path)])
    assert err.startswith(f"train.py: error: --dataset segfolder: {tmp_path} has no classes.txt; it needs "
                          f"DIR/classes.txt")


# ---------------------------------------------------------------- the leaderboard


def test_the_leaderboard_ranks_segmentation_runs_by_mean_iou_with_pixel_accuracy_beside():
    def run(run_id, mean_iou, accuracy):
        return {"run_id": run_id, "paper": "fcn", "flavor": "tiny", "dataset": "fashion-canvas", "task": "segmentation",
                "metric": "mean_iou", "higher_is_better": True, "final": mean_iou, "params": 441_000,
                "final_metrics": {"mean_iou": mean_iou, "pixel_accuracy": accuracy}, "strategy": "ddp",
                "world_size": 2, "precision": "fp32", "compile": False, "samples_per_s": 10.0, "wall_s": 60.0,
                "finished_at": "2026-12-04T00:00:00+00:00", "commit": "abcdef1234", "config": {"paper": "fcn"}}

    tables = leaderboard.rank([run("a", 0.41, 0.95), run("b", 0.63, 0.90), run("c", 0.52, 0.97)])
    assert [r["run_id"] for r in tables["segmentation", "fashion-canvas"]] == ["b", "c", "a"]
    text = leaderboard.render(tables, "markdown")
    assert "mean_iou 0.63, pixel accuracy 0.9" in text and "higher is better" in text


# ---------------------------------------------------------------- prediction


def test_predict_paints_a_runs_classes_over_the_image(tmp_path, capsys):
    """A finished run (weights saved as a run leaves them) paints each pixel's class; the classes are the
    model's own on the image alone, and the line gives their share."""
    from common import predict
    from common.tracking import write_json
    from safetensors.torch import save_file

    need_files(FASHION, GET_THEM)
    spec, data = get_paper("fcn"), get_dataset("fashion-canvas")
    torch.manual_seed(0)
    model = spec.build_for_data("tiny", data.facts()).eval()
    with torch.no_grad():  # scores that vary over the image: the score layers start at zero
        for layer in (model.score_fr, model.score_pool4, model.score_pool3):
            layer.weight.normal_(0, 0.5)
    run = tmp_path / "run"
    run.mkdir()
    write_json(run / "config.json", {"paper": "fcn", "dataset": "fashion-canvas", "flavor": "tiny"})
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, run / "model.safetensors")
    image = Image.fromarray(canvas.draw(*canvas.fashion_items(None, False), np.random.default_rng(3))[0])
    image.save(tmp_path / "canvas.png")
    assert predict.main(["--run", str(run), str(tmp_path / "canvas.png"), "--out", str(tmp_path / "drawn")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == f"drew them into {tmp_path / 'drawn'}/" and lines[0].startswith(f"{tmp_path / 'canvas.png'}: ")
    x = torch.from_numpy(predict.prepare(image, data.preprocess()))
    with torch.no_grad():
        expected = model(x[None])["out"][0].argmax(0).numpy()
    names, [labels] = predict.segment(run, [tmp_path / "canvas.png"], tmp_path / "again")
    assert np.array_equal(labels, expected) and len(np.unique(labels)) > 1
    assert lines[0].endswith(predict.coverage(labels, names))
    drawn = Image.open(tmp_path / "drawn" / "canvas.png")
    zoom = drawn.width // image.width
    assert zoom >= 2 and drawn.height >= zoom * image.height
    painted = np.asarray(drawn.convert("RGB"))[::zoom, ::zoom][:image.height]
    colours = predict.palette(len(names))
    grey = np.asarray(image.convert("RGB"), dtype=np.float32)
    expected_paint = np.where((labels > 0)[..., None], (grey + colours[labels]) / 2, grey).round()
    assert np.array_equal(painted, expected_paint.astype(np.uint8))


def test_the_result_of_a_segmentation_run_names_its_metrics(tmp_path):
    """result.json's final_metrics: mean IoU, pixel accuracy, the loss, and an IoU per class present."""
    task = get_task("segmentation", {"num_classes": 3, "classes": ["background", "Ankle boot", "T-shirt/top"]})
    metrics = task.build_metrics(torch.device("cpu"))
    task.update(metrics, torch.eye(3)[torch.tensor([[0, 1], [2, 2]])].permute(2, 0, 1)[None],
                {"labels": torch.tensor([[[0, 1], [2, 1]]])})
    got = task.compute(metrics)
    assert json.loads(json.dumps(got)) == got
    assert got == pytest.approx({"mean_iou": (1 + 1 / 2 + 1 / 2) / 3, "pixel_accuracy": 0.75,
                                 "loss": got["loss"], "iou_background": 1.0, "iou_ankle_boot": 0.5,
                                 "iou_t_shirt_top": 0.5})


# ---------------------------------------------------------------- what a segmentation paper's spec may add


def test_a_papers_pixel_weights_reach_its_training_loss(tmp_path, monkeypatch):
    """PaperSpec.pixel_weights (U-Net's weight map, computed from a sample's labels and instances) weighs
    each pixel of the training loss: weights of zero leave a loss of 0 and the weights where they were."""
    import dataclasses

    import papers
    from safetensors.torch import load_file

    from train import main

    need_files(FASHION, GET_THEM)
    seen = []

    def nothing(target: dict) -> torch.Tensor:
        seen.append(set(target))
        return torch.zeros(target["labels"].shape)

    spec = dataclasses.replace(get_paper("fcn"), name="fcn-weighted", pixel_weights=nothing)
    monkeypatch.setitem(papers._PAPERS, "fcn-weighted", spec)
    run = tmp_path / "run"
    assert main(["--paper", "fcn-weighted", "--max-steps", "2", "--batch-size", "4", "--train-fraction", "0.002",
                 "--eval-samples", "4", "--weight-decay", "0", "--warmup-steps", "0", "--wandb", "disabled",
                 "--out", str(run), "--results-dir", str(tmp_path / "results")]) == 0
    losses = [json.loads(line)["train/loss"] for line in (run / "metrics.jsonl").read_text().splitlines()
              if "train/loss" in line]
    assert losses and all(loss == 0 for loss in losses)
    assert {"labels", "instances"} in seen
    torch.manual_seed(0)
    fresh = spec.build_for_data("tiny", get_dataset("fashion-canvas").facts())
    trained = load_file(run / "model.safetensors")
    assert all(torch.equal(trained[k], v) for k, v in fresh.state_dict().items())


def test_a_paper_of_another_task_is_one_line(capsys):
    assert refused(capsys, ["--paper", "resnet", "--dataset", "fashion-canvas"]) == (
        "train.py: error: resnet is a classification model, and fashion-canvas a segmentation data set; train it "
        "on a classification data set (digits, digits-canvas, wds, shapes, cifar10, mnist, fashion-mnist, imagefolder)")
    assert refused(capsys, ["--paper", "fcn", "--dataset", "digits-canvas"]) == (
        "train.py: error: fcn is a segmentation model, and digits-canvas a classification data set; train it on a "
        "segmentation data set (fashion-canvas, segfolder)")
