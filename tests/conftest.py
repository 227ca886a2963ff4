"""Shared helpers: run the trainer in this process or under torchrun, and read wandb's offline files."""

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from filelock import FileLock

ROOT = Path(__file__).resolve().parent.parent

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two test processes share the two cores: one thread each, for their torch and for the processes
    # they start (torchrun already gives its workers one each), so that no thread spins waiting for a
    # core another process holds.
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
RESULTS_BEFORE = pytest.StashKey[dict]()


@pytest.fixture(scope="session", autouse=True)
def _away_from_the_repository(tmp_path_factory):
    """For the whole session, the fixtures of every scope included: no real wandb key, nothing written
    into the user's home folder (wandb's folders, the data cache of common.data.mnist), and a working
    folder outside the repository, so that default runs/ and results/ never land in the repository."""
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("WANDB_API_KEY", raising=False)
        mp.setenv("PAPER_STUDY_CACHE", str(home / "cache"))
        mp.setenv("NETRC", str(home / ".netrc"))
        mp.setenv("WANDB_CONFIG_DIR", str(home / "wandb-config"))
        mp.setenv("WANDB_CACHE_DIR", str(home / "wandb-cache"))
        mp.setenv("WANDB_DATA_DIR", str(home / "wandb-data"))
        mp.chdir(tmp_path_factory.mktemp("session-cwd"))
        yield


@pytest.fixture(autouse=True)
def _fresh_working_folder(monkeypatch, tmp_path_factory):
    """Each test starts in an empty folder of its own."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


def _results_store() -> dict:
    return {p.name: p.read_bytes() for p in sorted((ROOT / "results").glob("*"))}


def pytest_sessionstart(session):
    session.config.stash[RESULTS_BEFORE] = _results_store()


def pytest_sessionfinish(session, exitstatus):
    """The suite fails if it changed the repository's results store: tests write their runs elsewhere."""
    before, after = session.config.stash.get(RESULTS_BEFORE, None), _results_store()
    if before is not None and after != before:
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        print(f"\nthe tests changed the repository's results/: {', '.join(changed)}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def made_once(tmp_path_factory, name: str, make) -> Path:
    """A folder that `make(folder)` fills once per test session, however many xdist workers ask for
    it: the first makes it under a lock, the others wait and read it. A module's runs (torchrun
    launches, mostly) would otherwise be made again on every worker that runs one of its tests."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the session's, shared by workers
    folder = root / f"once-{name}"
    with FileLock(str(root / f"once-{name}.lock")):
        if not (folder / ".made").exists():
            if folder.exists():  # a worker that failed making it left a part
                import shutil

                shutil.rmtree(folder)
            folder.mkdir()
            make(folder)
            (folder / ".made").touch()
    return folder


def need_files(path: str | Path, how: str) -> Path:
    """`path`, for a test that reads real files installed outside the repository (Debian's Fashion-MNIST):
    where they are missing the test is skipped with a line saying how to get them, except under CI
    (the variable CI set, as .ci/run sets it after installing them), where it fails."""
    if not Path(path).exists():
        message = f"{path} is missing; {how}"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (CI is set: this test must not be skipped)")
        pytest.skip(message)
    return Path(path)


def refusal(flags: dict, world_size: int) -> str:
    """The one-line ConfigError that validation gives these config values on this many processes."""
    from common.config import TrainConfig, validate
    from common.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        validate(TrainConfig.from_dict(flags), world_size=world_size)
    return str(e.value)


def refused(capsys, argv: list[str]) -> str:
    """train.py's one line for a mistake (exit code 2), run in this process."""
    from train import main

    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def launch_env() -> dict:
    """This process's environment for a fresh launch: without the wandb service that an
    in-process test run started (wandb exports its address) and without torchrun's variables."""
    return {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "WANDB_SERVICE")}


def torchrun_command(nproc: int = 2) -> list[str]:
    """`torchrun --nproc_per_node N`, on a free port of its own (tests run side by side)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master-port", str(free_port())]


def torchrun(args: list[str], cwd: Path, nproc: int = 2, timeout: int = 300) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node N train.py ARGS` from `cwd`, as a user types it."""
    cmd = [*torchrun_command(nproc), str(ROOT / "train.py"), *args]
    proc = subprocess.run(cmd, cwd=cwd, env=launch_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def torchrun_many(runs: list[list[str]], cwd: Path, nproc: int = 2, timeout: int = 600) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node N train.py ARGS` for each ARGS of `runs`, in one launch (tests/launch_many.py):
    a fixture's runs on as many processes pay the processes' start once."""
    listing = Path(cwd) / f"launch-{free_port()}.json"
    listing.write_text(json.dumps([[str(a) for a in args] for args in runs]))
    cmd = [*torchrun_command(nproc), str(ROOT / "tests" / "launch_many.py"), str(listing)]
    proc = subprocess.run(cmd, cwd=cwd, env=launch_env(), capture_output=True, text=True, timeout=timeout)
    listing.unlink()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def read_wandb_records(path: Path, timeout: float = 60.0) -> list:
    """The records of an offline `run-<id>.wandb` file, once it holds the run's "exit" record: wandb's
    writer (its own service process) may still be flushing the file when run.finish() has returned,
    so the file is read again until it is complete, for up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        records = parse_wandb_records(path)
        if any(r.HasField("exit") for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def parse_wandb_records(path: Path) -> list:
    """The records of an offline `run-<id>.wandb` file: a 7-byte header, then records in
    LevelDB's log format (32 KiB blocks; each chunk has crc32, length, type) holding protobufs."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block = Path(path).read_bytes(), 32 * 1024
    assert data[:4] == b":W&B", "not a wandb data file"
    pos, records, pending = 7, [], b""
    while pos + 7 <= len(data):
        left_in_block = block - pos % block
        if left_in_block < 7:  # block trailer: zero padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:  # zeros to the end of the block (or of the file)
            pos += left_in_block
            continue
        if pos + 7 + length > len(data):  # a record still being written
            break
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk  # 1 full, 2 first, 3 middle, 4 last
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def wandb_run_folders(run_dir: Path) -> list[Path]:
    return sorted(p for p in (Path(run_dir) / "wandb").glob("*run-*") if p.is_dir())


def load_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def wandb_items(items) -> dict:
    """A history or summary record's items as {"train/loss": value}."""
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(Path(run_dir) / "model.safetensors")


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def bitwise_equal(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def interrupted_copy(run_dir: Path, step: int, dest: Path) -> Path:
    """A copy of a finished run as it stood had it been killed just after its step-`step` checkpoint:
    later checkpoints, the result and the final weights are not there."""
    import shutil

    shutil.copytree(run_dir, dest)
    for ckpt in (dest / "checkpoints").glob("step_*"):
        if int(ckpt.name.removeprefix("step_")) > step:
            shutil.rmtree(ckpt)
    (dest / "result.json").unlink()
    (dest / "model.safetensors").unlink()
    assert (dest / "checkpoints" / f"step_{step}" / ".metadata").exists()
    return dest


def tree_snapshot(folder: Path) -> dict:
    """Every file under `folder` with its bytes, to show that nothing changed."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def assert_same_outputs(ours, theirs, x, atol: float = 1e-5):
    """Our model and a reference implementation in eval mode on the same input: the same shape and
    values within atol, on outputs that differ enough between inputs and classes to tell (a check
    on near-constant outputs could not fail). Returns the reference's output."""
    import torch

    with torch.no_grad():
        expected, got = theirs(x), ours(x)
    assert got.shape == expected.shape
    assert (got - expected).abs().max() < atol
    assert expected.std() > 0.1
    return expected


def randomize_batch_norm(model, linear: bool = False):
    """Random scales, shifts and running statistics in every batch norm (and, with linear, random
    fully connected layers), in eval mode, so that a tensor mapped to the wrong place changes the output."""
    import torch
    import torch.nn as nn

    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.2)
                m.running_mean.normal_(0, 0.2)
                m.running_var.uniform_(0.5, 2.0)
            elif linear and isinstance(m, nn.Linear):
                m.weight.normal_(0, 0.5)
                m.bias.normal_(0, 0.5)
    return model.eval()


def pad_batch(images: list) -> tuple:
    """Images (C, h_i, w_i) zero-padded at the bottom and right to the largest, and the mask (B, H, W)."""
    import torch

    H, W = max(x.shape[1] for x in images), max(x.shape[2] for x in images)
    batch = torch.zeros(len(images), images[0].shape[0], H, W)
    mask = torch.zeros(len(images), H, W, dtype=torch.bool)
    for i, x in enumerate(images):
        batch[i, :, : x.shape[1], : x.shape[2]] = x
        mask[i, : x.shape[1], : x.shape[2]] = True
    return batch, mask
