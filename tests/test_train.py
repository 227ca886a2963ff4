"""End-to-end runs: the run directory, wandb's offline run read back, repeatability, and torchrun."""

import json
import time
import warnings

import pytest
import torch
from safetensors.torch import load_file

from common.data import get_dataset
from common.tracking import resolve_mode
from papers import get_paper
from tests.conftest import free_port, load_json, read_wandb_records, torchrun, wandb_items, wandb_run_folders
from train import main

pytestmark = pytest.mark.slow  # processes launched or runs trained: left out of `-m "not slow"`

RESULT_FIELDS = {
    "paper", "flavor", "dataset", "metric", "final", "best", "params", "trainable_params", "epochs", "steps",
    "batch_size", "strategy", "world_size", "precision", "compile", "samples_per_s", "wall_s", "device", "torch", "commit",
    "commit_at_start", "wandb_run_id", "command",
}


def short_run(out, *flags):
    code = main(["--paper", "vit", "--epochs", "2", "--out", str(out), *flags])
    assert code == 0
    return load_json(out / "result.json")


def test_run_directory_holds_config_result_and_weights(tmp_path, capsys):
    run = tmp_path / "run"
    result = short_run(run, "--max-steps", "30", "--wandb", "offline", "--seed", "3")
    out = capsys.readouterr().out
    assert f"test accuracy: {result['final']:.4g}" in out and f"run directory: {run}" in out and "wandb sync" in out

    config = load_json(run / "config.json")
    assert config["paper"] == "vit" and config["seed"] == 3 and config["max_steps"] == 30
    assert config["label_smoothing"] == 0.1  # the paper's default, resolved
    assert RESULT_FIELDS <= set(result)
    assert result["steps"] == 30 and result["strategy"] == "single" and result["world_size"] == 1
    assert result["command"].startswith("python train.py --paper vit")

    # the saved weights are the plain model's and score what result.json says
    model = get_paper("vit").build_for_data("tiny", get_dataset("digits").facts())
    model.load_state_dict(load_file(run / "model.safetensors"))
    assert result["params"] == sum(p.numel() for p in model.parameters())
    _, test = get_dataset("digits").load()
    images, labels = test.tensors
    with torch.no_grad():
        accuracy = (model.eval()(images).argmax(dim=1) == labels).double().mean().item()
    assert accuracy == pytest.approx(result["final"], abs=1e-12)


def test_wandb_offline_run_is_written_and_reads_back(tmp_path):
    run = tmp_path / "run"
    result = short_run(run, "--max-steps", "25", "--log-every", "5", "--wandb", "offline")
    folders = wandb_run_folders(run)
    assert len(folders) == 1 and folders[0].name.startswith("offline-run-")
    records = read_wandb_records(folders[0] / f"run-{result['wandb_run_id']}.wandb")
    kinds = [r.WhichOneof("record_type") for r in records]
    run_record = next(r.run for r in records if r.HasField("run"))
    assert run_record.run_id == result["wandb_run_id"] and run_record.project == "paper-study"
    assert wandb_items(run_record.config.update)["paper"] == "vit"
    history = [wandb_items(r.history.item) for r in records if r.HasField("history")]
    losses = [h["train/loss"] for h in history if "train/loss" in h]
    assert len(losses) == 5 and all(h.get("train/samples_per_s", 1) > 0 for h in history)
    assert [h["eval/accuracy"] for h in history if "eval/accuracy" in h][-1] == pytest.approx(result["final"])
    summary = {}
    for r in records:
        if r.HasField("summary"):
            summary |= wandb_items(r.summary.update)
    assert summary["final/accuracy"] == pytest.approx(result["final"]) and summary["params"] == result["params"]
    assert "exit" in kinds


def test_same_seed_gives_the_same_weights(tmp_path):
    for name, seed in (("a", "1"), ("b", "1"), ("c", "2")):
        short_run(tmp_path / name, "--max-steps", "12", "--seed", seed, "--wandb", "disabled", "--clip-grad", "0.5")
    a, b, c = (load_file(tmp_path / n / "model.safetensors") for n in "abc")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_bf16_autocast_and_accumulation_train(tmp_path):
    result = short_run(tmp_path / "run", "--max-steps", "2", "--precision", "bf16", "--grad-accum", "2",
                       "--wandb", "disabled")
    assert result["precision"] == "bf16" and result["steps"] == 2
    assert 0 <= result["final"] <= 1


def test_a_wandb_failure_does_not_stop_training(tmp_path, monkeypatch):
    import wandb

    def broken_init(*args, **kwargs):
        raise RuntimeError("service unreachable")

    monkeypatch.setattr(wandb, "init", broken_init)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = short_run(tmp_path / "run", "--max-steps", "3", "--wandb", "offline")
    assert result["wandb_run_id"] is None and result["steps"] == 3
    assert any("wandb failed" in str(w.message) and "service unreachable" in str(w.message) for w in caught)


def test_auto_mode_is_online_only_with_an_api_key(monkeypatch, tmp_path):
    assert resolve_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert resolve_mode("auto") == "online"
    monkeypatch.delenv("WANDB_API_KEY")
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "y" * 40 + "\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    assert resolve_mode("auto") == "online"
    assert resolve_mode("disabled") == "disabled"


def test_default_two_process_vit_run(tmp_path):
    """The README's first command: one run directory, one wandb run, and at least 0.96 test accuracy."""
    proc = torchrun(["--paper", "vit", "--wandb", "offline"], cwd=tmp_path)
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1
    result = load_json(runs[0] / "result.json")
    assert (runs[0] / "config.json").exists() and (runs[0] / "model.safetensors").exists()
    assert len(wandb_run_folders(runs[0])) == 1
    assert result["world_size"] == 2 and result["strategy"] == "ddp" and result["epochs"] == 30
    assert result["final"] >= 0.96
    assert f"test accuracy: {result['final']:.4g}" in proc.stdout
    # each rank's peak memory: every --log-every steps in metrics.jsonl and the bar, and in result.json
    assert [set(d) for d in result["device_per_rank"]] == [{"peak_rss_bytes"}] * 2
    assert all(0 < d["peak_rss_bytes"] < 2**40 for d in result["device_per_rank"])
    rows = [json.loads(line) for line in (runs[0] / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "train/loss" in r]
    assert all(r["device/rank0/peak_rss_bytes"] > 0 and r["device/rank1/peak_rss_bytes"] > 0 for r in logged)
    assert ", mem " in proc.stdout and "\r" not in proc.stderr  # a plain line per logged step (no terminal)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results", "runs"], "only the run and its result"
    assert [p.name for p in (tmp_path / "results").iterdir()] == [f"{runs[0].name}.json"]
    assert load_json(tmp_path / "results" / f"{runs[0].name}.json") == result


def test_wandb_online_without_a_network_logs_offline_for_a_later_sync(tmp_path, monkeypatch, capsys):
    port = free_port()  # nothing listens there
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    run = tmp_path / "run"
    start = time.monotonic()
    assert main(["--paper", "vit", "--max-steps", "3", "--log-every", "1", "--wandb", "online", "--out", str(run)]) == 0
    assert time.monotonic() - start < 60
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("wandb: cannot reach")]
    assert len(lines) == 1 and f"http://127.0.0.1:{port}" in lines[0] and "wandb sync" in lines[0]
    result = load_json(run / "result.json")
    folders = wandb_run_folders(run)
    assert len(folders) == 1 and folders[0].name.startswith("offline-run-")
    records = read_wandb_records(folders[0] / f"run-{result['wandb_run_id']}.wandb")
    history = [wandb_items(r.history.item) for r in records if r.HasField("history")]
    assert [row["_step"] for row in history if "train/loss" in row] == [1, 2, 3]
