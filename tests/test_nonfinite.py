"""A NaN in one rank's batch under ddp: --nonfinite stop ends the run in one line naming the step, the
value and the last good checkpoint (exit code 65), and stopped.json says so (reason "nonfinite": not one
to requeue); --nonfinite skip leaves out that step's update on
every rank, counts it, and stops after --nonfinite-patience skipped steps in a row."""

import pytest

import json
import subprocess

from common.errors import EXIT_NONFINITE
from common.preemption import STOPPED
from tests.conftest import ROOT, launch_env, torchrun_command

pytestmark = pytest.mark.slow  # processes launched or runs trained: left out of `-m "not slow"`

FLAGS = ["--paper", "vit", "--max-steps", "8", "--log-every", "1", "--ckpt-every", "2", "--wandb", "disabled"]


def poisoned_run(tmp_path, steps: str, flags: list[str]) -> subprocess.CompletedProcess:
    env = launch_env() | {"NAN_STEPS": steps, "NAN_RANK": "1"}
    return subprocess.run([*torchrun_command(2), str(ROOT / "tests" / "nan_entry.py"), *FLAGS, *flags,
                           "--out", str(tmp_path / "run")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)


def test_stop_names_the_step_the_value_and_the_last_good_checkpoint(tmp_path):
    proc = poisoned_run(tmp_path, "3", [])  # --nonfinite stop is the default
    lines = [line for line in proc.stderr.splitlines() if line.startswith("train.py: error: the loss is nan at")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("train.py: error: the loss is nan at step 3; the run stops; last good checkpoint: ")
    assert f"{tmp_path / 'run' / 'checkpoints' / 'step_2'} (resume with --resume" in lines[0]
    assert "exitcode  : 65" in proc.stderr and not (tmp_path / "run" / "result.json").exists()
    run = tmp_path / "run"
    assert json.loads((run / STOPPED).read_text()) == {
        "reason": "nonfinite", "step": 3, "checkpoint": str(run / "checkpoints" / "step_2"),
        "exit_code": EXIT_NONFINITE, "resume": f"torchrun --nproc_per_node 2 train.py --resume {run}"}


def test_skip_leaves_out_the_update_on_every_rank_and_stops_after_the_patience(tmp_path):
    # step 2 skipped, 3 trained (the count starts again), 4 and 5 skipped: the second in a row stops it
    proc = poisoned_run(tmp_path, "2,4,5", ["--nonfinite", "skip", "--nonfinite-patience", "2"])
    assert "train.py: error: the loss is nan at step 5 (2 steps in a row, --nonfinite-patience 2)" in proc.stderr
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # step 3 trained on a finite loss on both ranks: the skipped update of step 2 left no NaN in the weights
    assert [row["train/skipped_steps"] for row in rows if "train/skipped_steps" in row] == [0, 1, 1, 2], rows
    state = json.loads((tmp_path / "run" / "checkpoints" / "step_4" / "trainer.json").read_text())
    assert state["skipped_steps"] == 2 and state["nonfinite_in_row"] == 1
    marker = json.loads((tmp_path / "run" / STOPPED).read_text())
    assert marker["reason"] == "nonfinite" and marker["step"] == 5 and marker["checkpoint"].endswith("step_4")
