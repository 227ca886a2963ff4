"""Detection data and scoring: the built-in digits-detect canvases, COCO-format folders, the
detection task's COCO mAP (cross-checked against pycocotools) and common.evaluate's COCO files."""

import contextlib
import io
import json
from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image

from common.data import detect, digits, get_dataset
from common.data.coco import load as load_coco
from common.errors import ConfigError
from common.evaluate import ap_by_area, coco_ground_truth, coco_results
from common.tasks import get_task


def test_digits_detect_canvases_vary_in_size_and_hold_0_to_6_digits_with_tight_boxes():
    data = get_dataset("digits-detect")
    train, test = data.read()
    assert (len(train), len(test)) == (detect.TRAIN_SIZE, detect.TEST_SIZE) and len(train) >= 5000
    assert data.task == "detection" and data.is_variable() and data.facts()["num_classes"] == 10
    sizes = set(train.sizes)
    assert len(sizes) > 20 and sum(h != w for h, w in train.sizes) > len(train) / 2, "most canvases are not square"
    counts = [len(t["labels"]) for t in train.targets]
    assert min(counts) == 0 and max(counts) == detect.MAX_DIGITS and 0.02 < counts.count(0) / len(counts) < 0.1
    for i in range(0, len(train), 97):
        image, target = train[i]
        H, W = image.shape[1:]
        assert image.shape[0] == 3 and (H, W) == train.sizes[i] and 0 <= image.min() and image.max() <= 1
        boxes = target["boxes"]
        assert boxes.dtype == torch.float32 and target["labels"].dtype == torch.int64
        assert ((boxes[:, 0] >= 0) & (boxes[:, 1] >= 0) & (boxes[:, 2] <= W) & (boxes[:, 3] <= H)).all()
        assert ((boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])).all()
        for x1, y1, x2, y2 in boxes.int().tolist():  # tight: ink on each edge row and column
            ink = image[0, y1:y2, x1:x2] > detect.INK
            assert ink[0].any() and ink[-1].any() and ink[:, 0].any() and ink[:, -1].any()
    sides = torch.cat([t["boxes"][:, 2:] - t["boxes"][:, :2] for t in train.targets])
    assert sides.max() <= 32 and sides.max(dim=1).values.min() >= 4


def test_digits_detect_is_fixed_and_its_test_canvases_use_the_test_digits():
    x_train, x_test, y_train, y_test = digits.split_digits()
    glyphs = torch.from_numpy(x_test).float() / 16
    a = detect.DigitsDetect(glyphs, torch.from_numpy(y_test), 50, detect.SEEDS["test"])
    _, test = get_dataset("digits-detect").read()
    for i in range(50):
        assert torch.equal(a[i][0], test[i][0]) and torch.equal(a[i][1]["boxes"], test[i][1]["boxes"])


def write_coco(folder, annotations=None, categories=None, n_images=10):
    """A small COCO-format folder: n_images 40x30 images and one box each."""
    folder.mkdir(parents=True, exist_ok=True)
    images = []
    for i in range(1, n_images + 1):
        Image.new("RGB", (40, 30), (i * 20, 0, 0)).save(folder / f"im{i}.png")
        images.append({"id": i, "file_name": f"im{i}.png", "width": 40, "height": 30})
    if annotations is None:
        annotations = [{"id": i, "image_id": i, "category_id": 7 if i % 2 else 3, "bbox": [2, 3, 10, 20], "area": 200,
                        "iscrowd": 0} for i in range(1, n_images + 1)]
    categories = categories or [{"id": 7, "name": "cat"}, {"id": 3, "name": "dog"}]
    (folder / "instances.json").write_text(json.dumps({"images": images, "annotations": annotations,
                                                       "categories": categories}))
    return folder


def test_a_coco_folder_gives_images_and_boxes_with_labels_in_category_order(tmp_path):
    folder = write_coco(tmp_path / "coco")
    data = get_dataset("coco")
    assert data.facts(data_dir=str(folder))["num_classes"] == 2
    train, test = data.read(data_dir=str(folder))
    assert (len(train), len(test)) == (8, 2) and not set(train.ids) & set(test.ids)
    image, target = train[0]
    assert image.shape == (3, 30, 40) and train.sizes[0] == (30, 40)
    assert target["boxes"].tolist() == [[2, 3, 12, 23]]  # x, y, w, h -> x1, y1, x2, y2
    image_id = train.ids[0]
    assert target["labels"].tolist() == [0 if image_id % 2 == 0 else 1]  # category 3 is label 0, 7 is label 1
    assert data.preprocess(data_dir=str(folder))["labels"] == ["dog", "cat"]


@pytest.mark.parametrize("bad, says", [
    (dict(bbox=[35, 3, 10, 20]), "lies outside its 40x30 image"),
    (dict(bbox=[2, 3, -1, 20]), "negative width or height"),
    (dict(category_id=99), "has category 99, which 'categories' does not list"),
])
def test_a_bad_coco_annotation_is_one_line_naming_the_file_and_the_annotation(tmp_path, capsys, bad, says):
    from train import main

    annotations = [{"id": 1, "image_id": 1, "category_id": 7, "bbox": [2, 3, 10, 20]},
                   {"id": 2, "image_id": 2, "category_id": 7, "bbox": [2, 3, 10, 20]} | bad]
    folder = write_coco(tmp_path / "coco", annotations=annotations)
    with pytest.raises(ConfigError, match=f"instances.json: annotation 2 \\(image 2\\) .*{says}"):
        load_coco(data_dir=str(folder))
    assert main(["--paper", "faster_rcnn", "--dataset", "coco", "--data-dir", str(folder), "--max-steps", "1",
                 "--wandb", "disabled", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "annotation 2" in err[0] and says in err[0]


def random_case(seed: int, n_images: int = 6):
    g = torch.Generator().manual_seed(seed)

    def boxes(n):
        xy = torch.rand(n, 2, generator=g) * 60
        return torch.cat([xy, xy + 4 + torch.rand(n, 2, generator=g) * 30], dim=1)

    targets, detections = [], []
    for i in range(n_images):
        n = int(torch.randint(0, 5, (), generator=g))
        t = {"boxes": boxes(n), "labels": torch.randint(0, 3, (n,), generator=g)}
        k = int(torch.randint(0, 7, (), generator=g))
        near = t["boxes"][torch.randint(0, max(n, 1), (k,), generator=g)] if n else boxes(k)
        d = {"boxes": near + torch.randn(k, 4, generator=g) * 3, "scores": torch.rand(k, generator=g),
             "labels": torch.randint(0, 3, (k,), generator=g)}
        targets.append(t), detections.append(d)
    return targets, detections


@pytest.mark.parametrize("seed", [0, 1])
def test_detection_map_equals_pycocotools_on_the_files_evaluate_writes(tmp_path, seed):
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    targets, detections = random_case(seed)
    task = get_task("detection", {"num_classes": 3})
    metrics = task.build_metrics(torch.device("cpu"))
    task.update(metrics, detections, targets)
    ours = task.compute(metrics)
    gt, dt = tmp_path / "gt.json", tmp_path / "dt.json"
    gt.write_text(json.dumps(coco_ground_truth([(100, 100)] * len(targets), targets, ["a", "b", "c"])))
    dt.write_text(json.dumps(coco_results(detections)))
    with contextlib.redirect_stdout(io.StringIO()):
        truth = COCO(str(gt))
        evaluation = COCOeval(truth, truth.loadRes(str(dt)), "bbox")
        evaluation.evaluate(), evaluation.accumulate(), evaluation.summarize()
    stats = evaluation.stats  # AP .5:.95, AP .5, AP .75, ... AR 1, 10, 100
    assert 0 < ours["map"] < 1
    assert (ours["map"], ours["map_50"], ours["map_75"], ours["mar_100"]) == pytest.approx(
        (stats[0], stats[1], stats[2], stats[8]), abs=1e-4)


def test_evaluate_rescores_a_run_writes_coco_files_and_predict_draws_its_boxes(tmp_path, capsys):
    from pycocotools.coco import COCO

    from common import evaluate, predict
    from train import main

    folder = write_coco(tmp_path / "coco", n_images=10)
    run = tmp_path / "run"
    assert main(["--paper", "faster_rcnn", "--dataset", "coco", "--data-dir", str(folder), "--max-steps", "2",
                 "--batch-size", "2", "--wandb", "disabled", "--out", str(run)]) == 0
    final = json.loads((run / "result.json").read_text())["final"]
    capsys.readouterr()
    assert evaluate.main(["--run", str(run), "--draw", "2", "--threshold", "0"]) == 0
    out = capsys.readouterr().out
    assert f"map: {final:.4f}" in out and "mar_100:" in out  # the trainer's last evaluation, recomputed
    with contextlib.redirect_stdout(io.StringIO()):
        truth = COCO(str(run / "gt.json"))
    assert len(truth.getImgIds()) == 2 and len(truth.getAnnIds()) == 2  # the test split: 2 images, a box each
    assert {c["name"] for c in truth.loadCats(truth.getCatIds())} == {"dog", "cat"}
    assert isinstance(json.loads((run / "detections.json").read_text()), list)
    assert sorted(p.name for p in (run / "eval").iterdir()) == ["test-0.png", "test-1.png"]
    assert predict.main(["--run", str(run), str(folder / "im1.png"), "--out", str(tmp_path / "drawn"),
                         "--threshold", "0"]) == 0
    assert (tmp_path / "drawn" / "im1.png").is_file() and "im1.png: " in capsys.readouterr().out
    assert predict.main(["--run", str(tmp_path), str(folder / "im1.png")]) == 2  # not a run directory
    # one proposal per image at test time: at most one box per class (dog, cat) per image
    assert evaluate.main(["--run", str(run), "--model-kwargs", "rpn_post_nms_top_n=(150, 1)", "--areas", "50",
                          "200"]) == 0
    assert "map_small:" in capsys.readouterr().out
    per_image = Counter(d["image_id"] for d in json.loads((run / "detections.json").read_text()))
    assert max(per_image.values(), default=0) <= 2
    assert evaluate.main(["--run", str(run), "--areas", "50", "200", "--model-kwargs", "roi_size=3"]) == 2
    assert "roi_size=3" in capsys.readouterr().err  # weights of another shape: refused in one line


@pytest.mark.parametrize("seed", [0, 1])
def test_ap_by_area_is_coco_at_cocos_areas_and_follows_the_thresholds(seed):
    """At 32 ** 2 and 96 ** 2, AP and AR by size equal torchmetrics' (faster_coco_eval's defaults); boxes
    scaled by 3 with thresholds scaled by 9 score the same (IoU and the split are scale-free); other
    thresholds split the objects otherwise."""
    g = torch.Generator().manual_seed(seed)
    targets, detections = [], []
    for _ in range(12):  # squares of 10 to 150 pixels a side (areas 100 to 22,500: every size occurs), found
        side = 10 + 140 * torch.rand(4, 1, generator=g)  # with a jitter of a tenth of their side, and 2 strays
        xy = torch.rand(4, 2, generator=g) * 250
        boxes = torch.cat([xy, xy + side], dim=1)
        labels = torch.randint(0, 3, (4,), generator=g)
        strays = torch.cat([xy[:2] + 40, xy[:2] + 40 + side[:2]], dim=1)
        found = torch.cat([boxes + torch.randn(4, 4, generator=g) * side / 10, strays])
        targets.append({"boxes": boxes, "labels": labels})
        detections.append({"boxes": found, "scores": torch.rand(6, generator=g), "labels": torch.cat([labels, labels[:2]])})
    task = get_task("detection", {"num_classes": 3})
    metrics = task.build_metrics(torch.device("cpu"))
    task.update(metrics, detections, targets)
    ours = task.compute(metrics)
    gt = coco_ground_truth([(400, 400)] * len(targets), targets, ["a", "b", "c"])
    at_coco = ap_by_area(gt, coco_results(detections), 32 ** 2, 96 ** 2)
    sizes = ("map_small", "map_medium", "map_large")
    assert all(ours[k] > 0 for k in sizes)
    assert {k: at_coco[k] for k in ours} == pytest.approx(ours, abs=2e-3)  # float32 boxes there, float64 here
    for d in (*targets, *detections):
        d["boxes"] = d["boxes"] * 3
    gt = coco_ground_truth([(1200, 1200)] * len(targets), targets, ["a", "b", "c"])
    assert ap_by_area(gt, coco_results(detections), 9 * 32 ** 2, 9 * 96 ** 2) == pytest.approx(at_coco, abs=1e-6)
    other = ap_by_area(gt, coco_results(detections), 9 * 300, 9 * 3000)
    assert other["map"] == pytest.approx(at_coco["map"]) and [other[k] for k in sizes] != [at_coco[k] for k in sizes]
    with pytest.raises(ValueError, match="small < large"):
        ap_by_area(gt, [], 100, 50)


def write_coco_of_many_sizes(folder, n_images=30):
    """A COCO folder of n_images images from 32 to 72 px a side (height and width drawn apart), one or
    two boxes each, so that batches are padded and size buckets differ from a random order."""
    g = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    for i in range(1, n_images + 1):
        h, w = (int(v) for v in g.integers(32, 73, 2))
        Image.fromarray(g.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(folder / f"im{i}.png")
        images.append({"id": i, "file_name": f"im{i}.png", "width": w, "height": h})
        for k in range(1 + i % 2):
            bw, bh = (int(v) for v in g.integers(8, 20, 2))
            x, y = int(g.integers(0, w - bw)), int(g.integers(0, h - bh))
            annotations.append({"id": len(annotations) + 1, "image_id": i, "category_id": 1 + k, "area": bw * bh,
                                "bbox": [x, y, bw, bh], "iscrowd": 0})
    categories = [{"id": 1, "name": "one"}, {"id": 2, "name": "two"}]
    (folder / "instances.json").write_text(json.dumps({"images": images, "annotations": annotations,
                                                       "categories": categories}))
    return folder


@pytest.mark.slow  # trains, exports or compiles: the whole suite's, not the everyday lane's
@pytest.mark.parametrize("paper", ["faster_rcnn", "detr"])
def test_a_detection_run_in_size_buckets_resumed_mid_epoch_equals_the_uninterrupted_one(paper, tmp_path):
    """Faster R-CNN samples anchors and RoIs inside its forward, DETR matches inside its loss: a run
    stopped after step 3 of a 6-step epoch and resumed ends with the same weights, bit for bit, and its
    batches come from size buckets (less padding than the random order's)."""
    from tests.conftest import bitwise_equal, interrupted_copy, weights
    from train import main

    folder = write_coco_of_many_sizes(tmp_path / "coco")
    flags = ["--paper", paper, "--dataset", "coco", "--data-dir", str(folder), "--max-steps", "8", "--batch-size",
             "4", "--wandb", "disabled"]
    assert main(flags + ["--ckpt-every", "3", "--keep-ckpts", "5", "--bucketing", "size",
                         "--out", str(tmp_path / "run")]) == 0
    resumed = interrupted_copy(tmp_path / "run", 3, tmp_path / "resumed")
    assert main(["--resume", str(resumed)]) == 0
    assert bitwise_equal(weights(resumed), weights(tmp_path / "run"))
    bucketed = json.loads((tmp_path / "run" / "result.json").read_text())
    assert bucketed["steps"] == 8 and bucketed["bucketing"] == "size"
    assert main(flags + ["--max-steps", "6", "--bucketing", "none", "--out", str(tmp_path / "random")]) == 0
    random_order = json.loads((tmp_path / "random" / "result.json").read_text())
    assert bucketed["padding_waste"] < 0.75 * random_order["padding_waste"], (bucketed, random_order)


def _rank_map(rank: int, port: int, images: list, queue) -> None:
    """Rank `rank` of 2 (gloo) scores its half of `images` with the detection task's metric."""
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    task = get_task("detection", {"num_classes": 10})
    metrics = task.build_metrics(torch.device("cpu"))
    for detections, target in images[rank::2]:
        task.update(metrics, [detections], [target])
    result = task.compute(metrics)
    if rank == 0:
        queue.put(result)
    dist.destroy_process_group()


def test_detection_map_over_two_ranks_equals_one_process_over_all_images():
    """The mAP state of every image reaches every rank (in one gather, not one per tensor)."""
    import socket

    import torch.multiprocessing as mp

    g = torch.Generator().manual_seed(0)
    images = []
    for n in (3, 0, 5, 2, 1, 4, 6, 2):
        corner = torch.rand(8, 2, generator=g) * 40
        boxes = torch.cat([corner, corner + 8 + torch.rand(8, 2, generator=g) * 16], 1)  # (8, 4) detections
        labels = torch.randint(3, (8,), generator=g)
        detections = {"boxes": boxes, "scores": torch.rand(8, generator=g), "labels": labels}
        images.append((detections, {"boxes": boxes[:n] + torch.rand(n, 4, generator=g) * 3, "labels": labels[:n]}))
    task = get_task("detection", {"num_classes": 10})
    alone = task.build_metrics(torch.device("cpu"))
    for detections, target in images:
        task.update(alone, [detections], [target])
    expected = task.compute(alone)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    ranks = [ctx.Process(target=_rank_map, args=(r, port, images, queue)) for r in range(2)]
    for p in ranks:
        p.start()
    gathered = queue.get(timeout=120)
    for p in ranks:
        p.join(timeout=60)
    assert all(p.exitcode == 0 for p in ranks)
    assert 0 < expected["map"] < 1 and gathered == pytest.approx(expected, abs=1e-12)
