"""Every strategy trains the model that one process trains: ddp and fsdp under torchrun with
2 processes (gloo), and 2 machines (two torchrun launchers on 127.0.0.1)."""

import subprocess
import sys
import warnings

import pytest

from common.parallel import resolve_strategy
from tests.conftest import ROOT, free_port, launch_env, load_json, made_once, max_difference, torchrun_many, weights
from train import main

pytestmark = pytest.mark.slow  # processes launched or runs trained: left out of `-m "not slow"`

# accumulation and clipping on; the clip is small enough to act on every step
FLAGS = ["--paper", "vit", "--max-steps", "8", "--batch-size", "32", "--grad-accum", "2", "--clip-grad", "0.3",
         "--lr", "0.003", "--wandb", "disabled"]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    def make(out):
        assert main(FLAGS + ["--out", str(out / "run")]) == 0
        no_clip = [f if f != "0.3" else "0" for f in FLAGS]
        assert main(no_clip + ["--out", str(out / "noclip")]) == 0

    out = made_once(tmp_path_factory, "strategies-single", make)
    assert max_difference(weights(out / "run"), weights(out / "noclip")) > 1e-4, "clipping must change the result"
    return out / "run"


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> dict:
    """The single-process run's flags under torchrun with 2 processes: with ddp, and with fsdp and
    activation checkpointing (fsdp+ac: it changes no arithmetic; plain fsdp trains in test_checkpoint.py,
    test_language_modeling.py and test_seq2seq.py, and ran here too until commit 5963eb2)."""
    def make(out):
        torchrun_many([FLAGS + ["--strategy", "ddp", "--out", str(out / "ddp")],
                       FLAGS + ["--strategy", "fsdp", "--out", str(out / "fsdp+ac"), "--ac", "full"]], cwd=out)

    out = made_once(tmp_path_factory, "strategies-two", make)
    return {name: out / name for name in ("ddp", "fsdp+ac")}


@pytest.mark.parametrize("name", ["ddp", "fsdp+ac"])
def test_two_processes_train_the_single_process_weights(name, single, two_processes):
    run = two_processes[name]
    assert max_difference(weights(run), weights(single)) < 1e-5
    result = load_json(run / "result.json")
    assert result["strategy"] == name.partition("+")[0] and result["world_size"] == 2
    assert len(result["memory_per_rank"]) == 2
    if name == "fsdp+ac":  # each block keeps only its input: far fewer bytes than without (ddp's, the same batch)
        full = load_json(two_processes["ddp"] / "result.json")["memory_per_rank"][0]["activations"]
        assert result["ac"] == "full" and 5 * result["memory_per_rank"][0]["activations"] <= full


def test_fsdp_holds_about_half_of_ddps_bytes_per_rank(two_processes):
    ddp, fsdp = (load_json(two_processes[s] / "result.json")["memory_per_rank"] for s in ("ddp", "fsdp+ac"))
    for part in ("params", "grads", "optimizer", "total"):
        assert max(rank[part] for rank in fsdp) <= 0.55 * max(rank[part] for rank in ddp), part
    assert ddp[0]["params"] == 4 * load_json(two_processes["ddp"] / "result.json")["params"]  # fp32: 4 bytes each


def test_two_machines_train_the_two_process_weights(single, tmp_path):
    port, out = free_port(), str(tmp_path / "run")
    launchers = [
        subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
                          "--node-rank", str(node), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                          "--rdzv-id", "two-machines", str(ROOT / "train.py"), *FLAGS, "--out", out],
                         cwd=tmp_path, env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for node in (0, 1)
    ]
    for launcher in launchers:
        output, _ = launcher.communicate(timeout=180)
        assert launcher.returncode == 0, output[-3000:]
    assert max_difference(weights(tmp_path / "run"), weights(single)) < 1e-5
    result = load_json(tmp_path / "run" / "result.json")
    assert result["world_size"] == 2 and result["command"].startswith("torchrun --nnodes 2 --nproc_per_node 1")


def test_strategy_resolution():
    assert resolve_strategy("auto", 1) == "single" and resolve_strategy("auto", 4) == "ddp"
    assert resolve_strategy("fsdp", 2) == "fsdp" and resolve_strategy("fsdp", 1) == "single"
    assert resolve_strategy("dp", 1, cuda_devices=0) == "single" and resolve_strategy("dp", 1, cuda_devices=2) == "dp"
    with pytest.raises(ValueError, match="one process"):
        resolve_strategy("single", 2)
    with pytest.raises(ValueError, match="one process"):
        resolve_strategy("dp", 2)


def test_dp_without_two_gpus_runs_single_with_one_warning(tmp_path, monkeypatch):
    monkeypatch.setattr("torch.cuda.device_count", lambda: 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["--paper", "vit", "--max-steps", "2", "--strategy", "dp", "--wandb", "disabled",
                     "--out", str(tmp_path / "run")]) == 0
    lines = [str(w.message) for w in caught if "--strategy dp" in str(w.message)]
    assert lines == ["--strategy dp runs as single: fewer than two CUDA devices are visible"]
    assert load_json(tmp_path / "run" / "result.json")["strategy"] == "single"
