"""Shared helpers: run the trainer in this process or under torchrun, and read wandb's offline files."""

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _no_wandb_login(monkeypatch, tmp_path_factory):
    """No test may find a real wandb key or write into the user's home folder."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(home / ".netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(home / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(home / "wandb-cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(home / "wandb-data"))


def torchrun(args: list[str], cwd: Path, nproc: int = 2, timeout: int = 300) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node N train.py ARGS` from `cwd`, as a user types it."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), str(ROOT / "train.py"), *args]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def read_wandb_records(path: Path) -> list:
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
        if length == 0 and kind == 0:
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
