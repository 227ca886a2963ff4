"""Checkpoints: exact resume (mid-epoch, and under another strategy or world size), restart after
a worker is killed, pruning, and refusing bad or foreign checkpoints without touching the run."""

import glob
import json
import os
import pickle
import signal
import subprocess
import time

import pytest
import torch

from common import checkpoint
from common.parallel import Env
from papers.vit.model import VisionTransformer
from tests.conftest import (ROOT, bitwise_equal, interrupted_copy, launch_env, load_json, made_once, max_difference,
                            torchrun, torchrun_command, tree_snapshot, wandb_run_folders, weights)
from train import main

pytestmark = pytest.mark.slow  # processes launched or runs trained: left out of `-m "not slow"`

FLAGS = ["--paper", "vit", "--max-steps", "30", "--ckpt-every", "5", "--keep-ckpts", "10", "--clip-grad", "0.5"]


@pytest.fixture(scope="module")
def single_run(tmp_path_factory):
    """An uninterrupted one-process run with a checkpoint every 5 steps (an epoch is 22 steps)."""
    def make(out):
        assert main(FLAGS + ["--wandb", "offline", "--out", str(out / "run")]) == 0

    return made_once(tmp_path_factory, "checkpoint-single", make) / "run"


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """The same, with ddp on 2 processes."""
    def make(out):
        torchrun(FLAGS + ["--wandb", "disabled", "--out", str(out / "run")], cwd=out)

    return made_once(tmp_path_factory, "checkpoint-ddp", make) / "run"


def test_checkpoints_are_complete_and_pruned(single_run, tmp_path):
    assert [step for step, _ in checkpoint.complete(single_run)] == [5, 10, 15, 20, 25, 30]
    state = json.loads((single_run / "checkpoints" / "step_25" / "trainer.json").read_text())
    assert state["step"] == 25 and state["epoch"] == 1 and state["samples_in_epoch"] == 3 * 64
    assert state["wandb_run_id"] == load_json(single_run / "result.json")["wandb_run_id"]
    assert len(state["history"]) == 1 and state["scheduler"]["last_epoch"] == 25

    run = tmp_path / "run"
    assert main(["--paper", "vit", "--max-steps", "12", "--ckpt-every", "3", "--wandb", "disabled",
                 "--out", str(run)]) == 0  # default --keep-ckpts 2
    assert [step for step, _ in checkpoint.complete(run)] == [9, 12]
    unfinished = run / "checkpoints" / "step_15"  # a save that crashed before its .metadata
    unfinished.mkdir()
    (unfinished / "__0_0.distcp").write_bytes(b"partial")
    assert checkpoint.latest(run) == run / "checkpoints" / "step_12"


@pytest.mark.parametrize("step", [5, 25])  # mid first epoch; mid second epoch, after an evaluation
def test_one_process_resume_is_bitwise_equal(single_run, tmp_path, step):
    run = interrupted_copy(single_run, step, tmp_path / "run")
    assert main(["--resume", str(run)]) == 0
    assert bitwise_equal(weights(run), weights(single_run))
    resumed, uninterrupted = load_json(run / "result.json"), load_json(single_run / "result.json")
    for key in ("final", "best", "best_epoch", "steps", "wandb_run_id"):
        assert resumed[key] == uninterrupted[key], key
    ids = {folder.name.rsplit("-", 1)[1] for folder in wandb_run_folders(run)}
    assert ids == {uninterrupted["wandb_run_id"]}, "the resumed run continues the same wandb run"


def test_a_run_resumed_at_another_commit_records_each(single_run, tmp_path, monkeypatch):
    """The commit it started at, the one it resumed and ended at ("-dirty": uncommitted changes), and the
    leaderboard's short form of both."""
    from common.tracking import short_commit

    run = interrupted_copy(single_run, 5, tmp_path / "run")
    later = "f" * 40 + "-dirty"
    monkeypatch.setattr("common.trainer.git_commit", lambda: later)
    assert main(["--resume", str(run)]) == 0
    first = load_json(single_run / "result.json")
    assert first["commit_at_start"] == first["commit"] and "commits" not in first
    resumed = load_json(run / "result.json")
    assert (resumed["commit_at_start"], resumed["commit"]) == (first["commit"], later)
    assert resumed["commits"] == [first["commit"], later]
    assert short_commit(resumed) == f"{short_commit(first)}..fffffff*"


def test_resume_with_the_original_flags_repeated_is_bitwise_equal(single_run, tmp_path):
    """The command that started the run, with --resume added: the flags equal the saved ones, so it resumes."""
    run = interrupted_copy(single_run, 10, tmp_path / "run")
    assert main(FLAGS + ["--batch-size", "64", "--wandb", "disabled", "--resume", str(run)]) == 0
    assert bitwise_equal(weights(run), weights(single_run))


def test_a_checkpoint_and_config_saved_before_the_typed_state_resume_bitwise(single_run, tmp_path):
    """trainer.json without the keys added since (commits, skipped_steps, metrics, best_step, lr, warmup_steps),
    config.json with the run-time values it used to hold: the run resumes, to the same weights."""
    run = interrupted_copy(single_run, 25, tmp_path / "run")
    state_file = run / "checkpoints" / "step_25" / "trainer.json"
    state = json.loads(state_file.read_text())
    new = ("commits", "skipped_steps", "nonfinite_in_row", "metrics", "best_step", "lr", "warmup_steps")
    state_file.write_text(json.dumps({k: v for k, v in state.items() if k not in new}))
    config = load_json(run / "config.json")
    (run / "config.json").write_text(json.dumps(config | {"lr_in_use": 1e-3, "warmup_in_use": 0}))
    assert main(["--resume", str(run), "--wandb", "disabled"]) == 0
    assert bitwise_equal(weights(run), weights(single_run))
    resumed, uninterrupted = load_json(run / "result.json"), load_json(single_run / "result.json")
    for key in ("final", "best", "best_epoch", "steps", "lr", "warmup_steps"):
        assert resumed[key] == uninterrupted[key], key
    assert resumed["commit_at_start"] is None


def test_a_ddp_checkpoint_resumes_under_fsdp_and_in_one_process(ddp_run, tmp_path):
    fsdp = interrupted_copy(ddp_run, 10, tmp_path / "fsdp")
    torchrun(["--resume", str(fsdp), "--strategy", "fsdp"], cwd=tmp_path)
    assert load_json(fsdp / "result.json")["strategy"] == "fsdp"
    assert max_difference(weights(fsdp), weights(ddp_run)) < 1e-5

    single = interrupted_copy(ddp_run, 10, tmp_path / "single")
    assert main(["--resume", str(single)]) == 0
    assert load_json(single / "result.json")["world_size"] == 1
    assert max_difference(weights(single), weights(ddp_run)) < 1e-5


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry))
        except OSError:
            pass
    return kids


def test_torchrun_restarts_a_killed_worker_and_the_run_finishes_once(ddp_run, tmp_path):
    """SIGKILL one worker just after the first checkpoint: torchrun restarts the group, the new
    workers find the same default run directory, resume mid-epoch (step 5 of a 22-step epoch), and
    finish with the uninterrupted ddp run's weights, bit for bit."""
    cmd = [*torchrun_command(2), "--max-restarts", "1", str(ROOT / "train.py"), *FLAGS, "--wandb", "offline"]
    launcher = subprocess.Popen(cmd, cwd=tmp_path, env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
    deadline = time.time() + 120
    while not glob.glob(str(tmp_path / "runs/*/checkpoints/step_*/.metadata")):
        assert time.time() < deadline and launcher.poll() is None, "no checkpoint appeared"
        time.sleep(0.02)
    workers = _children(launcher.pid)
    assert len(workers) == 2
    os.kill(workers[-1], signal.SIGKILL)
    output, _ = launcher.communicate(timeout=180)
    assert launcher.returncode == 0, output[-3000:]
    assert "resumed at step" in output

    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1, "restarted workers must find the first attempt's run directory"
    result = load_json(runs[0] / "result.json")
    assert result["steps"] == 30
    ids = {folder.name.rsplit("-", 1)[1] for folder in wandb_run_folders(runs[0])}
    assert result["wandb_run_id"] is not None and ids == {result["wandb_run_id"]}, "one wandb run across the restart"
    assert bitwise_equal(weights(runs[0]), weights(ddp_run))


# ---------------------------------------------------------------- bad input


def resume_fails(run, capsys, *words) -> None:
    before = tree_snapshot(run)
    assert main(["--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    for word in words:
        assert word in err[0], err[0]
    assert tree_snapshot(run) == before, "nothing of the run directory may change"


def test_a_truncated_checkpoint_is_refused(single_run, tmp_path, capsys):
    run = interrupted_copy(single_run, 10, tmp_path / "run")
    shard = run / "checkpoints" / "step_10" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    resume_fails(run, capsys, "step_10", "corrupted")


def test_garbage_metadata_is_refused(single_run, tmp_path, capsys):
    run = interrupted_copy(single_run, 10, tmp_path / "run")
    (run / "checkpoints" / "step_10" / ".metadata").write_bytes(b"\x00not a pickle")
    resume_fails(run, capsys, "step_10", "metadata")


def test_metadata_cannot_run_code(single_run, tmp_path, capsys):
    run = interrupted_copy(single_run, 10, tmp_path / "run")
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    (run / "checkpoints" / "step_10" / ".metadata").write_bytes(pickle.dumps(Payload()))
    resume_fails(run, capsys, "refusing to load", "system")
    assert not marker.exists()


def test_a_checkpoint_of_another_paper_or_shape_is_refused(single_run, tmp_path, capsys):
    run = interrupted_copy(single_run, 10, tmp_path / "run")
    state_file = run / "checkpoints" / "step_10" / "trainer.json"
    state = json.loads(state_file.read_text())
    state_file.write_text(json.dumps(state | {"paper": "resnet"}))
    resume_fails(run, capsys, "holds resnet tiny, not vit tiny")

    state_file.write_text(json.dumps(state))  # the right names, but a narrower model saved as step 40
    other = VisionTransformer(img_size=8, patch_size=2, in_chans=1, num_classes=10, dim=64, depth=2, num_heads=4,
                              mlp_dim=128)
    optimizer = torch.optim.AdamW(other.parameters())
    checkpoint.save(run, 40, other, optimizer, state | {"scheduler": {}, "scaler": {}}, Env(0, 1, 0, torch.device("cpu")),
                    keep=10)
    resume_fails(run, capsys, "step_40", "holds another model", "64) there")


@pytest.mark.parametrize("case, flags, words", [
    ("no run", ["--resume", "{tmp}/nothing"], ["no run there"]),
    ("finished", ["--resume", "{run}"], ["has finished"]),
    ("changed lr", ["--resume", "{run}", "--lr", "0.1"],
     ["--lr cannot change when resuming", "the run has 0.0005, you gave 0.1", "--strategy"]),
    ("changed paper", ["--resume", "{run}", "--paper", "resnet", "--max-steps", "30"],
     ["--paper cannot change when resuming", "the run has 'vit', you gave 'resnet'"]),
])
def test_resume_input_errors(single_run, tmp_path, capsys, case, flags, words):
    flags = [f.format(tmp=tmp_path, run=single_run) for f in flags]
    before = tree_snapshot(single_run)
    assert main(flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(w in err[0] for w in words), err
    assert tree_snapshot(single_run) == before


def test_keep_ckpts_keeps_the_newest_and_the_best(tmp_path):
    for step in (3, 6, 9, 12):
        folder = checkpoint.checkpoint_dir(tmp_path, step)
        folder.mkdir(parents=True)
        (folder / ".metadata").write_bytes(b"done")
    checkpoint.prune(tmp_path, 2, best_step=3)
    assert [step for step, _ in checkpoint.complete(tmp_path)] == [3, 9, 12]
    checkpoint.prune(tmp_path, 1)
    assert [step for step, _ in checkpoint.complete(tmp_path)] == [12]


def test_a_deletion_cut_short_leaves_a_run_that_resumes(single_run, tmp_path, monkeypatch):
    """A kill inside the deletion of an old checkpoint: it has lost its .metadata first, so it no longer
    counts, and the run resumes from the newest as if nothing happened."""
    run = interrupted_copy(single_run, 25, tmp_path / "run")

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.prune(run, 1)
    monkeypatch.undo()
    assert (run / "checkpoints" / "step_5").is_dir()  # its files are still there
    assert [step for step, _ in checkpoint.complete(run)] == [10, 15, 20, 25]
    assert main(["--resume", str(run)]) == 0
    assert bitwise_equal(weights(run), weights(single_run))
