"""--tta flip: each test image scored by the mean of its logits and its mirror image's, in the trainer's
evaluation and in `python -m common.evaluate`; refused where there is no image to mirror."""

import pytest
import torch

from common import evaluate
from common.tasks import flip_tta
from tests.conftest import load_json, refused
from train import main

FLAGS = ["--paper", "lenet", "--dataset", "digits", "--epochs", "2", "--batch-size", "32", "--wandb", "disabled"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tta") / "run"
    assert main(FLAGS + ["--tta", "flip", "--out", str(out), "--results-dir", str(out.parent / "results")]) == 0
    return out


def by_hand(run_dir, mirrored: bool) -> float:
    """The run's test accuracy from its final weights, computed here: argmax of the logits, or of the mean
    of the image's and its mirror image's."""
    from common.data import dataset_for, options
    from common.export import load_run

    model, cfg = load_run(run_dir)
    _, test_set = dataset_for(cfg).read(**options(cfg))
    images = torch.stack([test_set[i][0] for i in range(len(test_set))])
    labels = torch.tensor([int(test_set[i][1]) for i in range(len(test_set))])
    with torch.no_grad():
        logits = model(images)
        if mirrored:
            logits = (logits + model(torch.flip(images, dims=[3]))) / 2
    return (logits.argmax(1) == labels).float().mean().item()


def test_the_run_scores_the_mean_of_each_image_and_its_mirror(run):
    result = load_json(run / "result.json")
    assert load_json(run / "config.json")["tta"] == "flip"
    with_flip, without = by_hand(run, True), by_hand(run, False)
    assert with_flip != without  # digits are not symmetric: the mirror changes some answers
    assert result["final"] == pytest.approx(with_flip, abs=1e-6)


def test_evaluate_takes_the_runs_own_or_the_one_given(run, capsys):
    capsys.readouterr()
    assert evaluate.main(["--run", str(run)]) == 0
    assert f"accuracy: {by_hand(run, True):.4f}" in capsys.readouterr().out
    assert evaluate.main(["--run", str(run), "--tta", "none"]) == 0
    assert f"accuracy: {by_hand(run, False):.4f}" in capsys.readouterr().out


def test_flip_tta_mirrors_the_width_and_passes_a_pipeline_stages_none():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(6, 2))
    x = torch.arange(12.0).reshape(2, 1, 2, 3)
    expected = (model(x) + model(x[..., [2, 1, 0]])) / 2
    assert torch.allclose(flip_tta(model, x), expected)
    assert flip_tta(lambda inputs: None, x) is None


def test_refused_without_images_of_one_size(capsys, tmp_path):
    line = refused(capsys, ["--paper", "lstm", "--dataset", "digits-rows", "--tta", "flip", "--out",
                            str(tmp_path / "rows")])
    assert "--tta flip" in line and "digits-rows has sequence inputs" in line
    assert not (tmp_path / "rows").exists()
    line = refused(capsys, ["--paper", "unet", "--dataset", "fashion-canvas", "--tta", "flip", "--out",
                            str(tmp_path / "canvas")])
    assert "--tta flip" in line and "segmentation" in line
