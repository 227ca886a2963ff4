"""Links a claim's second sweep starts from: `runs/<sweep>/<NAME>-seed-<N>` to the finished run of its own
seed in the first sweep's folder, so that a sweep file's `--init runs/<sweep>/<NAME>-seed-{seed}` starts each
seed from the run of that seed (VGG's deeper nets from net A, BERT's fine-tuning from each pre-training).
A claim's script names the runs it wants (papers/vgg/claims/net_a.py, papers/bert/claims/pre_trained.py)."""

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path


def finished_runs(folder: Path, key: Callable[[dict], object]) -> dict:
    """key(config): the finished run (config.json and model.safetensors) of a sweep's folder of runs; the
    links themselves are not runs."""
    runs = {}
    for config in sorted(folder.glob("*/config.json")):
        if not config.parent.is_symlink() and (config.parent / "model.safetensors").is_file():
            runs[key(json.loads(config.read_text()))] = config.parent
    return runs


def link(folder: Path, names: dict[str, object], runs: dict, missing: Callable[[list], str]) -> list[str]:
    """Each name (a link in `folder`) to the run of its key, replacing a link of that name; SystemExit with
    `missing(keys)` where a key has no finished run."""
    if absent := [key for key in names.values() if key not in runs]:
        raise SystemExit(missing(absent))
    lines = []
    for name, key in names.items():
        path = folder / name
        if path.is_symlink() or path.exists():
            path.unlink()
        path.symlink_to(runs[key].name)  # relative: the folder can move
        lines.append(f"{path} -> {runs[key].name}")
    return lines


def parser(description: str) -> argparse.ArgumentParser:
    """A claim's linking script's flags: `--runs-dir`, where common.sweep put the runs."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--runs-dir", default="runs", help="where common.sweep put the sweep's runs (runs)")
    return p


def run(args: argparse.Namespace, sweep: str, link_all: Callable[[Path], list[str]]) -> int:
    """The links made in runs/<sweep>/, one a line; or one line on stderr and exit 2."""
    try:
        print(*link_all(Path(args.runs_dir) / sweep), sep="\n")
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    return 0
