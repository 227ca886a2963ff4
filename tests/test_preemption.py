"""A run told to stop (SIGTERM, SIGUSR1, --time-limit) stops after a step with a checkpoint, says how
to resume in one line, exits with 75, leaves stopped.json for a scheduler's script (none after a crash,
none once resumed), and resumes to the uninterrupted run's weights bit for bit (the runs of
tests/test_checkpoint.py): in one process and in 2 under torchrun (the signal sent to torchrun)."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from common import checkpoint, trainer
from common.preemption import EXIT_PREEMPTED, STOPPED, StopSignals, parse_time_limit
from tests.conftest import ROOT, bitwise_equal, launch_env, torchrun, torchrun_command, weights
from tests.test_checkpoint import FLAGS as UNINTERRUPTED, ddp_run, single_run  # noqa: F401 (the fixtures)
from train import main

pytestmark = pytest.mark.slow  # processes launched or runs trained: left out of `-m "not slow"`

# the uninterrupted runs' flags (30 steps, in one process and with ddp), logging every step to see where it is
FLAGS = [*UNINTERRUPTED, "--log-every", "1", "--wandb", "disabled"]


def steps_logged(run) -> int:
    path = run / "metrics.jsonl"
    return path.read_text().count('"train/loss"') if path.exists() else 0


def stop_after(cmd: list[str], run, step: int, cwd) -> tuple[int, str, str]:
    """Start `cmd`, send it SIGTERM once the run has logged `step` steps; its exit code, stdout and stderr."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 240
    while steps_logged(run) < step and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=240)
    return proc.returncode, out, err


def stopped_step(err: str, run) -> int:
    lines = [line for line in err.splitlines() if line.startswith("train.py: stopped by SIGTERM after step")]
    assert len(lines) == 1, err[-2000:]
    assert f"train.py --resume {run}" in lines[0]
    step = int(re.search(r"after step (\d+) of 30", lines[0]).group(1))
    assert 3 <= step < 30 and checkpoint.latest(run).name == f"step_{step}"
    return step


def assert_marked(run, reason: str, step: int, launcher: str) -> None:
    """stopped.json names the reason, the step, its checkpoint (complete: the newest), exit code 75 and
    the command that resumes the run."""
    assert json.loads((run / STOPPED).read_text()) == {
        "reason": reason, "step": step, "checkpoint": str(checkpoint.checkpoint_dir(run, step)),
        "exit_code": EXIT_PREEMPTED, "resume": f"{launcher} train.py --resume {run}"}
    assert checkpoint.latest(run) == checkpoint.checkpoint_dir(run, step)


def test_sigterm_in_one_process_saves_and_resumes_bitwise(single_run, tmp_path):
    run = tmp_path / "stopped"
    cmd = [sys.executable, str(ROOT / "train.py"), *FLAGS, "--out", str(run)]
    code, out, err = stop_after(cmd, run, 3, tmp_path)
    assert code == EXIT_PREEMPTED
    step = stopped_step(err, run)
    # not a terminal: a plain line per logged step (--log-every 1), no progress-bar frames
    assert "\r" not in out + err and f"step {step}/30: loss " in out
    assert not (run / "result.json").exists()
    assert_marked(run, "SIGTERM", step, "python")
    assert main(["--resume", str(run)]) == 0
    assert bitwise_equal(weights(run), weights(single_run)) and not (run / STOPPED).exists()


def test_sigterm_to_torchrun_stops_every_rank_at_one_step_and_resumes_bitwise(ddp_run, tmp_path):
    run = tmp_path / "stopped"
    _, _, err = stop_after([*torchrun_command(2), str(ROOT / "train.py"), *FLAGS, "--out", str(run)], run, 3,
                           tmp_path)
    step = stopped_step(err, run)  # torchrun itself exits 1 after a signal; its workers exit 75
    assert "--resume" in err and len(list((checkpoint.checkpoint_dir(run, step)).glob("*.distcp"))) == 2
    assert_marked(run, "SIGTERM", step, "torchrun --nproc_per_node 2")  # what a script requeues on
    torchrun(["--resume", str(run)], cwd=tmp_path)
    assert bitwise_equal(weights(run), weights(ddp_run)) and not (run / STOPPED).exists()


def test_time_limit_stops_with_a_checkpoint_and_a_crash_leaves_no_marker(tmp_path, monkeypatch):
    run = tmp_path / "run"
    # this test process started long before a 1-second limit: the run stops after its first step
    assert main(FLAGS + ["--time-limit", "00:01", "--out", str(run)]) == EXIT_PREEMPTED
    assert_marked(run, "--time-limit", 1, "python")
    # the resume loads step_1 (the marker goes), then crashes at step 3: a crash writes none, so a script
    # that requeues on the marker does not requeue a run that crashes at the same step every time
    next_batch = trainer.Trainer.next_batch

    def crashing(self, batches, padding):
        if self.state.step + 1 == 3:
            raise RuntimeError("a bug at step 3")
        return next_batch(self, batches, padding)

    monkeypatch.setattr(trainer.Trainer, "next_batch", crashing)
    with pytest.raises(RuntimeError, match="a bug at step 3"):
        main(["--resume", str(run), "--time-limit", "10:00:00"])
    assert not (run / STOPPED).exists() and not (run / "result.json").exists()


def test_sigusr1_is_noted_and_a_second_signal_changes_nothing():
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.reason(step_seconds=1.0, save_seconds=1.0) == "SIGUSR1"
    assert signal.getsignal(signal.SIGTERM) is not stop._note  # the handlers are given back


def test_time_limits():
    assert parse_time_limit("1:30:00") == 5400 and parse_time_limit("90:00") == 5400
    assert parse_time_limit("2-00:00:30") == 2 * 86400 + 30
    for bad in ("90", "1:61:00", "a:00", "1-2-00:00"):
        with pytest.raises(ValueError, match="HH:MM:SS"):
            parse_time_limit(bad)
    assert main(["--paper", "vit", "--time-limit", "soon", "--wandb", "disabled"]) == 2


def test_a_bad_flag_under_torchrun_is_torchruns_root_cause(tmp_path):
    proc = subprocess.run([*torchrun_command(2), str(ROOT / "train.py"), "--paper", "vitt"], cwd=tmp_path,
                          env=launch_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0
    root_cause = proc.stderr[proc.stderr.index("Root Cause"):]
    assert "traceback : train.py: error: unknown paper 'vitt'; choose from: " in root_cause
