"""Net A's finished runs, for the deeper nets of table-3-fashion-mnist-deep.yaml to start from (Section 3.1:
"when training deeper architectures, we initialised the first four convolutional layers and the last three
fully-connected layers with the layers of net A").

    python -m papers.vgg.claims.net_a            # after: python -m common.sweep papers/vgg/claims/table-3-fashion-mnist.yaml

Links runs/vgg-table-3-fashion-mnist/A-seed-N to the finished VGG-11 run of seed N of that sweep, so that the
deep sweep's `--init runs/vgg-table-3-fashion-mnist/A-seed-{seed}` starts each of its runs from net A of its
own seed. A seed whose net A has not finished is one line, exit 2.
"""

import argparse
import json
import sys
from pathlib import Path

SWEEP = "vgg-table-3-fashion-mnist"
SEEDS = (0, 1, 2)


def finished_a_runs(folder: Path) -> dict[int, Path]:
    """Seed: the finished VGG-11 run (config.json and model.safetensors) in a sweep's folder of runs."""
    runs = {}
    for config in sorted(folder.glob("*/config.json")):
        cfg = json.loads(config.read_text())
        if cfg.get("flavor") == "VGG-11" and (config.parent / "model.safetensors").is_file():
            runs[cfg["seed"]] = config.parent
    return runs


def link(folder: Path, seeds=SEEDS) -> list[str]:
    runs = finished_a_runs(folder)
    missing = [s for s in seeds if s not in runs]
    if missing:
        raise SystemExit(f"net_a: no finished VGG-11 run of seed {', '.join(map(str, missing))} in {folder}; run "
                         f"python -m common.sweep papers/vgg/claims/table-3-fashion-mnist.yaml first")
    lines = []
    for seed in seeds:
        name = folder / f"A-seed-{seed}"
        if name.is_symlink() or name.exists():
            name.unlink()
        name.symlink_to(runs[seed].name)  # relative: the folder can move
        lines.append(f"{name} -> {runs[seed].name}")
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs-dir", default="runs", help="where common.sweep put the sweep's runs (runs)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        print(*link(Path(args.runs_dir) / SWEEP), sep="\n")
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
