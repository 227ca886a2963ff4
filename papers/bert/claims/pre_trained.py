"""The pre-trained runs of table-5-pre-training.yaml, for table-5.yaml's fine-tuning to start from (Section 5.1:
each pre-training task's model fine-tuned on the same task).

    python -m papers.bert.claims.pre_trained     # after: python -m common.sweep papers/bert/claims/table-5-pre-training.yaml

Links runs/bert-table-5-pre-training/DATASET-seed-N to the finished pre-training run of that data set (pydoc-pairs:
MLM + NSP; pydoc-segments: No NSP; pydoc-ltr: LTR & No NSP) and seed, so that table-5.yaml's
`--init runs/bert-table-5-pre-training/DATASET-seed-{seed}` fine-tunes each seed from the pre-training of its own
seed. A run that has not finished is one line, exit 2.
"""

import argparse
import json
import sys
from pathlib import Path

SWEEP = "bert-table-5-pre-training"
DATASETS = ("pydoc-pairs", "pydoc-segments", "pydoc-ltr")
SEEDS = (0, 1, 2)


def finished_runs(folder: Path) -> dict[tuple[str, int], Path]:
    """(data set, seed): the finished run (config.json and model.safetensors) in the sweep's folder of runs."""
    runs = {}
    for config in sorted(folder.glob("*/config.json")):
        cfg = json.loads(config.read_text())
        if not config.parent.is_symlink() and (config.parent / "model.safetensors").is_file():
            runs[cfg["dataset"], cfg["seed"]] = config.parent
    return runs


def link(folder: Path, datasets=DATASETS, seeds=SEEDS) -> list[str]:
    runs = finished_runs(folder)
    missing = [f"{d} seed {s}" for d in datasets for s in seeds if (d, s) not in runs]
    if missing:
        raise SystemExit(f"pre_trained: no finished run of {', '.join(missing)} in {folder}; run "
                         f"python -m common.sweep papers/bert/claims/table-5-pre-training.yaml first")
    lines = []
    for dataset in datasets:
        for seed in seeds:
            name = folder / f"{dataset}-seed-{seed}"
            if name.is_symlink() or name.exists():
                name.unlink()
            name.symlink_to(runs[dataset, seed].name)  # relative: the folder can move
            lines.append(f"{name} -> {runs[dataset, seed].name}")
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
