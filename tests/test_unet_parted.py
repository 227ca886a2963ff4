"""U-Net's weighted-loss figure (papers/unet/claims/parted.py): one test canvas whose items touch, its true
items, the weight map training puts on it and what seed 0 of each arm parts, as instances.py counts them; an
arm without its run is one line, exit 2."""

import numpy as np
import torch
from PIL import Image

from common.data import canvas, get_dataset
from common.data.collate import IGNORE_INDEX
from common.export import randomize
from common.tracking import write_json
from papers import get_paper
from papers.unet.claims import instances as inst
from papers.unet.claims import parted
from papers.unet.weights import target_weights
from tests.conftest import need_files

FASHION = "/usr/share/datasets/fashion-mnist"
GET_THEM = "apt-get install -y dataset-fashion-mnist"


def fake_run(folder, arm: str, seed: int) -> torch.nn.Module:
    """A finished run as train.py leaves one (config.json, model.safetensors), its weights perturbed so that
    its classes vary over a canvas."""
    from safetensors.torch import save_file

    model = randomize(get_paper("unet").build_for_data("tiny", get_dataset("fashion-canvas").facts()),
                      seed + (arm == "none") * 7).eval()
    run = folder / f"{inst.SWEEP}-{arm}-{seed}"
    run.mkdir(parents=True)
    write_json(run / "config.json", {"paper": "unet", "dataset": "fashion-canvas", "flavor": "tiny", "seed": seed,
                                     "pixel_weights": arm})
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, run / "model.safetensors")
    return model


def test_parted_draws_the_first_touching_canvas_its_weights_and_each_arms_parts(tmp_path, capsys):
    need_files(FASHION, GET_THEM)
    folder = tmp_path / "runs" / inst.SWEEP
    models = {arm: fake_run(folder, arm, 0) for arm in inst.ARMS}
    fake_run(folder, "paper", 1)  # another seed's run is not drawn
    out = tmp_path / "parted.png"
    assert parted.main(["--runs-dir", str(tmp_path / "runs"), "--out", str(out)]) == 0
    drawn = parted.draw(folder, tmp_path / "again.png")
    test = canvas.load()[1]
    index = drawn["canvas"]
    assert inst.touching(test[index][1]["instances"].numpy())
    assert not any(inst.touching(test[i][1]["instances"].numpy()) for i in range(index))
    assert capsys.readouterr().out.strip() == f"drew test canvas {index} and seed 0 of both arms into {out}"
    image, target = test[index]
    items, void = target["instances"].numpy(), target["labels"].numpy() == IGNORE_INDEX
    truth = inst.true_items(items, void)
    assert np.array_equal(drawn["true"] > 0, (items > 0) & ~void) and drawn["true"].max() == len(truth) >= 2
    assert np.array_equal(drawn["weights"], target_weights(target).numpy())
    for arm, model in models.items():
        with torch.no_grad():
            labels = model(image[None])[0].argmax(0).numpy()
        parts = inst.components(labels, void)
        assert len(parts) and np.array_equal(drawn[arm]["parts"] > 0, np.any(parts, axis=0))
        assert drawn[arm]["parts"].max() == len(parts) and drawn[arm]["matched"] == inst.matched(parts, truth)
    H, W = items.shape
    zoom = max(1, 400 // max(H, W))
    assert Image.open(out).width == 4 * W * zoom + 3 * 8


def test_a_chosen_canvas_is_drawn_and_a_missing_arm_is_one_line(tmp_path, capsys):
    need_files(FASHION, GET_THEM)
    folder = tmp_path / "runs" / inst.SWEEP
    fake_run(folder, "paper", 0)
    fake_run(folder, "none", 1)  # seed 1 only: seed 0 of this arm is missing
    assert parted.main(["--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "p.png")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"parted: no finished run of none seed 0 in {folder}; run python -m common.sweep "
        "papers/unet/claims/weighted-loss.yaml first"]
    assert parted.main(["--runs-dir", str(tmp_path / "runs"), "--seed", "1", "--out", str(tmp_path / "p.png")]) == 2
    fake_run(folder, "none", 0)
    assert parted.draw(folder, tmp_path / "p.png", index=3)["canvas"] == 3
