"""Bad input: one line on stderr naming what is wrong and the valid choices, exit code 2,
no traceback, nothing written. And the three layers of defaults."""

import subprocess
import sys

import pytest

import torch

from common.config import TrainConfig, build_parser, check_image_size, resolve, validate
from common.errors import ConfigError
from papers import get_paper
from tests.conftest import ROOT, load_json
from train import main

# (flags, words the one line must contain)
BAD_INPUTS = {
    "unknown paper": (["--paper", "vitt"], ["vitt", "choose from", "vit"]),
    "no paper": ([], ["--paper", "choose from", "vit"]),
    "unknown flavor": (["--paper", "vit", "--flavor", "huge"], ["huge", "choose from", "tiny", "ViT-B/16"]),
    "unknown dataset": (["--paper", "vit", "--dataset", "mnist-3d"], ["mnist-3d", "choose from", "digits"]),
    "unknown precision": (["--paper", "vit", "--precision", "fp8"], ["fp8", "fp32", "bf16", "fp16"]),
    "unknown strategy": (["--paper", "vit", "--strategy", "zero3"], ["zero3", "ddp", "single"]),
    "unknown wandb mode": (["--paper", "vit", "--wandb", "cloud"], ["cloud", "offline", "disabled"]),
    "zero batch size": (["--paper", "vit", "--batch-size", "0"], ["--batch-size", "positive integer", "'0'"]),
    "negative batch size": (["--paper", "vit", "--batch-size", "-8"], ["--batch-size", "positive integer"]),
    "zero epochs": (["--paper", "vit", "--epochs", "0"], ["--epochs", "positive integer"]),
    "zero max steps": (["--paper", "vit", "--max-steps", "0"], ["--max-steps", "positive integer"]),
    "zero grad accum": (["--paper", "vit", "--grad-accum", "0"], ["--grad-accum", "positive integer"]),
    "zero lr": (["--paper", "vit", "--lr", "0"], ["--lr", "positive number"]),
    "negative lr": (["--paper", "vit", "--lr", "-0.001"], ["--lr", "positive number"]),
    "negative weight decay": (["--paper", "vit", "--weight-decay", "-0.1"], ["--weight-decay", ">= 0"]),
    "epochs not an integer": (["--paper", "vit", "--epochs", "ten"], ["--epochs", "integer", "'ten'"]),
    "epochs a fraction": (["--paper", "vit", "--epochs", "2.5"], ["--epochs", "integer", "'2.5'"]),
    "lr not a number": (["--paper", "vit", "--lr", "fast"], ["--lr", "number", "'fast'"]),
    "label smoothing of 1": (["--paper", "vit", "--label-smoothing", "1"], ["label_smoothing", "below 1"]),
    "unknown flag": (["--paper", "vit", "--epoch", "3"], ["unrecognized", "--epoch"]),
    "batch not dividing over accumulation": (
        ["--paper", "vit", "--batch-size", "64", "--grad-accum", "3"], ["batch size 64", "multiple of 3", "63 or 66"]),
    "fp16 on a CPU": (["--paper", "vit", "--precision", "fp16"], ["fp16", "CUDA", "bf16"]),
    "flavor too big for the data": (["--paper", "vit", "--flavor", "ViT-B/16"], ["ViT-B/16", "digits", "patch size 16"]),
    "step schedule without milestones": (["--paper", "vit", "--schedule", "step"], ["milestones", "0.5,0.75", "None"]),
    "unknown augmentation": (["--paper", "vit", "--augment", "crop:4,rotate"], ["rotate", "crop:P", "flip"]),
    "augmenting sequences": (["--paper", "lstm", "--augment", "flip"], ["--augment flip", "digits-rows has sequences"]),
    "unknown optimizer": (["--paper", "vit", "--optimizer", "adam"], ["adam", "adamw", "sgd", "rmsprop"]),
    "unknown model argument": (["--paper", "alexnet", "--model-kwargs", "activaton=tanh"],
                               ["activaton", "its arguments", "activation", "widths"]),
    "model argument the data set sets": (["--paper", "alexnet", "--model-kwargs", "num_classes=3"],
                                         ["num_classes", "from the data set"]),
    "model argument value refused": (["--paper", "alexnet", "--model-kwargs", "activation=sigmoid"],
                                     ["activation=sigmoid", "relu", "tanh"]),
    "model argument of the wrong type": (["--paper", "resnet", "--model-kwargs", "layers=3"],
                                         ["--model-kwargs layers=3"]),
    "model argument without a value": (["--paper", "vit", "--model-kwargs", "tanh"], ["KEY=VALUE", "'tanh'"]),
    "model argument given twice": (["--paper", "vit", "--model-kwargs", "depth=1", "--model-kwargs", "depth=2"],
                                   ["depth", "twice"]),
    "model arguments with --init": (["--paper", "vit", "--init", "timm:vit_tiny_patch16_224", "--model-kwargs",
                                     "depth=1"], ["--model-kwargs", "--init"]),
    "train fraction above 1": (["--paper", "vit", "--train-fraction", "1.5"], ["--train-fraction", "up to 1"]),
    "train fraction of 0": (["--paper", "vit", "--train-fraction", "0"], ["--train-fraction", "positive"]),
    "sequence length for a data set of its own": (["--paper", "vit", "--seq-len", "50"], ["--seq-len", "adding-1997"]),
    "sequence length the adding problem cannot take": (
        ["--paper", "lstm", "--flavor", "exp4-adding", "--dataset", "adding-1997", "--seq-len", "10"],
        ["--seq-len 10", "at least 20"]),
    "a switch given a word": (["--paper", "vit", "--compile=maybe"], ["--compile", "true or false", "'maybe'"]),
}


def assert_one_clean_line(code: int, err: str, words: list[str]) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for word in words:
        assert word in lines[0], f"{word!r} not in {lines[0]!r}"


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_and_exit_2_and_writes_nothing(case, capsys, monkeypatch, tmp_path):
    if case == "fp16 on a CPU":
        monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    flags, words = BAD_INPUTS[case]
    code = main(flags + ["--wandb", "disabled"] if "--wandb" not in flags else flags)
    out, err = capsys.readouterr()
    assert_one_clean_line(code, err, words)
    assert out == ""
    assert list(tmp_path.iterdir()) == [], "nothing may be written"


def test_batch_that_does_not_divide_over_processes(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "4")  # as torchrun --nproc_per_node 4 sets it
    code = main(["--paper", "vit", "--batch-size", "30", "--wandb", "disabled"])
    assert_one_clean_line(code, capsys.readouterr().err, ["batch size 30", "4 process(es)", "multiple of 4", "28 or 32"])
    assert list(tmp_path.iterdir()) == []


def test_out_folder_holding_a_run_is_not_overwritten(capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"paper": "vit"}')
    (run / "result.json").write_text('{"final": 0.99}')
    code = main(["--paper", "vit", "--out", str(run), "--wandb", "disabled"])
    assert_one_clean_line(code, capsys.readouterr().err, [str(run), "already holds a run"])
    assert sorted(p.name for p in run.iterdir()) == ["config.json", "result.json"]
    assert load_json(run / "result.json") == {"final": 0.99}


def test_an_image_the_model_shrinks_to_nothing_is_refused_before_the_run(capsys, tmp_path):
    """ConvNeXt's ResNet stem (a quarter of the side) and three 2x2 downsamplings cannot take 28x28 images: one
    line naming the size and the switch, nothing written; the patchify stem, at the same size, passes the check."""
    out = tmp_path / "run"
    code = main(["--paper", "convnext", "--model-kwargs", "stem=resnet", "--out", str(out), "--wandb", "disabled"])
    assert_one_clean_line(code, capsys.readouterr().err, ["convnext tiny", "stem=resnet", "28x28 images",
                                                          "Kernel size"])
    assert not out.exists()
    spec, cfg = get_paper("convnext"), resolve(vars(build_parser().parse_args(["--paper", "convnext"])))
    with torch.device("meta"):
        model = spec.build_for_data("tiny", dict(num_classes=10, in_chans=1))
    check_image_size(spec, cfg, model, dict(num_classes=10, in_chans=1, img_size=28))
    assert model.training  # put back as it was


def test_no_traceback_from_the_real_command():
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "--paper", "vit", "--flavor", "giant"],
                          capture_output=True, text=True, timeout=120)
    assert_one_clean_line(proc.returncode, proc.stderr, ["giant", "choose from", "tiny"])


def test_defaults_come_from_the_dataclass_then_the_paper_then_the_flags():
    cfg = resolve(vars(build_parser().parse_args(["--paper", "vit", "--lr", "0.01"])))
    assert cfg.lr == 0.01  # flag
    assert cfg.epochs == 30 and cfg.label_smoothing == 0.1  # the ViT spec's defaults
    assert cfg.grad_accum == 1 and cfg.precision == "fp32"  # TrainConfig's
    validate(cfg)


def test_config_from_a_dict_rejects_unknown_keys_and_wrong_types():
    assert TrainConfig.from_dict({"paper": "vit", "lr": 1}).lr == 1  # an int is a valid float
    with pytest.raises(ConfigError, match="unknown config key.*learning_rate"):
        TrainConfig.from_dict({"paper": "vit", "learning_rate": 0.1})
    with pytest.raises(ConfigError, match="epochs must be an integer"):
        TrainConfig.from_dict({"paper": "vit", "epochs": "10"})
    with pytest.raises(ConfigError, match="compile must be true or false"):
        TrainConfig.from_dict({"paper": "vit", "compile": 1})


def test_list_prints_every_paper(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "vit" in out and "transformer" in out and "2020" in out and "ViT-H/14" in out


def test_a_paper_of_one_size_on_a_data_set_of_many_is_one_line_naming_the_fix(capsys, monkeypatch, tmp_path):
    """A paper that does not read padded batches (ResNet's spec without padded_batches, here) is refused
    variable-size data in one line that names the fixes; the first fix, --image-size, trains."""
    import dataclasses

    import papers

    monkeypatch.setitem(papers._PAPERS, "one-size", dataclasses.replace(papers.get_paper("resnet"), name="one-size",
                                                                        padded_batches=False))
    monkeypatch.chdir(tmp_path)
    code = main(["--paper", "one-size", "--dataset", "digits-canvas", "--wandb", "disabled"])
    assert_one_clean_line(code, capsys.readouterr().err, ["one-size reads batches of one size", "padded_batches",
                                                          "digits-canvas", "--image-size N", "digits,"])
    assert list(tmp_path.iterdir()) == []
    assert main(["--paper", "one-size", "--dataset", "digits-canvas", "--image-size", "16", "--max-steps", "2",
                 "--wandb", "disabled", "--out", str(tmp_path / "run")]) == 0
    result = load_json(tmp_path / "run" / "result.json")
    assert result["padding_waste"] == 0 and result["steps"] == 2
