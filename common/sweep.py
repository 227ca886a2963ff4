"""Sweeps: ordinary train.py runs over a grid (or random draws) of flags and seeds.

    python -m common.sweep FILE.yaml [--parallel N] [--dry-run] [--runs-dir runs]

FILE is a W&B sweep file, so the same file also runs on many machines (`wandb sweep FILE.yaml`,
then `wandb agent SWEEP_ID` on each):

    name: relu-vs-tanh            # the sweep's name (default: the file's stem)
    program: train.py
    method: grid                  # grid, or random with run_cap
    metric: {name: eval/accuracy, goal: maximize}
    parameters:
      paper: {value: alexnet}
      model-kwargs: {values: ["activation=relu", "activation=tanh"]}
      lr: {values: [0.01, 0.02]}
      seed: {values: [0, 1, 2]}
    command: ["${env}", "${interpreter}", "${program}", "${args}"]  # W&B's default; torchrun also works

Each combination's command line is built as `wandb agent` builds it, by wandb's own
`create_sweep_command` and `create_sweep_command_args` (`--lr=0.01`; `${args_no_boolean_flags}`
writes a true switch as `--compile` and leaves out a false one), so train.py receives the same
flags on both paths. Each combination is an ordinary run in `runs/<sweep>/<sweep>-<key>/`, its
result in the results store tagged with the sweep's name, the combination's key and parameters
(common.tracking.sweep_tag; the W&B group is the sweep's name). Locally:

- every combination is validated first, by the code that validates train.py's flags: a bad file is
  one line and exit code 2 before any run starts;
- `--parallel N` runs N combinations at a time, one process each with the cores divided between
  them (OMP_NUM_THREADS); a command that launches torchrun runs one combination at a time;
- a combination whose result is in the store is skipped; one that was cut (the sweep stopped by
  Ctrl-C, or killed with its runs) resumes from its last checkpoint, or starts again without one;
  so a sweep started again completes without redoing or duplicating a combination;
- a combination that fails is reported with its run directory and log, and the rest go on; the
  end lists what failed (exit code 1).

The file is read with yaml.safe_load: it holds data only, never code.
"""

import argparse
import hashlib
import itertools
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from common.errors import ConfigError
from common.tracking import SWEEP_ENV, uncommitted_changes

KEYS = {"name", "description", "program", "method", "metric", "parameters", "command", "run_cap", "project",
        "entity", "early_terminate"}
DEFAULT_COMMAND = ["${env}", "${interpreter}", "${program}", "${args}"]  # wandb agent's
SET_BY_THE_SWEEP = ("out", "resume", "rerun", "list")  # train.py flags a sweep file may not give
DISTRIBUTIONS = ("constant", "categorical", "int_uniform", "uniform", "q_uniform", "log_uniform_values",
                 "q_log_uniform_values", "normal")
LOG_NAME = "sweep.log"  # each run's output, in its run directory
PROGRAM = Path(__file__).resolve().parent.parent / "train.py"  # ${program}, wherever the sweep starts


@dataclass
class Sweep:
    name: str
    path: Path
    method: str
    parameters: dict
    command: list
    run_cap: int | None = None
    metric: dict = field(default_factory=dict)


# ---------------------------------------------------------------- the file


def load(path: str | Path) -> Sweep:
    """The sweep a file describes; ConfigError naming what is wrong with it."""
    import yaml

    path = Path(path)
    try:
        spec = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ConfigError(f"cannot read sweep file {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not a YAML sweep file: {' '.join(str(e).split())}") from None
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: a sweep file is a mapping (program, method, parameters, ...)")
    unknown = sorted(set(spec) - KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown key '{unknown[0]}'; a sweep file has {', '.join(sorted(KEYS))}")
    if spec.get("program", "train.py") != "train.py":
        raise ConfigError(f"{path}: program is {spec['program']!r}; sweeps here run train.py")
    method = spec.get("method", "grid")
    if method not in ("grid", "random"):
        why = " (bayes needs the W&B server: run it with wandb sweep and wandb agent)" if method == "bayes" else ""
        raise ConfigError(f"{path}: method {method!r} does not run locally; use grid or random{why}")
    parameters = spec.get("parameters")
    if not isinstance(parameters, dict) or not parameters:
        raise ConfigError(f"{path}: no parameters to sweep")
    for name, p in parameters.items():
        _check_parameter(path, method, name, p)
    run_cap = spec.get("run_cap")
    if method == "random" and not (isinstance(run_cap, int) and run_cap > 0):
        raise ConfigError(f"{path}: method random draws run_cap combinations; give run_cap, a positive integer")
    command = spec.get("command", DEFAULT_COMMAND)
    if not (isinstance(command, list) and "${program}" in command
            and any(c in command for c in ("${args}", "${args_no_boolean_flags}"))):
        raise ConfigError(f"{path}: command must be a list holding ${{program}} and ${{args}} (or "
                          f"${{args_no_boolean_flags}})")
    name = str(spec.get("name") or path.stem)
    if not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise ConfigError(f"{path}: name {name!r} names folders and runs: use letters, digits, '-', '_' and '.'")
    return Sweep(name, path, method, parameters, [str(c) for c in command], run_cap, spec.get("metric") or {})


def _check_parameter(path: Path, method: str, name: str, p) -> None:
    where = f"{path}: parameter {name}"
    if not isinstance(p, dict):
        raise ConfigError(f"{where}: give value, values or a distribution")
    if "parameters" in p:
        raise ConfigError(f"{where}: nested parameters do not map onto train.py's flags")
    if "values" in p and (not isinstance(p["values"], list) or not p["values"]):
        raise ConfigError(f"{where}: values must be a non-empty list")
    if "value" not in p and "values" not in p:
        if method == "grid":
            raise ConfigError(f"{where}: a grid takes value or values, not a distribution")
        kind = p.get("distribution", "int_uniform" if isinstance(p.get("min"), int) and isinstance(p.get("max"), int)
                     else "uniform")
        if kind not in DISTRIBUTIONS:
            raise ConfigError(f"{where}: distribution {kind!r} does not run locally; use one of "
                              f"{', '.join(DISTRIBUTIONS)}")
        needs = ("mu", "sigma") if kind == "normal" else ("min", "max")
        if any(k not in p for k in needs):
            raise ConfigError(f"{where}: distribution {kind} needs {' and '.join(needs)}")


def _draw(p: dict, rng: random.Random):
    if "value" in p:
        return p["value"]
    if "values" in p:
        return rng.choice(p["values"])
    kind = p.get("distribution", "int_uniform" if isinstance(p.get("min"), int) and isinstance(p.get("max"), int)
                 else "uniform")
    if kind == "normal":
        return rng.gauss(p["mu"], p["sigma"])
    low, high = p["min"], p["max"]
    if kind == "int_uniform":
        return rng.randint(low, high)
    x = math.exp(rng.uniform(math.log(low), math.log(high))) if kind.endswith("log_uniform_values") \
        else rng.uniform(low, high)
    return round(x / p.get("q", 1)) * p.get("q", 1) if kind.startswith("q_") else x


def combinations(sweep: Sweep) -> list[dict]:
    """Every combination of a grid, in the file's order (the last parameter changing fastest), or
    run_cap random draws (from a generator seeded by the sweep's name, so a sweep started again
    draws the same), without repeats."""
    names = list(sweep.parameters)
    if sweep.method == "grid":
        choices = [p["values"] if "values" in p else [p["value"]] for p in sweep.parameters.values()]
        drawn = [dict(zip(names, values)) for values in itertools.product(*choices)]
    else:
        rng = random.Random(int(hashlib.sha256(sweep.name.encode()).hexdigest()[:16], 16))
        drawn = [{n: _draw(sweep.parameters[n], rng) for n in names} for _ in range(sweep.run_cap)]
    unique = {}
    for params in drawn:
        unique.setdefault(key(params), params)
    return list(unique.values())


def key(params: dict) -> str:
    """A combination's short, stable name."""
    return hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:10]


def command_line(sweep: Sweep, params: dict) -> list[str]:
    """The command `wandb agent` runs for these parameters (wandb's own functions), with this Python
    for ${interpreter} (the agent writes "python", whichever is first on the PATH) and this checkout's
    train.py for ${program} (the agent: train.py in the folder it runs in)."""
    from wandb.sdk.launch.sweeps.utils import create_sweep_command, create_sweep_command_args

    command = create_sweep_command(list(sweep.command))
    args = create_sweep_command_args({"args": {k: {"value": v} for k, v in params.items()}})
    args |= {"interpreter": [sys.executable], "program": [str(PROGRAM)], "env": ["/usr/bin/env"]}
    out = []
    for chunk in command:  # as wandb_agent.Agent._command_run substitutes them
        out += (args.get(chunk[2:-1]) or []) if chunk.startswith("${") and chunk.endswith("}") else [chunk]
    return out


def program_at(argv: list[str]) -> int:
    return next(i for i, c in enumerate(argv) if Path(c).name == "train.py")


def train_args(argv: list[str]) -> list[str]:
    return argv[program_at(argv) + 1:]


def processes(argv: list[str]) -> int:
    """How many processes one run of this command uses: torchrun's --nproc_per_node, else 1."""
    if not any(Path(c).name == "torchrun" or c == "torch.distributed.run" for c in argv[: program_at(argv)]):
        return 1
    for i, c in enumerate(argv):
        for flag in ("--nproc_per_node", "--nproc-per-node"):
            if c == flag and i + 1 < len(argv):
                return int(argv[i + 1])
            if c.startswith(flag + "="):
                return int(c.split("=", 1)[1])
    return 1


# ---------------------------------------------------------------- checks, before any run


def validate(sweep: Sweep, params: dict, argv: list[str]):
    """The TrainConfig this combination runs, checked by the code that checks train.py's flags; a
    ConfigError names the combination and what is wrong."""
    from common.config import build_parser, resolve, validate as validate_config

    try:
        flags = vars(build_parser().parse_args(train_args(argv)))
        given = [f for f in SET_BY_THE_SWEEP if f in flags]
        if given:
            raise ConfigError(f"--{given[0]} is the sweep's to set (each combination has its own run directory)")
        cfg = resolve(flags)
        validate_config(cfg, world_size=processes(argv))
    except ConfigError as e:
        raise ConfigError(f"{sweep.path}: combination {describe(params)}: {e}") from None
    return cfg


def describe(params: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


# ---------------------------------------------------------------- running


@dataclass
class Job:
    params: dict
    argv: list[str]
    cfg: object
    run_dir: Path
    proc: subprocess.Popen | None = None
    started: float = 0.0

    @property
    def key(self) -> str:
        return key(self.params)


def stored_keys(results_dir: Path, name: str) -> set[str]:
    """The keys of this sweep's combinations whose result is in the store."""
    keys = set()
    for path in Path(results_dir).glob("*.json"):
        try:
            tag = json.loads(path.read_text()).get("sweep") or {}
        except ValueError:
            continue
        if tag.get("name") == name:
            keys.add(tag.get("key"))
    return keys


def prepare(job: Job) -> list[str] | None:
    """How to go on with a combination that is not in the store: None when its run finished but the store
    missed its result (now added), else the extra flags: resume from its last checkpoint, or a fresh start."""
    from common.checkpoint import latest
    from common.tracking import store_result

    if (job.run_dir / "result.json").is_file():  # killed after result.json, before the store
        store_result(json.loads((job.run_dir / "result.json").read_text()), Path(job.cfg.results_dir))
        return None
    if (job.run_dir / "config.json").is_file() and latest(job.run_dir) is not None:
        return ["--resume", str(job.run_dir)]
    shutil.rmtree(job.run_dir, ignore_errors=True)  # cut before its first checkpoint: start again
    job.run_dir.mkdir(parents=True)
    return ["--out", str(job.run_dir)]


class Runner:
    """Runs a sweep's jobs, `parallel` at a time, and says how far it is."""

    def __init__(self, sweep: Sweep, jobs: list[Job], parallel: int, threads: int, allow_dirty: bool = False):
        self.sweep, self.waiting, self.parallel, self.threads = sweep, list(jobs), parallel, threads
        self.allow_dirty = allow_dirty  # recorded in each run's sweep tag
        self.running: list[Job] = []
        self.done, self.failed, self.durations, self.began = 0, [], [], time.monotonic()

    def status(self) -> str:
        left = len(self.waiting)
        if self.durations:
            mean = sum(self.durations) / len(self.durations)
            eta = f"about {math.ceil(mean * (left + len(self.running) / 2) / self.parallel / 60)} min left"
        else:
            eta = "time left known after the first run"
        return (f"[{self.sweep.name}: {self.done} done, {len(self.running)} running, {left} left, "
                f"{len(self.failed)} failed; {eta}]")

    def start(self, job: Job) -> None:
        extra = prepare(job)
        if extra is None:
            self.done += 1
            print(f"{self.status()} {describe(job.params)}: its finished run's result added to the store", flush=True)
            return
        tag = {"name": self.sweep.name, "key": job.key, "combination": job.params,
               **({"allow_dirty": True} if self.allow_dirty else {})}
        env = os.environ | {"OMP_NUM_THREADS": str(self.threads), SWEEP_ENV: json.dumps(tag)}
        log = (job.run_dir / LOG_NAME).open("a")
        job.proc = subprocess.Popen(job.argv + extra, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        job.started = time.monotonic()
        self.running.append(job)
        how = "resumed" if extra[0] == "--resume" else "started"
        print(f"{self.status()} {how} {describe(job.params)} in {job.run_dir}", flush=True)

    def reap(self) -> None:
        for job in [j for j in self.running if j.proc.poll() is not None]:
            self.running.remove(job)
            if job.proc.returncode == 0 and (job.run_dir / "result.json").is_file():
                self.done += 1
                self.durations.append(time.monotonic() - job.started)
                result = json.loads((job.run_dir / "result.json").read_text())
                print(f"{self.status()} finished {describe(job.params)}: {result['metric']} {result['final']:.4g}",
                      flush=True)
            else:
                self.failed.append(job)
                print(f"{self.status()} FAILED {describe(job.params)} (exit code {job.proc.returncode}); "
                      f"see {job.run_dir / LOG_NAME}", flush=True)

    def run(self) -> int:
        try:
            while self.waiting or self.running:
                while self.waiting and len(self.running) < self.parallel:
                    self.start(self.waiting.pop(0))
                time.sleep(0.2)
                self.reap()
        except KeyboardInterrupt:
            for job in self.running:
                job.proc.send_signal(signal.SIGTERM)
            for job in self.running:
                job.proc.wait()
            print(f"\nsweep {self.sweep.name} stopped: {self.done} done; the same command goes on from here",
                  file=sys.stderr)
            return 130
        for job in self.failed:
            print(f"failed: {describe(job.params)}: {job.run_dir} (its output: {job.run_dir / LOG_NAME})",
                  file=sys.stderr)
        minutes = (time.monotonic() - self.began) / 60
        print(f"sweep {self.sweep.name}: {self.done} done, {len(self.failed)} failed, in {minutes:.1f} min; "
              f"python -m common.leaderboard --sweep {self.sweep.name} shows its results", flush=True)
        return 1 if self.failed else 0


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def plan(sweep: Sweep, runs_dir: Path) -> list[Job]:
    """Every combination as a job, each validated (ConfigError at the first bad one)."""
    jobs = []
    for params in combinations(sweep):
        argv = command_line(sweep, params)
        cfg = validate(sweep, params, argv)
        jobs.append(Job(params, argv, cfg, runs_dir / sweep.name / f"{sweep.name}-{key(params)}"))
    return jobs


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m common.sweep", description="Run a W&B sweep file's "
                                "combinations as ordinary train.py runs, resumably.")
    p.add_argument("file", type=Path, help="the sweep file (W&B's format)")
    p.add_argument("--parallel", type=int, default=1, metavar="N",
                   help="combinations at a time, the cores divided between them (default 1)")
    p.add_argument("--runs-dir", type=Path, default=Path("runs"), help="where the runs go: RUNS_DIR/<sweep>/")
    p.add_argument("--dry-run", action="store_true", help="validate every combination and print its command")
    p.add_argument("--allow-dirty", action="store_true",
                   help="run on a checkout whose tracked files have uncommitted changes (refused without it; "
                        "recorded in every run's sweep tag)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.parallel < 1:
            raise ConfigError(f"--parallel must be a positive integer, got {args.parallel}")
        sweep = load(args.file)
        jobs = plan(sweep, args.runs_dir)
    except ConfigError as e:
        print(f"sweep: error: {e}", file=sys.stderr)
        return 2
    width = max(processes(job.argv) for job in jobs)
    parallel = 1 if width > 1 else args.parallel
    if args.dry_run:
        for job in jobs:
            print(" ".join(job.argv[2:] if job.argv[0] == "/usr/bin/env" else job.argv))
        print(f"sweep {sweep.name}: {len(jobs)} combinations, all valid")
        return 0
    if (changed := uncommitted_changes()) and not args.allow_dirty:
        print(f"sweep: error: {len(changed)} tracked file(s) with uncommitted changes ({changed[0].split()[-1]}"
              f"{', ...' if len(changed) > 1 else ''}): a sweep's runs must record the code they ran, so commit "
              f"first (or --allow-dirty, recorded in every run)", file=sys.stderr)
        return 2
    done = set().union(*(stored_keys(Path(r), sweep.name) for r in {str(j.cfg.results_dir) for j in jobs}))
    todo = [job for job in jobs if job.key not in done]
    threads = max(1, cores() // (parallel * width))
    if width > 1 and args.parallel > 1:
        print(f"the command launches {width} processes a run (torchrun): one combination at a time", flush=True)
    print(f"sweep {sweep.name}: {len(jobs)} combinations, {len(jobs) - len(todo)} in the store already, "
          f"{len(todo)} to run, {parallel} at a time ({threads} thread(s) a process)", flush=True)
    return Runner(sweep, todo, parallel, threads, args.allow_dirty).run()


if __name__ == "__main__":
    sys.exit(main())
