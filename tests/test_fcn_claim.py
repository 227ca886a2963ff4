"""FCN's Table 2 claim: each arm of the sweep builds the tiny net with its own skips, and
papers.fcn.claims.masks draws one test canvas as each variant's run segments it, or says which run is missing."""

import json

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from common.data import canvas, get_dataset
from common.export import randomize
from common.tracking import write_json
from papers import get_paper
from papers.fcn.claims import masks
from tests.conftest import need_files

FASHION = "/usr/share/datasets/fashion-mnist"
GET_THEM = "apt-get install -y dataset-fashion-mnist"
SKIPS = {"32s": set(), "16s": {"score_pool4"}, "8s": {"score_pool4", "score_pool3"}}


def arms() -> dict[str, str]:
    """The sweep's --model-kwargs values, by variant."""
    sweep = yaml.safe_load((masks.OUT.parent / "table-2.yaml").read_text())
    return {value.split("=")[1]: value for value in sweep["parameters"]["model-kwargs"]["values"]}


def tiny(variant: str) -> torch.nn.Module:
    """The tiny flavor as the sweep's arm builds it (--model-kwargs variant=...), fashion-canvas's classes."""
    return get_paper("fcn").build_for_data("tiny", get_dataset("fashion-canvas").facts(), {"variant": variant})


def test_each_arm_builds_the_tiny_net_with_its_own_skips():
    need_files(FASHION, GET_THEM)
    assert list(arms()) == list(masks.VARIANTS)
    for variant, skips in SKIPS.items():
        model = tiny(variant)
        names = {name.split(".")[0] for name, _ in model.named_parameters()}
        assert model.variant == variant and names & {"score_pool4", "score_pool3"} == skips
        assert model(torch.zeros(1, 1, 40, 56))["out"].shape == (1, 11, 40, 56)


def fake_run(folder, variant: str, seed: int) -> torch.nn.Module:
    """A finished run as train.py leaves one (config.json, model.safetensors), its weights perturbed so that
    its classes vary over a canvas (the score layers start at zero)."""
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    model = randomize(tiny(variant), seed).eval()
    run = folder / f"fcn-table-2-{variant}-{seed}"
    run.mkdir(parents=True)
    write_json(run / "config.json", {"paper": "fcn", "dataset": "fashion-canvas", "flavor": "tiny", "seed": seed,
                                     "model_kwargs": {"variant": variant}})
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, run / "model.safetensors")
    return model


def test_masks_draws_the_truth_and_each_variants_seed_0_side_by_side(tmp_path, capsys):
    need_files(FASHION, GET_THEM)
    folder = tmp_path / "runs" / masks.SWEEP
    models = {v: fake_run(folder, v, 0) for v in masks.VARIANTS}
    fake_run(folder, "8s", 1)  # another seed's run is not drawn
    out = tmp_path / "masks.png"
    assert masks.main(["--runs-dir", str(tmp_path / "runs"), "--out", str(out), "--canvas", "3"]) == 0
    assert capsys.readouterr().out.strip().endswith(str(out))
    drawn = masks.draw(folder, tmp_path / "again.png", index=3)
    image, target = canvas.load()[1][3]
    truth = target["labels"].numpy()
    assert np.array_equal(drawn["true"][truth != 255], truth[truth != 255]) and not drawn["true"][truth == 255].any()
    for variant, model in models.items():
        with torch.no_grad():
            expected = model(image[None])["out"][0].argmax(0).numpy()
        assert np.array_equal(drawn[variant], expected) and len(np.unique(expected)) > 1
    assert len({drawn[v].tobytes() for v in masks.VARIANTS}) == 3
    picture = Image.open(out)
    H, W = truth.shape
    zoom = max(1, 400 // max(H, W))
    assert picture.width == 4 * W * zoom + 3 * 8 and picture.height >= 18 + H * zoom


def test_masks_without_a_variants_run_is_one_line_exit_2(tmp_path, capsys):
    folder = tmp_path / "runs" / masks.SWEEP
    (folder / "unfinished").mkdir(parents=True)  # a config.json, no model.safetensors yet
    write_json(folder / "unfinished" / "config.json",
               {"paper": "fcn", "flavor": "tiny", "seed": 0, "model_kwargs": {"variant": "32s"}})
    assert masks.main(["--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "m.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"masks: no finished FCN-32s, FCN-16s, FCN-8s run of seed 0 in {folder}; run "
                   f"python -m common.sweep papers/fcn/claims/table-2.yaml first")
    assert not (tmp_path / "m.png").exists()
