"""`--init RUN_DIR --init-tensors REGEX`: a deeper VGG started from net A's first four convolutions and three
fully connected layers, as VGG's Section 3.1 trained B to E (and as table-3-fashion-mnist-deep.yaml does);
a `{seed}` in RUN_DIR is the run's own seed; papers.vgg.claims.net_a links each seed's net A; and the
mistakes are one line."""

import json

import pytest
import torch

from common.config import TrainConfig, resolve
from common.pretrained import build_model, load_from_run
from papers.vgg import PAPER
from papers.bert.claims import pre_trained
from papers.vgg.claims import net_a
from tests.conftest import made_once, refused, weights

pytestmark = pytest.mark.slow  # a run trained: left out of `-m "not slow"`

PAPERS_LAYERS = r"blocks\.[01]\.0\..+|blocks\.2\.[02]\..+|fc[678]\..+"  # conv1_1, conv2_1, conv3_1, conv3_2, fc6-8
NET = ["--paper", "vgg", "--image-size", "32", "--model-kwargs", "width=0.25", "fc_width=128"]
FACTS = dict(num_classes=10, in_chans=1, img_size=32)  # digits at 32x32


def train(argv: list[str]) -> int:
    from train import main

    return main(argv + ["--wandb", "disabled"])


@pytest.fixture(scope="module")
def net_a_run(tmp_path_factory):
    """Net A (VGG-11 at a quarter of the filters), one step on the digits: a finished run to start from."""
    def make(folder):
        assert train(NET + ["--flavor", "VGG-11", "--max-steps", "1", "--seed", "1", "--out", str(folder / "A"),
                            "--results-dir", str(folder / "results")]) == 0

    return made_once(tmp_path_factory, "vgg-net-a-1-step", make) / "A"


def test_the_papers_layers_of_net_a_and_only_they_are_loaded(net_a_run):
    torch.manual_seed(0)
    model = build_model(PAPER.for_flavor("VGG-16"), "VGG-16", str(net_a_run), FACTS, {"width": 0.25, "fc_width": 128})
    before = {k: v.clone() for k, v in model.state_dict().items()}
    notes = load_from_run(model, PAPER, str(net_a_run), PAPERS_LAYERS)
    picked = {f"{layer}.{p}" for layer in ("blocks.0.0", "blocks.1.0", "blocks.2.0", "blocks.2.2", "fc6", "fc7", "fc8")
              for p in ("weight", "bias")}
    assert notes[0].startswith(f"--init {net_a_run}: 14 tensors loaded from")
    run, now = weights(net_a_run), model.state_dict()
    for k in now:
        if k in picked:
            assert torch.equal(now[k], run[k]), k  # net A's, exactly
        else:
            assert torch.equal(now[k], before[k]), k  # D's own initialisation
    # net A's convolutions of blocks 3 and 4 fit D by name and shape too: without --init-tensors they are loaded
    torch.manual_seed(0)
    every = build_model(PAPER.for_flavor("VGG-16"), "VGG-16", str(net_a_run), FACTS, {"width": 0.25, "fc_width": 128})
    load_from_run(every, PAPER, str(net_a_run))
    assert torch.equal(every.state_dict()["blocks.3.0.weight"], run["blocks.3.0.weight"])
    assert not torch.equal(now["blocks.3.0.weight"], run["blocks.3.0.weight"])


def test_seed_in_the_run_directory_is_the_runs_own_seed(net_a_run, tmp_path, capsys):
    """A sweep's runs each start from the run of their own seed; config.json keeps the path it used."""
    (tmp_path / "A-seed-2").symlink_to(net_a_run)
    cfg = resolve({"paper": "vgg", "init": str(tmp_path / "A-seed-{seed}"), "seed": 2})
    assert cfg.init == str(tmp_path / "A-seed-2")
    assert resolve({"paper": "vgg", "init": "runs/A-seed-{seed}"}).init == f"runs/A-seed-{TrainConfig.seed}"
    out = tmp_path / "deep"
    assert train(NET + ["--flavor", "VGG-13", "--max-steps", "1", "--seed", "2", "--init", str(tmp_path / "A-seed-{seed}"),
                        "--init-tensors", PAPERS_LAYERS, "--out", str(out), "--results-dir", str(tmp_path / "r")]) == 0
    assert f"--init {tmp_path / 'A-seed-2'}: 14 tensors loaded from" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["init"] == str(tmp_path / "A-seed-2") and config["init_tensors"] == PAPERS_LAYERS


def test_refusals_are_one_line(net_a_run, tmp_path, capsys):
    base = NET + ["--flavor", "VGG-13", "--out", str(tmp_path / "never")]
    assert refused(capsys, base + ["--init-tensors", "fc8.*"]) == (
        "train.py: error: --init-tensors picks tensors of a run to start from; give that run as --init RUN_DIR")
    line = refused(capsys, base + ["--init", str(net_a_run), "--init-tensors", "blocks.(0"])
    assert line.startswith("train.py: error: --init-tensors blocks.(0: not a regular expression (")
    line = refused(capsys, base + ["--init", str(net_a_run), "--init-tensors", "head\\..+"])
    assert line.startswith(f"train.py: error: --init-tensors head\\..+: none of the ") and "that fit this model matches" in line
    assert not (tmp_path / "never").exists()


def test_net_a_links_each_seeds_finished_run(tmp_path, capsys):
    folder = tmp_path / net_a.SWEEP
    for name, flavor, seed, finished in (("a0", "VGG-11", 0, True), ("a1", "VGG-11", 1, True),
                                          ("lrn1", "VGG-11-LRN", 1, True), ("a2", "VGG-11", 2, False)):
        (folder / name).mkdir(parents=True)
        (folder / name / "config.json").write_text(json.dumps({"flavor": flavor, "seed": seed}))
        if finished:
            (folder / name / "model.safetensors").write_bytes(b"")
    assert net_a.main(["--runs-dir", str(tmp_path)]) == 2  # seed 2's net A has not finished
    assert capsys.readouterr().err.strip().startswith("net_a: no finished VGG-11 run of seed 2 in")
    (folder / "a2" / "model.safetensors").write_bytes(b"")
    assert net_a.main(["--runs-dir", str(tmp_path)]) == 0
    assert {s: (folder / f"A-seed-{s}").resolve().name for s in (0, 1, 2)} == {0: "a0", 1: "a1", 2: "a2"}
    assert net_a.main(["--runs-dir", str(tmp_path)]) == 0  # again: the links are replaced


def test_berts_pre_trained_runs_are_linked_by_data_set_and_seed(tmp_path, capsys):
    folder = tmp_path / pre_trained.SWEEP
    made = {(d, s): f"{d[6:]}{s}" for d in pre_trained.DATASETS for s in (0, 1, 2)}  # pairs0 ... ltr2
    for (dataset, seed), name in made.items():
        (folder / name).mkdir(parents=True)
        (folder / name / "config.json").write_text(json.dumps({"dataset": dataset, "seed": seed}))
        if name != "ltr2":  # not finished
            (folder / name / "model.safetensors").write_bytes(b"")
    assert pre_trained.main(["--runs-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().startswith("pre_trained: no finished run of pydoc-ltr seed 2 in")
    (folder / "ltr2" / "model.safetensors").write_bytes(b"")
    for _ in range(2):  # again: the links are replaced, and a link is not taken for a run
        assert pre_trained.main(["--runs-dir", str(tmp_path)]) == 0
        assert {key: (folder / f"{key[0]}-seed-{key[1]}").resolve().name for key in made} == made

