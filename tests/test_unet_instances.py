"""U-Net's weighted-loss claim counts the items a net parts (papers/unet/claims/instances.py): the instance F1
of hand-made canvases, whose matches are known, and the script end to end on one-step runs standing in for
the sweep's six."""

import json
import shutil

import numpy as np
import pytest

from common import claims
from common.data.canvas import void_band
from papers.unet.claims import instances as inst
from tests.conftest import ROOT, need_files


def canvas(*boxes) -> np.ndarray:
    """Instance ids (H, W) of 20 x 20: the k-th (rows, cols) box is item k + 1, later ones in front."""
    ids = np.zeros((20, 20), dtype=np.int64)
    for k, (rows, cols) in enumerate(boxes):
        ids[rows, cols] = k + 1
    return ids


def no_void(ids: np.ndarray) -> np.ndarray:
    return np.where(ids > 0, 3, 0)  # every item of class 3, no band


def test_a_perfect_prediction_scores_1_with_the_void_band_left_out():
    ids = canvas((slice(2, 9), slice(2, 9)), (slice(5, 15), slice(9, 18)))  # two items that touch
    classes = np.where(void_band(ids), 255, np.where(ids > 0, ids + 1, 0))  # the data set's band
    labels = np.where(ids > 0, 4, 0)
    labels[:, 8] = 0  # the net leaves background between them (on the band): two components
    assert inst.instance_f1(labels, ids, classes) == (1.0, 2, 2, 2)
    assert inst.instance_f1(np.where(ids > 0, 4, 0), ids, classes)[2] == 1  # no gap: one component


def test_two_touching_items_predicted_as_one_count_one_match():
    """Merged, the larger item (50 of 80 pixels: IoU 0.625) matches and the smaller (30) does not: 1
    matched of 1 predicted and 2 true, F1 = 2 / 3. Parted by a background column, both match."""
    ids = canvas((slice(0, 10), slice(0, 3)), (slice(0, 10), slice(3, 8)))
    merged = no_void(ids)
    assert inst.instance_f1(merged, ids, no_void(ids)) == (pytest.approx(2 / 3), 1, 1, 2)
    parted = merged.copy()
    parted[:, 3] = 0  # item 2 loses a column: 40 of 50 pixels, IoU 0.8
    assert inst.instance_f1(parted, ids, no_void(ids)) == (1.0, 2, 2, 2)


def test_an_iou_just_under_one_half_is_no_match():
    ids = canvas((slice(0, 10), slice(0, 10)))  # 100 pixels
    under, half = np.zeros_like(ids), np.zeros_like(ids)
    under[0:7, 0:7], half[0:10, 0:5] = 3, 3  # 49 and 50 pixels inside it: IoU 0.49 and 0.5
    assert inst.instance_f1(under, ids, no_void(ids)) == (0.0, 0, 1, 1)
    assert inst.instance_f1(half, ids, no_void(ids)) == (1.0, 1, 1, 1)


def test_components_are_8_connected_and_one_on_the_void_band_alone_is_not_counted():
    ids = canvas((slice(0, 4), slice(0, 4)), (slice(4, 8), slice(4, 8)))  # meeting at a corner
    assert inst.touching(ids) and not inst.touching(canvas((slice(0, 4), slice(0, 4)), (slice(5, 8), slice(0, 4))))
    assert inst.instance_f1(no_void(ids), ids, no_void(ids))[2] == 1  # one component across the corner
    void = np.zeros_like(ids, dtype=bool)
    void[15, 10:15] = True
    labels = no_void(ids)
    labels[15, 10:15] = 5  # a sliver on the band: not judged, as mean IoU leaves the band out
    classes = np.where(void, 255, no_void(ids))
    assert len(inst.components(labels, void)) == 1 and inst.instance_f1(labels, ids, classes)[2] == 1


@pytest.mark.slow  # trains one step
def test_the_script_reads_the_sweeps_runs_and_writes_what_the_hypothesis_reads(tmp_path, capsys):
    """One one-step run copied to the sweep's six (paper, none; seeds 0-2, as their config.json say), scored
    on 4 canvases: instances.json holds each arm's three F1s where the hypothesis's paths look, the runs read
    and the commit; a run missing is one line, exit 2."""
    need_files("/usr/share/datasets/fashion-mnist", "apt-get install -y dataset-fashion-mnist")
    from train import main

    folder = tmp_path / "runs" / inst.SWEEP
    assert main(["--paper", "unet", "--max-steps", "1", "--batch-size", "4", "--train-fraction", "0.002",
                 "--eval-samples", "4", "--wandb", "disabled", "--out", str(tmp_path / "one"),
                 "--results-dir", str(tmp_path / "results")]) == 0
    for arm in inst.ARMS:
        for seed in inst.SEEDS:
            run = shutil.copytree(tmp_path / "one", folder / f"{inst.SWEEP}-{arm}-{seed}")
            cfg = json.loads((run / "config.json").read_text()) | {"pixel_weights": arm, "seed": seed}
            (run / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "instances.json"
    assert inst.main(["--runs-dir", str(tmp_path / "runs"), "--canvases", "4", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["provenance"]["commit"] and len(record["provenance"]["runs_read"]) == 6
    h = claims.load(ROOT / "papers" / "unet" / "claims" / "weighted-loss.yaml")
    for arm, spec in h.arms.items():
        found = dict(claims._walk(record, spec["path"].split("/")))
        assert sorted(k for k, in found) == ["0", "1", "2"] and all(0 <= v <= 1 for v in found.values())
    assert all(c["canvases"] == 4 for by_seed in record["counts"].values() for c in by_seed.values())
    shutil.rmtree(folder / f"{inst.SWEEP}-none-2")
    capsys.readouterr()
    assert inst.main(["--runs-dir", str(tmp_path / "runs"), "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"instances: no finished run of none seed 2 in {folder}; run python -m common.sweep "
        "papers/unet/claims/weighted-loss.yaml first"]
