"""Experiment tracking: Weights & Biases on rank 0, one wandb run per launch.

A wandb failure never stops training: the tracker warns once and goes on
without it. Other ranks get a tracker that does nothing.
"""

from __future__ import annotations

import json
import netrc
import os
import platform
import shlex
import subprocess
import warnings
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from common.errors import ConfigError

if TYPE_CHECKING:  # torch is imported where a device is named: the tools read results without it
    import torch


def has_api_key() -> bool:
    """True when wandb could log in without asking: WANDB_API_KEY, or a netrc entry for its host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    path = os.environ.get("NETRC") or Path.home() / ".netrc"
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def base_url() -> str:
    return os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")


def unreachable(url: str, timeout: float = 10.0) -> str | None:
    """Why no connection to the url's host opens within `timeout` seconds, or None if one does."""
    import socket

    parts = urlparse(url)
    try:
        socket.create_connection((parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)),
                                 timeout=timeout).close()
        return None
    except OSError as e:
        return f"{type(e).__name__}: {e}"


def resolve_mode(mode: str) -> str:
    if mode == "auto":
        return "online" if has_api_key() else "offline"
    return mode


class Tracker:
    """Logs to wandb, and every logged row also to `run_dir/metrics.jsonl` (so curves can be
    drawn offline). Wandb is skipped when disabled or after a failure; other ranks use NullTracker.

    Args:
        mode: online, offline or disabled (resolve "auto" first).
        resume_id: continue this wandb run (a resumed or restarted training run).
        project: the wandb project.
        run_dir: the run directory; wandb's own files go to `run_dir/wandb/`.
        name: the run's display name.
        config: the resolved config, logged as the run's config.
        group: the wandb group (a sweep's name), or None.
    """

    def __init__(self, mode: str, project: str, run_dir: Path, name: str, config: dict, resume_id: str | None = None,
                 group: str | None = None):
        self.run = None
        self.mode = mode
        self.metrics_file = Path(run_dir) / "metrics.jsonl"
        if mode == "disabled":
            return
        why = unreachable(base_url()) if mode == "online" else None
        if why:  # no network: log offline, to upload later, rather than wait for wandb's own timeouts
            print(f"wandb: cannot reach {base_url()} ({why}); logging offline instead: upload the run later with "
                  f"`wandb sync {Path(run_dir) / 'wandb'}/offline-run-*`", flush=True)
            self.mode = mode = "offline"
        try:
            import wandb

            self.run = wandb.init(
                project=project, name=name, dir=str(run_dir), mode=mode, config=config, group=group,
                id=resume_id, resume="allow" if resume_id else None,
                settings=wandb.Settings(silent=True, console="off", x_disable_stats=True, init_timeout=30),
            )
        except Exception as e:  # wandb must never stop training
            self._fail(e)

    def _fail(self, error: Exception) -> None:
        warnings.warn(f"wandb failed ({type(error).__name__}: {error}); training goes on without it", stacklevel=3)
        self.run = None

    @property
    def run_id(self) -> str | None:
        return self.run.id if self.run is not None else None

    @property
    def sync_dir(self) -> str | None:
        return self.run.settings.sync_dir if self.run is not None else None

    def log(self, values: dict, step: int) -> None:
        if self.metrics_file is not None:
            with self.metrics_file.open("a") as f:  # one JSON object per line; a resumed run appends
                f.write(json.dumps({"step": step} | values) + "\n")
        if self.run is None:
            return
        try:
            self.run.log(values, step=step)
        except Exception as e:
            self._fail(e)

    def summary(self, values: dict) -> None:
        if self.run is None:
            return
        try:
            self.run.summary.update(values)
        except Exception as e:
            self._fail(e)

    def finish(self) -> str | None:
        """Close the run; returns a line saying where it went."""
        if self.run is None:
            return None
        run, sync_dir = self.run, self.sync_dir
        try:
            url = run.url if self.mode == "online" else None
            run.finish()
        except Exception as e:
            self._fail(e)
            return None
        self.run = None
        if self.mode == "offline":
            return f"wandb: offline run in {sync_dir}; upload it with `wandb sync {sync_dir}`"
        return f"wandb: {url}"


def find_wandb_id(run_dir: Path) -> str | None:
    """The id of the wandb run that a run directory already holds (its folder ends in -<id>)."""
    folders = sorted((Path(run_dir) / "wandb").glob("*run-*-*"))
    return folders[-1].name.rsplit("-", 1)[1] if folders else None


class NullTracker(Tracker):
    """What ranks other than 0 use."""

    def __init__(self):
        self.run = None
        self.mode = "disabled"
        self.metrics_file = None



# ---------------------------------------------------------------- what a result records


def uncommitted_changes() -> list[str]:
    """The tracked files of this checkout with uncommitted changes (`git status --porcelain` lines);
    empty outside a git checkout."""
    root = Path(__file__).resolve().parent.parent
    try:
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return []
    return status.stdout.splitlines()


def git_commit() -> str | None:
    """The repo's commit, with "-dirty" when tracked files have uncommitted changes."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit.stdout.strip() + ("-dirty" if uncommitted_changes() else "")


def provenance(commits: list[str | None], end: str | None) -> dict:
    """What a result records of the code it ran: `commit`, the one its last process started at (Python
    reads the code then: a checkout changed under a running process does not change what it runs), and
    `commit_at_start`, the run's first ("-dirty": tracked files had uncommitted changes). Where the run
    resumed at other commits, `commits`: each in order. Where the checkout moved on while the last process
    ran, `checkout_at_end`: the commit it was at when the run finished."""
    ran_on = list(dict.fromkeys(commits))
    return {"commit": commits[-1], "commit_at_start": commits[0], **({"commits": ran_on} if len(ran_on) > 1 else {}),
            **({"checkout_at_end": end} if end != commits[-1] else {})}


def short_commit(result: dict) -> str:
    """A result's commit in 7 characters, "*" after it when the tree was dirty, and "start..end" when the
    run started at another commit than it ended at."""
    short = lambda c: "" if not c else c[:7] + ("*" if c.endswith("-dirty") else "")
    end, start = result.get("commit"), result.get("commit_at_start", result.get("commit"))
    return short(end) if start == end else f"{short(start)}..{short(end)}"


SWEEP_ENV = "PAPER_STUDY_SWEEP"  # set by common.sweep for each run it starts: {"name", "key", "combination"}


def sweep_tag() -> dict | None:
    """The sweep a run belongs to: its name, the key of its combination and the combination's
    parameters, from what common.sweep sets (SWEEP_ENV), or from a `wandb agent` (its sweep id as
    the name, the parameters from the file it writes); None for a run outside a sweep."""
    if os.environ.get(SWEEP_ENV):
        return json.loads(os.environ[SWEEP_ENV])
    sweep_id, params = os.environ.get("WANDB_SWEEP_ID"), os.environ.get("WANDB_SWEEP_PARAM_PATH")
    if not sweep_id:
        return None
    combination = {}
    if params and Path(params).is_file():
        import yaml

        combination = {k: v.get("value") for k, v in (yaml.safe_load(Path(params).read_text()) or {}).items()
                       if isinstance(v, dict) and k != "wandb_version"}
    return {"name": sweep_id, "key": os.environ.get("WANDB_RUN_ID"), "combination": combination}


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's with its cores and vector instructions: "AVX2, no bf16" is a CPU whose
    bf16 matrix products are emulated (tens of times slower than fp32), "+bf16" one with avx512_bf16 or
    AMX, where autocast to bf16 can pay."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    bf16 = "+bf16" if flags & {"avx512_bf16", "amx_bf16"} else ", no bf16" if flags else ""
    return f"CPU: {name} ({os.cpu_count()} cores, {torch.backends.cpu.get_cpu_capability()}{bf16})"


def command_line(argv: list[str]) -> str:
    """How this run was launched, as a command a user can paste."""
    nproc = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    nnodes = int(os.environ.get("WORLD_SIZE", "1")) // max(nproc, 1)
    if "TORCHELASTIC_RUN_ID" in os.environ:
        launcher = ["torchrun"] + (["--nnodes", str(nnodes)] if nnodes > 1 else []) + ["--nproc_per_node", str(nproc)]
    else:
        launcher = ["python"]
    return shlex.join(launcher + ["train.py"] + argv)


def write_json(path: Path, values: dict) -> None:
    """Write atomically: a reader sees the old file or the whole new one, never half."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(values, indent=2) + "\n")
    os.replace(tmp, path)


def store_result(result: dict, results_dir: Path) -> Path:
    """Add a finished run's result to the local results store: one file per run, named by its run id.

    Written to a temporary file and then hard-linked into place, which fails rather than
    overwrite: several runs may finish at once, and an entry is never replaced.
    """
    results_dir = Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    final = results_dir / f"{result['run_id']}.json"
    tmp = results_dir / f".{result['run_id']}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    try:
        os.link(tmp, final)
    except FileExistsError:
        warnings.warn(f"{final} already holds this run's result; left as it was", stacklevel=2)
    finally:
        tmp.unlink()
    return final


def local_results(results_dir: str | Path) -> list[dict]:
    """Every result in the store; an interrupted run never wrote one."""
    folder = Path(results_dir)
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []


def find_result(run: str, results_dir: str | Path) -> tuple[dict, Path]:
    """(result, run directory) of a finished run, by its run id (in the store) or its run directory."""
    path = Path(run)
    if (path / "result.json").is_file():
        return json.loads((path / "result.json").read_text()), path
    entry = Path(results_dir) / f"{run}.json"
    if entry.is_file():
        result = json.loads(entry.read_text())
        return result, Path(result["run_dir"])
    raise ConfigError(f"no finished run '{run}': neither a run directory with result.json nor an entry in "
                      f"{results_dir}/ (see python -m common.leaderboard)")
