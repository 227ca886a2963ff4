"""Sweeps (common.sweep): W&B sweep files run as ordinary train.py runs, validated before any starts,
resumable after a kill, with their results tagged and grouped over seeds."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common import sweep
from common.config import build_parser
from tests.conftest import ROOT, launch_env, load_json, read_wandb_records

pytestmark = pytest.mark.slow  # processes launched or runs trained: left out of `-m "not slow"`

# a value every train.py flag takes, as a sweep would give it (YAML's types)
FLAG_VALUES = {
    "list": False, "paper": "vit", "flavor": "tiny", "init": "timm:vit_tiny_patch16_224", "init-tensors": "fc.+",
    "model-kwargs": "depth=1 mlp_dim=64", "lora": 4, "lora-alpha": 16.0, "lora-targets": "qkv,o", "dataset": "digits", "data-dir": "data", "download": True, "hf-split": "train,test",
    "hf-columns": "text=text", "pixel-weights": "none",
    "train-fraction": 0.5, "image-size": 32, "pad-multiple": 8, "bucketing": "size", "epochs": 3, "eval-samples": 64,
    "max-steps": 10, "batch-size": "auto", "recipe": "paper", "optimizer": "sgd", "lr": 1e-3,
    "momentum": 0.9, "nesterov": True, "weight-decay": 0.0, "warmup-steps": 0, "lr-scaling": "sqrt",
    "schedule": "step", "milestones": "0.5,0.75", "gamma": 0.1, "gammas": "0.4,0.5", "augment": "crop:4,flip",
    "label-smoothing": 0.1, "teacher": "runs/teacher", "distillation": "hard", "distillation-tau": 3.0,
    "distillation-lambda": 0.1, "block-size": 64, "seq-len": 50, "tokenizer": "bpe", "vocab-size": 512,
    "beam": 4, "length-penalty": 0.6, "tta": "flip", "seed": 2, "precision": "bf16", "grad-accum": 2, "clip-grad": 1.0,
    "strategy": "ddp", "dp-replicate": 2, "dp-shard": 2, "tp": 2, "sequence-parallel": True,
    "pp": 2, "pp-schedule": "gpipe", "microbatches": 4, "ac": "full", "ckpt-every": 5, "keep-ckpts": 3, "time-limit": "1:00:00", "nonfinite": "skip",
    "nonfinite-patience": 3, "resume": "runs/x", "compile": False,
    "compile-mode": "default", "compile-backend": "eager", "out": "runs/y", "results-dir": "results",
    "rerun": "some-run", "wandb": "offline", "wandb-project": "p", "log-every": 5, "num-workers": 1, "profile": 3,
}


def test_every_flag_form_a_sweep_writes_parses():
    """Each of train.py's flags as `${args}` writes it (--flag=value, a switch as --flag=True) and as
    `${args_no_boolean_flags}` writes it (--flag, or nothing for False), through wandb's own builder."""
    parser = build_parser()
    flags = {a.option_strings[0][2:] for a in parser._actions if a.option_strings and a.dest != "help"}
    assert flags == set(FLAG_VALUES), "a new train.py flag needs a value here"
    for style in ("${args}", "${args_no_boolean_flags}"):
        spec = sweep.Sweep("t", Path("t.yaml"), "grid", {}, ["${program}", style])
        argv = sweep.train_args(sweep.command_line(spec, FLAG_VALUES))
        parsed = vars(parser.parse_args(argv))
        for flag, value in FLAG_VALUES.items():
            dest = flag.replace("-", "_")
            if value is False and style != "${args}":
                assert dest not in parsed, flag  # left out: the flag's own default
            elif flag == "model-kwargs":
                assert parsed[dest] == {"depth": 1, "mlp_dim": 64}
            else:
                assert parsed[dest] == value, (style, flag)


def test_a_grid_in_the_files_order_and_random_draws_that_repeat(tmp_path):
    grid = sweep.Sweep("g", tmp_path, "grid", {"lr": {"values": [0.1, 0.2]}, "seed": {"values": [0, 1, 2]},
                                               "paper": {"value": "vit"}}, [])
    assert sweep.combinations(grid) == [{"lr": lr, "seed": s, "paper": "vit"} for lr in (0.1, 0.2) for s in (0, 1, 2)]
    params = {"lr": {"distribution": "log_uniform_values", "min": 1e-4, "max": 1e-1},
              "epochs": {"min": 2, "max": 9}, "seed": {"values": [0, 1]}}
    draws = sweep.combinations(sweep.Sweep("r", tmp_path, "random", params, [], run_cap=20))
    assert draws == sweep.combinations(sweep.Sweep("r", tmp_path, "random", params, [], run_cap=20))
    assert len(draws) == 20 and all(1e-4 <= d["lr"] <= 0.1 and d["epochs"] in range(2, 10) for d in draws)
    assert len(sweep.combinations(sweep.Sweep("c", tmp_path, "random", {"seed": {"values": [0, 1]}}, [],
                                              run_cap=10))) == 2  # a repeated draw runs once


def test_a_torchrun_command_runs_one_combination_at_a_time():
    assert sweep.processes(["torchrun", "--nproc_per_node", "2", "/x/train.py", "--lr=1"]) == 2
    assert sweep.processes(["/usr/bin/env", "python", "-m", "torch.distributed.run", "--nproc-per-node=4",
                            "train.py"]) == 4
    assert sweep.processes(["/usr/bin/env", "python", "train.py", "--nproc_per_node=4"]) == 1


TINY = """name: {name}
program: train.py
method: grid
metric: {{name: eval/accuracy, goal: maximize}}
parameters:
  paper: {{value: lenet}}
  epochs: {{value: 1}}
  max-steps: {{value: 4}}
  ckpt-every: {{value: 2}}
  batch-size: {{value: 32}}
  seed: {{values: [0, 1, 2]}}
  wandb: {{value: disabled}}
"""


def start(path: Path, cwd: Path, *flags: str) -> subprocess.Popen:
    """`python -m common.sweep FILE` from cwd, in a process group of its own (as a scheduler's job)."""
    env = launch_env() | {"PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "common.sweep", str(path), *flags], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def sweep_results(folder: Path, name: str) -> list[dict]:
    found = [json.loads(p.read_text()) for p in folder.glob("*.json")]
    return [r for r in found if (r.get("sweep") or {}).get("name") == name]


def test_a_sweep_killed_with_its_runs_and_started_again_runs_each_combination_once(tmp_path):
    """3 seeds, 2 at a time: SIGKILL to the sweep's process group after its first result, then the same
    command again: 3 results, one per combination, grouped over seeds."""
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY.format(name="tiny"))
    first = start(path, tmp_path, "--parallel", "2", "--allow-dirty")  # (a test may run on a changed tree)
    deadline = time.monotonic() + 240
    while not sweep_results(tmp_path / "results", "tiny") and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    killed_with = len(sweep_results(tmp_path / "results", "tiny"))
    assert 1 <= killed_with < 3

    again = start(path, tmp_path, "--parallel", "2", "--allow-dirty")
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, out + err
    assert f"{killed_with} in the store already, {3 - killed_with} to run" in out
    results = sweep_results(tmp_path / "results", "tiny")
    combos = sorted((r["config"]["batch_size"], r["config"]["seed"]) for r in results)
    assert combos == [(32, 0), (32, 1), (32, 2)]
    assert len({r["sweep"]["key"] for r in results}) == 3
    for r in results:
        assert r["sweep"]["combination"]["seed"] == r["config"]["seed"] and r["steps"] == 4
        assert r["sweep"]["allow_dirty"] is True
        assert r["run_dir"] == f"runs/tiny/{r['run_id']}" and r["run_id"] == f"tiny-{r['sweep']['key']}"

    table = subprocess.run([sys.executable, "-m", "common.leaderboard", "--sweep", "tiny"], cwd=tmp_path,
                           env=launch_env() | {"PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    rows = [line for line in table.stdout.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert len(rows) == 1 and all(" ± " in row and "  3  [" in row for row in rows), table.stdout


def test_a_failing_combination_is_reported_and_the_rest_go_on(tmp_path):
    """A batch larger than the training split fails in the trainer (after validation); the other runs,
    in the W&B group named after the sweep."""
    path = tmp_path / "fails.yaml"
    path.write_text("program: train.py\nparameters:\n  paper: {value: lenet}\n  max-steps: {value: 2}\n"
                    "  batch-size: {values: [4096, 32]}\n  wandb: {value: offline}\n")
    proc = start(path, tmp_path, "--parallel", "2", "--allow-dirty")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1
    failed = [line for line in err.splitlines() if line.startswith("failed:")]
    assert len(failed) == 1 and "batch-size=4096" in failed[0] and "runs/fails/fails-" in failed[0], err
    log = Path(tmp_path / failed[0].split(": ")[2].split(" (")[0]) / sweep.LOG_NAME
    assert "larger than the 1437 training samples" in log.read_text()
    (result,) = sweep_results(tmp_path / "results", "fails")
    assert result["config"]["batch_size"] == 32
    wandb_file = next((tmp_path / result["run_dir"] / "wandb").glob("offline-run-*/run-*.wandb"))
    run = next(r.run for r in read_wandb_records(wandb_file) if r.HasField("run"))
    assert run.run_group == "fails"


BAD_FILES = {
    "an unknown flag": ("parameters:\n  paper: {value: lenet}\n  lrate: {values: [0.1]}\n", ["lrate", "unrecognized"]),
    "empty values": ("parameters:\n  paper: {value: lenet}\n  lr: {values: []}\n", ["lr", "non-empty list"]),
    "a value the flag refuses": ("parameters:\n  paper: {value: lenet}\n  lr: {values: [0.1, -1]}\n",
                                 ["lr=-1", "positive number"]),
    "a paper that cannot train on the data": ("parameters:\n  paper: {value: lenet}\n  dataset: {value: digits-rows}\n",
                                              ["lenet", "digits-rows", "sequence"]),
    "code in the file": ("parameters: !!python/object/apply:os.system ['touch pwned']\n", ["not a YAML sweep file"]),
    "an unknown key": ("parameter:\n  paper: {value: lenet}\n", ["unknown key 'parameter'"]),
    "bayes": ("method: bayes\nparameters:\n  paper: {value: lenet}\n", ["bayes", "wandb agent"]),
    "random without run_cap": ("method: random\nparameters:\n  paper: {value: lenet}\n", ["run_cap"]),
    "a grid of a distribution": ("parameters:\n  paper: {value: lenet}\n  lr: {min: 0.1, max: 1.0}\n",
                                 ["lr", "grid takes value or values"]),
    "a flag the sweep sets": ("parameters:\n  paper: {value: lenet}\n  out: {value: here}\n", ["--out", "sweep's"]),
    "another program": ("program: other.py\nparameters:\n  paper: {value: lenet}\n", ["other.py", "train.py"]),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_bad_sweep_file_is_one_line_exit_2_and_starts_nothing(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text, words = BAD_FILES[case]
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert sweep.main([str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert all(w in err[0] for w in words), err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]  # no run, no runs/, nothing run


def test_a_sweep_on_a_tree_with_uncommitted_changes_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    """Its runs would record a commit that is not the code they ran; --dry-run (no run) is still allowed."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sweep, "uncommitted_changes", lambda: [" M common/trainer.py", " M README.md"])
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY.format(name="tiny"))
    assert sweep.main([str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert all(w in err[0] for w in ("2 tracked file(s)", "common/trainer.py", "commit", "--allow-dirty")), err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.yaml"]
    assert sweep.main([str(path), "--dry-run"]) == 0
